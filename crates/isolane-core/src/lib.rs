//! isolane-core: scenario spec and validation, schedule math, metrics and statistics, max-rate
//! search, device models and admission control. No GPU, no threads.

pub mod job;
pub mod spec;

pub use job::JobRecord;
