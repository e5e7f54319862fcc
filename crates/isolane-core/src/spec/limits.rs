//! The bounds of every count, size, rate and time a scenario may hold, so that nothing a file
//! says can overflow the schedule's arithmetic or ask for more than any machine holds. What a
//! particular machine holds (memory for the job records, the models' activations, its cores) is
//! checked later, at run time, against these numbers' consequences (docs/scenario.md,
//! "Limits").

/// Highest `rate_hz` (and ramp rate): one release per nanosecond, the clock's resolution.
pub const MAX_RATE_HZ: f64 = 1e9;

/// Longest `duration_s`, ramp length (`steps × step_s`) and deadline, in seconds: 100 days.
/// Release times are computed as `k·T` in f64 and are exact to the ns up to 2^53 ns (104 days).
pub const MAX_SECONDS: f64 = 8_640_000.0;

/// Shortest deadline and duration, in seconds: 1 ns, the clock's resolution.
pub const MIN_SECONDS: f64 = 1e-9;

/// Most steps of an interferer's ramp. An isolation run keeps each step's rate and each
/// victim's metrics per step in memory, and writes a row per step and victim: 100 000 steps
/// are some tens of MB. Four billion (allowed before) took 22 GB and more before their first
/// row, where no machine has a use for more steps than its victims have jobs.
pub const MAX_RAMP_STEPS: u64 = 100_000;

/// Most jobs a workload may release (`jobs`, `duration_s × rate_hz`, a ramp's total) and most
/// warm-up jobs. Far above what memory allows (a job record takes 40 bytes); the run checks
/// the records against this machine's memory before it starts.
pub const MAX_JOBS: u64 = 1_000_000_000_000;

/// Longest `timing.spin_us`: 1 s of spinning before each release.
pub const MAX_SPIN_US: u64 = 1_000_000;

/// Longest `timing.start_delay_ms`: 1 hour between the start barrier and t0.
pub const MAX_START_DELAY_MS: u64 = 3_600_000;

/// Shortest best-effort piece (µs): below it, the launch and wait between pieces would cost more
/// than the piece.
pub const MIN_PIECE_US: u64 = 20;

/// Longest best-effort piece (µs): one second.
pub const MAX_PIECE_US: u64 = 1_000_000;

/// Largest protection margin (µs): one second.
pub const MAX_MARGIN_US: u64 = 1_000_000;

/// Largest stated stretch of a critical job beside best effort.
pub const MAX_STRETCH: f64 = 100.0;

/// Largest `[workload.serve]` `queue_limit`: requests a served model holds waiting. Each holds
/// its input until it runs; a deeper queue only lengthens the wait of the last request.
pub const MAX_QUEUE_LIMIT: u64 = 65_536;

/// Longest `[workload.serve.batching]` `max_delay_ms`: 10 s, beyond any request's deadline a
/// batcher would be worth waiting for.
pub const MAX_BATCH_DELAY_MS: f64 = 10_000.0;
