//! Device telemetry around a run (isolane-telemetry): sampling starts before t0 and stops
//! after the last workload; telemetry.csv goes into the run folder and the summary into
//! summary.json's `telemetry` object. Only for `backend = "cuda"`; without NVML the run goes on
//! without telemetry, with a warning.

use std::path::Path;

use crate::Observer;
use isolane_core::results::RunSummary;
use isolane_core::spec::{Backend, Scenario};
use isolane_runtime::coordinator::RunResult;
use isolane_telemetry::{RunTelemetry, SampleHook, DEFAULT_PERIOD};

/// Environment variable: the sampling period in ms (default 50).
pub const PERIOD_ENV: &str = "ISOLANE_TELEMETRY_PERIOD_MS";

/// Starts the sampler for a GPU scenario, showing each reading to `hook` (live metrics);
/// `None` on the CPU or when NVML is missing (warned).
pub fn start(
    scenario: &Scenario,
    hook: Option<SampleHook>,
    observer: &mut dyn Observer,
) -> Option<RunTelemetry> {
    if scenario.device.backend != Backend::Cuda {
        return None;
    }
    let period = std::env::var(PERIOD_ENV)
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|&ms| ms > 0)
        .map_or(DEFAULT_PERIOD, std::time::Duration::from_millis);
    if scenario.device.several_gpus() {
        // Sampling each GPU (a gpu column) is not built yet (docs/partitions.md, Several GPUs).
        observer.warning(&format!(
            "device telemetry samples GPU {} only, not every GPU of device.gpus",
            scenario.device.gpu
        ));
    }
    match RunTelemetry::start(scenario.device.gpu, period, hook) {
        Ok(t) => Some(t),
        Err(e) => {
            observer.warning(&format!("no device telemetry for this run: {e}"));
            None
        }
    }
}

/// Stops the sampler, writes telemetry.csv and puts the summary (and what can be attributed
/// to each workload: energy when it ran alone, device memory by process) into `summary`.
pub fn finish(
    telemetry: Option<RunTelemetry>,
    out: &Path,
    result: &RunResult,
    summary: &mut RunSummary,
    observer: &mut dyn Observer,
) {
    let Some(t) = telemetry else { return };
    let (rec, tsum) = match t.finish(out, result.t0_ns, result.wall_s) {
        Ok(x) => x,
        Err(e) => {
            observer.warning(&format!("device telemetry lost: {e}"));
            return;
        }
    };
    isolane_telemetry::attach(summary, &rec, &tsum);
    observer.note(&format!(
        "telemetry: {} samples, sampler CPU {:.2} % of a core",
        rec.samples.len(),
        rec.cpu_pct()
    ));
}
