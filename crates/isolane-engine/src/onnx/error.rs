//! Errors of ONNX loading and import. Every message names the file; errors about a node also name
//! the op, the node and the opset, so a user can find the culprit in Netron or `onnx.helper`.

use super::tensor::{ExternalError, TensorError};
use std::path::PathBuf;

/// Where in the model an error happened: the op type, the node's name and the opset in force.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRef {
    pub op: String,
    /// The node's `name` field, or `#<index>` when the exporter left it empty.
    pub node: String,
    pub opset: i64,
}

impl std::fmt::Display for NodeRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "op {} (node {:?}, opset {})",
            self.op, self.node, self.opset
        )
    }
}

/// Node errors keep their [`NodeRef`] boxed so that `Result<_, OnnxError>` stays small on the
/// import's many fallible helpers.
#[derive(Debug, thiserror::Error)]
pub enum OnnxError {
    #[error("cannot read ONNX file {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a valid ONNX model, the file may be truncated or corrupt (protobuf decode: {source})")]
    Decode {
        path: PathBuf,
        #[source]
        source: prost::DecodeError,
    },
    #[error("{path}: the model imports opset {opset} of the default ONNX domain; isolane supports opsets {min} to {max} (re-export with e.g. `torch.onnx.export(..., opset_version=17)`)")]
    Opset {
        path: PathBuf,
        opset: i64,
        min: i64,
        max: i64,
    },
    #[error("{path}: {what}")]
    Invalid { path: PathBuf, what: String },
    #[error("{path}: unsupported {node}{}", domain_note(.domain))]
    UnsupportedOp {
        path: PathBuf,
        node: Box<NodeRef>,
        domain: String,
    },
    #[error("{path}: {node}: unsupported attribute {attr}: {why}")]
    UnsupportedAttribute {
        path: PathBuf,
        node: Box<NodeRef>,
        attr: String,
        why: String,
    },
    #[error("{path}: {node}: {what}")]
    BadNode {
        path: PathBuf,
        node: Box<NodeRef>,
        what: String,
    },
    #[error("{path}: tensor {tensor:?}: {what}")]
    BadTensor {
        path: PathBuf,
        tensor: String,
        what: String,
    },
    #[error("{path}: tensor {tensor:?} keeps its data in external file \"{location}\": {what}")]
    ExternalData {
        path: PathBuf,
        tensor: String,
        /// The `location` as the model file writes it.
        location: String,
        what: String,
    },
}

impl OnnxError {
    /// The error for tensor `tensor` of the model at `path` that could not be decoded.
    pub fn from_tensor_error(path: &std::path::Path, tensor: &str, e: TensorError) -> Self {
        match e {
            TensorError::Bad(what) => OnnxError::BadTensor {
                path: path.to_path_buf(),
                tensor: tensor.to_string(),
                what,
            },
            TensorError::External(ExternalError { location, what }) => OnnxError::ExternalData {
                path: path.to_path_buf(),
                tensor: tensor.to_string(),
                location,
                what,
            },
        }
    }
}

fn domain_note(domain: &str) -> String {
    if domain.is_empty() || domain == "ai.onnx" {
        String::new()
    } else {
        format!(" of domain {domain:?}")
    }
}

pub type Result<T, E = OnnxError> = std::result::Result<T, E>;
