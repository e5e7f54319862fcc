//! Messages about an ONNX file's declared input shape speak the user's terms: sizes joined
//! with ×, never the IR's Rust names (`Fixed(1)`), and an empty input is refused up front.

mod common;

use common::{model, value_info};
use isolane_engine::onnx::proto::{tensor_proto::DataType, GraphProto, NodeProto};
use prost::Message as _;

/// `y = Relu(x)` with `x` declared as `dims`, written to a temporary .onnx file.
fn relu_model(dims: &[i64]) -> (tempfile::TempDir, std::path::PathBuf) {
    let model = model(GraphProto {
        name: Some("g".into()),
        node: vec![NodeProto {
            input: vec!["x".into()],
            output: vec!["y".into()],
            name: Some("relu".into()),
            op_type: Some("Relu".into()),
            ..Default::default()
        }],
        input: vec![value_info("x", DataType::Float, dims)],
        output: vec![value_info("y", DataType::Float, dims)],
        ..Default::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("relu.onnx");
    std::fs::write(&path, model.encode_to_vec()).unwrap();
    (dir, path)
}

#[test]
fn a_relu_with_a_normal_shape_imports() {
    let (_d, p) = relu_model(&[1, 3, 4]);
    isolane_engine::onnx::import_file(&p).unwrap();
}

#[test]
fn an_input_dimension_of_size_0_is_refused_with_the_shape_in_plain_terms() {
    let (_d, p) = relu_model(&[1, 0, 4]);
    let e = isolane_engine::onnx::import_file(&p)
        .unwrap_err()
        .to_string();
    assert!(e.contains("relu.onnx"), "{e}");
    assert!(
        e.contains("graph input \"x\": dimension 1 has size 0 (shape 1 × 0 × 4)"),
        "{e}"
    );
}

#[test]
fn a_far_too_large_input_is_described_without_rust_debug_output() {
    let (_d, p) = relu_model(&[1, 3, 1_000_000, 1_000_000]);
    let e = isolane_engine::onnx::import_file(&p)
        .unwrap_err()
        .to_string();
    assert!(!e.contains("Fixed("), "{e}");
    assert!(
        e.contains("graph input \"x\": shape 1 × 3 × 1000000 × 1000000 is far too large"),
        "{e}"
    );
}
