//! The protocol's tensor datatypes (KServe v2 "Tensor Data Types").

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

/// A tensor element type. Every type but BYTES has a fixed little-endian size; a BYTES element
/// is a 4-byte little-endian length followed by that many bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataType {
    Bool,
    Uint8,
    Uint16,
    Uint32,
    Uint64,
    Int8,
    Int16,
    Int32,
    Int64,
    Fp16,
    Fp32,
    Fp64,
    Bf16,
    Bytes,
}

impl DataType {
    /// Every datatype, in the specification's order.
    pub const ALL: [DataType; 14] = [
        DataType::Bool,
        DataType::Uint8,
        DataType::Uint16,
        DataType::Uint32,
        DataType::Uint64,
        DataType::Int8,
        DataType::Int16,
        DataType::Int32,
        DataType::Int64,
        DataType::Fp16,
        DataType::Fp32,
        DataType::Fp64,
        DataType::Bf16,
        DataType::Bytes,
    ];

    /// The protocol's name (`FP32`); names are case-sensitive.
    pub fn name(self) -> &'static str {
        match self {
            DataType::Bool => "BOOL",
            DataType::Uint8 => "UINT8",
            DataType::Uint16 => "UINT16",
            DataType::Uint32 => "UINT32",
            DataType::Uint64 => "UINT64",
            DataType::Int8 => "INT8",
            DataType::Int16 => "INT16",
            DataType::Int32 => "INT32",
            DataType::Int64 => "INT64",
            DataType::Fp16 => "FP16",
            DataType::Fp32 => "FP32",
            DataType::Fp64 => "FP64",
            DataType::Bf16 => "BF16",
            DataType::Bytes => "BYTES",
        }
    }

    /// The name from [`DataType::name`], or `None`.
    pub fn parse(name: &str) -> Option<DataType> {
        DataType::ALL.into_iter().find(|d| d.name() == name)
    }

    /// The names, comma-separated, for error messages.
    pub fn allowed() -> String {
        DataType::ALL.map(DataType::name).join(", ")
    }

    /// Bytes per element; `None` for BYTES, whose elements vary.
    pub fn element_size(self) -> Option<usize> {
        Some(match self {
            DataType::Bool | DataType::Uint8 | DataType::Int8 => 1,
            DataType::Uint16 | DataType::Int16 | DataType::Fp16 | DataType::Bf16 => 2,
            DataType::Uint32 | DataType::Int32 | DataType::Fp32 => 4,
            DataType::Uint64 | DataType::Int64 | DataType::Fp64 => 8,
            DataType::Bytes => return None,
        })
    }

    /// The fewest bytes an element takes in binary form: its size, or the 4-byte length of a
    /// BYTES element. What the per-request limit is checked against before any data is read.
    pub fn min_element_bytes(self) -> u64 {
        self.element_size().unwrap_or(4) as u64
    }

    /// The name in a Triton model configuration (`TYPE_FP32`; BYTES is `TYPE_STRING`).
    pub fn config_name(self) -> &'static str {
        match self {
            DataType::Bool => "TYPE_BOOL",
            DataType::Uint8 => "TYPE_UINT8",
            DataType::Uint16 => "TYPE_UINT16",
            DataType::Uint32 => "TYPE_UINT32",
            DataType::Uint64 => "TYPE_UINT64",
            DataType::Int8 => "TYPE_INT8",
            DataType::Int16 => "TYPE_INT16",
            DataType::Int32 => "TYPE_INT32",
            DataType::Int64 => "TYPE_INT64",
            DataType::Fp16 => "TYPE_FP16",
            DataType::Fp32 => "TYPE_FP32",
            DataType::Fp64 => "TYPE_FP64",
            DataType::Bf16 => "TYPE_BF16",
            DataType::Bytes => "TYPE_STRING",
        }
    }

    /// The name from [`DataType::config_name`], or `None`.
    pub fn parse_config_name(name: &str) -> Option<DataType> {
        DataType::ALL.into_iter().find(|d| d.config_name() == name)
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Serialize for DataType {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for DataType {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = std::borrow::Cow::<'de, str>::deserialize(d)?;
        DataType::parse(&name).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "unknown datatype `{name}`; the datatypes are {}",
                DataType::allowed()
            ))
        })
    }
}

/// (De)serializes a [`DataType`] by its model-configuration name (`TYPE_FP32`).
pub(crate) mod config_name {
    use super::DataType;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &DataType, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(d.config_name())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<DataType, D::Error> {
        let name = std::borrow::Cow::<'de, str>::deserialize(d)?;
        DataType::parse_config_name(&name).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "unknown data_type `{name}`; the data types are {}",
                DataType::ALL.map(DataType::config_name).join(", ")
            ))
        })
    }
}
