//! `Op::Resize`: nearest and bilinear on the two spatial dims of an NCHW tensor, with ONNX's
//! coordinate transforms (the arithmetic is `crate::ir::ResizeAttrs::source`).
//!
//! ONNX: Resize, and Upsample (opsets 7–9) with Resize-10, which compute their source
//! coordinates as `out / scale`.

use crate::error::Result;
use crate::ir::{self, Dim, Op};
use crate::ir::{rank4, shape_err, Node, ResizeAttrs, ResizeMode, ResizeSize};
use crate::kernels::{Kernel, ResizeK};
use crate::onnx::fold::Arr;
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
        c.ignore("cubic_coeff_a"); // only for mode=cubic, rejected below
        c.int_default_only("exclude_outside", 0)?;
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
        let mode = match mode.as_str() {
            "nearest" => ir::ResizeMode::Nearest,
            "linear" => ir::ResizeMode::Linear,
            other => {
                return Err(c.unsupported_attr(
                    "mode",
                    format!("value {other:?} (nearest and linear are supported)"),
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
        let xs = x.sym_shape().map_err(|e| c.bad(e))?;
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
        let out = self.out_name(c, 0);
        let ins = [(c.n.input[0].clone(), x)];
        self.emit(
            c,
            Op::Resize(ir::ResizeAttrs {
                mode,
                coord,
                nearest,
                size,
            }),
            &ins,
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
