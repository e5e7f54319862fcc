//! Ops that pick or join parts of tensors: `Op::Concat`, `Op::Split`, `Op::Slice` (ONNX
//! semantics, negative steps included) and `Op::Gather` (constant indices).

use crate::error::Result;
use crate::ir::{norm_axis, shape_err, slice_params, Node};
use crate::kernels::{strides_of, unsupported, Kernel, StridedK};

/// The shape rule of `Op::Split { axis, sizes }`, the one op with several outputs.
pub(crate) fn infer_split(
    n: &Node,
    x: &[usize],
    axis: i64,
    sizes: &[usize],
) -> Result<Vec<Vec<usize>>> {
    let err = |m: String| shape_err(n, m);
    let a = norm_axis(axis, x.len())
        .ok_or_else(|| err(format!("axis {axis} out of range for {x:?}")))?;
    if sizes.iter().sum::<usize>() != x[a] {
        return Err(err(format!("split sizes {sizes:?} do not sum to {}", x[a])));
    }
    Ok(sizes
        .iter()
        .map(|&s| {
            let mut o = x.to_vec();
            o[a] = s;
            o
        })
        .collect())
}

/// The shape rule of `Op::Slice { .. }`.
pub(crate) fn infer_slice(
    n: &Node,
    x: &[usize],
    starts: &[i64],
    ends: &[i64],
    axes: &[i64],
    steps: &[i64],
) -> Result<Vec<usize>> {
    let p = slice_params(x, starts, ends, axes, steps).map_err(|m| shape_err(n, m))?;
    Ok(p.iter().map(|t| t.2).collect())
}

/// The shape rule of `Op::Concat { axis }`.
pub(crate) fn infer_concat(n: &Node, ins: &[&[usize]], axis: &i64) -> Result<Vec<usize>> {
    let err = |m: String| shape_err(n, m);
    let x = ins.first().copied().unwrap_or(&[]);
    let shape = {
        let a = norm_axis(*axis, x.len())
            .ok_or_else(|| err(format!("axis {axis} out of range for {x:?}")))?;
        let mut o = x.to_vec();
        o[a] = 0;
        for s in ins {
            if s.len() != x.len() || s.iter().enumerate().any(|(i, &d)| i != a && d != x[i]) {
                return Err(err(format!("cannot concat {s:?} with {x:?} on axis {a}")));
            }
            o[a] = o[a]
                .checked_add(s[a])
                .ok_or_else(|| err(format!("concatenating {s:?} on axis {a} passes usize")))?;
        }
        o
    };
    Ok(shape)
}

/// The shape rule of `Op::Gather { axis, indices, indices_shape, }`.
pub(crate) fn infer_gather(
    n: &Node,
    ins: &[&[usize]],
    axis: &i64,
    indices: &[i64],
    indices_shape: &[usize],
) -> Result<Vec<usize>> {
    let err = |m: String| shape_err(n, m);
    let x = ins.first().copied().unwrap_or(&[]);
    let shape = {
        let a = norm_axis(*axis, x.len())
            .ok_or_else(|| err(format!("axis {axis} out of range for {x:?}")))?;
        if indices_shape.iter().product::<usize>() != indices.len() {
            return Err(err("indices do not fit indices_shape".into()));
        }
        let d = x[a] as i64;
        if let Some(bad) = indices.iter().find(|&&i| i < -d || i >= d) {
            return Err(err(format!("index {bad} out of range for dim of size {d}")));
        }
        let mut o = x[..a].to_vec();
        o.extend_from_slice(indices_shape);
        o.extend_from_slice(&x[a + 1..]);
        o
    };
    Ok(shape)
}

/// The CPU kernel of `Op::Slice { starts, ends, axes, steps, }`.
pub(crate) fn prepare_slice(
    node: &Node,
    ins: &[&[usize]],
    outs: &[&[usize]],
    starts: &[i64],
    ends: &[i64],
    axes: &[i64],
    steps: &[i64],
) -> Result<Kernel> {
    let x = ins[0];
    let o = outs[0];
    let kernel = {
        let p = slice_params(x, starts, ends, axes, steps).map_err(|m| unsupported(node, m))?;
        let st = strides_of(x);
        let base: i64 = p
            .iter()
            .zip(&st)
            .map(|(t, &s)| if t.2 > 0 { t.0 * s as i64 } else { 0 })
            .sum();
        Kernel::Strided(StridedK {
            out_shape: o.to_vec(),
            strides: p
                .iter()
                .zip(&st)
                .map(|(t, &s)| (t.1 * s as i64) as isize)
                .collect(),
            base: base as isize,
        })
    };
    Ok(kernel)
}

/// The CPU kernel of `Op::Concat { axis }`.
pub(crate) fn prepare_concat(node: &Node, ins: &[&[usize]], axis: i64) -> Result<Kernel> {
    let x = ins[0];
    let a = norm_axis(axis, x.len()).ok_or_else(|| unsupported(node, "axis"))?;
    Ok(Kernel::Concat {
        outer: x[..a].iter().product(),
        chunks: ins.iter().map(|s| s[a..].iter().product()).collect(),
    })
}

/// The CPU kernel of `Op::Split { axis, .. }`.
pub(crate) fn prepare_split(
    node: &Node,
    x: &[usize],
    outs: &[&[usize]],
    axis: i64,
) -> Result<Kernel> {
    let a = norm_axis(axis, x.len()).ok_or_else(|| unsupported(node, "axis"))?;
    Ok(Kernel::Split {
        outer: x[..a].iter().product(),
        chunks: outs.iter().map(|s| s[a..].iter().product()).collect(),
    })
}

/// The CPU kernel of `Op::Gather { axis, indices, .. }` (negative indices count from the end).
pub(crate) fn prepare_gather(
    node: &Node,
    x: &[usize],
    axis: i64,
    indices: &[i64],
) -> Result<Kernel> {
    let a = norm_axis(axis, x.len()).ok_or_else(|| unsupported(node, "axis"))?;
    let d = x[a] as i64;
    Ok(Kernel::Gather {
        outer: x[..a].iter().product(),
        dim: x[a],
        inner: x[a + 1..].iter().product(),
        indices: indices
            .iter()
            .map(|&i| if i < 0 { (i + d) as usize } else { i as usize })
            .collect(),
    })
}
