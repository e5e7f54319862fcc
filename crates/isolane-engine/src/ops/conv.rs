//! Convolutions (`Op::Conv`, 2-D NCHW with a fused bias, residual and activation): the shape
//! rule and the CPU kernel's set-up. ONNX's 3-D Conv is imported as 2-D ones (see
//! `crate::onnx`'s volume import).

use std::sync::Arc;

use crate::error::Result;
use crate::ir::{rank4, shape_err, window_out, ConvAttrs, Node};
use crate::kernels::implicit::Implicit;
use crate::kernels::{ConvK, ConvMethod, Kernel};

/// The shape rule of `Op::Conv(a)`.
pub(crate) fn infer_conv(n: &Node, ins: &[&[usize]], a: &ConvAttrs) -> Result<Vec<usize>> {
    let err = |m: String| shape_err(n, m);
    let x = ins.first().copied().unwrap_or(&[]);
    let shape = {
        rank4(n, x, "input")?;
        let w = ins[1];
        rank4(n, w, "weight")?;
        let g = a.groups;
        if g == 0 || !x[1].is_multiple_of(g) || !w[0].is_multiple_of(g) || w[1] * g != x[1] {
            return Err(err(format!(
                "input {x:?}, weight {w:?} and groups {g} do not fit"
            )));
        }
        if ins.len() >= 3 && ins[2] != [w[0]] {
            return Err(err(format!("bias shape {:?}, expected [{}]", ins[2], w[0])));
        }
        let oh = window_out(
            x[2],
            w[2],
            a.strides[0],
            a.pads[0],
            a.pads[2],
            a.dilations[0],
            false,
        );
        let ow = window_out(
            x[3],
            w[3],
            a.strides[1],
            a.pads[1],
            a.pads[3],
            a.dilations[1],
            false,
        );
        let (Some(oh), Some(ow)) = (oh, ow) else {
            return Err(err(format!("kernel {w:?} does not fit input {x:?}")));
        };
        let o = vec![x[0], w[0], oh, ow];
        if a.residual && ins[3] != o.as_slice() {
            return Err(err(format!("residual shape {:?}, expected {o:?}", ins[3])));
        }
        o
    };
    Ok(shape)
}

/// The CPU kernel of `Op::Conv(a)`.
pub(crate) fn prepare_conv(ins: &[&[usize]], outs: &[&[usize]], a: &ConvAttrs) -> Result<Kernel> {
    let x = ins[0];
    let o = outs[0];
    let kernel = {
        let w = ins[1];
        let cg = w[1];
        let method = if cg == 1 && a.groups > 1 {
            ConvMethod::Depthwise
        } else if w[2] == 1 && w[3] == 1 && a.strides == [1, 1] && a.pads == [0; 4] {
            ConvMethod::Pointwise
        } else {
            ConvMethod::Im2col
        };
        Kernel::Conv(ConvK {
            n: x[0],
            c: x[1],
            h: x[2],
            w: x[3],
            m: w[0],
            oh: o[2],
            ow: o[3],
            kh: w[2],
            kw: w[3],
            sh: a.strides[0],
            sw: a.strides[1],
            pt: a.pads[0],
            pl: a.pads[1],
            dh: a.dilations[0],
            dw: a.dilations[1],
            groups: a.groups,
            act: a.activation,
            has_bias: ins.len() >= 3,
            residual: a.residual,
            method,
            packed: None,
            implicit: if method == ConvMethod::Im2col {
                Implicit::prepare(
                    x,
                    w[0],
                    o,
                    [w[2], w[3]],
                    a.strides,
                    [a.pads[0], a.pads[1]],
                    a.dilations,
                    a.groups,
                )
                .map(Arc::new)
            } else {
                None
            },
            tile: {
                // ~256 KiB of im2col per task, a multiple of 16 columns; whole output
                // rows when the rows can be lowered as one contiguous copy.
                let kk = (w[1] * w[2] * w[3]).max(1);
                let t = ((65536 / kk).clamp(112, 4096) / 16) * 16;
                if o[3] <= t {
                    (t / o[3]).max(1) * o[3]
                } else {
                    t
                }
            },
        })
    };
    Ok(kernel)
}
