//! Scenario files: the device set-up and its workloads (DESIGN.md, "Vocabulary").
//!
//! These types are the contract between the scenario parser (this crate), the runtime and the
//! CLI. A file is read by `spec::parse` (the structural walk: TOML types, keys, defaults, spans;
//! see [`Scenario::from_toml_str`]) and checked by `spec::validate` (every rule, on the typed
//! `Scenario`), which also checks scenarios built in code ([`Scenario::validate`]);
//! `spec::write` writes the resolved file. The user format is documented key by key in
//! `docs/scenario.md`.

mod error;
mod format;
pub mod kernel;
pub mod limits;
mod model;
mod parse;
pub mod program;
mod spans;
mod validate;
mod write;
pub use format::{
    BATCHING_KEYS, DEVICE_KEYS, PROTECTION_KEYS, SERVE_KEYS, TIMING_KEYS, WORKLOAD_KEYS,
};

use serde::{Deserialize, Serialize};

pub use error::{Problem, SpecError, MAX_LISTED_PROBLEMS};
pub use kernel::{KernelModel, KernelParseError, KernelWork};
pub use model::{
    ModelCatalog, ModelParseError, ModelSource, NoBuiltinModels, SpinModel, SpinParseError,
};
pub use program::ProgramSpec;

/// A whole scenario file, resolved: every default filled in, every value validated.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    pub device: DeviceSpec,
    #[serde(default)]
    pub timing: TimingSpec,
    #[serde(default)]
    pub protection: ProtectionSpec,
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

impl Mechanism {
    /// The word a scenario uses for it (`mechanism = "..."`).
    pub fn name(self) -> &'static str {
        format::name_of(format::MECHANISMS, self)
    }
}

impl Criticality {
    /// The word a scenario uses for it (`criticality = "..."`).
    pub fn name(self) -> &'static str {
        format::name_of(format::CRITICALITIES, self)
    }
}

impl Precision {
    /// The word a scenario uses for it (`precision = "..."`).
    pub fn name(self) -> &'static str {
        format::name_of(format::PRECISIONS, self)
    }
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
    /// GPU index (ignored for the cpu backend); with several GPUs, the first of `gpus`.
    #[serde(default)]
    pub gpu: u32,
    /// Every GPU of a scenario on several GPUs (at least two, distinct, `gpus[0] == gpu`);
    /// empty for one GPU, so that a single-GPU scenario reads, writes and serialises exactly
    /// as before (docs/partitions.md, Several GPUs). Read it through [`DeviceSpec::all_gpus`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<u32>,
    pub mechanism: Mechanism,
    /// Default host for every workload; a workload may override it.
    pub host: Host,
}

/// Knobs of the release loop. Defaults are tuned for an idle machine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TimingSpec {
    /// Sleep until this long before a release, then spin (µs). 0 = never spin: sleep until
    /// the release.
    pub spin_us: u64,
    /// Delay between the start barrier and t0, so every workload is ready (ms).
    pub start_delay_ms: u64,
    /// Seed for every seeded random choice (spin jitter, synthetic weights).
    pub seed: u64,
}

impl Default for TimingSpec {
    fn default() -> Self {
        TimingSpec {
            spin_us: 200,
            start_delay_ms: 50,
            seed: 0x15_01a4e,
        }
    }
}

/// How the coordinator protects critical workloads from best-effort ones (`[protection]`,
/// docs/criticality.md). It acts only when a run has both kinds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProtectionSpec {
    /// `false`: best-effort work is never held back (the unprotected side of a comparison).
    pub enabled: bool,
    /// Target length of a best-effort piece (µs): a model that can be split runs its job as
    /// pieces of about this length, between which it can be held back.
    pub piece_us: u64,
    /// Safety margin kept before a critical job's deadline (µs).
    pub margin_us: u64,
    /// The worst stretch a critical job suffers while best effort runs beside it (≥ 1, e.g.
    /// from `isolane interference`): overlap then costs it `1 − 1/stretch` of its length. Unset:
    /// a full stall, which holds whatever the mechanism does.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stretch: Option<f64>,
    /// Critical work's streams at the device's greatest priority, and best-effort MPS clients at
    /// below-normal priority, where the hardware arbitrates between them (with `enabled`).
    pub priorities: bool,
    /// Best-effort work held back by the guard (with `enabled`); `false` leaves the priorities
    /// alone, to measure one lever without the other.
    pub guard: bool,
    /// What a run does when a critical deadline is predicted to miss beside its neighbours
    /// (`admission::predicted_misses`): warn (the default), refuse (exit 2) or say nothing.
    pub admission: AdmissionMode,
    /// L2 cache set aside for critical models' weights (MiB, 0: none): CUDA's persisting-L2
    /// limit and an access-policy window over each critical model's weights.
    pub l2_persist_mib: u64,
    /// A critical job with slack delays its start, whole, while a critical job without slack
    /// runs, and only as long as it still keeps its own deadline (the guard).
    pub slack_order: bool,
    /// The sharing guard: a best-effort piece may overlap critical jobs when the delay its
    /// memory intensity is predicted to cause them (`crate::predict`), corrected by each
    /// victim's measured stretch, fits their slack and their budget of overlapped jobs, which
    /// halves on a job that ends near its deadline (docs/criticality.md); not a full stall.
    pub share: bool,
    /// Best effort in runs of fine pieces (µs; 0: off, the default): a best-effort job is split
    /// into pieces of this length instead of `piece_us`, and before each run the guard admits
    /// the longest run of consecutive pieces whose estimated total fits every critical job's
    /// slack, at most `piece_us` long, launched back to back and waited for once. When set,
    /// from 20 to `piece_us`.
    pub fine_piece_us: u64,
}

/// `[protection] admission`: what a predicted miss of a critical deadline does to a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AdmissionMode {
    /// The run goes ahead, and says which workload is predicted to miss, beside whom, by how much.
    #[default]
    Warn,
    /// The run is refused (exit 2) with the same text.
    Refuse,
    /// Nothing is predicted.
    Off,
}

impl AdmissionMode {
    pub const ALL: [(&'static str, AdmissionMode); 3] = [
        ("warn", AdmissionMode::Warn),
        ("refuse", AdmissionMode::Refuse),
        ("off", AdmissionMode::Off),
    ];
}

impl Default for ProtectionSpec {
    fn default() -> Self {
        ProtectionSpec {
            enabled: true,
            piece_us: 250,
            margin_us: 100,
            stretch: None,
            priorities: true,
            guard: true,
            admission: AdmissionMode::Warn,
            l2_persist_mib: 0,
            slack_order: false,
            share: false,
            fine_piece_us: 0,
        }
    }
}

/// Whether a workload's deadlines must hold (critical) or it takes what is left (best effort).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Criticality {
    #[default]
    Critical,
    BestEffort,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    Fp32,
    Tf32,
    Fp16,
    Bf16,
    /// A float model quantized to int8 from its `calibration` set (activations per tensor,
    /// weights per output channel; docs/engine.md, Post-training quantization), run with
    /// fp16 between the quantized ops on cuda and fp32 on the CPU.
    Int8,
    /// As `Int8`, to float8 e4m3fn.
    Fp8,
}

impl Precision {
    /// Whether the model is quantized from a calibration set.
    pub fn quantized(self) -> bool {
        matches!(self, Precision::Int8 | Precision::Fp8)
    }
}

/// How a `precision = "int8"` or `"fp8"` workload's model is calibrated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CalibrationSpec {
    /// A folder of `.npy` files or images (`calibration`), absolute once resolved.
    pub dir: String,
    /// `calibration_method`; percentile (the 99.99th) unless written.
    pub method: CalibrationMethod,
    /// `calibration_skips`; quantized unless written (serde's default too, so that a spec
    /// serialized before the field existed still reads).
    #[serde(default)]
    pub skips: CalibrationSkips,
}

/// How an activation's range is chosen from the calibration set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CalibrationMethod {
    Percentile,
    Entropy,
    Minmax,
}

/// What calibration does with a residual block's skip (a convolution's fused residual).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CalibrationSkips {
    /// Quantized too: on cuda the skip stays in bytes, half the memory traffic of a block's
    /// output (TensorRT's and onnxruntime's default).
    #[default]
    Quantized,
    /// Added in floats: a little closer to the float model.
    Float,
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

/// One workload: a model at a rate (the usual kind), or an external program (`program` is
/// `Some`, docs/programs.md). A program workload has no model, rate, deadline, jobs or
/// warm-up: those fields then hold the parser's neutral values (model empty, rate `"max"`,
/// 0 jobs, 0 warm-up) and nothing reads them; [`WorkloadSpec::program`] tells the two apart.
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
    /// With precision "int8" or "fp8": the calibration set, method and skips (`calibration`,
    /// `calibration_method`, `calibration_skips`); `None` otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calibration: Option<CalibrationSpec>,
    pub rate: Rate,
    /// Relative deadline in ms; defaults to the period (required for `rate = "max"`? no: unbounded).
    pub deadline_ms: Option<f64>,
    /// When the workload's schedule starts, in ms after the run's start (`None`: at it): every
    /// release is shifted by it, so workloads of one rate can be released out of phase, as
    /// cameras that are not synchronised are. Its run length counts from there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase_ms: Option<f64>,
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
    /// On `backend = "cuda"`, compare an imported (.onnx) model's compiled plan with the CPU
    /// reference before the first job (docs/cuda.md, Plan check). Default true.
    #[serde(default = "plan_check_default")]
    pub plan_check: bool,
    #[serde(default)]
    pub criticality: Criticality,
    /// A critical workload's own worst stretch beside best effort (≥ 1, e.g. its worst cell of
    /// `isolane interference`): the guard charges its overlaps `1 − 1/stretch` instead of the
    /// run's `[protection]` model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stretch: Option<f64>,
    /// The engine this workload runs on: `device.backend` unless the workload says otherwise
    /// (a CPU workload beside GPU ones gets no GPU partition).
    #[serde(default = "cpu_backend")]
    pub backend: Backend,
    /// An external program run instead of a model (`command = [...]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub program: Option<ProgramSpec>,
    /// The GPU this workload runs on, one of the device's `gpus`. A resolved scenario holds it
    /// only when the device has several GPUs (for every GPU workload); `None` means the
    /// device's first GPU. Read it through [`WorkloadSpec::gpu_on`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<u32>,
    /// How `isolane serve` queues and batches this workload's requests (`[workload.serve]`);
    /// `run` ignores it.
    #[serde(default, skip_serializing_if = "ServeSpec::is_default")]
    pub serve: ServeSpec,
}

/// A served model's request queue and batching (`[workload.serve]`, docs/scenario.md; how
/// `isolane serve` uses them: docs/serve.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServeSpec {
    /// Requests waiting (taken, not yet running) at most.
    pub queue_limit: u32,
    /// What a request that finds the queue full gets.
    pub when_full: WhenFull,
    /// Dynamic batching: `None` takes the criticality's default (best effort batches what is
    /// queued, with no delay; critical runs one request per job).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batching: Option<Batching>,
}

impl ServeSpec {
    pub const DEFAULT_QUEUE_LIMIT: u32 = 64;

    pub fn is_default(&self) -> bool {
        *self == ServeSpec::default()
    }

    /// The batching this workload gets: its own, else best effort's default (what is queued,
    /// up to the compiled batch, no waiting), else none.
    pub fn batching_for(&self, criticality: Criticality) -> Option<Batching> {
        self.batching.clone().or(match criticality {
            Criticality::BestEffort => Some(Batching::default()),
            Criticality::Critical => None,
        })
    }
}

impl Default for ServeSpec {
    fn default() -> Self {
        ServeSpec {
            queue_limit: ServeSpec::DEFAULT_QUEUE_LIMIT,
            when_full: WhenFull::Refuse,
            batching: None,
        }
    }
}

/// At a full queue: refuse the new request (HTTP 429), or answer the oldest queued one with a
/// refusal and take the new one (a sensor's fresh frame matters more than a stale one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WhenFull {
    #[default]
    Refuse,
    DropOldest,
}

impl WhenFull {
    /// The word a scenario uses for it (`when_full = "..."`).
    pub fn name(self) -> &'static str {
        format::name_of(format::WHEN_FULL, self)
    }
}

/// Dynamic batching of a served model (Triton's dynamic batcher): requests queued together run
/// as one job of up to the workload's `batch` rows.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Batching {
    /// How long the first request of a batch may wait for more, in ms (0: run what is queued).
    pub max_delay_ms: f64,
    /// Batch sizes (rows) worth waiting for: a batch that reaches one of them runs at once.
    /// Empty: only the full batch.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub preferred: Vec<u32>,
}

fn plan_check_default() -> bool {
    true
}

/// A workload sent without `backend` (older peers) ran on the CPU unless its device said
/// otherwise, which the receiver applies through [`WorkloadSpec::device`].
fn cpu_backend() -> Backend {
    Backend::Cpu
}

impl WorkloadSpec {
    /// Period in seconds, `None` for closed loop.
    pub fn period_s(&self) -> Option<f64> {
        self.rate.hz().map(|h| 1.0 / h)
    }

    /// Relative deadline in seconds: `deadline_ms`, else the period, else none (closed loop
    /// without a deadline never times out).
    pub fn deadline_s(&self) -> Option<f64> {
        self.deadline_ms
            .map(|d| d / 1e3)
            .or_else(|| self.period_s())
    }
}

impl Scenario {
    /// Parse and validate a scenario file's text. `path` is used in messages and as the base
    /// for relative `.onnx` and weights paths (which come back absolute). `models` says which
    /// built-in model names exist (the CLI passes the engine's catalog).
    ///
    /// On error nothing is half-parsed: the result lists every problem with file, line, column
    /// and field.
    pub fn from_toml_str(
        text: &str,
        path: impl AsRef<std::path::Path>,
        models: &dyn ModelCatalog,
    ) -> Result<Scenario, SpecError> {
        parse::parse(text, path.as_ref(), models)
    }

    /// Read and validate a scenario file.
    pub fn load(
        path: impl AsRef<std::path::Path>,
        models: &dyn ModelCatalog,
    ) -> Result<Scenario, SpecError> {
        let path = path.as_ref();
        Self::from_toml_str(&Self::read_file(path)?, path, models)
    }

    /// The text of a scenario file, read once (a pipe, a process substitution or a FIFO has
    /// its text only once: parse every part of the file from this text) and at most
    /// [`crate::files::MAX_CONFIG_BYTES`] of it.
    pub fn read_file(path: impl AsRef<std::path::Path>) -> Result<String, SpecError> {
        let path = path.as_ref();
        crate::files::read_text_capped(path, crate::files::MAX_CONFIG_BYTES).map_err(|source| {
            SpecError::Read {
                file: path.display().to_string(),
                source,
            }
        })
    }

    /// Per workload of the scenario file `text` (in file order), whether it names its GPU
    /// itself (`gpu = N`): the resolved scenario fills in every GPU workload's `gpu` when the
    /// device has several, so only the file tells a workload pinned to a GPU from one the
    /// planner may place (`isolane plan --auto`). Text that is not a scenario gives none.
    pub fn workloads_naming_their_gpu(text: &str) -> Vec<bool> {
        let Ok(doc) = text.parse::<toml::Table>() else {
            return Vec::new();
        };
        let Some(toml::Value::Array(workloads)) = doc.get("workload") else {
            return Vec::new();
        };
        workloads.iter().map(|w| w.get("gpu").is_some()).collect()
    }

    /// The GPU workloads of GPU `gpu` alone, as a scenario of that one GPU (`device.gpu =
    /// gpu`, no `gpus`, no workload `gpu`): what a command that works on one GPU at a time
    /// (`isolane verify`) takes of a scenario on several. Empty of workloads when none is on it.
    pub fn on_one_gpu(&self, gpu: u32) -> Scenario {
        let mut s = self.clone();
        s.workloads = self
            .workloads
            .iter()
            .filter(|w| w.on_gpu() && w.program.is_none() && w.gpu_on(&self.device) == gpu)
            .cloned()
            .map(|w| WorkloadSpec { gpu: None, ..w })
            .collect();
        s.device.gpu = gpu;
        s.device.gpus = Vec::new();
        s
    }

    /// The resolved scenario as TOML in the user format, every default written out, so that
    /// `from_toml_str(to_toml_string())` gives back an equal `Scenario` (DESIGN.md: the output
    /// directory's `scenario.toml`).
    pub fn to_toml_string(&self) -> Result<String, SpecError> {
        write::to_toml(self)
    }

    /// Validate a scenario built in code (e.g. by `isolane maxrate` from flags) by the same
    /// rules as a file, on the value itself. There is no file the user wrote, so the problems
    /// carry no file, line or column: each names only its field (`workload[0].batch`), which a
    /// caller can translate into its own terms (a flag name) through [`SpecError::problems`].
    /// Relative `.onnx` and weights paths are taken relative to the current directory.
    pub fn validate(&self, models: &dyn ModelCatalog) -> Result<(), SpecError> {
        let problems = validate::check(
            self,
            &spans::Spans::none(),
            std::path::Path::new(""),
            models,
        );
        if problems.is_empty() {
            return Ok(());
        }
        Err(SpecError::Invalid {
            file: String::new(),
            problems: problems.into_iter().map(|(_, p)| p).collect(),
        })
    }
}

impl Ramp {
    /// The rates of the steps: `steps` values evenly spaced from `from_hz` to `to_hz`, both
    /// included (one step: `from_hz`).
    pub fn rates(&self) -> Vec<f64> {
        (0..self.steps).map(|i| self.step_rate(i)).collect()
    }

    /// The rate of step `i` (0-based) of [`Ramp::rates`].
    pub fn step_rate(&self, i: u32) -> f64 {
        let n = self.steps;
        if n <= 1 {
            self.from_hz
        } else if i >= n - 1 {
            // Exactly to_hz, not to_hz ± rounding.
            self.to_hz
        } else {
            self.from_hz + (self.to_hz - self.from_hz) * f64::from(i) / f64::from(n - 1)
        }
    }

    /// Number of steps.
    pub fn step_count(&self) -> u32 {
        self.steps
    }

    /// Total length of the ramp, `steps × step_s`, in seconds.
    pub fn total_duration_s(&self) -> f64 {
        f64::from(self.steps) * self.step_s
    }

    /// Index of the step that covers `t_s` seconds after t0 (`None` after the ramp's end).
    pub fn step_at(&self, t_s: f64) -> Option<u32> {
        if t_s.is_nan() || t_s < 0.0 || t_s >= self.total_duration_s() {
            return None;
        }
        Some(((t_s / self.step_s) as u32).min(self.steps.saturating_sub(1)))
    }
}

impl DeviceSpec {
    /// Every GPU of the scenario, in the file's order: `gpus`, or `[gpu]` for one GPU.
    pub fn all_gpus(&self) -> Vec<u32> {
        if self.gpus.is_empty() {
            vec![self.gpu]
        } else {
            self.gpus.clone()
        }
    }

    /// Whether the scenario spreads its workloads over more than one GPU.
    pub fn several_gpus(&self) -> bool {
        self.gpus.len() > 1
    }
}

impl WorkloadSpec {
    /// The GPU index this workload runs on: its own `gpu`, else the device's first.
    pub fn gpu_on(&self, device: &DeviceSpec) -> u32 {
        self.gpu.unwrap_or(device.gpu)
    }

    /// The device this workload runs on: the scenario's, with the workload's own backend (a
    /// CPU workload of a GPU scenario is not partitioned: mechanism `none`) and its own GPU
    /// as `gpu` (what a worker falls back on when its environment names no GPU).
    pub fn device(&self, scenario: &DeviceSpec) -> DeviceSpec {
        match self.backend {
            Backend::Cuda => DeviceSpec {
                gpu: self.gpu_on(scenario),
                ..scenario.clone()
            },
            Backend::Cpu => DeviceSpec {
                backend: Backend::Cpu,
                mechanism: Mechanism::None,
                ..scenario.clone()
            },
        }
    }

    /// Whether this workload runs on the GPU (and so takes a GPU partition).
    pub fn on_gpu(&self) -> bool {
        self.backend == Backend::Cuda
    }

    /// What the `model` string refers to. Cannot fail for a validated spec.
    pub fn model_source(&self) -> Result<ModelSource, ModelParseError> {
        ModelSource::classify(&self.model)
    }

    /// The spin model, when the model is `spin:`.
    pub fn spin(&self) -> Option<SpinModel> {
        SpinModel::parse(&self.model).ok()
    }

    /// The synthetic kernel, when the model is `kernel:`.
    pub fn kernel(&self) -> Option<KernelModel> {
        KernelModel::parse(&self.model).ok()
    }

    /// Relative deadline in whole ns (rounded), `None` = never times out.
    pub fn deadline_ns(&self) -> Option<i64> {
        self.deadline_s().map(crate::schedule::secs_to_ns)
    }

    /// Jobs the workload will release (warm-up excluded), when known ahead: a job count, or a
    /// duration at a fixed rate. Closed loop with a duration: `None`.
    pub fn planned_jobs(&self) -> Option<u64> {
        match (self.length, self.rate) {
            (RunLength::Jobs(n), _) => Some(n),
            (RunLength::DurationS(d), Rate::Hz(hz)) => match self.ramp {
                // Step by step, without the list of rates (a ramp may have billions of steps).
                Some(r) if self.role == Role::Interferer => Some(
                    (0..r.steps)
                        .map(|i| crate::schedule::jobs_in(r.step_s, r.step_rate(i)))
                        .sum(),
                ),
                _ => Some(crate::schedule::jobs_in(d, hz)),
            },
            (RunLength::DurationS(_), Rate::Max(_)) => None,
        }
    }
}

#[cfg(test)]
mod tests;
