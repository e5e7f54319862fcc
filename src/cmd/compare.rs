//! `isolane compare RUN_A RUN_B`: two runs side by side, per workload, with a Mann–Whitney U test.

use std::path::PathBuf;

use clap::Args;

#[derive(Args)]
#[command(
    about = "Compare two runs' workloads side by side, with a Mann–Whitney U test",
    long_about = "Reads RUN_A/summary.json and RUN_B/summary.json and the jobs/<workload>.csv \
                  files, and for every workload present in both prints the two runs' metrics \
                  side by side and the two-sided Mann–Whitney U p-value of their response \
                  times (a small p: the latency distributions differ). --json prints the same \
                  as one JSON object on stdout (the tables go to stderr)."
)]
pub struct CompareArgs {
    /// Output directory of the first run.
    run_a: PathBuf,
    /// Output directory of the second run.
    run_b: PathBuf,
    /// Print the comparison as one JSON object on stdout (per workload and app: both runs'
    /// metrics and the U test; the names only in one run; each run's CPU steal); the tables go
    /// to stderr (docs/report.md, Reading results in Python).
    #[arg(long)]
    json: bool,
}

pub fn run(args: CompareArgs) -> anyhow::Result<u8> {
    // With --json, stdout is the JSON object alone: the text goes to stderr.
    let say = |text: &str| {
        if args.json {
            eprintln!("{text}")
        } else {
            println!("{text}")
        }
    };
    let json =
        isolane_report::compare::compare(&args.run_a, &args.run_b, &say).map_err(|e| blame!(e))?;
    if args.json {
        println!("{json}");
    }
    Ok(0)
}
