//! Normalisations: `Op::BatchNorm` (per channel on dim 1) and `Op::LayerNorm` (over dims
//! `axis..`), and ONNX's BatchNormalization, LayerNormalization, GroupNormalization and
//! InstanceNormalization (the last two as a LayerNorm over a reshaped input and an affine).
//!
//! BatchNormalization: inference (the IR's `BatchNorm`, folded into a preceding Conv/Linear
//! by the passes), opset 7–8's `spatial = 0` (statistics per activation, not per channel) and
//! `training_mode = 1` over a value known at import (timm's NF-ResNets standardise their
//! convolution weights with it), which is computed here.

use crate::error::Result;
use crate::ir::{broadcast_shapes, norm_axis, shape_err, Node};
use crate::ir::{Binary, Dim, Op, PoolAttrs};
use crate::kernels::{unsupported, Kernel};
use crate::onnx::fold::{self, Arr};
use crate::onnx::import::{node_axis, ones, static_shape, Ctx, Importer, Val};
use crate::onnx::Result as OnnxResult;
use crate::ops::ImportFn;

/// The shape rule of `Op::BatchNorm { .. }`.
pub(crate) fn infer_batch_norm(n: &Node, ins: &[&[usize]]) -> Result<Vec<usize>> {
    let err = |m: String| shape_err(n, m);
    let x = ins.first().copied().unwrap_or(&[]);
    let shape = {
        if x.len() < 2 {
            return Err(err(format!("input {x:?} has no channel dim")));
        }
        for s in &ins[1..] {
            if *s != [x[1]] {
                return Err(err(format!("parameter shape {s:?}, expected [{}]", x[1])));
            }
        }
        x.to_vec()
    };
    Ok(shape)
}

/// The shape rule of `Op::LayerNorm { axis, .. }`.
pub(crate) fn infer_layer_norm(n: &Node, ins: &[&[usize]], axis: &i64) -> Result<Vec<usize>> {
    let err = |m: String| shape_err(n, m);
    let x = ins.first().copied().unwrap_or(&[]);
    let shape = {
        let a = norm_axis(*axis, x.len())
            .ok_or_else(|| err(format!("axis {axis} out of range for {x:?}")))?;
        let norm = &x[a..];
        for s in &ins[1..] {
            let n: usize = norm.iter().product();
            if s.iter().product::<usize>() != n
                || broadcast_shapes(s, norm).as_deref() != Some(norm)
            {
                return Err(err(format!(
                    "scale/bias shape {s:?} does not match normalised dims {norm:?}"
                )));
            }
        }
        x.to_vec()
    };
    Ok(shape)
}

/// The CPU kernel of `Op::BatchNorm { eps }` on input shape `x`.
pub(crate) fn prepare_batch_norm(x: &[usize], eps: f32) -> Kernel {
    Kernel::BatchNorm {
        n: x[0],
        c: x[1],
        hw: x[2..].iter().product(),
        eps,
    }
}

/// The CPU kernel of `Op::LayerNorm { axis, eps }`.
pub(crate) fn prepare_layer_norm(
    node: &Node,
    ins: &[&[usize]],
    axis: i64,
    eps: f32,
) -> Result<Kernel> {
    let x = ins[0];
    let a = norm_axis(axis, x.len()).ok_or_else(|| unsupported(node, "axis"))?;
    Ok(Kernel::LayerNorm {
        rows: x[..a].iter().product(),
        d: x[a..].iter().product(),
        eps,
        has_bias: ins.len() == 3,
    })
}

/// The ONNX op types imported as normalisations.
pub(crate) const ONNX: &[(&str, ImportFn)] = &[
    ("BatchNormalization", import_batch_norm),
    ("LayerNormalization", import_layer_norm),
    ("GroupNormalization", import_group_norm),
    ("InstanceNormalization", import_instance_norm),
    ("LRN", import_lrn),
];

/// LRN (opset 1 on; AlexNet, GoogLeNet and CaffeNet of the ONNX Model Zoo, opsets 3–9).
fn import_lrn(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
    let size = c.int("size", 0)?;
    let alpha = c.float("alpha", 1e-4)?;
    let beta = c.float("beta", 0.75)?;
    let bias = c.float("bias", 1.0)?;
    if size < 1 {
        let got = match c.attr("size") {
            Some(_) => format!("{size}"),
            None => "missing".to_string(),
        };
        return Err(c.bad(format!(
            "attribute size (the channel window) must be at least 1; it is {got}"
        )));
    }
    im.lrn(c, size as usize, alpha, beta, bias)
}

fn import_batch_norm(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
    im.batch_norm(c)
}

fn import_layer_norm(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
    let axis = c.int("axis", -1)?;
    let eps = c.float("epsilon", 1e-5)?;
    // stash_type selects the precision of the mean/variance; isolane computes them
    // in f32, which is what stash_type=1 (the default) asks for.
    c.ignore("stash_type");
    let x = im.req(c, 0)?;
    node_axis(c, axis, x.rank())?;
    im.emit1(c, Op::LayerNorm { axis, eps }, 3)
}

fn import_group_norm(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
    im.group_norm(c)
}

fn import_instance_norm(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
    im.instance_norm(c)
}

impl Importer<'_> {
    /// LRN: `y = x / (bias + alpha/size · Σ x²)^beta`, the sum over the channels `c − ⌊(size−1)/2⌋
    /// ..= c + ⌈(size−1)/2⌉` that exist. The IR has no LRN, and the window sum is an average
    /// pool with zero padding counted (divisor `size`, so `alpha/size · Σ` is `alpha · mean`)
    /// over the channels seen as the rows of `[N, 1, C, D1·…·Dk]`, as PyTorch's own
    /// `local_response_norm` computes it: the ops are ones every backend already runs.
    pub(crate) fn lrn(
        &mut self,
        c: &Ctx,
        size: usize,
        alpha: f32,
        beta: f32,
        bias: f32,
    ) -> OnnxResult<Vec<Val>> {
        let x = self.req(c, 0)?;
        let shape = x.sym_shape().map_err(|e| c.bad(e))?;
        if shape.len() < 3 {
            return Err(c.bad(format!(
                "input has rank {}; LRN takes [N, C, D1, ...] (rank 3 or more)",
                shape.len()
            )));
        }
        let mut fixed = Vec::with_capacity(shape.len() - 1);
        for (i, s) in shape.iter().enumerate().skip(1) {
            if !s.is_const() || s.c < 1 {
                return Err(c.bad(format!(
                    "input dimension {i} depends on the batch size or is 0; LRN needs fixed \
                     channel and spatial sizes"
                )));
            }
            fixed.push(s.c as usize);
        }
        let (channels, plane) = (fixed[0], fixed[1..].iter().product::<usize>());
        let x_in = (c.n.input[0].clone(), x.clone());
        let node = c.r.node.clone();
        let scalar = |v: f32, what: &str| {
            (
                format!("{node}:lrn_{what}"),
                Val::F(Arr::new(vec![], vec![v])),
            )
        };
        let square = self.binary(c, Binary::Mul, x_in.clone(), x_in.clone(), 1)?;
        let square = (format!("{node}:square"), first(c, square)?);
        let rows = self.emit_tmp(
            c,
            Op::Reshape {
                shape: vec![
                    Dim::Copy,
                    Dim::Fixed(1),
                    Dim::Fixed(channels),
                    Dim::Fixed(plane),
                ],
            },
            &[square],
            "channel_rows",
        )?;
        let before = (size - 1) / 2;
        let window = Op::AveragePool(PoolAttrs {
            kernel: [size, 1],
            pads: [before, 0, size - 1 - before, 0],
            count_include_pad: true,
            ..PoolAttrs::default()
        });
        let mean = self.emit_tmp(
            c,
            window,
            &[(format!("{node}:channel_rows"), rows)],
            "window_mean",
        )?;
        let mut back = vec![Dim::Copy];
        back.extend(fixed.iter().map(|&d| Dim::Fixed(d)));
        let mean = self.emit_tmp(
            c,
            Op::Reshape { shape: back },
            &[(format!("{node}:window_mean"), mean)],
            "window_mean_nc",
        )?;
        let t = self.binary(
            c,
            Binary::Mul,
            (format!("{node}:mean"), mean),
            scalar(alpha, "alpha"),
            1,
        )?;
        let t = self.binary(
            c,
            Binary::Add,
            (format!("{node}:scaled"), first(c, t)?),
            scalar(bias, "bias"),
            1,
        )?;
        let t = self.binary(
            c,
            Binary::Pow,
            (format!("{node}:biased"), first(c, t)?),
            scalar(beta, "beta"),
            1,
        )?;
        self.binary(
            c,
            Binary::Div,
            x_in,
            (format!("{node}:divisor"), first(c, t)?),
            0,
        )
    }

    pub(crate) fn batch_norm(&mut self, c: &Ctx) -> OnnxResult<Vec<Val>> {
        let eps = c.float("epsilon", 1e-5)?;
        c.ignore("momentum"); // only updates the running statistics (training outputs)
                              // `is_test` (opsets 1–6, still written by some converters) asks for inference when 1.
        if c.int("is_test", 1)? == 0 {
            return Err(c.unsupported_attr(
                "is_test",
                "value 0 (training) is not supported; isolane runs inference",
            ));
        }
        let spatial = if self.m.opset < 9 {
            c.int("spatial", 1)?
        } else {
            1
        };
        if c.int("training_mode", 0)? != 0 {
            return self.batch_norm_training(c, eps);
        }
        if spatial == 0 && self.req(c, 0)?.rank() > 2 {
            return self.batch_norm_per_activation(c, eps);
        }
        self.emit1(c, Op::BatchNorm { eps }, 5)
    }

    /// `spatial = 0` (opsets 7–8): the statistics and parameters have the shape of one sample
    /// without the batch, `[C, D1, …]`, and each activation is normalised by its own. With
    /// them known at import this is `x·a + b`, `a = scale/√(var+ε)`, `b = B − mean·a`.
    pub(crate) fn batch_norm_per_activation(&mut self, c: &Ctx, eps: f32) -> OnnxResult<Vec<Val>> {
        let x = self.req(c, 0)?;
        let sample = static_shape(&x)[1..].to_vec();
        let mut params = Vec::with_capacity(4);
        for (i, what) in [(1, "scale"), (2, "B"), (3, "mean"), (4, "var")] {
            match self.req(c, i)? {
                Val::F(a) if a.shape == sample => params.push(a.data),
                v => {
                    return Err(c.bad(format!(
                        "spatial = 0: {what} must be floats of shape {sample:?} known at \
                         import (one per activation), is {} of shape {:?}",
                        v.kind(),
                        static_shape(&v)
                    )))
                }
            }
        }
        let (mut a, mut b) = (Vec::new(), Vec::new());
        let [scale, bias, mean, var] = [&params[0], &params[1], &params[2], &params[3]];
        for (((&g, &beta), &mu), &v) in scale.iter().zip(bias).zip(mean).zip(var) {
            let s = g as f64 / (v as f64 + eps as f64).sqrt();
            a.push(s as f32);
            b.push((beta as f64 - mu as f64 * s) as f32);
        }
        self.affine(c, (c.n.input[0].clone(), x), &sample, a, b)
    }

    /// `training_mode = 1` normalises with the input's own statistics: per channel (dim 1), the
    /// mean and the population variance over every other dim. Computed here (in f64, rounded
    /// once) when the input is known at import; the running-statistics outputs are refused if
    /// used. On a runtime tensor the statistics would mix the samples of a batch.
    pub(crate) fn batch_norm_training(&mut self, c: &Ctx, eps: f32) -> OnnxResult<Vec<Val>> {
        let x = self.req(c, 0)?;
        let Val::F(x) = x else {
            return Err(c.bad(format!(
                "training_mode = 1 normalises with the batch's own statistics; isolane computes \
                 it only on a value known at import (weight standardisation), not on {}",
                x.kind()
            )));
        };
        if x.shape.len() < 2 {
            return Err(c.bad(format!("the input {:?} has no channel dimension", x.shape)));
        }
        let ch = x.shape[1];
        let per_channel = |v: Val, what: &str| -> OnnxResult<Vec<f32>> {
            match v {
                Val::F(a) if a.data.len() == ch => Ok(a.data),
                v => Err(c.bad(format!(
                    "{what} must be {ch} floats known at import, is {} of shape {:?}",
                    v.kind(),
                    static_shape(&v)
                ))),
            }
        };
        let scale = per_channel(self.req(c, 1)?, "scale")?;
        let bias = per_channel(self.req(c, 2)?, "B")?;
        let inner: usize = x.shape[2..].iter().product();
        let outer = x.shape[0];
        let count = (outer * inner) as f64;
        let mut y = vec![0f32; x.data.len()];
        for k in 0..ch {
            let at = |n: usize, i: usize| (n * ch + k) * inner + i;
            let mut sum = 0f64;
            for n in 0..outer {
                for i in 0..inner {
                    sum += x.data[at(n, i)] as f64;
                }
            }
            let mean = sum / count;
            let mut sq = 0f64;
            for n in 0..outer {
                for i in 0..inner {
                    let d = x.data[at(n, i)] as f64 - mean;
                    sq += d * d;
                }
            }
            let inv = 1.0 / (sq / count + eps as f64).sqrt();
            for n in 0..outer {
                for i in 0..inner {
                    let v = (x.data[at(n, i)] as f64 - mean) * inv;
                    y[at(n, i)] = (v * scale[k] as f64 + bias[k] as f64) as f32;
                }
            }
        }
        Ok(vec![Val::F(Arr::new(x.shape.clone(), y))])
    }

    /// GroupNormalization (opset 18: `scale`/`bias` per group; opset 21: per channel) as IR ops:
    /// `[N, C, ...] → [N, G, rest]`, LayerNorm over `rest` with a unit scale, back to
    /// `[N, C, ...]`, then the per-channel affine `x·scale + bias` broadcast over `[C, 1, ...]`.
    pub(crate) fn group_norm(&mut self, c: &Ctx) -> OnnxResult<Vec<Val>> {
        let eps = c.float("epsilon", 1e-5)?;
        let groups = c.int("num_groups", 0)?;
        // stash_type (opset 21) selects the precision of mean/variance; isolane's are f32,
        // which is the default (stash_type = 1).
        c.ignore("stash_type");
        let x = self.req(c, 0)?;
        let xs = x.sym_shape().map_err(|e| c.bad(e))?;
        if !x.is_dyn() || xs.len() < 3 {
            return Err(c.bad(format!(
                "the input must be a runtime tensor [N, C, ...] of rank 3 or more, is {} of rank {}",
                x.kind(),
                xs.len()
            )));
        }
        let ch = xs[1];
        if !ch.is_const() || groups < 1 || ch.c % groups != 0 {
            return Err(c.bad(format!(
                "num_groups {groups} must be positive and divide the {} channels",
                ch
            )));
        }
        let (ch, groups) = (ch.c as usize, groups as usize);
        // The per-channel scale and bias are built at import: a channel count from a corrupt
        // file must be refused, not allocated.
        fold::numel(&[ch]).map_err(|e| c.bad(format!("the scale per channel: {e}")))?;
        let per_channel = |v: Val, what: &str| -> OnnxResult<Vec<f32>> {
            let Val::F(a) = v else {
                return Err(c.bad(format!("{what} must be a float tensor known at import")));
            };
            match a.data.len() {
                n if n == ch => Ok(a.data),
                // Opset 18's per-group form: each group's value for each of its channels.
                n if n == groups => Ok((0..ch).map(|i| a.data[i / (ch / groups)]).collect()),
                n => Err(c.bad(format!(
                    "{what} has {n} values; expected {ch} (channels) or {groups} (groups)"
                ))),
            }
        };
        let scale = per_channel(self.req(c, 1)?, "scale")?;
        let bias = per_channel(self.req(c, 2)?, "bias")?;
        let rest: usize = static_shape(&x)[2..].iter().product::<usize>() * (ch / groups);
        let grouped = self.emit_tmp(
            c,
            Op::Reshape {
                shape: vec![Dim::Copy, Dim::Fixed(groups), Dim::Fixed(rest)],
            },
            &[(c.n.input[0].clone(), x.clone())],
            "grouped",
        )?;
        let ones = (
            format!("{}:unit_scale", c.r.node),
            ones(&[rest]).map_err(|e| c.bad(e))?,
        );
        let normed = self.emit_tmp(
            c,
            Op::LayerNorm { axis: -1, eps },
            &[(format!("{}:grouped", c.r.node), grouped), ones],
            "normed",
        )?;
        let mut back = vec![Dim::Copy];
        back.extend(static_shape(&x)[1..].iter().map(|&d| Dim::Fixed(d)));
        let ungrouped = self.emit_tmp(
            c,
            Op::Reshape { shape: back },
            &[(format!("{}:normed", c.r.node), normed)],
            "ungrouped",
        )?;
        self.channel_affine(c, ungrouped, xs.len(), scale, bias)
    }

    /// `x·scale + bias` with per-channel (dim 1) `scale` and `bias`, the node's output.
    pub(crate) fn channel_affine(
        &mut self,
        c: &Ctx,
        x: Val,
        rank: usize,
        scale: Vec<f32>,
        bias: Vec<f32>,
    ) -> OnnxResult<Vec<Val>> {
        let mut shape = vec![scale.len()];
        shape.extend(std::iter::repeat_n(1, rank - 2));
        self.affine(c, (format!("{}:normed", c.r.node), x), &shape, scale, bias)
    }

    /// `x·scale + bias` with constant `scale` and `bias` of `shape` (broadcast against `x`),
    /// the node's output.
    pub(crate) fn affine(
        &mut self,
        c: &Ctx,
        x: (String, Val),
        shape: &[usize],
        scale: Vec<f32>,
        bias: Vec<f32>,
    ) -> OnnxResult<Vec<Val>> {
        let scale = (
            format!("{}:scale", c.r.node),
            Val::F(Arr::new(shape.to_vec(), scale)),
        );
        let bias = (
            format!("{}:bias", c.r.node),
            Val::F(Arr::new(shape.to_vec(), bias)),
        );
        let scaled = self.binary(c, Binary::Mul, x, scale, 1)?;
        let scaled = scaled
            .into_iter()
            .next()
            .ok_or_else(|| c.bad("no output"))?;
        self.binary(
            c,
            Binary::Add,
            (format!("{}:scaled", c.r.node), scaled),
            bias,
            0,
        )
    }

    /// InstanceNormalization (`[N, C, ...]`, each (n, c) normalised over the spatial dims;
    /// the classic exporter writes GroupNorm as Reshape → InstanceNormalization → Reshape):
    /// LayerNorm over dims `2..` with a unit scale, then the per-channel affine.
    pub(crate) fn instance_norm(&mut self, c: &Ctx) -> OnnxResult<Vec<Val>> {
        let eps = c.float("epsilon", 1e-5)?;
        let x = self.req(c, 0)?;
        let rank = x.rank();
        if !x.is_dyn() || rank < 3 {
            return Err(c.bad(format!(
                "the input must be a runtime tensor [N, C, ...] of rank 3 or more, is {} of rank {rank}",
                x.kind()
            )));
        }
        let shape = static_shape(&x);
        let ch = shape[1];
        let vec_of = |v: Val, what: &str| -> OnnxResult<Vec<f32>> {
            match v {
                Val::F(a) if a.data.len() == ch => Ok(a.data),
                v => Err(c.bad(format!(
                    "{what} must be {ch} floats known at import, is {}",
                    v.kind()
                ))),
            }
        };
        let scale = vec_of(self.req(c, 1)?, "scale")?;
        let bias = vec_of(self.req(c, 2)?, "B")?;
        let spatial = shape[2..].to_vec();
        let ones = (
            format!("{}:unit_scale", c.r.node),
            ones(&spatial).map_err(|e| c.bad(e))?,
        );
        let normed = self.emit_tmp(
            c,
            Op::LayerNorm { axis: 2, eps },
            &[(c.n.input[0].clone(), x), ones],
            "normed",
        )?;
        self.channel_affine(c, normed, rank, scale, bias)
    }
}

/// The one value an import step returned.
fn first(c: &Ctx, mut v: Vec<Val>) -> OnnxResult<Val> {
    v.pop()
        .ok_or_else(|| c.bad("internal: a step returned no value"))
}
