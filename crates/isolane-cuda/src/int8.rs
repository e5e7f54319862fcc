//! The int8 tensor-core path's lowering decisions and its arithmetic, on the CPU (issue 33):
//! which quantized matrix products of an optimised graph can run as an int8 × int8 → int32
//! GEMM (cuBLASLt `CUBLAS_COMPUTE_32I`) followed by one dequantizing epilogue, and what that
//! epilogue computes.
//!
//! A product qualifies when its activation input is a per-tensor, symmetric int8
//! [`Op::FakeQuant`] (zero point 0: the int8 value is `round(x / s)` itself) and its weight is
//! a constant whose every output channel lies on one symmetric int8 grid (what calibration and
//! a QDQ file's weight DequantizeLinear fold to). Then
//! `y[m, n] = Σ_k (qx[m, k]·sx)(qw[n, k]·sw[n]) = sx·sw[n]·Σ_k qx[m, k]·qw[n, k]`, the sum an
//! exact int32 (|Σ| ≤ 128·127·K < 2³¹ for K ≤ [`MAX_K`] = 132 104), so one scaling per output replaces
//! the float GEMM on dequantized values. What is not on this path keeps the fake-quant steps
//! (docs/cuda.md), and [`int8_paths`] says why.
//!
//! float8 e4m3 (`precision = "fp8"`) takes the same path on Hopper's FP8 tensor cores: the
//! activation quantized per tensor onto e4m3's grid, the weight's every channel on one e4m3 grid
//! (`s = amax / 448`), the product accumulated in f32 by cuBLASLt (exact up to f32 rounding of
//! the sum, not bit-exact as int32 is), and the same epilogue.
//!
//! The plan ([`crate::plan`]) consults [`classify`] for each product and emits a
//! [`crate::plan::StepKind::QuantGemm`] for those that qualify.

use isolane_engine::ir::{Graph, NodeId, Op, Tensor, Unary};
use isolane_engine::quant::{Granularity, QuantType};

/// cuBLASLt's int8 IMMA kernels on Hopper take the "TN" format in plain column-major order
/// (the COL32 orders are for Turing and Ampere), with cuBLAS's m and k (our N and K) in
/// multiples of 4 and 4-byte aligned pointers.
pub const INT8_ALIGN: usize = 4;

/// cuBLASLt's FP8 kernels want every dimension and pointer 16-byte aligned: K and N in
/// multiples of 16.
pub const FP8_ALIGN: usize = 16;

/// Largest K whose int32 sum of int8 products cannot overflow (128 · 127 · K < 2³¹).
pub const MAX_K: usize = (i32::MAX as usize) / (128 * 127);

/// A matrix product that runs as an int8 (or fp8) GEMM:
/// `y[M, N] = epilogue(qx[M, K] · qw[N, K]ᵀ)`.
#[derive(Clone, Debug, PartialEq)]
pub struct Int8Gemm {
    /// The node (Linear, or a convolution read as a GEMM over its NHWC im2col).
    pub node: NodeId,
    /// [`QuantType::Int8`] or [`QuantType::Float8E4M3Fn`].
    pub qtype: QuantType,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    /// The activation's scale.
    pub x_scale: f32,
    /// The quantized weights as f32 (integers in [−127, 127], or e4m3 values: exact),
    /// `[N, K]` row-major (a convolution's in its filter's `[M, C, kh, kw]` order per row; the
    /// NHWC lowering reorders them to `[M, kh, kw, C]`).
    pub w: Vec<f32>,
    /// One scale per output channel.
    pub w_scales: Vec<f32>,
    /// The convolution is 1×1, stride 1, unpadded: x itself is the `[M, K]` matrix, no im2col.
    pub direct: bool,
}

/// Which path each quantized matrix product takes: the int8 GEMM, or the fake-quant steps
/// with the reason.
pub fn int8_paths(g: &Graph, batch: usize) -> Vec<(String, Result<Int8Gemm, String>)> {
    let Ok(shapes) = g.infer_shapes(batch) else {
        return Vec::new();
    };
    g.nodes
        .iter()
        .enumerate()
        .filter(|(_, n)| matches!(n.op, Op::Conv(_) | Op::Linear { .. } | Op::MatMul))
        .filter(|(_, n)| quantized_input(g, n.inputs[0]).is_some())
        .map(|(i, n)| (n.name.clone(), classify(g, &shapes, i)))
        .collect()
}

/// The FakeQuant that produces `v`, if one does.
fn quantized_input(g: &Graph, v: usize) -> Option<&isolane_engine::quant::FakeQuantAttrs> {
    let p = g.producer(v)?;
    match &g.nodes[p].op {
        Op::FakeQuant(a) => Some(a),
        _ => None,
    }
}

/// Whether node `ni` (a Conv, Linear or MatMul whose input is quantized) runs as an int8 GEMM.
pub fn classify(g: &Graph, shapes: &[Vec<usize>], ni: NodeId) -> Result<Int8Gemm, String> {
    let n = &g.nodes[ni];
    let fq = quantized_input(g, n.inputs[0]).ok_or("its input is not quantized")?;
    let qtype = fq.qtype;
    if !matches!(qtype, QuantType::Int8 | QuantType::Float8E4M3Fn) {
        return Err(format!(
            "its input is quantized to {qtype}, not int8 or float8e4m3fn"
        ));
    }
    if !fq.saturate {
        return Err("its quantization does not saturate (NaN past the range)".into());
    }
    if fq.granularity != Granularity::PerTensor {
        return Err("its input has more than one scale (per axis or per block)".into());
    }
    if fq.zero_points.first() != Some(&0.0) {
        return Err("its input's zero point is not 0 (asymmetric)".into());
    }
    let x_scale = fq.scales[0];
    if !(x_scale.is_finite() && x_scale > 0.0) {
        return Err(format!(
            "its input's scale {x_scale} is not a positive number"
        ));
    }
    let w = match n.inputs.get(1).and_then(|&v| g.constant(v)) {
        Some(w) => w,
        None => return Err("its weight is not a constant".into()),
    };
    let x_shape = &shapes[n.inputs[0]];
    let (m, nn, k, direct) = match &n.op {
        Op::Linear { .. } => {
            let (&kk, rows) = x_shape.split_last().ok_or("a scalar input")?;
            (rows.iter().product(), w.shape[0], kk, true)
        }
        Op::Conv(a) => {
            if a.groups != 1 {
                return Err(format!(
                    "a grouped convolution ({} groups) is not one GEMM",
                    a.groups
                ));
            }
            let y = &shapes[n.outputs[0]];
            let [mc, c, kh, kw] = w.shape[..] else {
                return Err(format!("a filter of shape {:?}, not 2-D", w.shape));
            };
            let direct = kh == 1 && kw == 1 && a.strides == [1, 1] && a.pads == [0; 4];
            (y[0] * y[2] * y[3], mc, c * kh * kw, direct)
        }
        _ => return Err("a MatMul: only Linear and Conv weights are quantized per channel".into()),
    };
    let (align, lib) = match qtype {
        QuantType::Int8 => (INT8_ALIGN, "int8"),
        _ => (FP8_ALIGN, "fp8"),
    };
    if k % align != 0 || nn % align != 0 {
        return Err(format!(
            "K = {k} and N = {nn} must be multiples of {align} for cuBLASLt's {lib} kernels"
        ));
    }
    if qtype == QuantType::Int8 && k > MAX_K {
        return Err(format!(
            "K = {k} could overflow the int32 sum (at most {MAX_K})"
        ));
    }
    let (wq, w_scales) = match qtype {
        QuantType::Int8 => int8_weights(w)?,
        _ => fp8_weights(w)?,
    };
    Ok(Int8Gemm {
        node: ni,
        qtype,
        m,
        n: nn,
        k,
        x_scale,
        w: wq,
        w_scales,
        direct,
    })
}

/// The integers and per-output-channel scales of a weight whose every channel (dimension 0)
/// lies on a symmetric int8 grid, such that `q · s` gives back each f32 weight exactly; or the
/// first channel that does not.
///
/// The grid's scale is not stored (the weights were folded to f32 at import or calibration),
/// so it is found from the channel's largest magnitude, which symmetric quantization puts at
/// ±127 (`s = amax / 127`, or an f32 neighbour of it: `fl(127 · s) / 127` may round away).
pub fn int8_weights(w: &Tensor) -> Result<(Vec<f32>, Vec<f32>), String> {
    channel_grids(w, 127.0, "int8", on_grid)
}

/// [`int8_weights`] for float8 e4m3: each channel's values on e4m3's grid scaled by `s`
/// (`amax` at ±448), given back exactly by `q · s`.
pub fn fp8_weights(w: &Tensor) -> Result<(Vec<f32>, Vec<f32>), String> {
    channel_grids(
        w,
        isolane_engine::quant::E4M3_MAX,
        "float8 e4m3",
        |row, s| {
            row.iter()
                .map(|&v| {
                    let q = isolane_engine::quant::round_e4m3fn(v / s, true);
                    (q * s == v).then_some(q)
                })
                .collect()
        },
    )
}

/// Each channel's grid values and scale (`amax / top` or an f32 neighbour), where `fit` puts
/// the whole channel on the grid of a scale exactly.
fn channel_grids(
    w: &Tensor,
    top: f32,
    what: &str,
    fit: impl Fn(&[f32], f32) -> Option<Vec<f32>>,
) -> Result<(Vec<f32>, Vec<f32>), String> {
    let rows = w.shape.first().copied().unwrap_or(1).max(1);
    let per = w.data.len() / rows;
    let mut q = Vec::with_capacity(w.data.len());
    let mut scales = Vec::with_capacity(rows);
    for r in 0..rows {
        let row = &w.data[r * per..(r + 1) * per];
        let amax = row.iter().fold(0f32, |m, x| m.max(x.abs()));
        if amax == 0.0 {
            // An all-zero channel is on every grid.
            q.extend(std::iter::repeat_n(0f32, per));
            scales.push(1.0);
            continue;
        }
        let s0 = amax / top;
        let found = [s0, s0.next_up(), s0.next_down()]
            .into_iter()
            .find_map(|s| fit(row, s).map(|qs| (s, qs)));
        let Some((s, qs)) = found else {
            return Err(format!(
                "output channel {r} of the weight is not on one {what} grid (not a quantized weight)"
            ));
        };
        q.extend(qs);
        scales.push(s);
    }
    Ok((q, scales))
}

/// The integers of `row` on the grid of scale `s`, if each one's `q · s` is the value exactly.
fn on_grid(row: &[f32], s: f32) -> Option<Vec<f32>> {
    row.iter()
        .map(|&v| {
            let q = (v / s).round_ties_even();
            (q.abs() <= 127.0 && q * s == v).then_some(q)
        })
        .collect()
}

/// The byte of float8 e4m3fn (1 sign, 4 exponent bits biased by 7, 3 mantissa bits) that
/// holds `v`, a value on its grid (what [`fp8_weights`] and the quantize kernel produce);
/// NaN for anything else is the caller's bug, so it maps to e4m3fn's NaN, 0x7f.
pub fn e4m3_bits(v: f32) -> u8 {
    let sign = if v.is_sign_negative() { 0x80u8 } else { 0 };
    let a = v.abs();
    if a.is_nan() || a > isolane_engine::quant::E4M3_MAX {
        return 0x7f;
    }
    if a < 2f32.powi(-6) {
        // Subnormal: a multiple of 2⁻⁹.
        let m = (a * 512.0).round_ties_even() as u8;
        return sign | m.min(7);
    }
    let bits = a.to_bits();
    let e = ((bits >> 23) as i32 - 127 + 7) as u8;
    let m = ((bits >> 20) & 7) as u8;
    sign | (e << 3) | m
}

/// `qx[M, K] · qw[N, K]ᵀ` in int32, what the tensor cores compute (exact).
pub fn int8_gemm_reference(qx: &[i8], qw: &[f32], m: usize, n: usize, k: usize) -> Vec<i32> {
    let mut acc = vec![0i32; m * n];
    for i in 0..m {
        let a = &qx[i * k..(i + 1) * k];
        for j in 0..n {
            let b = &qw[j * k..(j + 1) * k];
            acc[i * n + j] = a.iter().zip(b).map(|(&x, &w)| x as i32 * w as i32).sum();
        }
    }
    acc
}

/// The activation's int8 values as the quantize kernel makes them: `round(x / s)` half to
/// even, saturated to [−128, 127] (the FakeQuant's own rule, `isolane_engine::quant`).
pub fn quantize_reference(x: &[f32], s: f32) -> Vec<i8> {
    x.iter()
        .map(|&v| isolane_engine::quant::quantize(v, s, 0.0, QuantType::Int8, true) as i8)
        .collect()
}

/// The epilogue: `act(acc[m, n] · (sx · sw[n]) + bias[n])`, in f32, row-major `[M, N]`. The
/// product of scales is formed once per channel (one rounding), then one multiply-add per
/// output: within a few ulp of the float GEMM on dequantized values, which rounds K products
/// and K sums.
pub fn epilogue_reference(
    acc: &[i32],
    n: usize,
    x_scale: f32,
    w_scales: &[f32],
    bias: Option<&[f32]>,
    act: Option<Unary>,
) -> Vec<f32> {
    let scale: Vec<f32> = w_scales.iter().map(|&s| x_scale * s).collect();
    acc.iter()
        .enumerate()
        .map(|(i, &a)| {
            let c = i % n;
            let v = (a as f32).mul_add(scale[c], bias.map_or(0.0, |b| b[c]));
            match act {
                Some(Unary::Relu) => v.max(0.0),
                Some(Unary::Relu6) => v.clamp(0.0, 6.0),
                _ => v,
            }
        })
        .collect()
}

/// The inverse output scale cuDNN's fused quantized graph multiplies by before writing its
/// output quantized (`crate::plan::QuantGraphConsts::y_inv`): `1 / s` rounded to f32. The
/// graph's int8 fusion patterns have a multiply, not a division.
pub fn inverse_scale(s: f32) -> f32 {
    1.0 / s
}

/// One output of cuDNN's fused quantized graph as its f32 pointwise steps compute it: the
/// int32 (or f32) sum `acc` times the channel's scale, plus bias and residual, ReLU.
pub fn graph_value(acc: f32, scale: f32, bias: f32, residual: f32, relu: bool) -> f32 {
    let v = acc * scale + bias + residual;
    if relu {
        v.max(0.0)
    } else {
        v
    }
}

/// The activations a quantized graph applies: none, ReLU, and ReLU with an upper clip (ReLU6,
/// `Clip(0, max)`: cuDNN's `RELU_FWD` with `RELU_UPPER_CLIP`, the same f32 `min(max(v, 0),
/// max)`); `(relu, upper clip)`, `None` for any other.
pub fn quant_graph_act(act: Option<isolane_engine::ir::Unary>) -> Option<(bool, Option<f32>)> {
    match act {
        None => Some((false, None)),
        Some(isolane_engine::ir::Unary::Relu) => Some((true, None)),
        Some(isolane_engine::ir::Unary::Relu6) => Some((true, Some(6.0))),
        Some(isolane_engine::ir::Unary::Clip { min, max })
            if min == 0.0 && max > 0.0 && max.is_finite() =>
        {
            Some((true, Some(max)))
        }
        Some(_) => None,
    }
}

/// The graph's output quantized for the next convolution: `v · y_inv` converted to `qtype`
/// as the GPU converts f32 (round to nearest even, saturated; NaN to 0 for int8). ONNX's
/// exact rule divides by the scale instead ([`quantize_reference`]); the two differ only where
/// `v / s` lies within an ulp of a rounding boundary, and then by one step
/// (`graph_requantize_is_the_exact_rule_but_at_ties` holds it).
pub fn graph_requantize(v: f32, y_inv: f32, qtype: QuantType) -> f32 {
    let r = v * y_inv;
    match qtype {
        QuantType::Int8 if r.is_nan() => 0.0,
        QuantType::Int8 => r.round_ties_even().clamp(-128.0, 127.0),
        _ => isolane_engine::quant::round_e4m3fn(r, true),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use isolane_engine::calibrate::{quantize_model, CalibOptions};
    use isolane_engine::ir::{ConvAttrs, Dim};
    use isolane_engine::quant::FakeQuantAttrs;
    use isolane_engine::{Backend, CpuBackend, Precision};

    fn rand(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    fn constant(g: &mut Graph, name: &str, shape: Vec<usize>, seed: u64, s: f32) -> usize {
        let n = shape.iter().product();
        let d = rand(n, seed).into_iter().map(|v| v * s).collect();
        g.add_constant(name, Tensor::new(shape, d).unwrap())
    }

    /// Conv 3×3 (K = 27) → Conv 1×1 (K = 8) → Conv 3×3 (K = 72) → pool → Linear (K = 16),
    /// quantized by calibration.
    fn quantized_cnn(batch: usize) -> (Graph, Graph) {
        let mut g = Graph::new("q");
        let x = g.add_input(
            "x",
            vec![Dim::Batch, Dim::Fixed(3), Dim::Fixed(8), Dim::Fixed(8)],
        );
        let relu = |pads| {
            Op::Conv(ConvAttrs {
                pads,
                activation: Some(Unary::Relu),
                ..Default::default()
            })
        };
        let w1 = constant(&mut g, "w1", vec![8, 3, 3, 3], 1, 0.4);
        let b1 = constant(&mut g, "b1", vec![8], 2, 0.1);
        let w2 = constant(&mut g, "w2", vec![8, 8, 1, 1], 3, 0.4);
        let b2 = constant(&mut g, "b2", vec![8], 4, 0.1);
        let w3 = constant(&mut g, "w3", vec![16, 8, 3, 3], 5, 0.2);
        let b3 = constant(&mut g, "b3", vec![16], 6, 0.1);
        let wl = constant(&mut g, "wl", vec![12, 16], 7, 0.5);
        let bl = constant(&mut g, "bl", vec![12], 8, 0.1);
        let h = g.add_op("c1", relu([1; 4]), &[x, w1, b1]).unwrap();
        let h = g.add_op("c2", relu([0; 4]), &[h, w2, b2]).unwrap();
        let h = g.add_op("c3", relu([1; 4]), &[h, w3, b3]).unwrap();
        let h = g.add_op("pool", Op::GlobalAveragePool, &[h]).unwrap();
        let h = g.add_op("flat", Op::Flatten { axis: 1 }, &[h]).unwrap();
        let y = g
            .add_op("fc", Op::Linear { activation: None }, &[h, wl, bl])
            .unwrap();
        g.add_output(y).unwrap();
        let samples: Vec<Vec<Tensor>> = (0..4)
            .map(|s| vec![Tensor::new(vec![batch, 3, 8, 8], rand(batch * 192, 50 + s)).unwrap()])
            .collect();
        let q = quantize_model(&g, batch, &samples, &CalibOptions::default()).unwrap();
        (g, q.graph)
    }

    #[test]
    fn lowering_decisions_name_the_path_of_each_quantized_product() {
        let (_, q) = quantized_cnn(2);
        let paths = int8_paths(&q, 2);
        let by_name = |name: &str| {
            paths
                .iter()
                .find(|(n, _)| n == name)
                .unwrap_or_else(|| panic!("{name} in {paths:?}"))
                .1
                .clone()
        };
        // K = 3·3·3 = 27: cuBLASLt's int8 kernels want multiples of 4.
        let e = by_name("c1").unwrap_err();
        assert!(e.contains("K = 27"), "{e}");
        let c2 = by_name("c2").unwrap();
        assert_eq!((c2.m, c2.n, c2.k, c2.direct), (2 * 8 * 8, 8, 8, true));
        let c3 = by_name("c3").unwrap();
        assert_eq!((c3.m, c3.n, c3.k, c3.direct), (2 * 8 * 8, 16, 72, false));
        let fc = by_name("fc").unwrap();
        assert_eq!((fc.m, fc.n, fc.k), (2, 12, 16));
        // Per-channel scales recovered; every weight given back exactly by q · s.
        let w = q.constant(q.nodes[fc.node].inputs[1]).unwrap();
        for (i, &v) in w.data.iter().enumerate() {
            assert_eq!(fc.w[i] * fc.w_scales[i / 16], v);
        }
        assert!(fc.w.iter().any(|&v| v.abs() == 127.0));
    }

    #[test]
    fn what_is_not_int8_keeps_the_fake_quant_path_with_its_reason() {
        let (float, q) = quantized_cnn(1);
        // The float model has no quantized product at all.
        assert!(int8_paths(&float, 1).is_empty());
        // A weight off the grid (the float weight behind a quantized input).
        let mut g = q.clone();
        let fc = g.nodes.iter().position(|n| n.name == "fc").unwrap();
        let wv = g.nodes[fc].inputs[1];
        let wl_id = float.values.iter().position(|v| v.name == "wl").unwrap();
        let wl = float.constant(wl_id).unwrap().clone();
        g.values[wv].kind = isolane_engine::ir::ValueKind::Constant(wl);
        let shapes = g.infer_shapes(1).unwrap();
        let e = classify(&g, &shapes, fc).unwrap_err();
        assert!(e.contains("not on one int8 grid"), "{e}");
        // uint8 activations, and an asymmetric zero point.
        for (qtype, zp, want) in [
            (QuantType::Uint8, 0.0, "uint8"),
            (QuantType::Int8, 3.0, "zero point"),
        ] {
            let mut g = q.clone();
            let p = g.producer(g.nodes[fc].inputs[0]).unwrap();
            if let Op::FakeQuant(a) = &mut g.nodes[p].op {
                *a = FakeQuantAttrs {
                    qtype,
                    zero_points: vec![zp],
                    ..a.clone()
                };
            }
            let e = classify(&g, &shapes, fc).unwrap_err();
            assert!(e.contains(want), "{e}");
        }
    }

    #[test]
    fn int8_gemm_and_epilogue_compute_what_the_fake_quant_graph_does() {
        // Linear 64 → 32 behind an int8 FakeQuant, quantized weights: the CPU backend's
        // FakeQuant graph against quantize → int32 GEMM → epilogue.
        let (m, k, n) = (5, 64, 32);
        let mut g = Graph::new("lin");
        let x = g.add_input("x", vec![Dim::Batch, Dim::Fixed(k)]);
        let w = constant(&mut g, "w", vec![n, k], 11, 0.3);
        let b = constant(&mut g, "b", vec![n], 12, 0.2);
        let h = g.add_op("pre", Op::Unary(Unary::Identity), &[x]).unwrap();
        let y = g
            .add_op(
                "fc",
                Op::Linear {
                    activation: Some(Unary::Relu),
                },
                &[h, w, b],
            )
            .unwrap();
        g.add_output(y).unwrap();
        let samples = vec![vec![Tensor::new(vec![m, k], rand(m * k, 13)).unwrap()]];
        let q = quantize_model(&g, m, &samples, &CalibOptions::default())
            .unwrap()
            .graph;
        let paths = int8_paths(&q, m);
        let Some((_, Ok(gemm))) = paths.iter().find(|(name, _)| name == "fc") else {
            panic!("{paths:?}");
        };
        let cpu = CpuBackend::new(1);
        let mut model = cpu.compile(&q, m, Precision::Fp32).unwrap();
        let input = rand(m * k, 99);
        model.input_mut().copy_from_slice(&input);
        model.run().unwrap();
        let want = model.output().to_vec();

        let qx = quantize_reference(&input, gemm.x_scale);
        let acc = int8_gemm_reference(&qx, &gemm.w, m, n, k);
        let bias = q.constant(q.nodes[gemm.node].inputs[2]).unwrap();
        let got = epilogue_reference(
            &acc,
            n,
            gemm.x_scale,
            &gemm.w_scales,
            Some(&bias.data),
            Some(Unary::Relu),
        );
        let top = want.iter().fold(0f32, |a, v| a.max(v.abs()));
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            // Both round: the float GEMM K products and sums, the epilogue two steps.
            assert!((a - b).abs() <= 1e-5 * top, "output {i}: {a} against {b}");
        }
        assert!(want.iter().any(|&v| v > 0.0) && want.contains(&0.0));
    }

    #[test]
    fn the_int32_sum_cannot_overflow_below_max_k() {
        let k = MAX_K;
        let acc = int8_gemm_reference(&vec![-128; k], &vec![-127.0; k], 1, 1, k);
        assert_eq!(acc[0] as i64, 128 * 127 * k as i64);
        assert!(128 * 127 * (k as i64 + 1) > i32::MAX as i64);
    }

    /// The value of e4m3fn byte `b` (the spec's decoding), NaN for 0x7f / 0xff.
    fn e4m3_value(b: u8) -> f32 {
        let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
        let (e, m) = ((b >> 3) & 15, b & 7);
        if e == 15 && m == 7 {
            return f32::NAN;
        }
        sign * if e == 0 {
            m as f32 * 2f32.powi(-9)
        } else {
            (1.0 + m as f32 / 8.0) * 2f32.powi(e as i32 - 7)
        }
    }

    #[test]
    fn e4m3_bits_encodes_every_value_of_the_grid() {
        for b in 0..=255u8 {
            let v = e4m3_value(b);
            if v.is_nan() {
                assert_eq!(e4m3_bits(v) & 0x7f, 0x7f);
                continue;
            }
            // −0 and +0 are both zero; every other byte comes back as itself.
            assert_eq!(e4m3_value(e4m3_bits(v)), v, "byte {b:#04x} = {v}");
            if v != 0.0 {
                assert_eq!(e4m3_bits(v), b, "{v}");
            }
        }
        assert_eq!(e4m3_bits(448.0), 0x7e);
        assert_eq!(e4m3_bits(-2f32.powi(-9)), 0x81);
    }

    #[test]
    fn fp8_weights_recover_each_channels_e4m3_grid() {
        let (m, k) = (3, 16);
        let scales = [0.01f32, 0.5, 3.0];
        let mut data = Vec::new();
        for s in scales {
            for j in 0..k {
                // e4m3 values from the subnormals to 448, one channel reaching ±448.
                let q = isolane_engine::quant::round_e4m3fn((j as f32 - 7.5) * 59.7, true);
                data.push(q * s);
            }
        }
        let w = Tensor::new(vec![m, k], data.clone()).unwrap();
        let (q, s) = fp8_weights(&w).unwrap();
        for (i, v) in data.iter().enumerate() {
            assert_eq!(q[i] * s[i / k], *v, "weight {i}");
            assert!(!e4m3_value(e4m3_bits(q[i])).is_nan());
        }
        // A weight off every e4m3 grid (0.3 and 0.31 share none with 448 at the top) is
        // named by its channel.
        let mut off = data;
        off[k + 1] = 0.5 * 0.31;
        let e = fp8_weights(&Tensor::new(vec![m, k], off).unwrap()).unwrap_err();
        assert!(e.contains("output channel 1") && e.contains("e4m3"), "{e}");
    }

    #[test]
    fn graph_requantize_is_the_exact_rule_but_at_ties() {
        use isolane_engine::quant::quantize;
        let mut differ = 0;
        let mut total = 0;
        for (si, s) in [0.0173f32, 0.05, 0.1, 0.3333, 1.7, 7.0]
            .into_iter()
            .enumerate()
        {
            let inv = inverse_scale(s);
            for (i, v) in rand(20_000, 31 + si as u64).into_iter().enumerate() {
                // Values across the whole grid and past it (saturation).
                let v = v * s * 160.0;
                let exact = quantize(v, s, 0.0, QuantType::Int8, true);
                let got = graph_requantize(v, inv, QuantType::Int8);
                assert!(
                    (got - exact).abs() <= 1.0,
                    "{v} / {s}: {got} against {exact}"
                );
                differ += (got != exact) as usize;
                total += 1;
                // fp8: one e4m3 step at most, the same value almost always.
                let e = quantize(v, s, 0.0, QuantType::Float8E4M3Fn, true);
                let g = graph_requantize(v, inv, QuantType::Float8E4M3Fn);
                assert!(
                    (g - e).abs() <= e.abs().max(g.abs()) / 8.0 + 1e-6,
                    "{i}: {g} {e}"
                );
            }
            assert_eq!(graph_requantize(1e9, inv, QuantType::Int8), 127.0);
            assert_eq!(graph_requantize(-1e9, inv, QuantType::Int8), -128.0);
        }
        assert_eq!(graph_requantize(f32::NAN, 1.0, QuantType::Int8), 0.0);
        // Exactly half-way values round to even, as ONNX's rule does.
        for (v, want) in [(2.5, 2.0), (3.5, 4.0), (-2.5, -2.0), (0.5, 0.0)] {
            assert_eq!(graph_requantize(v, 1.0, QuantType::Int8), want, "{v}");
        }
        // A multiply by the rounded reciprocal lands on the other side of a boundary only
        // for values within an ulp of it: a handful in 120 000.
        assert!(differ * 1000 < total, "{differ} of {total} differ");
    }

    #[test]
    fn the_graph_value_scales_adds_and_clips() {
        assert_eq!(graph_value(10.0, 0.5, 1.0, -2.0, false), 4.0);
        assert_eq!(graph_value(-10.0, 0.5, 1.0, 0.0, true), 0.0);
        assert_eq!(graph_value(-10.0, 0.5, 1.0, 0.0, false), -4.0);
    }
}
