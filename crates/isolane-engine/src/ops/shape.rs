//! Ops that move or re-view data without computing: `Op::Flatten`, `Op::Reshape`,
//! `Op::Unsqueeze`, `Op::Squeeze` (views: the output is the input's data with another shape),
//! `Op::Transpose` and `Op::Expand` (strided copies).

use crate::error::Result;
use crate::ir::{broadcast_shapes, checked_numel, norm_axis, resolve_dims, shape_err, Dim, Node};
use crate::kernels::{bcast_strides, strides_of, Kernel, StridedK};

/// The shape rule of `Op::Flatten { axis }`: `[product of dims before axis, product of the rest]`.
pub(crate) fn infer_flatten(n: &Node, x: &[usize], axis: i64) -> Result<Vec<usize>> {
    let err = |m: String| shape_err(n, m);
    let a = if axis == x.len() as i64 {
        x.len()
    } else {
        norm_axis(axis, x.len())
            .ok_or_else(|| err(format!("axis {axis} out of range for {x:?}")))?
    };
    let (Some(outer), Some(inner)) = (checked_numel(&x[..a]), checked_numel(&x[a..])) else {
        return Err(err(format!("{x:?} holds more elements than usize counts")));
    };
    Ok(vec![outer, inner])
}

/// The shape rule of `Op::Reshape { shape }`.
pub(crate) fn infer_reshape(
    n: &Node,
    x: &[usize],
    shape: &[Dim],
    batch: usize,
) -> Result<Vec<usize>> {
    let err = |m: String| shape_err(n, m);
    let o = resolve_dims(shape, Some(x), batch).map_err(err)?;
    // Checked: a target shape from a model file may multiply past usize.
    if checked_numel(&o).is_none() || checked_numel(&o) != checked_numel(x) {
        return Err(err(format!("cannot reshape {x:?} into {o:?}")));
    }
    Ok(o)
}

/// The shape rule of `Op::Expand { shape }`: the broadcast of the input and the target.
pub(crate) fn infer_expand(
    n: &Node,
    x: &[usize],
    shape: &[Dim],
    batch: usize,
) -> Result<Vec<usize>> {
    let err = |m: String| shape_err(n, m);
    let t = resolve_dims(shape, None, batch).map_err(err)?;
    broadcast_shapes(x, &t).ok_or_else(|| err(format!("cannot expand {x:?} to {t:?}")))
}

/// The shape rule of `Op::Transpose { perm }`.
pub(crate) fn infer_transpose(n: &Node, ins: &[&[usize]], perm: &[usize]) -> Result<Vec<usize>> {
    let err = |m: String| shape_err(n, m);
    let x = ins.first().copied().unwrap_or(&[]);
    let shape = {
        let mut seen = vec![false; x.len()];
        if perm.len() != x.len()
            || perm
                .iter()
                .any(|&p| p >= x.len() || std::mem::replace(&mut seen[p], true))
        {
            return Err(err(format!(
                "perm {perm:?} is not a permutation of rank {}",
                x.len()
            )));
        }
        perm.iter().map(|&p| x[p]).collect()
    };
    Ok(shape)
}

/// The shape rule of `Op::Unsqueeze { axes }`.
pub(crate) fn infer_unsqueeze(n: &Node, ins: &[&[usize]], axes: &[i64]) -> Result<Vec<usize>> {
    let err = |m: String| shape_err(n, m);
    let x = ins.first().copied().unwrap_or(&[]);
    let shape = {
        let r = x.len() + axes.len();
        let mut ax: Vec<usize> = Vec::new();
        for &a in axes {
            ax.push(norm_axis(a, r).ok_or_else(|| err(format!("axis {a} out of range")))?);
        }
        ax.sort_unstable();
        ax.dedup();
        if ax.len() != axes.len() {
            return Err(err("repeated axis".into()));
        }
        let mut o = Vec::with_capacity(r);
        let mut it = x.iter();
        for i in 0..r {
            if ax.contains(&i) {
                o.push(1);
            } else if let Some(&d) = it.next() {
                o.push(d);
            }
        }
        o
    };
    Ok(shape)
}

/// The shape rule of `Op::Squeeze { axes }`.
pub(crate) fn infer_squeeze(n: &Node, ins: &[&[usize]], axes: &[i64]) -> Result<Vec<usize>> {
    let err = |m: String| shape_err(n, m);
    let x = ins.first().copied().unwrap_or(&[]);
    let shape = {
        let mut drop = vec![false; x.len()];
        if axes.is_empty() {
            for (i, &d) in x.iter().enumerate() {
                drop[i] = d == 1;
            }
        } else {
            for &a in axes {
                let i =
                    norm_axis(a, x.len()).ok_or_else(|| err(format!("axis {a} out of range")))?;
                if x[i] != 1 {
                    return Err(err(format!("cannot squeeze dim {i} of size {}", x[i])));
                }
                drop[i] = true;
            }
        }
        x.iter()
            .enumerate()
            .filter(|(i, _)| !drop[*i])
            .map(|(_, &d)| d)
            .collect()
    };
    Ok(shape)
}

/// The CPU kernel of `Op::Transpose { perm }`: a strided copy.
pub(crate) fn prepare_transpose(x: &[usize], o: &[usize], perm: &[usize]) -> Kernel {
    let st = strides_of(x);
    Kernel::Strided(StridedK {
        out_shape: o.to_vec(),
        strides: perm.iter().map(|&p| st[p] as isize).collect(),
        base: 0,
    })
}

/// The CPU kernel of `Op::Expand`: a strided copy with stride 0 on the broadcast dims.
pub(crate) fn prepare_expand(x: &[usize], o: &[usize]) -> Kernel {
    Kernel::Strided(StridedK {
        out_shape: o.to_vec(),
        strides: bcast_strides(x, o)
            .into_iter()
            .map(|s| s as isize)
            .collect(),
        base: 0,
    })
}
