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
        let refuse = |what: String| {
            Err(c.bad(format!(
                "{what}: only a ConvTranspose whose strides equal its kernel (no overlap), \
                 without pads, output_padding, dilations or groups, is supported"
            )))
        };
        if let Some(k) = c.ints("kernel_shape")? {
            if k != [kh as i64, kw as i64] {
                return Err(c.bad(format!("kernel_shape {k:?} differs from the weight's")));
            }
        }
        let strides = Self::two(c, "strides", c.ints("strides")?, 1)?;
        let dilations = Self::two(c, "dilations", c.ints("dilations")?, 1)?;
        let groups = c.int("group", 1)?;
        let pads = c.ints("pads")?.unwrap_or_default();
        let output_padding = c.ints("output_padding")?.unwrap_or_default();
        let auto_pad = c.string("auto_pad", "NOTSET")?;
        let output_shape = c.ints("output_shape")?;
        if strides != [kh, kw] {
            return refuse(format!("strides {strides:?} with a kernel of {kh}×{kw}"));
        }
        if dilations != [1, 1] || groups != 1 {
            return refuse(format!("dilations {dilations:?}, group {groups}"));
        }
        if pads.iter().any(|&p| p != 0) || output_padding.iter().any(|&p| p != 0) {
            return refuse(format!("pads {pads:?}, output_padding {output_padding:?}"));
        }
        if !matches!(auto_pad.as_str(), "NOTSET" | "VALID") {
            return refuse(format!("auto_pad {auto_pad:?}"));
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
        if let Some(o) = output_shape {
            let o = &o[o.len().saturating_sub(2)..];
            if o != [(h * kh) as i64, (wd * kw) as i64] {
                return refuse(format!("output_shape {o:?}"));
            }
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
    use crate::onnx::proto::{attribute_proto::AttributeType, AttributeProto, NodeProto};
    use crate::ops::testing::{floats, node, run};

    fn ints_attr(mut n: NodeProto, name: &str, v: &[i64]) -> NodeProto {
        n.attribute.push(AttributeProto {
            name: Some(name.into()),
            ints: v.to_vec(),
            r#type: Some(AttributeType::Ints as i32),
            ..Default::default()
        });
        n
    }

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
        n = ints_attr(n, "strides", &[kh as i64, kw as i64]);
        n = ints_attr(n, "kernel_shape", &[kh as i64, kw as i64]);
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
        // Overlapping windows are refused by name, saying what is supported.
        let mut n = node("ConvTranspose", &["x", "w"], "y");
        n = ints_attr(n, "strides", &[1, 1]);
        let e = run(
            vec![n],
            vec![floats("w", &[2, 3, 2, 3], &wt)],
            &[1, 2, 2, 2],
            &x,
        )
        .unwrap_err();
        assert!(
            e.contains("ConvTranspose") && e.contains("strides equal its kernel"),
            "{e}"
        );
    }
}
