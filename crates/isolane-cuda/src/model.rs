//! [`CudaModel`], the [`CompiledModel`] that replays a plan's captured CUDA graph: its state
//! and lifetime here, each job of building and running it in a child module.

use std::ffi::{c_void, CString};
use std::time::Instant;

use cudarc::cublaslt::sys as lt;
use cudarc::cudnn::sys as dnn;
use cudarc::driver::sys as cu;
use cudarc::nvrtc::sys as rtc;
use isolane_engine::ir::Unary;
use isolane_engine::{CompiledModel, EngineError, Precision, Result};

use crate::dnn_graph::{ConvGraph, ConvGraphPtrs, ConvGraphSpec};
use crate::error::{cu_check, dnn_check, lt_check, rtc_check, CudaError};
use crate::handles::{
    dev_zero, CapturedGraph, CublasLt, Cudnn, DeviceBuffer, DeviceSpan, Module, PinnedF32,
};
use crate::kernels::{self, BLOCK, HALF_KERNEL_NAMES, KERNEL_NAMES, WARP_ROW_PER_LANE};
use crate::mm_check::{MatmulOperands, MatmulProbe, MatmulShape};
use crate::options::BuildOptions;
use crate::plan::{
    act_code, binary_code, AttentionStep, CastQuant, ConvStep, DType, LayerNormStep, LinearStep,
    Loc, MatMulStep, Plan, PoolStep, ResizeStep, SoftmaxStep, Step, StepKind, Strided, MAX_RANK,
};

mod build;
mod conv;
mod graph;
mod launch;
mod lt_algos;
mod matmul;
mod memory;
mod nvrtc;
#[path = "quant_gemm.rs"]
mod quant_gemm;
mod record;
mod run;
mod slots;
mod timing;

// The children share one namespace (each starts with `use super::*`), as `quant_gemm` does.
use conv::*;
use launch::*;
use matmul::*;
use memory::*;
use nvrtc::*;
use record::*;
use timing::*;

pub(crate) use matmul::MM_WORKSPACE_CAP;
pub(crate) use nvrtc::{cubin_for, device_arch, device_sm_count};
pub use slots::Slots;
pub(crate) use timing::Events;

/// Makes `ctx` current on this thread if it is not already (cheap: no allocation).
pub(crate) fn make_current(ctx: cu::CUcontext) -> Result<()> {
    let mut cur: cu::CUcontext = std::ptr::null_mut();
    // SAFETY: valid out-pointer; libcuda is loaded before any model exists.
    cu_check("cuCtxGetCurrent", unsafe { cu::cuCtxGetCurrent(&mut cur) })?;
    if cur != ctx {
        // SAFETY: ctx is a live context owned by the backend the caller built the model with.
        cu_check("cuCtxSetCurrent", unsafe { cu::cuCtxSetCurrent(ctx) })?;
    }
    Ok(())
}

/// Device memory of one loaded model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryReport {
    /// Constants (weights, biases) in the device dtype.
    pub weights_bytes: usize,
    /// The activation arena (graph input/output staging included).
    pub arena_bytes: usize,
    /// Scratch shared by cuDNN and cuBLASLt.
    pub workspace_bytes: usize,
    /// The three above.
    pub total_bytes: usize,
    /// Free device memory before compiling minus after (handles, module, graph and the
    /// allocator's rounding included; other users of the device can disturb it).
    pub device_delta_bytes: usize,
}

/// Everything that a compile needs from its backend.
pub(crate) struct Target {
    pub ctx: cu::CUcontext,
    pub stream: cu::CUstream,
    pub build: BuildOptions,
    /// Keeps a backend-owned stream alive as long as the model.
    pub keep: Option<std::sync::Arc<dyn std::any::Any + Send + Sync>>,
    /// Convolution paths a build must not keep at their steps: a check found them wrong
    /// (`crate::rebuild`).
    pub barred: Vec<crate::rebuild::StepPath>,
}

impl Target {
    /// This target with `barred` barred too.
    pub(crate) fn barring(mut self, barred: &[crate::rebuild::StepPath]) -> Target {
        self.barred.extend_from_slice(barred);
        self
    }
}

/// A model compiled for the GPU: one CUDA graph replayed per `run()`.
pub struct CudaModel {
    // The graphs first: fields drop in declaration order, and their nodes use the module, the
    // library handles and the buffers declared below.
    /// The whole job (input copies, forward, output copies).
    whole: Option<CapturedGraph>,
    /// The forward alone (no input/output copies), for measuring device time.
    compute: Option<CapturedGraph>,
    /// The job without its input copies, for inputs written on the device
    /// ([`CudaModel::launch_from_device`]); captured on first use.
    from_device: Option<CapturedGraph>,
    /// The job split into consecutive pieces, one graph each ([`CudaModel::split`]); empty
    /// until split.
    pieces: Vec<CapturedGraph>,
    ctx: cu::CUcontext,
    stream: cu::CUstream,
    precision: Precision,
    /// The one device allocation (`None` until the weights are uploaded): the weights, then
    /// the arena, then (when they fit in the allocation's rounding) the workspaces. Dropped
    /// after the graphs, whose nodes use it.
    block: Option<DeviceBuffer>,
    /// The weights and the activation arena, in `block`.
    weights: DeviceSpan,
    arena: DeviceSpan,
    /// cuDNN's workspace, in `block` or `own_workspaces` (the search's scratch while
    /// candidates are timed).
    workspace: DeviceSpan,
    /// cuBLASLt's workspace, apart from cuDNN's and zeroed when placed ([`MM_WORKSPACE_CAP`]).
    mm_workspace: DeviceSpan,
    /// The workspaces that did not fit in `block`'s rounding.
    own_workspaces: Vec<DeviceBuffer>,
    mem: MemoryReport,
    host_in: Vec<PinnedF32>,
    host_out: Vec<PinnedF32>,
    in_shapes: Vec<Vec<usize>>,
    out_shapes: Vec<Vec<usize>>,
    /// Dropped after the graphs (fields drop in declaration order): their nodes use its
    /// kernels and the libraries'.
    module: Option<Module>,
    funcs: Vec<cu::CUfunction>,
    /// isolane's kernels are launched with programmatic dependent launch after a kernel or a
    /// matrix product (sm_90+ and [`BuildOptions::programmatic_launch`]; `kernels.rs` says why
    /// that is safe).
    programmatic: bool,
    /// Per kernel of `funcs`: whether it may be launched early (not in
    /// [`kernels::PLAIN_LAUNCH`]).
    early_ok: Vec<bool>,
    /// cuDNN graph-API plans (dropped before the handle they were made with).
    conv_graphs: Vec<ConvGraph>,
    cudnn: Option<Cudnn>,
    cublaslt: Option<CublasLt>,
    convs: Vec<ConvDesc>,
    mms: Vec<MatmulDesc>,
    launches: Vec<Launch>,
    /// The quantized products whose kept candidate is the plain float step (a calibrated
    /// model's fp16 fallback reads x unquantized): the plan check's reference drops their
    /// input FakeQuants, as the plan does.
    plain_float_layers: Vec<String>,
    /// Each quantized product's kept candidate (`crate::plan::QuantAlternatives`' order), in
    /// plan order.
    quant_choices: Vec<(String, usize)>,
    /// The convolution path each convolution step kept (`crate::rebuild`).
    conv_paths: Vec<crate::rebuild::StepPath>,
    /// The step each launch belongs to (for profiles).
    names: Vec<String>,
    /// cuBLASLt algorithm chosen per matmul shape (pointers aside), so that repeated layers
    /// are timed once.
    algo_cache: Vec<(String, lt::cublasLtMatmulAlgo_t, usize)>,
    steps: usize,
    /// Index in `launches` of each step's first launch, then of the output copies (the plan
    /// check replays the plan step by step).
    step_start: Vec<usize>,
    /// Byte offsets of the arena's storages and of the constants in the weights, and the
    /// device dtype: where a plan location is on the device.
    storage_offsets: Vec<usize>,
    const_offsets: Vec<usize>,
    dtype: DType,
    build_ms: f64,
    /// The plan check's result, when it ran.
    check: Option<crate::check::CheckReport>,
    /// The access-policy window over the weights that every graph captured from now on sets
    /// on its kernel nodes ([`CudaModel::persist_weights_in_l2`]).
    l2_window: Option<crate::l2::Window>,
    _keep: Option<std::sync::Arc<dyn std::any::Any + Send + Sync>>,
}

// SAFETY: every raw handle and pointer here is owned by this struct (device buffers, pinned
// host buffers, library handles, the graph); the driver and libraries allow their use from any
// thread as long as calls on one handle are not concurrent, which `&mut self` on `run`
// guarantees. The context is made current on whichever thread calls.
unsafe impl Send for CudaModel {}

impl CudaModel {
    /// The plan check's result (`None` when it was skipped).
    pub fn plan_check(&self) -> Option<crate::check::CheckReport> {
        self.check
    }

    /// The quantized products that kept the plain float step (x read unquantized).
    pub fn plain_float_layers(&self) -> &[String] {
        &self.plain_float_layers
    }

    /// Each quantized product's kept candidate by index (`options::quant_candidate_name`
    /// names it), in plan order.
    pub fn quant_choices(&self) -> &[(String, usize)] {
        &self.quant_choices
    }

    /// The path each convolution of a build kept, in plan order, as the search log names it
    /// (`gemm`, `cudnn engine 48 fused`, `stem kernel`, …); empty for a saved plan's load.
    pub fn conv_path_names(&self) -> Vec<&str> {
        self.conv_paths.iter().map(|p| p.path.as_str()).collect()
    }

    /// The convolution paths kept in `steps` (`crate::rebuild`).
    pub(crate) fn conv_paths_in(
        &self,
        steps: std::ops::Range<usize>,
    ) -> Vec<crate::rebuild::StepPath> {
        self.conv_paths
            .iter()
            .filter(|p| steps.contains(&p.step))
            .cloned()
            .collect()
    }

    pub(crate) fn set_plan_check(&mut self, r: crate::check::CheckReport) {
        self.check = Some(r);
    }

    /// Device memory of this model.
    pub fn memory(&self) -> MemoryReport {
        self.mem
    }

    /// Milliseconds spent building the model from its plan (weights upload, kernel loading,
    /// algorithm search, capture).
    pub fn build_ms(&self) -> f64 {
        self.build_ms
    }

    /// Planned steps, CUDA graph launches per job (always 1).
    pub fn steps(&self) -> usize {
        self.steps
    }

    /// Library calls and kernels captured into the graph.
    pub fn launches(&self) -> usize {
        self.launches.len()
    }

    /// The precision this model was compiled for.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// The stream this model runs on.
    pub fn stream(&self) -> cu::CUstream {
        self.stream
    }

    /// The context this model's memory and stream belong to.
    pub fn context(&self) -> cu::CUcontext {
        self.ctx
    }
}

impl Drop for CudaModel {
    fn drop(&mut self) {
        if make_current(self.ctx).is_err() {
            return;
        }
        // SAFETY: the stream is synchronised first so that no job still uses what the fields
        // free when they drop (graphs first, then the device memory, the libraries, the
        // module, the pinned buffers: declaration order).
        unsafe {
            cu::cuStreamSynchronize(self.stream);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::StepRunner;
    use isolane_engine::{build_model, ErrorKind, Weights};

    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn a_device_index_that_does_not_exist_is_the_callers_mistake() {
        let e = crate::CudaBackend::new(u32::MAX)
            .err()
            .expect("a GPU with index u32::MAX");
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        assert!(e.to_string().contains("does not exist"), "{e}");
    }

    /// The weights, arena and workspaces are spans of the model's memory: the report adds
    /// them up, and a plan location is read back only from inside its span.
    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn a_models_memory_is_read_back_only_inside_its_spans() {
        let gpu = crate::CudaBackend::new(0).expect("cuda backend");
        let g = build_model("resnet18", Weights::Synthetic { seed: 3 }).expect("model");
        let mut m = gpu.compile_cuda(&g, 1, Precision::Fp16).expect("compile");
        let mem = m.memory();
        assert_eq!(m.weights.bytes(), mem.weights_bytes);
        assert_eq!(m.arena.bytes(), mem.arena_bytes);
        assert_eq!(
            m.workspace.bytes() + m.mm_workspace.bytes(),
            mem.workspace_bytes
        );
        assert_eq!(
            mem.total_bytes,
            mem.weights_bytes + mem.arena_bytes + mem.workspace_bytes
        );
        let block = m.block.as_ref().expect("the model's allocation").span();
        assert_eq!(block.slice(0, m.weights.bytes()), Some(m.weights));
        m.run().expect("a job");
        let first = m
            .read(Loc::Const { id: 0, offset: 0 }, 4)
            .expect("a weight");
        assert_eq!(first.len(), 4);
        let elems = mem.weights_bytes / 2;
        let past = m.read(
            Loc::Const {
                id: 0,
                offset: elems,
            },
            1,
        );
        assert!(
            matches!(past, Err(EngineError::InvalidArgument(_))),
            "{past:?}"
        );
        let storage = m.read(
            Loc::Storage {
                id: 0,
                offset: mem.arena_bytes,
            },
            1,
        );
        assert!(
            matches!(storage, Err(EngineError::InvalidArgument(_))),
            "{storage:?}"
        );
    }
}
