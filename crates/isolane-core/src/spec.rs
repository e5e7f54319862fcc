//! Scenario files: the device set-up and its workloads (DESIGN.md, "Vocabulary").
//!
//! These types are the contract between the scenario parser (this crate), the runtime and the
//! CLI. Parsing and validation live in `spec::parse` (see `Scenario::from_toml_str`).

use serde::{Deserialize, Serialize};

/// A whole scenario file, resolved: every default filled in, every value validated.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    pub device: DeviceSpec,
    #[serde(default)]
    pub timing: TimingSpec,
    #[serde(rename = "workload")]
    pub workloads: Vec<WorkloadSpec>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    Cpu,
    Cuda,
}

/// How a GPU is shared. `None` is the only value allowed with the `cpu` backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mechanism {
    None,
    Timeslice,
    Mps,
    Mig,
    Green,
}

/// Where a workload's code runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Host {
    Thread,
    Process,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceSpec {
    pub backend: Backend,
    /// GPU index (ignored for the cpu backend).
    #[serde(default)]
    pub gpu: u32,
    pub mechanism: Mechanism,
    /// Default host for every workload; a workload may override it.
    pub host: Host,
}

/// Knobs of the release loop. Defaults are tuned for an idle machine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TimingSpec {
    /// Sleep until this long before a release, then spin (µs). 0 = always spin.
    pub spin_us: u64,
    /// Delay between the start barrier and t0, so every workload is ready (ms).
    pub start_delay_ms: u64,
    /// Seed for every seeded random choice (spin jitter, synthetic weights).
    pub seed: u64,
}

impl Default for TimingSpec {
    fn default() -> Self {
        TimingSpec { spin_us: 200, start_delay_ms: 50, seed: 0x15_01a4e }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    Fp32,
    Tf32,
    Fp16,
    Bf16,
}

/// Fixed release rate, or closed loop.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Rate {
    Hz(f64),
    /// Written `"max"` in TOML.
    Max(MaxRate),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MaxRate {
    Max,
}

impl Rate {
    pub fn hz(self) -> Option<f64> {
        match self {
            Rate::Hz(h) => Some(h),
            Rate::Max(_) => None,
        }
    }
}

/// How long a workload runs: a wall-clock duration or a job count (warm-up excluded).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunLength {
    DurationS(f64),
    Jobs(u64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LatePolicy {
    Skip,
    Queue,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Plain workload (default).
    Standalone,
    /// Fixed-rate workload whose deadline keeping is measured in the isolation experiment.
    Victim,
    /// Workload whose rate ramps in the isolation experiment.
    Interferer,
}

/// An interferer's rate ramp: `steps` rates evenly spaced from `from_hz` to `to_hz`, each held
/// for `step_s` seconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ramp {
    pub from_hz: f64,
    pub to_hz: f64,
    pub steps: u32,
    pub step_s: f64,
}

/// The share of a device one workload gets. Every field is optional; which ones are allowed
/// depends on the mechanism (validated).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartitionSpec {
    /// green: number of SMs.
    pub sms: Option<u32>,
    /// mps: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE (1..=100).
    pub thread_pct: Option<u32>,
    /// mps: CUDA_MPS_PINNED_DEVICE_MEM_LIMIT in MiB.
    pub mem_limit_mib: Option<u64>,
    /// mig: profile name such as "1g.10gb".
    pub mig_profile: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadSpec {
    pub name: String,
    /// `spin:4ms`, `spin:4ms~0.5ms`, a built-in architecture name, or a path to an `.onnx` file.
    pub model: String,
    /// Optional safetensors file with the model's weights.
    pub weights: Option<String>,
    pub batch: u32,
    pub precision: Precision,
    pub rate: Rate,
    /// Relative deadline in ms; defaults to the period (required for `rate = "max"`? no: unbounded).
    pub deadline_ms: Option<f64>,
    pub length: RunLength,
    pub warmup_jobs: u64,
    pub late: LatePolicy,
    /// CPU cores the workload's thread (or worker) is pinned to; empty = not pinned.
    pub cpu: Vec<usize>,
    pub role: Role,
    pub ramp: Option<Ramp>,
    /// Overrides `device.host`.
    pub host: Host,
    pub partition: PartitionSpec,
}

impl WorkloadSpec {
    /// Period in seconds, `None` for closed loop.
    pub fn period_s(&self) -> Option<f64> {
        self.rate.hz().map(|h| 1.0 / h)
    }

    /// Relative deadline in seconds: `deadline_ms`, else the period, else none (closed loop
    /// without a deadline never times out).
    pub fn deadline_s(&self) -> Option<f64> {
        self.deadline_ms.map(|d| d / 1e3).or_else(|| self.period_s())
    }
}
