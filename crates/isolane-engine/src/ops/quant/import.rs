//! QuantizeLinear and DequantizeLinear (the QDQ format that onnxruntime's `quantize_static`,
//! TensorRT's and NVIDIA ModelOpt's tools write), imported as ONNX defines them:
//!
//! - on values known at import (weights, biases, their scales) both are computed here, exactly
//!   ([`crate::quant`]): an int8 weight with its DequantizeLinear becomes the f32 weight it
//!   stands for, and a float weight behind a Q → DQ pair becomes its quantized value;
//! - a QuantizeLinear of a runtime tensor is held back ([`Pending`]) until its
//!   DequantizeLinear, and the pair becomes one [`Op::FakeQuant`]: the runtime values stay f32
//!   and hold exactly what the pair computes. Any other reader of a quantized runtime tensor
//!   (QOperator ops such as QLinearConv, a graph output) is refused by name.
//!
//! The quantized ops' family (`crate::ops::quant`) routes their op types here; the importer
//! keeps the quantization state this module defines ([`State`]) and asks it about every node
//! (`quantized_readers`).

use std::collections::HashMap;

use crate::ir::{self, Binary, Op, ReduceKind, Unary};
use crate::onnx::fold::{self, Arr, Sym};
use crate::onnx::import::{
    fmt_syms, node_axis, static_shape, syms_static, Ctx, Dyn, Importer, Val,
};
use crate::onnx::proto::NodeProto;
use crate::onnx::Result;
use crate::quant::{dequantize_all, FakeQuantAttrs, Granularity, QuantType};

/// A QuantizeLinear of a runtime tensor, waiting for its DequantizeLinear.
#[derive(Debug, Clone)]
pub(crate) struct Pending {
    /// The QuantizeLinear's float input.
    pub x: Dyn,
    pub attrs: FakeQuantAttrs,
    /// The QuantizeLinear node, for messages.
    pub node: String,
}

/// What the importer remembers for quantization.
#[derive(Debug, Default)]
pub(crate) struct State {
    /// The element types of quantized constants (initializers, Constant nodes, QuantizeLinear
    /// outputs): integers are held as i64 and float8 as f32, so int8 and uint8 (or float8 and
    /// float) are told apart here.
    types: HashMap<String, QuantType>,
    /// The FakeQuant made for a QuantizeLinear output, reused by each of its DequantizeLinears.
    made: HashMap<String, Val>,
    /// Runtime tensors that hold integers (QOperator values), and their element types.
    ints: HashMap<String, IntType>,
    /// Runtime tensors held scaled down by a power of two (ConvInteger's and MatMulInteger's
    /// int32 accumulators, and their casts and moves), with the factor `2^p` that restores
    /// them: an unscaled accumulator overflows fp16 on cuda (65504). The factor is folded
    /// into the scale that multiplies the accumulator (exact: only exponents move), else
    /// applied where another op reads the tensor.
    shifts: HashMap<String, f32>,
}

/// The scales, zero points and type of one QuantizeLinear or DequantizeLinear.
struct Params {
    granularity: Granularity,
    scales: Vec<f32>,
    zero_points: Vec<f32>,
    /// The zero point's element type, where the node has one whose type is known.
    zp_type: Option<QuantType>,
}

impl Importer<'_> {
    /// Remembers the element type of an initializer.
    pub(crate) fn note_initializer_type(&mut self, name: &str, onnx_type: i32) {
        if let Some(q) = QuantType::from_onnx(onnx_type) {
            self.quant.types.insert(name.to_string(), q);
        }
    }

    /// Remembers the element type of a Constant node's tensor.
    pub(crate) fn note_constant_type(&mut self, c: &Ctx) {
        let t = c.n.attribute.iter().find(|a| a.name() == "value");
        if let (Some(t), Some(out)) = (t.and_then(|a| a.t.as_ref()), c.n.output.first()) {
            self.note_initializer_type(out, t.data_type());
        }
    }

    pub(crate) fn quantize_linear(&mut self, c: &Ctx) -> Result<Vec<Val>> {
        let opset = self.m.opset;
        let saturate = if opset >= 19 {
            c.int("saturate", 1)? != 0
        } else {
            true
        };
        let output_dtype = if opset >= 21 {
            c.int("output_dtype", 0)?
        } else {
            0
        };
        let x = self.req(c, 0)?;
        let p = self.params(c, &x)?;
        let named = match output_dtype {
            0 => None,
            t => Some(QuantType::from_onnx(t as i32).ok_or_else(|| {
                c.unsupported_attr(
                    "output_dtype",
                    format!(
                        "{} (isolane quantizes to int8, uint8, int16, uint16 and float8e4m3fn)",
                        type_name(t as i32)
                    ),
                )
            })?),
        };
        let qtype = match (named, p.zp_type) {
            (Some(a), Some(b)) if a != b => {
                return Err(c.bad(format!(
                    "output_dtype is {a} but the zero point is {b}; they must agree"
                )))
            }
            (Some(t), _) | (None, Some(t)) => t,
            (None, None) if self.get(c, 2)?.is_some() => {
                return Err(c.bad(format!(
                    "the zero point {:?} is computed at import, so its element type (int8 or \
                     uint8, ...) is unknown; isolane needs it stored as an initializer or a \
                     Constant",
                    c.n.input[2]
                )))
            }
            // No zero point: uint8, as the spec says.
            (None, None) => QuantType::Uint8,
        };
        check_zero_points(c, qtype, &p.zero_points)?;
        let attrs = FakeQuantAttrs {
            qtype,
            saturate,
            granularity: p.granularity,
            scales: p.scales,
            zero_points: p.zero_points,
        };
        let out = match x {
            Val::F(a) => {
                attrs.layout(&a.shape).map_err(|e| c.bad(e))?;
                let mut q = vec![0.0; a.data.len()];
                attrs.quantize_into(&a.shape, &a.data, &mut q, 0);
                if qtype.is_float() {
                    Val::F(Arr::new(a.shape, q))
                } else {
                    // Exact: saturated integers of at most 16 bits.
                    Val::I(Arr::new(
                        a.shape,
                        q.iter().map(|&v| Sym::k(v as i64)).collect(),
                    ))
                }
            }
            Val::Dyn(d) => {
                if matches!(attrs.granularity, Granularity::Blocked { .. }) {
                    return Err(c.bad(
                        "blocked quantization (block_size) of a runtime tensor is not supported; \
                         isolane supports it on constant weights",
                    ));
                }
                for s in &d.shapes {
                    attrs.layout(s).map_err(|e| c.bad(e))?;
                }
                Val::Q(Box::new(Pending {
                    x: d,
                    attrs,
                    node: c.r.node.clone(),
                }))
            }
            other => {
                return Err(c.bad(format!(
                    "QuantizeLinear of {} is not supported (its input must be float)",
                    other.kind()
                )))
            }
        };
        if let Some(name) = c.n.output.first() {
            self.quant.types.insert(name.clone(), qtype);
        }
        Ok(vec![out])
    }

    pub(crate) fn dequantize_linear(&mut self, c: &Ctx) -> Result<Vec<Val>> {
        let x = self.req(c, 0)?;
        let p = self.params(c, &x)?;
        let x_name = c.n.input[0].clone();
        let x_type = self.quant.types.get(&x_name).copied();
        let known = |qtype: QuantType| FakeQuantAttrs {
            qtype,
            saturate: true,
            granularity: p.granularity.clone(),
            scales: p.scales.clone(),
            zero_points: p.zero_points.clone(),
        };
        match x {
            Val::I(a) => {
                let q: Vec<f32> = a
                    .data
                    .iter()
                    .map(|s| {
                        if s.is_const() {
                            Ok(s.c as f32)
                        } else {
                            Err(c.bad("the quantized input depends on the batch size"))
                        }
                    })
                    .collect::<Result<_>>()?;
                if let Some(t) = x_type {
                    check_zero_points(c, t, &p.zero_points)?;
                }
                let y =
                    dequantize_all(&known(QuantType::Int8), &a.shape, &q).map_err(|e| c.bad(e))?;
                Ok(vec![Val::F(Arr::new(a.shape, y))])
            }
            Val::F(a) if x_type == Some(QuantType::Float8E4M3Fn) => {
                check_zero_points(c, QuantType::Float8E4M3Fn, &p.zero_points)?;
                let y = dequantize_all(&known(QuantType::Float8E4M3Fn), &a.shape, &a.data)
                    .map_err(|e| c.bad(e))?;
                Ok(vec![Val::F(Arr::new(a.shape, y))])
            }
            Val::Q(pending) => {
                let theirs = &pending.attrs;
                if p.granularity != theirs.granularity
                    || !same_bits(&p.scales, &theirs.scales)
                    || !same_bits(&p.zero_points, &theirs.zero_points)
                {
                    return Err(c.bad(format!(
                        "its scales or zero points differ from those of QuantizeLinear (node \
                         {:?}) that feeds it; isolane runs a Q → DQ pair with one set of \
                         parameters",
                        pending.node
                    )));
                }
                if let Some(v) = self.quant.made.get(&x_name) {
                    return Ok(vec![v.clone()]);
                }
                let out = self.out_name(c, 0);
                let v = self
                    .emit(
                        c,
                        Op::FakeQuant(pending.attrs.clone()),
                        &[(x_name.clone(), Val::Dyn(pending.x.clone()))],
                        vec![out],
                    )?
                    .remove(0);
                self.quant.made.insert(x_name, v.clone());
                Ok(vec![v])
            }
            Val::Dyn(d) if self.quant.ints.contains_key(&x_name) => {
                let t = self.quant.ints[&x_name];
                self.dequantize_ints(c, d, t, p)
            }
            other => Err(c.bad(format!(
                "DequantizeLinear of {} is not supported: its input must be an integer or \
                 float8 constant, or a quantized runtime tensor",
                other.kind()
            ))),
        }
    }

    /// The scale and zero point inputs of a QuantizeLinear or DequantizeLinear on `x`, and
    /// the `axis` / `block_size` attributes, checked against `x`'s shape.
    fn params(&mut self, c: &Ctx, x: &Val) -> Result<Params> {
        let opset = self.m.opset;
        let axis = if opset >= 13 { c.int("axis", 1)? } else { 1 };
        let block = if opset >= 21 {
            c.int("block_size", 0)?
        } else {
            0
        };
        let scale = match self.req(c, 1)? {
            Val::F(a) => a,
            other => {
                return Err(c.bad(format!(
                    "the scale {:?} is {}; isolane needs float scales known at import",
                    c.n.input[1],
                    other.kind()
                )))
            }
        };
        if let Some(bad) = scale.data.iter().find(|s| !(s.is_finite() && **s > 0.0)) {
            return Err(c.bad(format!(
                "the scale {:?} holds {bad}; scales must be finite and positive",
                c.n.input[1]
            )));
        }
        let zp_name = c.n.input.get(2).cloned().unwrap_or_default();
        let (zero_points, zp_type) = match self.get(c, 2)? {
            None => (vec![0.0; scale.data.len()], None),
            Some(v) => {
                let zp_shape = static_shape(&v);
                let vals = match v {
                    Val::I(a) => syms_static(c, &Val::I(a), "the zero point")?
                        .into_iter()
                        .map(|z| z as f32)
                        .collect(),
                    Val::F(a) => a.data,
                    other => {
                        return Err(c.bad(format!(
                            "the zero point {zp_name:?} is {}; isolane needs it known at import",
                            other.kind()
                        )))
                    }
                };
                // Scalars and one-element vectors are alike (onnxruntime writes both).
                let alike = |a: &[usize], b: &[usize]| {
                    a == b
                        || (a.len() <= 1
                            && b.len() <= 1
                            && a.iter().product::<usize>() == b.iter().product::<usize>())
                };
                if !alike(&zp_shape, &scale.shape) {
                    return Err(c.bad(format!(
                        "the zero point has shape {zp_shape:?} and the scale {:?}; they must \
                         be equal",
                        scale.shape
                    )));
                }
                (vals, self.quant.types.get(&zp_name).copied())
            }
        };
        let shape = x.sym_shape().map_err(|e| c.bad(e))?;
        let rank = shape.len();
        let granularity = if block != 0 {
            let b = usize::try_from(block)
                .map_err(|_| c.unsupported_attr("block_size", format!("{block} is negative")))?;
            let a = node_axis(c, axis, rank)?;
            let want: Vec<Sym> = shape
                .iter()
                .enumerate()
                .map(|(i, d)| {
                    if i == a {
                        Sym::k(d.c.saturating_add(block - 1) / block)
                    } else {
                        *d
                    }
                })
                .collect();
            if shape.iter().any(|d| !d.is_const()) || scale.shape.len() != rank {
                return Err(c.bad(format!(
                    "blocked quantization needs a scale of the input's rank and a static input \
                     shape; the input is {}, the scale {:?}",
                    fmt_syms(&shape),
                    scale.shape
                )));
            }
            if want.iter().zip(&scale.shape).any(|(w, &s)| w.c != s as i64) {
                return Err(c.bad(format!(
                    "a block size of {b} on axis {a} of an input of shape {} needs a scale of \
                     shape {}, the scale is {:?}",
                    fmt_syms(&shape),
                    fmt_syms(&want),
                    scale.shape
                )));
            }
            Granularity::Blocked {
                axis: a as i64,
                block: b,
            }
        } else if scale.data.len() == 1 && scale.shape.len() <= 1 {
            Granularity::PerTensor
        } else if scale.shape.len() == 1 {
            let a = node_axis(c, axis, rank)?;
            if !shape[a].is_const() || shape[a].c != scale.data.len() as i64 {
                return Err(c.bad(format!(
                    "a per-axis scale of {} values on axis {a} of an input of shape {}: the \
                     axis must be as long as the scale (and not the batch)",
                    scale.data.len(),
                    fmt_syms(&shape)
                )));
            }
            Granularity::PerAxis { axis: a as i64 }
        } else {
            return Err(c.bad(format!(
                "the scale has shape {:?}; isolane supports a scalar (per tensor), a 1-D scale \
                 (per axis) or, with block_size, a scale of the input's rank",
                scale.shape
            )));
        };
        Ok(Params {
            granularity,
            scales: scale.data,
            zero_points,
            zp_type,
        })
    }
}

/// Zero points must be integers in the type's range (float8: zero).
fn check_zero_points(c: &Ctx, t: QuantType, zps: &[f32]) -> Result<()> {
    let (lo, hi) = t.range();
    let ok = |z: f32| {
        if t.is_float() {
            z == 0.0
        } else {
            z.fract() == 0.0 && (lo..=hi).contains(&z)
        }
    };
    if let Some(z) = zps.iter().find(|z| !ok(**z)) {
        return Err(c.bad(format!(
            "zero point {z} is not a valid {t} zero point{}",
            if t.is_float() {
                " (float8 zero points must be 0)"
            } else {
                ""
            }
        )));
    }
    Ok(())
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// An ONNX data type number by name (FLOAT8E5M2, INT4, ...), for messages.
fn type_name(t: i32) -> String {
    crate::onnx::proto::tensor_proto::DataType::try_from(t)
        .map(|d| d.as_str_name().to_string())
        .unwrap_or_else(|_| format!("data type {t}"))
}

// ---------------------------------------------------------------------------------------------
// The QOperator format: QLinearConv, QLinearMatMul, ConvInteger, MatMulInteger,
// DynamicQuantizeLinear (ONNX) and onnxruntime's com.microsoft QGemm, QLinearAdd, QLinearMul,
// QLinearGlobalAveragePool, QLinearConcat, QLinearLeakyRelu, QLinearSigmoid, QLinearSoftmax.
//
// A quantized runtime tensor between these ops is held as its integers (`q`, in f32: exact for
// 8-bit values and for int32 accumulators below 2^24), and each op is lowered onto float IR
// ops and `FakeQuant` with a scale of 1 (which is `round` half to even, plus the zero point,
// saturated to the type's range, minus the zero point). The integer products are computed on
// `q − zero_point` exactly (sums of integers below 2^24 are exact in f32 in any order), then
// scaled by the f32 multiplier onnxruntime computes, `(x_scale · w_scale) / y_scale`, and
// rounded: the same operations as onnxruntime's integer kernels, so the same bits.
// ---------------------------------------------------------------------------------------------

/// The element type of a runtime integer tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum IntType {
    Q(QuantType),
    /// MatMulInteger's and ConvInteger's accumulators.
    Int32,
}

impl fmt::Display for IntType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IntType::Q(q) => write!(f, "{q}"),
            IntType::Int32 => f.write_str("int32"),
        }
    }
}

use std::fmt;

/// The com.microsoft (onnxruntime contrib) ops isolane imports.
pub(crate) fn is_contrib(op: &str) -> bool {
    matches!(
        op,
        "QGemm"
            | "QLinearAdd"
            | "QLinearMul"
            | "QLinearGlobalAveragePool"
            | "QLinearConcat"
            | "QLinearLeakyRelu"
            | "QLinearSigmoid"
            | "QLinearSoftmax"
            | "QuantizeLinear"
            | "DequantizeLinear"
    )
}

/// The ops that read quantized runtime tensors as integers.
const QOPS: [&str; 13] = [
    "QLinearConv",
    "QLinearMatMul",
    "ConvInteger",
    "MatMulInteger",
    "QGemm",
    "QLinearAdd",
    "QLinearMul",
    "QLinearGlobalAveragePool",
    "QLinearConcat",
    "QLinearLeakyRelu",
    "QLinearSigmoid",
    "QLinearSoftmax",
    "DequantizeLinear",
];

/// Ops that only move or select values: on integers they compute what they compute on the
/// integers onnxruntime holds, and their output is an integer tensor of the same type.
const MOVERS: [&str; 13] = [
    "Identity",
    "Reshape",
    "Transpose",
    "Flatten",
    "Squeeze",
    "Unsqueeze",
    "Concat",
    "Slice",
    "Gather",
    "Split",
    "MaxPool",
    "GlobalMaxPool",
    "Expand",
];

/// A zero point: known at import (one value, or one per channel), or a runtime scalar
/// (DynamicQuantizeLinear's).
enum Zp {
    Const(Vec<f32>),
    Runtime(Dyn),
}

impl Importer<'_> {
    /// Checks the node's quantized runtime inputs before it is imported: a QuantizeLinear
    /// output read by anything but DequantizeLinear becomes integers here, and an integer
    /// runtime tensor may be read only by the ops that read integers. Returns the type of the
    /// outputs when the node moves integers (a Reshape of a uint8 tensor is uint8).
    pub(crate) fn quantized_readers(&mut self, c: &Ctx) -> Result<Option<IntType>> {
        let op = c.op();
        let reads_ints = QOPS.contains(&op) || matches!(op, "Cast" | "Shape" | "Size");
        let mover = MOVERS.contains(&op);
        let allowed = || {
            format!(
                "isolane reads a quantized runtime tensor only in DequantizeLinear, Cast to \
                 float, the QOperator ops ({}) and ops that move values ({})",
                QOPS[..12].join(", "),
                MOVERS.join(", ")
            )
        };
        for name in &c.n.input {
            if let Some(Val::Q(p)) = self.vals.get(name) {
                if op == "DequantizeLinear" {
                    continue;
                }
                if !(reads_ints || mover) {
                    return Err(c.bad(format!(
                        "input {name:?} is the {} output of QuantizeLinear (node {:?}) on a \
                         runtime tensor; {}",
                        p.attrs.qtype,
                        p.node,
                        allowed()
                    )));
                }
                let p = p.clone();
                self.materialize(c, name, &p)?;
            }
        }
        self.carry_shifts(c, mover)?;
        let mut moved: Option<IntType> = None;
        let mut floats = false;
        for name in &c.n.input {
            match (self.quant.ints.get(name), self.vals.get(name)) {
                (Some(&t), Some(Val::Dyn(_))) => {
                    if !(reads_ints || mover) {
                        return Err(c.bad(format!(
                            "input {name:?} is a runtime {t} tensor; {}",
                            allowed()
                        )));
                    }
                    if moved.is_some_and(|m| m != t) {
                        return Err(c.bad(format!(
                            "its inputs are runtime integer tensors of different types ({} and \
                             {t})",
                            moved.unwrap_or(t)
                        )));
                    }
                    moved = Some(t);
                }
                (_, Some(Val::Dyn(_))) => floats = true,
                _ => {}
            }
        }
        if mover && moved.is_some() && floats {
            return Err(c.bad(
                "it mixes runtime integer (quantized) and float tensors; the file's types do \
                 not agree",
            ));
        }
        Ok(if mover { moved } else { None })
    }

    /// Where node `c` reads tensors held scaled down by `2^-p` ([`State::shifts`]): a Cast to
    /// float, a move (one common factor) and Shape/Size keep the scaling (on the node's
    /// outputs), a Mul by a constant or a runtime scalar folds it into that operand
    /// ([`Importer::shifted_operand`]), DequantizeLinear into its scale; any other reader
    /// gets the restored values.
    fn carry_shifts(&mut self, c: &Ctx, mover: bool) -> Result<()> {
        let shifted: Vec<(String, f32)> =
            c.n.input
                .iter()
                .filter_map(|n| self.quant.shifts.get(n).map(|&f| (n.clone(), f)))
                .collect();
        let Some(&(_, f)) = shifted.first() else {
            return Ok(());
        };
        let op = c.op();
        let runtime_ins =
            c.n.input
                .iter()
                .filter(|n| matches!(self.vals.get(*n), Some(Val::Dyn(_))))
                .count();
        let keep = match op {
            "Shape" | "Size" | "DequantizeLinear" => return Ok(()),
            "Cast" => true,
            _ if mover => shifted.len() == runtime_ins && shifted.iter().all(|(_, g)| *g == f),
            "Mul" => {
                return if shifted.len() == 1 && self.shift_foldable(c, &shifted[0].0) {
                    Ok(())
                } else {
                    self.unshift_all(&shifted)
                }
            }
            _ => false,
        };
        if !keep {
            return self.unshift_all(&shifted);
        }
        for out in c.n.output.iter().filter(|o| !o.is_empty()) {
            self.quant.shifts.insert(out.clone(), f);
        }
        Ok(())
    }

    fn unshift_all(&mut self, shifted: &[(String, f32)]) -> Result<()> {
        for (name, f) in shifted {
            self.unshift(name, *f)?;
        }
        Ok(())
    }

    /// Whether the other operand of a Mul that reads the shifted `name` can take the factor:
    /// a float constant, or a float runtime tensor that does not grow with the batch (the
    /// dynamic scale products, `x_scale · w_scale`, one or one per channel).
    fn shift_foldable(&self, c: &Ctx, name: &str) -> bool {
        let other = c.n.input.iter().find(|n| n.as_str() != name);
        match other.and_then(|o| self.vals.get(o)) {
            Some(Val::F(_)) => true,
            Some(Val::Dyn(d)) => d.shapes[0] == d.shapes[1],
            _ => false,
        }
    }

    /// The operand `(name, value)` of a Mul node, with the factor of a shifted other operand
    /// folded into it (see [`Importer::carry_shifts`]): `x · 2^-p · (s · 2^p)` is `x · s`,
    /// exactly at f32, and in range at fp16.
    pub(crate) fn shifted_operand(
        &mut self,
        c: &Ctx,
        name: &str,
        v: Val,
        other: &str,
    ) -> Result<(String, Val)> {
        let Some(&f) = self.quant.shifts.get(other) else {
            return Ok((name.to_string(), v));
        };
        if self.quant.shifts.contains_key(name) {
            return Err(c.bad("internal: both operands of a Mul are shifted"));
        }
        let fc = self.qconst(c, "unshift", Arr::scalar(f));
        self.qbin(c, Binary::Mul, (name.to_string(), v), fc, "scale_unshifted")
    }

    /// Restores the shifted runtime tensor `name` (`· 2^p`) for a reader that cannot take the
    /// factor, or a graph output. At fp16 the restored integers may exceed its range again.
    pub(crate) fn unshift(&mut self, name: &str, f: f32) -> Result<()> {
        self.quant.shifts.remove(name);
        let Some(Val::Dyn(d)) = self.vals.get(name).cloned() else {
            return Ok(());
        };
        let k = self.g.add_constant(
            format!("{name}/unshift"),
            ir::Tensor {
                shape: vec![],
                data: vec![f],
            },
        );
        let id = self
            .g
            .add_op(
                format!("{name}/unshifted"),
                Op::Binary(Binary::Mul),
                &[d.id, k],
            )
            .map_err(|e| self.invalid(e.to_string()))?;
        self.vals.insert(
            name.to_string(),
            Val::Dyn(Dyn {
                id,
                shapes: d.shapes,
            }),
        );
        Ok(())
    }

    /// Restores every shifted graph output (see [`Importer::unshift`]).
    pub(crate) fn unshift_outputs(&mut self, outputs: &[String]) -> Result<()> {
        for name in outputs {
            if let Some(&f) = self.quant.shifts.get(name) {
                self.unshift(name, f)?;
            }
        }
        Ok(())
    }

    /// Records that the runtime outputs of node `n` hold integers of type `t`.
    pub(crate) fn tag_int_outputs(&mut self, n: &NodeProto, outs: &[Val], t: IntType) {
        for (name, v) in n.output.iter().zip(outs) {
            if v.is_dyn() && !name.is_empty() {
                self.quant.ints.insert(name.clone(), t);
            }
        }
    }

    /// Replaces the pending QuantizeLinear output `name` by its integers:
    /// `clamp(round(x / s) + z)` as `FakeQuant(x / s, scale 1, z) + z`.
    fn materialize(&mut self, c: &Ctx, name: &str, p: &Pending) -> Result<()> {
        let a = &p.attrs;
        if a.granularity != Granularity::PerTensor || a.qtype.is_float() {
            return Err(c.bad(format!(
                "input {name:?} is the output of QuantizeLinear (node {:?}), {} {}; isolane \
                 reads a quantized runtime tensor as integers (into {}) only when it is \
                 quantized per tensor to an integer type",
                p.node,
                a.qtype,
                match a.granularity {
                    Granularity::PerTensor => "per tensor",
                    Granularity::PerAxis { .. } => "per axis",
                    Granularity::Blocked { .. } => "blocked",
                },
                c.op()
            )));
        }
        let x = (name.to_string(), Val::Dyn(p.x.clone()));
        let s = self.qconst(c, "scale", Arr::scalar(a.scales[0]));
        let v = self.qbin(c, Binary::Div, x, s, "quantize")?;
        let q = self.round_sat(c, v, a.qtype, a.zero_points[0], None)?;
        self.vals.insert(name.to_string(), q);
        self.quant
            .ints
            .insert(name.to_string(), IntType::Q(a.qtype));
        Ok(())
    }

    /// A float constant with a name of its own (the IR stores constants by name).
    fn qconst(&mut self, c: &Ctx, what: &str, a: Arr<f32>) -> (String, Val) {
        self.fresh += 1;
        (format!("{}:{what}{}", c.r.node, self.fresh), Val::F(a))
    }

    /// `x op y`, folded when both are constants.
    fn qbin(
        &mut self,
        c: &Ctx,
        b: Binary,
        x: (String, Val),
        y: (String, Val),
        what: &str,
    ) -> Result<(String, Val)> {
        if let (Val::F(p), Val::F(q)) = (&x.1, &y.1) {
            let r = fold::zip(p, q, |u, v| {
                Ok(match b {
                    Binary::Add => u + v,
                    Binary::Sub => u - v,
                    Binary::Mul => u * v,
                    Binary::Div => u / v,
                    _ => return Err("internal: unexpected op".to_string()),
                })
            })
            .map_err(|e| c.bad(e))?;
            return Ok(self.qconst(c, what, r));
        }
        let v = self.emit_tmp(c, Op::Binary(b), &[x, y], what)?;
        Ok((format!("{}:{what}", c.r.node), v))
    }

    /// `q = clamp(round(v) + z, type's range)` (half to even), as
    /// `FakeQuant(v, scale 1, z) + z`; the last op is named `out` when given.
    fn round_sat(
        &mut self,
        c: &Ctx,
        v: (String, Val),
        t: QuantType,
        z: f32,
        out: Option<String>,
    ) -> Result<Val> {
        let fq = Op::FakeQuant(FakeQuantAttrs {
            qtype: t,
            saturate: true,
            granularity: Granularity::PerTensor,
            scales: vec![1.0],
            zero_points: vec![z],
        });
        if z == 0.0 {
            return match out {
                Some(o) => Ok(self.emit(c, fq, &[v], vec![o])?.remove(0)),
                None => self.emit_tmp(c, fq, &[v], "round"),
            };
        }
        let k = self.emit_tmp(c, fq, &[v], "round")?;
        let zc = self.qconst(c, "zero_point", Arr::scalar(z));
        match out {
            Some(o) => Ok(self
                .emit(
                    c,
                    Op::Binary(Binary::Add),
                    &[(format!("{}:round", c.r.node), k), zc],
                    vec![o],
                )?
                .remove(0)),
            None => Ok(self.qbin(c, Binary::Add, (String::new(), k), zc, "q")?.1),
        }
    }

    /// Input `i` of a QOperator node: a runtime integer tensor, or an integer constant (as
    /// f32), with its element type where known.
    fn qin(&self, c: &Ctx, i: usize) -> Result<((String, Val), Option<IntType>)> {
        let name = c.n.input.get(i).cloned().unwrap_or_default();
        match self.req(c, i)? {
            Val::Dyn(d) => match self.quant.ints.get(&name) {
                Some(&t) => Ok(((name, Val::Dyn(d)), Some(t))),
                None => Err(c.bad(format!(
                    "input {name:?} is a float runtime tensor; {} reads a quantized tensor (the \
                     output of QuantizeLinear, DynamicQuantizeLinear or another QOperator op)",
                    c.op()
                ))),
            },
            Val::I(a) => {
                let q = syms_static(c, &Val::I(a.clone()), "the quantized input")?;
                let t = self.quant.types.get(&name).copied().map(IntType::Q);
                let f = Arr::new(a.shape, q.into_iter().map(|v| v as f32).collect());
                Ok(((name, Val::F(f)), t))
            }
            other => Err(c.bad(format!(
                "input {name:?} is {}; {} reads a quantized (integer) tensor",
                other.kind(),
                c.op()
            ))),
        }
    }

    /// Scale input `i`: finite positive floats known at import, one or `per` of them.
    fn qscale(&self, c: &Ctx, i: usize, per: Option<usize>) -> Result<Vec<f32>> {
        let name = c.n.input.get(i).cloned().unwrap_or_default();
        let a = match self.req(c, i)? {
            Val::F(a) => a,
            other => {
                return Err(c.bad(format!(
                    "the scale {name:?} is {}; isolane needs float scales known at import",
                    other.kind()
                )))
            }
        };
        if let Some(bad) = a.data.iter().find(|s| !(s.is_finite() && **s > 0.0)) {
            return Err(c.bad(format!(
                "the scale {name:?} holds {bad}; scales must be finite and positive"
            )));
        }
        let n = a.data.len();
        if !(n == 1 && a.shape.len() <= 1 || per.is_some_and(|p| n == p && a.shape.len() == 1)) {
            return Err(c.bad(format!(
                "the scale {name:?} has shape {:?}; it must be a scalar{}",
                a.shape,
                per.map_or(String::new(), |p| format!(
                    " or a vector of {p} (per channel)"
                ))
            )));
        }
        Ok(a.data)
    }

    /// Zero point input `i` (absent: 0), one or `per` values, in the range of `t` where known.
    fn qzp(
        &self,
        c: &Ctx,
        i: usize,
        per: Option<usize>,
        t: Option<IntType>,
        runtime_ok: bool,
    ) -> Result<Zp> {
        let name = c.n.input.get(i).cloned().unwrap_or_default();
        let Some(v) = self.get(c, i)? else {
            return Ok(Zp::Const(vec![0.0]));
        };
        let vals: Vec<f32> = match v {
            Val::I(a) => {
                let n = a.data.len();
                if !(n == 1 && a.shape.len() <= 1
                    || per.is_some_and(|p| n == p && a.shape.len() == 1))
                {
                    return Err(c.bad(format!(
                        "the zero point {name:?} has shape {:?}; it must be a scalar{}",
                        a.shape,
                        per.map_or(String::new(), |p| format!(
                            " or a vector of {p} (per channel)"
                        ))
                    )));
                }
                syms_static(c, &Val::I(a), "the zero point")?
                    .into_iter()
                    .map(|z| z as f32)
                    .collect()
            }
            Val::Dyn(d) if runtime_ok && d.shapes[0].iter().product::<usize>() == 1 => {
                return Ok(Zp::Runtime(d))
            }
            other => {
                return Err(c.bad(format!(
                    "the zero point {name:?} is {}; isolane needs integer zero points known at \
                     import{}",
                    other.kind(),
                    if runtime_ok {
                        " or a runtime scalar"
                    } else {
                        ""
                    }
                )))
            }
        };
        if let Some(IntType::Q(q)) = t {
            check_zero_points(c, q, &vals)?;
        }
        Ok(Zp::Const(vals))
    }

    fn zp_const(&self, c: &Ctx, z: Zp, name: &str) -> Result<Vec<f32>> {
        match z {
            Zp::Const(v) => Ok(v),
            Zp::Runtime(_) => Err(c.bad(format!(
                "the {name} zero point must be known at import, not computed at run time"
            ))),
        }
    }

    /// The element type of zero point input `i` (where it is a typed constant).
    fn zp_type(&self, c: &Ctx, i: usize) -> Option<QuantType> {
        let name = c.n.input.get(i)?;
        self.quant.types.get(name).copied()
    }

    /// `x − z` (skipped when z is 0): a quantized tensor's integers relative to its zero point.
    fn minus_zp(&mut self, c: &Ctx, x: (String, Val), z: Zp) -> Result<(String, Val)> {
        match z {
            Zp::Const(v) if v.iter().all(|z| *z == 0.0) => Ok(x),
            Zp::Const(v) if v.len() == 1 => {
                let zc = self.qconst(c, "zero_point", Arr::scalar(v[0]));
                self.qbin(c, Binary::Sub, x, zc, "centred")
            }
            Zp::Const(_) => {
                Err(c.bad("a per-channel zero point is supported on constant weights only"))
            }
            Zp::Runtime(d) => self.qbin(c, Binary::Sub, x, (String::new(), Val::Dyn(d)), "centred"),
        }
    }

    /// `(x − z) · s`: DequantizeLinear of a quantized input with scalar parameters.
    fn dequant_in(&mut self, c: &Ctx, xi: usize, si: usize, zi: usize) -> Result<(String, Val)> {
        let (x, t) = self.qin(c, xi)?;
        let s = self.qscale(c, si, None)?;
        let z = self.qzp(c, zi, None, t, false)?;
        let k = self.minus_zp(c, x, z)?;
        let sc = self.qconst(c, "scale", Arr::scalar(s[0]));
        self.qbin(c, Binary::Mul, k, sc, "dequantized")
    }

    /// The type of a QOperator node's output: its zero point's, else `fallback`'s, else uint8.
    fn out_type(&self, c: &Ctx, zi: usize, fallback: Option<IntType>) -> Result<QuantType> {
        match (self.zp_type(c, zi), fallback) {
            (Some(t), _) | (None, Some(IntType::Q(t))) if !t.is_float() => Ok(t),
            (Some(t), _) => Err(c.bad(format!(
                "the output type {t} is not supported (QOperator outputs are integers)"
            ))),
            _ => Ok(QuantType::Uint8),
        }
    }

    /// Quantizes float `v` with the node's output scale (input `si`) and zero point (`zi`):
    /// `clamp(round(v / s) + z)`, named as the node's output 0.
    fn quant_out(
        &mut self,
        c: &Ctx,
        v: (String, Val),
        si: usize,
        zi: usize,
        fallback: Option<IntType>,
    ) -> Result<Vec<Val>> {
        let t = self.out_type(c, zi, fallback)?;
        let s = self.qscale(c, si, None)?;
        let z = self.qzp(c, zi, None, Some(IntType::Q(t)), false)?;
        let z = self.zp_const(c, z, "output")?[0];
        let sc = self.qconst(c, "scale", Arr::scalar(s[0]));
        let v = self.qbin(c, Binary::Div, v, sc, "scaled")?;
        let out = self.out_name(c, 0);
        let q = self.round_sat(c, v, t, z, Some(out.clone()))?;
        self.quant.ints.insert(out, IntType::Q(t));
        Ok(vec![q])
    }

    /// Requantizes an integer accumulator `acc` by the multiplier `m` (one, or one per
    /// channel, broadcast as `m_shape`): `clamp(round(acc · m) + z)`, as node output 0.
    fn requant(
        &mut self,
        c: &Ctx,
        acc: (String, Val),
        m: Vec<f32>,
        m_shape: Vec<usize>,
        t: QuantType,
        z: f32,
    ) -> Result<Vec<Val>> {
        let mc = self.qconst(c, "multiplier", Arr::new(m_shape, m));
        let v = self.qbin(c, Binary::Mul, acc, mc, "rescaled")?;
        let out = self.out_name(c, 0);
        let q = self.round_sat(c, v, t, z, Some(out.clone()))?;
        self.quant.ints.insert(out, IntType::Q(t));
        Ok(vec![q])
    }

    pub(crate) fn qoperator(&mut self, c: &Ctx, op: &str) -> Result<Vec<Val>> {
        // onnxruntime's own ops exist in its domain only.
        if is_contrib(op) && c.n.domain() != "com.microsoft" {
            return Err(c.unsupported_op());
        }
        match op {
            "QLinearConv" => self.qlinear_conv(c),
            "ConvInteger" => self.conv_integer(c),
            "QLinearMatMul" => self.qlinear_matmul(c, false),
            "QGemm" => self.qlinear_matmul(c, true),
            "MatMulInteger" => self.matmul_integer(c),
            "DynamicQuantizeLinear" => self.dynamic_quantize_linear(c),
            "QLinearAdd" | "QLinearMul" => {
                let a = self.dequant_in(c, 0, 1, 2)?;
                let b = self.dequant_in(c, 3, 4, 5)?;
                let bin = if op == "QLinearAdd" {
                    Binary::Add
                } else {
                    Binary::Mul
                };
                let v = self.qbin(c, bin, a, b, "sum")?;
                let t = self.qin(c, 0)?.1;
                self.quant_out(c, v, 6, 7, t)
            }
            "QLinearLeakyRelu" | "QLinearSigmoid" => {
                let u = if op == "QLinearSigmoid" {
                    Unary::Sigmoid
                } else {
                    Unary::LeakyRelu {
                        alpha: c.float("alpha", 0.01)?,
                    }
                };
                let x = self.dequant_in(c, 0, 1, 2)?;
                let v = self.emit_tmp(c, Op::Unary(u), &[x], "activated")?;
                let t = self.qin(c, 0)?.1;
                self.quant_out(c, (String::new(), v), 3, 4, t)
            }
            "QLinearSoftmax" => {
                let axis = c.int("axis", -1)?;
                let opset = c.int("opset", 13)?;
                let x = self.dequant_in(c, 0, 1, 2)?;
                let r = x.1.rank();
                let a = node_axis(c, axis, r)?;
                // Before opset 13 Softmax works on the input flattened to 2-D at `axis`: the
                // same as opset 13's only when `axis` is the last.
                if opset < 13 && a + 1 != r {
                    return Err(c.unsupported_attr(
                        "axis",
                        format!("{axis} with opset {opset} (isolane: the last axis only)"),
                    ));
                }
                let v = self.emit_tmp(c, Op::Softmax { axis }, &[x], "softmax")?;
                let t = self.qin(c, 0)?.1;
                self.quant_out(c, (String::new(), v), 3, 4, t)
            }
            "QLinearGlobalAveragePool" => self.qlinear_global_average_pool(c),
            "QLinearConcat" => self.qlinear_concat(c),
            _ => Err(c.unsupported_op()),
        }
    }

    /// The powers of two `2^-p` that keep an integer product's accumulator (at most `bound`)
    /// within 2^15 when the weights are scaled by it: exact in f32 (only exponents move), and
    /// in range at fp16 on cuda, where unscaled int8 products would overflow 65504.
    fn shift_for(bound: f64) -> f32 {
        let p = if bound > 32768.0 {
            (bound.log2().ceil() as i32 - 15).min(60)
        } else {
            0
        };
        2f32.powi(-p)
    }

    /// Constant integer weights less their zero point (`zp[channel(i)]` for element `i`, or
    /// the one zero point), and the largest magnitude among them (the accumulator's bound).
    fn centred(q: &[f32], zp: &[f32], channel: impl Fn(usize) -> usize) -> (Vec<f32>, f64) {
        let centred: Vec<f32> = q
            .iter()
            .enumerate()
            .map(|(i, &v)| v - zp[if zp.len() == 1 { 0 } else { channel(i) }])
            .collect();
        let max = centred.iter().fold(0f32, |a, v| a.max(v.abs())) as f64;
        (centred, max)
    }

    fn qlinear_conv(&mut self, c: &Ctx) -> Result<Vec<Val>> {
        let (x, xt) = self.qin(c, 0)?;
        let xs = self.qscale(c, 1, None)?[0];
        let xz = self.qzp(c, 2, None, xt, false)?;
        let xz = self.zp_const(c, xz, "input")?[0];
        let (w, wt) = self.qin(c, 3)?;
        let Val::F(wa) = w.1 else {
            return Err(c.bad(format!(
                "the weight {:?} is a runtime tensor; isolane needs QLinearConv's weights \
                 known at import",
                w.0
            )));
        };
        let m = wa.shape.first().copied().unwrap_or(0);
        let ws = self.qscale(c, 4, Some(m))?;
        let wz = self.qzp(c, 5, Some(m), wt, false)?;
        let wz = self.zp_const(c, wz, "weight")?;
        let ys = self.qscale(c, 6, None)?[0];
        let yt = self.out_type(c, 7, xt)?;
        let yz = self.qzp(c, 7, None, Some(IntType::Q(yt)), false)?;
        let yz = self.zp_const(c, yz, "output")?[0];
        let bias = match self.get(c, 8)? {
            None => None,
            Some(Val::I(b)) if b.data.len() == m => Some(
                syms_static(c, &Val::I(b), "the bias")?
                    .into_iter()
                    .map(|v| v as f64)
                    .collect::<Vec<_>>(),
            ),
            Some(other) => {
                return Err(c.bad(format!(
                    "the bias is {} of shape {:?}; QLinearConv's bias is an int32 vector of {m} \
                     known at import",
                    other.kind(),
                    static_shape(&other)
                )))
            }
        };
        self.integer_conv(c, x, xt, xz, wa, &wz, bias, Some((xs, ws, ys, yt, yz)))
    }

    fn conv_integer(&mut self, c: &Ctx) -> Result<Vec<Val>> {
        let (x, xt) = self.qin(c, 0)?;
        let (w, wt) = self.qin(c, 1)?;
        let Val::F(wa) = w.1 else {
            return Err(c.bad(format!(
                "the weight {:?} is a runtime tensor; isolane needs ConvInteger's weights known \
                 at import",
                w.0
            )));
        };
        let m = wa.shape.first().copied().unwrap_or(0);
        let xz = self.qzp(c, 2, None, xt, true)?;
        let wz = self.qzp(c, 3, Some(m), wt, false)?;
        let wz = self.zp_const(c, wz, "weight")?;
        let x = self.minus_zp(c, x, xz)?;
        self.integer_conv(c, x, xt, 0.0, wa, &wz, None, None)
    }

    /// `conv(x − xz, w − wz) + bias` on integers; with `requant` = (x scale, weight scales,
    /// y scale, y type, y zero point) QLinearConv's output, else ConvInteger's int32.
    #[allow(clippy::too_many_arguments)]
    fn integer_conv(
        &mut self,
        c: &Ctx,
        x: (String, Val),
        xt: Option<IntType>,
        xz: f32,
        w: Arr<f32>,
        wz: &[f32],
        bias: Option<Vec<f64>>,
        requant: Option<(f32, Vec<f32>, f32, QuantType, f32)>,
    ) -> Result<Vec<Val>> {
        if w.shape.len() != 4 {
            return Err(c.bad(format!(
                "only 2-D convolution is supported (weight shape {:?})",
                w.shape
            )));
        }
        let m = w.shape[0];
        let per: usize = w.shape[1..].iter().product();
        let op = self.conv_op(c, &x.1, &Val::F(w.clone()))?;
        let x = self.minus_zp(c, x, Zp::Const(vec![xz]))?;
        let (centred, wmax) = Self::centred(&w.data, wz, |i| i / per.max(1));
        // The accumulator's bound, to scale it into fp16's range (exactly: a power of two).
        // ConvInteger's input arrives centred on a zero point that may be known only at run
        // time: `|x − z|` is then at most the type's span.
        let xmax = match xt {
            Some(IntType::Q(t)) if requant.is_none() => {
                let (lo, hi) = t.range();
                (hi - lo) as f64
            }
            Some(IntType::Q(t)) => {
                let (lo, hi) = t.range();
                (lo - xz).abs().max((hi - xz).abs()) as f64
            }
            _ => 65535.0,
        };
        let bmax = bias
            .as_ref()
            .map_or(0.0, |b| b.iter().fold(0f64, |a, v| a.max(v.abs())));
        let shift = Self::shift_for(per as f64 * xmax * wmax + bmax);
        let wk = self.qconst(
            c,
            "weight",
            Arr::new(w.shape.clone(), centred.iter().map(|v| v * shift).collect()),
        );
        let mut ins = vec![x, wk];
        if let Some(b) = &bias {
            ins.push(self.qconst(
                c,
                "bias",
                Arr::new(vec![m], b.iter().map(|v| *v as f32 * shift).collect()),
            ));
        }
        let Some((xs, ws, ys, yt, yz)) = requant else {
            let out = self.out_name(c, 0);
            let v = self.emit(c, op, &ins, vec![out.clone()])?.remove(0);
            self.quant.ints.insert(out.clone(), IntType::Int32);
            if shift != 1.0 {
                self.quant.shifts.insert(out, 1.0 / shift);
            }
            return Ok(vec![v]);
        };
        let acc = self.emit_tmp(c, op, &ins, "accumulator")?;
        // onnxruntime's multiplier: (x_scale · w_scale) / y_scale, in f32.
        let mult: Vec<f32> = ws.iter().map(|w| xs * w / ys / shift).collect();
        let shape = if mult.len() == 1 {
            vec![]
        } else {
            vec![m, 1, 1]
        };
        self.requant(c, (String::new(), acc), mult, shape, yt, yz)
    }

    /// QLinearMatMul, and onnxruntime's QGemm (`alpha`, `transA`, `transB`, an int32 bias C,
    /// and a float output when it has no output zero point).
    fn qlinear_matmul(&mut self, c: &Ctx, gemm: bool) -> Result<Vec<Val>> {
        let (alpha, trans_a, trans_b) = if gemm {
            (
                c.float("alpha", 1.0)?,
                c.int("transA", 0)? != 0,
                c.int("transB", 0)? != 0,
            )
        } else {
            (1.0, false, false)
        };
        let (ysi, yzi) = if gemm { (7, 8) } else { (6, 7) };
        let (a, at) = self.qin(c, 0)?;
        let a_scale = self.qscale(c, 1, None)?[0];
        let az = self.qzp(c, 2, None, at, false)?;
        let mut a = self.minus_zp(c, a, az)?;
        if trans_a {
            a = self.transpose2(c, a)?;
        }
        let (b, bt) = self.qin(c, 3)?;
        let quantized = !gemm || self.get(c, yzi)?.is_some();
        let ys = match self.get(c, ysi)? {
            Some(_) => Some(self.qscale(c, ysi, None)?[0]),
            None if quantized => {
                return Err(c.bad("the output zero point is given without its scale"))
            }
            None => None,
        };
        let yt = self.out_type(c, yzi, at)?;
        let yz = self.qzp(c, yzi, None, Some(IntType::Q(yt)), false)?;
        let yz = self.zp_const(c, yz, "output")?[0];
        let bias = match self.get(c, 6)? {
            Some(cv) if gemm => {
                let Val::I(ca) = &cv else {
                    return Err(c.bad(format!(
                        "the bias C is {}; QGemm's is an int32 constant",
                        cv.kind()
                    )));
                };
                if ca.data.len() != 1 && !(ca.shape.iter().rev().skip(1).all(|&d| d == 1)) {
                    return Err(c.bad(format!(
                        "the bias C has shape {:?}; isolane supports a scalar or a row of N",
                        ca.shape
                    )));
                }
                Some(syms_static(c, &cv, "the bias")?)
            }
            _ => None,
        };
        let bias_max = bias.as_ref().map_or(0.0, |v| {
            v.iter().fold(0f64, |m, x| m.max((*x as f64).abs()))
        });
        let (b, bs, shift) = match b.1 {
            Val::F(bq) => {
                let bq = if trans_b {
                    if bq.shape.len() != 2 {
                        return Err(c.bad(format!("B has shape {:?}; QGemm's is 2-D", bq.shape)));
                    }
                    bq.transpose(&[1, 0]).map_err(|e| c.bad(e))?
                } else {
                    bq
                };
                if bq.shape.len() < 2 {
                    return Err(c.bad(format!(
                        "the constant B has shape {:?}; isolane needs a matrix",
                        bq.shape
                    )));
                }
                let n = bq.shape[bq.shape.len() - 1];
                let k = bq.shape[bq.shape.len() - 2];
                let bs = self.qscale(c, 4, Some(n))?;
                let bz = self.qzp(c, 5, Some(n), bt, false)?;
                let bz = self.zp_const(c, bz, "B")?;
                let (centred, bmax) = Self::centred(&bq.data, &bz, |i| i % n);
                let amax = match at {
                    Some(IntType::Q(t)) => {
                        let (lo, hi) = t.range();
                        let z = match self.qzp(c, 2, None, at, false)? {
                            Zp::Const(v) => v[0],
                            Zp::Runtime(_) => 0.0,
                        };
                        (lo - z).abs().max((hi - z).abs()) as f64
                    }
                    _ => 65535.0,
                };
                let shift = Self::shift_for(k as f64 * amax * bmax + bias_max);
                let bk = self.qconst(
                    c,
                    "B",
                    Arr::new(bq.shape, centred.iter().map(|v| v * shift).collect()),
                );
                (bk, bs, shift)
            }
            Val::Dyn(d) => {
                let bs = self.qscale(c, 4, None)?;
                let bz = self.qzp(c, 5, None, bt, false)?;
                let mut b = self.minus_zp(c, (String::new(), Val::Dyn(d)), bz)?;
                if trans_b {
                    b = self.transpose2(c, b)?;
                }
                (b, bs, 1.0)
            }
            other => return Err(c.bad(format!("B is {}", other.kind()))),
        };
        let n_cols = bs.len();
        let mut acc = (
            String::new(),
            self.emit_tmp(c, Op::MatMul, &[a, b], "accumulator")?,
        );
        if let Some(v) = &bias {
            let bias = self.qconst(
                c,
                "bias",
                Arr::new(vec![v.len()], v.iter().map(|&x| x as f32 * shift).collect()),
            );
            acc = self.qbin(c, Binary::Add, acc, bias, "biased")?;
        }
        // onnxruntime's multipliers: `a_scale · b_scale / y_scale` (QGemm: `alpha · a_scale ·
        // b_scale`, then `/ y_scale`), left to right in f32; the shift undone exactly.
        let mult: Vec<f32> = bs
            .iter()
            .map(|b| {
                let m = if gemm {
                    alpha * a_scale * b
                } else {
                    a_scale * b
                };
                ys.map_or(m, |y| m / y) / shift
            })
            .collect();
        let shape = if n_cols == 1 { vec![] } else { vec![n_cols] };
        if !quantized {
            let mc = self.qconst(c, "multiplier", Arr::new(shape, mult));
            let out = self.out_name(c, 0);
            return self.emit(c, Op::Binary(Binary::Mul), &[acc, mc], vec![out]);
        }
        self.requant(c, acc, mult, shape, yt, yz)
    }

    /// A 2-D value transposed (folded when it is a constant).
    fn transpose2(&mut self, c: &Ctx, x: (String, Val)) -> Result<(String, Val)> {
        if x.1.rank() != 2 {
            return Err(c.bad(format!(
                "a transposed input must be 2-D, it has rank {}",
                x.1.rank()
            )));
        }
        match x.1 {
            Val::F(a) => {
                let t = a.transpose(&[1, 0]).map_err(|e| c.bad(e))?;
                Ok(self.qconst(c, "transposed", t))
            }
            v => {
                let t = self.emit_tmp(
                    c,
                    Op::Transpose { perm: vec![1, 0] },
                    &[(x.0, v)],
                    "transposed",
                )?;
                Ok((String::new(), t))
            }
        }
    }

    fn matmul_integer(&mut self, c: &Ctx) -> Result<Vec<Val>> {
        let (a, at) = self.qin(c, 0)?;
        let az = self.qzp(c, 2, None, at, true)?;
        let a = self.minus_zp(c, a, az)?;
        let (b, bt) = self.qin(c, 1)?;
        let (b, shift) = match b.1 {
            Val::F(bq) => {
                let n = bq.shape.last().copied().unwrap_or(1);
                let k = bq.shape.len().checked_sub(2).map_or(1, |i| bq.shape[i]);
                let bz = self.qzp(c, 3, Some(n), bt, false)?;
                let bz = self.zp_const(c, bz, "B")?;
                let (centred, bmax) = Self::centred(&bq.data, &bz, |i| i % n);
                // The accumulator's bound (A's zero point may be a runtime value: `|a − z|`
                // is at most the type's span), to scale it into fp16's range.
                let amax = match at {
                    Some(IntType::Q(t)) => {
                        let (lo, hi) = t.range();
                        (hi - lo) as f64
                    }
                    _ => 65535.0,
                };
                let shift = Self::shift_for(k as f64 * amax * bmax);
                let scaled = centred.iter().map(|v| v * shift).collect();
                (self.qconst(c, "B", Arr::new(bq.shape, scaled)), shift)
            }
            v => {
                let bz = self.qzp(c, 3, None, bt, true)?;
                (self.minus_zp(c, (b.0, v), bz)?, 1.0)
            }
        };
        let out = self.out_name(c, 0);
        let v = self.emit(c, Op::MatMul, &[a, b], vec![out.clone()])?;
        self.quant.ints.insert(out.clone(), IntType::Int32);
        if shift != 1.0 {
            self.quant.shifts.insert(out, 1.0 / shift);
        }
        Ok(v)
    }

    /// DynamicQuantizeLinear as ONNX (and onnxruntime) define it: the range `[min(x, 0),
    /// max(x, 0)]` over the whole tensor (the batch included), `scale = (max − min) / 255` (1
    /// for an all-zero tensor), `zero_point = clamp(round(0 − min / scale), 0, 255)` and
    /// `y = clamp(round(x / scale) + zero_point, 0, 255)`.
    fn dynamic_quantize_linear(&mut self, c: &Ctx) -> Result<Vec<Val>> {
        let x = match self.req(c, 0)? {
            Val::Dyn(d) => (c.n.input[0].clone(), Val::Dyn(d)),
            other => {
                return Err(c.bad(format!(
                    "the input is {}; isolane quantizes runtime tensors here",
                    other.kind()
                )))
            }
        };
        let axes: Vec<i64> = (0..x.1.rank() as i64).collect();
        let reduce = |kind| Op::Reduce {
            kind,
            axes: axes.clone(),
            keepdims: false,
        };
        let mx = self.emit_tmp(c, reduce(ReduceKind::Max), std::slice::from_ref(&x), "max")?;
        let mn = self.emit_tmp(c, reduce(ReduceKind::Min), std::slice::from_ref(&x), "min")?;
        let zero = self.qconst(c, "zero", Arr::scalar(0.0));
        let hi = self.qbin(c, Binary::Max, (String::new(), mx), zero.clone(), "hi")?;
        let lo = self.qbin(c, Binary::Min, (String::new(), mn), zero.clone(), "lo")?;
        let span = self.qbin(c, Binary::Sub, hi, lo.clone(), "span")?;
        let qrange = self.qconst(c, "qrange", Arr::scalar(255.0));
        let s0 = self.qbin(c, Binary::Div, span.clone(), qrange, "scale")?;
        // `1 − t` with `t = min(t · 2^14, 1)` eleven times from the span: 1 for a zero span,
        // 0 for any positive one (f32's least subnormal, 2^-149, reaches 2^5), so that an
        // all-zero input gets scale 1. Every constant and step stays within fp16's range
        // (a larger factor such as 2^100 is +inf there, and 0 · inf is NaN).
        let one = self.qconst(c, "one", Arr::scalar(1.0));
        let step = self.qconst(c, "step", Arr::scalar(2f32.powi(14)));
        let mut t = span;
        for _ in 0..11 {
            let u = self.qbin(c, Binary::Mul, t, step.clone(), "span_up")?;
            t = self.qbin(c, Binary::Min, u, one.clone(), "positive")?;
        }
        let t = self.qbin(c, Binary::Sub, one, t, "empty")?;
        let scale_name = self.out_name(c, 1);
        let scale = self
            .emit(c, Op::Binary(Binary::Add), &[s0, t], vec![scale_name])?
            .remove(0);
        let scale = (String::new(), scale);
        let z = self.qbin(c, Binary::Div, lo, scale.clone(), "min_q")?;
        let z = self.qbin(c, Binary::Sub, zero, z, "zero_point")?;
        let zp_name = self.out_name(c, 2);
        let zp = self.round_sat(c, z, QuantType::Uint8, 0.0, Some(zp_name.clone()))?;
        let v = self.qbin(c, Binary::Div, x, scale.clone(), "scaled")?;
        let k = self.round_sat(c, v, QuantType::Int16, 0.0, None)?;
        let k = self.qbin(
            c,
            Binary::Add,
            (String::new(), k),
            (String::new(), zp.clone()),
            "shifted",
        )?;
        let y_name = self.out_name(c, 0);
        let y = self.round_sat(c, k, QuantType::Uint8, 0.0, Some(y_name.clone()))?;
        self.quant.ints.insert(y_name, IntType::Q(QuantType::Uint8));
        self.quant
            .ints
            .insert(zp_name, IntType::Q(QuantType::Uint8));
        Ok(vec![y, scale.1, zp])
    }

    /// onnxruntime's QLinearGlobalAveragePool: the integer sum over the image, `Σ(x − x_zp)`,
    /// requantized by `x_scale / (y_scale · image size)`.
    fn qlinear_global_average_pool(&mut self, c: &Ctx) -> Result<Vec<Val>> {
        let channels_last = c.int("channels_last", 0)? != 0;
        let (x, xt) = self.qin(c, 0)?;
        let Val::Dyn(d) = &x.1 else {
            return Err(c.bad("the input must be a runtime tensor"));
        };
        let r = d.shapes[0].len();
        if r < 3 {
            return Err(c.bad(format!("the input has rank {r}; it must be at least 3")));
        }
        let axes: Vec<usize> = if channels_last {
            (1..r - 1).collect()
        } else {
            (2..r).collect()
        };
        if axes.iter().any(|&a| d.shapes[0][a] != d.shapes[1][a]) {
            return Err(c.bad("the pooled dimensions depend on the batch size"));
        }
        let size: usize = axes.iter().map(|&a| d.shapes[0][a]).product();
        let xs = self.qscale(c, 1, None)?[0];
        let xz = self.qzp(c, 2, None, xt, false)?;
        let ys = self.qscale(c, 3, None)?[0];
        let yt = self.out_type(c, 4, xt)?;
        let yz = self.qzp(c, 4, None, Some(IntType::Q(yt)), false)?;
        let yz = self.zp_const(c, yz, "output")?[0];
        let k = self.minus_zp(c, x, xz)?;
        let sum = self.emit_tmp(
            c,
            Op::Reduce {
                kind: ReduceKind::Sum,
                axes: axes.iter().map(|&a| a as i64).collect(),
                keepdims: true,
            },
            &[k],
            "sum",
        )?;
        let m = xs / (ys * size as f32);
        self.requant(c, (String::new(), sum), vec![m], vec![], yt, yz)
    }

    /// onnxruntime's QLinearConcat: inputs `y_scale, y_zp, (x, x_scale, x_zp)…`; an input with
    /// other parameters than the output's is requantized as onnxruntime's lookup table does,
    /// `clamp(round((x − x_zp) · x_scale / y_scale) + y_zp)`.
    fn qlinear_concat(&mut self, c: &Ctx) -> Result<Vec<Val>> {
        let axis = c.int("axis", 0)?;
        let n = c.n.input.len();
        if n < 5 || !(n - 2).is_multiple_of(3) {
            return Err(c.bad(format!(
                "it has {n} inputs; QLinearConcat takes y_scale, y_zero_point and triples of \
                 (x, x_scale, x_zero_point)"
            )));
        }
        let ys = self.qscale(c, 0, None)?[0];
        let t0 = self.qin(c, 2)?.1;
        let yt = self.out_type(c, 1, t0)?;
        let yz = self.qzp(c, 1, None, Some(IntType::Q(yt)), false)?;
        let yz = self.zp_const(c, yz, "output")?[0];
        let mut ins = Vec::new();
        for j in (2..n).step_by(3) {
            let (x, xt) = self.qin(c, j)?;
            let xs = self.qscale(c, j + 1, None)?[0];
            let xz = self.qzp(c, j + 2, None, xt, false)?;
            let xz = self.zp_const(c, xz, "input")?[0];
            if xs.to_bits() == ys.to_bits() && xz == yz && xt == Some(IntType::Q(yt)) {
                ins.push(x);
                continue;
            }
            let k = self.minus_zp(c, x, Zp::Const(vec![xz]))?;
            let sc = self.qconst(c, "scale", Arr::scalar(xs));
            let v = self.qbin(c, Binary::Mul, k, sc, "dequantized")?;
            let sc = self.qconst(c, "scale", Arr::scalar(ys));
            let v = self.qbin(c, Binary::Div, v, sc, "scaled")?;
            let q = self.round_sat(c, v, yt, yz, None)?;
            ins.push((String::new(), q));
        }
        let r = ins[0].1.rank();
        node_axis(c, axis, r)?;
        let out = self.out_name(c, 0);
        let v = self.emit(c, Op::Concat { axis }, &ins, vec![out.clone()])?;
        self.quant.ints.insert(out, IntType::Q(yt));
        Ok(v)
    }

    /// DequantizeLinear of a runtime integer tensor: `(q − z) · s`, broadcast per axis.
    fn dequantize_ints(&mut self, c: &Ctx, d: Dyn, t: IntType, p: Params) -> Result<Vec<Val>> {
        match t {
            IntType::Q(q) => check_zero_points(c, q, &p.zero_points)?,
            IntType::Int32 if p.zero_points.iter().any(|z| *z != 0.0) => {
                return Err(c.bad("an int32 input's zero point must be 0"))
            }
            IntType::Int32 => {}
        }
        let shape = match p.granularity {
            Granularity::PerTensor => vec![],
            Granularity::PerAxis { axis } => {
                let r = d.shapes[0].len();
                let a = axis as usize;
                let mut s = vec![1; r - a];
                s[0] = p.scales.len();
                s
            }
            Granularity::Blocked { .. } => {
                return Err(c.bad(
                    "blocked dequantization of a runtime tensor is not supported; isolane \
                     supports it on constant weights",
                ))
            }
        };
        // A shifted accumulator's factor goes into the scale (exact: a power of two).
        let mut p = p;
        if let Some(f) = self.quant.shifts.get(&c.n.input[0]) {
            p.scales.iter_mut().for_each(|s| *s *= f);
        }
        let x = (c.n.input[0].clone(), Val::Dyn(d));
        let k = if p.zero_points.iter().all(|z| *z == 0.0) {
            x
        } else {
            let zc = self.qconst(c, "zero_point", Arr::new(shape.clone(), p.zero_points));
            self.qbin(c, Binary::Sub, x, zc, "centred")?
        };
        let sc = self.qconst(c, "scale", Arr::new(shape, p.scales));
        let out = self.out_name(c, 0);
        self.emit(c, Op::Binary(Binary::Mul), &[k, sc], vec![out])
    }
}
