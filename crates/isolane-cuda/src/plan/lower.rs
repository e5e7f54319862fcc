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
            Op::MaxPool(pa) | Op::AveragePool(pa) => p.lower_pool(c, pa, pat),
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::Path;

    /// The `.rs` modules of a folder, by name (`mod.rs` left out).
    fn modules(dir: &Path) -> BTreeSet<String> {
        std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .filter_map(|e| {
                let name = e.ok()?.file_name().into_string().ok()?;
                let stem = name.strip_suffix(".rs")?;
                (stem != "mod").then(|| stem.to_string())
            })
            .collect()
    }

    /// A family's CUDA side is found by its engine home's name: each module here is named as
    /// one of isolane-engine's `ops/` families, and each family there has one here but those
    /// whose ops never reach a plan (`folded`: computed at import; `volume`: 3-D ops imported
    /// as 2-D ones; `recurrent`: LSTM, GRU and RNN unrolled at import into the other families'
    /// ops).
    #[test]
    fn every_lowering_module_is_named_as_its_engine_family() {
        let here = Path::new(env!("CARGO_MANIFEST_DIR"));
        let cuda = modules(&here.join("src/plan/lower"));
        let engine = modules(&here.join("../isolane-engine/src/ops"));
        let without_cuda_side: BTreeSet<String> = ["folded", "volume", "recurrent"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let stray: Vec<_> = cuda.difference(&engine).collect();
        assert!(stray.is_empty(), "no engine family named {stray:?}");
        let missing: Vec<_> = engine
            .difference(&cuda)
            .filter(|f| !without_cuda_side.contains(*f))
            .collect();
        assert!(
            missing.is_empty(),
            "engine families without a CUDA lowering: {missing:?}"
        );
    }
}
