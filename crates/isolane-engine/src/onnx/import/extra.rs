//! BatchNormalization in all its forms, and Tile.
//!
//! BatchNormalization: inference (the IR's `BatchNorm`, folded into a preceding Conv/Linear
//! by the passes), opset 7–8's `spatial = 0` (statistics per activation, not per channel) and
//! `training_mode = 1` over a value known at import (timm's NF-ResNets standardise their
//! convolution weights with it), which is computed here. Tile becomes Reshape → Expand →
//! Reshape per repeated axis, so every backend runs it with ops it has.

use super::*;

impl Importer<'_> {
    pub(super) fn batch_norm(&mut self, c: &Ctx) -> Result<Vec<Val>> {
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
    fn batch_norm_per_activation(&mut self, c: &Ctx, eps: f32) -> Result<Vec<Val>> {
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
    fn batch_norm_training(&mut self, c: &Ctx, eps: f32) -> Result<Vec<Val>> {
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
        let per_channel = |v: Val, what: &str| -> Result<Vec<f32>> {
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

    /// Tile (opsets 6 and 13): output axis k is `repeats[k]` copies of the input's axis k.
    /// A repeat that depends on the batch (XCiT's positional encoding, `pos.repeat(B, 1, 1,
    /// 1)`) is supported on an axis of size 1, where Tile is a broadcast: one Expand. Every
    /// other repeated axis: Reshape `[…, 1, d, …]` → Expand `[…, r, d, …]` → Reshape
    /// `[…, r·d, …]` (one more dimension at a time, within every backend's rank); folded
    /// when the input is known at import.
    pub(super) fn tile(&mut self, c: &Ctx) -> Result<Vec<Val>> {
        let mut x = self.req(c, 0)?;
        let mut reps: Vec<Sym> = match self.req(c, 1)? {
            Val::I(a) => a.data,
            v => {
                return Err(c.bad(format!(
                    "repeats is {}; expected integers known at import",
                    v.kind()
                )))
            }
        };
        let r = x.rank();
        if reps.len() != r {
            return Err(c.bad(format!(
                "repeats {} must hold one value per input dimension ({r})",
                fmt_syms(&reps)
            )));
        }
        let xs = x.sym_shape().map_err(|e| c.bad(e))?;
        let by_batch: Vec<usize> = (0..r).filter(|&k| !reps[k].is_const()).collect();
        if !by_batch.is_empty() {
            let mut target = xs.clone();
            for &k in &by_batch {
                if xs[k] != Sym::k(1) || reps[k].a < 0 || reps[k].c < 0 {
                    return Err(c.bad(format!(
                        "repeats {} depends on the batch size on axis {k}, of size {}; isolane \
                         supports that only on an axis of size 1 (a broadcast)",
                        fmt_syms(&reps),
                        xs[k]
                    )));
                }
                target[k] = reps[k];
                reps[k] = Sym::k(1);
            }
            let dims: Vec<Dim> = target
                .iter()
                .map(|&s| sym_to_dim(s, false))
                .collect::<Result<_, _>>()
                .map_err(|e| c.bad(format!("tiled shape {}: {e}", fmt_syms(&target))))?;
            check_dims_size(&dims).map_err(|e| c.bad(format!("the tiled shape {e}")))?;
            x = self.emit_tmp(
                c,
                Op::Expand { shape: dims },
                &[(c.n.input[0].clone(), x)],
                "broadcast",
            )?;
        }
        let repeats: Vec<i64> = reps.iter().map(|s| s.c).collect();
        if let Some(bad) = repeats.iter().find(|&&v| v < 1) {
            return Err(c.bad(format!(
                "repeats {repeats:?}: a repeat of {bad} is not supported (at least 1; 0 \
                 makes an empty tensor)"
            )));
        }
        if repeats.iter().all(|&v| v == 1) {
            return Ok(vec![x]);
        }
        let mut shape = x.sym_shape().map_err(|e| c.bad(e))?;
        let mut out_shape = shape.clone();
        for (d, &k) in out_shape.iter_mut().zip(&repeats) {
            *d = d.mul(Sym::k(k)).map_err(|e| c.bad(e))?;
        }
        let out_dims: Vec<Dim> = out_shape
            .iter()
            .map(|&s| sym_to_dim(s, false))
            .collect::<Result<_, _>>()
            .map_err(|e| c.bad(format!("output shape {}: {e}", fmt_syms(&out_shape))))?;
        check_dims_size(&out_dims).map_err(|e| c.bad(format!("the tiled shape {e}")))?;
        if !x.is_dyn() {
            let out: Vec<usize> = out_shape.iter().map(|s| s.c as usize).collect();
            match x {
                Val::I(_) => fold::numel_of::<Sym>(&out),
                Val::B(_) => fold::numel_of::<bool>(&out),
                _ => fold::numel(&out),
            }
            .map_err(|e| c.bad(e))?;
        }
        let mut cur = (format!("{}:broadcast", c.r.node), x);
        let last = repeats.iter().rposition(|&v| v > 1).unwrap_or(0);
        for (k, &rep) in repeats.iter().enumerate() {
            if rep == 1 {
                continue;
            }
            let split = |with: Sym| -> Result<Vec<Sym>> {
                let mut s = shape.clone();
                s.insert(k, with);
                Ok(s)
            };
            let (ones, wide) = (split(Sym::k(1))?, split(Sym::k(rep))?);
            let mut merged = shape.clone();
            merged[k] = out_shape[k];
            let next = if cur.1.is_dyn() {
                let dims = |s: &[Sym]| -> Result<Vec<Dim>> {
                    s.iter()
                        .map(|&d| sym_to_dim(d, false))
                        .collect::<Result<_, _>>()
                        .map_err(|e| c.bad(format!("shape {}: {e}", fmt_syms(s))))
                };
                let apart = self.emit_tmp(
                    c,
                    Op::Reshape {
                        shape: dims(&ones)?,
                    },
                    &[cur],
                    "apart",
                )?;
                let copies = self.emit_tmp(
                    c,
                    Op::Expand {
                        shape: dims(&wide)?,
                    },
                    &[(format!("{}:apart", c.r.node), apart)],
                    "copies",
                )?;
                if k == last {
                    let out = self.out_name(c, 0);
                    let ins = [(format!("{}:copies", c.r.node), copies)];
                    let op = Op::Reshape {
                        shape: dims(&merged)?,
                    };
                    return self.emit(c, op, &ins, vec![out]);
                }
                self.emit_tmp(
                    c,
                    Op::Reshape {
                        shape: dims(&merged)?,
                    },
                    &[(format!("{}:copies", c.r.node), copies)],
                    "tiled",
                )?
            } else {
                let st = |s: &[Sym]| s.iter().map(|d| d.c as usize).collect::<Vec<_>>();
                let (ones, wide, merged) = (st(&ones), st(&wide), st(&merged));
                map_arr(
                    c,
                    cur.1,
                    |a| {
                        a.reshape(ones.clone())?
                            .broadcast_to(&wide)?
                            .reshape(merged.clone())
                    },
                    |a| {
                        a.reshape(ones.clone())?
                            .broadcast_to(&wide)?
                            .reshape(merged.clone())
                    },
                    |a| {
                        a.reshape(ones.clone())?
                            .broadcast_to(&wide)?
                            .reshape(merged.clone())
                    },
                )?
            };
            shape = merged;
            self.fresh += 1;
            cur = (format!("{}:tiled{}", c.r.node, self.fresh), next);
        }
        Ok(vec![cur.1])
    }
}
