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
    /// Whether a ceil-mode pool's window (dilation 1) is larger than the padded input on
    /// both axes, by less than a stride: its output is one window ([`ir::window_out`] has no
    /// answer for a window past the input; PyTorch and onnxruntime take one).
    fn one_window_past_the_input(
        hw: [usize; 2],
        kernel: [usize; 2],
        strides: [usize; 2],
        pads: [usize; 4],
    ) -> bool {
        (0..2).all(|a| {
            let padded = hw[a].saturating_add(pads[a]).saturating_add(pads[a + 2]);
            kernel[a] > padded && kernel[a] - padded < strides[a]
        })
    }

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
        if ceil_mode
            && dilations == [1, 1]
            && Self::one_window_past_the_input(hw, kernel, strides, pads)
        {
            // ONNX's (and PyTorch's) ceil rule: ceil((padded - kernel) / stride) + 1 = 1 for a
            // window past the padded input by less than a stride, so one window starting at
            // the top-left pad. Transformers' EfficientNet pools so: AvgPool2d(2560,
            // ceil_mode=True) on 18×18 (b7). Without pads, or without counting them, that
            // window's mean (max) is the whole plane's: the global pool, exactly, rather than
            // a window loop over 2560² taps per value.
            if pads.iter().any(|&p| p != 0) && count_include_pad {
                return Err(c.bad(format!(
                    "a window {kernel:?} larger than the input {hw:?} with pads {pads:?} and \
                     count_include_pad=1 is not supported (without pads, or without counting \
                     them, it is a global pool)"
                )));
            }
            if max {
                return import_global_max(self, c);
            }
            return self.emit1(c, Op::GlobalAveragePool, 1);
        }
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

#[cfg(test)]
mod tests {
    use crate::onnx::proto::{attribute_proto::AttributeType, AttributeProto, NodeProto};
    use crate::ops::testing::{node, run, with_int};

    fn ints_attr(mut n: NodeProto, name: &str, v: &[i64]) -> NodeProto {
        n.attribute.push(AttributeProto {
            name: Some(name.into()),
            ints: v.to_vec(),
            r#type: Some(AttributeType::Ints as i32),
            ..Default::default()
        });
        n
    }

    fn pool(op: &str, k: i64, ceil: i64, pads: &[i64], include: i64) -> Vec<NodeProto> {
        let mut n = ints_attr(node(op, &["x"], "y"), "kernel_shape", &[k, k]);
        n = ints_attr(n, "strides", &[k, k]);
        n = ints_attr(n, "pads", pads);
        n = with_int(n, "ceil_mode", ceil);
        if op == "AveragePool" {
            n = with_int(n, "count_include_pad", include);
        }
        vec![n]
    }

    /// Transformers' EfficientNet pools its 18×18 (b7) features with AvgPool2d(2560,
    /// ceil_mode=True): one window (PyTorch and onnxruntime), refused as "window [2560, 2560]
    /// does not fit input". It is the global pool.
    #[test]
    fn a_ceil_mode_window_past_the_input_is_one_window_over_all_of_it() {
        let x: Vec<f32> = (0..16).map(|v| v as f32).collect();
        let zero = [0, 0, 0, 0];
        for include in [0, 1] {
            let y = run(
                pool("AveragePool", 6, 1, &zero, include),
                vec![],
                &[1, 1, 4, 4],
                &x,
            );
            let y = y.unwrap();
            assert_eq!(
                (y.shape.clone(), y.data.clone()),
                (vec![1, 1, 1, 1], vec![7.5])
            );
        }
        let y = run(pool("MaxPool", 6, 1, &zero, 0), vec![], &[1, 1, 4, 4], &x).unwrap();
        assert_eq!(y.data, vec![15.0]);
        // Padding counted into such a window is not a global pool: refused by name.
        let e = run(
            pool("AveragePool", 7, 1, &[1, 1, 1, 1], 1),
            vec![],
            &[1, 1, 4, 4],
            &x,
        )
        .unwrap_err();
        assert!(
            e.contains("larger than the input") && e.contains("count_include_pad"),
            "{e}"
        );
        // Without ceil mode there is no window at all (ONNX: an output of size 0).
        let e = run(
            pool("AveragePool", 6, 0, &zero, 0),
            vec![],
            &[1, 1, 4, 4],
            &x,
        )
        .unwrap_err();
        assert!(e.contains("does not fit input"), "{e}");
    }
}
