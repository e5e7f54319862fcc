//! Quantization as ONNX defines it (QuantizeLinear / DequantizeLinear), in f32: the one
//! definition that the ONNX importer folds constant weights with and that the CPU backend runs
//! for [`crate::ir::Op::FakeQuant`] (a QuantizeLinear → DequantizeLinear pair on a runtime
//! tensor).
//!
//! Every step is the spec's and exact in f32: `x / scale` is one IEEE division (onnxruntime
//! divides too, it does not multiply by a reciprocal), rounding is half to even, the integer
//! `q = round(x / scale) + zero_point` is saturated to its type's range, and
//! `(q − zero_point) · scale` is one f32 product of an exact integer. float8 e4m3fn rounds
//! `x / scale` half to even onto its grid (3 mantissa bits, subnormals down to 2⁻⁹) and
//! saturates to ±448, or gives NaN past it when the node says `saturate = 0`.

use std::fmt;

/// The element type a QuantizeLinear produces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QuantType {
    Int8,
    Uint8,
    Int16,
    Uint16,
    /// ONNX FLOAT8E4M3FN: no infinities, one NaN pattern, largest finite 448.
    Float8E4M3Fn,
}

impl QuantType {
    /// The ONNX `TensorProto.DataType` number, and back.
    pub fn onnx_type(self) -> i32 {
        match self {
            QuantType::Uint8 => 2,
            QuantType::Int8 => 3,
            QuantType::Uint16 => 4,
            QuantType::Int16 => 5,
            QuantType::Float8E4M3Fn => 17,
        }
    }

    /// The type of ONNX data type `t`, if isolane quantizes to it.
    pub fn from_onnx(t: i32) -> Option<QuantType> {
        [
            QuantType::Uint8,
            QuantType::Int8,
            QuantType::Uint16,
            QuantType::Int16,
            QuantType::Float8E4M3Fn,
        ]
        .into_iter()
        .find(|q| q.onnx_type() == t)
    }

    /// The saturation range of an integer type (float8: ±448).
    pub fn range(self) -> (f32, f32) {
        match self {
            QuantType::Int8 => (-128.0, 127.0),
            QuantType::Uint8 => (0.0, 255.0),
            QuantType::Int16 => (-32768.0, 32767.0),
            QuantType::Uint16 => (0.0, 65535.0),
            QuantType::Float8E4M3Fn => (-E4M3_MAX, E4M3_MAX),
        }
    }

    pub fn is_float(self) -> bool {
        self == QuantType::Float8E4M3Fn
    }
}

impl fmt::Display for QuantType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            QuantType::Int8 => "int8",
            QuantType::Uint8 => "uint8",
            QuantType::Int16 => "int16",
            QuantType::Uint16 => "uint16",
            QuantType::Float8E4M3Fn => "float8e4m3fn",
        })
    }
}

/// Which scale (and zero point) each element uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Granularity {
    /// One scale for the whole tensor.
    PerTensor,
    /// One scale per index of dimension `axis` (opset 13).
    PerAxis { axis: i64 },
    /// One scale per `block` consecutive indices of dimension `axis` (opset 21): the scales
    /// have the input's shape with that dimension `ceil(d / block)`.
    Blocked { axis: i64, block: usize },
}

/// `DequantizeLinear(QuantizeLinear(x))` with one set of parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct FakeQuantAttrs {
    pub qtype: QuantType,
    /// float8 only: out-of-range values saturate (true, ONNX's default) or become NaN.
    pub saturate: bool,
    pub granularity: Granularity,
    /// C-order, as the granularity says (one per tensor, per axis index, or per block).
    pub scales: Vec<f32>,
    /// One per scale; integers (0 for float8).
    pub zero_points: Vec<f32>,
}

/// The largest finite float8 e4m3fn value.
pub const E4M3_MAX: f32 = 448.0;

/// `v` rounded half to even onto the float8 e4m3fn grid, as an f32 (exact: every e4m3 value
/// is an f32). Past ±448 (after rounding) it saturates to ±448, or is NaN when `saturate` is
/// false; ±∞ likewise; NaN stays NaN.
pub fn round_e4m3fn(v: f32, saturate: bool) -> f32 {
    if v.is_nan() {
        return f32::NAN;
    }
    let a = v.abs();
    if a.is_infinite() {
        return if saturate {
            E4M3_MAX.copysign(v)
        } else {
            f32::NAN
        };
    }
    // The spacing of the grid around `a`: 2^(e − 3) for a normal e4m3 number of exponent e
    // (e ≥ −6), 2⁻⁹ among the subnormals. Powers of two, so the division and product are exact.
    let e = if a >= f32::MIN_POSITIVE {
        ((a.to_bits() >> 23) as i32 - 127).max(-6)
    } else {
        -6
    };
    let quantum = f32::from_bits(((e - 3 + 127) as u32) << 23);
    let r = (a / quantum).round_ties_even() * quantum;
    let r = if r > E4M3_MAX {
        if saturate {
            E4M3_MAX
        } else {
            f32::NAN
        }
    } else {
        r
    };
    r.copysign(v)
}

/// The ONNX QuantizeLinear value of `x` (the integer, or the float8 value, as an f32).
#[inline]
pub fn quantize(x: f32, scale: f32, zero_point: f32, qtype: QuantType, saturate: bool) -> f32 {
    let v = x / scale;
    if qtype.is_float() {
        return round_e4m3fn(v, saturate);
    }
    let (lo, hi) = qtype.range();
    // Adding the (integral) zero point before or after rounding is the same; |v| past 2^24
    // saturates whatever the addition rounds to. NaN stays NaN (the spec leaves it open).
    (v.round_ties_even() + zero_point).clamp(lo, hi)
}

/// The ONNX DequantizeLinear value of `q`.
#[inline]
pub fn dequantize(q: f32, scale: f32, zero_point: f32) -> f32 {
    (q - zero_point) * scale
}

impl FakeQuantAttrs {
    /// How many scales a tensor of `shape` needs, with the granularity's dimension resolved:
    /// `(outer, d, inner, per-axis count)`, or why the scales do not fit it.
    pub fn layout(&self, shape: &[usize]) -> Result<(usize, usize, usize, usize), String> {
        let (axis, per) = match self.granularity {
            Granularity::PerTensor => {
                let n = shape.iter().product();
                return self.count_is(1).map(|_| (1, n, 1, 1));
            }
            Granularity::PerAxis { axis } => (axis, 1),
            Granularity::Blocked { axis, block } => (axis, block.max(1)),
        };
        let a = crate::ir::norm_axis(axis, shape.len())
            .ok_or_else(|| format!("axis {axis} is out of range for shape {shape:?}"))?;
        let outer: usize = shape[..a].iter().product();
        let d = shape[a];
        let inner: usize = shape[a + 1..].iter().product();
        let want = match self.granularity {
            Granularity::Blocked { .. } => outer * d.div_ceil(per) * inner,
            _ => d,
        };
        self.count_is(want)
            .map(|_| (outer, d, inner, d.div_ceil(per)))
    }

    fn count_is(&self, want: usize) -> Result<(), String> {
        if self.scales.len() != want || self.zero_points.len() != want {
            return Err(format!(
                "{} scales and {} zero points for a tensor that needs {want}",
                self.scales.len(),
                self.zero_points.len()
            ));
        }
        Ok(())
    }

    /// The scale index of every element of a C-order tensor of `shape` whose layout is
    /// `(outer, d, inner, blocks)` from [`FakeQuantAttrs::layout`], for element `i`.
    #[inline]
    fn param_index(&self, i: usize, (_, d, inner, blocks): (usize, usize, usize, usize)) -> usize {
        match self.granularity {
            Granularity::PerTensor => 0,
            Granularity::PerAxis { .. } => (i / inner) % d,
            Granularity::Blocked { block, .. } => {
                let (o, rest) = (i / (d * inner), i % (d * inner));
                let (a, j) = (rest / inner, rest % inner);
                (o * blocks + a / block.max(1)) * inner + j
            }
        }
    }

    /// QuantizeLinear of `x` (C-order, `shape`) into `out`: integers (or float8 values) as f32.
    pub fn quantize_into(&self, shape: &[usize], x: &[f32], out: &mut [f32], start: usize) {
        let Ok(l) = self.layout(shape) else { return };
        for (k, (o, &v)) in out.iter_mut().zip(x).enumerate() {
            let p = self.param_index(start + k, l);
            *o = quantize(
                v,
                self.scales[p],
                self.zero_points[p],
                self.qtype,
                self.saturate,
            );
        }
    }

    /// `DequantizeLinear(QuantizeLinear(x))` of the elements `start..start + x.len()` of a
    /// C-order tensor of `shape`, into `out`.
    pub fn apply_into(&self, shape: &[usize], x: &[f32], out: &mut [f32], start: usize) {
        let Ok(l) = self.layout(shape) else { return };
        if self.granularity == Granularity::PerTensor {
            let (s, z) = (self.scales[0], self.zero_points[0]);
            for (o, &v) in out.iter_mut().zip(x) {
                *o = dequantize(quantize(v, s, z, self.qtype, self.saturate), s, z);
            }
            return;
        }
        for (k, (o, &v)) in out.iter_mut().zip(x).enumerate() {
            let p = self.param_index(start + k, l);
            let (s, z) = (self.scales[p], self.zero_points[p]);
            *o = dequantize(quantize(v, s, z, self.qtype, self.saturate), s, z);
        }
    }
}

/// DequantizeLinear of known values `q` (C-order, `shape`) with the scales and zero points of
/// `attrs` (whose `qtype` and `saturate` are not used).
pub fn dequantize_all(
    attrs: &FakeQuantAttrs,
    shape: &[usize],
    q: &[f32],
) -> Result<Vec<f32>, String> {
    let l = attrs.layout(shape)?;
    Ok(q.iter()
        .enumerate()
        .map(|(i, &v)| {
            let p = attrs.param_index(i, l);
            dequantize(v, attrs.scales[p], attrs.zero_points[p])
        })
        .collect())
}

/// `g` with the input FakeQuant of each named layer bypassed: the layer reads what its
/// FakeQuant read, while the FakeQuant's other readers keep it. This is the arithmetic of a
/// calibrated model whose layers fall back to plain float (isolane-cuda's plain float step),
/// against which its plan is checked. A name that is not a node whose first input a FakeQuant
/// makes is left as it is (the check then compares with the quantized arithmetic there).
pub fn without_input_fake_quant(g: &crate::ir::Graph, layers: &[String]) -> crate::ir::Graph {
    let mut out = g.clone();
    for name in layers {
        let Some(ni) = out.nodes.iter().position(|n| &n.name == name) else {
            continue;
        };
        let Some(&x) = out.nodes[ni].inputs.first() else {
            continue;
        };
        if let Some(fq) = out.producer(x) {
            if matches!(out.nodes[fq].op, crate::ir::Op::FakeQuant(_)) {
                out.nodes[ni].inputs[0] = out.nodes[fq].inputs[0];
            }
        }
    }
    out
}

/// The most terms any one sum of products of `g` adds at `batch` (a Conv's `C/groups · kh · kw`,
/// a MatMul's, Gemm's or Linear's K), at least 1: what bounds how far two right f32
/// evaluations of a value that feeds a quantizer may differ (a K-term sum's rounding, `K · 2⁻²⁴`
/// of it at worst, about `√K · 2⁻²⁴` with independent rounding errors).
pub fn longest_sum(g: &crate::ir::Graph, batch: usize) -> crate::Result<usize> {
    use crate::ir::Op;
    let shapes = g.infer_shapes(batch)?;
    let dims = |v: usize| shapes.get(v).map_or(&[][..], |s| s.as_slice());
    let mut k = 1usize;
    for n in &g.nodes {
        let terms = match &n.op {
            Op::Conv(_) => n.inputs.get(1).map(|&w| dims(w).iter().skip(1).product()),
            Op::MatMul | Op::Linear { .. } => {
                n.inputs.first().and_then(|&a| dims(a).last().copied())
            }
            Op::Gemm { trans_a, .. } => n.inputs.first().and_then(|&a| {
                let a = dims(a);
                if *trans_a {
                    a.first().copied()
                } else {
                    a.get(1).copied()
                }
            }),
            _ => None,
        };
        k = k.max(terms.unwrap_or(1));
    }
    Ok(k)
}

/// `g` with the input of every FakeQuant that is not a constant (a weight's is exact)
/// multiplied by `factor` before it is quantized: values that lie within `factor − 1` of a
/// rounding boundary of their grid go to the neighbouring value, one quantization step away,
/// and the rest keep theirs. The plan check measures with it how far such flips move a
/// quantized model's output (isolane-cuda's `check::quantization_sensitivity`).
pub fn nudge_quantizer_inputs(
    g: &crate::ir::Graph,
    factor: f32,
) -> crate::Result<crate::ir::Graph> {
    use crate::ir::{Binary, Op, Tensor, ValueKind};
    let mut out = g.clone();
    let nudged: Vec<usize> = g
        .nodes
        .iter()
        .enumerate()
        .filter(|(_, n)| {
            matches!(n.op, Op::FakeQuant(_))
                && n.inputs
                    .first()
                    .is_some_and(|&x| !matches!(g.values[x].kind, ValueKind::Constant(_)))
        })
        .map(|(i, _)| i)
        .collect();
    if nudged.is_empty() {
        return Ok(out);
    }
    let c = out.add_constant("isolane.quantizer_nudge", Tensor::scalar(factor));
    // Each Mul is made by the builder (its value typed as any), then moved before its
    // FakeQuant: the builder appends, and the graph must stay in topological order.
    let mut before: Vec<(usize, crate::ir::Node)> = Vec::with_capacity(nudged.len());
    for &i in &nudged {
        let x = out.nodes[i].inputs[0];
        let name = format!("{}.nudge", out.nodes[i].name);
        let y = out.add_op(name, Op::Binary(Binary::Mul), &[x, c])?;
        let mul = out.nodes.pop().expect("the node just added");
        out.nodes[i].inputs[0] = y;
        before.push((i, mul));
    }
    let old = std::mem::take(&mut out.nodes);
    let mut before = before.into_iter().peekable();
    for (i, n) in old.into_iter().enumerate() {
        if let Some((_, mul)) = before.next_if(|(at, _)| *at == i) {
            out.nodes.push(mul);
        }
        out.nodes.push(n);
    }
    for ni in 0..out.nodes.len() {
        for index in 0..out.nodes[ni].outputs.len() {
            let o = out.nodes[ni].outputs[index];
            out.values[o].kind = ValueKind::Computed { node: ni, index };
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every finite e4m3fn value, from its bits (sign, 4 exponent bits of bias 7, 3 mantissa
    /// bits; exponent 0 subnormal; 0x7F/0xFF NaN).
    fn e4m3_values() -> Vec<f32> {
        (0u8..=0xFE)
            .filter(|b| b & 0x7F != 0x7F)
            .map(|b| {
                let (s, e, m) = ((b >> 7) as i32, ((b >> 3) & 0xF) as i32, (b & 7) as f32);
                let mag = if e == 0 {
                    m / 8.0 * 2f32.powi(-6)
                } else {
                    (1.0 + m / 8.0) * 2f32.powi(e - 7)
                };
                if s == 1 {
                    -mag
                } else {
                    mag
                }
            })
            .collect()
    }

    #[test]
    fn e4m3_grid_points_are_fixed_and_midpoints_round_to_even() {
        let mut pos: Vec<f32> = e4m3_values().into_iter().filter(|v| *v >= 0.0).collect();
        pos.sort_by(f32::total_cmp);
        pos.dedup();
        assert_eq!(pos.len(), 127);
        assert_eq!(*pos.last().unwrap(), 448.0);
        for &v in &pos {
            assert_eq!(round_e4m3fn(v, true), v);
            assert_eq!(round_e4m3fn(-v, true), -v);
        }
        for w in pos.windows(2) {
            let (a, b) = (w[0], w[1]);
            let mid = (a + b) / 2.0; // exact: both are on a grid finer than f32's
                                     // The even neighbour has an even mantissa: its bits (in units of the grid) are even.
            let q = if a == 0.0 { 2f32.powi(-9) } else { b - a };
            let even = if ((a / q).round() as i64) % 2 == 0 {
                a
            } else {
                b
            };
            assert_eq!(round_e4m3fn(mid, true), even, "midpoint of {a} and {b}");
            assert_eq!(round_e4m3fn(mid.next_down(), true), a);
            assert_eq!(round_e4m3fn(mid.next_up(), true), b);
        }
    }

    #[test]
    fn e4m3_saturates_or_gives_nan_past_448() {
        // 464 is the midpoint of 448 and 480 (which would be the NaN pattern): ties to 448.
        assert_eq!(round_e4m3fn(464.0, false), 448.0);
        assert!(round_e4m3fn(464.5, false).is_nan());
        assert_eq!(round_e4m3fn(464.5, true), 448.0);
        assert_eq!(round_e4m3fn(-1e9, true), -448.0);
        assert_eq!(round_e4m3fn(f32::INFINITY, true), 448.0);
        assert!(round_e4m3fn(f32::NEG_INFINITY, false).is_nan());
        assert!(round_e4m3fn(f32::NAN, true).is_nan());
        // Below half the smallest subnormal (2^-10): zero, with the sign kept.
        assert_eq!(round_e4m3fn(2f32.powi(-10), true), 0.0);
        assert!(round_e4m3fn(-(2f32.powi(-10)), true).is_sign_negative());
        assert_eq!(round_e4m3fn(2f32.powi(-10).next_up(), true), 2f32.powi(-9));
    }

    #[test]
    fn integer_quantization_rounds_half_to_even_and_saturates() {
        let q = |x: f32, t| quantize(x, 0.5, 0.0, t, true);
        assert_eq!(q(1.25, QuantType::Int8), 2.0); // 2.5 → 2
        assert_eq!(q(1.75, QuantType::Int8), 4.0); // 3.5 → 4
        assert_eq!(q(-1.25, QuantType::Int8), -2.0);
        assert_eq!(q(1000.0, QuantType::Int8), 127.0);
        assert_eq!(q(-1000.0, QuantType::Int8), -128.0);
        assert_eq!(q(-3.0, QuantType::Uint8), 0.0);
        assert_eq!(quantize(-3.0, 0.5, 10.0, QuantType::Uint8, true), 4.0);
        assert_eq!(quantize(1e9, 1.0, 3.0, QuantType::Uint16, true), 65535.0);
        assert_eq!(dequantize(4.0, 0.5, 10.0), -3.0);
    }

    #[test]
    fn per_axis_and_blocked_parameters_follow_the_element_index() {
        // x of shape [2, 3, 2], per axis 1: element (i, j, k) uses scale j.
        let a = FakeQuantAttrs {
            qtype: QuantType::Int8,
            saturate: true,
            granularity: Granularity::PerAxis { axis: 1 },
            scales: vec![1.0, 2.0, 4.0],
            zero_points: vec![0.0; 3],
        };
        let x: Vec<f32> = (0..12).map(|i| i as f32 + 0.9).collect();
        let mut y = vec![0.0; 12];
        a.apply_into(&[2, 3, 2], &x, &mut y, 0);
        let want: Vec<f32> = (0..12)
            .map(|i| {
                let s = [1.0, 2.0, 4.0][(i / 2) % 3];
                ((i as f32 + 0.9) / s).round_ties_even() * s
            })
            .collect();
        assert_eq!(y, want);
        // The same elements fed in two pieces give the same result.
        let mut y2 = vec![0.0; 12];
        a.apply_into(&[2, 3, 2], &x[..5], &mut y2[..5], 0);
        a.apply_into(&[2, 3, 2], &x[5..], &mut y2[5..], 5);
        assert_eq!(y2, want);
        // Blocked on axis 1 of [1, 5] by 2: scales [1, 3] (ceil(5 / 2) = 3 blocks).
        let b = FakeQuantAttrs {
            granularity: Granularity::Blocked { axis: 1, block: 2 },
            scales: vec![1.0, 10.0, 100.0],
            zero_points: vec![0.0; 3],
            ..a.clone()
        };
        let mut y = vec![0.0; 5];
        b.apply_into(&[1, 5], &[1.4, 1.4, 14.0, 16.0, 140.0], &mut y, 0);
        assert_eq!(y, vec![1.0, 1.0, 10.0, 20.0, 100.0]);
        assert!(b.layout(&[1, 6]).is_ok() && b.layout(&[1, 7]).is_err());
        assert!(a.layout(&[2, 4, 2]).is_err());
    }

    #[test]
    fn a_named_layer_reads_past_its_input_fake_quant_and_its_neighbours_keep_it() {
        use crate::ir::{Dim, Graph, Op, Unary};
        let mut g = Graph::new("fq");
        let x = g.add_input("x", vec![Dim::Batch, Dim::Fixed(4)]);
        let fq = g
            .add_op(
                "fq",
                Op::FakeQuant(FakeQuantAttrs {
                    qtype: QuantType::Int8,
                    saturate: true,
                    granularity: Granularity::PerTensor,
                    scales: vec![0.5],
                    zero_points: vec![0.0],
                }),
                &[x],
            )
            .unwrap();
        let a = g.add_op("a", Op::Unary(Unary::Relu), &[fq]).unwrap();
        let b = g.add_op("b", Op::Unary(Unary::Neg), &[fq]).unwrap();
        g.add_output(a).unwrap();
        g.add_output(b).unwrap();
        let plain = without_input_fake_quant(&g, &["a".into(), "nowhere".into(), "fq".into()]);
        assert_eq!(plain.nodes[1].inputs, [x], "a reads x");
        assert_eq!(plain.nodes[2].inputs, [fq], "b keeps the FakeQuant");
        assert_eq!(
            plain.nodes[0].inputs,
            [x],
            "the FakeQuant itself is unchanged"
        );
        plain.validate().unwrap();
    }

    /// A FakeQuant's computed input is scaled before it is quantized, a weight's is not; the
    /// graph stays valid and in order, and values near a rounding boundary move one step.
    #[test]
    fn nudged_quantizers_move_only_values_near_a_boundary_one_step() {
        use crate::ir::{Binary, Dim, Graph, Op, Tensor};
        use crate::{Backend, CpuBackend, Precision};
        let attrs = FakeQuantAttrs {
            qtype: QuantType::Int8,
            saturate: true,
            granularity: Granularity::PerTensor,
            scales: vec![1.0],
            zero_points: vec![0.0],
        };
        let mut g = Graph::new("ties");
        let x = g.add_input("x", vec![Dim::Batch, Dim::Fixed(4)]);
        let zero = g.add_constant("zero", Tensor::new(vec![4], vec![0.0; 4]).unwrap());
        let c = g.add_constant(
            "c",
            Tensor::new(vec![4], vec![2.5, -3.5, 2.2, 7.0]).unwrap(),
        );
        // A quantized weight (zeros: exact), whose FakeQuant is not nudged.
        let wq = g
            .add_op("wq", Op::FakeQuant(attrs.clone()), &[zero])
            .unwrap();
        let x0 = g.add_op("x0", Op::Binary(Binary::Mul), &[x, wq]).unwrap();
        let y = g.add_op("y", Op::Binary(Binary::Add), &[x0, c]).unwrap();
        let q = g.add_op("q", Op::FakeQuant(attrs), &[y]).unwrap();
        g.add_output(q).unwrap();
        let run = |g: &Graph| {
            let mut m = CpuBackend::new(1).compile(g, 1, Precision::Fp32).unwrap();
            m.input_mut().copy_from_slice(&[0.3, -1.0, 2.0, 0.5]);
            m.run().unwrap();
            m.output().to_vec()
        };
        // 2.5 and -3.5 round to even (2, -4); 2.2 and 7 are far from a boundary.
        assert_eq!(run(&g), [2.0, -4.0, 2.0, 7.0]);
        let up = nudge_quantizer_inputs(&g, 1.0 + 2f32.powi(-16)).unwrap();
        up.validate().unwrap();
        assert_eq!(
            up.nodes.len(),
            g.nodes.len() + 1,
            "the weight's FakeQuant is not nudged"
        );
        assert_eq!(run(&up), [3.0, -4.0, 2.0, 7.0]);
        let down = nudge_quantizer_inputs(&g, 1.0 - 2f32.powi(-16)).unwrap();
        assert_eq!(run(&down), [2.0, -3.0, 2.0, 7.0]);
        // Without a quantizer of a computed value, the graph is unchanged.
        let mut plain = Graph::new("plain");
        let x = plain.add_input("x", vec![Dim::Batch, Dim::Fixed(4)]);
        plain.add_output(x).unwrap();
        assert_eq!(nudge_quantizer_inputs(&plain, 1.5).unwrap(), plain);
    }

    #[test]
    fn the_longest_sum_is_a_convolutions_or_a_products_reduction() {
        use crate::{build_model, Weights};
        let g = build_model("resnet18", Weights::Synthetic { seed: 1 }).unwrap();
        // layer4's 3×3 convolutions over 512 channels.
        assert_eq!(longest_sum(&g, 1).unwrap(), 512 * 9);
        let g = build_model("vit_b_16", Weights::Synthetic { seed: 1 }).unwrap();
        // The MLP's second Linear reads 3072 features.
        assert_eq!(longest_sum(&g, 1).unwrap(), 3072);
    }
}
