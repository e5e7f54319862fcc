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
//! A child module of `import`, so that it shares the importer's private types.

use super::*;
use crate::quant::{dequantize_all, FakeQuantAttrs, Granularity, QuantType};

/// A QuantizeLinear of a runtime tensor, waiting for its DequantizeLinear.
#[derive(Debug, Clone)]
pub(super) struct Pending {
    /// The QuantizeLinear's float input.
    pub x: Dyn,
    pub attrs: FakeQuantAttrs,
    /// The QuantizeLinear node, for messages.
    pub node: String,
}

/// What the importer remembers for quantization.
#[derive(Debug, Default)]
pub(super) struct State {
    /// The element types of quantized constants (initializers, Constant nodes, QuantizeLinear
    /// outputs): integers are held as i64 and float8 as f32, so int8 and uint8 (or float8 and
    /// float) are told apart here.
    types: HashMap<String, QuantType>,
    /// The FakeQuant made for a QuantizeLinear output, reused by each of its DequantizeLinears.
    made: HashMap<String, Val>,
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
    pub(super) fn note_initializer_type(&mut self, name: &str, onnx_type: i32) {
        if let Some(q) = QuantType::from_onnx(onnx_type) {
            self.quant.types.insert(name.to_string(), q);
        }
    }

    /// Remembers the element type of a Constant node's tensor.
    pub(super) fn note_constant_type(&mut self, c: &Ctx) {
        let t = c.n.attribute.iter().find(|a| a.name() == "value");
        if let (Some(t), Some(out)) = (t.and_then(|a| a.t.as_ref()), c.n.output.first()) {
            self.note_initializer_type(out, t.data_type());
        }
    }

    /// Refuses a node other than DequantizeLinear that reads a quantized runtime tensor.
    pub(super) fn check_quantized_readers(&self, c: &Ctx) -> Result<()> {
        if c.op() == "DequantizeLinear" {
            return Ok(());
        }
        for name in &c.n.input {
            if let Some(Val::Q(p)) = self.vals.get(name) {
                return Err(c.bad(format!(
                    "input {name:?} is the {} output of QuantizeLinear (node {:?}) on a runtime \
                     tensor; isolane runs a quantized runtime tensor only into DequantizeLinear \
                     (the QDQ format: onnxruntime's `quantize_static(..., \
                     quant_format=QuantFormat.QDQ)`), not into QOperator ops such as \
                     QLinearConv, QLinearMatMul, MatMulInteger or ConvInteger",
                    p.attrs.qtype, p.node
                )));
            }
        }
        Ok(())
    }

    pub(super) fn quantize_linear(&mut self, c: &Ctx) -> Result<Vec<Val>> {
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

    pub(super) fn dequantize_linear(&mut self, c: &Ctx) -> Result<Vec<Val>> {
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
            other => Err(c.bad(format!(
                "DequantizeLinear of {} is not supported: its input must be an integer or \
                 float8 constant, or the output of a QuantizeLinear",
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
            let a = norm_axis(c, axis, rank)?;
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
            let a = norm_axis(c, axis, rank)?;
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
    super::super::proto::tensor_proto::DataType::try_from(t)
        .map(|d| d.as_str_name().to_string())
        .unwrap_or_else(|_| format!("data type {t}"))
}
