//! The vocabulary of the scenario file format, shared by the walk that reads a file
//! (`spec::parse`), the rules that check a scenario (`spec::validate`) and the writer
//! (`spec::write`): the keys of each table, the names of enum values, the defaults, each integer
//! field's bounds and the "expected ..." text of every field. One place, so that a refused value
//! is told the same bounds whether the walk (wrong type) or a rule (out of range) refused it.

use super::limits::{MAX_BATCH_DELAY_MS, MAX_QUEUE_LIMIT};
use super::limits::{
    MAX_JOBS, MAX_MARGIN_US, MAX_PIECE_US, MAX_RAMP_STEPS, MAX_RATE_HZ, MAX_SECONDS, MAX_SPIN_US,
    MAX_START_DELAY_MS, MAX_STRETCH, MIN_PIECE_US,
};
use super::model::ModelCatalog;
use super::{
    Backend, CalibrationMethod, CalibrationSkips, Criticality, Host, LatePolicy, Mechanism,
    Precision, Role, WhenFull,
};

/// `app`: the `[[app]]` tables (pipelines and ensembles), read and validated by `isolane-app`
/// (docs/apps.md); this walk only lets them through.
pub(super) const ROOT_KEYS: &[&str] = &["device", "timing", "protection", "workload", "app"];
/// The keys each table of a scenario allows (also the property tests' alphabet).
pub const DEVICE_KEYS: &[&str] = &["backend", "gpu", "gpus", "mechanism", "host"];
pub const TIMING_KEYS: &[&str] = &["spin_us", "start_delay_ms", "seed"];
pub const PROTECTION_KEYS: &[&str] = &[
    "enabled",
    "piece_us",
    "margin_us",
    "stretch",
    "priorities",
    "guard",
    "admission",
    "l2_persist_mib",
    "slack_order",
    "share",
    "fine_piece_us",
];
pub const WORKLOAD_KEYS: &[&str] = &[
    "name",
    "model",
    "weights",
    "batch",
    "precision",
    "calibration",
    "calibration_method",
    "calibration_skips",
    "rate_hz",
    "deadline_ms",
    "phase_ms",
    "duration_s",
    "jobs",
    "warmup_jobs",
    "late",
    "cpu",
    "role",
    "ramp",
    "host",
    "partition",
    "plan_check",
    "criticality",
    "stretch",
    "backend",
    "gpu",
    "serve",
    "command",
    "env",
    "cwd",
    "timeout_s",
];
/// `[workload.serve]`: how `isolane serve` queues and batches a model's requests.
pub const SERVE_KEYS: &[&str] = &["queue_limit", "when_full", "batching"];
/// `[workload.serve.batching]`.
pub const BATCHING_KEYS: &[&str] = &["max_delay_ms", "preferred"];
pub(super) const RAMP_KEYS: &[&str] = &["from_hz", "to_hz", "steps", "step_s"];
pub(super) const PARTITION_KEYS: &[&str] = &["sms", "thread_pct", "mem_limit_mib", "mig_profile"];

pub(super) const BACKENDS: &[(&str, Backend)] = &[("cpu", Backend::Cpu), ("cuda", Backend::Cuda)];
pub(super) const MECHANISMS: &[(&str, Mechanism)] = &[
    ("none", Mechanism::None),
    ("timeslice", Mechanism::Timeslice),
    ("mps", Mechanism::Mps),
    ("mig", Mechanism::Mig),
    ("green", Mechanism::Green),
];
pub(super) const HOSTS: &[(&str, Host)] = &[("thread", Host::Thread), ("process", Host::Process)];
pub(super) const PRECISIONS: &[(&str, Precision)] = &[
    ("fp32", Precision::Fp32),
    ("tf32", Precision::Tf32),
    ("fp16", Precision::Fp16),
    ("bf16", Precision::Bf16),
    ("int8", Precision::Int8),
    ("fp8", Precision::Fp8),
];
pub(super) const CALIBRATION_METHODS: &[(&str, CalibrationMethod)] = &[
    ("percentile", CalibrationMethod::Percentile),
    ("entropy", CalibrationMethod::Entropy),
    ("minmax", CalibrationMethod::Minmax),
];
pub(super) const CALIBRATION_SKIPS: &[(&str, CalibrationSkips)] = &[
    ("quantized", CalibrationSkips::Quantized),
    ("float", CalibrationSkips::Float),
];
/// What `calibration` holds.
pub(super) const CALIBRATION_EXPECTED: &str =
    "a folder of .npy files or images (relative to the scenario file's)";
pub(super) const LATE: &[(&str, LatePolicy)] =
    &[("skip", LatePolicy::Skip), ("queue", LatePolicy::Queue)];
pub(super) const CRITICALITIES: &[(&str, Criticality)] = &[
    ("critical", Criticality::Critical),
    ("best_effort", Criticality::BestEffort),
];
pub(super) const WHEN_FULL: &[(&str, WhenFull)] = &[
    ("refuse", WhenFull::Refuse),
    ("drop_oldest", WhenFull::DropOldest),
];
pub(super) const ROLES: &[(&str, Role)] = &[
    ("standalone", Role::Standalone),
    ("victim", Role::Victim),
    ("interferer", Role::Interferer),
];

pub(super) fn name_of<T: PartialEq + Copy>(table: &[(&'static str, T)], v: T) -> &'static str {
    table.iter().find(|(_, t)| *t == v).map_or("?", |(n, _)| n)
}

/// Default warm-up, in jobs (DESIGN.md: warm-up jobs run first and are excluded).
pub(super) const DEFAULT_WARMUP_JOBS: u64 = 10;

pub(super) fn default_mechanism(backend: Backend) -> Mechanism {
    match backend {
        Backend::Cpu => Mechanism::None,
        // No partitioning: the papers' "GPU stand-alone".
        Backend::Cuda => Mechanism::Timeslice,
    }
}

pub(super) fn default_host(mechanism: Mechanism) -> Host {
    match mechanism {
        // Green contexts of one process run concurrently; separate processes would not
        // (DESIGN.md, "Partitions").
        Mechanism::None | Mechanism::Green => Host::Thread,
        Mechanism::Timeslice | Mechanism::Mps | Mechanism::Mig => Host::Process,
    }
}

/// The bounds of an integer field, both inclusive. The walk refuses what does not fit the
/// field's Rust type, a rule what is outside the bounds; both say the same text.
#[derive(Debug, Clone, Copy)]
pub(super) struct IntRule {
    pub min: u64,
    pub max: u64,
}

impl IntRule {
    const fn new(min: u64, max: u64) -> IntRule {
        IntRule { min, max }
    }

    pub fn allows(self, n: u64) -> bool {
        n >= self.min && n <= self.max
    }

    /// Both bounds, always: a value too large must be told the real limit.
    pub fn expected(self) -> String {
        let IntRule { min, max } = self;
        if max == 100 {
            format!("an integer from {min} to {max}")
        } else {
            format!("an integer >= {min} (at most {max})")
        }
    }
}

const U32: u64 = u32::MAX as u64;
pub(super) const GPU: IntRule = IntRule::new(0, U32);
pub(super) const SPIN_US: IntRule = IntRule::new(0, MAX_SPIN_US);
pub(super) const START_DELAY_MS: IntRule = IntRule::new(0, MAX_START_DELAY_MS);
pub(super) const SEED: IntRule = IntRule::new(0, u64::MAX);
pub(super) const PIECE_US: IntRule = IntRule::new(MIN_PIECE_US, MAX_PIECE_US);
/// `[protection] fine_piece_us`: off, or a piece from the shortest to `piece_us` (a run of
/// them is capped at `piece_us`, so a longer fine piece would be no run at all).
pub(super) fn fine_piece_expected(piece_us: Option<u64>) -> String {
    let most = piece_us.map_or_else(|| "piece_us".to_string(), |n| format!("piece_us ({n})"));
    format!("0 (off), or an integer from {MIN_PIECE_US} to {most}")
}
pub(super) const MARGIN_US: IntRule = IntRule::new(0, MAX_MARGIN_US);
/// The L2 set aside: at most a GiB (an H200 has 60 MB of L2; the device's own limit is checked
/// where the model is built).
pub(super) const L2_PERSIST_MIB: IntRule = IntRule::new(0, 1024);
pub(super) const BATCH: IntRule = IntRule::new(1, U32);
pub(super) const JOBS: IntRule = IntRule::new(1, MAX_JOBS);
pub(super) const WARMUP_JOBS: IntRule = IntRule::new(0, MAX_JOBS);
pub(super) const CPU_ID: IntRule = IntRule::new(0, U32);
pub(super) const STEPS: IntRule = IntRule::new(1, MAX_RAMP_STEPS);
pub(super) const SMS: IntRule = IntRule::new(1, U32);
pub(super) const THREAD_PCT: IntRule = IntRule::new(1, 100);
pub(super) const MEM_LIMIT_MIB: IntRule = IntRule::new(1, i64::MAX as u64);
pub(super) const QUEUE_LIMIT: IntRule = IntRule::new(1, MAX_QUEUE_LIMIT);

/// What a time value may be: more than 0, from 1 ns (`MIN_SECONDS`) to 100 days
/// ([`MAX_SECONDS`]), in seconds or milliseconds.
pub(super) fn seconds_expected(unit: &str, per_second: f64) -> String {
    let (lo, hi) = if per_second == 1e3 {
        ("1e-6", "8.64e9")
    } else {
        ("1e-9", "8.64e6")
    };
    debug_assert_eq!(hi.parse::<f64>().ok(), Some(MAX_SECONDS * per_second));
    format!("a finite number of {unit} > 0, from {lo} (1 ns) to {hi} (100 days)")
}

pub(super) fn phase_expected() -> String {
    "a finite number of milliseconds >= 0, up to 8.64e9 (100 days)".into()
}

pub(super) fn rate_expected() -> String {
    format!(
        "a finite number > 0 (jobs per second) and <= {MAX_RATE_HZ:e} (one per ns, the clock's \
         resolution), or \"max\" (closed loop)"
    )
}

/// A ramp's `from_hz` and `to_hz`.
pub(super) fn hz_expected() -> String {
    format!("a finite rate > 0 in Hz, at most {MAX_RATE_HZ:e}")
}

pub(super) fn stretch_expected() -> String {
    format!(
        "a number from 1 to {MAX_STRETCH} (how many times longer a critical job may take beside \
         best effort)"
    )
}

/// `[workload.serve.batching]`'s `max_delay_ms`.
pub(super) fn max_delay_expected() -> String {
    format!(
        "a finite number of milliseconds >= 0, at most {MAX_BATCH_DELAY_MS} (how long a batch's \
         first request may wait for more)"
    )
}

/// `[workload.serve.batching]`'s `preferred`, for a workload of `batch` rows (`None`: its batch
/// is not known, the walk refused it).
pub(super) fn preferred_expected(batch: Option<u32>) -> String {
    let bound = match batch {
        Some(b) => format!("the workload's batch ({b})"),
        None => "the workload's batch".to_string(),
    };
    format!("an array of batch sizes from 1 to {bound}, strictly increasing, e.g. [4, 8]")
}

pub(super) const NAME_EXPECTED: &str = "a name of 1 to 64 letters, digits, '_', '.' or '-' (it \
                                        becomes a file name), not only dots";
pub(super) const MIG_EXPECTED: &str = "a MIG profile name such as \"1g.10gb\" or \"3g.40gb\"";
pub(super) const RAMP_EXPECTED: &str = "ramp = { from_hz = <Hz>, to_hz = <Hz>, steps = <n>, \
                                        step_s = <s> } (an interferer's rate comes from its ramp)";

pub(super) fn model_expectation(models: &dyn ModelCatalog) -> String {
    let names = models.builtin_names();
    let builtins = if names.is_empty() {
        "no built-in models in this build".to_string()
    } else {
        format!("a built-in model: {}", names.join(", "))
    };
    format!(
        "\"spin:<time>[~<jitter>]\" (e.g. \"spin:4ms\"), \"kernel:<kind>:…\" (e.g. \
         \"kernel:triad:256MiB\"), a path ending in .onnx, or {builtins}"
    )
}
