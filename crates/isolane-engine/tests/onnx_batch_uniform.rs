//! A ConstantOfShape whose shape holds the batch size (PyTorch's classic export of
//! `torch.zeros(x.shape[0], h, w)`, edgenext's positional encoding): held with one row,
//! computed row by row and broadcast where it meets the activations; refused by name where an
//! op would not treat its rows alike.

use std::path::Path;

use isolane_engine::onnx::proto::{
    attribute_proto::AttributeType, tensor_proto::DataType, tensor_shape_proto, type_proto,
    AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorProto,
    TensorShapeProto, TypeProto, ValueInfoProto,
};
use isolane_engine::onnx::{import, OnnxModel};
use isolane_engine::{Backend, CpuBackend, Precision};

/// A float tensor value of shape `[batch, dims...]` (the batch a named, dynamic dimension).
fn batched(name: &str, dims: &[i64]) -> ValueInfoProto {
    let batch = tensor_shape_proto::Dimension {
        value: Some(tensor_shape_proto::dimension::Value::DimParam(
            "batch".into(),
        )),
        ..Default::default()
    };
    let rest = dims.iter().map(|&d| tensor_shape_proto::Dimension {
        value: Some(tensor_shape_proto::dimension::Value::DimValue(d)),
        ..Default::default()
    });
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(DataType::Float as i32),
                shape: Some(TensorShapeProto {
                    dim: std::iter::once(batch).chain(rest).collect(),
                }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn ints(name: &str, dims: &[i64], values: &[i64]) -> TensorProto {
    TensorProto {
        name: Some(name.into()),
        dims: dims.to_vec(),
        data_type: Some(DataType::Int64 as i32),
        int64_data: values.to_vec(),
        ..Default::default()
    }
}

fn node(op: &str, inputs: &[&str], output: &str) -> NodeProto {
    NodeProto {
        name: Some(output.into()),
        op_type: Some(op.into()),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: vec![output.into()],
        ..Default::default()
    }
}

fn with_int(mut n: NodeProto, name: &str, v: i64) -> NodeProto {
    n.attribute.push(AttributeProto {
        name: Some(name.into()),
        i: Some(v),
        r#type: Some(AttributeType::Int as i32),
        ..Default::default()
    });
    n
}

/// `x [B, 4, 3, 3]`; `ones = ConstantOfShape([B, 3, 3], 1.0)`, `cs = CumSum(ones, axis 2)`
/// (1, 2, 3 along the width), then `tail` (nodes reading `cs`) and the output `y`.
fn model(tail: Vec<NodeProto>, y: ValueInfoProto) -> ModelProto {
    let one = TensorProto {
        dims: vec![1],
        data_type: Some(DataType::Float as i32),
        float_data: vec![1.0],
        ..Default::default()
    };
    let mut cos = node("ConstantOfShape", &["shape"], "ones");
    cos.attribute.push(AttributeProto {
        name: Some("value".into()),
        t: Some(one),
        r#type: Some(AttributeType::Tensor as i32),
        ..Default::default()
    });
    let mut nodes = vec![
        node("Shape", &["x"], "s"),
        with_int(node("Gather", &["s", "zero"], "b"), "axis", 0),
        node("Unsqueeze", &["b", "axes0"], "b1"),
        with_int(node("Concat", &["b1", "hw"], "shape"), "axis", 0),
        cos,
        node("CumSum", &["ones", "two"], "cs"),
    ];
    nodes.extend(tail);
    ModelProto {
        ir_version: Some(8),
        opset_import: vec![OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(17),
        }],
        graph: Some(GraphProto {
            name: Some("g".into()),
            node: nodes,
            initializer: vec![
                ints("zero", &[], &[0]),
                ints("axes0", &[1], &[0]),
                ints("axes1", &[1], &[1]),
                ints("hw", &[2], &[3, 3]),
                ints("two", &[], &[2]),
            ],
            input: vec![batched("x", &[4, 3, 3])],
            output: vec![y],
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn import_model(m: ModelProto) -> Result<isolane_engine::ir::Graph, String> {
    let m = OnnxModel::from_proto(m, Path::new("uniform.onnx")).map_err(|e| e.to_string())?;
    import(&m).map_err(|e| e.to_string())
}

#[test]
fn a_constant_the_size_of_the_batch_is_computed_once_and_broadcast_to_every_row() {
    let tail = vec![
        node("Unsqueeze", &["cs", "axes1"], "u"),
        node("Add", &["x", "u"], "y"),
    ];
    let g = import_model(model(tail, batched("y", &[4, 3, 3]))).unwrap();
    for batch in [1, 3] {
        let mut m = CpuBackend::new(1)
            .compile(&g, batch, Precision::Fp32)
            .unwrap();
        let x: Vec<f32> = (0..m.input_mut().len()).map(|i| i as f32 * 0.5).collect();
        m.input_mut().copy_from_slice(&x);
        m.run().unwrap();
        assert_eq!(m.output().len(), batch * 36);
        for (i, (&y, &x)) in m.output().iter().zip(&x).enumerate() {
            let w = (i % 3) as f32;
            assert_eq!(y, x + w + 1.0, "element {i} at batch {batch}");
        }
    }
}

#[test]
fn an_op_that_mixes_its_rows_is_refused_by_name() {
    let tail = vec![
        node("ReduceSum", &["cs", "axes0"], "r"),
        node("Add", &["x", "r"], "y"),
    ];
    let e = import_model(model(tail, batched("y", &[4, 3, 3]))).unwrap_err();
    assert!(
        e.contains("ReduceSum") && e.contains("ConstantOfShape"),
        "{e}"
    );
    assert!(e.contains("\"cs\""), "{e}");
}

#[test]
fn a_transpose_that_moves_the_batch_is_refused() {
    let mut t = node("Transpose", &["cs"], "t");
    t.attribute.push(AttributeProto {
        name: Some("perm".into()),
        ints: vec![1, 0, 2],
        r#type: Some(AttributeType::Ints as i32),
        ..Default::default()
    });
    let tail = vec![t, node("Add", &["x", "t"], "y")];
    let e = import_model(model(tail, batched("y", &[4, 3, 3]))).unwrap_err();
    assert!(
        e.contains("Transpose") && e.contains("ConstantOfShape"),
        "{e}"
    );
}

#[test]
fn an_output_built_only_from_it_is_refused() {
    let tail = vec![node("Identity", &["cs"], "y")];
    let e = import_model(model(tail, batched("y", &[3, 3]))).unwrap_err();
    assert!(
        e.contains("graph output \"y\"") && e.contains("ConstantOfShape"),
        "{e}"
    );
}

#[test]
fn a_uniform_value_as_another_input_than_the_data_is_refused() {
    // Clip's bound (as a convolution's weight would be): its dimension 0 is not the batch.
    let tail = vec![node("Clip", &["x", "cs"], "y")];
    let e = import_model(model(tail, batched("y", &[4, 3, 3]))).unwrap_err();
    assert!(e.contains("Clip") && e.contains("ConstantOfShape"), "{e}");
}
