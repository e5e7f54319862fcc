//! How much memory running a graph at a batch size needs at the least, known before anything is
//! allocated: so that a batch no machine can hold is refused with a message instead of an
//! allocation that aborts the process.

use crate::error::Result;
use crate::ir::{Graph, ValueId, ValueKind};
use crate::passes;

/// What a graph needs at one batch size, in f32 elements (multiply by the element size of the
/// precision for bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Footprint {
    /// Elements of every graph input (the batch the caller fills).
    pub input_elements: u128,
    /// Elements of every graph output.
    pub output_elements: u128,
    /// A lower bound on the activation arena: the graph inputs (alive for the whole run) plus
    /// the largest, over the optimised graph's nodes, of the elements that node reads and writes
    /// outside the inputs and the weights. All of those are alive at once while the node runs,
    /// so any memory plan holds at least this much; the CPU backend's plan holds exactly its
    /// arena, which is at least this.
    pub min_activation_elements: u128,
}

/// The footprint of `g` compiled for `batch`, from its optimised graph's shapes (the graph the
/// backends plan): shape arithmetic only, nothing of the batch's size is allocated.
pub fn footprint(g: &Graph, batch: usize) -> Result<Footprint> {
    // The passes do not depend on the batch (only the shapes do): optimise at batch 1, the
    // cheapest, then take the shapes at the real batch.
    let opt = passes::optimize(g, 1)?;
    let shapes = opt.infer_shapes(batch)?;
    let elements = |v: ValueId| -> u128 {
        shapes[v]
            .iter()
            .fold(1u128, |n, &d| n.saturating_mul(d as u128))
    };
    let storage = storage_roots(&opt);
    let is_input = |v: ValueId| opt.inputs.contains(&storage[v]);
    let input_elements: u128 = opt.inputs.iter().map(|&v| elements(v)).sum();
    let output_elements: u128 = opt.outputs.iter().map(|&v| elements(v)).sum();
    let mut busiest: u128 = 0;
    for n in opt.nodes.iter().filter(|n| !n.op.is_view()) {
        let mut roots: Vec<ValueId> = n
            .inputs
            .iter()
            .chain(&n.outputs)
            .map(|&v| storage[v])
            .filter(|&v| !is_input(v) && !matches!(opt.values[v].kind, ValueKind::Constant(_)))
            .collect();
        roots.sort_unstable();
        roots.dedup();
        busiest = busiest.max(roots.iter().map(|&v| elements(v)).sum());
    }
    Ok(Footprint {
        input_elements,
        output_elements,
        min_activation_elements: input_elements.saturating_add(busiest),
    })
}

/// For every value, the value whose storage it shares: a view (reshape, flatten, ...) shares its
/// input's, as the backends alias it; any other value is its own.
fn storage_roots(g: &Graph) -> Vec<ValueId> {
    let mut root: Vec<ValueId> = (0..g.values.len()).collect();
    for n in &g.nodes {
        if n.op.is_view() {
            if let (Some(&out), Some(&src)) = (n.outputs.first(), n.inputs.first()) {
                root[out] = root[src];
            }
        }
    }
    root
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{CompiledModel, Precision};
    use crate::{build_model, CpuBackend, Weights};

    #[test]
    fn the_floor_is_below_the_cpu_arena_and_grows_with_the_batch() {
        let g = build_model("mobilenet_v2", Weights::Zeros).unwrap();
        let one = footprint(&g, 1).unwrap();
        assert_eq!(one.input_elements, 3 * 224 * 224);
        assert_eq!(one.output_elements, 1000);
        let m = CpuBackend::new(1)
            .compile_cpu(&g, 2, Precision::Fp32)
            .unwrap();
        let two = footprint(&g, 2).unwrap();
        assert!(
            two.min_activation_elements * 4 <= m.arena_bytes() as u128,
            "floor {} elements, arena {} bytes",
            two.min_activation_elements,
            m.arena_bytes()
        );
        // More than the input alone: the busiest node's tensors count.
        assert!(two.min_activation_elements > two.input_elements);
        let big = footprint(&g, 100_000).unwrap();
        assert_eq!(big.input_elements, 100_000 * one.input_elements);
        assert!(big.min_activation_elements >= 100_000 * one.input_elements * 2);
    }
}
