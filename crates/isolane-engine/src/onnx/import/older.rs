//! Opsets 7–12: the signatures that changed by opset 13, with their own semantics.
//!
//! Most changes moved an attribute to an input (Slice at 10, Pad and Clip at 11, Squeeze,
//! Unsqueeze and Split at 13). Such a node is rewritten into its newer form — the attribute's
//! value becomes a constant input — and handed to the newer handler, so both forms share one
//! implementation and every check. Ops whose meaning changed are implemented here: Softmax
//! before 13 coerces its input to 2-D, and Upsample (7–9) and Resize-10 compute source
//! coordinates as `out / scale` (what onnxruntime does for them).

use super::*;

impl Importer<'_> {
    /// Runs `handler` on a copy of node `c` in its newer form: `inputs` puts a value (or
    /// nothing: an empty input name) at an input position, `drop` removes attributes the
    /// caller has read and turned into inputs, `add` sets attributes. Messages still name the
    /// node as the file has it; every attribute the copy keeps must be read by the handler.
    pub(super) fn as_newer_form(
        &mut self,
        c: &Ctx,
        inputs: Vec<(usize, Option<Val>)>,
        drop: &[&str],
        add: Vec<AttributeProto>,
        handler: fn(&mut Self, &Ctx) -> Result<Vec<Val>>,
    ) -> Result<Vec<Val>> {
        for name in drop {
            c.ignore(name);
        }
        let mut n = c.n.clone();
        n.attribute.retain(|a| !drop.contains(&a.name()));
        n.attribute
            .retain(|a| !add.iter().any(|b| b.name() == a.name()));
        n.attribute.extend(add);
        for (pos, v) in inputs {
            if n.input.len() <= pos {
                n.input.resize(pos + 1, String::new());
            }
            n.input[pos] = match v {
                None => String::new(),
                Some(v) => {
                    self.fresh += 1;
                    let name = format!("{}:input{pos}:{}", c.r.node, self.fresh);
                    self.vals.insert(name.clone(), v);
                    name
                }
            };
        }
        let newer = Ctx {
            n: &n,
            r: c.r.clone(),
            path: c.path,
            read: RefCell::new(vec![false; n.attribute.len()]),
        };
        let out = handler(self, &newer)?;
        newer.check_all_read()?;
        // The copy's handler read (or refused) every attribute the original still had.
        for a in &c.n.attribute {
            c.ignore(a.name());
        }
        Ok(out)
    }

    /// Slice before opset 10: `starts`, `ends` and `axes` are attributes (no steps).
    pub(super) fn slice_v1(&mut self, c: &Ctx) -> Result<Vec<Val>> {
        let ints_val =
            |v: Vec<i64>| Val::I(Arr::new(vec![v.len()], v.into_iter().map(Sym::k).collect()));
        let starts = c
            .ints("starts")?
            .ok_or_else(|| c.bad("attribute starts is required"))?;
        let ends = c
            .ints("ends")?
            .ok_or_else(|| c.bad("attribute ends is required"))?;
        let mut inputs = vec![(1, Some(ints_val(starts))), (2, Some(ints_val(ends)))];
        if let Some(axes) = c.ints("axes")? {
            inputs.push((3, Some(ints_val(axes))));
        }
        self.as_newer_form(c, inputs, &["starts", "ends", "axes"], vec![], Self::slice)
    }

    /// Pad before opset 11: `pads` and `value` are attributes; `mode` is unchanged.
    pub(super) fn pad_v2(&mut self, c: &Ctx) -> Result<Vec<Val>> {
        let pads = c
            .ints("pads")?
            .ok_or_else(|| c.bad("attribute pads is required"))?;
        let value = c.float("value", 0.0)?;
        let pads = Val::I(Arr::new(
            vec![pads.len()],
            pads.into_iter().map(Sym::k).collect(),
        ));
        let inputs = vec![(1, Some(pads)), (2, Some(Val::F(Arr::scalar(value))))];
        self.as_newer_form(c, inputs, &["pads", "value"], vec![], Self::pad)
    }

    /// Clip before opset 11: `min` and `max` are attributes whose defaults are the lowest and
    /// the largest float (not ±infinity: an infinite input is clipped to them).
    pub(super) fn clip_v6(&mut self, c: &Ctx) -> Result<Vec<Val>> {
        let min = c.float("min", f32::MIN)?;
        let max = c.float("max", f32::MAX)?;
        let inputs = vec![
            (1, Some(Val::F(Arr::scalar(min)))),
            (2, Some(Val::F(Arr::scalar(max)))),
        ];
        self.as_newer_form(c, inputs, &["min", "max"], vec![], Self::clip)
    }

    /// Squeeze and Unsqueeze before opset 13: `axes` is an attribute (optional for Squeeze).
    pub(super) fn squeeze_v1(&mut self, c: &Ctx, unsqueeze: bool) -> Result<Vec<Val>> {
        let axes = c.ints("axes")?;
        let inputs = match axes {
            Some(a) => vec![(
                1,
                Some(Val::I(Arr::new(
                    vec![a.len()],
                    a.into_iter().map(Sym::k).collect(),
                ))),
            )],
            None => vec![],
        };
        let handler: fn(&mut Self, &Ctx) -> Result<Vec<Val>> = if unsqueeze {
            |im, c| im.squeeze(c, true)
        } else {
            |im, c| im.squeeze(c, false)
        };
        self.as_newer_form(c, inputs, &["axes"], vec![], handler)
    }

    /// Split before opset 13: the part sizes are the `split` attribute (absent: equal parts).
    pub(super) fn split_v2(&mut self, c: &Ctx) -> Result<Vec<Val>> {
        let inputs = match c.ints("split")? {
            Some(s) => vec![(
                1,
                Some(Val::I(Arr::new(
                    vec![s.len()],
                    s.into_iter().map(Sym::k).collect(),
                ))),
            )],
            None => vec![],
        };
        self.as_newer_form(c, inputs, &["split"], vec![], Self::split)
    }

    /// Softmax before opset 13 (default axis 1): the input is coerced to 2-D, `[d0·…·d(axis−1),
    /// d(axis)·…·d(n−1)]`, each row normalised as one, and the result reshaped back. Over the
    /// last axis this is the newer Softmax; over an earlier one it normalises several axes
    /// together (unlike opset 13's single axis), imported as Flatten → Softmax → Reshape.
    pub(super) fn softmax_v1(&mut self, c: &Ctx) -> Result<Vec<Val>> {
        let axis = c.int("axis", 1)?;
        let x = self.req(c, 0)?;
        let r = x.rank();
        // Flatten's axis may equal the rank: every row then holds one element.
        let a = if axis == r as i64 {
            r
        } else {
            norm_axis(c, axis, r)?
        };
        if a + 1 == r {
            return self.emit1(c, Op::Softmax { axis: -1 }, 1);
        }
        let shape = x.sym_shape().map_err(|e| c.bad(e))?;
        let back: Vec<Dim> = shape
            .iter()
            .map(|&s| sym_to_dim(s, false))
            .collect::<Result<_, _>>()
            .map_err(|e| c.bad(format!("shape {}: {e}", fmt_syms(&shape))))?;
        let flat = self.emit_tmp(
            c,
            Op::Flatten { axis: a as i64 },
            &[(c.n.input[0].clone(), x)],
            "rows",
        )?;
        let soft = self.emit_tmp(
            c,
            Op::Softmax { axis: -1 },
            &[(format!("{}:rows", c.r.node), flat)],
            "normalised",
        )?;
        let out = self.out_name(c, 0);
        self.emit(
            c,
            Op::Reshape { shape: back },
            &[(format!("{}:normalised", c.r.node), soft)],
            vec![out],
        )
    }

    /// Upsample (opsets 7–9; `scales` an attribute at 7–8, an input at 9) and Resize at
    /// opset 10 (inputs X and scales): the output is `floor(in · scale)` and an output index
    /// `i` reads the input at `i / scale` (the `asymmetric` coordinate mode). Nearest takes
    /// that coordinate's floor when upsampling and its ceiling when downsampling, as
    /// onnxruntime does; linear interpolates. Both become the newer Resize.
    pub(super) fn upsample(&mut self, c: &Ctx) -> Result<Vec<Val>> {
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
