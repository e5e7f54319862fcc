//! Device telemetry around a run (isolane-telemetry): sampling starts before t0 and stops
//! after the last workload; telemetry.csv goes into the run folder and the summary into
//! summary.json's `telemetry` object (`telemetry_per_gpu` on several GPUs: every GPU of
//! `[device] gpus` is sampled). Only for `backend = "cuda"`; without NVML the run goes on
//! without telemetry, with a warning.

use std::path::Path;

use crate::Observer;
use isolane_core::results::RunSummary;
use isolane_core::spec::{Backend, Scenario};
use isolane_telemetry::{RunTelemetry, SampleHook, DEFAULT_PERIOD};

/// Environment variable: the sampling period in ms (default 50).
pub const PERIOD_ENV: &str = "ISOLANE_TELEMETRY_PERIOD_MS";

/// Starts the sampler for a GPU scenario, one per GPU of the scenario, showing each reading of
/// the first GPU to `hook` (live metrics); `None` on the CPU or when NVML is missing (warned).
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
    match RunTelemetry::start(&scenario.device.all_gpus(), period, hook) {
        Ok(t) => Some(t),
        Err(e) => {
            observer.warning(&format!("no device telemetry for this run: {e}"));
            None
        }
    }
}

/// Stops the sampler, writes telemetry.csv and puts the summary (and what can be attributed
/// to each workload on its own GPU: energy when it ran alone there, device memory by process)
/// into `summary`.
pub fn finish(
    telemetry: Option<RunTelemetry>,
    scenario: &Scenario,
    out: &Path,
    (t0_ns, wall_s): (Option<i64>, f64),
    summary: &mut RunSummary,
    observer: &mut dyn Observer,
) {
    let Some(t) = telemetry else { return };
    let gpus = match t.finish(out, t0_ns, wall_s) {
        Ok(x) => x,
        Err(e) => {
            observer.warning(&format!("device telemetry lost: {e}"));
            return;
        }
    };
    isolane_telemetry::attach_gpus(summary, &gpus, &|name| gpu_of(scenario, name));
    for g in &gpus {
        observer.note(&format!(
            "telemetry{}: {} samples, sampler CPU {:.2} % of a core",
            g.summary
                .gpu
                .map_or(String::new(), |n| format!(" of GPU {n}")),
            g.recording.samples.len(),
            g.recording.cpu_pct()
        ));
    }
}

/// The GPU a workload of `scenario` ran on: its own `gpu`, else the device's first (a command
/// workload's too); `None` for a workload on the CPU or a name the scenario does not have.
pub fn gpu_of(scenario: &Scenario, name: &str) -> Option<u32> {
    let w = scenario.workloads.iter().find(|w| w.name == name)?;
    (w.program.is_some() || w.on_gpu()).then(|| w.gpu_on(&scenario.device))
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
    fn a_run_on_several_gpus_is_not_warned_that_one_gpu_is_sampled() {
        // Without NVML (CI) the only warning is that there is no telemetry at all.
        let mut seen = Warnings::default();
        drop(start(&scenario("gpus = [1, 0]"), None, &mut seen));
        assert!(
            seen.0.iter().all(|w| w.starts_with("no device telemetry")),
            "{:?}",
            seen.0
        );
    }

    /// A fake GPU of constant power and a counter of `watts` J per reading; `reads` counts
    /// its readings for the test to wait on.
    struct Fake {
        watts: f64,
        n: u64,
        reads: std::sync::Arc<std::sync::atomic::AtomicU64>,
    }

    impl isolane_telemetry::Source for Fake {
        fn device(&self) -> String {
            "Fake GPU".into()
        }
        fn kind(&self) -> &'static str {
            "fake"
        }
        fn read(&mut self) -> isolane_telemetry::Reading {
            self.n += 1;
            self.reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            isolane_telemetry::Reading {
                power_w: Some(self.watts),
                energy_counter_mj: Some((self.watts * 1000.0) as u64 * self.n),
                ..Default::default()
            }
        }
    }

    #[test]
    fn a_run_on_two_gpus_writes_each_gpus_telemetry_and_attributes_it_by_gpu() {
        let text = "[device]\nbackend = \"cuda\"\ngpus = [0, 1]\nmechanism = \"timeslice\"\n\
                    [[workload]]\nname = \"a\"\nmodel = \"spin:1ms\"\nrate_hz = 10\njobs = 1\n\
                    [[workload]]\nname = \"b\"\nmodel = \"spin:1ms\"\nrate_hz = 10\njobs = 1\n\
                    gpu = 1\n";
        let s = Scenario::from_toml_str(text, "s.toml", &NoBuiltinModels).unwrap();
        let reads: Vec<_> = (0..2)
            .map(|_| std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0)))
            .collect();
        let fake = |watts: f64, i: usize| -> Box<dyn isolane_telemetry::Source> {
            Box::new(Fake {
                watts,
                n: 0,
                reads: std::sync::Arc::clone(&reads[i]),
            })
        };
        let sources = vec![(0, fake(100.0, 0)), (1, fake(300.0, 1))];
        let t = RunTelemetry::start_sources(sources, std::time::Duration::from_millis(5), None)
            .unwrap();
        // Two readings per GPU make an energy: wait for three of each, however loaded the
        // machine (the deadline only stops a broken sampler from hanging the test).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while reads
            .iter()
            .any(|r| r.load(std::sync::atomic::Ordering::SeqCst) < 3)
        {
            assert!(
                std::time::Instant::now() < deadline,
                "the samplers stopped reading"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let dir = tempfile::tempdir().unwrap();
        let mut summary = isolane_core::results::RunSummary::new("run");
        for name in ["a", "b"] {
            let mut w = isolane_core::results::WorkloadSummary::new(name, "spin:1ms", 1);
            w.metrics.completed = 1;
            summary.workloads.push(w);
        }
        let mut seen = Warnings::default();
        finish(
            Some(t),
            &s,
            dir.path(),
            (None, 0.0),
            &mut summary,
            &mut seen,
        );
        assert!(seen.0.is_empty(), "{:?}", seen.0);
        assert_eq!(summary.telemetry, None);
        let gpus: Vec<Option<u32>> = summary.telemetry_per_gpu.iter().map(|t| t.gpu).collect();
        assert_eq!(gpus, [Some(0), Some(1)]);
        let csv = std::fs::read_to_string(dir.path().join("telemetry.csv")).unwrap();
        assert!(csv.starts_with("t_s,gpu,"), "{csv}");
        // a alone on GPU 0, b alone on GPU 1: each gets its own GPU's energy.
        let energy = |i: usize| summary.workloads[i].metrics.energy_j;
        let per_gpu = |g: usize| summary.telemetry_per_gpu[g].energy_j;
        assert!(per_gpu(0).is_some() && per_gpu(1).is_some(), "{summary:?}");
        assert_eq!((energy(0), energy(1)), (per_gpu(0), per_gpu(1)));
    }

    #[test]
    fn each_workload_is_attributed_to_its_own_gpu() {
        let text = "[device]\nbackend = \"cuda\"\ngpus = [1, 0]\nmechanism = \"timeslice\"\n\
                    [[workload]]\nname = \"a\"\nmodel = \"spin:1ms\"\nrate_hz = 10\njobs = 1\n\
                    [[workload]]\nname = \"b\"\nmodel = \"spin:1ms\"\nrate_hz = 10\njobs = 1\n\
                    gpu = 0\n\
                    [[workload]]\nname = \"c\"\nmodel = \"spin:1ms\"\nrate_hz = 10\njobs = 1\n\
                    backend = \"cpu\"\n";
        let s = Scenario::from_toml_str(text, "s.toml", &NoBuiltinModels).unwrap();
        assert_eq!(gpu_of(&s, "a"), Some(1), "the device's first GPU");
        assert_eq!(gpu_of(&s, "b"), Some(0));
        assert_eq!(gpu_of(&s, "c"), None, "a CPU workload has no GPU");
        assert_eq!(gpu_of(&s, "nobody"), None);
    }
}
