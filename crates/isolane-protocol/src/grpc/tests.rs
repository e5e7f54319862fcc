//! The gRPC conversions: raw and typed contents read into the same tensors as the HTTP side's,
//! the same refusals, the response's raw outputs and `late`, the status codes, the metadata
//! messages; and that the checked-in generated code is what the .proto generates.

use super::inference::model_infer_request::{InferInputTensor, InferRequestedOutputTensor};
use super::inference::{self, InferParameter, InferTensorContents, ModelInferRequest};
use super::*;
use crate::{decode_request, encode_request, ConfigTensor, ModelState, BINARY_DATA, DEADLINE_MS};
use prost::Message;

fn limits() -> Limits {
    Limits::default()
}

fn le<T: Copy, const N: usize>(values: &[T], f: impl Fn(T) -> [u8; N]) -> Vec<u8> {
    values.iter().flat_map(|&v| f(v)).collect()
}

/// A tensor of every datatype, with the extremes of its range.
fn every_datatype() -> Vec<Tensor> {
    let t = |name: &str, dt: DataType, shape: Vec<u64>, data: Vec<u8>| {
        Tensor::new(name, dt, shape, data).unwrap()
    };
    vec![
        t("b", DataType::Bool, vec![2], vec![1, 0]),
        t("u8", DataType::Uint8, vec![2], vec![0, 255]),
        t(
            "u16",
            DataType::Uint16,
            vec![1],
            le(&[u16::MAX], u16::to_le_bytes),
        ),
        t(
            "u32",
            DataType::Uint32,
            vec![1],
            le(&[u32::MAX], u32::to_le_bytes),
        ),
        t(
            "u64",
            DataType::Uint64,
            vec![1],
            le(&[u64::MAX], u64::to_le_bytes),
        ),
        t("i8", DataType::Int8, vec![2], vec![0x80, 0x7f]),
        t(
            "i16",
            DataType::Int16,
            vec![2],
            le(&[i16::MIN, i16::MAX], i16::to_le_bytes),
        ),
        t(
            "i32",
            DataType::Int32,
            vec![1],
            le(&[i32::MIN], i32::to_le_bytes),
        ),
        t(
            "i64",
            DataType::Int64,
            vec![1],
            le(&[i64::MAX], i64::to_le_bytes),
        ),
        t(
            "f16",
            DataType::Fp16,
            vec![2],
            le(
                &[half::f16::MAX, half::f16::NEG_ZERO],
                half::f16::to_le_bytes,
            ),
        ),
        t(
            "bf16",
            DataType::Bf16,
            vec![1],
            le(&[half::bf16::from_f32(-1.5)], half::bf16::to_le_bytes),
        ),
        // Raw and typed data carry what JSON cannot: NaN and infinities.
        t(
            "f32",
            DataType::Fp32,
            vec![2, 2],
            le(
                &[f32::MAX, 0.1, f32::NAN, f32::NEG_INFINITY],
                f32::to_le_bytes,
            ),
        ),
        t(
            "f64",
            DataType::Fp64,
            vec![1],
            le(&[f64::MIN_POSITIVE], f64::to_le_bytes),
        ),
        Tensor::from_bytes_elements("s", vec![3], &["", "héllo", "\u{0}\u{ff}"]).unwrap(),
    ]
}

/// A request through the wire: encoded by prost and decoded again, as a server receives it.
fn over_the_wire(req: &ModelInferRequest) -> ModelInferRequest {
    ModelInferRequest::decode(req.encode_to_vec().as_slice()).unwrap()
}

/// Compares data bit for bit (NaN != NaN as floats).
fn same(a: &[Tensor], b: &[Tensor]) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        assert_eq!(x, y, "{}", x.name());
    }
}

fn request(inputs: Vec<InferInputTensor>, raw: Vec<Vec<u8>>) -> ModelInferRequest {
    ModelInferRequest {
        model_name: "m".into(),
        inputs,
        raw_input_contents: raw.into_iter().map(Into::into).collect(),
        ..Default::default()
    }
}

fn input(name: &str, datatype: &str, shape: &[i64]) -> InferInputTensor {
    InferInputTensor {
        name: name.into(),
        datatype: datatype.into(),
        shape: shape.to_vec(),
        ..Default::default()
    }
}

fn typed(name: &str, datatype: &str, shape: &[i64], c: InferTensorContents) -> InferInputTensor {
    InferInputTensor {
        contents: Some(c),
        ..input(name, datatype, shape)
    }
}

fn refuse(req: ModelInferRequest) -> ProtocolError {
    decode_infer_request(over_the_wire(&req), &limits(), None).unwrap_err()
}

fn refused_with(req: ModelInferRequest, parts: &[&str]) -> ProtocolError {
    let e = refuse(req);
    let text = e.to_string();
    for p in parts {
        assert!(text.contains(p), "`{text}` lacks `{p}`");
    }
    e
}

fn param(choice: ParameterChoice) -> InferParameter {
    InferParameter {
        parameter_choice: Some(choice),
    }
}

#[test]
fn every_datatype_round_trips_as_raw_contents() {
    let tensors = every_datatype();
    let mut params = Parameters::new();
    params.set_deadline_ms(250);
    params.insert("priority", Parameter::Int(2));
    let outputs = [
        OutputChoice {
            name: "o".into(),
            binary: None,
        },
        OutputChoice {
            name: "p".into(),
            binary: Some(true),
        },
    ];
    let req = encode_infer_request(
        "m",
        Some("2"),
        Some("r1"),
        &params,
        &tensors,
        Some(&outputs),
    )
    .unwrap();
    let got = decode_infer_request(over_the_wire(&req), &limits(), None).unwrap();
    assert_eq!(got.model_name, "m");
    assert_eq!(got.model_version.as_deref(), Some("2"));
    let r = &got.request;
    assert_eq!(r.id.as_deref(), Some("r1"));
    assert_eq!(r.deadline_ms, Some(250.0));
    assert_eq!(r.parameters, params);
    same(&r.inputs, &tensors);
    assert_eq!(r.outputs.requested.as_deref(), Some(&outputs[..]));

    // No version, id or outputs: none, none, and every output.
    let req = encode_infer_request("m", None, None, &Parameters::new(), &tensors, None).unwrap();
    let got = decode_infer_request(over_the_wire(&req), &limits(), None).unwrap();
    assert_eq!(got.model_version, None);
    assert_eq!(got.request.id, None);
    assert_eq!(got.request.deadline_ms, None);
    assert_eq!(got.request.outputs.requested, None);
}

#[test]
fn raw_contents_decode_as_the_binary_extension_does() {
    // The same tensors through HTTP's binary extension and through gRPC's raw contents.
    let tensors = every_datatype();
    let mut params = Parameters::new();
    params.set_deadline_ms(40);
    let with_binary: Vec<(&Tensor, bool)> = tensors.iter().map(|t| (t, true)).collect();
    let body = encode_request(Some("x"), &params, &with_binary, None).unwrap();
    let http = decode_request(&body.body, body.header_len, &limits()).unwrap();
    let req = encode_infer_request("m", None, Some("x"), &params, &tensors, None).unwrap();
    let grpc = decode_infer_request(over_the_wire(&req), &limits(), None).unwrap();
    assert_eq!(grpc.request, http);
}

#[test]
fn every_datatype_with_a_typed_field_round_trips_as_typed_contents() {
    let tensors: Vec<Tensor> = every_datatype()
        .into_iter()
        .filter(|t| !matches!(t.datatype(), DataType::Fp16 | DataType::Bf16))
        .collect();
    let inputs = tensors
        .iter()
        .map(|t| InferInputTensor {
            name: t.name().into(),
            datatype: t.datatype().name().into(),
            shape: t.shape().iter().map(|&d| d as i64).collect(),
            parameters: Default::default(),
            contents: Some(typed_contents(t).unwrap()),
        })
        .collect();
    let got =
        decode_infer_request(over_the_wire(&request(inputs, vec![])), &limits(), None).unwrap();
    same(&got.request.inputs, &tensors);

    // FP16 and BF16 have no typed field: refused, pointing at the raw contents.
    for t in every_datatype()
        .iter()
        .filter(|t| matches!(t.datatype(), DataType::Fp16 | DataType::Bf16))
    {
        assert_eq!(typed_contents(t), None);
        let dt = t.datatype().name();
        let e = refused_with(
            request(vec![typed(t.name(), dt, &[1], Default::default())], vec![]),
            &[
                "`contents`",
                &format!("{dt} has no typed contents field"),
                "`raw_input_contents`",
            ],
        );
        assert_eq!(e.grpc_code(), GrpcCode::InvalidArgument);
    }
}

#[test]
fn typed_contents_are_checked_against_the_datatype_and_shape() {
    let ints = |v: Vec<i32>| InferTensorContents {
        int_contents: v,
        ..Default::default()
    };
    // Narrow integer types travel as int32/uint32 and must fit.
    refused_with(
        request(vec![typed("x", "INT8", &[2], ints(vec![1, 200]))], vec![]),
        &[
            "input `x`",
            "`contents.int_contents`",
            "element 1 (200) is out of INT8's range",
        ],
    );
    refused_with(
        request(
            vec![typed(
                "x",
                "UINT16",
                &[1],
                InferTensorContents {
                    uint_contents: vec![70000],
                    ..Default::default()
                },
            )],
            vec![],
        ),
        &["element 0 (70000) is out of UINT16's range"],
    );
    // The element count must be the shape's.
    refused_with(
        request(vec![typed("x", "INT32", &[3], ints(vec![1, 2]))], vec![]),
        &[
            "`contents.int_contents`",
            "2 elements, but shape [3] holds 3",
        ],
    );
    // Elements in another type's field.
    refused_with(
        request(vec![typed("x", "FP32", &[2], ints(vec![1, 2]))], vec![]),
        &[
            "`contents.int_contents`",
            "has 2 elements; FP32 elements go in `contents.fp32_contents`",
        ],
    );
    // No data at all, unless the tensor is empty.
    refused_with(
        request(vec![input("x", "FP32", &[2])], vec![]),
        &["input `x`", "`contents`", "missing"],
    );
    let empty = decode_infer_request(
        over_the_wire(&request(vec![input("x", "FP32", &[0, 3])], vec![])),
        &limits(),
        None,
    )
    .unwrap();
    assert_eq!(empty.request.inputs[0].shape(), &[0, 3]);
    assert!(empty.request.inputs[0].data().is_empty());
}

#[test]
fn raw_contents_are_checked_as_binary_data() {
    let f32s = le(&[1.0f32, 2.0], f32::to_le_bytes);
    // One entry per input.
    refused_with(
        request(
            vec![input("a", "FP32", &[2]), input("b", "FP32", &[2])],
            vec![f32s.clone()],
        ),
        &[
            "the request",
            "`raw_input_contents`",
            "has 1 entries, but there are 2 inputs",
        ],
    );
    // Each entry's size is the shape's.
    refused_with(
        request(vec![input("a", "FP32", &[2])], vec![f32s[..7].to_vec()]),
        &[
            "input `a`",
            "`raw_input_contents`",
            "7 bytes, but shape [2] of FP32 takes 2 x 4 = 8 bytes",
        ],
    );
    // BOOL bytes are 0 or 1; BYTES lengths stay inside the data.
    refused_with(
        request(vec![input("b", "BOOL", &[2])], vec![vec![1, 2]]),
        &["BOOL element 1 is the byte 2"],
    );
    refused_with(
        request(
            vec![input("s", "BYTES", &[1])],
            vec![vec![9, 0, 0, 0, b'a']],
        ),
        &["BYTES element 0 is 9 bytes long, past the end"],
    );
    // Raw and typed data together.
    let mut both = request(vec![input("a", "FP32", &[2])], vec![f32s]);
    both.inputs[0].contents = Some(InferTensorContents {
        fp32_contents: vec![1.0, 2.0],
        ..Default::default()
    });
    refused_with(
        both,
        &["`contents`", "given as well as `raw_input_contents`"],
    );
}

#[test]
fn headers_are_checked_as_the_http_side_checks_them() {
    let one = || vec![le(&[1.0f32], f32::to_le_bytes)];
    // tritonclient's sequence_id goes as an int64 parameter; no served model takes one.
    let mut in_sequence = request(vec![input("x", "FP32", &[1])], one());
    in_sequence
        .parameters
        .insert("sequence_id".into(), param(ParameterChoice::Int64Param(7)));
    let e = refused_with(in_sequence, &["`sequence_id`", "sequence model"]);
    assert_eq!(e.grpc_code(), crate::GrpcCode::InvalidArgument);
    refused_with(
        request(vec![input("x", "FP33", &[1])], one()),
        &["input `x`", "`datatype`", "unknown datatype `FP33`", "FP32"],
    );
    refused_with(
        request(vec![input("x", "FP32", &[-1])], one()),
        &["`shape`", "dimension 0 is -1"],
    );
    refused_with(
        request(vec![input("x", "FP32", &[1; 65])], one()),
        &["`shape`", "has 65 dimensions; a shape has at most 64"],
    );
    refused_with(
        request(vec![input("", "FP32", &[1])], one()),
        &["`name`", "is empty"],
    );
    let e = refuse(request(
        vec![input("x", "FP32", &[1]), input("x", "FP32", &[1])],
        vec![one()[0].clone(), one()[0].clone()],
    ));
    assert_eq!(
        e,
        ProtocolError::Duplicate {
            kind: "input",
            name: "x".into()
        }
    );
    // Outputs: unique names; classification read.
    let mut req = request(vec![input("x", "FP32", &[1])], one());
    req.outputs = vec![
        InferRequestedOutputTensor {
            name: "y".into(),
            parameters: Default::default(),
        },
        InferRequestedOutputTensor {
            name: "y".into(),
            parameters: Default::default(),
        },
    ];
    assert_eq!(
        refuse(req.clone()),
        ProtocolError::Duplicate {
            kind: "output",
            name: "y".into()
        }
    );
    req.outputs.pop();
    req.outputs[0].parameters.insert(
        "classification".into(),
        param(ParameterChoice::Int64Param(3)),
    );
    let got = decode_infer_request(over_the_wire(&req), &limits(), None).unwrap();
    assert_eq!(got.request.outputs.classes("y"), Some(3));
    // Answered as the top classes, BYTES of shape [rows, k], as tritonclient reads them.
    let y = Tensor::new(
        "y",
        DataType::Fp32,
        vec![1, 3],
        [0.5f32, 2.0, 1.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
    )
    .unwrap();
    let meta = ResponseMeta {
        model_name: "m".into(),
        model_version: Some("1".into()),
        id: None,
        parameters: Parameters::new(),
    };
    let resp = encode_infer_response(&meta, vec![y], &got.request.outputs).unwrap();
    assert_eq!(resp.outputs[0].datatype, "BYTES");
    assert_eq!(resp.outputs[0].shape, vec![1, 3]);
    let mut want = Vec::new();
    for s in ["2.000000:1", "1.000000:2", "0.500000:0"] {
        want.extend_from_slice(&(s.len() as u32).to_le_bytes());
        want.extend_from_slice(s.as_bytes());
    }
    assert_eq!(&resp.raw_output_contents[0][..], &want[..]);
    req.outputs[0].parameters.insert(
        "classification".into(),
        param(ParameterChoice::StringParam("3".into())),
    );
    refused_with(req, &["`classification`", "number of top classes"]);
}

#[test]
fn shared_memory_is_refused_by_name() {
    let mut x = input("x", "FP32", &[1]);
    x.parameters.insert(
        "shared_memory_region".into(),
        param(ParameterChoice::StringParam("r".into())),
    );
    let e = refused_with(
        request(vec![x], vec![]),
        &["the shared memory extension", "`shared_memory_region`"],
    );
    assert_eq!(e.grpc_code(), GrpcCode::InvalidArgument);
}

/// Regions in memory, as a server's registry holds them; counts the reads.
struct Regions {
    regions: Vec<(&'static str, Vec<u8>)>,
    reads: std::cell::Cell<usize>,
}

impl Regions {
    fn new(regions: Vec<(&'static str, Vec<u8>)>) -> Regions {
        Regions {
            regions,
            reads: std::cell::Cell::new(0),
        }
    }
}

impl SharedMemory for Regions {
    fn read(&self, r: &SharedRef, what: &str) -> Result<bytes::Bytes, ProtocolError> {
        self.reads.set(self.reads.get() + 1);
        let (_, bytes) = self
            .regions
            .iter()
            .find(|(n, _)| *n == r.region)
            .ok_or_else(|| ProtocolError::Refused {
                reason: format!("{what}: no region `{}`", r.region),
            })?;
        bytes
            .get(r.offset as usize..(r.offset + r.byte_size) as usize)
            .map(bytes::Bytes::copy_from_slice)
            .ok_or_else(|| ProtocolError::Refused {
                reason: format!("{what}: past region `{}`", r.region),
            })
    }
}

/// Parameters naming `byte_size` bytes at `offset` of `region` (no offset parameter for 0, as
/// tritonclient leaves it out).
fn in_region(region: &str, offset: i64, byte_size: i64) -> BTreeMap<String, InferParameter> {
    let mut p = BTreeMap::new();
    p.insert(
        SHARED_MEMORY[0].to_owned(),
        param(ParameterChoice::StringParam(region.into())),
    );
    p.insert(
        SHARED_MEMORY[1].to_owned(),
        param(ParameterChoice::Int64Param(byte_size)),
    );
    if offset != 0 {
        p.insert(
            SHARED_MEMORY[2].to_owned(),
            param(ParameterChoice::Int64Param(offset)),
        );
    }
    p
}

fn f32s(values: &[f32]) -> Vec<u8> {
    le(values, f32::to_le_bytes)
}

/// As tritonclient sends it: `a` and `c` in region `in` (no raw entry), `b` raw between them;
/// output `y` asked for in region `out`, `z` in the response.
fn shared_request() -> ModelInferRequest {
    let mut a = input("a", "FP32", &[2, 2]);
    a.parameters = in_region("in", 8, 16);
    let b = input("b", "INT32", &[1]);
    let mut c = input("c", "FP32", &[1]);
    c.parameters = in_region("in", 0, 4);
    let mut req = request(vec![a, b, c], vec![le(&[-7i32], i32::to_le_bytes)]);
    req.outputs = vec![
        InferRequestedOutputTensor {
            name: "y".into(),
            parameters: in_region("out", 4, 8),
        },
        InferRequestedOutputTensor {
            name: "z".into(),
            parameters: BTreeMap::new(),
        },
    ];
    req
}

fn shared_regions() -> Regions {
    let mut bytes = f32s(&[9.0, 0.0]);
    bytes.extend(f32s(&[1.0, 2.0, 3.0, 4.0]));
    Regions::new(vec![("in", bytes)])
}

#[test]
fn shared_memory_inputs_are_read_from_their_region_and_outputs_named_there() {
    let shm = shared_regions();
    let got = decode_infer_request(over_the_wire(&shared_request()), &limits(), Some(&shm))
        .unwrap()
        .request;
    assert_eq!(shm.reads.get(), 2);
    assert_eq!(got.inputs[0].data(), &f32s(&[1.0, 2.0, 3.0, 4.0])[..]);
    assert_eq!(got.inputs[1].data(), &(-7i32).to_le_bytes()[..]);
    assert_eq!(got.inputs[2].data(), &f32s(&[9.0])[..]);
    let y = SharedRef {
        region: "out".into(),
        offset: 4,
        byte_size: 8,
    };
    assert_eq!(got.outputs.shared, vec![("y".to_string(), y.clone())]);
    let asked: Vec<_> = got.outputs.requested.iter().flatten().collect();
    assert_eq!(asked.len(), 2);

    // The response names `y`'s region with an empty raw entry, so that `z` and `w` keep
    // their places (tritonclient finds an output's raw entry by the output's place).
    let outputs = vec![
        Tensor::new("z", DataType::Fp32, vec![1], f32s(&[5.0])).unwrap(),
        Tensor::new("y", DataType::Fp32, vec![2], f32s(&[6.0, 7.0])).unwrap(),
        Tensor::new("w", DataType::Uint8, vec![2], vec![1, 2]).unwrap(),
    ];
    let resp = encode_infer_response(&ResponseMeta::default(), outputs, &got.outputs).unwrap();
    let resp = inference::ModelInferResponse::decode(resp.encode_to_vec().as_slice()).unwrap();
    assert_eq!(
        resp.raw_output_contents,
        vec![f32s(&[5.0]), vec![], vec![1, 2]]
            .into_iter()
            .map(bytes::Bytes::from)
            .collect::<Vec<_>>()
    );
    assert_eq!(resp.outputs[1].name, "y");
    assert_eq!(resp.outputs[1].shape, vec![2]);
    assert_eq!(
        parameters_from_grpc(resp.outputs[1].parameters.clone(), "y").unwrap(),
        y.parameters()
    );
    assert!(resp.outputs[0].parameters.is_empty());
    // A client without the extension refuses such a response by name, as over HTTP.
    let e = decode_infer_response(resp, &limits()).unwrap_err();
    assert!(e.to_string().contains("shared_memory_region"), "{e}");

    // Every input in shared memory: no raw entries at all.
    let mut req = shared_request();
    req.inputs.remove(1);
    req.raw_input_contents.clear();
    let got = decode_infer_request(over_the_wire(&req), &limits(), Some(&shm)).unwrap();
    assert_eq!(got.request.inputs.len(), 2);
}

#[test]
fn shared_memory_references_are_checked_and_refused_without_the_extension() {
    let shm = shared_regions();
    let refuse_shm = |req: ModelInferRequest, part: &str| {
        let e = decode_infer_request(over_the_wire(&req), &limits(), Some(&shm)).unwrap_err();
        assert!(e.to_string().contains(part), "`{e}` lacks `{part}`");
        e
    };
    // Without the extension, an output's region is refused by name as an input's is.
    let mut req = shared_request();
    req.inputs.truncate(2);
    req.inputs[0].parameters.clear();
    req.raw_input_contents = vec![vec![0; 16].into(), vec![0; 4].into()];
    let e = refuse(req);
    assert!(
        e.to_string().contains("the shared memory extension") && e.to_string().contains("`y`"),
        "{e}"
    );
    // A raw entry for a shared input too: the count says which inputs take one.
    let mut req = shared_request();
    req.raw_input_contents.push(vec![0; 4].into());
    refuse_shm(
        req,
        "has 2 entries, but 1 of the 3 inputs are not in shared memory",
    );
    // Typed contents as well as a region.
    let mut req = shared_request();
    req.inputs[2].contents = Some(InferTensorContents {
        fp32_contents: vec![1.0],
        ..Default::default()
    });
    refuse_shm(req, "and so is parameter `shared_memory_region`");
    // A byte size that is not the shape's, an unknown region, a range past it.
    let mut req = shared_request();
    req.inputs[0].parameters = in_region("in", 8, 12);
    refuse_shm(req, "input `a`");
    let mut req = shared_request();
    req.inputs[0].parameters = in_region("nope", 0, 16);
    refuse_shm(req, "no region `nope`");
    let mut req = shared_request();
    req.inputs[0].parameters = in_region("in", 16, 16);
    refuse_shm(req, "past region `in`");
    // A region without its byte size, a byte size without its region, a negative offset.
    let mut req = shared_request();
    req.inputs[0].parameters.remove(SHARED_MEMORY[1]);
    refuse_shm(
        req,
        "input `a`: parameter `shared_memory_byte_size`: is missing",
    );
    let mut req = shared_request();
    req.outputs[0].parameters.remove(SHARED_MEMORY[0]);
    refuse_shm(
        req,
        "output `y`: parameter `shared_memory_region`: is missing",
    );
    let mut req = shared_request();
    req.inputs[2].parameters = in_region("in", -4, 4);
    refuse_shm(
        req,
        "`shared_memory_offset`: is -4; a byte count is 0 or more",
    );
    // A byte size past the request's limit is refused before the region is read.
    let small = Limits {
        max_tensor_bytes: 8,
        ..limits()
    };
    let reads = shm.reads.get();
    let e = decode_infer_request(over_the_wire(&shared_request()), &small, Some(&shm)).unwrap_err();
    assert!(matches!(e, ProtocolError::TooLarge { limit: 8, .. }), "{e}");
    assert_eq!(shm.reads.get(), reads);
}

#[test]
fn the_limits_are_checked_before_data_is_taken() {
    let small = Limits {
        max_tensor_bytes: 16,
        max_body_bytes: 1 << 20,
        max_batch: None,
    };
    // A shape past the limit is refused from its header, whatever data follows.
    let req = request(vec![input("x", "FP32", &[1 << 40])], vec![vec![0; 4]]);
    let e = decode_infer_request(over_the_wire(&req), &small, None).unwrap_err();
    assert!(
        matches!(e, ProtocolError::TooLarge { limit: 16, .. }),
        "{e}"
    );
    assert_eq!(e.grpc_code(), GrpcCode::ResourceExhausted);
    // The inputs count together.
    let req = request(
        vec![input("a", "FP32", &[3]), input("b", "FP32", &[2])],
        vec![vec![0; 12], vec![0; 8]],
    );
    let e = decode_infer_request(over_the_wire(&req), &small, None).unwrap_err();
    assert!(
        e.to_string().contains("input `b`") && e.to_string().contains("20 bytes"),
        "{e}"
    );
    // BYTES: counted as read.
    let req = request(
        vec![typed(
            "s",
            "BYTES",
            &[1],
            InferTensorContents {
                bytes_contents: vec![vec![b'z'; 13]],
                ..Default::default()
            },
        )],
        vec![],
    );
    let e = decode_infer_request(over_the_wire(&req), &small, None).unwrap_err();
    assert!(matches!(e, ProtocolError::TooLarge { size: 17, .. }), "{e}");
    // Too many inputs.
    let many = (0..=MAX_TENSORS)
        .map(|i| input(&format!("x{i}"), "FP32", &[0]))
        .collect();
    refused_with(request(many, vec![]), &["`inputs`", "at most 4096"]);
}

#[test]
fn parameters_are_read_and_checked() {
    let mut req = request(vec![], vec![]);
    // tritonclient may send a deadline as uint64; it is an integer like int64.
    req.parameters
        .insert(DEADLINE_MS.into(), param(ParameterChoice::Uint64Param(75)));
    req.parameters
        .insert("w".into(), param(ParameterChoice::DoubleParam(0.5)));
    let got = decode_infer_request(over_the_wire(&req), &limits(), None).unwrap();
    assert_eq!(got.request.deadline_ms, Some(75.0));
    assert_eq!(
        got.request.parameters.get("w"),
        Some(&Parameter::Double(0.5))
    );

    req.parameters
        .insert(DEADLINE_MS.into(), param(ParameterChoice::Int64Param(0)));
    refused_with(
        req.clone(),
        &["`deadline_ms`", "is 0; a deadline is a positive"],
    );
    // A fraction of a millisecond is a deadline too (a critical model's may be 1.5 ms).
    req.parameters
        .insert(DEADLINE_MS.into(), param(ParameterChoice::DoubleParam(7.5)));
    let got = decode_infer_request(over_the_wire(&req), &limits(), None).unwrap();
    assert_eq!(got.request.deadline_ms, Some(7.5));
    // perf_analyzer's `--request-parameter deadline_ms:7.5:string`: the number it holds.
    req.parameters.insert(
        DEADLINE_MS.into(),
        param(ParameterChoice::StringParam("7.5".into())),
    );
    let got = decode_infer_request(over_the_wire(&req), &limits(), None).unwrap();
    assert_eq!(got.request.deadline_ms, Some(7.5));
    req.parameters.insert(
        DEADLINE_MS.into(),
        param(ParameterChoice::StringParam("7 ms".into())),
    );
    refused_with(
        req.clone(),
        &[
            "`deadline_ms`",
            "is the string \"7 ms\", which is not a decimal number",
        ],
    );
    req.parameters
        .insert(DEADLINE_MS.into(), param(ParameterChoice::BoolParam(true)));
    refused_with(
        req.clone(),
        &["`deadline_ms`", "it is a number of milliseconds"],
    );
    // NaN and the infinities are doubles, but no deadline: not "a number with a fraction".
    for x in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        req.parameters
            .insert(DEADLINE_MS.into(), param(ParameterChoice::DoubleParam(x)));
        refused_with(
            req.clone(),
            &["`deadline_ms`", "a positive, finite number of milliseconds"],
        );
    }
    req.parameters.insert(
        DEADLINE_MS.into(),
        param(ParameterChoice::Uint64Param(u64::MAX)),
    );
    refused_with(req.clone(), &["`deadline_ms`", "past the int64 range"]);
    req.parameters
        .insert(DEADLINE_MS.into(), InferParameter::default());
    refused_with(req.clone(), &["`deadline_ms`", "has no value"]);
    req.parameters.clear();
    for i in 0..=MAX_PARAMETERS {
        req.parameters
            .insert(format!("p{i}"), param(ParameterChoice::BoolParam(true)));
    }
    refused_with(req, &["the request", "`parameters`", "at most 64"]);
}

#[test]
fn a_response_carries_raw_outputs_and_late() {
    let outputs = every_datatype();
    let mut meta = ResponseMeta {
        model_name: "m".into(),
        model_version: Some("1".into()),
        id: Some("r9".into()),
        parameters: Parameters::new(),
    };
    meta.parameters.set_late(true);
    let resp = encode_infer_response(&meta, outputs.clone(), &OutputSelection::default()).unwrap();
    assert_eq!(
        resp.parameters.get("late"),
        Some(&param(ParameterChoice::BoolParam(true)))
    );
    assert_eq!(resp.raw_output_contents.len(), outputs.len());
    assert_eq!(resp.raw_output_contents[1], [0, 255][..]);
    assert!(resp.outputs.iter().all(|o| o.contents.is_none()));
    assert_eq!(resp.outputs[11].shape, vec![2, 2]);
    assert_eq!(resp.outputs[11].datatype, "FP32");
    let wire = inference::ModelInferResponse::decode(resp.encode_to_vec().as_slice()).unwrap();
    let back = decode_infer_response(wire, &limits()).unwrap();
    assert!(back.late);
    assert_eq!(back.meta, meta);
    same(&back.outputs, &outputs);

    // On time: no `late` at all (absent reads as false).
    let on_time = ResponseMeta {
        parameters: Parameters::new(),
        ..meta
    };
    let resp = encode_infer_response(&on_time, vec![], &OutputSelection::default()).unwrap();
    assert!(resp.parameters.is_empty());
    assert!(!decode_infer_response(resp, &limits()).unwrap().late);
}

#[test]
fn a_refusal_is_a_status_with_its_code_and_message() {
    let cases = [
        (
            ProtocolError::Refused {
                reason: "predicted 40 ms late".into(),
            },
            tonic::Code::ResourceExhausted,
        ),
        (
            ProtocolError::UnknownModel {
                model: "m".into(),
                version: None,
            },
            tonic::Code::NotFound,
        ),
        (
            ProtocolError::NotReady {
                reason: "draining".into(),
            },
            tonic::Code::Unavailable,
        ),
        (
            ProtocolError::Unrepresentable {
                tensor: "t".into(),
                message: "x".into(),
            },
            tonic::Code::Internal,
        ),
        (
            ProtocolError::Duplicate {
                kind: "input",
                name: "x".into(),
            },
            tonic::Code::InvalidArgument,
        ),
    ];
    for (e, code) in cases {
        let s = tonic::Status::from(&e);
        assert_eq!(s.code(), code, "{e}");
        assert_eq!(s.message(), e.to_string());
        assert_eq!(s.code() as i32, e.grpc_code().value());
    }
}

#[test]
fn the_metadata_messages_convert() {
    let server = ServerMetadata {
        name: "isolane".into(),
        version: "0.1.0".into(),
        extensions: vec!["binary_tensor_data".into()],
    };
    let s = inference::ServerMetadataResponse::from(&server);
    assert_eq!((s.name.as_str(), s.extensions.len()), ("isolane", 1));

    let meta = ModelMetadata {
        name: "m".into(),
        versions: vec!["1".into()],
        platform: "isolane".into(),
        inputs: vec![TensorMetadata {
            name: "input".into(),
            datatype: DataType::Fp32,
            shape: vec![-1, 1],
        }],
        outputs: vec![],
    };
    let m = inference::ModelMetadataResponse::from(&meta);
    assert_eq!(m.inputs[0].datatype, "FP32");
    assert_eq!(m.inputs[0].shape, vec![-1, 1]);

    let config = ModelConfig {
        name: "m".into(),
        platform: "isolane".into(),
        backend: String::new(),
        max_batch_size: 8,
        input: vec![ConfigTensor {
            name: "input".into(),
            data_type: DataType::Bytes,
            dims: vec![1],
        }],
        output: vec![ConfigTensor {
            name: "output".into(),
            data_type: DataType::Fp16,
            dims: vec![-1],
        }],
        dynamic_batching: Some(crate::DynamicBatching {
            preferred_batch_size: vec![4, 8],
            max_queue_delay_microseconds: 500,
        }),
    };
    let c = inference::ModelConfig::from(&config);
    assert_eq!(c.max_batch_size, 8);
    assert_eq!(c.input[0].data_type(), inference::DataType::TypeString);
    assert_eq!(c.output[0].data_type(), inference::DataType::TypeFp16);
    assert_eq!(c.output[0].dims, vec![-1]);
    let b = c.dynamic_batching.expect("the batching goes over gRPC too");
    assert_eq!(
        (b.preferred_batch_size, b.max_queue_delay_microseconds),
        (vec![4, 8], 500)
    );
    // The enum's numbers are the protocol's (TYPE_FP32 = 11 on the wire).
    assert_eq!(inference::DataType::from(DataType::Fp32) as i32, 11);
    assert_eq!(inference::DataType::from(DataType::Bf16) as i32, 14);

    let index = repository_index(&[
        RepositoryIndexEntry {
            name: "a".into(),
            version: None,
            state: ModelState::Ready,
            reason: String::new(),
        },
        RepositoryIndexEntry {
            name: "b".into(),
            version: Some("1".into()),
            state: ModelState::Unavailable,
            reason: "draining".into(),
        },
    ]);
    let states: Vec<&str> = index.models.iter().map(|m| m.state.as_str()).collect();
    assert_eq!(states, ["READY", "UNAVAILABLE"]);
    // The names are serde's too (the HTTP answer).
    for s in [
        ModelState::Unknown,
        ModelState::Loading,
        ModelState::Unloading,
    ] {
        assert_eq!(serde_json::to_value(s).unwrap(), s.name());
    }
    let ready = RepositoryIndexRequest::from(&inference::RepositoryIndexRequest {
        repository_name: String::new(),
        ready: true,
    });
    assert!(ready.ready);
}

#[test]
fn binary_data_output_parameters_are_read_as_on_http() {
    let mut req = request(vec![], vec![]);
    req.parameters.insert(
        "binary_data_output".into(),
        param(ParameterChoice::BoolParam(true)),
    );
    req.outputs = vec![InferRequestedOutputTensor {
        name: "y".into(),
        parameters: [(
            BINARY_DATA.to_owned(),
            param(ParameterChoice::Int64Param(1)),
        )]
        .into(),
    }];
    refused_with(req, &["output `y`", "`binary_data`", "it is a boolean"]);
}

/// The gRPC decoders' fuzz targets (`scripts/fuzz.sh` runs them longer): valid requests
/// round-trip through raw and typed contents, and mutated or arbitrary messages are decoded
/// into consistent tensors within the limit or refused with a 400 or 413, never a panic.
mod fuzz {
    use super::*;
    use crate::tests::fuzz::{check_refusal, check_tensors, parameters, tensors, LIMITS};
    use proptest::prelude::*;
    use proptest::sample::Index;

    /// Every tensor's data as typed contents (when all have a typed field), else raw.
    fn encode(tensors: &[Tensor], params: &Parameters, typed: bool) -> ModelInferRequest {
        let mut req = encode_infer_request("m", None, Some("r"), params, tensors, None).unwrap();
        let contents: Option<Vec<_>> = tensors.iter().map(typed_contents).collect();
        if let (true, Some(contents)) = (typed, contents) {
            req.raw_input_contents.clear();
            for (input, c) in req.inputs.iter_mut().zip(contents) {
                input.contents = Some(c);
            }
        }
        req
    }

    /// Decodes a message as a server does: refused with a 400 or 413, or decoded into
    /// consistent tensors within the limit that decode the same again and survive a
    /// re-encoding.
    fn check_request(m: ModelInferRequest) -> Result<(), TestCaseError> {
        match decode_infer_request(m.clone(), &LIMITS, None) {
            Ok(r) => {
                check_tensors(&r.request.inputs)?;
                prop_assert_eq!(decode_infer_request(m, &LIMITS, None), Ok(r.clone()));
                let again = encode_infer_request(
                    &r.model_name,
                    r.model_version.as_deref(),
                    r.request.id.as_deref(),
                    &r.request.parameters,
                    &r.request.inputs,
                    None,
                );
                prop_assert!(again.is_ok(), "{again:?}");
                let back =
                    decode_infer_request(over_the_wire(&again.unwrap()), &Limits::default(), None);
                prop_assert_eq!(back.map(|b| b.request.inputs), Ok(r.request.inputs));
            }
            Err(e) => check_refusal(&e)?,
        }
        Ok(())
    }

    fn check_response(bytes: &[u8]) -> Result<(), TestCaseError> {
        if let Ok(m) = inference::ModelInferResponse::decode(bytes) {
            match decode_infer_response(m, &LIMITS) {
                Ok(r) => {
                    check_tensors(&r.outputs)?;
                }
                Err(e) => check_refusal(&e)?,
            }
        }
        Ok(())
    }

    #[derive(Debug, Clone)]
    enum Mutation {
        Set(Index, u8),
        Insert(Index, Vec<u8>),
        Delete(Index, usize),
        Truncate(Index),
    }

    fn mutation() -> impl Strategy<Value = Mutation> {
        prop_oneof![
            (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Mutation::Set(i, b)),
            (any::<Index>(), prop::collection::vec(any::<u8>(), 1..6))
                .prop_map(|(i, t)| Mutation::Insert(i, t)),
            (any::<Index>(), 1usize..8).prop_map(|(i, n)| Mutation::Delete(i, n)),
            any::<Index>().prop_map(Mutation::Truncate),
        ]
    }

    fn mutate(bytes: &mut Vec<u8>, m: &Mutation) {
        let at = |i: &Index, len: usize| i.index(len + 1);
        match m {
            Mutation::Set(i, b) => {
                if !bytes.is_empty() {
                    let k = i.index(bytes.len());
                    bytes[k] = *b;
                }
            }
            Mutation::Insert(i, t) => {
                let k = at(i, bytes.len());
                bytes.splice(k..k, t.iter().copied());
            }
            Mutation::Delete(i, n) => {
                let k = at(i, bytes.len());
                let end = (k + n).min(bytes.len());
                bytes.drain(k..end);
            }
            Mutation::Truncate(i) => {
                let k = at(i, bytes.len());
                bytes.truncate(k);
            }
        }
    }

    proptest! {
        #![proptest_config(isolane_core::fuzz::config(500))]

        #[test]
        fn fuzz_grpc_requests_round_trip_raw_and_typed(
            tensors in tensors(),
            params in parameters(),
            typed in any::<bool>(),
            late in any::<bool>(),
        ) {
            let req = encode(&tensors, &params, typed);
            let r = decode_infer_request(over_the_wire(&req), &LIMITS, None).unwrap();
            prop_assert_eq!(&r.request.inputs, &tensors);
            prop_assert_eq!(&r.request.parameters, &params);
            prop_assert_eq!(r.request.deadline_ms, params.deadline_ms().unwrap());
            prop_assert_eq!(r.request.id.as_deref(), Some("r"));

            let mut meta = ResponseMeta {
                model_name: "m".into(),
                model_version: None,
                id: r.request.id.clone(),
                parameters: Parameters::new(),
            };
            meta.parameters.set_late(late);
            let resp = encode_infer_response(&meta, tensors.clone(), &OutputSelection::default()).unwrap();
            let wire =
                inference::ModelInferResponse::decode(resp.encode_to_vec().as_slice()).unwrap();
            let back = decode_infer_response(wire, &LIMITS).unwrap();
            prop_assert_eq!(back.outputs, tensors);
            prop_assert_eq!(back.late, late);
            prop_assert_eq!(back.meta, meta);
        }
    }

    proptest! {
        #![proptest_config(isolane_core::fuzz::config(1000))]

        #[test]
        fn fuzz_grpc_mutated_messages_are_decoded_or_refused(
            tensors in tensors(),
            params in parameters(),
            typed in any::<bool>(),
            mutations in prop::collection::vec(mutation(), 1..4),
        ) {
            let mut bytes = encode(&tensors, &params, typed).encode_to_vec();
            for m in &mutations {
                mutate(&mut bytes, m);
            }
            if let Ok(m) = ModelInferRequest::decode(bytes.as_slice()) {
                check_request(m)?;
            }
            check_response(&bytes)?;
        }

        #[test]
        fn fuzz_grpc_arbitrary_messages_are_decoded_or_refused(
            bytes in prop::collection::vec(any::<u8>(), 0..512),
        ) {
            if let Ok(m) = ModelInferRequest::decode(bytes.as_slice()) {
                check_request(m)?;
            }
            check_response(&bytes)?;
        }
    }
}

/// A server's decoded input is a slice of the message it read (gRPC) or of the body (HTTP's
/// binary data), not a copy: a 602 KB frame copied once more per request cost the serving
/// path tens of µs and a fresh allocation each time.
#[test]
fn raw_contents_and_binary_bodies_become_tensors_without_a_copy() {
    let t = Tensor::new("x", DataType::Fp32, vec![4], f32s(&[1.0, 2.0, 3.0, 4.0])).unwrap();
    let inside = |data: &[u8], message: &bytes::Bytes| {
        message.as_ptr_range().contains(&data.as_ptr()) && data.len() == 16
    };

    let req = encode_infer_request(
        "m",
        None,
        None,
        &Parameters::new(),
        std::slice::from_ref(&t),
        None,
    );
    let wire = bytes::Bytes::from(req.unwrap().encode_to_vec());
    let got = decode_infer_request(
        ModelInferRequest::decode(wire.clone()).unwrap(),
        &limits(),
        None,
    );
    let got = got.unwrap().request.inputs;
    assert_eq!(got, vec![t.clone()]);
    assert!(inside(got[0].data(), &wire), "gRPC: the input was copied");

    let body = encode_request(None, &Parameters::new(), &[(&t, true)], None).unwrap();
    let header_len = body.header_len;
    let body = bytes::Bytes::from(body.body);
    let got = crate::decode_request_bytes(&body, header_len, &limits(), None).unwrap();
    assert_eq!(got.inputs, vec![t.clone()]);
    assert!(
        inside(got.inputs[0].data(), &body),
        "HTTP: the input was copied"
    );
    // A body given as a slice is copied from, as before.
    let copied = decode_request(&body, header_len, &limits()).unwrap();
    assert_eq!(copied.inputs, vec![t]);
    assert!(!inside(copied.inputs[0].data(), &body));
}
