//! The CUDA lowering of the `linear` family (its engine home: isolane-engine's `ops/linear.rs`).
//! Linear, MatMul and the attention pattern (a MatMul that `Patterns::fuse_attention` marked):
//! cuBLASLt, or the fused attention kernel.

use crate::plan::*;

impl Planner<'_> {
    /// Lowers `Op::Linear { activation }`.
    pub(in crate::plan) fn lower_linear(
        &mut self,
        c: &NodeCtx,
        activation: &Option<Unary>,
    ) -> Result<Lowered> {
        let p = self;
        let (n, name, in_shapes, outs, x0) = (c.n, c.name, &c.in_shapes, &c.outs, c.x0);
        let x = p.plain(x0, name)?;
        let w = p.raw(n.inputs[1], name)?;
        let bias = match n.inputs.get(2) {
            Some(&b) => Some(p.raw(b, name)?),
            None => None,
        };
        let y = p.output(outs[0], false);
        let xsh = &in_shapes[0];
        p.linear_of[outs[0]] = Some((p.steps.len(), p.t));
        p.push(
            name,
            StepKind::Linear(LinearStep {
                x,
                w,
                bias,
                y,
                m: xsh[..xsh.len() - 1].iter().product(),
                n: in_shapes[1][0],
                k: in_shapes[1][1],
                act: *activation,
                residual: None,
            }),
        );
        Ok(Lowered::Steps)
    }

    /// Lowers `Op::MatMul if attn_at[ni].is_some()`.
    pub(in crate::plan) fn lower_attention(
        &mut self,
        c: &NodeCtx,
        pat: &Patterns,
    ) -> Result<Lowered> {
        let p = self;
        let (n, ni, name, outs, out_shape, x0, g, sole_user, is_output, folded_t, key_of, attn_at) = (
            c.n,
            c.ni,
            c.name,
            &c.outs,
            &c.out_shape,
            c.x0,
            p.g,
            &pat.sole_user,
            &pat.is_output,
            &pat.folded_t,
            &pat.key_of,
            &pat.attn_at,
        );
        let sn = &g.nodes[attn_at[ni].unwrap_or_default()];
        let kv = key_of[sn.inputs[1]].unwrap_or(sn.inputs[1]);
        let alpha = operand_alpha(&p.alpha_of, folded_t, sn.inputs[0])
            * operand_alpha(&p.alpha_of, folded_t, sn.inputs[1]);
        let out_scale = operand_alpha(&p.alpha_of, folded_t, x0)
            * operand_alpha(&p.alpha_of, folded_t, n.inputs[1]);
        // (loc, [image, head, row] strides) of a [B, H, S, d] / [BH, S, d] operand,
        // read in place when its rows are contiguous and 16-byte aligned, else copied.
        let operand = |v: usize, p: &mut Planner| -> Result<(Loc, [usize; 3])> {
            let es = p.es;
            let aligned = |l: Loc, st: &[usize]| {
                let off = match l {
                    Loc::Storage { offset, .. } | Loc::Const { offset, .. } => offset,
                };
                (off * es).is_multiple_of(16) && st.iter().all(|&x| (x * es).is_multiple_of(16))
            };
            // Full strides [.., row, 1] → (image, head, row).
            let split = |st: &[usize]| -> [usize; 3] {
                if st.len() == 4 {
                    [st[0], st[1], st[2]]
                } else {
                    [0, st[0], st[1]]
                }
            };
            if !p.nhwc[v] {
                let st = p.strides(v);
                let l = p.raw(v, name)?;
                let r = st.len();
                if st[r - 1] == 1 && aligned(l, &st[..r - 1]) {
                    return Ok((l, split(&st)));
                }
            }
            let l = p.plain(v, name)?;
            Ok((l, split(&contiguous_strides(&p.shapes[v]))))
        };
        let (ql, qst) = operand(sn.inputs[0], &mut *p)?;
        let (kl, kst) = operand(kv, &mut *p)?;
        let (vl, vst) = operand(n.inputs[1], &mut *p)?;
        let sh = p.shapes[sn.inputs[0]].clone();
        let r = sh.len();
        let (batch, heads) = if r == 4 { (sh[0], sh[1]) } else { (1, sh[0]) };
        // Written straight into the layout of a sole transposing consumer that keeps
        // the last dim (the heads merged back), so that transpose is free.
        let o = outs[0];
        let mut yst = contiguous_strides(out_shape);
        let mut strided = false;
        if let Some(u) = sole_user[o] {
            if let Op::Transpose { perm } = &g.nodes[u].op {
                if perm.len() == r && perm[r - 1] == r - 1 && !is_output[o] {
                    let tshape: Vec<usize> = perm.iter().map(|&q| out_shape[q]).collect();
                    let ts = contiguous_strides(&tshape);
                    for (d, &q) in perm.iter().enumerate() {
                        yst[q] = ts[d];
                    }
                    strided = true;
                }
            }
        }
        let y = p.output(o, false);
        p.vstrides[o] = strided.then(|| yst.clone());
        let ys = if r == 4 {
            [yst[0], yst[1], yst[2]]
        } else {
            [0, yst[0], yst[1]]
        };
        debug_assert_eq!(yst[r - 1], 1);
        p.push(
            name,
            StepKind::Attention(AttentionStep {
                q: ql,
                k: kl,
                v: vl,
                y,
                batch,
                heads,
                seq: sh[r - 2],
                dim: sh[r - 1],
                alpha,
                out_scale,
                q_strides: qst,
                k_strides: kst,
                v_strides: vst,
                y_strides: ys,
            }),
        );
        Ok(Lowered::Steps)
    }

    /// Lowers `Op::MatMul`.
    pub(in crate::plan) fn lower_matmul(&mut self, c: &NodeCtx, pat: &Patterns) -> Result<Lowered> {
        let p = self;
        let (n, name, in_shapes, outs, out_shape, x0, g, sole_user, is_output, folded_t) = (
            c.n,
            c.name,
            &c.in_shapes,
            &c.outs,
            &c.out_shape,
            c.x0,
            p.g,
            &pat.sole_user,
            &pat.is_output,
            &pat.folded_t,
        );
        let vb = folded_t[n.inputs[1]].unwrap_or(n.inputs[1]);
        let b_trans = folded_t[n.inputs[1]].is_some();
        // Each operand as (batch, batch stride, rows, cols, row stride) in place, or
        // copied to row-major when its strides do not allow that.
        let view = |v: usize, p: &mut Planner| -> Result<(Loc, MatView)> {
            let mut sh = p.shapes[v].clone();
            if sh.len() == 1 {
                sh.insert(0, 1);
            }
            if p.vstrides[v].is_some() {
                let st = p.strides(v);
                let st = if st.len() < sh.len() {
                    [vec![0], st].concat()
                } else {
                    st
                };
                if let Some(mv) = mat_view(&sh, &st) {
                    return Ok((p.raw(v, name)?, mv));
                }
            }
            let l = p.plain(v, name)?;
            let r = sh.len();
            let (rows, cols) = (sh[r - 2], sh[r - 1]);
            Ok((
                l,
                (sh[..r - 2].iter().product(), rows * cols, rows, cols, cols),
            ))
        };
        let (al, (ab, sa, m, k, lda)) = view(x0, &mut *p)?;
        let (bl, (bb, sb, br, bc, ldb)) = view(vb, &mut *p)?;
        let nn = if b_trans { br } else { bc };
        if in_shapes[1].len() == 1 && !b_trans {
            return Err(unsupported(name, "MatMul with a 1-D second operand"));
        }
        if !(ab == bb || ab == 1 || bb == 1) {
            return Err(unsupported(
                name,
                format!(
                    "MatMul broadcasting {:?} × {:?}",
                    in_shapes[0], in_shapes[1]
                ),
            ));
        }
        let batch = ab.max(bb);
        // Written straight into the layout of a sole transposing consumer that keeps
        // the last dim (attention heads merged back), so that transpose is free.
        let o = outs[0];
        let mut y_strides: Option<Vec<usize>> = None;
        if let Some(u) = sole_user[o] {
            if let Op::Transpose { perm } = &g.nodes[u].op {
                let r = perm.len();
                if r == out_shape.len() && perm[r - 1] == r - 1 && !is_output[o] {
                    let tshape: Vec<usize> = perm.iter().map(|&q| out_shape[q]).collect();
                    let ts = contiguous_strides(&tshape);
                    let mut st = vec![0; r];
                    for (d, &q) in perm.iter().enumerate() {
                        st[q] = ts[d];
                    }
                    if mat_view(out_shape, &st).is_some_and(|mv| mv.0 == batch) {
                        y_strides = Some(st);
                    }
                }
            }
        }
        let y = p.output(o, false);
        let (sy, ldy) = match &y_strides {
            Some(st) => {
                let mv = mat_view(out_shape, st).unwrap_or((batch, m * nn, m, nn, nn));
                (mv.1, mv.4)
            }
            None => (m * nn, nn),
        };
        p.vstrides[o] = y_strides;
        p.push(
            name,
            StepKind::MatMul(MatMulStep {
                a: al,
                b: bl,
                y,
                batch,
                m,
                n: nn,
                k,
                a_batch_stride: if ab == 1 { 0 } else { sa },
                b_batch_stride: if bb == 1 { 0 } else { sb },
                b_trans,
                alpha: operand_alpha(&p.alpha_of, folded_t, x0)
                    * operand_alpha(&p.alpha_of, folded_t, n.inputs[1]),
                lda,
                ldb,
                ldy,
                y_batch_stride: sy,
            }),
        );
        Ok(Lowered::Steps)
    }
}
