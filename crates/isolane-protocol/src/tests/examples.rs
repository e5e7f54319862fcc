//! Real bodies (the specification's examples, what tritonclient and curl send), round trips, and
//! every refusal with its message and status.

use crate::*;

fn limits() -> Limits {
    Limits::default()
}

fn refuse(body: &[u8], header_len: Option<usize>) -> ProtocolError {
    match decode_request(body, header_len, &limits()) {
        Ok(r) => panic!("decoded {r:?}"),
        Err(e) => e,
    }
}

/// Refused with a 400 whose message holds every one of `parts`.
fn refused_with(body: &str, parts: &[&str]) -> ProtocolError {
    let e = refuse(body.as_bytes(), None);
    let msg = e.to_string();
    for p in parts {
        assert!(msg.contains(p), "`{msg}` lacks `{p}`");
    }
    e
}

/// A body of a JSON header followed by binary parts, and its header length.
fn with_binary(header: &str, parts: &[&[u8]]) -> (Vec<u8>, usize) {
    let mut body = header.as_bytes().to_vec();
    for p in parts {
        body.extend_from_slice(p);
    }
    (body, header.len())
}

fn le<T: Copy, const N: usize>(values: &[T], f: impl Fn(T) -> [u8; N]) -> Vec<u8> {
    values.iter().flat_map(|&v| f(v)).collect()
}

// The KServe v2 specification's JSON example, as written: `"data": [true]` for a shape [3].
const SPEC_JSON_EXAMPLE: &str = r#"{
  "id" : "42",
  "inputs" : [
    {
      "name" : "input0",
      "shape" : [ 2, 2 ],
      "datatype" : "UINT32",
      "data" : [ 1, 2, 3, 4 ]
    },
    {
      "name" : "input1",
      "shape" : [ 3 ],
      "datatype" : "BOOL",
      "data" : [ true ]
    }
  ],
  "outputs" : [
    {
      "name" : "output0"
    }
  ]
}"#;

#[test]
fn the_specifications_json_example_is_refused_for_its_bool_count_and_read_once_corrected() {
    let e = refused_with(
        SPEC_JSON_EXAMPLE,
        &["input `input1`", "`data`", "1 elements", "[3]", "holds 3"],
    );
    assert_eq!(e.http_status(), 400);
    assert_eq!(e.grpc_code(), GrpcCode::InvalidArgument);

    let fixed = SPEC_JSON_EXAMPLE.replace("[ true ]", "[ true, false, true ]");
    let r = decode_request(fixed.as_bytes(), None, &limits()).unwrap();
    assert_eq!(r.id.as_deref(), Some("42"));
    assert_eq!(r.inputs.len(), 2);
    let a = &r.inputs[0];
    assert_eq!(
        (a.name(), a.datatype(), a.shape()),
        ("input0", DataType::Uint32, &[2, 2][..])
    );
    assert_eq!(a.data(), le(&[1u32, 2, 3, 4], u32::to_le_bytes));
    assert_eq!(r.inputs[1].data(), [1, 0, 1]);
    assert_eq!(
        r.outputs.requested,
        Some(vec![OutputChoice {
            name: "output0".into(),
            binary: None
        }])
    );
    assert!(!r.outputs.binary("output0"));
    assert_eq!(r.deadline_ms, None);
}

#[test]
fn the_binary_extensions_example_built_byte_by_byte_is_read() {
    // extension_binary_data.md's request: UINT32 [2, 2] (16 bytes) and BOOL [3] (3 bytes) after
    // the JSON, an output asked for as binary; `model_name` is a field the protocol ignores.
    let header = r#"{
  "model_name" : "mymodel",
  "inputs" : [
    {
      "name" : "input0",
      "shape" : [ 2, 2 ],
      "datatype" : "UINT32",
      "parameters" : {
        "binary_data_size" : 16
      }
    },
    {
      "name" : "input1",
      "shape" : [ 3 ],
      "datatype" : "BOOL",
      "parameters" : {
        "binary_data_size" : 3
      }
    }
  ],
  "outputs" : [
    {
      "name" : "output0",
      "parameters" : {
        "binary_data" : true
      }
    }
  ]
}"#;
    let input0: [u8; 16] = [
        0x01, 0x00, 0x00, 0x00, // 1
        0x02, 0x00, 0x00, 0x00, // 2
        0xff, 0xff, 0xff, 0xff, // 4294967295
        0x00, 0x01, 0x00, 0x00, // 256
    ];
    let input1: [u8; 3] = [0x01, 0x00, 0x01];
    let (body, hl) = with_binary(header, &[&input0, &input1]);
    assert_eq!(body.len(), hl + 19);
    let r = decode_request(&body, Some(hl), &limits()).unwrap();
    assert_eq!(r.inputs[0].data(), input0);
    assert_eq!(r.inputs[1].data(), input1);
    assert!(r.outputs.binary("output0"));

    // The answer of the example: a [3, 2] FP32 output as 24 bytes after the JSON.
    let out = Tensor::new(
        "output0",
        DataType::Fp32,
        vec![3, 2],
        le(&[1.0f32, 1.1, 2.0, 2.1, 3.0, 3.1], f32::to_le_bytes),
    )
    .unwrap();
    let meta = ResponseMeta {
        model_name: "mymodel".into(),
        ..ResponseMeta::default()
    };
    let enc = encode_response(&meta, std::slice::from_ref(&out), &r.outputs).unwrap();
    let hl = enc.header_len.expect("binary output");
    assert_eq!(enc.body.len(), hl + 24);
    assert_eq!(enc.content_type(), "application/octet-stream");
    let head: serde_json::Value = serde_json::from_slice(&enc.body[..hl]).unwrap();
    assert_eq!(
        head,
        serde_json::json!({"model_name": "mymodel", "outputs": [{"name": "output0", "shape": [3, 2],
            "datatype": "FP32", "parameters": {"binary_data_size": 24}}]})
    );
    let back = decode_response(&enc.body, enc.header_len, &limits()).unwrap();
    assert_eq!(back.outputs, vec![out]);
}

#[test]
fn a_tritonclient_body_with_bytes_and_no_outputs_is_read() {
    // tritonclient.http: compact JSON (rapidjson), every input binary by default, BYTES
    // serialized as a 4-byte length and the bytes, and `binary_data_output` when no outputs are
    // named.
    let header = concat!(
        r#"{"id":"7","inputs":[{"name":"INPUT0","shape":[1,4],"datatype":"FP16","parameters":{"binary_data_size":8}},"#,
        r#"{"name":"TEXT","shape":[2],"datatype":"BYTES","parameters":{"binary_data_size":13}}],"#,
        r#""parameters":{"binary_data_output":true,"deadline_ms":25,"priority":1}}"#
    );
    let fp16 = le(&[1.0f32, -2.0, 0.5, 65504.0], |x| {
        half::f16::from_f32(x).to_le_bytes()
    });
    let mut text = Vec::new();
    text.extend_from_slice(&5u32.to_le_bytes());
    text.extend_from_slice(b"hello");
    text.extend_from_slice(&0u32.to_le_bytes());
    assert_eq!(text.len(), 13);
    let (body, hl) = with_binary(header, &[&fp16, &text]);
    let r = decode_request(&body, Some(hl), &limits()).unwrap();
    assert_eq!(r.inputs[0].data(), fp16);
    assert_eq!(
        r.inputs[1].bytes_elements().unwrap(),
        vec![&b"hello"[..], b""]
    );
    assert_eq!(r.deadline_ms, Some(25.0));
    assert_eq!(r.outputs.requested, None);
    assert!(r.outputs.binary("anything"));
    assert_eq!(r.parameters.get("priority"), Some(&Parameter::Int(1)));
}

#[test]
fn a_curl_body_with_nested_data_is_read() {
    let body = r#"{"inputs":[{"name":"x","shape":[2,3],"datatype":"FP32","data":[[1,2.5,-3],[0.1,1e-3,-0]]}],
        "outputs":[{"name":"y","parameters":{"binary_data":false}}],"parameters":{"deadline_ms":20}}"#;
    let r = decode_request(body.as_bytes(), None, &limits()).unwrap();
    assert_eq!(
        r.inputs[0].data(),
        le(&[1.0f32, 2.5, -3.0, 0.1, 1e-3, -0.0], f32::to_le_bytes)
    );
    assert_eq!(r.deadline_ms, Some(20.0));
    assert!(!r.outputs.binary("y"));
    // A scalar: shape [] holds one element.
    let body =
        r#"{"inputs":[{"name":"s","shape":[],"datatype":"INT64","data":[-9223372036854775808]}]}"#;
    let r = decode_request(body.as_bytes(), None, &limits()).unwrap();
    assert_eq!(r.inputs[0].data(), i64::MIN.to_le_bytes());
    // An empty tensor: no data.
    let body = r#"{"inputs":[{"name":"e","shape":[0,3],"datatype":"BYTES","data":[]}]}"#;
    let r = decode_request(body.as_bytes(), None, &limits()).unwrap();
    assert!(r.inputs[0].data().is_empty());
}

#[test]
fn every_datatype_round_trips_as_json_and_as_binary() {
    let tensors = vec![
        Tensor::new("b", DataType::Bool, vec![2], vec![1, 0]).unwrap(),
        Tensor::new("u8", DataType::Uint8, vec![2], vec![0, 255]).unwrap(),
        Tensor::new(
            "u16",
            DataType::Uint16,
            vec![1],
            le(&[65535u16], u16::to_le_bytes),
        )
        .unwrap(),
        Tensor::new(
            "u32",
            DataType::Uint32,
            vec![1],
            le(&[u32::MAX], u32::to_le_bytes),
        )
        .unwrap(),
        Tensor::new(
            "u64",
            DataType::Uint64,
            vec![1],
            le(&[u64::MAX], u64::to_le_bytes),
        )
        .unwrap(),
        Tensor::new("i8", DataType::Int8, vec![2], vec![0x80, 0x7f]).unwrap(),
        Tensor::new(
            "i16",
            DataType::Int16,
            vec![1],
            le(&[i16::MIN], i16::to_le_bytes),
        )
        .unwrap(),
        Tensor::new(
            "i32",
            DataType::Int32,
            vec![1],
            le(&[i32::MIN], i32::to_le_bytes),
        )
        .unwrap(),
        Tensor::new(
            "i64",
            DataType::Int64,
            vec![1],
            le(&[i64::MAX], i64::to_le_bytes),
        )
        .unwrap(),
        Tensor::new(
            "f16",
            DataType::Fp16,
            vec![3],
            le(
                &[
                    half::f16::MAX,
                    half::f16::MIN_POSITIVE_SUBNORMAL,
                    half::f16::NEG_ZERO,
                ],
                half::f16::to_le_bytes,
            ),
        )
        .unwrap(),
        Tensor::new(
            "bf16",
            DataType::Bf16,
            vec![2],
            le(
                &[half::bf16::MAX, half::bf16::from_f32(-1.5)],
                half::bf16::to_le_bytes,
            ),
        )
        .unwrap(),
        Tensor::new(
            "f32",
            DataType::Fp32,
            vec![3],
            le(&[f32::MAX, f32::MIN_POSITIVE, 0.1], f32::to_le_bytes),
        )
        .unwrap(),
        Tensor::new(
            "f64",
            DataType::Fp64,
            vec![2],
            le(&[f64::MIN, 5e-324], f64::to_le_bytes),
        )
        .unwrap(),
        Tensor::from_bytes_elements("s", vec![3], &["", "é", "a\"b\\"]).unwrap(),
    ];
    for binary in [false, true] {
        let inputs: Vec<(&Tensor, bool)> = tensors.iter().map(|t| (t, binary)).collect();
        let mut params = Parameters::new();
        params.set_deadline_ms(15);
        let enc = encode_request(Some("id-1"), &params, &inputs, None).unwrap();
        assert_eq!(enc.header_len.is_some(), binary);
        let r = decode_request(&enc.body, enc.header_len, &limits()).unwrap();
        assert_eq!(r.inputs, tensors, "binary: {binary}");
        assert_eq!(r.deadline_ms, Some(15.0));
        assert_eq!(r.id.as_deref(), Some("id-1"));

        let mut meta = ResponseMeta {
            model_name: "m".into(),
            model_version: Some("1".into()),
            id: Some("id-1".into()),
            parameters: Parameters::new(),
        };
        meta.parameters.set_late(true);
        let sel = OutputSelection {
            requested: None,
            binary_data_output: binary,
            shared: Vec::new(),
            classification: Vec::new(),
        };
        let enc = encode_response(&meta, &tensors, &sel).unwrap();
        let back = decode_response(&enc.body, enc.header_len, &limits()).unwrap();
        assert_eq!(back.outputs, tensors);
        assert_eq!(back.meta, meta);
        assert!(back.late);
    }
}

#[test]
fn json_output_floats_are_written_short() {
    let t = Tensor::new(
        "y",
        DataType::Fp32,
        vec![3],
        le(&[1.1f32, 2.0, -0.5], f32::to_le_bytes),
    )
    .unwrap();
    let enc = encode_response(&ResponseMeta::default(), &[t], &OutputSelection::default()).unwrap();
    let text = String::from_utf8(enc.body).unwrap();
    assert!(text.contains(r#""data":[1.1,2.0,-0.5]"#), "{text}");
    assert_eq!(enc.header_len, None);
}

/// Issue 32: an output holding NaN or an infinity, asked for as JSON, was refused (a 500);
/// Triton writes them as rapidjson's `NaN`, `Infinity` and `-Infinity` (kWriteNanAndInfFlag),
/// which Python's json (tritonclient's) reads. Finite elements are written as before.
#[test]
fn json_outputs_carry_nan_and_infinities_as_triton_writes_them() {
    let f32s = [
        1.1f32,
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        -0.5,
        1e-7,
        f32::MAX,
    ];
    let f64s = [f64::NEG_INFINITY, 0.1, -f64::NAN, f64::MIN_POSITIVE];
    let f16s = [
        half::f16::INFINITY,
        half::f16::from_f32(0.5),
        half::f16::NAN,
    ];
    let tensors = [
        Tensor::new("a", DataType::Fp32, vec![7], le(&f32s, f32::to_le_bytes)).unwrap(),
        Tensor::new("b", DataType::Fp64, vec![2, 2], le(&f64s, f64::to_le_bytes)).unwrap(),
        Tensor::new(
            "c",
            DataType::Fp16,
            vec![3],
            le(&f16s, half::f16::to_le_bytes),
        )
        .unwrap(),
    ];
    let enc = encode_response(
        &ResponseMeta::default(),
        &tensors,
        &OutputSelection::default(),
    )
    .unwrap();
    let text = String::from_utf8(enc.body).unwrap();
    // Finite elements exactly as serde_json writes them alone.
    let j = |x: f32| serde_json::to_string(&x).unwrap();
    let a = format!(
        r#""data":[{},NaN,Infinity,-Infinity,{},{},{}]"#,
        j(1.1),
        j(-0.5),
        j(1e-7),
        j(f32::MAX)
    );
    assert!(text.contains(&a), "{text}");
    let b = format!(
        r#""data":[-Infinity,{},NaN,{}]"#,
        serde_json::to_string(&0.1f64).unwrap(),
        serde_json::to_string(&f64::MIN_POSITIVE).unwrap()
    );
    assert!(text.contains(&b), "{text}");
    assert!(text.contains(r#""data":[Infinity,0.5,NaN]"#), "{text}");
    // Read back as Python's json reads it: the tokens as the values they name.
    let standard = text
        .replace("-Infinity", "\"-inf\"")
        .replace("Infinity", "\"inf\"")
        .replace("NaN", "\"nan\"");
    let v: serde_json::Value = serde_json::from_str(&standard).unwrap();
    let back = |i: usize| -> Vec<f64> {
        v["outputs"][i]["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| match x {
                serde_json::Value::String(s) => s.parse::<f64>().unwrap(),
                n => n.as_f64().unwrap(),
            })
            .collect()
    };
    let same = |got: Vec<f64>, want: Vec<f64>| {
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(&want) {
            assert!(g == w || (g.is_nan() && w.is_nan()), "{got:?} != {want:?}");
        }
    };
    // f32 values read as Python's float (f64) round to the same f32.
    let a_back: Vec<f64> = back(0).iter().map(|&x| f64::from(x as f32)).collect();
    same(a_back, f32s.iter().map(|&x| f64::from(x)).collect());
    same(back(1), f64s.to_vec());
    same(back(2), f16s.iter().map(|x| x.to_f64()).collect());
    // A request's JSON data carries them as tritonclient's does (Python's json writes the same
    // tokens), and isolane's decoder reads them back.
    let nan = Tensor::new(
        "x",
        DataType::Fp32,
        vec![2],
        le(&[0.0f32, f32::NAN], f32::to_le_bytes),
    )
    .unwrap();
    let enc = encode_request(None, &Parameters::new(), &[(&nan, false)], None).unwrap();
    let text = String::from_utf8(enc.body.clone()).unwrap();
    assert!(text.contains(r#""data":[0.0,NaN]"#), "{text}");
    let back = decode_request(&enc.body, None, &limits()).unwrap();
    assert_eq!(back.inputs, [nan]);
}

/// Triton parses request JSON with rapidjson's kParseNanAndInfFlag, so FP32 and FP64 `data`
/// may hold `NaN`, `Inf`, `Infinity` and each with `-` (reader.h's ParseNumber; `-NaN` is the
/// same NaN); isolane refused every such request (serde_json reads standard JSON only).
#[test]
fn json_data_takes_rapidjsons_nan_and_infinity_tokens_as_triton_does() {
    let tokens = "[NaN, Infinity, -Infinity, 1.0, Inf, -Inf, -NaN, -2.5e-1]";
    let want = [
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        1.0,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        -0.25,
    ];
    for (dt, bits) in [
        ("FP32", le(&want.map(|x| x as f32), f32::to_le_bytes)),
        ("FP64", le(&want, f64::to_le_bytes)),
        (
            "FP16",
            le(&want.map(half::f16::from_f64), half::f16::to_le_bytes),
        ),
        (
            "BF16",
            le(&want.map(half::bf16::from_f64), half::bf16::to_le_bytes),
        ),
    ] {
        let body = input(dt, "[2, 4]", &format!(r#","data":{tokens}"#));
        let r = decode_request(body.as_bytes(), None, &limits()).unwrap();
        assert_eq!(r.inputs[0].data(), &bits[..], "{dt}");
    }
    // The bit patterns Triton's `float f = double` gives: the quiet NaN and the infinities.
    let body = input("FP32", "[3]", r#","data":[NaN,Infinity,-Infinity]"#);
    let r = decode_request(body.as_bytes(), None, &limits()).unwrap();
    assert_eq!(
        r.inputs[0].data(),
        &le(
            &[0x7fc0_0000u32, 0x7f80_0000, 0xff80_0000],
            u32::to_le_bytes
        )[..]
    );
    // Nested, beside the binary extension, with carriage returns and a token-like string
    // elsewhere in the header.
    let header = "{\"id\":\"NaN Inf\",\r\n\"inputs\":[{\"name\":\"x\",\"shape\":[2,2],\
                  \"datatype\":\"FP32\",\"data\":[[NaN,\r1],[-Inf,\t2]]},\
                  {\"name\":\"y\",\"shape\":[1],\"datatype\":\"FP32\",\
                  \"parameters\":{\"binary_data_size\":4}}]}";
    let (body, len) = with_binary(header, &[&7.5f32.to_le_bytes()]);
    let r = decode_request(&body, Some(len), &limits()).unwrap();
    assert_eq!(r.id.as_deref(), Some("NaN Inf"));
    assert_eq!(
        r.inputs[0].data(),
        &le(&[f32::NAN, 1.0, f32::NEG_INFINITY, 2.0], f32::to_le_bytes)[..]
    );
    assert_eq!(r.inputs[1].data(), &7.5f32.to_le_bytes()[..]);
    // BYTES strings that spell a token are strings.
    let body = input("BYTES", "[2]", r#","data":["NaN","-Infinity"]"#);
    let r = decode_request(body.as_bytes(), None, &limits()).unwrap();
    assert_eq!(
        r.inputs[0].bytes_elements().unwrap(),
        [&b"NaN"[..], b"-Infinity"]
    );
    // A response (what Triton and isolane write) reads the same way.
    let resp = r#"{"model_name":"m","outputs":[{"name":"o","shape":[2],"datatype":"FP64","data":[-Infinity,NaN]}]}"#;
    let r = decode_response(resp.as_bytes(), None, &limits()).unwrap();
    assert_eq!(
        r.outputs[0].data(),
        &le(&[f64::NEG_INFINITY, f64::NAN], f64::to_le_bytes)[..]
    );
}

/// What rapidjson refuses stays refused, and the tokens are numbers only in float data.
#[test]
fn non_finite_tokens_are_refused_where_triton_refuses_them() {
    // Not rapidjson's spellings, or a token run into something else: the JSON error as before.
    for data in [
        "[nan]",
        "[inf]",
        "[+Inf]",
        "[Infinit]",
        "[NaN1]",
        "[NaN.5]",
        "[Inf0]",
        "[Infinityx]",
        "[- Inf]",
        "[1NaN]",
        "[INF]",
        "[NaNNaN]",
    ] {
        let body = input("FP32", "[1]", &format!(r#","data":{data}"#));
        let e = refuse(body.as_bytes(), None);
        assert!(
            matches!(e, ProtocolError::Json { .. }) && e.to_string().contains("column"),
            "{data}: {e}"
        );
    }
    // A float value in data of another datatype.
    for (dt, data, parts) in [
        (
            "INT32",
            "[1, NaN]",
            &["input `x`", "NaN", "INT32 elements are integers"][..],
        ),
        (
            "UINT8",
            "[-Infinity]",
            &["-Infinity", "UINT8 elements are integers"],
        ),
        (
            "BOOL",
            "[Inf]",
            &["Infinity", "BOOL elements are true or false"],
        ),
        (
            "BYTES",
            r#"["a", NaN]"#,
            &["NaN", "BYTES elements are strings"],
        ),
    ] {
        let body = input(dt, "[2]", &format!(r#","data":{data}"#));
        let e = refused_with(&body, parts);
        assert_eq!(e.http_status(), 400, "{e}");
    }
    // Anywhere but in data: a shape, a parameter, an unknown field.
    for body in [
        input("FP32", "[NaN]", r#","data":[1]"#),
        format!(
            r#"{{"parameters":{{"deadline_ms":Infinity}},{}"#,
            &input("FP32", "[1]", r#","data":[1]"#)[1..]
        ),
        format!(
            r#"{{"junk":[NaN],{}"#,
            &input("FP32", "[1]", r#","data":[NaN]"#)[1..]
        ),
    ] {
        let e = refused_with(&body, &["outside tensors' `data`", "1 of its"]);
        assert_eq!(e.http_status(), 400, "{e}");
    }
    // Data that is a token, not an array.
    refused_with(
        &input("FP32", "[1]", r#","data":NaN"#),
        &["outside tensors' `data`"],
    );
}

#[test]
fn outputs_json_cannot_carry_are_refused_by_element() {
    let raw =
        Tensor::from_bytes_elements("s", vec![2], &[&b"ok"[..], &[0xffu8, 0xfe][..]]).unwrap();
    let e = encode_response(
        &ResponseMeta::default(),
        std::slice::from_ref(&raw),
        &OutputSelection::default(),
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("output `s`")
            && e.to_string().contains("element 1")
            && e.to_string().contains("not UTF-8"),
        "{e}"
    );
    assert_eq!((e.http_status(), e.grpc_code()), (500, GrpcCode::Internal));
    // As binary data it goes.
    let sel = OutputSelection {
        requested: Some(vec![OutputChoice {
            name: "s".into(),
            binary: Some(true),
        }]),
        binary_data_output: false,
        shared: Vec::new(),
        classification: Vec::new(),
    };
    assert!(encode_response(&ResponseMeta::default(), &[raw], &sel).is_ok());
}

#[test]
fn inconsistent_tensors_are_not_built() {
    let e = Tensor::new("t", DataType::Fp32, vec![2, 2], vec![0; 15]).unwrap_err();
    assert!(
        e.to_string().contains("15 bytes") && e.to_string().contains("16 bytes"),
        "{e}"
    );
    let e = Tensor::new("t", DataType::Bool, vec![1], vec![2]).unwrap_err();
    assert!(e.to_string().contains("0 or 1"), "{e}");
    let e = Tensor::new("t", DataType::Bytes, vec![2], vec![1, 0, 0, 0, b'a']).unwrap_err();
    assert!(e.to_string().contains("1 BYTES elements"), "{e}");
    let e = Tensor::new("t", DataType::Uint8, vec![u64::MAX, 2], vec![]).unwrap_err();
    assert!(e.to_string().contains("2^64"), "{e}");
}

fn input(datatype: &str, shape: &str, rest: &str) -> String {
    format!(r#"{{"inputs":[{{"name":"x","shape":{shape},"datatype":"{datatype}"{rest}}}]}}"#)
}

#[test]
fn json_elements_are_checked_against_the_datatype() {
    let cases: &[(&str, &str, &str, &[&str])] = &[
        (
            "UINT8",
            "[1]",
            "[256]",
            &["element 0 (256)", "UINT8's range"],
        ),
        ("INT8", "[1]", "[-129]", &["INT8's range"]),
        ("UINT64", "[1]", "[-1]", &["UINT64's range"]),
        ("INT64", "[1]", "[18446744073709551615]", &["INT64's range"]),
        (
            "INT32",
            "[1]",
            "[1.5]",
            &["(1.5)", "INT32 elements are integers"],
        ),
        ("INT32", "[1]", "[1e2]", &["INT32 elements are integers"]),
        ("FP16", "[1]", "[70000]", &["FP16's range"]),
        ("BF16", "[1]", "[1e39]", &["BF16's range"]),
        ("FP32", "[1]", "[1e300]", &["FP32's range"]),
        (
            "FP32",
            "[1]",
            r#"["1.0"]"#,
            &["a string", "FP32 elements are numbers"],
        ),
        ("FP32", "[1]", "[null]", &["`data`"]),
        ("FP32", "[1]", r#"[{"a":1}]"#, &["`data`"]),
        ("BOOL", "[1]", "[1]", &["BOOL elements are true or false"]),
        ("BYTES", "[1]", "[1]", &["BYTES elements are strings"]),
        ("FP32", "[2]", "[1,2,3]", &["more than the 2 elements"]),
        ("FP32", "[2, 2]", "[[1,2],[3]]", &["3 elements", "holds 4"]),
        ("FP32", "[1]", "1", &["is a number", "array"]),
        ("FP32", "[1]", r#""abc""#, &["is a string"]),
        ("FP64", "[1]", "[1e400]", &["input `x`", "out of range"]),
    ];
    for (dt, shape, data, parts) in cases {
        let body = input(dt, shape, &format!(r#","data":{data}"#));
        let e = refused_with(&body, parts);
        assert_eq!(e.http_status(), 400, "{e}");
    }
}

#[test]
fn shapes_and_datatypes_are_checked() {
    refused_with(
        &input("FP33", "[1]", r#","data":[1]"#),
        &["input `x`", "`datatype`", "FP33", "BOOL, UINT8"],
    );
    refused_with(
        &input("fp32", "[1]", r#","data":[1]"#),
        &["unknown datatype `fp32`"],
    );
    refused_with(
        &input("FP32", "[2, -1]", r#","data":[1]"#),
        &["input `x`", "`shape`", "dimension 1 is -1"],
    );
    refused_with(
        &input("UINT8", "[4294967296, 4294967296]", r#","data":[1]"#),
        &["input `x`", "more than 2^64 elements"],
    );
    refused_with(
        &input("FP32", "[1.5]", r#","data":[1]"#),
        &["the inference request", "i64"],
    );
    let dims = vec!["1"; MAX_DIMS + 1].join(",");
    refused_with(
        &input("FP32", &format!("[{dims}]"), r#","data":[1]"#),
        &["at most 64 dimensions"],
    );
    refused_with(
        r#"{"inputs":[{"name":"","shape":[1],"datatype":"FP32","data":[1]}]}"#,
        &["`name`", "is empty"],
    );
    refused_with(
        r#"{"inputs":[{"name":"x","datatype":"FP32","data":[1]}]}"#,
        &["missing field `shape`"],
    );
    refused_with(r#"{"id":"1"}"#, &["missing field `inputs`"]);
    let e = refused_with("{\"inputs\":[", &["the inference request", "EOF"]);
    assert_eq!(e.grpc_code(), GrpcCode::InvalidArgument);
}

#[test]
fn the_limits_are_checked_before_reading() {
    let small = Limits {
        max_tensor_bytes: 1000,
        max_body_bytes: 10_000,
        max_batch: None,
    };
    // 251 FP32 elements: 1004 bytes, refused from the shape before its data is read.
    let body = input("FP32", "[251]", r#","data":[1]"#);
    let e = decode_request(body.as_bytes(), None, &small).unwrap_err();
    assert_eq!(
        (e.http_status(), e.grpc_code()),
        (413, GrpcCode::ResourceExhausted)
    );
    assert!(
        e.to_string().contains("1004 bytes") && e.to_string().contains("1000"),
        "{e}"
    );
    // Two inputs that fit alone but not together.
    let body = r#"{"inputs":[{"name":"a","shape":[200],"datatype":"FP32","parameters":{"binary_data_size":800}},
        {"name":"b","shape":[100],"datatype":"FP32","parameters":{"binary_data_size":400}}]}"#;
    let (body, hl) = with_binary(body, &[&[0; 800], &[0; 400]]);
    let e = decode_request(&body, Some(hl), &small).unwrap_err();
    assert!(
        e.to_string().contains("input `b`") && e.to_string().contains("1200 bytes"),
        "{e}"
    );
    // BYTES elements as JSON strings, counted as they are read.
    let long = "x".repeat(600);
    let body = input("BYTES", "[2]", &format!(r#","data":["{long}","{long}"]"#));
    let e = decode_request(body.as_bytes(), None, &small).unwrap_err();
    assert_eq!(e.http_status(), 413, "{e}");
    assert!(e.to_string().contains("1208 bytes"), "{e}");
    // The whole body.
    let e = decode_request(&vec![b' '; 10_001], None, &small).unwrap_err();
    assert!(e.to_string().contains("10001 bytes"), "{e}");
    assert_eq!(e.http_status(), 413);
    // A shape of 2^61 BYTES elements: the 4-byte lengths alone are past any limit.
    refused_with(
        &input("BYTES", "[2305843009213693952]", r#","data":[]"#),
        &["more than the limit"],
    );
    let many =
        vec![r#"{"name":"a","shape":[0],"datatype":"BOOL","data":[]}"#; MAX_TENSORS + 1].join(",");
    refused_with(
        &format!(r#"{{"inputs":[{many}]}}"#),
        &["at most 4096 tensors"],
    );
}

#[test]
fn a_short_data_array_for_a_large_shape_reserves_little() {
    // 16384 FP32 elements fit the limit, but a `data` of one element cannot hold them: the
    // reader reserves for what the text can hold, not for what the shape claims.
    let body = input("FP32", "[16384]", r#","data":[1]"#);
    let (r, peak) = super::alloc::peak_during(|| decode_request(body.as_bytes(), None, &limits()));
    let e = r.unwrap_err();
    assert!(
        e.to_string()
            .contains("1 elements, but shape [16384] holds 16384"),
        "{e}"
    );
    assert!(peak < 16 << 10, "held {peak} bytes");
}

#[test]
fn binary_data_is_checked() {
    let h = |dt: &str, shape: &str, size: &str| {
        format!(
            r#"{{"inputs":[{{"name":"x","shape":{shape},"datatype":"{dt}","parameters":{{"binary_data_size":{size}}}}}]}}"#
        )
    };
    let go = |header: String, tail: &[u8], parts: &[&str]| {
        let (body, hl) = with_binary(&header, &[tail]);
        let e = refuse(&body, Some(hl));
        for p in parts {
            assert!(e.to_string().contains(p), "`{e}` lacks `{p}`");
        }
        e
    };
    go(
        h("FP32", "[2]", "7"),
        &[0; 7],
        &[
            "input `x`",
            "binary_data_size",
            "7 bytes",
            "takes 2 x 4 = 8 bytes",
        ],
    );
    go(
        h("FP32", "[2]", "8"),
        &[0; 4],
        &["is 8, but only 4 bytes of the body remain"],
    );
    go(
        h("FP32", "[1]", "-4"),
        &[0; 4],
        &["is -4; a byte count is 0 or more"],
    );
    go(
        h("FP32", "[1]", r#""4""#),
        &[0; 4],
        &["binary_data_size", "is a string; it is an integer"],
    );
    let e = go(h("FP32", "[1]", "4"), &[0; 6], &["2 bytes after"]);
    assert_eq!(e, ProtocolError::LeftoverBytes { count: 2 });
    go(
        h("BOOL", "[2]", "2"),
        &[1, 7],
        &["BOOL element 1 is the byte 7"],
    );
    // BYTES: a cut-off length, a length past the end, too many and too few elements.
    go(
        h("BYTES", "[1]", "3"),
        &[1, 0, 0],
        &["element 0's 4-byte length is cut off"],
    );
    go(
        h("BYTES", "[1]", "6"),
        &[5, 0, 0, 0, b'a', b'b'],
        &["element 0 is 5 bytes long, past the end"],
    );
    go(
        h("BYTES", "[1]", "8"),
        &[0, 0, 0, 0, 0, 0, 0, 0],
        &["4 bytes after the 1 BYTES elements"],
    );
    go(
        h("BYTES", "[3]", "8"),
        &[0, 0, 0, 0, 0, 0, 0, 0],
        &["2 BYTES elements, but shape [3] holds 3"],
    );
    // binary_data_size without a header length: no binary part.
    let e = refuse(h("FP32", "[1]", "4").as_bytes(), None);
    assert!(e.to_string().contains("no binary part"), "{e}");
    // The header length itself.
    let header = h("FP32", "[1]", "4");
    let e = refuse(header.as_bytes(), Some(header.len() + 1));
    assert!(
        e.to_string().contains("Inference-Header-Content-Length"),
        "{e}"
    );
    let e = refuse(header.as_bytes(), Some(0));
    assert!(e.to_string().contains("raw binary request"), "{e}");
    let (body, hl) = with_binary(&header, &[&[0; 4]]);
    let e = refuse(&body, Some(hl - 1));
    assert!(e.to_string().contains("the inference request"), "{e}");
    assert_eq!(parse_header_length(b" 123 ").unwrap(), 123);
    for bad in [
        &b""[..],
        b"-1",
        b"+1",
        b"12a",
        b"0x10",
        b"99999999999999999999999",
    ] {
        let e = parse_header_length(bad).unwrap_err();
        assert!(
            e.to_string().starts_with("Inference-Header-Content-Length"),
            "{e}"
        );
    }
    // Non-UTF-8 JSON.
    let e = refuse(b"{\"inputs\":[\xff]}", None);
    assert!(e.to_string().contains("not UTF-8"), "{e}");
}

#[test]
fn data_is_given_once() {
    refused_with(
        &input("FP32", "[1]", ""),
        &["input `x`", "`data`", "missing"],
    );
    let both = input(
        "FP32",
        "[1]",
        r#","data":[1],"parameters":{"binary_data_size":4}"#,
    );
    let (body, hl) = with_binary(&both, &[&[0; 4]]);
    let e = refuse(&body, Some(hl));
    assert!(e.to_string().contains("give one"), "{e}");
    let two = r#"{"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[1]},{"name":"x","shape":[1],"datatype":"FP32","data":[1]}]}"#;
    let e = refused_with(two, &["input `x` is given more than once"]);
    assert!(matches!(e, ProtocolError::Duplicate { kind: "input", .. }));
    let outs = r#"{"inputs":[],"outputs":[{"name":"y"},{"name":"y"}]}"#;
    refused_with(outs, &["output `y` is given more than once"]);
    refused_with(
        r#"{"inputs":[],"outputs":[{"name":""}]}"#,
        &["output ``", "is empty"],
    );
}

/// An input of more rows than the model's batch is refused for its batch, a 400 naming the
/// bound, not a 413 about bytes (RESOURCE_EXHAUSTED is the code clients retry on).
#[test]
fn rows_past_the_models_batch_are_refused_for_the_batch_not_the_bytes() {
    let echo = Limits {
        max_tensor_bytes: 16,
        max_body_bytes: 10_000,
        max_batch: Some(4),
    };
    let body = input("FP32", "[5, 1]", r#","data":[1,2,3,4,5]"#);
    let e = decode_request(body.as_bytes(), None, &echo).unwrap_err();
    assert_eq!(
        (e.http_status(), e.grpc_code()),
        (400, GrpcCode::InvalidArgument),
        "{e}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains("[5, 1] has 5 rows") && msg.contains("1 ≤ n ≤ 4"),
        "{msg}"
    );
    // Within the batch the byte limit still holds, and it is still a 413.
    let body = input("FP32", "[4, 2]", r#","data":[1,2,3,4,5,6,7,8]"#);
    let e = decode_request(body.as_bytes(), None, &echo).unwrap_err();
    assert_eq!(e.http_status(), 413, "{e}");
    let body = input("FP32", "[4, 1]", r#","data":[1,2,3,4]"#);
    assert!(decode_request(body.as_bytes(), None, &echo).is_ok());
}

#[test]
fn parameters_are_checked() {
    let req = |params: &str| format!(r#"{{"inputs":[],"parameters":{params}}}"#);
    // A decimal string is the number it holds (perf_analyzer sends no doubles); another
    // string is refused, naming it.
    let r = decode_request(req(r#"{"deadline_ms":"20"}"#).as_bytes(), None, &limits()).unwrap();
    assert_eq!(r.deadline_ms, Some(20.0));
    let r = decode_request(req(r#"{"deadline_ms":" 1.5"}"#).as_bytes(), None, &limits()).unwrap();
    assert_eq!(r.deadline_ms, Some(1.5));
    for bad in ["soon", "", "inf", "NaN", "1.5ms"] {
        refused_with(
            &req(&format!(r#"{{"deadline_ms":"{bad}"}}"#)),
            &[
                "the request",
                "`deadline_ms`",
                &format!("is the string {bad:?}, which is not a decimal number"),
            ],
        );
    }
    refused_with(
        &req(r#"{"deadline_ms":"0"}"#),
        &["`deadline_ms`", "is 0; a deadline is a positive number"],
    );
    refused_with(
        &req(r#"{"deadline_ms":true}"#),
        &[
            "`deadline_ms`",
            "is a boolean; it is a number of milliseconds",
        ],
    );
    refused_with(
        &req(r#"{"deadline_ms":0}"#),
        &["`deadline_ms`", "is 0; a deadline is a positive number"],
    );
    refused_with(&req(r#"{"deadline_ms":-5}"#), &["is -5"]);
    // A fraction of a millisecond is a deadline too; past int64's range it is refused.
    let r = decode_request(req(r#"{"deadline_ms":2.5}"#).as_bytes(), None, &limits()).unwrap();
    assert_eq!(r.deadline_ms, Some(2.5));
    refused_with(
        &req(r#"{"deadline_ms":1e300}"#),
        &[
            "`deadline_ms`",
            "is 1e300; a deadline is a positive number of milliseconds, at most 9223372036854775807",
        ],
    );
    // No served model is a sequence model: a request in a sequence is refused, as Triton
    // refuses one to a model without sequence batching; tritonclient's defaults pass.
    for params in [
        r#"{"sequence_id":7}"#,
        r#"{"sequence_id":"abc"}"#,
        r#"{"sequence_start":true}"#,
        r#"{"sequence_id":0,"sequence_end":true}"#,
    ] {
        let e = refused_with(&req(params), &["the request", "sequence model"]);
        assert_eq!(
            (e.http_status(), e.grpc_code()),
            (400, GrpcCode::InvalidArgument)
        );
    }
    let r = req(r#"{"sequence_id":0,"sequence_start":false,"sequence_end":false}"#);
    assert!(decode_request(r.as_bytes(), None, &limits()).is_ok());
    refused_with(
        &req(r#"{"binary_data_output":1}"#),
        &["`binary_data_output`", "boolean"],
    );
    refused_with(
        &req(r#"{"a":1,"a":2}"#),
        &["parameter `a` is given more than once"],
    );
    refused_with(&req(r#"{"a":[1]}"#), &["a string, a number or a boolean"]);
    refused_with(
        &req(r#"{"a":9223372036854775808}"#),
        &["past the int64 range"],
    );
    let many: Vec<String> = (0..=MAX_PARAMETERS)
        .map(|i| format!(r#""p{i}":1"#))
        .collect();
    refused_with(
        &req(&format!("{{{}}}", many.join(","))),
        &["at most 64 parameters"],
    );
    refused_with(
        r#"{"inputs":[],"outputs":[{"name":"y","parameters":{"binary_data":"yes"}}]}"#,
        &["output `y`", "`binary_data`", "boolean"],
    );
    let r = decode_request(
        req(r#"{"deadline_ms":20,"x":1.5,"s":"t","b":false}"#).as_bytes(),
        None,
        &limits(),
    )
    .unwrap();
    assert_eq!(r.deadline_ms, Some(20.0));
    assert_eq!(r.parameters.get("x"), Some(&Parameter::Double(1.5)));
    assert_eq!(r.parameters.len(), 4);
    // A response's `late`.
    let mut p = Parameters::new();
    assert!(!p.late().unwrap());
    p.set_late(true);
    assert!(p.late().unwrap());
    p.insert(LATE, Parameter::Int(1));
    assert!(p
        .late()
        .unwrap_err()
        .to_string()
        .contains("the response: parameter `late`"));
    p.set_late(false);
    assert_eq!(p.get(LATE), None);
    let body = r#"{"model_name":"m","outputs":[],"parameters":{"late":"yes"}}"#;
    let e = decode_response(body.as_bytes(), None, &limits()).unwrap_err();
    assert!(e.to_string().contains("`late`"), "{e}");
}

#[test]
fn extensions_isolane_lacks_are_refused_by_name() {
    let shm = input(
        "FP32",
        "[1]",
        r#","parameters":{"shared_memory_region":"r","shared_memory_byte_size":4}"#,
    );
    refused_with(
        &shm,
        &[
            "shared memory extension is not supported",
            "input `x`",
            "shared_memory_region",
        ],
    );
    // Classification is read (and answered at encoding: `classification_answers_...`); a
    // count that is not a non-negative integer is refused by name.
    let out = r#"{"inputs":[],"outputs":[{"name":"y","parameters":{"classification":3}}]}"#;
    let r = decode_request(out.as_bytes(), None, &limits()).unwrap();
    assert_eq!(r.outputs.classification, vec![("y".to_string(), 3)]);
    assert_eq!(r.outputs.classes("y"), Some(3));
    let out = r#"{"inputs":[],"outputs":[{"name":"y","parameters":{"classification":0}}]}"#;
    let r = decode_request(out.as_bytes(), None, &limits()).unwrap();
    assert_eq!(r.outputs.classes("y"), None);
    for bad in ["-1", "1.5", "\"3\"", "true", "4294967296"] {
        let out = format!(
            r#"{{"inputs":[],"outputs":[{{"name":"y","parameters":{{"classification":{bad}}}}}]}}"#
        );
        refused_with(
            &out,
            &["output `y`", "`classification`", "number of top classes"],
        );
    }
    let out = r#"{"inputs":[],"outputs":[{"name":"y","parameters":{"shared_memory_region":"r"}}]}"#;
    refused_with(out, &["shared memory extension"]);
}

/// Found by trying tritonclient (`InferRequestedOutput(name, class_count=k)`, Triton's
/// image_client example): the classification extension was refused. Each row's top classes
/// come back as Triton writes them (`src/classification.cc`: `"%f:index"`, largest first,
/// shape `[rows, min(k, row)]`, BYTES), as JSON strings or binary data.
#[test]
fn classification_answers_each_rows_top_classes_as_triton_writes_them() {
    let values: [f32; 8] = [1.1, 3.3, 0.5, 2.4, -1.0, f32::NAN, 7.0, 7.0];
    let t = Tensor::new(
        "y",
        DataType::Fp32,
        vec![2, 4],
        values.iter().flat_map(|v| v.to_le_bytes()).collect(),
    )
    .unwrap();
    let c = crate::classify(&t, 2).unwrap();
    assert_eq!(c.datatype(), DataType::Bytes);
    assert_eq!(c.shape(), &[2, 2]);
    let got: Vec<&[u8]> = c.bytes_elements().unwrap();
    let want: [&[u8]; 4] = [b"3.300000:1", b"2.400000:3", b"7.000000:2", b"7.000000:3"];
    assert_eq!(got, want);
    // More classes than a row has: the row's, NaN last.
    let c = crate::classify(&t, 9).unwrap();
    assert_eq!(c.shape(), &[2, 4]);
    assert_eq!(
        c.bytes_elements().unwrap()[4..],
        [&b"7.000000:2"[..], b"7.000000:3", b"-1.000000:0", b"nan:1"]
    );
    let ints = Tensor::new("z", DataType::Int32, vec![1], vec![0; 4]).unwrap();
    let e = crate::classify(&ints, 1).unwrap_err();
    assert!(
        e.to_string().contains("INT32; classes are read from FP32"),
        "{e}"
    );
    // Through the encoder, as JSON strings and as binary data.
    let meta = ResponseMeta {
        model_name: "m".into(),
        model_version: Some("1".into()),
        id: None,
        parameters: Parameters::new(),
    };
    for binary in [false, true] {
        let sel = OutputSelection {
            binary_data_output: binary,
            classification: vec![("y".into(), 1)],
            ..Default::default()
        };
        let enc = encode_response(&meta, std::slice::from_ref(&t), &sel).unwrap();
        if !binary {
            let text = String::from_utf8(enc.body.clone()).unwrap();
            assert!(
                text.contains(
                    r#""shape":[2,1],"datatype":"BYTES","data":["3.300000:1","7.000000:2"]"#
                ),
                "{text}"
            );
        }
        let back = decode_response(&enc.body, enc.header_len, &limits()).unwrap();
        assert_eq!(
            back.outputs[0].bytes_elements().unwrap(),
            [&b"3.300000:1"[..], b"7.000000:2"]
        );
    }
}

#[test]
fn each_error_has_its_status_and_code() {
    let cases = [
        (
            ProtocolError::UnknownModel {
                model: "m".into(),
                version: Some("2".into()),
            },
            404,
            "NOT_FOUND",
            5,
        ),
        (
            ProtocolError::NotFound {
                what: "no region `r` is registered".into(),
            },
            404,
            "NOT_FOUND",
            5,
        ),
        (
            ProtocolError::AlreadyExists {
                what: "shared memory region `r` is registered already".into(),
            },
            400,
            "ALREADY_EXISTS",
            6,
        ),
        (
            ProtocolError::Refused {
                reason: "deadline".into(),
            },
            429,
            "RESOURCE_EXHAUSTED",
            8,
        ),
        (
            ProtocolError::NotReady {
                reason: "loading".into(),
            },
            503,
            "UNAVAILABLE",
            14,
        ),
        (
            ProtocolError::TooLarge {
                what: "b".into(),
                size: 2,
                limit: 1,
            },
            413,
            "RESOURCE_EXHAUSTED",
            8,
        ),
        (
            ProtocolError::LeftoverBytes { count: 1 },
            400,
            "INVALID_ARGUMENT",
            3,
        ),
        (
            ProtocolError::Unrepresentable {
                tensor: "t".into(),
                message: "m".into(),
            },
            500,
            "INTERNAL",
            13,
        ),
    ];
    for (e, status, code, value) in cases {
        assert_eq!(e.http_status(), status, "{e}");
        assert_eq!(e.grpc_code().name(), code, "{e}");
        assert_eq!(e.grpc_code().value(), value, "{e}");
    }
    let e = ProtocolError::UnknownModel {
        model: "m".into(),
        version: Some("2".into()),
    };
    assert_eq!(e.to_string(), "unknown model `m` version `2`");
    assert_eq!(
        serde_json::to_string(&e.body()).unwrap(),
        r#"{"error":"unknown model `m` version `2`"}"#
    );
    let e = ProtocolError::UnknownModel {
        model: "m".into(),
        version: None,
    };
    assert_eq!(e.to_string(), "unknown model `m`");
}

#[test]
fn the_metadata_messages_read_and_write_as_the_protocol_has_them() {
    let server: ServerMetadata = serde_json::from_str(
        r#"{"name":"triton","version":"2.50.0","extensions":["binary_tensor_data","model_repository"]}"#,
    )
    .unwrap();
    assert_eq!(server.extensions.len(), 2);
    let model = ModelMetadata {
        name: "resnet".into(),
        versions: vec!["1".into()],
        platform: "onnxruntime_onnx".into(),
        inputs: vec![TensorMetadata {
            name: "input".into(),
            datatype: DataType::Fp32,
            shape: vec![-1, 3, 224, 224],
        }],
        outputs: vec![TensorMetadata {
            name: "output".into(),
            datatype: DataType::Fp32,
            shape: vec![-1, 1000],
        }],
    };
    let text = serde_json::to_string(&model).unwrap();
    assert!(
        text.contains(r#"{"name":"input","datatype":"FP32","shape":[-1,3,224,224]}"#),
        "{text}"
    );
    assert_eq!(serde_json::from_str::<ModelMetadata>(&text).unwrap(), model);
    let e = serde_json::from_str::<TensorMetadata>(r#"{"name":"a","datatype":"F32","shape":[1]}"#)
        .unwrap_err();
    assert!(e.to_string().contains("unknown datatype `F32`"), "{e}");

    let config: ModelConfig = serde_json::from_str(
        r#"{"name":"resnet","platform":"onnxruntime_onnx","max_batch_size":8,
            "input":[{"name":"input","data_type":"TYPE_FP32","dims":[3,224,224]}],
            "output":[{"name":"output","data_type":"TYPE_STRING","dims":[-1]}]}"#,
    )
    .unwrap();
    assert_eq!(config.input[0].data_type, DataType::Fp32);
    assert_eq!(config.output[0].data_type, DataType::Bytes);
    assert!(serde_json::to_string(&config)
        .unwrap()
        .contains(r#""data_type":"TYPE_FP32""#));

    let index = vec![
        RepositoryIndexEntry {
            name: "a".into(),
            version: Some("1".into()),
            state: ModelState::Ready,
            reason: String::new(),
        },
        RepositoryIndexEntry {
            name: "b".into(),
            version: None,
            state: ModelState::Unavailable,
            reason: "no GPU".into(),
        },
    ];
    assert_eq!(
        serde_json::to_string(&index).unwrap(),
        r#"[{"name":"a","version":"1","state":"READY","reason":""},{"name":"b","state":"UNAVAILABLE","reason":"no GPU"}]"#
    );
    assert_eq!(
        RepositoryIndexRequest::decode(b"").unwrap(),
        RepositoryIndexRequest { ready: false }
    );
    assert_eq!(
        RepositoryIndexRequest::decode(br#"{"ready":true}"#).unwrap(),
        RepositoryIndexRequest { ready: true }
    );
    assert!(RepositoryIndexRequest::decode(br#"{"ready":1}"#).is_err());
    assert_eq!(
        serde_json::to_string(&ReadyResponse { ready: true }).unwrap(),
        r#"{"ready":true}"#
    );
    assert_eq!(
        serde_json::to_string(&LiveResponse { live: false }).unwrap(),
        r#"{"live":false}"#
    );
    assert_eq!((health_status(true), health_status(false)), (200, 400));
    let err: ErrorBody = serde_json::from_str(r#"{"error":"x"}"#).unwrap();
    assert_eq!(err.error, "x");
}

/// Regions in memory, as a server's registry would hold them.
struct Regions(Vec<(String, Vec<u8>)>);

impl crate::SharedMemory for Regions {
    fn read(&self, r: &crate::SharedRef, what: &str) -> Result<bytes::Bytes, ProtocolError> {
        let (_, bytes) =
            self.0
                .iter()
                .find(|(n, _)| *n == r.region)
                .ok_or_else(|| ProtocolError::Refused {
                    reason: format!("{what}: no region `{}`", r.region),
                })?;
        let end = (r.offset + r.byte_size) as usize;
        bytes
            .get(r.offset as usize..end)
            .map(bytes::Bytes::copy_from_slice)
            .ok_or_else(|| ProtocolError::Refused {
                reason: format!("{what}: past the region"),
            })
    }
}

#[test]
fn shared_memory_inputs_are_read_from_their_region_and_outputs_named_there() {
    let floats: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let mut region = vec![0u8; 8];
    region.extend_from_slice(&floats);
    let shm = Regions(vec![("in0".into(), region)]);
    let body = br#"{"inputs":[{"name":"x","shape":[2,2],"datatype":"FP32",
        "parameters":{"shared_memory_region":"in0","shared_memory_offset":8,
                      "shared_memory_byte_size":16}}],
        "outputs":[{"name":"y","parameters":{"shared_memory_region":"out0",
                      "shared_memory_byte_size":8}}]}"#;
    let limits = Limits::default();
    let d = crate::decode_request_with(body, None, &limits, Some(&shm)).unwrap();
    assert_eq!(d.inputs[0].data(), &floats[..]);
    let out = &d.outputs.shared;
    assert_eq!(out.len(), 1);
    assert_eq!(
        out[0],
        (
            "y".to_string(),
            crate::SharedRef {
                region: "out0".into(),
                offset: 0,
                byte_size: 8
            }
        )
    );
    // The response carries no data for that output, and no binary size.
    let y = Tensor::new("y", DataType::Fp32, vec![2], vec![0; 8]).unwrap();
    let enc = encode_response(&ResponseMeta::default(), &[y], &d.outputs).unwrap();
    assert_eq!(enc.header_len, None);
    let text = String::from_utf8(enc.body).unwrap();
    assert!(text.contains(r#""name":"y""#), "{text}");
    assert!(!text.contains("\"data\""), "{text}");
    assert!(!text.contains("binary_data_size"), "{text}");

    // Without the extension the parameters are refused by name, as before.
    let e = decode_request(body, None, &limits).unwrap_err();
    assert!(e.to_string().contains("shared memory"), "{e}");
    // A wrong byte size for the shape, an unknown region, data given twice, no region.
    let bad = |b: &[u8]| {
        crate::decode_request_with(b, None, &limits, Some(&shm))
            .unwrap_err()
            .to_string()
    };
    let e = bad(br#"{"inputs":[{"name":"x","shape":[2,2],"datatype":"FP32",
        "parameters":{"shared_memory_region":"in0","shared_memory_byte_size":12}}]}"#);
    assert!(e.contains("input `x`"), "{e}");
    let e = bad(br#"{"inputs":[{"name":"x","shape":[1],"datatype":"FP32",
        "parameters":{"shared_memory_region":"nope","shared_memory_byte_size":4}}]}"#);
    assert!(e.contains("no region `nope`"), "{e}");
    let e = bad(
        br#"{"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[1],
        "parameters":{"shared_memory_region":"in0","shared_memory_byte_size":4}}]}"#,
    );
    assert!(e.contains("give one"), "{e}");
    let e = bad(br#"{"inputs":[{"name":"x","shape":[1],"datatype":"FP32",
        "parameters":{"shared_memory_byte_size":4}}]}"#);
    assert!(e.contains("shared_memory_region"), "{e}");
}
