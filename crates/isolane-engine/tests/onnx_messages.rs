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

/// A GroupNormalization whose scale and bias are given per group (opset 18's form) is expanded
/// to one value per channel at import: a corrupt channel count must be refused, not allocated
/// (the parser fuzzer found an 8 GiB allocation here).
#[test]
fn a_group_norm_over_far_too_many_channels_is_refused_not_allocated() {
    use isolane_engine::onnx::proto::{AttributeProto, TensorProto};
    let per_group = |name: &str| TensorProto {
        name: Some(name.into()),
        dims: vec![1],
        data_type: Some(DataType::Float as i32),
        float_data: vec![1.0],
        ..Default::default()
    };
    let dims = [1, 1 << 27, 1];
    let mut m = model(GraphProto {
        name: Some("g".into()),
        node: vec![NodeProto {
            input: vec!["x".into(), "scale".into(), "bias".into()],
            output: vec!["y".into()],
            name: Some("gn".into()),
            op_type: Some("GroupNormalization".into()),
            attribute: vec![AttributeProto {
                name: Some("num_groups".into()),
                i: Some(1),
                r#type: Some(2), // INT
                ..Default::default()
            }],
            ..Default::default()
        }],
        initializer: vec![per_group("scale"), per_group("bias")],
        input: vec![value_info("x", DataType::Float, &dims)],
        output: vec![value_info("y", DataType::Float, &dims)],
        ..Default::default()
    });
    m.opset_import[0].version = Some(18);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gn.onnx");
    std::fs::write(&path, m.encode_to_vec()).unwrap();
    let e = isolane_engine::onnx::import_file(&path)
        .unwrap_err()
        .to_string();
    // Refused by the channel check itself, before any per-channel vector is built.
    assert!(e.contains("the scale per channel"), "{e}");
    assert!(e.contains("too large"), "{e}");
}
