//! The executors the runtime and apps run: real models on the engine's CPU and CUDA backends
//! ([`engine`]), synthetic `kernel:` workloads (`kernel`, which `engine` builds), the models of
//! app stages ([`app_models`]), an app in an `isolane worker` process ([`app_worker`]), and the
//! seeded inputs they all start from ([`seeded_input`]).
//!
//! The adapters between the engine and the runtime: the runtime defines `EngineExecutors` and
//! `AppRunner` and depends on no engine; this crate implements them with `isolane-engine` and
//! `isolane-cuda`, and the binary builds one value of each and passes it down.

pub mod app_models;
pub mod app_worker;
pub mod bench;
pub mod engine;
pub mod exit;
pub mod foresee;
pub mod infer;
mod kernel;
pub mod listing;
pub mod machine;
pub mod run_input;
pub mod saved_plan;
pub mod seeded_input;
