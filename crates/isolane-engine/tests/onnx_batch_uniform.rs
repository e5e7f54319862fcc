//! A ConstantOfShape whose shape holds the batch size (PyTorch's classic export of
//! `torch.zeros(x.shape[0], h, w)`, edgenext's positional encoding; DETR's all-ones pixel
//! mask): held once, computed repeat by repeat wherever the batch axis moves, and broadcast
//! where it meets the activations; integers counting along the batch (`Range(0, B)`, the
//! classic exporter's `arange(B)·HW + position` indices) held with a step per sample; refused
//! by name where an op would not treat the samples alike.

mod common;

use common::rel_l2;
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

/// A transpose may move the batch (the value is held along dimension 1 then), but adding it
/// to the activations, whose batch is dimension 0, would pair every sample with every other:
/// refused, naming the op and the held value.
#[test]
fn a_held_batch_that_meets_the_activations_on_another_axis_is_refused() {
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
        e.contains("Add") && e.contains("\"t\"") && e.contains("along dimension 1"),
        "{e}"
    );
    assert!(e.contains("does not broadcast along the batch axis"), "{e}");
}

/// `model` with more initializers (each a `TensorProto`).
fn with_inits(mut m: ModelProto, inits: Vec<TensorProto>) -> ModelProto {
    if let Some(g) = m.graph.as_mut() {
        g.initializer.extend(inits);
    }
    m
}

/// Runs `g` at `batch` on `x[i] = i / 2`; returns the input and the output.
fn run(g: &isolane_engine::ir::Graph, batch: usize) -> (Vec<f32>, Vec<f32>) {
    let mut m = CpuBackend::new(1)
        .compile(g, batch, Precision::Fp32)
        .unwrap();
    let x: Vec<f32> = (0..m.input_mut().len()).map(|i| i as f32 * 0.5).collect();
    m.input_mut().copy_from_slice(&x);
    m.run().unwrap();
    (x, m.output().to_vec())
}

/// The batch moves off dimension 0 and back (DETR's `mask[None]` … `[0]`): Unsqueeze puts it
/// on dimension 1, Gather of index 0 along dimension 0 brings it back; the value stays held
/// once throughout, and every sample gets it.
#[test]
fn a_held_batch_moved_to_dimension_1_and_back_reaches_every_sample() {
    let tail = vec![
        node("Unsqueeze", &["cs", "axes0"], "u"),
        with_int(node("Gather", &["u", "zero"], "back"), "axis", 0),
        node("Unsqueeze", &["back", "axes1"], "b4"),
        node("Add", &["x", "b4"], "y"),
    ];
    let g = import_model(model(tail, batched("y", &[4, 3, 3]))).unwrap();
    for batch in [1, 3] {
        let (x, y) = run(&g, batch);
        assert_eq!(y.len(), batch * 36);
        for (i, (&y, &x)) in y.iter().zip(&x).enumerate() {
            assert_eq!(y, x + (i % 3) as f32 + 1.0, "element {i} at batch {batch}");
        }
    }
}

/// The classic exporter's advanced indexing `m[arange(B)[:, None], pos]` of a `[B, 9]` value:
/// the value flattened to `[B·9]`, indexed by `arange(B)·9 + pos`. `Range(0, B)` is held as
/// its first value with a step of 1 per sample, the index as `pos` with a step of 9, and the
/// Gather reads each sample's own 9 elements: computed at import, the same for every sample.
/// `scale` multiplies the sample index instead of 9 and `limit_plus` is added to Range's limit
/// (0 and 9 in the real case).
fn counting_index_model(scale: i64, limit_plus: i64) -> ModelProto {
    let tail = vec![
        node("Reshape", &["cs", "minus1"], "flat"),
        node("Add", &["b", "limit_plus"], "limit"),
        node("Range", &["zero", "limit", "one"], "samples"),
        node("Unsqueeze", &["samples", "axes1"], "col"),
        node("Mul", &["col", "scale"], "starts"),
        node("Add", &["starts", "pos"], "idx"),
        with_int(node("Gather", &["flat", "idx"], "picked"), "axis", 0),
        node("Reshape", &["picked", "shape4"], "p4"),
        node("Add", &["x", "p4"], "y"),
    ];
    with_inits(
        model(tail, batched("y", &[4, 3, 3])),
        vec![
            ints("minus1", &[1], &[-1]),
            ints("one", &[], &[1]),
            ints("limit_plus", &[], &[limit_plus]),
            ints("scale", &[], &[scale]),
            // Each sample's 9 elements in reverse order.
            ints("pos", &[1, 9], &[8, 7, 6, 5, 4, 3, 2, 1, 0]),
            ints("shape4", &[4], &[-1, 1, 3, 3]),
        ],
    )
}

#[test]
fn indices_counting_along_the_batch_read_each_samples_own_elements() {
    let g = import_model(counting_index_model(9, 0)).unwrap();
    for batch in [1, 2, 3] {
        let (x, y) = run(&g, batch);
        assert_eq!(y.len(), batch * 36);
        for (i, (&y, &x)) in y.iter().zip(&x).enumerate() {
            // cs is 1, 2, 3 along the width; reversed within each 3×3 sample: 3, 2, 1.
            assert_eq!(y, x + (3 - i % 3) as f32, "element {i} at batch {batch}");
        }
    }
}

#[test]
fn indices_that_reach_into_another_samples_elements_are_refused() {
    // arange(B)·8 + pos: sample 1 would read element 8 of sample 0.
    let e = import_model(counting_index_model(8, 0)).unwrap_err();
    assert!(
        e.contains("Gather") && e.contains("reaches outside the sample's own 9 elements"),
        "{e}"
    );
    // Range(0, B + 1): its length is not a multiple of the batch.
    let e = import_model(counting_index_model(9, 1)).unwrap_err();
    assert!(
        e.contains("Range") && e.contains("multiple of the batch"),
        "{e}"
    );
}

#[test]
fn a_product_of_two_values_counting_along_the_batch_is_refused() {
    let tail = vec![
        node("Range", &["zero", "b", "one"], "samples"),
        node("Mul", &["samples", "samples"], "squares"),
        node("Cast", &["squares"], "f"),
        node("Add", &["x", "f"], "y"),
    ];
    let m = with_inits(
        model(tail, batched("y", &[4, 3, 3])),
        vec![ints("one", &[], &[1])],
    );
    let e = import_model(m).unwrap_err();
    assert!(
        e.contains("Mul") && e.contains("a product of two values that count along the batch"),
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

/// Hugging Face DETR exported by PyTorch's classic exporter (scripts/hf_models.py --fixture:
/// a 12.5k-parameter config with DETR's graph). Its all-ones pixel mask `[B, H, W]` is
/// unsqueezed to `[1, B, H, W]` (the batch on dimension 1), resized, taken back with `[0]`,
/// flattened to `[B·HW]` and indexed by `arange(B)·HW + position` for the attention masks:
/// all held once and computed at import. Both outputs match onnxruntime at batch 2 (distinct
/// images) and, from the same import, at batch 1 (the first image's rows).
#[test]
fn detr_classic_export_matches_onnxruntime_at_batch_1_and_2() {
    use isolane_engine::io::read_npy;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/onnx");
    let stem = dir.join("torch_detr_tiny_op17");
    let g = isolane_engine::onnx::import_file(stem.with_extension("onnx")).unwrap();
    let x = read_npy(stem.with_extension("input.npy")).unwrap();
    let logits = read_npy(stem.with_extension("output.npy")).unwrap();
    let boxes = read_npy(stem.with_extension("boxes.npy")).unwrap();
    assert_eq!(x.shape[0], 2);
    for batch in [2, 1] {
        let mut m = CpuBackend::new(1)
            .compile(&g, batch, Precision::Fp32)
            .unwrap();
        let per = x.data.len() / 2;
        m.input_mut().copy_from_slice(&x.data[..per * batch]);
        m.run().unwrap();
        for (k, want) in [(0, &logits), (1, &boxes)] {
            let n = want.data.len() / 2 * batch;
            assert_eq!(m.output_shape_at(k)[0], batch);
            assert_eq!(m.output_at(k).len(), n);
            let err = rel_l2(m.output_at(k), &want.data[..n]);
            println!("output {k} at batch {batch}: relative L2 {err:.2e}");
            assert!(
                err <= 1e-5,
                "output {k} at batch {batch}: relative L2 {err:.2e}"
            );
        }
    }
}

/// A matrix product whose right side is held once and whose left side is batched at run time
/// (DETR's decoder: attention weights times the values of its zero queries), with the batch
/// as a dimension of its own (`[B, 4, 3, 3] @ [B, 1, 3, 3]`, transformers 5) or merged with
/// the heads (`[4·B, 3, 3] @ [4·B, 3, 3]`, transformers 4's `bmm`, where the held side is
/// `[4, 3, 3]`): the held side is repeated to the batch at run time, and every sample gets
/// `x @ cs` (`cs[i][j] = j + 1`).
#[test]
fn a_product_of_the_activations_and_a_held_value_gives_every_sample_its_rows() {
    let expand = node("Expand", &["u", "shape4"], "e");
    let separate = vec![
        node("Unsqueeze", &["cs", "axes1"], "u"),
        node("MatMul", &["x", "u"], "y"),
    ];
    let merged = vec![
        node("Unsqueeze", &["cs", "axes1"], "u"),
        node("Concat", &["b1", "four", "hw"], "shape4"),
        expand,
        node("Reshape", &["e", "heads"], "v"),
        node("Reshape", &["x", "heads"], "xh"),
        node("MatMul", &["xh", "v"], "p"),
        node("Reshape", &["p", "back"], "y"),
    ];
    let merged_concat = merged
        .into_iter()
        .map(|n| match n.op_type() {
            "Concat" => with_int(n, "axis", 0),
            _ => n,
        })
        .collect();
    let extra = || {
        vec![
            ints("four", &[1], &[4]),
            ints("heads", &[3], &[-1, 3, 3]),
            ints("back", &[4], &[-1, 4, 3, 3]),
        ]
    };
    for (what, tail) in [("separate", separate), ("merged", merged_concat)] {
        let m = with_inits(model(tail, batched("y", &[4, 3, 3])), extra());
        let g = import_model(m).unwrap_or_else(|e| panic!("{what}: {e}"));
        for batch in [1, 2] {
            let (x, y) = run(&g, batch);
            assert_eq!(y.len(), batch * 36, "{what}");
            for (r, (xr, yr)) in x.chunks(3).zip(y.chunks(3)).enumerate() {
                let sum: f32 = xr.iter().sum();
                for (j, &v) in yr.iter().enumerate() {
                    let want = sum * (j + 1) as f32;
                    assert!(
                        (v - want).abs() <= 1e-4 * want.abs().max(1.0),
                        "{what} at batch {batch}, row {r}: {v} against {want}"
                    );
                }
            }
        }
    }
}
