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

/// An int64 initializer.
fn ints(name: &str, values: &[i64]) -> isolane_engine::onnx::proto::TensorProto {
    isolane_engine::onnx::proto::TensorProto {
        name: Some(name.into()),
        dims: vec![values.len() as i64],
        data_type: Some(DataType::Int64 as i32),
        int64_data: values.to_vec(),
        ..Default::default()
    }
}

/// A float initializer.
fn floats(name: &str, values: &[f32]) -> isolane_engine::onnx::proto::TensorProto {
    isolane_engine::onnx::proto::TensorProto {
        name: Some(name.into()),
        dims: vec![values.len() as i64],
        data_type: Some(DataType::Float as i32),
        float_data: values.to_vec(),
        ..Default::default()
    }
}

fn node(name: &str, op: &str, inputs: &[&str], outputs: &[&str]) -> NodeProto {
    NodeProto {
        name: Some(name.into()),
        op_type: Some(op.into()),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

/// `x` of `dims`, its first dimension named (dynamic) when `dynamic_batch`.
fn input(dims: &[i64], dynamic_batch: bool) -> isolane_engine::onnx::proto::ValueInfoProto {
    use isolane_engine::onnx::proto::{tensor_shape_proto::dimension::Value, type_proto};
    let mut vi = value_info("x", DataType::Float, dims);
    if dynamic_batch {
        if let Some(type_proto::Value::TensorType(t)) =
            vi.r#type.as_mut().and_then(|t| t.value.as_mut())
        {
            t.shape.as_mut().unwrap().dim[0].value = Some(Value::DimParam("batch".into()));
        }
    }
    vi
}

/// The reproducer: a constant `Pad` of `p` on both sides of H and W of an 8×8 input
/// with 3 channels.
fn pad_model(p: i64, dynamic_batch: bool) -> isolane_engine::onnx::OnnxModel {
    let g = GraphProto {
        name: Some("g".into()),
        node: vec![node("pad", "Pad", &["x", "pads"], &["y"])],
        initializer: vec![ints("pads", &[0, 0, p, p, 0, 0, p, p])],
        input: vec![input(&[1, 3, 8, 8], dynamic_batch)],
        output: vec![value_info("y", DataType::Float, &[])],
        ..Default::default()
    };
    let mut m = model(g);
    // The output's shape is left undeclared (rank 0 would not match).
    if let Some(o) = m.graph.as_mut().unwrap().output.first_mut() {
        o.r#type = None;
    }
    isolane_engine::onnx::OnnxModel::from_proto(m, std::path::Path::new("pad.onnx")).unwrap()
}

/// A Pad of 1e5 (and 3e4) on an 8×8 input: the footprint check evaluated the constant border
/// (the IR's Expand of the pad value) to fold it, allocating 240 GB and aborting inside the
/// check. The border now stays a node past the fold's bound, and the footprint is shape
/// arithmetic that names the node, its op and its shape. Were any of it allocated, this test
/// would abort.
#[test]
fn a_huge_pad_gets_a_footprint_by_arithmetic_naming_the_node_not_an_allocation() {
    use isolane_engine::footprint::footprint;
    for p in [100_000usize, 30_000] {
        let g = isolane_engine::onnx::import(&pad_model(p as i64, false)).unwrap();
        let fp = footprint(&g, 1).unwrap();
        let side = 8 + 2 * p;
        let out = (3 * side * side) as u128;
        assert_eq!(fp.output_elements, out);
        let b = fp.busiest.expect("a busiest node");
        assert_eq!(b.node, "pad");
        assert_eq!(b.op, "Concat");
        assert_eq!(b.largest_shape, vec![1, 3, side, side]);
        assert_eq!(b.largest_elements(), out);
        assert_eq!(
            b.describe(),
            format!("node \"pad\" (Concat), whose largest tensor is 1 × 3 × {side} × {side}")
        );
        // The padded output and the border blocks it is joined from, all alive at once.
        assert!(b.elements > out, "{b:?}");
        assert_eq!(fp.min_activation_elements, 3 * 64 + b.elements);
        // Compiling sees the same graph: the border along W is not folded into a constant
        // (the one along H, 3 × p × 8 elements a side, is).
        let opt = isolane_engine::passes::optimize(&g, 1).unwrap();
        assert!(opt.nodes.iter().any(|n| n.op.name() == "Expand"));
        assert!(
            opt.constant_elements() <= 2 * 3 * p * 8 + 4,
            "{}",
            opt.constant_elements()
        );
    }
}

/// A small pad is still folded (its border becomes a constant), so models that pad by a few
/// pixels compile as before.
#[test]
fn a_small_pad_border_is_still_folded_into_a_constant() {
    let g = isolane_engine::onnx::import(&pad_model(2, false)).unwrap();
    let opt = isolane_engine::passes::optimize(&g, 1).unwrap();
    assert!(opt.nodes.iter().all(|n| n.op.name() != "Expand"));
    assert!(opt.constant_elements() > 0);
    let fp = isolane_engine::footprint::footprint(&g, 1).unwrap();
    assert_eq!(fp.output_elements, 3 * 12 * 12);
}

/// The footprint folds at the batch it is asked for: it optimised at batch 1, which folded a
/// batch-sized Pad border to one row, and the shapes at batch 4 no longer joined (an error,
/// which the preflight read as "cannot tell" and let pass).
#[test]
fn the_footprint_of_a_padded_model_at_batch_4_is_worked_out() {
    let g = isolane_engine::onnx::import(&pad_model(2, true)).unwrap();
    let fp = isolane_engine::footprint::footprint(&g, 4).unwrap();
    assert_eq!(fp.input_elements, 4 * 3 * 8 * 8);
    assert_eq!(fp.output_elements, 4 * 3 * 12 * 12);
}

/// A Resize by 5000 of an 8×8 input: the footprint names the Resize and its 40000 × 40000
/// output (19.2 GB of f32), by arithmetic, so the preflight can refuse it before compiling.
#[test]
fn a_huge_resize_is_named_by_the_footprint() {
    let g = GraphProto {
        name: Some("g".into()),
        node: vec![node("up", "Resize", &["x", "", "scales"], &["y"])],
        initializer: vec![floats("scales", &[1.0, 1.0, 5000.0, 5000.0])],
        input: vec![input(&[1, 3, 8, 8], false)],
        output: vec![value_info("y", DataType::Float, &[1, 3, 40000, 40000])],
        ..Default::default()
    };
    let m = isolane_engine::onnx::OnnxModel::from_proto(model(g), std::path::Path::new("r.onnx"))
        .unwrap();
    let g = isolane_engine::onnx::import(&m).unwrap();
    let fp = isolane_engine::footprint::footprint(&g, 1).unwrap();
    let b = fp.busiest.unwrap();
    assert_eq!((b.node.as_str(), b.op), ("up", "Resize"));
    assert_eq!(b.largest_shape, vec![1, 3, 40000, 40000]);
    assert_eq!(fp.min_activation_elements, 3 * 64 + 3 * 40000 * 40000);
}

/// A graph of `nodes` reading `x` [1, 4] and writing `y`, with `inits` as initializers and
/// the graph inputs `inputs`.
fn structure_error(
    nodes: Vec<NodeProto>,
    inits: Vec<isolane_engine::onnx::proto::TensorProto>,
    inputs: &[&str],
) -> String {
    let g = GraphProto {
        name: Some("g".into()),
        node: nodes,
        initializer: inits,
        input: inputs
            .iter()
            .map(|n| value_info(n, DataType::Float, &[1, 4]))
            .collect(),
        output: vec![value_info("y", DataType::Float, &[1, 4])],
        ..Default::default()
    };
    match isolane_engine::onnx::OnnxModel::from_proto(model(g), std::path::Path::new("s.onnx")) {
        Err(e) => e.to_string(),
        Ok(m) => isolane_engine::onnx::import(&m).unwrap_err().to_string(),
    }
}

/// Two nodes writing one tensor were accepted, the later write silently replacing the first.
#[test]
fn a_tensor_written_by_two_nodes_is_refused_naming_both() {
    let e = structure_error(
        vec![
            node("first", "Relu", &["x"], &["t"]),
            node("second", "Sigmoid", &["x"], &["t"]),
            node("last", "Relu", &["t"], &["y"]),
        ],
        vec![],
        &["x"],
    );
    assert!(e.contains("s.onnx"), "{e}");
    assert!(e.contains("tensor \"t\" is written twice"), "{e}");
    assert!(e.contains("op Relu (node \"first\""), "{e}");
    assert!(e.contains("op Sigmoid (node \"second\""), "{e}");
    // A node writing over a graph input or an initializer.
    let e = structure_error(vec![node("n", "Relu", &["x"], &["x"])], vec![], &["x"]);
    assert!(
        e.contains("tensor \"x\" is written twice, by the graph input and by op Relu (node \"n\""),
        "{e}"
    );
    let e = structure_error(
        vec![
            node("n", "Relu", &["x"], &["w"]),
            node("m", "Add", &["x", "w"], &["y"]),
        ],
        vec![floats("w", &[1.0])],
        &["x"],
    );
    assert!(
        e.contains("tensor \"w\" is written twice, by an initializer"),
        "{e}"
    );
}

#[test]
fn duplicate_graph_inputs_and_initializers_are_refused() {
    let e = structure_error(vec![node("n", "Relu", &["x"], &["y"])], vec![], &["x", "x"]);
    assert!(e.contains("graph input \"x\" is listed twice"), "{e}");
    let e = structure_error(
        vec![node("n", "Add", &["x", "w"], &["y"])],
        vec![floats("w", &[1.0]), floats("w", &[2.0])],
        &["x"],
    );
    assert!(e.contains("initializer \"w\" is given twice"), "{e}");
}

#[test]
fn a_missing_tensor_a_cycle_and_nodes_out_of_order_are_refused_by_name() {
    let e = structure_error(
        vec![node("n", "Add", &["x", "nowhere"], &["y"])],
        vec![],
        &["x"],
    );
    assert!(
        e.contains("input \"nowhere\" is not produced by any node, initializer or graph input"),
        "{e}"
    );
    let e = structure_error(
        vec![
            node("a", "Add", &["x", "b"], &["a"]),
            node("b", "Relu", &["a"], &["b"]),
            node("out", "Relu", &["a"], &["y"]),
        ],
        vec![],
        &["x"],
    );
    assert!(e.contains("op Add (node \"a\""), "{e}");
    assert!(
        e.contains("input \"b\" is written only by a later node, op Relu (node \"b\""),
        "{e}"
    );
    assert!(e.contains("or they form a cycle"), "{e}");
    let e = structure_error(
        vec![node("self", "Add", &["x", "y"], &["y"])],
        vec![],
        &["x"],
    );
    assert!(e.contains("input \"y\" is this node's own output"), "{e}");
}

/// `ConstantOfShape(shape)` of a one-element `value` tensor.
fn constant_of_shape(
    name: &str,
    shape: &str,
    value: isolane_engine::onnx::proto::TensorProto,
) -> NodeProto {
    use isolane_engine::onnx::proto::{attribute_proto::AttributeType, AttributeProto};
    let mut n = node(name, "ConstantOfShape", &[shape], &[name]);
    n.attribute.push(AttributeProto {
        name: Some("value".into()),
        t: Some(value),
        r#type: Some(AttributeType::Tensor as i32),
        ..Default::default()
    });
    n
}

/// GatherND copies a whole slice per index tuple: 2^20 zero indices into a [2, 2^20] constant
/// made a 2^40-float (4 TiB) constant, allocated before anything was checked. Now its size is
/// checked first and the node is named.
#[test]
fn a_gather_nd_that_would_fold_a_huge_constant_is_refused_before_allocating() {
    let mut zero_i64 = ints("zero", &[0]);
    zero_i64.name = None;
    let mut zero_f32 = floats("zero", &[0.0]);
    zero_f32.name = None;
    let g = GraphProto {
        name: Some("g".into()),
        node: vec![
            constant_of_shape("data", "data_shape", zero_f32),
            constant_of_shape("indices", "indices_shape", zero_i64),
            node("gnd", "GatherND", &["data", "indices"], &["table"]),
            node("add", "Add", &["x", "table"], &["y"]),
        ],
        initializer: vec![
            ints("data_shape", &[2, 1 << 20]),
            ints("indices_shape", &[1 << 20, 1]),
        ],
        input: vec![input(&[1, 4], false)],
        output: vec![value_info("y", DataType::Float, &[1 << 20, 1 << 20])],
        ..Default::default()
    };
    let m = isolane_engine::onnx::OnnxModel::from_proto(model(g), std::path::Path::new("g.onnx"))
        .unwrap();
    let e = isolane_engine::onnx::import(&m).unwrap_err().to_string();
    assert!(e.contains("op GatherND (node \"gnd\""), "{e}");
    assert!(e.contains("is too large to fold"), "{e}");
}

/// A DequantizeLinear of a constant weight with `block_size` i64::MAX (opset 21): the block
/// count `ceil(d / block)` overflowed i64 and panicked; it is one block.
#[test]
fn a_huge_quantization_block_is_one_block_not_an_overflow() {
    use isolane_engine::onnx::proto::{
        attribute_proto::AttributeType, AttributeProto, TensorProto,
    };
    let mut dq = node("dq", "DequantizeLinear", &["wq", "ws"], &["w"]);
    for (name, v) in [("axis", 0), ("block_size", i64::MAX)] {
        dq.attribute.push(AttributeProto {
            name: Some(name.into()),
            r#type: Some(AttributeType::Int as i32),
            i: Some(v),
            ..Default::default()
        });
    }
    let wq = TensorProto {
        name: Some("wq".into()),
        dims: vec![4, 2],
        data_type: Some(DataType::Int8 as i32),
        raw_data: Some([1i8, -2, 3, -4, 5, -6, 7, -8].map(|v| v as u8).to_vec()),
        ..Default::default()
    };
    let mut ws = floats("ws", &[0.5, 0.25]);
    ws.dims = vec![1, 2];
    let g = GraphProto {
        name: Some("g".into()),
        node: vec![dq, node("mm", "MatMul", &["x", "w"], &["y"])],
        initializer: vec![wq, ws],
        input: vec![value_info("x", DataType::Float, &[1, 4])],
        output: vec![value_info("y", DataType::Float, &[1, 2])],
        ..Default::default()
    };
    let mut m = model(g);
    m.opset_import[0].version = Some(21);
    m.ir_version = Some(10);
    let m =
        isolane_engine::onnx::OnnxModel::from_proto(m, std::path::Path::new("dq.onnx")).unwrap();
    let g = isolane_engine::onnx::import(&m).unwrap();
    let y = isolane_engine::reference::interpret(
        &g,
        1,
        &[isolane_engine::Tensor::new(vec![1, 4], vec![1.0, 1.0, 1.0, 1.0]).unwrap()],
    )
    .unwrap();
    // Column sums of the dequantized weight: (1 + 3 + 5 + 7)·0.5, (−2 − 4 − 6 − 8)·0.25.
    assert_eq!(y[0].data, vec![8.0, -5.0]);
}
