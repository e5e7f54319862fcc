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
    let records: Vec<JobRecord> = if isolane_core::files::is_there(&path) {
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

/// `isolane summarize DIR`'s folder: a run's (it holds scenario.toml, written before the run
/// starts) without a summary.json, unless `force` (which replaces it).
pub fn check_folder(dir: &Path, force: bool) -> Result<(), String> {
    let scenario = dir.join("scenario.toml");
    if isolane_core::files::is_there(&scenario) && !scenario.is_file() {
        // Read as the scenario it is, a FIFO would wait forever for a writer.
        return Err(format!(
            "{}: is not a regular file (a FIFO, a device, a folder or a link to nothing); a run \
             writes its scenario.toml as one",
            scenario.display()
        ));
    }
    if !scenario.is_file() {
        return Err(format!(
            "{}: no scenario.toml, so not the folder of an `isolane run` (it writes one before \
             the run starts)",
            dir.display()
        ));
    }
    if dir.join("summary.json").exists() && !force {
        return Err(format!(
            "{}: has a summary.json already (its run ended and wrote it, or summarize did); pass \
             --force to rebuild it from jobs/*.csv (without any device telemetry and \
             partitions it holds)",
            dir.display()
        ));
    }
    Ok(())
}

/// What a rebuilt summary of a run cut short says of it: the jobs recorded (of those planned,
/// where the schedules say).
pub fn cut_short_note(summary: &RunSummary, plan: &RunPlan) -> Option<String> {
    if summary.complete {
        return None;
    }
    let jobs_recorded: u64 = summary.workloads.iter().map(|w| w.metrics.jobs).sum();
    let planned: Option<u64> = plan
        .workloads
        .iter()
        .map(|w| w.schedule.expected_jobs())
        .sum();
    let of = planned.map_or(String::new(), |p| format!(" of {p} planned"));
    Some(format!(
        "note: the run was cut short: {jobs_recorded} job(s){of} were recorded; summary.json says \
         \"complete\": false"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summarize_takes_a_run_folder_and_keeps_a_summary_unless_forced() {
        let dir = tempfile::tempdir().unwrap();
        let e = check_folder(dir.path(), false).unwrap_err();
        assert!(e.contains("no scenario.toml"), "{e}");
        std::fs::write(dir.path().join("scenario.toml"), "").unwrap();
        assert_eq!(check_folder(dir.path(), false), Ok(()));
        std::fs::write(dir.path().join("summary.json"), "{}").unwrap();
        let e = check_folder(dir.path(), false).unwrap_err();
        assert!(
            e.contains("has a summary.json already") && e.contains("--force"),
            "{e}"
        );
        assert_eq!(check_folder(dir.path(), true), Ok(()));
    }
}
