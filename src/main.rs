//! The `isolane` command line: thin, clap. Each subcommand lives in `cmd/`.

fn main() {
    println!("isolane");
}
