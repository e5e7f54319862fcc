//! Graph-input shapes as a file declares them: a negative size is named as such, not mistaken
//! for a dynamic dimension.

mod common;

use std::path::Path;

use common::{model, value_info};
use isolane_engine::onnx::proto::{tensor_proto::DataType, GraphProto, ModelProto, NodeProto};
use isolane_engine::onnx::OnnxModel;

/// `y = Identity(x)` with `x` declared `[1, 3, dims...]`.
fn identity_model(x_dims: &[i64]) -> ModelProto {
    model(GraphProto {
        name: Some("g".into()),
        node: vec![NodeProto {
            op_type: Some("Identity".into()),
            input: vec!["x".into()],
            output: vec!["y".into()],
            ..Default::default()
        }],
        input: vec![value_info("x", DataType::Float, x_dims)],
        output: vec![value_info("y", DataType::Float, x_dims)],
        ..Default::default()
    })
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
