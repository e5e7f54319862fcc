//! Normalisations: `Op::BatchNorm` (per channel on dim 1) and `Op::LayerNorm` (over dims
//! `axis..`).

use crate::error::Result;
use crate::ir::{broadcast_shapes, norm_axis, shape_err, Node};
use crate::kernels::{unsupported, Kernel};

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
