//! Reductions over axes: `Op::Reduce` (Mean, Sum, Max, Min, L1, SumSquare, L2) and
//! `Op::Softmax`.

use crate::error::Result;
use crate::ir::{norm_axis, shape_err, Node, ReduceKind};
use crate::kernels::{strides_of, unsupported, Kernel};

/// The shape rule of `Op::Softmax { axis }`: the input's shape, once the axis is in range.
pub(crate) fn infer_softmax(n: &Node, x: &[usize], axis: i64) -> Result<Vec<usize>> {
    norm_axis(axis, x.len())
        .ok_or_else(|| shape_err(n, format!("axis {axis} out of range for {x:?}")))?;
    Ok(x.to_vec())
}

/// The shape rule of `Op::Reduce { axes, keepdims, .. }`.
pub(crate) fn infer_reduce(
    n: &Node,
    ins: &[&[usize]],
    axes: &[i64],
    keepdims: &bool,
) -> Result<Vec<usize>> {
    let err = |m: String| shape_err(n, m);
    let x = ins.first().copied().unwrap_or(&[]);
    let shape = {
        let mut red = vec![axes.is_empty(); x.len()];
        for &a in axes {
            red[norm_axis(a, x.len()).ok_or_else(|| err(format!("axis {a} out of range")))?] = true;
        }
        let mut o = Vec::new();
        for (i, &d) in x.iter().enumerate() {
            if !red[i] {
                o.push(d);
            } else if *keepdims {
                o.push(1);
            }
        }
        o
    };
    Ok(shape)
}

/// The CPU kernel of `Op::Softmax { axis }`.
pub(crate) fn prepare_softmax(node: &Node, x: &[usize], axis: i64) -> Result<Kernel> {
    let a = norm_axis(axis, x.len()).ok_or_else(|| unsupported(node, "axis"))?;
    Ok(Kernel::Softmax {
        outer: x[..a].iter().product(),
        dim: x[a],
        inner: x[a + 1..].iter().product(),
    })
}

/// The CPU kernel of `Op::Reduce { kind, axes, .. }`.
pub(crate) fn prepare_reduce(
    node: &Node,
    ins: &[&[usize]],
    kind: &ReduceKind,
    axes: &[i64],
) -> Result<Kernel> {
    let x = ins[0];
    let kernel = {
        let mut red = vec![axes.is_empty(); x.len()];
        for &ax in axes {
            red[norm_axis(ax, x.len()).ok_or_else(|| unsupported(node, "axis"))?] = true;
        }
        let st = strides_of(x);
        let offs = |sel: bool| -> Vec<usize> {
            let dims: Vec<usize> = (0..x.len()).filter(|&i| red[i] == sel).collect();
            let total: usize = dims.iter().map(|&i| x[i]).product();
            let mut v = Vec::with_capacity(total);
            let mut idx = vec![0usize; dims.len()];
            for _ in 0..total {
                v.push(idx.iter().zip(&dims).map(|(i, &d)| i * st[d]).sum());
                for j in (0..idx.len()).rev() {
                    idx[j] += 1;
                    if idx[j] < x[dims[j]] {
                        break;
                    }
                    idx[j] = 0;
                }
            }
            v
        };
        Kernel::Reduce {
            kind: *kind,
            bases: offs(false),
            offsets: offs(true),
        }
    };
    Ok(kernel)
}
