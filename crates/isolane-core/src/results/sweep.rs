//! sweep.json: what `isolane sweep` swept and where each point's run folder is.

use serde::{Deserialize, Serialize};

use super::{legacy_version, Versioned};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepIndex {
    #[serde(default = "legacy_version")]
    pub schema_version: u32,
    pub isolane_version: String,
    /// `partition` or `concurrency`.
    pub kind: String,
    pub model: String,
    pub backend: String,
    pub mechanism: String,
    /// The precisions swept, comma-separated when several.
    pub precision: String,
    /// partition: the device model the sizes come from; `sms` or `thread_pct`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit: Option<String>,
    /// false on the CPU backend: the points are labelled with a size, but nothing is
    /// partitioned (a dry run of the machinery).
    pub partition_applied: bool,
    /// Hz, or null for closed loop.
    pub rate_hz: Option<f64>,
    pub duration_s: f64,
    pub points: Vec<SweepPoint>,
}

impl Versioned for SweepIndex {
    fn schema_version(&self) -> u32 {
        self.schema_version
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SweepPoint {
    /// The point's run folder, relative to the sweep folder.
    pub dir: String,
    /// `pending`, then the run's: `ok`, `failed`, `interrupted`, or `error` (it did not run).
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sms: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread_pct: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workloads: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precision: Option<String>,
}
