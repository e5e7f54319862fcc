//! `isolane summarize DIR`: rebuilds summary.json of a run that was cut short (killed before it
//! could write it) from the resolved scenario and the per-job records it streamed to jobs/.

use std::path::{Path, PathBuf};

use clap::Args;
use isolane_core::files::jobs_file_name;
use isolane_core::results::{RunStatus, RunSummary};
use isolane_core::JobRecord;
use isolane_runtime::coordinator::{RunPlan, RunResult, WorkloadResult, WorkloadStatus};
use isolane_runtime::output;
use isolane_runtime::results::{self, RunInfo};

use super::user;

#[derive(Args)]
#[command(
    about = "Rebuild summary.json of a run that was killed, from its jobs/*.csv",
    long_about = "A run streams every job's record to DIR/jobs/<workload>.csv while it goes on, \
                  so a run killed before it could write summary.json (kill -9, a crash, a lost \
                  machine) still holds what it measured. This rebuilds summary.json from \
                  DIR/scenario.toml and those records with the same metric code as `isolane \
                  run`, marks it \"complete\": false and the run's status \"interrupted\", and \
                  prints the results table. A last row cut off by the kill is left out (and \
                  said so). Device telemetry and partitions are not in the records, so they are \
                  absent.\n\nExit codes: 0 rebuilt; 2 DIR is not a run folder, has a \
                  summary.json already (without --force), or a record is malformed (named by file, \
                  line and field: a time that is NaN, negative or past 1e12 ms, a job index \
                  repeated or out of order, an end before its start or release)."
)]
pub struct SummarizeArgs {
    /// The run's output folder (holds scenario.toml and jobs/).
    pub dir: PathBuf,
    /// Rebuild even if DIR has a summary.json (which the finished run wrote; it is replaced).
    #[arg(long)]
    pub force: bool,
}

pub fn run(args: SummarizeArgs) -> anyhow::Result<u8> {
    let dir = &args.dir;
    let scenario_path = dir.join("scenario.toml");
    if !scenario_path.is_file() {
        return Err(user(format!(
            "{}: no scenario.toml, so not the folder of an `isolane run` (it writes one before \
             the run starts)",
            dir.display()
        )));
    }
    if dir.join("summary.json").exists() && !args.force {
        return Err(user(format!(
            "{}: has a summary.json already (its run ended and wrote it, or summarize did); pass \
             --force to rebuild it from jobs/*.csv (without any device telemetry and \
             partitions it holds)",
            dir.display()
        )));
    }
    let file = super::ScenarioFile::read(&scenario_path)?;
    let (scenario, _) = file.scenario()?;
    if !file.apps()?.is_empty() {
        return Err(user(format!(
            "{}: a run of [[app]]s; summarize does not rebuild those yet (their frames are \
             written when the run ends, docs/apps.md)",
            dir.display()
        )));
    }
    let plan = RunPlan::from_scenario(&scenario);
    let (mut summary, notes) = folder_summary(dir, &plan, "run")?;
    summary.rebuilt_by = Some("isolane summarize".into());
    isolane_core::results::write_json(&dir.join("summary.json"), &summary)?;
    println!("{}", super::run::results_table(&scenario, &summary, false));
    for n in &notes {
        eprintln!("note: {n}");
    }
    let jobs_recorded: u64 = summary.workloads.iter().map(|w| w.metrics.jobs).sum();
    let planned: Option<u64> = plan
        .workloads
        .iter()
        .map(|w| w.schedule.expected_jobs())
        .sum();
    if !summary.complete {
        let of = planned.map_or(String::new(), |p| format!(" of {p} planned"));
        eprintln!(
            "note: the run was cut short: {jobs_recorded} job(s){of} were recorded; summary.json says \
             \"complete\": false"
        );
    }
    println!("summary: {}", dir.join("summary.json").display());
    Ok(0)
}

/// The summary of the records streamed to `dir/jobs/` by a run of `plan` (or a server:
/// `command`), by the runtime's own summary code, and notes on what was short.
pub(super) fn folder_summary(
    dir: &Path,
    plan: &RunPlan,
    command: &'static str,
) -> anyhow::Result<(RunSummary, Vec<String>)> {
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
        .collect::<anyhow::Result<Vec<_>>>()?;
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
) -> anyhow::Result<WorkloadResult> {
    let path = dir.join("jobs").join(jobs_file_name(name));
    let records: Vec<JobRecord> = if path.is_file() {
        let (records, note) = output::read_jobs_csv_partial(&path).map_err(user)?;
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
