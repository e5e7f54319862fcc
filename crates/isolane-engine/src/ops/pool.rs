//! Pooling: `Op::MaxPool`, `Op::AveragePool` (2-D windows), `Op::GlobalAveragePool` and
//! `Op::AdaptiveAvgPool`.

use crate::error::Result;
use crate::ir::{rank4, shape_err, window_out, Node, Op, PoolAttrs};
use crate::kernels::{window_ranges, Kernel, PoolK};

/// The shape rule of `Op::MaxPool(p) | Op::AveragePool(p)`.
pub(crate) fn infer_pool(n: &Node, ins: &[&[usize]], p: &PoolAttrs) -> Result<Vec<usize>> {
    let err = |m: String| shape_err(n, m);
    let x = ins.first().copied().unwrap_or(&[]);
    let shape = {
        rank4(n, x, "input")?;
        let oh = window_out(
            x[2],
            p.kernel[0],
            p.strides[0],
            p.pads[0],
            p.pads[2],
            p.dilations[0],
            p.ceil_mode,
        );
        let ow = window_out(
            x[3],
            p.kernel[1],
            p.strides[1],
            p.pads[1],
            p.pads[3],
            p.dilations[1],
            p.ceil_mode,
        );
        let (Some(oh), Some(ow)) = (oh, ow) else {
            return Err(err(format!(
                "window {:?} does not fit input {x:?}",
                p.kernel
            )));
        };
        vec![x[0], x[1], oh, ow]
    };
    Ok(shape)
}

/// The shape rule of `Op::GlobalAveragePool`: every spatial dim becomes 1.
pub(crate) fn infer_global_average(n: &Node, x: &[usize]) -> Result<Vec<usize>> {
    if x.len() < 3 {
        return Err(shape_err(n, format!("input {x:?} has no spatial dims")));
    }
    let mut o = x[..2].to_vec();
    o.extend(std::iter::repeat_n(1, x.len() - 2));
    Ok(o)
}

/// The shape rule of `Op::AdaptiveAvgPool { output }`.
pub(crate) fn infer_adaptive_average(
    n: &Node,
    x: &[usize],
    output: &[usize; 2],
) -> Result<Vec<usize>> {
    rank4(n, x, "input")?;
    if output[0] == 0 || output[1] == 0 {
        return Err(shape_err(n, "output size 0"));
    }
    Ok(vec![x[0], x[1], output[0], output[1]])
}

/// The CPU kernel of `Op::MaxPool(p) | Op::AveragePool(p)`.
pub(crate) fn prepare_pool(
    node: &Node,
    ins: &[&[usize]],
    outs: &[&[usize]],
    p: &PoolAttrs,
) -> Result<Kernel> {
    let x = ins[0];
    let o = outs[0];
    let kernel = {
        let k = PoolK {
            nc: x[0] * x[1],
            h: x[2],
            w: x[3],
            oh: o[2],
            ow: o[3],
            p: p.clone(),
            ys: window_ranges(o[2], x[2], p.kernel[0], p.strides[0], p.pads[0]),
            xs: window_ranges(o[3], x[3], p.kernel[1], p.strides[1], p.pads[1]),
        };
        if matches!(node.op, Op::MaxPool(_)) {
            Kernel::MaxPool(k)
        } else {
            Kernel::AvgPool(k)
        }
    };
    Ok(kernel)
}

/// The CPU kernel of `Op::GlobalAveragePool` (an adaptive average to one cell).
pub(crate) fn prepare_global_average(x: &[usize]) -> Kernel {
    Kernel::AdaptiveAvg {
        nc: x[0] * x[1],
        h: x[2..].iter().product(),
        w: 1,
        oh: 1,
        ow: 1,
    }
}

/// The CPU kernel of `Op::AdaptiveAvgPool { output }`.
pub(crate) fn prepare_adaptive_average(x: &[usize], output: &[usize; 2]) -> Kernel {
    Kernel::AdaptiveAvg {
        nc: x[0] * x[1],
        h: x[2],
        w: x[3],
        oh: output[0],
        ow: output[1],
    }
}
