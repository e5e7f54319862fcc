//! `Op::FakeQuant`: ONNX's `DequantizeLinear(QuantizeLinear(x))` with one set of parameters
//! (the arithmetic is `crate::quant`).

use std::sync::Arc;

use crate::error::Result;
use crate::ir::{shape_err, FakeQuantAttrs, Node};
use crate::kernels::{unsupported, Kernel};

/// The shape rule of `Op::FakeQuant(q)`: the input's shape, once the parameters fit it.
pub(crate) fn infer_fake_quant(n: &Node, x: &[usize], q: &FakeQuantAttrs) -> Result<Vec<usize>> {
    q.layout(x).map_err(|m| shape_err(n, m))?;
    Ok(x.to_vec())
}

/// The CPU kernel of `Op::FakeQuant(q)`; its scales are indexed by element.
pub(crate) fn prepare_fake_quant(node: &Node, x: &[usize], q: &FakeQuantAttrs) -> Result<Kernel> {
    q.layout(x).map_err(|m| unsupported(node, m))?;
    Ok(Kernel::FakeQuant {
        attrs: Arc::new(q.clone()),
        shape: x.to_vec(),
    })
}
