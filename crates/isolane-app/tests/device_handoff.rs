//! A GPU preprocess hands its output to the model it feeds in device memory, on whichever GPU
//! each stage names (`gpu =`), and the copy between them is timed and named by its link — run
//! here with a stand-in backend whose "device memory" is host memory, so that the stages'
//! side of the hand-off runs in CI (the CUDA copies themselves: tests/apps.rs on the GPU).

mod common;

use common::{ChannelMeans, Names};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use isolane_app::data::{DeviceValues, Link};
use isolane_app::models::{GpuPreprocess, ModelBuilder};
use isolane_app::run::{run_apps, RunOutcome, RunSettings};
use isolane_app::spec::{parse_apps, AppSpec, ModelSpec, Transfer};
use isolane_core::spec::{Backend, DeviceSpec, Host, Mechanism, TimingSpec};
use isolane_engine::preprocess::PreprocessPlan;
use isolane_engine::CompiledModel;
use isolane_runtime::partition::Partition;

/// "Device" values: host memory that says which GPU it is on.
struct FakeValues {
    gpu: u32,
    data: Vec<f32>,
}

impl DeviceValues for FakeValues {
    fn gpu(&self) -> u32 {
        self.gpu
    }
    fn len(&self) -> usize {
        self.data.len()
    }
    fn to_host(&self, out: &mut [f32]) -> Result<(), String> {
        out.copy_from_slice(&self.data);
        Ok(())
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// The kernel's CPU reference, leaving its output on its stage's "GPU".
struct FakeKernel {
    plan: PreprocessPlan,
    gpu: u32,
    to_device: Arc<AtomicUsize>,
}

impl GpuPreprocess for FakeKernel {
    fn run(&mut self, frame: &[u8], out: &mut [f32]) -> Result<(), String> {
        isolane_engine::preprocess::preprocess_into(&self.plan, frame, out)
            .map_err(|e| e.to_string())
    }
    fn run_to_device(&mut self, frame: &[u8]) -> Result<Option<Arc<dyn DeviceValues>>, String> {
        self.to_device.fetch_add(1, Ordering::SeqCst);
        let mut data = vec![0.0; self.plan.output_len()];
        self.run(frame, &mut data)?;
        Ok(Some(Arc::new(FakeValues {
            gpu: self.gpu,
            data,
        })))
    }
}

/// Copying between two "GPUs" takes this long, so that the transfer shows in the records.
const PEER_COPY: std::time::Duration = std::time::Duration::from_micros(300);

/// Builds [`ChannelMeans`] models and [`FakeKernel`]s on the GPU the run gives each stage, recording
/// which (`built`: model or preprocess name → GPU) and whether it got a partition.
#[derive(Default)]
struct FakeGpus {
    built: Mutex<Vec<(String, u32, bool)>>,
    to_device: Arc<AtomicUsize>,
}

impl ModelBuilder for FakeGpus {
    fn build(
        &self,
        d: &DeviceSpec,
        m: &ModelSpec,
        _: u64,
        p: Option<Partition>,
    ) -> Result<Box<dyn CompiledModel>, String> {
        self.built
            .lock()
            .unwrap()
            .push((m.name.clone(), d.gpu, p.is_some()));
        Ok(Box::new(ChannelMeans::new(d.gpu)))
    }

    fn preprocessor(
        &self,
        d: &DeviceSpec,
        plan: &PreprocessPlan,
        _f16: bool,
        p: Option<Partition>,
    ) -> Result<Box<dyn GpuPreprocess>, String> {
        self.built
            .lock()
            .unwrap()
            .push(("preprocess".into(), d.gpu, p.is_some()));
        Ok(Box::new(FakeKernel {
            plan: *plan,
            gpu: d.gpu,
            to_device: self.to_device.clone(),
        }))
    }

    fn feed(
        &self,
        model: &mut dyn CompiledModel,
        values: &dyn DeviceValues,
        transfer: Transfer,
    ) -> Result<Option<Link>, String> {
        let (Some(m), Some(v)) = (
            model
                .as_any_mut()
                .and_then(|m| m.downcast_mut::<ChannelMeans>()),
            values.as_any().downcast_ref::<FakeValues>(),
        ) else {
            return Ok(None);
        };
        m.input.copy_from_slice(&v.data);
        if m.gpu == v.gpu {
            return Ok(Some(Link::Device));
        }
        std::thread::sleep(PEER_COPY);
        Ok(Some(match transfer {
            Transfer::Auto => Link::Peer,
            _ => Link::Staged,
        }))
    }

    fn share_partition(&self, p: &Partition) -> Option<Partition> {
        p.downcast_ref::<()>().map(|_| Box::new(()) as Partition)
    }
}

/// An app: a GPU preprocess (`pre`), a model (`net`) and a classifier, with `app` and
/// `pre`/`net` keys added.
fn app(app_keys: &str, pre_keys: &str, net_keys: &str) -> Vec<AppSpec> {
    let text = format!(
        r#"
[[app]]
name = "a"
deadline_ms = 2000
frames = 24
{app_keys}
[app.source]
kind = "synthetic"
width = 16
height = 12
fps = 200
[[app.stage]]
name = "pre"
kind = "preprocess"
size = [4, 4]
device = "gpu"
{pre_keys}
[[app.stage]]
name = "net"
kind = "model"
model = "m"
{net_keys}
[[app.stage]]
name = "top"
kind = "classify"
top_k = 2
[[app.stage]]
name = "out"
kind = "sink"
"#
    );
    parse_apps(&text, std::path::Path::new("t.toml"), &Names).unwrap()
}

/// Two GPUs, green partitions, stages as threads; `net` has a partition.
fn run(apps: &[AppSpec], models: Arc<FakeGpus>) -> RunOutcome {
    let device = DeviceSpec {
        backend: Backend::Cuda,
        gpu: 0,
        mechanism: Mechanism::Green,
        host: Host::Thread,
        gpus: vec![0, 1],
    };
    let mut partitions: HashMap<String, Partition> = HashMap::new();
    partitions.insert("a.net".into(), Box::new(()));
    let stop = AtomicBool::new(false);
    let out = run_apps(
        apps,
        RunSettings {
            device: &device,
            timing: &TimingSpec::default(),
            models,
            partitions,
            stop: &stop,
            out: None,
            start: None,
            guard: Default::default(),
        },
    )
    .unwrap();
    assert_eq!(out.apps[0].error, None);
    out
}

/// What reached the sink, frame by frame.
fn outputs(out: &RunOutcome) -> Vec<Option<String>> {
    out.apps[0].stages[3]
        .iter()
        .map(|s| s.output.clone())
        .collect()
}

/// The preprocess on GPU 0, the model on GPU 1: the model gets the values GPU to GPU (peer),
/// every frame's copy is timed, and the classes are the ones the host path gives.
#[test]
fn a_model_on_another_gpu_gets_the_preprocess_output_peer_to_peer() {
    let split = app("", "gpu = 0", "gpu = 1");
    let models = Arc::new(FakeGpus::default());
    let out = run(&split, models.clone());
    let built = models.built.lock().unwrap().clone();
    assert!(
        built.contains(&("preprocess".into(), 0, false)),
        "the preprocess on its own GPU, outside the model's partition: {built:?}"
    );
    assert!(built.contains(&("net".into(), 1, true)), "{built:?}");
    assert_eq!(
        models.to_device.load(Ordering::SeqCst),
        25,
        "warm-up and 24 frames"
    );
    let net = &out.apps[0].stages[1];
    assert_eq!(net.len(), 24);
    for r in net {
        let (ns, link) = r
            .transfer
            .expect("every frame's input came from device memory");
        assert_eq!(link, Link::Peer);
        assert!(ns >= PEER_COPY.as_nanos() as i64, "{ns} ns");
    }
    let s = isolane_app::metrics::summarize(&split[0], &out.apps[0], &|_| "p".into());
    let t = s.stages[1]
        .transfer
        .as_ref()
        .expect("the model's transfers");
    assert_eq!(t.links, [Link::Peer]);
    assert!(t.latency_ms.p50.unwrap() >= 0.3, "{:?}", t.latency_ms);
    assert!(
        s.stages[0].transfer.is_none(),
        "the preprocess moved nothing in"
    );
    assert_eq!(
        s.stages[0].partition,
        "gpu, outside any partition, on GPU 0"
    );
    assert_eq!(s.stages[1].partition, "p");
    // The CSV has each frame's transfer, within its end to end.
    let csv = isolane_app::metrics::frames_csv(&split[0], &out.apps[0]);
    let header: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
    let col = header.iter().position(|h| *h == "transfer_ms").unwrap();
    let lat = header.iter().position(|h| *h == "latency_ms").unwrap();
    for line in csv.lines().skip(1) {
        let cells: Vec<&str> = line.split(',').collect();
        let moved: f64 = cells[col].parse().unwrap();
        assert!(moved >= 0.3, "{line}");
        assert!(cells[lat].parse::<f64>().unwrap() >= moved, "{line}");
    }
    // The same classes as through the host.
    let host = app("transfer = \"host\"", "gpu = 0", "gpu = 1");
    let through_host = run(&host, Arc::new(FakeGpus::default()));
    assert_eq!(outputs(&out), outputs(&through_host));
}

/// `transfer = "staged"` copies between GPUs through host memory, and on one GPU a copy is
/// device to device; `transfer = "host"` hands on host tensors and records no transfer.
#[test]
fn the_app_chooses_how_values_move_between_gpu_stages() {
    let staged = app("transfer = \"staged\"", "gpu = 0", "gpu = 1");
    let out = run(&staged, Arc::new(FakeGpus::default()));
    assert!(out.apps[0].stages[1]
        .iter()
        .all(|r| r.transfer.is_some_and(|(_, l)| l == Link::Staged)));

    // No gpu keys: the preprocess goes to its model's GPU and shares its partition.
    let one = app("", "", "");
    let models = Arc::new(FakeGpus::default());
    let out = run(&one, models.clone());
    assert!(out.apps[0].stages[1]
        .iter()
        .all(|r| r.transfer.is_some_and(|(_, l)| l == Link::Device)));
    let built = models.built.lock().unwrap().clone();
    assert!(built.contains(&("preprocess".into(), 0, true)), "{built:?}");

    let host = app("transfer = \"host\"", "", "");
    let models = Arc::new(FakeGpus::default());
    let out = run(&host, models.clone());
    assert_eq!(models.to_device.load(Ordering::SeqCst), 0);
    assert!(out.apps[0].stages[1].iter().all(|r| r.transfer.is_none()));
    let s = isolane_app::metrics::summarize(&host[0], &out.apps[0], &|_| "p".into());
    assert!(s.stages[1].transfer.is_none());
}

/// A model stage's `gpu` puts the model there, and a GPU preprocess that names none follows
/// the model it feeds (an app's `gpu` is the default of both).
#[test]
fn a_stage_gpu_places_the_model_and_the_preprocess_follows_it() {
    let apps = app("gpu = 0", "", "gpu = 1");
    let models = Arc::new(FakeGpus::default());
    run(&apps, models.clone());
    let built = models.built.lock().unwrap().clone();
    assert!(built.contains(&("net".into(), 1, true)), "{built:?}");
    assert!(built.contains(&("preprocess".into(), 1, true)), "{built:?}");
}
