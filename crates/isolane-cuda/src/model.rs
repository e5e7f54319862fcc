//! The GPU side: device buffers, cuDNN / cuBLASLt descriptors, the NVRTC module, the captured
//! CUDA graph, and [`CudaModel`], the [`CompiledModel`] that replays it.

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
    dev_alloc, dev_zero, CapturedGraph, CublasLt, Cudnn, DeviceBuffer, Module, PinnedF32,
};
use crate::kernels::{self, BLOCK, HALF_KERNEL_NAMES, KERNEL_NAMES, WARP_ROW_PER_LANE};
use crate::mm_check::{MatmulOperands, MatmulProbe, MatmulShape};
use crate::options::BuildOptions;
use crate::plan::{
    act_code, binary_code, AttentionStep, ConvStep, DType, LayerNormStep, LinearStep, Loc,
    MatMulStep, Plan, PoolStep, ResizeStep, SoftmaxStep, Step, StepKind, Strided, MAX_RANK,
};

#[path = "quant_gemm.rs"]
mod quant_gemm;

// ---------------------------------------------------------------------------------------------
// Error plumbing: every library call is checked and named.

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

// ---------------------------------------------------------------------------------------------
// Kernel arguments (layouts match the structs in the NVRTC source).

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct Space {
    rank: i32,
    dims: [i64; MAX_RANK],
    s0: [i64; MAX_RANK],
    s1: [i64; MAX_RANK],
    s2: [i64; MAX_RANK],
}

impl Space {
    fn from(s: &Strided) -> Space {
        let mut sp = Space {
            rank: s.dims.len() as i32,
            ..Default::default()
        };
        for d in 0..s.dims.len() {
            sp.dims[d] = s.dims[d] as i64;
            sp.s0[d] = s.strides[0][d] as i64;
            sp.s1[d] = s.strides.get(1).map_or(0, |v| v[d] as i64);
            sp.s2[d] = s.strides.get(2).map_or(0, |v| v[d] as i64);
        }
        sp
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct PoolP {
    v: [i32; 16],
    xs: [i64; 4],
    ys: [i64; 4],
}

/// `ResizeP` of the NVRTC source: (n, c, h, w, oh, ow, linear, coord, nearest, pad), the
/// coordinate scales, then the strides of x and y along (n, c, h, w).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct ResizeP {
    v: [i32; 10],
    scales: [f32; 2],
    xs: [i64; 4],
    ys: [i64; 4],
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct DwP {
    v: [i32; 16],
    p0: f32,
    p1: f32,
    whwc: i32,
    pad: i32,
    xs: [i64; 4],
    ys: [i64; 4],
}

fn strides4(shape: &[usize; 4], nhwc: bool) -> [i64; 4] {
    let s = crate::plan::phys_strides(shape, nhwc);
    [s[0] as i64, s[1] as i64, s[2] as i64, s[3] as i64]
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct ImP {
    v: [i32; 14],
}

/// `AttnP` of the attention kernel: s, heads, qtiles, pad; scale_log2, oscale; the (image,
/// head) strides of q, k, v, y; their row strides (elements).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct AttnP {
    v: [i32; 4],
    scale_log2: f32,
    oscale: f32,
    bh: [i64; 8],
    rows: [i32; 4],
}

/// Rescales a copy's iteration space to words of `w` bytes (elements of `es` bytes) when the
/// innermost dim is contiguous in both operands and every size, stride and address allows it.
fn widen_copy(s: &Strided, es: usize, w: usize, ptrs: [u64; 2]) -> Option<Strided> {
    let r = s.dims.len();
    if r == 0 || w <= es || ptrs.iter().any(|p| p % w as u64 != 0) {
        return None;
    }
    let f = w / es;
    if s.strides.iter().any(|st| st[r - 1] != 1) || !s.dims[r - 1].is_multiple_of(f) {
        return None;
    }
    if s.strides
        .iter()
        .any(|st| st[..r - 1].iter().any(|x| x % f != 0))
    {
        return None;
    }
    let mut dims = s.dims.clone();
    dims[r - 1] /= f;
    let strides = s
        .strides
        .iter()
        .map(|st| {
            let mut v: Vec<usize> = st.iter().map(|x| x / f).collect();
            v[r - 1] = 1;
            v
        })
        .collect();
    Some(Strided { dims, strides })
}

#[derive(Clone, Debug)]
enum Arg {
    Ptr(u64),
    I64(i64),
    I32(i32),
    F32(f32),
    Space(Box<Space>),
    Pool(Box<PoolP>),
    Resize(Box<ResizeP>),
    Dw(Box<DwP>),
    Im(Box<ImP>),
    Attn(Box<AttnP>),
}

impl Arg {
    fn as_ptr(&self) -> *mut c_void {
        match self {
            Arg::Ptr(v) => v as *const u64 as *mut c_void,
            Arg::I64(v) => v as *const i64 as *mut c_void,
            Arg::I32(v) => v as *const i32 as *mut c_void,
            Arg::F32(v) => v as *const f32 as *mut c_void,
            Arg::Space(b) => &**b as *const Space as *mut c_void,
            Arg::Pool(b) => &**b as *const PoolP as *mut c_void,
            Arg::Resize(b) => &**b as *const ResizeP as *mut c_void,
            Arg::Dw(b) => &**b as *const DwP as *mut c_void,
            Arg::Im(b) => &**b as *const ImP as *mut c_void,
            Arg::Attn(b) => &**b as *const AttnP as *mut c_void,
        }
    }
}

/// One thing issued on the stream, with every pointer resolved.
#[derive(Debug)]
enum Launch {
    Kernel {
        func: usize,
        grid: u32,
        block: u32,
        /// Dynamic shared memory in bytes (0 for kernels that declare theirs statically).
        shared: u32,
        args: Vec<Arg>,
    },
    Conv {
        conv: usize,
        x: u64,
        w: u64,
        y: u64,
    },
    /// A cuDNN graph-API plan (`dnn_graph`), its epilogue fused or not.
    ConvGraph {
        graph: usize,
        ptrs: Box<ConvGraphPtrs>,
    },
    Matmul {
        mm: usize,
        a: u64,
        b: u64,
        /// Added with beta = 1 when non-zero (a fused residual).
        c: u64,
        y: u64,
    },
    HtoD {
        dst: u64,
        src: *const c_void,
        bytes: usize,
    },
    DtoH {
        dst: *mut c_void,
        src: u64,
        bytes: usize,
    },
}

struct ConvDesc {
    x: dnn::cudnnTensorDescriptor_t,
    w: dnn::cudnnFilterDescriptor_t,
    conv: dnn::cudnnConvolutionDescriptor_t,
    y: dnn::cudnnTensorDescriptor_t,
    algo: dnn::cudnnConvolutionFwdAlgo_t,
    workspace: usize,
}

struct MatmulDesc {
    desc: lt::cublasLtMatmulDesc_t,
    a: lt::cublasLtMatrixLayout_t,
    b: lt::cublasLtMatrixLayout_t,
    d: lt::cublasLtMatrixLayout_t,
    algo: lt::cublasLtMatmulAlgo_t,
    workspace: usize,
    alpha: f32,
    beta: f32,
}

impl Drop for ConvDesc {
    fn drop(&mut self) {
        // SAFETY: each descriptor was created by `conv_desc` for this value alone (null where
        // creation had not happened yet) and is destroyed once, here. Descriptors are host
        // objects, independent of the cuDNN handle.
        unsafe {
            if !self.x.is_null() {
                dnn::cudnnDestroyTensorDescriptor(self.x);
            }
            if !self.y.is_null() {
                dnn::cudnnDestroyTensorDescriptor(self.y);
            }
            if !self.w.is_null() {
                dnn::cudnnDestroyFilterDescriptor(self.w);
            }
            if !self.conv.is_null() {
                dnn::cudnnDestroyConvolutionDescriptor(self.conv);
            }
        }
    }
}

impl Drop for MatmulDesc {
    fn drop(&mut self) {
        // SAFETY: the layouts and the matmul descriptor were created by `mm_index` for this
        // value alone and are destroyed once, here; they are host objects, independent of the
        // cuBLASLt handle.
        unsafe {
            lt::cublasLtMatrixLayoutDestroy(self.a);
            lt::cublasLtMatrixLayoutDestroy(self.b);
            lt::cublasLtMatrixLayoutDestroy(self.d);
            lt::cublasLtMatmulDescDestroy(self.desc);
        }
    }
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
    /// The one device allocation: the weights, then the arena, then (when they fit in the
    /// allocation's rounding) the workspaces; `arena` and the workspaces point into it (a
    /// workspace may have its own allocation, `workspace_owned` / `mm_workspace_owned`).
    weights: u64,
    arena: u64,
    /// cuDNN's workspace.
    workspace: u64,
    workspace_owned: bool,
    /// cuBLASLt's workspace, apart from cuDNN's and zeroed when placed ([`MM_WORKSPACE_CAP`]).
    mm_workspace: u64,
    mm_workspace_owned: bool,
    mem: MemoryReport,
    host_in: Vec<PinnedF32>,
    host_out: Vec<PinnedF32>,
    in_shapes: Vec<Vec<usize>>,
    out_shapes: Vec<Vec<usize>>,
    /// Dropped after the graphs (fields drop in declaration order): their nodes use its
    /// kernels and the libraries'.
    module: Option<Module>,
    funcs: Vec<cu::CUfunction>,
    /// cuDNN graph-API plans (dropped before the handle they were made with).
    conv_graphs: Vec<ConvGraph>,
    cudnn: Option<Cudnn>,
    cublaslt: Option<CublasLt>,
    convs: Vec<ConvDesc>,
    mms: Vec<MatmulDesc>,
    launches: Vec<Launch>,
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

/// The driver's allocation granularity on the H100 (driver 580): every free-memory drop we
/// measured was a multiple of it. Only sizes the shared weights + arena allocation; a device
/// with another granularity loses at most the workspace's sharing of the rounding.
const ALLOC_GRANULARITY: usize = 2 << 20;

fn free_mem() -> Result<usize> {
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: valid out-pointers, a context is current.
    cu_check("cuMemGetInfo", unsafe {
        cu::cuMemGetInfo_v2(&mut free, &mut total)
    })?;
    Ok(free)
}

pub(crate) fn device_arch() -> Result<(i32, i32)> {
    let mut dev: cu::CUdevice = 0;
    // SAFETY: valid out-pointer, a context is current.
    cu_check("cuCtxGetDevice", unsafe { cu::cuCtxGetDevice(&mut dev) })?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: valid out-pointers and device.
    unsafe {
        cu_check(
            "cuDeviceGetAttribute",
            cu::cuDeviceGetAttribute(
                &mut major,
                cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                dev,
            ),
        )?;
        cu_check(
            "cuDeviceGetAttribute",
            cu::cuDeviceGetAttribute(
                &mut minor,
                cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                dev,
            ),
        )?;
    }
    Ok((major, minor))
}

/// Compiles (or loads from the disk cache) the kernels for `dtype` and returns the cubin.
fn kernel_cubin(dtype: DType, arch: (i32, i32)) -> Result<Vec<u8>> {
    cubin_for(kernels::source(dtype), "isolane_kernels.cu", arch)
}

/// Compiles `src` (no headers) with NVRTC for `arch`, or loads it from the disk cache.
pub(crate) fn cubin_for(src: String, file: &str, arch: (i32, i32)) -> Result<Vec<u8>> {
    let arch_s = format!("sm_{}{}", arch.0, arch.1);
    let options = vec![
        format!("--gpu-architecture={arch_s}"),
        "-default-device".to_string(),
    ];
    let (mut vmaj, mut vmin) = (0, 0);
    // SAFETY: valid out-pointers; libnvrtc is loaded (libs::ensure_all ran before).
    rtc_check("nvrtcVersion", unsafe {
        rtc::nvrtcVersion(&mut vmaj, &mut vmin)
    })?;
    let key = kernels::cache_key(&src, &arch_s, (vmaj, vmin), &options);
    let dir = kernels::cache_dir();
    if let Some(d) = &dir {
        if let Some(c) = kernels::cache_read(d, &key) {
            return Ok(c);
        }
    }
    let csrc = CString::new(src).map_err(|e| EngineError::Runtime(e.to_string()))?;
    let name = CString::new(file).map_err(|e| EngineError::Runtime(e.to_string()))?;
    let copts: Vec<CString> = options
        .iter()
        .map(|o| CString::new(o.as_str()).expect("options have no NUL"))
        .collect();
    let popts: Vec<*const std::ffi::c_char> = copts.iter().map(|c| c.as_ptr()).collect();
    let mut prog: rtc::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: the source and name strings outlive the program; no headers are passed.
    rtc_check("nvrtcCreateProgram", unsafe {
        rtc::nvrtcCreateProgram(
            &mut prog,
            csrc.as_ptr(),
            name.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        )
    })?;
    // SAFETY: prog is live; the option pointers are valid NUL-terminated strings.
    let r = unsafe { rtc::nvrtcCompileProgram(prog, popts.len() as i32, popts.as_ptr()) };
    let result = (|| {
        if r != rtc::nvrtcResult::NVRTC_SUCCESS {
            let mut n = 0usize;
            // SAFETY: prog is live; the log buffer has the size NVRTC reported.
            let log = unsafe {
                rtc::nvrtcGetProgramLogSize(prog, &mut n);
                let mut buf = vec![0u8; n.max(1)];
                rtc::nvrtcGetProgramLog(prog, buf.as_mut_ptr() as *mut std::ffi::c_char);
                String::from_utf8_lossy(&buf)
                    .trim_end_matches('\0')
                    .to_string()
            };
            // A library failure with the compiler's log as its detail (an out-of-memory
            // becomes one, as from any call).
            let failed = rtc_check("nvrtcCompileProgram", r)
                .err()
                .map(|e| CudaError {
                    detail: Some(log),
                    ..e
                });
            return Err(failed.map_or_else(
                || EngineError::Runtime("nvrtcCompileProgram failed".into()),
                EngineError::from,
            ));
        }
        let mut n = 0usize;
        // SAFETY: prog compiled; the buffer has the size NVRTC reported.
        unsafe {
            rtc_check("nvrtcGetCUBINSize", rtc::nvrtcGetCUBINSize(prog, &mut n))?;
            let mut buf = vec![0u8; n];
            rtc_check(
                "nvrtcGetCUBIN",
                rtc::nvrtcGetCUBIN(prog, buf.as_mut_ptr() as *mut std::ffi::c_char),
            )?;
            Ok(buf)
        }
    })();
    // SAFETY: prog was created above and is destroyed once.
    unsafe { rtc::nvrtcDestroyProgram(&mut prog) };
    let cubin = result?;
    if let Some(d) = &dir {
        kernels::cache_write(d, &key, &cubin);
    }
    Ok(cubin)
}

fn dnn_dtype(d: DType) -> dnn::cudnnDataType_t {
    match d {
        DType::F32 => dnn::cudnnDataType_t::CUDNN_DATA_FLOAT,
        DType::F16 => dnn::cudnnDataType_t::CUDNN_DATA_HALF,
        DType::Bf16 => dnn::cudnnDataType_t::CUDNN_DATA_BFLOAT16,
    }
}

fn lt_dtype(d: DType) -> lt::cudaDataType {
    match d {
        DType::F32 => lt::cudaDataType::CUDA_R_32F,
        DType::F16 => lt::cudaDataType::CUDA_R_16F,
        DType::Bf16 => lt::cudaDataType::CUDA_R_16BF,
    }
}

fn elementwise_grid(n: usize) -> u32 {
    (n.div_ceil(BLOCK as usize)).clamp(1, 8192) as u32
}

/// Fewest threads for which the depthwise pair kernel (`dwconv_c2_*`) is chosen.
const DWC2_MIN_THREADS: usize = 1 << 17;

/// Fewest rows for which the one-warp-per-row LayerNorm / softmax kernels are chosen.
const WARP_ROWS_MIN: usize = 3072;

/// Rows per block of the one-warp-per-row kernels.
const WARP_ROWS_PER_BLOCK: usize = 4;

fn reduce_block(len: usize) -> u32 {
    if len >= 1024 {
        512
    } else if len >= 256 {
        256
    } else if len > 64 {
        128
    } else {
        64
    }
}

pub(crate) struct Events {
    a: cu::CUevent,
    b: cu::CUevent,
}

impl Events {
    pub(crate) fn new() -> Result<Events> {
        let (mut a, mut b) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: valid out-pointers, a context is current.
        unsafe {
            cu_check("cuEventCreate", cu::cuEventCreate(&mut a, 0))?;
            cu_check("cuEventCreate", cu::cuEventCreate(&mut b, 0))?;
        }
        Ok(Events { a, b })
    }
    /// Milliseconds between two records on `stream` around `f`.
    pub(crate) fn time(
        &self,
        stream: cu::CUstream,
        f: &mut dyn FnMut() -> Result<()>,
    ) -> Result<f32> {
        let mut ms = 0f32;
        // SAFETY: events and stream are live.
        unsafe {
            cu_check("cuEventRecord", cu::cuEventRecord(self.a, stream))?;
            f()?;
            cu_check("cuEventRecord", cu::cuEventRecord(self.b, stream))?;
            cu_check("cuEventSynchronize", cu::cuEventSynchronize(self.b))?;
            cu_check(
                "cuEventElapsedTime",
                cu::cuEventElapsedTime_v2(&mut ms, self.a, self.b),
            )?;
        }
        Ok(ms)
    }
}

impl Drop for Events {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once.
        unsafe {
            cu::cuEventDestroy_v2(self.a);
            cu::cuEventDestroy_v2(self.b);
        }
    }
}

/// Where [`CudaModel::upload_weights`] put the weights: each constant's offset, their bytes,
/// and the one allocation's used and rounded sizes (the arena follows the weights).
struct WeightBlock {
    const_offs: Vec<usize>,
    const_bytes: usize,
    block_used: usize,
    block_bytes: usize,
}

/// What recording a step's launches needs besides the model: where every operand lives on
/// the device, the kernel table, the scratch buffer and events algorithm searches time on,
/// and the row-kernel choice.
struct Recorder<'a> {
    plan: &'a Plan,
    const_offs: &'a [usize],
    arena_base: u64,
    weights_base: u64,
    dtype: DType,
    es: usize,
    half_names: &'static [&'static str],
    /// Device scratch of `ws_cap` bytes: cuDNN's workspace while candidates are timed.
    scratch: u64,
    ws_cap: usize,
    /// Zeroed device scratch of `mm_ws_cap` bytes: cuBLASLt's workspace while timing.
    mm_scratch: u64,
    mm_ws_cap: usize,
    events: Events,
    options: BuildOptions,
    /// The choices made among timed candidates: recorded, or replayed from a saved plan
    /// (`crate::saved`), in which case nothing is timed.
    choices: std::cell::RefCell<crate::saved::ChoiceLog>,
}

impl Recorder<'_> {
    /// Elements per 16-byte access of the `*_v` kernels (4 f32, 8 f16/bf16).
    fn vec_lanes(&self) -> usize {
        kernels::VEC_BYTES / self.es
    }

    /// The device address of an operand.
    fn ptr(&self, l: Loc) -> u64 {
        match l {
            Loc::Storage { id, offset } => {
                self.arena_base + self.plan.storages[id].offset as u64 + (offset * self.es) as u64
            }
            Loc::Const { id, offset } => {
                self.weights_base + self.const_offs[id] as u64 + (offset * self.es) as u64
            }
        }
    }

    /// The index in `CudaModel::funcs` of the kernel `name`.
    fn func(&self, name: &str) -> usize {
        KERNEL_NAMES
            .iter()
            .chain(self.half_names)
            .position(|k| *k == name)
            .expect("kernel name is in KERNEL_NAMES (or HALF_KERNEL_NAMES for f16/bf16)")
    }

    /// One warp per row pays off with many rows; with few (batch 1) the block-per-row
    /// kernels were faster (measured: vit_b_16 fp16 batch 1, 0.77 ms with the warp kernels
    /// for its 197-row LayerNorms and 2364-row softmaxes, 0.65 ms without).
    fn warp_rows(&self, rows: usize) -> bool {
        !self.options.block_rows && rows >= WARP_ROWS_MIN
    }
}

/// The library descriptors made so far, found again by key: one cuDNN convolution or
/// cuBLASLt matmul (with its timed algorithm) per distinct shape.
#[derive(Default)]
struct LibraryCaches {
    conv: Vec<(ConvKey, usize)>,
    /// The graph-API plan kept for an equal convolution and epilogue (`m.conv_graphs` index).
    conv_graph: Vec<(ConvGraphSpec, usize)>,
    mm: Vec<(MmKey, usize)>,
    /// The quantized GEMMs' (`quant_gemm`), by type and shape: the matmul, or `None` where
    /// cuBLASLt had no algorithm (the CUDA-core fallback kernel runs instead).
    quant: Vec<(String, Option<usize>)>,
}

impl CudaModel {
    pub(crate) fn build(plan: Plan, target: &Target) -> Result<CudaModel> {
        Self::build_logged(plan, target, crate::saved::ChoiceLog::none()).map(|(m, _)| m)
    }

    /// [`CudaModel::build`], its choices among timed candidates recorded in `log` and
    /// returned, or taken from it (a replaying log: nothing timed).
    pub(crate) fn build_logged(
        plan: Plan,
        target: &Target,
        log: crate::saved::ChoiceLog,
    ) -> Result<(CudaModel, crate::saved::ChoiceLog)> {
        let t0 = Instant::now();
        make_current(target.ctx)?;
        let free_before = free_mem()?;
        let arch = device_arch()?;
        let mut m = CudaModel::unbuilt(&plan, target);
        let block = m.upload_weights(&plan)?;
        m.alloc_pinned_io(&plan)?;
        let half_names = m.load_kernels(plan.dtype, arch)?;
        m.create_library_handles()?;

        // Algorithms that need more workspace than the cap are not considered.
        let ws_cap = target.build.workspace_cap(plan.arena_bytes);
        let scratch = DeviceBuffer::new(ws_cap)
            .map_err(|e| e.for_allocation("the algorithm search's workspace"))?;
        let mm_ws_cap = ws_cap.min(MM_WORKSPACE_CAP);
        let mm_scratch = DeviceBuffer::zeroed(mm_ws_cap)
            .map_err(|e| e.for_allocation("the matrix products' search workspace"))?;
        let rec = Recorder {
            plan: &plan,
            const_offs: &block.const_offs,
            arena_base: m.arena,
            weights_base: m.weights,
            dtype: plan.dtype,
            es: plan.dtype.size(),
            half_names,
            scratch: scratch.ptr,
            ws_cap,
            mm_scratch: mm_scratch.ptr,
            mm_ws_cap,
            events: Events::new()?,
            options: target.build,
            choices: std::cell::RefCell::new(log),
        };
        let recorded = m.record_launches(&rec);
        let mut log = rec.choices.into_inner();
        // The search may have stopped with an error while timing on the scratch buffer: the
        // model must not free it a second time when it is dropped.
        m.workspace = 0;
        m.mm_workspace = 0;
        // The algorithm search is over: nothing uses the scratch any more.
        drop(scratch);
        drop(mm_scratch);
        recorded?;
        log.finish()?;
        if log.recording() {
            log.matmuls = m
                .algo_cache
                .iter()
                .map(|(k, algo, _)| (k.clone(), algo.data))
                .collect();
        }
        m.place_workspace(&plan, &block)?;
        m.instantiate()?;
        m.mem.device_delta_bytes = free_before.saturating_sub(free_mem()?);
        m.build_ms = t0.elapsed().as_secs_f64() * 1e3;
        Ok((m, log))
    }

    /// The model with its shapes and layout from `plan` and nothing allocated yet.
    fn unbuilt(plan: &Plan, target: &Target) -> CudaModel {
        CudaModel {
            ctx: target.ctx,
            stream: target.stream,
            precision: plan.precision,
            weights: 0,
            arena: 0,
            workspace: 0,
            workspace_owned: false,
            mm_workspace: 0,
            mm_workspace_owned: false,
            mem: MemoryReport::default(),
            host_in: Vec::new(),
            host_out: Vec::new(),
            in_shapes: plan.inputs.iter().map(|i| i.shape.clone()).collect(),
            out_shapes: plan.outputs.iter().map(|o| o.shape.clone()).collect(),
            module: None,
            funcs: Vec::new(),
            conv_graphs: Vec::new(),
            cudnn: None,
            cublaslt: None,
            convs: Vec::new(),
            mms: Vec::new(),
            launches: Vec::new(),
            names: Vec::new(),
            algo_cache: Vec::new(),
            whole: None,
            compute: None,
            from_device: None,
            pieces: Vec::new(),
            steps: plan.steps.len(),
            step_start: Vec::with_capacity(plan.steps.len() + 1),
            storage_offsets: plan.storages.iter().map(|st| st.offset).collect(),
            const_offsets: plan.const_layout().0,
            dtype: plan.dtype,
            build_ms: 0.0,
            l2_window: None,
            check: None,
            _keep: target.keep.clone(),
        }
    }

    /// Weights (converted on the host, uploaded once) and the arena share one allocation:
    /// the driver rounds every allocation up to ALLOC_GRANULARITY, which for a small model
    /// is a large share of its memory (resnet18 fp16 with three allocations: 34 MiB for
    /// 28.8 MiB planned). What the rounding leaves over may hold the workspace
    /// ([`CudaModel::place_workspace`]).
    fn upload_weights(&mut self, plan: &Plan) -> Result<WeightBlock> {
        let (const_offs, const_bytes) = plan.const_layout();
        let host = plan.weights_host();
        let weights_span = crate::plan::align(const_bytes);
        let block_used = weights_span + plan.arena_bytes;
        let block_bytes = block_used.div_ceil(ALLOC_GRANULARITY).max(1) * ALLOC_GRANULARITY;
        self.weights = dev_alloc(block_bytes)
            .map_err(|e| e.for_allocation("the weights and the activation arena"))?;
        // SAFETY: the device buffer holds const_bytes; host is const_bytes long; synchronous.
        cu_check("cuMemcpyHtoD", unsafe {
            cu::cuMemcpyHtoD_v2(self.weights, host.as_ptr() as *const c_void, const_bytes)
        })?;
        drop(host);
        self.arena = self.weights + weights_span as u64;
        // Poison the arena once so that a read of unwritten memory shows up as NaN in tests
        // (0xff bytes are NaN in f32, f16 and bf16).
        // SAFETY: the arena holds arena_bytes; synchronous memset.
        cu_check("cuMemsetD8", unsafe {
            cu::cuMemsetD8_v2(self.arena, 0xff, plan.arena_bytes)
        })?;
        Ok(WeightBlock {
            const_offs,
            const_bytes,
            block_used,
            block_bytes,
        })
    }

    /// Pinned host buffers for inputs and outputs.
    fn alloc_pinned_io(&mut self, plan: &Plan) -> Result<()> {
        for io in &plan.inputs {
            let n: usize = io.shape.iter().product();
            self.host_in.push(PinnedF32::new(n)?);
        }
        for io in &plan.outputs {
            let n: usize = io.shape.iter().product();
            self.host_out.push(PinnedF32::new(n)?);
        }
        Ok(())
    }

    /// Loads the NVRTC module for `dtype` and looks up every kernel; returns the names of the
    /// f16/bf16-only kernels loaded after [`KERNEL_NAMES`] (none at f32).
    fn load_kernels(&mut self, dtype: DType, arch: (i32, i32)) -> Result<&'static [&'static str]> {
        let cubin = kernel_cubin(dtype, arch)?;
        let module = Module::load(&cubin)?;
        let raw = module.raw();
        self.module = Some(module);
        let half_names: &'static [&'static str] = if dtype == DType::F32 {
            &[]
        } else {
            HALF_KERNEL_NAMES
        };
        for name in KERNEL_NAMES.iter().chain(half_names) {
            let c = CString::new(*name).expect("kernel names have no NUL");
            let mut f: cu::CUfunction = std::ptr::null_mut();
            // SAFETY: module is loaded; c is NUL-terminated.
            cu_check("cuModuleGetFunction", unsafe {
                cu::cuModuleGetFunction(&mut f, raw, c.as_ptr())
            })?;
            if *name == "attention" && arch.0 >= 8 {
                // Its larger block shapes take more than the 48 KiB of dynamic shared memory
                // a kernel gets without opting in (it runs on sm_80 and newer only: every one
                // allows at least 99 KiB).
                // SAFETY: f is a function of the module just loaded.
                cu_check("cuFuncSetAttribute", unsafe {
                    cu::cuFuncSetAttribute(
                        f,
                        cu::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        kernels::ATTN_MAX_SHARED_BYTES as i32,
                    )
                })?;
            }
            self.funcs.push(f);
        }
        Ok(half_names)
    }

    /// Library handles, bound to our stream.
    fn create_library_handles(&mut self) -> Result<()> {
        self.cudnn = Some(Cudnn::new(self.stream)?);
        self.cublaslt = Some(CublasLt::new()?);
        Ok(())
    }

    /// The cuDNN handle (null before the libraries are created).
    fn cudnn(&self) -> dnn::cudnnHandle_t {
        self.cudnn.as_ref().map_or(std::ptr::null_mut(), Cudnn::raw)
    }

    /// The cuBLASLt handle (null before the libraries are created).
    fn cublaslt(&self) -> lt::cublasLtHandle_t {
        self.cublaslt
            .as_ref()
            .map_or(std::ptr::null_mut(), CublasLt::raw)
    }

    /// Records the job's launches: the input copies, every step's launches (each named after
    /// its step), the output copies.
    fn record_launches(&mut self, rec: &Recorder) -> Result<()> {
        let plan = rec.plan;
        let staging = |id: usize| rec.arena_base + plan.storages[id].offset as u64;
        let mut caches = LibraryCaches::default();
        for (i, io) in plan.inputs.iter().enumerate() {
            self.launches.push(Launch::HtoD {
                dst: staging(io.staging),
                src: self.host_in[i].ptr() as *const c_void,
                bytes: self.host_in[i].len() * 4,
            });
        }
        let mut prev = String::from("input copy");
        for step in &plan.steps {
            while self.names.len() < self.launches.len() {
                self.names.push(prev.clone());
            }
            prev = step.name.clone();
            self.step_start.push(self.launches.len());
            record_step(self, rec, &mut caches, step)?;
        }
        while self.names.len() < self.launches.len() {
            self.names.push(prev.clone());
        }
        self.step_start.push(self.launches.len());
        for (i, io) in plan.outputs.iter().enumerate() {
            self.names.push("output copy".into());
            self.launches.push(Launch::DtoH {
                dst: self.host_out[i].ptr() as *mut c_void,
                src: staging(io.staging),
                bytes: self.host_out[i].len() * 4,
            });
        }
        Ok(())
    }

    /// The one workspace: the largest any chosen algorithm needs, in the weights block's
    /// rounding where it fits, else an allocation of its own; and the memory report.
    fn place_workspace(&mut self, plan: &Plan, block: &WeightBlock) -> Result<()> {
        let graphs = self.launches.iter().filter_map(|l| match l {
            Launch::ConvGraph { graph, .. } => Some(self.conv_graphs[*graph].workspace),
            _ => None,
        });
        let dnn = self
            .convs
            .iter()
            .map(|c| c.workspace)
            .chain(graphs)
            .max()
            .unwrap_or(0);
        let mm = self.mms.iter().map(|x| x.workspace).max().unwrap_or(0);
        // Each in the weights allocation's rounding where it fits, else an allocation of its own.
        let mut free = crate::plan::align(block.block_used);
        let mut place = |bytes: usize| -> Result<(u64, bool)> {
            if free + bytes <= block.block_bytes {
                let at = self.weights + free as u64;
                free = crate::plan::align(free + bytes);
                Ok((at, false))
            } else {
                let at = dev_alloc(bytes).map_err(|e| e.for_allocation("a library workspace"))?;
                Ok((at, true))
            }
        };
        (self.workspace, self.workspace_owned) = place(dnn)?;
        (self.mm_workspace, self.mm_workspace_owned) = place(mm)?;
        // cuBLASLt's semaphores start at zero (MM_WORKSPACE_CAP).
        dev_zero(self.mm_workspace, mm)?;
        let ws = dnn + mm;
        self.mem = MemoryReport {
            weights_bytes: block.const_bytes,
            arena_bytes: plan.arena_bytes,
            workspace_bytes: ws,
            total_bytes: block.const_bytes + plan.arena_bytes + ws,
            device_delta_bytes: 0,
        };
        Ok(())
    }

    /// One eager run (loads lazily-loaded library kernels outside capture), then the captures
    /// of the whole job and of the copy-free forward.
    fn instantiate(&mut self) -> Result<()> {
        self.issue(true)?;
        // SAFETY: the stream is live.
        cu_check("cuStreamSynchronize", unsafe {
            cu::cuStreamSynchronize(self.stream)
        })?;
        self.whole = Some(self.capture(true)?);
        self.compute = Some(self.capture(false)?);
        Ok(())
    }

    /// Captures the launches (with or without the input/output copies) into a graph and
    /// instantiates it.
    /// Splits a job into consecutive pieces of about `piece_ms` of device time each (by the
    /// launches' own timings, [`CudaModel::profile`]), one CUDA graph per piece, so that the
    /// caller can pause between pieces ([`CudaModel::run_piece`]): how best-effort work is held
    /// back without giving up graphs. A launch longer than `piece_ms` is a piece of its own.
    /// Returns the number of pieces.
    pub fn split(&mut self, piece_ms: f64) -> Result<usize> {
        let times = self.profile()?;
        let mut bounds = vec![0];
        let mut acc = 0.0;
        for (i, (_, _, ms)) in times.iter().enumerate() {
            if acc > 0.0 && acc + ms > piece_ms {
                bounds.push(i);
                acc = 0.0;
            }
            acc += ms;
        }
        bounds.push(self.launches.len());
        self.pieces.clear();
        for w in bounds.windows(2) {
            let piece = self.capture_list(&self.launches[w[0]..w[1]], true)?;
            self.pieces.push(piece);
        }
        Ok(self.pieces.len())
    }

    /// Sets `mib` of the L2 aside in the model's context (CUDA's persisting-L2 limit, kept if
    /// already larger) and puts an access-policy window over the model's weights on its stream
    /// and on every kernel node of its graphs, captured again with it: a critical model's
    /// weights then stay in the L2 beside neighbours that stream through it
    /// (`[protection] l2_persist_mib`). Before [`CudaModel::split`] (pieces captured earlier
    /// would not have it). More than the device sets aside is an error naming the key.
    pub fn persist_weights_in_l2(&mut self, mib: u64) -> Result<crate::l2::Persisted> {
        make_current(self.ctx)?;
        let limits = crate::l2::limits()?;
        let bytes = crate::l2::persist_bytes(mib, &limits)?;
        let Some(window) = crate::l2::window(
            self.weights,
            self.mem.weights_bytes,
            bytes,
            limits.max_window_bytes,
        ) else {
            return Err(EngineError::Unsupported(
                "[protection] l2_persist_mib: the model has no weights to keep in the L2".into(),
            ));
        };
        crate::l2::set_aside(bytes)?;
        // SAFETY: the model's own stream, live, of the current context.
        unsafe { crate::l2::on_stream(self.stream, &window)? };
        self.l2_window = Some(window);
        self.from_device = None;
        self.whole = Some(self.capture(true)?);
        self.compute = Some(self.capture(false)?);
        self.pieces.clear();
        Ok(crate::l2::Persisted {
            persist_bytes: bytes,
            window,
        })
    }

    /// Pieces a job runs as: 1 until [`CudaModel::split`].
    pub fn pieces(&self) -> usize {
        self.pieces.len().max(1)
    }

    /// Runs piece `i` of a split job and waits for it (unsplit: the whole job).
    pub fn run_piece(&mut self, i: usize) -> Result<()> {
        let Some(exec) = self.pieces.get(i).map(CapturedGraph::exec) else {
            return self.run();
        };
        make_current(self.ctx)?;
        // SAFETY: exec and stream are live; the piece's buffers are owned by self.
        cu_check("cuGraphLaunch", unsafe {
            cu::cuGraphLaunch(exec, self.stream)
        })?;
        self.wait()
    }

    fn capture(&self, copies: bool) -> Result<CapturedGraph> {
        self.capture_list(&self.launches, copies)
    }

    fn capture_list(&self, launches: &[Launch], copies: bool) -> Result<CapturedGraph> {
        // SAFETY: the stream is live and not capturing. THREAD_LOCAL: other threads (other
        // partitions compiling their models) may keep allocating while we capture.
        cu_check("cuStreamBeginCapture", unsafe {
            cu::cuStreamBeginCapture_v2(
                self.stream,
                cu::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
        })?;
        let issued = self.issue_list(launches, copies);
        let mut graph: cu::CUgraph = std::ptr::null_mut();
        // SAFETY: the stream is capturing; ending the capture is required even after a failure.
        let ended = unsafe { cu::cuStreamEndCapture(self.stream, &mut graph) };
        if issued.is_err() || ended != cu::CUresult::CUDA_SUCCESS {
            if !graph.is_null() {
                // SAFETY: the graph the failed capture returned, destroyed once.
                unsafe {
                    cu::cuGraphDestroy(graph);
                }
            }
            issued?;
            cu_check("cuStreamEndCapture", ended)?;
        }
        if let Some(w) = &self.l2_window {
            // SAFETY: the captured graph, live and not instantiated yet.
            if let Err(e) = unsafe { crate::l2::on_graph(graph, w) } {
                // SAFETY: the graph is ours and has no instance.
                unsafe {
                    cu::cuGraphDestroy(graph);
                }
                return Err(e);
            }
        }
        let mut exec: cu::CUgraphExec = std::ptr::null_mut();
        // SAFETY: graph is a complete captured graph; valid out-pointer.
        let r = unsafe { cu::cuGraphInstantiateWithFlags(&mut exec, graph, 0) };
        if r != cu::CUresult::CUDA_SUCCESS {
            // SAFETY: the graph is ours and has no instance.
            unsafe {
                cu::cuGraphDestroy(graph);
            }
            cu_check("cuGraphInstantiate", r)?;
        }
        let captured = CapturedGraph::new(graph, exec);
        // SAFETY: exec and stream are live.
        cu_check("cuGraphUpload", unsafe {
            cu::cuGraphUpload(exec, self.stream)
        })?;
        // SAFETY: the stream is live.
        cu_check("cuStreamSynchronize", unsafe {
            cu::cuStreamSynchronize(self.stream)
        })?;
        Ok(captured)
    }

    /// Device time of the forward alone (the graph without the input/output copies): the
    /// median of `replays` replays, each timed with events, in milliseconds.
    pub fn device_ms(&mut self, replays: usize) -> Result<f64> {
        make_current(self.ctx)?;
        let ev = Events::new()?;
        let mut t = Vec::with_capacity(replays.max(1));
        for _ in 0..replays.max(1) {
            let exec = self
                .compute
                .as_ref()
                .map_or(std::ptr::null_mut(), CapturedGraph::exec);
            let stream = self.stream;
            let ms = ev.time(stream, &mut || {
                // SAFETY: exec and stream are live.
                Ok(cu_check("cuGraphLaunch", unsafe {
                    cu::cuGraphLaunch(exec, stream)
                })?)
            })?;
            t.push(ms as f64);
        }
        t.sort_by(|a, b| a.total_cmp(b));
        Ok(t[t.len() / 2])
    }

    /// Issues every launch on the stream (eagerly, or into a capture); `copies`: include the
    /// input and output copies.
    fn issue(&self, copies: bool) -> Result<()> {
        self.issue_list(&self.launches, copies)
    }

    fn issue_list(&self, launches: &[Launch], copies: bool) -> Result<()> {
        for l in launches {
            if !copies && matches!(l, Launch::HtoD { .. } | Launch::DtoH { .. }) {
                continue;
            }
            match l {
                Launch::Kernel {
                    func,
                    grid,
                    block,
                    shared,
                    args,
                } => {
                    let mut ps: Vec<*mut c_void> = args.iter().map(|a| a.as_ptr()).collect();
                    // SAFETY: the argument list matches the kernel's signature (built next to
                    // it above); every pointer is into this model's arena or weights.
                    cu_check("cuLaunchKernel", unsafe {
                        cu::cuLaunchKernel(
                            self.funcs[*func],
                            *grid,
                            1,
                            1,
                            *block,
                            1,
                            1,
                            *shared,
                            self.stream,
                            ps.as_mut_ptr(),
                            std::ptr::null_mut(),
                        )
                    })?;
                }
                Launch::Conv { conv, x, w, y } => {
                    let c = &self.convs[*conv];
                    let (one, zero) = (1f32, 0f32);
                    // SAFETY: descriptors match the buffers (planned together); the workspace
                    // holds at least c.workspace bytes; alpha/beta are f32 as cuDNN requires
                    // for float, half and bfloat16 data.
                    dnn_check("cudnnConvolutionForward", unsafe {
                        dnn::cudnnConvolutionForward(
                            self.cudnn(),
                            &one as *const f32 as *const c_void,
                            c.x,
                            *x as *const c_void,
                            c.w,
                            *w as *const c_void,
                            c.conv,
                            c.algo,
                            self.workspace as *mut c_void,
                            c.workspace,
                            &zero as *const f32 as *const c_void,
                            c.y,
                            *y as *mut c_void,
                        )
                    })?;
                }
                Launch::ConvGraph { graph, ptrs } => {
                    let ptrs = ConvGraphPtrs {
                        workspace: self.workspace,
                        ..**ptrs
                    };
                    // SAFETY: the plan was made for these buffers' shapes (planned together);
                    // the workspace holds at least the plan's workspace bytes.
                    unsafe { self.conv_graphs[*graph].execute(self.cudnn(), &ptrs) }?;
                }
                Launch::Matmul { mm, a, b, c, y } => {
                    run_matmul(
                        self.cublaslt(),
                        &self.mms[*mm],
                        *a,
                        *b,
                        *c,
                        *y,
                        self.mm_workspace,
                        self.stream,
                    )?;
                }
                Launch::HtoD { dst, src, bytes } => {
                    // SAFETY: src is a pinned host buffer of `bytes` owned by this model; dst
                    // is its staging storage in the arena.
                    cu_check("cuMemcpyHtoDAsync", unsafe {
                        cu::cuMemcpyHtoDAsync_v2(*dst, *src, *bytes, self.stream)
                    })?;
                }
                Launch::DtoH { dst, src, bytes } => {
                    // SAFETY: as above, in the other direction.
                    cu_check("cuMemcpyDtoHAsync", unsafe {
                        cu::cuMemcpyDtoHAsync_v2(*dst, *src, *bytes, self.stream)
                    })?;
                }
            }
        }
        Ok(())
    }

    /// Runs the launches one by one (not the graph), each timed with events: (step name,
    /// what ran, milliseconds), in order. For finding slow steps; allocates.
    pub fn profile(&mut self) -> Result<Vec<(String, String, f64)>> {
        make_current(self.ctx)?;
        let ev = Events::new()?;
        let mut out = Vec::new();
        for (i, l) in self.launches.iter().enumerate() {
            let what = match l {
                Launch::Kernel { func, .. } => KERNEL_NAMES
                    .iter()
                    .chain(HALF_KERNEL_NAMES)
                    .nth(*func)
                    .map_or_else(|| format!("kernel {func}"), |k| k.to_string()),
                Launch::Conv { conv, .. } => format!("cudnn algo {:?}", self.convs[*conv].algo),
                Launch::ConvGraph { graph, .. } => {
                    format!("cudnn engine {}", self.conv_graphs[*graph].engine)
                }
                Launch::Matmul { .. } => "cublasLt".to_string(),
                Launch::HtoD { .. } => "HtoD".to_string(),
                Launch::DtoH { .. } => "DtoH".to_string(),
            };
            let one = std::slice::from_ref(l);
            let ms = ev.time(self.stream, &mut || self.issue_list(one, true))?;
            out.push((
                self.names.get(i).cloned().unwrap_or_default(),
                what,
                ms as f64,
            ));
        }
        Ok(out)
    }

    /// The plan check's result (`None` when it was skipped).
    pub fn plan_check(&self) -> Option<crate::check::CheckReport> {
        self.check
    }

    pub(crate) fn set_plan_check(&mut self, r: crate::check::CheckReport) {
        self.check = Some(r);
    }

    /// Device address of `len` elements at a plan location, if they lie inside the arena or
    /// the weights.
    fn device_span(&self, l: Loc, len: usize) -> Option<u64> {
        let es = self.dtype.size();
        let (base, start, limit) = match l {
            Loc::Storage { id, offset } => (
                self.arena,
                self.storage_offsets.get(id)? + offset * es,
                self.mem.arena_bytes,
            ),
            Loc::Const { id, offset } => (
                self.weights,
                self.const_offsets.get(id)? + offset * es,
                self.mem.weights_bytes,
            ),
        };
        (start + len * es <= limit).then_some(base + start as u64)
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

    /// Where input `i`'s f32 values live on the device — the staging the job's input copy
    /// fills — and its bytes. A producer may write the input there on this model's stream (e.g.
    /// [`crate::Preprocessor::launch_into_model`] on the same backend) and run the job with
    /// [`CudaModel::launch_from_device`].
    pub fn device_input(&self, i: usize) -> Option<(cu::CUdeviceptr, usize)> {
        let mut copies = self.launches.iter().filter_map(|l| match l {
            Launch::HtoD { dst, bytes, .. } => Some((*dst, *bytes)),
            _ => None,
        });
        copies.nth(i)
    }

    /// Launches one job without its input copies (the inputs already written to
    /// [`CudaModel::device_input`], on this model's stream) and without waiting; pair with
    /// [`CudaModel::wait`]. The outputs are copied to the host as in [`CudaModel::launch`].
    pub fn launch_from_device(&mut self) -> Result<()> {
        make_current(self.ctx)?;
        if self.from_device.is_none() {
            // The input copies are the launches before the first step's.
            let first = self.step_start.first().copied().unwrap_or(0);
            self.from_device = Some(self.capture_list(&self.launches[first..], true)?);
        }
        let exec = self
            .from_device
            .as_ref()
            .map(CapturedGraph::exec)
            .ok_or_else(|| EngineError::Runtime("the model has no graph".into()))?;
        // SAFETY: exec and stream are live; the graph's buffers are owned by self.
        cu_check("cuGraphLaunch", unsafe {
            cu::cuGraphLaunch(exec, self.stream)
        })
        .map_err(EngineError::from)
    }

    /// Launches one job (the graph) without waiting; pair with [`CudaModel::wait`].
    pub fn launch(&mut self) -> Result<()> {
        let exec = self
            .whole
            .as_ref()
            .map(CapturedGraph::exec)
            .ok_or_else(|| EngineError::Runtime("the model has no graph".into()))?;
        make_current(self.ctx)?;
        // SAFETY: exec and stream are live; the graph's buffers are owned by self.
        cu_check("cuGraphLaunch", unsafe {
            cu::cuGraphLaunch(exec, self.stream)
        })
        .map_err(EngineError::from)
    }

    /// True when the last launched job has finished (never blocks).
    pub fn is_done(&self) -> Result<bool> {
        // SAFETY: the stream is live.
        let r = unsafe { cu::cuStreamQuery(self.stream) };
        match r {
            cu::CUresult::CUDA_SUCCESS => Ok(true),
            cu::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            e => cu_check("cuStreamQuery", e)
                .map(|_| false)
                .map_err(EngineError::from),
        }
    }

    /// Waits for the last launched job (the output copy is its last node).
    pub fn wait(&self) -> Result<()> {
        // SAFETY: the stream is live.
        cu_check("cuStreamSynchronize", unsafe {
            cu::cuStreamSynchronize(self.stream)
        })
        .map_err(EngineError::from)
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

#[allow(clippy::too_many_arguments)]
fn pointwise_launch(
    rec: &Recorder,
    x: u64,
    y: u64,
    scale: Option<u64>,
    bias: Option<u64>,
    res: Option<u64>,
    n: usize,
    channels: usize,
    inner: usize,
    act: Option<Unary>,
) -> Launch {
    let (a, p0, p1) = act_code(act, rec.dtype);
    let (scale, bias, res) = (scale.unwrap_or(0), bias.unwrap_or(0), res.unwrap_or(0));
    let lanes = rec.vec_lanes();
    // Channels contiguous (inner 1), whole vectors, 16-byte aligned: 16-byte accesses.
    let vector = inner == 1
        && channels.is_multiple_of(lanes)
        && n.is_multiple_of(lanes)
        && n / lanes <= i32::MAX as usize
        && vec_aligned(&[x, y, scale, bias, res]);
    let (func, threads, sizes) = if vector {
        let sizes = [
            Arg::I32((n / lanes) as i32),
            Arg::I32((channels / lanes) as i32),
        ];
        (rec.func("pointwise_v"), n / lanes, sizes.to_vec())
    } else {
        let sizes = [
            Arg::I64(n as i64),
            Arg::I64(channels as i64),
            Arg::I64(inner as i64),
        ];
        (rec.func("pointwise"), n, sizes.to_vec())
    };
    let mut args = vec![
        Arg::Ptr(x),
        Arg::Ptr(y),
        Arg::Ptr(scale),
        Arg::Ptr(bias),
        Arg::Ptr(res),
    ];
    args.extend(sizes);
    args.extend([Arg::I32(a), Arg::F32(p0), Arg::F32(p1)]);
    Launch::Kernel {
        func,
        grid: elementwise_grid(threads),
        block: BLOCK,
        shared: 0,
        args,
    }
}

/// Whether every operand (0 for an absent one) suits the 16-byte accesses of the `*_v` kernels.
fn vec_aligned(ptrs: &[u64]) -> bool {
    ptrs.iter()
        .all(|p| p.is_multiple_of(kernels::VEC_BYTES as u64))
}

#[derive(Clone, Debug, PartialEq)]
struct ConvKey {
    x: [usize; 4],
    w: [usize; 4],
    pads: [usize; 2],
    strides: [usize; 2],
    dil: [usize; 2],
    groups: usize,
}

impl ConvKey {
    fn of(c: &ConvStep) -> ConvKey {
        ConvKey {
            x: c.x_shape,
            w: c.w_shape,
            pads: c.pads,
            strides: c.strides,
            dil: c.dilations,
            groups: c.groups,
        }
    }
}

/// cuDNN algorithms per convolution that the build times itself (see [`conv_descs`]).
const CUDNN_CANDIDATES: usize = 3;

/// Descriptors for the fastest few algorithms cuDNN finds for `c`, fastest first by cuDNN's
/// own timing.
///
/// cuDNN's search times each algorithm once, eagerly, often as the GPU's first work after idle,
/// so its ranking of near-equal algorithms changes from build to build (resnet18 fp16 built at
/// 0.35 ms in most builds and 0.59 ms in one: docs/interference.md). Its top
/// [`CUDNN_CANDIDATES`] are therefore kept and timed again by [`time_candidates`], as graphs
/// in alternating rounds, with the GEMM path.
///
/// Untimed (`ISOLANE_CUDA_SEARCH=first`, or an MPS client with part of the threads:
/// [`BuildOptions::from_vars`]), cuDNN's own first choice only.
fn conv_descs(m: &CudaModel, c: &ConvStep, rec: &Recorder) -> Result<Vec<ConvDesc>> {
    let (dtype, precision) = (rec.dtype, rec.plan.precision);
    let (scratch, ws_cap) = (rec.scratch, rec.ws_cap);
    let ptr = |l: Loc| rec.ptr(l);
    let keep = if rec.options.first_choice {
        1
    } else {
        CUDNN_CANDIDATES
    };
    let search = conv_desc(c, dtype, precision)?;
    let mut perf: [dnn::cudnnConvolutionFwdAlgoPerf_t; 10] =
        // SAFETY: the perf records are plain C structs for which all-zero bytes are valid.
        unsafe { std::mem::zeroed() };
    let mut got = 0;
    // SAFETY: the descriptors are live; the buffers passed to the algorithm search are the
    // step's own (planned together with these shapes) and the scratch holds ws_cap bytes.
    dnn_check("cudnnFindConvolutionForwardAlgorithmEx", unsafe {
        dnn::cudnnFindConvolutionForwardAlgorithmEx(
            m.cudnn(),
            search.x,
            ptr(c.x) as *const c_void,
            search.w,
            ptr(c.w) as *const c_void,
            search.conv,
            search.y,
            ptr(c.y) as *mut c_void,
            perf.len() as i32,
            &mut got,
            perf.as_mut_ptr(),
            scratch as *mut c_void,
            ws_cap,
        )
    })?;
    let usable = perf[..got.max(0) as usize].iter().filter(|p| {
        p.status == dnn::cudnnStatus_t::CUDNN_STATUS_SUCCESS
            && p.memory <= ws_cap
            && (precision != Precision::Fp32
                || p.mathType != dnn::cudnnMathType_t::CUDNN_TENSOR_OP_MATH)
    });
    let mut descs = Vec::with_capacity(keep);
    let mut search = Some(search);
    for p in usable.take(keep) {
        let mut d = match search.take() {
            Some(d) => d,
            None => conv_desc(c, dtype, precision)?,
        };
        d.algo = p.algo;
        d.workspace = p.memory;
        if precision != Precision::Fp32 {
            // SAFETY: `d.conv` is live and owned by `d`.
            dnn_check("cudnnSetConvolutionMathType", unsafe {
                dnn::cudnnSetConvolutionMathType(d.conv, p.mathType)
            })?;
        }
        descs.push(d);
    }
    if descs.is_empty() {
        return Err(EngineError::Runtime(format!(
            "cuDNN offers no convolution algorithm for x {:?} w {:?} within a {} byte workspace",
            c.x_shape, c.w_shape, ws_cap
        )));
    }
    Ok(descs)
}

/// The descriptors of convolution `c` (algorithm not yet chosen).
fn conv_desc(c: &ConvStep, dtype: DType, precision: Precision) -> Result<ConvDesc> {
    let dt = dnn_dtype(dtype);
    let i = |v: usize| v as i32;
    let mut d = ConvDesc {
        x: std::ptr::null_mut(),
        w: std::ptr::null_mut(),
        conv: std::ptr::null_mut(),
        y: std::ptr::null_mut(),
        algo: dnn::cudnnConvolutionFwdAlgo_t::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM,
        workspace: 0,
    };
    let fmt = if c.nhwc {
        dnn::cudnnTensorFormat_t::CUDNN_TENSOR_NHWC
    } else {
        dnn::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW
    };
    let math = match precision {
        Precision::Fp32 => dnn::cudnnMathType_t::CUDNN_FMA_MATH,
        Precision::Tf32 => dnn::cudnnMathType_t::CUDNN_DEFAULT_MATH,
        Precision::Fp16 | Precision::Bf16 => dnn::cudnnMathType_t::CUDNN_TENSOR_OP_MATH,
    };
    // SAFETY: out-pointers are valid. The descriptors destroy themselves when `d` is dropped
    // (here on an error, else with the model).
    unsafe {
        dnn_check(
            "cudnnCreateTensorDescriptor",
            dnn::cudnnCreateTensorDescriptor(&mut d.x),
        )?;
        dnn_check(
            "cudnnCreateTensorDescriptor",
            dnn::cudnnCreateTensorDescriptor(&mut d.y),
        )?;
        dnn_check(
            "cudnnCreateFilterDescriptor",
            dnn::cudnnCreateFilterDescriptor(&mut d.w),
        )?;
        dnn_check(
            "cudnnCreateConvolutionDescriptor",
            dnn::cudnnCreateConvolutionDescriptor(&mut d.conv),
        )?;
        let [n, ch, h, w] = c.x_shape;
        dnn_check(
            "cudnnSetTensor4dDescriptor",
            dnn::cudnnSetTensor4dDescriptor(d.x, fmt, dt, i(n), i(ch), i(h), i(w)),
        )?;
        let [n, ch, h, w] = c.y_shape;
        dnn_check(
            "cudnnSetTensor4dDescriptor",
            dnn::cudnnSetTensor4dDescriptor(d.y, fmt, dt, i(n), i(ch), i(h), i(w)),
        )?;
        let [k, cg, kh, kw] = c.w_shape;
        dnn_check(
            "cudnnSetFilter4dDescriptor",
            dnn::cudnnSetFilter4dDescriptor(d.w, dt, fmt, i(k), i(cg), i(kh), i(kw)),
        )?;
        dnn_check(
            "cudnnSetConvolution2dDescriptor",
            dnn::cudnnSetConvolution2dDescriptor(
                d.conv,
                i(c.pads[0]),
                i(c.pads[1]),
                i(c.strides[0]),
                i(c.strides[1]),
                i(c.dilations[0]),
                i(c.dilations[1]),
                dnn::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
                dnn::cudnnDataType_t::CUDNN_DATA_FLOAT,
            ),
        )?;
        dnn_check(
            "cudnnSetConvolutionGroupCount",
            dnn::cudnnSetConvolutionGroupCount(d.conv, i(c.groups)),
        )?;
        dnn_check(
            "cudnnSetConvolutionMathType",
            dnn::cudnnSetConvolutionMathType(d.conv, math),
        )?;
    }
    Ok(d)
}

#[derive(Clone, Debug, PartialEq)]
struct MmKey {
    m: usize,
    n: usize,
    k: usize,
    batch: usize,
    sa: usize,
    sb: usize,
    b_trans: bool,
    linear: bool,
    bias: Option<u64>,
    relu: bool,
    gelu: bool,
    residual: bool,
    alpha: u32,
    /// Row strides of our a, b and y, and y's batch stride.
    lda: usize,
    ldb: usize,
    ldy: usize,
    sy: usize,
}

impl MmKey {
    /// `y[m, n] = x[m, k] · wᵀ (+ bias)`, dense and unbatched, nothing else fused.
    fn linear(m: usize, n: usize, k: usize, bias: Option<u64>) -> MmKey {
        MmKey {
            m,
            n,
            k,
            batch: 1,
            sa: 0,
            sb: 0,
            b_trans: true,
            linear: true,
            bias,
            relu: false,
            gelu: false,
            residual: false,
            alpha: 1.0f32.to_bits(),
            lda: k,
            ldb: k,
            ldy: n,
            sy: m * n,
        }
    }
}

fn set_attr<T>(
    desc: lt::cublasLtMatmulDesc_t,
    attr: lt::cublasLtMatmulDescAttributes_t,
    v: &T,
) -> Result<()> {
    // SAFETY: v points to a value of the size the attribute expects (chosen by the caller).
    lt_check("cublasLtMatmulDescSetAttribute", unsafe {
        lt::cublasLtMatmulDescSetAttribute(
            desc,
            attr,
            v as *const T as *const c_void,
            std::mem::size_of::<T>(),
        )
    })
    .map_err(EngineError::from)
}

fn layout(
    dt: lt::cudaDataType,
    rows: usize,
    cols: usize,
    ld: usize,
    batch: usize,
    stride: usize,
) -> Result<lt::cublasLtMatrixLayout_t> {
    let mut l: lt::cublasLtMatrixLayout_t = std::ptr::null_mut();
    // SAFETY: valid out-pointer; attribute values are i32 / i64 as cuBLASLt documents.
    unsafe {
        lt_check(
            "cublasLtMatrixLayoutCreate",
            lt::cublasLtMatrixLayoutCreate(&mut l, dt, rows as u64, cols as u64, ld as i64),
        )?;
        if batch > 1 {
            let b = batch as i32;
            let s = stride as i64;
            lt_check(
                "cublasLtMatrixLayoutSetAttribute",
                lt::cublasLtMatrixLayoutSetAttribute(
                    l,
                    lt::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                    &b as *const i32 as *const c_void,
                    4,
                ),
            )?;
            lt_check(
                "cublasLtMatrixLayoutSetAttribute",
                lt::cublasLtMatrixLayoutSetAttribute(
                    l,
                    lt::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                    &s as *const i64 as *const c_void,
                    8,
                ),
            )?;
        }
    }
    Ok(l)
}

/// The cuBLASLt matmul descriptor (compute type, transposes, epilogue, bias) and the layouts
/// of a (the weight-side operand), b and d for `key`.
fn matmul_descriptors(
    key: &MmKey,
    dtype: DType,
    precision: Precision,
) -> Result<(
    lt::cublasLtMatmulDesc_t,
    lt::cublasLtMatrixLayout_t,
    lt::cublasLtMatrixLayout_t,
    lt::cublasLtMatrixLayout_t,
)> {
    let dt = lt_dtype(dtype);
    let compute = match precision {
        Precision::Tf32 => lt::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32,
        // Plain COMPUTE_32F never uses TF32: fp32 stays true fp32.
        _ => lt::cublasComputeType_t::CUBLAS_COMPUTE_32F,
    };
    let mut desc: lt::cublasLtMatmulDesc_t = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    lt_check("cublasLtMatmulDescCreate", unsafe {
        lt::cublasLtMatmulDescCreate(&mut desc, compute, lt::cudaDataType::CUDA_R_32F)
    })?;
    let (mm, n, k) = (key.m, key.n, key.k);
    let op_n: i32 = 0;
    // cuBLASLt's A is our B operand (see `mm_index`), transposed when `b_trans`.
    let (op_a, a_rows, a_cols): (i32, _, _) = if key.b_trans { (1, k, n) } else { (0, n, k) };
    set_attr(
        desc,
        lt::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
        &op_a,
    )?;
    let a = layout(dt, a_rows, a_cols, key.ldb, key.batch, key.sb)?;
    set_attr(
        desc,
        lt::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSB,
        &op_n,
    )?;
    let b = layout(dt, k, mm, key.lda, key.batch, key.sa)?;
    let d = layout(dt, n, mm, key.ldy, key.batch, key.sy)?;
    if key.linear {
        let epi = match (key.bias.is_some(), key.relu) {
            _ if key.gelu => lt::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_GELU_BIAS,
            (true, true) => lt::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_RELU_BIAS,
            (true, false) => lt::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS,
            (false, true) => lt::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_RELU,
            (false, false) => lt::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_DEFAULT,
        };
        set_attr(
            desc,
            lt::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_EPILOGUE,
            &epi,
        )?;
        if let Some(bp) = key.bias {
            set_attr(
                desc,
                lt::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                &bp,
            )?;
        }
    }
    Ok((desc, a, b, d))
}

/// Up to 16 algorithms cuBLASLt's heuristic proposes for the descriptors within the workspace
/// cap, and how many it returned.
fn matmul_heuristics(
    handle: lt::cublasLtHandle_t,
    (desc, a, b, d): (
        lt::cublasLtMatmulDesc_t,
        lt::cublasLtMatrixLayout_t,
        lt::cublasLtMatrixLayout_t,
        lt::cublasLtMatrixLayout_t,
    ),
    ws_cap: usize,
) -> Result<([lt::cublasLtMatmulHeuristicResult_t; 16], i32)> {
    let mut pref: lt::cublasLtMatmulPreference_t = std::ptr::null_mut();
    let mut results: [lt::cublasLtMatmulHeuristicResult_t; 16];
    let mut got = 0i32;
    let cap = ws_cap as u64;
    // SAFETY: valid out-pointers; the descriptors above are complete.
    unsafe {
        results = std::mem::zeroed();
        lt_check(
            "cublasLtMatmulPreferenceCreate",
            lt::cublasLtMatmulPreferenceCreate(&mut pref),
        )?;
        lt_check(
            "cublasLtMatmulPreferenceSetAttribute",
            lt::cublasLtMatmulPreferenceSetAttribute(
                pref,
                lt::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                &cap as *const u64 as *const c_void,
                8,
            ),
        )?;
        let r = lt::cublasLtMatmulAlgoGetHeuristic(
            handle,
            desc,
            a,
            b,
            d,
            d,
            pref,
            results.len() as i32,
            results.as_mut_ptr(),
            &mut got,
        );
        lt::cublasLtMatmulPreferenceDestroy(pref);
        lt_check("cublasLtMatmulAlgoGetHeuristic", r)?;
    }
    Ok((results, got))
}

/// A matmul descriptor for `key` (reused when an identical one exists), its algorithm chosen
/// by timing cuBLASLt's candidates on the real buffers.
///
/// Row-major `Y[M,N] = X[M,K] · op(B)` is computed as column-major `Yᵀ = op(B)ᵀ · Xᵀ`:
/// cuBLASLt's A is our B operand (`a_ptr`), its B is our X (`b_ptr`).
fn mm_index(
    m: &mut CudaModel,
    rec: &Recorder,
    cache: &mut Vec<(MmKey, usize)>,
    key: MmKey,
    [a_ptr, b_ptr, c_ptr, y_ptr]: [u64; 4],
) -> Result<usize> {
    let (dtype, precision) = (rec.dtype, rec.plan.precision);
    let (scratch, ws_cap, events) = (rec.mm_scratch, rec.mm_ws_cap, &rec.events);
    if let Some((_, i)) = cache.iter().find(|(k, _)| *k == key) {
        return Ok(*i);
    }
    let (desc, a, b, d) = matmul_descriptors(&key, dtype, precision)?;
    let shape_key = format!(
        "{:?}",
        MmKey {
            bias: key.bias.map(|_| 1),
            ..key.clone()
        }
    );
    // A saved plan's algorithm for this shape: checked by cuBLASLt for these descriptors
    // (which also says its workspace), never searched or timed.
    let saved = rec
        .choices
        .borrow()
        .replaying()
        .then(|| rec.choices.borrow().matmul(&shape_key));
    if let Some(saved) = saved {
        let mut cand = MatmulDesc {
            desc,
            a,
            b,
            d,
            algo: saved.unwrap_or(lt::cublasLtMatmulAlgo_t { data: [0; 8] }),
            workspace: 0,
            alpha: f32::from_bits(key.alpha),
            beta: if key.residual { 1.0 } else { 0.0 },
        };
        let Some(algo) = saved else {
            return Err(EngineError::InvalidArgument(format!(
                "the saved plan has no cuBLASLt algorithm for the {}×{}×{} matmul (batch {}) \
                 of the plan made from its graph; build it again with `isolane build`",
                key.m, key.n, key.k, key.batch
            )));
        };
        // Set in place: `MatmulDesc { workspace, ..cand }` would copy the descriptor handles
        // (all `Copy`) and leave `cand` to destroy them when dropped, a double free at the
        // model's end (the H200 aborted so, session 20).
        cand.workspace = crate::saved::checked_matmul_algo(m.cublaslt(), (desc, a, b, d), &algo)?;
        m.mms.push(cand);
        cache.push((key, m.mms.len() - 1));
        return Ok(m.mms.len() - 1);
    }
    let (results, got) = matmul_heuristics(m.cublaslt(), (desc, a, b, d), ws_cap)?;
    let (mm, n, k) = (key.m, key.n, key.k);
    let mut cand = MatmulDesc {
        desc,
        a,
        b,
        d,
        algo: results[0].algo,
        workspace: results[0].workspace_size(),
        alpha: f32::from_bits(key.alpha),
        beta: if key.residual { 1.0 } else { 0.0 },
    };
    if got == 0 {
        return Err(EngineError::Runtime(format!(
            "cuBLASLt offers no algorithm for {mm}×{n}×{k} (batch {})",
            key.batch
        )));
    }
    if let Some((_, algo, ws)) = m.algo_cache.iter().find(|(k, _, _)| *k == shape_key) {
        cand.algo = *algo;
        cand.workspace = *ws;
        m.mms.push(cand);
        cache.push((key, m.mms.len() - 1));
        return Ok(m.mms.len() - 1);
    }
    // Time each candidate that runs (after a warm-up call) in alternating rounds, each keeping
    // its best, and keep the fastest: timed one after the other, the first ones ran while the
    // clocks were still rising after idle (time_candidates says more).
    let (handle, stream) = (m.cublaslt(), m.stream);
    let run =
        |cand: &MatmulDesc| run_matmul(handle, cand, a_ptr, b_ptr, c_ptr, y_ptr, scratch, stream);
    // Every candidate is checked against the CPU first (mm_check: some computed garbage as an
    // MPS client with part of the threads); the check's run is also the warm-up call.
    let probe = MatmulProbe::new(
        &matmul_shape(&key),
        &MatmulOperands {
            x: b_ptr,
            w: a_ptr,
            c: c_ptr,
            y: y_ptr,
        },
        dtype,
        precision,
        rec.arena_base..rec.arena_base + rec.plan.arena_bytes as u64,
    )?;
    let mut runs: Vec<(usize, f32)> = Vec::new();
    let mut wrong = Vec::new();
    let mut failed = None;
    for (i, r) in results[..got as usize].iter().enumerate() {
        if r.state != lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS || r.workspace_size() > ws_cap {
            continue;
        }
        if rec.options.first_choice && !runs.is_empty() {
            break;
        }
        cand.algo = r.algo;
        cand.workspace = r.workspace_size();
        // A candidate that cannot run here (a cluster shape a small green context cannot
        // place: time_candidates) is left out like a wrong one.
        match probe.matches(stream, &mut || run(&cand)) {
            Ok(true) => runs.push((i, f32::INFINITY)),
            Ok(false) => wrong.push(i),
            Err(e) => {
                failed.get_or_insert(e);
                wrong.push(i);
            }
        }
    }
    if runs.is_empty() {
        let failed = failed.map_or(String::new(), |e| format!(" (one failed to run: {e})"));
        return Err(EngineError::Runtime(format!(
            "cuBLASLt offers no algorithm that computes the {mm}×{n}×{k} matmul (batch {}) right \
             on this GPU: its candidates {wrong:?} all disagreed with the CPU on seeded inputs \
             or failed to run{failed}",
            key.batch
        )));
    }
    // One candidate (untimed search, or the only one that passed) is kept without timing.
    for _ in 0..if runs.len() > 1 { TIMING_ROUNDS } else { 0 } {
        for (i, t) in runs.iter_mut() {
            cand.algo = results[*i].algo;
            cand.workspace = results[*i].workspace_size();
            *t = t.min(events.time(stream, &mut || run(&cand))?);
        }
    }
    // The fastest; on a tie (untimed), the first.
    let (best, _) = *runs
        .iter()
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .expect("at least one candidate passed (checked above)");
    probe.poison_again()?;
    if rec.options.search_log {
        let times: Vec<String> = runs
            .iter()
            .map(|(i, t)| {
                let algo = &results[*i].algo;
                format!(
                    "#{i} (id {}, cluster {}, ws {}) {t:.4} ms",
                    algo_config(algo, lt::cublasLtMatmulAlgoConfigAttributes_t::CUBLASLT_ALGO_CONFIG_ID),
                    algo_config(
                        algo,
                        lt::cublasLtMatmulAlgoConfigAttributes_t::CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID
                    ),
                    results[*i].workspace_size()
                )
            })
            .collect();
        eprintln!(
            "search: matmul {mm}x{n}x{k} batch {}: {}; wrong {wrong:?}; kept #{best}",
            key.batch,
            times.join(", "),
        );
    }
    cand.algo = results[best].algo;
    cand.workspace = results[best].workspace_size();
    m.algo_cache.push((shape_key, cand.algo, cand.workspace));
    m.mms.push(cand);
    cache.push((key, m.mms.len() - 1));
    Ok(m.mms.len() - 1)
}

/// One `u32` attribute of a cuBLASLt algorithm's configuration, for the search log (`u32::MAX`
/// where it cannot be read).
fn algo_config(
    algo: &lt::cublasLtMatmulAlgo_t,
    attr: lt::cublasLtMatmulAlgoConfigAttributes_t,
) -> u32 {
    let mut v: u32 = u32::MAX;
    let mut written = 0usize;
    // SAFETY: `algo` is an initialised algorithm from the heuristic; the buffer is a u32 and its
    // size is passed, as these attributes (ID, CLUSTER_SHAPE_ID) are 32-bit.
    let r = unsafe {
        lt::cublasLtMatmulAlgoConfigGetAttribute(
            algo,
            attr,
            &mut v as *mut u32 as *mut c_void,
            std::mem::size_of::<u32>(),
            &mut written,
        )
    };
    if r == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        v
    } else {
        u32::MAX
    }
}

/// What the CPU check of a matmul's candidates needs to know of its key.
fn matmul_shape(key: &MmKey) -> MatmulShape {
    MatmulShape {
        m: key.m,
        n: key.n,
        k: key.k,
        batch: key.batch,
        sx: key.sa,
        sw: key.sb,
        sy: key.sy,
        ldx: key.lda,
        ldw: key.ldb,
        ldy: key.ldy,
        w_trans: key.b_trans,
        alpha: f32::from_bits(key.alpha),
        // cuBLASLt's epilogue is set for linear keys only (matmul_descriptors).
        bias: key.bias.filter(|_| key.linear),
        relu: key.relu && key.linear,
        gelu: key.gelu && key.linear,
        residual: key.residual,
    }
}

trait WorkspaceSize {
    fn workspace_size(&self) -> usize;
}
impl WorkspaceSize for lt::cublasLtMatmulHeuristicResult_t {
    fn workspace_size(&self) -> usize {
        self.workspaceSize
    }
}

#[allow(clippy::too_many_arguments)]
fn run_matmul(
    h: lt::cublasLtHandle_t,
    d: &MatmulDesc,
    a: u64,
    b: u64,
    c: u64,
    y: u64,
    workspace: u64,
    stream: cu::CUstream,
) -> Result<()> {
    let c = if c != 0 { c } else { y };
    // SAFETY: descriptors and layouts were built for exactly these buffers; the workspace
    // holds at least d.workspace bytes; scale type is f32.
    lt_check("cublasLtMatmul", unsafe {
        lt::cublasLtMatmul(
            h,
            d.desc,
            &d.alpha as *const f32 as *const c_void,
            a as *const c_void,
            d.a,
            b as *const c_void,
            d.b,
            &d.beta as *const f32 as *const c_void,
            c as *const c_void,
            d.d,
            y as *mut c_void,
            d.d,
            &d.algo,
            workspace as *mut c_void,
            d.workspace,
            stream as lt::cudaStream_t,
        )
    })
    .map_err(EngineError::from)
}

impl Drop for CudaModel {
    fn drop(&mut self) {
        if make_current(self.ctx).is_err() {
            return;
        }
        // SAFETY: the stream is synchronised first so that no job still uses what the fields
        // below free when they drop (graphs first, then the libraries, the module, the pinned
        // buffers: declaration order).
        unsafe {
            cu::cuStreamSynchronize(self.stream);
        }
        // SAFETY: the weights block and an own workspace were allocated by this model and are
        // freed exactly once, here; the graphs that use them are never launched again.
        unsafe {
            if self.workspace_owned && self.workspace != 0 {
                cu::cuMemFree_v2(self.workspace);
            }
            if self.mm_workspace_owned && self.mm_workspace != 0 {
                cu::cuMemFree_v2(self.mm_workspace);
            }
            if self.weights != 0 {
                cu::cuMemFree_v2(self.weights);
            }
        }
    }
}

/// The plan check's step-by-step replay: the same launches the graph holds, issued eagerly.
impl crate::check::StepRunner for CudaModel {
    fn run_plan(&mut self, inputs: &[Vec<f32>]) -> Result<Vec<Vec<f32>>> {
        self.write_inputs(inputs)?;
        self.run()?;
        Ok((0..self.num_outputs())
            .map(|i| self.output_at(i).to_vec())
            .collect())
    }

    fn write_inputs(&mut self, inputs: &[Vec<f32>]) -> Result<()> {
        for (i, x) in inputs.iter().enumerate() {
            let buf = self.input_mut_at(i);
            if buf.len() != x.len() {
                return Err(EngineError::InvalidArgument(format!(
                    "input {i}: {} values for a buffer of {}",
                    x.len(),
                    buf.len()
                )));
            }
            buf.copy_from_slice(x);
        }
        Ok(())
    }

    fn run_steps(&mut self, from: usize, to: usize) -> Result<()> {
        make_current(self.ctx)?;
        // Step 0 starts with the input copies (the launches before the first step).
        let first = if from == 0 {
            0
        } else {
            self.step_start[from.min(self.steps)]
        };
        let last = self.step_start[to.min(self.steps)];
        let launches = self.launches.get(first..last).ok_or_else(|| {
            EngineError::InvalidArgument(format!("steps {from}..{to} of {}", self.steps))
        })?;
        self.issue_list(launches, true)?;
        self.wait()
    }

    fn read(&mut self, loc: Loc, len: usize) -> Result<Vec<f32>> {
        make_current(self.ctx)?;
        let es = self.dtype.size();
        let src = self.device_span(loc, len).ok_or_else(|| {
            EngineError::InvalidArgument(format!("{len} elements at {loc:?} are outside the model"))
        })?;
        let mut raw = vec![0u8; len * es];
        // SAFETY: src..src + len * es lies inside this model's arena or weights (checked
        // above); raw holds len * es bytes; synchronous copy (the stream was synchronised
        // after the last step).
        cu_check("cuMemcpyDtoH", unsafe {
            cu::cuMemcpyDtoH_v2(raw.as_mut_ptr() as *mut c_void, src, raw.len())
        })?;
        Ok(crate::convert::to_f32(&raw, self.dtype))
    }
}

impl CompiledModel for CudaModel {
    fn num_inputs(&self) -> usize {
        self.host_in.len()
    }
    fn num_outputs(&self) -> usize {
        self.host_out.len()
    }
    fn input_shape_at(&self, i: usize) -> &[usize] {
        self.in_shapes.get(i).map_or(&[], |s| s.as_slice())
    }
    fn output_shape_at(&self, i: usize) -> &[usize] {
        self.out_shapes.get(i).map_or(&[], |s| s.as_slice())
    }
    fn input_mut_at(&mut self, i: usize) -> &mut [f32] {
        match self.host_in.get_mut(i) {
            Some(b) => b.as_mut_slice(),
            None => &mut [],
        }
    }
    fn output_at(&self, i: usize) -> &[f32] {
        match self.host_out.get(i) {
            Some(b) => b.as_slice(),
            None => &[],
        }
    }
    fn run(&mut self) -> Result<()> {
        self.launch()?;
        self.wait()
    }
    fn arena_bytes(&self) -> usize {
        self.mem.arena_bytes
    }
}

/// Records the launches of one step (choosing among timed candidates where there are several).
fn record_step(
    m: &mut CudaModel,
    rec: &Recorder,
    caches: &mut LibraryCaches,
    step: &Step,
) -> Result<()> {
    let err = |e: EngineError| e.at_node(&step.name);
    let es = rec.es;
    match &step.kind {
        StepKind::CastIn { x, y, n } => m.launches.push(cast_launch(rec, "cast_in", *x, *y, *n)),
        StepKind::CastOut { x, y, n } => m.launches.push(cast_launch(rec, "cast_out", *x, *y, *n)),
        StepKind::Conv(c) => record_conv(m, rec, caches, &err, c)?,
        StepKind::DwConv(c) => record_dw_conv(m, rec, c)?,
        StepKind::Linear(l) => record_linear(m, rec, caches, &err, l)?,
        StepKind::MatMul(mm_step) => record_matmul(m, rec, caches, &err, mm_step)?,
        StepKind::QuantGemm(q) => {
            quant_gemm::record_quant_gemm(m, rec, caches, (&step.name, &err), q)?
        }
        StepKind::Pointwise {
            x,
            y,
            scale,
            bias,
            residual,
            n,
            channels,
            inner,
            act,
        } => m.launches.push(pointwise_launch(
            rec,
            rec.ptr(*x),
            rec.ptr(*y),
            scale.map(&|l| rec.ptr(l)),
            bias.map(&|l| rec.ptr(l)),
            residual.map(&|l| rec.ptr(l)),
            *n,
            *channels,
            *inner,
            *act,
        )),
        StepKind::Binary { a, b, y, op, space } => {
            let n = space.numel();
            m.launches.push(Launch::Kernel {
                func: rec.func("binary"),
                grid: elementwise_grid(n),
                block: BLOCK,
                shared: 0,
                args: vec![
                    Arg::Ptr(rec.ptr(*a)),
                    Arg::Ptr(rec.ptr(*b)),
                    Arg::Ptr(rec.ptr(*y)),
                    Arg::I64(n as i64),
                    Arg::I32(binary_code(*op)),
                    Arg::Space(Box::new(Space::from(space))),
                ],
            });
        }
        StepKind::Copy { x, y, space } => {
            // The output staging is f32 and so is its source when dtype is f32.
            // Contiguous innermost runs move in 16-, 8- or 4-byte words.
            let (xp, yp) = (rec.ptr(*x), rec.ptr(*y));
            let (name, sp) = [("copy_w16", 16), ("copy_w8", 8), ("copy_w4", 4)]
                .iter()
                .find_map(|&(k, w)| widen_copy(space, es, w, [xp, yp]).map(|sp| (k, sp)))
                .unwrap_or(("copy_strided", space.clone()));
            let n = sp.numel();
            m.launches.push(Launch::Kernel {
                func: rec.func(name),
                grid: elementwise_grid(n),
                block: BLOCK,
                shared: 0,
                args: vec![
                    Arg::Ptr(xp),
                    Arg::Ptr(yp),
                    Arg::I64(n as i64),
                    Arg::Space(Box::new(Space::from(&sp))),
                ],
            });
        }
        StepKind::Attention(at) => record_attention(m, rec, &err, at)?,
        StepKind::LayerNorm(ln) => record_layer_norm(m, rec, ln).map_err(err)?,
        StepKind::Softmax(sm) => record_softmax(m, rec, sm),
        StepKind::Pool(pool) => record_pool(m, rec, pool),
        StepKind::ChanMean { x, y, n, c, hw } => m.launches.push(Launch::Kernel {
            func: rec.func("chan_mean"),
            grid: elementwise_grid(n * c),
            block: BLOCK,
            shared: 0,
            args: vec![
                Arg::Ptr(rec.ptr(*x)),
                Arg::Ptr(rec.ptr(*y)),
                Arg::I64(*n as i64),
                Arg::I64(*c as i64),
                Arg::I64(*hw as i64),
            ],
        }),
        StepKind::RowReduce {
            x,
            y,
            rows,
            hw,
            kind,
        } => m.launches.push(Launch::Kernel {
            func: rec.func("row_reduce"),
            grid: (rows * 32).div_ceil(BLOCK as usize) as u32,
            block: BLOCK,
            shared: 0,
            args: vec![
                Arg::Ptr(rec.ptr(*x)),
                Arg::Ptr(rec.ptr(*y)),
                Arg::I64(*rows as i64),
                Arg::I64(*hw as i64),
                Arg::I32(reduce_code(*kind)),
            ],
        }),
        StepKind::Resize(rs) => record_resize(m, rec, rs),
        StepKind::FakeQuant(fq) => {
            let (lo, hi) = fq.qtype.range();
            m.launches.push(Launch::Kernel {
                func: rec.func("fake_quant"),
                grid: elementwise_grid(fq.n),
                block: BLOCK,
                shared: 0,
                args: vec![
                    Arg::Ptr(rec.ptr(fq.x)),
                    Arg::Ptr(rec.ptr(fq.y)),
                    Arg::Ptr(fq.params.map_or(0, |[s, _]| rec.ptr(s))),
                    Arg::Ptr(fq.params.map_or(0, |[_, z]| rec.ptr(z))),
                    Arg::F32(fq.scale),
                    Arg::F32(fq.zero_point),
                    Arg::I64(fq.n as i64),
                    Arg::I64(fq.channels as i64),
                    Arg::I64(fq.inner as i64),
                    Arg::F32(lo),
                    Arg::F32(hi),
                    Arg::I32(fq.qtype.is_float() as i32),
                    Arg::I32(fq.saturate as i32),
                ],
            });
        }
        StepKind::AdaptivePool {
            x,
            y,
            x_shape,
            out_hw,
        } => {
            let n = x_shape[0] * x_shape[1] * out_hw[0] * out_hw[1];
            m.launches.push(Launch::Kernel {
                func: rec.func("adaptive_pool"),
                grid: elementwise_grid(n),
                block: BLOCK,
                shared: 0,
                args: vec![
                    Arg::Ptr(rec.ptr(*x)),
                    Arg::Ptr(rec.ptr(*y)),
                    Arg::I32((x_shape[0] * x_shape[1]) as i32),
                    Arg::I32(x_shape[2] as i32),
                    Arg::I32(x_shape[3] as i32),
                    Arg::I32(out_hw[0] as i32),
                    Arg::I32(out_hw[1] as i32),
                ],
            });
        }
    }
    Ok(())
}

/// The elementwise cast of `n` values from `x` to `y` (into or out of the model's dtype).
fn cast_launch(rec: &Recorder, kernel: &str, x: Loc, y: Loc, n: usize) -> Launch {
    Launch::Kernel {
        func: rec.func(kernel),
        grid: elementwise_grid(n),
        block: BLOCK,
        shared: 0,
        args: vec![
            Arg::Ptr(rec.ptr(x)),
            Arg::Ptr(rec.ptr(y)),
            Arg::I64(n as i64),
        ],
    }
}

fn record_conv(
    m: &mut CudaModel,
    rec: &Recorder,
    caches: &mut LibraryCaches,
    err: &dyn Fn(EngineError) -> EngineError,
    c: &ConvStep,
) -> Result<()> {
    let saved = rec.choices.borrow_mut().take("a convolution")?;
    if let Some(choice) = saved {
        return replay_conv(m, rec, caches, c, choice).map_err(err);
    }
    let conv_cache = &mut caches.conv;
    // Two ways, each timed on the real buffers; the faster one is kept:
    // cuDNN (one of its best algorithms) + our epilogue kernel, or (NHWC, one group)
    // im2col + a cuBLASLt GEMM with bias, ReLU and the residual fused.
    let paths = rec.options.conv_paths;
    let key = ConvKey::of(c);
    // The cuDNN candidates: the algorithm chosen for an equal convolution earlier in this
    // build, else cuDNN's top few.
    let cached = conv_cache.iter().find(|(k, _)| *k == key).map(|&(_, i)| i);
    let mut dnn_descs: Vec<usize> = Vec::new();
    if paths.tries_cudnn() || !c.gemm_capable() {
        // (The descriptors of the algorithms that lose stay in `m.convs`, unused: a few host
        // objects per distinct convolution, and the launches hold indices into it.)
        let found = match cached {
            Some(i) => Ok(vec![i]),
            None => conv_descs(m, c, rec).map(|descs| {
                descs
                    .into_iter()
                    .map(|d| {
                        m.convs.push(d);
                        m.convs.len() - 1
                    })
                    .collect()
            }),
        };
        match found {
            Ok(idxs) => dnn_descs = idxs,
            Err(e) if !c.gemm_capable() => return Err(err(e)),
            Err(_) => {}
        }
    }
    let mut candidates: Vec<TimedPath> = dnn_descs
        .iter()
        .map(|&idx| {
            let mut l = vec![Launch::Conv {
                conv: idx,
                x: rec.ptr(c.x),
                w: rec.ptr(c.w),
                y: rec.ptr(c.y),
            }];
            if c.bias.is_some() || c.residual.is_some() || c.act.is_some() {
                l.push(conv_epilogue(rec, c, true, true));
            }
            (l, f32::INFINITY)
        })
        .collect();
    // cuDNN's graph API: its heuristics' first engines, the epilogue fused where it can be.
    let graph_first = candidates.len();
    let graph_ptrs = ConvGraphPtrs {
        x: rec.ptr(c.x),
        w: rec.ptr(c.w),
        y: rec.ptr(c.y),
        bias: c.bias.map_or(0, &|l| rec.ptr(l)),
        residual: c.residual.map_or(0, &|l| rec.ptr(l)),
        workspace: 0,
    };
    // (Its tensors are declared 16-byte aligned.)
    let p = &graph_ptrs;
    let aligned = vec_aligned(&[p.x, p.w, p.y, p.bias, p.residual]);
    let graph_spec =
        (paths.tries_cudnn() && rec.options.cudnn_graphs && !rec.options.first_choice && aligned)
            .then(|| ConvGraphSpec::of(c, rec.dtype, rec.plan.precision))
            .flatten();
    let graph_idxs = match &graph_spec {
        Some(spec) => conv_graph_candidates(m, rec, &mut caches.conv_graph, spec),
        None => Vec::new(),
    };
    for &gi in &graph_idxs {
        let g = &m.conv_graphs[gi];
        let mut l = vec![Launch::ConvGraph {
            graph: gi,
            ptrs: Box::new(graph_ptrs),
        }];
        if !g.fused && (c.bias.is_some() || c.residual.is_some() || c.act.is_some()) {
            l.push(conv_epilogue(rec, c, true, true));
        }
        candidates.push((l, f32::INFINITY));
    }
    let n_dnn_all = candidates.len();
    // The GEMM path where it is tried and could be kept (an untimed search keeps cuDNN's first
    // choice), and where cuDNN found nothing (ISOLANE_CUDA_CONV=cudnn, an MPS client with part
    // of the threads).
    let gemm_may_win = paths.tries_gemm() && !rec.options.first_choice;
    if c.gemm_capable() && (gemm_may_win || dnn_descs.is_empty()) {
        let mut l = Vec::new();
        let b_ptr = match c.col {
            Some(col) => {
                l.push(im2col_launch(rec, c, col));
                rec.ptr(col)
            }
            None => rec.ptr(c.x),
        };
        let relu = matches!(c.act, Some(Unary::Relu));
        let mm_key = conv_gemm_key(rec, c, relu);
        let res_ptr = c.residual.map_or(0, &|l| rec.ptr(l));
        let ptrs = [rec.ptr(c.w), b_ptr, res_ptr, rec.ptr(c.y)];
        match matmul_launch(m, rec, &mut caches.mm, mm_key, ptrs) {
            Ok(launch) => {
                l.push(launch);
                if c.act.is_some() && !relu {
                    l.push(conv_epilogue(rec, c, false, false));
                }
                candidates.push((l, f32::INFINITY));
            }
            Err(e) if dnn_descs.is_empty() => return Err(err(e)),
            Err(_) => {}
        }
    }
    if !rec.options.first_choice {
        time_candidates(m, rec, &mut candidates).map_err(err)?;
    }
    let n_dnn = dnn_descs.len();
    // A path that failed to run has a NaN time, which total_cmp puts after every other.
    let fastest =
        |r: std::ops::Range<usize>| r.min_by(|&a, &b| candidates[a].1.total_cmp(&candidates[b].1));
    let best_legacy = fastest(0..n_dnn);
    if let (Some(i), None) = (best_legacy, cached) {
        if !candidates[i].1.is_nan() {
            conv_cache.push((key, dnn_descs[i]));
        }
    }
    if let (Some(i), Some(spec)) = (fastest(graph_first..n_dnn_all), graph_spec) {
        if !candidates[i].1.is_nan() && !caches.conv_graph.iter().any(|(s, _)| *s == spec) {
            caches.conv_graph.push((spec, graph_idxs[i - graph_first]));
        }
    }
    let best_dnn = fastest(0..n_dnn_all);
    // The GEMM path on a tie (cuDNN's first choice when nothing was timed).
    let chosen = match (best_dnn, candidates.len() > n_dnn_all) {
        (Some(d), _) if rec.options.first_choice => d,
        (Some(d), true) if candidates[d].1.total_cmp(&candidates[n_dnn_all].1).is_lt() => d,
        (_, true) => n_dnn_all,
        (Some(d), false) => d,
        (None, false) => return Err(err(EngineError::Runtime("no convolution path".into()))),
    };
    if rec.options.search_log {
        let times: Vec<String> = candidates
            .iter()
            .enumerate()
            .map(|(i, (_, ms))| {
                let what = if i < n_dnn {
                    format!("cudnn algo {:?}", m.convs[dnn_descs[i]].algo)
                } else if i < n_dnn_all {
                    let g = &m.conv_graphs[graph_idxs[i - graph_first]];
                    let fused = if g.fused { " fused" } else { "" };
                    let rtc = if g.runtime_compiled {
                        " runtime-compiled"
                    } else {
                        ""
                    };
                    format!("cudnn engine {}{fused}{rtc}", g.engine)
                } else {
                    "gemm".to_string()
                };
                format!("{what} {:.4} ms", ms)
            })
            .collect();
        log_conv_search("conv", c, &times, chosen);
    }
    if rec.choices.borrow().recording() {
        rec.choices.borrow_mut().note(conv_choice(
            m,
            &dnn_descs,
            &graph_idxs,
            [n_dnn, graph_first, n_dnn_all],
            chosen,
        ));
    }
    m.launches.extend(candidates.swap_remove(chosen).0);
    Ok(())
}

/// The saved form of convolution path `chosen` among the candidates of [`record_conv`]: the
/// legacy descriptors `dnn_descs` first, then the graph-API plans `graph_idxs` (from
/// `graph_first` to `n_dnn_all`), then the GEMM path.
fn conv_choice(
    m: &CudaModel,
    dnn_descs: &[usize],
    graph_idxs: &[usize],
    [n_dnn, graph_first, n_dnn_all]: [usize; 3],
    chosen: usize,
) -> crate::saved::Choice {
    if chosen < n_dnn {
        let d = &m.convs[dnn_descs[chosen]];
        match crate::saved::conv_math(d.conv) {
            Some(math) => crate::saved::Choice::ConvLegacy {
                algo: d.algo as u32,
                math,
            },
            None => crate::saved::Choice::Unsaveable("cuDNN did not say a math type".into()),
        }
    } else if chosen < n_dnn_all {
        let g = &m.conv_graphs[graph_idxs[chosen - graph_first]];
        let (bias, residual) = g.reads();
        match g.to_json() {
            Ok(json) => crate::saved::Choice::ConvGraph {
                json,
                engine: g.engine,
                fused: g.fused,
                bias,
                residual,
            },
            Err(e) => crate::saved::Choice::Unsaveable(format!(
                "cuDNN did not serialise a graph-API plan: {e}"
            )),
        }
    } else {
        crate::saved::Choice::ConvGemm
    }
}

/// A convolution's launches from a saved plan's choice: the one path, nothing timed.
fn replay_conv(
    m: &mut CudaModel,
    rec: &Recorder,
    caches: &mut LibraryCaches,
    c: &ConvStep,
    choice: crate::saved::Choice,
) -> Result<()> {
    use crate::saved::Choice;
    let has_epilogue = c.bias.is_some() || c.residual.is_some() || c.act.is_some();
    match choice {
        Choice::ConvLegacy { algo, math } => {
            let (Some(algo), Some(math)) =
                (crate::saved::conv_algo(algo), crate::saved::math_type(math))
            else {
                return Err(EngineError::InvalidArgument(format!(
                    "the saved plan holds cuDNN algorithm {algo} with math type {math}, which \
                     cuDNN does not have"
                )));
            };
            let mut d = conv_desc(c, rec.dtype, rec.plan.precision)?;
            d.algo = algo;
            if rec.plan.precision != Precision::Fp32 {
                // SAFETY: `d.conv` is live and owned by `d`.
                dnn_check("cudnnSetConvolutionMathType", unsafe {
                    dnn::cudnnSetConvolutionMathType(d.conv, math)
                })?;
            }
            let mut ws = 0usize;
            // SAFETY: the descriptors are live; a valid out-pointer.
            dnn_check("cudnnGetConvolutionForwardWorkspaceSize", unsafe {
                dnn::cudnnGetConvolutionForwardWorkspaceSize(
                    m.cudnn(),
                    d.x,
                    d.w,
                    d.conv,
                    d.y,
                    d.algo,
                    &mut ws,
                )
            })?;
            d.workspace = ws;
            m.convs.push(d);
            m.launches.push(Launch::Conv {
                conv: m.convs.len() - 1,
                x: rec.ptr(c.x),
                w: rec.ptr(c.w),
                y: rec.ptr(c.y),
            });
            if has_epilogue {
                m.launches.push(conv_epilogue(rec, c, true, true));
            }
        }
        Choice::ConvGraph {
            json,
            engine,
            fused,
            bias,
            residual,
        } => {
            // The JSON is kept in the file (it names the engine and knobs the build timed),
            // but the plan is made again from the engine's configuration.
            let _ = (json, bias, residual);
            let spec = ConvGraphSpec::of(c, rec.dtype, rec.plan.precision).ok_or_else(|| {
                EngineError::InvalidArgument(
                    "the saved plan holds a cuDNN graph for a convolution the graph API does \
                     not take here; build it again with `isolane build`"
                        .into(),
                )
            })?;
            let g = crate::dnn_graph::conv_graph_of_engine(
                m.cudnn(),
                &spec,
                fused,
                engine,
                rec.ws_cap,
            )?
            .ok_or_else(|| {
                EngineError::InvalidArgument(format!(
                    "the saved plan's cuDNN engine {engine} is not offered for this \
                     convolution here; build it again with `isolane build`"
                ))
            })?;
            m.conv_graphs.push(g);
            m.launches.push(Launch::ConvGraph {
                graph: m.conv_graphs.len() - 1,
                ptrs: Box::new(ConvGraphPtrs {
                    x: rec.ptr(c.x),
                    w: rec.ptr(c.w),
                    y: rec.ptr(c.y),
                    bias: c.bias.map_or(0, &|l| rec.ptr(l)),
                    residual: c.residual.map_or(0, &|l| rec.ptr(l)),
                    workspace: 0,
                }),
            });
            if !fused && has_epilogue {
                m.launches.push(conv_epilogue(rec, c, true, true));
            }
        }
        Choice::ConvGemm if c.gemm_capable() => {
            let b_ptr = match c.col {
                Some(col) => {
                    m.launches.push(im2col_launch(rec, c, col));
                    rec.ptr(col)
                }
                None => rec.ptr(c.x),
            };
            let relu = matches!(c.act, Some(Unary::Relu));
            let mm_key = conv_gemm_key(rec, c, relu);
            let res_ptr = c.residual.map_or(0, &|l| rec.ptr(l));
            let ptrs = [rec.ptr(c.w), b_ptr, res_ptr, rec.ptr(c.y)];
            let launch = matmul_launch(m, rec, &mut caches.mm, mm_key, ptrs)?;
            m.launches.push(launch);
            if c.act.is_some() && !relu {
                m.launches.push(conv_epilogue(rec, c, false, false));
            }
        }
        other => {
            return Err(EngineError::InvalidArgument(format!(
                "the saved plan holds {other:?} for a convolution it cannot run so; build it \
                 again with `isolane build`"
            )))
        }
    }
    Ok(())
}

/// The search log's line for a convolution (`ISOLANE_CUDA_SEARCH_LOG`): its shapes, each
/// candidate's time and the one kept.
fn log_conv_search(what: &str, c: &ConvStep, times: &[String], chosen: usize) {
    eprintln!(
        "search: {what} {:?} -> {:?} k{:?} s{:?}: {}; kept {chosen}",
        c.x_shape,
        c.y_shape,
        &c.w_shape[2..],
        c.strides,
        times.join(", ")
    );
}

/// Indices into `m.conv_graphs` of the graph-API plans to time for `spec`: the one kept for an
/// equal convolution earlier in this build, else cuDNN's first few (none where the graph API
/// offers none: the legacy algorithms and the GEMM path remain).
fn conv_graph_candidates(
    m: &mut CudaModel,
    rec: &Recorder,
    cache: &mut [(ConvGraphSpec, usize)],
    spec: &ConvGraphSpec,
) -> Vec<usize> {
    if let Some(&(_, i)) = cache.iter().find(|(s, _)| s == spec) {
        return vec![i];
    }
    let t0 = Instant::now();
    let graphs = crate::dnn_graph::conv_graphs(
        m.cudnn(),
        spec,
        rec.ws_cap,
        CUDNN_CANDIDATES,
        rec.options.cudnn_runtime_compiled,
    )
    .unwrap_or_else(|e| {
        if rec.options.search_log {
            eprintln!("search: cudnn graph for {spec:?}: {e}");
        }
        Vec::new()
    });
    if rec.options.search_log {
        eprintln!(
            "search: {} cudnn graph plans made in {:.1} ms",
            graphs.len(),
            t0.elapsed().as_secs_f64() * 1e3
        );
    }
    let first = m.conv_graphs.len();
    m.conv_graphs.extend(graphs);
    (first..m.conv_graphs.len()).collect()
}

/// The pointwise pass after a cuDNN convolution (bias, residual, activation) or after its GEMM
/// (the activation cuBLASLt's epilogue does not fuse).
fn conv_epilogue(rec: &Recorder, c: &ConvStep, with_bias: bool, with_res: bool) -> Launch {
    let n_out: usize = c.y_shape.iter().product();
    pointwise_launch(
        rec,
        rec.ptr(c.y),
        rec.ptr(c.y),
        None,
        if with_bias {
            c.bias.map(&|l| rec.ptr(l))
        } else {
            None
        },
        if with_res {
            c.residual.map(&|l| rec.ptr(l))
        } else {
            None
        },
        n_out,
        c.y_shape[1],
        if c.nhwc {
            1
        } else {
            c.y_shape[2] * c.y_shape[3]
        },
        c.act,
    )
}

/// The im2col kernel that lowers a convolution's input into `col` for the GEMM path.
fn im2col_launch(rec: &Recorder, c: &ConvStep, col: Loc) -> Launch {
    let [n, ch, h, w] = c.x_shape;
    let [_, _, oh, ow] = c.y_shape;
    let (kh, kw) = (c.w_shape[2], c.w_shape[3]);
    let v = [
        n,
        h,
        w,
        ch,
        oh,
        ow,
        kh,
        kw,
        c.strides[0],
        c.strides[1],
        c.pads[0],
        c.pads[1],
        c.dilations[0],
        c.dilations[1],
    ];
    let vi = v.map(|s| s as i32);
    let total = n * oh * ow * kh * kw * ch;
    // Whole 16-byte vectors of channels: copied as they are, 32-bit indices.
    let lanes = rec.vec_lanes();
    let vector = ch.is_multiple_of(lanes)
        && total / lanes <= i32::MAX as usize
        && vec_aligned(&[rec.ptr(c.x), rec.ptr(col)]);
    let (func, threads) = if vector {
        ("im2col_v", total / lanes)
    } else {
        ("im2col", total)
    };
    Launch::Kernel {
        func: rec.func(func),
        grid: elementwise_grid(threads),
        block: BLOCK,
        shared: 0,
        args: vec![
            Arg::Ptr(rec.ptr(c.x)),
            Arg::Ptr(rec.ptr(col)),
            Arg::Im(Box::new(ImP { v: vi })),
        ],
    }
}

/// The cuBLASLt GEMM of a convolution's GEMM path: `y[n·oh·ow, M] = col · wᵀ` with the bias,
/// ReLU and residual fused.
fn conv_gemm_key(rec: &Recorder, c: &ConvStep, relu: bool) -> MmKey {
    let [n, ch, _, _] = c.x_shape;
    let [_, _, oh, ow] = c.y_shape;
    let (kh, kw) = (c.w_shape[2], c.w_shape[3]);
    MmKey {
        relu,
        residual: c.residual.is_some(),
        ..MmKey::linear(
            n * oh * ow,
            c.w_shape[0],
            kh * kw * ch,
            c.bias.map(&|l| rec.ptr(l)),
        )
    }
}

/// A convolution's candidate launches and their best time (∞ until timed).
type TimedPath = (Vec<Launch>, f32);

/// Times each candidate path as it will run, on the search scratch as workspace.
///
/// "As it will run" means captured in a CUDA graph, as the job is: timed as eager launches, each
/// kernel paid its launch overhead, which the job's graph does not, and a path of fewer kernels
/// won where it was slower on the GPU (resnet18 fp16 in 32 SMs chose the GEMM path for some
/// convolutions in some builds and not in others, and ran 0.45–0.78 ms per job against
/// 0.41 ms with cuDNN throughout: docs/interference.md). The paths are timed in alternation,
/// [`TIMING_ROUNDS`] times, each keeping its best: the build is often the GPU's first work after
/// idle, and a path timed only before the clocks had risen lost to one timed after.
///
/// A path that cannot run here is left out (its time NaN), as long as another can: in a green
/// context of a few SMs some library kernels launch thread-block clusters the context cannot
/// place (`CUDA_ERROR_INVALID_CLUSTER_SIZE` at instantiation, or cuDNN's
/// `CUDNN_STATUS_EXECUTION_FAILED`; mobilenet_v2 in 8 SMs and resnet50 in 104 SMs beside it on
/// the H100), and a build must not fail for a candidate it need not keep.
fn time_candidates(m: &mut CudaModel, rec: &Recorder, paths: &mut [TimedPath]) -> Result<()> {
    if paths.len() < 2 {
        return Ok(());
    }
    (m.workspace, m.mm_workspace) = (rec.scratch, rec.mm_scratch);
    let timed = time_paths_as_graphs(m, rec, paths);
    (m.workspace, m.mm_workspace) = (0, 0);
    timed
}

/// Times `paths` (unless the build times nothing) and returns the index of the fastest: the
/// first where nothing was timed, on a tie, or where every path failed to run (NaN).
fn fastest_of(m: &mut CudaModel, rec: &Recorder, paths: &mut [TimedPath]) -> Result<usize> {
    let what = m.names.last().cloned().unwrap_or_default();
    if let Some(i) = rec.choices.borrow_mut().pick(paths.len(), &what)? {
        return Ok(i);
    }
    if !rec.options.first_choice {
        time_candidates(m, rec, paths)?;
    }
    let i = (0..paths.len())
        .min_by(|&a, &b| paths[a].1.total_cmp(&paths[b].1))
        .unwrap_or(0);
    rec.choices
        .borrow_mut()
        .note(crate::saved::Choice::Pick(i as u32));
    Ok(i)
}

/// The most workspace a cuBLASLt algorithm may use (PyTorch gives cuBLAS 32 MiB on Hopper).
///
/// cuBLASLt's workspace is its own, apart from cuDNN's, and zeroed when placed, as PyTorch keeps
/// it: some of its algorithms (split-K kernels with a workspace of a few bytes) keep semaphores
/// there, and cuDNN's convolutions write their scratch over whatever they share. (Suspected, and
/// ruled out, as the cause of the wrong matmuls under MPS thread limits: `mm_check`.)
pub(crate) const MM_WORKSPACE_CAP: usize = 32 << 20;

/// Rounds of alternating timings of competing candidates (each keeps its best round).
const TIMING_ROUNDS: usize = 5;

/// Replays of a candidate's graph per timing (their mean is the round's time): one replay of a
/// few microseconds is close to the events' resolution.
const REPLAYS_PER_TIMING: usize = 4;

/// Captures each present path into a graph and sets its time to the best of [`TIMING_ROUNDS`]
/// alternating rounds of [`REPLAYS_PER_TIMING`] replays ([`time_candidates`] says why).
fn time_paths_as_graphs(m: &CudaModel, rec: &Recorder, paths: &mut [TimedPath]) -> Result<()> {
    let mut timed: Vec<(&mut f32, CapturedGraph)> = Vec::with_capacity(paths.len());
    let mut first_failure = None;
    for (launches, best) in paths.iter_mut() {
        match m.capture_list(launches, true) {
            Ok(graph) => timed.push((best, graph)),
            Err(e) => {
                *best = f32::NAN;
                first_failure.get_or_insert(e);
            }
        }
    }
    if let (true, Some(e)) = (timed.is_empty(), first_failure) {
        return Err(e);
    }
    for _ in 0..TIMING_ROUNDS {
        for (best, graph) in timed.iter_mut() {
            let ms = rec.events.time(m.stream, &mut || {
                for _ in 0..REPLAYS_PER_TIMING {
                    // SAFETY: the graph's instance and the stream are live; its buffers (the
                    // model's arena and the search scratch) outlive the timing.
                    cu_check("cuGraphLaunch", unsafe {
                        cu::cuGraphLaunch(graph.exec(), m.stream)
                    })?;
                }
                Ok(())
            })? / REPLAYS_PER_TIMING as f32;
            **best = best.min(ms);
        }
    }
    Ok(())
}

fn record_dw_conv(m: &mut CudaModel, rec: &Recorder, c: &ConvStep) -> Result<()> {
    let es = rec.es;
    let (a, p0, p1) = act_code(c.act, rec.dtype);
    let v = [
        c.x_shape[0],
        c.x_shape[1],
        c.x_shape[2],
        c.x_shape[3],
        c.y_shape[1],
        c.y_shape[2],
        c.y_shape[3],
        c.w_shape[2],
        c.w_shape[3],
        c.strides[0],
        c.strides[1],
        c.pads[0],
        c.pads[1],
        c.dilations[0],
        c.dilations[1],
        0,
    ];
    let mut vi = v.map(|s| s as i32);
    vi[15] = a;
    let n: usize = c.y_shape.iter().product();
    // The register-window kernels: NHWC, horizontal stride and dilation 1.
    let fast = c.nhwc && c.strides[1] == 1 && c.dilations[1] == 1;
    // Channel pairs, 8 outputs per thread: also one filter per channel, M
    // even and every operand 2-element aligned.
    // `BuildOptions::depthwise_pairs` off (ISOLANE_CUDA_DW=window) keeps the 4-output kernels.
    let pair_ok = fast
        && rec.options.depthwise_pairs
        && c.y_shape[1] == c.x_shape[1]
        && c.y_shape[1].is_multiple_of(2)
        && [Some(c.x), Some(c.w), c.bias, c.residual, Some(c.y)]
            .iter()
            .flatten()
            .all(|l| rec.ptr(*l).is_multiple_of(2 * es as u64));
    let pairs = n.div_ceil(c.y_shape[3]) / 2 * c.y_shape[3].div_ceil(kernels::DWC2_OUT);
    // With few threads (batch 1) the 4-output kernel fills the GPU better
    // (measured: convnext_base fp16 batch 1 1.04 ms with it, 1.21 with the
    // pair kernel; batch 64 13.1 ms vs 10.2 ms).
    let pair_ok = pair_ok && pairs >= DWC2_MIN_THREADS;
    // (7×7 only: the 3×3 pair kernel, MobileNetV2's, was not measured.)
    // The register-window kernels: 4 outputs of a row per thread.
    let quads = n.div_ceil(c.y_shape[3]) * c.y_shape[3].div_ceil(4);
    let (kernel, threads_older) = match (fast, c.w_shape[3]) {
        (true, 7) if pair_ok => ("dwconv_c2_k7", pairs),
        (true, 3) => ("dwconv_s1_k3", quads),
        (true, 7) => ("dwconv_s1_k7", quads),
        _ => ("dwconv", n),
    };
    let params = DwP {
        v: vi,
        p0,
        p1,
        whwc: c.nhwc as i32,
        pad: 0,
        xs: strides4(&c.x_shape, c.nhwc),
        ys: strides4(&c.y_shape, c.nhwc),
    };
    let ptrs = [
        rec.ptr(c.x),
        rec.ptr(c.w),
        c.bias.map_or(0, &|l| rec.ptr(l)),
        c.residual.map_or(0, &|l| rec.ptr(l)),
        rec.ptr(c.y),
    ];
    let launch = |name: &str, threads: usize| {
        let mut args: Vec<Arg> = ptrs.iter().map(|&p| Arg::Ptr(p)).collect();
        args.push(Arg::Dw(Box::new(params)));
        vec![Launch::Kernel {
            func: rec.func(name),
            grid: elementwise_grid(threads),
            block: BLOCK,
            shared: 0,
            args,
        }]
    };
    // The vector kernels first: where nothing is timed (an MPS client with part of the
    // threads) the first of them is kept.
    let (mut names, threads): (Vec<String>, Vec<usize>) =
        dw_vec_kernels(rec, c, &ptrs).into_iter().unzip();
    names.push(kernel.to_string());
    let mut paths: Vec<TimedPath> = names
        .iter()
        .zip(threads.into_iter().chain([threads_older]))
        .map(|(name, t)| (launch(name, t), f32::INFINITY))
        .collect();
    let chosen = fastest_of(m, rec, &mut paths)?;
    if rec.options.search_log && paths.len() > 1 {
        let times: Vec<String> = names
            .iter()
            .zip(&paths)
            .map(|(name, (_, ms))| format!("{name} {ms:.4} ms"))
            .collect();
        log_conv_search("depthwise", c, &times, chosen);
    }
    m.launches.extend(paths.swap_remove(chosen).0);
    Ok(())
}

/// The vectorised depthwise kernels (`kernels::DW_VEC_SHAPES`) that can run `c`, with their
/// thread counts: NHWC, one filter per channel, whole 16-byte vectors of channels, horizontal
/// dilation 1, the kernel width and horizontal stride of a compiled shape, aligned operands
/// (`ptrs`) and 32-bit indices.
fn dw_vec_kernels(rec: &Recorder, c: &ConvStep, ptrs: &[u64]) -> Vec<(String, usize)> {
    let lanes = rec.vec_lanes();
    let [n, ch, _, _] = c.x_shape;
    let [_, m_out, oh, ow] = c.y_shape;
    if !c.nhwc
        || m_out != ch
        || !ch.is_multiple_of(lanes)
        || c.dilations[1] != 1
        || !vec_aligned(ptrs)
    {
        return Vec::new();
    }
    kernels::DW_VEC_SHAPES
        .iter()
        .filter(|&&(kw, sw, _)| kw == c.w_shape[3] && sw == c.strides[1])
        .map(|&(kw, sw, outs)| {
            let threads = n * oh * ow.div_ceil(outs) * (ch / lanes);
            (kernels::dw_vec_name(kw, sw, outs), threads)
        })
        .filter(|&(_, threads)| threads <= i32::MAX as usize)
        .collect()
}

fn record_linear(
    m: &mut CudaModel,
    rec: &Recorder,
    caches: &mut LibraryCaches,
    err: &dyn Fn(EngineError) -> EngineError,
    l: &LinearStep,
) -> Result<()> {
    let LinearStep {
        x,
        w,
        bias,
        y,
        m: mm,
        n,
        k,
        act,
        residual,
    } = l;
    let relu = matches!(act, Some(Unary::Relu));
    // tf32/fp16/bf16: cuBLASLt's GELU epilogue (tanh form; it differs from
    // the exact erf GELU by < 1e-3, below those precisions' rounding here;
    // fp32 keeps the exact GELU kernel).
    let gelu = matches!(act, Some(Unary::Gelu) | Some(Unary::GeluTanh))
        && rec.plan.precision != Precision::Fp32
        && bias.is_some()
        && !rec.options.exact_gelu;
    let key = MmKey {
        relu,
        gelu,
        residual: residual.is_some(),
        ..MmKey::linear(*mm, *n, *k, bias.map(&|l| rec.ptr(l)))
    };
    let res_ptr = residual.map_or(0, &|l| rec.ptr(l));
    let ptrs = [rec.ptr(*w), rec.ptr(*x), res_ptr, rec.ptr(*y)];
    let launch = matmul_launch(m, rec, &mut caches.mm, key, ptrs).map_err(err)?;
    m.launches.push(launch);
    if act.is_some() && !relu && !gelu {
        m.launches.push(pointwise_launch(
            rec,
            rec.ptr(*y),
            rec.ptr(*y),
            None,
            None,
            None,
            mm * n,
            1,
            1,
            *act,
        ));
    }
    Ok(())
}

fn record_matmul(
    m: &mut CudaModel,
    rec: &Recorder,
    caches: &mut LibraryCaches,
    err: &dyn Fn(EngineError) -> EngineError,
    mm_step: &MatMulStep,
) -> Result<()> {
    let MatMulStep {
        a,
        b,
        y,
        batch,
        m: mm,
        n,
        k,
        a_batch_stride,
        b_batch_stride,
        b_trans,
        alpha,
        lda,
        ldb,
        ldy,
        y_batch_stride,
    } = mm_step;
    let key = MmKey {
        m: *mm,
        n: *n,
        k: *k,
        batch: *batch,
        sa: *a_batch_stride,
        sb: *b_batch_stride,
        lda: *lda,
        ldb: *ldb,
        ldy: *ldy,
        sy: *y_batch_stride,
        b_trans: *b_trans,
        linear: false,
        bias: None,
        relu: false,
        gelu: false,
        residual: false,
        alpha: alpha.to_bits(),
    };
    // cuBLASLt's A is our B operand (see `mm_index`).
    let ptrs = [rec.ptr(*b), rec.ptr(*a), 0, rec.ptr(*y)];
    let launch = matmul_launch(m, rec, &mut caches.mm, key, ptrs).map_err(err)?;
    m.launches.push(launch);
    Ok(())
}

/// The launch of the cuBLASLt matmul `key` on `[a, b, c, y]` (cuBLASLt's operands, see
/// `mm_index`; `c` is 0 without a residual), its descriptor made and timed unless cached.
fn matmul_launch(
    m: &mut CudaModel,
    rec: &Recorder,
    mm_cache: &mut Vec<(MmKey, usize)>,
    key: MmKey,
    [a, b, c, y]: [u64; 4],
) -> Result<Launch> {
    let mm = mm_index(m, rec, mm_cache, key, [a, b, c, y])?;
    Ok(Launch::Matmul { mm, a, b, c, y })
}

fn record_attention(
    m: &mut CudaModel,
    rec: &Recorder,
    err: &dyn Fn(EngineError) -> EngineError,
    at: &AttentionStep,
) -> Result<()> {
    let AttentionStep {
        q,
        k,
        v,
        y,
        batch,
        heads,
        seq,
        dim,
        alpha,
        out_scale,
        q_strides,
        k_strides,
        v_strides,
        y_strides,
    } = at;
    let dtype = rec.dtype;
    if *dim != kernels::ATTN_HEAD_DIM || dtype == DType::F32 {
        return Err(err(EngineError::Runtime(format!(
            "fused attention needs head dim {} and f16/bf16 (got {dim}, {})",
            kernels::ATTN_HEAD_DIM,
            dtype.name()
        ))));
    }
    let bh = |s: &[usize; 3]| [s[0] as i64, s[1] as i64];
    let (qs, ks, vs, ys) = (bh(q_strides), bh(k_strides), bh(v_strides), bh(y_strides));
    let launch = |(warps, key_groups): (usize, usize)| {
        let qtiles = seq.div_ceil(kernels::ATTN_WARP_ROWS * warps);
        vec![Launch::Kernel {
            func: rec.func("attention"),
            grid: (qtiles * heads * batch) as u32,
            block: (32 * warps * key_groups) as u32,
            shared: kernels::attn_shared_bytes(key_groups) as u32,
            args: vec![
                Arg::Ptr(rec.ptr(*q)),
                Arg::Ptr(rec.ptr(*k)),
                Arg::Ptr(rec.ptr(*v)),
                Arg::Ptr(rec.ptr(*y)),
                Arg::Attn(Box::new(AttnP {
                    v: [*seq as i32, *heads as i32, qtiles as i32, warps as i32],
                    scale_log2: alpha * std::f32::consts::LOG2_E,
                    oscale: *out_scale,
                    bh: [qs[0], qs[1], ks[0], ks[1], vs[0], vs[1], ys[0], ys[1]],
                    rows: [
                        q_strides[2] as i32,
                        k_strides[2] as i32,
                        v_strides[2] as i32,
                        y_strides[2] as i32,
                    ],
                })),
            ],
        }]
    };
    // Blocks of 4 query warps fill the GPU at large batch; at batch 1 (12 heads of ViT-B)
    // smaller blocks give more of them, and key groups more warps per block. Every shape
    // computes the same attention (key groups add their partial sums in another order, within
    // f32 rounding): timed, the fastest kept (the first untimed).
    let mut paths: Vec<TimedPath> = kernels::ATTN_BLOCKS
        .iter()
        .map(|&b| (launch(b), f32::INFINITY))
        .collect();
    let chosen = fastest_of(m, rec, &mut paths).map_err(err)?;
    if rec.options.search_log {
        let times: Vec<String> = kernels::ATTN_BLOCKS
            .iter()
            .zip(&paths)
            .map(|((w, kg), (_, ms))| format!("{w} warps x {kg} key groups {ms:.4} ms"))
            .collect();
        eprintln!(
            "search: attention batch {batch} heads {heads} seq {seq}: {}; kept {chosen}",
            times.join(", ")
        );
    }
    m.launches.extend(paths.swap_remove(chosen).0);
    Ok(())
}

fn record_layer_norm(m: &mut CudaModel, rec: &Recorder, ln: &LayerNormStep) -> Result<()> {
    let LayerNormStep {
        x,
        scale,
        bias,
        y,
        rows,
        cols,
        eps,
    } = ln;
    let ptrs = [
        rec.ptr(*x),
        rec.ptr(*y),
        rec.ptr(*scale),
        bias.map_or(0, &|l| rec.ptr(l)),
    ];
    let ptr_args = || ptrs.iter().map(|&p| Arg::Ptr(p));
    let warp_kernel = |name: String, rows_per_block: usize| Launch::Kernel {
        func: rec.func(&name),
        grid: rows.div_ceil(rows_per_block) as u32,
        block: 32 * rows_per_block as u32,
        shared: 0,
        args: ptr_args()
            .chain([
                Arg::I32(*rows as i32),
                Arg::I32(*cols as i32),
                Arg::F32(*eps),
            ])
            .collect(),
    };
    // Rows of ≤ 1024: one warp per row in registers; longer: a block per row.
    let first = match WARP_ROW_PER_LANE
        .iter()
        .find(|&&nr| *cols <= 32 * nr && rec.warp_rows(*rows))
    {
        Some(nr) => warp_kernel(format!("layernorm_warp{nr}"), WARP_ROWS_PER_BLOCK),
        None => Launch::Kernel {
            func: rec.func("layernorm"),
            grid: *rows as u32,
            block: reduce_block(*cols),
            shared: 0,
            args: ptr_args()
                .chain([Arg::I64(*cols as i64), Arg::F32(*eps)])
                .collect(),
        },
    };
    let mut paths: Vec<TimedPath> = vec![(vec![first], f32::INFINITY)];
    // Whole 16-byte vectors and aligned rows: one warp per row with wide loads, 8 or 2 rows
    // per block, timed against the kernel above (the fastest kept; untimed, the first).
    let lanes = rec.vec_lanes();
    let vector = cols.is_multiple_of(lanes) && vec_aligned(&ptrs);
    if let Some(nv) = kernels::LN_VEC_PER_LANE
        .iter()
        .find(|&&nv| vector && *cols <= 32 * nv * lanes)
    {
        for rows_per_block in [8, 2] {
            let l = warp_kernel(format!("layernorm_wv{nv}"), rows_per_block);
            paths.push((vec![l], f32::INFINITY));
        }
    }
    let chosen = fastest_of(m, rec, &mut paths)?;
    m.launches.extend(paths.swap_remove(chosen).0);
    Ok(())
}

fn record_softmax(m: &mut CudaModel, rec: &Recorder, sm: &SoftmaxStep) {
    let SoftmaxStep {
        x,
        y,
        outer,
        len,
        inner,
    } = sm;
    m.launches.push(
        match WARP_ROW_PER_LANE
            .iter()
            .find(|&&nr| *len <= 32 * nr && rec.warp_rows(*outer))
        {
            Some(nr) if *inner == 1 => Launch::Kernel {
                func: rec.func(&format!("softmax_warp{nr}")),
                grid: outer.div_ceil(WARP_ROWS_PER_BLOCK) as u32,
                block: 32 * WARP_ROWS_PER_BLOCK as u32,
                shared: 0,
                args: vec![
                    Arg::Ptr(rec.ptr(*x)),
                    Arg::Ptr(rec.ptr(*y)),
                    Arg::I32(*outer as i32),
                    Arg::I32(*len as i32),
                ],
            },
            _ => Launch::Kernel {
                func: rec.func("softmax"),
                grid: (outer * inner) as u32,
                block: reduce_block(*len),
                shared: 0,
                args: vec![
                    Arg::Ptr(rec.ptr(*x)),
                    Arg::Ptr(rec.ptr(*y)),
                    Arg::I64(*len as i64),
                    Arg::I64(*inner as i64),
                ],
            },
        },
    );
}

fn record_pool(m: &mut CudaModel, rec: &Recorder, pool: &PoolStep) {
    let PoolStep {
        x,
        y,
        max,
        x_shape,
        out_hw,
        kernel,
        strides,
        pads,
        dilations,
        count_include_pad,
        nhwc,
    } = pool;
    let v = [
        x_shape[0],
        x_shape[1],
        x_shape[2],
        x_shape[3],
        out_hw[0],
        out_hw[1],
        kernel[0],
        kernel[1],
        strides[0],
        strides[1],
        pads[0],
        pads[1],
        dilations[0],
        dilations[1],
        *max as usize,
        *count_include_pad as usize,
    ];
    let vi = v.map(|s| s as i32);
    let n = x_shape[0] * x_shape[1] * out_hw[0] * out_hw[1];
    // Channels contiguous and whole vectors: 16-byte loads, 32-bit indices.
    let lanes = rec.vec_lanes();
    let vector = *nhwc
        && x_shape[1].is_multiple_of(lanes)
        && n / lanes <= i32::MAX as usize
        && vec_aligned(&[rec.ptr(*x), rec.ptr(*y)]);
    let (func, threads) = if vector {
        ("pool2d_v", n / lanes)
    } else {
        ("pool2d", n)
    };
    m.launches.push(Launch::Kernel {
        func: rec.func(func),
        grid: elementwise_grid(threads),
        block: BLOCK,
        shared: 0,
        args: vec![
            Arg::Ptr(rec.ptr(*x)),
            Arg::Ptr(rec.ptr(*y)),
            Arg::Pool(Box::new(PoolP {
                v: vi,
                xs: strides4(x_shape, *nhwc),
                ys: strides4(&[x_shape[0], x_shape[1], out_hw[0], out_hw[1]], *nhwc),
            })),
        ],
    });
}

fn record_resize(m: &mut CudaModel, rec: &Recorder, rs: &ResizeStep) {
    let ResizeStep {
        x,
        y,
        x_shape,
        out_hw,
        linear,
        coord,
        nearest,
        scales,
        nhwc,
    } = rs;
    let [n, c, h, w] = x_shape.map(|d| d as i32);
    let [oh, ow] = out_hw.map(|d| d as i32);
    let total = x_shape[0] * x_shape[1] * out_hw[0] * out_hw[1];
    m.launches.push(Launch::Kernel {
        func: rec.func("resize2d"),
        grid: elementwise_grid(total),
        block: BLOCK,
        shared: 0,
        args: vec![
            Arg::Ptr(rec.ptr(*x)),
            Arg::Ptr(rec.ptr(*y)),
            Arg::Resize(Box::new(ResizeP {
                v: [n, c, h, w, oh, ow, *linear as i32, *coord, *nearest, 0],
                scales: *scales,
                xs: strides4(x_shape, *nhwc),
                ys: strides4(&[x_shape[0], x_shape[1], out_hw[0], out_hw[1]], *nhwc),
            })),
        ],
    });
}

/// The `row_reduce` kernel's code for a reduction (the `switch` in kernels.rs).
fn reduce_code(kind: isolane_engine::ir::ReduceKind) -> i32 {
    use isolane_engine::ir::ReduceKind;
    match kind {
        ReduceKind::Mean => 0,
        ReduceKind::Sum => 1,
        ReduceKind::Max => 2,
        ReduceKind::Min => 3,
        ReduceKind::L1 => 4,
        ReduceKind::SumSquare => 5,
        ReduceKind::L2 => 6,
    }
}
