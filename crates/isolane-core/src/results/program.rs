//! summary.json's `program` object: what a command workload (an external program,
//! docs/programs.md) did — how it ended, its CPU time, and what the GPU telemetry could
//! attribute to its processes.

use serde::{Deserialize, Serialize};

/// How an external program ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProgramEnd {
    /// It exited by itself (`exit_code` says with what).
    Exited,
    /// A signal it did not get from isolane ended it (`signal` says which).
    Killed,
    /// isolane stopped it at its `duration_s`: a normal end.
    StoppedAtDuration,
    /// Still running at its `timeout_s`: stopped, and the workload failed.
    TimedOut,
    /// isolane was interrupted (Ctrl-C, SIGTERM) and stopped it.
    Interrupted,
    /// It never started (the command could not be run, or the run never reached t0).
    NotStarted,
}

impl ProgramEnd {
    /// The words the results table and the report print.
    pub fn words(self) -> &'static str {
        match self {
            ProgramEnd::Exited => "exited",
            ProgramEnd::Killed => "killed by a signal",
            ProgramEnd::StoppedAtDuration => "stopped at duration",
            ProgramEnd::TimedOut => "timed out",
            ProgramEnd::Interrupted => "interrupted",
            ProgramEnd::NotStarted => "not started",
        }
    }
}

/// How a program's energy was obtained. There is no per-process energy counter: NVML's
/// accounting gives none, so the device's energy over the program's run is shared out by
/// what each process used of the SMs (NVML per-process utilisation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProgramEnergySource {
    /// The device's energy over the program's run × the program's share of the SM
    /// utilisation of every process on the device: attributed, not measured.
    AttributedBySmShare,
}

/// A command workload's run. Its exit code or signal, pid and wall time are the workload's
/// own fields (`exit_code`, `signal`, `pid`, `wall_s`), its peak device memory is
/// `gpu_memory_mib` (the sum over its process tree, per telemetry sample).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProgramSummary {
    /// The program and its arguments.
    pub command: Vec<String>,
    pub end: ProgramEnd,
    /// When it started and ended, in seconds after t0.
    pub started_s: f64,
    pub ended_s: f64,
    /// CPU time of the program and of every descendant it waited for (getrusage of a reaped
    /// child), user and system (s); `cpu_pct` is their sum over its wall time (100 = one core).
    pub cpu_user_s: f64,
    pub cpu_system_s: f64,
    pub cpu_pct: f64,
    /// The largest resident set of one of those processes (MiB).
    pub max_rss_mib: f64,
    /// Every process of its process group seen while it ran (the program first): what device
    /// memory and GPU use are attributed by.
    pub pids: Vec<u32>,
    /// Its standard output and error, in the results folder.
    pub stdout: String,
    pub stderr: String,
    /// Mean share of the GPU's SMs its processes kept busy over its run (%), from NVML's
    /// per-process utilisation; absent without NVML or where the driver does not report it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_share_pct: Option<f64>,
    /// Energy attributed to it (J); see `energy_source`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub energy_j: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub energy_source: Option<ProgramEnergySource>,
}
