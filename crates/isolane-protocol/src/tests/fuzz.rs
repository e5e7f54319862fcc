//! The decoders' fuzz targets (property tests; `scripts/fuzz.sh` runs them longer): valid bodies
//! round-trip, and mutated, assembled or arbitrary bodies and header lengths are decoded
//! consistently or refused, never panic, and never make the decoder hold more than the tensor
//! limit allows and the body's own size explains.

use super::alloc::peak_during;
use crate::*;
use proptest::prelude::*;
use proptest::sample::{select, Index};

/// Small, so that a shape within the limit still dwarfs the bodies the targets make.
pub(crate) const LIMITS: Limits = Limits {
    max_tensor_bytes: 1 << 16,
    max_body_bytes: 1 << 16,
    max_batch: None,
};

/// What decoding may hold at most: twice the tensor data it returns (a JSON reader's buffer as it
/// fills), a bounded multiple of the body (the header's own structures: measured under 10x), and
/// a constant. Never the size a shape claims.
fn allowed(body: usize, decoded: usize) -> usize {
    2 * decoded + 16 * body + 4096
}

pub(crate) fn check_tensors(tensors: &[Tensor]) -> Result<usize, TestCaseError> {
    let total: usize = tensors.iter().map(|t| t.data().len()).sum();
    prop_assert!(total as u64 <= LIMITS.max_tensor_bytes, "{total} bytes");
    let mut names: Vec<&str> = tensors.iter().map(Tensor::name).collect();
    names.sort_unstable();
    names.dedup();
    prop_assert_eq!(names.len(), tensors.len());
    for t in tensors {
        let rebuilt = Tensor::new(
            t.name(),
            t.datatype(),
            t.shape().to_vec(),
            t.data().to_vec(),
        );
        prop_assert_eq!(rebuilt.as_ref(), Ok(t));
    }
    Ok(total)
}

pub(crate) fn check_refusal(e: &ProtocolError) -> Result<(), TestCaseError> {
    prop_assert!(matches!(e.http_status(), 400 | 413), "{e:?}");
    prop_assert!(!e.to_string().is_empty());
    Ok(())
}

/// Decodes a request body: refused with a 400 or 413, or decoded into consistent tensors that
/// decode the same again and survive a re-encoding; within the memory bound either way.
fn check_request(body: &[u8], header_len: Option<usize>) -> Result<(), TestCaseError> {
    let (r, peak) = peak_during(|| decode_request(body, header_len, &LIMITS));
    let decoded = r
        .as_ref()
        .map_or(0, |r| r.inputs.iter().map(|t| t.data().len()).sum());
    prop_assert!(
        peak <= allowed(body.len(), decoded),
        "held {peak} bytes for a body of {} decoded into {decoded}",
        body.len()
    );
    match r {
        Ok(r) => {
            check_tensors(&r.inputs)?;
            prop_assert_eq!(decode_request(body, header_len, &LIMITS), Ok(r.clone()));
            let inputs: Vec<(&Tensor, bool)> = r.inputs.iter().map(|t| (t, true)).collect();
            let enc = encode_request(r.id.as_deref(), &r.parameters, &inputs, None);
            prop_assert!(enc.is_ok(), "{enc:?}");
            let enc = enc.unwrap();
            let again = decode_request(&enc.body, enc.header_len, &Limits::default());
            prop_assert_eq!(again.map(|a| a.inputs), Ok(r.inputs));
        }
        Err(e) => check_refusal(&e)?,
    }
    Ok(())
}

fn check_response(body: &[u8], header_len: Option<usize>) -> Result<(), TestCaseError> {
    let (r, peak) = peak_during(|| decode_response(body, header_len, &LIMITS));
    let decoded = r
        .as_ref()
        .map_or(0, |r| r.outputs.iter().map(|t| t.data().len()).sum());
    prop_assert!(peak <= allowed(body.len(), decoded), "held {peak} bytes");
    match r {
        Ok(r) => {
            check_tensors(&r.outputs)?;
        }
        Err(e) => check_refusal(&e)?,
    }
    Ok(())
}

/// Any tensor JSON can carry: floats (NaN as the one JSON's `NaN` reads into), BOOL bytes of 0
/// or 1, UTF-8 BYTES.
fn tensor(name: String) -> BoxedStrategy<Tensor> {
    (
        select(DataType::ALL.to_vec()),
        prop::collection::vec(0u64..4, 0..4),
    )
        .prop_flat_map(move |(dt, shape)| {
            let n = shape.iter().product::<u64>() as usize;
            let (name, shape2) = (name.clone(), shape.clone());
            match dt.element_size() {
                Some(size) => prop::collection::vec(any::<u8>(), n * size)
                    .prop_map(move |mut d| {
                        json_canonical(dt, &mut d);
                        Tensor::new(name.clone(), dt, shape.clone(), d).unwrap()
                    })
                    .boxed(),
                None => prop::collection::vec(
                    prop::collection::vec(any::<char>(), 0..5).prop_map(String::from_iter),
                    n,
                )
                .prop_map(move |els| {
                    Tensor::from_bytes_elements(name.clone(), shape2.clone(), &els).unwrap()
                })
                .boxed(),
            }
        })
        .boxed()
}

/// Makes every NaN the one `NaN` in JSON reads into (JSON carries no payload or sign); BOOL
/// bytes become 0 or 1.
fn json_canonical(dt: DataType, d: &mut [u8]) {
    let size = dt.element_size().unwrap_or(1);
    for c in d.chunks_exact_mut(size) {
        match dt {
            DataType::Bool => c[0] &= 1,
            DataType::Fp16 if half::f16::from_le_bytes([c[0], c[1]]).is_nan() => {
                c.copy_from_slice(&half::f16::from_f64(f64::NAN).to_le_bytes())
            }
            DataType::Bf16 if half::bf16::from_le_bytes([c[0], c[1]]).is_nan() => {
                c.copy_from_slice(&half::bf16::from_f64(f64::NAN).to_le_bytes())
            }
            DataType::Fp32 if f32::from_le_bytes([c[0], c[1], c[2], c[3]]).is_nan() => {
                c.copy_from_slice(&(f64::NAN as f32).to_le_bytes())
            }
            DataType::Fp64 if f64::from_le_bytes(c.try_into().unwrap()).is_nan() => {
                c.copy_from_slice(&f64::NAN.to_le_bytes())
            }
            _ => {}
        }
    }
}

pub(crate) fn tensors() -> impl Strategy<Value = Vec<Tensor>> {
    (0usize..4).prop_flat_map(|n| (0..n).map(|i| tensor(format!("t{i}"))).collect::<Vec<_>>())
}

pub(crate) fn parameters() -> impl Strategy<Value = Parameters> {
    (
        prop::option::of(1u64..100_000),
        prop::option::of(any::<bool>()),
        prop::option::of("[a-z]{0,6}".prop_map(Parameter::String)),
    )
        .prop_map(|(deadline, bdo, extra)| {
            let mut p = Parameters::new();
            if let Some(ms) = deadline {
                p.set_deadline_ms(ms);
            }
            if let Some(b) = bdo {
                p.insert(BINARY_DATA_OUTPUT, Parameter::Bool(b));
            }
            if let Some(v) = extra {
                p.insert("custom", v);
            }
            p
        })
}

fn outputs() -> impl Strategy<Value = Option<Vec<OutputChoice>>> {
    prop::option::of(
        prop::collection::vec(prop::option::of(any::<bool>()), 0..3).prop_map(|bs| {
            bs.into_iter()
                .enumerate()
                .map(|(i, binary)| OutputChoice {
                    name: format!("o{i}"),
                    binary,
                })
                .collect()
        }),
    )
}

/// A valid request body: tensors, each JSON or binary, parameters, outputs.
fn request() -> impl Strategy<
    Value = (
        Vec<Tensor>,
        Vec<bool>,
        Parameters,
        Option<Vec<OutputChoice>>,
    ),
> {
    (
        tensors(),
        prop::collection::vec(any::<bool>(), 4),
        parameters(),
        outputs(),
    )
}

fn encode(
    tensors: &[Tensor],
    binary: &[bool],
    params: &Parameters,
    outputs: &Option<Vec<OutputChoice>>,
) -> Encoded {
    let inputs: Vec<(&Tensor, bool)> = tensors.iter().zip(binary.iter().copied()).collect();
    encode_request(Some("r"), params, &inputs, outputs.as_deref()).unwrap()
}

#[derive(Debug, Clone)]
enum Mutation {
    Set(Index, u8),
    Insert(Index, &'static [u8]),
    Delete(Index, usize),
    Truncate(Index),
}

const TOKENS: &[&[u8]] = &[
    b"-1",
    b"0",
    b"1",
    b"4",
    b"65536",
    b"4294967296",
    b"18446744073709551615",
    b"9223372036854775808",
    b"1e300",
    b"1e400",
    b"-0",
    b"2.5",
    b"null",
    b"true",
    b"\"\"",
    b"[",
    b"]",
    b"{",
    b"}",
    b",",
    b":",
    b"[[[[",
    b"\"BYTES\"",
    b"\"FP16\"",
    b"\"BOOL\"",
    b"\"binary_data_size\":",
    b"\"data\":",
    b"\"shape\":",
    b"\"name\":\"t0\",",
    b"\"parameters\":{},",
    b"\"deadline_ms\":",
    b"\"binary_data\":",
    b"\"shared_memory_region\":\"r\",",
    b"\xff",
    b"\\u0000",
    b"\"\\ud800\"",
    b"\x00\x00\x00\x00",
    b"\xff\xff\xff\x7f",
    b"NaN",
    b"-Infinity",
    b"Inf",
    b"\r",
];

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<Index>(), byte()).prop_map(|(i, b)| Mutation::Set(i, b)),
        (any::<Index>(), select(TOKENS)).prop_map(|(i, t)| Mutation::Insert(i, t)),
        (any::<Index>(), 1usize..16).prop_map(|(i, n)| Mutation::Delete(i, n)),
        any::<Index>().prop_map(Mutation::Truncate),
    ]
}

/// Mostly the bytes JSON is made of, so that a mutated header often still parses.
fn byte() -> impl Strategy<Value = u8> {
    prop_oneof![
        4 => select(&b"0123456789-+.eE,:[]{}\"\\ tfnu"[..]),
        1 => any::<u8>(),
    ]
}

/// Applies one mutation, moving the header length along with edits inside the header.
fn mutate(body: &mut Vec<u8>, m: &Mutation, header_len: &mut Option<usize>) {
    let at = |i: &Index, len: usize| i.index(len + 1);
    match m {
        Mutation::Set(i, b) => {
            if !body.is_empty() {
                let k = i.index(body.len());
                body[k] = *b;
            }
        }
        Mutation::Insert(i, t) => {
            let k = at(i, body.len());
            body.splice(k..k, t.iter().copied());
            if let Some(h) = header_len.as_mut().filter(|h| k < **h) {
                *h += t.len();
            }
        }
        Mutation::Delete(i, n) => {
            let k = at(i, body.len());
            let end = (k + n).min(body.len());
            body.drain(k..end);
            if let Some(h) = header_len.as_mut() {
                *h -= end.min(*h).saturating_sub(k);
            }
        }
        Mutation::Truncate(i) => {
            let k = at(i, body.len());
            body.truncate(k);
            if let Some(h) = header_len.as_mut() {
                *h = (*h).min(k);
            }
        }
    }
}

/// How a mutated body's header length is given.
#[derive(Debug, Clone)]
enum HeaderLen {
    /// Moved along with the edits in the header.
    Tracked,
    Original,
    Dropped,
    Shifted(i16),
    Any(usize),
}

fn header_len() -> impl Strategy<Value = HeaderLen> {
    prop_oneof![
        6 => Just(HeaderLen::Tracked),
        1 => Just(HeaderLen::Original),
        1 => Just(HeaderLen::Dropped),
        1 => (-40i16..40).prop_map(HeaderLen::Shifted),
        1 => (0usize..2048).prop_map(HeaderLen::Any),
    ]
}

fn apply(h: &HeaderLen, original: Option<usize>, tracked: Option<usize>) -> Option<usize> {
    match h {
        HeaderLen::Tracked => tracked,
        HeaderLen::Original => original,
        HeaderLen::Dropped => None,
        HeaderLen::Shifted(d) => {
            Some((tracked.unwrap_or(0) as i64 + i64::from(*d)).max(0) as usize)
        }
        HeaderLen::Any(n) => Some(*n),
    }
}

/// JSON values put in place of one of a header's values.
const REPLACEMENTS: &[&str] = &[
    "-1",
    "0",
    "1",
    "2",
    "3",
    "4",
    "8",
    "65536",
    "4294967296",
    "18446744073709551615",
    "-9223372036854775808",
    "1.5",
    "1e300",
    "true",
    "false",
    "null",
    "\"\"",
    "\"FP32\"",
    "\"BYTES\"",
    "\"BOOL\"",
    "\"UINT8\"",
    "\"t0\"",
    "[]",
    "[0]",
    "[1,2]",
    "[[1],[2]]",
    "[\"a\"]",
    "[true]",
    "{}",
    "{\"binary_data_size\":4}",
    "{\"binary_data\":true}",
    "{\"deadline_ms\":0}",
];

#[derive(Debug, Clone)]
enum Edit {
    Replace(Index, &'static str),
    Remove(Index),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        3 => (any::<Index>(), select(REPLACEMENTS)).prop_map(|(i, v)| Edit::Replace(i, v)),
        1 => any::<Index>().prop_map(Edit::Remove),
    ]
}

/// The JSON pointers of every value under `v` (`v` itself excluded).
fn pointers(v: &serde_json::Value, at: &str, out: &mut Vec<String>) {
    let children: Vec<(String, &serde_json::Value)> = match v {
        serde_json::Value::Object(m) => m
            .iter()
            .map(|(k, c)| (k.replace('~', "~0").replace('/', "~1"), c))
            .collect(),
        serde_json::Value::Array(a) => a
            .iter()
            .enumerate()
            .map(|(i, c)| (i.to_string(), c))
            .collect(),
        _ => return,
    };
    for (k, c) in children {
        let p = format!("{at}/{k}");
        out.push(p.clone());
        pointers(c, &p, out);
    }
}

fn apply_edit(v: &mut serde_json::Value, e: &Edit) {
    let mut all = Vec::new();
    pointers(v, "", &mut all);
    let pick = |i: &Index| all.get(i.index(all.len().max(1))).cloned();
    match e {
        Edit::Replace(i, text) => {
            if let Some(p) = pick(i) {
                *v.pointer_mut(&p).unwrap() = serde_json::from_str(text).unwrap();
            }
        }
        Edit::Remove(i) => {
            if let Some(p) = pick(i) {
                let (parent, key) = p.rsplit_once('/').unwrap();
                let key = key.replace("~1", "/").replace("~0", "~");
                match v.pointer_mut(parent).unwrap() {
                    serde_json::Value::Object(m) => {
                        m.remove(&key);
                    }
                    serde_json::Value::Array(a) => {
                        a.remove(key.parse::<usize>().unwrap());
                    }
                    _ => unreachable!("a pointer's parent holds it"),
                }
            }
        }
    }
}

const DIMS: &[&str] = &["1", "2", "3", "1", "2", "0"];
/// Wrong, or large: within the fuzz limit, but past what a short body holds.
const BAD_DIMS: &[&str] = &[
    "-1",
    "2048",
    "4096",
    "8192",
    "16384",
    "4294967296",
    "9223372036854775807",
    "1.0",
    "\"2\"",
];
const DTYPES: &[&str] = &[
    "BOOL", "UINT8", "INT16", "UINT32", "INT64", "FP16", "BF16", "FP32", "FP64", "BYTES", "fp32",
    "", "INT128",
];
const DATA: &[&str] = &[
    "[]",
    "[0]",
    "[1,2]",
    "[[1],[2]]",
    "[[1,2],[3,4],[5,6]]",
    "[true,false]",
    "[\"a\",\"\"]",
    "[1e300]",
    "[-1]",
    "[255,256]",
    "[0.5,65504,65520]",
    "null",
    "{}",
    "1",
    "[[[[[]]]]]",
    "[null]",
    "[\"\\u00e9\"]",
    "[NaN,-Inf]",
    "[[Infinity],\r[-NaN]]",
    "[\"NaN\",Inf]",
];
const SIZES: &[&str] = &[
    "0",
    "1",
    "2",
    "3",
    "4",
    "5",
    "8",
    "12",
    "16",
    "-1",
    "4294967296",
    "\"4\"",
    "1.5",
    "true",
];
const NAMES: &[&str] = &["a", "b", "c", "d", "e", "f", "a", ""];
const EXTRA: &[&str] = &[
    "",
    "",
    "",
    ",\"x\":1",
    ",\"shared_memory_region\":\"r\"",
    ",\"binary_data\":true",
];

/// One input's JSON text from pieces, most of them wrong somewhere.
fn assembled_input() -> impl Strategy<Value = String> {
    (
        select(NAMES),
        prop::collection::vec(prop_oneof![3 => select(DIMS), 1 => select(BAD_DIMS)], 0..3),
        select(DTYPES),
        prop::option::of(select(DATA)),
        prop::option::of(select(SIZES)),
        select(EXTRA),
    )
        .prop_map(|(name, dims, dt, data, size, extra)| {
            let mut s = format!(
                r#"{{"name":"{name}","shape":[{}],"datatype":"{dt}""#,
                dims.join(",")
            );
            if let Some(d) = data {
                s += &format!(r#","data":{d}"#);
            }
            let size = size.map(|n| format!(r#""binary_data_size":{n}"#));
            let params = [
                size.unwrap_or_default(),
                extra.trim_start_matches(',').to_owned(),
            ];
            let params: Vec<&String> = params.iter().filter(|p| !p.is_empty()).collect();
            if !params.is_empty() {
                let params: Vec<&str> = params.iter().map(|p| p.as_str()).collect();
                s += &format!(r#","parameters":{{{}}}"#, params.join(","));
            }
            s + "}"
        })
}

proptest! {
    #![proptest_config(isolane_core::fuzz::config(500))]

    #[test]
    fn fuzz_encoded_requests_and_responses_round_trip(
        (tensors, binary, params, outputs) in request(),
        late in any::<bool>(),
    ) {
        let enc = encode(&tensors, &binary, &params, &outputs);
        let r = decode_request(&enc.body, enc.header_len, &LIMITS).unwrap();
        prop_assert_eq!(&r.inputs, &tensors);
        prop_assert_eq!(r.id.as_deref(), Some("r"));
        prop_assert_eq!(&r.parameters, &params);
        prop_assert_eq!(r.deadline_ms, params.deadline_ms().unwrap());
        prop_assert_eq!(&r.outputs.requested, &outputs);

        // The response to it, with the outputs in the form it asked for.
        let outs: Vec<Tensor> = tensors
            .iter()
            .enumerate()
            .map(|(i, t)| Tensor::new(format!("o{i}"), t.datatype(), t.shape().to_vec(), t.data().to_vec()).unwrap())
            .collect();
        let mut meta = ResponseMeta { model_name: "m".into(), model_version: None, id: r.id.clone(), parameters: Parameters::new() };
        meta.parameters.set_late(late);
        let enc = encode_response(&meta, &outs, &r.outputs).unwrap();
        prop_assert_eq!(enc.header_len.is_some(), outs.iter().any(|t| r.outputs.binary(t.name())));
        let back = decode_response(&enc.body, enc.header_len, &LIMITS).unwrap();
        prop_assert_eq!(back.outputs, outs);
        prop_assert_eq!(back.late, late);
        prop_assert_eq!(back.meta, meta);
    }
}

proptest! {
    #![proptest_config(isolane_core::fuzz::config(1000))]

    #[test]
    fn fuzz_mutated_request_bodies_are_decoded_or_refused(
        (tensors, binary, params, outputs) in request(),
        mutations in prop::collection::vec(mutation(), 1..4),
        hl in header_len(),
    ) {
        let enc = encode(&tensors, &binary, &params, &outputs);
        let mut body = enc.body;
        let mut tracked = enc.header_len;
        for m in &mutations {
            mutate(&mut body, m, &mut tracked);
        }
        let header_len = apply(&hl, enc.header_len, tracked);
        check_request(&body, header_len)?;
        check_response(&body, header_len)?;
    }

    #[test]
    fn fuzz_edited_request_headers_are_decoded_or_refused(
        (tensors, binary, params, outputs) in request(),
        edits in prop::collection::vec(edit(), 1..3),
        keep_len in prop::bool::weighted(0.9),
    ) {
        let enc = encode(&tensors, &binary, &params, &outputs);
        let split = enc.header_len.unwrap_or(enc.body.len());
        // A header whose data holds NaN or an infinity is not standard JSON, which the edits
        // need; the other targets put those tokens in every place.
        let header = serde_json::from_slice::<serde_json::Value>(&enc.body[..split]);
        prop_assume!(header.is_ok());
        let mut header = header.unwrap();
        for e in &edits {
            apply_edit(&mut header, e);
        }
        let mut body = serde_json::to_vec(&header).unwrap();
        let len = body.len();
        body.extend_from_slice(&enc.body[split..]);
        let header_len = if keep_len { enc.header_len.map(|_| len) } else { Some(len) };
        check_request(&body, header_len)?;
    }

    #[test]
    fn fuzz_assembled_request_headers_are_decoded_or_refused(
        inputs in prop::collection::vec(assembled_input(), 0..4),
        deadline in prop_oneof![
            3 => Just(None),
            1 => select(&["20", "0", "-1", "\"5\"", "1.5"][..]).prop_map(Some),
        ],
        tail in prop::collection::vec(any::<u8>(), 0..48),
        with_len in any::<bool>(),
    ) {
        let params = deadline.map(|d| format!(r#","parameters":{{"deadline_ms":{d}}}"#)).unwrap_or_default();
        let header = format!(r#"{{"inputs":[{}]{params}}}"#, inputs.join(","));
        let mut body = header.clone().into_bytes();
        body.extend_from_slice(&tail);
        let header_len = with_len.then_some(header.len());
        check_request(&body, header_len)?;
        if !with_len {
            check_request(header.as_bytes(), None)?;
        }
    }

    #[test]
    fn fuzz_arbitrary_bodies_and_header_lengths_are_refused_or_decoded(
        body in prop::collection::vec(any::<u8>(), 0..512),
        header_len in prop::option::of(0usize..600),
    ) {
        check_request(&body, header_len)?;
        check_response(&body, header_len)?;
        if parse_header_length(&body).is_ok() {
            prop_assert!(body.trim_ascii().iter().all(u8::is_ascii_digit));
        }
    }
}
