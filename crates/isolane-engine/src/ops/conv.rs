//! Convolutions (`Op::Conv`, 2-D NCHW with a fused bias, residual and activation): the shape
//! rule, the CPU kernel's set-up and ONNX's Conv. A 3-D Conv is imported as 2-D ones
//! ([`super::volume`]).

use std::sync::Arc;

use crate::error::Result;
use crate::ir::{self, Op};
use crate::ir::{rank4, shape_err, window_out, ConvAttrs, Node};
use crate::kernels::implicit::Implicit;
use crate::kernels::{ConvK, ConvMethod, Kernel};
use crate::onnx::fold::{Arr, Sym};
use crate::onnx::import::{fmt_syms, sym_to_dim, Ctx, Importer, Val};
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

/// A general ConvTranspose's window geometry (ONNX attributes, checked).
struct Geometry {
    strides: [usize; 2],
    dilations: [usize; 2],
    groups: usize,
    /// `[top, left, bottom, right]`.
    pads: Vec<i64>,
    output_padding: Vec<i64>,
}

/// The ONNX op types imported as convolutions.
pub(crate) const ONNX: &[(&str, ImportFn)] = &[
    ("Conv", import_conv),
    ("ConvTranspose", import_conv_transpose),
];

fn import_conv_transpose(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
    im.conv_transpose(c)
}

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

    /// ConvTranspose whose kernel equals its stride (no overlap, no pads): each input pixel
    /// becomes its own `kh × kw` block of outputs, `W[ci, co, i, j]` weighing it. That is a
    /// 1×1 Conv to `Cout·kh·kw` channels, then the blocks moved into place (Reshape →
    /// Transpose → Reshape, a depth-to-space). DPT's reassemble stage (Transformers) and UNet
    /// decoders' `ConvTranspose2d(k, stride=k)` are so; other ConvTransposes are refused by
    /// name.
    pub(crate) fn conv_transpose(&mut self, c: &Ctx) -> OnnxResult<Vec<Val>> {
        let x = self.req(c, 0)?;
        let Val::F(w) = self.req(c, 1)? else {
            return Err(c.bad("the weight must be known at import"));
        };
        let bias = match self.get(c, 2)? {
            None => None,
            Some(Val::F(b)) => Some(b),
            Some(_) => return Err(c.bad("the bias must be known at import")),
        };
        let xs = x.sym_shape().map_err(|e| c.bad(e))?;
        if xs.len() != 4 || w.shape.len() != 4 {
            return Err(c.bad(format!(
                "only 2-D ConvTranspose is supported (input rank {}, weight rank {})",
                xs.len(),
                w.shape.len()
            )));
        }
        let (cin, cout, kh, kw) = (w.shape[0], w.shape[1], w.shape[2], w.shape[3]);
        if let Some(k) = c.ints("kernel_shape")? {
            if k != [kh as i64, kw as i64] {
                return Err(c.bad(format!("kernel_shape {k:?} differs from the weight's")));
            }
        }
        let strides = Self::two(c, "strides", c.ints("strides")?, 1)?;
        let dilations = Self::two(c, "dilations", c.ints("dilations")?, 1)?;
        let groups = c.int("group", 1)?;
        let pads = c.ints("pads")?.unwrap_or_else(|| vec![0; 4]);
        let output_padding = c.ints("output_padding")?.unwrap_or_else(|| vec![0; 2]);
        let auto_pad = c.string("auto_pad", "NOTSET")?;
        let output_shape = c.ints("output_shape")?;
        if !matches!(auto_pad.as_str(), "NOTSET" | "VALID") {
            return Err(c.unsupported_attr(
                "auto_pad",
                format!("value {auto_pad:?} (NOTSET and VALID are supported; give pads)"),
            ));
        }
        let pads = if auto_pad == "VALID" {
            vec![0; 4]
        } else {
            pads
        };
        if pads.len() != 4 || pads.iter().any(|&p| !(0..=1 << 20).contains(&p)) {
            return Err(c.bad(format!(
                "pads {pads:?}: expected 4 non-negative values (2-D)"
            )));
        }
        if output_padding.len() != 2 || output_padding.iter().any(|&p| !(0..=1 << 20).contains(&p))
        {
            return Err(c.bad(format!(
                "output_padding {output_padding:?}: expected 2 non-negative values"
            )));
        }
        if groups < 1 || cin % groups as usize != 0 {
            return Err(c.bad(format!(
                "group {groups} does not divide {cin} input channels"
            )));
        }
        if xs[1] != Sym::k(cin as i64) {
            return Err(c.bad(format!(
                "the input has {} channels, the weight {cin}",
                fmt_syms(&xs[1..2])
            )));
        }
        let [h, wd] = [xs[2], xs[3]];
        if !h.is_const() || !wd.is_const() {
            return Err(c.bad("the spatial size must not depend on the batch"));
        }
        let (h, wd) = (h.c as usize, wd.c as usize);
        // ONNX: out = (in - 1)·stride + (kernel - 1)·dilation + 1 + output_padding - pads.
        let out_hw = [0, 1].map(|a| {
            let (inp, k) = ([h, wd][a], [kh, kw][a]);
            ((inp - 1) * strides[a] + (k - 1) * dilations[a] + 1 + output_padding[a] as usize)
                as i64
                - pads[a]
                - pads[a + 2]
        });
        if out_hw.iter().any(|&o| o < 1) {
            return Err(c.bad(format!("the output would be {out_hw:?}: empty")));
        }
        if let Some(o) = output_shape {
            let o = &o[o.len().saturating_sub(2)..];
            if o != out_hw {
                return Err(c.unsupported_attr(
                    "output_shape",
                    format!(
                        "{o:?}, other than the {out_hw:?} the pads give (give the pads instead)"
                    ),
                ));
            }
        }
        let blocks = strides == [kh, kw]
            && dilations == [1, 1]
            && groups == 1
            && pads.iter().all(|&p| p == 0)
            && output_padding.iter().all(|&p| p == 0);
        if !blocks {
            let geometry = Geometry {
                strides,
                dilations,
                groups: groups as usize,
                pads,
                output_padding,
            };
            return self.conv_transpose_general(c, x, &w, bias, &geometry);
        }
        // The 1×1 Conv's weight: output channel (co, i, j) reads W[ci, co, i, j].
        let block = kh * kw;
        let mut wc = vec![0.0f32; cout * block * cin];
        for ci in 0..cin {
            for co in 0..cout {
                for ij in 0..block {
                    wc[(co * block + ij) * cin + ci] = w.data[(ci * cout + co) * block + ij];
                }
            }
        }
        let mut ins = vec![
            (c.n.input[0].clone(), x),
            (
                format!("{}:weight", c.r.node),
                Val::F(Arr::new(vec![cout * block, cin, 1, 1], wc)),
            ),
        ];
        if let Some(b) = bias {
            if b.data.len() != cout {
                return Err(c.bad(format!(
                    "bias of {} values for {cout} channels",
                    b.data.len()
                )));
            }
            let per = b
                .data
                .iter()
                .flat_map(|&v| std::iter::repeat_n(v, block))
                .collect();
            ins.push((
                format!("{}:bias", c.r.node),
                Val::F(Arr::new(vec![cout * block], per)),
            ));
        }
        let conv = Op::Conv(ConvAttrs::default());
        let y = self.emit_tmp(c, conv, &ins, "blocks")?;
        let f = ir::Dim::Fixed;
        let n = sym_to_dim(xs[0], false).map_err(|e| c.bad(e))?;
        let split = vec![n, f(cout), f(kh), f(kw), f(h), f(wd)];
        let name = format!("{}:blocks", c.r.node);
        let y = self.emit_tmp(
            c,
            Op::Reshape { shape: split },
            &[(name.clone(), y)],
            "split",
        )?;
        let perm = vec![0, 1, 4, 2, 5, 3];
        let y = self.emit_tmp(c, Op::Transpose { perm }, &[(name.clone(), y)], "placed")?;
        let out = self.out_name(c, 0);
        let shape = vec![n, f(cout), f(h * kh), f(wd * kw)];
        self.emit(c, Op::Reshape { shape }, &[(name, y)], vec![out])
    }

    /// Any other 2-D ConvTranspose (overlapping windows: UNet and GAN decoders' `k = 4,
    /// stride 2`, segmentation heads' `k = 3, stride 2, output_padding 1`), as its definition
    /// rewritten: `stride - 1` zeros inserted between the input's pixels (a Reshape that opens
    /// an axis of size 1, padded to `stride` with zeros, merged back), the border padded by
    /// `dilation·(kernel - 1) - pad` (cropped where negative; `output_padding` more at the
    /// end), then a stride-1 Conv with the same dilation and groups whose weight is the
    /// ConvTranspose's flipped in space, its input and output channels swapped per group.
    /// The same products, summed in another order.
    fn conv_transpose_general(
        &mut self,
        c: &Ctx,
        x: Val,
        w: &Arr<f32>,
        bias: Option<Arr<f32>>,
        geo: &Geometry,
    ) -> OnnxResult<Vec<Val>> {
        let (cin, cout_g, kh, kw) = (w.shape[0], w.shape[1], w.shape[2], w.shape[3]);
        let g = geo.groups;
        let (cin_g, cout) = (cin / g, cout_g * g);
        let xs = x.sym_shape().map_err(|e| c.bad(e))?;
        let n = sym_to_dim(xs[0], false).map_err(|e| c.bad(e))?;
        let f = ir::Dim::Fixed;
        let name = |what: &str| format!("{}:{what}", c.r.node);
        let mut cur = (c.n.input[0].clone(), x);
        let mut hw = [xs[2].c as usize, xs[3].c as usize];
        for a in 0..2 {
            let s = geo.strides[a];
            let k = [kh, kw][a];
            let edge = (geo.dilations[a] * (k - 1)) as i64;
            let before = edge - geo.pads[a];
            let mut after = edge - geo.pads[a + 2] + geo.output_padding[a];
            if s > 1 {
                // [.., in, ..] -> [.., in, 1, ..] -> zeros to [.., in, s, ..] -> [.., in·s, ..]:
                // each pixel followed by s - 1 zeros; the last s - 1 are cropped below.
                let mut open = vec![n, f(cin), f(hw[0]), f(hw[1])];
                open.insert(3 + a, f(1));
                let v = self.emit_tmp(c, Op::Reshape { shape: open }, &[cur], "open")?;
                let v = self.pad_axis(
                    c,
                    (name("open"), v),
                    3 + a,
                    [0, s as i64 - 1],
                    "constant",
                    0.0,
                )?;
                hw[a] *= s;
                let merged = vec![n, f(cin), f(hw[0]), f(hw[1])];
                let v = self.emit_tmp(
                    c,
                    Op::Reshape { shape: merged },
                    &[(name("zeros"), v)],
                    "spread",
                )?;
                cur = (name("spread"), v);
                after -= s as i64 - 1;
            }
            if before != 0 || after != 0 {
                let v = self.pad_axis(c, cur, 2 + a, [before, after], "constant", 0.0)?;
                let size = hw[a] as i64 + before + after;
                if size < 1 {
                    return Err(c.bad("the padded input is empty"));
                }
                hw[a] = size as usize;
                self.fresh += 1;
                cur = (format!("{}:bordered{}", c.r.node, self.fresh), v);
            }
        }
        // W'[gi·cout_g + o, i, y, x] = W[gi·cin_g + i, o, kh-1-y, kw-1-x]
        let mut wc = vec![0.0f32; cout * cin_g * kh * kw];
        for gi in 0..g {
            for i in 0..cin_g {
                for o in 0..cout_g {
                    for y in 0..kh {
                        for xx in 0..kw {
                            let src = (((gi * cin_g + i) * cout_g + o) * kh + kh - 1 - y) * kw + kw
                                - 1
                                - xx;
                            let dst = (((gi * cout_g + o) * cin_g + i) * kh + y) * kw + xx;
                            wc[dst] = w.data[src];
                        }
                    }
                }
            }
        }
        let mut ins = vec![
            cur,
            (
                name("flipped"),
                Val::F(Arr::new(vec![cout, cin_g, kh, kw], wc)),
            ),
        ];
        if let Some(b) = bias {
            if b.data.len() != cout {
                return Err(c.bad(format!(
                    "bias of {} values for {cout} channels",
                    b.data.len()
                )));
            }
            ins.push((name("bias"), Val::F(b)));
        }
        let conv = Op::Conv(ConvAttrs {
            strides: [1, 1],
            pads: [0; 4],
            dilations: geo.dilations,
            groups: g,
            activation: None,
            residual: false,
        });
        let out = self.out_name(c, 0);
        self.emit(c, conv, &ins, vec![out])
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

#[cfg(test)]
mod conv_transpose_tests {
    use crate::onnx::proto::{attribute_proto::AttributeType, AttributeProto};
    use crate::ops::testing::{floats, node, run, with_int, with_ints};

    /// Transformers' DPT (and UNet decoders) upsample with ConvTranspose2d(k, stride=k):
    /// refused as "unsupported op ConvTranspose". Checked against the definition, `y[n, co,
    /// h·kh + i, w·kw + j] = b[co] + Σ_ci x[n, ci, h, w] · W[ci, co, i, j]`, on a 2×3 kernel.
    #[test]
    fn a_conv_transpose_whose_stride_is_its_kernel_matches_its_definition() {
        let (cin, cout, kh, kw, h, w) = (2, 3, 2, 3, 2, 2);
        let x: Vec<f32> = (0..cin * h * w).map(|v| v as f32 * 0.5 - 1.0).collect();
        let wt: Vec<f32> = (0..cin * cout * kh * kw)
            .map(|v| ((v * 7) % 11) as f32 - 5.0)
            .collect();
        let b = [0.25f32, -1.0, 2.0];
        let mut n = node("ConvTranspose", &["x", "w", "b"], "y");
        n = with_ints(n, "strides", &[kh as i64, kw as i64]);
        n = with_ints(n, "kernel_shape", &[kh as i64, kw as i64]);
        let inits = vec![
            floats("w", &[cin as i64, cout as i64, kh as i64, kw as i64], &wt),
            floats("b", &[cout as i64], &b),
        ];
        let y = run(vec![n], inits, &[1, cin, h, w], &x).unwrap();
        assert_eq!(y.shape, vec![1, cout, h * kh, w * kw]);
        for co in 0..cout {
            for yy in 0..h * kh {
                for xx in 0..w * kw {
                    let (hh, i, ww, j) = (yy / kh, yy % kh, xx / kw, xx % kw);
                    let mut want = b[co];
                    for ci in 0..cin {
                        want +=
                            x[(ci * h + hh) * w + ww] * wt[((ci * cout + co) * kh + i) * kw + j];
                    }
                    let got = y.data[(co * h * kh + yy) * w * kw + xx];
                    assert!(
                        (got - want).abs() < 1e-4,
                        "({co}, {yy}, {xx}): {got} vs {want}"
                    );
                }
            }
        }
    }

    /// `y[n, g·Cog + o, yy, xx] = b + Σ x[n, g·Cig + i, h, w] · W[g·Cig + i, o, ky, kx]` over
    /// `yy = h·s + ky·d - pad_top` (and the same across): ONNX's ConvTranspose, summed
    /// directly, for `x [1, cin, h, w]`.
    #[allow(clippy::too_many_arguments)]
    fn definition(
        x: &[f32],
        wt: &[f32],
        b: &[f32],
        [cin, cout_g, kh, kw]: [usize; 4],
        [h, w]: [usize; 2],
        s: [usize; 2],
        d: [usize; 2],
        g: usize,
        pads: [usize; 4],
        op: [usize; 2],
    ) -> (Vec<usize>, Vec<f32>) {
        let oh = (h - 1) * s[0] + (kh - 1) * d[0] + 1 + op[0] - pads[0] - pads[2];
        let ow = (w - 1) * s[1] + (kw - 1) * d[1] + 1 + op[1] - pads[1] - pads[3];
        let (cin_g, cout) = (cin / g, cout_g * g);
        let mut y = vec![0.0f32; cout * oh * ow];
        for co in 0..cout {
            y[co * oh * ow..(co + 1) * oh * ow].fill(b[co]);
        }
        for gi in 0..g {
            for i in 0..cin_g {
                let ci = gi * cin_g + i;
                for o in 0..cout_g {
                    let co = gi * cout_g + o;
                    for hh in 0..h {
                        for ww in 0..w {
                            for ky in 0..kh {
                                for kx in 0..kw {
                                    let yy = (hh * s[0] + ky * d[0]) as i64 - pads[0] as i64;
                                    let xx = (ww * s[1] + kx * d[1]) as i64 - pads[1] as i64;
                                    if yy < 0 || xx < 0 || yy >= oh as i64 || xx >= ow as i64 {
                                        continue;
                                    }
                                    y[(co * oh + yy as usize) * ow + xx as usize] += x
                                        [(ci * h + hh) * w + ww]
                                        * wt[((ci * cout_g + o) * kh + ky) * kw + kx];
                                }
                            }
                        }
                    }
                }
            }
        }
        (vec![1, cout, oh, ow], y)
    }

    /// UNet and GAN decoders' ConvTranspose2d(k = 4, stride 2, pad 1), segmentation heads'
    /// (k = 3, stride 2, pad 1, output_padding 1), grouped and dilated ones: refused before
    /// ("only a ConvTranspose whose strides equal its kernel"); imported as zeros inserted,
    /// a border and a stride-1 Conv of the flipped weight, checked against the definition.
    #[test]
    fn an_overlapping_conv_transpose_matches_its_definition() {
        // (cin, cout per group, kh, kw, h, w, strides, dilations, group, pads, output_padding)
        type Case = (
            [usize; 4],
            [usize; 2],
            [usize; 2],
            [usize; 2],
            usize,
            [usize; 4],
            [usize; 2],
        );
        let cases: [Case; 5] = [
            (
                [2, 3, 4, 4],
                [3, 4],
                [2, 2],
                [1, 1],
                1,
                [1, 1, 1, 1],
                [0, 0],
            ),
            (
                [2, 2, 3, 3],
                [3, 3],
                [2, 2],
                [1, 1],
                1,
                [1, 1, 1, 1],
                [1, 1],
            ),
            (
                [4, 1, 3, 2],
                [2, 3],
                [1, 2],
                [2, 1],
                2,
                [0, 1, 2, 0],
                [0, 1],
            ),
            (
                [2, 3, 2, 3],
                [2, 2],
                [1, 1],
                [1, 1],
                1,
                [0, 0, 0, 0],
                [0, 0],
            ),
            (
                [3, 2, 5, 1],
                [4, 2],
                [3, 1],
                [1, 1],
                1,
                [3, 0, 1, 0],
                [2, 0],
            ),
        ];
        for ([cin, cout_g, kh, kw], [h, w], s, d, g, pads, op) in cases {
            let x: Vec<f32> = (0..cin * h * w)
                .map(|v| (v % 7) as f32 * 0.5 - 1.0)
                .collect();
            let wt: Vec<f32> = (0..cin * cout_g * kh * kw)
                .map(|v| ((v * 7) % 11) as f32 * 0.25 - 1.0)
                .collect();
            let b: Vec<f32> = (0..cout_g * g).map(|v| v as f32 * 0.5 - 0.25).collect();
            let mut n = node("ConvTranspose", &["x", "w", "b"], "y");
            n = with_ints(n, "strides", &s.map(|v| v as i64));
            n = with_ints(n, "dilations", &d.map(|v| v as i64));
            n = with_ints(n, "pads", &pads.map(|v| v as i64));
            n = with_ints(n, "output_padding", &op.map(|v| v as i64));
            n = with_int(n, "group", g as i64);
            let inits = vec![
                floats("w", &[cin as i64, cout_g as i64, kh as i64, kw as i64], &wt),
                floats("b", &[(cout_g * g) as i64], &b),
            ];
            let y = run(vec![n], inits, &[1, cin, h, w], &x).unwrap();
            let (shape, want) = definition(
                &x,
                &wt,
                &b,
                [cin, cout_g, kh, kw],
                [h, w],
                s,
                d,
                g,
                pads,
                op,
            );
            assert_eq!(y.shape, shape, "strides {s:?} pads {pads:?}");
            for (k, (got, want)) in y.data.iter().zip(&want).enumerate() {
                assert!(
                    (got - want).abs() < 1e-4,
                    "strides {s:?} dilations {d:?} group {g} pads {pads:?} op {op:?}: [{k}] {got} vs {want}"
                );
            }
        }
        // An auto_pad the import does not compute is refused by name.
        let mut n = node("ConvTranspose", &["x", "w"], "y");
        n.attribute.push(AttributeProto {
            name: Some("auto_pad".into()),
            s: Some(b"SAME_UPPER".to_vec()),
            r#type: Some(AttributeType::String as i32),
            ..Default::default()
        });
        let wt = vec![0.5f32; 2 * 3 * 2 * 2];
        let e = run(
            vec![n],
            vec![floats("w", &[2, 3, 2, 2], &wt)],
            &[1, 2, 2, 2],
            &[0.0; 8],
        )
        .unwrap_err();
        assert!(e.contains("auto_pad") && e.contains("SAME_UPPER"), "{e}");
    }
}
