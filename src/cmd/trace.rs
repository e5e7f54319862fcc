//! `isolane trace DIR`: a run's jobs, partitions and telemetry as a Chrome trace-event /
//! Perfetto JSON timeline (isolane-trace; docs/observability.md).

use std::path::{Path, PathBuf};

use clap::Args;
use isolane_core::flag_values::millis;

use super::user;

#[derive(Args)]
#[command(
    about = "Write a run's timeline as a Perfetto / chrome://tracing JSON trace",
    long_about = "Reads the run or isolation folder DIR (summary.json, jobs/*.csv, \
                  telemetry.csv) and writes its timeline in the Chrome trace-event JSON format \
                  that ui.perfetto.dev and chrome://tracing open: every job of every workload \
                  as a span on its workload's track (from its start to its end; its release an \
                  instant; a timeout in its category and name, a skipped job an instant), the \
                  time the criticality guard held a job (jobs CSV column held_ms) on a track of \
                  its own, each workload's partition and the isolation steps, and every numeric \
                  telemetry.csv column as a counter track. Times are µs from the first event \
                  (telemetry starts before t0); --from-ms/--to-ms keep a part of a long run. \
                  A run of [[app]]s is not traced yet (exit 2: apps/<app>.csv has no start \
                  time per stage); another command's folder is named with the command that \
                  reads it. See docs/observability.md."
)]
pub struct TraceArgs {
    /// A run or isolation results folder (holds summary.json).
    pub dir: PathBuf,
    /// Where to write the trace. Default: DIR/trace.json.
    #[arg(long, short = 'o', value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Only from this time on (ms since t0): a part of a long run, whose whole trace would be
    /// too large to open (about 300 bytes per job).
    #[arg(long, value_name = "MS", value_parser = millis)]
    pub from_ms: Option<f64>,
    /// Only up to this time (ms since t0).
    #[arg(long, value_name = "MS", value_parser = millis)]
    pub to_ms: Option<f64>,
}

pub fn run(args: TraceArgs) -> anyhow::Result<u8> {
    let out = args.out.unwrap_or_else(|| args.dir.join("trace.json"));
    let window = match (args.from_ms, args.to_ms) {
        (None, None) => None,
        (from, to) => Some((
            from.unwrap_or(f64::NEG_INFINITY),
            to.unwrap_or(f64::INFINITY),
        )),
    };
    if let Some((from, to)) = window.filter(|(from, to)| from > to) {
        return Err(user(format!(
            "--from-ms {from} is after --to-ms {to}: the window would be empty"
        )));
    }
    write_window(&args.dir, &out, window)?;
    Ok(0)
}

/// Writes the trace of the run folder `dir` to `out` and says so. `run --trace`'s last step.
pub fn write(dir: &Path, out: &Path) -> anyhow::Result<()> {
    write_window(dir, out, None)
}

/// [`write`] of the part in `window` (ms since t0); a folder or file that is not what it
/// should be is the user's mistake (exit 2).
fn write_window(dir: &Path, out: &Path, window: Option<(f64, f64)>) -> anyhow::Result<()> {
    let t = isolane_trace::write_trace(dir, out, window).map_err(|e| blame!(e))?;
    println!("{}", isolane_trace::written_line(&t, out));
    Ok(())
}
