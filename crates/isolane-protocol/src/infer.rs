//! Inference bodies: a JSON header, then (binary tensor data extension) the binary tensors in
//! the header's order, the header's length given by `Inference-Header-Content-Length`. Decoded
//! into checked [`Tensor`]s, and encoded back.

use crate::error::json_error;
use crate::messages::{InferRequest, InferResponse, InferTensor, RequestedOutput};
use crate::nonfinite;
use crate::params::{param_error, BINARY_DATA, BINARY_DATA_OUTPUT, BINARY_DATA_SIZE};
use crate::tensor::{
    check_binary, check_json_encodable, decode_json_data, element_count, json_with_non_finite,
    shape_text, JsonData,
};
use crate::{DataType, Limits, Parameter, Parameters, ProtocolError, Tensor, MAX_DIMS};
use bytes::Bytes;
use serde::Serialize;
use std::collections::HashSet;

/// The HTTP header giving the JSON header's length when binary tensors follow it.
pub const HEADER_LENGTH: &str = "Inference-Header-Content-Length";

/// Input and output parameters of extensions isolane does not implement: refused by name
/// rather than ignored, since ignoring them would answer a different question.
/// The shared memory extension's parameters, in this order: region, byte size, offset.
pub const SHARED_MEMORY: [&str; 3] = [
    "shared_memory_region",
    "shared_memory_byte_size",
    "shared_memory_offset",
];

/// An output a request asks for, and whether as binary data (`None`: as the request's
/// `binary_data_output` says).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputChoice {
    pub name: String,
    pub binary: Option<bool>,
}

/// Which outputs a request asks for, and in which form.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutputSelection {
    /// The outputs named in the request; `None`: every output of the model.
    pub requested: Option<Vec<OutputChoice>>,
    /// The request parameter `binary_data_output`.
    pub binary_data_output: bool,
    /// Outputs to be written into registered shared memory instead of the response (the
    /// shared memory extension; only where the server offers it).
    pub shared: Vec<(String, SharedRef)>,
    /// Outputs asked for as their top classes (the classification extension: the output
    /// parameter `classification`, a count above 0), with that count: each is answered as
    /// [`classify`] makes it.
    pub classification: Vec<(String, u32)>,
}

/// The classification extension's output parameter: how many of the output's top classes to
/// answer with, instead of the tensor.
pub const CLASSIFICATION: &str = "classification";

/// The most elements one row of an output may have for its classes to be sorted (Triton's
/// bound, against a pathological sort).
pub const MAX_CLASSIFICATION_ELEMENTS: u64 = 1_000_000;

/// An output as the classification extension answers it, as Triton does
/// (`src/classification.cc`): for each row of its first (batch) dimension, the `count` largest
/// elements (at most the row's), largest first, each a string `"value:index"`, the value as C's
/// `%f` writes it (`"3.300000:1"`) and the index within the row; a BYTES tensor of shape
/// `[rows, count]`. Equal values keep their index order; NaN ranks below every number.
pub fn classify(t: &Tensor, count: u32) -> Result<Tensor, ProtocolError> {
    let what = format!("output `{}`", t.name());
    if t.datatype() != DataType::Fp32 {
        return Err(ProtocolError::Unsupported {
            feature: "the classification extension",
            message: format!(
                "{what} is {}; classes are read from FP32 outputs",
                t.datatype()
            ),
        });
    }
    let (rows, row) = match t.shape().split_first() {
        Some((&rows, rest)) => (rows, rest.iter().product::<u64>()),
        None => (1, 1),
    };
    if row > MAX_CLASSIFICATION_ELEMENTS {
        return Err(ProtocolError::Unsupported {
            feature: "the classification extension",
            message: format!(
                "{what} has {row} elements per row, more than the {MAX_CLASSIFICATION_ELEMENTS} \
                 whose classes are sorted"
            ),
        });
    }
    let row = row as usize;
    let values: Vec<f32> = t
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let k = (count as usize).min(row);
    let mut classes = Vec::with_capacity(rows as usize * k);
    let mut order: Vec<usize> = Vec::with_capacity(row);
    for r in values.chunks_exact(row.max(1)).take(rows as usize) {
        order.clear();
        order.extend(0..row);
        // Largest first; NaN below every number; equal values in index order (a stable sort).
        order.sort_by(|&a, &b| match (r[a].is_nan(), r[b].is_nan()) {
            (false, false) => r[b].partial_cmp(&r[a]).unwrap_or(std::cmp::Ordering::Equal),
            (x, y) => x.cmp(&y),
        });
        for &i in &order[..k] {
            classes.push(format!("{}:{i}", c_float(r[i])));
        }
    }
    Tensor::from_bytes_elements(t.name(), vec![rows, k as u64], &classes)
}

/// A float as C's `printf("%f", (double) x)` writes it (Triton's `std::to_string`).
fn c_float(x: f32) -> String {
    match x {
        x if x.is_nan() && x.is_sign_negative() => "-nan".into(),
        x if x.is_nan() => "nan".into(),
        x if x.is_infinite() && x > 0.0 => "inf".into(),
        x if x.is_infinite() => "-inf".into(),
        x => format!("{:.6}", x as f64),
    }
}

/// Where a tensor's data lies in a registered system shared memory region (the protocol's
/// shared memory extension: parameters `shared_memory_region`, `shared_memory_offset`,
/// `shared_memory_byte_size`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedRef {
    pub region: String,
    pub offset: u64,
    pub byte_size: u64,
}

impl SharedRef {
    /// A tensor's shared memory parameters: `None` when it has none; refused when the region
    /// or byte size is missing, or a value is of the wrong type or negative.
    pub fn from_parameters(p: &Parameters, what: &str) -> Result<Option<SharedRef>, ProtocolError> {
        if !SHARED_MEMORY.iter().any(|k| p.contains(k)) {
            return Ok(None);
        }
        let region = match p.get(SHARED_MEMORY[0]) {
            Some(Parameter::String(r)) if !r.is_empty() => r.clone(),
            Some(_) => {
                return Err(param_error(
                    what,
                    SHARED_MEMORY[0],
                    "is not a region's name (a non-empty string)".into(),
                ))
            }
            None => {
                return Err(param_error(
                    what,
                    SHARED_MEMORY[0],
                    format!(
                        "is missing, but `{}` or `{}` is given; name the registered region",
                        SHARED_MEMORY[1], SHARED_MEMORY[2]
                    ),
                ))
            }
        };
        let count = |key: &str, default: Option<u64>| -> Result<u64, ProtocolError> {
            match (p.int(key, what)?, default) {
                (Some(v), _) => u64::try_from(v).map_err(|_| {
                    param_error(what, key, format!("is {v}; a byte count is 0 or more"))
                }),
                (None, Some(d)) => Ok(d),
                (None, None) => Err(param_error(what, key, "is missing".into())),
            }
        };
        Ok(Some(SharedRef {
            byte_size: count(SHARED_MEMORY[1], None)?,
            offset: count(SHARED_MEMORY[2], Some(0))?,
            region,
        }))
    }

    /// The parameters that say where the data is, as a response names an output written there.
    pub fn parameters(&self) -> Parameters {
        let mut p = Parameters::new();
        p.insert(SHARED_MEMORY[0], Parameter::String(self.region.clone()));
        p.insert(
            SHARED_MEMORY[1],
            Parameter::Int(i64::try_from(self.byte_size).unwrap_or(i64::MAX)),
        );
        if self.offset != 0 {
            p.insert(
                SHARED_MEMORY[2],
                Parameter::Int(i64::try_from(self.offset).unwrap_or(i64::MAX)),
            );
        }
        p
    }
}

/// The shared memory regions a server has registered: where inputs given by reference are
/// read from.
pub trait SharedMemory {
    /// The bytes `r` names: a view of the region where the server maps it (no copy: a 602 KB
    /// frame would otherwise be copied once more per request, before the model's own input
    /// copy), else a copy; refused (naming the region) when it is not registered or `r`
    /// reaches past it.
    fn read(&self, r: &SharedRef, what: &str) -> Result<Bytes, ProtocolError>;
}

impl OutputSelection {
    /// Where output `name` goes in shared memory, if the request said so.
    pub fn shared(&self, name: &str) -> Option<&SharedRef> {
        self.shared.iter().find(|(n, _)| n == name).map(|(_, r)| r)
    }

    /// Whether output `name` goes back as binary data: its own `binary_data`, else the
    /// request's `binary_data_output`, else JSON.
    pub fn binary(&self, name: &str) -> bool {
        self.requested
            .iter()
            .flatten()
            .find(|o| o.name == name)
            .and_then(|o| o.binary)
            .unwrap_or(self.binary_data_output)
    }

    /// How many classes output `name` is answered with, if the request asked for them.
    pub fn classes(&self, name: &str) -> Option<u32> {
        self.classification
            .iter()
            .find(|(n, _)| n == name)
            .map(|&(_, k)| k)
    }

    /// The outputs as a response carries them: each asked for by classification replaced by
    /// its classes ([`classify`]), the others as they are (a clone shares their data).
    pub fn answered(&self, outputs: &[Tensor]) -> Result<Vec<Tensor>, ProtocolError> {
        outputs
            .iter()
            .map(|t| match self.classes(t.name()) {
                Some(k) => classify(t, k),
                None => Ok(t.clone()),
            })
            .collect()
    }
}

/// A checked inference request.
#[derive(Debug, Clone, PartialEq)]
pub struct DecodedRequest {
    pub id: Option<String>,
    /// Every request parameter, as sent (the ones below included).
    pub parameters: Parameters,
    /// The request parameter `deadline_ms` in milliseconds (a fraction allowed), checked
    /// positive and within int64's range.
    pub deadline_ms: Option<f64>,
    /// In the request's order; names unique.
    pub inputs: Vec<Tensor>,
    pub outputs: OutputSelection,
}

/// What an inference response says besides its outputs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ResponseMeta {
    pub model_name: String,
    pub model_version: Option<String>,
    /// The request's `id`, if it had one.
    pub id: Option<String>,
    /// `late = true` (see [`Parameters::set_late`]) for a request that completed after its
    /// deadline.
    pub parameters: Parameters,
}

/// A checked inference response (what a client reads).
#[derive(Debug, Clone, PartialEq)]
pub struct DecodedResponse {
    pub meta: ResponseMeta,
    /// The response parameter `late`.
    pub late: bool,
    pub outputs: Vec<Tensor>,
}

/// An encoded body and, when binary tensors follow the JSON, the value of
/// `Inference-Header-Content-Length`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Encoded {
    pub body: Vec<u8>,
    pub header_len: Option<usize>,
}

impl Encoded {
    /// The body's `Content-Type`.
    pub fn content_type(&self) -> &'static str {
        if self.header_len.is_some() {
            "application/octet-stream"
        } else {
            "application/json"
        }
    }
}

/// Reads an `Inference-Header-Content-Length` value: decimal digits (surrounding spaces
/// allowed, as HTTP allows them around a value).
pub fn parse_header_length(value: &[u8]) -> Result<usize, ProtocolError> {
    let text = value.trim_ascii();
    let bad = || ProtocolError::HeaderLength {
        message: format!(
            "`{}` is not a byte count (decimal digits)",
            String::from_utf8_lossy(&text[..text.len().min(40)])
        ),
    };
    if text.is_empty() || !text.iter().all(u8::is_ascii_digit) {
        return Err(bad());
    }
    std::str::from_utf8(text)
        .ok()
        .and_then(|t| t.parse().ok())
        .ok_or_else(bad)
}

/// Splits a body into its JSON header and its binary part (`None` without a header length).
fn split_body<'b>(
    body: &'b [u8],
    header_len: Option<usize>,
    limits: &Limits,
    what: &'static str,
) -> Result<(&'b str, Option<&'b [u8]>), ProtocolError> {
    if body.len() as u64 > limits.max_body_bytes {
        return Err(ProtocolError::TooLarge {
            what: what.to_owned(),
            size: body.len() as u128,
            limit: limits.max_body_bytes,
        });
    }
    let (header, binary) = match header_len {
        None => (body, None),
        Some(0) => {
            return Err(ProtocolError::Unsupported {
                feature: "a raw binary request (Inference-Header-Content-Length: 0)",
                message: "send a JSON header naming the input, its shape and datatype".into(),
            })
        }
        Some(n) if n > body.len() => {
            return Err(ProtocolError::HeaderLength {
                message: format!("{n} bytes, but the whole body is {} bytes", body.len()),
            })
        }
        Some(n) => (&body[..n], Some(&body[n..])),
    };
    let header = std::str::from_utf8(header).map_err(|e| ProtocolError::Json {
        what,
        message: format!("the JSON header is not UTF-8 text ({e})"),
    })?;
    Ok((header, binary))
}

/// A tensor's header (name, datatype, shape, parameters), checked; its data comes next.
pub(crate) struct TensorHeader {
    /// "input `x`": how errors name the tensor.
    pub what: String,
    pub name: String,
    pub datatype: DataType,
    pub shape: Vec<u64>,
    pub numel: u64,
    /// The bytes of tensor data the message's limit leaves for this tensor.
    pub budget: u64,
}

/// The checks shared by every form a message's tensors come in (JSON `data`, the binary
/// extension, gRPC's raw and typed contents): names unique and not empty, a known datatype, a
/// shape whose size fits what the limit leaves before any data is read, no shared memory; and
/// the running total of the message's tensor bytes.
pub(crate) struct TensorChecker<'l> {
    role: &'static str,
    limits: &'l Limits,
    seen: HashSet<String>,
    total: u64,
    /// Whether shared memory parameters are read (the server offers the extension).
    pub(crate) shared: bool,
}

impl<'l> TensorChecker<'l> {
    /// `role`: "input" or "output".
    pub fn new(role: &'static str, limits: &'l Limits) -> Self {
        TensorChecker {
            role,
            limits,
            seen: HashSet::new(),
            total: 0,
            shared: false,
        }
    }

    /// Checks a tensor's header, before any of its data is read.
    pub fn header(
        &mut self,
        name: &str,
        datatype: &str,
        shape: &[i64],
        parameters: &Parameters,
    ) -> Result<TensorHeader, ProtocolError> {
        let role = self.role;
        let what = format!("{role} `{name}`");
        let err = |field: &'static str, message: String| ProtocolError::Tensor {
            tensor: what.clone(),
            field,
            message,
        };
        if name.is_empty() {
            return Err(err("name", "is empty".into()));
        }
        if !self.seen.insert(name.to_owned()) {
            return Err(ProtocolError::Duplicate {
                kind: role,
                name: name.to_owned(),
            });
        }
        let datatype = DataType::parse(datatype).ok_or_else(|| {
            err(
                "datatype",
                format!(
                    "unknown datatype `{}`; the datatypes are {}",
                    datatype.chars().take(40).collect::<String>(),
                    DataType::allowed()
                ),
            )
        })?;
        // JSON headers are refused past this while they are read; other forms come here.
        if shape.len() > MAX_DIMS {
            return Err(err(
                "shape",
                format!(
                    "has {} dimensions; a shape has at most {MAX_DIMS}",
                    shape.len()
                ),
            ));
        }
        let mut dims = Vec::with_capacity(shape.len());
        for (i, &d) in shape.iter().enumerate() {
            let d = u64::try_from(d).map_err(|_| {
                err(
                    "shape",
                    format!("dimension {i} is {d}; a dimension is 0 or more"),
                )
            })?;
            dims.push(d);
        }
        let shape = dims;
        if let (Some(max), Some(&rows), "input") = (self.limits.max_batch, shape.first(), role) {
            if rows > max {
                return Err(err(
                    "shape",
                    format!(
                        "{} has {rows} rows (its first dimension); the model's batch is \
                         1 ≤ n ≤ {max}",
                        shape_text(&shape)
                    ),
                ));
            }
        }
        let numel = element_count(&what, &shape)?;
        // The fewest bytes the shape's data can take, against what the limit leaves, before any
        // of it is read or allocated.
        let least = u128::from(numel) * u128::from(datatype.min_element_bytes());
        let limit = self.limits.max_tensor_bytes;
        if u128::from(self.total) + least > u128::from(limit) {
            return Err(ProtocolError::TooLarge {
                what: format!(
                    "{what} (shape {} of {datatype}, with the {role}s before it)",
                    shape_text(&shape)
                ),
                size: u128::from(self.total) + least,
                limit,
            });
        }
        if let Some(p) = SHARED_MEMORY.iter().find(|p| parameters.contains(p)) {
            if !self.shared {
                return Err(ProtocolError::Unsupported {
                    feature: "the shared memory extension",
                    message: format!("{what} has parameter `{p}`; send its data in the body"),
                });
            }
        }
        Ok(TensorHeader {
            what,
            name: name.to_owned(),
            datatype,
            shape,
            numel,
            budget: limit - self.total,
        })
    }

    /// Checks `size` bytes of binary data (about to be read from `field`) against what the
    /// limit leaves for the tensor.
    pub fn check_binary_size(&self, h: &TensorHeader, size: u64) -> Result<(), ProtocolError> {
        if size > h.budget {
            return Err(ProtocolError::TooLarge {
                what: format!(
                    "{}'s binary data (with the {}s before it)",
                    h.what, self.role
                ),
                size: u128::from(self.total) + u128::from(size),
                limit: self.limits.max_tensor_bytes,
            });
        }
        Ok(())
    }

    /// Checks binary data as the tensor's elements ([`check_binary`]) and takes it.
    pub fn binary(
        &mut self,
        h: TensorHeader,
        field: &'static str,
        data: Bytes,
    ) -> Result<Tensor, ProtocolError> {
        self.check_binary_size(&h, data.len() as u64)?;
        check_binary(&h.what, field, h.datatype, &h.shape, h.numel, &data)?;
        Ok(self.take(h, data))
    }

    /// The tensor of a checked header and data that holds its elements.
    pub fn take(&mut self, h: TensorHeader, data: impl Into<Bytes>) -> Tensor {
        let data = data.into();
        self.total += data.len() as u64;
        Tensor::checked(h.name, h.datatype, h.shape, data)
    }
}

/// Checks and reads the tensors of a header, taking binary ones from `binary` in order: as
/// slices of `owner` (the body `binary` is part of) where there is one, else as copies.
/// `marked`: the header is one [`nonfinite::mark`] rewrote.
fn decode_tensors(
    tensors: &[InferTensor],
    binary: Option<&[u8]>,
    owner: Option<&Bytes>,
    role: &'static str,
    limits: &Limits,
    shm: Option<&dyn SharedMemory>,
    marked: bool,
) -> Result<Vec<Tensor>, ProtocolError> {
    let mut checker = TensorChecker::new(role, limits);
    checker.shared = shm.is_some();
    let mut rest = binary;
    let mut out = Vec::with_capacity(tensors.len());
    for t in tensors {
        let h = checker.header(&t.name, &t.datatype, &t.shape, &t.parameters)?;
        let what = h.what.clone();
        if let Some(shm) = shm {
            if let Some(r) = SharedRef::from_parameters(&t.parameters, &what)? {
                if t.data.is_some() || t.parameters.contains(BINARY_DATA_SIZE) {
                    return Err(param_error(
                        &what,
                        SHARED_MEMORY[0],
                        format!(
                            "is given, and so is its data (`data` or `{BINARY_DATA_SIZE}`); give one"
                        ),
                    ));
                }
                checker.check_binary_size(&h, r.byte_size)?;
                let data = shm.read(&r, &what)?;
                out.push(checker.binary(h, "parameters.shared_memory_byte_size", data)?);
                continue;
            }
        }
        let err = |field: &'static str, message: String| ProtocolError::Tensor {
            tensor: what.clone(),
            field,
            message,
        };
        let binary_size = t.parameters.int(BINARY_DATA_SIZE, &what)?;
        let tensor = match (&t.data, binary_size) {
            (Some(_), Some(_)) => {
                return Err(err(
                    "data",
                    format!("given both as `data` and as binary (`parameters.{BINARY_DATA_SIZE}`); give one"),
                ))
            }
            (None, None) => {
                return Err(err(
                    "data",
                    format!("missing: give `data` (JSON) or `parameters.{BINARY_DATA_SIZE}` (binary data after the JSON)"),
                ))
            }
            (Some(raw), None) => {
                let data = decode_json_data(
                    &what,
                    h.datatype,
                    &h.shape,
                    h.numel,
                    raw.get(),
                    h.budget,
                    limits.max_tensor_bytes,
                    marked,
                )?;
                checker.take(h, data)
            }
            (None, Some(size)) => {
                let Some(body) = rest else {
                    return Err(param_error(
                        &what,
                        BINARY_DATA_SIZE,
                        format!("is given, but the body has no binary part (no {HEADER_LENGTH} header)"),
                    ));
                };
                let size = u64::try_from(size).map_err(|_| {
                    param_error(&what, BINARY_DATA_SIZE, format!("is {size}; a byte count is 0 or more"))
                })?;
                if size > body.len() as u64 {
                    return Err(param_error(
                        &what,
                        BINARY_DATA_SIZE,
                        format!(
                            "is {size}, but only {} bytes of the body remain after the JSON header \
                             and the binary {role}s before it",
                            body.len()
                        ),
                    ));
                }
                checker.check_binary_size(&h, size)?;
                let (chunk, after) = body.split_at(size as usize);
                rest = Some(after);
                let data = match owner {
                    Some(b) => b.slice_ref(chunk),
                    None => Bytes::copy_from_slice(chunk),
                };
                checker.binary(h, "parameters.binary_data_size", data)?
            }
        };
        out.push(tensor);
    }
    if let Some(left) = rest.filter(|r| !r.is_empty()) {
        return Err(ProtocolError::LeftoverBytes {
            count: left.len() as u64,
        });
    }
    Ok(out)
}

/// Checks the outputs a request asks for (names unique and not empty) and reads each one's
/// `binary_data` and `classification` (into `classes`); with `shared`, an output's shared
/// memory parameters are read into it, and without, refused.
pub(crate) fn requested_outputs_shared<'a>(
    outputs: impl IntoIterator<Item = (&'a str, &'a Parameters)>,
    mut shared: Option<&mut Vec<(String, SharedRef)>>,
    classes: &mut Vec<(String, u32)>,
) -> Result<Vec<OutputChoice>, ProtocolError> {
    let mut seen = HashSet::new();
    let mut choices = Vec::new();
    for (name, parameters) in outputs {
        let what = format!("output `{name}`");
        if name.is_empty() {
            return Err(ProtocolError::Tensor {
                tensor: what,
                field: "name",
                message: "is empty".into(),
            });
        }
        if !seen.insert(name) {
            return Err(ProtocolError::Duplicate {
                kind: "output",
                name: name.to_owned(),
            });
        }
        if let Some(p) = SHARED_MEMORY.iter().find(|p| parameters.contains(p)) {
            match shared.as_deref_mut() {
                Some(list) => {
                    if let Some(r) = SharedRef::from_parameters(parameters, &what)? {
                        list.push((name.to_owned(), r));
                    }
                }
                None => {
                    return Err(ProtocolError::Unsupported {
                        feature: "the shared memory extension",
                        message: format!("{what} has parameter `{p}`"),
                    })
                }
            }
        }
        match parameters.get(CLASSIFICATION) {
            None | Some(Parameter::Int(0)) => {}
            Some(Parameter::Int(k)) if *k > 0 && *k <= u32::MAX as i64 => {
                // As Triton: classes are computed from the tensor, never written to a region.
                if let Some(p) = SHARED_MEMORY.iter().find(|p| parameters.contains(p)) {
                    return Err(param_error(
                        &what,
                        CLASSIFICATION,
                        format!(
                            "is given with `{p}`; an output is answered either as its classes \
                             or in shared memory, not both"
                        ),
                    ));
                }
                classes.push((name.to_owned(), *k as u32));
            }
            Some(p) => {
                return Err(param_error(
                    &what,
                    CLASSIFICATION,
                    format!(
                        "is {p:?}; it is the number of top classes to answer with, an integer \
                         from 0 (the tensor itself) to {}",
                        u32::MAX
                    ),
                ))
            }
        }
        choices.push(OutputChoice {
            name: name.to_owned(),
            binary: parameters.bool(BINARY_DATA, &what)?,
        });
    }
    Ok(choices)
}

/// Decodes an inference request body. `header_len` is the `Inference-Header-Content-Length`
/// header's value (see [`parse_header_length`]), `None` when the request has none (the whole
/// body is JSON).
pub fn decode_request(
    body: &[u8],
    header_len: Option<usize>,
    limits: &Limits,
) -> Result<DecodedRequest, ProtocolError> {
    decode_request_with(body, header_len, limits, None)
}

/// [`decode_request`] for a server that offers the shared memory extension: inputs given by
/// region are read from `shm`, outputs asked for in a region are listed in
/// [`OutputSelection::shared`].
pub fn decode_request_with(
    body: &[u8],
    header_len: Option<usize>,
    limits: &Limits,
    shm: Option<&dyn SharedMemory>,
) -> Result<DecodedRequest, ProtocolError> {
    decode_request_in(body, None, header_len, limits, shm)
}

/// [`decode_request_with`] for a body a server holds as [`Bytes`]: each binary input is a
/// slice of `body`, not a copy of its part (the body's memory lives as long as an input).
pub fn decode_request_bytes(
    body: &Bytes,
    header_len: Option<usize>,
    limits: &Limits,
    shm: Option<&dyn SharedMemory>,
) -> Result<DecodedRequest, ProtocolError> {
    decode_request_in(body, Some(body), header_len, limits, shm)
}

fn decode_request_in(
    body: &[u8],
    owner: Option<&Bytes>,
    header_len: Option<usize>,
    limits: &Limits,
    shm: Option<&dyn SharedMemory>,
) -> Result<DecodedRequest, ProtocolError> {
    let (header, binary) = split_body(body, header_len, limits, "the inference request")?;
    let header = nonfinite::mark(header);
    let req: InferRequest =
        serde_json::from_str(&header.text).map_err(|e| json_error("the inference request", &e))?;
    tokens_in_data_only(&header, &req.inputs, "the inference request")?;
    let deadline_ms = req.parameters.deadline_ms()?;
    req.parameters.refuse_sequence()?;
    let binary_data_output = req
        .parameters
        .bool(BINARY_DATA_OUTPUT, "the request")?
        .unwrap_or(false);
    let marked = header.tokens > 0;
    let inputs = decode_tensors(&req.inputs, binary, owner, "input", limits, shm, marked)?;
    let mut shared = Vec::new();
    let mut classification = Vec::new();
    let requested = match &req.outputs {
        None => None,
        Some(outputs) => Some(requested_outputs_shared(
            outputs.iter().map(|o| (o.name.as_str(), &o.parameters)),
            shm.map(|_| &mut shared),
            &mut classification,
        )?),
    };
    Ok(DecodedRequest {
        id: req.id,
        parameters: req.parameters,
        deadline_ms,
        inputs,
        outputs: OutputSelection {
            requested,
            binary_data_output,
            shared,
            classification,
        },
    })
}

/// Refuses NaN and the infinities anywhere but in tensors' `data` (a shape, a parameter, an
/// unknown field), where [`nonfinite::mark`] made them 0s that would be read as such.
fn tokens_in_data_only(
    header: &nonfinite::Marked<'_>,
    tensors: &[InferTensor],
    what: &'static str,
) -> Result<(), ProtocolError> {
    if header.tokens == 0 {
        return Ok(());
    }
    let in_data: usize = tensors
        .iter()
        .filter_map(|t| t.data.as_deref())
        .map(|raw| nonfinite::count(raw.get()))
        .sum();
    if in_data == header.tokens {
        return Ok(());
    }
    let outside = header.tokens - in_data;
    Err(ProtocolError::Json {
        what,
        message: format!(
            "{outside} of its NaN and infinity tokens (`NaN`, `Inf`, `Infinity`, each with or \
             without `-`) {} outside tensors' `data`; they are read only as elements of FP16, \
             BF16, FP32 and FP64 data",
            if outside == 1 { "is" } else { "are" }
        ),
    })
}

/// Decodes an inference response body (what a client does), with the same checks.
pub fn decode_response(
    body: &[u8],
    header_len: Option<usize>,
    limits: &Limits,
) -> Result<DecodedResponse, ProtocolError> {
    let (header, binary) = split_body(body, header_len, limits, "the inference response")?;
    let header = nonfinite::mark(header);
    let resp: InferResponse =
        serde_json::from_str(&header.text).map_err(|e| json_error("the inference response", &e))?;
    tokens_in_data_only(&header, &resp.outputs, "the inference response")?;
    let late = resp.parameters.late()?;
    let marked = header.tokens > 0;
    let outputs = decode_tensors(&resp.outputs, binary, None, "output", limits, None, marked)?;
    Ok(DecodedResponse {
        meta: ResponseMeta {
            model_name: resp.model_name,
            model_version: resp.model_version,
            id: resp.id,
            parameters: resp.parameters,
        },
        late,
        outputs,
    })
}

/// The header entries of tensors and their binary parts, in order.
/// How a tensor's data goes in a message.
#[derive(Clone, Copy)]
enum Form {
    Json,
    Binary,
    /// Written into shared memory by the server: the message carries no data for it.
    Shared,
}

impl Form {
    fn binary(binary: bool) -> Form {
        if binary {
            Form::Binary
        } else {
            Form::Json
        }
    }
}

/// A message's header entries, their binary parts, and the data texts [`Splice`] puts in.
type Encodings<'t> = (Vec<InferTensor>, Vec<&'t [u8]>, Vec<String>);

/// NaN and the infinities go as Triton's tokens, in a response as in a request (Triton's
/// reader and isolane's take them: [`nonfinite`]).
fn encode_tensors<'t>(
    tensors: impl Iterator<Item = (&'t Tensor, Form)>,
    role: &str,
) -> Result<Encodings<'t>, ProtocolError> {
    let mut entries = Vec::new();
    let mut binaries = Vec::new();
    let mut spliced = Vec::new();
    for (t, form) in tensors {
        let what = format!("{role} `{}`", t.name());
        let shape = t
            .shape()
            .iter()
            .map(|&d| i64::try_from(d))
            .collect::<Result<Vec<i64>, _>>()
            .map_err(|_| ProtocolError::Unrepresentable {
                tensor: what.clone(),
                message: format!("shape {} has a dimension past int64", shape_text(t.shape())),
            })?;
        let mut parameters = Parameters::new();
        let data = match form {
            Form::Binary => {
                let size = i64::try_from(t.data().len()).expect("a Vec's length fits i64");
                parameters.insert(BINARY_DATA_SIZE, Parameter::Int(size));
                binaries.push(t.data());
                None
            }
            // Named by neither data nor parameters: the client asked for it there and knows
            // where; perf_analyzer's HTTP client refuses an output whose parameters lack
            // `binary_data_size` (measured on the H200: "attempt to access non-existing object
            // member 'binary_data_size'").
            Form::Shared => None,
            Form::Json => {
                check_json_encodable(t, &what)?;
                let raw = match json_with_non_finite(t) {
                    // A RawValue holds standard JSON only: a placeholder stands in its place.
                    Some(text) => {
                        spliced.push(text);
                        serde_json::value::RawValue::from_string(format!(
                            "\"{SPLICE}{}\"",
                            spliced.len() - 1
                        ))
                    }
                    None => serde_json::value::to_raw_value(&JsonData(t)),
                };
                Some(raw.map_err(|e| ProtocolError::Unrepresentable {
                    tensor: what.clone(),
                    message: e.to_string(),
                })?)
            }
        };
        entries.push(InferTensor {
            name: t.name().to_owned(),
            shape,
            datatype: t.datatype().name().to_owned(),
            parameters,
            data,
        });
    }
    Ok((entries, binaries, spliced))
}

/// What a placeholder for a [`Splice`] text opens with: a JSON string, where every other raw
/// value of a message is a tensor's data array.
const SPLICE: &str = "isolane-splice:";

/// serde_json's compact writer, but it writes a data text in place of its placeholder: JSON
/// with `NaN` and the infinities, which neither serde_json nor a RawValue writes.
struct Splice<'a>(&'a [String]);

impl serde_json::ser::Formatter for Splice<'_> {
    fn write_raw_fragment<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> std::io::Result<()> {
        let text = fragment
            .strip_prefix('"')
            .and_then(|f| f.strip_prefix(SPLICE))
            .and_then(|f| f.strip_suffix('"'))
            .and_then(|i| i.parse::<usize>().ok())
            .and_then(|i| self.0.get(i));
        writer.write_all(text.map_or(fragment, String::as_str).as_bytes())
    }
}

fn assemble<H: Serialize>(
    header: &H,
    binaries: &[&[u8]],
    spliced: &[String],
    any_binary: bool,
    what: &str,
) -> Result<Encoded, ProtocolError> {
    let mut body = Vec::with_capacity(128 + spliced.iter().map(String::len).sum::<usize>());
    let mut ser = serde_json::Serializer::with_formatter(&mut body, Splice(spliced));
    header
        .serialize(&mut ser)
        .map_err(|e| ProtocolError::Unrepresentable {
            tensor: what.to_owned(),
            message: e.to_string(),
        })?;
    let header_len = any_binary.then_some(body.len());
    body.reserve_exact(binaries.iter().map(|b| b.len()).sum());
    for b in binaries {
        body.extend_from_slice(b);
    }
    Ok(Encoded { body, header_len })
}

/// Encodes an inference response: each output as JSON or binary data as `selection` asks
/// ([`OutputSelection::binary`]). Which outputs to send (those requested) is the caller's.
/// NaN and the infinities go as Triton writes them (`NaN`, `Infinity`, `-Infinity`); an output
/// JSON cannot carry (BYTES that are not UTF-8) is refused.
pub fn encode_response(
    meta: &ResponseMeta,
    outputs: &[Tensor],
    selection: &OutputSelection,
) -> Result<Encoded, ProtocolError> {
    let outputs = &selection.answered(outputs)?;
    let (entries, binaries, spliced) = encode_tensors(
        outputs.iter().map(|t| {
            let form = match selection.shared(t.name()) {
                Some(_) => Form::Shared,
                None => Form::binary(selection.binary(t.name())),
            };
            (t, form)
        }),
        "output",
    )?;
    let header = InferResponse {
        model_name: meta.model_name.clone(),
        model_version: meta.model_version.clone(),
        id: meta.id.clone(),
        parameters: meta.parameters.clone(),
        outputs: entries,
    };
    let any_binary = outputs
        .iter()
        .any(|t| selection.shared(t.name()).is_none() && selection.binary(t.name()));
    assemble(&header, &binaries, &spliced, any_binary, "the response")
}

/// Encodes an inference request as tritonclient does (what a client, a test or the fuzz
/// targets send): each input as JSON data or binary data (`true`), and the outputs asked for.
pub fn encode_request(
    id: Option<&str>,
    parameters: &Parameters,
    inputs: &[(&Tensor, bool)],
    outputs: Option<&[OutputChoice]>,
) -> Result<Encoded, ProtocolError> {
    let (entries, binaries, spliced) = encode_tensors(
        inputs.iter().map(|&(t, binary)| (t, Form::binary(binary))),
        "input",
    )?;
    let header = InferRequest {
        id: id.map(str::to_owned),
        parameters: parameters.clone(),
        inputs: entries,
        outputs: outputs.map(|outs| {
            outs.iter()
                .map(|o| {
                    let mut parameters = Parameters::new();
                    if let Some(b) = o.binary {
                        parameters.insert(BINARY_DATA, Parameter::Bool(b));
                    }
                    RequestedOutput {
                        name: o.name.clone(),
                        parameters,
                    }
                })
                .collect()
        }),
    };
    let any_binary = inputs.iter().any(|(_, b)| *b);
    assemble(&header, &binaries, &spliced, any_binary, "the request")
}
