//! Graph-input shapes as a file declares them: a negative size is named as such, not mistaken
//! for a dynamic dimension.

use std::path::Path;

use isolane_engine::onnx::proto::{
    tensor_proto::DataType, tensor_shape_proto::dimension::Value as DimValue,
    tensor_shape_proto::Dimension, type_proto, GraphProto, ModelProto, NodeProto,
    OperatorSetIdProto, TensorShapeProto, TypeProto, ValueInfoProto,
};
use isolane_engine::onnx::OnnxModel;

fn value_info(name: &str, dims: &[i64]) -> ValueInfoProto {
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(DataType::Float as i32),
                shape: Some(TensorShapeProto {
                    dim: dims
                        .iter()
                        .map(|&d| Dimension {
                            value: Some(DimValue::DimValue(d)),
                            ..Default::default()
                        })
                        .collect(),
                }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// `y = Identity(x)` with `x` declared `[1, 3, dims...]`.
fn identity_model(x_dims: &[i64]) -> ModelProto {
    ModelProto {
        ir_version: Some(8),
        opset_import: vec![OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(17),
        }],
        graph: Some(GraphProto {
            name: Some("g".into()),
            node: vec![NodeProto {
                op_type: Some("Identity".into()),
                input: vec!["x".into()],
                output: vec!["y".into()],
                ..Default::default()
            }],
            input: vec![value_info("x", x_dims)],
            output: vec![value_info("y", x_dims)],
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[test]
fn a_negative_input_dimension_is_named_as_such() {
    let e = OnnxModel::from_proto(identity_model(&[1, 3, -5]), Path::new("m.onnx"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("m.onnx")
            && e.contains("graph input \"x\"")
            && e.contains("dimension 2 is -5; expected a size >= 0")
            && !e.contains("dynamic (\"dim2\")"),
        "{e}"
    );
    assert!(OnnxModel::from_proto(identity_model(&[1, 3, 5]), Path::new("m.onnx")).is_ok());
}
