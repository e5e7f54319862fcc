//! A decoded tensor (name, datatype, shape, little-endian bytes) and the reading of its data
//! from a JSON `data` array or from binary data, and the writing of it back as JSON.

use crate::nonfinite;
use crate::{DataType, ProtocolError};
use bytes::Bytes;
use serde::de::{self, DeserializeSeed, SeqAccess, Visitor};
use serde::ser::SerializeSeq;
use serde::{Deserializer, Serialize, Serializer};
use serde_json::ser::Formatter;
use std::fmt;

/// A tensor as an engine takes it: `data` is row-major little-endian elements, BOOL one byte of
/// 0 or 1, BYTES each element a 4-byte little-endian length and its bytes. Always consistent:
/// built only by [`Tensor::new`] (which checks) or by the decoders (which check the same).
///
/// The data is [`Bytes`]: a tensor decoded from a body or a gRPC message it came in is a slice
/// of that message's buffer, not a copy (a 602 KB frame is otherwise copied once more per
/// request), and a clone shares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tensor {
    name: String,
    datatype: DataType,
    shape: Vec<u64>,
    data: Bytes,
}

impl Tensor {
    /// A tensor from its parts; refused when `data` does not hold exactly the shape's elements
    /// (a BOOL byte other than 0 or 1 included).
    pub fn new(
        name: impl Into<String>,
        datatype: DataType,
        shape: Vec<u64>,
        data: Vec<u8>,
    ) -> Result<Tensor, ProtocolError> {
        Tensor::with_bytes(name, datatype, shape, Bytes::from(data))
    }

    /// [`Tensor::new`] of data held as [`Bytes`] (shared, not copied).
    pub fn with_bytes(
        name: impl Into<String>,
        datatype: DataType,
        shape: Vec<u64>,
        data: Bytes,
    ) -> Result<Tensor, ProtocolError> {
        let name = name.into();
        let what = format!("tensor `{name}`");
        let numel = element_count(&what, &shape)?;
        check_binary(&what, "data", datatype, &shape, numel, &data)?;
        Ok(Tensor {
            name,
            datatype,
            shape,
            data,
        })
    }

    /// A BYTES tensor of the given elements.
    pub fn from_bytes_elements<E: AsRef<[u8]>>(
        name: impl Into<String>,
        shape: Vec<u64>,
        elements: &[E],
    ) -> Result<Tensor, ProtocolError> {
        let name = name.into();
        let mut data = Vec::new();
        for (i, e) in elements.iter().enumerate() {
            let e = e.as_ref();
            let len = u32::try_from(e.len()).map_err(|_| ProtocolError::Tensor {
                tensor: format!("tensor `{name}`"),
                field: "data",
                message: format!(
                    "element {i} is {} bytes; a BYTES element is at most 2^32 - 1",
                    e.len()
                ),
            })?;
            data.extend_from_slice(&len.to_le_bytes());
            data.extend_from_slice(e);
        }
        Tensor::new(name, DataType::Bytes, shape, data)
    }

    pub(crate) fn checked(
        name: String,
        datatype: DataType,
        shape: Vec<u64>,
        data: Bytes,
    ) -> Tensor {
        Tensor {
            name,
            datatype,
            shape,
            data,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn datatype(&self) -> DataType {
        self.datatype
    }

    pub fn shape(&self) -> &[u64] {
        &self.shape
    }

    /// The elements' bytes (see the type's documentation).
    pub fn data(&self) -> &[u8] {
        &self.data
    }

    /// The elements' bytes, shared with this tensor's other clones (no copy).
    pub fn bytes(&self) -> &Bytes {
        &self.data
    }

    pub fn into_data(self) -> Bytes {
        self.data
    }

    /// The number of elements (the shape's product; it fits, as the data holds them).
    pub fn element_count(&self) -> u64 {
        self.shape.iter().product()
    }

    /// A BYTES tensor's elements, in order; `None` for another datatype.
    pub fn bytes_elements(&self) -> Option<Vec<&[u8]>> {
        if self.datatype != DataType::Bytes {
            return None;
        }
        let mut out = Vec::new();
        let mut rest = &self.data[..];
        // Checked on construction: every length is there and within the data.
        while rest.len() >= 4 {
            let len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
            out.push(&rest[4..4 + len]);
            rest = &rest[4 + len..];
        }
        Some(out)
    }
}

/// Limits on what one message may make the decoder hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The decoded tensor data of one request (or response), all its tensors together, in bytes.
    /// A shape is checked against it before any of its data is read.
    pub max_tensor_bytes: u64,
    /// A whole body (JSON header and binary data), in bytes: a server reads no more than this.
    pub max_body_bytes: u64,
    /// The most rows (the first dimension) an input may have: a server's model's compiled
    /// batch. A shape past it is refused for its batch, before its bytes are weighed against
    /// `max_tensor_bytes`, so that the client hears the bound it can act on. `None`: no bound.
    pub max_batch: Option<u64>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_tensor_bytes: 256 << 20,
            // JSON data takes several characters per byte of tensor ("0.123456," for 4 bytes).
            max_body_bytes: 512 << 20,
            max_batch: None,
        }
    }
}

pub(crate) fn shape_text(shape: &[u64]) -> String {
    let dims: Vec<String> = shape.iter().map(u64::to_string).collect();
    format!("[{}]", dims.join(", "))
}

pub(crate) fn element_count(what: &str, shape: &[u64]) -> Result<u64, ProtocolError> {
    shape
        .iter()
        .try_fold(1u64, |n, &d| n.checked_mul(d))
        .ok_or_else(|| ProtocolError::Tensor {
            tensor: what.to_owned(),
            field: "shape",
            message: format!("shape {} holds more than 2^64 elements", shape_text(shape)),
        })
}

fn tensor_error(what: &str, field: &'static str, message: String) -> ProtocolError {
    ProtocolError::Tensor {
        tensor: what.to_owned(),
        field,
        message,
    }
}

/// Checks binary `data` against the datatype and shape: the size for fixed-size types (and BOOL
/// bytes 0 or 1), and for BYTES exactly `numel` length-prefixed elements with nothing after.
pub(crate) fn check_binary(
    what: &str,
    field: &'static str,
    datatype: DataType,
    shape: &[u64],
    numel: u64,
    data: &[u8],
) -> Result<(), ProtocolError> {
    match datatype.element_size() {
        Some(size) => {
            let need = u128::from(numel) * size as u128;
            if data.len() as u128 != need {
                return Err(tensor_error(
                    what,
                    field,
                    format!(
                        "{} bytes, but shape {} of {datatype} takes {numel} x {size} = {need} bytes",
                        data.len(),
                        shape_text(shape)
                    ),
                ));
            }
            if datatype == DataType::Bool {
                if let Some(i) = data.iter().position(|&b| b > 1) {
                    return Err(tensor_error(
                        what,
                        field,
                        format!(
                            "BOOL element {i} is the byte {}; BOOL bytes are 0 or 1",
                            data[i]
                        ),
                    ));
                }
            }
        }
        None => {
            let mut off = 0usize;
            let mut count = 0u64;
            while off < data.len() {
                if count == numel {
                    return Err(tensor_error(
                        what,
                        field,
                        format!(
                            "{} bytes after the {numel} BYTES elements of shape {}",
                            data.len() - off,
                            shape_text(shape)
                        ),
                    ));
                }
                let Some(len) = data.get(off..off + 4) else {
                    return Err(tensor_error(
                        what,
                        field,
                        format!(
                            "BYTES element {count}'s 4-byte length is cut off at byte {off} of {}",
                            data.len()
                        ),
                    ));
                };
                let len = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
                if len > data.len() - off - 4 {
                    return Err(tensor_error(
                        what,
                        field,
                        format!(
                            "BYTES element {count} is {len} bytes long, past the end of the \
                             tensor's {} bytes",
                            data.len()
                        ),
                    ));
                }
                off += 4 + len;
                count += 1;
            }
            if count != numel {
                return Err(tensor_error(
                    what,
                    field,
                    format!(
                        "{count} BYTES elements, but shape {} holds {numel}",
                        shape_text(shape)
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// One JSON element as the parser saw it.
#[derive(Clone, Copy)]
enum Elem<'a> {
    Bool(bool),
    Uint(u64),
    Int(i64),
    Float(f64),
    Str(&'a str),
}

impl Elem<'_> {
    fn kind(&self) -> &'static str {
        match self {
            Elem::Bool(_) => "a boolean",
            Elem::Uint(_) | Elem::Int(_) => "an integer",
            Elem::Float(_) => "a number with a fraction or exponent",
            Elem::Str(_) => "a string",
        }
    }

    fn text(&self) -> String {
        match self {
            Elem::Bool(b) => b.to_string(),
            Elem::Uint(u) => u.to_string(),
            Elem::Int(i) => i.to_string(),
            Elem::Float(x) => x.to_string(),
            Elem::Str(s) => format!("{:?}", s.chars().take(40).collect::<String>()),
        }
    }
}

/// Where a JSON `data` array's elements go, converted and checked one by one.
struct Sink<'w> {
    what: &'w str,
    datatype: DataType,
    shape: &'w [u64],
    expected: u64,
    count: u64,
    out: Vec<u8>,
    /// The most bytes `out` may take (the tensor's size, or for BYTES what the limit leaves).
    cap: usize,
    limit: u64,
    /// The bytes of the message's tensors before this one.
    before: u64,
    error: Option<ProtocolError>,
}

impl Sink<'_> {
    fn reserve(&mut self, n: usize) -> Result<(), ProtocolError> {
        let need = self.out.len() + n;
        if need > self.cap {
            return Err(ProtocolError::TooLarge {
                what: format!("{}'s data (with the tensors before it)", self.what),
                size: u128::from(self.before) + need as u128,
                limit: self.limit,
            });
        }
        if need > self.out.capacity() {
            // Grows like Vec does, but never past the cap, so that the allocation stays within it.
            let target = need
                .max(self.out.capacity().saturating_mul(2))
                .min(self.cap);
            self.out.reserve_exact(target - self.out.len());
        }
        Ok(())
    }

    fn push(&mut self, e: Elem<'_>) -> Result<(), ProtocolError> {
        let i = self.count;
        if i == self.expected {
            return Err(tensor_error(
                self.what,
                "data",
                format!(
                    "more than the {} elements of shape {}",
                    self.expected,
                    shape_text(self.shape)
                ),
            ));
        }
        let dt = self.datatype;
        let what = self.what;
        let mismatch = |e: &Elem<'_>, allowed: &str| {
            tensor_error(
                what,
                "data",
                format!(
                    "element {i} ({}) is {}; {dt} elements are {allowed}",
                    e.text(),
                    e.kind()
                ),
            )
        };
        let out_of_range = |e: &Elem<'_>| {
            tensor_error(
                what,
                "data",
                format!("element {i} ({}) is out of {dt}'s range", e.text()),
            )
        };
        macro_rules! int {
            ($t:ty) => {{
                let v: Option<$t> = match e {
                    Elem::Uint(u) => Some(<$t>::try_from(u).map_err(|_| out_of_range(&e))?),
                    Elem::Int(v) => Some(<$t>::try_from(v).map_err(|_| out_of_range(&e))?),
                    _ => None,
                };
                let v = v.ok_or_else(|| mismatch(&e, "integers"))?;
                self.reserve(std::mem::size_of::<$t>())?;
                self.out.extend_from_slice(&v.to_le_bytes());
            }};
        }
        let float = |e: &Elem<'_>| -> Result<f64, ProtocolError> {
            match *e {
                Elem::Uint(u) => Ok(u as f64),
                Elem::Int(v) => Ok(v as f64),
                // serde_json reads only finite numbers (it refuses 1e400); narrowing is checked below.
                Elem::Float(x) => Ok(x),
                _ => Err(mismatch(e, "numbers")),
            }
        };
        match dt {
            DataType::Bool => match e {
                Elem::Bool(b) => {
                    self.reserve(1)?;
                    self.out.push(u8::from(b));
                }
                _ => return Err(mismatch(&e, "true or false")),
            },
            DataType::Uint8 => int!(u8),
            DataType::Uint16 => int!(u16),
            DataType::Uint32 => int!(u32),
            DataType::Uint64 => int!(u64),
            DataType::Int8 => int!(i8),
            DataType::Int16 => int!(i16),
            DataType::Int32 => int!(i32),
            DataType::Int64 => int!(i64),
            DataType::Fp16 => {
                let h = half::f16::from_f64(float(&e)?);
                if !h.is_finite() {
                    return Err(out_of_range(&e));
                }
                self.reserve(2)?;
                self.out.extend_from_slice(&h.to_le_bytes());
            }
            DataType::Bf16 => {
                let h = half::bf16::from_f64(float(&e)?);
                if !h.is_finite() {
                    return Err(out_of_range(&e));
                }
                self.reserve(2)?;
                self.out.extend_from_slice(&h.to_le_bytes());
            }
            DataType::Fp32 => {
                let x = float(&e)? as f32;
                if !x.is_finite() {
                    return Err(out_of_range(&e));
                }
                self.reserve(4)?;
                self.out.extend_from_slice(&x.to_le_bytes());
            }
            DataType::Fp64 => {
                let x = float(&e)?;
                if !x.is_finite() {
                    return Err(out_of_range(&e));
                }
                self.reserve(8)?;
                self.out.extend_from_slice(&x.to_le_bytes());
            }
            DataType::Bytes => match e {
                Elem::Str(s) => {
                    let len = u32::try_from(s.len()).map_err(|_| {
                        tensor_error(
                            self.what,
                            "data",
                            format!(
                                "element {i} is {} bytes; a BYTES element is at most 2^32 - 1",
                                s.len()
                            ),
                        )
                    })?;
                    self.reserve(4 + s.len())?;
                    self.out.extend_from_slice(&len.to_le_bytes());
                    self.out.extend_from_slice(s.as_bytes());
                }
                _ => return Err(mismatch(&e, "strings")),
            },
        }
        self.count += 1;
        Ok(())
    }
}

/// A JSON value of `data`: an element, or an array (of any depth) of them.
struct Flat<'s, 'w>(&'s mut Sink<'w>);

impl<'de> DeserializeSeed<'de> for Flat<'_, '_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl Flat<'_, '_> {
    fn take<E: de::Error>(self, e: Elem<'_>) -> Result<(), E> {
        self.0.push(e).map_err(|err| {
            // The protocol error is the one reported; serde's own only stops the parse.
            self.0.error = Some(err);
            E::custom("stopped")
        })
    }
}

impl<'de> Visitor<'de> for Flat<'_, '_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a tensor element (number, boolean or string) or an array of them")
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<(), E> {
        self.take(Elem::Bool(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<(), E> {
        self.take(Elem::Int(v))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
        self.take(Elem::Uint(v))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<(), E> {
        self.take(Elem::Float(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        self.take(Elem::Str(v))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let sink = self.0;
        while seq.next_element_seed(Flat(&mut *sink))?.is_some() {}
        Ok(())
    }
}

/// Reads a JSON `data` array (flat or nested; only the element count must match the shape)
/// into little-endian bytes. `budget` is what the message's limit leaves. `marked`: the text is
/// a part of one [`nonfinite::mark`] rewrote, whose markers are NaN and the infinities.
#[allow(clippy::too_many_arguments)]
pub(crate) fn decode_json_data(
    what: &str,
    datatype: DataType,
    shape: &[u64],
    numel: u64,
    raw: &str,
    budget: u64,
    limit: u64,
    marked: bool,
) -> Result<Vec<u8>, ProtocolError> {
    let raw = raw.trim_start();
    // In a marked text every carriage return is a marker's.
    let marked = marked && raw.contains('\r');
    let float = matches!(
        datatype,
        DataType::Fp16 | DataType::Bf16 | DataType::Fp32 | DataType::Fp64
    );
    if marked && !float {
        let allowed = match datatype {
            DataType::Bool => "true or false",
            DataType::Bytes => "strings",
            _ => "integers",
        };
        let token = nonfinite::first(raw).map_or("NaN", nonfinite::Kind::token);
        return Err(tensor_error(
            what,
            "data",
            format!(
                "holds {token}; {datatype} elements are {allowed} (NaN and the infinities are \
                 FP16, BF16, FP32 and FP64 values)"
            ),
        ));
    }
    if !raw.starts_with('[') {
        let kind = match raw.as_bytes().first() {
            Some(b'{') => "an object",
            Some(b'"') => "a string",
            Some(b'n') => "null",
            Some(b't' | b'f') => "a boolean",
            _ => "a number",
        };
        return Err(tensor_error(
            what,
            "data",
            format!("is {kind}; `data` is an array of elements (flat or nested)"),
        ));
    }
    let (cap, initial) = match datatype.element_size() {
        // The shape's size was checked against the budget already. Each element takes at least
        // two characters ("0,"), so a short text never reserves a large shape's size.
        Some(size) => {
            let bytes = (numel * size as u64) as usize;
            (bytes, bytes.min((raw.len() / 2 + 1) * size))
        }
        None => (usize::try_from(budget).unwrap_or(usize::MAX), 0),
    };
    let mut sink = Sink {
        what,
        datatype,
        shape,
        expected: numel,
        count: 0,
        out: Vec::with_capacity(initial),
        cap,
        limit,
        before: limit - budget,
        error: None,
    };
    let mut de = serde_json::Deserializer::from_str(raw);
    let parsed = Flat(&mut sink).deserialize(&mut de).and_then(|()| de.end());
    if let Some(e) = sink.error.take() {
        return Err(e);
    }
    if let Err(e) = parsed {
        return Err(tensor_error(what, "data", e.to_string()));
    }
    if sink.count != numel {
        return Err(tensor_error(
            what,
            "data",
            format!(
                "{} elements, but shape {} holds {numel}",
                sink.count,
                shape_text(shape)
            ),
        ));
    }
    if marked {
        // Each marker was read as a 0 at its element's place: it takes its value there, in
        // the datatype as Triton narrows a double (NaN stays a quiet NaN).
        let out = &mut sink.out;
        nonfinite::for_each_marked(raw, |i, kind| {
            let x = kind.value();
            let mut buf = [0u8; 8];
            let size = match datatype {
                DataType::Fp16 => put(&mut buf, &half::f16::from_f64(x).to_le_bytes()),
                DataType::Bf16 => put(&mut buf, &half::bf16::from_f64(x).to_le_bytes()),
                DataType::Fp32 => put(&mut buf, &(x as f32).to_le_bytes()),
                _ => put(&mut buf, &x.to_le_bytes()),
            };
            let at = i as usize * size;
            if let Some(place) = out.get_mut(at..at + size) {
                place.copy_from_slice(&buf[..size]);
            }
        });
    }
    Ok(sink.out)
}

/// Copies `bytes` to the start of `buf`; their count.
fn put(buf: &mut [u8; 8], bytes: &[u8]) -> usize {
    buf[..bytes.len()].copy_from_slice(bytes);
    bytes.len()
}

/// A tensor's data as a flat JSON array; checked beforehand by [`check_json_encodable`].
pub(crate) struct JsonData<'t>(pub &'t Tensor);

/// Refuses what JSON cannot carry: BYTES elements that are not UTF-8. (NaN and the infinities
/// go as Triton writes them: [`json_with_non_finite`].)
pub(crate) fn check_json_encodable(t: &Tensor, what: &str) -> Result<(), ProtocolError> {
    if t.datatype != DataType::Bytes {
        return Ok(());
    }
    for (i, e) in t
        .bytes_elements()
        .unwrap_or_default()
        .into_iter()
        .enumerate()
    {
        if let Err(err) = std::str::from_utf8(e) {
            return Err(ProtocolError::Unrepresentable {
                tensor: what.to_owned(),
                message: format!(
                    "element {i} is not UTF-8 text ({err}); JSON cannot carry it (ask for \
                     binary data: the output parameter `binary_data: true`)"
                ),
            });
        }
    }
    Ok(())
}

/// One element of a float tensor, as [`JsonData`] writes it (FP16 and BF16 through f32).
#[derive(Clone, Copy)]
enum Float {
    Single(f32),
    Double(f64),
}

impl Float {
    fn wide(self) -> f64 {
        match self {
            Float::Single(x) => f64::from(x),
            Float::Double(x) => x,
        }
    }
}

/// A float tensor's elements; None for other datatypes.
fn floats(t: &Tensor) -> Option<Box<dyn Iterator<Item = Float> + '_>> {
    let d = &t.data;
    Some(match t.datatype {
        DataType::Fp16 => Box::new(
            d.chunks_exact(2)
                .map(|c| Float::Single(half::f16::from_le_bytes([c[0], c[1]]).to_f32())),
        ),
        DataType::Bf16 => Box::new(
            d.chunks_exact(2)
                .map(|c| Float::Single(half::bf16::from_le_bytes([c[0], c[1]]).to_f32())),
        ),
        DataType::Fp32 => Box::new(
            d.chunks_exact(4)
                .map(|c| Float::Single(f32::from_le_bytes([c[0], c[1], c[2], c[3]]))),
        ),
        DataType::Fp64 => Box::new(
            d.chunks_exact(8)
                .map(|c| Float::Double(f64::from_le_bytes(c.try_into().expect("8 bytes")))),
        ),
        _ => return None,
    })
}

/// A float tensor that holds NaN or an infinity as a flat JSON array with them written as
/// Triton writes them: `NaN`, `Infinity`, `-Infinity` (its TritonJson writer sets rapidjson's
/// `kWriteNanAndInfFlag`; Python's `json`, which tritonclient reads with, takes them). Finite
/// elements are written as [`JsonData`] writes them. None when every element is finite (or
/// the tensor holds no floats): serde_json writes those, and would write NaN as `null`.
pub(crate) fn json_with_non_finite(t: &Tensor) -> Option<String> {
    if floats(t)?.all(|x| x.wide().is_finite()) {
        return None;
    }
    let mut out = Vec::with_capacity(t.data.len() * 3 + 2);
    out.push(b'[');
    for (i, x) in floats(t)?.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let w = x.wide();
        let token = if w.is_nan() {
            "NaN"
        } else if w == f64::INFINITY {
            "Infinity"
        } else if w == f64::NEG_INFINITY {
            "-Infinity"
        } else {
            // serde_json's own writer for a finite float, so the text is as before.
            let mut f = serde_json::ser::CompactFormatter;
            match x {
                Float::Single(v) => f.write_f32(&mut out, v),
                Float::Double(v) => f.write_f64(&mut out, v),
            }
            .expect("a Vec takes every write");
            continue;
        };
        out.extend_from_slice(token.as_bytes());
    }
    out.push(b']');
    Some(String::from_utf8(out).expect("numbers and tokens are ASCII"))
}

impl Serialize for JsonData<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let t = self.0;
        let d = &t.data;
        let mut seq = s.serialize_seq(None)?;
        macro_rules! each {
            ($n:expr, $f:expr) => {
                for c in d.chunks_exact($n) {
                    seq.serialize_element(&$f(c.try_into().expect("chunk size")))?;
                }
            };
        }
        match t.datatype {
            DataType::Bool => each!(1, |c: [u8; 1]| c[0] != 0),
            DataType::Uint8 => each!(1, u8::from_le_bytes),
            DataType::Uint16 => each!(2, u16::from_le_bytes),
            DataType::Uint32 => each!(4, u32::from_le_bytes),
            DataType::Uint64 => each!(8, u64::from_le_bytes),
            DataType::Int8 => each!(1, i8::from_le_bytes),
            DataType::Int16 => each!(2, i16::from_le_bytes),
            DataType::Int32 => each!(4, i32::from_le_bytes),
            DataType::Int64 => each!(8, i64::from_le_bytes),
            // The shortest text that reads back as the same f32 (and so the same f16/bf16).
            DataType::Fp16 => each!(2, |c| half::f16::from_le_bytes(c).to_f32()),
            DataType::Bf16 => each!(2, |c| half::bf16::from_le_bytes(c).to_f32()),
            DataType::Fp32 => each!(4, f32::from_le_bytes),
            DataType::Fp64 => each!(8, f64::from_le_bytes),
            DataType::Bytes => {
                for e in t.bytes_elements().unwrap_or_default() {
                    let text = std::str::from_utf8(e).map_err(serde::ser::Error::custom)?;
                    seq.serialize_element(text)?;
                }
            }
        }
        seq.end()
    }
}
