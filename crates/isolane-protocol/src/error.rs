//! One error type for every refusal, each with the HTTP status and the gRPC code it is answered
//! with, and the `{"error": "..."}` body.

use crate::messages::ErrorBody;
use thiserror::Error;

/// The gRPC status codes the protocol's refusals map onto (google.rpc.Code); plain values here,
/// so that this crate needs no gRPC library.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GrpcCode {
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Internal,
    Unavailable,
    AlreadyExists,
}

impl GrpcCode {
    /// The code's name as gRPC spells it (`INVALID_ARGUMENT`, ...).
    pub fn name(self) -> &'static str {
        match self {
            GrpcCode::InvalidArgument => "INVALID_ARGUMENT",
            GrpcCode::NotFound => "NOT_FOUND",
            GrpcCode::ResourceExhausted => "RESOURCE_EXHAUSTED",
            GrpcCode::Internal => "INTERNAL",
            GrpcCode::Unavailable => "UNAVAILABLE",
            GrpcCode::AlreadyExists => "ALREADY_EXISTS",
        }
    }

    /// The code's number on the wire (google.rpc.Code).
    pub fn value(self) -> i32 {
        match self {
            GrpcCode::InvalidArgument => 3,
            GrpcCode::NotFound => 5,
            GrpcCode::ResourceExhausted => 8,
            GrpcCode::Internal => 13,
            GrpcCode::Unavailable => 14,
            GrpcCode::AlreadyExists => 6,
        }
    }
}

/// Why a message was refused (or, for [`ProtocolError::Unrepresentable`], could not be
/// answered in the form asked for). The message names the input or output, the field and what
/// is allowed, so that it can go back to the client as it is.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum ProtocolError {
    /// The JSON text itself: not UTF-8, a syntax error, a field of the wrong type or missing.
    #[error("{what} is not a valid inference protocol message: {message}")]
    Json { what: &'static str, message: String },
    /// The `Inference-Header-Content-Length` header: not a number, or past the body's end.
    #[error("Inference-Header-Content-Length: {message}")]
    HeaderLength { message: String },
    /// One field of one input or output tensor (`tensor` is e.g. "input `INPUT0`").
    #[error("{tensor}: `{field}`: {message}")]
    Tensor {
        tensor: String,
        field: &'static str,
        message: String,
    },
    /// One parameter (`scope` is "the request", "input `x`", "output `y`" or "the response").
    #[error("{scope}: parameter `{name}`: {message}")]
    Parameter {
        scope: String,
        name: String,
        message: String,
    },
    /// An input or output named twice.
    #[error("{kind} `{name}` is given more than once; each {kind} is named once")]
    Duplicate { kind: &'static str, name: String },
    /// A body, or the tensor data of one message, past its limit.
    #[error("{what} is {size} bytes, more than the limit of {limit} bytes")]
    TooLarge {
        what: String,
        size: u128,
        limit: u64,
    },
    /// A body past its limit whose whole size is not known: a chunked body, or a compressed
    /// one that is not decompressed past the limit (a small body may hold gigabytes).
    #[error("{what} is more than the limit of {limit} bytes")]
    OverLimit { what: String, limit: u64 },
    /// Bytes after the last binary tensor.
    #[error(
        "the body has {count} bytes after the JSON header and the binary tensors; each binary \
         tensor's `parameters.binary_data_size` must account for every byte"
    )]
    LeftoverBytes { count: u64 },
    /// A protocol extension isolane does not implement (shared memory, classification, raw
    /// binary requests).
    #[error("{feature} is not supported: {message}")]
    Unsupported {
        feature: &'static str,
        message: String,
    },
    /// A model (and version) the server does not serve.
    #[error(
        "unknown model `{model}`{}",
        .version.as_deref().map(|v| format!(" version `{v}`")).unwrap_or_default()
    )]
    UnknownModel {
        model: String,
        version: Option<String>,
    },
    /// Something a request names that the server does not hold (a shared memory region not
    /// registered), as Triton's NOT_FOUND.
    #[error("{what}")]
    NotFound { what: String },
    /// Something a request would add that the server holds already (a shared memory region's
    /// name registered twice), as Triton's ALREADY_EXISTS: HTTP 400 (its http_server.cc has
    /// no closer status for it) and gRPC ALREADY_EXISTS.
    #[error("{what}")]
    AlreadyExists { what: String },
    /// A request refused before it ran: its deadline cannot be met, or the queue is full.
    #[error("refused: {reason}")]
    Refused { reason: String },
    /// The server or the model is not ready for inference.
    #[error("not ready: {reason}")]
    NotReady { reason: String },
    /// An output that JSON cannot carry (BYTES that are not UTF-8), or that a
    /// server built inconsistently.
    #[error("{tensor} cannot be encoded: {message}")]
    Unrepresentable { tensor: String, message: String },
}

impl ProtocolError {
    /// The HTTP status the error is answered with.
    pub fn http_status(&self) -> u16 {
        match self {
            ProtocolError::Json { .. }
            | ProtocolError::HeaderLength { .. }
            | ProtocolError::Tensor { .. }
            | ProtocolError::Parameter { .. }
            | ProtocolError::Duplicate { .. }
            | ProtocolError::LeftoverBytes { .. }
            | ProtocolError::Unsupported { .. }
            | ProtocolError::AlreadyExists { .. } => 400,
            ProtocolError::UnknownModel { .. } | ProtocolError::NotFound { .. } => 404,
            ProtocolError::TooLarge { .. } | ProtocolError::OverLimit { .. } => 413,
            ProtocolError::Refused { .. } => 429,
            ProtocolError::Unrepresentable { .. } => 500,
            ProtocolError::NotReady { .. } => 503,
        }
    }

    /// The gRPC code the error is answered with.
    pub fn grpc_code(&self) -> GrpcCode {
        if let ProtocolError::AlreadyExists { .. } = self {
            return GrpcCode::AlreadyExists;
        }
        match self.http_status() {
            404 => GrpcCode::NotFound,
            413 | 429 => GrpcCode::ResourceExhausted,
            500 => GrpcCode::Internal,
            503 => GrpcCode::Unavailable,
            _ => GrpcCode::InvalidArgument,
        }
    }

    /// The HTTP error body, `{"error": "<this error's message>"}`.
    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            error: self.to_string(),
        }
    }
}

pub(crate) fn json_error(what: &'static str, e: &serde_json::Error) -> ProtocolError {
    ProtocolError::Json {
        what,
        message: e.to_string(),
    }
}
