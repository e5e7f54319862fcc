//! `Op::Resize`: nearest and bilinear on the two spatial dims of an NCHW tensor, with ONNX's
//! coordinate transforms (the arithmetic is `crate::ir::ResizeAttrs::source`).

use crate::error::Result;
use crate::ir::{rank4, shape_err, Node, ResizeAttrs, ResizeMode, ResizeSize};
use crate::kernels::{Kernel, ResizeK};

/// The shape rule of `Op::Resize(r)`.
pub(crate) fn infer_resize(n: &Node, ins: &[&[usize]], r: &ResizeAttrs) -> Result<Vec<usize>> {
    let err = |m: String| shape_err(n, m);
    let x = ins.first().copied().unwrap_or(&[]);
    let shape = {
        rank4(n, x, "input")?;
        if x[2] == 0 || x[3] == 0 {
            return Err(err(format!("cannot resize an empty input {x:?}")));
        }
        let (oh, ow) = match r.size {
            ResizeSize::Size([h, w]) => (h, w),
            ResizeSize::Scales([sh, sw]) => {
                if !(sh > 0.0 && sw > 0.0 && sh.is_finite() && sw.is_finite()) {
                    return Err(err(format!("bad scales {sh}, {sw}")));
                }
                (
                    (x[2] as f32 * sh).floor() as usize,
                    (x[3] as f32 * sw).floor() as usize,
                )
            }
        };
        if oh == 0 || ow == 0 {
            return Err(err("output size 0".into()));
        }
        vec![x[0], x[1], oh, ow]
    };
    Ok(shape)
}

/// The CPU kernel of `Op::Resize(r)`.
pub(crate) fn prepare_resize(
    ins: &[&[usize]],
    outs: &[&[usize]],
    r: &ResizeAttrs,
) -> Result<Kernel> {
    let x = ins[0];
    let o = outs[0];
    let kernel = {
        let (h, w, oh, ow) = (x[2], x[3], o[2], o[3]);
        let [sh, sw] = r.coord_scales([h, w], [oh, ow]);
        let linear = r.mode == ResizeMode::Linear;
        let axis = |inp: usize, out: usize, scale: f32| -> Vec<(usize, usize, f32)> {
            (0..out).map(|i| r.source(i, inp, out, scale)).collect()
        };
        Kernel::Resize(ResizeK {
            nc: x[0] * x[1],
            h,
            w,
            oh,
            ow,
            linear,
            ys: axis(h, oh, sh),
            xs: axis(w, ow, sw),
        })
    };
    Ok(kernel)
}
