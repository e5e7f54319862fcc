//! The CUDA lowering of the `elementwise` family (its engine home: isolane-engine's
//! `ops/elementwise.rs`). Unary and Binary ops: pointwise and broadcast kernels, or folded into a
//! neighbour (a scalar Mul into a matmul's alpha, an Add into a Linear's epilogue, a per-channel
//! scale deferred to the Add that reads it).

use crate::plan::*;

impl Planner<'_> {
    /// Lowers `Op::Unary(u)`.
    pub(in crate::plan) fn lower_unary(&mut self, c: &NodeCtx, u: &Unary) -> Result<Lowered> {
        let p = self;
        let (name, outs, out_shape, x0) = (c.name, &c.outs, &c.out_shape, c.x0);
        let x = p.raw(x0, name)?;
        let keep = p.nhwc[x0];
        let y = p.output(outs[0], keep);
        let n = out_shape.iter().product();
        p.push(name, StepKind::elementwise(x, y, n, None, Some(*u)));
        Ok(Lowered::Steps)
    }

    /// Scale folding: `x · c` with `c` a scalar constant, consumed only by a MatMul, becomes
    /// that matmul's alpha (the output aliases `x`). Returns whether it folded.
    pub(in crate::plan) fn fold_scalar_into_matmul_alpha(
        &mut self,
        c: &NodeCtx,
        pat: &Patterns,
    ) -> Result<bool> {
        let p = self;
        let (name, outs, in_shapes, out_shape, g) =
            (c.name, &c.outs, &c.in_shapes, &c.out_shape, p.g);
        let (va, vb) = (c.x0, c.n.inputs[1]);
        let scalar_const = |v: usize| match &g.values[v].kind {
            ValueKind::Constant(t) if t.numel() == 1 => Some(t.data[0]),
            _ => None,
        };
        let sole = |v: usize| pat.sole_user[v].map(|u| &g.nodes[u]);
        if matches!(sole(outs[0]).map(|u| &u.op), Some(Op::MatMul)) {
            let pair = match (scalar_const(va), scalar_const(vb)) {
                (None, Some(c)) if in_shapes[0] == *out_shape => Some((va, c)),
                (Some(c), None) if in_shapes[1] == *out_shape => Some((vb, c)),
                _ => None,
            };
            if let Some((xv, c)) = pair {
                let l = if p.nhwc[xv] {
                    p.plain(xv, name)?
                } else {
                    p.raw(xv, name)?
                };
                p.loc[outs[0]] = Some(l);
                p.vstrides[outs[0]] = if p.nhwc[xv] {
                    None
                } else {
                    p.vstrides[xv].clone()
                };
                p.alpha_of[outs[0]] = p.alpha_of[xv] * c;
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Scale folding: `x · s[c]` (a per-channel constant) consumed only by `+ r` is deferred to
    /// the add, which emits one pointwise pass `x · s[c] + r`. Returns whether it deferred.
    pub(in crate::plan) fn defer_channel_scale_to_add(
        &mut self,
        c: &NodeCtx,
        pat: &Patterns,
    ) -> Result<bool> {
        let p = self;
        let (name, outs, out_shape, g) = (c.name, &c.outs, &c.out_shape, p.g);
        let (va, vb) = (c.x0, c.n.inputs[1]);
        let sole = |v: usize| pat.sole_user[v].map(|u| &g.nodes[u]);
        if out_shape.len() == 4 {
            let chan = |cv: usize, xv: usize| -> bool {
                matches!(g.values[cv].kind, ValueKind::Constant(_))
                    && p.shapes[xv] == *out_shape
                    && {
                        let cs = &p.shapes[cv];
                        let c = out_shape[1];
                        cs.iter().product::<usize>() == c
                            && (cs.as_slice() == [c, 1, 1] || cs.as_slice() == [1, c, 1, 1])
                    }
            };
            let pair = if chan(va, vb) {
                Some((vb, va))
            } else if chan(vb, va) {
                Some((va, vb))
            } else {
                None
            };
            if let (Some((xv, cv)), Some(add)) = (pair, sole(outs[0])) {
                let other = add.inputs.iter().copied().find(|&i| i != outs[0]);
                let fits = matches!(add.op, Op::Binary(Binary::Add))
                    && add.inputs.len() == 2
                    && other.is_some_and(|r| {
                        p.shapes[r] == *out_shape && p.loc[r].is_some() && p.nhwc[r] == p.nhwc[xv]
                    });
                if fits {
                    let xl = p.raw(xv, name)?;
                    let sl = p.raw(cv, name)?;
                    p.pending_scale[outs[0]] = Some((xl, sl, out_shape[1]));
                    p.nhwc[outs[0]] = p.nhwc[xv];
                    return Ok(true);
                }
            }
        }
        Ok(false)
    }

    /// The add a per-channel scale was deferred to: one pointwise pass `x · s[c] + r`.
    /// Returns whether it emitted it.
    pub(in crate::plan) fn add_deferred_channel_scale(&mut self, c: &NodeCtx) -> Result<bool> {
        let p = self;
        let (name, outs, out_shape) = (c.name, &c.outs, &c.out_shape);
        let (va, vb) = (c.x0, c.n.inputs[1]);
        for (sv, rv) in [(va, vb), (vb, va)] {
            if let Some((xl, sl, ch)) = p.pending_scale[sv] {
                let r = p.raw(rv, name)?;
                // Keep x alive up to here (it was read at the Mul's time).
                p.touch(xl);
                let nhwc = p.nhwc[sv];
                let y = p.output(outs[0], nhwc);
                let inner = if nhwc { 1 } else { out_shape[2] * out_shape[3] };
                p.push(
                    name,
                    StepKind::Pointwise {
                        x: xl,
                        y,
                        scale: Some(sl),
                        bias: None,
                        residual: Some(r),
                        n: out_shape.iter().product(),
                        channels: ch,
                        inner,
                        act: None,
                    },
                );
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// `Linear(x) + r` with `r` older than the Linear: `r` becomes cuBLASLt's C (beta = 1)
    /// and the sum is the Linear's output. Returns whether it fused.
    pub(in crate::plan) fn fuse_add_into_linear(
        &mut self,
        c: &NodeCtx,
        pat: &Patterns,
    ) -> Result<bool> {
        let p = self;
        let (name, outs, g, users) = (c.name, &c.outs, p.g, &pat.users);
        let (va, vb) = (c.x0, c.n.inputs[1]);
        for (lv, rv) in [(va, vb), (vb, va)] {
            let Some((si, lt)) = p.linear_of[lv] else {
                continue;
            };
            // r must hold its value before the Linear runs.
            let older = match (&g.values[rv].kind, p.loc[rv]) {
                (ValueKind::Constant(_), _) => true,
                (_, Some(Loc::Storage { id, .. })) => p.storages[id].first < lt,
                _ => false,
            };
            if users[lv] != 1 || p.nhwc[rv] || !older {
                continue;
            }
            if let StepKind::Linear(LinearStep {
                act: None,
                residual: None,
                ..
            }) = p.steps[si].kind
            {
                let r = p.raw(rv, name)?;
                if let StepKind::Linear(LinearStep { residual, .. }) = &mut p.steps[si].kind {
                    *residual = Some(r);
                }
                p.loc[outs[0]] = p.loc[lv];
                p.def_t[outs[0]] = p.def_t[lv];
                // The Linear's own output is never stored any more (its storage
                // holds the sum).
                p.probes.retain(|pr| pr.value != lv);
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Lowers `Op::Binary(op)`: the scale and residual folds first, else one pointwise
    /// (same-shape add) or broadcasting binary step.
    pub(in crate::plan) fn lower_binary(
        &mut self,
        c: &NodeCtx,
        pat: &Patterns,
        op: &Binary,
    ) -> Result<Lowered> {
        if *op == Binary::Mul
            && (self.fold_scalar_into_matmul_alpha(c, pat)?
                || self.defer_channel_scale_to_add(c, pat)?)
        {
            return Ok(Lowered::Folded);
        }
        let p = self;
        let (name, in_shapes, outs, out_shape) = (c.name, &c.in_shapes, &c.outs, &c.out_shape);
        let (va, vb) = (c.x0, c.n.inputs[1]);
        for v in [va, vb] {
            if p.vstrides[v].is_some() {
                let l = p.plain(v, name)?;
                p.loc[v] = Some(l);
                p.vstrides[v] = None;
            }
        }
        if *op == Binary::Add
            && in_shapes[0] == in_shapes[1]
            && (p.add_deferred_channel_scale(c)? || p.fuse_add_into_linear(c, pat)?)
        {
            return Ok(Lowered::Folded);
        }
        let a = p.raw(va, name)?;
        let b = p.raw(vb, name)?;
        let (na, nb) = (p.nhwc[va], p.nhwc[vb]);
        if *op == Binary::Add && in_shapes[0] == in_shapes[1] && na == nb {
            // A residual add: one contiguous pass whatever the layout.
            let y = p.output(outs[0], na);
            let n = out_shape.iter().product();
            p.push(name, StepKind::elementwise(a, y, n, Some(b), None));
        } else {
            let out_nhwc = (na && in_shapes[0] == *out_shape) || (nb && in_shapes[1] == *out_shape);
            let y = p.output(outs[0], out_nhwc);
            let ys = phys_strides(out_shape, p.nhwc[outs[0]]);
            let sa = phys_broadcast(&in_shapes[0], na, out_shape);
            let sb = phys_broadcast(&in_shapes[1], nb, out_shape);
            p.push(
                name,
                StepKind::Binary {
                    a,
                    b,
                    y,
                    op: *op,
                    space: Strided::coalesce(out_shape, vec![ys, sa, sb], name)?,
                },
            );
        }
        Ok(Lowered::Steps)
    }
}
