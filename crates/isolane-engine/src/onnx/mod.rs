//! ONNX import: an ONNX file (opsets 7–21) → the engine's graph IR.
//!
//! `proto` is generated from the vendored `onnx.proto` by `tools/regen-onnx-proto.sh` and committed,
//! so building needs no protoc. `model` decodes and checks a file; `import` turns the graph into IR,
//! folding shape subgraphs (Shape → Gather → Concat → Reshape chains) by constant propagation for
//! the static input shape chosen at compile time.

mod error;
pub(crate) mod fold;
pub(crate) mod import;
mod model;
pub mod tensor;

/// Rust types of the ONNX protobuf schema (generated; do not edit).
#[allow(clippy::all, clippy::pedantic, missing_docs, rustdoc::all)]
#[path = "onnx.rs"]
pub mod proto;

pub use error::{NodeRef, OnnxError, Result};
pub use import::{import, import_file, import_file_sized};
pub use model::{Dim, Input, OnnxModel, MAX_OPSET, MIN_OPSET};
