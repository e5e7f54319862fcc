//! The CUDA lowering, one module per op family, each named as the family's home in
//! isolane-engine's `ops/` (docs/engine.md, "Ops and their homes"): what a node of that family
//! becomes in the plan (its steps, or a view with none). [`Planner::lower_node`] is the one
//! place that lists every `Op` on this side; the plan-wide decisions a family's lowering reads
//! (which transposes fold into a matmul, where attention fuses, which products run quantized)
//! are made before it, in `plan_with` and `Patterns::find`.

use crate::plan::*;

mod conv;
mod elementwise;
mod index;
mod linear;
mod norm;
mod pool;
mod quant;
mod reduce;
mod resize;
mod shape;

impl Planner<'_> {
    /// Lowers the node of `c` (not a view: `lower_view` ran first) by its family.
    pub(in crate::plan) fn lower_node(&mut self, c: &NodeCtx, pat: &Patterns) -> Result<Lowered> {
        let (p, ni, name) = (self, c.ni, c.name);
        match &c.n.op {
            Op::Conv(_) | Op::Linear { .. } if p.quant[ni].is_some() => p.lower_quant_gemm(c, pat),
            Op::Conv(a) => p.lower_conv(c, a),
            Op::Linear { activation } => p.lower_linear(c, activation),
            Op::MatMul if pat.attn_at[ni].is_some() => p.lower_attention(c, pat),
            Op::MatMul => p.lower_matmul(c, pat),
            Op::BatchNorm { eps } => p.lower_batch_norm(c, eps),
            Op::Unary(u) => p.lower_unary(c, u),
            Op::Binary(op) => p.lower_binary(c, pat, op),
            Op::Transpose { perm } => p.lower_transpose(c, perm),
            Op::Expand { .. } => p.lower_expand(c),
            Op::Concat { axis } => p.lower_concat(c, axis),
            Op::Split { axis, sizes } => p.lower_split(c, axis, sizes),
            Op::Slice {
                starts,
                ends,
                axes,
                steps: st,
            } => p.lower_slice(c, starts, ends, axes, st),
            Op::Gather {
                axis,
                indices,
                indices_shape,
            } => p.lower_gather(c, axis, indices, indices_shape),
            Op::LayerNorm { axis, eps } => p.lower_layer_norm(c, axis, eps),
            Op::Softmax { axis } => p.lower_softmax(c, axis),
            Op::MaxPool(pa) | Op::AveragePool(pa) => p.lower_pool(c, pa),
            Op::Resize(r) => p.lower_resize(c, r),
            Op::GlobalAveragePool => p.lower_global_average_pool(c),
            Op::AdaptiveAvgPool { output } => p.lower_adaptive_average_pool(c, output),
            Op::Reduce { kind, axes, .. } => p.lower_reduce(c, *kind, axes),
            Op::FakeQuant(q) => p.lower_fake_quant(c, q),
            other => Err(unsupported(
                name,
                format!("op {} is not implemented on cuda yet", other.name()),
            )),
        }
    }
}
