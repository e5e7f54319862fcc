//! Post-training quantization of a float model: calibration on sample inputs, then the model
//! rewritten as a QDQ graph ([`Op::FakeQuant`]) that any backend runs.
//!
//! What is quantized is what int8 / fp8 inference engines quantize (TensorRT's and
//! onnxruntime's defaults): the inputs of every convolution, Linear, MatMul and Gemm.
//! Weights (constant operands) get one symmetric scale per output channel (Conv, Linear) or
//! per tensor (a constant MatMul / Gemm operand), from their largest magnitude; activations one
//! symmetric scale per tensor from the calibration set: the largest magnitude seen (`MinMax`)
//! or a percentile of the magnitudes (`Percentile`), read off a histogram. The graph is first
//! optimised for the batch (BatchNorm folded into its convolution), so the weights quantized
//! are the ones that run.

use std::collections::HashMap;
use std::sync::Arc;

use crate::error::{EngineError, Result};
use crate::ir::{Graph, NodeId, Op, Tensor, ValueId, ValueKind};
use crate::quant::{FakeQuantAttrs, Granularity, QuantType};
use crate::reference::interpret_seeing;

/// How an activation's range is chosen from its calibration values.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum CalibMethod {
    /// The largest magnitude seen.
    MinMax,
    /// The given percentile (e.g. 99.99) of the magnitudes seen: outliers saturate and the
    /// rest get a finer grid.
    Percentile(f64),
}

/// What [`quantize_model`] makes.
#[derive(Clone, Debug, PartialEq)]
pub struct CalibOptions {
    /// [`QuantType::Int8`] or [`QuantType::Float8E4M3Fn`].
    pub qtype: QuantType,
    pub method: CalibMethod,
    /// Bins of each activation's histogram of magnitudes.
    pub bins: usize,
}

impl Default for CalibOptions {
    fn default() -> Self {
        CalibOptions {
            qtype: QuantType::Int8,
            method: CalibMethod::Percentile(99.99),
            bins: 2048,
        }
    }
}

/// The quantized model and what was done.
#[derive(Clone, Debug)]
pub struct Quantized {
    pub graph: Graph,
    /// Activations given a FakeQuant, and weight tensors quantized.
    pub activations: usize,
    pub weights: usize,
}

/// Quantizes `g` for inference at `batch`: calibrates its activations on `samples` (each a
/// list of the graph's inputs at that batch) and returns the QDQ graph.
pub fn quantize_model(
    g: &Graph,
    batch: usize,
    samples: &[Vec<Tensor>],
    opts: &CalibOptions,
) -> Result<Quantized> {
    let bad = |m: String| EngineError::InvalidArgument(format!("calibration: {m}"));
    if !matches!(opts.qtype, QuantType::Int8 | QuantType::Float8E4M3Fn) {
        return Err(bad(format!(
            "quantizing to {} is not supported (int8 and float8e4m3fn are)",
            opts.qtype
        )));
    }
    if samples.is_empty() {
        return Err(bad("the calibration set is empty".into()));
    }
    if let CalibMethod::Percentile(p) = opts.method {
        if !(p > 0.0 && p <= 100.0) {
            return Err(bad(format!("percentile {p} is not in (0, 100]")));
        }
    }
    let g = crate::passes::optimize(g, batch)?;
    let (acts, weights) = targets(&g);
    // Two passes over the calibration set: the largest magnitudes, then histograms over them.
    let mut amax: HashMap<ValueId, f32> = acts.iter().map(|&v| (v, 0.0)).collect();
    run_all(&g, batch, samples, &acts, |v, t| {
        let m = t.data.iter().fold(0f32, |m, x| m.max(x.abs()));
        let e = amax.entry(v).or_insert(0.0);
        *e = e.max(m);
    })?;
    let bins = opts.bins.max(16);
    let range: HashMap<ValueId, f32> = match opts.method {
        CalibMethod::MinMax => amax.clone(),
        CalibMethod::Percentile(p) => {
            let mut hist: HashMap<ValueId, Vec<u64>> =
                acts.iter().map(|&v| (v, vec![0; bins])).collect();
            run_all(&g, batch, samples, &acts, |v, t| {
                let (top, h) = (amax[&v], hist.get_mut(&v));
                if let (true, Some(h)) = (top > 0.0, h) {
                    for x in &t.data {
                        let b = ((x.abs() / top) * bins as f32) as usize;
                        h[b.min(bins - 1)] += 1;
                    }
                }
            })?;
            acts.iter()
                .map(|&v| (v, percentile(&hist[&v], amax[&v], p)))
                .collect()
        }
    };
    let qmax = opts.qtype.range().1;
    let scale_of = |m: f32| {
        if m > 0.0 && m.is_finite() {
            m / qmax
        } else {
            1.0
        }
    };
    let fq = |scales: Vec<f32>, granularity| FakeQuantAttrs {
        qtype: opts.qtype,
        saturate: true,
        granularity,
        zero_points: vec![0.0; scales.len()],
        scales,
    };
    // Rebuild the graph in order, each quantized activation behind its FakeQuant (made once)
    // and each weight replaced by its quantized value.
    let mut out = Graph::new(g.name.clone());
    let mut map: Vec<Option<ValueId>> = vec![None; g.values.len()];
    for &i in &g.inputs {
        if let ValueKind::Input(dims) = &g.values[i].kind {
            map[i] = Some(out.add_input(g.values[i].name.clone(), dims.clone()));
        }
    }
    let mut quantized_act: HashMap<ValueId, ValueId> = HashMap::new();
    let mut n_weights = 0;
    for (ni, n) in g.nodes.iter().enumerate() {
        let mut ins = Vec::with_capacity(n.inputs.len());
        for (k, &v) in n.inputs.iter().enumerate() {
            if map[v].is_none() {
                let ValueKind::Constant(t) = &g.values[v].kind else {
                    return Err(EngineError::graph(&n.name, "input defined after its use"));
                };
                let t = match weights.get(&(ni, k)) {
                    Some(&per_channel) => {
                        n_weights += 1;
                        Arc::new(quantize_weight(
                            t,
                            per_channel,
                            |s| fq(s.to_vec(), granularity_of(per_channel)),
                            &scale_of,
                        )?)
                    }
                    None => t.clone(),
                };
                map[v] = Some(out.add_shared_constant(g.values[v].name.clone(), t));
            }
            let mapped = map[v].unwrap_or(v);
            if acts.contains(&v) && is_activation_input(n, k) {
                let q = match quantized_act.get(&v) {
                    Some(&q) => q,
                    None => {
                        let name = format!("{}/quant", g.values[v].name);
                        let q = out.add_op(
                            name,
                            Op::FakeQuant(fq(vec![scale_of(range[&v])], Granularity::PerTensor)),
                            &[mapped],
                        )?;
                        quantized_act.insert(v, q);
                        q
                    }
                };
                ins.push(q);
            } else {
                ins.push(mapped);
            }
        }
        let names = n
            .outputs
            .iter()
            .map(|&o| g.values[o].name.clone())
            .collect();
        let outs = out.add_node_with_outputs(n.name.clone(), n.op.clone(), &ins, names)?;
        for (&o, id) in n.outputs.iter().zip(outs) {
            map[o] = Some(id);
        }
    }
    for &o in &g.outputs {
        let id = match map[o] {
            Some(id) => id,
            None => match &g.values[o].kind {
                ValueKind::Constant(t) => {
                    out.add_shared_constant(g.values[o].name.clone(), t.clone())
                }
                _ => return Err(EngineError::graph("<outputs>", "output not computed")),
            },
        };
        out.add_output(id)?;
    }
    out.validate()?;
    Ok(Quantized {
        graph: out,
        activations: quantized_act.len(),
        weights: n_weights,
    })
}

fn granularity_of(per_channel: bool) -> Granularity {
    if per_channel {
        Granularity::PerAxis { axis: 0 }
    } else {
        Granularity::PerTensor
    }
}

/// Whether input `k` of `n` is one that gets quantized when it is not a constant.
fn is_activation_input(n: &crate::ir::Node, k: usize) -> bool {
    match n.op {
        Op::Conv(_) | Op::Linear { .. } | Op::Gemm { .. } => k == 0,
        Op::MatMul => k < 2,
        _ => false,
    }
}

/// The runtime values to calibrate (inputs of the quantized ops) and the weights to quantize:
/// `(node, input index) → per output channel`.
fn targets(g: &Graph) -> (Vec<ValueId>, HashMap<(NodeId, usize), bool>) {
    let mut acts = Vec::new();
    let mut weights = HashMap::new();
    for (ni, n) in g.nodes.iter().enumerate() {
        for (k, &v) in n.inputs.iter().enumerate() {
            let constant = g.constant(v).is_some();
            match (&n.op, k, constant) {
                (Op::Conv(_) | Op::Linear { .. }, 1, true) => {
                    weights.insert((ni, k), true);
                }
                (Op::MatMul | Op::Gemm { .. }, 0 | 1, true) => {
                    weights.insert((ni, k), false);
                }
                _ if !constant && is_activation_input(n, k) && !acts.contains(&v) => acts.push(v),
                _ => {}
            }
        }
    }
    (acts, weights)
}

/// A weight fake-quantized with one symmetric scale per output channel (dimension 0) or per
/// tensor.
fn quantize_weight(
    t: &Tensor,
    per_channel: bool,
    attrs: impl Fn(&[f32]) -> FakeQuantAttrs,
    scale_of: &dyn Fn(f32) -> f32,
) -> Result<Tensor> {
    let rows = if per_channel {
        t.shape.first().copied().unwrap_or(1)
    } else {
        1
    };
    let per = t.data.len() / rows.max(1);
    let scales: Vec<f32> = (0..rows)
        .map(|r| {
            scale_of(
                t.data[r * per..(r + 1) * per]
                    .iter()
                    .fold(0f32, |m, x| m.max(x.abs())),
            )
        })
        .collect();
    let a = attrs(&scales);
    let mut data = vec![0.0; t.data.len()];
    a.apply_into(&t.shape, &t.data, &mut data, 0);
    Tensor::new(t.shape.clone(), data)
}

/// Runs the graph node by node on every sample (the reference evaluator), showing each
/// value of `watch` to `see`.
fn run_all(
    g: &Graph,
    batch: usize,
    samples: &[Vec<Tensor>],
    watch: &[ValueId],
    mut see: impl FnMut(ValueId, &Tensor),
) -> Result<()> {
    for (si, inputs) in samples.iter().enumerate() {
        let mut watched = |v: ValueId, t: &Tensor| {
            if watch.contains(&v) {
                see(v, t);
            }
        };
        interpret_seeing(g, batch, inputs, &mut watched).map_err(|e| match e {
            EngineError::InvalidArgument(m) => {
                EngineError::InvalidArgument(format!("calibration sample {si}: {m}"))
            }
            e => e,
        })?;
    }
    Ok(())
}

/// The magnitude below which `p` percent of a histogram's values (of `top` / bins wide bins)
/// lie: the upper edge of the bin where the count reaches it.
fn percentile(hist: &[u64], top: f32, p: f64) -> f32 {
    let total: u64 = hist.iter().sum();
    if total == 0 || top <= 0.0 {
        return top;
    }
    let want = (total as f64 * p / 100.0).ceil() as u64;
    let mut seen = 0;
    for (b, &c) in hist.iter().enumerate() {
        seen += c;
        if seen >= want {
            return top * (b + 1) as f32 / hist.len() as f32;
        }
    }
    top
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Backend, Precision};
    use crate::ir::{ConvAttrs, Dim, Unary};
    use crate::CpuBackend;

    fn rand(n: usize, seed: u64) -> Vec<f32> {
        // splitmix64 → uniform [-1, 1)
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
                let mut z = s;
                z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                z ^= z >> 31;
                (z >> 40) as f32 / (1u64 << 23) as f32 - 1.0
            })
            .collect()
    }

    /// Conv → ReLU → Conv → ReLU → global pool → Linear: 10 classes.
    fn tiny_cnn() -> Graph {
        let mut g = Graph::new("tiny");
        let x = g.add_input(
            "x",
            vec![Dim::Batch, Dim::Fixed(3), Dim::Fixed(10), Dim::Fixed(10)],
        );
        let c = |g: &mut Graph, name: &str, shape: Vec<usize>, seed, s: f32| {
            let n = shape.iter().product();
            let d = rand(n, seed).into_iter().map(|v| v * s).collect();
            g.add_constant(name, Tensor::new(shape, d).unwrap())
        };
        let w1 = c(&mut g, "w1", vec![8, 3, 3, 3], 1, 0.4);
        let b1 = c(&mut g, "b1", vec![8], 2, 0.1);
        let w2 = c(&mut g, "w2", vec![16, 8, 3, 3], 3, 0.2);
        let b2 = c(&mut g, "b2", vec![16], 4, 0.1);
        let wl = c(&mut g, "wl", vec![10, 16], 5, 0.5);
        let bl = c(&mut g, "bl", vec![10], 6, 0.1);
        let conv = Op::Conv(ConvAttrs {
            pads: [1; 4],
            activation: Some(Unary::Relu),
            ..Default::default()
        });
        let h = g.add_op("c1", conv.clone(), &[x, w1, b1]).unwrap();
        let h = g.add_op("c2", conv, &[h, w2, b2]).unwrap();
        let h = g.add_op("pool", Op::GlobalAveragePool, &[h]).unwrap();
        let h = g.add_op("flat", Op::Flatten { axis: 1 }, &[h]).unwrap();
        let y = g
            .add_op("fc", Op::Linear { activation: None }, &[h, wl, bl])
            .unwrap();
        g.add_output(y).unwrap();
        g
    }

    fn argmax(v: &[f32]) -> usize {
        (0..v.len()).fold(0, |b, i| if v[i] > v[b] { i } else { b })
    }

    /// Top-1 agreement with the float model on held-out inputs, and the relative L2 distance.
    fn agreement(f: &Graph, q: &Graph, batch: usize, seeds: std::ops::Range<u64>) -> (f64, f64) {
        let cpu = CpuBackend::new(1);
        let mut mf = cpu.compile(f, batch, Precision::Fp32).unwrap();
        let mut mq = cpu.compile(q, batch, Precision::Fp32).unwrap();
        let (mut same, mut all, mut num, mut den) = (0, 0, 0f64, 0f64);
        for s in seeds {
            let x = rand(mf.input_mut().len(), 1000 + s);
            mf.input_mut().copy_from_slice(&x);
            mq.input_mut().copy_from_slice(&x);
            mf.run().unwrap();
            mq.run().unwrap();
            for (a, b) in mq.output().chunks(10).zip(mf.output().chunks(10)) {
                same += (argmax(a) == argmax(b)) as usize;
                all += 1;
            }
            for (a, b) in mq.output().iter().zip(mf.output()) {
                num += ((a - b) as f64).powi(2);
                den += (*b as f64).powi(2);
            }
        }
        (same as f64 / all as f64, (num / den).sqrt())
    }

    #[test]
    fn int8_and_fp8_models_keep_the_float_models_top1() {
        let g = tiny_cnn();
        let batch = 4;
        let samples: Vec<Vec<Tensor>> = (0..8)
            .map(|s| vec![Tensor::new(vec![batch, 3, 10, 10], rand(1200, 100 + s)).unwrap()])
            .collect();
        for (qtype, method) in [
            (QuantType::Int8, CalibMethod::Percentile(99.99)),
            (QuantType::Int8, CalibMethod::MinMax),
            (QuantType::Float8E4M3Fn, CalibMethod::MinMax),
        ] {
            let opts = CalibOptions {
                qtype,
                method,
                ..Default::default()
            };
            let q = quantize_model(&g, batch, &samples, &opts).unwrap();
            // Both convolutions' and the Linear's inputs; their three weights.
            assert_eq!((q.activations, q.weights), (3, 3), "{qtype} {method:?}");
            let (top1, err) = agreement(&g, &q.graph, batch, 0..16);
            println!("{qtype} {method:?}: top-1 agreement {top1:.3}, rel L2 {err:.2e}");
            // int8 with 127 steps a side moves each quantized tensor by well under 1 %;
            // float8 e4m3fn rounds to 3 mantissa bits (up to 6.25 % an element), three
            // times over here.
            let limit = if qtype.is_float() { 0.15 } else { 0.05 };
            assert!(
                top1 >= 0.9 && err < limit,
                "{qtype} {method:?}: {top1} {err}"
            );
            // It is quantized: not the float model's output.
            assert!(err > 1e-4, "{qtype} {method:?}: {err}");
        }
    }

    #[test]
    fn percentile_reads_the_histogram() {
        let h = [90, 9, 0, 1];
        assert_eq!(percentile(&h, 4.0, 90.0), 1.0);
        assert_eq!(percentile(&h, 4.0, 99.0), 2.0);
        assert_eq!(percentile(&h, 4.0, 100.0), 4.0);
        let g = tiny_cnn();
        let bad = CalibOptions {
            method: CalibMethod::Percentile(0.0),
            ..Default::default()
        };
        let s = vec![vec![Tensor::zeros(vec![1, 3, 10, 10])]];
        assert!(quantize_model(&g, 1, &s, &bad).is_err());
        assert!(quantize_model(&g, 1, &[], &CalibOptions::default()).is_err());
    }
}
