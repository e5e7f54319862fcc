//! isolane-core: scenario spec and validation, schedule math, metrics and statistics, max-rate
//! search, device models and admission control. No GPU, no threads.

// One unsafe operation per block, each with its own SAFETY comment (root Cargo.toml).
#![warn(clippy::multiple_unsafe_ops_per_block)]

pub mod admission;
pub mod app_records;
pub mod backend;
pub mod device_model;
pub mod exit_codes;
pub mod files;
pub mod flag_values;
#[cfg(feature = "test-support")]
pub mod fuzz;
pub mod job;
pub mod maxrate;
pub mod metrics;
pub mod predict;
pub mod probe;
pub mod process;
pub mod results;
pub mod schedule;
pub mod spec;
pub mod stats;
#[cfg(feature = "test-support")]
pub mod system_packages;
pub mod text;
pub mod user_error;

pub use job::JobRecord;
pub use metrics::WorkloadMetrics;
pub use spec::{Scenario, SpecError};
