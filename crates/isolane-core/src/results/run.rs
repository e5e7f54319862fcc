//! summary.json of `isolane run` and `isolane isolation`.

use serde::{Deserialize, Serialize};

use super::ProgramSummary;
use super::{legacy_version, IsolationSteps, TelemetrySummary, Versioned};
use crate::metrics::WorkloadMetrics;
use crate::spec::{Backend, Criticality, Mechanism};

/// The outcome of a run or of one workload: "ok", "failed" (a workload failed), "interrupted"
/// (Ctrl-C, or a run cut short and summarised afterwards).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    Ok,
    Failed,
    Interrupted,
}

impl std::fmt::Display for RunStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RunStatus::Ok => "ok",
            RunStatus::Failed => "failed",
            RunStatus::Interrupted => "interrupted",
        })
    }
}

impl RunStatus {
    /// The word result tables print (a failure stands out).
    pub fn word(self) -> &'static str {
        match self {
            RunStatus::Ok => "ok",
            RunStatus::Failed => "FAILED",
            RunStatus::Interrupted => "interrupted",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkloadSummary {
    pub name: String,
    pub model: String,
    pub batch: u32,
    /// Hz, or `null` for closed loop.
    pub rate_hz: Option<f64>,
    pub deadline_ms: Option<f64>,
    /// `thread` or `process`.
    pub host: String,
    pub status: RunStatus,
    /// Why it failed: the worker's signal or exit status, or the error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// A thread-hosted workload whose model ran out of memory being built or warmed up (a
    /// worker process says so by its exit code 3 instead).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ran_out_of_memory: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// Wall time the throughput is computed over: t0 to the workload's last release or end.
    pub wall_s: f64,
    /// Device memory admission control counted for this workload (MiB): the engine's plan
    /// (weights + arena + workspace) plus, once per process, the CUDA context. `null` on the
    /// CPU and for synthetic workloads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_estimate_mib: Option<u64>,
    /// `critical` (the default) or `best_effort` (docs/criticality.md).
    #[serde(default)]
    pub criticality: Criticality,
    /// A best-effort workload the criticality guard acted on: how it was held back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<HeldSummary>,
    /// What the workload's release-loop thread cost the CPU from t0 to its end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuSummary>,
    /// A `kernel:` workload's fixed work per job: with `throughput_ips` (jobs/s at batch 1) it
    /// gives the achieved bytes/s and flop/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub work: Option<crate::spec::KernelWork>,
    /// Where it ran: `cpu` or `cuda` (absent before schema 3: the device's backend).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<Backend>,
    /// A command workload (an external program): how it ran. Its `jobs` and latencies are 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub program: Option<ProgramSummary>,
    /// Completed jobs' execution times (end − start, ms): each job's own time, without the
    /// queueing and late starts its response time adds (absent before session 28, and for a
    /// workload that completed no job).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec_ms: Option<crate::metrics::ExecTimes>,
    #[serde(flatten)]
    pub metrics: WorkloadMetrics,
}

/// What one workload's release-loop thread (in its worker process for `host = "process"`) cost
/// the CPU from t0 to its end, from the kernel's per-thread counters. Threads the engine starts
/// itself (the CPU backend's intra-op pool, CUDA's) are not in it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CpuSummary {
    /// Time on a CPU (s).
    pub cpu_s: f64,
    /// `cpu_s` over the workload's wall time (%): 100 = one core busy throughout.
    pub cpu_pct: f64,
    /// Time runnable but waiting for a core (ms): the run-queue delay.
    pub runqueue_wait_ms: f64,
    /// Switches away because the thread slept or blocked (waiting for a release, for the GPU).
    pub voluntary_switches: u64,
    /// Switches away because the scheduler preempted the thread.
    pub involuntary_switches: u64,
}

/// How the criticality guard held a best-effort workload back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HeldSummary {
    /// Pieces each job ran as (the guard may hold a job before each).
    pub pieces: u64,
    /// Time held back over the whole run (ms).
    pub total_ms: f64,
    /// Jobs held back at least once.
    pub jobs_held: u64,
    /// The longest hold of one job (ms).
    pub max_ms: f64,
}

impl HeldSummary {
    /// The holds of `records` (their `held_ns`), for a workload run as `pieces` pieces.
    pub fn of(records: &[crate::JobRecord], pieces: u64) -> HeldSummary {
        let held = records.iter().map(|r| r.held_ns).filter(|h| *h > 0);
        HeldSummary {
            pieces,
            total_ms: held.clone().sum::<i64>() as f64 / 1e6,
            jobs_held: held.clone().count() as u64,
            max_ms: held.max().unwrap_or(0) as f64 / 1e6,
        }
    }
}

/// What one workload's partition was, for summary.json and the printed plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PartitionRecord {
    pub workload: String,
    pub mechanism: Mechanism,
    /// What the partition is, in words ("green 8 SMs", "mps 25%", "mig 1g.10gb", "whole GPU").
    pub partition: String,
    /// green: SMs the driver granted (read back); mig: the instance's SMs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub granted_sms: Option<u32>,
    /// mig: `MIG-<uuid>` the worker is bound to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_device: Option<String>,
    /// mps: the daemon's pipe directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mps_pipe_dir: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunSummary {
    #[serde(default = "legacy_version")]
    pub schema_version: u32,
    pub isolane_version: String,
    /// `run` or `isolation`.
    pub command: String,
    pub status: RunStatus,
    pub interrupted: bool,
    /// `false` when this summary was rebuilt by `isolane summarize` from the `jobs/*.csv` of a
    /// run that was cut short (killed before it wrote summary.json).
    #[serde(default = "yes")]
    pub complete: bool,
    /// Who wrote this summary when not the run itself (`isolane summarize`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rebuilt_by: Option<String>,
    /// Set when the run could not write all its per-job records (a full disk at its end): which
    /// `jobs/*.csv` hold fewer records than the run measured, and why. This summary's metrics
    /// are still those of every job measured (kept in memory); absent when the files are whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files_incomplete: Option<String>,
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
    /// What each workload's partition was (GPU runs; absent on the CPU).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub partitions: Vec<PartitionRecord>,
    /// Device telemetry over the run, when it was sampled on one GPU. A run on several GPUs
    /// leaves it out and has `telemetry_per_gpu` instead: each GPU's power, clocks and energy
    /// are its own, and no single object could stand for them all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub telemetry: Option<TelemetrySummary>,
    /// A run on several GPUs (`[device] gpus`): one telemetry summary per GPU sampled, in the
    /// order of `gpus`, each naming its `gpu`. Empty for one GPU (schema 4).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub telemetry_per_gpu: Vec<TelemetrySummary>,
    /// `isolane isolation`: the ramp's steps (flattened: `step_s`, `steps`).
    #[serde(default, flatten, skip_serializing_if = "Option::is_none")]
    pub isolation: Option<IsolationSteps>,
    /// The scenario's `[[app]]`s: end-to-end and per-stage results (docs/apps.md).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub apps: Vec<super::AppSummary>,
}

fn yes() -> bool {
    true
}

impl Versioned for RunSummary {
    fn schema_version(&self) -> u32 {
        self.schema_version
    }
}

impl RunSummary {
    /// Whether the run failed only because models did not fit: some workload failed, and
    /// every one that failed ran out of memory ([`WorkloadSummary::out_of_memory`]). `run`
    /// exits 3 then, as `infer` does.
    pub fn failed_out_of_memory(&self) -> bool {
        failed_out_of_memory(&self.workloads)
    }
}

fn failed_out_of_memory(workloads: &[WorkloadSummary]) -> bool {
    let mut failed = workloads.iter().filter(|w| w.status == RunStatus::Failed);
    failed.clone().next().is_some() && failed.all(WorkloadSummary::out_of_memory)
}

impl WorkloadSummary {
    /// Whether it failed because its model at its batch did not fit: its worker process exited
    /// 3, the engine's out-of-memory, or its thread found the engine out of memory.
    pub fn out_of_memory(&self) -> bool {
        self.status == RunStatus::Failed
            && (self.ran_out_of_memory || self.host == "process" && self.exit_code == Some(3))
    }

    /// A workload that has run no job yet (its metrics are those of no records).
    pub fn new(name: &str, model: &str, batch: u32) -> WorkloadSummary {
        WorkloadSummary {
            name: name.to_string(),
            model: model.to_string(),
            batch,
            rate_hz: None,
            deadline_ms: None,
            host: "thread".to_string(),
            status: RunStatus::Ok,
            error: None,
            signal: None,
            exit_code: None,
            ran_out_of_memory: false,
            pid: None,
            wall_s: 0.0,
            memory_estimate_mib: None,
            criticality: Criticality::Critical,
            held: None,
            cpu: None,
            work: crate::spec::KernelModel::parse(model)
                .ok()
                .map(|k| k.work()),
            backend: None,
            program: None,
            exec_ms: None,
            metrics: crate::metrics::workload_metrics(&[], batch, 0.0, None),
        }
    }
}

impl RunSummary {
    /// The summary of `command` with no workload yet, in this build's schema.
    pub fn new(command: &str) -> RunSummary {
        RunSummary {
            schema_version: super::SCHEMA_VERSION,
            isolane_version: env!("CARGO_PKG_VERSION").to_string(),
            command: command.to_string(),
            status: RunStatus::Ok,
            interrupted: false,
            complete: true,
            rebuilt_by: None,
            files_incomplete: None,
            started_at: String::new(),
            host: String::new(),
            scenario: String::new(),
            t0_monotonic_ns: None,
            wall_s: 0.0,
            cpu_steal_pct: None,
            workloads: Vec::new(),
            partitions: Vec::new(),
            telemetry: None,
            telemetry_per_gpu: Vec::new(),
            isolation: None,
            apps: Vec::new(),
        }
    }

    /// Images per second of all workloads together.
    pub fn total_throughput_ips(&self) -> f64 {
        self.workloads
            .iter()
            .map(|w| w.metrics.throughput_ips)
            .sum()
    }

    pub fn workload(&self, name: &str) -> Option<&WorkloadSummary> {
        self.workloads.iter().find(|w| w.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_failed_out_of_memory_when_every_failure_is_a_worker_exit_3() {
        let failed = |host: &str, code: Option<i32>| {
            let mut w = WorkloadSummary::new("w", "resnet18", 256);
            w.status = RunStatus::Failed;
            w.host = host.into();
            w.exit_code = code;
            w
        };
        let ok = WorkloadSummary::new("ok", "resnet18", 1);
        let oom = failed("process", Some(3));
        assert!(oom.out_of_memory());
        assert!(!failed("thread", Some(3)).out_of_memory());
        assert!(!failed("process", Some(1)).out_of_memory());
        assert!(failed_out_of_memory(&[ok.clone(), oom.clone()]));
        assert!(!failed_out_of_memory(&[
            oom.clone(),
            failed("process", Some(1))
        ]));
        assert!(!failed_out_of_memory(std::slice::from_ref(&ok)));
        assert!(!failed_out_of_memory(&[]));
    }
}
