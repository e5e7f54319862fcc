//! `Op::Resize`: nearest and bilinear on the two spatial dims of an NCHW tensor, with ONNX's
//! coordinate transforms (the arithmetic is `crate::ir::ResizeAttrs::source`); bicubic on
//! values known at import only, computed there ([`Cubic`]).
//!
//! ONNX: Resize, and Upsample (opsets 7–9) with Resize-10, which compute their source
//! coordinates as `out / scale`.

use crate::error::Result;
use crate::ir::{self, Dim, Op};
use crate::ir::{rank4, shape_err, Node, ResizeAttrs, ResizeMode, ResizeSize};
use crate::kernels::{Kernel, ResizeK};
use crate::onnx::fold::{self, Arr};
use crate::onnx::import::{check_dims_size, fmt_syms, node_axis, Ctx, Importer, Val};
use crate::onnx::proto::{attribute_proto::AttributeType, AttributeProto};
use crate::onnx::Result as OnnxResult;
use crate::ops::ImportFn;

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

/// The ONNX op types imported as resizes.
pub(crate) const ONNX: &[(&str, ImportFn)] =
    &[("Upsample", import_upsample), ("Resize", import_resize)];

/// Upsample exists up to opset 9.
fn import_upsample(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
    if im.m.opset < 10 {
        im.upsample(c)
    } else {
        Err(c.unsupported_op())
    }
}

/// Resize-10 computes its source coordinates as Upsample does.
fn import_resize(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
    if im.m.opset < 11 {
        im.upsample(c)
    } else {
        im.resize(c)
    }
}

impl Importer<'_> {
    pub(crate) fn resize(&mut self, c: &Ctx) -> OnnxResult<Vec<Val>> {
        let mode = c.string("mode", "nearest")?;
        let coord = c.string("coordinate_transformation_mode", "half_pixel")?;
        let nearest = c.string("nearest_mode", "round_prefer_floor")?;
        let cubic_a = c.float("cubic_coeff_a", -0.75)?;
        let exclude_outside = c.int("exclude_outside", 0)?;
        if mode != "cubic" && exclude_outside != 0 {
            return Err(c.unsupported_attr(
                "exclude_outside",
                format!("value {exclude_outside} (only mode cubic uses it)"),
            ));
        }
        c.ignore("extrapolation_value"); // only for tf_crop_and_resize, rejected below
        let opset = self.m.opset;
        let axes = if opset >= 18 {
            c.int_default_only("antialias", 0)?;
            let p = c.string("keep_aspect_ratio_policy", "stretch")?;
            if p != "stretch" {
                return Err(c.unsupported_attr("keep_aspect_ratio_policy", format!("value {p:?}")));
            }
            c.ints("axes")?
        } else {
            None
        };
        let cubic = mode == "cubic";
        let mode = match mode.as_str() {
            "nearest" | "cubic" => ir::ResizeMode::Nearest,
            "linear" => ir::ResizeMode::Linear,
            other => {
                return Err(c.unsupported_attr(
                    "mode",
                    format!("value {other:?} (nearest, linear and cubic are supported)"),
                ))
            }
        };
        let coord = match coord.as_str() {
            "half_pixel" => ir::CoordMode::HalfPixel,
            "pytorch_half_pixel" => ir::CoordMode::PytorchHalfPixel,
            "align_corners" => ir::CoordMode::AlignCorners,
            "asymmetric" => ir::CoordMode::Asymmetric,
            other => {
                return Err(c.unsupported_attr(
                    "coordinate_transformation_mode",
                    format!("value {other:?}"),
                ))
            }
        };
        let nearest = match nearest.as_str() {
            "round_prefer_floor" => ir::NearestMode::RoundPreferFloor,
            "round_prefer_ceil" => ir::NearestMode::RoundPreferCeil,
            "floor" => ir::NearestMode::Floor,
            "ceil" => ir::NearestMode::Ceil,
            other => return Err(c.unsupported_attr("nearest_mode", format!("value {other:?}"))),
        };
        let x = self.req(c, 0)?;
        let xs = self.real_shape(&c.n.input[0], &x).map_err(|e| c.bad(e))?;
        if xs.len() != 4 {
            return Err(c.bad(format!(
                "only 4-D NCHW input is supported (rank {})",
                xs.len()
            )));
        }
        // The axes the scales/sizes inputs refer to.
        let axes: Vec<usize> = match axes {
            None => (0..4).collect(),
            Some(a) => a
                .iter()
                .map(|&v| node_axis(c, v, 4))
                .collect::<OnnxResult<_>>()?,
        };
        let scales = match self.get(c, 2)? {
            None => None,
            Some(Val::F(a)) if a.data.is_empty() => None,
            Some(Val::F(a)) => Some(a.data),
            Some(v) => {
                return Err(c.bad(format!(
                    "scales is {}; it must be known at import",
                    v.kind()
                )))
            }
        };
        let sizes = match self.get(c, 3)? {
            None => None,
            Some(Val::I(a)) if a.data.is_empty() => None,
            Some(Val::I(a)) => Some(a.data),
            Some(v) => {
                return Err(c.bad(format!("sizes is {}; it must be known at import", v.kind())))
            }
        };
        let size = match (scales, sizes) {
            (Some(s), None) => {
                if s.len() != axes.len() {
                    return Err(c.bad(format!("{} scales for {} axes", s.len(), axes.len())));
                }
                let mut full = [1.0f32; 4];
                for (&a, &v) in axes.iter().zip(&s) {
                    full[a] = v;
                }
                if full[0] != 1.0 || full[1] != 1.0 {
                    return Err(c.bad(format!("scales {s:?}: only H and W may be resized")));
                }
                if !(full[2] > 0.0 && full[3] > 0.0 && full[2] < 1e4 && full[3] < 1e4) {
                    return Err(c.bad(format!("scales {s:?} out of range")));
                }
                ir::ResizeSize::Scales([full[2], full[3]])
            }
            (None, Some(s)) => {
                if s.len() != axes.len() {
                    return Err(c.bad(format!("{} sizes for {} axes", s.len(), axes.len())));
                }
                let mut full = xs.clone();
                for (&a, &v) in axes.iter().zip(&s) {
                    full[a] = v;
                }
                if full[0] != xs[0] || full[1] != xs[1] {
                    return Err(c.bad(format!(
                        "sizes {}: only H and W may be resized",
                        fmt_syms(&s)
                    )));
                }
                if !full[2].is_const() || !full[3].is_const() || full[2].c < 1 || full[3].c < 1 {
                    return Err(c.bad(format!(
                        "sizes {}: H and W must be positive and fixed",
                        fmt_syms(&s)
                    )));
                }
                let hw = [full[2].c as usize, full[3].c as usize];
                check_dims_size(&[Dim::Fixed(hw[0]), Dim::Fixed(hw[1])])
                    .map_err(|e| c.bad(format!("sizes {e}")))?;
                ir::ResizeSize::Size(hw)
            }
            _ => return Err(c.bad("exactly one of scales and sizes must be given")),
        };
        let attrs = ir::ResizeAttrs {
            mode,
            coord,
            nearest,
            size,
        };
        if cubic {
            let cubic = Cubic {
                a: cubic_a,
                exclude_outside: exclude_outside != 0,
            };
            return match &x {
                Val::F(a) => Ok(vec![Val::F(cubic.resize(c, a, &attrs)?)]),
                _ => self.cubic_at_run_time(c, x, &cubic, &attrs),
            };
        }
        // A resize of a constant is one too (DETR's dynamo export resizes its all-ones pixel
        // mask, then casts it to bool: a runtime float could not be cast so).
        if let Val::F(a) = &x {
            return Ok(vec![Val::F(resize_known(c, a, &attrs)?)]);
        }
        let out = self.out_name(c, 0);
        let ins = [(c.n.input[0].clone(), x)];
        self.emit(c, Op::Resize(attrs), &ins, vec![out])
    }

    /// A cubic Resize of a runtime tensor (timm's CrossViT resizes its input image so): cubic
    /// resizing is linear in the input and separable, `Y = A_h · X · A_wᵀ` per plane, with
    /// `A` each axis's taps ([`Cubic::taps`]) summed into a matrix. It becomes two products by
    /// constant matrices (Linear ops on every backend) around transposes: X `[N, C, H, W]`
    /// → `[N, C, W, H]` · `A_hᵀ` → `[N, C, W, OH]` → `[N, C, OH, W]` · `A_wᵀ`. The same
    /// arithmetic as the constant path, summed in another order (f32 rounding only).
    fn cubic_at_run_time(
        &mut self,
        c: &Ctx,
        x: Val,
        cubic: &Cubic,
        r: &ir::ResizeAttrs,
    ) -> OnnxResult<Vec<Val>> {
        let Val::Dyn(d) = &x else {
            return Err(c.bad(format!(
                "a cubic Resize of {}: expected a float tensor",
                x.kind()
            )));
        };
        let (xs0, xs1) = (&d.shapes[0], &d.shapes[1]);
        if xs0.len() != 4 || xs0[2..] != xs1[2..] {
            return Err(c.bad(format!(
                "a cubic Resize of {xs0:?}: the spatial size must not depend on the batch"
            )));
        }
        let (h, w) = (xs0[2], xs0[3]);
        let [oh, ow] = cubic.out_size(c, [h, w], r)?;
        let [sh, sw] = r.coord_scales([h, w], [oh, ow]);
        let name = |what: &str| format!("{}:{what}", c.r.node);
        let ah = Val::F(Arr::new(vec![h, oh], cubic.matrix(c, r, h, oh, sh)?));
        let aw = Val::F(Arr::new(vec![w, ow], cubic.matrix(c, r, w, ow, sw)?));
        let cols = Op::Transpose {
            perm: vec![0, 1, 3, 2],
        };
        let t = self.emit_tmp(c, cols.clone(), &[(c.n.input[0].clone(), x)], "cols")?;
        let t = self.emit_tmp(
            c,
            Op::MatMul,
            &[(name("t"), t), (name("rows"), ah)],
            "by_rows",
        )?;
        let t = self.emit_tmp(c, cols, &[(name("by_rows"), t)], "back")?;
        let out = self.out_name(c, 0);
        self.emit(
            c,
            Op::MatMul,
            &[(name("back"), t), (name("columns"), aw)],
            vec![out],
        )
    }

    /// Upsample (opsets 7–9; `scales` an attribute at 7–8, an input at 9) and Resize at
    /// opset 10 (inputs X and scales): the output is `floor(in · scale)` and an output index
    /// `i` reads the input at `i / scale` (the `asymmetric` coordinate mode). Nearest takes
    /// that coordinate's floor when upsampling and its ceiling when downsampling, as
    /// onnxruntime does; linear interpolates. Both become the newer Resize.
    pub(crate) fn upsample(&mut self, c: &Ctx) -> OnnxResult<Vec<Val>> {
        let opset = self.m.opset;
        let resize10 = c.op() == "Resize";
        let mode = c.string("mode", "nearest")?;
        let scales = if !resize10 && opset < 9 {
            c.typed("scales", AttributeType::Floats)?
                .map(|a| a.floats.clone())
                .ok_or_else(|| c.bad("attribute scales is required"))?
        } else {
            match self.req(c, 1)? {
                Val::F(a) => a.data,
                v => {
                    return Err(c.bad(format!(
                        "scales is {}; it must be floats known at import",
                        v.kind()
                    )))
                }
            }
        };
        if !resize10 && scales.iter().any(|&s| s < 1.0) {
            return Err(c.bad(format!(
                "scales {scales:?}: Upsample's scales must be at least 1"
            )));
        }
        // The spatial scales decide the rounding (onnxruntime's rule for these opsets).
        let spatial = scales.get(2..).unwrap_or_default();
        let nearest = if spatial.iter().all(|&s| s >= 1.0) {
            "floor"
        } else if spatial.iter().all(|&s| s <= 1.0) {
            "ceil"
        } else {
            if mode == "nearest" {
                return Err(c.bad(format!(
                    "scales {scales:?}: nearest resizing that upsamples one axis and \
                     downsamples another is not supported before opset 11"
                )));
            }
            "floor"
        };
        let n = scales.len();
        let string_attr = |name: &str, v: &str| AttributeProto {
            name: Some(name.into()),
            r#type: Some(AttributeType::String as i32),
            s: Some(v.as_bytes().to_vec()),
            ..Default::default()
        };
        let add = vec![
            string_attr("mode", &mode),
            string_attr("coordinate_transformation_mode", "asymmetric"),
            string_attr("nearest_mode", nearest),
        ];
        let inputs = vec![(1, None), (2, Some(Val::F(Arr::new(vec![n], scales))))];
        self.as_newer_form(c, inputs, &["scales", "mode"], add, Self::resize)
    }
}

/// ONNX Resize's `mode = "cubic"` (Keys' cubic convolution with coefficient `a`: -0.75 is
/// PyTorch's `bicubic`, -0.5 TensorFlow's), computed at import on a value known there. DINOv2,
/// YOLOS and other ViTs resize their position embeddings to the input's patch grid with
/// `interpolate(mode="bicubic")`, which both PyTorch exporters write as a cubic Resize of a
/// constant. Each output row and column reads the 4 nearest source ones (clamped to the edge);
/// with `exclude_outside` those past the edge get no weight and the rest are scaled to sum 1.
struct Cubic {
    a: f32,
    exclude_outside: bool,
}

impl Cubic {
    /// The 4 taps (source index, weight) of output index `i` of an axis.
    fn taps(
        &self,
        r: &ir::ResizeAttrs,
        i: usize,
        inp: usize,
        out: usize,
        scale: f32,
    ) -> [(usize, f64); 4] {
        let x = match r.coord {
            ir::CoordMode::HalfPixel => (i as f64 + 0.5) / scale as f64 - 0.5,
            ir::CoordMode::PytorchHalfPixel if out > 1 => (i as f64 + 0.5) / scale as f64 - 0.5,
            ir::CoordMode::AlignCorners if out > 1 => {
                i as f64 * (inp as f64 - 1.0) / (out as f64 - 1.0)
            }
            ir::CoordMode::Asymmetric => i as f64 / scale as f64,
            ir::CoordMode::PytorchHalfPixel | ir::CoordMode::AlignCorners => 0.0,
        };
        let base = x.floor();
        let t = x - base;
        let a = self.a as f64;
        // Keys' kernel at distance d: |d| <= 1 and 1 < |d| < 2.
        let near = |d: f64| ((a + 2.0) * d - (a + 3.0)) * d * d + 1.0;
        let far = |d: f64| ((a * d - 5.0 * a) * d + 8.0 * a) * d - 4.0 * a;
        let w = [far(t + 1.0), near(t), near(1.0 - t), far(2.0 - t)];
        let mut taps = [(0usize, 0.0f64); 4];
        let mut sum = 0.0;
        for (k, tap) in taps.iter_mut().enumerate() {
            let j = base as i64 - 1 + k as i64;
            let inside = (0..inp as i64).contains(&j);
            let weight = if self.exclude_outside && !inside {
                0.0
            } else {
                w[k]
            };
            *tap = (j.clamp(0, inp as i64 - 1) as usize, weight);
            sum += weight;
        }
        if self.exclude_outside && sum != 0.0 {
            taps.iter_mut().for_each(|t| t.1 /= sum);
        }
        taps
    }

    /// The output's `[OH, OW]` for an input of `[h, w]`.
    fn out_size(&self, c: &Ctx, [h, w]: [usize; 2], r: &ir::ResizeAttrs) -> OnnxResult<[usize; 2]> {
        let [oh, ow] = match r.size {
            ir::ResizeSize::Size(hw) => hw,
            // ONNX: the output is floor(input · scale).
            ir::ResizeSize::Scales([sh, sw]) => [
                (h as f64 * sh as f64).floor() as usize,
                (w as f64 * sw as f64).floor() as usize,
            ],
        };
        if h == 0 || w == 0 || oh == 0 || ow == 0 {
            return Err(c.bad(format!("cubic Resize of {h}×{w} to {oh}×{ow}")));
        }
        Ok([oh, ow])
    }

    /// The `[inp, out]` matrix `M` of one axis: output `i` is `Σ_j x[j] · M[j, i]` (the taps
    /// of a clamped edge read the same source, so their weights add up). A matrix past the
    /// size a constant may fold to is the model's error, not an allocation.
    fn matrix(
        &self,
        c: &Ctx,
        r: &ir::ResizeAttrs,
        inp: usize,
        out: usize,
        scale: f32,
    ) -> OnnxResult<Vec<f32>> {
        let len = fold::numel_of::<f64>(&[inp, out]).map_err(|e| {
            c.bad(format!(
                "a cubic Resize of {inp} to {out} along an axis: its weights, {e}"
            ))
        })?;
        let mut m = vec![0.0f64; len];
        for i in 0..out {
            for (j, wt) in self.taps(r, i, inp, out, scale) {
                m[j * out + i] += wt;
            }
        }
        Ok(m.into_iter().map(|v| v as f32).collect())
    }

    /// `x` (N, C, H, W) resized as `r` says (its size or scales; only H and W change).
    fn resize(&self, c: &Ctx, x: &Arr<f32>, r: &ir::ResizeAttrs) -> OnnxResult<Arr<f32>> {
        let [n, ch, h, w] = [x.shape[0], x.shape[1], x.shape[2], x.shape[3]];
        let [oh, ow] = self.out_size(c, [h, w], r)?;
        let shape = vec![n, ch, oh, ow];
        fold::numel_of::<f32>(&shape).map_err(|e| c.bad(e))?;
        let [sh, sw] = r.coord_scales([h, w], [oh, ow]);
        let rows: Vec<_> = (0..oh).map(|i| self.taps(r, i, h, oh, sh)).collect();
        let cols: Vec<_> = (0..ow).map(|j| self.taps(r, j, w, ow, sw)).collect();
        let mut out = Vec::with_capacity(n * ch * oh * ow);
        let mut tmp = vec![0.0f64; oh * w];
        for plane in x.data.chunks_exact(h * w) {
            for (i, taps) in rows.iter().enumerate() {
                for col in 0..w {
                    tmp[i * w + col] = taps
                        .iter()
                        .map(|&(y, wt)| wt * plane[y * w + col] as f64)
                        .sum();
                }
            }
            for i in 0..oh {
                for taps in &cols {
                    out.push(
                        taps.iter()
                            .map(|&(xx, wt)| wt * tmp[i * w + xx])
                            .sum::<f64>() as f32,
                    );
                }
            }
        }
        Ok(Arr::new(shape, out))
    }
}

/// A nearest or linear Resize of a constant `x` (N, C, H, W), computed at import with the
/// CPU kernel's arithmetic (`kernels::resize`: the same taps, the same f32 operations).
fn resize_known(c: &Ctx, x: &Arr<f32>, r: &ir::ResizeAttrs) -> OnnxResult<Arr<f32>> {
    let shapes = [x.shape.as_slice()];
    let node = Node {
        name: c.r.node.clone(),
        op: Op::Resize(r.clone()),
        inputs: vec![],
        outputs: vec![],
    };
    let o = infer_resize(&node, &shapes, r).map_err(|e| c.bad(e.to_string()))?;
    fold::numel_of::<f32>(&o).map_err(|e| c.bad(e))?;
    let Kernel::Resize(k) =
        prepare_resize(&shapes, &[o.as_slice()], r).map_err(|e| c.bad(e.to_string()))?
    else {
        return Err(c.bad("internal: a Resize without its kernel"));
    };
    let mut out = vec![0.0; o.iter().product()];
    for (i, p) in x
        .data
        .chunks_exact(k.h * k.w)
        .zip(out.chunks_exact_mut(k.oh * k.ow))
    {
        crate::kernels::resize_plane(&k, i, p);
    }
    Ok(Arr::new(o, out))
}

#[cfg(test)]
mod tests {
    use crate::onnx::proto::{attribute_proto::AttributeType, AttributeProto, NodeProto};
    use crate::ops::testing::{floats, ints, node, run};

    fn attr(
        mut n: NodeProto,
        name: &str,
        s: Option<&str>,
        f: Option<f32>,
        i: Option<i64>,
    ) -> NodeProto {
        n.attribute.push(AttributeProto {
            name: Some(name.into()),
            s: s.map(|s| s.as_bytes().to_vec()),
            f,
            i,
            r#type: Some(if s.is_some() {
                AttributeType::String
            } else if f.is_some() {
                AttributeType::Float
            } else {
                AttributeType::Int
            } as i32),
            ..Default::default()
        });
        n
    }

    /// DINOv2 and YOLOS resize their position embeddings with `interpolate(mode="bicubic")`,
    /// which both exporters write as a cubic Resize of a constant: refused ("nearest and
    /// linear are supported"). Computed at import now; the expected values are onnxruntime's
    /// (and, for a = -0.75 half_pixel, PyTorch's bicubic) on `x = k^1.5`, k = 0..16 as 4×4.
    #[test]
    fn a_cubic_resize_of_a_constant_or_at_run_time_matches_onnxruntime() {
        let table: Vec<f32> = (0..16).map(|k| (k as f32).powf(1.5)).collect();
        // (coordinate mode, a, exclude_outside, output size, expected)
        type Case = (&'static str, f32, i64, [i64; 2], Vec<f32>);
        let cases: [Case; 3] = [
            (
                "half_pixel",
                -0.75,
                0,
                [3, 5],
                vec![
                    0.8157, 1.59971, 3.09345, 5.17796, 6.95199, 14.05138, 16.63829, 20.20658,
                    24.01033, 26.99178, 38.78938, 42.25111, 46.95706, 51.85767, 55.64555,
                ],
            ),
            (
                "half_pixel",
                -0.5,
                1,
                [3, 5],
                vec![
                    0.6968, 1.49555, 2.90906, 4.84464, 6.62484, 14.46306, 17.10906, 20.51147,
                    24.1268, 27.17308, 39.34852, 42.93547, 47.46914, 52.1715, 56.0756,
                ],
            ),
            (
                "align_corners",
                -0.75,
                0,
                [6, 3],
                vec![
                    0.0, 1.78599, 5.19615, 3.31624, 6.80469, 11.41054, 10.88784, 16.33964,
                    22.44213, 18.42658, 24.69666, 31.5665, 31.5566, 38.9211, 46.80824, 41.56922,
                    49.58938, 58.09475,
                ],
            ),
        ];
        for (coord, a, exclude, [h, w], want) in cases {
            let mut resize = node("Resize", &["table", "", "", "sizes"], "pos");
            resize = attr(resize, "mode", Some("cubic"), None, None);
            resize = attr(
                resize,
                "coordinate_transformation_mode",
                Some(coord),
                None,
                None,
            );
            resize = attr(resize, "cubic_coeff_a", None, Some(a), None);
            resize = attr(resize, "exclude_outside", None, None, Some(exclude));
            let nodes = vec![resize, node("Add", &["x", "pos"], "y")];
            let inits = vec![
                floats("table", &[1, 1, 4, 4], &table),
                ints("sizes", &[4], &[1, 1, h, w]),
            ];
            let n = (h * w) as usize;
            let y = run(nodes, inits, &[1, 1, h as usize, w as usize], &vec![0.0; n]).unwrap();
            for (got, want) in y.data.iter().zip(&want) {
                assert!(
                    (got - want).abs() < 1e-4,
                    "{coord} a={a}: {:?} vs {want:?}",
                    y.data
                );
            }
            // The same resize of a runtime tensor (timm's CrossViT resizes its input image so:
            // refused before, "cubic is supported on values known at import"): the same values,
            // at batch 2 with a second plane of other values.
            let mut resize = node("Resize", &["x", "", "", "sizes"], "y");
            resize = attr(resize, "mode", Some("cubic"), None, None);
            resize = attr(
                resize,
                "coordinate_transformation_mode",
                Some(coord),
                None,
                None,
            );
            resize = attr(resize, "cubic_coeff_a", None, Some(a), None);
            resize = attr(resize, "exclude_outside", None, None, Some(exclude));
            let x: Vec<f32> = table.iter().chain(&[1.0f32; 16]).copied().collect();
            let y = run(
                vec![resize],
                vec![ints("sizes", &[4], &[2, 1, h, w])],
                &[2, 1, 4, 4],
                &x,
            )
            .unwrap();
            assert_eq!(y.shape, vec![2, 1, h as usize, w as usize]);
            for (got, want) in y.data[..n].iter().zip(&want) {
                assert!(
                    (got - want).abs() < 1e-4,
                    "runtime {coord} a={a}: {:?} vs {want:?}",
                    y.data
                );
            }
            // Cubic weights sum to 1: a constant plane stays constant.
            for got in &y.data[n..] {
                assert!((got - 1.0).abs() < 1e-5, "{coord}: {:?}", &y.data[n..]);
            }
        }
    }
}
