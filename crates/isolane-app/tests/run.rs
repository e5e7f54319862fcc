//! The app runtime end to end with stand-in models (fast on any CPU): frames flow through
//! the graph, every stage records every frame, ensembles record their members, and a stage
//! that fails is reported without hanging the run.

mod common;

use common::{ChannelMeans, Names};
use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use isolane_app::models::ModelBuilder;
use isolane_app::run::{run_apps, RunSettings};
use isolane_app::spec::{parse_apps, AppSpec, ModelSpec};
use isolane_core::spec::{DeviceSpec, TimingSpec};
use isolane_engine::CompiledModel;
use isolane_runtime::partition::Partition;

/// Builds a [`ChannelMeans`] for every model; the model named `broken` fails after warm-up
/// and 3 frames.
struct StandIns;

impl ModelBuilder for StandIns {
    fn build(
        &self,
        _: &DeviceSpec,
        m: &ModelSpec,
        _: u64,
        _: Option<Partition>,
    ) -> Result<Box<dyn CompiledModel>, String> {
        Ok(Box::new(ChannelMeans {
            fail_after: m.name.ends_with("broken").then_some(4),
            ..ChannelMeans::new(0)
        }))
    }
}

fn apps(stages: &str) -> Vec<AppSpec> {
    apps_with_sink(stages, "")
}

/// The app with `sink` added to its sink's table (e.g. its `after`).
fn apps_with_sink(stages: &str, sink: &str) -> Vec<AppSpec> {
    let text = format!(
        r#"
[[app]]
name = "a"
deadline_ms = 2000
frames = 24
[app.source]
kind = "synthetic"
width = 16
height = 12
fps = 200
[[app.stage]]
name = "pre"
kind = "preprocess"
size = [4, 4]
{stages}
[[app.stage]]
name = "out"
kind = "sink"
{sink}
"#
    );
    parse_apps(&text, std::path::Path::new("t.toml"), &Names).unwrap()
}

fn run(apps: &[AppSpec]) -> isolane_app::run::RunOutcome {
    run_with(apps, Arc::new(StandIns)).unwrap()
}

/// Runs `apps` on the CPU with `models`.
fn run_with(
    apps: &[AppSpec],
    models: Arc<dyn ModelBuilder + Send>,
) -> Result<isolane_app::run::RunOutcome, isolane_app::run::RunError> {
    let stop = AtomicBool::new(false);
    let device = DeviceSpec {
        backend: isolane_core::spec::Backend::Cpu,
        gpu: 0,
        mechanism: isolane_core::spec::Mechanism::None,
        host: isolane_core::spec::Host::Thread,
        gpus: Vec::new(),
    };
    let timing = TimingSpec::default();
    run_apps(
        apps,
        RunSettings {
            device: &device,
            timing: &timing,
            models,
            partitions: HashMap::new(),
            stop: &stop,
            out: None,
            start: None,
            guard: Default::default(),
        },
    )
}

#[test]
fn a_pipeline_runs_every_frame_through_every_stage() {
    let apps = apps("[[app.stage]]\nname = \"net\"\nkind = \"model\"\nmodel = \"m\"\n[[app.stage]]\nname = \"top\"\nkind = \"classify\"\ntop_k = 2");
    let out = run(&apps);
    let rec = &out.apps[0];
    assert_eq!(rec.error, None);
    assert_eq!(rec.release_ns.len(), 24);
    // the absolute schedule: 5 ms apart
    assert_eq!(rec.release_ns[3] - rec.release_ns[2], 5_000_000);
    for stage in &rec.stages {
        assert_eq!(stage.len(), 24);
    }
    let s = isolane_app::metrics::summarize(&apps[0], rec, &|_| "cpu".into());
    assert_eq!(s.end_to_end.jobs, 4);
    // a 2 s deadline holds on any machine
    assert_eq!(s.end_to_end.completed, 4);
    assert_eq!(s.stages.len(), 4);
    assert_eq!(s.stages[1].processed, 4);
    // a frame's latency covers its stages' own times
    let own: f64 = s.stages.iter().map(|st| st.latency_ms.min.unwrap()).sum();
    assert!(s.end_to_end.latency_ms.max.unwrap() >= own);
}

#[test]
fn an_ensemble_records_its_members() {
    let apps = apps("[[app.stage]]\nname = \"ens\"\nkind = \"ensemble\"\nvote = \"mean\"\nmembers = [{ name = \"x\", model = \"m\" }, { name = \"y\", model = \"m\" }, { name = \"z\", model = \"m\" }]");
    let out = run(&apps);
    let rec = &out.apps[0];
    assert_eq!(rec.error, None);
    for r in &rec.stages[1] {
        assert_eq!(r.members.len(), 3);
        for (s, e) in &r.members {
            // each member ran inside the ensemble's own span
            assert!(r.start_ns.unwrap() <= *s && s <= e && *e <= r.end_ns.unwrap());
        }
    }
    let s = isolane_app::metrics::summarize(&apps[0], rec, &|_| "cpu".into());
    assert_eq!(s.stages[1].members.len(), 3);
    assert_eq!(s.stages[1].members[2].name, "ens.z");
}

#[test]
fn a_failing_stage_drops_its_frames_and_says_why() {
    let apps = apps("[[app.stage]]\nname = \"broken\"\nkind = \"model\"\nmodel = \"m\"");
    let out = run(&apps);
    let rec = &out.apps[0];
    let e = rec.error.as_deref().unwrap();
    assert!(
        e.contains("stage `broken`, frame 3") && e.contains("stand-in failure"),
        "{e}"
    );
    let sink = &rec.stages[2];
    assert_eq!(sink.len(), 24);
    assert!(sink[2].end_ns.is_some() && sink[3].end_ns.is_none() && sink[23].end_ns.is_none());
}

#[test]
fn a_sink_joins_two_branches_of_a_dag() {
    let stages = "[[app.stage]]\nname = \"left\"\nkind = \"model\"\nmodel = \"m\"\nafter = [\"pre\"]\n\
                  [[app.stage]]\nname = \"right\"\nkind = \"model\"\nmodel = \"m\"\nafter = [\"pre\"]\n\
                  [[app.stage]]\nname = \"lc\"\nkind = \"classify\"\nafter = [\"left\"]\n\
                  [[app.stage]]\nname = \"rc\"\nkind = \"classify\"\nafter = [\"right\"]";
    let app = apps_with_sink(stages, "after = [\"lc\", \"rc\"]").remove(0);
    let out = run(std::slice::from_ref(&app));
    let rec = &out.apps[0];
    assert_eq!(rec.error, None);
    for (left, (right, sink)) in rec.stages[1]
        .iter()
        .zip(rec.stages[2].iter().zip(&rec.stages[5]))
    {
        // the sink ends a frame after both branches ended it
        assert!(sink.end_ns.unwrap() >= left.end_ns.unwrap().max(right.end_ns.unwrap()));
    }
}

/// A model that takes 30 ms per frame released every 5 ms with a 10 ms deadline: with
/// `late = "skip"` the frames that wait past their deadline are dropped, never run.
#[test]
fn late_frames_are_skipped_and_count_as_timeouts() {
    struct Slow;
    impl ModelBuilder for Slow {
        fn build(
            &self,
            d: &DeviceSpec,
            m: &ModelSpec,
            s: u64,
            p: Option<Partition>,
        ) -> Result<Box<dyn CompiledModel>, String> {
            struct Sleepy(Box<dyn CompiledModel>);
            impl CompiledModel for Sleepy {
                fn input_shape_at(&self, i: usize) -> &[usize] {
                    self.0.input_shape_at(i)
                }
                fn output_shape_at(&self, i: usize) -> &[usize] {
                    self.0.output_shape_at(i)
                }
                fn input_mut_at(&mut self, i: usize) -> &mut [f32] {
                    self.0.input_mut_at(i)
                }
                fn output_at(&self, i: usize) -> &[f32] {
                    self.0.output_at(i)
                }
                fn run(&mut self) -> isolane_engine::Result<()> {
                    std::thread::sleep(std::time::Duration::from_millis(30));
                    self.0.run()
                }
            }
            Ok(Box::new(Sleepy(StandIns.build(d, m, s, p)?)))
        }
    }
    let mut apps = apps("[[app.stage]]\nname = \"net\"\nkind = \"model\"\nmodel = \"m\"");
    apps[0].deadline_ms = 10.0;
    let out = run_with(&apps, Arc::new(Slow)).unwrap();
    let s = isolane_app::metrics::summarize(&apps[0], &out.apps[0], &|_| "cpu".into());
    let net = &s.stages[1];
    // every frame either ran or was skipped; a 30 ms model cannot keep up with 5 ms frames
    assert_eq!(net.processed + net.skipped, 4);
    let all = &out.apps[0].stages[1];
    let ran = all.iter().filter(|r| r.end_ns.is_some()).count();
    assert!((1..24).contains(&ran), "{ran} of 24 ran");
    // each one that ran took the model's 30 ms, over the 10 ms deadline: all frames time out
    assert_eq!(s.end_to_end.timeouts, 4);
    // and those that reached the sink late are measured, not dropped there
    let sink = &out.apps[0].stages[2];
    let measured_late = sink.iter().filter(|r| r.end_ns.is_some()).count();
    assert_eq!(
        measured_late, ran,
        "every frame the model ran reached the sink"
    );
}

/// A member whose model cannot be built fails the run's set-up with its name, and the run
/// returns (the other members' threads are joined, not left behind).
#[test]
fn a_member_that_cannot_be_built_is_named() {
    struct NoZ;
    impl ModelBuilder for NoZ {
        fn build(
            &self,
            d: &DeviceSpec,
            m: &ModelSpec,
            s: u64,
            p: Option<Partition>,
        ) -> Result<Box<dyn CompiledModel>, String> {
            if m.name.ends_with(".z") {
                return Err("no such model here".into());
            }
            StandIns.build(d, m, s, p)
        }
    }
    let apps = apps("[[app.stage]]\nname = \"ens\"\nkind = \"ensemble\"\nmembers = [{ name = \"x\", model = \"m\" }, { name = \"z\", model = \"m\" }]");
    let e = run_with(&apps, Arc::new(NoZ)).err().unwrap().to_string();
    assert!(
        e.contains("app `a`") && e.contains("member `ens.z`") && e.contains("no such model"),
        "{e}"
    );
}

/// A member whose model panics mid-run does not hang the ensemble: the stage fails with a
/// message and the run ends.
#[test]
fn a_member_that_panics_fails_the_stage_without_hanging() {
    struct Panicky;
    impl ModelBuilder for Panicky {
        fn build(
            &self,
            d: &DeviceSpec,
            m: &ModelSpec,
            s: u64,
            p: Option<Partition>,
        ) -> Result<Box<dyn CompiledModel>, String> {
            struct Boom(Box<dyn CompiledModel>, usize);
            impl CompiledModel for Boom {
                fn input_shape_at(&self, i: usize) -> &[usize] {
                    self.0.input_shape_at(i)
                }
                fn output_shape_at(&self, i: usize) -> &[usize] {
                    self.0.output_shape_at(i)
                }
                fn input_mut_at(&mut self, i: usize) -> &mut [f32] {
                    self.0.input_mut_at(i)
                }
                fn output_at(&self, i: usize) -> &[f32] {
                    self.0.output_at(i)
                }
                fn run(&mut self) -> isolane_engine::Result<()> {
                    self.1 += 1;
                    assert!(self.1 < 3, "stand-in model bug");
                    self.0.run()
                }
            }
            let inner = StandIns.build(d, m, s, p)?;
            Ok(if m.name.ends_with(".y") {
                Box::new(Boom(inner, 0))
            } else {
                inner
            })
        }
    }
    let apps = apps("[[app.stage]]\nname = \"ens\"\nkind = \"ensemble\"\nmembers = [{ name = \"x\", model = \"m\" }, { name = \"y\", model = \"m\" }]");
    let out = run_with(&apps, Arc::new(Panicky)).unwrap();
    let e = out.apps[0].error.as_deref().unwrap();
    assert!(
        e.contains("stage `ens`, frame 1") && e.contains("panicked"),
        "{e}"
    );
}

/// A "GPU" preprocess that is the engine's CPU reference of the CUDA kernel
/// (`isolane_engine::preprocess`, bit-exact with it), so that the GPU stage's path runs in CI.
struct ReferencePreprocess {
    plan: isolane_engine::preprocess::PreprocessPlan,
}

impl isolane_app::models::GpuPreprocess for ReferencePreprocess {
    fn run(&mut self, frame: &[u8], out: &mut [f32]) -> Result<(), String> {
        isolane_engine::preprocess::preprocess_into(&self.plan, frame, out)
            .map_err(|e| e.to_string())
    }
}

/// [`StandIns`], with GPU preprocesses of [`ReferencePreprocess`]; a partition is a shared
/// counter that every stage built in it increments.
struct WithGpu;

type Counter = Arc<std::sync::atomic::AtomicUsize>;

impl ModelBuilder for WithGpu {
    fn build(
        &self,
        d: &DeviceSpec,
        m: &ModelSpec,
        seed: u64,
        p: Option<Partition>,
    ) -> Result<Box<dyn CompiledModel>, String> {
        if let Some(c) = p.and_then(|p| p.downcast::<Counter>().ok()) {
            c.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        StandIns.build(d, m, seed, None)
    }

    fn preprocessor(
        &self,
        _: &DeviceSpec,
        plan: &isolane_engine::preprocess::PreprocessPlan,
        _f16: bool,
        p: Option<Partition>,
    ) -> Result<Box<dyn isolane_app::models::GpuPreprocess>, String> {
        if let Some(c) = p.and_then(|p| p.downcast::<Counter>().ok()) {
            c.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        Ok(Box::new(ReferencePreprocess { plan: *plan }))
    }

    fn share_partition(&self, p: &Partition) -> Option<Partition> {
        p.downcast_ref::<Counter>()
            .map(|c| Box::new(Arc::clone(c)) as Partition)
    }
}

/// A `device = "gpu"` preprocess (here the kernel's CPU reference) gives the model the tensor
/// the CPU preprocess would, to f32 rounding (the kernel divides by the scale where the CPU
/// operator multiplies), with the crop's frame map, and is built in the partition of the model
/// it feeds.
#[test]
fn a_gpu_preprocess_runs_in_the_partition_of_the_model_it_feeds() {
    let net = "[[app.stage]]\nname = \"net\"\nkind = \"model\"\nmodel = \"m\"";
    let gpu = apps_with_sink(net, "").into_iter().map(|mut a| {
        let isolane_app::spec::StageKind::Preprocess(p) = &mut a.stages[0].kind else {
            panic!()
        };
        p.device = isolane_app::spec::PreprocessDevice::Gpu;
        p.crop = Some([2, 1, 12, 10]);
        p.mean = [0.5, 0.4, 0.3];
        p.std = [0.2, 0.25, 0.3];
        a
    });
    let gpu: Vec<AppSpec> = gpu.collect();
    let counter: Counter = Arc::default();
    let mut partitions: HashMap<String, Partition> = HashMap::new();
    partitions.insert("a.net".into(), Box::new(Arc::clone(&counter)));
    let stop = AtomicBool::new(false);
    let device = DeviceSpec {
        backend: isolane_core::spec::Backend::Cuda,
        gpu: 0,
        mechanism: isolane_core::spec::Mechanism::Green,
        host: isolane_core::spec::Host::Thread,
        gpus: Vec::new(),
    };
    let timing = TimingSpec::default();
    let out = run_apps(
        &gpu,
        RunSettings {
            device: &device,
            timing: &timing,
            models: Arc::new(WithGpu),
            partitions,
            stop: &stop,
            out: None,
            start: None,
            guard: Default::default(),
        },
    )
    .unwrap();
    assert_eq!(out.apps[0].error, None);
    assert_eq!(out.apps[0].stages[0].len(), 24);
    assert_eq!(
        counter.load(std::sync::atomic::Ordering::SeqCst),
        2,
        "the preprocess and the model were built in the one partition"
    );
    // summary.json says where it ran: on the GPU, in its model's partition.
    let s = isolane_app::metrics::summarize(&gpu[0], &out.apps[0], &|m| format!("green for {m}"));
    assert_eq!(
        s.stages[0].partition,
        "gpu, in net's partition: green for net"
    );
    assert_eq!(s.stages[1].partition, "green for net");
    // The same frame through both operators.
    let frame = isolane_app::source::Synthetic::frame(16, 12, 3);
    let isolane_app::spec::StageKind::Preprocess(p) = &gpu[0].stages[0].kind else {
        panic!()
    };
    let op = isolane_app::ops::preprocess::Preprocess {
        width: 4,
        height: 4,
        spec: p.clone(),
    };
    let cpu = op.run(&frame).unwrap();
    let mut cut = Vec::new();
    isolane_app::ops::preprocess::cut(&frame, [2, 1, 12, 10], &mut cut);
    let plan = op.kernel_plan(12, 10).unwrap();
    let reference = isolane_engine::preprocess::preprocess(&plan, &cut).unwrap();
    for (a, b) in cpu.data.iter().zip(&reference) {
        assert!((a - b).abs() < 1e-4, "{a} vs {b}");
    }
}

/// The start gate (an app in a worker process) gives t0; a gate that refuses ends the run
/// before any frame with its reason.
#[test]
fn the_start_gate_gives_t0_or_stops_the_run() {
    let apps = apps("");
    let stop = AtomicBool::new(false);
    let device = DeviceSpec {
        backend: isolane_core::spec::Backend::Cpu,
        gpu: 0,
        mechanism: isolane_core::spec::Mechanism::None,
        host: isolane_core::spec::Host::Thread,
        gpus: Vec::new(),
    };
    let timing = TimingSpec::default();
    let settings = |start: isolane_app::run::StartGate<'static>| RunSettings {
        device: &device,
        timing: &timing,
        models: Arc::new(StandIns),
        partitions: HashMap::new(),
        stop: &stop,
        out: None,
        start: Some(start),
        guard: Default::default(),
    };
    let t0 = isolane_runtime::clock::now_ns() + 5_000_000;
    let out = run_apps(&apps, settings(Box::new(move || Ok(t0)))).unwrap();
    assert_eq!(out.t0_ns, t0);
    assert_eq!(out.apps[0].stages[1].len(), 24);
    let e = run_apps(&apps, settings(Box::new(|| Err("aborted".into()))))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("aborted"), "{e}");
}
