//! Property tests of the engine's file readers: whatever the bytes, the npy reader, the
//! safetensors loader and the ONNX loader + importer return a value or an error, never panic.
//! Inputs are byte-level mutations of valid files (the test fixtures, and files written by the
//! engine's own writers), plus npy and safetensors headers assembled with edge-case fields.
//! `cargo test` runs a bounded number of cases (`ISOLANE_FUZZ_CASES`, default 300 each, about a
//! second in all) from a fixed seed; `scripts/fuzz.sh` runs many more from random seeds. The ONNX
//! edits found six bugs, all fixed: a Pad of 2^56 edge elements built an index per element, a
//! GroupNorm over a corrupt 2^34-element shape allocated its unit scale,
//! a huge Split `num_outputs` allocated terabytes, a Slice step at the edge of i64 overflowed, and
//! so did a Conv/pool window with a huge dilation or pad and a Reshape target of huge dims
//! (checked, then inferred).

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use isolane_engine::io::npy::{encode_npy, parse_npy};
use isolane_engine::onnx::{import, OnnxModel};
use isolane_engine::weights::{read_safetensors, write_safetensors};
use isolane_engine::Tensor;
use proptest::prelude::*;

fn config() -> ProptestConfig {
    isolane_core::fuzz::config(300)
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/onnx")
}

/// Every file of the ONNX fixtures (valid and bad) whose name ends in `ext`.
fn fixture_files(ext: &str) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for dir in [fixtures(), fixtures().join("bad")] {
        let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == ext))
            .collect();
        paths.sort();
        out.extend(paths.iter().map(|p| std::fs::read(p).unwrap()));
    }
    assert!(!out.is_empty(), "no .{ext} fixtures");
    out
}

fn onnx_seeds() -> &'static [Vec<u8>] {
    static S: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    S.get_or_init(|| fixture_files("onnx"))
}

fn npy_seeds() -> &'static [Vec<u8>] {
    static S: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    S.get_or_init(|| {
        let mut v = fixture_files("npy");
        v.push(encode_npy(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]));
        v.push(encode_npy(&[], &[7.0]));
        v
    })
}

/// Safetensors files written by the engine's writer: f32 tensors of a few shapes.
fn safetensors_seeds() -> &'static [Vec<u8>] {
    static S: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    S.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let t = |shape: &[usize]| {
            Arc::new(Tensor {
                shape: shape.to_vec(),
                data: (0..shape.iter().product::<usize>())
                    .map(|i| i as f32)
                    .collect(),
            })
        };
        let sets: Vec<Vec<(String, Arc<Tensor>)>> = vec![
            vec![("w".into(), t(&[2, 3]))],
            vec![
                ("a.weight".into(), t(&[4])),
                ("a.bias".into(), t(&[1, 1, 2])),
            ],
            vec![("scalar".into(), t(&[]))],
        ];
        sets.iter()
            .enumerate()
            .map(|(i, set)| {
                let p = dir.path().join(format!("{i}.safetensors"));
                write_safetensors(&p, set).unwrap();
                std::fs::read(&p).unwrap()
            })
            .collect()
    })
}

/// One byte-level change; positions wrap around the input's length.
#[derive(Debug, Clone)]
enum Mutation {
    Flip {
        at: usize,
        bit: u8,
    },
    Set {
        at: usize,
        byte: u8,
    },
    /// Little-endian edge-case integer written over the bytes at `at` (lengths, dims, offsets).
    Word {
        at: usize,
        value: u64,
        width: u8,
    },
    Insert {
        at: usize,
        bytes: Vec<u8>,
    },
    Delete {
        at: usize,
        len: usize,
    },
    Truncate {
        at: usize,
    },
}

const EDGE_VALUES: &[u64] = &[
    0,
    1,
    0x7f,
    0xff,
    0xffff,
    0x7fff_ffff,
    0xffff_ffff,
    0x7fff_ffff_ffff_ffff,
    u64::MAX,
    1 << 32,
    1 << 40,
];

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 0u8..8).prop_map(|(at, bit)| Mutation::Flip { at, bit }),
        (any::<usize>(), any::<u8>()).prop_map(|(at, byte)| Mutation::Set { at, byte }),
        (
            any::<usize>(),
            prop::sample::select(EDGE_VALUES),
            prop::sample::select(&[1u8, 2, 4, 8][..])
        )
            .prop_map(|(at, value, width)| Mutation::Word { at, value, width }),
        (any::<usize>(), prop::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(at, bytes)| Mutation::Insert { at, bytes }),
        (any::<usize>(), 1usize..64).prop_map(|(at, len)| Mutation::Delete { at, len }),
        any::<usize>().prop_map(|at| Mutation::Truncate { at }),
    ]
}

fn apply(bytes: &mut Vec<u8>, m: &Mutation) {
    let n = bytes.len();
    if n == 0 {
        return;
    }
    match m {
        Mutation::Flip { at, bit } => bytes[at % n] ^= 1 << bit,
        Mutation::Set { at, byte } => bytes[at % n] = *byte,
        Mutation::Word { at, value, width } => {
            let at = at % n;
            let le = value.to_le_bytes();
            let w = (*width as usize).min(n - at);
            bytes[at..at + w].copy_from_slice(&le[..w]);
        }
        Mutation::Insert { at, bytes: ins } => {
            let at = at % (n + 1);
            bytes.splice(at..at, ins.iter().copied());
        }
        Mutation::Delete { at, len } => {
            let at = at % n;
            bytes.drain(at..(at + len).min(n));
        }
        Mutation::Truncate { at } => bytes.truncate(at % (n + 1)),
    }
}

fn mutated(seeds: &'static [Vec<u8>]) -> impl Strategy<Value = Vec<u8>> {
    (0..seeds.len(), prop::collection::vec(mutation(), 1..6)).prop_map(move |(i, ms)| {
        let mut b = seeds[i].clone();
        for m in &ms {
            apply(&mut b, m);
        }
        b
    })
}

/// Dimension values for assembled headers: small, zero and past every limit.
const DIMS: &[&str] = &[
    "0",
    "1",
    "3",
    "65536",
    "4294967296",
    "9223372036854775807",
    "18446744073709551615",
    "18446744073709551616",
    "-1",
    "1.5",
    "x",
];

fn dims() -> impl Strategy<Value = Vec<&'static str>> {
    prop::collection::vec(prop::sample::select(DIMS), 0..5)
}

/// A `.npy` file: magic, version, a header dictionary of edge-case fields, then data.
fn assembled_npy() -> impl Strategy<Value = Vec<u8>> {
    (
        prop::sample::select(&[1u8, 2, 3, 4][..]),
        prop::sample::select(
            &[
                "'<f4'", "'<f8'", "'|f4'", "'>f4'", "'<f2'", "'<i8'", "''", "4",
            ][..],
        ),
        prop::sample::select(&["False", "True", "0", ""][..]),
        dims(),
        prop::sample::select(&[0usize, 4, 8, 24, 4096][..]),
    )
        .prop_map(|(major, descr, fortran, dims, data_len)| {
            let header = format!(
                "{{'descr': {descr}, 'fortran_order': {fortran}, 'shape': ({}), }}\n",
                dims.iter().map(|d| format!("{d},")).collect::<String>()
            );
            let mut b = b"\x93NUMPY".to_vec();
            b.push(major);
            b.push(0);
            if major == 1 {
                b.extend_from_slice(&(header.len() as u16).to_le_bytes());
            } else {
                b.extend_from_slice(&(header.len() as u32).to_le_bytes());
            }
            b.extend_from_slice(header.as_bytes());
            b.resize(b.len() + data_len, 0x3f);
            b
        })
}

/// A safetensors file: an 8-byte header length, a JSON header of edge-case tensors, then data.
fn assembled_safetensors() -> impl Strategy<Value = Vec<u8>> {
    let tensor = (
        prop::sample::select(
            &[
                "F32", "F16", "BF16", "F64", "I64", "U8", "BOOL", "F8_E4M3", "X",
            ][..],
        ),
        dims(),
        prop::sample::select(DIMS),
        prop::sample::select(DIMS),
    );
    (
        prop::collection::vec(tensor, 0..4),
        prop::sample::select(&[0usize, 2, 4, 8, 24, 4096][..]),
        prop::sample::select(&[None, Some(0u64), Some(1), Some(u64::MAX), Some(1 << 40)][..]),
    )
        .prop_map(|(tensors, data_len, claimed_len)| {
            let entries: Vec<String> = tensors
                .iter()
                .enumerate()
                .map(|(i, (dtype, shape, begin, end))| {
                    format!(
                        "\"t{i}\":{{\"dtype\":\"{dtype}\",\"shape\":[{}],\"data_offsets\":[{begin},{end}]}}",
                        shape.join(",")
                    )
                })
                .collect();
            let header = format!("{{{}}}", entries.join(","));
            let len = claimed_len.unwrap_or(header.len() as u64);
            let mut b = len.to_le_bytes().to_vec();
            b.extend_from_slice(header.as_bytes());
            b.resize(b.len() + data_len, 0x3c);
            b
        })
}

fn load_safetensors(bytes: &[u8]) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("w.safetensors");
    std::fs::write(&p, bytes).unwrap();
    let _ = read_safetensors(&p);
}

fn load_onnx(bytes: &[u8]) {
    // The path only names the file in messages and anchors external data (none here).
    let path = Path::new("/nonexistent/fuzz.onnx");
    if let Ok(model) = OnnxModel::from_bytes(bytes, path) {
        let _ = import(&model);
    }
}

/// Integers at the edges of what a dimension, an axis or a count may be.
const EDGE_I64: &[i64] = &[0, 1, -1, 2, 3, -2, 1 << 31, 1 << 40, i64::MAX, i64::MIN];

/// One change to a decoded model, where a byte flip rarely lands: attribute values, tensor and
/// input dimensions, wiring, op types.
#[derive(Debug, Clone)]
enum ModelEdit {
    AttrInt {
        node: usize,
        attr: usize,
        value: i64,
    },
    InitializerDim {
        init: usize,
        dim: usize,
        value: i64,
    },
    InputDim {
        input: usize,
        dim: usize,
        value: i64,
    },
    Rewire {
        node: usize,
        slot: usize,
        from: usize,
    },
    DropInput {
        node: usize,
        slot: usize,
    },
    OpType {
        node: usize,
        op: &'static str,
    },
}

const OPS: &[&str] = &[
    "Conv",
    "Gemm",
    "MatMul",
    "Reshape",
    "Transpose",
    "Concat",
    "Split",
    "Slice",
    "Gather",
    "Squeeze",
    "Unsqueeze",
    "Flatten",
    "Pad",
    "Resize",
    "ReduceMean",
    "Softmax",
    "Expand",
    "ConstantOfShape",
    "Shape",
    "Add",
    "MaxPool",
    "AveragePool",
    "BatchNormalization",
    "Clip",
];

fn model_edit() -> impl Strategy<Value = ModelEdit> {
    let ix = || any::<usize>();
    let v = || prop::sample::select(EDGE_I64);
    prop_oneof![
        (ix(), ix(), v()).prop_map(|(node, attr, value)| ModelEdit::AttrInt { node, attr, value }),
        (ix(), ix(), v()).prop_map(|(init, dim, value)| ModelEdit::InitializerDim {
            init,
            dim,
            value
        }),
        (ix(), ix(), v()).prop_map(|(input, dim, value)| ModelEdit::InputDim { input, dim, value }),
        (ix(), ix(), ix()).prop_map(|(node, slot, from)| ModelEdit::Rewire { node, slot, from }),
        (ix(), ix()).prop_map(|(node, slot)| ModelEdit::DropInput { node, slot }),
        (ix(), prop::sample::select(OPS)).prop_map(|(node, op)| ModelEdit::OpType { node, op }),
    ]
}

/// `&mut v[i % v.len()]`, or None for an empty `v`.
fn pick<T>(v: &mut [T], i: usize) -> Option<&mut T> {
    let n = v.len();
    (n > 0).then(|| &mut v[i % n])
}

fn edit_model(m: &mut isolane_engine::onnx::proto::ModelProto, e: &ModelEdit) {
    use isolane_engine::onnx::proto::{tensor_shape_proto::dimension, type_proto};
    let Some(g) = m.graph.as_mut() else { return };
    let names: Vec<String> = g
        .node
        .iter()
        .flat_map(|n| n.output.iter().cloned())
        .chain(g.initializer.iter().filter_map(|t| t.name.clone()))
        .chain(g.input.iter().filter_map(|i| i.name.clone()))
        .collect();
    match *e {
        ModelEdit::AttrInt { node, attr, value } => {
            if let Some(a) = pick(&mut g.node, node).and_then(|n| pick(&mut n.attribute, attr)) {
                if a.i.is_some() {
                    a.i = Some(value);
                }
                if let Some(x) = pick(&mut a.ints, attr) {
                    *x = value;
                }
            }
        }
        ModelEdit::InitializerDim { init, dim, value } => {
            if let Some(d) = pick(&mut g.initializer, init).and_then(|t| pick(&mut t.dims, dim)) {
                *d = value;
            }
        }
        ModelEdit::InputDim { input, dim, value } => {
            let shape = pick(&mut g.input, input)
                .and_then(|i| i.r#type.as_mut())
                .and_then(|t| match t.value.as_mut() {
                    Some(type_proto::Value::TensorType(tt)) => tt.shape.as_mut(),
                    _ => None,
                });
            if let Some(d) = shape.and_then(|s| pick(&mut s.dim, dim)) {
                d.value = Some(dimension::Value::DimValue(value));
            }
        }
        ModelEdit::Rewire { node, slot, from } => {
            if let (Some(input), false) = (
                pick(&mut g.node, node).and_then(|n| pick(&mut n.input, slot)),
                names.is_empty(),
            ) {
                *input = names[from % names.len()].clone();
            }
        }
        ModelEdit::DropInput { node, slot } => {
            if let Some(n) = pick(&mut g.node, node) {
                if !n.input.is_empty() {
                    let i = slot % n.input.len();
                    n.input.remove(i);
                }
            }
        }
        ModelEdit::OpType { node, op } => {
            if let Some(n) = pick(&mut g.node, node) {
                n.op_type = Some(op.to_string());
            }
        }
    }
}

fn edited_model() -> impl Strategy<Value = (usize, Vec<ModelEdit>)> {
    (
        0..onnx_seeds().len(),
        prop::collection::vec(model_edit(), 1..4),
    )
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn edited_onnx_models_never_panic((seed, edits) in edited_model()) {
        use prost::Message as _;
        let Ok(mut m) = isolane_engine::onnx::proto::ModelProto::decode(onnx_seeds()[seed].as_slice()) else {
            return Ok(()); // one of the bad fixtures
        };
        for e in &edits {
            edit_model(&mut m, e);
        }
        if let Ok(model) = OnnxModel::from_proto(m, Path::new("/nonexistent/fuzz.onnx")) {
            let _ = import(&model);
        }
    }

    #[test]
    fn mutated_npy_files_never_panic(bytes in mutated(npy_seeds())) {
        let _ = parse_npy(&bytes);
    }

    #[test]
    fn assembled_npy_headers_never_panic(bytes in assembled_npy()) {
        let _ = parse_npy(&bytes);
    }

    #[test]
    fn mutated_safetensors_files_never_panic(bytes in mutated(safetensors_seeds())) {
        load_safetensors(&bytes);
    }

    #[test]
    fn assembled_safetensors_headers_never_panic(bytes in assembled_safetensors()) {
        load_safetensors(&bytes);
    }

    #[test]
    fn mutated_onnx_files_never_panic(bytes in mutated(onnx_seeds())) {
        load_onnx(&bytes);
    }
}

/// The seeds are what the mutations start from: valid files the readers accept.
#[test]
fn the_seeds_load() {
    for b in npy_seeds() {
        parse_npy(b).unwrap();
    }
    for b in safetensors_seeds() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("w.safetensors");
        std::fs::write(&p, b).unwrap();
        assert!(!read_safetensors(&p).unwrap().is_empty());
    }
    let valid = std::fs::read(fixtures().join("conv_basic_op13.onnx")).unwrap();
    import(&OnnxModel::from_bytes(&valid, &fixtures().join("conv_basic_op13.onnx")).unwrap())
        .unwrap();
}

/// Found by `edited_onnx_models_never_panic`: a Slice step at the edge of i64 overflowed the
/// length computation. One element is taken, whatever the direction.
#[test]
fn a_slice_step_at_the_edge_of_i64_takes_one_element() {
    use isolane_engine::ir::slice_params;
    let p = slice_params(&[5], &[0], &[5], &[0], &[i64::MAX]).unwrap();
    assert_eq!(p, vec![(0, i64::MAX, 1)]);
    let p = slice_params(&[5], &[4], &[-6], &[0], &[i64::MIN]).unwrap();
    assert_eq!(p, vec![(4, i64::MIN, 1)]);
    let p = slice_params(&[5], &[0], &[5], &[0], &[2]).unwrap();
    assert_eq!(p, vec![(0, 2, 3)]);
}

/// Found by `edited_onnx_models_never_panic`: a window whose dilation × kernel or padded size
/// passes usize fits nowhere (an error upstream), instead of overflowing.
#[test]
fn a_window_past_usize_fits_nowhere() {
    use isolane_engine::ir::window_out;
    assert_eq!(window_out(8, 3, 1, 0, 0, usize::MAX, false), None);
    assert_eq!(window_out(8, 3, 1, usize::MAX, 1, 1, true), None);
    assert_eq!(window_out(8, 3, 1, 1, 1, 1, false), Some(8));
}

/// Found by `edited_onnx_models_never_panic`: element counts of shapes from model files are
/// counted with overflow checks.
#[test]
fn an_element_count_past_usize_is_none() {
    use isolane_engine::ir::checked_numel;
    assert_eq!(checked_numel(&[2, 3, 4]), Some(24));
    assert_eq!(checked_numel(&[]), Some(1));
    assert_eq!(checked_numel(&[usize::MAX, 2]), None);
    assert_eq!(checked_numel(&[usize::MAX, 0]), Some(0));
}
