//! maxrate.json: one max-stable-rate search (`isolane maxrate --out`).

use serde::{Deserialize, Serialize};

use super::{legacy_version, Versioned};
use crate::maxrate::{MaxRateConfig, TraceStep};
use crate::spec::{Backend, Mechanism, Precision};

/// Start lateness over all timed batches, µs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LatenessSummary {
    pub p50: Option<f64>,
    pub p99: Option<f64>,
    pub max: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MaxrateReport {
    #[serde(default = "legacy_version")]
    pub schema_version: u32,
    pub isolane_version: String,
    pub model: String,
    pub batch: u32,
    /// Version 1 files of the CPU-only searches have no backend, precision or mechanism.
    #[serde(default = "cpu")]
    pub backend: Backend,
    #[serde(default = "fp32")]
    pub precision: Precision,
    /// `none` on the CPU; `timeslice` for the whole GPU.
    #[serde(default = "no_mechanism")]
    pub mechanism: Mechanism,
    /// The partition the search ran in: green SMs or MPS thread %.
    #[serde(default)]
    pub sms: Option<u32>,
    #[serde(default)]
    pub thread_pct: Option<u32>,
    pub config: MaxRateConfig,
    /// The max stable rate f (IMS), jobs per second.
    pub max_rate_hz: f64,
    /// `L_max = 1/f`, ms.
    pub l_max_ms: f64,
    pub initial_rate_hz: f64,
    pub start_lateness_us: LatenessSummary,
    #[serde(default)]
    pub cpu_steal_pct: Option<f64>,
    pub trace: Vec<TraceStep>,
}

fn cpu() -> Backend {
    Backend::Cpu
}

fn fp32() -> Precision {
    Precision::Fp32
}

fn no_mechanism() -> Mechanism {
    Mechanism::None
}

impl Versioned for MaxrateReport {
    fn schema_version(&self) -> u32 {
        self.schema_version
    }
}

impl MaxrateReport {
    /// The column of the papers' Tables II–III this result belongs to: the mechanism (or the
    /// backend on the CPU) and the partition size.
    pub fn column(&self) -> String {
        let base = match (self.mechanism, self.backend) {
            (Mechanism::None, Backend::Cpu) => "cpu".to_string(),
            (Mechanism::None, Backend::Cuda) => "timeslice".to_string(),
            (m, _) => enum_word(&m),
        };
        match (self.sms, self.thread_pct) {
            (Some(s), _) => format!("{base} ({s} SMs)"),
            (None, Some(p)) => format!("{base} ({p}%)"),
            _ => base,
        }
    }

    /// The row of those tables: model, precision when not fp32, batch when not 1.
    pub fn row(&self) -> String {
        let mut r = self.model.clone();
        if self.precision != Precision::Fp32 {
            r = format!("{r} {}", enum_word(&self.precision));
        }
        if self.batch != 1 {
            r = format!("{r} (batch {})", self.batch);
        }
        r
    }
}

/// A unit enum's serde name (`Mechanism::Green` → `green`).
pub(crate) fn enum_word<T: Serialize>(v: &T) -> String {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::String(s)) => s,
        _ => String::new(),
    }
}
