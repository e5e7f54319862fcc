//! The CUDA lowering of the `conv` family (its engine home: isolane-engine's `ops/conv.rs`). Conv:
//! cuDNN or im2col + cuBLASLt (chosen when the model is built), its bias, activation and residual
//! fused.

use crate::plan::*;

impl Planner<'_> {
    /// Lowers `Op::Conv(a)`.
    pub(in crate::plan) fn lower_conv(&mut self, c: &NodeCtx, a: &ConvAttrs) -> Result<Lowered> {
        let p = self;
        let (n, name, in_shapes, outs, out_shape, x0, opts, es) = (
            c.n,
            c.name,
            &c.in_shapes,
            &c.outs,
            &c.out_shape,
            c.x0,
            p.opts,
            p.es,
        );
        let mut xs = four(&in_shapes[0], name)?;
        let mut ws = four(&in_shapes[1], name)?;
        let dw = a.groups > 1 && a.groups == xs[1] && ws[1] == 1;
        let cl = opts.channels_last;
        // An RGB input stored as 4 channels (`Planner::stem_channel_pad`): read as the NHWC
        // image of 4 channels it is, with the filter padded alike.
        let padded = p.cpad[x0].filter(|_| cl && a.groups == 1);
        let x = if let Some(cp) = padded {
            xs[1] = cp;
            ws[1] = cp;
            p.raw(x0, name)?
        } else if cl {
            p.channels_last(x0, name)?
        } else {
            p.plain(x0, name)?
        };
        // cuDNN (and our kernels) pad symmetrically: the excess of one side is padded
        // explicitly first, the convolution gets the symmetric rest.
        let (x, xs, pads) = p.pad_asymmetric(name, x, xs, a.pads, cl)?;
        let w = match padded {
            Some(cp) => p.padded_filter(n.inputs[1], cp, name)?,
            None => p.raw(n.inputs[1], name)?,
        };
        let bias = match n.inputs.get(2) {
            Some(&b) => Some(p.raw(b, name)?),
            None => None,
        };
        let residual = match (a.residual, n.inputs.get(3)) {
            (true, Some(&r)) => Some(if cl {
                p.channels_last(r, name)?
            } else {
                p.plain(r, name)?
            }),
            _ => None,
        };
        if cl && dw {
            match w {
                Loc::Const { id, .. } => {
                    if !p.filter_dw_hwc.contains(&id) {
                        p.filter_dw_hwc.push(id);
                    }
                }
                _ => {
                    return Err(unsupported(
                        name,
                        "channels-last depthwise convolution with a computed filter",
                    ))
                }
            }
        }
        if cl && !dw && ws[2] * ws[3] * ws[1] > 1 {
            if let Loc::Const { id, .. } = w {
                if !p.filter_nhwc.contains(&id) {
                    p.filter_nhwc.push(id);
                }
            } else {
                return Err(unsupported(
                    name,
                    "channels-last convolution with a computed filter",
                ));
            }
        }
        let y = p.output(outs[0], cl);
        let ys = four(out_shape, name)?;
        let direct = ws[2] == 1 && ws[3] == 1 && a.strides == [1, 1] && pads == [0; 2];
        // The im2col matrix lives only during this step.
        let col = if cl && a.groups == 1 && !direct {
            let rows = ys[0] * ys[2] * ys[3];
            let s = p.new_storage(rows * ws[1] * ws[2] * ws[3] * es);
            Some(Loc::Storage { id: s, offset: 0 })
        } else {
            None
        };
        let c = ConvStep {
            x,
            w,
            bias,
            residual,
            y,
            x_shape: xs,
            w_shape: ws,
            y_shape: four(out_shape, name)?,
            pads,
            strides: a.strides,
            dilations: a.dilations,
            groups: a.groups,
            act: a.activation,
            nhwc: cl,
            col,
        };
        p.push(
            name,
            if dw {
                StepKind::DwConv(c)
            } else {
                StepKind::Conv(c)
            },
        );
        Ok(Lowered::Steps)
    }

    /// Constant filter `w` (`[M, C, kh, kw]`) with zero input channels added up to `cp`: a new
    /// constant (the original is not uploaded unless something else reads it).
    fn padded_filter(&mut self, w: usize, cp: usize, name: &str) -> Result<Loc> {
        let ValueKind::Constant(t) = &self.g.values[w].kind else {
            return Err(unsupported(name, "a padded stem with a computed filter"));
        };
        let [m, c, kh, kw] = four(&t.shape, name)?;
        if c > cp || t.data.len() != m * c * kh * kw {
            return Err(unsupported(
                name,
                format!("a filter of {c} channels padded to {cp}"),
            ));
        }
        let plane = kh * kw;
        let mut data = vec![0f32; m * cp * plane];
        for o in 0..m {
            let src = &t.data[o * c * plane..(o + 1) * c * plane];
            data[o * cp * plane..o * cp * plane + c * plane].copy_from_slice(src);
        }
        Ok(self.new_const(Tensor::new(vec![m, cp, kh, kw], data)?))
    }

    /// `x` (shape `xs`, NHWC when `nhwc`) zero-padded by the asymmetric part of ONNX `pads`
    /// (`[top, left, bottom, right]`) into a temporary, its shape, and the symmetric `[h, w]`
    /// padding left for the convolution. Symmetric padding returns `x` untouched.
    pub(in crate::plan) fn pad_asymmetric(
        &mut self,
        name: &str,
        x: Loc,
        xs: [usize; 4],
        pads: [usize; 4],
        nhwc: bool,
    ) -> Result<(Loc, [usize; 4], [usize; 2])> {
        let sym = [pads[0].min(pads[2]), pads[1].min(pads[3])];
        if pads[0] == pads[2] && pads[1] == pads[3] {
            return Ok((x, xs, sym));
        }
        let [top, left] = [pads[0] - sym[0], pads[1] - sym[1]];
        let ps = [
            xs[0],
            xs[1],
            xs[2] + top + pads[2] - sym[0],
            xs[3] + left + pads[3] - sym[1],
        ];
        let s = self.new_storage(ps.iter().product::<usize>() * self.es);
        let y = Loc::Storage { id: s, offset: 0 };
        let ys = phys_strides(&ps, nhwc);
        // Zeros first: one zero constant broadcast (stride 0) over the whole temporary.
        let zero = self.new_const(Tensor::new(vec![1], vec![0.0])?);
        let fill = format!("{name} (zero padding)");
        self.push_copy(&fill, [zero, y], &ps, [ys.clone(), vec![0; 4]])?;
        let inner = y.with_offset(top * ys[2] + left * ys[3]);
        let copy = format!("{name} (padded input)");
        self.push_copy(&copy, [x, inner], &xs, [ys, phys_strides(&xs, nhwc)])?;
        Ok((y, ps, sym))
    }
}
