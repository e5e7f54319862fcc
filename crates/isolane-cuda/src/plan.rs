//! The execution plan: made once per (graph, batch, precision) on the CPU, without touching a
//! GPU, so that it is tested in CI.
//!
//! It lowers every node of the optimised graph to a [`Step`] that a GPU library or one of our
//! NVRTC kernels runs, aliases view ops onto their input's storage (with an element offset, so
//! that a split along a leading axis or a gather of one index costs nothing), and packs every
//! activation into one arena by liveness: storages alive at the same step get disjoint byte
//! ranges, everything else may share.
//!
//! Each op family's lowering is in `plan/lower/<family>.rs`, named as its home in the engine
//! (`isolane_engine`'s `ops/`), reached from one match, `Planner::lower_node`.

use std::sync::Arc;

pub use isolane_engine::arena::{assign_offsets, check_no_overlap, ArenaRules, Storage};
use isolane_engine::ir::{
    broadcast_shapes, infer_node, norm_axis, slice_params, Binary, ConvAttrs, CoordMode, Graph,
    NearestMode, Node, Op, PoolAttrs, ReduceKind, ResizeAttrs, ResizeMode, Tensor, Unary,
    ValueKind,
};
use isolane_engine::quant::{FakeQuantAttrs, Granularity, QuantType};
use isolane_engine::{EngineError, Precision, Result};

mod lower;

/// Alignment of every storage in the arena and every constant in the weights buffer
/// (cuDNN and cuBLASLt want 16 bytes; 256 keeps every tensor on its own cache-line group).
pub const ALIGN: usize = 256;

/// Most dims a strided kernel indexes (after merging contiguous dims).
pub const MAX_RANK: usize = 6;

/// Element type of activations and weights on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    Bf16,
}

impl DType {
    pub fn of(p: Precision) -> DType {
        match p {
            Precision::Fp32 | Precision::Tf32 => DType::F32,
            Precision::Fp16 => DType::F16,
            Precision::Bf16 => DType::Bf16,
        }
    }
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::Bf16 => 2,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::Bf16 => "bf16",
        }
    }
}

/// Where an operand lives: a storage of the arena or a constant, plus an element offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loc {
    Storage { id: usize, offset: usize },
    Const { id: usize, offset: usize },
}

impl Loc {
    fn with_offset(self, extra: usize) -> Loc {
        match self {
            Loc::Storage { id, offset } => Loc::Storage {
                id,
                offset: offset + extra,
            },
            Loc::Const { id, offset } => Loc::Const {
                id,
                offset: offset + extra,
            },
        }
    }
}

/// The device arena's layout ([`ALIGN`]-byte boundaries); an empty storage still gets its
/// own aligned bytes so that every storage has a distinct device address.
pub const ARENA_RULES: ArenaRules = ArenaRules {
    align: ALIGN,
    min_bytes: 1,
};

/// Resize's coordinate transformation and nearest-rounding codes shared with the NVRTC source
/// (`resize_src` and `resize_nearest` in kernels.rs).
pub fn resize_codes(r: &ResizeAttrs) -> (i32, i32) {
    let coord = match r.coord {
        CoordMode::HalfPixel => 0,
        CoordMode::PytorchHalfPixel => 1,
        CoordMode::AlignCorners => 2,
        CoordMode::Asymmetric => 3,
    };
    let nearest = match r.nearest {
        NearestMode::RoundPreferFloor => 0,
        NearestMode::RoundPreferCeil => 1,
        NearestMode::Floor => 2,
        NearestMode::Ceil => 3,
    };
    (coord, nearest)
}

/// Pointwise function codes shared with the NVRTC source (`act()` in kernels.rs), for a
/// result stored as `dtype`.
pub fn act_code(u: Option<Unary>, dtype: DType) -> (i32, f32, f32) {
    match u {
        None | Some(Unary::Identity) => (0, 0.0, 0.0),
        Some(Unary::Relu) => (1, 0.0, 0.0),
        Some(Unary::Relu6) => (2, 0.0, 6.0),
        Some(Unary::Clip { min, max }) => {
            (3, storable_bound(min, dtype), storable_bound(max, dtype))
        }
        Some(Unary::LeakyRelu { alpha }) => (4, alpha, 0.0),
        Some(Unary::Sigmoid) => (5, 0.0, 0.0),
        Some(Unary::HardSigmoid { alpha, beta }) => (6, alpha, beta),
        Some(Unary::HardSwish) => (7, 0.0, 0.0),
        Some(Unary::Silu) => (8, 0.0, 0.0),
        Some(Unary::Gelu) => (9, 0.0, 0.0),
        Some(Unary::GeluTanh) => (10, 0.0, 0.0),
        Some(Unary::Tanh) => (11, 0.0, 0.0),
        Some(Unary::Exp) => (12, 0.0, 0.0),
        Some(Unary::Log) => (13, 0.0, 0.0),
        Some(Unary::Sqrt) => (14, 0.0, 0.0),
        Some(Unary::Erf) => (15, 0.0, 0.0),
        Some(Unary::Neg) => (16, 0.0, 0.0),
        Some(Unary::Abs) => (17, 0.0, 0.0),
        Some(Unary::Reciprocal) => (18, 0.0, 0.0),
    }
}

/// The smallest positive fp16 value (a subnormal, 2^-24).
const F16_TINIEST: f32 = 5.960_464_5e-8;

/// A clip bound as the result can hold it: a nonzero bound too small for fp16 would be stored
/// as zero, and a lower bound that keeps a value away from zero must keep it there. PyTorch's
/// `F.normalize` exports `x / Clip(ReduceL2(x), min = 1e-12)`: at fp16 the bound became 0, and
/// a zero row (swin_v2_t's padded window tokens, whose key has no bias) gave 0/0 = NaN where
/// fp32 gives 0. Such a bound is moved out to fp16's smallest value of the same sign; bf16
/// keeps fp32's range and every bound as it is.
fn storable_bound(bound: f32, dtype: DType) -> f32 {
    if dtype == DType::F16 && bound != 0.0 && bound.abs() < F16_TINIEST {
        F16_TINIEST.copysign(bound)
    } else {
        bound
    }
}

/// Binary op codes shared with the NVRTC source.
pub fn binary_code(b: Binary) -> i32 {
    match b {
        Binary::Add => 0,
        Binary::Sub => 1,
        Binary::Mul => 2,
        Binary::Div => 3,
        Binary::Pow => 4,
        Binary::Max => 5,
        Binary::Min => 6,
    }
}

/// An iteration space of up to [`MAX_RANK`] dims with one stride set per operand (elements).
#[derive(Clone, Debug, PartialEq)]
pub struct Strided {
    pub dims: Vec<usize>,
    /// `strides[k][d]`: stride of operand k along dim d.
    pub strides: Vec<Vec<usize>>,
}

impl Strided {
    /// Merges dims that every operand walks contiguously, drops size-1 dims, and checks the rank.
    pub fn coalesce(dims: &[usize], strides: Vec<Vec<usize>>, node: &str) -> Result<Strided> {
        let keep: Vec<usize> = (0..dims.len()).filter(|&d| dims[d] != 1).collect();
        let mut od: Vec<usize> = Vec::new();
        let mut os: Vec<Vec<usize>> = vec![Vec::new(); strides.len()];
        for &d in &keep {
            if !od.is_empty() {
                let merge = strides
                    .iter()
                    .zip(&os)
                    .all(|(s, o)| o.last().copied() == Some(s[d] * dims[d]));
                if merge {
                    let n = od.len() - 1;
                    od[n] *= dims[d];
                    for (k, s) in strides.iter().enumerate() {
                        os[k][n] = s[d];
                    }
                    continue;
                }
            }
            od.push(dims[d]);
            for (k, s) in strides.iter().enumerate() {
                os[k].push(s[d]);
            }
        }
        if od.is_empty() {
            od.push(1);
            for o in &mut os {
                o.push(1);
            }
        }
        if od.len() > MAX_RANK {
            return Err(EngineError::Unsupported(format!(
                "node `{node}`: strided access of rank {} (the cuda backend indexes at most {MAX_RANK} dims)",
                od.len()
            )));
        }
        Ok(Strided {
            dims: od,
            strides: os,
        })
    }

    pub fn numel(&self) -> usize {
        self.dims.iter().product()
    }
}

/// Row-major strides of a shape.
pub fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

/// Strides of `shape` read as if broadcast to `out` (0 along broadcast dims).
pub fn broadcast_strides(shape: &[usize], out: &[usize]) -> Vec<usize> {
    strides_broadcast(shape, &contiguous_strides(shape), out)
}

/// `strides` of a tensor of `shape`, right-aligned to `out`: 0 where `out` has a leading dim
/// `shape` lacks or `shape` has extent 1.
fn strides_broadcast(shape: &[usize], strides: &[usize], out: &[usize]) -> Vec<usize> {
    let lead = out.len() - shape.len();
    (0..out.len())
        .map(|d| {
            if d < lead || shape[d - lead] == 1 {
                0
            } else {
                strides[d - lead]
            }
        })
        .collect()
}

/// Convolution through cuDNN.
#[derive(Clone, Debug, PartialEq)]
pub struct ConvStep {
    pub x: Loc,
    pub w: Loc,
    pub bias: Option<Loc>,
    pub residual: Option<Loc>,
    pub y: Loc,
    /// `[N, C, H, W]`, `[M, C/g, kh, kw]`, `[N, M, OH, OW]`.
    pub x_shape: [usize; 4],
    pub w_shape: [usize; 4],
    pub y_shape: [usize; 4],
    pub pads: [usize; 2],
    pub strides: [usize; 2],
    pub dilations: [usize; 2],
    pub groups: usize,
    pub act: Option<Unary>,
    /// x, y (and residual) stored NHWC; the filter is uploaded KRSC.
    pub nhwc: bool,
    /// Storage of the im2col matrix `[N·OH·OW, kh·kw·C]` when the convolution may run as a
    /// GEMM and needs one (NHWC, one group, not [`ConvStep::direct_gemm`]).
    pub col: Option<Loc>,
}

impl ConvStep {
    /// NHWC, one group: the convolution is a matrix product over (im2col of) x.
    pub fn gemm_capable(&self) -> bool {
        self.nhwc && self.groups == 1
    }
    /// 1×1, stride 1, no padding: x itself is the `[N·H·W, C]` matrix.
    pub fn direct_gemm(&self) -> bool {
        self.gemm_capable()
            && self.w_shape[2] == 1
            && self.w_shape[3] == 1
            && self.strides == [1, 1]
            && self.pads == [0, 0]
    }
}

/// What one step does. Operands are [`Loc`]s; sizes are in elements.
#[derive(Clone, Debug, PartialEq)]
pub enum StepKind {
    /// f32 staging buffer → activation dtype (graph inputs; at fp32 only to reorder them).
    CastIn {
        x: Loc,
        y: Loc,
        n: usize,
        /// `(C, H·W, P)` where y is written channels last: each item's `[C, H·W]` planes become
        /// `[H·W, P]` rows, as its convolutions read it (no layout copy after the cast), each
        /// pixel's C values followed by P − C zeros (P > C: an RGB stem stored as 4 channels,
        /// which cuDNN's first-layer kernel reads without padding it in two kernels of its
        /// own).
        nhwc: Option<(usize, usize, usize)>,
        /// The graph's per-tensor FakeQuant of this input, applied by the cast (channels last
        /// only); that node then has no step of its own.
        quant: Option<CastQuant>,
    },
    /// activation dtype → f32 staging buffer (graph outputs).
    CastOut {
        x: Loc,
        y: Loc,
        n: usize,
    },
    Conv(ConvStep),
    /// Depthwise convolution (groups = C, one filter per output channel) by our own kernel,
    /// with bias, residual and activation fused.
    DwConv(ConvStep),
    /// `y[M,N] = x[M,K] · w[N,K]ᵀ + b`, then `act` (cuBLASLt, bias fused as an epilogue).
    Linear(LinearStep),
    /// Batched `y[b] = a[b] · op(bm[b])` (row-major) through cuBLASLt; `b_trans` = bm holds
    /// `[.., N, K]` (a transpose folded into the matmul).
    MatMul(MatMulStep),
    /// Fused self-attention `y = softmax(alpha · q·kᵀ) · v · out_scale` for each (image, head),
    /// head dim `dim`: q, k and v read in place and y written through (image, head, row)
    /// strides (the last dim contiguous), so the QKV split and the head merge cost nothing.
    Attention(AttentionStep),
    /// `y = act(x · scale[c] + bias[c] + res)` elementwise, `c = (i / inner) % channels`.
    Pointwise {
        x: Loc,
        y: Loc,
        scale: Option<Loc>,
        bias: Option<Loc>,
        residual: Option<Loc>,
        n: usize,
        channels: usize,
        inner: usize,
        act: Option<Unary>,
    },
    Binary {
        a: Loc,
        b: Loc,
        y: Loc,
        op: Binary,
        /// operands: 0 = y (contiguous), 1 = a, 2 = b.
        space: Strided,
    },
    /// `y[...] = x[...]` over a strided space (transpose, concat, slice, gather, expand);
    /// operands: 0 = y, 1 = x.
    Copy {
        x: Loc,
        y: Loc,
        space: Strided,
    },
    LayerNorm(LayerNormStep),
    Softmax(SoftmaxStep),
    Pool(PoolStep),
    /// Mean over HW of an NHWC `[N, H, W, C]` tensor → `[N, C]`.
    ChanMean {
        x: Loc,
        y: Loc,
        n: usize,
        c: usize,
        hw: usize,
    },
    /// Reduction (`kind`) over `hw` contiguous elements for each of `rows` rows.
    RowReduce {
        x: Loc,
        y: Loc,
        rows: usize,
        hw: usize,
        kind: ReduceKind,
    },
    /// ONNX Resize of H and W (nearest or bilinear), NCHW or NHWC storage alike; the codes are
    /// [`resize_codes`]'s, `scales` [`ResizeAttrs::coord_scales`]'s.
    Resize(ResizeStep),
    /// PyTorch AdaptiveAvgPool2d.
    AdaptivePool {
        x: Loc,
        y: Loc,
        x_shape: [usize; 4],
        out_hw: [usize; 2],
    },
    /// `y = DequantizeLinear(QuantizeLinear(x))` (a QDQ model's activation pair), computed in
    /// f32 as `isolane_engine::quant` does.
    FakeQuant(FakeQuantStep),
    /// A quantized matrix product on the int8 (or fp8) tensor cores (`crate::int8`): quantize
    /// x, one cuBLASLt GEMM, one dequantizing epilogue.
    QuantGemm(Box<QuantGemmStep>),
}

/// A [`StepKind::QuantGemm`]: `y[M, N] = act(acc · scale[n] + bias[n] + residual)` with
/// `acc = q(x)[M, K] · w[N, K]ᵀ`, where `q(x) = sat(round(x / x_scale))` on int8's or e4m3's
/// grid, `acc` an exact int32 (int8) or an f32 (fp8) sum, and `scale[n] = x_scale · w_scale[n]`.
///
/// Run as (1) the im2col of a convolution that is not a direct GEMM (`conv`, into `col`, in
/// the activation dtype), (2) the quantize kernel (`x` or `col` → `xq`, one byte each),
/// (3) cuBLASLt (`xq`, `w` → `acc`), (4) the epilogue kernel (`acc` → `y`).
#[derive(Clone, Debug, PartialEq)]
pub struct QuantGemmStep {
    /// [`QuantType::Int8`] or [`QuantType::Float8E4M3Fn`].
    pub qtype: QuantType,
    /// The activations before quantization: `[M, K]` rows (a Linear's input, a direct 1×1
    /// convolution's NHWC input), or the convolution's NHWC input that `conv` im2cols.
    pub x: Loc,
    /// `x` is already quantized (one byte per element, NHWC or rows): its producer's epilogue
    /// wrote it ([`QuantGemmStep::y_scale`]). No quantize kernel runs; an im2col copies bytes
    /// straight into `xq`.
    pub x_quantized: bool,
    /// The convolution's geometry when x is im2col'ed first (`col` is then its matrix: in
    /// the activation dtype, or `xq` itself when `x_quantized`).
    pub conv: Option<ConvStep>,
    /// Whether `xq` was quantized by an earlier QuantGemm step from the same `x` (then this
    /// step runs only the GEMM and the epilogue).
    pub xq_ready: bool,
    /// Quantized `[M, K]` (one byte per element; storage offsets count bytes, `offset` 0).
    pub xq: Loc,
    /// Quantized weight `[N, K]`, a constant in [`ConstRepr::I8`] or [`ConstRepr::E4M3`]
    /// (a convolution's rows in `[kh, kw, C]` order, its im2col's).
    pub w: Loc,
    /// The accumulator `[M, N]`: int32 (int8) or f32 (fp8).
    pub acc: Loc,
    /// `[N]` f32 constant ([`ConstRepr::F32`]): `x_scale · w_scale[n]`.
    pub scale: Loc,
    pub bias: Option<Loc>,
    pub residual: Option<Loc>,
    /// The residual is bytes of `qtype` at this scale (a skip the model quantizes,
    /// `isolane_engine::calibrate`): its producer's epilogue, or a direct GEMM's rows, made
    /// them. Every path reads them as `byte · scale` in f32 (the float step dequantizes them
    /// into [`QuantFloat::residual`] first).
    pub residual_scale: Option<f32>,
    pub y: Loc,
    /// The epilogue quantizes its result by this scale (to `qtype`, one byte per element)
    /// for the next GEMMs, which alone read it, instead of storing it in the activation dtype.
    pub y_scale: Option<f32>,
    /// `y` (in the activation dtype, which other steps read: a residual) also quantized by
    /// this scale into these bytes, which the next direct quantized GEMMs read as their rows
    /// (`xq_ready`) instead of quantizing `y` themselves: resnet's block output. Every path
    /// writes them (a quantize kernel after it; cuDNN's fused graph as its second output where
    /// cuDNN plans that).
    pub y_copy: Option<(Loc, f32)>,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub x_scale: f32,
    pub act: Option<Unary>,
    /// The other ways this product may run, timed against the int8 GEMM at build so that the
    /// faster is kept per layer (docs/cuda.md "int8 and fp8": the timed choice).
    pub alt: Option<Box<QuantAlternatives>>,
}

/// The alternatives of a [`QuantGemmStep`] to its im2col + quantize + GEMM + epilogue:
/// `(int8 GEMM, cuDNN's legacy int8 convolution, float step, cuDNN's fused graph, the int8
/// GEMM with x quantized into `xb` before an im2col of bytes into `xq`)` are candidates 0 to 4
/// of the build's timed choice, in that order whether or not each is built (a saved plan
/// names the index).
#[derive(Clone, Debug, PartialEq)]
pub struct QuantAlternatives {
    /// cuDNN's implicit-GEMM convolution of the quantized bytes (C and N multiples of 4): `x`
    /// (NHWC bytes: x quantized whole into `xb` by the quantize kernel, `xb` being `xq` for a
    /// direct 1×1; the bytes an earlier step made, `xq_ready`; or the producer's bytes
    /// themselves when `x_quantized`) convolved
    /// with the quantized KRSC filter (`QuantGemmStep::w`). The legacy API (int8 only) writes
    /// `y` = `QuantGemmStep::acc` as f32 (the exact int32 sums converted), then the step's
    /// epilogue runs on that f32 accumulator; the graph API (int8 or e4m3, where the step's
    /// output is not bytes and its activation none or ReLU) multiplies by the per-channel
    /// scale, adds bias and residual and applies ReLU inside the graph, writing the step's `y`.
    /// No im2col, no int32 round-trip.
    pub dnn_conv: Option<ConvStep>,
    /// Where `dnn_conv` reads x quantized; `None` when `x_quantized` (x itself).
    pub xb: Option<Loc>,
    /// What cuDNN's fused quantized graph reads besides `dnn_conv`'s x and w; `None` where
    /// no graph is planned (no `dnn_conv`, an activation other than none or ReLU, a computed
    /// bias).
    pub graph: Option<QuantGraphConsts>,
    /// The float step that keeps the model's fake-quant semantics.
    pub float: QuantFloat,
}

/// The constants of cuDNN's fused quantized convolution graph (candidate 3): `y = q(act(acc ·
/// scale[c] + bias[c] + residual) · y_inv[c])`, `q` the output's quantization where the step's
/// output is bytes for the next quantized convolution (`QuantGemmStep::y_scale`), so that a
/// chain of them never goes back to floats and needs no quantize kernel between them.
#[derive(Clone, Debug, PartialEq)]
pub struct QuantGraphConsts {
    /// The bias as f32 (`[N]`, [`ConstRepr::F32`]), where the product has one.
    pub bias: Option<Loc>,
    /// `1 / y_scale` for every output channel (`[N]` f32), where the output is bytes.
    pub y_inv: Option<Loc>,
    /// `1 / s` for every output channel (`[N]` f32), where the output is quantized as well
    /// by scale `s` (`QuantGemmStep::y_copy`): the graph's second output.
    pub copy_inv: Option<Loc>,
    /// Where the residual is bytes of scale `r` ([`QuantGemmStep::residual_scale`]): the
    /// graph adds them as read, so its constants are the step's divided by `r` (`scale / r`
    /// per channel here, the bias above too), and its last multiply, `r / y_scale` (bytes
    /// out) or `r` (floats out) per channel in `y_inv`, scales back (ReLU commutes with it).
    pub scale: Option<Loc>,
}

/// The float form of a quantized product, as the fake-quant steps compute it: x's values
/// `dequantize(quantize(x))` in the activation dtype (`xf`: by the fake-quant kernel from x's
/// floats, or by the dequantize kernel from the producer's bytes), the ordinary Conv or Linear
/// step on them with the dequantized weights, its result quantized into `y` when the step's
/// output is bytes (`yf` then holds the float result first).
#[derive(Clone, Debug, PartialEq)]
pub struct QuantFloat {
    pub xf: Loc,
    /// Elements of x (and `xf`).
    pub x_n: usize,
    /// [`StepKind::Conv`] or [`StepKind::Linear`], reading `xf`, writing `yf` or `y`.
    pub product: StepKind,
    pub yf: Option<Loc>,
    /// Later steps read this step's `xq` (`xq_ready`): the float path fills it too.
    pub fills_xq: bool,
    /// Where the residual is bytes ([`QuantGemmStep::residual_scale`]): the float storage
    /// the dequantize kernel fills from them, which `product` reads as its residual.
    pub residual: Option<Loc>,
}

impl QuantFloat {
    /// The product reading `x` in place of `xf`: x itself, unquantized (`quant_float_plain`;
    /// the two share shape and layout, the product was planned for either).
    pub fn product_on(&self, x: Loc) -> StepKind {
        match &self.product {
            StepKind::Conv(c) => StepKind::Conv(ConvStep { x, ..c.clone() }),
            StepKind::Linear(l) => StepKind::Linear(LinearStep { x, ..l.clone() }),
            other => other.clone(),
        }
    }
}

/// How a constant is stored on the device when not in the activation dtype.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConstRepr {
    /// Exact integers in [−128, 127], one byte each.
    I8,
    /// Values on float8 e4m3fn's grid, one byte each ([`crate::int8::e4m3_bits`]).
    E4M3,
    /// f32 whatever the activation dtype (scales that f16 would round or flush).
    F32,
}

impl ConstRepr {
    pub fn size(self) -> usize {
        match self {
            ConstRepr::I8 | ConstRepr::E4M3 => 1,
            ConstRepr::F32 => 4,
        }
    }
}

/// A [`StepKind::FakeQuant`]: element `i` uses the scale and zero point of channel
/// `(i / inner) % channels`, read from the constants `params` (scales, zero points), or
/// `scale` and `zero_point` (f32 kernel arguments, exact at every precision) when there is one
/// channel.
#[derive(Clone, Debug, PartialEq)]
pub struct FakeQuantStep {
    pub x: Loc,
    pub y: Loc,
    pub n: usize,
    pub channels: usize,
    pub inner: usize,
    pub params: Option<[Loc; 2]>,
    pub scale: f32,
    pub zero_point: f32,
    pub qtype: QuantType,
    pub saturate: bool,
}

/// A per-tensor fake quantization done by an input's cast ([`StepKind::CastIn`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CastQuant {
    pub scale: f32,
    pub zero_point: f32,
    pub qtype: QuantType,
    pub saturate: bool,
}

impl StepKind {
    /// A [`StepKind::Pointwise`] pass over `n` values with nothing per channel: only an
    /// optional residual added and an optional activation.
    fn elementwise(x: Loc, y: Loc, n: usize, residual: Option<Loc>, act: Option<Unary>) -> Self {
        StepKind::Pointwise {
            x,
            y,
            scale: None,
            bias: None,
            residual,
            n,
            channels: 1,
            inner: 1,
            act,
        }
    }
}

/// One planned step: the node it came from (for messages) and what to do.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    pub name: String,
    pub kind: StepKind,
}

/// A graph input or output: its f32 staging storage and shape.
#[derive(Clone, Debug, PartialEq)]
pub struct Io {
    pub staging: usize,
    pub shape: Vec<usize>,
}

/// Where a value of the planned graph can be read once computed (the plan check compares it
/// with the CPU reference's): `loc` walked with `strides` over `shape`, times `scale` (a
/// scalar multiplication aliased onto its input is applied by the consumer, not stored).
#[derive(Clone, Debug, PartialEq)]
pub struct Probe {
    /// The value (of the optimised graph the plan was made from).
    pub value: usize,
    /// The node that computes it and that node's op.
    pub node: String,
    pub op: &'static str,
    pub loc: Loc,
    pub shape: Vec<usize>,
    pub strides: Vec<usize>,
    pub scale: f32,
    /// How many steps have run when the value is complete: read it right then, before the
    /// next step (its storage may be reused once its last consumer has run).
    pub ready: usize,
}

impl Probe {
    /// Elements from `loc` to the last one the value touches (what to read back).
    pub fn span(&self) -> usize {
        1 + self
            .shape
            .iter()
            .zip(&self.strides)
            .map(|(d, s)| d.saturating_sub(1) * s)
            .sum::<usize>()
    }

    /// The value in row-major order from the `span()` elements read at `loc`.
    pub fn gather(&self, raw: &[f32]) -> Vec<f32> {
        let n: usize = self.shape.iter().product();
        let mut out = Vec::with_capacity(n);
        let mut idx = vec![0usize; self.shape.len()];
        for _ in 0..n {
            let at: usize = idx.iter().zip(&self.strides).map(|(i, s)| i * s).sum();
            out.push(raw.get(at).copied().unwrap_or(f32::NAN) * self.scale);
            for d in (0..idx.len()).rev() {
                idx[d] += 1;
                if idx[d] < self.shape[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
        out
    }
}

/// The whole plan.
#[derive(Clone, Debug)]
pub struct Plan {
    pub dtype: DType,
    pub precision: Precision,
    pub steps: Vec<Step>,
    pub storages: Vec<Storage>,
    pub arena_bytes: usize,
    /// Constants referenced by steps (converted to `dtype` at upload).
    pub consts: Vec<Arc<Tensor>>,
    /// Constants used as channels-last convolution filters: uploaded `[M, kh, kw, C/g]`.
    pub filter_nhwc: Vec<usize>,
    /// Constants used as channels-last depthwise filters: uploaded `[kh, kw, M]`.
    pub filter_dw_hwc: Vec<usize>,
    pub inputs: Vec<Io>,
    pub outputs: Vec<Io>,
    /// Every value a step computes that can be read back, in node order (see [`Probe`]).
    pub probes: Vec<Probe>,
    /// Constants stored otherwise than in `dtype` (the quantized GEMMs' weights and scales).
    pub const_repr: Vec<(usize, ConstRepr)>,
}

impl Plan {
    /// The weights buffer as uploaded: every constant in the device dtype at its
    /// [`Plan::const_layout`] offset, convolution filters in the layout their step reads.
    pub fn weights_host(&self) -> Vec<u8> {
        use crate::convert::push_converted;
        let (offs, bytes) = self.const_layout();
        let mut host = Vec::with_capacity(bytes);
        for (i, (c, &off)) in self.consts.iter().zip(&offs).enumerate() {
            host.resize(off, 0);
            if let Some(r) = self.repr_of(i) {
                match r {
                    // Exact integers in [−128, 127] (the planner made them so).
                    ConstRepr::I8 => host.extend(c.data.iter().map(|&v| v as i8 as u8)),
                    ConstRepr::E4M3 => {
                        host.extend(c.data.iter().map(|&v| crate::int8::e4m3_bits(v)))
                    }
                    ConstRepr::F32 => host.extend(c.data.iter().flat_map(|v| v.to_le_bytes())),
                }
            } else if self.filter_nhwc.contains(&i) && c.shape.len() == 4 {
                // [M, C/g, kh, kw] → [M, kh, kw, C/g] (cuDNN's NHWC filter layout, and the
                // column order of our im2col).
                let [m, cg, kh, kw] = [c.shape[0], c.shape[1], c.shape[2], c.shape[3]];
                let mut t = vec![0f32; c.data.len()];
                for o in 0..m {
                    for ci in 0..cg {
                        for a in 0..kh {
                            for b in 0..kw {
                                t[((o * kh + a) * kw + b) * cg + ci] =
                                    c.data[((o * cg + ci) * kh + a) * kw + b];
                            }
                        }
                    }
                }
                push_converted(&mut host, &t, self.dtype);
            } else if self.filter_dw_hwc.contains(&i) && c.shape.len() == 4 {
                // [M, 1, kh, kw] → [kh, kw, M]: the depthwise kernels read it coalesced.
                let [m, _, kh, kw] = [c.shape[0], c.shape[1], c.shape[2], c.shape[3]];
                let mut t = vec![0f32; c.data.len()];
                for o in 0..m {
                    for k in 0..kh * kw {
                        t[k * m + o] = c.data[o * kh * kw + k];
                    }
                }
                push_converted(&mut host, &t, self.dtype);
            } else {
                push_converted(&mut host, &c.data, self.dtype);
            }
        }
        host.resize(bytes, 0);
        host
    }

    /// Bytes of all constants in the device dtype, each aligned to [`ALIGN`].
    pub fn const_layout(&self) -> (Vec<usize>, usize) {
        let mut offs = Vec::with_capacity(self.consts.len());
        let mut at = 0;
        for (i, c) in self.consts.iter().enumerate() {
            offs.push(at);
            let es = self.repr_of(i).map_or(self.dtype.size(), ConstRepr::size);
            at += align(c.numel() * es);
        }
        (offs, at)
    }

    /// How constant `i` is stored, when not in `dtype`.
    pub fn repr_of(&self, i: usize) -> Option<ConstRepr> {
        self.const_repr
            .iter()
            .find(|(c, _)| *c == i)
            .map(|&(_, r)| r)
    }
}

pub fn align(n: usize) -> usize {
    n.div_ceil(ALIGN) * ALIGN
}

fn unsupported(node: &str, what: impl std::fmt::Display) -> EngineError {
    EngineError::Unsupported(format!("cuda backend: node `{node}`: {what}"))
}

fn four(s: &[usize], node: &str) -> Result<[usize; 4]> {
    s.try_into()
        .map_err(|_| unsupported(node, format!("expected a 4-D tensor, got {s:?}")))
}

/// Planning options.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanOptions {
    /// Store convolution activations channels-last (NHWC): cuDNN's tensor-core kernels want
    /// it, and ConvNeXt's permutes around its LayerNorms become free views.
    pub channels_last: bool,
    /// Plan `softmax(q·kᵀ)·v` with head dim [`crate::kernels::ATTN_HEAD_DIM`] as one
    /// [`StepKind::Attention`] (the fused tensor-core kernel: f16/bf16 on sm_80 and newer;
    /// the caller decides).
    pub fused_attention: bool,
}

impl Default for PlanOptions {
    fn default() -> Self {
        PlanOptions {
            channels_last: true,
            fused_attention: false,
        }
    }
}

/// Logical strides of a value as stored: NCHW order, NHWC memory when `nhwc`.
pub fn phys_strides(shape: &[usize], nhwc: bool) -> Vec<usize> {
    if nhwc && shape.len() == 4 {
        let [_, c, h, w] = [shape[0], shape[1], shape[2], shape[3]];
        vec![h * w * c, 1, w * c, c]
    } else {
        contiguous_strides(shape)
    }
}

/// [`phys_strides`] broadcast to `out` (0 along broadcast dims).
fn phys_broadcast(shape: &[usize], nhwc: bool, out: &[usize]) -> Vec<usize> {
    strides_broadcast(shape, &phys_strides(shape, nhwc), out)
}

struct Planner<'g> {
    g: &'g Graph,
    opts: PlanOptions,
    es: usize,
    shapes: Vec<Vec<usize>>,
    loc: Vec<Option<Loc>>,
    nhwc: Vec<bool>,
    plain_of: Vec<Option<Loc>>,
    nhwc_of: Vec<Option<Loc>>,
    /// Value → the channel count it is stored with, NHWC, past its own channels zeros
    /// ([`Planner::stem_channel_pad`]); its `vstrides` describe that storage.
    cpad: Vec<Option<usize>>,
    storages: Vec<Storage>,
    steps: Vec<Step>,
    consts: Vec<Arc<Tensor>>,
    const_of: Vec<Option<usize>>,
    filter_nhwc: Vec<usize>,
    filter_dw_hwc: Vec<usize>,
    /// Value → (index in `steps`, time) of the Linear step that wrote it.
    linear_of: Vec<Option<(usize, usize)>>,
    /// Time at which a value got its storage (0 for inputs and constants).
    def_t: Vec<usize>,
    /// A scalar a sole MatMul consumer applies as alpha (the value aliases the unscaled one).
    alpha_of: Vec<f32>,
    /// A per-channel scaling deferred to the sole Add that consumes it: (x, scale, channels).
    pending_scale: Vec<Option<(Loc, Loc, usize)>>,
    /// Strides of a value that is a non-contiguous view (a transpose or split read in place
    /// by a stride-aware consumer); `None`: row-major (or NHWC when `nhwc`).
    vstrides: Vec<Option<Vec<usize>>>,
    probes: Vec<Probe>,
    t: usize,
    /// Node → the quantized GEMM it runs as (`crate::int8::classify`), when it does.
    quant: Vec<Option<crate::int8::Int8Gemm>>,
    /// Value → its quantized `[M, K]` rows already made (location, scale, type, whether the
    /// rows are NHWC pixels or the value's own last axis), for a second direct GEMM of the same
    /// activations.
    quantized_of: Vec<Option<(Loc, f32, QuantType, bool)>>,
    const_repr: Vec<(usize, ConstRepr)>,
    /// Node → it is a FakeQuant that emits nothing (`find_quant_gemms`).
    fq_skip: Vec<bool>,
    /// Node → it is a FakeQuant of a graph input that the input's cast applies
    /// ([`Planner::cast_fake_quant`]).
    fq_in_cast: Vec<bool>,
}

impl Planner<'_> {
    fn new_storage(&mut self, bytes: usize) -> usize {
        self.storages.push(Storage::new(bytes, self.t));
        self.storages.len() - 1
    }
    fn touch(&mut self, l: Loc) {
        if let Loc::Storage { id, .. } = l {
            self.storages[id].last = self.storages[id].last.max(self.t);
        }
    }
    fn numel(&self, v: usize) -> usize {
        self.shapes[v].iter().product()
    }
    /// The operand of value `v` as stored (constants registered on first use).
    fn raw(&mut self, v: usize, node: &str) -> Result<Loc> {
        if let ValueKind::Constant(tensor) = &self.g.values[v].kind {
            let id = match self.const_of[v] {
                Some(id) => id,
                None => {
                    self.consts.push(tensor.clone());
                    self.const_of[v] = Some(self.consts.len() - 1);
                    self.consts.len() - 1
                }
            };
            return Ok(Loc::Const { id, offset: 0 });
        }
        let l = self.loc[v]
            .ok_or_else(|| unsupported(node, format!("input value {v} has no storage")))?;
        self.touch(l);
        Ok(l)
    }
    /// Strides of `v` as stored.
    fn strides(&self, v: usize) -> Vec<usize> {
        match &self.vstrides[v] {
            Some(s) => s.clone(),
            None => phys_strides(&self.shapes[v], self.nhwc[v]),
        }
    }
    /// `v` in plain row-major layout (a conversion copy when it is stored NHWC or strided).
    fn plain(&mut self, v: usize, node: &str) -> Result<Loc> {
        let l = self.raw(v, node)?;
        if let Some(st) = self.vstrides[v].clone() {
            if let Some(p) = self.plain_of[v] {
                self.touch(p);
                return Ok(p);
            }
            let contiguous = contiguous_strides(&self.shapes[v]);
            let y = self.layout_copy(v, l, node, "contiguous copy", [contiguous, st])?;
            self.plain_of[v] = Some(y);
            return Ok(y);
        }
        if !self.nhwc[v] {
            return Ok(l);
        }
        if let Some(p) = self.plain_of[v] {
            self.touch(p);
            return Ok(p);
        }
        let shape = &self.shapes[v];
        let strides = [contiguous_strides(shape), phys_strides(shape, true)];
        let y = self.layout_copy(v, l, node, "to NCHW", strides)?;
        self.plain_of[v] = Some(y);
        Ok(y)
    }
    /// `v` stored NHWC (a conversion copy when it is plain); only for 4-D values.
    fn channels_last(&mut self, v: usize, node: &str) -> Result<Loc> {
        let l = self.raw(v, node)?;
        let shape = self.shapes[v].clone();
        // A view (`vstrides`) is NHWC only when its strides say so.
        let viewed = self.vstrides[v].is_some();
        let nhwc = phys_strides(&shape, true);
        if self.strides(v) == nhwc || (!viewed && (shape[2] * shape[3] == 1 || shape[1] == 1)) {
            return Ok(l);
        }
        if let Some(p) = self.nhwc_of[v] {
            self.touch(p);
            return Ok(p);
        }
        let strides = [nhwc, self.strides(v)];
        let y = self.layout_copy(v, l, node, "to NHWC", strides)?;
        self.nhwc_of[v] = Some(y);
        Ok(y)
    }
    /// A copy of value `v` (at `x`) into a fresh storage, in the layout of
    /// `[y_strides, x_strides]`; the step is named after `node` and `what`.
    fn layout_copy(
        &mut self,
        v: usize,
        x: Loc,
        node: &str,
        what: &str,
        [y_strides, x_strides]: [Vec<usize>; 2],
    ) -> Result<Loc> {
        let s = self.new_storage(self.numel(v) * self.es);
        let y = Loc::Storage { id: s, offset: 0 };
        let space = Strided::coalesce(&self.shapes[v], vec![y_strides, x_strides], node)?;
        self.push(&format!("{node} ({what})"), StepKind::Copy { x, y, space });
        Ok(y)
    }
    /// A fresh storage for output `v` held only as bytes (quantized at `s`, type `t`; rows NHWC
    /// when `nhwc`) for the quantized GEMMs that read it: no float storage, so no probe.
    fn bytes_output(&mut self, v: usize, s: f32, t: QuantType, nhwc: bool) -> Loc {
        let l = Loc::Storage {
            id: self.new_storage(self.numel(v)),
            offset: 0,
        };
        self.quantized_of[v] = Some((l, s, t, nhwc));
        self.def_t[v] = self.t;
        l
    }
    /// A fresh storage for output `v`, NHWC when asked and it makes a difference.
    fn output(&mut self, v: usize, nhwc: bool) -> Loc {
        let s = self.new_storage(self.numel(v) * self.es);
        let sh = &self.shapes[v];
        self.nhwc[v] = nhwc && sh.len() == 4 && sh[2] * sh[3] > 1 && sh[1] > 1;
        let l = Loc::Storage { id: s, offset: 0 };
        self.loc[v] = Some(l);
        self.def_t[v] = self.t;
        l
    }
    /// Value `v` stored at `l` in `like`'s layout (NHWC, strides, padded channels), from now.
    fn store_like(&mut self, v: usize, like: usize, l: Loc) {
        self.loc[v] = Some(l);
        self.nhwc[v] = self.nhwc[like];
        self.vstrides[v] = self.vstrides[like].clone();
        self.cpad[v] = self.cpad[like];
        self.def_t[v] = self.t;
    }
    /// Probes for the outputs of `node`, which has just been planned: where each can be read
    /// as the steps planned so far leave it (a value made plain later gets a new location,
    /// but this one is the value's at this time).
    fn record_probes(&mut self, node: &isolane_engine::ir::Node) {
        for &o in &node.outputs {
            let Some(loc @ Loc::Storage { .. }) = self.loc[o] else {
                continue;
            };
            if self.pending_scale[o].is_some() {
                continue;
            }
            self.probes.push(Probe {
                value: o,
                node: node.name.clone(),
                op: node.op.name(),
                loc,
                shape: self.shapes[o].clone(),
                strides: self.strides(o),
                scale: self.alpha_of[o],
                ready: self.steps.len(),
            });
        }
    }
    /// A constant the plan computed itself (not a graph value).
    fn new_const(&mut self, t: Tensor) -> Loc {
        self.consts.push(Arc::new(t));
        Loc::Const {
            id: self.consts.len() - 1,
            offset: 0,
        }
    }
    fn push(&mut self, name: &str, kind: StepKind) {
        self.steps.push(Step {
            name: name.to_string(),
            kind,
        });
    }
    /// A copy of `shape` elements read from `x` at `x_strides` and written to `y` at
    /// `y_strides` (element strides).
    fn push_copy(
        &mut self,
        name: &str,
        [x, y]: [Loc; 2],
        shape: &[usize],
        [y_strides, x_strides]: [Vec<usize>; 2],
    ) -> Result<()> {
        let space = Strided::coalesce(shape, vec![y_strides, x_strides], name)?;
        self.push(name, StepKind::Copy { x, y, space });
        Ok(())
    }
}

/// What the lowering of one node works with: the node, its index and its concrete shapes.
struct NodeCtx<'a> {
    n: &'a Node,
    ni: usize,
    name: &'a str,
    in_shapes: Vec<Vec<usize>>,
    outs: Vec<usize>,
    out_shape: Vec<usize>,
    /// The first input.
    x0: usize,
}

impl<'a> NodeCtx<'a> {
    fn new(shapes: &[Vec<usize>], ni: usize, n: &'a Node) -> NodeCtx<'a> {
        NodeCtx {
            n,
            ni,
            name: n.name.as_str(),
            in_shapes: n.inputs.iter().map(|&i| shapes[i].clone()).collect(),
            outs: n.outputs.clone(),
            out_shape: shapes[n.outputs[0]].clone(),
            x0: n.inputs[0],
        }
    }

    /// Checks the planned shapes against the IR (a planning bug must not reach the GPU).
    fn check_shapes(&self, batch: usize) -> Result<()> {
        let refs: Vec<&[usize]> = self.in_shapes.iter().map(|s| s.as_slice()).collect();
        let inferred = infer_node(self.n, &refs, batch)?;
        if inferred[0] != self.out_shape {
            return Err(unsupported(self.name, "shape disagreement in planning"));
        }
        Ok(())
    }
}

/// What lowering a node did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lowered {
    /// It planned the node's own steps (or aliased its output); its shapes are checked.
    Steps,
    /// It folded the node into another step (a scale into a matmul's alpha, a per-channel
    /// scale into the following add, an add into a Linear's C): nothing of its own to check.
    Folded,
}

/// What the pattern passes found in the graph before lowering: use counts, the transposes
/// folded into matmuls, scaled keys, and the attention blocks fused into one step.
struct Patterns {
    /// Value → number of readers (graph outputs count as one).
    users: Vec<usize>,
    /// Value → its only reading node, when it has exactly one.
    sole_user: Vec<Option<usize>>,
    /// Value → every reading node.
    users_of: Vec<Vec<usize>>,
    is_output: Vec<bool>,
    /// Transpose output → its input, for transposes folded into their MatMul (transpose folding).
    folded_t: Vec<Option<usize>>,
    /// Value → the key a scores MatMul reads transposed from it (scale folding of `kᵀ · c`).
    key_of: Vec<Option<usize>>,
    /// Nodes that emit nothing because a later node's fused Attention step covers them.
    attn_skip: Vec<bool>,
    /// Node (the context MatMul) → the scores MatMul of its fused Attention step.
    attn_at: Vec<Option<usize>>,
}

impl Patterns {
    /// Runs the pattern passes over `g` (shapes at the planned batch).
    fn find(g: &Graph, shapes: &[Vec<usize>], opts: PlanOptions) -> Patterns {
        let nv = g.values.len();
        let users = count_users(g);
        let sole_user = sole_users(g, &users);
        let mut users_of: Vec<Vec<usize>> = vec![Vec::new(); nv];
        for (ni, n) in g.nodes.iter().enumerate() {
            for &i in &n.inputs {
                users_of[i].push(ni);
            }
        }
        let is_output: Vec<bool> = (0..nv).map(|v| g.outputs.contains(&v)).collect();
        let folded_t = fold_transposes_into_matmuls(g, &users);
        let key_of: Vec<Option<usize>> = (0..nv)
            .map(|v| scaled_key_source(g, shapes, &users, &folded_t, v))
            .collect();
        let mut pat = Patterns {
            users,
            sole_user,
            users_of,
            is_output,
            folded_t,
            key_of,
            attn_skip: vec![false; g.nodes.len()],
            attn_at: vec![None; g.nodes.len()],
        };
        if opts.fused_attention {
            pat.fuse_attention(g, shapes);
        }
        pat
    }

    /// Whether node `ni` reads strided views in place (see `Planner::vstrides`).
    fn stride_aware(&self, g: &Graph, ni: usize) -> bool {
        let n = &g.nodes[ni];
        match &n.op {
            Op::Split { .. } | Op::Squeeze { .. } | Op::Transpose { .. } | Op::MatMul => true,
            Op::Binary(Binary::Mul) => {
                let scalar = |v: usize| matches!(&g.values[v].kind, ValueKind::Constant(t) if t.numel() == 1);
                (scalar(n.inputs[0]) || scalar(n.inputs[1]))
                    && self.sole_user[n.outputs[0]]
                        .is_some_and(|u| matches!(g.nodes[u].op, Op::MatMul))
            }
            _ => false,
        }
    }

    /// Fused attention: MatMul(q, kᵀ) → Softmax(last axis) → MatMul(·, v), each the sole user
    /// of the previous, q, k and v of one shape [B, H, S, d] (or [BH, S, d]) with d the
    /// kernel's. The first two emit nothing; the last emits one Attention step (`attn_at`: the
    /// scores node).
    fn fuse_attention(&mut self, g: &Graph, shapes: &[Vec<usize>]) {
        for (ni, n) in g.nodes.iter().enumerate() {
            if !matches!(n.op, Op::MatMul) || n.inputs.len() != 2 {
                continue;
            }
            let Some(kv) = self.key_of[n.inputs[1]] else {
                continue;
            };
            let s_v = n.outputs[0];
            let Some(si) = self.sole_user[s_v] else {
                continue;
            };
            let sm = &g.nodes[si];
            let r = shapes[s_v].len();
            let Op::Softmax { axis } = sm.op else {
                continue;
            };
            if norm_axis(axis, r) != Some(r.wrapping_sub(1)) || self.is_output[s_v] {
                continue;
            }
            let p_v = sm.outputs[0];
            let Some(ci) = self.sole_user[p_v] else {
                continue;
            };
            let cn = &g.nodes[ci];
            if !matches!(cn.op, Op::MatMul) || cn.inputs[0] != p_v || self.is_output[p_v] {
                continue;
            }
            let (qs, ks, vs) = (&shapes[n.inputs[0]], &shapes[kv], &shapes[cn.inputs[1]]);
            if (qs.len() == 3 || qs.len() == 4)
                && qs == ks
                && qs == vs
                && qs[qs.len() - 1] == crate::kernels::ATTN_HEAD_DIM
            {
                self.attn_skip[ni] = true;
                self.attn_skip[si] = true;
                self.attn_at[ci] = Some(ni);
            }
        }
    }
}

/// Value → number of reading nodes, plus one for each graph output.
fn count_users(g: &Graph) -> Vec<usize> {
    let mut users = vec![0usize; g.values.len()];
    for n in &g.nodes {
        for &i in &n.inputs {
            users[i] += 1;
        }
    }
    for &o in &g.outputs {
        users[o] += 1;
    }
    users
}

/// Value → its only reading node, where `users` says it has one.
fn sole_users(g: &Graph, users: &[usize]) -> Vec<Option<usize>> {
    let mut sole_user: Vec<Option<usize>> = vec![None; g.values.len()];
    for (ni, n) in g.nodes.iter().enumerate() {
        for &i in &n.inputs {
            if users[i] == 1 {
                sole_user[i] = Some(ni);
            }
        }
    }
    sole_user
}

/// Whether `perm` swaps the last two dims and keeps the others.
fn swaps_last_two(perm: &[usize]) -> bool {
    let r = perm.len();
    r >= 2
        && perm[r - 2] == r - 1
        && perm[r - 1] == r - 2
        && perm[..r - 2].iter().enumerate().all(|(i, &q)| q == i)
}

/// Transpose folding: a transpose swapping the last two dims whose only user is a MatMul's
/// second operand is folded into that matmul (cuBLASLt transposes for free). Returns
/// transpose output → transpose input for the folded ones.
fn fold_transposes_into_matmuls(g: &Graph, users: &[usize]) -> Vec<Option<usize>> {
    let mut folded_t: Vec<Option<usize>> = vec![None; g.values.len()];
    for n in &g.nodes {
        if let Op::Transpose { perm } = &n.op {
            if swaps_last_two(perm) && users[n.outputs[0]] == 1 {
                let feeds_matmul_b = g
                    .nodes
                    .iter()
                    .any(|m| matches!(m.op, Op::MatMul) && m.inputs[1] == n.outputs[0]);
                if feeds_matmul_b {
                    folded_t[n.outputs[0]] = Some(n.inputs[0]);
                }
            }
        }
    }
    folded_t
}

/// Scale folding of a transposed key: the key a scores MatMul reads transposed from its
/// second operand `v`, through a folded transpose (`q · kᵀ`), or through a scalar
/// multiplication of a last-two-dims transpose that has no other user (`q · (kᵀ · c)`,
/// torch.onnx's scaled-dot-product export): that transpose is a free view and the
/// multiplication an alpha (`operand_alpha`).
fn scaled_key_source(
    g: &Graph,
    shapes: &[Vec<usize>],
    users: &[usize],
    folded_t: &[Option<usize>],
    v: usize,
) -> Option<usize> {
    if let Some(k) = folded_t[v] {
        return Some(k);
    }
    let ValueKind::Computed { node, .. } = g.values[v].kind else {
        return None;
    };
    let mul = &g.nodes[node];
    if mul.op != Op::Binary(Binary::Mul) || users[v] != 1 {
        return None;
    }
    let scalar = |x: usize| matches!(&g.values[x].kind, ValueKind::Constant(t) if t.numel() == 1);
    let t = match (scalar(mul.inputs[0]), scalar(mul.inputs[1])) {
        (false, true) => mul.inputs[0],
        (true, false) => mul.inputs[1],
        _ => return None,
    };
    let ValueKind::Computed { node: tn, .. } = g.values[t].kind else {
        return None;
    };
    let Op::Transpose { perm } = &g.nodes[tn].op else {
        return None;
    };
    (swaps_last_two(perm) && users[t] == 1 && shapes[t] == shapes[v])
        .then_some(g.nodes[tn].inputs[0])
}

impl<'g> Planner<'g> {
    fn new(g: &'g Graph, shapes: Vec<Vec<usize>>, es: usize, opts: PlanOptions) -> Planner<'g> {
        let nv = g.values.len();
        Planner {
            g,
            opts,
            es,
            shapes,
            loc: vec![None; nv],
            nhwc: vec![false; nv],
            plain_of: vec![None; nv],
            nhwc_of: vec![None; nv],
            cpad: vec![None; nv],
            storages: Vec::new(),
            steps: Vec::new(),
            consts: Vec::new(),
            const_of: vec![None; nv],
            filter_nhwc: Vec::new(),
            filter_dw_hwc: Vec::new(),
            linear_of: vec![None; nv],
            def_t: vec![0; nv],
            alpha_of: vec![1.0; nv],
            pending_scale: vec![None; nv],
            vstrides: vec![None; nv],
            probes: Vec::new(),
            t: 0,
            quant: vec![None; g.nodes.len()],
            quantized_of: vec![None; nv],
            const_repr: Vec::new(),
            fq_skip: Vec::new(),
            fq_in_cast: vec![false; g.nodes.len()],
        }
    }

    /// Time 0: inputs arrive (staging f32 storages) and are cast to the activation dtype.
    fn stage_inputs(&mut self, dtype: DType, pat: &Patterns) -> Vec<Io> {
        let (g, es) = (self.g, self.es);
        let p = self;
        let mut inputs = Vec::new();
        for &i in &g.inputs {
            let n = p.numel(i);
            let staging = p.new_storage(n * 4);
            let nhwc = p.read_channels_last(i, pat).then(|| {
                let sh = &p.shapes[i];
                let (c, hw) = (sh[1], sh[2] * sh[3]);
                match p.stem_channel_pad(i, pat) {
                    Some(padded) => {
                        p.vstrides[i] = Some(vec![padded * hw, 1, padded * sh[3], padded]);
                        p.cpad[i] = Some(padded);
                    }
                    None => p.nhwc[i] = true,
                }
                (c, hw, p.cpad[i].unwrap_or(c))
            });
            let stored = match nhwc {
                Some((c, _, padded)) => n / c * padded,
                None => n,
            };
            let fused = nhwc.and_then(|_| p.cast_fake_quant(i, pat));
            let st = if dtype == DType::F32 && nhwc.is_none() {
                staging
            } else {
                let s = p.new_storage(stored * es);
                p.push(
                    &format!("cast input {}", g.values[i].name),
                    StepKind::CastIn {
                        x: Loc::Storage {
                            id: staging,
                            offset: 0,
                        },
                        y: Loc::Storage { id: s, offset: 0 },
                        n,
                        nhwc,
                        quant: fused.map(|(_, q)| q),
                    },
                );
                s
            };
            p.loc[i] = Some(Loc::Storage { id: st, offset: 0 });
            if let Some((f, _)) = fused {
                // The FakeQuant's output is the cast's.
                p.fq_in_cast[f] = true;
                p.store_like(g.nodes[f].outputs[0], i, Loc::Storage { id: st, offset: 0 });
            }
            inputs.push(Io {
                staging,
                shape: p.shapes[i].clone(),
            });
        }
        inputs
    }

    /// Whether input `v` is read only channels last: a 4-D image (several channels and
    /// pixels) whose readers are convolutions of the channels-last plan, directly or through a
    /// per-tensor FakeQuant (a quantized model's stem), which keeps the layout. Its cast then
    /// writes NHWC (a CNN's input: one pass instead of a cast and a layout copy).
    fn read_channels_last(&self, v: usize, pat: &Patterns) -> bool {
        let g = self.g;
        let sh = &self.shapes[v];
        let conv_of = |u: usize, x: usize| {
            matches!(g.nodes[u].op, Op::Conv(_))
                && g.nodes[u].inputs[0] == x
                && g.nodes[u].inputs[1..].iter().all(|&i| i != x)
        };
        let reads_nhwc = |u: usize| {
            if conv_of(u, v) {
                return true;
            }
            let n = &g.nodes[u];
            let Op::FakeQuant(fq) = &n.op else {
                return false;
            };
            let y = n.outputs[0];
            fq.scales.len() == 1
                && n.inputs[0] == v
                && !pat.is_output[y]
                && !pat.users_of[y].is_empty()
                && pat.users_of[y].iter().all(|&r| conv_of(r, y))
        };
        self.opts.channels_last
            && sh.len() == 4
            && sh[1] > 1
            && sh[2] * sh[3] > 1
            && !pat.is_output[v]
            && !pat.users_of[v].is_empty()
            && pat.users_of[v].iter().all(|&u| reads_nhwc(u))
    }

    /// The FakeQuant node that input `v`'s cast can apply, and how: `v`'s one reader, per
    /// tensor, emitting a value (not read as bytes by quantized products), not an output. A
    /// quantized CNN's stem reads its input so (one pass over the image instead of two:
    /// resnet50 at batch 64, 22 µs, session 36).
    fn cast_fake_quant(&self, v: usize, pat: &Patterns) -> Option<(usize, CastQuant)> {
        let g = self.g;
        let [f] = pat.users_of[v][..] else {
            return None;
        };
        let n = &g.nodes[f];
        let Op::FakeQuant(q) = &n.op else {
            return None;
        };
        let fits = q.scales.len() == 1
            && n.inputs[0] == v
            && !self.fq_skip[f]
            && !pat.is_output[n.outputs[0]];
        fits.then(|| {
            let quant = CastQuant {
                scale: q.scales[0],
                zero_point: q.zero_points.first().copied().unwrap_or(0.0),
                qtype: q.qtype,
                saturate: q.saturate,
            };
            (f, quant)
        })
    }

    /// The channel count to store input `v` with when it is an RGB image read only by
    /// convolutions of one group with constant filters whose windows overlap (directly or
    /// through a per-tensor FakeQuant that emits a value): 4, zeros in the fourth channel, and
    /// each filter padded alike. cuDNN pads a 3-channel NHWC input to 4 in two kernels of its
    /// own before its first-layer kernel, every run (resnet50 at batch 64: ~29 µs, session
    /// 37); given 4 it runs that kernel alone. A patchifying stem (stride = window: ViT's
    /// 16 × 16, ConvNeXt's 4 × 4) is a GEMM of K = kh·kw·C that a fourth channel only makes
    /// longer: not padded. Known after [`Planner::find_quant_gemms`] (a quantized product
    /// reads bytes, not this storage).
    fn stem_channel_pad(&self, v: usize, pat: &Patterns) -> Option<usize> {
        let g = self.g;
        let overlapping = |u: usize, a: &ConvAttrs| {
            let w = &self.shapes[g.nodes[u].inputs[1]];
            w.len() == 4 && w[1] == 3 && (w[2] > a.strides[0] || w[3] > a.strides[1])
        };
        let padded_conv = |u: usize, x: usize| {
            let n = &g.nodes[u];
            matches!(&n.op, Op::Conv(a) if a.groups == 1 && overlapping(u, a))
                && self.quant[u].is_none()
                && n.inputs[0] == x
                && n.inputs[1..].iter().all(|&i| i != x)
                && matches!(g.values[n.inputs[1]].kind, ValueKind::Constant(_))
        };
        let reads_padded = |u: usize| {
            if padded_conv(u, v) {
                return true;
            }
            let n = &g.nodes[u];
            let y = n.outputs[0];
            matches!(&n.op, Op::FakeQuant(fq) if fq.scales.len() == 1)
                && !self.fq_skip[u]
                && pat.users_of[y].iter().all(|&r| padded_conv(r, y))
        };
        (self.shapes[v][1] == 3 && pat.users_of[v].iter().all(|&u| reads_padded(u))).then_some(4)
    }

    /// Outputs: cast (or copy) into their own f32 staging storage, alive to the end (`end`).
    fn stage_outputs(&mut self, dtype: DType, end: usize) -> Result<Vec<Io>> {
        let g = self.g;
        let p = self;
        p.t = end;
        let mut outputs = Vec::new();
        for &o in &g.outputs {
            let src = p.plain(o, "<outputs>")?;
            let n = p.numel(o);
            let staging = p.new_storage(n * 4);
            p.storages[staging].last = end + 1;
            let dst = Loc::Storage {
                id: staging,
                offset: 0,
            };
            let kind = if dtype == DType::F32 {
                StepKind::Copy {
                    x: src,
                    y: dst,
                    space: Strided::coalesce(&[n], vec![vec![1], vec![1]], "<outputs>")?,
                }
            } else {
                StepKind::CastOut { x: src, y: dst, n }
            };
            p.push(&format!("output {}", g.values[o].name), kind);
            outputs.push(Io {
                staging,
                shape: p.shapes[o].clone(),
            });
        }
        Ok(outputs)
    }
}

/// Plans an already optimised graph (see `isolane_engine::passes::optimize`).
pub fn plan(g: &Graph, batch: usize, precision: Precision) -> Result<Plan> {
    plan_with(g, batch, precision, PlanOptions::default())
}

/// [`plan`] with options.
pub fn plan_with(g: &Graph, batch: usize, precision: Precision, opts: PlanOptions) -> Result<Plan> {
    let dtype = DType::of(precision);
    let mut p = Planner::new(g, g.infer_shapes(batch)?, dtype.size(), opts);
    let pat = Patterns::find(g, &p.shapes, opts);
    p.find_quant_gemms(&pat);
    let inputs = p.stage_inputs(dtype, &pat);
    let fq_skip = p.fq_skip.clone();
    for (ni, n) in g.nodes.iter().enumerate() {
        if ni > 0 {
            p.record_probes(&g.nodes[ni - 1]);
        }
        p.t = ni + 1;
        // Folded transposes produce nothing; their matmul reads the source. A FakeQuant read
        // only by quantized GEMMs produces nothing either: they quantize its input.
        if pat.folded_t[n.outputs[0]].is_some()
            || pat.attn_skip[ni]
            || fq_skip[ni]
            || p.fq_in_cast[ni]
        {
            continue;
        }
        let c = NodeCtx::new(&p.shapes, ni, n);
        if p.lower_view(&c, &pat)? {
            continue;
        }
        let lowered = p.lower_node(&c, &pat)?;
        if lowered == Lowered::Steps {
            c.check_shapes(batch)?;
        }
    }

    if let Some(last) = g.nodes.last() {
        p.record_probes(last);
    }
    mark_shared_xq(&mut p.steps);
    let end = g.nodes.len() + 1;
    let outputs = p.stage_outputs(dtype, end)?;
    // Inputs' staging stays reserved for the whole run (written before the graph starts).
    for io in &inputs {
        p.storages[io.staging].last = end + 1;
    }
    let mut storages = p.storages;
    let arena_bytes = assign_offsets(&mut storages, ARENA_RULES);
    Ok(Plan {
        dtype,
        precision,
        steps: p.steps,
        storages,
        arena_bytes,
        consts: p.consts,
        filter_nhwc: p.filter_nhwc,
        filter_dw_hwc: p.filter_dw_hwc,
        inputs,
        outputs,
        probes: p.probes,
        const_repr: p.const_repr,
    })
}

/// Marks the quantized GEMMs whose quantize kernel fills an `xq` that later ones read
/// (`xq_ready`, or as their residual of bytes): their float alternative must fill it too.
fn mark_shared_xq(steps: &mut [Step]) {
    let shared: Vec<Loc> = steps
        .iter()
        .flat_map(|s| match &s.kind {
            StepKind::QuantGemm(q) => [
                q.xq_ready.then_some(q.xq),
                q.residual.filter(|_| q.residual_scale.is_some()),
            ],
            _ => [None, None],
        })
        .flatten()
        .collect();
    for s in steps.iter_mut() {
        if let StepKind::QuantGemm(q) = &mut s.kind {
            if !q.xq_ready && shared.contains(&q.xq) {
                if let Some(alt) = q.alt.as_mut() {
                    alt.float.fills_xq = true;
                }
            }
        }
    }
}

/// Test hook of the plan check: a deliberately wrong plan. Negates the stored output of
/// `node` right after it is computed (one extra in-place pointwise step), so that every later
/// step computes with a wrong value. Errors when `node` has no probe (nothing is stored for it).
#[doc(hidden)]
pub fn corrupt_node(plan: &mut Plan, node: &str) -> Result<()> {
    let pr = plan
        .probes
        .iter()
        .find(|pr| pr.node == node)
        .cloned()
        .ok_or_else(|| unsupported(node, "no stored output to corrupt"))?;
    plan.steps.insert(
        pr.ready,
        Step {
            name: format!("{node} (corrupted by the plan-check test hook)"),
            kind: StepKind::elementwise(pr.loc, pr.loc, pr.span(), None, Some(Unary::Neg)),
        },
    );
    for p in &mut plan.probes {
        if p.ready >= pr.ready {
            p.ready += 1;
        }
    }
    Ok(())
}

/// The scale a MatMul operand `v` carries unapplied: a multiplication by a scalar constant
/// aliased onto its input (`alpha_of`), and, when `v` is a transpose folded into the matmul,
/// the scale of the value that transpose reads. Each value's scale counts once: torch's
/// scaled-dot-product export scales both q and kᵀ by √scale, and kᵀ·√scale is both the
/// matmul's operand and the value it reads when no transpose is folded.
fn operand_alpha(alpha_of: &[f32], folded_t: &[Option<usize>], v: usize) -> f32 {
    alpha_of[v] * folded_t[v].map_or(1.0, |src| alpha_of[src])
}

/// (batch, batch stride, rows, cols, row stride) of a matrix operand.
pub type MatView = (usize, usize, usize, usize, usize);

/// A strided `[.., rows, cols]` operand as one matrix batch: (batch, batch stride, rows,
/// cols, row stride), when its columns are contiguous and its batch dims collapse to one
/// stride.
pub fn mat_view(shape: &[usize], strides: &[usize]) -> Option<MatView> {
    let r = shape.len();
    if r < 2 || strides.len() != r {
        return None;
    }
    let (rows, cols) = (shape[r - 2], shape[r - 1]);
    if cols > 1 && strides[r - 1] != 1 {
        return None;
    }
    let ld = if rows > 1 { strides[r - 2] } else { cols };
    if ld < cols {
        return None;
    }
    let b = Strided::coalesce(&shape[..r - 2], vec![strides[..r - 2].to_vec()], "").ok()?;
    let batch: usize = b.numel();
    if batch == 1 {
        return Some((1, rows * cols, rows, cols, ld));
    }
    if b.dims.len() != 1 {
        return None;
    }
    Some((batch, b.strides[0][0], rows, cols, ld))
}

/// `broadcast_shapes` re-exported for the GPU side's checks.
pub fn broadcast(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    broadcast_shapes(a, b)
}

/// The fields of [`StepKind::Linear`].
#[derive(Clone, Debug, PartialEq)]
pub struct LinearStep {
    pub x: Loc,
    pub w: Loc,
    pub bias: Option<Loc>,
    pub y: Loc,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub act: Option<Unary>,
    /// Added before the epilogue (a residual add fused as cuBLASLt's C with beta = 1).
    pub residual: Option<Loc>,
}

/// The fields of [`StepKind::MatMul`].
#[derive(Clone, Debug, PartialEq)]
pub struct MatMulStep {
    pub a: Loc,
    pub b: Loc,
    pub y: Loc,
    pub batch: usize,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub a_batch_stride: usize,
    pub b_batch_stride: usize,
    pub b_trans: bool,
    /// Scales the product (a multiplication by a constant scalar folded in).
    pub alpha: f32,
    /// Row strides (leading dimensions) of a, b and y, and y's batch stride: operands may
    /// be strided views (attention heads read in place from the QKV projection).
    pub lda: usize,
    pub ldb: usize,
    pub ldy: usize,
    pub y_batch_stride: usize,
}

/// The fields of [`StepKind::Attention`].
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionStep {
    pub q: Loc,
    pub k: Loc,
    pub v: Loc,
    pub y: Loc,
    pub batch: usize,
    pub heads: usize,
    pub seq: usize,
    pub dim: usize,
    pub alpha: f32,
    pub out_scale: f32,
    pub q_strides: [usize; 3],
    pub k_strides: [usize; 3],
    pub v_strides: [usize; 3],
    pub y_strides: [usize; 3],
}

/// The fields of [`StepKind::LayerNorm`].
#[derive(Clone, Debug, PartialEq)]
pub struct LayerNormStep {
    pub x: Loc,
    pub scale: Loc,
    pub bias: Option<Loc>,
    pub y: Loc,
    pub rows: usize,
    pub cols: usize,
    pub eps: f32,
}

/// The fields of [`StepKind::Softmax`].
#[derive(Clone, Debug, PartialEq)]
pub struct SoftmaxStep {
    pub x: Loc,
    pub y: Loc,
    pub outer: usize,
    pub len: usize,
    pub inner: usize,
}

/// The fields of [`StepKind::Pool`].
#[derive(Clone, Debug, PartialEq)]
pub struct PoolStep {
    pub x: Loc,
    pub y: Loc,
    pub max: bool,
    /// `[N, C, H, W]` and `[OH, OW]`.
    pub x_shape: [usize; 4],
    pub out_hw: [usize; 2],
    pub kernel: [usize; 2],
    pub strides: [usize; 2],
    /// `[top, left]`; bottom/right only matter through the output size.
    pub pads: [usize; 2],
    pub dilations: [usize; 2],
    pub count_include_pad: bool,
    /// x and y stored NHWC.
    pub nhwc: bool,
    /// y holds the pooled values quantized (scale, type: the bytes the quantize kernel makes
    /// of the stored values) instead of the values: only quantized GEMMs read them
    /// ([`Planner::pooled_bytes`]).
    pub y_quant: Option<(f32, QuantType)>,
}

/// The fields of [`StepKind::Resize`].
#[derive(Clone, Debug, PartialEq)]
pub struct ResizeStep {
    pub x: Loc,
    pub y: Loc,
    /// `[N, C, H, W]` and `[OH, OW]`.
    pub x_shape: [usize; 4],
    pub out_hw: [usize; 2],
    pub linear: bool,
    pub coord: i32,
    pub nearest: i32,
    pub scales: [f32; 2],
    /// x and y stored NHWC.
    pub nhwc: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clip_bound_too_small_for_fp16_stays_nonzero_there_only() {
        let clip = |min: f32, max: f32| Some(Unary::Clip { min, max });
        assert_eq!(
            act_code(clip(1e-12, f32::INFINITY), DType::F16),
            (3, F16_TINIEST, f32::INFINITY)
        );
        assert_eq!(
            act_code(clip(-1.0, -1e-9), DType::F16),
            (3, -1.0, -F16_TINIEST)
        );
        // Zero, representable bounds, and the wider formats keep their bounds.
        assert_eq!(act_code(clip(0.0, 6.0), DType::F16), (3, 0.0, 6.0));
        assert_eq!(act_code(clip(1e-3, 1.0), DType::F16), (3, 1e-3, 1.0));
        for d in [DType::F32, DType::Bf16] {
            assert_eq!(act_code(clip(1e-12, 1.0), d), (3, 1e-12, 1.0));
        }
        // The tiniest fp16 value is what fp16 stores it as.
        assert_eq!(half::f16::from_f32(F16_TINIEST).to_f32(), F16_TINIEST);
        assert_eq!(half::f16::from_f32(1e-12).to_f32(), 0.0);
    }
}
