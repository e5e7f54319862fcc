//! Post-training quantization of a float model: calibration on sample inputs, then the model
//! rewritten as a QDQ graph ([`Op::FakeQuant`]) that any backend runs.
//!
//! What is quantized is what int8 / fp8 inference engines quantize (TensorRT's and
//! onnxruntime's defaults): the inputs of every convolution, Linear, MatMul and Gemm, and a
//! convolution's fused residual (a residual block's skip).
//! Weights (constant operands) get one symmetric scale per output channel (Conv, Linear) or
//! per tensor (a constant MatMul / Gemm operand), from their largest magnitude; activations one
//! symmetric scale per tensor from the calibration set: the largest magnitude seen (`MinMax`)
//! or a percentile of the magnitudes (`Percentile`), read off a histogram, or the clipping
//! threshold that loses the least information (`Entropy`, TensorRT's KL-divergence method).
//! The graph is first optimised for the batch (BatchNorm folded into its convolution), so the
//! weights quantized are the ones that run.
//!
//! [`load_calibration_set`] reads a folder of `.npy` files or images into samples, and
//! [`top1_agreement`] says how often the quantized model's top-1 class is the float model's;
//! [`score_top1`] scores any backend's output on labelled items against the labels and the
//! fp32 [`cpu_reference`].

use std::collections::HashMap;
use std::path::{Path, PathBuf};
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
    /// The threshold whose clipped 128-level quantization of the magnitudes' histogram is
    /// closest to it in KL divergence (TensorRT's entropy calibration; int8 only: float8's
    /// grid is not uniform). Exact zeros are left out of the histogram, and the model's own
    /// input keeps its largest magnitude (see [`quantize_model`]).
    Entropy,
}

/// The method names a scenario's `calibration_method` and the command line take.
pub const METHOD_NAMES: [&str; 3] = ["percentile", "entropy", "minmax"];

impl CalibMethod {
    /// The method called `name` ([`METHOD_NAMES`]); percentile is the 99.99th.
    pub fn from_name(name: &str) -> Option<CalibMethod> {
        match name {
            "percentile" => Some(CalibMethod::Percentile(99.99)),
            "entropy" => Some(CalibMethod::Entropy),
            "minmax" => Some(CalibMethod::MinMax),
            _ => None,
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            CalibMethod::MinMax => "minmax",
            CalibMethod::Percentile(_) => "percentile",
            CalibMethod::Entropy => "entropy",
        }
    }
}

/// What [`quantize_model`] makes.
#[derive(Clone, Debug, PartialEq)]
pub struct CalibOptions {
    /// [`QuantType::Int8`] or [`QuantType::Float8E4M3Fn`].
    pub qtype: QuantType,
    pub method: CalibMethod,
    /// Bins of each activation's histogram of magnitudes.
    pub bins: usize,
    /// Quantize a convolution's fused residual too (a residual block's skip; on by default,
    /// as TensorRT and onnxruntime's QDQ format do): the skip then stays in bytes between
    /// blocks. Off, the skip is added in floats (a little closer to the float model, twice
    /// the memory traffic where a block's output is stored).
    pub residual_skips: bool,
}

impl Default for CalibOptions {
    fn default() -> Self {
        CalibOptions {
            qtype: QuantType::Int8,
            method: CalibMethod::Percentile(99.99),
            bins: 2048,
            residual_skips: true,
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
    if opts.method == CalibMethod::Entropy && opts.qtype != QuantType::Int8 {
        return Err(bad(format!(
            "entropy calibration models int8's uniform grid; for {} use \"percentile\" or \"minmax\"",
            opts.qtype
        )));
    }
    let g = crate::passes::optimize(g, batch)?;
    let quantized_input =
        |n: &crate::ir::Node, k: usize| is_activation_input(n, k, opts.residual_skips);
    let (acts, weights) = targets(&g, &quantized_input);
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
        CalibMethod::Percentile(_) | CalibMethod::Entropy => {
            let mut hist: HashMap<ValueId, Vec<u64>> =
                acts.iter().map(|&v| (v, vec![0; bins])).collect();
            // Exact zeros (a ReLU's negatives) are counted apart for the entropy method.
            let mut zeros: HashMap<ValueId, u64> = acts.iter().map(|&v| (v, 0)).collect();
            run_all(&g, batch, samples, &acts, |v, t| {
                let (top, h) = (amax[&v], hist.get_mut(&v));
                if let (true, Some(h)) = (top > 0.0, h) {
                    for x in &t.data {
                        let b = ((x.abs() / top) * bins as f32) as usize;
                        h[b.min(bins - 1)] += 1;
                    }
                    *zeros.entry(v).or_insert(0) +=
                        t.data.iter().filter(|&&x| x == 0.0).count() as u64;
                }
            })?;
            acts.iter()
                .map(|&v| {
                    let r = match opts.method {
                        CalibMethod::Percentile(p) => percentile(&hist[&v], amax[&v], p),
                        // The model's own input is data, bounded by its preprocessing, not an
                        // activation with a long tail to clip; its values are few and evenly
                        // spaced (pixel levels), where KL divergence favours a threshold just
                        // past the largest spike: on the digits it clipped every stroke pixel
                        // (a quarter of the values) to the background's magnitude, and top-1
                        // accuracy fell to 70 %. It keeps its whole range.
                        _ if g.inputs.contains(&v) => amax[&v],
                        _ => {
                            // Zero is on every grid: no threshold loses anything on exact
                            // zeros, so they say nothing about which one to pick. Counted,
                            // a ReLU's (half the values or more) make one spike in the first
                            // bin whose KL term outweighs the rest, and the smallest
                            // threshold wins (the trained digits model fell to 10 % top-1
                            // accuracy). NVIDIA's pytorch-quantization flattens that bin too.
                            let mut h = hist[&v].clone();
                            h[0] -= zeros[&v].min(h[0]);
                            entropy_threshold(&h, amax[&v], ENTROPY_LEVELS)
                        }
                    };
                    (v, r)
                })
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
            if acts.contains(&v) && quantized_input(n, k) {
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

/// Whether input `k` of `n` is one that gets quantized when it is not a constant: a
/// product's activation operand, and (`residual_skips`) a convolution's fused residual (a residual block's skip,
/// quantized as TensorRT asks of int8 residual networks and as onnxruntime's QDQ format
/// quantizes an Add's inputs: the skip is then the same bytes the next block's convolutions
/// read, and a block's output never needs storing in floats).
fn is_activation_input(n: &crate::ir::Node, k: usize, residual_skips: bool) -> bool {
    match &n.op {
        Op::Conv(a) => k == 0 || (residual_skips && a.residual && k == 3),
        Op::Linear { .. } | Op::Gemm { .. } => k == 0,
        Op::MatMul => k < 2,
        _ => false,
    }
}

/// The runtime values to calibrate (inputs of the quantized ops) and the weights to quantize:
/// `(node, input index) → per output channel`.
fn targets(
    g: &Graph,
    quantized_input: &dyn Fn(&crate::ir::Node, usize) -> bool,
) -> (Vec<ValueId>, HashMap<(NodeId, usize), bool>) {
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
                _ if !constant && quantized_input(n, k) && !acts.contains(&v) => acts.push(v),
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

/// Quantization levels on one side of int8's symmetric grid (0..=127).
const ENTROPY_LEVELS: usize = 128;

/// The magnitude threshold (a bin edge, at least `levels` bins up) that TensorRT's entropy
/// calibration picks from a histogram of magnitudes over `[0, top]`: for each candidate edge
/// `i`, P is the first `i` bins with everything above folded into bin `i − 1` (what clipping
/// does), Q is those `i` bins merged into `levels` equal groups and spread back evenly over
/// each group's non-empty bins (what quantizing them does); the edge of least KL(P‖Q) wins.
fn entropy_threshold(hist: &[u64], top: f32, levels: usize) -> f32 {
    let bins = hist.len();
    let total: u64 = hist.iter().sum();
    if total == 0 || top <= 0.0 || bins <= levels {
        return top;
    }
    // above[i]: the count in bins i.. (clipped into bin i − 1 by a threshold at edge i).
    let mut above = vec![0u64; bins + 1];
    for i in (0..bins).rev() {
        above[i] = above[i + 1] + hist[i];
    }
    let mut best = (f64::INFINITY, bins);
    let mut q = vec![0f64; bins];
    for (i, &clipped) in above.iter().enumerate().skip(levels) {
        let p_total = total as f64;
        let q_total = (total - clipped) as f64;
        if q_total == 0.0 {
            continue;
        }
        for l in 0..levels {
            let (a, b) = (l * i / levels, (l + 1) * i / levels);
            let group = &hist[a..b];
            let nonzero = group.iter().filter(|&&c| c > 0).count();
            let sum: u64 = group.iter().sum();
            for (j, &c) in group.iter().enumerate() {
                q[a + j] = if c > 0 {
                    sum as f64 / nonzero as f64
                } else {
                    0.0
                };
            }
        }
        let mut kl = 0.0;
        for j in 0..i {
            let pc = hist[j] as f64 + if j == i - 1 { clipped as f64 } else { 0.0 };
            if pc == 0.0 {
                continue;
            }
            let p = pc / p_total;
            // An empty Q bin where P has mass (the clipped outliers in an empty last bin):
            // smoothed as TensorRT does, a small but finite loss rather than an infinite one.
            let qv = (q[j] / q_total).max(1e-12);
            kl += p * (p / qv).ln();
        }
        if kl < best.0 {
            best = (kl, i);
        }
    }
    top * best.1 as f32 / bins as f32
}

/// Items a workload's calibration folder is read for at most: enough for stable ranges
/// (TensorRT suggests about 500 images for ImageNet; the reference evaluator that calibrates
/// is single-threaded, so fewer keep a start-up short).
pub const CALIBRATION_ITEMS: usize = 64;

/// Calibration (or held-out) samples read from a folder, batched for the model.
#[derive(Clone, Debug)]
pub struct CalibrationSet {
    /// Each a list of the graph's inputs at the batch; the last batch is filled by repeating
    /// items from the start (they are not counted twice by [`top1_agreement`]).
    pub samples: Vec<Vec<Tensor>>,
    /// Distinct items read (images, or rows of the `.npy` files).
    pub items: usize,
    /// Files read, in name order.
    pub files: Vec<PathBuf>,
}

/// Reads every `.npy`, `.png`, `.jpg` and `.jpeg` file of `dir` (in name order; other files
/// and hidden ones are skipped) as items of the graph's single input at `batch`: a `.npy`
/// holds one item (the input's shape without the batch, or with a leading 1) or several (a
/// leading count); an image is decoded and prepared as torchvision's ImageNet transform does
/// (resize the shorter side to `side · 256 / 224` rounded, centre crop: as `infer --image`),
/// for an input of shape `[3, side, side]`. At most `limit` items are kept. An entry with one
/// of those extensions that is not a regular file (a FIFO, a device or a link to one, a
/// folder) is refused by name: it is never read, and never silently left out.
pub fn load_calibration_set(
    dir: &Path,
    g: &Graph,
    batch: usize,
    limit: usize,
) -> Result<CalibrationSet> {
    let bad = |m: String| EngineError::InvalidArgument(format!("calibration set: {m}"));
    if g.inputs.len() != 1 {
        return Err(bad(format!(
            "the model has {} inputs; a calibration folder feeds models of one input",
            g.inputs.len()
        )));
    }
    let shapes = g.infer_shapes(batch)?;
    let full = &shapes[g.inputs[0]];
    if full.first() != Some(&batch) {
        return Err(bad(format!(
            "the model's input has shape {full:?}, without the batch ({batch}) first"
        )));
    }
    let item: Vec<usize> = full[1..].to_vec();
    let per: usize = item.iter().product();
    let entries = std::fs::read_dir(dir)
        .map_err(|e| bad(format!("cannot read folder {}: {e}", dir.display())))?;
    let mut files: Vec<PathBuf> = Vec::new();
    for e in entries {
        let e = e.map_err(|e| bad(format!("cannot read folder {}: {e}", dir.display())))?;
        let p = e.path();
        let hidden = p
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with('.'));
        if !hidden && kind_of(&p).is_some() {
            files.push(p);
        }
    }
    files.sort();
    if files.is_empty() {
        return Err(bad(format!(
            "no .npy, .png, .jpg or .jpeg file in {}",
            dir.display()
        )));
    }
    let mut data: Vec<f32> = Vec::new();
    let mut used = Vec::new();
    for f in &files {
        if data.len() / per.max(1) >= limit {
            break;
        }
        used.push(f.clone());
        match kind_of(f) {
            Some(FileKind::Npy) => {
                let t = crate::io::read_npy(f).map_err(|e| bad(e.to_string()))?;
                let rows = if t.shape == item {
                    1
                } else if t.shape.len() == item.len() + 1 && t.shape[1..] == item[..] {
                    t.shape[0]
                } else {
                    return Err(bad(format!(
                        "{} has shape {:?}; the model takes items of shape {item:?} (or \
                         [count, ...] of them)",
                        f.display(),
                        t.shape
                    )));
                };
                let take = rows.min(limit - data.len() / per.max(1));
                data.extend_from_slice(&t.data[..take * per]);
            }
            Some(FileKind::Image) => {
                let side = match item[..] {
                    [3, h, w] if h == w && h > 0 => h,
                    _ => {
                        return Err(bad(format!(
                            "{} is an image; the model's input items are {item:?}, not \
                             [3, side, side] (use .npy files)",
                            f.display()
                        )))
                    }
                };
                // An image too long for its resize is refused there, naming it and its size.
                let img =
                    crate::io::image::load_image_sized(f, side).map_err(|e| bad(e.to_string()))?;
                data.extend(img);
            }
            None => {}
        }
    }
    let items = data.len() / per.max(1);
    if items == 0 {
        return Err(bad(format!("no items in {}", dir.display())));
    }
    let n_batches = items.div_ceil(batch);
    let mut samples = Vec::with_capacity(n_batches);
    for b in 0..n_batches {
        let mut x = Vec::with_capacity(batch * per);
        for k in 0..batch {
            let i = (b * batch + k) % items;
            x.extend_from_slice(&data[i * per..(i + 1) * per]);
        }
        samples.push(vec![Tensor::new(full.clone(), x)?]);
    }
    Ok(CalibrationSet {
        samples,
        items,
        files: used,
    })
}

enum FileKind {
    Npy,
    Image,
}

fn kind_of(p: &Path) -> Option<FileKind> {
    let ext = p.extension()?.to_str()?.to_ascii_lowercase();
    match ext.as_str() {
        "npy" => Some(FileKind::Npy),
        "png" | "jpg" | "jpeg" => Some(FileKind::Image),
        _ => None,
    }
}

/// How the quantized model's answers compare with the float model's.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Agreement {
    /// Items compared.
    pub items: usize,
    /// Items whose top-1 class (the largest of the first output's row) is the float model's.
    pub same_top1: usize,
    /// ‖quantized − float‖ / ‖float‖ over the first output of every compared item.
    pub rel_l2: f64,
}

impl Agreement {
    pub fn top1(&self) -> f64 {
        if self.items == 0 {
            0.0
        } else {
            self.same_top1 as f64 / self.items as f64
        }
    }
}

/// Runs `float` and `quantized` on the CPU backend (fp32, `threads` threads) over the first
/// `items` items of `samples` (batches of `batch`) and compares the first outputs' rows.
pub fn top1_agreement(
    float: &Graph,
    quantized: &Graph,
    batch: usize,
    samples: &[Vec<Tensor>],
    items: usize,
    threads: usize,
) -> Result<Agreement> {
    use crate::backend::{Backend, Precision};
    let cpu = crate::CpuBackend::new(threads.max(1));
    let mut mf = cpu.compile(float, batch, Precision::Fp32)?;
    let mut mq = cpu.compile(quantized, batch, Precision::Fp32)?;
    let (mut same, mut seen, mut num, mut den) = (0, 0, 0f64, 0f64);
    for s in samples {
        for (i, t) in s.iter().enumerate() {
            let (a, b) = (mf.input_mut_at(i), mq.input_mut_at(i));
            if a.len() != t.data.len() || b.len() != t.data.len() {
                return Err(EngineError::InvalidArgument(format!(
                    "agreement: input {i} has {} values, the model takes {}",
                    t.data.len(),
                    a.len()
                )));
            }
            a.copy_from_slice(&t.data);
            b.copy_from_slice(&t.data);
        }
        mf.run()?;
        mq.run()?;
        let row = mf.output().len() / batch.max(1);
        if row == 0 {
            break;
        }
        for (a, b) in mq.output().chunks(row).zip(mf.output().chunks(row)) {
            if seen == items {
                break;
            }
            seen += 1;
            same += (argmax(a) == argmax(b)) as usize;
            for (x, y) in a.iter().zip(b) {
                num += ((x - y) as f64).powi(2);
                den += (*y as f64).powi(2);
            }
        }
    }
    Ok(Agreement {
        items: seen,
        same_top1: same,
        rel_l2: if den > 0.0 { (num / den).sqrt() } else { 0.0 },
    })
}

/// A model's top-1 answers over labelled items, against the labels and against the fp32
/// reference's answers on the same items.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Scores {
    pub items: usize,
    /// Items whose top-1 class is their label.
    pub correct: usize,
    /// Items whose top-1 class is the reference's.
    pub agree: usize,
}

impl Scores {
    /// The share of items classified as labelled.
    pub fn accuracy(&self) -> f64 {
        self.correct as f64 / self.items.max(1) as f64
    }

    /// The share of items whose top-1 class is the reference's.
    pub fn agreement(&self) -> f64 {
        self.agree as f64 / self.items.max(1) as f64
    }
}

impl std::fmt::Display for Scores {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "top-1 accuracy {}/{} ({:.2} %), agreement with fp32 {}/{} ({:.2} %)",
            self.correct,
            self.items,
            100.0 * self.accuracy(),
            self.agree,
            self.items,
            100.0 * self.agreement()
        )
    }
}

/// Scores `output` (one row of class scores per item, as many rows as `labels`) against the
/// labels and against `reference`, the fp32 model's output on the same items.
pub fn score_top1(output: &[f32], reference: &[f32], labels: &[usize]) -> Result<Scores> {
    let bad = |m: String| EngineError::InvalidArgument(format!("labels: {m}"));
    if labels.is_empty() {
        return Err(bad("there are no labels".into()));
    }
    if output.len() != reference.len() {
        return Err(bad(format!(
            "the output has {} values and the fp32 reference {}",
            output.len(),
            reference.len()
        )));
    }
    if !output.len().is_multiple_of(labels.len()) || output.is_empty() {
        return Err(bad(format!(
            "{} labels do not divide the output's {} values into one row per item",
            labels.len(),
            output.len()
        )));
    }
    let classes = output.len() / labels.len();
    if let Some((i, l)) = labels.iter().enumerate().find(|(_, &l)| l >= classes) {
        return Err(bad(format!(
            "label {i} is class {l}, but the model's output has {classes} classes (0 to {})",
            classes - 1
        )));
    }
    let mut s = Scores {
        items: labels.len(),
        correct: 0,
        agree: 0,
    };
    for ((row, r), &l) in output
        .chunks(classes)
        .zip(reference.chunks(classes))
        .zip(labels)
    {
        let top = argmax(row);
        s.correct += (top == l) as usize;
        s.agree += (top == argmax(r)) as usize;
    }
    Ok(s)
}

/// The first output of `g` run at fp32 on the CPU backend (`threads` threads) at `batch` on
/// `input` (the whole batch): the reference [`score_top1`] compares with.
pub fn cpu_reference(g: &Graph, batch: usize, input: &[f32], threads: usize) -> Result<Vec<f32>> {
    use crate::backend::{Backend, Precision};
    let mut m = crate::CpuBackend::new(threads.max(1)).compile(g, batch, Precision::Fp32)?;
    if m.input_mut().len() != input.len() {
        return Err(EngineError::InvalidArgument(format!(
            "fp32 reference: the input has {} values, the model takes {}",
            input.len(),
            m.input_mut().len()
        )));
    }
    m.input_mut().copy_from_slice(input);
    m.run()?;
    Ok(m.output().to_vec())
}

/// What [`quantize_from_folder`] did, for a report line.
#[derive(Clone, Debug)]
pub struct QuantizeReport {
    pub qtype: QuantType,
    pub method: CalibMethod,
    /// Calibration items read.
    pub items: usize,
    pub activations: usize,
    pub weights: usize,
    /// The quantized model against the float model over the calibration items.
    pub agreement: Agreement,
}

impl std::fmt::Display for QuantizeReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let a = &self.agreement;
        write!(
            f,
            "{} from {} calibration items ({}): {} activations and {} weights quantized; top-1 \
             agreement with fp32 {}/{} ({:.1} %), relative L2 {:.2e}",
            self.qtype,
            self.items,
            self.method.name(),
            self.activations,
            self.weights,
            a.same_top1,
            a.items,
            100.0 * a.top1(),
            a.rel_l2
        )
    }
}

/// `g` quantized at `batch` from the first [`CALIBRATION_ITEMS`] items of folder `dir`
/// ([`load_calibration_set`], [`quantize_model`]), and its top-1 agreement with `g` over
/// them on the CPU backend (`threads` threads).
pub fn quantize_from_folder(
    g: &Graph,
    batch: usize,
    dir: &Path,
    opts: &CalibOptions,
    threads: usize,
) -> Result<(Graph, QuantizeReport)> {
    let set = load_calibration_set(dir, g, batch, CALIBRATION_ITEMS)?;
    let q = quantize_model(g, batch, &set.samples, opts)?;
    let agreement = top1_agreement(g, &q.graph, batch, &set.samples, set.items, threads)?;
    let report = QuantizeReport {
        qtype: opts.qtype,
        method: opts.method,
        items: set.items,
        activations: q.activations,
        weights: q.weights,
        agreement,
    };
    Ok((q.graph, report))
}

/// The index of the largest value (the first of equals); NaN never wins.
fn argmax(v: &[f32]) -> usize {
    (0..v.len()).fold(0, |b, i| if v[i] > v[b] { i } else { b })
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

    /// A constant of `shape`, uniform in [-s, s) from `seed`.
    fn constant(g: &mut Graph, name: &str, shape: Vec<usize>, seed: u64, s: f32) -> ValueId {
        let n = shape.iter().product();
        let d = rand(n, seed).into_iter().map(|v| v * s).collect();
        g.add_constant(name, Tensor::new(shape, d).unwrap())
    }

    /// Conv → ReLU → Conv → ReLU → global pool → Linear: 10 classes.
    fn tiny_cnn() -> Graph {
        let mut g = Graph::new("tiny");
        let x = g.add_input(
            "x",
            vec![Dim::Batch, Dim::Fixed(3), Dim::Fixed(10), Dim::Fixed(10)],
        );
        let c = constant;
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

    /// A residual block: c1 → ReLU → c2, whose output plus c1's (the skip) goes through a
    /// ReLU, pooled, then a Linear.
    fn residual_cnn() -> Graph {
        let mut g = Graph::new("residual");
        let x = g.add_input(
            "x",
            vec![Dim::Batch, Dim::Fixed(3), Dim::Fixed(10), Dim::Fixed(10)],
        );
        let c = constant;
        let (w1, b1) = (
            c(&mut g, "w1", vec![8, 3, 3, 3], 1, 0.4),
            c(&mut g, "b1", vec![8], 2, 0.1),
        );
        let (w2, b2) = (
            c(&mut g, "w2", vec![8, 8, 1, 1], 3, 0.3),
            c(&mut g, "b2", vec![8], 4, 0.1),
        );
        let (wl, bl) = (
            c(&mut g, "wl", vec![10, 8], 5, 0.5),
            c(&mut g, "bl", vec![10], 6, 0.1),
        );
        let conv = |activation| {
            Op::Conv(ConvAttrs {
                pads: [1; 4],
                activation,
                ..Default::default()
            })
        };
        let h1 = g
            .add_op("c1", conv(Some(Unary::Relu)), &[x, w1, b1])
            .unwrap();
        let one = Op::Conv(ConvAttrs::default());
        let h2 = g.add_op("c2", one, &[h1, w2, b2]).unwrap();
        let s = g
            .add_op("add", Op::Binary(crate::ir::Binary::Add), &[h2, h1])
            .unwrap();
        let r = g.add_op("relu", Op::Unary(Unary::Relu), &[s]).unwrap();
        let h = g.add_op("pool", Op::GlobalAveragePool, &[r]).unwrap();
        let h = g.add_op("flat", Op::Flatten { axis: 1 }, &[h]).unwrap();
        let y = g
            .add_op("fc", Op::Linear { activation: None }, &[h, wl, bl])
            .unwrap();
        g.add_output(y).unwrap();
        g
    }

    #[test]
    fn a_residual_blocks_skip_is_quantized_by_the_fakequant_its_convolution_reads() {
        let g = residual_cnn();
        let batch = 4;
        let samples: Vec<Vec<Tensor>> = (0..8)
            .map(|s| vec![Tensor::new(vec![batch, 3, 10, 10], rand(1200, 200 + s)).unwrap()])
            .collect();
        let opts = CalibOptions::default();
        let q = quantize_model(&g, batch, &samples, &opts).unwrap();
        let qg = &q.graph;
        // The add fused into c2 (its residual, input 3): c1's output quantized once, read by
        // c2 both as its operand and as its residual.
        let c2 = qg.nodes.iter().find(|n| n.name == "c2").expect("c2");
        let Op::Conv(a) = &c2.op else {
            panic!("c2 is a convolution")
        };
        assert!(a.residual, "the add is fused into c2");
        assert_eq!(
            c2.inputs[3], c2.inputs[0],
            "one FakeQuant for the operand and the skip"
        );
        let fq = qg.producer(c2.inputs[3]).expect("a producer");
        assert!(matches!(qg.nodes[fq].op, Op::FakeQuant(_)));
        // Three activations: the input, c1's output (operand and skip), the Linear's input.
        assert_eq!(q.activations, 3);
        let (top1, l2) = agreement(&g, qg, batch, 0..8);
        assert!(top1 >= 0.9 && l2 < 0.05, "top-1 {top1}, rel L2 {l2}");
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
            (QuantType::Int8, CalibMethod::Entropy),
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
            // Entropy once clipped the ReLU outputs here to a fraction of their range
            // (rel L2 7.6e-2), their zeros deciding its KL divergence; it is held to
            // the same bound as the others.
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

    #[test]
    fn entropy_clips_a_few_far_outliers_and_keeps_a_flat_range() {
        // A bulk in the first 10 % of the range and a handful of values at its top: clipping
        // them costs little, and 128 levels over the bulk instead of over the whole range
        // keep its shape, so the threshold falls far below the largest magnitude.
        let mut h = vec![0u64; 2048];
        for (i, c) in h.iter_mut().enumerate().take(200) {
            *c = 1000 + (i as u64 * 7919) % 300;
        }
        h[2047] = 3;
        let t = entropy_threshold(&h, 10.0, ENTROPY_LEVELS);
        assert!(t < 2.0, "threshold {t}");
        assert!(t >= 10.0 * 128.0 / 2048.0, "threshold {t}");
        // Values spread evenly over the whole range: clipping any of them loses more than
        // the grid's coarseness, so nothing is clipped.
        let flat = vec![500u64; 2048];
        let t = entropy_threshold(&flat, 10.0, ENTROPY_LEVELS);
        assert!(t > 9.0, "threshold {t}");
        assert_eq!(entropy_threshold(&[0; 2048], 3.0, ENTROPY_LEVELS), 3.0);
    }

    #[test]
    fn entropy_is_refused_for_float8_and_method_names_round_trip() {
        let g = tiny_cnn();
        let s = vec![vec![Tensor::zeros(vec![1, 3, 10, 10])]];
        let opts = CalibOptions {
            qtype: QuantType::Float8E4M3Fn,
            method: CalibMethod::Entropy,
            ..Default::default()
        };
        let e = quantize_model(&g, 1, &s, &opts).unwrap_err().to_string();
        assert!(e.contains("entropy") && e.contains("percentile"), "{e}");
        for n in METHOD_NAMES {
            assert_eq!(CalibMethod::from_name(n).unwrap().name(), n);
        }
        assert_eq!(CalibMethod::from_name("kl"), None);
    }

    #[test]
    fn a_folder_of_npy_files_is_batched_and_the_agreement_is_measured() {
        let g = tiny_cnn();
        let dir = tempfile::tempdir().unwrap();
        // One item, one file of three items (a leading count), one of shape [1, 3, 10, 10],
        // and a file that is not read.
        let w = |name: &str, shape: Vec<usize>, seed| {
            let n = shape.iter().product();
            crate::io::write_npy(dir.path().join(name), &shape, &rand(n, seed)).unwrap();
        };
        w("a.npy", vec![3, 10, 10], 7);
        w("b.npy", vec![3, 3, 10, 10], 8);
        w("c.npy", vec![1, 3, 10, 10], 9);
        std::fs::write(dir.path().join("notes.txt"), "not a sample").unwrap();
        let set = load_calibration_set(dir.path(), &g, 2, 100).unwrap();
        assert_eq!((set.items, set.files.len(), set.samples.len()), (5, 3, 3));
        // The fifth item's batch is filled with the first item again.
        let last = &set.samples[2][0];
        assert_eq!(last.shape, vec![2, 3, 10, 10]);
        assert_eq!(last.data[300..], set.samples[0][0].data[..300]);
        let few = load_calibration_set(dir.path(), &g, 2, 2).unwrap();
        assert_eq!((few.items, few.samples.len()), (2, 1));

        let q = quantize_model(&g, 2, &set.samples, &CalibOptions::default()).unwrap();
        let a = top1_agreement(&g, &q.graph, 2, &set.samples, set.items, 1).unwrap();
        assert_eq!(a.items, 5);
        assert!(
            a.top1() >= 0.8 && a.rel_l2 > 1e-4 && a.rel_l2 < 0.05,
            "{a:?}"
        );
        // The same through the one call a workload makes, with its report line.
        let opts = CalibOptions::default();
        let (q2, r) = quantize_from_folder(&g, 2, dir.path(), &opts, 1).unwrap();
        assert_eq!(q2, q.graph);
        assert_eq!((r.items, r.activations, r.weights), (5, 3, 3));
        assert_eq!(r.agreement, a);
        let line = r.to_string();
        assert!(
            line.starts_with("int8 from 5 calibration items (percentile): 3 activations")
                && line.contains(&format!("top-1 agreement with fp32 {}/5", a.same_top1)),
            "{line}"
        );
        // A model that answers differently is caught: the classifier's weights negated.
        let mut wrong = g.clone();
        for v in &mut wrong.values {
            if v.name == "wl" {
                if let ValueKind::Constant(t) = &mut v.kind {
                    let neg: Vec<f32> = t.data.iter().map(|x| -x).collect();
                    *t = Arc::new(Tensor::new(t.shape.clone(), neg).unwrap());
                }
            }
        }
        let a = top1_agreement(&g, &wrong, 2, &set.samples, set.items, 1).unwrap();
        assert!(a.top1() < 0.5 && a.rel_l2 > 1.0, "{a:?}");
    }

    #[test]
    fn bad_calibration_folders_are_refused_by_name() {
        let g = tiny_cnn();
        let dir = tempfile::tempdir().unwrap();
        let e = load_calibration_set(dir.path(), &g, 1, 10)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no .npy, .png, .jpg or .jpeg file"), "{e}");
        crate::io::write_npy(dir.path().join("x.npy"), &[3, 9, 10], &[0.0; 270]).unwrap();
        let e = load_calibration_set(dir.path(), &g, 1, 10)
            .unwrap_err()
            .to_string();
        assert!(e.contains("x.npy") && e.contains("[3, 9, 10]"), "{e}");
        std::fs::write(dir.path().join("x.npy"), b"garbage").unwrap();
        let e = load_calibration_set(dir.path(), &g, 1, 10)
            .unwrap_err()
            .to_string();
        assert!(e.contains("x.npy"), "{e}");
        std::fs::remove_file(dir.path().join("x.npy")).unwrap();
        std::fs::write(dir.path().join("y.png"), b"not a png").unwrap();
        let e = load_calibration_set(dir.path(), &g, 1, 10)
            .unwrap_err()
            .to_string();
        assert!(e.contains("y.png") && e.contains("decode"), "{e}");
        let missing = dir.path().join("none");
        let e = load_calibration_set(&missing, &g, 1, 10)
            .unwrap_err()
            .to_string();
        assert!(e.contains("cannot read folder"), "{e}");
    }

    /// A FIFO named x.npy is refused by name, not skipped and never read (it would block, or
    /// never end); so is a link to a device. An image too long for its resize is refused
    /// naming its size, not resized into gigabytes.
    #[test]
    fn entries_that_are_no_regular_file_and_overlong_images_are_refused_by_name() {
        let g = tiny_cnn();
        let dir = tempfile::tempdir().unwrap();
        crate::io::write_npy(dir.path().join("a.npy"), &[3, 10, 10], &[0.5; 300]).unwrap();
        let fifo = dir.path().join("x.npy");
        assert!(std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success());
        let e = load_calibration_set(dir.path(), &g, 1, 10)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("x.npy") && e.contains("is a FIFO (named pipe), not a regular file"),
            "{e}"
        );
        std::fs::remove_file(&fifo).unwrap();
        std::os::unix::fs::symlink("/dev/zero", dir.path().join("z.npy")).unwrap();
        let e = load_calibration_set(dir.path(), &g, 1, 10)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("z.npy") && e.contains("is a character device"),
            "{e}"
        );
        std::fs::remove_file(dir.path().join("z.npy")).unwrap();
        // The model's 10x10 input resizes the shorter side to 11: a 3000000x1 strip (a few
        // kilobytes as a PNG) would take 1 GiB.
        ::image::RgbImage::new(3_000_000, 1)
            .save(dir.path().join("strip.png"))
            .unwrap();
        let e = load_calibration_set(dir.path(), &g, 1, 10)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("strip.png: 3000000x1 pixels; resized to 11 on its shorter side")
                && e.contains("at most 1478983 times"),
            "{e}"
        );
    }

    #[test]
    fn scores_count_labels_and_the_references_answers_and_refuse_mismatches() {
        // Three items of three classes: the model answers 2, 0, 1; the reference 2, 1, 1.
        let out = [0.1, 0.2, 0.9, 0.8, 0.1, 0.1, 0.0, 0.5, 0.4];
        let reference = [0.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0];
        let s = score_top1(&out, &reference, &[2, 0, 0]).unwrap();
        assert_eq!(
            s,
            Scores {
                items: 3,
                correct: 2,
                agree: 2
            }
        );
        assert_eq!(
            s.to_string(),
            "top-1 accuracy 2/3 (66.67 %), agreement with fp32 2/3 (66.67 %)"
        );
        let e = score_top1(&out, &reference, &[0, 3, 1])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("label 1 is class 3") && e.contains("3 classes"),
            "{e}"
        );
        let e = score_top1(&out, &reference, &[0, 1])
            .unwrap_err()
            .to_string();
        assert!(e.contains("2 labels do not divide"), "{e}");
        let e = score_top1(&out, &reference[..6], &[0, 1, 2])
            .unwrap_err()
            .to_string();
        assert!(e.contains("fp32 reference 6"), "{e}");
        assert!(score_top1(&out, &reference, &[]).is_err());
    }

    /// The scales of `g`'s FakeQuant ops, in graph order.
    fn fake_quant_scales(g: &Graph) -> Vec<f32> {
        g.nodes
            .iter()
            .filter_map(|n| match &n.op {
                Op::FakeQuant(a) => Some(a.scales[0]),
                _ => None,
            })
            .collect()
    }

    /// Entropy calibration on pixel-like input (most values one background level, the rest
    /// on a few levels; the trained digits model's input, whose entropy range once clipped
    /// every stroke): the model's input keeps its whole range, and the first ReLU's output,
    /// half zeros, is not clipped to a sliver of its range by its zeros' spike.
    #[test]
    fn entropy_keeps_the_models_input_whole_and_is_not_led_by_relu_zeros() {
        let g = tiny_cnn();
        let batch = 4;
        let samples: Vec<Vec<Tensor>> = (0..8)
            .map(|s| {
                let x = rand(1200, 200 + s)
                    .into_iter()
                    .map(|v| {
                        if v < 0.4 {
                            -1.0
                        } else {
                            ((v - 0.4) / 0.6 * 16.0).ceil().clamp(1.0, 16.0) / 8.0
                        }
                    })
                    .collect();
                vec![Tensor::new(vec![batch, 3, 10, 10], x).unwrap()]
            })
            .collect();
        let scales = |method| {
            let opts = CalibOptions {
                method,
                ..Default::default()
            };
            fake_quant_scales(&quantize_model(&g, batch, &samples, &opts).unwrap().graph)
        };
        let (entropy, minmax) = (scales(CalibMethod::Entropy), scales(CalibMethod::MinMax));
        assert_eq!(entropy.len(), 3, "{entropy:?}");
        assert_eq!(minmax[0], 2.0 / 127.0);
        assert_eq!(entropy[0], minmax[0], "the input's range");
        assert!(
            entropy[1] >= 0.5 * minmax[1],
            "the first ReLU output's range: entropy {} of min-max {}",
            entropy[1] * 127.0,
            minmax[1] * 127.0
        );
    }
}
