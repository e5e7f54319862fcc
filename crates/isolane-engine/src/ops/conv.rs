//! Convolutions (`Op::Conv`, 2-D NCHW with a fused bias, residual and activation): the shape
//! rule, the CPU kernel's set-up and ONNX's Conv. A 3-D Conv is imported as 2-D ones
//! ([`super::volume`]).

use std::sync::Arc;

use crate::error::Result;
use crate::ir::{self, Op};
use crate::ir::{rank4, shape_err, window_out, ConvAttrs, Node};
use crate::kernels::implicit::Implicit;
use crate::kernels::{ConvK, ConvMethod, Kernel};
use crate::onnx::import::{Ctx, Importer, Val};
use crate::onnx::Result as OnnxResult;
use crate::ops::ImportFn;

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

/// The ONNX op types imported as convolutions.
pub(crate) const ONNX: &[(&str, ImportFn)] = &[("Conv", import_conv)];

/// A 3-D Conv (a rank-5 input) becomes 2-D ones (`crate::ops::volume`).
fn import_conv(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
    if im.input_rank(c) == 5 {
        im.conv3d(c)
    } else {
        im.conv(c)
    }
}

impl Importer<'_> {
    pub(crate) fn conv(&mut self, c: &Ctx) -> OnnxResult<Vec<Val>> {
        let x = self.req(c, 0)?;
        let w = self.req(c, 1)?;
        let op = self.conv_op(c, &x, &w)?;
        self.emit1(c, op, 3)
    }

    /// The IR Conv for a 2-D convolution of `x` by weights `w` with the node's attributes
    /// (Conv's, and QLinearConv's and ConvInteger's, which are the same).
    pub(crate) fn conv_op(&mut self, c: &Ctx, x: &Val, w: &Val) -> OnnxResult<Op> {
        let ws = w.sym_shape().map_err(|e| c.bad(e))?;
        // A float constant input (a positional encoding computed from constants, as edgenext's)
        // becomes an IR constant; the passes then fold the Conv at compile time.
        let xshape = match x {
            Val::Dyn(d) => d.shapes[0].clone(),
            Val::F(a) => a.shape.clone(),
            other => {
                return Err(c.bad(format!(
                    "the input is {}; expected a float tensor",
                    other.kind()
                )))
            }
        };
        if xshape.len() != 4 || ws.len() != 4 {
            return Err(c.bad(format!(
                "only 2-D convolution is supported (input rank {}, weight rank {})",
                xshape.len(),
                ws.len()
            )));
        }
        let kernel = [ws[2].c as usize, ws[3].c as usize];
        if kernel.contains(&0) || xshape[2] == 0 || xshape[3] == 0 {
            return Err(c.bad(format!("empty kernel {kernel:?} or input {xshape:?}")));
        }
        if let Some(k) = c.ints("kernel_shape")? {
            if k != [kernel[0] as i64, kernel[1] as i64] {
                return Err(c.bad(format!(
                    "kernel_shape {k:?} differs from the weight's {kernel:?}"
                )));
            }
        }
        let strides = Self::two(c, "strides", c.ints("strides")?, 1)?;
        let dilations = Self::two(c, "dilations", c.ints("dilations")?, 1)?;
        let groups = c.int("group", 1)?;
        if groups < 1 {
            return Err(c.bad(format!("group {groups}")));
        }
        let hw = [xshape[2], xshape[3]];
        let pads = self.window_pads(c, hw, kernel, strides, dilations)?;
        Ok(Op::Conv(ir::ConvAttrs {
            strides,
            pads,
            dilations,
            groups: groups as usize,
            activation: None,
            residual: false,
        }))
    }
}
