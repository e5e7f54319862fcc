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
}

impl Tensor {
    pub fn new(shape: Vec<usize>, data: Data) -> Self {
        debug_assert_eq!(shape.iter().product::<usize>(), data.len());
        Tensor { shape, data }
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
        T::Int16 | T::Uint16 => 2,
        T::Int8 | T::Uint8 | T::Bool => 1,
        _ => return None,
    })
}

/// Decodes a `TensorProto` (typed fields or little-endian `raw_data`) into a [`Tensor`].
///
/// `external` supplies the bytes of a tensor whose `data_location` is EXTERNAL; it is given the
/// tensor and returns its raw bytes (see `model::read_external`).
pub fn from_proto(
    t: &TensorProto,
    external: &mut dyn FnMut(&TensorProto) -> Result<Vec<u8>, String>,
) -> Result<Tensor, String> {
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
            "data type {} is not supported (isolane reads float32/64 and integer/bool tensors)",
            dt.as_str_name()
        )
    })?;

    let is_external = t.data_location() == tensor_proto::DataLocation::External;
    let raw_owned;
    let raw: Option<&[u8]> = if is_external {
        raw_owned = external(t)?;
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
            ));
        }
        // ONNX stores raw data little-endian whatever the host; decode explicitly.
        let data = match dt {
            T::Float => Data::F32(
                raw.chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
            ),
            T::Double => Data::F32(
                raw.chunks_exact(8)
                    .map(|c| f64::from_le_bytes(c.try_into().unwrap_or([0; 8])) as f32)
                    .collect(),
            ),
            T::Int64 => Data::I64(
                raw.chunks_exact(8)
                    .map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                    .collect(),
            ),
            T::Uint64 => Data::I64(
                raw.chunks_exact(8)
                    .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])) as i64)
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
            T::Uint16 => Data::I64(
                raw.chunks_exact(2)
                    .map(|c| u16::from_le_bytes([c[0], c[1]]) as i64)
                    .collect(),
            ),
            T::Int8 => Data::I64(raw.iter().map(|&b| b as i8 as i64).collect()),
            T::Uint8 => Data::I64(raw.iter().map(|&b| b as i64).collect()),
            T::Bool => Data::Bool(raw.iter().map(|&b| b != 0).collect()),
            _ => unreachable!("elem_size accepted only the types above"),
        };
        return Ok(Tensor { shape, data });
    }

    // Typed fields: which one holds the data depends on the type (onnx.proto, TensorProto).
    let (data, have) = match dt {
        T::Float => (Data::F32(t.float_data.clone()), t.float_data.len()),
        T::Double => (
            Data::F32(t.double_data.iter().map(|&x| x as f32).collect()),
            t.double_data.len(),
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
        // int32_data holds INT32, INT16, INT8, UINT16, UINT8 (one value per int32).
        _ => (
            Data::I64(t.int32_data.iter().map(|&x| x as i64).collect()),
            t.int32_data.len(),
        ),
    };
    if have != numel {
        return Err(format!(
            "holds {have} values, but shape {:?} needs {numel}",
            t.dims
        ));
    }
    Ok(Tensor { shape, data })
}

/// Reads the bytes of an externally stored tensor (`data_location = EXTERNAL`): the `location`
/// key names a file relative to the model's directory; `offset` and `length` select a range.
pub fn read_external(model_path: &Path, t: &TensorProto) -> Result<Vec<u8>, (String, String)> {
    use std::io::{Read, Seek, SeekFrom};
    let mut location = None;
    let mut offset: u64 = 0;
    let mut length: Option<u64> = None;
    for kv in &t.external_data {
        let parse = |v: &str| {
            v.parse::<u64>()
                .map_err(|_| (kv.key().to_string(), format!("bad {} {v:?}", kv.key())))
        };
        match kv.key() {
            "location" => location = Some(kv.value().to_string()),
            "offset" => offset = parse(kv.value())?,
            "length" => length = Some(parse(kv.value())?),
            _ => {} // "checksum" and future keys do not change the bytes read
        }
    }
    let location = location.ok_or_else(|| (String::new(), "no `location` key".to_string()))?;
    let dir = model_path.parent().unwrap_or_else(|| Path::new("."));
    let file = dir.join(&location);
    let err = |what: String| (file.display().to_string(), what);
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
