//! coexec.json and coexec.csv: what `isolane coexec` measured (docs/coexec.md). Each job alone
//! and each concurrent cell is an ordinary run folder; the index says what each was, its
//! times and energy, and the speedup and slowdowns computed from them.

use serde::{Deserialize, Serialize};

use super::csv_field;
use super::{legacy_version, Versioned};
use crate::spec::KernelWork;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CoexecIndex {
    #[serde(default = "legacy_version")]
    pub schema_version: u32,
    pub isolane_version: String,
    /// The jobs file.
    pub jobs_file: String,
    pub backend: String,
    /// The mechanisms asked for, in order (`none`, `timeslice`, `mps`, `mps-provisioned`,
    /// `green`, `mig`).
    pub mechanisms: Vec<String>,
    /// The thresholds the pairs were classified with.
    pub thresholds: IntensityThresholds,
    /// Why the energy fields are absent, where they are (no NVML energy counter).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub energy_note: Option<String>,
    pub jobs: Vec<CoexecJob>,
    pub cells: Vec<CoexecCell>,
}

impl Versioned for CoexecIndex {
    fn schema_version(&self) -> u32 {
        self.schema_version
    }
}

/// A job is memory-bound when its DRAM bandwidth use alone is at least `dram_bw_util_pct`
/// (NVML GPM, Hopper and later), else, for a `kernel:` job, when its FLOPs per byte are below
/// `flop_per_byte`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct IntensityThresholds {
    pub dram_bw_util_pct: f64,
    pub flop_per_byte: f64,
}

/// How a job uses the device, measured alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Intensity {
    Memory,
    Compute,
    /// Neither DRAM telemetry nor a known work per job.
    Unknown,
}

impl Intensity {
    pub fn word(self) -> &'static str {
        match self {
            Intensity::Memory => "memory",
            Intensity::Compute => "compute",
            Intensity::Unknown => "unknown",
        }
    }
}

/// What a pair is, from its two jobs' intensities.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PairClass {
    BothMemory,
    Mixed,
    BothCompute,
    Unknown,
}

impl PairClass {
    pub fn word(self) -> &'static str {
        match self {
            PairClass::BothMemory => "both_memory",
            PairClass::Mixed => "mixed",
            PairClass::BothCompute => "both_compute",
            PairClass::Unknown => "unknown",
        }
    }
}

/// One job alone (the reference of its slowdowns and of the sequential cells).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CoexecJob {
    pub name: String,
    /// The model (`spin:…`, `kernel:…`, a network) or the command, joined with spaces.
    pub what: String,
    /// The alone run's folder, relative to the study folder.
    pub dir: String,
    /// `ok`, `failed`, `interrupted` or `error` (it did not run).
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// t0 to the job's end, alone (s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wall_s: Option<f64>,
    /// The device's energy over the alone run (J), from NVML.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub energy_j: Option<f64>,
    /// Mean DRAM bandwidth used alone, % of the peak (GPM).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dram_bw_util_pct: Option<f64>,
    /// A `kernel:` job's work per inference, and for all its jobs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub work: Option<KernelWork>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_total: Option<u64>,
    pub intensity: Intensity,
}

/// A pair run one way: `sequential` (computed from the alone runs) or concurrently under one
/// mechanism.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CoexecCell {
    pub a: String,
    pub b: String,
    /// `sequential`, or the mechanism.
    pub mechanism: String,
    /// The run folder (empty for `sequential` and skipped cells).
    pub dir: String,
    /// `ok`, `failed`, `interrupted`, `error` or `skipped`.
    pub status: String,
    /// Why it was skipped or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub class: PairClass,
    /// Each job's partition in this cell (`64 SMs`, `50 %`), where partitioned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition_a: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition_b: Option<String>,
    #[serde(flatten)]
    pub m: CellMetrics,
}

/// The measured times and energy of a cell and what is computed from them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CellMetrics {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wall_a_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wall_b_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub makespan_s: Option<f64>,
    /// wall_a alone + wall_b alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequential_s: Option<f64>,
    /// sequential_s / makespan_s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speedup: Option<f64>,
    /// Each job's wall time here over alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slowdown_a: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slowdown_b: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub energy_j: Option<f64>,
    /// energy alone of a + of b.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequential_energy_j: Option<f64>,
    /// energy_j / sequential_energy_j.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub energy_vs_sequential: Option<f64>,
}

pub const COEXEC_CSV_HEADER: &str = "a,b,mechanism,status,class,partition_a,partition_b,\
wall_a_s,wall_b_s,makespan_s,sequential_s,speedup,slowdown_a,slowdown_b,energy_j,\
sequential_energy_j,energy_vs_sequential,reason,dir";

/// One row per cell (`sequential` rows included); empty where a value is absent.
pub fn coexec_csv(cells: &[CoexecCell]) -> String {
    let mut out = String::from(COEXEC_CSV_HEADER);
    out.push('\n');
    for c in cells {
        let f = |v: Option<f64>| v.map_or(String::new(), |x| format!("{x:.6}"));
        let s = |v: &Option<String>| csv_field(v.as_deref().unwrap_or(""));
        let m = &c.m;
        let row = [
            csv_field(&c.a),
            csv_field(&c.b),
            c.mechanism.clone(),
            c.status.clone(),
            c.class.word().to_string(),
            s(&c.partition_a),
            s(&c.partition_b),
            f(m.wall_a_s),
            f(m.wall_b_s),
            f(m.makespan_s),
            f(m.sequential_s),
            f(m.speedup),
            f(m.slowdown_a),
            f(m.slowdown_b),
            f(m.energy_j),
            f(m.sequential_energy_j),
            f(m.energy_vs_sequential),
            s(&c.reason),
            csv_field(&c.dir),
        ];
        out.push_str(&row.join(","));
        out.push('\n');
    }
    out
}
