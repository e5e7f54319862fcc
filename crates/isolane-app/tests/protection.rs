//! Criticality protection for apps on the CPU (docs/criticality.md, Apps): a critical app and a
//! best-effort app pinned to one core, whose models burn CPU time. Unprotected, the best-effort
//! model takes half the core while the critical frame runs and the critical app misses its
//! deadline; protected, the guard holds the best-effort model back whenever it could make a
//! critical frame late, and runs it in the gaps.

mod common;

use common::Names;
use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use isolane_app::models::ModelBuilder;
use isolane_app::protection::AppGuard;
use isolane_app::run::{run_apps, RunSettings};
use isolane_app::spec::{parse_apps, AppSpec, ModelSpec};
use isolane_core::spec::{Criticality, DeviceSpec, ProtectionSpec, TimingSpec};
use isolane_engine::CompiledModel;
use isolane_runtime::partition::Partition;

/// This thread's CPU time (ns).
fn thread_cpu_ns() -> i64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer; CLOCK_THREAD_CPUTIME_ID needs nothing else.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec * 1_000_000_000 + t.tv_nsec
}

/// A model that burns `ms` of its thread's CPU time per run: sharing a core makes it slower,
/// as a CPU inference would be.
struct Burn {
    ms: i64,
    input: Vec<f32>,
    output: Vec<f32>,
}

impl CompiledModel for Burn {
    fn input_shape_at(&self, _: usize) -> &[usize] {
        &[1, 3, 4, 4]
    }
    fn output_shape_at(&self, _: usize) -> &[usize] {
        &[1, 3]
    }
    fn input_mut_at(&mut self, _: usize) -> &mut [f32] {
        &mut self.input
    }
    fn output_at(&self, _: usize) -> &[f32] {
        &self.output
    }
    fn run(&mut self) -> isolane_engine::Result<()> {
        let until = thread_cpu_ns() + self.ms * 1_000_000;
        while thread_cpu_ns() < until {
            std::hint::spin_loop();
        }
        Ok(())
    }
}

/// `burnN`: N ms of CPU per frame.
struct Burners;

impl ModelBuilder for Burners {
    fn build(
        &self,
        _: &DeviceSpec,
        m: &ModelSpec,
        _: u64,
        _: Option<Partition>,
    ) -> Result<Box<dyn CompiledModel>, String> {
        let ms = m
            .model
            .trim_start_matches("burn")
            .parse()
            .map_err(|_| "burnN")?;
        Ok(Box::new(Burn {
            ms,
            input: vec![0.0; 48],
            output: vec![0.0; 3],
        }))
    }
}

/// A critical app at 20 fps (6 ms of CPU per frame, due in 12 ms) and three best-effort ones
/// at 10 fps (15 ms per frame, released with every other critical frame), all on core 0, for
/// 2.5 s: 58 % of the core, but unprotected every other critical frame shares it with three.
fn apps() -> Vec<AppSpec> {
    let app = |name: &str, crit: &str, fps: u32, deadline: u32, burn: u32, frames: u32| {
        format!(
            r#"
[[app]]
name = "{name}"
criticality = "{crit}"
deadline_ms = {deadline}
frames = {frames}
drop_frames = 5
cpu = [0]
[app.source]
kind = "synthetic"
width = 16
height = 12
fps = {fps}
[[app.stage]]
name = "pre"
kind = "preprocess"
size = [4, 4]
[[app.stage]]
name = "net"
kind = "model"
model = "burn{burn}"
[[app.stage]]
name = "out"
kind = "sink"
"#
        )
    };
    let text = app("camera", "critical", 20, 12, 6, 50)
        + &app("archive", "best_effort", 10, 1000, 15, 25)
        + &app("backup", "best_effort", 10, 1000, 15, 25)
        + &app("index", "best_effort", 10, 1000, 15, 25);
    parse_apps(&text, std::path::Path::new("t.toml"), &Names).unwrap()
}

/// One run: each app's summary and whether any of its frames (measured or not) was held.
fn run(
    apps: &[AppSpec],
    protection: &ProtectionSpec,
) -> Vec<(isolane_core::results::AppSummary, bool)> {
    let stop = AtomicBool::new(false);
    let device = DeviceSpec {
        backend: isolane_core::spec::Backend::Cpu,
        gpu: 0,
        mechanism: isolane_core::spec::Mechanism::None,
        host: isolane_core::spec::Host::Thread,
        gpus: Vec::new(),
    };
    let timing = TimingSpec::default();
    let out = run_apps(
        apps,
        RunSettings {
            device: &device,
            timing: &timing,
            models: Arc::new(Burners),
            partitions: HashMap::new(),
            stop: &stop,
            out: None,
            start: None,
            guard: AppGuard::create(apps, protection).unwrap(),
        },
    )
    .unwrap();
    apps.iter()
        .zip(&out.apps)
        .map(|(a, r)| {
            assert_eq!(r.error, None);
            let held = r.stages.iter().flatten().any(|s| s.held_ns > 0);
            (
                isolane_app::metrics::summarize(a, r, &|_| "cpu".into()),
                held,
            )
        })
        .collect()
}

fn timeout_pct(s: &isolane_core::results::AppSummary) -> f64 {
    let e = &s.end_to_end;
    100.0 * e.timeouts as f64 / e.jobs as f64
}

#[test]
fn the_guard_keeps_a_critical_apps_deadlines_beside_best_effort() {
    let apps = apps();
    assert_eq!(apps[1].criticality, Criticality::BestEffort);
    let on = ProtectionSpec::default();
    let off = ProtectionSpec {
        enabled: false,
        ..on
    };
    // The critical app alone on core 0: what the machine gives it with no best effort (≈ 0 %
    // on a quiet machine; where other processes take core 0, they do with or without the
    // guard, so protection is judged against this). The three runs are sequential, so a load
    // that comes or goes between them moves `alone` and `protected` apart (a full `cargo test`
    // on 2 cores: alone 0 %, protected 15 %, once in about ten suites): the comparison is
    // tried up to three times, and a guard that does not protect fails all three.
    let mut tries = Vec::new();
    let (unprotected, unprotected_held, protected, protected_held) = loop {
        let alone = timeout_pct(&run(&apps[..1], &on)[0].0);
        let (unprotected, unprotected_held): (Vec<_>, Vec<_>) =
            run(&apps, &off).into_iter().unzip();
        let (protected, protected_held): (Vec<_>, Vec<_>) = run(&apps, &on).into_iter().unzip();
        let (u, p) = (timeout_pct(&unprotected[0]), timeout_pct(&protected[0]));
        // Unprotected, a 6 ms frame with a 15 ms neighbour on its core takes about 12 ms or
        // more: most frames miss. Protected, the neighbour runs only where it ends before the
        // next frame or fits its slack: no more misses than alone (two frames of 45 allowed).
        if u >= 30.0 && p <= alone.max(5.0) + 5.0 {
            break (unprotected, unprotected_held, protected, protected_held);
        }
        tries.push(format!(
            "critical timeouts: unprotected {u:.0} % (at least 30 asked), protected {p:.0} % \
             (alone {alone:.0} %)"
        ));
        assert!(tries.len() < 3, "{tries:#?}");
    };
    assert!(unprotected.iter().all(|s| s.held.is_none()));
    assert!(
        !unprotected_held.contains(&true),
        "an unprotected frame was held"
    );
    // Every best-effort app's first frame, released with the critical one, waits for it (the
    // critical app's first frames are learned from with best effort held back). Whether later,
    // measured frames are held depends on the machine: where other processes share core 0,
    // best effort falls behind and runs in the gaps unheld.
    assert_eq!(protected_held, [false, true, true, true]);
    for held in protected[1..].iter().filter_map(|s| s.held.as_ref()) {
        assert_eq!(held.pieces, 1);
        assert!(held.jobs_held > 0 && held.total_ms > 0.0, "{held:?}");
    }
    // Best effort still runs: the core's gaps between critical frames fit its frames (all of
    // them on a quiet machine; a quarter is asked, where other processes share core 0).
    let (done, jobs) = protected[1..].iter().fold((0, 0), |(d, j), s| {
        (d + s.end_to_end.completed, j + s.end_to_end.jobs)
    });
    assert!(
        done * 4 >= jobs,
        "best effort completed {done} of {jobs} frames"
    );
    assert_eq!(protected[0].held, None);
}
