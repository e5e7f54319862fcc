//! The HTTP/JSON messages, as serde types. The inference request and response are the JSON
//! header only; [`crate::decode_request`] and friends check them and read their tensors.

use crate::{DataType, Parameters, ProtocolError};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::value::RawValue;

/// The most dimensions a shape may have. Real models have a handful; the cap keeps a shape of
/// a million `1`s from costing memory before it is checked.
pub const MAX_DIMS: usize = 64;
/// The most inputs (or outputs) one message may name. With [`crate::MAX_PARAMETERS`] it bounds
/// the memory that reading a header takes beyond its own size.
pub const MAX_TENSORS: usize = 4096;

/// `GET /v2`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerMetadata {
    pub name: String,
    pub version: String,
    #[serde(default)]
    pub extensions: Vec<String>,
}

/// One input or output of a model's metadata; `-1` marks a variable dimension.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorMetadata {
    pub name: String,
    pub datatype: DataType,
    pub shape: Vec<i64>,
}

/// `GET /v2/models/{name}[/versions/{version}]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelMetadata {
    pub name: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub versions: Vec<String>,
    pub platform: String,
    pub inputs: Vec<TensorMetadata>,
    pub outputs: Vec<TensorMetadata>,
}

/// One input or output of a model configuration (`TYPE_FP32`; dims without the batch
/// dimension when `max_batch_size` > 0, `-1` for a variable one).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigTensor {
    pub name: String,
    #[serde(with = "crate::datatype::config_name")]
    pub data_type: DataType,
    pub dims: Vec<i64>,
}

/// `GET /v2/models/{name}/config`: the subset of Triton's model configuration that clients
/// such as perf_analyzer read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelConfig {
    pub name: String,
    #[serde(default)]
    pub platform: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub backend: String,
    #[serde(default)]
    pub max_batch_size: u32,
    #[serde(default)]
    pub input: Vec<ConfigTensor>,
    #[serde(default)]
    pub output: Vec<ConfigTensor>,
    /// Present when the model batches requests dynamically (Triton's `dynamic_batching`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dynamic_batching: Option<DynamicBatching>,
}

/// Triton's `dynamic_batching` of a model configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DynamicBatching {
    #[serde(default)]
    pub preferred_batch_size: Vec<u32>,
    #[serde(default)]
    pub max_queue_delay_microseconds: u64,
}

/// The live answer (gRPC `ServerLiveResponse`; over HTTP the status says it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveResponse {
    pub live: bool,
}

/// The ready answer (gRPC `ServerReadyResponse` / `ModelReadyResponse`; over HTTP the status
/// says it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadyResponse {
    pub ready: bool,
}

/// The HTTP status of a health answer: 200 for true, 400 for false (the protocol: "a 4xx
/// status code indicates false"; the body is empty).
pub fn health_status(ok: bool) -> u16 {
    if ok {
        200
    } else {
        400
    }
}

/// `POST /v2/repository/index`'s body (optional: an empty body is the default).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepositoryIndexRequest {
    /// Only the models ready for inference.
    #[serde(default)]
    pub ready: bool,
}

impl RepositoryIndexRequest {
    /// Reads the body; an empty (or all-whitespace) body is `{}`.
    pub fn decode(body: &[u8]) -> Result<Self, ProtocolError> {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(RepositoryIndexRequest::default());
        }
        serde_json::from_slice(body)
            .map_err(|e| crate::error::json_error("the repository index request", &e))
    }
}

/// A model's state in the repository index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum ModelState {
    Unknown,
    Ready,
    Unavailable,
    Loading,
    Unloading,
}

impl ModelState {
    /// The state's name in the protocol (`READY`, ...), as serde writes it.
    pub fn name(self) -> &'static str {
        match self {
            ModelState::Unknown => "UNKNOWN",
            ModelState::Ready => "READY",
            ModelState::Unavailable => "UNAVAILABLE",
            ModelState::Loading => "LOADING",
            ModelState::Unloading => "UNLOADING",
        }
    }
}

/// One model of `POST /v2/repository/index`'s answer (a JSON array of these).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepositoryIndexEntry {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    pub state: ModelState,
    #[serde(default)]
    pub reason: String,
}

/// An HTTP error body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: String,
}

/// An input of a request or an output of a response, as its JSON header has it. `data` stays
/// JSON text until the datatype and shape are checked.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct InferTensor {
    pub name: String,
    #[serde(deserialize_with = "bounded_shape")]
    pub shape: Vec<i64>,
    /// Kept as text so that an unknown datatype is refused naming its tensor.
    pub datatype: String,
    #[serde(default, skip_serializing_if = "Parameters::is_empty")]
    pub parameters: Parameters,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Box<RawValue>>,
}

/// An output a request asks for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestedOutput {
    pub name: String,
    #[serde(default, skip_serializing_if = "Parameters::is_empty")]
    pub parameters: Parameters,
}

/// `POST /v2/models/{name}[/versions/{version}]/infer`'s JSON header. Unknown fields are
/// ignored, as Triton does (its own examples send `model_name`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct InferRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(default, skip_serializing_if = "Parameters::is_empty")]
    pub parameters: Parameters,
    #[serde(deserialize_with = "bounded_list")]
    pub inputs: Vec<InferTensor>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "bounded_optional_list"
    )]
    pub outputs: Option<Vec<RequestedOutput>>,
}

/// An inference response's JSON header.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct InferResponse {
    pub model_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(default, skip_serializing_if = "Parameters::is_empty")]
    pub parameters: Parameters,
    #[serde(deserialize_with = "bounded_list")]
    pub outputs: Vec<InferTensor>,
}

fn bounded_shape<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<i64>, D::Error> {
    struct V;
    impl<'de> serde::de::Visitor<'de> for V {
        type Value = Vec<i64>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            write!(f, "a shape: an array of at most {MAX_DIMS} integers")
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<i64>, A::Error> {
            let mut dims = Vec::new();
            while let Some(d) = seq.next_element::<i64>()? {
                if dims.len() == MAX_DIMS {
                    return Err(serde::de::Error::custom(format!(
                        "a shape has at most {MAX_DIMS} dimensions"
                    )));
                }
                dims.push(d);
            }
            Ok(dims)
        }
    }
    d.deserialize_seq(V)
}

/// A list of at most [`MAX_TENSORS`] entries, refused as soon as it has more.
fn bounded_list<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Vec<T>, D::Error> {
    struct V<T>(std::marker::PhantomData<T>);
    impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for V<T> {
        type Value = Vec<T>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            write!(f, "an array of at most {MAX_TENSORS} tensors")
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
            let mut out = Vec::new();
            while let Some(t) = seq.next_element::<T>()? {
                if out.len() == MAX_TENSORS {
                    return Err(serde::de::Error::custom(format!(
                        "a message names at most {MAX_TENSORS} tensors"
                    )));
                }
                out.push(t);
            }
            Ok(out)
        }
    }
    d.deserialize_seq(V(std::marker::PhantomData))
}

fn bounded_optional_list<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<Vec<T>>, D::Error> {
    #[derive(Deserialize)]
    #[serde(bound = "T: Deserialize<'de>")]
    struct List<T>(#[serde(deserialize_with = "bounded_list")] Vec<T>);
    Ok(Option::<List<T>>::deserialize(d)?.map(|l| l.0))
}
