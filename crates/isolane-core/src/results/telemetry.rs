//! The `telemetry` object of summary.json (names as in docs/design.md's metric list). The
//! telemetry crate computes it; it is defined here so that every reader sees the same fields.

use serde::{Deserialize, Serialize};

/// `{mean, min, max}` of one quantity over the samples that have it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Stat {
    pub mean: f64,
    pub min: f64,
    pub max: f64,
}

/// How the energy was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EnergySource {
    /// Every interval from the driver's energy counter.
    Counter,
    /// Every interval by integrating power (no counter, or it wrapped or reset).
    IntegratedPower,
    /// Some of each.
    Mixed,
    /// Neither counter nor power: no energy.
    None,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TelemetrySummary {
    pub source: String,
    pub device: String,
    /// The GPU (device index) sampled, in a run on several GPUs (`RunSummary::telemetry_per_gpu`);
    /// absent for one GPU, whose summary reads as it did before several GPUs existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<u32>,
    pub period_ms: f64,
    /// Samples inside the window summarised (the run: t0 to its end).
    pub samples: usize,
    pub duration_s: f64,
    pub power_w: Option<Stat>,
    /// Energy over the window.
    pub energy_j: Option<f64>,
    pub energy_source: EnergySource,
    pub sm_clock_mhz: Option<Stat>,
    pub mem_clock_mhz: Option<Stat>,
    pub temperature_c: Option<Stat>,
    /// Every throttle reason seen in at least one sample of the window.
    pub throttle_reasons: Vec<String>,
    pub memory_used_mib: Option<Stat>,
    pub gpu_util_pct: Option<Stat>,
    pub sm_util_pct: Option<Stat>,
    pub sm_occupancy_pct: Option<Stat>,
    pub tensor_util_pct: Option<Stat>,
    pub dram_bw_util_pct: Option<Stat>,
    /// The sampler's own cost: CPU seconds of its thread, and as % of one core over its life.
    pub sampler_cpu_s: f64,
    pub sampler_cpu_pct: f64,
    /// Periods the sampler could not keep (a reading took longer than the period).
    pub sampler_overruns: u64,
    /// Queries refreshed less often than every reading to keep the sampler's CPU cost in
    /// budget, with their refresh period in ms (their columns are empty in between).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub refresh_ms: std::collections::BTreeMap<String, f64>,
}
