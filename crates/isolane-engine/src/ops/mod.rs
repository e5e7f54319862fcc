//! Every op's home: one module per op family holds, for its ops, the shape rule (what
//! [`crate::ir::Graph::infer_shapes`] runs), the choice and set-up of the CPU kernel that the
//! reference evaluator and the CPU backend run (`crate::kernels` holds the kernels' loops), and
//! the ONNX import of the op types that become them ([`OnnxOps`]).
//!
//! Shape inference and kernel preparation dispatch to the families through the two matches
//! below, the only places that list every [`Op`]; the ONNX importer gets its op-type table as a
//! value ([`OnnxOps::standard`]), not from a process-wide registry. Adding an op is: one
//! [`Op`] variant, its family's rule and kernel set-up, one arm in each match here and one row
//! in its family's ONNX table. The CUDA lowering (isolane-cuda's `plan.rs`) is still one match
//! of its own; see docs/engine.md.

use crate::error::Result;
use crate::ir::{Node, Op};
use crate::kernels::Kernel;

pub(crate) mod conv;
pub(crate) mod elementwise;
pub(crate) mod index;
pub(crate) mod linear;
pub(crate) mod norm;
pub(crate) mod pool;
pub(crate) mod quant;
pub(crate) mod reduce;
pub(crate) mod resize;
pub(crate) mod shape;

/// Output shapes of one node, by its family's rule (every op but Split has one output).
pub(crate) fn infer(n: &Node, ins: &[&[usize]], batch: usize) -> Result<Vec<Vec<usize>>> {
    let x = ins.first().copied().unwrap_or(&[]);
    let out = match &n.op {
        Op::Split { axis, sizes } => return index::infer_split(n, x, *axis, sizes),
        Op::Conv(a) => conv::infer_conv(n, ins, a)?,
        Op::BatchNorm { .. } => norm::infer_batch_norm(n, ins)?,
        Op::LayerNorm { axis, .. } => norm::infer_layer_norm(n, ins, axis)?,
        Op::Unary(_) | Op::Identity => x.to_vec(),
        Op::Binary(_) => elementwise::infer_binary(n, ins)?,
        Op::MatMul => linear::infer_matmul(n, ins)?,
        Op::Gemm {
            trans_a, trans_b, ..
        } => linear::infer_gemm(n, ins, trans_a, trans_b)?,
        Op::Linear { .. } => linear::infer_linear(n, ins)?,
        Op::MaxPool(p) | Op::AveragePool(p) => pool::infer_pool(n, ins, p)?,
        Op::GlobalAveragePool => pool::infer_global_average(n, x)?,
        Op::AdaptiveAvgPool { output } => pool::infer_adaptive_average(n, x, output)?,
        Op::Flatten { axis } => shape::infer_flatten(n, x, *axis)?,
        Op::Reshape { shape } => shape::infer_reshape(n, x, shape, batch)?,
        Op::Expand { shape } => shape::infer_expand(n, x, shape, batch)?,
        Op::Transpose { perm } => shape::infer_transpose(n, ins, perm)?,
        Op::Unsqueeze { axes } => shape::infer_unsqueeze(n, ins, axes)?,
        Op::Squeeze { axes } => shape::infer_squeeze(n, ins, axes)?,
        Op::Concat { axis } => index::infer_concat(n, ins, axis)?,
        Op::Slice {
            starts,
            ends,
            axes,
            steps,
        } => index::infer_slice(n, x, starts, ends, axes, steps)?,
        Op::Gather {
            axis,
            indices,
            indices_shape,
        } => index::infer_gather(n, ins, axis, indices, indices_shape)?,
        Op::Softmax { axis } => reduce::infer_softmax(n, x, *axis)?,
        Op::Reduce { axes, keepdims, .. } => reduce::infer_reduce(n, ins, axes, keepdims)?,
        Op::Resize(r) => resize::infer_resize(n, ins, r)?,
        Op::FakeQuant(q) => quant::infer_fake_quant(n, x, q)?,
    };
    Ok(vec![out])
}

/// The CPU kernel of `node` for its concrete input and output shapes, by its family.
pub(crate) fn prepare(node: &Node, ins: &[&[usize]], outs: &[&[usize]]) -> Result<Kernel> {
    let x = ins[0];
    let o = outs[0];
    Ok(match &node.op {
        Op::Conv(a) => conv::prepare_conv(ins, outs, a)?,
        Op::BatchNorm { eps } => norm::prepare_batch_norm(x, *eps),
        Op::LayerNorm { axis, eps } => norm::prepare_layer_norm(node, ins, *axis, *eps)?,
        Op::Unary(u) => Kernel::Unary(*u),
        Op::Binary(b) => elementwise::prepare_binary(ins, o, *b),
        Op::Identity => Kernel::Copy,
        Op::Linear { activation } => linear::prepare_linear(ins, *activation),
        Op::MatMul => linear::prepare_matmul(node, ins)?,
        Op::Gemm {
            alpha,
            beta,
            trans_a,
            trans_b,
        } => linear::prepare_gemm(ins, outs, alpha, beta, trans_a, trans_b)?,
        Op::MaxPool(p) | Op::AveragePool(p) => pool::prepare_pool(node, ins, outs, p)?,
        Op::GlobalAveragePool => pool::prepare_global_average(x),
        Op::AdaptiveAvgPool { output } => pool::prepare_adaptive_average(x, output),
        Op::Reshape { .. } | Op::Flatten { .. } | Op::Squeeze { .. } | Op::Unsqueeze { .. } => {
            Kernel::Copy
        }
        Op::Transpose { perm } => shape::prepare_transpose(x, o, perm),
        Op::Expand { .. } => shape::prepare_expand(x, o),
        Op::Slice {
            starts,
            ends,
            axes,
            steps,
        } => index::prepare_slice(node, ins, outs, starts, ends, axes, steps)?,
        Op::Concat { axis } => index::prepare_concat(node, ins, *axis)?,
        Op::Split { axis, .. } => index::prepare_split(node, x, outs, *axis)?,
        Op::Gather { axis, indices, .. } => index::prepare_gather(node, x, *axis, indices)?,
        Op::Softmax { axis } => reduce::prepare_softmax(node, x, *axis)?,
        Op::Reduce { kind, axes, .. } => reduce::prepare_reduce(node, ins, kind, axes)?,
        Op::Resize(r) => resize::prepare_resize(ins, outs, r)?,
        Op::FakeQuant(q) => quant::prepare_fake_quant(node, x, q)?,
    })
}
