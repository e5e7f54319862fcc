//! The engine's error type.

use thiserror::Error;

/// Everything that can go wrong while building, loading, compiling or running a model.
#[derive(Debug, Error)]
pub enum EngineError {
    /// The graph is malformed: wrong input count, an unknown value, a cycle, a bad attribute.
    #[error("invalid graph: node `{node}`: {msg}")]
    InvalidGraph { node: String, msg: String },
    /// Shapes of a node's inputs do not fit the op.
    #[error("shape error: node `{node}` ({op}): {msg}")]
    Shape {
        node: String,
        op: String,
        msg: String,
    },
    /// The backend cannot run something (op, precision, batch...).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// Unknown built-in model name.
    #[error("unknown model `{name}`; built-in models: {known}")]
    UnknownModel { name: String, known: String },
    /// A weights file problem (I/O, format, a tensor with a wrong name/shape/dtype).
    #[error("weights file `{file}`: {msg}")]
    Weights { file: String, msg: String },
    /// Anything the caller passed that does not fit (buffer sizes, batch 0...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A failure while running a compiled model.
    #[error("runtime error: {0}")]
    Runtime(String),
}

impl EngineError {
    pub(crate) fn graph(node: impl Into<String>, msg: impl Into<String>) -> Self {
        EngineError::InvalidGraph {
            node: node.into(),
            msg: msg.into(),
        }
    }
}

/// Result alias used throughout the engine.
pub type Result<T, E = EngineError> = std::result::Result<T, E>;
