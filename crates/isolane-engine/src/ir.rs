//! The engine's graph IR: values (graph inputs, constants, computed tensors), nodes (ops) and
//! static shape inference.
//!
//! # Batch dimension
//! A [`Graph`] is batch-agnostic. Graph inputs declare their shape with [`Dim`]s, one of which is
//! normally [`Dim::Batch`]; shape-carrying attributes (`Reshape`, `Expand`) may use `Dim::Batch` /
//! `Dim::BatchTimes(k)` too. Concrete shapes exist only after [`Graph::infer_shapes`] is given the
//! batch size, which a backend does once when it compiles the graph for a (batch, precision).
//! Everything else is static: shape subgraphs (Shape, ConstantOfShape, Range, Cast...) must be
//! folded away by whoever builds the graph.
//!
//! # Data types
//! All runtime tensors are f32. Constants are f32 ([`Tensor`]); integer data that ops need
//! (Gather indices, Slice bounds, permutations) lives in the op's attributes as i64/usize.
//! Each value carries its type ([`ValueType`]): float32 today, and for a `FakeQuant`'s output
//! the quantization grid it is on; the builder sets it by the op family's rule
//! (`crate::ops::value_types`) and [`Graph::validate`] checks it.
//!
//! # Order
//! Nodes are kept in topological order: a node may only use values defined before it (graph
//! inputs, constants, or outputs of earlier nodes). The builder methods enforce this.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use crate::error::{EngineError, Result};
pub use crate::quant::{FakeQuantAttrs, Granularity, QuantType};

/// Index of a value in [`Graph::values`].
pub type ValueId = usize;
/// Index of a node in [`Graph::nodes`].
pub type NodeId = usize;

/// A dense row-major f32 tensor (constants and weights).
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

impl Tensor {
    /// A tensor from a shape and data; errors if the sizes disagree.
    pub fn new(shape: Vec<usize>, data: Vec<f32>) -> Result<Self> {
        let n: usize = shape.iter().product();
        if n != data.len() {
            return Err(EngineError::InvalidArgument(format!(
                "tensor of shape {shape:?} needs {n} elements, got {}",
                data.len()
            )));
        }
        Ok(Tensor { shape, data })
    }
    /// A 0-d tensor holding one value.
    pub fn scalar(v: f32) -> Self {
        Tensor {
            shape: vec![],
            data: vec![v],
        }
    }
    /// A tensor of zeros.
    pub fn zeros(shape: Vec<usize>) -> Self {
        let n = shape.iter().product();
        Tensor {
            shape,
            data: vec![0.0; n],
        }
    }
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.data.len()
    }
}

/// One dimension of a declared shape (graph inputs, `Reshape`/`Expand` targets).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dim {
    /// A fixed size.
    Fixed(usize),
    /// The batch size chosen at compile time.
    Batch,
    /// `k ×` the batch size (e.g. `[N*heads, S, d]`).
    BatchTimes(usize),
    /// Reshape only: copy the input's size at this position (ONNX `0`).
    Copy,
    /// Reshape only: inferred from the element count (ONNX `-1`); at most one.
    Infer,
}

impl std::fmt::Display for Dim {
    /// In the user's terms: a size, `batch`, `4·batch`, `copy` (ONNX 0), `inferred` (ONNX -1).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Dim::Fixed(n) => write!(f, "{n}"),
            Dim::Batch => f.write_str("batch"),
            Dim::BatchTimes(k) => write!(f, "{k}·batch"),
            Dim::Copy => f.write_str("copy"),
            Dim::Infer => f.write_str("inferred"),
        }
    }
}

/// A declared shape in the user's terms: `batch × 3 × 224 × 224`.
pub fn dims_text(dims: &[Dim]) -> String {
    dims.iter()
        .map(Dim::to_string)
        .collect::<Vec<_>>()
        .join(" × ")
}

impl Dim {
    /// Converts ONNX-style integers (0 = copy, -1 = infer) into dims.
    pub fn from_onnx(v: i64) -> Result<Dim> {
        match v {
            -1 => Ok(Dim::Infer),
            0 => Ok(Dim::Copy),
            v if v > 0 => Ok(Dim::Fixed(v as usize)),
            v => Err(EngineError::InvalidArgument(format!("bad shape dim {v}"))),
        }
    }
}

/// Pointwise functions, usable as standalone ops ([`Op::Unary`]) and as fused epilogues.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Unary {
    Identity,
    Relu,
    /// `clamp(x, 0, 6)` (MobileNetV2).
    Relu6,
    Clip {
        min: f32,
        max: f32,
    },
    LeakyRelu {
        alpha: f32,
    },
    Sigmoid,
    /// `clamp(alpha*x + beta, 0, 1)`.
    HardSigmoid {
        alpha: f32,
        beta: f32,
    },
    /// `x * relu6(x + 3) / 6`.
    HardSwish,
    /// `x * sigmoid(x)`.
    Silu,
    /// Exact GELU: `0.5 x (1 + erf(x / sqrt 2))`.
    Gelu,
    /// tanh-approximated GELU.
    GeluTanh,
    Tanh,
    Exp,
    Log,
    Sqrt,
    Erf,
    Neg,
    Abs,
    Reciprocal,
}

/// Elementwise binary ops with numpy broadcasting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Binary {
    Add,
    Sub,
    Mul,
    Div,
    Pow,
    Max,
    Min,
}

/// Reductions.
///
/// ONNX's ReduceL1, ReduceSumSquare and ReduceL2 are kinds of their own rather than an
/// elementwise step around a Sum: the squares (and their sum) of an fp16 plan would be stored
/// in fp16 between the steps and overflow past 65504 (swin_v2's cosine attention normalises
/// rows whose squares do), while one reduction keeps them in f32 and stores only its result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceKind {
    Mean,
    Sum,
    Max,
    Min,
    /// Σ|x|.
    L1,
    /// Σx².
    SumSquare,
    /// √Σx².
    L2,
}

impl ReduceKind {
    /// The reduction of `values` (`n` of them), in f32: the one definition the CPU backend and
    /// the CUDA plan's emulator compute with (the CUDA `row_reduce` kernel mirrors it).
    pub fn apply(self, values: impl Iterator<Item = f32>, n: usize) -> f32 {
        match self {
            ReduceKind::Sum => values.sum(),
            ReduceKind::Mean => values.sum::<f32>() / n as f32,
            ReduceKind::Max => values.fold(f32::NEG_INFINITY, f32::max),
            ReduceKind::Min => values.fold(f32::INFINITY, f32::min),
            ReduceKind::L1 => values.map(f32::abs).sum(),
            ReduceKind::SumSquare => values.map(|v| v * v).sum(),
            ReduceKind::L2 => values.map(|v| v * v).sum::<f32>().sqrt(),
        }
    }
}

/// 2-D convolution attributes (NCHW). Inputs: `x [N,C,H,W]`, `w [M, C/groups, kh, kw]`,
/// optional `b [M]`, and when `residual` is set a fourth input added before the activation
/// (then the bias input must be present). The kernel size comes from `w`'s shape.
#[derive(Clone, Debug, PartialEq)]
pub struct ConvAttrs {
    pub strides: [usize; 2],
    /// `[top, left, bottom, right]` (ONNX order: h_begin, w_begin, h_end, w_end).
    pub pads: [usize; 4],
    pub dilations: [usize; 2],
    pub groups: usize,
    /// Fused epilogue after bias (and residual).
    pub activation: Option<Unary>,
    /// Fused residual add: `act(conv(x) + b + inputs[3])`.
    pub residual: bool,
}

impl Default for ConvAttrs {
    fn default() -> Self {
        ConvAttrs {
            strides: [1, 1],
            pads: [0; 4],
            dilations: [1, 1],
            groups: 1,
            activation: None,
            residual: false,
        }
    }
}

/// Pooling attributes (NCHW, 2-D).
#[derive(Clone, Debug, PartialEq)]
pub struct PoolAttrs {
    pub kernel: [usize; 2],
    pub strides: [usize; 2],
    /// `[top, left, bottom, right]`.
    pub pads: [usize; 4],
    pub dilations: [usize; 2],
    pub ceil_mode: bool,
    /// AveragePool only: count padded cells in the divisor.
    pub count_include_pad: bool,
}

impl Default for PoolAttrs {
    fn default() -> Self {
        PoolAttrs {
            kernel: [1, 1],
            strides: [1, 1],
            pads: [0; 4],
            dilations: [1, 1],
            ceil_mode: false,
            count_include_pad: false,
        }
    }
}

/// Resize interpolation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResizeMode {
    Nearest,
    /// Bilinear on the two spatial dims.
    Linear,
}

/// ONNX `coordinate_transformation_mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CoordMode {
    HalfPixel,
    PytorchHalfPixel,
    AlignCorners,
    Asymmetric,
}

/// ONNX `nearest_mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NearestMode {
    RoundPreferFloor,
    RoundPreferCeil,
    Floor,
    Ceil,
}

/// Output size of a Resize on H and W.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ResizeSize {
    /// Output = floor(input × scale); the scale is also used in the coordinate transform.
    Scales([f32; 2]),
    /// Explicit output H, W.
    Size([usize; 2]),
}

/// Resize attributes (4-D NCHW input; only H and W are resized).
#[derive(Clone, Debug, PartialEq)]
pub struct ResizeAttrs {
    pub mode: ResizeMode,
    pub coord: CoordMode,
    pub nearest: NearestMode,
    pub size: ResizeSize,
}

impl ResizeAttrs {
    /// The scale of each spatial axis used in the coordinate transform: the given scales, or
    /// output / input for an explicit size (ONNX's definition).
    pub fn coord_scales(&self, in_hw: [usize; 2], out_hw: [usize; 2]) -> [f32; 2] {
        match self.size {
            ResizeSize::Scales(s) => s,
            ResizeSize::Size(_) => [
                out_hw[0] as f32 / in_hw[0] as f32,
                out_hw[1] as f32 / in_hw[1] as f32,
            ],
        }
    }

    /// Where output index `i` of an axis (`inp` long in, `out` long out, `scale` from
    /// [`ResizeAttrs::coord_scales`]) reads: `(i0, i1, weight of i1)`; nearest reads `i0` only
    /// (`i1 == i0`, weight 0). Every backend's Resize follows this (the cuda kernel mirrors it
    /// in CUDA C, in the same f32 operations).
    pub fn source(&self, i: usize, inp: usize, out: usize, scale: f32) -> (usize, usize, f32) {
        let xo = match self.coord {
            CoordMode::HalfPixel => (i as f32 + 0.5) / scale - 0.5,
            CoordMode::PytorchHalfPixel => {
                if out > 1 {
                    (i as f32 + 0.5) / scale - 0.5
                } else {
                    0.0
                }
            }
            CoordMode::AlignCorners => {
                if out > 1 {
                    i as f32 * (inp as f32 - 1.0) / (out as f32 - 1.0)
                } else {
                    0.0
                }
            }
            CoordMode::Asymmetric => i as f32 / scale,
        };
        let last = (inp - 1) as f32;
        if self.mode == ResizeMode::Linear {
            let xc = xo.clamp(0.0, last);
            let i0 = xc.floor() as usize;
            let i1 = (i0 + 1).min(inp - 1);
            (i0, i1, xc - i0 as f32)
        } else {
            let v = match self.nearest {
                NearestMode::Floor => xo.floor(),
                NearestMode::Ceil => xo.ceil(),
                NearestMode::RoundPreferFloor if xo.fract() == 0.5 => xo.floor(),
                NearestMode::RoundPreferCeil if xo.fract() == 0.5 => xo.ceil(),
                NearestMode::RoundPreferFloor | NearestMode::RoundPreferCeil => xo.round(),
            };
            let i0 = v.clamp(0.0, last) as usize;
            (i0, i0, 0.0)
        }
    }
}

/// The ops. Input conventions are given per variant; `Graph::validate` checks arity.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// Inputs: x, w, [b], [residual]. See [`ConvAttrs`].
    Conv(ConvAttrs),
    /// Inputs: x, scale, bias, mean, var (per-channel on dim 1).
    BatchNorm {
        eps: f32,
    },
    /// One input.
    Unary(Unary),
    /// Two inputs, numpy broadcasting.
    Binary(Binary),
    /// Inputs: a, b; numpy `matmul` semantics (batched, broadcasting, 1-D promotion).
    MatMul,
    /// ONNX Gemm: `alpha * op(a) @ op(b) + beta * c`; inputs a, b, [c] (c broadcast to [M,N]).
    Gemm {
        alpha: f32,
        beta: f32,
        trans_a: bool,
        trans_b: bool,
    },
    /// PyTorch `nn.Linear`: inputs x `[.., K]`, w `[N, K]`, [b `[N]`]; output `[.., N]`;
    /// fused activation. Produced by passes (and built-ins) from MatMul/Gemm with constant weights.
    Linear {
        activation: Option<Unary>,
    },
    MaxPool(PoolAttrs),
    AveragePool(PoolAttrs),
    /// `[N,C,H,W] -> [N,C,1,1]`.
    GlobalAveragePool,
    /// PyTorch `AdaptiveAvgPool2d(output)`.
    AdaptiveAvgPool {
        output: [usize; 2],
    },
    /// ONNX Flatten: `[d0..d(axis-1) product, rest product]`.
    Flatten {
        axis: i64,
    },
    Reshape {
        shape: Vec<Dim>,
    },
    Transpose {
        perm: Vec<usize>,
    },
    /// Any number of inputs.
    Concat {
        axis: i64,
    },
    /// One input, `sizes.len()` outputs.
    Split {
        axis: i64,
        sizes: Vec<usize>,
    },
    /// ONNX Slice semantics (negative indices, clamping, negative steps).
    Slice {
        starts: Vec<i64>,
        ends: Vec<i64>,
        axes: Vec<i64>,
        steps: Vec<i64>,
    },
    /// Gather along `axis` with constant indices (negative indices allowed).
    Gather {
        axis: i64,
        indices: Vec<i64>,
        indices_shape: Vec<usize>,
    },
    Unsqueeze {
        axes: Vec<i64>,
    },
    /// Empty `axes` squeezes every size-1 dim.
    Squeeze {
        axes: Vec<i64>,
    },
    /// numpy-broadcast the input to `shape` (ONNX Expand: result is the broadcast of both).
    Expand {
        shape: Vec<Dim>,
    },
    Softmax {
        axis: i64,
    },
    /// Normalises over dims `axis..`; inputs x, scale, [bias] (shape of the normalised dims).
    LayerNorm {
        axis: i64,
        eps: f32,
    },
    Reduce {
        kind: ReduceKind,
        axes: Vec<i64>,
        keepdims: bool,
    },
    Resize(ResizeAttrs),
    /// Pass-through (Dropout at inference, Identity).
    Identity,
    /// ONNX `DequantizeLinear(QuantizeLinear(x))` with one set of parameters (what a QDQ
    /// model's activation Q→DQ pair computes): see [`crate::quant`].
    FakeQuant(FakeQuantAttrs),
}

impl Op {
    /// A short name for messages.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Conv(_) => "Conv",
            Op::BatchNorm { .. } => "BatchNorm",
            Op::Unary(_) => "Unary",
            Op::Binary(_) => "Binary",
            Op::MatMul => "MatMul",
            Op::Gemm { .. } => "Gemm",
            Op::Linear { .. } => "Linear",
            Op::MaxPool(_) => "MaxPool",
            Op::AveragePool(_) => "AveragePool",
            Op::GlobalAveragePool => "GlobalAveragePool",
            Op::AdaptiveAvgPool { .. } => "AdaptiveAvgPool",
            Op::Flatten { .. } => "Flatten",
            Op::Reshape { .. } => "Reshape",
            Op::Transpose { .. } => "Transpose",
            Op::Concat { .. } => "Concat",
            Op::Split { .. } => "Split",
            Op::Slice { .. } => "Slice",
            Op::Gather { .. } => "Gather",
            Op::Unsqueeze { .. } => "Unsqueeze",
            Op::Squeeze { .. } => "Squeeze",
            Op::Expand { .. } => "Expand",
            Op::Softmax { .. } => "Softmax",
            Op::LayerNorm { .. } => "LayerNorm",
            Op::Reduce { .. } => "Reduce",
            Op::Resize(_) => "Resize",
            Op::Identity => "Identity",
            Op::FakeQuant(_) => "FakeQuant",
        }
    }

    /// Allowed input counts `(min, max)`; `max == usize::MAX` = variadic.
    fn arity(&self) -> (usize, usize) {
        match self {
            Op::Conv(a) if a.residual => (4, 4),
            Op::Conv(_) => (2, 3),
            Op::BatchNorm { .. } => (5, 5),
            Op::Binary(_) | Op::MatMul => (2, 2),
            Op::Gemm { .. } | Op::Linear { .. } | Op::LayerNorm { .. } => (2, 3),
            Op::Concat { .. } => (1, usize::MAX),
            _ => (1, 1),
        }
    }

    /// Number of outputs the op produces.
    pub fn num_outputs(&self) -> usize {
        match self {
            Op::Split { sizes, .. } => sizes.len(),
            _ => 1,
        }
    }

    /// True for ops whose output is the input's data with another shape (no copy needed).
    pub fn is_view(&self) -> bool {
        matches!(
            self,
            Op::Reshape { .. }
                | Op::Flatten { .. }
                | Op::Unsqueeze { .. }
                | Op::Squeeze { .. }
                | Op::Identity
        )
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a value is.
#[derive(Clone, Debug, PartialEq)]
pub enum ValueKind {
    /// A graph input with its declared shape.
    Input(Vec<Dim>),
    /// A constant (weights). Shared so that compiling does not copy weights.
    Constant(Arc<Tensor>),
    /// Output `index` of node `node`.
    Computed { node: NodeId, index: usize },
}

/// A value's element type.
///
/// Every backend computes in f32, and every value of a graph is `F32` today: a float16
/// model's values are held as the f32 values they are (docs/onnx.md), and a quantized
/// activation as the f32 value it dequantizes to, its grid in [`Value::quant`]. The other
/// types are those ONNX files carry, which the importer computes with at import only; the
/// type rules (`crate::ops::value_types`) refuse them as an op's input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DType {
    F32,
    F16,
    Bf16,
    Int8,
    Uint8,
    Int16,
    Uint16,
    /// float8 e4m3fn.
    E4m3,
    Int64,
    Bool,
}

impl DType {
    /// The ONNX `TensorProto.DataType` of each type, and back (None for the others).
    pub fn from_onnx(t: i32) -> Option<DType> {
        Some(match t {
            1 => DType::F32,
            2 => DType::Uint8,
            3 => DType::Int8,
            4 => DType::Uint16,
            5 => DType::Int16,
            7 => DType::Int64,
            9 => DType::Bool,
            10 => DType::F16,
            16 => DType::Bf16,
            17 => DType::E4m3,
            _ => return None,
        })
    }
}

impl From<QuantType> for DType {
    fn from(q: QuantType) -> DType {
        match q {
            QuantType::Int8 => DType::Int8,
            QuantType::Uint8 => DType::Uint8,
            QuantType::Int16 => DType::Int16,
            QuantType::Uint16 => DType::Uint16,
            QuantType::Float8E4M3Fn => DType::E4m3,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DType::F32 => "float32",
            DType::F16 => "float16",
            DType::Bf16 => "bfloat16",
            DType::Int8 => "int8",
            DType::Uint8 => "uint8",
            DType::Int16 => "int16",
            DType::Uint16 => "uint16",
            DType::E4m3 => "float8e4m3fn",
            DType::Int64 => "int64",
            DType::Bool => "bool",
        })
    }
}

/// A value's type: its element type and, for a value on a quantization grid (a `FakeQuant`'s
/// output), the grid's parameters (element type, scales, zero points; per tensor, axis or
/// block), shared with the op that made it.
#[derive(Clone, Debug, PartialEq)]
pub struct ValueType {
    pub dtype: DType,
    pub quant: Option<Arc<FakeQuantAttrs>>,
}

impl ValueType {
    /// A plain f32 value: graph inputs, constants and most ops' outputs.
    pub const F32: ValueType = ValueType {
        dtype: DType::F32,
        quant: None,
    };
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.quant {
            None => write!(f, "{}", self.dtype),
            Some(q) => write!(
                f,
                "{} on a {} grid ({} scales)",
                self.dtype,
                q.qtype,
                q.scales.len()
            ),
        }
    }
}

/// A named value.
#[derive(Clone, Debug, PartialEq)]
pub struct Value {
    pub name: String,
    pub kind: ValueKind,
    /// Set by the builder: f32 for graph inputs and constants, the op family's type rule for
    /// computed values; [`Graph::validate`] checks it.
    pub ty: ValueType,
}

/// An op applied to values.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub name: String,
    pub op: Op,
    pub inputs: Vec<ValueId>,
    pub outputs: Vec<ValueId>,
}

/// A dataflow graph in topological order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Graph {
    pub name: String,
    pub values: Vec<Value>,
    pub nodes: Vec<Node>,
    pub inputs: Vec<ValueId>,
    pub outputs: Vec<ValueId>,
}

impl Graph {
    /// An empty graph.
    pub fn new(name: impl Into<String>) -> Self {
        Graph {
            name: name.into(),
            ..Default::default()
        }
    }

    /// Declares a graph input. Its shape normally starts with [`Dim::Batch`].
    pub fn add_input(&mut self, name: impl Into<String>, shape: Vec<Dim>) -> ValueId {
        let id = self.values.len();
        self.values.push(Value {
            name: name.into(),
            kind: ValueKind::Input(shape),
            ty: ValueType::F32,
        });
        self.inputs.push(id);
        id
    }

    /// Adds a constant.
    pub fn add_constant(&mut self, name: impl Into<String>, t: Tensor) -> ValueId {
        self.add_shared_constant(name, Arc::new(t))
    }

    /// Adds a constant that shares its storage.
    pub fn add_shared_constant(&mut self, name: impl Into<String>, t: Arc<Tensor>) -> ValueId {
        let id = self.values.len();
        self.values.push(Value {
            name: name.into(),
            kind: ValueKind::Constant(t),
            ty: ValueType::F32,
        });
        id
    }

    /// Adds a node with named outputs; returns the output value ids. Checks that the inputs
    /// exist (which keeps the graph topologically ordered) and the op's arity.
    pub fn add_node_with_outputs(
        &mut self,
        name: impl Into<String>,
        op: Op,
        inputs: &[ValueId],
        output_names: Vec<String>,
    ) -> Result<Vec<ValueId>> {
        let name = name.into();
        if let Some(&bad) = inputs.iter().find(|&&v| v >= self.values.len()) {
            return Err(EngineError::graph(
                &name,
                format!("unknown input value {bad}"),
            ));
        }
        check_arity(&name, &op, inputs.len())?;
        if output_names.len() != op.num_outputs() {
            return Err(EngineError::graph(
                &name,
                format!(
                    "{} produces {} outputs, {} names given",
                    op.name(),
                    op.num_outputs(),
                    output_names.len()
                ),
            ));
        }
        let in_types: Vec<&ValueType> = inputs.iter().map(|&v| &self.values[v].ty).collect();
        let types =
            crate::ops::value_types(&op, &in_types).map_err(|m| EngineError::graph(&name, m))?;
        let node_id = self.nodes.len();
        let mut outs = Vec::with_capacity(output_names.len());
        for ((index, oname), ty) in output_names.into_iter().enumerate().zip(types) {
            outs.push(self.values.len());
            self.values.push(Value {
                name: oname,
                kind: ValueKind::Computed {
                    node: node_id,
                    index,
                },
                ty,
            });
        }
        self.nodes.push(Node {
            name,
            op,
            inputs: inputs.to_vec(),
            outputs: outs.clone(),
        });
        Ok(outs)
    }

    /// Adds a node; outputs are named `name` (one output) or `name:i`.
    pub fn add_node(
        &mut self,
        name: impl Into<String>,
        op: Op,
        inputs: &[ValueId],
    ) -> Result<Vec<ValueId>> {
        let name = name.into();
        let n = op.num_outputs();
        let names = if n == 1 {
            vec![name.clone()]
        } else {
            (0..n).map(|i| format!("{name}:{i}")).collect()
        };
        self.add_node_with_outputs(name, op, inputs, names)
    }

    /// Adds a single-output node and returns its output.
    pub fn add_op(
        &mut self,
        name: impl Into<String>,
        op: Op,
        inputs: &[ValueId],
    ) -> Result<ValueId> {
        let name = name.into();
        if op.num_outputs() != 1 {
            return Err(EngineError::graph(&name, "add_op needs a single-output op"));
        }
        Ok(self.add_node(name, op, inputs)?[0])
    }

    /// Marks a value as a graph output.
    pub fn add_output(&mut self, v: ValueId) -> Result<()> {
        if v >= self.values.len() {
            return Err(EngineError::graph(
                "<outputs>",
                format!("unknown value {v}"),
            ));
        }
        self.outputs.push(v);
        Ok(())
    }

    /// The constant behind a value, if it is one.
    pub fn constant(&self, v: ValueId) -> Option<&Arc<Tensor>> {
        match &self.values.get(v)?.kind {
            ValueKind::Constant(t) => Some(t),
            _ => None,
        }
    }

    /// Finds a value by name.
    pub fn find_value(&self, name: &str) -> Option<ValueId> {
        self.values.iter().position(|v| v.name == name)
    }

    /// The node producing a value, if computed.
    pub fn producer(&self, v: ValueId) -> Option<NodeId> {
        match self.values.get(v)?.kind {
            ValueKind::Computed { node, .. } => Some(node),
            _ => None,
        }
    }

    /// Total number of constant elements (weights and buffers).
    pub fn constant_elements(&self) -> usize {
        self.values
            .iter()
            .map(|v| match &v.kind {
                ValueKind::Constant(t) => t.numel(),
                _ => 0,
            })
            .sum()
    }

    /// For each value, how many node inputs (plus graph outputs) use it.
    pub fn use_counts(&self) -> Vec<usize> {
        let mut uses = vec![0usize; self.values.len()];
        for n in &self.nodes {
            for &i in &n.inputs {
                uses[i] += 1;
            }
        }
        for &o in &self.outputs {
            uses[o] += 1;
        }
        uses
    }

    /// Checks structure: ids in range, topological order, arity, consistent value kinds,
    /// at least one input and one output, and each value's type: what its op's type rule
    /// makes of the inputs' types (every op computes on f32 values).
    pub fn validate(&self) -> Result<()> {
        if self.outputs.is_empty() {
            return Err(EngineError::graph(&self.name, "graph has no outputs"));
        }
        let mut defined = vec![false; self.values.len()];
        for &i in &self.inputs {
            let ok = matches!(
                self.values.get(i).map(|v| &v.kind),
                Some(ValueKind::Input(_))
            );
            if !ok {
                return Err(EngineError::graph(
                    &self.name,
                    format!("graph input {i} is not an input value"),
                ));
            }
            defined[i] = true;
        }
        for (i, v) in self.values.iter().enumerate() {
            if matches!(v.kind, ValueKind::Constant(_)) {
                defined[i] = true;
            }
        }
        for (ni, n) in self.nodes.iter().enumerate() {
            check_arity(&n.name, &n.op, n.inputs.len())?;
            for &i in &n.inputs {
                if i >= self.values.len() || !defined[i] {
                    return Err(EngineError::graph(
                        &n.name,
                        format!("input value {i} is not defined before this node"),
                    ));
                }
            }
            if n.outputs.len() != n.op.num_outputs() {
                return Err(EngineError::graph(&n.name, "wrong number of outputs"));
            }
            let in_types: Vec<&ValueType> = n.inputs.iter().map(|&i| &self.values[i].ty).collect();
            let types = crate::ops::value_types(&n.op, &in_types)
                .map_err(|m| EngineError::graph(&n.name, m))?;
            for (k, &o) in n.outputs.iter().enumerate() {
                match self.values.get(o).map(|v| &v.kind) {
                    Some(ValueKind::Computed { node, index }) if *node == ni && *index == k => {}
                    _ => {
                        return Err(EngineError::graph(
                            &n.name,
                            format!("output value {o} is inconsistent"),
                        ))
                    }
                }
                if defined[o] {
                    return Err(EngineError::graph(
                        &n.name,
                        format!("value {o} defined twice"),
                    ));
                }
                defined[o] = true;
                let ty = &self.values[o].ty;
                if *ty != types[k] {
                    return Err(EngineError::graph(
                        &n.name,
                        format!(
                            "output value {o} is typed {ty}, but {} makes {}",
                            n.op.name(),
                            types[k]
                        ),
                    ));
                }
            }
        }
        for &o in &self.outputs {
            if o >= self.values.len() || !defined[o] {
                return Err(EngineError::graph(
                    "<outputs>",
                    format!("graph output {o} is never computed"),
                ));
            }
        }
        Ok(())
    }

    /// Concrete shapes of every value for a batch size (indexed by [`ValueId`]). Values that are
    /// neither inputs, constants nor outputs of a node get an empty shape.
    pub fn infer_shapes(&self, batch: usize) -> Result<Vec<Vec<usize>>> {
        if batch == 0 {
            return Err(EngineError::InvalidArgument(
                "batch size must be at least 1".into(),
            ));
        }
        self.validate()?;
        let mut shapes: Vec<Vec<usize>> = vec![Vec::new(); self.values.len()];
        for (i, v) in self.values.iter().enumerate() {
            match &v.kind {
                ValueKind::Input(dims) => {
                    shapes[i] = resolve_dims(dims, None, batch)
                        .map_err(|m| EngineError::graph(&v.name, m))?;
                }
                ValueKind::Constant(t) => shapes[i] = t.shape.clone(),
                ValueKind::Computed { .. } => {}
            }
        }
        for n in &self.nodes {
            let ins: Vec<&[usize]> = n.inputs.iter().map(|&i| shapes[i].as_slice()).collect();
            let outs = infer_node(n, &ins, batch)?;
            for (o, s) in n.outputs.iter().zip(outs) {
                shapes[*o] = s;
            }
        }
        Ok(shapes)
    }
}

fn check_arity(name: &str, op: &Op, n: usize) -> Result<()> {
    let (lo, hi) = op.arity();
    if n < lo || n > hi {
        let want = if lo == hi {
            format!("{lo}")
        } else if hi == usize::MAX {
            format!("at least {lo}")
        } else {
            format!("{lo}..={hi}")
        };
        return Err(EngineError::graph(
            name,
            format!("{} takes {want} inputs, got {n}", op.name()),
        ));
    }
    Ok(())
}

/// Resolves declared dims to sizes. `input` is the reshape source shape (for Copy/Infer).
pub fn resolve_dims(
    dims: &[Dim],
    input: Option<&[usize]>,
    batch: usize,
) -> std::result::Result<Vec<usize>, String> {
    let mut out = Vec::with_capacity(dims.len());
    let mut infer_at = None;
    for (i, d) in dims.iter().enumerate() {
        out.push(match *d {
            Dim::Fixed(n) => n,
            Dim::Batch => batch,
            Dim::BatchTimes(k) => k
                .checked_mul(batch)
                .ok_or_else(|| format!("dim {i}: {k} × batch {batch} passes usize"))?,
            Dim::Copy => match input {
                Some(s) if i < s.len() => s[i],
                _ => return Err(format!("dim {i}: Copy has no input dim to copy")),
            },
            Dim::Infer => {
                if infer_at.is_some() || input.is_none() {
                    return Err("more than one inferred dim, or Infer outside Reshape".into());
                }
                infer_at = Some(i);
                1
            }
        });
    }
    if let (Some(i), Some(src)) = (infer_at, input) {
        // Checked: the dims come from model files.
        let total = checked_numel(src)
            .ok_or_else(|| format!("cannot infer dim {i}: {src:?} holds more than usize counts"))?;
        let known = out
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .try_fold(1usize, |n, (_, d)| n.checked_mul(*d))
            .unwrap_or(0);
        if known == 0 || !total.is_multiple_of(known) {
            return Err(format!(
                "cannot infer dim {i}: {total} elements into {out:?}"
            ));
        }
        out[i] = total / known;
    }
    Ok(out)
}

/// numpy broadcasting of two shapes.
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let r = a.len().max(b.len());
    let mut out = vec![0; r];
    for i in 0..r {
        let da = if i < r - a.len() {
            1
        } else {
            a[i - (r - a.len())]
        };
        let db = if i < r - b.len() {
            1
        } else {
            b[i - (r - b.len())]
        };
        out[i] = if da == db {
            da
        } else if da == 1 {
            db
        } else if db == 1 {
            da
        } else {
            return None;
        };
    }
    Some(out)
}

/// Normalises a possibly negative axis against a rank.
pub fn norm_axis(axis: i64, rank: usize) -> Option<usize> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if a < 0 || a >= r {
        None
    } else {
        Some(a as usize)
    }
}

/// The number of elements of `shape`, or None past usize (shapes from model files).
pub fn checked_numel(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d))
}

/// Output size of a strided window op along one dim.
pub fn window_out(
    input: usize,
    k: usize,
    stride: usize,
    pad_begin: usize,
    pad_end: usize,
    dil: usize,
    ceil: bool,
) -> Option<usize> {
    if stride == 0 || dil == 0 || k == 0 {
        return None;
    }
    // Checked: dilations, kernels and pads come from model files; past usize, no window fits.
    let eff = dil.checked_mul(k - 1)?.checked_add(1)?;
    let padded = input.checked_add(pad_begin)?.checked_add(pad_end)?;
    if padded < eff {
        return None;
    }
    let span = padded - eff;
    let mut out = if ceil {
        span.div_ceil(stride)
    } else {
        span / stride
    } + 1;
    // PyTorch/ONNX: with ceil mode the last window must start inside the input or left padding.
    // (out - 1) * stride <= span, so it cannot overflow; input + pad_begin <= padded.
    if ceil && out > 1 && (out - 1) * stride >= input + pad_begin {
        out -= 1;
    }
    Some(out)
}

/// Resolved Slice parameters: for every dim `(start, step, len)`.
pub fn slice_params(
    shape: &[usize],
    starts: &[i64],
    ends: &[i64],
    axes: &[i64],
    steps: &[i64],
) -> std::result::Result<Vec<(i64, i64, usize)>, String> {
    let mut p: Vec<(i64, i64, usize)> = shape.iter().map(|&d| (0, 1, d)).collect();
    if starts.len() != ends.len() {
        return Err("starts and ends differ in length".into());
    }
    let axes: Vec<i64> = if axes.is_empty() {
        (0..starts.len() as i64).collect()
    } else {
        axes.to_vec()
    };
    if axes.len() != starts.len() || (!steps.is_empty() && steps.len() != starts.len()) {
        return Err("starts/ends/axes/steps lengths differ".into());
    }
    let mut seen = vec![false; shape.len()];
    for (i, &ax) in axes.iter().enumerate() {
        let a = norm_axis(ax, shape.len()).ok_or_else(|| format!("axis {ax} out of range"))?;
        if seen[a] {
            return Err(format!("axis {ax} repeated"));
        }
        seen[a] = true;
        let d = shape[a] as i64;
        let step = if steps.is_empty() { 1 } else { steps[i] };
        if step == 0 {
            return Err("step 0".into());
        }
        let clampi = |v: i64, lo: i64, hi: i64| v.max(lo).min(hi);
        let mut s = starts[i];
        let mut e = ends[i];
        if s < 0 {
            s = s.saturating_add(d);
        }
        if e < 0 {
            e = e.saturating_add(d);
        }
        // ceil(span / |step|), written so that no step (i64::MIN and MAX included) overflows:
        // the span is at most d.
        let len = if step > 0 {
            s = clampi(s, 0, d);
            e = clampi(e, 0, d);
            if e > s {
                (e - s - 1) as u64 / step.unsigned_abs() + 1
            } else {
                0
            }
        } else {
            s = clampi(s, 0, d - 1);
            e = clampi(e, -1, d - 1);
            if s > e {
                (s - e - 1) as u64 / step.unsigned_abs() + 1
            } else {
                0
            }
        };
        p[a] = (s, step, len as usize);
    }
    Ok(p)
}

/// Fails unless `s`, the shape of the `what` operand of `n`, is 4-D.
pub(crate) fn rank4(n: &Node, s: &[usize], what: &str) -> Result<()> {
    if s.len() != 4 {
        return Err(shape_err(n, format!("{what} must be 4-D NCHW, got {s:?}")));
    }
    Ok(())
}

pub(crate) fn shape_err(n: &Node, msg: impl Into<String>) -> EngineError {
    EngineError::Shape {
        node: n.name.clone(),
        op: n.op.name().to_string(),
        msg: msg.into(),
    }
}

/// Output shapes of one node: the rule of the op's family (`crate::ops`).
pub fn infer_node(n: &Node, ins: &[&[usize]], batch: usize) -> Result<Vec<Vec<usize>>> {
    crate::ops::infer(n, ins, batch)
}

/// numpy matmul output shape.
pub fn matmul_shape(a: &[usize], b: &[usize]) -> std::result::Result<Vec<usize>, String> {
    if a.is_empty() || b.is_empty() {
        return Err("matmul of a scalar".into());
    }
    let a2: Vec<usize> = if a.len() == 1 {
        vec![1, a[0]]
    } else {
        a.to_vec()
    };
    let b2: Vec<usize> = if b.len() == 1 {
        vec![b[0], 1]
    } else {
        b.to_vec()
    };
    let (m, k) = (a2[a2.len() - 2], a2[a2.len() - 1]);
    let (k2, n) = (b2[b2.len() - 2], b2[b2.len() - 1]);
    if k != k2 {
        return Err(format!("inner dims differ: {a:?} x {b:?}"));
    }
    let batch = broadcast_shapes(&a2[..a2.len() - 2], &b2[..b2.len() - 2])
        .ok_or_else(|| format!("batch dims do not broadcast: {a:?} x {b:?}"))?;
    let mut o = batch;
    if a.len() > 1 {
        o.push(m);
    }
    if b.len() > 1 {
        o.push(n);
    }
    Ok(o)
}

/// A map from value names to ids (helper for importers).
pub fn name_index(g: &Graph) -> HashMap<String, ValueId> {
    g.values
        .iter()
        .enumerate()
        .map(|(i, v)| (v.name.clone(), i))
        .collect()
}
