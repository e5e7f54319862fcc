//! How a model stage gets its compiled model: a [`ModelBuilder`] the caller passes in (the
//! binary's builds on the CPU or the CUDA backend, in the stage's partition; [`CpuModels`]
//! is the CPU one). No process-wide registry: the builder is a value.

use std::path::Path;
use std::sync::Arc;

use isolane_core::spec::{DeviceSpec, Precision as SpecPrecision};
use isolane_engine::preprocess::PreprocessPlan;
use isolane_engine::{build_model, CompiledModel, Dim, Graph, Precision, Weights};
use isolane_runtime::partition::Partition;

use crate::data::{DeviceValues, Link};
use crate::spec::{ModelSpec, Transfer};

/// Builds the models of model stages and ensemble members, one per call, on the thread that
/// will run it (a CUDA context is current per thread).
pub trait ModelBuilder: Sync {
    /// Compiles `model` at batch 1 for `device`, in `partition` when the run set one up for
    /// it. `seed` seeds a built-in model's synthetic weights.
    fn build(
        &self,
        device: &DeviceSpec,
        model: &ModelSpec,
        seed: u64,
        partition: Option<Partition>,
    ) -> Result<Box<dyn CompiledModel>, String>;

    /// Builds a GPU preprocess (a `device = "gpu"` preprocess stage) computing `plan` (frames
    /// of its layout in, its output out; values rounded to f16 when `f16`), in `partition`
    /// when the run has one for it: the partition of the model the preprocess feeds. A
    /// builder without a GPU refuses.
    fn preprocessor(
        &self,
        device: &DeviceSpec,
        plan: &PreprocessPlan,
        f16: bool,
        partition: Option<Partition>,
    ) -> Result<Box<dyn GpuPreprocess>, String> {
        let _ = (device, plan, f16, partition);
        Err("this backend runs no GPU preprocess; expected device = \"cpu\"".into())
    }

    /// Copies `values` (on whichever GPU) into the first input of `model`, one this builder
    /// built, for its next `run`, which then starts from there; `transfer` says whether a copy
    /// between two GPUs may go peer to peer (`auto`) or goes through host memory (`staged`).
    /// `Ok(None)`: the model takes no input from device memory, and the stage hands it the
    /// values through the host.
    fn feed(
        &self,
        model: &mut dyn CompiledModel,
        values: &dyn DeviceValues,
        transfer: Transfer,
    ) -> Result<Option<Link>, String> {
        let _ = (model, values, transfer);
        Ok(None)
    }

    /// A second handle on `partition`, for a GPU preprocess that runs in the partition of the
    /// model it feeds (`None`: this kind of partition cannot be shared, and the preprocess runs
    /// outside any).
    fn share_partition(&self, partition: &Partition) -> Option<Partition> {
        let _ = partition;
        None
    }
}

/// A preprocess on the GPU, built for one frame layout and one output (its
/// [`PreprocessPlan`]); the stage hands it host frames and takes the values back in host
/// memory, or leaves them on the device for the model after it ([`GpuPreprocess::run_to_device`]).
pub trait GpuPreprocess: Send {
    /// `frame`: the plan's layout (packed HWC RGB); `out`: its `output_len()` values, NCHW.
    fn run(&mut self, frame: &[u8], out: &mut [f32]) -> Result<(), String>;

    /// `frame` through the kernel into device memory that the stages after it copy from (the
    /// same values [`GpuPreprocess::run`] gives); `Ok(None)`: this preprocess hands its values
    /// on through the host only.
    fn run_to_device(&mut self, frame: &[u8]) -> Result<Option<Arc<dyn DeviceValues>>, String> {
        let _ = frame;
        Ok(None)
    }
}

/// The engine's CPU backend, one thread per model (stages run side by side on their own
/// threads).
pub struct CpuModels;

impl ModelBuilder for CpuModels {
    fn build(
        &self,
        _device: &DeviceSpec,
        model: &ModelSpec,
        seed: u64,
        _partition: Option<Partition>,
    ) -> Result<Box<dyn CompiledModel>, String> {
        let graph = load_graph(model, seed)?;
        let compiled = isolane_engine::CpuBackend::new(1)
            .compile_cpu(&graph, 1, precision(model.precision))
            .map_err(|e| format!("{}: {e}", model.model))?;
        Ok(Box::new(compiled))
    }
}

/// The engine's precision of a scenario's.
pub fn precision(p: SpecPrecision) -> Precision {
    match p {
        SpecPrecision::Fp32 => Precision::Fp32,
        SpecPrecision::Tf32 => Precision::Tf32,
        SpecPrecision::Fp16 => Precision::Fp16,
        SpecPrecision::Bf16 => Precision::Bf16,
        // Refused by the app's validation (a workload's calibration quantizes these); an
        // app model stage never holds them.
        SpecPrecision::Int8 | SpecPrecision::Fp8 => Precision::Fp32,
    }
}

/// The graph of a built-in (seeded synthetic weights, or a safetensors file) or an ONNX file.
pub fn load_graph(model: &ModelSpec, seed: u64) -> Result<Graph, String> {
    let graph = if model.model.ends_with(".onnx") {
        isolane_engine::onnx::import_file(Path::new(&model.model)).map_err(|e| e.to_string())
    } else {
        let weights = match &model.weights {
            Some(p) => Weights::Safetensors(p.into()),
            None => Weights::Synthetic { seed },
        };
        build_model(&model.model, weights).map_err(|e| e.to_string())
    };
    graph.map_err(|e| format!("{}: {e}", model.model))
}

/// The model's first input at batch 1 (`[1, C, H, W]` for an image model), without building
/// weights: a preprocess that names no size takes its size from it.
pub fn input_shape(model: &ModelSpec) -> Result<Vec<usize>, String> {
    let graph = if model.model.ends_with(".onnx") {
        load_graph(model, 0)?
    } else {
        build_model(&model.model, Weights::Zeros).map_err(|e| format!("{}: {e}", model.model))?
    };
    let id = *graph
        .inputs
        .first()
        .ok_or_else(|| format!("{}: the model has no input", model.model))?;
    let isolane_engine::ir::ValueKind::Input(dims) = &graph.values[id].kind else {
        return Err(format!(
            "{}: its first input is not a graph input",
            model.model
        ));
    };
    dims.iter()
        .map(|d| match d {
            Dim::Fixed(n) => Ok(*n),
            Dim::Batch | Dim::BatchTimes(1) => Ok(1),
            other => Err(format!(
                "{}: its input has a size {other:?} fixed only at run time; give the \
                 preprocess size = [width, height]",
                model.model
            )),
        })
        .collect()
}
