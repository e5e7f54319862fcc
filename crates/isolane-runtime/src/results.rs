//! summary.json: what a run writes about itself and each workload, and reads back for
//! `isolane compare`. Metric names are core's `WorkloadMetrics` (DESIGN.md, "Metrics"),
//! flattened into each workload's object.

use isolane_core::metrics::{workload_metrics, WorkloadMetrics};
use isolane_core::spec::{Rate, WorkloadSpec};
use isolane_core::JobRecord;
use serde::{Deserialize, Serialize};

use crate::coordinator::{RunResult, WorkloadPlan, WorkloadResult, WorkloadStatus};

/// The outcome of a whole run: "ok", "failed" (some workload failed), "interrupted" (Ctrl-C).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Ok,
    Failed,
    Interrupted,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkloadSummary {
    pub name: String,
    pub model: String,
    pub batch: u32,
    /// Hz, or `null` for closed loop.
    pub rate_hz: Option<f64>,
    pub deadline_ms: Option<f64>,
    pub host: String,
    pub status: Status,
    /// Why it failed: the worker's signal or exit status, or the error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// Wall time the throughput is computed over: t0 to the workload's last release or end.
    pub wall_s: f64,
    #[serde(flatten)]
    pub metrics: WorkloadMetrics,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunSummary {
    pub isolane_version: String,
    /// `run` or `isolation`.
    pub command: String,
    pub status: Status,
    pub interrupted: bool,
    /// `false` when this summary was rebuilt by `isolane summarize` from the `jobs/*.csv` of a
    /// run that was cut short (killed): it covers the jobs recorded before the kill. Older
    /// folders, written before this field, were complete.
    #[serde(default = "complete_by_default")]
    pub complete: bool,
    /// UTC, RFC 3339.
    pub started_at: String,
    pub host: String,
    /// The scenario file, or `<built-in quickstart>`.
    pub scenario: String,
    /// t0 as absolute CLOCK_MONOTONIC ns (null if the run never started).
    pub t0_monotonic_ns: Option<i64>,
    /// From t0 to the end of the last workload.
    pub wall_s: f64,
    /// Share of this machine's CPU time (all CPUs, %) that a hypervisor took during the run
    /// (the steal column of /proc/stat): on a shared VM, late starts and missed deadlines with
    /// a high value here are the host's, not the workloads'. Absent where not reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_steal_pct: Option<f64>,
    pub workloads: Vec<WorkloadSummary>,
    /// Device telemetry over the run (isolane-telemetry's summary), when it was sampled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub telemetry: Option<serde_json::Value>,
}

fn complete_by_default() -> bool {
    true
}

/// The wall time a workload's throughput is measured over.
pub fn workload_wall_s(records: &[JobRecord], run_wall_s: f64) -> f64 {
    let last = records
        .iter()
        .map(|r| r.end_ns.unwrap_or(r.release_ns))
        .max();
    match last {
        Some(ns) if ns > 0 => ns as f64 / 1e9,
        _ => run_wall_s,
    }
}

pub fn summarize_workload(
    spec: &WorkloadSpec,
    deadline_ns: Option<i64>,
    result: &WorkloadResult,
    run_wall_s: f64,
) -> WorkloadSummary {
    let wall_s = workload_wall_s(&result.records, run_wall_s);
    let metrics = workload_metrics(&result.records, spec.batch, wall_s, deadline_ns);
    let (status, error, signal, exit_code) = match &result.status {
        WorkloadStatus::Ok => (Status::Ok, None, None, None),
        WorkloadStatus::Interrupted => (Status::Interrupted, None, None, None),
        WorkloadStatus::Failed(f) => (
            Status::Failed,
            Some(f.message.clone()),
            f.signal,
            f.exit_code,
        ),
    };
    WorkloadSummary {
        name: spec.name.clone(),
        model: spec.model.clone(),
        batch: spec.batch,
        rate_hz: match spec.rate {
            Rate::Hz(h) => Some(h),
            Rate::Max(_) => None,
        },
        deadline_ms: deadline_ns.map(|d| d as f64 / 1e6),
        host: format!("{:?}", spec.host).to_lowercase(),
        status,
        error,
        signal,
        exit_code,
        pid: result.pid,
        wall_s,
        metrics,
    }
}

/// Run-level status: interrupted wins over failed (the user stopped it), failed over ok.
pub fn run_status(result: &RunResult) -> Status {
    if result.interrupted {
        Status::Interrupted
    } else if result
        .workloads
        .iter()
        .any(|w| matches!(w.status, WorkloadStatus::Failed(_)))
    {
        Status::Failed
    } else {
        Status::Ok
    }
}

pub struct RunInfo<'a> {
    pub command: &'a str,
    pub started_at: chrono::DateTime<chrono::Utc>,
    pub scenario: String,
}

pub fn summarize_run(info: &RunInfo, plans: &[WorkloadPlan], result: &RunResult) -> RunSummary {
    let workloads = plans
        .iter()
        .zip(&result.workloads)
        .map(|(p, r)| summarize_workload(&p.spec, p.schedule.deadline_ns, r, result.wall_s))
        .collect();
    RunSummary {
        isolane_version: env!("CARGO_PKG_VERSION").to_string(),
        command: info.command.to_string(),
        status: run_status(result),
        interrupted: result.interrupted,
        complete: true,
        started_at: info
            .started_at
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        host: crate::output::host_name(),
        scenario: info.scenario.clone(),
        t0_monotonic_ns: result.t0_ns,
        wall_s: result.wall_s,
        cpu_steal_pct: result.cpu_steal_pct,
        workloads,
        telemetry: None,
    }
}
