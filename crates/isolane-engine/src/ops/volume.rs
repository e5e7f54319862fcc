//! 3-D convolution and pooling (video models: torchvision's r3d_18, mc3_18, r2plus1d_18) as
//! 2-D ops the backends already have, exactly.
//!
//! Conv over `[N, C, D, H, W]`: the depth is zero-padded, and for each output depth the `kd`
//! input depth slices its window reads are gathered next to each other and stacked into the
//! channels, so that one 2-D convolution over `[N·D_out, kd·C, H, W]` with the weight
//! rearranged to `[O, kd·C/g, kh, kw]` computes the 3-D one (the same products and sums,
//! in another order). Pooling is separable: a 2-D pool over each depth slice, then the
//! maximum (or the sum, divided by the window's count along the depth) over the depth window.
//! Every value stays rank 5 or less, within each backend's indexing.

use crate::ir::{self, Binary, Dim, Op, ReduceKind};
use crate::onnx::fold::{self, Arr};
use crate::onnx::import::{static_shape, Ctx, Importer, Val};
use crate::onnx::Result as OnnxResult;

/// A 3-D window's attributes, read from an ONNX node (`pads` in ONNX order: the three
/// begins, then the three ends).
struct Window3 {
    kernel: [usize; 3],
    strides: [usize; 3],
    dilations: [usize; 3],
    pads: [usize; 6],
}

fn three(c: &Ctx, name: &str, v: Option<Vec<i64>>, default: usize) -> OnnxResult<[usize; 3]> {
    match v {
        None => Ok([default; 3]),
        Some(v) if v.len() == 3 && v.iter().all(|&x| (1..=1 << 20).contains(&x)) => {
            Ok([v[0] as usize, v[1] as usize, v[2] as usize])
        }
        Some(v) => Err(c.bad(format!("{name} {v:?}: expected 3 positive values (3-D)"))),
    }
}

impl Window3 {
    fn read(c: &Ctx, kernel: [usize; 3], input: [usize; 3]) -> OnnxResult<Window3> {
        let strides = three(c, "strides", c.ints("strides")?, 1)?;
        let dilations = three(c, "dilations", c.ints("dilations")?, 1)?;
        let auto = c.string("auto_pad", "NOTSET")?;
        let pads = match auto.as_str() {
            "NOTSET" | "" => {
                let p = c.ints("pads")?.unwrap_or_else(|| vec![0; 6]);
                if p.len() != 6 || p.iter().any(|&v| !(0..=1 << 20).contains(&v)) {
                    return Err(c.bad(format!("pads {p:?}: expected 6 non-negative values (3-D)")));
                }
                std::array::from_fn(|i| p[i] as usize)
            }
            "VALID" => [0; 6],
            "SAME_UPPER" | "SAME_LOWER" => {
                let mut out = [0usize; 6];
                for i in 0..3 {
                    let o = input[i].div_ceil(strides[i]);
                    let eff = (kernel[i] - 1) * dilations[i] + 1;
                    let total = ((o - 1) * strides[i] + eff).saturating_sub(input[i]);
                    let (small, big) = (total / 2, total - total / 2);
                    (out[i], out[i + 3]) = if auto == "SAME_UPPER" {
                        (small, big)
                    } else {
                        (big, small)
                    };
                }
                out
            }
            other => return Err(c.unsupported_attr("auto_pad", format!("value {other:?}"))),
        };
        Ok(Window3 {
            kernel,
            strides,
            dilations,
            pads,
        })
    }

    /// The output depth, and the padded input depth its windows reach (ceil mode may reach
    /// past the explicit pads).
    fn depth(&self, d: usize, ceil: bool) -> OnnxResult<(usize, usize), String> {
        let padded = d + self.pads[0] + self.pads[3];
        let eff = (self.kernel[0] - 1) * self.dilations[0] + 1;
        if padded < eff {
            return Err(format!(
                "the window ({eff} deep with dilation) is deeper than the padded input ({padded})"
            ));
        }
        let span = padded - eff;
        let s = self.strides[0];
        let mut out = if ceil { span.div_ceil(s) } else { span / s } + 1;
        // ONNX and PyTorch: the last window must start inside the input or its left padding.
        if ceil && (out - 1) * s >= d + self.pads[0] {
            out -= 1;
        }
        let reach = (out - 1) * s + eff;
        Ok((out, reach.max(padded)))
    }

    /// The gathered depth indices: for each output depth, its window's `kd` positions. Their
    /// count is bounded as a folded constant's (a corrupt file's depth of 2^38 must be refused,
    /// not allocated).
    fn depth_indices(&self, out: usize) -> OnnxResult<Vec<i64>, String> {
        let (s, dl, k) = (self.strides[0], self.dilations[0], self.kernel[0]);
        fold::numel_of::<i64>(&[out, k]).map_err(|e| format!("the depth windows: {e}"))?;
        Ok((0..out)
            .flat_map(|o| (0..k).map(move |z| (o * s + z * dl) as i64))
            .collect())
    }
}

impl Importer<'_> {
    /// A runtime `[N, C, D, H, W]` input as the 4-D values the decomposition works on.
    fn volume_input(&self, c: &Ctx) -> OnnxResult<(Val, [usize; 5])> {
        let x = self.req(c, 0)?;
        let shape = match &x {
            Val::Dyn(d) if d.shapes[0].len() == 5 => d.shapes[0].clone(),
            v => {
                return Err(c.bad(format!(
                    "the input is {} of rank {}; 3-D windows need a runtime [N, C, D, H, W] tensor",
                    v.kind(),
                    v.rank()
                )))
            }
        };
        if shape[1..].contains(&0) {
            return Err(c.bad(format!("empty input {shape:?}")));
        }
        Ok((x, std::array::from_fn(|i| shape[i])))
    }

    /// `[N, C, D, H·W]` → `[N, D, C, H·W]`, depth padded by `before`/`after` with `fill`.
    fn depth_major(
        &mut self,
        c: &Ctx,
        x: (String, Val),
        [_, ch, d, h, w]: [usize; 5],
        [before, after]: [usize; 2],
        fill: f32,
    ) -> OnnxResult<(String, Val)> {
        let flat = self.emit_tmp(
            c,
            Op::Reshape {
                shape: vec![Dim::Copy, Dim::Fixed(ch), Dim::Fixed(d), Dim::Fixed(h * w)],
            },
            &[x],
            "flat",
        )?;
        let t = self.emit_tmp(
            c,
            Op::Transpose {
                perm: vec![0, 2, 1, 3],
            },
            &[(format!("{}:flat", c.r.node), flat)],
            "depth_major",
        )?;
        let mut cur = (format!("{}:depth_major", c.r.node), t);
        if before + after > 0 {
            let p = [before as i64, after as i64];
            let v = self.pad_axis(c, cur, 1, p, "constant", fill)?;
            cur = (format!("{}:depth_padded", c.r.node), v);
        }
        Ok(cur)
    }

    /// `[N, D_out, C, H'·W']` back to the node's output `[N, C, D_out, H', W']`.
    fn channels_major(
        &mut self,
        c: &Ctx,
        x: (String, Val),
        [ch, d, h, w]: [usize; 4],
    ) -> OnnxResult<Vec<Val>> {
        let t = self.emit_tmp(
            c,
            Op::Transpose {
                perm: vec![0, 2, 1, 3],
            },
            &[x],
            "channels_major",
        )?;
        let out = self.out_name(c, 0);
        let shape = [ch, d, h, w].map(Dim::Fixed);
        let mut dims = vec![Dim::Copy];
        dims.extend(shape);
        self.emit(
            c,
            Op::Reshape { shape: dims },
            &[(format!("{}:channels_major", c.r.node), t)],
            vec![out],
        )
    }

    pub(crate) fn conv3d(&mut self, c: &Ctx) -> OnnxResult<Vec<Val>> {
        let (x, xs) = self.volume_input(c)?;
        let Val::F(wt) = self.req(c, 1)? else {
            return Err(c.bad("a 3-D convolution's weight must be known at import"));
        };
        if wt.shape.len() != 5 || wt.shape.contains(&0) {
            return Err(c.bad(format!(
                "weight shape {:?}: expected [O, C/group, kd, kh, kw]",
                wt.shape
            )));
        }
        let (o, cg) = (wt.shape[0], wt.shape[1]);
        let kernel = [wt.shape[2], wt.shape[3], wt.shape[4]];
        if let Some(k) = c.ints("kernel_shape")? {
            if k.iter().map(|&v| v as usize).ne(kernel) {
                return Err(c.bad(format!(
                    "kernel_shape {k:?} differs from the weight's {kernel:?}"
                )));
            }
        }
        let g = c.int("group", 1)?;
        let ch = xs[1];
        if g < 1 || ch % g as usize != 0 || ch / g as usize != cg || o % g as usize != 0 {
            return Err(c.bad(format!(
                "group {g} does not fit {ch} input channels, the weight {:?}",
                wt.shape
            )));
        }
        let g = g as usize;
        let win = Window3::read(c, kernel, [xs[2], xs[3], xs[4]])?;
        let (d_out, reach) = win.depth(xs[2], false).map_err(|e| c.bad(e))?;
        let extra = reach - (xs[2] + win.pads[0] + win.pads[3]);
        let kd = kernel[0];
        let (h, w) = (xs[3], xs[4]);
        let x = self.depth_major(
            c,
            (c.n.input[0].clone(), x),
            xs,
            [win.pads[0], win.pads[3] + extra],
            0.0,
        )?;
        let idx = win.depth_indices(d_out).map_err(|e| c.bad(e))?;
        let gathered = self.emit_tmp(
            c,
            Op::Gather {
                axis: 1,
                indices_shape: vec![idx.len()],
                indices: idx,
            },
            &[x],
            "windows",
        )?;
        let mut cur = (format!("{}:windows", c.r.node), gathered);
        if g > 1 {
            // Each group's channels must be contiguous: [.., kd, g, C/g·HW] → [.., g, kd, ..].
            let split = self.emit_tmp(
                c,
                Op::Reshape {
                    shape: vec![
                        Dim::Infer,
                        Dim::Fixed(kd),
                        Dim::Fixed(g),
                        Dim::Fixed(cg * h * w),
                    ],
                },
                &[cur],
                "by_group",
            )?;
            let t = self.emit_tmp(
                c,
                Op::Transpose {
                    perm: vec![0, 2, 1, 3],
                },
                &[(format!("{}:by_group", c.r.node), split)],
                "group_major",
            )?;
            cur = (format!("{}:group_major", c.r.node), t);
        }
        let stacked = self.emit_tmp(
            c,
            Op::Reshape {
                shape: vec![
                    Dim::Infer,
                    Dim::Fixed(kd * ch),
                    Dim::Fixed(h),
                    Dim::Fixed(w),
                ],
            },
            &[cur],
            "stacked",
        )?;
        // [O, C/g, kd, kh, kw] → [O, kd, C/g, kh, kw] → [O, kd·C/g, kh, kw].
        let w2 = wt
            .transpose(&[0, 2, 1, 3, 4])
            .and_then(|a| a.reshape(vec![o, kd * cg, kernel[1], kernel[2]]))
            .map_err(|e| c.bad(e))?;
        let mut ins = vec![
            (format!("{}:stacked", c.r.node), stacked),
            (format!("{}:weight2d", c.r.node), Val::F(w2)),
        ];
        if let Some(b) = self.get(c, 2)? {
            ins.push((c.n.input[2].clone(), b));
        }
        let conv = self.emit_tmp(
            c,
            Op::Conv(ir::ConvAttrs {
                strides: [win.strides[1], win.strides[2]],
                pads: [win.pads[1], win.pads[2], win.pads[4], win.pads[5]],
                dilations: [win.dilations[1], win.dilations[2]],
                groups: g,
                activation: None,
                residual: false,
            }),
            &ins,
            "conv2d",
        )?;
        let s = static_shape(&conv);
        let (ho, wo) = (s[2], s[3]);
        let back = self.emit_tmp(
            c,
            Op::Reshape {
                shape: vec![
                    Dim::Infer,
                    Dim::Fixed(d_out),
                    Dim::Fixed(o),
                    Dim::Fixed(ho * wo),
                ],
            },
            &[(format!("{}:conv2d", c.r.node), conv)],
            "per_depth",
        )?;
        self.channels_major(
            c,
            (format!("{}:per_depth", c.r.node), back),
            [o, d_out, ho, wo],
        )
    }

    pub(crate) fn pool3d(&mut self, c: &Ctx, max: bool) -> OnnxResult<Vec<Val>> {
        let (x, xs) = self.volume_input(c)?;
        let kernel = three(c, "kernel_shape", c.ints("kernel_shape")?, 0)
            .map_err(|_| c.bad("kernel_shape must hold 3 positive values"))?;
        if kernel[0] == 0 {
            return Err(c.bad("kernel_shape is required"));
        }
        let win = Window3::read(c, kernel, [xs[2], xs[3], xs[4]])?;
        if max {
            c.ignore("storage_order"); // only changes the (unsupported) indices output
        } else if win.dilations != [1, 1, 1] {
            return Err(c.unsupported_attr(
                "dilations",
                format!(
                    "value {:?} (average pooling supports only [1, 1, 1])",
                    win.dilations
                ),
            ));
        }
        let ceil_mode = c.int("ceil_mode", 0)? != 0;
        let include_pad = !max && c.int("count_include_pad", 0)? != 0;
        let (d_out, reach) = win.depth(xs[2], ceil_mode).map_err(|e| c.bad(e))?;
        let [n_, ch, d, h, w] = xs;
        let _ = n_;
        // 2-D pooling of every depth slice: [N, D, C, H·W] → [N·D, C, H, W].
        let x = self.depth_major(c, (c.n.input[0].clone(), x), xs, [0, 0], 0.0)?;
        let slices = self.emit_tmp(
            c,
            Op::Reshape {
                shape: vec![Dim::Infer, Dim::Fixed(ch), Dim::Fixed(h), Dim::Fixed(w)],
            },
            &[x],
            "slices",
        )?;
        let attrs = ir::PoolAttrs {
            kernel: [kernel[1], kernel[2]],
            strides: [win.strides[1], win.strides[2]],
            pads: [win.pads[1], win.pads[2], win.pads[4], win.pads[5]],
            dilations: [win.dilations[1], win.dilations[2]],
            ceil_mode,
            count_include_pad: include_pad,
        };
        let op = if max {
            Op::MaxPool(attrs)
        } else {
            Op::AveragePool(attrs)
        };
        let pooled = self.emit_tmp(c, op, &[(format!("{}:slices", c.r.node), slices)], "pooled")?;
        let s = static_shape(&pooled);
        let (ho, wo) = (s[2], s[3]);
        let per_depth = self.emit_tmp(
            c,
            Op::Reshape {
                shape: vec![Dim::Infer, Dim::Fixed(d), Dim::Fixed(ch * ho * wo)],
            },
            &[(format!("{}:pooled", c.r.node), pooled)],
            "per_depth",
        )?;
        // Padding along the depth never wins a maximum and adds nothing to a sum.
        let fill = if max { f32::NEG_INFINITY } else { 0.0 };
        let extra = reach - (d + win.pads[0] + win.pads[3]);
        let mut cur = (format!("{}:per_depth", c.r.node), per_depth);
        let (before, after) = (win.pads[0], win.pads[3] + extra);
        if before + after > 0 {
            let v = self.pad_axis(c, cur, 1, [before as i64, after as i64], "constant", fill)?;
            cur = (format!("{}:depth_padded", c.r.node), v);
        }
        let idx = win.depth_indices(d_out).map_err(|e| c.bad(e))?;
        let gathered = self.emit_tmp(
            c,
            Op::Gather {
                axis: 1,
                indices_shape: vec![idx.len()],
                indices: idx,
            },
            &[cur],
            "windows",
        )?;
        let windows = self.emit_tmp(
            c,
            Op::Reshape {
                shape: vec![
                    Dim::Infer,
                    Dim::Fixed(d_out),
                    Dim::Fixed(kernel[0]),
                    Dim::Fixed(ch * ho * wo),
                ],
            },
            &[(format!("{}:windows", c.r.node), gathered)],
            "by_window",
        )?;
        let reduced = self.emit_tmp(
            c,
            Op::Reduce {
                kind: if max {
                    ReduceKind::Max
                } else {
                    ReduceKind::Sum
                },
                axes: vec![2],
                keepdims: false,
            },
            &[(format!("{}:by_window", c.r.node), windows)],
            "reduced",
        )?;
        let mut cur = (format!("{}:reduced", c.r.node), reduced);
        if !max {
            // The window's count along the depth: the explicit pads count when
            // count_include_pad is set, the ceil mode's overhang never does.
            let (lo, hi) = if include_pad {
                (0, d + win.pads[0] + win.pads[3])
            } else {
                (win.pads[0], win.pads[0] + d)
            };
            let inv: Vec<f32> = (0..d_out)
                .map(|o| {
                    let start = o * win.strides[0];
                    let n = (start..start + kernel[0])
                        .filter(|p| (lo..hi).contains(p))
                        .count();
                    1.0 / n.max(1) as f32
                })
                .collect();
            let scale = (
                format!("{}:depth_count", c.r.node),
                Val::F(Arr::new(vec![d_out, 1], inv)),
            );
            let v = self.binary(c, Binary::Mul, cur, scale, 1)?;
            let v = v.into_iter().next().ok_or_else(|| c.bad("no output"))?;
            cur = (format!("{}:averaged", c.r.node), v);
        }
        let split = self.emit_tmp(
            c,
            Op::Reshape {
                shape: vec![
                    Dim::Infer,
                    Dim::Fixed(d_out),
                    Dim::Fixed(ch),
                    Dim::Fixed(ho * wo),
                ],
            },
            &[cur],
            "split",
        )?;
        self.channels_major(
            c,
            (format!("{}:split", c.r.node), split),
            [ch, d_out, ho, wo],
        )
    }
}

impl Importer<'_> {
    /// The rank of the node's first input (0 when it is missing: the handler then says so).
    pub(crate) fn input_rank(&self, c: &Ctx) -> usize {
        self.get(c, 0).ok().flatten().map_or(0, |v| v.rank())
    }

    /// GlobalAveragePool of a rank other than 4 (3-D: video models' `AdaptiveAvgPool3d(1)`):
    /// the mean over every dimension after the channels.
    pub(crate) fn global_average_nd(&mut self, c: &Ctx) -> OnnxResult<Vec<Val>> {
        let r = self.input_rank(c);
        if r < 3 {
            return Err(c.bad(format!("input must be [N, C, spatial...], has rank {r}")));
        }
        let op = Op::Reduce {
            kind: ReduceKind::Mean,
            axes: (2..r as i64).collect(),
            keepdims: true,
        };
        self.emit1(c, op, 1)
    }
}

#[cfg(test)]
mod tests {
    use super::Window3;

    fn win(k: usize, s: usize, dil: usize, pads: [usize; 2]) -> Window3 {
        Window3 {
            kernel: [k, 1, 1],
            strides: [s, 1, 1],
            dilations: [dil, 1, 1],
            pads: [pads[0], 0, 0, pads[1], 0, 0],
        }
    }

    /// Output depths as ONNX/PyTorch define them, and how far the windows reach.
    #[test]
    fn depth_follows_the_onnx_output_size() {
        // floor((7 + 2 - 3) / 2) + 1 = 4, windows within the 9 padded.
        assert_eq!(win(3, 2, 1, [1, 1]).depth(7, false), Ok((4, 9)));
        // ceil((8 - 3) / 2) + 1 = 4 (dilation 2: 3 deep): the last window reaches 9 > 8.
        assert_eq!(win(2, 2, 2, [0, 0]).depth(8, true), Ok((4, 9)));
        // ceil mode's last window would start in the right padding: dropped (PyTorch's rule).
        assert_eq!(win(2, 2, 1, [1, 1]).depth(3, true), Ok((2, 5)));
        assert!(win(5, 1, 1, [0, 0]).depth(3, false).is_err());
    }

    /// A depth from a corrupt file is refused before its index list is built.
    #[test]
    fn depth_windows_are_bounded_before_they_are_listed() {
        let w = win(3, 1, 1, [1, 1]);
        assert_eq!(w.depth_indices(2), Ok(vec![0, 1, 2, 1, 2, 3]));
        let e = w.depth_indices(1 << 38).unwrap_err();
        assert!(e.contains("too large"), "{e}");
    }
}
