//! How much memory running a graph at a batch size needs at the least, known before anything is
//! allocated: so that a batch no machine can hold is refused with a message instead of an
//! allocation that aborts the process.

use crate::error::Result;
use crate::ir::{Graph, ValueId, ValueKind};
use crate::passes;

/// What a graph needs at one batch size, in f32 elements (multiply by the element size of the
/// precision for bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
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
    /// The node that makes the floor (the busiest one), for messages; `None` for a graph
    /// whose nodes read and write nothing outside its inputs and weights.
    pub busiest: Option<Busiest>,
}

/// The node whose tensors, alive at once, make [`Footprint::min_activation_elements`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Busiest {
    /// The node's name; an ONNX import gives every node it makes the ONNX node's name.
    pub node: String,
    /// The engine op it runs (a Pad is imported as Concat and Expand nodes).
    pub op: &'static str,
    /// The elements it reads and writes outside the graph inputs and the weights.
    pub elements: u128,
    /// The shape of the largest of those tensors.
    pub largest_shape: Vec<usize>,
}

impl Busiest {
    /// The elements of its largest tensor.
    pub fn largest_elements(&self) -> u128 {
        self.largest_shape
            .iter()
            .fold(1u128, |n, &d| n.saturating_mul(d as u128))
    }

    /// `node "pad" (Concat), whose largest tensor is 1 × 3 × 200008 × 200008`, for messages.
    pub fn describe(&self) -> String {
        let shape: Vec<String> = self.largest_shape.iter().map(|d| d.to_string()).collect();
        format!(
            "node {:?} ({}), whose largest tensor is {}",
            self.node,
            self.op,
            shape.join(" × ")
        )
    }
}

/// The footprint of `g` compiled for `batch`, from its optimised graph's shapes (the graph the
/// backends plan): shape arithmetic, nothing of the activations' size is allocated. The passes
/// run at `batch`, as a backend's compile runs them: a node whose inputs are all constants is
/// folded only within the passes' bounds ([`passes::MAX_FOLD_NODE_ELEMENTS`],
/// [`passes::fold_budget`]); past them it stays a node, and its output counts here.
pub fn footprint(g: &Graph, batch: usize) -> Result<Footprint> {
    let opt = passes::optimize(g, batch)?;
    let shapes = opt.infer_shapes(batch)?;
    let elements = |v: ValueId| -> u128 {
        shapes[v]
            .iter()
            .fold(1u128, |n, &d| n.saturating_mul(d as u128))
    };
    let storage = storage_roots(&opt);
    let is_input = |v: ValueId| opt.inputs.contains(&storage[v]);
    let sum = |vs: &[ValueId]| vs.iter().fold(0u128, |n, &v| n.saturating_add(elements(v)));
    let input_elements = sum(&opt.inputs);
    let output_elements = sum(&opt.outputs);
    let mut busiest: Option<Busiest> = None;
    // A view that aliases its input holds nothing of its own.
    let aliased = |n: &&crate::ir::Node| n.outputs.first().is_some_and(|&o| storage[o] != o);
    for n in opt.nodes.iter().filter(|n| !aliased(n)) {
        let mut roots: Vec<ValueId> = n
            .inputs
            .iter()
            .chain(&n.outputs)
            .map(|&v| storage[v])
            .filter(|&v| !is_input(v) && !matches!(opt.values[v].kind, ValueKind::Constant(_)))
            .collect();
        roots.sort_unstable();
        roots.dedup();
        let here = sum(&roots);
        if here > busiest.as_ref().map_or(0, |b| b.elements) {
            let largest = roots.iter().copied().max_by_key(|&v| elements(v));
            busiest = Some(Busiest {
                node: n.name.clone(),
                op: n.op.name(),
                elements: here,
                largest_shape: largest.map(|v| shapes[v].clone()).unwrap_or_default(),
            });
        }
    }
    let floor = busiest.as_ref().map_or(0, |b| b.elements);
    Ok(Footprint {
        input_elements,
        output_elements,
        min_activation_elements: input_elements.saturating_add(floor),
        busiest,
    })
}

/// For every value, the value whose storage it shares: a view (reshape, flatten, ...) of an
/// activation shares its input's, as the backends alias it; any other value is its own (a view
/// of a constant too large to fold is a copy into the arena).
fn storage_roots(g: &Graph) -> Vec<ValueId> {
    let mut root: Vec<ValueId> = (0..g.values.len()).collect();
    for n in &g.nodes {
        if let (true, Some(&out), Some(&src)) =
            (n.op.is_view(), n.outputs.first(), n.inputs.first())
        {
            if !matches!(g.values[root[src]].kind, ValueKind::Constant(_)) {
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
