//! The models of app stages (isolane-app's `ModelBuilder`): the engine's CPU backend, or its
//! CUDA backend in the stage's green context when the run set one up for it.

use isolane_app::models::{load_graph, precision, CpuModels, ModelBuilder};
use isolane_app::spec::ModelSpec;
use isolane_core::spec::{Backend, DeviceSpec};
use isolane_engine::CompiledModel;
use isolane_runtime::partition::Partition;

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
}

/// A CUDA model with the green group it runs in (dropped after the model).
struct InGroup {
    model: isolane_cuda::CudaModel,
    _group: Option<isolane_gpu::GreenGroup>,
}

impl CompiledModel for InGroup {
    fn input_shape_at(&self, i: usize) -> &[usize] {
        self.model.input_shape_at(i)
    }
    fn output_shape_at(&self, i: usize) -> &[usize] {
        self.model.output_shape_at(i)
    }
    fn input_mut_at(&mut self, i: usize) -> &mut [f32] {
        self.model.input_mut_at(i)
    }
    fn output_at(&self, i: usize) -> &[f32] {
        self.model.output_at(i)
    }
    fn run(&mut self) -> isolane_engine::Result<()> {
        self.model.run()
    }
}

fn build_cuda(
    device: &DeviceSpec,
    model: &ModelSpec,
    seed: u64,
    partition: Option<Partition>,
) -> Result<Box<dyn CompiledModel>, String> {
    isolane_cuda::libs::ensure_all().map_err(|e| e.to_string())?;
    let group = partition
        .map(|p| {
            p.downcast::<isolane_gpu::GreenGroup>()
                .map(|g| *g)
                .map_err(|_| "its partition is not a green group".to_string())
        })
        .transpose()?;
    let backend = match &group {
        Some(g) => {
            g.make_current().map_err(|e| e.to_string())?;
            // SAFETY: the group (its context and stream) is moved into `InGroup` beside the
            // model, which is declared first and so dropped first.
            unsafe { isolane_cuda::CudaBackend::with_stream(g.context(), g.stream()) }
        }
        None => isolane_cuda::CudaBackend::new(device.gpu),
    }
    .map_err(|e| e.to_string())?;
    let graph = load_graph(model, seed)?;
    let options = isolane_cuda::CompileOptions {
        plan_check: model.plan_check && model.model.ends_with(".onnx"),
        ..Default::default()
    };
    let compiled = backend
        .compile_cuda_with(&graph, 1, precision(model.precision), &options)
        .map_err(|e| format!("{}: {e}", model.model))?;
    Ok(Box::new(InGroup {
        model: compiled,
        _group: group,
    }))
}
