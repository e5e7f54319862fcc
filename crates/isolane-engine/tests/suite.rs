//! Every integration test of this crate in one binary: one link instead of one per file
//! (the test build's largest cost). Each file stays a module of its own name; a file
//! that must own its process (a global allocator, its own harness, environment
//! variables it sets) is a binary of its own (Cargo.toml, `autotests = false`).

// Each file keeps its own `mod common;`, as it had as a binary of its own, so that it still
// builds alone; the helpers are small and compiled once per module that uses them.
#![allow(clippy::duplicate_mod)]

#[path = "models.rs"]
mod models;
#[path = "onnx_batch_uniform.rs"]
mod onnx_batch_uniform;
#[path = "onnx_fixtures.rs"]
mod onnx_fixtures;
#[path = "onnx_input_dims.rs"]
mod onnx_input_dims;
#[path = "onnx_inputs.rs"]
mod onnx_inputs;
#[path = "onnx_messages.rs"]
mod onnx_messages;
#[path = "onnx_tensors.rs"]
mod onnx_tensors;
#[path = "ops.rs"]
mod ops;
#[path = "weights.rs"]
mod weights;
