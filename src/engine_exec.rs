//! Plugs the inference engine into the runtime: every workload whose model is not `spin:` is a
//! real network (a built-in architecture or an ONNX file), compiled once for its batch and
//! precision and run once per job.
//!
//! The runtime does not depend on the engine; `main` registers this once, so the coordinator
//! and `isolane worker` processes build models the same way.

use std::path::Path;

use isolane_core::spec::{Precision as SpecPrecision, WorkloadSpec};
use isolane_engine::{
    build_model, model_info, CompiledModel, CpuBackend, Graph, Precision, Weights,
};
use isolane_runtime::exec::{EngineExecutors, ExecError, Executor};

/// The engine as the runtime sees it (the CPU backend for now).
pub struct EngineExecutorsImpl;

fn is_onnx(model: &str) -> bool {
    Path::new(model)
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("onnx"))
}

fn precision(p: SpecPrecision) -> Precision {
    match p {
        SpecPrecision::Fp32 => Precision::Fp32,
        SpecPrecision::Tf32 => Precision::Tf32,
        SpecPrecision::Fp16 => Precision::Fp16,
        SpecPrecision::Bf16 => Precision::Bf16,
    }
}

fn engine_err(spec: &WorkloadSpec, message: impl std::fmt::Display) -> ExecError {
    ExecError::Engine {
        workload: spec.name.clone(),
        message: message.to_string(),
    }
}

fn load_graph(spec: &WorkloadSpec, seed: u64) -> Result<Graph, ExecError> {
    if is_onnx(&spec.model) {
        return isolane_engine::onnx::import_file(Path::new(&spec.model))
            .map_err(|e| engine_err(spec, e));
    }
    let weights = match &spec.weights {
        Some(p) => Weights::Safetensors(p.into()),
        None => Weights::Synthetic { seed },
    };
    build_model(&spec.model, weights).map_err(|e| engine_err(spec, e))
}

impl EngineExecutors for EngineExecutorsImpl {
    fn check(&self, spec: &WorkloadSpec) -> Result<(), ExecError> {
        if !is_onnx(&spec.model) && model_info(&spec.model).is_none() {
            return Err(ExecError::BadModel {
                workload: spec.name.clone(),
                model: spec.model.clone(),
                reason: "not a built-in model (see `isolane models`) nor an .onnx file".into(),
            });
        }
        Ok(())
    }

    fn build(
        &self,
        spec: &WorkloadSpec,
        seed: u64,
        _index: usize,
    ) -> Result<Box<dyn Executor>, ExecError> {
        self.check(spec)?;
        let graph = load_graph(spec, seed)?;
        // One engine thread per core the workload is pinned to (1 when unpinned): the pool is
        // created here, on the workload's pinned thread, so its threads inherit that affinity.
        let threads = spec.cpu.len().max(1);
        let mut model = CpuBackend::new(threads)
            .compile_cpu(&graph, spec.batch as usize, precision(spec.precision))
            .map_err(|e| engine_err(spec, e))?;
        let input = crate::cmd::infer::random_normal(model.input_mut().len(), seed);
        model.input_mut().copy_from_slice(&input);
        Ok(Box::new(ModelExecutor {
            model: Box::new(model),
        }))
    }
}

/// One compiled model; a job is one forward pass over the (fixed, seeded) input batch.
struct ModelExecutor {
    model: Box<dyn CompiledModel>,
}

impl Executor for ModelExecutor {
    fn run_job(&mut self) -> Result<(), ExecError> {
        self.model.run().map_err(|e| ExecError::Job(e.to_string()))
    }
}
