//! A run's summary rebuilt from the records it streamed to its folder's jobs/ (`isolane
//! summarize` of a run that was killed, and a server's at its end): the runtime's own summary
//! code on what was recorded, with notes on what was short.

use std::path::Path;

use isolane_core::files::jobs_file_name;
use isolane_core::results::{RunStatus, RunSummary};
use isolane_core::JobRecord;
use isolane_runtime::coordinator::{RunPlan, RunResult, WorkloadResult, WorkloadStatus};
use isolane_runtime::output::{self, OutputError};
use isolane_runtime::results::{self, RunInfo};

/// The summary of the records streamed to `dir/jobs/` by a run of `plan` (or a server:
/// `command`), by the runtime's own summary code, and notes on what was short.
pub fn folder_summary(
    dir: &Path,
    plan: &RunPlan,
    command: &'static str,
) -> Result<(RunSummary, Vec<String>), OutputError> {
    let mut notes = Vec::new();
    let workloads = plan
        .workloads
        .iter()
        .map(|w| {
            // A program's outcome lives only in summary.json: its workload is not complete.
            let planned = match w.spec.program {
                Some(_) => None,
                None => w.schedule.expected_jobs(),
            };
            recorded(dir, &w.spec.name, planned, &mut notes)
        })
        .collect::<Result<Vec<_>, OutputError>>()?;
    let summary = rebuild(plan, &dir.join("scenario.toml"), workloads, command);
    Ok((summary, notes))
}

/// A workload's records as the killed run left them: `Ok` (all planned jobs recorded) or
/// interrupted. A missing file means none was recorded.
fn recorded(
    dir: &Path,
    name: &str,
    planned: Option<u64>,
    notes: &mut Vec<String>,
) -> Result<WorkloadResult, OutputError> {
    let path = dir.join("jobs").join(jobs_file_name(name));
    let records: Vec<JobRecord> = if path.is_file() {
        let (records, note) = output::read_jobs_csv_partial(&path)?;
        notes.extend(note);
        records
    } else {
        notes.push(format!(
            "{}: missing: no job of workload `{name}` was recorded",
            path.display()
        ));
        Vec::new()
    };
    let complete = planned.is_some_and(|p| records.len() as u64 == p);
    Ok(WorkloadResult {
        name: name.to_string(),
        status: if complete {
            WorkloadStatus::Ok
        } else {
            WorkloadStatus::Interrupted
        },
        records,
        warmup_ns: Vec::new(),
        pid: None,
        device_memory_mib: None,
        pieces: None,
        cpu: None,
        program: None,
    })
}

/// The summary of the recorded jobs, by the runtime's own summary code.
fn rebuild(
    plan: &RunPlan,
    scenario_path: &Path,
    workloads: Vec<WorkloadResult>,
    command: &'static str,
) -> RunSummary {
    let complete = workloads
        .iter()
        .all(|w| matches!(w.status, WorkloadStatus::Ok));
    let wall_s = plan
        .workloads
        .iter()
        .zip(&workloads)
        .map(|(p, w)| results::workload_wall_s(&w.records, &p.schedule, 0.0))
        .fold(0.0, f64::max);
    let result = RunResult {
        t0_ns: None,
        wall_s,
        interrupted: !complete,
        workloads,
        cpu_steal_pct: None,
        jobs_stream_error: None,
    };
    // scenario.toml is written just before the run starts: its time is the run's start.
    let started_at = std::fs::metadata(scenario_path)
        .and_then(|m| m.modified())
        .map(chrono::DateTime::<chrono::Utc>::from)
        .unwrap_or_else(|_| chrono::Utc::now());
    let info = RunInfo {
        command,
        started_at,
        scenario: scenario_path.display().to_string(),
    };
    let mut summary = results::summarize_run(&info, &plan.workloads, &result);
    summary.complete = complete;
    if !complete && summary.status == RunStatus::Ok {
        summary.status = RunStatus::Interrupted;
    }
    summary
}
