//! The CUDA lowering of the `norm` family (its engine home: isolane-engine's `ops/norm.rs`).
//! BatchNorm (a per-channel affine step) and LayerNorm.

use crate::plan::*;

impl Planner<'_> {
    /// Lowers `Op::BatchNorm { eps }`.
    pub(in crate::plan) fn lower_batch_norm(&mut self, c: &NodeCtx, eps: &f32) -> Result<Lowered> {
        let p = self;
        let (n, name, outs, out_shape, x0, g) = (c.n, c.name, &c.outs, &c.out_shape, c.x0, p.g);
        // A BatchNorm the passes could not fold into a producer (densenet's norms of
        // concatenated features): one pointwise pass x · scale[c] + shift[c].
        let (scale, shift) = batchnorm_affine(g, &n.inputs, *eps)
            .ok_or_else(|| unsupported(name, "BatchNorm with computed parameters"))?;
        let x = p.raw(x0, name)?;
        let keep = p.nhwc[x0];
        let scale = p.new_const(scale);
        let shift = p.new_const(shift);
        let y = p.output(outs[0], keep);
        let channels = out_shape[1];
        let inner = if keep {
            1
        } else {
            out_shape[2..].iter().product()
        };
        p.push(
            name,
            StepKind::Pointwise {
                x,
                y,
                scale: Some(scale),
                bias: Some(shift),
                residual: None,
                n: out_shape.iter().product(),
                channels,
                inner,
                act: None,
            },
        );
        Ok(Lowered::Steps)
    }

    /// Lowers `Op::LayerNorm { axis, eps }`.
    pub(in crate::plan) fn lower_layer_norm(
        &mut self,
        c: &NodeCtx,
        axis: &i64,
        eps: &f32,
    ) -> Result<Lowered> {
        let p = self;
        let (n, name, in_shapes, outs, x0) = (c.n, c.name, &c.in_shapes, &c.outs, c.x0);
        let x = &in_shapes[0];
        let a = norm_axis(*axis, x.len()).ok_or_else(|| unsupported(name, "bad axis"))?;
        let xl = p.plain(x0, name)?;
        let scale = p.raw(n.inputs[1], name)?;
        let bias = match n.inputs.get(2) {
            Some(&b) => Some(p.raw(b, name)?),
            None => None,
        };
        let y = p.output(outs[0], false);
        p.push(
            name,
            StepKind::LayerNorm(LayerNormStep {
                x: xl,
                scale,
                bias,
                y,
                rows: x[..a].iter().product(),
                cols: x[a..].iter().product(),
                eps: *eps,
            }),
        );
        Ok(Lowered::Steps)
    }
}

/// BatchNorm's per-channel `(scale, shift)` = `(γ/√(var+ε), β − mean·scale)`, computed in f32
/// exactly as the CPU backend does; `None` when a parameter is not a constant.
fn batchnorm_affine(g: &Graph, inputs: &[usize], eps: f32) -> Option<(Tensor, Tensor)> {
    let param = |i: usize| match &g.values[*inputs.get(i)?].kind {
        ValueKind::Constant(t) => Some(t.clone()),
        _ => None,
    };
    let (gamma, beta, mean, var) = (param(1)?, param(2)?, param(3)?, param(4)?);
    let c = gamma.numel();
    let scale: Vec<f32> = (0..c)
        .map(|ch| gamma.data[ch] / (var.data[ch] + eps).sqrt())
        .collect();
    let shift: Vec<f32> = (0..c)
        .map(|ch| beta.data[ch] - mean.data[ch] * scale[ch])
        .collect();
    Some((
        Tensor::new(vec![c], scale).ok()?,
        Tensor::new(vec![c], shift).ok()?,
    ))
}
