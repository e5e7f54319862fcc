//! One job's timing record, as the release loop writes it and `jobs/<workload>.csv` stores it.

use serde::{Deserialize, Serialize};

/// Times are nanoseconds since the common `t0` of the run (monotonic clock).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobRecord {
    /// Job index k (0-based, warm-up jobs excluded).
    pub index: u64,
    /// Scheduled release r_k = k·T (closed loop: the previous job's end).
    pub release_ns: i64,
    /// Actual start; `None` when the job was skipped (late policy `skip`).
    pub start_ns: Option<i64>,
    /// Completion; `None` when skipped.
    pub end_ns: Option<i64>,
    /// R_k > D, or skipped.
    pub timeout: bool,
    /// How long the criticality guard held this best-effort job back (ns): before its start and
    /// between its pieces (docs/criticality.md). 0 for critical work and unprotected runs.
    #[serde(default)]
    pub held_ns: i64,
}

impl JobRecord {
    /// Response time R_k = completion − scheduled release, for completed jobs.
    pub fn latency_ns(&self) -> Option<i64> {
        self.end_ns.map(|e| e - self.release_ns)
    }

    /// Start lateness = actual start − scheduled start, where the scheduled start is
    /// `max(r_k, end of the previous job)` (passed in by the caller, who knows the previous job).
    pub fn start_lateness_ns(&self, scheduled_start_ns: i64) -> Option<i64> {
        self.start_ns.map(|s| s - scheduled_start_ns)
    }

    pub fn completed(&self) -> bool {
        self.end_ns.is_some()
    }
}
