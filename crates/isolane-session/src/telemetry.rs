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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Progress;
    use isolane_core::spec::NoBuiltinModels;

    /// Keeps the warnings a run would show.
    #[derive(Default)]
    struct Warnings(Vec<String>);

    impl Observer for Warnings {
        fn progress(&mut self, _: &Progress) {}
        fn finished(&mut self) {}
        fn warning(&mut self, message: &str) {
            self.0.push(message.to_string());
        }
        fn note(&mut self, _: &str) {}
    }

    fn scenario(device: &str) -> Scenario {
        let text = format!(
            "[device]\nbackend = \"cuda\"\n{device}\nmechanism = \"timeslice\"\n\
             [[workload]]\nname = \"a\"\nmodel = \"spin:1ms\"\nrate_hz = 10\njobs = 1\n"
        );
        Scenario::from_toml_str(&text, "s.toml", &NoBuiltinModels).unwrap()
    }

    #[test]
    fn a_run_on_several_gpus_is_warned_that_only_the_first_is_sampled() {
        let mut seen = Warnings::default();
        let sampler = start(&scenario("gpus = [1, 0]"), None, &mut seen);
        assert_eq!(
            seen.0.first().map(String::as_str),
            Some("device telemetry samples GPU 1 only, not every GPU of device.gpus")
        );
        drop(sampler);
        let mut one = Warnings::default();
        drop(start(&scenario("gpu = 1"), None, &mut one));
        assert!(
            one.0.iter().all(|w| !w.contains("only")),
            "one GPU: {:?}",
            one.0
        );
    }
}
