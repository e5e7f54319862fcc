//! isolane's CUDA backend.
//!
//! A model is planned once per (graph, batch, precision) — [`plan`] on the CPU: BatchNorm
//! folded and epilogues fused by the engine's passes, one step per node, view ops aliased,
//! every activation packed into one arena by liveness — then built on the GPU: convolutions
//! through cuDNN (algorithm benchmarked at build time), matrix products through cuBLASLt (bias
//! and ReLU as epilogues, algorithm benchmarked), NVRTC kernels for the rest (cached on disk),
//! and the whole forward, input and output copies included, captured as one CUDA graph. A job
//! is one `cuGraphLaunch` and one `cuStreamSynchronize`.
//!
//! Every kernel, cuDNN's and cuBLASLt's included, runs on the stream the backend was given, so
//! a green-context stream confines the whole model to that context's SMs
//! ([`CudaBackend::with_stream`]).

pub mod calibrated;
pub mod check;
pub mod convert;
mod dnn_graph;
pub mod error;
mod handles;
pub mod int8;
pub mod kernels;
pub mod l2;
pub mod libs;
mod mm_check;
mod model;
pub mod options;
pub mod plan;
pub mod preprocess;
mod rebuild;
pub mod saved;
pub mod synthetic;
pub mod transfer;

use std::sync::Arc;

use cudarc::driver::sys as cu;
use isolane_engine::{passes, Backend, CompiledModel, EngineError, Graph, Precision, Result};

pub use calibrated::{FallbackOutcome, WholeModelChoice};
pub use model::{CudaModel, MemoryReport, Slots};
pub use options::{BuildOptions, ConvPaths};
pub use preprocess::{InputType, Preprocessor};
pub use synthetic::{Synthetic, SyntheticKernel};
pub use transfer::{CopyPath, DeviceF32, InputCopier};

/// The cuda engine's revision, kept with every profile the planner measures
/// (`isolane_planner::cache::Times::engine_revision`): bump it with any change that makes the
/// same model's plan run at another speed (kernels, their choice, library paths), so that
/// profiles measured by an older engine are measured again instead of mispredicting.
/// 1: session 14 (cuDNN's graph API, the 16-byte kernels, fused attention at batch 1).
/// 2: session 15 (the attention kernel's cp.async/ldmatrix tiles and 4 key groups).
/// 3: session 22 (a quantized product runs the fastest of its timed candidates, which a saved
///    plan records; a general Gemm and a reversing Slice planned through the decomposition).
/// 4: session 24 (int8 / fp8: cuDNN's fused quantized graph among the candidates, the graph
///    chain timed whole against the per-layer picks, a block output's bytes made by its
///    producer; a saved plan of 3 is refused, its plan's buffers are not this one's).
/// 5: session 32 (a quantized skip read as bytes by its residual reader, its producer writing
///    bytes only: a calibrated model's plan has other buffers and steps; a saved plan of 4 is
///    refused).
/// 6: session 33 (on compute capability 9.0 the own int8 kernel, rewritten, is timed with the
///    other candidates by default and picked where faster; a saved plan of 5 is refused, its
///    own launches are not this kernel's).
/// 7: session 34 (a pool read only by quantized products writes their bytes: a calibrated
///    resnet's plan has other steps and buffers; a saved plan of 6 is refused).
/// 8: session 37 (an RGB input read only by convolutions is stored as 4 channels and the
///    stem filters padded alike: a CNN's plan has other steps, constants and buffers; a saved
///    plan of 7 is refused).
pub const ENGINE_REVISION: u32 = 8;

/// How [`CudaBackend::compile_cuda_with`] compiles.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompileOptions {
    /// Run the plan once on a seeded random input and compare it with the CPU reference
    /// before returning it ([`check`]); a plan that disagrees is an error naming the first
    /// diverging node, never a model. On by default.
    pub plan_check: bool,
    /// Test hook: negate the output of this node of the optimised graph, a deliberately wrong
    /// plan that the check must catch ([`plan::corrupt_node`]).
    #[doc(hidden)]
    pub corrupt_node: Option<String>,
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions {
            plan_check: true,
            corrupt_node: None,
        }
    }
}

/// A stream the backend created itself (on the device's primary context), destroyed last.
struct OwnedStream {
    stream: cu::CUstream,
    _primary: isolane_gpu::driver::PrimaryContext,
}

// SAFETY: the stream handle may be used from any thread; it is destroyed once, in Drop.
unsafe impl Send for OwnedStream {}
// SAFETY: shared access only reads the handle.
unsafe impl Sync for OwnedStream {}

impl Drop for OwnedStream {
    fn drop(&mut self) {
        // SAFETY: created in CudaBackend::new and destroyed once; models that used it hold an
        // Arc to this struct (through the backend) only as long as the backend lives, and the
        // driver keeps the stream's pending work running to completion after destruction.
        unsafe {
            cu::cuStreamDestroy_v2(self.stream);
        }
    }
}

/// The `cuda` backend: compiles graphs into [`CudaModel`]s that run on one stream.
#[derive(Clone)]
pub struct CudaBackend {
    ctx: cu::CUcontext,
    stream: cu::CUstream,
    /// Tuning switches, from the environment when the backend is made.
    build: BuildOptions,
    _owned: Option<Arc<OwnedStream>>,
}

// SAFETY: the backend holds driver handles only (a context and a stream), which the driver
// lets any thread use; compiling makes the context current on the calling thread.
unsafe impl Send for CudaBackend {}
// SAFETY: shared access only copies the handle values.
unsafe impl Sync for CudaBackend {}

impl CudaBackend {
    /// A backend on device `index`'s primary context with a stream of its own.
    pub fn new(index: u32) -> Result<CudaBackend> {
        Self::with_own_stream(index, false)
    }

    /// As [`new`](Self::new), with the stream at the device's greatest priority when `urgent`
    /// (a critical workload of a protected run, docs/criticality.md), else the default.
    pub fn with_own_stream(index: u32, urgent: bool) -> Result<CudaBackend> {
        libs::ensure_all().map_err(EngineError::Runtime)?;
        isolane_gpu::driver::init().map_err(error::from_gpu)?;
        let dev = isolane_gpu::driver::device(index).map_err(error::from_gpu)?;
        let primary = isolane_gpu::driver::PrimaryContext::retain(dev).map_err(error::from_gpu)?;
        let ctx = primary.raw();
        model::make_current(ctx)?;
        let mut priority = 0;
        if urgent {
            let mut least = 0;
            // SAFETY: two valid out-pointers; the primary context is current.
            error::cu_check("cuCtxGetStreamPriorityRange", unsafe {
                cu::cuCtxGetStreamPriorityRange(&mut least, &mut priority)
            })?;
        }
        let mut stream: cu::CUstream = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the primary context is current; `priority` is 0 (the
        // default) or the context's greatest.
        error::cu_check("cuStreamCreateWithPriority", unsafe {
            cu::cuStreamCreateWithPriority(
                &mut stream,
                cu::CUstream_flags::CU_STREAM_NON_BLOCKING as u32,
                priority,
            )
        })?;
        Ok(CudaBackend {
            ctx,
            stream,
            build: BuildOptions::from_env(),
            _owned: Some(Arc::new(OwnedStream {
                stream,
                _primary: primary,
            })),
        })
    }

    /// A backend that runs everything on the caller's `stream` in `ctx` — e.g. a green
    /// context's (`GreenGroup::context()`, `GreenGroup::stream()`), which confines every
    /// kernel of every model compiled here to that group's SMs.
    ///
    /// # Safety
    /// `ctx` and `stream` must be valid, `stream` must belong to `ctx`, and both must outlive
    /// the backend and every model compiled with it.
    pub unsafe fn with_stream(ctx: cu::CUcontext, stream: cu::CUstream) -> Result<CudaBackend> {
        libs::ensure_all().map_err(EngineError::Runtime)?;
        isolane_gpu::driver::init().map_err(error::from_gpu)?;
        Ok(CudaBackend {
            ctx,
            stream,
            build: BuildOptions::from_env(),
            _owned: None,
        })
    }

    /// The same backend with other tuning switches (instead of the environment's).
    pub fn with_build_options(mut self, build: BuildOptions) -> CudaBackend {
        self.build = build;
        self
    }

    /// The tuning switches models are compiled with ([`BuildOptions::from_env`] unless set).
    pub fn build_options(&self) -> BuildOptions {
        self.build
    }

    /// The context models are built in.
    pub fn context(&self) -> cu::CUcontext {
        self.ctx
    }

    /// The stream every model runs on.
    pub fn stream(&self) -> cu::CUstream {
        self.stream
    }

    /// Compiles to the concrete model type (memory report, async launch), with the plan
    /// check ([`CompileOptions::default`]).
    pub fn compile_cuda(
        &self,
        graph: &Graph,
        batch: usize,
        precision: Precision,
    ) -> Result<CudaModel> {
        self.compile_cuda_with(graph, batch, precision, &CompileOptions::default())
    }

    /// [`CudaBackend::compile_cuda`] with options.
    pub fn compile_cuda_with(
        &self,
        graph: &Graph,
        batch: usize,
        precision: Precision,
        options: &CompileOptions,
    ) -> Result<CudaModel> {
        if batch == 0 {
            return Err(EngineError::InvalidArgument(
                "batch must be at least 1".into(),
            ));
        }
        let g = passes::optimize(graph, batch)?;
        let opts = self.plan_options(batch, precision)?;
        let mut p = plan::plan_with(&g, batch, precision, opts)?;
        if let Some(node) = &options.corrupt_node {
            plan::corrupt_node(&mut p, node)?;
        }
        if !options.plan_check {
            return CudaModel::build(p, &self.target());
        }
        let (mut m, report) = rebuild::build_checked(
            |barred| CudaModel::build(p.clone(), &self.target().barring(barred)),
            |m| check_model(m, graph, &g, &p, batch),
            |m, steps| m.conv_paths_in(steps),
            &mut |note| eprintln!("{note}"),
        )?;
        m.set_plan_check(report);
        Ok(m)
    }
}

impl CudaBackend {
    /// The layout and attention form a compile plans with here (a saved plan keeps them).
    fn plan_options(&self, batch: usize, precision: Precision) -> Result<plan::PlanOptions> {
        // Fused attention: f16/bf16 (the kernel's tensor-core types) on sm_80 and newer, unless
        // the build options turn it off (at batch 1 too, unless they keep it to batch > 1:
        // there the unfused plan reads the heads in place as well, in three launches).
        model::make_current(self.ctx)?;
        let fused_attention = (batch > 1 || self.build.fused_attention_batch1)
            && matches!(precision, Precision::Fp16 | Precision::Bf16)
            && model::device_arch()?.0 >= 8
            && self.build.fused_attention;
        Ok(plan::PlanOptions {
            channels_last: self.build.channels_last,
            fused_attention,
        })
    }
}

/// The plan check on the GPU: the captured graph runs the check's input (as a job would), and
/// on a mismatch the launches are replayed step by step to find the diverging node. Where a
/// calibrated model's layers kept the plain float step, the reference is the model without
/// those layers' input FakeQuants, the arithmetic the plan runs.
fn check_model(
    m: &mut CudaModel,
    graph: &Graph,
    optimised: &Graph,
    p: &plan::Plan,
    batch: usize,
) -> std::result::Result<check::CheckReport, check::CheckFailure> {
    let plain = m.plain_float_layers().to_vec();
    if plain.is_empty() {
        return check::check_plan_at(graph, optimised, p, batch, m);
    }
    let reference = isolane_engine::quant::without_input_fake_quant(graph, &plain);
    let optimised = isolane_engine::quant::without_input_fake_quant(optimised, &plain);
    check::check_plan_at(&reference, &optimised, p, batch, m)
}

impl Backend for CudaBackend {
    fn name(&self) -> &str {
        "cuda"
    }
    fn compile(
        &self,
        graph: &Graph,
        batch: usize,
        precision: Precision,
    ) -> Result<Box<dyn CompiledModel>> {
        Ok(Box::new(self.compile_cuda(graph, batch, precision)?))
    }
}

/// Device memory a model will take once compiled, from its plan alone (no GPU needed): the
/// constants in the device dtype, the activation arena, and the most workspace [`CudaModel`]
/// gives its libraries ([`workspace_limit`]). Admission control counts this
/// per workload; the per-process CUDA context comes on top (the caller's to add, once per
/// process).
pub fn planned_memory(graph: &Graph, batch: usize, precision: Precision) -> Result<PlannedMemory> {
    if batch == 0 {
        return Err(EngineError::InvalidArgument(
            "batch must be at least 1".into(),
        ));
    }
    let g = passes::optimize(graph, batch)?;
    // Unfused attention and channels-last: the layout compile_cuda picks by default, with the
    // larger arena of the two attention forms (the fused kernel needs no score matrix).
    let opts = plan::PlanOptions {
        channels_last: true,
        fused_attention: false,
    };
    let p = plan::plan_with(&g, batch, precision, opts)?;
    let (_, weights_bytes) = p.const_layout();
    let workspace_bytes = workspace_limit(p.arena_bytes);
    Ok(PlannedMemory {
        weights_bytes,
        arena_bytes: p.arena_bytes,
        workspace_bytes,
    })
}

/// The most workspace a model with an activation arena of `arena_bytes` takes by default:
/// cuDNN's, at most half the arena, and cuBLASLt's own, at most half the arena and 32 MiB.
pub fn workspace_limit(arena_bytes: usize) -> usize {
    arena_bytes / 2 + (arena_bytes / 2).min(model::MM_WORKSPACE_CAP)
}

/// [`planned_memory`]'s answer, bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlannedMemory {
    pub weights_bytes: usize,
    pub arena_bytes: usize,
    /// The cap: the workspace actually chosen is at most this.
    pub workspace_bytes: usize,
}

impl PlannedMemory {
    pub fn total_bytes(&self) -> usize {
        self.weights_bytes + self.arena_bytes + self.workspace_bytes
    }
}
