//! The `isolane` command line: thin, clap. Each subcommand lives in `cmd/<name>.rs`; this file
//! only declares them and maps results to exit codes (0 ok, 1 runtime failure, 2 user mistake,
//! 130 interrupted — see docs/runtime.md).

mod cmd;
mod engine_exec;
mod partition_streams;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "isolane",
    version,
    about = "Run several DNN inference workloads at once, each in its own partition, at fixed \
             rates with deadlines, and measure how well their deadlines are kept.",
    arg_required_else_help = true
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    Run(cmd::run::RunArgs),
    Maxrate(cmd::maxrate::MaxrateArgs),
    Isolation(cmd::isolation::IsolationArgs),
    Compare(cmd::compare::CompareArgs),
    Bench(cmd::bench::BenchArgs),
    Plan(cmd::plan::PlanArgs),
    Devices(cmd::devices::DevicesArgs),
    Verify(cmd::verify::VerifyArgs),
    Models(cmd::models::ModelsArgs),
    Infer(cmd::infer::InferArgs),
    Report(cmd::report::ReportArgs),
    Sweep(cmd::sweep::SweepArgs),
    Summarize(cmd::summarize::SummarizeArgs),
    /// Internal: one workload of a `host = "process"` run, driven by the coordinator over
    /// stdin/stdout.
    #[command(hide = true)]
    Worker(cmd::worker::WorkerArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    isolane_runtime::exec::register_engine(Box::new(engine_exec::EngineExecutorsImpl));
    let result = match cli.command {
        Command::Run(a) => cmd::run::run(a),
        Command::Maxrate(a) => cmd::maxrate::run(a),
        Command::Isolation(a) => cmd::isolation::run(a),
        Command::Compare(a) => cmd::compare::run(a),
        Command::Bench(a) => cmd::bench::run(a),
        Command::Plan(a) => cmd::plan::run(a),
        Command::Devices(a) => cmd::devices::run(a),
        Command::Verify(a) => cmd::verify::run(a),
        Command::Models(a) => cmd::models::run(a),
        Command::Infer(a) => cmd::infer::run(a),
        Command::Report(a) => cmd::report::run(a),
        Command::Sweep(a) => cmd::sweep::run(a),
        Command::Summarize(a) => cmd::summarize::run(a),
        Command::Worker(a) => cmd::worker::run(a),
    };
    cmd::exit_code(result)
}
