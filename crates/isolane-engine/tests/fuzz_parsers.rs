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
//!
//! The footprint target builds small ONNX graphs with crafted sizes (pads, resizes, expands,
//! concats, reshapes, pools, slices, constants and GatherNDs folded at import, at and past every
//! bound) and sends them through
//! import and the footprint check (what `infer` and `run` do before compiling): each case must
//! return a footprint or an error without a panic, and allocate at most 1 GiB at once (counted
//! by this binary's allocator).

mod common;

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

/// The import error of the fixture `name` with its first input's dimension `dim` edited to
/// `value`, as `edited_onnx_models_never_panic` edits it.
fn import_error_with_input_dim(name: &str, dim: usize, value: i64) -> String {
    use prost::Message as _;
    let path = fixtures().join(name);
    let bytes = std::fs::read(&path).unwrap();
    let mut m = isolane_engine::onnx::proto::ModelProto::decode(bytes.as_slice()).unwrap();
    edit_model(
        &mut m,
        &ModelEdit::InputDim {
            input: 0,
            dim,
            value,
        },
    );
    let model = OnnxModel::from_proto(m, &path).unwrap();
    import(&model)
        .expect_err("the edited model is refused")
        .to_string()
}

/// Found by `edited_onnx_models_never_panic`: a cubic Resize resized at run time builds a
/// weight matrix per axis (input × output); an input edited to 2^31 rows asked for one past
/// usize and panicked in the allocation. It is the model's error now, naming the Resize.
#[test]
fn a_cubic_resize_too_large_to_weigh_is_the_models_error() {
    for value in [1i64 << 31, 1 << 20] {
        // The height alone: the input itself stays within the importer's size limit.
        let err = import_error_with_input_dim("resize_cubic_runtime_scales_op13.onnx", 2, value);
        assert!(err.contains("cubic Resize"), "{err}");
    }
}

/// Found by `edited_onnx_models_never_panic`: a recurrence is unrolled a time step at a time,
/// and an LSTM whose sequence an edit made 2^31 steps long allocated per step (176 GiB) before
/// anything else refused it. A sequence past the unrolling cap is the model's error now.
#[test]
fn a_recurrence_too_long_to_unroll_is_the_models_error() {
    for value in [1i64 << 31, 1 << 15] {
        // The fixture's input is [batch, sequence, features], transposed for the LSTM.
        let err = import_error_with_input_dim("lstm_forward_op14.onnx", 1, value);
        assert!(err.contains("steps"), "{err}");
    }
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

// Each case is held to a memory cap: what the footprint check and the import allocate is
// measured (on this thread: import and footprint run on the caller's), not assumed.
#[global_allocator]
static COUNTING: isolane_core::fuzz::alloc::ThreadCounting =
    isolane_core::fuzz::alloc::ThreadCounting;
use isolane_core::fuzz::alloc::peak_during as peak_bytes;

/// The most a footprint case may allocate: a model of a few nodes and tiny initializers, whose
/// constants folding may make no larger than its bounds (256 MiB for one, 1 GiB in all).
const FOOTPRINT_CAP_BYTES: usize = 1 << 30;

/// One node of a crafted graph, applied to the running tensor: ops whose output size a model
/// file sets freely, with sizes at and past every bound.
#[derive(Debug, Clone)]
enum Craft {
    Pad {
        pads: [i64; 8],
        mode: &'static str,
    },
    ResizeScales([f32; 2]),
    ResizeSizes([i64; 2]),
    Expand(Vec<i64>),
    /// Joined with itself `times` times along `axis`.
    Concat {
        axis: i64,
        times: usize,
    },
    Reshape(Vec<i64>),
    /// `+ ConstantOfShape(shape)`: a constant made at import, broadcast against the tensor.
    AddConstantOfShape(Vec<i64>),
    MaxPool {
        kernel: i64,
        pad: i64,
        stride: i64,
        dilation: i64,
    },
    /// `+ GatherND(ConstantOfShape([rows, cols]), ConstantOfShape([tuples, 1]) of zeros)`: a
    /// few indices copying whole rows of a constant, folded at import.
    GatherNd {
        rows: i64,
        cols: i64,
        tuples: i64,
    },
    Slice {
        start: i64,
        end: i64,
        axis: i64,
        step: i64,
    },
}

/// Sizes past every bound: the issue's 3e4 and 1e5 pads, and values at the edge of every
/// integer type.
const CRAFT_HUGE: &[i64] = &[
    30_000,
    100_000,
    1 << 20,
    1 << 31,
    1 << 40,
    i64::MAX,
    i64::MIN,
];

const CRAFT_SCALES: &[f32] = &[
    1.0,
    0.5,
    2.0,
    3.0,
    5000.0,
    9999.0,
    1e4,
    1e30,
    0.0,
    -1.0,
    f32::NAN,
];

/// A size a real model would use for this field (most cases), or one past every bound (one in
/// five), so that most graphs import and reach the footprint with some huge tensors in them.
fn size(normal: &'static [i64]) -> impl Strategy<Value = i64> {
    prop_oneof![
        4 => prop::sample::select(normal),
        1 => prop::sample::select(CRAFT_HUGE),
    ]
}

fn sizes(normal: &'static [i64], len: std::ops::Range<usize>) -> impl Strategy<Value = Vec<i64>> {
    prop::collection::vec(size(normal), len)
}

fn craft() -> impl Strategy<Value = Craft> {
    prop_oneof![
        (
            prop::array::uniform8(size(&[0, 1, 2, 3, -1])),
            prop::sample::select(&["constant", "constant", "constant", "edge", "reflect"][..])
        )
            .prop_map(|(pads, mode)| Craft::Pad { pads, mode }),
        prop::array::uniform2(prop::sample::select(CRAFT_SCALES)).prop_map(Craft::ResizeScales),
        prop::array::uniform2(size(&[1, 4, 16])).prop_map(Craft::ResizeSizes),
        sizes(&[1, 1, 1, 2, 3], 4..6).prop_map(Craft::Expand),
        (-4i64..4, 1usize..4).prop_map(|(axis, times)| Craft::Concat { axis, times }),
        sizes(&[0, 0, -1, 1, 2], 1..5).prop_map(Craft::Reshape),
        sizes(&[1, 1, 1, 2, 3], 1..5).prop_map(Craft::AddConstantOfShape),
        (
            size(&[1, 2, 3]),
            size(&[0, 1]),
            size(&[1, 2]),
            size(&[1, 2])
        )
            .prop_map(|(kernel, pad, stride, dilation)| Craft::MaxPool {
                kernel,
                pad,
                stride,
                dilation
            }),
        (size(&[1, 2]), size(&[1, 8]), size(&[1, 2, 3]))
            .prop_map(|(rows, cols, tuples)| { Craft::GatherNd { rows, cols, tuples } }),
        (
            size(&[0, 1, -1]),
            size(&[1, 2, -1]),
            1i64..4,
            size(&[1, 2, -1])
        )
            .prop_map(|(start, end, axis, step)| Craft::Slice {
                start,
                end,
                axis,
                step
            }),
    ]
}

/// An input of 4 dims (some past every bound), a dynamic batch or not, 1 to 4 crafted nodes,
/// and the batch the footprint is asked for.
fn crafted_model() -> impl Strategy<Value = ([i64; 4], bool, Vec<Craft>, usize)> {
    (
        prop::array::uniform4(prop_oneof![
            8 => prop::sample::select(&[1i64, 2, 3, 8, 16][..]),
            1 => prop::sample::select(&[224i64, 1 << 20, 1 << 31][..]),
        ]),
        any::<bool>(),
        prop::collection::vec(craft(), 1..5),
        prop_oneof![
            4 => prop::sample::select(&[1usize, 2, 7][..]),
            1 => prop::sample::select(&[1usize << 20, 1 << 40, usize::MAX][..]),
        ],
    )
}

/// The ONNX model of a crafted graph: `t0` (the input) through the nodes to `y`.
fn build_crafted(
    dims: [i64; 4],
    dynamic: bool,
    nodes: &[Craft],
) -> isolane_engine::onnx::proto::ModelProto {
    use isolane_engine::onnx::proto::{
        attribute_proto::AttributeType, tensor_proto::DataType, tensor_shape_proto::dimension,
        type_proto, AttributeProto, GraphProto, NodeProto, TensorProto,
    };
    let ints = |name: String, v: &[i64]| TensorProto {
        name: Some(name),
        dims: vec![v.len() as i64],
        data_type: Some(DataType::Int64 as i32),
        int64_data: v.to_vec(),
        ..Default::default()
    };
    let floats = |name: String, v: &[f32]| TensorProto {
        name: Some(name),
        dims: vec![v.len() as i64],
        data_type: Some(DataType::Float as i32),
        float_data: v.to_vec(),
        ..Default::default()
    };
    let attr_ints = |name: &str, v: Vec<i64>| AttributeProto {
        name: Some(name.into()),
        ints: v,
        r#type: Some(AttributeType::Ints as i32),
        ..Default::default()
    };
    let attr_int = |name: &str, v: i64| AttributeProto {
        name: Some(name.into()),
        i: Some(v),
        r#type: Some(AttributeType::Int as i32),
        ..Default::default()
    };
    let mut g = GraphProto {
        name: Some("crafted".into()),
        ..Default::default()
    };
    let mut x = common::value_info("t0", DataType::Float, &dims);
    if dynamic {
        if let Some(type_proto::Value::TensorType(t)) =
            x.r#type.as_mut().and_then(|t| t.value.as_mut())
        {
            if let Some(d) = t.shape.as_mut().and_then(|s| s.dim.first_mut()) {
                d.value = Some(dimension::Value::DimParam("batch".into()));
            }
        }
    }
    g.input.push(x);
    for (i, craft) in nodes.iter().enumerate() {
        let (t, out) = (format!("t{i}"), format!("t{}", i + 1));
        let k = |what: &str| format!("{what}{i}");
        let mut n = NodeProto {
            name: Some(format!("n{i}")),
            output: vec![out],
            ..Default::default()
        };
        let (op, inputs): (&str, Vec<String>) = match craft {
            Craft::Pad { pads, mode } => {
                g.initializer.push(ints(k("pads"), pads));
                n.attribute.push(AttributeProto {
                    name: Some("mode".into()),
                    s: Some(mode.as_bytes().to_vec()),
                    r#type: Some(AttributeType::String as i32),
                    ..Default::default()
                });
                ("Pad", vec![t, k("pads")])
            }
            Craft::ResizeScales(hw) => {
                g.initializer
                    .push(floats(k("scales"), &[1.0, 1.0, hw[0], hw[1]]));
                ("Resize", vec![t, String::new(), k("scales")])
            }
            Craft::ResizeSizes(hw) => {
                g.initializer
                    .push(ints(k("sizes"), &[dims[0], dims[1], hw[0], hw[1]]));
                ("Resize", vec![t, String::new(), String::new(), k("sizes")])
            }
            Craft::Expand(shape) => {
                g.initializer.push(ints(k("shape"), shape));
                ("Expand", vec![t, k("shape")])
            }
            Craft::Concat { axis, times } => {
                n.attribute.push(attr_int("axis", *axis));
                ("Concat", vec![t; *times + 1])
            }
            Craft::Reshape(shape) => {
                g.initializer.push(ints(k("shape"), shape));
                ("Reshape", vec![t, k("shape")])
            }
            Craft::AddConstantOfShape(shape) => {
                g.initializer.push(ints(k("shape"), shape));
                g.node.push(NodeProto {
                    name: Some(k("cos")),
                    op_type: Some("ConstantOfShape".into()),
                    input: vec![k("shape")],
                    output: vec![k("ones")],
                    ..Default::default()
                });
                ("Add", vec![t, k("ones")])
            }
            Craft::MaxPool {
                kernel,
                pad,
                stride,
                dilation,
            } => {
                n.attribute
                    .push(attr_ints("kernel_shape", vec![*kernel; 2]));
                n.attribute.push(attr_ints("pads", vec![*pad; 4]));
                n.attribute.push(attr_ints("strides", vec![*stride; 2]));
                n.attribute.push(attr_ints("dilations", vec![*dilation; 2]));
                ("MaxPool", vec![t])
            }
            Craft::GatherNd { rows, cols, tuples } => {
                g.initializer.push(ints(k("data_shape"), &[*rows, *cols]));
                g.initializer.push(ints(k("indices_shape"), &[*tuples, 1]));
                for (out, shape, value) in [
                    (k("data"), k("data_shape"), floats(String::new(), &[1.0])),
                    (k("indices"), k("indices_shape"), ints(String::new(), &[0])),
                ] {
                    let mut value = value;
                    value.name = None;
                    g.node.push(NodeProto {
                        name: Some(out.clone()),
                        op_type: Some("ConstantOfShape".into()),
                        input: vec![shape],
                        output: vec![out],
                        attribute: vec![AttributeProto {
                            name: Some("value".into()),
                            t: Some(value),
                            r#type: Some(AttributeType::Tensor as i32),
                            ..Default::default()
                        }],
                        ..Default::default()
                    });
                }
                g.node.push(NodeProto {
                    name: Some(k("gnd")),
                    op_type: Some("GatherND".into()),
                    input: vec![k("data"), k("indices")],
                    output: vec![k("table")],
                    ..Default::default()
                });
                ("Add", vec![t, k("table")])
            }
            Craft::Slice {
                start,
                end,
                axis,
                step,
            } => {
                for (what, v) in [
                    ("starts", start),
                    ("ends", end),
                    ("axes", axis),
                    ("steps", step),
                ] {
                    g.initializer.push(ints(k(what), &[*v]));
                }
                let names = ["starts", "ends", "axes", "steps"].map(k);
                ("Slice", std::iter::once(t).chain(names).collect())
            }
        };
        n.op_type = Some(op.into());
        n.input = inputs;
        g.node.push(n);
    }
    let y = format!("t{}", nodes.len());
    g.output.push(isolane_engine::onnx::proto::ValueInfoProto {
        name: Some(y),
        ..Default::default()
    });
    common::model(g)
}

/// The issue's reproducers, as crafted graphs, run first by the footprint target.
#[test]
fn the_footprint_target_holds_the_issues_reproducers() {
    let pad = |p| Craft::Pad {
        pads: [0, 0, p, p, 0, 0, p, p],
        mode: "constant",
    };
    for nodes in [
        vec![pad(100_000)],
        vec![pad(30_000)],
        vec![Craft::ResizeScales([5000.0, 5000.0])],
    ] {
        let (result, peak) = peak_bytes(|| import_and_footprint([1, 3, 8, 8], false, &nodes, 1));
        let fp = result.unwrap_or_else(|e| panic!("{nodes:?}: {e}"));
        // Past 10 GB of activations, all of it counted, none of it allocated.
        assert!(fp.min_activation_elements * 4 > 10_000_000_000, "{fp:?}");
        assert!(peak < 64 << 20, "{nodes:?}: {peak} bytes");
    }
}

/// Import then footprint of a crafted graph: the path `infer` and `run` take before compiling.
fn import_and_footprint(
    dims: [i64; 4],
    dynamic: bool,
    nodes: &[Craft],
    batch: usize,
) -> Result<isolane_engine::footprint::Footprint, String> {
    let m = build_crafted(dims, dynamic, nodes);
    let model = OnnxModel::from_proto(m, Path::new("/nonexistent/crafted.onnx"))
        .map_err(|e| e.to_string())?;
    let g = import(&model).map_err(|e| e.to_string())?;
    isolane_engine::footprint::footprint(&g, batch).map_err(|e| e.to_string())
}

proptest! {
    #![proptest_config(config())]

    /// Crafted shapes (pads, resizes, expands, tiles, huge dims, overflowing products) through
    /// import and the footprint check: never a panic, never more than [`FOOTPRINT_CAP_BYTES`],
    /// and either a footprint (whose floor holds its inputs) or an error that says something.
    #[test]
    fn crafted_shapes_through_the_footprint_check_never_panic_nor_allocate_past_a_cap(
        (dims, dynamic, nodes, batch) in crafted_model()
    ) {
        let (result, peak) = peak_bytes(|| import_and_footprint(dims, dynamic, &nodes, batch));
        prop_assert!(peak <= FOOTPRINT_CAP_BYTES, "{peak} bytes allocated at once");
        match result {
            Ok(fp) => {
                prop_assert!(fp.min_activation_elements >= fp.input_elements);
                let busiest = fp.busiest.as_ref().map_or(0, |b| b.elements);
                prop_assert_eq!(fp.min_activation_elements, fp.input_elements.saturating_add(busiest));
            }
            Err(e) => prop_assert!(e.len() > 20, "{}", e),
        }
    }
}
