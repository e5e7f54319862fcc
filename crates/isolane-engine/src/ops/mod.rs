//! Every op's home: one module per op family holds, for its ops, the shape rule (what
//! [`crate::ir::Graph::infer_shapes`] runs), the choice and set-up of the CPU kernel that the
//! reference evaluator and the CPU backend run (`crate::kernels` holds the kernels' loops), and
//! the ONNX import of the op types that become them ([`OnnxOps`]).
//!
//! Shape inference and kernel preparation dispatch to the families through the two matches
//! below, the only places that list every [`Op`]; the ONNX importer gets its op-type table as a
//! value ([`OnnxOps::standard`]), not from a process-wide registry. Adding an op is: one
//! [`Op`] variant, its family's rule and kernel set-up, one arm in each match here, one row
//! in its family's ONNX table, and its encoding in saved plans (`crate::saved`). The CUDA
//! lowering has a module per family too (isolane-cuda's `plan/lower/<family>.rs`, dispatched
//! by `Planner::lower_node`); see docs/engine.md.

use std::collections::HashMap;

use crate::error::Result;
use crate::ir::{DType, Node, Op, ValueType};
use crate::kernels::Kernel;
use crate::onnx::import::{Ctx, Importer, Val};
use crate::onnx::Result as OnnxResult;

pub(crate) mod conv;
pub(crate) mod elementwise;
pub(crate) mod folded;
pub(crate) mod index;
pub(crate) mod linear;
pub(crate) mod norm;
pub(crate) mod pool;
pub(crate) mod quant;
pub(crate) mod recurrent;
pub(crate) mod reduce;
pub(crate) mod resize;
pub(crate) mod shape;
pub(crate) mod volume;

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

/// The types of a node's outputs, by its family's type rule, from its inputs' types (what
/// the graph builder records and `Graph::validate` checks). Every backend computes in f32, so
/// every op takes f32 values (a quantized value is one, on its grid); a family whose outputs
/// differ from plain f32 has an arm here (today: `FakeQuant`, whose output is on a grid).
pub(crate) fn value_types(
    op: &Op,
    ins: &[&ValueType],
) -> std::result::Result<Vec<ValueType>, String> {
    if let Some((i, t)) = ins.iter().enumerate().find(|(_, t)| t.dtype != DType::F32) {
        return Err(format!(
            "input {i} is {t}; {} takes float32 values only (every backend computes in f32)",
            op.name()
        ));
    }
    Ok(match op {
        Op::FakeQuant(q) => vec![quant::output_type(q)],
        _ => vec![ValueType::F32; op.num_outputs()],
    })
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

/// Each family's ONNX rows; an op type is in one family only (a unit test checks it).
const ONNX_FAMILIES: [&[(&str, ImportFn)]; 12] = [
    folded::ONNX,
    elementwise::ONNX,
    conv::ONNX,
    norm::ONNX,
    pool::ONNX,
    linear::ONNX,
    shape::ONNX,
    index::ONNX,
    reduce::ONNX,
    resize::ONNX,
    quant::ONNX,
    recurrent::ONNX,
];

/// How a family imports one ONNX node: it reads the node's inputs and attributes through the
/// importer and returns its outputs (IR nodes it added, or values computed at import).
pub(crate) type ImportFn = fn(&mut Importer<'_>, &Ctx<'_>) -> OnnxResult<Vec<Val>>;

/// The importer's op table: each ONNX op type (the default domain's, and the quantized ops
/// onnxruntime also writes in com.microsoft's) with its family's import function. A value, not a registry: [`OnnxOps::standard`] lists every family's rows, and a
/// caller may add or replace rows before handing it to the importer
/// (`crate::onnx::import::import_with_ops`). Opset differences are the import function's own
/// (it reads the model's opset), so one op type has one row.
#[derive(Clone)]
pub(crate) struct OnnxOps {
    by_type: HashMap<&'static str, ImportFn>,
}

impl OnnxOps {
    /// Every op type isolane imports, from the families' tables.
    pub(crate) fn standard() -> OnnxOps {
        let mut ops = OnnxOps {
            by_type: HashMap::new(),
        };
        for &(op_type, import) in ONNX_FAMILIES.iter().flat_map(|f| f.iter()) {
            ops = ops.with(op_type, import);
        }
        ops
    }

    /// This table with `op_type` imported by `import` (replacing any earlier row).
    pub(crate) fn with(mut self, op_type: &'static str, import: ImportFn) -> OnnxOps {
        self.by_type.insert(op_type, import);
        self
    }

    /// The import function of `op_type`, if the table has one.
    pub(crate) fn get(&self, op_type: &str) -> Option<ImportFn> {
        self.by_type.get(op_type).copied()
    }
}

/// One-graph ONNX models built in memory for the families' import tests: nodes on a float
/// input `x` of fixed shape, imported and run on the CPU backend and the reference evaluator.
#[cfg(test)]
pub(crate) mod testing {
    use std::path::Path;

    use crate::backend::{Backend, Precision};
    use crate::ir::Tensor;
    use crate::onnx::proto::{
        attribute_proto::AttributeType, tensor_proto::DataType, tensor_shape_proto, type_proto,
        AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorProto,
        TensorShapeProto, TypeProto, ValueInfoProto,
    };
    use crate::onnx::OnnxModel;

    pub(crate) fn node(op: &str, ins: &[&str], out: &str) -> NodeProto {
        NodeProto {
            name: Some(format!("{op}_{out}")),
            op_type: Some(op.into()),
            input: ins.iter().map(|s| s.to_string()).collect(),
            output: vec![out.into()],
            ..Default::default()
        }
    }

    pub(crate) fn with_int(mut n: NodeProto, name: &str, v: i64) -> NodeProto {
        n.attribute.push(AttributeProto {
            name: Some(name.into()),
            i: Some(v),
            r#type: Some(AttributeType::Int as i32),
            ..Default::default()
        });
        n
    }

    pub(crate) fn with_ints(mut n: NodeProto, name: &str, v: &[i64]) -> NodeProto {
        n.attribute.push(AttributeProto {
            name: Some(name.into()),
            ints: v.to_vec(),
            r#type: Some(AttributeType::Ints as i32),
            ..Default::default()
        });
        n
    }

    pub(crate) fn ints(name: &str, dims: &[i64], v: &[i64]) -> TensorProto {
        TensorProto {
            name: Some(name.into()),
            dims: dims.to_vec(),
            data_type: Some(DataType::Int64 as i32),
            int64_data: v.to_vec(),
            ..Default::default()
        }
    }

    pub(crate) fn floats(name: &str, dims: &[i64], v: &[f32]) -> TensorProto {
        TensorProto {
            name: Some(name.into()),
            dims: dims.to_vec(),
            data_type: Some(DataType::Float as i32),
            float_data: v.to_vec(),
            ..Default::default()
        }
    }

    /// A float value of `dims`, dimension 0 the batch (named, any size) if `batched`.
    fn info(name: &str, dims: &[usize], batched: bool) -> ValueInfoProto {
        use tensor_shape_proto::dimension::Value;
        let dim = dims
            .iter()
            .enumerate()
            .map(|(i, &d)| tensor_shape_proto::Dimension {
                value: Some(if batched && i == 0 {
                    Value::DimParam("batch".into())
                } else {
                    Value::DimValue(d as i64)
                }),
                ..Default::default()
            })
            .collect();
        ValueInfoProto {
            name: Some(name.into()),
            r#type: Some(TypeProto {
                value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                    elem_type: Some(DataType::Float as i32),
                    shape: Some(TensorShapeProto { dim }),
                })),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// Imports `nodes` (opset 17) on input `x` of `shape` and runs them on `x`, on the CPU
    /// backend and the reference evaluator (which must agree): output `y`, or the import's
    /// error as text.
    pub(crate) fn run(
        nodes: Vec<NodeProto>,
        initializer: Vec<TensorProto>,
        shape: &[usize],
        x: &[f32],
    ) -> Result<Tensor, String> {
        let g = import(nodes, initializer, shape, false)?;
        let feed = Tensor::new(shape.to_vec(), x.to_vec()).unwrap();
        let reference = crate::reference::interpret(&g, shape[0], &[feed]).unwrap();
        let mut cpu = crate::CpuBackend::new(1)
            .compile(&g, shape[0], Precision::Fp32)
            .unwrap();
        cpu.input_mut().copy_from_slice(x);
        cpu.run().unwrap();
        let out = Tensor::new(cpu.output_shape_at(0).to_vec(), cpu.output().to_vec()).unwrap();
        assert_eq!(out.shape, reference[0].shape);
        for (a, b) in out.data.iter().zip(&reference[0].data) {
            assert!(
                a == b || (a.is_nan() && b.is_nan()),
                "cpu {a} vs reference {b}"
            );
        }
        Ok(out)
    }

    /// The graph of [`run`]'s model, `x`'s dimension 0 a named batch if `batched`.
    pub(crate) fn import(
        nodes: Vec<NodeProto>,
        initializer: Vec<TensorProto>,
        shape: &[usize],
        batched: bool,
    ) -> Result<crate::ir::Graph, String> {
        let m = ModelProto {
            ir_version: Some(8),
            opset_import: vec![OperatorSetIdProto {
                domain: Some(String::new()),
                version: Some(17),
            }],
            graph: Some(GraphProto {
                name: Some("g".into()),
                node: nodes,
                initializer,
                input: vec![info("x", shape, batched)],
                output: vec![ValueInfoProto {
                    name: Some("y".into()),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        let m = OnnxModel::from_proto(m, Path::new("t.onnx")).map_err(|e| e.to_string())?;
        crate::onnx::import(&m).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::ir::{Dim, Graph, Unary};
    use crate::onnx::import::import_with_ops;
    use crate::onnx::proto::{
        tensor_proto::DataType, tensor_shape_proto, type_proto, GraphProto, ModelProto, NodeProto,
        OperatorSetIdProto, TensorShapeProto, TypeProto, ValueInfoProto,
    };
    use crate::onnx::OnnxModel;
    use crate::quant::{FakeQuantAttrs, Granularity, QuantType};

    /// The op types the importer knew when its one match became the families' tables.
    const KNOWN: &[&str] = &[
        "Abs",
        "Add",
        "And",
        "AveragePool",
        "BatchNormalization",
        "Cast",
        "CastLike",
        "Ceil",
        "Clip",
        "Col2Im",
        "Concat",
        "Constant",
        "ConstantOfShape",
        "Conv",
        "ConvInteger",
        "ConvTranspose",
        "Cos",
        "CumSum",
        "DequantizeLinear",
        "Div",
        "Dropout",
        "DynamicQuantizeLinear",
        "Einsum",
        "Equal",
        "Erf",
        "Exp",
        "Expand",
        "Flatten",
        "Floor",
        "Gather",
        "GatherND",
        "Gelu",
        "Gemm",
        "GlobalAveragePool",
        "GlobalMaxPool",
        "Greater",
        "GreaterOrEqual",
        "GRU",
        "GroupNormalization",
        "HardSigmoid",
        "HardSwish",
        "Identity",
        "InstanceNormalization",
        "IsNaN",
        "LayerNormalization",
        "LeakyRelu",
        "Less",
        "LessOrEqual",
        "LRN",
        "LSTM",
        "Log",
        "MatMul",
        "MatMulInteger",
        "Max",
        "MaxPool",
        "Mean",
        "Min",
        "Mod",
        "Mul",
        "Neg",
        "Not",
        "OneHot",
        "Or",
        "PRelu",
        "Pad",
        "Pow",
        "QGemm",
        "QLinearAdd",
        "QLinearConcat",
        "QLinearConv",
        "QLinearGlobalAveragePool",
        "QLinearLeakyRelu",
        "QLinearMatMul",
        "QLinearMul",
        "QLinearSigmoid",
        "QLinearSoftmax",
        "QuantizeLinear",
        "Range",
        "Reciprocal",
        "ReduceL1",
        "ReduceL2",
        "ReduceMax",
        "ReduceMean",
        "ReduceMin",
        "ReduceSum",
        "ReduceSumSquare",
        "Relu",
        "Reshape",
        "Resize",
        "RNN",
        "ScatterElements",
        "ScatterND",
        "Shape",
        "Sigmoid",
        "Sin",
        "Size",
        "Slice",
        "Softmax",
        "Split",
        "Sqrt",
        "Squeeze",
        "Sub",
        "Sum",
        "Tanh",
        "Tile",
        "Transpose",
        "Unsqueeze",
        "Upsample",
        "Where",
    ];

    #[test]
    fn every_known_op_type_has_one_row_in_one_family() {
        let ops = OnnxOps::standard();
        for op in KNOWN {
            assert!(ops.get(op).is_some(), "{op} has no import function");
        }
        let rows: usize = ONNX_FAMILIES.iter().map(|f| f.len()).sum();
        // A row in two families would replace the first one's silently.
        assert_eq!(
            rows,
            KNOWN.len(),
            "an op type has rows in two families, or a new one"
        );
        assert_eq!(ops.by_type.len(), KNOWN.len());
        assert!(ops.get("NonMaxSuppression").is_none());
    }

    /// A model of one node of type `op` on `x [1, 4]`.
    fn one_node(op: &str) -> OnnxModel {
        let dim = |d: i64| tensor_shape_proto::Dimension {
            value: Some(tensor_shape_proto::dimension::Value::DimValue(d)),
            ..Default::default()
        };
        let x = ValueInfoProto {
            name: Some("x".into()),
            r#type: Some(TypeProto {
                value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                    elem_type: Some(DataType::Float as i32),
                    shape: Some(TensorShapeProto {
                        dim: vec![dim(1), dim(4)],
                    }),
                })),
                ..Default::default()
            }),
            ..Default::default()
        };
        let m = ModelProto {
            ir_version: Some(8),
            opset_import: vec![OperatorSetIdProto {
                domain: Some(String::new()),
                version: Some(17),
            }],
            graph: Some(GraphProto {
                name: Some("g".into()),
                node: vec![NodeProto {
                    name: Some("n".into()),
                    op_type: Some(op.into()),
                    input: vec!["x".into()],
                    output: vec!["y".into()],
                    ..Default::default()
                }],
                input: vec![x],
                output: vec![ValueInfoProto {
                    name: Some("y".into()),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        OnnxModel::from_proto(m, Path::new("one.onnx")).unwrap()
    }

    /// The table is a value: a caller's row reaches its importer only.
    #[test]
    fn a_caller_adds_an_op_type_to_its_own_table() {
        fn swish(im: &mut Importer, c: &Ctx) -> OnnxResult<Vec<Val>> {
            im.emit1(c, Op::Unary(Unary::Silu), 1)
        }
        let m = one_node("Swish");
        let e = import_with_ops(&m, m.initializers.clone(), OnnxOps::standard())
            .unwrap_err()
            .to_string();
        assert!(e.contains("Swish"), "{e}");
        let ops = OnnxOps::standard().with("Swish", swish);
        let g = import_with_ops(&m, m.initializers.clone(), ops).unwrap();
        assert_eq!(g.nodes.len(), 1);
        assert_eq!(g.nodes[0].op, Op::Unary(Unary::Silu));
        assert!(crate::onnx::import(&m).is_err());
        // A replaced row is the one used.
        let ops = OnnxOps::standard().with("Relu", swish);
        let g = import_with_ops(&one_node("Relu"), Default::default(), ops).unwrap();
        assert_eq!(g.nodes[0].op, Op::Unary(Unary::Silu));
    }

    /// The builder types each value by its op's rule, and `validate` checks every type.
    #[test]
    fn values_are_typed_by_their_ops_rule_and_validated() {
        let q = FakeQuantAttrs {
            qtype: QuantType::Int8,
            saturate: true,
            granularity: Granularity::PerTensor,
            scales: vec![0.5],
            zero_points: vec![0.0],
        };
        let mut g = Graph::new("t");
        let x = g.add_input("x", vec![Dim::Batch, Dim::Fixed(4)]);
        let f = g.add_op("fq", Op::FakeQuant(q.clone()), &[x]).unwrap();
        let r = g.add_op("relu", Op::Unary(Unary::Relu), &[f]).unwrap();
        g.add_output(r).unwrap();
        assert_eq!(g.values[x].ty, ValueType::F32);
        assert_eq!(g.values[f].ty.dtype, DType::F32);
        assert_eq!(g.values[f].ty.quant.as_deref(), Some(&q));
        assert_eq!(g.values[r].ty, ValueType::F32);
        g.validate().unwrap();
        // A type other than the rule's is refused, naming the node.
        let mut bad = g.clone();
        bad.values[f].ty = ValueType::F32;
        let e = bad.validate().unwrap_err().to_string();
        assert!(e.contains("`fq`") && e.contains("is typed float32"), "{e}");
        // A value of another element type: no op takes it, in the builder or in validate.
        let mut bad = g.clone();
        bad.values[x].ty.dtype = DType::Int64;
        let e = bad.validate().unwrap_err().to_string();
        assert!(
            e.contains("input 0 is int64") && e.contains("float32 values only"),
            "{e}"
        );
        let e = bad
            .add_op("neg", Op::Unary(Unary::Neg), &[x])
            .unwrap_err()
            .to_string();
        assert!(e.contains("input 0 is int64"), "{e}");
    }
}
