//! isolane-engine: graph IR, built-in architectures, loaders (safetensors, ONNX) and backends.

pub mod arch;
pub mod arena;
pub mod backend;
pub mod calibrate;
pub mod cpu;
pub mod decompose;
pub mod error;
pub mod footprint;
pub mod io;
pub mod ir;
mod kernels;
pub mod onnx;
mod ops;
pub mod passes;
pub mod preprocess;
pub mod quant;
pub mod reference;
pub mod saved;
pub mod synthetic;
pub mod traffic;
pub mod weights;

pub use arch::{build_model, builtin_models, model_info, ModelInfo};
pub use backend::{Backend, CompiledModel, Precision};
pub use cpu::CpuBackend;
pub use error::{EngineError, ErrorKind, LibraryFailure, OutOfMemory, Result};
pub use ir::{Dim, Graph, Op, Tensor, ValueId};
pub use weights::Weights;
