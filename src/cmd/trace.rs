//! `isolane trace DIR`: a run's jobs, partitions and telemetry as a Chrome trace-event /
//! Perfetto JSON timeline (isolane-trace; docs/observability.md).

use std::path::{Path, PathBuf};

use clap::Args;

use super::user;

#[derive(Args)]
#[command(
    about = "Write a run's timeline as a Perfetto / chrome://tracing JSON trace",
    long_about = "Reads the run or isolation folder DIR (summary.json, jobs/*.csv, \
                  telemetry.csv) and writes its timeline in the Chrome trace-event JSON format \
                  that ui.perfetto.dev and chrome://tracing open: every job of every workload \
                  as a span on its workload's track (from its start to its end; its release an \
                  instant; a timeout in its category and name, a skipped job an instant), the \
                  time a hold-back guard held a job (jobs CSV column held_ns) on a track of its \
                  own, each workload's partition and the isolation steps, and every numeric \
                  telemetry.csv column as a counter track. Times are µs from the first event \
                  (telemetry starts before t0); see docs/observability.md."
)]
pub struct TraceArgs {
    /// A run or isolation results folder (holds summary.json).
    pub dir: PathBuf,
    /// Where to write the trace. Default: DIR/trace.json.
    #[arg(long, short = 'o', value_name = "FILE")]
    pub out: Option<PathBuf>,
}

pub fn run(args: TraceArgs) -> anyhow::Result<u8> {
    let out = args.out.unwrap_or_else(|| args.dir.join("trace.json"));
    write(&args.dir, &out)?;
    Ok(0)
}

/// Writes the trace of the run folder `dir` to `out` and says so; a folder or file that is
/// not what it should be is the user's mistake (exit 2). Also `run --trace`'s last step.
pub fn write(dir: &Path, out: &Path) -> anyhow::Result<()> {
    let t = isolane_trace::write_trace(dir, out).map_err(|e| {
        if e.is_user_error() {
            user(e)
        } else {
            anyhow::Error::new(e)
        }
    })?;
    let jobs: usize = t.lanes.iter().map(|l| l.jobs.len()).sum();
    // Two short lines: the tables' 80 columns hold for ordinary paths.
    println!(
        "trace: {} ({jobs} jobs of {} workloads, {} counters)\n\
         open it in ui.perfetto.dev or chrome://tracing",
        out.display(),
        t.lanes.len(),
        t.counters.len()
    );
    Ok(())
}
