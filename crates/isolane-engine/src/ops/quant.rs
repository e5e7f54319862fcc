//! `Op::FakeQuant`: ONNX's `DequantizeLinear(QuantizeLinear(x))` with one set of parameters
//! (the arithmetic is `crate::quant`).
//!
//! ONNX: the QDQ and QOperator op types; their import is [`import`], which also holds the
//! quantization state the importer keeps for every node.

use std::sync::Arc;

use crate::error::Result;
use crate::ir::{shape_err, DType, FakeQuantAttrs, Node, ValueType};
use crate::kernels::{unsupported, Kernel};
use crate::onnx::import::{Ctx, Importer, Val};
use crate::onnx::Result as OnnxResult;
use crate::ops::ImportFn;

pub(crate) mod import;

/// The shape rule of `Op::FakeQuant(q)`: the input's shape, once the parameters fit it.
pub(crate) fn infer_fake_quant(n: &Node, x: &[usize], q: &FakeQuantAttrs) -> Result<Vec<usize>> {
    q.layout(x).map_err(|m| shape_err(n, m))?;
    Ok(x.to_vec())
}

/// The type rule of `Op::FakeQuant(q)`: an f32 value on `q`'s grid (each element is
/// `(k - zero point) · scale` for a `k` of `q`'s element type), its parameters shared.
pub(crate) fn output_type(q: &FakeQuantAttrs) -> ValueType {
    ValueType {
        dtype: DType::F32,
        quant: Some(Arc::new(q.clone())),
    }
}

/// The CPU kernel of `Op::FakeQuant(q)`; its scales are indexed by element.
pub(crate) fn prepare_fake_quant(node: &Node, x: &[usize], q: &FakeQuantAttrs) -> Result<Kernel> {
    q.layout(x).map_err(|m| unsupported(node, m))?;
    Ok(Kernel::FakeQuant {
        attrs: Arc::new(q.clone()),
        shape: x.to_vec(),
    })
}

/// The ONNX op types of quantized models: QDQ pairs and the QOperator ops (also in the
/// com.microsoft domain), imported by [`import`].
pub(crate) const ONNX: &[(&str, ImportFn)] = &[
    ("QuantizeLinear", import_quantize_linear),
    ("DequantizeLinear", import_dequantize_linear),
    ("QLinearConv", import_qoperator),
    ("QLinearMatMul", import_qoperator),
    ("ConvInteger", import_qoperator),
    ("MatMulInteger", import_qoperator),
    ("DynamicQuantizeLinear", import_qoperator),
    ("QLinearAdd", import_qoperator),
    ("QLinearMul", import_qoperator),
    ("QLinearGlobalAveragePool", import_qoperator),
    ("QLinearConcat", import_qoperator),
    ("QLinearLeakyRelu", import_qoperator),
    ("QLinearSigmoid", import_qoperator),
    ("QLinearSoftmax", import_qoperator),
    ("QGemm", import_qoperator),
];

fn import_quantize_linear(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
    im.quantize_linear(c)
}

fn import_dequantize_linear(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
    im.dequantize_linear(c)
}

fn import_qoperator(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
    im.qoperator(c, c.op())
}
