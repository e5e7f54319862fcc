//! Convolutions through cuDNN's graph (backend) API: one operation graph per convolution, its
//! bias, residual and ReLU fused where the epilogue has nothing else, run by an execution plan
//! of one of the engines cuDNN's heuristics rank first.
//!
//! The legacy API (`cudnnConvolutionForward`) reaches only the engines behind its algorithm
//! enum; on the H100 those were 2–3× slower than the ones PyTorch's cuDNN frontend runs for
//! the same NHWC fp16 convolutions (resnet18 at batch 64: 0.09 vs 0.04 ms for a 3×3 64→64
//! convolution at 56×56, 0.37 vs 0.12 ms for the 7×7 stem). Here the same engines are
//! available, and the epilogue pass after the convolution disappears where the fused graph
//! finalizes. Each candidate is timed against the legacy algorithms and the GEMM path by the
//! model build, like every other convolution path.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::cudnn::sys as dnn;
use dnn::cudnnBackendAttributeName_t as A;
use dnn::cudnnBackendAttributeType_t as T;
use dnn::cudnnBackendDescriptorType_t as D;

use isolane_engine::ir::Unary;
use isolane_engine::Precision;

use crate::plan::{ConvStep, DType};
use isolane_gpu::call::{dnn_check, CudaError};

/// One backend descriptor, destroyed on drop.
struct Desc(dnn::cudnnBackendDescriptor_t);

impl Desc {
    fn new(kind: D) -> Result<Desc, CudaError> {
        let mut d: dnn::cudnnBackendDescriptor_t = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; the descriptor is owned by the returned value.
        dnn_check("cudnnBackendCreateDescriptor", unsafe {
            dnn::cudnnBackendCreateDescriptor(kind, &mut d)
        })?;
        Ok(Desc(d))
    }

    /// Sets an attribute to `n` values of `ty` at `values`.
    fn set<V>(&self, name: A, ty: T, values: &[V]) -> Result<(), CudaError> {
        // SAFETY: `values` holds values.len() elements of the type `ty` names (the callers
        // below pair them: i64 with INT64, descriptors with BACKEND_DESCRIPTOR, ...); cuDNN
        // copies them before returning.
        dnn_check("cudnnBackendSetAttribute", unsafe {
            dnn::cudnnBackendSetAttribute(
                self.0,
                name,
                ty,
                values.len() as i64,
                values.as_ptr() as *const c_void,
            )
        })
    }

    fn set_i64(&self, name: A, values: &[i64]) -> Result<(), CudaError> {
        self.set(name, T::CUDNN_TYPE_INT64, values)
    }

    fn set_desc(&self, name: A, descs: &[&Desc]) -> Result<(), CudaError> {
        let raw: Vec<dnn::cudnnBackendDescriptor_t> = descs.iter().map(|d| d.0).collect();
        self.set(name, T::CUDNN_TYPE_BACKEND_DESCRIPTOR, &raw)
    }

    fn set_dtype(&self, name: A, dtype: dnn::cudnnDataType_t) -> Result<(), CudaError> {
        self.set(name, T::CUDNN_TYPE_DATA_TYPE, &[dtype])
    }

    fn finalize(&self) -> Result<(), CudaError> {
        // SAFETY: the descriptor is live; its required attributes were set by the caller.
        dnn_check("cudnnBackendFinalize", unsafe {
            dnn::cudnnBackendFinalize(self.0)
        })
    }

    fn get_i64(&self, name: A) -> Result<i64, CudaError> {
        let (mut v, mut n) = (0i64, 0i64);
        // SAFETY: room for exactly one INT64 value.
        dnn_check("cudnnBackendGetAttribute", unsafe {
            dnn::cudnnBackendGetAttribute(
                self.0,
                name,
                T::CUDNN_TYPE_INT64,
                1,
                &mut n,
                &mut v as *mut i64 as *mut c_void,
            )
        })?;
        Ok(v)
    }
}

impl Drop for Desc {
    fn drop(&mut self) {
        // SAFETY: created by cudnnBackendCreateDescriptor for this value alone, destroyed once.
        unsafe {
            dnn::cudnnBackendDestroyDescriptor(self.0);
        }
    }
}

// SAFETY: backend descriptors are host objects; the model that owns them uses them from one
// thread at a time (it is `Send`, not `Sync`, like its legacy descriptors).
unsafe impl Send for Desc {}

/// Unique ids of the graph's tensors in a variant pack.
const X: i64 = 1;
const W: i64 = 2;
const Y: i64 = 3;
const BIAS: i64 = 4;
const RES: i64 = 5;
/// A quantized convolution's per-channel scale (`QuantGemmStep::scale`, f32).
const SCALE: i64 = 6;
/// A quantized convolution's per-channel inverse output scale (`1 / y_scale`, f32), where it
/// writes its output quantized for the next quantized convolution.
const YSCALE: i64 = 7;
/// A quantized convolution's second output ([`ConvGraphSpec::quant_copy`]): y quantized.
const YQ: i64 = 8;

/// What the graph computes: `y = act(conv(x, w) + bias + residual)`, NHWC activations and a
/// KRSC filter (dims given in NCHW / KCRS order, as cuDNN's logical dims are; the groups are
/// x's channels over w's).
#[derive(Clone, Debug, PartialEq)]
pub struct ConvGraphSpec {
    pub x: [usize; 4],
    pub w: [usize; 4],
    pub y: [usize; 4],
    pub pads: [usize; 2],
    pub strides: [usize; 2],
    pub dilations: [usize; 2],
    pub bias: bool,
    pub residual: bool,
    pub relu: bool,
    /// The ReLU's upper clip (`RELU_UPPER_CLIP`): 6 for a quantized convolution's ReLU6
    /// (MobileNetV2's) or a `Clip(0, max)`; never in a float graph.
    pub relu_max: Option<f32>,
    pub dtype: DType,
    /// Accumulate in f32 but let the engines use TF32 tensor cores (the tf32 precision); at
    /// fp32 engines that would are left out.
    pub allow_tf32: bool,
    /// A quantized convolution (`crate::plan::QuantAlternatives::dnn_conv`): x and w int8 (int32
    /// sums) or float8 e4m3 (f32 sums), the sum multiplied by the per-channel scale first
    /// (always inside the graph), then the epilogue (bias in f32); y in `dtype`.
    pub quant: Option<isolane_engine::quant::QuantType>,
    /// A quantized convolution whose output is quantized too, for the next quantized
    /// convolution: after the epilogue a multiply by the per-channel inverse output scale,
    /// y written in `quant`'s type (cuDNN's conversion: round to nearest even, saturated).
    pub quant_out: bool,
    /// A quantized convolution whose output is written twice: y in `dtype` (a residual reads
    /// it) and, multiplied by the per-channel inverse output scale, in `quant`'s type into a
    /// second tensor (the next quantized convolution's rows): resnet's block output, which
    /// otherwise needs a quantize kernel after the graph. Never with `quant_out`.
    pub quant_copy: bool,
    /// A quantized convolution's residual is read as bytes of `quant`'s type (the block's
    /// skip kept quantized, as TensorRT's int8 residual networks keep it): added as read, so
    /// the caller folds the residual's scale into the graph's constants (the scale and bias
    /// divided by it, the output's inverse scale multiplied by it; ReLU commutes with it).
    pub residual_quant: bool,
}

impl ConvGraphSpec {
    /// The graph of `c`, where that path applies: NHWC activations (and a KRSC filter). Its
    /// epilogue is bias, residual and ReLU; with any other activation the graph has none (our
    /// epilogue kernel runs after it).
    pub fn of(c: &ConvStep, dtype: DType, precision: Precision) -> Option<ConvGraphSpec> {
        if !c.nhwc {
            return None;
        }
        let relu = matches!(c.act, Some(Unary::Relu));
        let fusable = c.act.is_none() || relu;
        Some(ConvGraphSpec {
            x: c.x_shape,
            w: c.w_shape,
            y: c.y_shape,
            pads: c.pads,
            strides: c.strides,
            dilations: c.dilations,
            bias: fusable && c.bias.is_some(),
            residual: fusable && c.residual.is_some(),
            relu,
            relu_max: None,
            dtype,
            allow_tf32: precision == Precision::Tf32,
            quant: None,
            quant_out: false,
            quant_copy: false,
            residual_quant: false,
        })
    }

    /// The fused graph of a quantized convolution `c` (x and w quantized to `qtype`, NHWC,
    /// one group), writing y in `dtype`, or quantized to `qtype` again when `quant_out`: where
    /// its activation is none, ReLU, or a ReLU clipped above
    /// ([`crate::int8::quant_graph_act`]).
    pub fn quantized(
        c: &ConvStep,
        qtype: isolane_engine::quant::QuantType,
        dtype: DType,
        quant_out: bool,
    ) -> Option<ConvGraphSpec> {
        let (relu, relu_max) = crate::int8::quant_graph_act(c.act)?;
        (c.nhwc && c.groups == 1).then(|| ConvGraphSpec {
            x: c.x_shape,
            w: c.w_shape,
            y: c.y_shape,
            pads: c.pads,
            strides: c.strides,
            dilations: c.dilations,
            bias: c.bias.is_some(),
            residual: c.residual.is_some(),
            relu,
            relu_max,
            dtype,
            allow_tf32: false,
            quant: Some(qtype),
            quant_out,
            quant_copy: false,
            residual_quant: false,
        })
    }
}

/// A finalized execution plan for one [`ConvGraphSpec`].
pub struct ConvGraph {
    plan: Desc,
    /// The engine configuration the plan was made of.
    _config: Desc,
    /// What the configuration was ranked from (heuristics, operation graph, operations,
    /// tensors), shared by the plans of one graph: cuDNN may refer to them while a plan lives.
    _made_from: Arc<GraphParts>,
    /// Workspace bytes the plan needs.
    pub workspace: usize,
    /// cuDNN's global engine index (for search logs).
    pub engine: i64,
    /// Its kernel was compiled when the plan was made.
    pub runtime_compiled: bool,
    /// Whether bias, residual and ReLU are inside the graph (else the caller's epilogue).
    pub fused: bool,
    /// The fused graph reads a bias, a residual.
    bias: bool,
    residual: bool,
    /// A quantized graph: it reads the per-channel scales ([`ConvGraphPtrs::scale`]), and a
    /// last per-channel multiply where `y_scaled` ([`ConvGraphPtrs::y_scale`]: the inverse
    /// output scales of bytes out, or a residual of bytes' scale back).
    quant: bool,
    y_scaled: bool,
    /// It writes y quantized too ([`ConvGraphSpec::quant_copy`], [`ConvGraphPtrs::y_copy`]).
    quant_copy: bool,
}

/// Descriptors kept alive for the plans made from them, dropped in order (heuristics, graph,
/// operations before the tensors they read).
struct GraphParts {
    _descs: Vec<Desc>,
}

// SAFETY: the parts are never read after the plans are made, only kept and dropped (once, when
// the last plan goes); sharing references to them across threads shares nothing mutable.
unsafe impl Sync for GraphParts {}

/// Device pointers of one execution (0 where the graph has no such tensor).
#[derive(Clone, Copy, Debug)]
pub struct ConvGraphPtrs {
    pub x: u64,
    pub w: u64,
    pub y: u64,
    pub bias: u64,
    pub residual: u64,
    pub workspace: u64,
    /// A quantized graph's per-channel scales (f32), and inverse output scales (f32) where
    /// its output is quantized: per launch, so that layers of one shape share one plan.
    pub scale: u64,
    pub y_scale: u64,
    /// Where a graph that writes its output twice puts the quantized copy (0 otherwise).
    pub y_copy: u64,
}

fn dnn_dtype(d: DType) -> dnn::cudnnDataType_t {
    match d {
        DType::F32 => dnn::cudnnDataType_t::CUDNN_DATA_FLOAT,
        DType::F16 => dnn::cudnnDataType_t::CUDNN_DATA_HALF,
        DType::Bf16 => dnn::cudnnDataType_t::CUDNN_DATA_BFLOAT16,
    }
}

/// NHWC strides of logical NCHW dims.
fn nhwc_strides(d: [usize; 4]) -> [i64; 4] {
    let [_, c, h, w] = d.map(|v| v as i64);
    [h * w * c, 1, w * c, c]
}

fn tensor(
    uid: i64,
    dims: [usize; 4],
    strides: [i64; 4],
    dtype: dnn::cudnnDataType_t,
    is_virtual: bool,
) -> Result<Desc, CudaError> {
    let t = Desc::new(D::CUDNN_BACKEND_TENSOR_DESCRIPTOR)?;
    t.set_dtype(A::CUDNN_ATTR_TENSOR_DATA_TYPE, dtype)?;
    t.set_i64(A::CUDNN_ATTR_TENSOR_DIMENSIONS, &dims.map(|v| v as i64))?;
    t.set_i64(A::CUDNN_ATTR_TENSOR_STRIDES, &strides)?;
    t.set_i64(A::CUDNN_ATTR_TENSOR_UNIQUE_ID, &[uid])?;
    t.set_i64(A::CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, &[16])?;
    if is_virtual {
        t.set(
            A::CUDNN_ATTR_TENSOR_IS_VIRTUAL,
            T::CUDNN_TYPE_BOOLEAN,
            &[true],
        )?;
    }
    t.finalize()?;
    Ok(t)
}

/// A pointwise operation `y = mode(x[, b])` computed in f32 (a ReLU clipped above at
/// `upper`, where given).
fn pointwise(
    mode: dnn::cudnnPointwiseMode_t,
    x: &Desc,
    b: Option<&Desc>,
    y: &Desc,
    upper: Option<f32>,
) -> Result<Desc, CudaError> {
    let pw = Desc::new(D::CUDNN_BACKEND_POINTWISE_DESCRIPTOR)?;
    pw.set(
        A::CUDNN_ATTR_POINTWISE_MODE,
        T::CUDNN_TYPE_POINTWISE_MODE,
        &[mode],
    )?;
    pw.set_dtype(
        A::CUDNN_ATTR_POINTWISE_MATH_PREC,
        dnn::cudnnDataType_t::CUDNN_DATA_FLOAT,
    )?;
    if let Some(u) = upper {
        // A float clip with f32 math, as cuDNN's frontend sets it.
        pw.set(
            A::CUDNN_ATTR_POINTWISE_RELU_UPPER_CLIP,
            T::CUDNN_TYPE_FLOAT,
            &[u],
        )?;
    }
    pw.finalize()?;
    let op = Desc::new(D::CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR)?;
    op.set_desc(A::CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, &[&pw])?;
    op.set_desc(A::CUDNN_ATTR_OPERATION_POINTWISE_XDESC, &[x])?;
    if let Some(b) = b {
        op.set_desc(A::CUDNN_ATTR_OPERATION_POINTWISE_BDESC, &[b])?;
    }
    op.set_desc(A::CUDNN_ATTR_OPERATION_POINTWISE_YDESC, &[y])?;
    op.finalize()?;
    Ok(op)
}

/// The operation graph of `spec` (with the epilogue inside when `fused`), and the descriptors
/// it was made of (kept alive as long as anything made from the graph).
fn operation_graph(
    handle: dnn::cudnnHandle_t,
    spec: &ConvGraphSpec,
    fused: bool,
) -> Result<(Desc, Vec<Desc>), CudaError> {
    use isolane_engine::quant::QuantType;
    let io = dnn_dtype(spec.dtype);
    let f32t = dnn::cudnnDataType_t::CUDNN_DATA_FLOAT;
    let (xw, comp) = match spec.quant {
        None => (io, f32t),
        Some(QuantType::Int8) => (
            dnn::cudnnDataType_t::CUDNN_DATA_INT8,
            dnn::cudnnDataType_t::CUDNN_DATA_INT32,
        ),
        Some(_) => (dnn::cudnnDataType_t::CUDNN_DATA_FP8_E4M3, f32t),
    };
    // The output: a quantized graph's quantized again for the next one, else in `dtype`.
    let yt = if spec.quant_out { xw } else { io };
    // A quantized graph's bias is f32 (the planner's copy), as cuDNN's int8 fusion samples
    // declare it; a float graph's is the activations' dtype.
    let bias_t = if spec.quant.is_some() { f32t } else { io };
    let xt = tensor(X, spec.x, nhwc_strides(spec.x), xw, false)?;
    let wt = tensor(W, spec.w, nhwc_strides(spec.w), xw, false)?;
    let conv = Desc::new(D::CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR)?;
    conv.set_dtype(A::CUDNN_ATTR_CONVOLUTION_COMP_TYPE, comp)?;
    conv.set(
        A::CUDNN_ATTR_CONVOLUTION_CONV_MODE,
        T::CUDNN_TYPE_CONVOLUTION_MODE,
        &[dnn::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION],
    )?;
    conv.set_i64(A::CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, &[2])?;
    for (name, values) in [
        (A::CUDNN_ATTR_CONVOLUTION_DILATIONS, spec.dilations),
        (A::CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, spec.strides),
        (A::CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, spec.pads),
        (A::CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, spec.pads),
    ] {
        conv.set_i64(name, &values.map(|v| v as i64))?;
    }
    conv.finalize()?;

    let epilogue = spec.quant.is_some() || (fused && (spec.bias || spec.residual || spec.relu));
    // The convolution writes y itself, or a virtual f32 tensor the epilogue reads (uids from
    // 101; 100 is an int8 convolution's int32 sums).
    let mut virt = 100;
    let mut next_virtual = || -> Result<Desc, CudaError> {
        virt += 1;
        tensor(virt, spec.y, nhwc_strides(spec.y), f32t, true)
    };
    let conv_out = if epilogue && comp == dnn::cudnnDataType_t::CUDNN_DATA_INT32 {
        // An int8 convolution's sums stay int32 until the scale, as cuDNN's ConvScaleBiasAct
        // int8 sample declares them (session 22's f32 virtual tensor here got no engine on
        // the H200, for reasons not known).
        tensor(100, spec.y, nhwc_strides(spec.y), comp, true)?
    } else if epilogue {
        next_virtual()?
    } else {
        tensor(Y, spec.y, nhwc_strides(spec.y), io, false)?
    };
    let op = Desc::new(D::CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR)?;
    op.set_desc(A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, &[&xt])?;
    op.set_desc(A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, &[&wt])?;
    op.set_desc(A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, &[&conv_out])?;
    op.set_desc(
        A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
        &[&conv],
    )?;
    op.set(
        A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
        T::CUDNN_TYPE_FLOAT,
        &[1f32],
    )?;
    op.set(
        A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA,
        T::CUDNN_TYPE_FLOAT,
        &[0f32],
    )?;
    op.finalize()?;
    let mut ops = vec![op];
    let mut parts = vec![xt, wt, conv];
    if epilogue {
        use dnn::cudnnPointwiseMode_t as Pw;
        // The per-channel operands (scales, bias): one value per output channel, broadcast.
        let c = spec.y[1];
        let cs = c as i64;
        let per_channel = |uid, ty| tensor(uid, [1, c, 1, 1], [cs, 1, cs, cs], ty, false);
        // The remaining steps, each reading the previous one's output; the last writes y.
        let mut steps: Vec<(Pw, Option<Desc>)> = Vec::new();
        let relu_step = steps.len()
            + usize::from(spec.quant.is_some())
            + usize::from(spec.bias)
            + usize::from(spec.residual);
        if spec.quant.is_some() {
            let s = per_channel(SCALE, f32t)?;
            steps.push((Pw::CUDNN_POINTWISE_MUL, Some(s)));
        }
        if spec.bias {
            let b = per_channel(BIAS, bias_t)?;
            steps.push((Pw::CUDNN_POINTWISE_ADD, Some(b)));
        }
        if spec.residual {
            let rt = if spec.residual_quant { xw } else { io };
            let r = tensor(RES, spec.y, nhwc_strides(spec.y), rt, false)?;
            steps.push((Pw::CUDNN_POINTWISE_ADD, Some(r)));
        }
        if spec.relu {
            steps.push((Pw::CUDNN_POINTWISE_RELU_FWD, None));
        }
        if spec.quant_out || spec.residual_quant {
            let s = per_channel(YSCALE, f32t)?;
            steps.push((Pw::CUDNN_POINTWISE_MUL, Some(s)));
        }
        let last = steps.len() - 1;
        let mut input = conv_out;
        for (i, (mode, b)) in steps.into_iter().enumerate() {
            let out = if i == last {
                tensor(Y, spec.y, nhwc_strides(spec.y), yt, false)?
            } else {
                next_virtual()?
            };
            let upper = spec.relu_max.filter(|_| spec.relu && i == relu_step);
            ops.push(pointwise(mode, &input, b.as_ref(), &out, upper)?);
            parts.push(std::mem::replace(&mut input, out));
            parts.extend(b);
        }
        if spec.quant_copy {
            // y as written above, quantized once more into its own tensor: a non-virtual
            // tensor read by a further pointwise step, as cuDNN's fusion samples chain them.
            let s = per_channel(YSCALE, f32t)?;
            let q = tensor(YQ, spec.y, nhwc_strides(spec.y), xw, false)?;
            ops.push(pointwise(
                Pw::CUDNN_POINTWISE_MUL,
                &input,
                Some(&s),
                &q,
                None,
            )?);
            parts.push(s);
            parts.push(q);
        }
        parts.push(input);
    } else {
        parts.push(conv_out);
    }
    let graph = Desc::new(D::CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR)?;
    graph.set(
        A::CUDNN_ATTR_OPERATIONGRAPH_HANDLE,
        T::CUDNN_TYPE_HANDLE,
        &[handle],
    )?;
    let refs: Vec<&Desc> = ops.iter().collect();
    graph.set_desc(A::CUDNN_ATTR_OPERATIONGRAPH_OPS, &refs)?;
    graph.finalize()?;
    // Ops before the tensors they read (dropped in this order).
    ops.extend(parts);
    Ok((graph, ops))
}

/// Engine configurations cuDNN's heuristics (`mode`: A, or the fallback list) rank first for
/// `graph`, best first, and
/// the heuristics descriptor they came from. `sm_target`: the SM count the configurations are
/// to split their work for where it is not the device's (`crate::saved::SmTargets`: a saved
/// plan loaded where the device reports another count than at its build).
fn engine_configs(
    graph: &Desc,
    max: usize,
    sm_target: Option<i32>,
    mode: dnn::cudnnBackendHeurMode_t,
) -> Result<(Desc, Vec<Desc>), CudaError> {
    let heur = Desc::new(D::CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR)?;
    heur.set_desc(A::CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, &[graph])?;
    heur.set(
        A::CUDNN_ATTR_ENGINEHEUR_MODE,
        T::CUDNN_TYPE_HEUR_MODE,
        &[mode],
    )?;
    if let Some(sms) = sm_target {
        // A cuDNN that refuses the target (before 8.9.5, or not on this GPU) gives the
        // device's configurations: the load's check run refuses a plan whose bits differ.
        let _ = heur.set(
            A::CUDNN_ATTR_ENGINEHEUR_SM_COUNT_TARGET,
            T::CUDNN_TYPE_INT32,
            &[sms],
        );
    }
    heur.finalize()?;
    let mut count = 0i64;
    // SAFETY: a count query (no elements requested).
    dnn_check("cudnnBackendGetAttribute", unsafe {
        dnn::cudnnBackendGetAttribute(
            heur.0,
            A::CUDNN_ATTR_ENGINEHEUR_RESULTS,
            T::CUDNN_TYPE_BACKEND_DESCRIPTOR,
            0,
            &mut count,
            std::ptr::null_mut(),
        )
    })?;
    let n = (count.max(0) as usize).min(max);
    let cfgs: Vec<Desc> = (0..n)
        .map(|_| Desc::new(D::CUDNN_BACKEND_ENGINECFG_DESCRIPTOR))
        .collect::<Result<_, _>>()?;
    let mut raw: Vec<dnn::cudnnBackendDescriptor_t> = cfgs.iter().map(|d| d.0).collect();
    let mut got = 0i64;
    // SAFETY: `raw` holds n created engine-config descriptors for cuDNN to fill.
    dnn_check("cudnnBackendGetAttribute", unsafe {
        dnn::cudnnBackendGetAttribute(
            heur.0,
            A::CUDNN_ATTR_ENGINEHEUR_RESULTS,
            T::CUDNN_TYPE_BACKEND_DESCRIPTOR,
            n as i64,
            &mut got,
            raw.as_mut_ptr() as *mut c_void,
        )
    })?;
    let mut cfgs = cfgs;
    cfgs.truncate(got.clamp(0, n as i64) as usize);
    Ok((heur, cfgs))
}

/// The engine of an engine configuration.
fn engine_of(cfg: &Desc) -> Option<Desc> {
    let engine = Desc::new(D::CUDNN_BACKEND_ENGINE_DESCRIPTOR).ok()?;
    let mut raw = engine.0;
    let mut n = 0i64;
    // SAFETY: room for one descriptor, created above, which cuDNN fills.
    let status = unsafe {
        dnn::cudnnBackendGetAttribute(
            cfg.0,
            A::CUDNN_ATTR_ENGINECFG_ENGINE,
            T::CUDNN_TYPE_BACKEND_DESCRIPTOR,
            1,
            &mut n,
            &mut raw as *mut dnn::cudnnBackendDescriptor_t as *mut c_void,
        )
    };
    (status == dnn::cudnnStatus_t::CUDNN_STATUS_SUCCESS && n == 1).then_some(engine)
}

/// Up to 16 notes of type `ty` (an enum of u32 values) an engine carries; `None` where cuDNN
/// does not say.
fn notes<N: Copy>(engine: &Desc, name: A, ty: T, fill: N) -> Option<Vec<N>> {
    let mut notes = [fill; 16];
    let mut count = 0i64;
    // SAFETY: room for 16 values of the type `ty` names (N is that enum).
    let status = unsafe {
        dnn::cudnnBackendGetAttribute(
            engine.0,
            name,
            ty,
            notes.len() as i64,
            &mut count,
            notes.as_mut_ptr() as *mut c_void,
        )
    };
    (status == dnn::cudnnStatus_t::CUDNN_STATUS_SUCCESS)
        .then(|| notes[..count.clamp(0, 16) as usize].to_vec())
}

/// What the build needs to know of an engine before making a plan of it.
struct EngineFacts {
    /// cuDNN's global engine index (-1 where it does not say).
    index: i64,
    /// It may use reduced-precision math: tensor cores on f32 data are TF32, down-converted
    /// inputs, reduced-precision sums (not allowed at fp32; PyTorch filters cuDNN's engines
    /// alike without `allow_tf32`).
    reduced_precision: bool,
    /// Its kernel is compiled when the plan is made (NVRTC inside cuDNN: seconds per model).
    runtime_compiled: bool,
}

fn engine_facts(cfg: &Desc) -> EngineFacts {
    use dnn::cudnnBackendBehaviorNote_t as B;
    use dnn::cudnnBackendNumericalNote_t as Nn;
    let Some(engine) = engine_of(cfg) else {
        return EngineFacts {
            index: -1,
            reduced_precision: true,
            runtime_compiled: true,
        };
    };
    let numerical = notes(
        &engine,
        A::CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
        T::CUDNN_TYPE_NUMERICAL_NOTE,
        Nn::CUDNN_NUMERICAL_NOTE_TYPE_COUNT,
    );
    let behavior = notes(
        &engine,
        A::CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE,
        T::CUDNN_TYPE_BEHAVIOR_NOTE,
        B::CUDNN_BEHAVIOR_NOTE_TYPE_COUNT,
    );
    EngineFacts {
        index: engine
            .get_i64(A::CUDNN_ATTR_ENGINE_GLOBAL_INDEX)
            .unwrap_or(-1),
        reduced_precision: numerical.is_none_or(|n| {
            n.iter().any(|n| {
                matches!(
                    n,
                    Nn::CUDNN_NUMERICAL_NOTE_TENSOR_CORE
                        | Nn::CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS
                        | Nn::CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION
                )
            })
        }),
        runtime_compiled: behavior
            .is_none_or(|b| b.contains(&B::CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION)),
    }
}

/// Up to `max` execution plans for `spec`, best ranked first: the fused graph's where its
/// epilogue is only bias, residual and ReLU (`spec` says so) and such plans finalize, else the
/// convolution alone. Plans that do not finalize on this GPU or need more than `ws_cap` bytes
/// of workspace are left out, and engines compiled at run time unless `runtime_compilation`;
/// none at all is an error.
pub fn conv_graphs(
    handle: dnn::cudnnHandle_t,
    spec: &ConvGraphSpec,
    ws_cap: usize,
    max: usize,
    (runtime_compilation, sm_target): (bool, Option<i32>),
) -> Result<Vec<ConvGraph>, CudaError> {
    let has_epilogue = spec.bias || spec.residual || spec.relu;
    let mut out = Vec::new();
    let mut first_error = None;
    for fused in [true, false] {
        if (!fused || !has_epilogue) && !out.is_empty() {
            break;
        }
        let limits = Limits {
            ws_cap,
            max,
            runtime_compilation,
            sm_target,
            mode: dnn::cudnnBackendHeurMode_t::CUDNN_HEUR_MODE_A,
        };
        if let Err(e) = plans_of_graph(handle, spec, fused, &limits, &mut out) {
            first_error.get_or_insert(e);
        }
    }
    match (out.is_empty(), first_error) {
        (true, Some(e)) => Err(e),
        _ => Ok(out),
    }
}

/// Which plans [`plans_of_graph`] keeps.
struct Limits {
    /// Workspace bytes a plan may need.
    ws_cap: usize,
    /// Plans in all.
    max: usize,
    /// Whether engines compiled at run time are allowed.
    runtime_compilation: bool,
    /// The heuristics' SM count target ([`engine_configs`]).
    sm_target: Option<i32>,
    /// Which heuristics rank the configurations.
    mode: dnn::cudnnBackendHeurMode_t,
}

/// What became of the configurations cuDNN's heuristics offered for one graph: why a
/// quantized graph got no plan, said in one line ([`quant_conv_graphs`]).
#[derive(Debug, Default)]
pub struct Tally {
    /// Configurations the heuristics offered.
    pub offered: usize,
    /// Left out: compiled at run time, which these limits do not allow.
    pub runtime_compiled: usize,
    /// Left out: reduced precision where fp32 was asked.
    pub reduced_precision: usize,
    /// Left out: more workspace than the cap.
    pub over_workspace: usize,
    /// Did not finalize on this GPU (cuDNN's NOT_SUPPORTED and the like).
    pub failed: usize,
    /// The first failure's status, as cuDNN named it.
    pub first_failure: Option<String>,
    /// Plans made.
    pub made: usize,
}

impl Tally {
    /// One clause: "4 offered: 2 compiled at run time (not allowed), 2 failed
    /// (CUDNN_STATUS_NOT_SUPPORTED ...)".
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        for (n, what) in [
            (self.runtime_compiled, "compiled at run time (not allowed)"),
            (self.reduced_precision, "of reduced precision"),
            (self.over_workspace, "over the workspace cap"),
        ] {
            if n > 0 {
                parts.push(format!("{n} {what}"));
            }
        }
        if self.failed > 0 {
            parts.push(format!(
                "{} did not finalize ({})",
                self.failed,
                self.first_failure.as_deref().unwrap_or("no status")
            ));
        }
        match (self.offered, parts.is_empty()) {
            (0, _) => "the heuristics offered no engine".to_string(),
            (n, true) => format!("{n} offered, {} made", self.made),
            (n, false) => format!("{n} offered: {}", parts.join(", ")),
        }
    }
}

/// Adds to `out`, up to `limits.max` in all, the plans of the heuristics' configurations for
/// `spec`'s graph (fused or not) that are allowed at this precision and by `limits` and that
/// finalize on this GPU. One heuristics query per graph: its configurations share it.
fn plans_of_graph(
    handle: dnn::cudnnHandle_t,
    spec: &ConvGraphSpec,
    fused: bool,
    limits: &Limits,
    out: &mut Vec<ConvGraph>,
) -> Result<Tally, CudaError> {
    // A few more configurations than plans leave room for those filtered out.
    let (cfgs, shared) = configurations(handle, spec, fused, 4 * limits.max, limits)?;
    let mut first_error = None;
    let mut tally = Tally {
        offered: cfgs.len(),
        ..Tally::default()
    };
    for cfg in cfgs {
        if out.len() >= limits.max {
            break;
        }
        let facts = engine_facts(&cfg);
        // (A quantized graph's sums are int32 or its inputs float8: tensor cores are the point.)
        let exactness_asked = spec.quant.is_none() && spec.dtype == DType::F32;
        if exactness_asked && !spec.allow_tf32 && facts.reduced_precision {
            tally.reduced_precision += 1;
            continue;
        }
        if facts.runtime_compiled && !limits.runtime_compilation {
            tally.runtime_compiled += 1;
            continue;
        }
        let made = plan_of(handle, &cfg).and_then(|plan| {
            let ws = plan.get_i64(A::CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE)?;
            Ok((plan, ws))
        });
        let (plan, ws) = match made {
            Ok(made) => made,
            Err(e) => {
                tally.failed += 1;
                tally.first_failure.get_or_insert_with(|| e.to_string());
                first_error.get_or_insert(e);
                continue;
            }
        };
        if ws < 0 || ws as usize > limits.ws_cap {
            tally.over_workspace += 1;
            continue;
        }
        tally.made += 1;
        out.push(ConvGraph::made(
            plan,
            cfg,
            &shared,
            ws as usize,
            &facts,
            spec,
            fused,
        ));
    }
    match (out.is_empty(), first_error) {
        (true, Some(e)) => Err(e),
        _ => Ok(tally),
    }
}

/// The plan of cuDNN engine `engine` for `spec`'s graph (fused as a build's choice says), as
/// the heuristics offer it: how a saved plan makes a graph-API convolution again, nothing
/// timed. `None`: the heuristics do not offer that engine here (or its plan needs more than
/// `ws_cap` bytes of workspace). Made from the engine's configuration, not from the plan's
/// JSON text: restoring an execution plan from JSON crashed the process on the H200 (cuDNN 9,
/// a double free, session 20).
///
/// `sm_target` (the build's SM count, where this device reports another) is asked of the
/// heuristics first. cuDNN refuses a target above the SMs the device reports
/// (`CUDNN_STATUS_BAD_PARAM` at finalize: every convolution of a plan built on the whole H200
/// and loaded by an MPS client of 30 % of its threads, session 27), so where the target is
/// refused or its configurations lack the engine, the engine is sought again without it. The
/// load's bit check then says whether the convolution computes the build's bits here.
pub fn conv_graph_of_engine(
    handle: dnn::cudnnHandle_t,
    spec: &ConvGraphSpec,
    choice: (bool, i64),
    ws_cap: usize,
    sm_target: Option<i32>,
) -> Result<Option<ConvGraph>, CudaError> {
    targeted_or_not(sm_target, |target| {
        engine_plan(handle, spec, choice, ws_cap, target)
    })
}

/// `find(target)`, and where that finds nothing or fails, `find(None)`: the device's own
/// count. The second attempt's error, if it fails too.
fn targeted_or_not<G, E>(
    target: Option<i32>,
    mut find: impl FnMut(Option<i32>) -> Result<Option<G>, E>,
) -> Result<Option<G>, E> {
    match find(target) {
        Ok(Some(g)) => Ok(Some(g)),
        first if target.is_some() => find(None).or_else(|e| first.map_err(|_| e)),
        other => other,
    }
}

fn engine_plan(
    handle: dnn::cudnnHandle_t,
    spec: &ConvGraphSpec,
    (fused, engine): (bool, i64),
    ws_cap: usize,
    sm_target: Option<i32>,
) -> Result<Option<ConvGraph>, CudaError> {
    let has_epilogue = spec.bias || spec.residual || spec.relu;
    // A build without an epilogue made its graph as the fused one (the convolution alone).
    let graph_fused = fused || !has_epilogue;
    let limits = Limits {
        ws_cap,
        max: 64,
        runtime_compilation: true,
        sm_target,
        mode: dnn::cudnnBackendHeurMode_t::CUDNN_HEUR_MODE_A,
    };
    let (cfgs, shared) = configurations(handle, spec, graph_fused, 64, &limits)?;
    for cfg in cfgs {
        let facts = engine_facts(&cfg);
        if facts.index != engine {
            continue;
        }
        let plan = plan_of(handle, &cfg)?;
        let ws = plan.get_i64(A::CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE)?;
        if ws < 0 || ws as usize > ws_cap {
            return Ok(None);
        }
        return Ok(Some(ConvGraph::made(
            plan,
            cfg,
            &shared,
            ws as usize,
            &facts,
            spec,
            graph_fused,
        )));
    }
    Ok(None)
}

/// Up to `max` of the heuristics' engine configurations for `spec`'s graph (fused or not),
/// with the descriptors they were made from, which every plan of them keeps alive.
fn configurations(
    handle: dnn::cudnnHandle_t,
    spec: &ConvGraphSpec,
    fused: bool,
    max: usize,
    limits: &Limits,
) -> Result<(Vec<Desc>, Arc<GraphParts>), CudaError> {
    let (graph, parts) = operation_graph(handle, spec, fused)?;
    // A target cuDNN refuses (above the SMs an MPS client's device reports) fails the
    // heuristics' finalize: the device's own configurations then, which the load's bit check
    // judges.
    let (heur, cfgs) = match engine_configs(&graph, max, limits.sm_target, limits.mode) {
        Err(_) if limits.sm_target.is_some() => engine_configs(&graph, max, None, limits.mode)?,
        found => found?,
    };
    let mut kept = vec![heur, graph];
    kept.extend(parts);
    Ok((cfgs, Arc::new(GraphParts { _descs: kept })))
}

impl ConvGraph {
    /// The finalized `plan` of configuration `cfg` of `spec`'s graph, fused or not.
    fn made(
        plan: Desc,
        cfg: Desc,
        shared: &Arc<GraphParts>,
        workspace: usize,
        facts: &EngineFacts,
        spec: &ConvGraphSpec,
        fused: bool,
    ) -> ConvGraph {
        ConvGraph {
            plan,
            _config: cfg,
            _made_from: Arc::clone(shared),
            workspace,
            engine: facts.index,
            runtime_compiled: facts.runtime_compiled,
            fused: fused && (spec.bias || spec.residual || spec.relu),
            bias: fused && spec.bias,
            residual: fused && spec.residual,
            quant: spec.quant.is_some(),
            y_scaled: spec.quant_out || spec.residual_quant,
            quant_copy: spec.quant_copy,
        }
    }
}

/// Up to `max` execution plans of quantized convolution `spec` ([`ConvGraphSpec::quantized`]:
/// the convolution, the scale, bias, residual, ReLU and the output's quantization in one
/// graph), best ranked first. Tried in turn until one gives a plan: the heuristics' (mode A)
/// precompiled engines; with `runtime_compilation`, its engines compiled at run time too
/// (cuDNN's runtime fusion, NVRTC when the plan is made); its fallback list. None at all is
/// the reason each attempt gave, in one line (the candidate is then not built).
pub fn quant_conv_graphs(
    handle: dnn::cudnnHandle_t,
    spec: &ConvGraphSpec,
    ws_cap: usize,
    max: usize,
    (runtime_compilation, sm_target): (bool, Option<i32>),
) -> Result<Vec<ConvGraph>, String> {
    use dnn::cudnnBackendHeurMode_t as M;
    if spec.quant.is_none() {
        return Err("not a quantized graph".into());
    }
    let mut attempts = vec![("precompiled", false, M::CUDNN_HEUR_MODE_A)];
    if runtime_compilation {
        attempts.push(("runtime-compiled", true, M::CUDNN_HEUR_MODE_A));
    }
    attempts.push(("fallback", runtime_compilation, M::CUDNN_HEUR_MODE_FALLBACK));
    let mut said = Vec::new();
    for (what, rtc, mode) in attempts {
        let limits = Limits {
            ws_cap,
            max,
            runtime_compilation: rtc,
            sm_target,
            mode,
        };
        let mut out = Vec::new();
        match plans_of_graph(handle, spec, true, &limits, &mut out) {
            Ok(_) if !out.is_empty() => {
                for g in &mut out {
                    // The scale step is part of the graph whatever the epilogue.
                    g.fused = true;
                    g.bias = spec.bias;
                    g.residual = spec.residual;
                }
                return Ok(out);
            }
            Ok(t) => said.push(format!("{what}: {}", t.describe())),
            Err(e) => said.push(format!("{what}: {e}")),
        }
    }
    if !runtime_compilation {
        said.push(
            "engines compiled at run time not tried (ISOLANE_CUDA_QUANT_GRAPH=precompiled)".into(),
        );
    }
    Err(format!("cuDNN makes no plan of it ({})", said.join("; ")))
}

fn plan_of(handle: dnn::cudnnHandle_t, cfg: &Desc) -> Result<Desc, CudaError> {
    let plan = Desc::new(D::CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR)?;
    plan.set(
        A::CUDNN_ATTR_EXECUTION_PLAN_HANDLE,
        T::CUDNN_TYPE_HANDLE,
        &[handle],
    )?;
    plan.set_desc(A::CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, &[cfg])?;
    plan.finalize()?;
    Ok(plan)
}

impl ConvGraph {
    /// The plan as cuDNN serialises it (`CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION`: the
    /// engine, its knob settings and what it was made for), for a saved plan
    /// ([`crate::saved`]).
    pub fn to_json(&self) -> Result<String, CudaError> {
        let mut count = 0i64;
        // SAFETY: a length query (no elements requested) on a finalized plan.
        dnn_check("cudnnBackendGetAttribute", unsafe {
            dnn::cudnnBackendGetAttribute(
                self.plan.0,
                A::CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION,
                T::CUDNN_TYPE_CHAR,
                0,
                &mut count,
                std::ptr::null_mut(),
            )
        })?;
        let mut buf = vec![0u8; count.max(0) as usize];
        let mut got = 0i64;
        // SAFETY: `buf` has room for `count` chars, which cuDNN fills.
        dnn_check("cudnnBackendGetAttribute", unsafe {
            dnn::cudnnBackendGetAttribute(
                self.plan.0,
                A::CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION,
                T::CUDNN_TYPE_CHAR,
                buf.len() as i64,
                &mut got,
                buf.as_mut_ptr() as *mut c_void,
            )
        })?;
        // Kept as cuDNN wrote it (its terminating NUL too), as cuDNN's frontend keeps it.
        buf.truncate(got.clamp(0, buf.len() as i64) as usize);
        Ok(String::from_utf8_lossy(&buf).into_owned())
    }

    /// Whether bias and residual are read inside the graph.
    pub fn reads(&self) -> (bool, bool) {
        (self.bias, self.residual)
    }

    /// Queues the convolution on the handle's stream.
    ///
    /// # Safety
    /// Every pointer is a live device buffer of the graph's shape and dtype (the workspace of
    /// at least `self.workspace` bytes), on the handle's device.
    pub unsafe fn execute(
        &self,
        handle: dnn::cudnnHandle_t,
        p: &ConvGraphPtrs,
    ) -> Result<(), CudaError> {
        let mut uids = vec![X, W, Y];
        let mut ptrs: Vec<*mut c_void> = vec![p.x as _, p.w as _, p.y as _];
        if self.bias {
            uids.push(BIAS);
            ptrs.push(p.bias as _);
        }
        if self.residual {
            uids.push(RES);
            ptrs.push(p.residual as _);
        }
        if self.quant {
            uids.push(SCALE);
            ptrs.push(p.scale as _);
        }
        if self.y_scaled || self.quant_copy {
            uids.push(YSCALE);
            ptrs.push(p.y_scale as _);
        }
        if self.quant_copy {
            uids.push(YQ);
            ptrs.push(p.y_copy as _);
        }
        let pack = Desc::new(D::CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)?;
        pack.set_i64(A::CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, &uids)?;
        pack.set(
            A::CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
            T::CUDNN_TYPE_VOID_PTR,
            &ptrs,
        )?;
        pack.set(
            A::CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
            T::CUDNN_TYPE_VOID_PTR,
            &[p.workspace as *mut c_void],
        )?;
        pack.finalize()?;
        // SAFETY: the plan and pack are finalized; the caller vouches for the pointers.
        dnn_check("cudnnBackendExecute", unsafe {
            dnn::cudnnBackendExecute(handle, self.plan.0, pack.0)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Loc;

    #[test]
    fn an_sm_target_cudnn_refuses_is_dropped_for_the_devices_own_count() {
        // Refused (an MPS client's device reports fewer SMs than the target): found without.
        let mut asked = vec![];
        let got = targeted_or_not(Some(132), |t| {
            asked.push(t);
            match t {
                Some(_) => Err("CUDNN_STATUS_BAD_PARAM"),
                None => Ok(Some(7)),
            }
        });
        assert_eq!((got, asked), (Ok(Some(7)), vec![Some(132), None]));
        // The engine not among the target's configurations: sought again without it.
        let got = targeted_or_not(Some(132), |t| Ok::<_, ()>(t.is_none().then_some(3)));
        assert_eq!(got, Ok(Some(3)));
        // Found with the target: asked once.
        let mut n = 0;
        assert_eq!(
            targeted_or_not(Some(132), |_| {
                n += 1;
                Ok::<_, ()>(Some(1))
            }),
            Ok(Some(1))
        );
        assert_eq!(n, 1);
        // No target: nothing to drop, asked once, its answer kept.
        let mut n = 0;
        let got = targeted_or_not(None, |_| {
            n += 1;
            Err::<Option<u8>, _>("e")
        });
        assert_eq!((got, n), (Err("e"), 1));
        // Both fail: the second attempt's error.
        let got = targeted_or_not(Some(1), |t| {
            Err::<Option<u8>, _>(if t.is_some() { "first" } else { "second" })
        });
        assert_eq!(got, Err("second"));
    }

    fn step(act: Option<Unary>, nhwc: bool) -> ConvStep {
        let at = |id| Loc::Storage { id, offset: 0 };
        ConvStep {
            x: at(0),
            w: Loc::Const { id: 0, offset: 0 },
            bias: Some(Loc::Const { id: 1, offset: 0 }),
            residual: Some(at(1)),
            y: at(2),
            x_shape: [2, 64, 56, 56],
            w_shape: [128, 64, 3, 3],
            y_shape: [2, 128, 28, 28],
            pads: [1, 1],
            strides: [2, 2],
            dilations: [1, 1],
            groups: 1,
            act,
            nhwc,
            col: None,
        }
    }

    #[test]
    fn the_graph_fuses_bias_residual_and_relu_only() {
        let s = ConvGraphSpec::of(&step(Some(Unary::Relu), true), DType::F16, Precision::Fp16)
            .expect("NHWC");
        assert!(s.bias && s.residual && s.relu && !s.allow_tf32);
        assert_eq!(
            (s.x, s.y, s.strides),
            ([2, 64, 56, 56], [2, 128, 28, 28], [2, 2])
        );
        let none = ConvGraphSpec::of(&step(None, true), DType::F32, Precision::Tf32).unwrap();
        assert!(none.bias && none.residual && !none.relu && none.allow_tf32);
        // Another activation: the convolution alone (bias and residual in our epilogue).
        let silu =
            ConvGraphSpec::of(&step(Some(Unary::Silu), true), DType::F16, Precision::Fp16).unwrap();
        assert!(!silu.bias && !silu.residual && !silu.relu);
        assert!(ConvGraphSpec::of(&step(None, false), DType::F16, Precision::Fp16).is_none());
    }

    #[test]
    fn a_quantized_graph_fuses_its_scale_and_bias_residual_relu() {
        use isolane_engine::quant::QuantType;
        let s = ConvGraphSpec::quantized(
            &step(Some(Unary::Relu), true),
            QuantType::Int8,
            DType::F16,
            false,
        )
        .expect("ReLU fuses");
        assert!(s.bias && s.residual && s.relu && !s.allow_tf32 && !s.quant_out);
        assert_eq!((s.quant, s.dtype), (Some(QuantType::Int8), DType::F16));
        let plain = ConvGraphSpec::quantized(
            &step(None, true),
            QuantType::Float8E4M3Fn,
            DType::F16,
            false,
        )
        .unwrap();
        assert!(!plain.relu && plain.quant == Some(QuantType::Float8E4M3Fn));
        // Bytes out for the next quantized convolution: a spec of its own (its plan is not
        // the float-output one's).
        let out = ConvGraphSpec::quantized(
            &step(Some(Unary::Relu), true),
            QuantType::Int8,
            DType::F16,
            true,
        )
        .unwrap();
        assert!(out.quant_out && out != s);
        // ReLU6 and Clip(0, max): the ReLU clipped above; Clip(-1, 1) is no ReLU.
        let q =
            |act| ConvGraphSpec::quantized(&step(act, true), QuantType::Int8, DType::F16, false);
        let r6 = q(Some(Unary::Relu6)).expect("ReLU6 fuses");
        assert!(r6.relu && r6.relu_max == Some(6.0) && r6 != s);
        let clip = q(Some(Unary::Clip { min: 0.0, max: 4.0 })).unwrap();
        assert!(clip.relu && clip.relu_max == Some(4.0));
        assert!(q(Some(Unary::Clip {
            min: -1.0,
            max: 1.0
        }))
        .is_none());
        assert!(s.relu_max.is_none() && plain.relu_max.is_none());
        // Another activation, or NCHW: no quantized graph (the scale must be inside it).
        assert!(ConvGraphSpec::quantized(
            &step(Some(Unary::Silu), true),
            QuantType::Int8,
            DType::F16,
            true
        )
        .is_none());
        assert!(
            ConvGraphSpec::quantized(&step(None, false), QuantType::Int8, DType::F16, false)
                .is_none()
        );
        // The float graph has no quantization.
        let f = ConvGraphSpec::of(&step(None, true), DType::F16, Precision::Fp16).unwrap();
        assert!(f.quant.is_none() && !f.quant_out && !f.quant_copy);
        // y written twice (the record asks for it where the step has a quantized copy): a
        // spec, and so a plan, of its own.
        assert!(!s.quant_copy);
        let both = ConvGraphSpec {
            quant_copy: true,
            ..s.clone()
        };
        assert!(both != s && both != out);
    }

    #[test]
    fn a_graph_without_a_plan_says_what_became_of_each_engine() {
        assert_eq!(
            Tally::default().describe(),
            "the heuristics offered no engine"
        );
        let t = Tally {
            offered: 5,
            runtime_compiled: 3,
            over_workspace: 1,
            failed: 1,
            first_failure: Some("cudnnBackendFinalize: CUDNN_STATUS_NOT_SUPPORTED".into()),
            ..Tally::default()
        };
        assert_eq!(
            t.describe(),
            "5 offered: 3 compiled at run time (not allowed), 1 over the workspace cap, 1 did \
             not finalize (cudnnBackendFinalize: CUDNN_STATUS_NOT_SUPPORTED)"
        );
        let made = Tally {
            offered: 2,
            made: 1,
            ..Tally::default()
        };
        assert_eq!(made.describe(), "2 offered, 1 made");
    }

    /// Which fused quantized graphs cuDNN plans on this GPU (the session 24 question: does
    /// sm_90 take int8 convolution fusions, and only as engines compiled at run time?): for
    /// resnet50's convolution shapes at batch 1 and 64, int8 and e4m3, the graph with each
    /// epilogue (scale only; bias and ReLU; bias, residual and ReLU; each writing fp16 or
    /// requantized bytes), first with precompiled engines only, then with runtime-compiled
    /// ones. Prints per graph the engine and the time its plan took, or cuDNN's reasons.
    /// Holds that a graph without a plan is refused with the reason of every attempt (the
    /// build's candidate is then skipped, said once), never with a bare error.
    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn which_quantized_graphs_cudnn_plans_on_this_gpu() {
        use isolane_engine::quant::QuantType;
        let backend = crate::CudaBackend::new(0).expect("needs a CUDA GPU");
        crate::model::make_current(backend.context()).unwrap();
        let h = crate::handles::Cudnn::new(std::ptr::null_mut()).expect("cudnn");
        // (C, H, K, kernel, stride): resnet50's conv1 1×1, conv2 3×3, conv3 1×1 of layer1, a
        // strided 3×3 of layer2, layer4's 3×3.
        let shapes = [
            (64, 56, 64, 1, 1),
            (64, 56, 64, 3, 1),
            (64, 56, 256, 1, 1),
            (128, 56, 128, 3, 2),
            (512, 7, 512, 3, 1),
        ];
        let mut planned = 0;
        let mut tried = 0;
        // Runtime-compiled engines take seconds each: the most telling graphs first (int8 at
        // batch 1, then 64, then e4m3), within 90 s, the rest said to be skipped.
        let start = std::time::Instant::now();
        for (qtype, batch) in [
            (QuantType::Int8, 1),
            (QuantType::Int8, 64),
            (QuantType::Float8E4M3Fn, 1),
        ] {
            for (c, hw, k, r, st) in shapes {
                let o = (hw + 2 * (r / 2) - r) / st + 1;
                // Then: a block's output written twice, fp16 for the next residual and bytes
                // for the next convolution (`quant_copy`); a ReLU6 (MobileNetV2's); the
                // residual read as bytes (`residual_quant`), writing bytes or fp16.
                for (bias, residual, relu, quant_out, quant_copy, relu6, residual_quant) in [
                    (false, false, false, false, false, false, false),
                    (true, false, true, false, false, false, false),
                    (true, false, true, true, false, false, false),
                    (true, true, true, false, false, false, false),
                    (true, true, true, true, false, false, false),
                    (true, true, true, false, true, false, false),
                    (true, false, true, false, false, true, false),
                    (true, true, true, true, false, false, true),
                    (true, true, true, false, false, false, true),
                ] {
                    let spec = ConvGraphSpec {
                        x: [batch, c, hw, hw],
                        w: [k, c, r, r],
                        y: [batch, k, o, o],
                        pads: [r / 2; 2],
                        strides: [st; 2],
                        dilations: [1, 1],
                        bias,
                        residual,
                        relu,
                        relu_max: relu6.then_some(6.0),
                        dtype: DType::F16,
                        allow_tf32: false,
                        quant: Some(qtype),
                        quant_out,
                        quant_copy,
                        residual_quant,
                    };
                    let what = format!(
                        "{qtype} b{batch} {c}x{hw}x{hw} k{r} s{st} -> {k}: bias {bias} \
                             residual {residual} (bytes {residual_quant}) relu {relu} \
                             bytes out {quant_out} y and bytes {quant_copy} relu6 {relu6}"
                    );
                    for rtc in [false, true] {
                        if start.elapsed().as_secs() > 90 {
                            println!("{what} rtc {rtc}: skipped (90 s spent)");
                            continue;
                        }
                        tried += 1;
                        let t0 = std::time::Instant::now();
                        let got = quant_conv_graphs(h.raw(), &spec, 1 << 30, 1, (rtc, None));
                        let ms = t0.elapsed().as_secs_f64() * 1e3;
                        match got {
                            Ok(g) => {
                                planned += 1;
                                println!(
                                    "{what} rtc {rtc}: engine {} (runtime-compiled {}, \
                                         workspace {}) in {ms:.1} ms",
                                    g[0].engine, g[0].runtime_compiled, g[0].workspace
                                );
                            }
                            Err(e) => {
                                println!("{what} rtc {rtc}: none in {ms:.1} ms: {e}");
                                assert!(
                                    e.contains("precompiled:") && e.contains("fallback:"),
                                    "{e}"
                                );
                            }
                        }
                    }
                }
            }
        }
        println!("{planned} of {tried} quantized graphs planned");
    }

    /// What a residual of bytes saves (issue 33's int8 target): resnet50's 1×1 expansions with
    /// the skip at batch 64, run as today (fp16 residual read, y written in fp16 and as bytes)
    /// and with the skip kept as bytes (int8 residual read, bytes written): the time of each
    /// plan, the best of the runtime-compiled engines cuDNN ranks first.
    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn a_residual_of_bytes_against_one_of_fp16() {
        use crate::handles::DeviceBuffer;
        use isolane_engine::quant::QuantType;
        let backend = crate::CudaBackend::new(0).expect("needs a CUDA GPU");
        crate::model::make_current(backend.context()).unwrap();
        let h = crate::handles::Cudnn::new(std::ptr::null_mut()).expect("cudnn");
        // (C, H, K): layer1's, layer2's, layer3's and layer4's conv3.
        for (c, hw, k) in [
            (64, 56, 256),
            (128, 28, 512),
            (256, 14, 1024),
            (512, 7, 2048),
        ] {
            let base = ConvGraphSpec {
                x: [64, c, hw, hw],
                w: [k, c, 1, 1],
                y: [64, k, hw, hw],
                pads: [0, 0],
                strides: [1, 1],
                dilations: [1, 1],
                bias: true,
                residual: true,
                relu: true,
                relu_max: None,
                dtype: DType::F16,
                allow_tf32: false,
                quant: Some(QuantType::Int8),
                quant_out: false,
                quant_copy: true,
                residual_quant: false,
            };
            let bytes = ConvGraphSpec {
                quant_out: true,
                quant_copy: false,
                residual_quant: true,
                ..base.clone()
            };
            let ny = 64 * k * hw * hw;
            let buf = |n: usize| DeviceBuffer::zeroed(n).expect("device memory");
            let (x, w, y, yq, r) = (
                buf(64 * c * hw * hw),
                buf(k * c),
                buf(2 * ny),
                buf(ny),
                buf(2 * ny),
            );
            let (bias, scale, ys) = (buf(4 * k), buf(4 * k), buf(4 * k));
            for (what, spec) in [
                ("fp16 residual, y and bytes", &base),
                ("bytes residual, bytes", &bytes),
            ] {
                let plans = match quant_conv_graphs(h.raw(), spec, 1 << 30, 4, (true, None)) {
                    Ok(p) => p,
                    Err(e) => {
                        println!("b64 {c}x{hw}x{hw} -> {k}, {what}: no plan: {e}");
                        continue;
                    }
                };
                for g in &plans {
                    let ws = buf(g.workspace);
                    let p = ConvGraphPtrs {
                        x: x.span().ptr(),
                        w: w.span().ptr(),
                        y: if spec.quant_out {
                            yq.span().ptr()
                        } else {
                            y.span().ptr()
                        },
                        bias: bias.span().ptr(),
                        residual: r.span().ptr(),
                        workspace: ws.span().ptr(),
                        scale: scale.span().ptr(),
                        y_scale: ys.span().ptr(),
                        y_copy: yq.span().ptr(),
                    };
                    let run = |n: usize| {
                        for _ in 0..n {
                            // SAFETY: every pointer is a live zeroed buffer of its tensor's
                            // size (bytes for int8, two for fp16, four for f32), the
                            // workspace as the plan asks.
                            unsafe { g.execute(h.raw(), &p) }.expect("executes");
                        }
                        // SAFETY: a context is current.
                        let done = unsafe { cudarc::driver::sys::cuCtxSynchronize() };
                        isolane_gpu::call::cu_check("cuCtxSynchronize", done).expect("runs");
                    };
                    run(5);
                    let t0 = std::time::Instant::now();
                    run(50);
                    let us = t0.elapsed().as_secs_f64() * 1e6 / 50.0;
                    println!(
                        "b64 {c}x{hw}x{hw} -> {k}, {what}: engine {} {us:.1} us",
                        g.engine
                    );
                }
            }
        }
    }

    #[test]
    fn nhwc_strides_are_channels_last() {
        assert_eq!(nhwc_strides([2, 3, 4, 5]), [60, 1, 15, 3]);
    }
}
