//! The models and GPU preprocesses of app stages (isolane-app's `ModelBuilder`): the engine's
//! CPU backend, or its CUDA backend in the stage's green context when the run set one up for it.
//!
//! A green context may be current to only one thread at a time (NVIDIA's documentation), but a
//! GPU preprocess runs in the green context of the model it feeds, on a thread of its own. So a
//! run hands each model its green group as a [`SharedGroup`]: every use of the group (a model's
//! build, run and drop; a preprocess's build, launch and drop) is a turn that holds its lock
//! and leaves the context current nowhere when it ends, and the two stages take turns in their
//! partition.

use std::sync::{Arc, Mutex, MutexGuard};

use isolane_app::data::{DeviceValues, Link};
use isolane_app::models::{load_graph, precision, CpuModels, GpuPreprocess, ModelBuilder};
use isolane_app::spec::{ModelSpec, Transfer};
use isolane_core::spec::{Backend, DeviceSpec};
use isolane_engine::preprocess::PreprocessPlan;
use isolane_engine::CompiledModel;
use isolane_runtime::partition::Partition;

/// A green group that a model stage and the GPU preprocess feeding it use in turn.
pub type SharedGroup = Arc<Mutex<isolane_gpu::GreenGroup>>;

/// A green group as an app's partition (what [`AppModels`] takes back out).
pub fn shared_partition(group: isolane_gpu::GreenGroup) -> Partition {
    Box::new(Arc::new(Mutex::new(group)))
}

/// A stage's turn in a shared group: the group's lock and, when the turn ends, no context
/// current on this thread any more (NVIDIA: a green context is current to one thread at a
/// time). Every CUDA object of ours makes its context current itself before each use.
struct Turn<'a>(MutexGuard<'a, isolane_gpu::GreenGroup>);

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        // Runs before the guard (the field) unlocks. Failing to unset only leaves the
        // context current on this thread, which the next turn's own set-current replaces.
        let _ = self.0.release_current();
    }
}

fn turn(group: &SharedGroup) -> Turn<'_> {
    // A panic while the lock was held leaves nothing half-done that a CUDA call relies on.
    Turn(group.lock().unwrap_or_else(|p| p.into_inner()))
}

pub struct AppModels;

impl ModelBuilder for AppModels {
    fn build(
        &self,
        device: &DeviceSpec,
        model: &ModelSpec,
        seed: u64,
        partition: Option<Partition>,
    ) -> Result<Box<dyn CompiledModel>, String> {
        match device.backend {
            Backend::Cpu => CpuModels.build(device, model, seed, partition),
            Backend::Cuda => build_cuda(device, model, seed, partition),
        }
    }

    fn preprocessor(
        &self,
        device: &DeviceSpec,
        plan: &PreprocessPlan,
        f16: bool,
        partition: Option<Partition>,
    ) -> Result<Box<dyn GpuPreprocess>, String> {
        match device.backend {
            Backend::Cpu => Err("the cpu backend runs no GPU preprocess".into()),
            Backend::Cuda => build_preprocessor(device, plan, f16, partition),
        }
    }

    fn feed(
        &self,
        model: &mut dyn CompiledModel,
        values: &dyn DeviceValues,
        transfer: Transfer,
    ) -> Result<Option<Link>, String> {
        let model = model.as_any_mut().and_then(|m| m.downcast_mut::<InGroup>());
        let values = values.as_any().downcast_ref::<CudaValues>();
        match (model, values) {
            (Some(m), Some(v)) => m.feed(v, transfer).map(Some),
            _ => Ok(None),
        }
    }

    fn share_partition(&self, partition: &Partition) -> Option<Partition> {
        partition
            .downcast_ref::<SharedGroup>()
            .map(|g| Box::new(Arc::clone(g)) as Partition)
    }
}

/// The green group of a partition, if the run gave one.
fn group_of(partition: Option<Partition>) -> Result<Option<SharedGroup>, String> {
    partition
        .map(|p| {
            p.downcast::<SharedGroup>()
                .map(|g| *g)
                .map_err(|_| "its partition is not a green group".to_string())
        })
        .transpose()
}

/// A CUDA backend in `group`'s green context (its stream), or on the process's device.
fn backend_in(
    device: &DeviceSpec,
    group: Option<&isolane_gpu::GreenGroup>,
) -> Result<isolane_cuda::CudaBackend, String> {
    match group {
        Some(g) => {
            g.make_current().map_err(|e| e.to_string())?;
            // SAFETY: the group (its context and stream) outlives what is built on this
            // backend: both `InGroup` and `InGroupPreprocess` hold the group's Arc and drop
            // their CUDA objects first (under its lock) in their Drop.
            unsafe { isolane_cuda::CudaBackend::with_stream(g.context(), g.stream()) }
        }
        // A worker behind an MPS daemon sees its GPU under the index its environment gives,
        // and a critical app's worker of a protected run its stream's priority.
        None => isolane_cuda::CudaBackend::with_own_stream(
            crate::engine::gpu_index(device),
            crate::engine::worker_is_urgent(),
        ),
    }
    .map_err(|e| e.to_string())
}

/// A CUDA model with the green group it runs in (its lock held around every use).
struct InGroup {
    model: Option<isolane_cuda::CudaModel>,
    group: Option<SharedGroup>,
    /// Copies device values from other stages into the model's input.
    copier: isolane_cuda::InputCopier,
    /// The next run starts from the input already on the device (`feed`).
    fed: bool,
}

impl InGroup {
    fn model(&self) -> &isolane_cuda::CudaModel {
        self.model.as_ref().expect("dropped only in Drop")
    }

    /// `values` (from any stage's GPU) into the model's input, for the next run.
    fn feed(&mut self, values: &CudaValues, transfer: Transfer) -> Result<Link, String> {
        let model = self.model.as_mut().expect("dropped only in Drop");
        let _turn = self.group.as_ref().map(turn);
        let path = self
            .copier
            .copy_into(model, values.values(), transfer == Transfer::Auto)
            .map_err(|e| e.to_string())?;
        self.fed = true;
        Ok(match path {
            isolane_cuda::CopyPath::Device => Link::Device,
            isolane_cuda::CopyPath::Peer => Link::Peer,
            isolane_cuda::CopyPath::Staged => Link::Staged,
        })
    }
}

impl CompiledModel for InGroup {
    fn input_shape_at(&self, i: usize) -> &[usize] {
        self.model().input_shape_at(i)
    }
    fn output_shape_at(&self, i: usize) -> &[usize] {
        self.model().output_shape_at(i)
    }
    fn input_mut_at(&mut self, i: usize) -> &mut [f32] {
        self.model
            .as_mut()
            .expect("dropped only in Drop")
            .input_mut_at(i)
    }
    fn output_at(&self, i: usize) -> &[f32] {
        self.model().output_at(i)
    }
    fn run(&mut self) -> isolane_engine::Result<()> {
        let model = self.model.as_mut().expect("dropped only in Drop");
        // The model makes its context current itself before its launch.
        let _turn = self.group.as_ref().map(turn);
        if std::mem::take(&mut self.fed) {
            model.launch_from_device()?;
            model.wait()
        } else {
            model.run()
        }
    }
    fn as_any_mut(&mut self) -> Option<&mut dyn std::any::Any> {
        Some(self)
    }
}

impl Drop for InGroup {
    fn drop(&mut self) {
        // The model's memory and graph are freed in the group's context: under its lock.
        let _turn = self.group.as_ref().map(turn);
        self.model = None;
    }
}

fn build_cuda(
    device: &DeviceSpec,
    model: &ModelSpec,
    seed: u64,
    partition: Option<Partition>,
) -> Result<Box<dyn CompiledModel>, String> {
    isolane_cuda::libs::ensure_all().map_err(|e| e.to_string())?;
    let group = group_of(partition)?;
    let held = group.as_ref().map(turn);
    let backend = backend_in(device, held.as_ref().map(|t| &*t.0))?;
    let graph = load_graph(model, seed)?;
    // Every app model is checked, built-ins too: an app runs at batch 1, so the check costs one
    // CPU forward pass, and a built-in YOLOv8n under MPS once gave NaN boxes that no GPU test had
    // seen (docs/apps.md, Measured on the H100).
    let options = isolane_cuda::CompileOptions {
        plan_check: model.plan_check,
        ..Default::default()
    };
    let compiled = backend
        .compile_cuda_with(&graph, 1, precision(model.precision), &options)
        .map_err(|e| format!("{}: {e}", model.model))?;
    drop(held);
    Ok(Box::new(InGroup {
        model: Some(compiled),
        group,
        copier: Default::default(),
        fed: false,
    }))
}

/// `isolane_cuda::preprocess` for a stage: host frames in, values out in host memory or left
/// on the device ([`CudaValues`]), in the green group of the model it feeds (under its lock)
/// or on the stage's GPU.
struct InGroupPreprocess {
    pre: Option<isolane_cuda::Preprocessor>,
    group: Option<SharedGroup>,
    backend: isolane_cuda::CudaBackend,
    /// The stage's GPU, as the machine numbers them.
    gpu: u32,
    /// Outputs left on the device, reused once no stage holds them any more.
    outputs: Vec<Arc<CudaValues>>,
}

/// Device outputs a GPU preprocess keeps for reuse (a frame's values are held until every
/// stage that reads them is done; more in flight are made afresh and not kept).
const DEVICE_OUTPUTS: usize = 4;

/// A GPU preprocess's output left in device memory, with the green group it was made in
/// (freed there, under its lock).
struct CudaValues {
    /// `None` only in Drop.
    values: Option<isolane_cuda::DeviceF32>,
    group: Option<SharedGroup>,
    gpu: u32,
}

impl CudaValues {
    fn values(&self) -> &isolane_cuda::DeviceF32 {
        self.values.as_ref().expect("dropped only in Drop")
    }
}

impl DeviceValues for CudaValues {
    fn gpu(&self) -> u32 {
        self.gpu
    }
    fn len(&self) -> usize {
        self.values().len()
    }
    fn to_host(&self, out: &mut [f32]) -> Result<(), String> {
        let _turn = self.group.as_ref().map(turn);
        self.values().to_host(out).map_err(|e| e.to_string())
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl Drop for CudaValues {
    fn drop(&mut self) {
        // Freed in the group's context (DeviceF32's drop makes it current): under its lock.
        let _turn = self.group.as_ref().map(turn);
        self.values = None;
    }
}

impl GpuPreprocess for InGroupPreprocess {
    fn run(&mut self, frame: &[u8], out: &mut [f32]) -> Result<(), String> {
        let _turn = self.group.as_ref().map(turn);
        // The preprocessor makes its context current itself before every launch and copy.
        self.pre
            .as_mut()
            .expect("dropped only in Drop")
            .run_host_into(frame, out)
            .map_err(|e| e.to_string())
    }

    fn run_to_device(&mut self, frame: &[u8]) -> Result<Option<Arc<dyn DeviceValues>>, String> {
        let free = self.outputs.iter().position(|o| Arc::strong_count(o) == 1);
        let out = match free {
            Some(i) => self.outputs[i].clone(),
            None => {
                let _turn = self.group.as_ref().map(turn);
                let len = self
                    .pre
                    .as_ref()
                    .expect("dropped only in Drop")
                    .plan()
                    .output_len();
                let values = self.backend.device_f32(len).map_err(|e| e.to_string())?;
                let made = Arc::new(CudaValues {
                    values: Some(values),
                    group: self.group.clone(),
                    gpu: self.gpu,
                });
                if self.outputs.len() < DEVICE_OUTPUTS {
                    self.outputs.push(made.clone());
                }
                made
            }
        };
        let _turn = self.group.as_ref().map(turn);
        self.pre
            .as_mut()
            .expect("dropped only in Drop")
            .run_to(frame, out.values())
            .map_err(|e| e.to_string())?;
        Ok(Some(out))
    }
}

impl Drop for InGroupPreprocess {
    fn drop(&mut self) {
        let _turn = self.group.as_ref().map(turn);
        self.pre = None;
    }
}

fn build_preprocessor(
    device: &DeviceSpec,
    plan: &PreprocessPlan,
    f16: bool,
    partition: Option<Partition>,
) -> Result<Box<dyn GpuPreprocess>, String> {
    isolane_cuda::libs::ensure_all().map_err(|e| e.to_string())?;
    let group = group_of(partition)?;
    let held = group.as_ref().map(turn);
    let backend = backend_in(device, held.as_ref().map(|t| &*t.0))?;
    // f32 values either way (rounded to half first for f16): a model's device input is f32
    // and it casts to its precision itself.
    let input_type = if f16 {
        isolane_cuda::InputType::F16AsF32
    } else {
        isolane_cuda::InputType::F32
    };
    let pre = backend
        .preprocessor(plan, input_type)
        .map_err(|e| format!("GPU preprocess: {e}"))?;
    drop(held);
    Ok(Box::new(InGroupPreprocess {
        pre: Some(pre),
        group,
        backend,
        gpu: device.gpu,
        outputs: Vec::new(),
    }))
}
