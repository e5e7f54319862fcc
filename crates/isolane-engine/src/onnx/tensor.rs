//! Constant tensors of an ONNX model: initializers, `Constant` nodes and the values that constant
//! propagation computes at import (shape arithmetic above all).
//!
//! Integers of every width are kept as `i64` and booleans as `Bool`: shape subgraphs only need
//! these, and ONNX's integer ops are exact on them. Floats are `f32`, the engine's precision
//! (a `double` initializer is rounded once to f32, as the engine would compute in f32 anyway).

use super::proto::{tensor_proto, TensorProto};
use std::path::Path;

/// The element type of a constant, after the widening described in the module doc.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DType {
    F32,
    I64,
    Bool,
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DType::F32 => "float32",
            DType::I64 => "int64",
            DType::Bool => "bool",
        })
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Data {
    F32(Vec<f32>),
    I64(Vec<i64>),
    Bool(Vec<bool>),
}

impl Data {
    pub fn len(&self) -> usize {
        match self {
            Data::F32(v) => v.len(),
            Data::I64(v) => v.len(),
            Data::Bool(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn dtype(&self) -> DType {
        match self {
            Data::F32(_) => DType::F32,
            Data::I64(_) => DType::I64,
            Data::Bool(_) => DType::Bool,
        }
    }
}

/// A constant tensor, C-order.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: Data,
    /// The ONNX data type the file stored it as (`TensorProto.DataType`): `data` widens it,
    /// and QuantizeLinear needs the zero point's own type (int8 or uint8, float8) to know
    /// its output's range.
    pub onnx_type: i32,
}

impl Tensor {
    pub fn new(shape: Vec<usize>, data: Data) -> Self {
        debug_assert_eq!(shape.iter().product::<usize>(), data.len());
        use tensor_proto::DataType as T;
        let onnx_type = match data {
            Data::F32(_) => T::Float,
            Data::I64(_) => T::Int64,
            Data::Bool(_) => T::Bool,
        } as i32;
        Tensor {
            shape,
            data,
            onnx_type,
        }
    }

    pub fn f32(shape: Vec<usize>, v: Vec<f32>) -> Self {
        Self::new(shape, Data::F32(v))
    }

    pub fn i64(shape: Vec<usize>, v: Vec<i64>) -> Self {
        Self::new(shape, Data::I64(v))
    }

    pub fn scalar_i64(v: i64) -> Self {
        Self::new(vec![], Data::I64(vec![v]))
    }

    pub fn numel(&self) -> usize {
        self.data.len()
    }

    pub fn dtype(&self) -> DType {
        self.data.dtype()
    }

    /// The values as i64 (exact for I64 and Bool; F32 only if every value is integral).
    pub fn to_i64(&self) -> Option<Vec<i64>> {
        match &self.data {
            Data::I64(v) => Some(v.clone()),
            Data::Bool(v) => Some(v.iter().map(|&b| b as i64).collect()),
            Data::F32(v) => v
                .iter()
                .map(|&x| (x.fract() == 0.0 && x.abs() < 9.0e15).then_some(x as i64))
                .collect(),
        }
    }

    pub fn to_f32(&self) -> Vec<f32> {
        match &self.data {
            Data::F32(v) => v.clone(),
            Data::I64(v) => v.iter().map(|&x| x as f32).collect(),
            Data::Bool(v) => v.iter().map(|&b| b as i32 as f32).collect(),
        }
    }
}

/// Size in bytes of one element of an ONNX data type, for the types isolane reads.
fn elem_size(dt: tensor_proto::DataType) -> Option<usize> {
    use tensor_proto::DataType as T;
    Some(match dt {
        T::Float | T::Int32 | T::Uint32 => 4,
        T::Double | T::Int64 | T::Uint64 => 8,
        T::Int16 | T::Uint16 | T::Float16 | T::Bfloat16 => 2,
        T::Int8 | T::Uint8 | T::Bool | T::Float8e4m3fn => 1,
        _ => return None,
    })
}

/// An IEEE half (float16) bit pattern as f32; exact (every f16 is an f32).
pub fn f16_bits_to_f32(bits: u16) -> f32 {
    half::f16::from_bits(bits).to_f32()
}

/// A bfloat16 bit pattern as f32; exact (bf16 is the top half of an f32).
pub fn bf16_bits_to_f32(bits: u16) -> f32 {
    half::bf16::from_bits(bits).to_f32()
}

/// A float8 e4m3fn bit pattern as f32 (exact): sign, 4 exponent bits of bias 7, 3 mantissa
/// bits, exponent 0 subnormal, `S.1111.111` NaN (no infinities).
pub fn e4m3fn_bits_to_f32(b: u8) -> f32 {
    let (e, m) = (((b >> 3) & 0xF) as i32, (b & 7) as f32);
    let mag = match (e, b & 0x7F) {
        (_, 0x7F) => f32::NAN,
        (0, _) => m * (1.0 / 512.0),
        _ => (8.0 + m) * f32::from_bits(((e - 10 + 127) as u32) << 23),
    };
    if b & 0x80 != 0 {
        -mag
    } else {
        mag
    }
}

/// Decodes little-endian raw bytes of type `dt` (length already checked).
fn decode_raw(dt: tensor_proto::DataType, raw: &[u8]) -> Data {
    use tensor_proto::DataType as T;
    let u16s = || {
        raw.chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
    };
    let b8 = |c: &[u8]| -> [u8; 8] { c.try_into().unwrap_or([0; 8]) };
    match dt {
        T::Float => Data::F32(
            raw.chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        ),
        T::Double => Data::F32(
            raw.chunks_exact(8)
                .map(|c| f64::from_le_bytes(b8(c)) as f32)
                .collect(),
        ),
        T::Float16 => Data::F32(u16s().map(f16_bits_to_f32).collect()),
        T::Bfloat16 => Data::F32(u16s().map(bf16_bits_to_f32).collect()),
        T::Int64 => Data::I64(
            raw.chunks_exact(8)
                .map(|c| i64::from_le_bytes(b8(c)))
                .collect(),
        ),
        T::Uint64 => Data::I64(
            raw.chunks_exact(8)
                .map(|c| u64::from_le_bytes(b8(c)) as i64)
                .collect(),
        ),
        T::Int32 => Data::I64(
            raw.chunks_exact(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64)
                .collect(),
        ),
        T::Uint32 => Data::I64(
            raw.chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64)
                .collect(),
        ),
        T::Int16 => Data::I64(
            raw.chunks_exact(2)
                .map(|c| i16::from_le_bytes([c[0], c[1]]) as i64)
                .collect(),
        ),
        T::Uint16 => Data::I64(u16s().map(|v| v as i64).collect()),
        T::Int8 => Data::I64(raw.iter().map(|&b| b as i8 as i64).collect()),
        T::Uint8 => Data::I64(raw.iter().map(|&b| b as i64).collect()),
        T::Float8e4m3fn => Data::F32(raw.iter().map(|&b| e4m3fn_bits_to_f32(b)).collect()),
        _ => Data::Bool(raw.iter().map(|&b| b != 0).collect()), // T::Bool: elem_size allows no other
    }
}

/// Decodes the typed field that holds a tensor of type `dt` (onnx.proto, TensorProto).
fn decode_typed(dt: tensor_proto::DataType, t: &TensorProto) -> (Data, usize) {
    use tensor_proto::DataType as T;
    // int32_data holds FLOAT16 and BFLOAT16 as their bit patterns in the low 16 bits.
    let low16 = |x: &i32| (*x as u32 & 0xffff) as u16;
    match dt {
        T::Float => (Data::F32(t.float_data.clone()), t.float_data.len()),
        T::Double => (
            Data::F32(t.double_data.iter().map(|&x| x as f32).collect()),
            t.double_data.len(),
        ),
        T::Float16 => (
            Data::F32(
                t.int32_data
                    .iter()
                    .map(|x| f16_bits_to_f32(low16(x)))
                    .collect(),
            ),
            t.int32_data.len(),
        ),
        T::Bfloat16 => (
            Data::F32(
                t.int32_data
                    .iter()
                    .map(|x| bf16_bits_to_f32(low16(x)))
                    .collect(),
            ),
            t.int32_data.len(),
        ),
        T::Int64 => (Data::I64(t.int64_data.clone()), t.int64_data.len()),
        T::Uint64 | T::Uint32 => (
            Data::I64(t.uint64_data.iter().map(|&x| x as i64).collect()),
            t.uint64_data.len(),
        ),
        T::Bool => (
            Data::Bool(t.int32_data.iter().map(|&x| x != 0).collect()),
            t.int32_data.len(),
        ),
        // int32_data holds float8 as its bit pattern in the low 8 bits.
        T::Float8e4m3fn => (
            Data::F32(
                t.int32_data
                    .iter()
                    .map(|&x| e4m3fn_bits_to_f32(x as u8))
                    .collect(),
            ),
            t.int32_data.len(),
        ),
        // int32_data holds INT32, INT16, INT8, UINT16, UINT8 (one value per int32).
        _ => (
            Data::I64(t.int32_data.iter().map(|&x| x as i64).collect()),
            t.int32_data.len(),
        ),
    }
}

/// Decodes a `TensorProto` (typed fields or little-endian `raw_data`) into a [`Tensor`].
/// float16 and bfloat16 values are widened to f32 exactly (see docs/onnx.md on precision).
///
/// `external` supplies the bytes of a tensor whose `data_location` is EXTERNAL; it is given the
/// tensor and returns its raw bytes (see [`read_external`]).
pub fn from_proto(
    t: &TensorProto,
    external: &mut dyn FnMut(&TensorProto) -> Result<Vec<u8>, ExternalError>,
) -> Result<Tensor, TensorError> {
    use tensor_proto::DataType as T;
    if t.segment.is_some() {
        return Err("segmented tensors are not supported".into());
    }
    let mut shape = Vec::with_capacity(t.dims.len());
    let mut numel: usize = 1;
    for &d in &t.dims {
        let d =
            usize::try_from(d).map_err(|_| format!("negative dimension {d} in {:?}", t.dims))?;
        numel = numel
            .checked_mul(d)
            .ok_or_else(|| format!("dimensions {:?} overflow", t.dims))?;
        shape.push(d);
    }
    let dt =
        T::try_from(t.data_type()).map_err(|_| format!("unknown data type {}", t.data_type()))?;
    let size = elem_size(dt).ok_or_else(|| {
        format!(
            "data type {} is not supported (isolane reads float32/64, float16, bfloat16, float8e4m3fn and integer/bool tensors)",
            dt.as_str_name()
        )
    })?;

    let is_external = t.data_location() == tensor_proto::DataLocation::External;
    let raw_owned;
    let raw: Option<&[u8]> = if is_external {
        raw_owned = external(t).map_err(TensorError::External)?;
        Some(&raw_owned)
    } else {
        t.raw_data.as_deref()
    };

    if let Some(raw) = raw {
        let want = numel
            .checked_mul(size)
            .ok_or_else(|| format!("dimensions {:?} overflow", t.dims))?;
        if raw.len() != want {
            return Err(format!(
                "raw data holds {} bytes, but shape {:?} of {} needs {want}",
                raw.len(),
                t.dims,
                dt.as_str_name()
            )
            .into());
        }
        // ONNX stores raw data little-endian whatever the host; decode explicitly.
        return Ok(Tensor {
            shape,
            data: decode_raw(dt, raw),
            onnx_type: dt as i32,
        });
    }

    let (data, have) = decode_typed(dt, t);
    if have != numel {
        return Err(format!("holds {have} values, but shape {:?} needs {numel}", t.dims).into());
    }
    Ok(Tensor {
        shape,
        data,
        onnx_type: dt as i32,
    })
}

/// Why a tensor could not be decoded: its own fields, or its external data file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TensorError {
    Bad(String),
    External(ExternalError),
}

impl From<String> for TensorError {
    fn from(what: String) -> Self {
        TensorError::Bad(what)
    }
}

impl From<&str> for TensorError {
    fn from(what: &str) -> Self {
        TensorError::Bad(what.to_string())
    }
}

/// An external data reference that was refused or could not be read: the `location` as the
/// file wrote it and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExternalError {
    pub location: String,
    pub what: String,
}

/// The file an external data `location` names, confined to the model's folder `dir` as the
/// ONNX spec and `onnx.checker` require: a relative path, no `..` component, and (after
/// resolving symbolic links) still inside `dir`. Anything else would let a model file read
/// arbitrary files of the machine it is loaded on.
pub fn confined_location(dir: &Path, location: &str) -> Result<std::path::PathBuf, String> {
    use std::path::Component;
    if location.is_empty() {
        return Err("is empty".into());
    }
    // Both separators are checked whatever the host: a file written on Windows may use `\`.
    let parts: Vec<&str> = location.split(['/', '\\']).collect();
    let windows_drive = location.len() >= 2 && location.as_bytes()[1] == b':';
    let rel = Path::new(location);
    if rel.has_root() || location.starts_with(['/', '\\']) || windows_drive {
        return Err(format!(
            "is an absolute path; ONNX external data must be a path relative to the model's folder {}",
            dir.display()
        ));
    }
    if parts.contains(&"..") || rel.components().any(|c| c == Component::ParentDir) {
        return Err(format!(
            "contains `..`; ONNX external data must stay inside the model's folder {}",
            dir.display()
        ));
    }
    let file = dir.join(rel);
    let real_dir = dir
        .canonicalize()
        .map_err(|e| format!("the model's folder {}: {e}", dir.display()))?;
    let real_file = file
        .canonicalize()
        .map_err(|e| format!("cannot open {}: {e}", file.display()))?;
    if !real_file.starts_with(&real_dir) {
        return Err(format!(
            "resolves (through a symbolic link) to {}, outside the model's folder {}",
            real_file.display(),
            real_dir.display()
        ));
    }
    if !real_file.is_file() {
        return Err(format!("{} is not a regular file", file.display()));
    }
    Ok(real_file)
}

/// Reads the bytes of an externally stored tensor (`data_location = EXTERNAL`): the `location`
/// key names a file inside the model's folder (see [`confined_location`]); `offset` and
/// `length` select a range.
pub fn read_external(model_path: &Path, t: &TensorProto) -> Result<Vec<u8>, ExternalError> {
    use std::io::{Read, Seek, SeekFrom};
    let mut location = None;
    let mut offset: Option<String> = None;
    let mut length: Option<String> = None;
    for kv in &t.external_data {
        match kv.key() {
            "location" => location = Some(kv.value().to_string()),
            "offset" => offset = Some(kv.value().to_string()),
            "length" => length = Some(kv.value().to_string()),
            _ => {} // "checksum" and future keys do not change the bytes read
        }
    }
    let location = location.ok_or_else(|| ExternalError {
        location: String::new(),
        what: "the tensor is marked EXTERNAL but has no `location` key".into(),
    })?;
    let err = |what: String| ExternalError {
        location: location.clone(),
        what,
    };
    let parse = |key: &str, v: Option<String>| -> Result<Option<u64>, ExternalError> {
        v.map(|v| {
            v.parse::<u64>()
                .map_err(|_| err(format!("{key} {v:?} is not a non-negative integer")))
        })
        .transpose()
    };
    let offset = parse("offset", offset)?.unwrap_or(0);
    let length = parse("length", length)?;
    let dir = match model_path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let file = confined_location(dir, &location).map_err(err)?;
    let mut f = std::fs::File::open(&file).map_err(|e| err(format!("cannot open: {e}")))?;
    let file_len = f.metadata().map_err(|e| err(e.to_string()))?.len();
    let length = length.unwrap_or(file_len.saturating_sub(offset));
    if offset.checked_add(length).is_none_or(|end| end > file_len) {
        return Err(err(format!(
            "range {offset}+{length} is past the end of the file ({file_len} bytes)"
        )));
    }
    f.seek(SeekFrom::Start(offset))
        .map_err(|e| err(e.to_string()))?;
    let mut buf = vec![0u8; length as usize];
    f.read_exact(&mut buf).map_err(|e| err(e.to_string()))?;
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every float8 e4m3fn bit pattern decodes, from raw bytes and from int32_data alike, to a
    /// value of its grid (0x7F and 0xFF to NaN), and 0x7E is 448.
    #[test]
    fn float8_e4m3fn_initializers_decode_every_pattern() {
        let bytes: Vec<u8> = (0..=255).collect();
        let raw = TensorProto {
            dims: vec![256],
            data_type: Some(tensor_proto::DataType::Float8e4m3fn as i32),
            raw_data: Some(bytes.clone()),
            ..Default::default()
        };
        let typed = TensorProto {
            raw_data: None,
            int32_data: bytes.iter().map(|&b| b as i32).collect(),
            ..raw.clone()
        };
        let mut no_external = |_: &TensorProto| -> Result<Vec<u8>, ExternalError> {
            unreachable!("no external data")
        };
        for t in [raw, typed] {
            let d = from_proto(&t, &mut no_external).unwrap();
            assert_eq!(d.onnx_type, tensor_proto::DataType::Float8e4m3fn as i32);
            let Data::F32(v) = d.data else {
                panic!("not f32")
            };
            for (b, x) in bytes.iter().zip(&v) {
                if b & 0x7F == 0x7F {
                    assert!(x.is_nan(), "{b:#x}");
                } else {
                    assert_eq!(crate::quant::round_e4m3fn(*x, false), *x, "{b:#x}");
                    assert_eq!(x.is_sign_negative(), b & 0x80 != 0, "{b:#x}");
                }
            }
            assert_eq!(
                (v[0x7E], v[0xFE], v[0x01], v[0x08]),
                (448.0, -448.0, 1.0 / 512.0, 1.0 / 64.0)
            );
        }
    }
}
