//! `isolane explain RUN_DIR`: each late job's time attributed to its causes, per workload a
//! table, written to RUN_DIR/explain.json (isolane_report::explain; docs/criticality.md).

use std::path::PathBuf;

use clap::Args;
use isolane_report::explain::{self, render::render, MemoryProfiles};

use super::user;

#[derive(Args)]
#[command(
    about = "Say why a run's late jobs were late: neighbours, host, guard, own service time",
    long_about = "Reads the run or isolation folder RUN_DIR (summary.json, scenario.toml, \
                  jobs/*.csv) and attributes each late job (a timeout, skipped ones included) \
                  to its causes, as time: the neighbour workloads that ran beside it (sharing \
                  its GPU, whose memory system partitions do not split, or its CPU cores), named, \
                  with their memory intensity when --memory gives it; the host (a start later \
                  than the job could start, with no neighbour on its cores); the criticality \
                  guard's holds (held_ms); and its own service time beyond its typical (the \
                  median of its jobs that ran with no neighbour beside them, or of its jobs in a \
                  run alone given with --alone). A job queued behind \
                  its own earlier job inherits that job's causes. Each late job counts once, \
                  split among its causes by their time, so per workload the causes' shares add \
                  up to its late %. Prints a table per workload and writes RUN_DIR/explain.json \
                  (rewritten each time; no other file is touched), which isolane report draws. \
                  Copy-engine waits are not in the job records: said so. See \
                  docs/criticality.md, \"Why jobs were late\". RUN_DIR without what is \
                  needed (summary.json, scenario.toml, a jobs/<workload>.csv) is refused with \
                  what is missing (exit 2)."
)]
pub struct ExplainArgs {
    /// A run or isolation results folder (holds summary.json and jobs/).
    pub run_dir: PathBuf,
    /// Models' memory-system figures (TOML: [[model]] entries with model, dram_gb_s, l2_mib,
    /// source), to name each neighbour's memory intensity; without it, "unknown".
    #[arg(long, value_name = "FILE")]
    pub memory: Option<PathBuf>,
    /// A run folder of the workloads alone (repeatable): each workload's typical service time
    /// is then taken from its jobs there, not from the run's own (where every job may have run
    /// beside a neighbour); a workload none of them has keeps its own.
    #[arg(long, value_name = "DIR")]
    pub alone: Vec<PathBuf>,
    /// Every column at its natural width (no fitting to 80 columns).
    #[arg(long)]
    pub wide: bool,
}

pub fn run(args: ExplainArgs) -> anyhow::Result<u8> {
    let profiles = match &args.memory {
        Some(p) => Some((
            p.as_path(),
            MemoryProfiles::load(p).map_err(|e| user(format!("--memory {e}")))?,
        )),
        None => None,
    };
    let e = explain::explain_dir(
        &args.run_dir,
        profiles.as_ref().map(|(p, m)| (*p, m)),
        &args.alone,
    )
    .map_err(user)?;
    print!("{}", render(&e, args.wide));
    let path = explain::write_explanation(&args.run_dir, &e)?;
    println!("explain: {}", path.display());
    Ok(0)
}
