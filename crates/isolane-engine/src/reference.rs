//! The reference evaluator: runs one node, or a whole graph node by node, on tensors it
//! allocates as it goes. It sits below the passes (constant folding evaluates nodes with it)
//! and below every backend (the CPU backend's tests and the CUDA backend's plan check compare
//! against it), and uses only the op kernels (`crate::kernels`), run single-threaded.

use std::sync::Arc;

use crate::error::{EngineError, Result};
use crate::ir::{infer_node, Graph, Node, Tensor, ValueId, ValueKind};
use crate::kernels::{Io, Kernel, RawBuf};

/// Evaluates one node on constant tensors (constant folding, references).
pub fn eval_node(node: &Node, ins: &[&Tensor], batch: usize) -> Result<Vec<Tensor>> {
    let limit = u128::MAX;
    eval_node_within(node, ins, batch, limit)?
        .ok_or_else(|| EngineError::graph(&node.name, "no output within an unlimited size"))
}

/// [`eval_node`], unless the node's outputs and scratch would hold more than `max_elements`
/// f32 elements: `Ok(None)` then, known from the shapes before anything is allocated.
/// Constant folding goes through this, so that a crafted model (a Pad of 1e5, an Expand to a
/// huge shape) cannot make compiling or the footprint check allocate without bound.
pub fn eval_node_within(
    node: &Node,
    ins: &[&Tensor],
    batch: usize,
    max_elements: u128,
) -> Result<Option<Vec<Tensor>>> {
    let in_shapes: Vec<&[usize]> = ins.iter().map(|t| t.shape.as_slice()).collect();
    let out_shapes = infer_node(node, &in_shapes, batch)?;
    let elements = |s: &[usize]| s.iter().fold(1u128, |n, &d| n.saturating_mul(d as u128));
    let out_elements = out_shapes
        .iter()
        .fold(0u128, |n, s| n.saturating_add(elements(s)));
    if out_elements > max_elements {
        return Ok(None);
    }
    if node.op.is_view() {
        return Ok(Some(vec![Tensor {
            shape: out_shapes[0].clone(),
            data: ins[0].data.clone(),
        }]));
    }
    let os: Vec<&[usize]> = out_shapes.iter().map(|s| s.as_slice()).collect();
    let kernel = Kernel::prepare(node, &in_shapes, &os)?;
    if out_elements.saturating_add(kernel.scratch_len(1) as u128) > max_elements {
        return Ok(None);
    }
    let mut outs: Vec<Tensor> = out_shapes
        .iter()
        .map(|s| Tensor::zeros(s.clone()))
        .collect();
    let mut scratch = vec![0.0f32; kernel.scratch_len(1)];
    let in_bufs: Vec<RawBuf> = ins.iter().map(|t| RawBuf::from_const(&t.data)).collect();
    let out_bufs: Vec<RawBuf> = outs
        .iter_mut()
        .map(|t| RawBuf::from_slice(&mut t.data))
        .collect();
    kernel.run(
        &Io {
            ins: &in_bufs,
            outs: &out_bufs,
            scratch: RawBuf::from_slice(&mut scratch),
        },
        1,
    );
    Ok(Some(outs))
}

/// Runs a graph node by node, unoptimised, allocating as it goes: a slow reference used to
/// check the passes and the compiled backends.
pub fn interpret(g: &Graph, batch: usize, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
    interpret_seeing(g, batch, inputs, &mut |_, _| {})
}

/// [`interpret`], showing `see` every value as it becomes known: the inputs and constants
/// first, then each node's outputs (calibration reads the activations this way).
pub fn interpret_seeing(
    g: &Graph,
    batch: usize,
    inputs: &[Tensor],
    see: &mut dyn FnMut(ValueId, &Tensor),
) -> Result<Vec<Tensor>> {
    let shapes = g.infer_shapes(batch)?;
    if inputs.len() != g.inputs.len() {
        return Err(EngineError::InvalidArgument(format!(
            "graph has {} inputs, {} given",
            g.inputs.len(),
            inputs.len()
        )));
    }
    let mut vals: Vec<Option<Arc<Tensor>>> = vec![None; g.values.len()];
    for (&i, t) in g.inputs.iter().zip(inputs) {
        if t.shape != shapes[i] {
            return Err(EngineError::InvalidArgument(format!(
                "input `{}` has shape {:?}, expected {:?}",
                g.values[i].name, t.shape, shapes[i]
            )));
        }
        vals[i] = Some(Arc::new(t.clone()));
    }
    for (i, v) in g.values.iter().enumerate() {
        if let ValueKind::Constant(t) = &v.kind {
            vals[i] = Some(t.clone());
        }
    }
    for (i, t) in vals.iter().enumerate() {
        if let Some(t) = t {
            see(i, t);
        }
    }
    for n in &g.nodes {
        let ins: Vec<Arc<Tensor>> = n
            .inputs
            .iter()
            .map(|&i| {
                vals[i]
                    .clone()
                    .ok_or_else(|| EngineError::graph(&n.name, "input not computed"))
            })
            .collect::<Result<_>>()?;
        let refs: Vec<&Tensor> = ins.iter().map(|t| t.as_ref()).collect();
        let outs = eval_node(n, &refs, batch)?;
        for (&o, t) in n.outputs.iter().zip(outs) {
            see(o, &t);
            vals[o] = Some(Arc::new(t));
        }
    }
    g.outputs
        .iter()
        .map(|&o| {
            vals[o]
                .as_ref()
                .map(|t| t.as_ref().clone())
                .ok_or_else(|| EngineError::graph("<outputs>", "output not computed"))
        })
        .collect()
}
