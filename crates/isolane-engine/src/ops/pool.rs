//! Pooling: `Op::MaxPool`, `Op::AveragePool` (2-D windows), `Op::GlobalAveragePool` and
//! `Op::AdaptiveAvgPool`.
//!
//! ONNX: MaxPool and AveragePool (3-D ones as 2-D ones, [`super::volume`]), GlobalAveragePool
//! (of any rank) and GlobalMaxPool (a max Reduce).

use crate::error::Result;
use crate::ir::{self, ReduceKind};
use crate::ir::{rank4, shape_err, window_out, Node, Op, PoolAttrs};
use crate::kernels::{window_ranges, Kernel, PoolK};
use crate::onnx::import::{Ctx, Importer, Val};
use crate::onnx::Result as OnnxResult;
use crate::ops::ImportFn;

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

/// The ONNX op types imported as pools.
pub(crate) const ONNX: &[(&str, ImportFn)] = &[
    ("MaxPool", import_pool),
    ("AveragePool", import_pool),
    ("GlobalAveragePool", import_global_average),
    ("GlobalMaxPool", import_global_max),
];

/// A 3-D pool (a rank-5 input) becomes 2-D ones (`crate::ops::volume`).
fn import_pool(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
    let max = c.op() == "MaxPool";
    if im.input_rank(c) == 5 {
        im.pool3d(c, max)
    } else {
        im.pool(c, max)
    }
}

fn import_global_average(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
    if im.input_rank(c) != 4 {
        return im.global_average_nd(c);
    }
    let x = im.req(c, 0)?;
    if x.rank() != 4 {
        return Err(c.bad(format!("input must be 4-D NCHW, has rank {}", x.rank())));
    }
    im.emit1(c, Op::GlobalAveragePool, 1)
}

/// A max over every spatial dim.
fn import_global_max(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
    let x = im.req(c, 0)?;
    let axes = (2..x.rank() as i64).collect();
    im.emit1(
        c,
        Op::Reduce {
            kind: ReduceKind::Max,
            axes,
            keepdims: true,
        },
        1,
    )
}

impl Importer<'_> {
    pub(crate) fn pool(&mut self, c: &Ctx, max: bool) -> OnnxResult<Vec<Val>> {
        let x = self.req(c, 0)?;
        let Val::Dyn(xd) = &x else {
            return Err(c.bad(format!(
                "the input is {}; expected a runtime tensor",
                x.kind()
            )));
        };
        if xd.shapes[0].len() != 4 {
            return Err(c.bad(format!(
                "only 2-D pooling is supported (input rank {})",
                xd.shapes[0].len()
            )));
        }
        let kernel = Self::two(c, "kernel_shape", c.ints("kernel_shape")?, 0)?;
        if kernel[0] == 0 {
            return Err(c.bad("kernel_shape is required"));
        }
        let strides = Self::two(c, "strides", c.ints("strides")?, 1)?;
        let dilations = if max {
            // storage_order only changes the (unsupported) indices output.
            c.ignore("storage_order");
            Self::two(c, "dilations", c.ints("dilations")?, 1)?
        } else {
            // AveragePool has `dilations` from opset 19; exporters write the default [1, 1].
            let d = Self::two(c, "dilations", c.ints("dilations")?, 1)?;
            if d != [1, 1] {
                return Err(c.unsupported_attr(
                    "dilations",
                    format!("value {d:?} (average pooling supports only [1, 1])"),
                ));
            }
            d
        };
        let ceil_mode = c.int("ceil_mode", 0)? != 0;
        let count_include_pad = if max {
            false
        } else {
            c.int("count_include_pad", 0)? != 0
        };
        let hw = [xd.shapes[0][2], xd.shapes[0][3]];
        if hw.contains(&0) {
            return Err(c.bad(format!("empty input {:?}", xd.shapes[0])));
        }
        let pads = self.window_pads(c, hw, kernel, strides, dilations)?;
        let attrs = ir::PoolAttrs {
            kernel,
            strides,
            pads,
            dilations,
            ceil_mode,
            count_include_pad,
        };
        self.emit1(
            c,
            if max {
                Op::MaxPool(attrs)
            } else {
                Op::AveragePool(attrs)
            },
            1,
        )
    }
}
