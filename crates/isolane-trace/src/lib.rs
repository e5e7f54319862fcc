//! isolane-trace: a run's results folder as a timeline, written as a Chrome trace-event /
//! Perfetto JSON file (`isolane trace`, `run --trace`; docs/observability.md).
//!
//! [`Timeline::load`] reads summary.json, jobs/*.csv (by column name: the criticality guard's
//! `held_ms` column is used when present) or, for a run of `[[app]]`s, apps/<app>.csv (each
//! frame end to end, and each stage's start and own time), and telemetry.csv;
//! [`chrome::trace_json`] turns it into trace events; [`write_trace`] does both.

pub mod chrome;
pub mod csv;
pub mod timeline;

use std::path::{Path, PathBuf};

pub use timeline::{read_jobs, Counter, Job, Lane, LaneKind, Step, Timeline};

/// A window's end as given, in e-notation when it is beyond any run (`--from-ms 1e308` was
/// written out in 309 digits).
fn window_end(ms: f64) -> String {
    if ms.abs() >= 1e12 {
        format!("{ms:e}")
    } else {
        format!("{ms}")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// No summary.json and no sign of a run killed before writing one.
    #[error(
        "{0} is not a run folder: `isolane trace` needs the summary.json that isolane run and \
         isolation write"
    )]
    NotARun(PathBuf),
    /// scenario.toml but no summary.json: a run killed before it ended, which `isolane
    /// summarize` completes.
    #[error(
        "{0} has no summary.json: its run was killed before it wrote one; isolane summarize {0} \
         rebuilds it from jobs/*.csv, then isolane trace {0} reads it"
    )]
    CutShort(PathBuf),
    /// Another command's results folder, which has no job timeline of its own.
    #[error(
        "{dir} is {what}, not a run folder: `isolane trace` reads the summary.json of isolane \
         run and isolation; {hint}"
    )]
    OtherResults {
        dir: PathBuf,
        what: &'static str,
        hint: String,
    },
    /// A run of `[[app]]`s written before the frames CSV kept when each stage started.
    #[error(
        "{file} has no `{stage}.start_ms` column: {dir} is a run of [[app]]s written before \
         isolane recorded when each stage started a frame, so its stages cannot be placed on a \
         timeline (run it again to trace it; isolane report {dir} draws the apps' latencies \
         and stage times; docs/apps.md)",
        file = file.display(),
        dir = dir.display()
    )]
    Apps {
        dir: PathBuf,
        file: PathBuf,
        stage: String,
    },
    /// `--from-ms`/`--to-ms` hold none of the run's jobs: an empty trace would look like a run
    /// that did nothing.
    #[error(
        "--from-ms/--to-ms: no job of the run is in that window ({} to {} ms after t0); its \
         jobs run from {first_ms:.1} to {last_ms:.1} ms",
        window_end(*.from_ms),
        window_end(*.to_ms)
    )]
    EmptyWindow {
        from_ms: f64,
        to_ms: f64,
        first_ms: f64,
        last_ms: f64,
    },
    #[error(transparent)]
    File(#[from] isolane_core::files::FileError),
    #[error(transparent)]
    Results(#[from] isolane_core::results::ResultsError),
    /// The trace file could not be written (`--out` names no file isolane writes, or the
    /// write failed): said once, by [`isolane_core::files::write_output`].
    #[error(transparent)]
    Write(isolane_core::files::OutputFileError),
}

impl TraceError {
    /// A folder or file the user named that is not what it should be (exit code 2), rather
    /// than a failure to write the trace.
    pub fn is_user_error(&self) -> bool {
        match self {
            TraceError::Write(e) => e.is_user_error(),
            _ => true,
        }
    }
}

/// Reads the run folder `dir` and writes its trace to `out` (as every output file the user
/// names: [`isolane_core::files::write_output`]), only the part in
/// `window` (ms since t0) when given. Returns the timeline, for the caller's summary line.
pub fn write_trace(
    dir: &Path,
    out: &Path,
    window: Option<(f64, f64)>,
) -> Result<Timeline, TraceError> {
    let mut timeline = Timeline::load(dir)?;
    if let Some((from, to)) = window {
        let jobs = || timeline.lanes.iter().flat_map(|l| &l.jobs);
        let first = jobs().map(|j| j.release_ms).min_by(f64::total_cmp);
        let last = jobs()
            .map(|j| j.end_ms.unwrap_or(j.release_ms))
            .max_by(f64::total_cmp);
        timeline = timeline.window(from, to);
        if let (Some(first_ms), Some(last_ms)) = (first, last) {
            if timeline.lanes.iter().all(|l| l.jobs.is_empty()) {
                return Err(TraceError::EmptyWindow {
                    from_ms: from,
                    to_ms: to,
                    first_ms,
                    last_ms,
                });
            }
        }
    }
    let json = chrome::trace_json(&timeline);
    isolane_core::files::write_output(out, json.as_bytes()).map_err(TraceError::Write)?;
    Ok(timeline)
}

/// The summary line of a trace written to `out`: two short lines, so that the tables' 80
/// columns hold for ordinary paths.
pub fn written_line(timeline: &Timeline, out: &Path) -> String {
    let jobs: usize = timeline.lanes.iter().map(|l| l.jobs.len()).sum();
    format!(
        "trace: {} ({jobs} jobs of {} workloads, {} counters)\n\
         open it in ui.perfetto.dev or chrome://tracing",
        out.display(),
        timeline.lanes.len(),
        timeline.counters.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--from-ms 1e308` was written out in 309 digits in the refusal.
    #[test]
    fn an_empty_window_says_its_ends_briefly() {
        let e = |from_ms: f64, to_ms: f64| {
            TraceError::EmptyWindow {
                from_ms,
                to_ms,
                first_ms: 0.0,
                last_ms: 500.0,
            }
            .to_string()
        };
        let far = e(1e308, f64::MAX);
        assert!(
            far.contains("(1e308 to 1.7976931348623157e308 ms after t0)"),
            "{far}"
        );
        assert!(far.len() < 200, "{far}");
        let near = e(600.5, 900.0);
        assert!(
            near.contains("(600.5 to 900 ms after t0); its jobs run from 0.0 to 500.0 ms"),
            "{near}"
        );
    }
}
