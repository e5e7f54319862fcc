//! isolane-runtime: hosts (thread/process workers), the release loop, the coordinator,
//! experiments and result files. See `docs/runtime.md`.

// One unsafe operation per block, each with its own SAFETY comment (root Cargo.toml).
#![warn(clippy::multiple_unsafe_ops_per_block)]

pub mod affinity;
pub mod app_role;
pub mod clock;
pub mod coexec;
pub mod coordinator;
pub mod exec;
pub mod guard;
pub mod handle;
pub mod instance;
pub mod interference;
pub mod isolation;
pub mod jobs_stream;
pub mod limits;
pub mod maxrate;
pub mod output;
pub mod partition;
pub mod probe_role;
pub mod program;
pub mod protocol;
pub mod release;
pub mod remote_exec;
pub mod results;
pub mod schedule;
pub mod sweep;
pub mod thread_cpu;
pub mod worker;
pub mod worker_client;

pub use coordinator::{
    run, RunOptions, RunPlan, RunResult, WorkloadPlan, WorkloadResult, WorkloadStatus,
};
pub use exec::{ExecError, Executor};

/// Unit tests that busy-wait take this lock: run side by side on a 2-core CI machine they would
/// preempt each other and measure the contention instead of the code.
#[cfg(test)]
pub(crate) fn serial_test_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}
