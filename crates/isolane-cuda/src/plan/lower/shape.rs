//! The CUDA lowering of the `shape` family (its engine home: isolane-engine's `ops/shape.rs`).
//! Shape ops (Flatten, Reshape, Squeeze, Unsqueeze, Identity, Transpose, Expand): most become views
//! of their input's storage (an alias, an element offset or strides) and emit no step; the rest a
//! strided copy.

use crate::plan::*;

impl Planner<'_> {
    /// Plans `c.n` as a view of its input when it can be one (an alias of the input's storage,
    /// with an element offset or strides): reshapes, squeezes, splits and gathers along leading
    /// axes, transposes read by stride-aware consumers only, layout-swapping transposes of NHWC
    /// values. Inputs stored as strided views are made plain first unless the node reads
    /// strides. Returns whether the node became a view (and so has no step).
    pub(in crate::plan) fn lower_view(&mut self, c: &NodeCtx, pat: &Patterns) -> Result<bool> {
        let p = self;
        // The readers of an input stored with padded channels take that storage as it is.
        let pad_reader = p.cpad[c.x0].is_some() && matches!(c.n.op, Op::Conv(_) | Op::FakeQuant(_));
        if !pat.stride_aware(p.g, c.ni) && !pad_reader {
            for &i in &c.n.inputs {
                if p.vstrides[i].is_some() {
                    let l = p.plain(i, c.name)?;
                    p.loc[i] = Some(l);
                    p.vstrides[i] = None;
                }
            }
        }
        Ok(p.view_of_strided_input(c)?
            || p.transpose_as_strided_view(c, pat)?
            || p.alias_view(c)?
            || p.layout_swap_view(c)?)
    }

    /// A view op (or a split) of a strided input: a view again when only size-1 dims change
    /// (the input is made plain otherwise). Returns whether the node became a view.
    pub(in crate::plan) fn view_of_strided_input(&mut self, c: &NodeCtx) -> Result<bool> {
        let p = self;
        let (n, name, in_shapes, outs, out_shape, x0) =
            (c.n, c.name, &c.in_shapes, &c.outs, &c.out_shape, c.x0);
        // Strided inputs of view ops: a view again when only size-1 dims change.
        if p.vstrides[x0].is_some() && (n.op.is_view() || matches!(n.op, Op::Split { .. })) {
            let st = p.strides(x0);
            let l = p.raw(x0, name)?;
            if let Op::Split { axis, sizes } = &n.op {
                let a = norm_axis(*axis, in_shapes[0].len())
                    .ok_or_else(|| unsupported(name, "bad axis"))?;
                let mut at = 0;
                for (j, &o) in outs.iter().enumerate() {
                    p.loc[o] = Some(l.with_offset(at * st[a]));
                    p.vstrides[o] = Some(st.clone());
                    at += sizes[j];
                }
                return Ok(true);
            }
            let kept: Vec<usize> = in_shapes[0]
                .iter()
                .zip(&st)
                .filter(|(d, _)| **d != 1)
                .map(|(_, s)| *s)
                .collect();
            let in_dims: Vec<usize> = in_shapes[0].iter().copied().filter(|&d| d != 1).collect();
            let out_dims: Vec<usize> = out_shape.iter().copied().filter(|&d| d != 1).collect();
            if in_dims == out_dims {
                let mut it = kept.iter();
                let os: Vec<usize> = out_shape
                    .iter()
                    .map(|&d| if d == 1 { 0 } else { *it.next().unwrap_or(&0) })
                    .collect();
                p.loc[outs[0]] = Some(l);
                p.vstrides[outs[0]] = Some(os);
                return Ok(true);
            }
            let l = p.plain(x0, name)?;
            p.loc[x0] = Some(l);
            p.vstrides[x0] = None;
        }
        Ok(false)
    }

    /// A transpose read by stride-aware consumers only (or whose result is row-major) is a
    /// strided view of its input. Returns whether it became one.
    pub(in crate::plan) fn transpose_as_strided_view(
        &mut self,
        c: &NodeCtx,
        pat: &Patterns,
    ) -> Result<bool> {
        let p = self;
        let g = p.g;
        let (n, name, outs, out_shape, x0, is_output, users_of) = (
            c.n,
            c.name,
            &c.outs,
            &c.out_shape,
            c.x0,
            &pat.is_output,
            &pat.users_of,
        );
        // A transpose read by stride-aware consumers only (or whose result is row-major) is a
        // view: its strides are the input's, permuted.
        if let Op::Transpose { perm } = &n.op {
            let consts = matches!(g.values[x0].kind, ValueKind::Constant(_));
            if !consts && !p.nhwc[x0] {
                let st = p.strides(x0);
                let os: Vec<usize> = perm.iter().map(|&q| st[q]).collect();
                let contiguous = os == contiguous_strides(out_shape)
                    || Strided::coalesce(
                        out_shape,
                        vec![os.clone(), contiguous_strides(out_shape)],
                        name,
                    )
                    .is_ok_and(|s| s.dims.len() == 1 && s.strides[0][0] == 1);
                let o = outs[0];
                let all_aware = !is_output[o]
                    && !users_of[o].is_empty()
                    && users_of[o].iter().all(|&u| pat.stride_aware(g, u));
                if contiguous || all_aware {
                    let l = p.raw(x0, name)?;
                    p.loc[o] = Some(l);
                    p.vstrides[o] = if contiguous { None } else { Some(os) };
                    return Ok(true);
                }
            }
        }

        Ok(false)
    }

    /// Views alias their input's storage at an element offset: reshapes, squeezes, gathers of
    /// one index and splits along leading axes. Returns whether the node became one.
    pub(in crate::plan) fn alias_view(&mut self, c: &NodeCtx) -> Result<bool> {
        let p = self;
        let (n, name, in_shapes, outs, x0) = (c.n, c.name, &c.in_shapes, &c.outs, c.x0);
        // Views alias their input (constants included); NHWC values are made plain first,
        // except where the view keeps meaning under NHWC (see Transpose below).
        let view_offset: Option<usize> = match &n.op {
            op if op.is_view() => Some(0),
            Op::Gather { axis, indices, .. } if indices.len() == 1 => {
                let x = &in_shapes[0];
                let a = norm_axis(*axis, x.len()).ok_or_else(|| unsupported(name, "bad axis"))?;
                if x[..a].iter().all(|&d| d == 1) {
                    let idx = if indices[0] < 0 {
                        indices[0] + x[a] as i64
                    } else {
                        indices[0]
                    } as usize;
                    Some(idx * x[a + 1..].iter().product::<usize>())
                } else {
                    None
                }
            }
            _ => None,
        };
        if let Some(off) = view_offset {
            let l = p.plain(x0, name)?;
            p.loc[outs[0]] = Some(l.with_offset(off));
            return Ok(true);
        }
        if let Op::Split { axis, sizes } = &n.op {
            let x = &in_shapes[0];
            let a = norm_axis(*axis, x.len()).ok_or_else(|| unsupported(name, "bad axis"))?;
            let inner: usize = x[a + 1..].iter().product();
            if x[..a].iter().all(|&d| d == 1) {
                let l = p.plain(x0, name)?;
                let mut at = 0;
                for (j, &o) in outs.iter().enumerate() {
                    p.loc[o] = Some(l.with_offset(at * inner));
                    at += sizes[j];
                }
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Layout-swapping transposes: NCHW→NHWC of an NHWC value is its storage read plainly;
    /// NHWC→NCHW of a plain 4-D value is the same storage read as NHWC. Returns whether the
    /// transpose became such a free view.
    pub(in crate::plan) fn layout_swap_view(&mut self, c: &NodeCtx) -> Result<bool> {
        let p = self;
        let g = p.g;
        let (opts, n, name, outs, out_shape, x0) =
            (p.opts, c.n, c.name, &c.outs, &c.out_shape, c.x0);
        if let Op::Transpose { perm } = &n.op {
            // NCHW→NHWC of an NHWC value is its storage read plainly; NHWC→NCHW of a plain
            // 4-D value is the same storage read as NHWC. Both free.
            if p.nhwc[x0] && perm == &[0, 2, 3, 1] {
                let l = p.raw(x0, name)?;
                p.loc[outs[0]] = Some(l);
                return Ok(true);
            }
            if opts.channels_last
                && !p.nhwc[x0]
                && perm == &[0, 3, 1, 2]
                && !matches!(g.values[x0].kind, ValueKind::Constant(_))
            {
                let l = p.raw(x0, name)?;
                let o = outs[0];
                p.loc[o] = Some(l);
                p.nhwc[o] = out_shape[2] * out_shape[3] > 1 && out_shape[1] > 1;
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Lowers `Op::Transpose { perm }`.
    pub(in crate::plan) fn lower_transpose(
        &mut self,
        c: &NodeCtx,
        perm: &[usize],
    ) -> Result<Lowered> {
        let p = self;
        let (name, outs, out_shape, x0) = (c.name, &c.outs, &c.out_shape, c.x0);
        let x = p.raw(x0, name)?;
        // The input as stored: NHWC, or a strided view (a transpose is stride-aware,
        // so a transpose of a transpose reaches here with its input unconverted).
        let xs = p.strides(x0);
        let src: Vec<usize> = perm.iter().map(|&q| xs[q]).collect();
        let y = p.output(outs[0], false);
        p.push_copy(
            name,
            [x, y],
            out_shape,
            [contiguous_strides(out_shape), src],
        )?;
        Ok(Lowered::Steps)
    }

    /// Lowers `Op::Expand { .. }`.
    pub(in crate::plan) fn lower_expand(&mut self, c: &NodeCtx) -> Result<Lowered> {
        let p = self;
        let (name, in_shapes, outs, out_shape, x0) =
            (c.name, &c.in_shapes, &c.outs, &c.out_shape, c.x0);
        let x = p.raw(x0, name)?;
        let sx = phys_broadcast(&in_shapes[0], p.nhwc[x0], out_shape);
        let y = p.output(outs[0], false);
        p.push_copy(name, [x, y], out_shape, [contiguous_strides(out_shape), sx])?;
        Ok(Lowered::Steps)
    }
}
