//! The runtime side of the max-rate search (Algorithm 1): core's `BatchRunner` on the release
//! loop, one workload on the calling thread.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use isolane_core::maxrate::{BatchOutcome, BatchRunner};
use isolane_core::spec::LatePolicy;
use isolane_core::JobRecord;

use crate::clock;
use crate::exec::{ExecError, Executor};
use crate::release::{run_loop, start_lateness_ns, LoopEnd, VecSink};
use crate::schedule::Schedule;

#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    #[error(transparent)]
    Exec(#[from] ExecError),
    #[error("interrupted")]
    Interrupted,
}

/// Runs the search's batches with the real release loop: the same absolute schedule, skip
/// policy and deadline `1/f` as `isolane run`, so the rate found is the rate a run sustains.
pub struct LoopRunner {
    exec: Box<dyn Executor>,
    spin_ns: i64,
    start_delay_ns: i64,
    stop: Arc<AtomicBool>,
    /// Reused between batches so that a batch never allocates while it runs.
    buf: Vec<JobRecord>,
    /// Start lateness (ns) of every job of every timed batch.
    pub lateness_ns: Vec<i64>,
}

impl LoopRunner {
    pub fn new(
        exec: Box<dyn Executor>,
        spin_ns: i64,
        start_delay_ns: i64,
        stop: Arc<AtomicBool>,
    ) -> Self {
        LoopRunner {
            exec,
            spin_ns,
            start_delay_ns,
            stop,
            buf: Vec::new(),
            lateness_ns: Vec::new(),
        }
    }
}

impl BatchRunner for LoopRunner {
    type Error = RunnerError;

    fn run_back_to_back(&mut self, n: u64) -> Result<Vec<f64>, RunnerError> {
        let mut times = Vec::with_capacity(n as usize);
        for _ in 0..n {
            if self.stop.load(std::sync::atomic::Ordering::Relaxed) {
                return Err(RunnerError::Interrupted);
            }
            let a = clock::now_ns();
            self.exec.run_job()?;
            times.push((clock::now_ns() - a) as f64 / 1e9);
        }
        Ok(times)
    }

    fn run_at_rate(&mut self, n: u64, rate_hz: f64) -> Result<BatchOutcome, RunnerError> {
        let schedule = Schedule::periodic_jobs(rate_hz, n, LatePolicy::Skip);
        let mut sink = VecSink {
            records: std::mem::take(&mut self.buf),
            counter: None,
        };
        sink.records.clear();
        sink.records.reserve(n as usize);
        let t0 = clock::now_ns() + self.start_delay_ns;
        let end = run_loop(
            self.exec.as_mut(),
            &schedule,
            t0,
            self.spin_ns,
            &self.stop,
            &mut sink,
        );
        self.buf = sink.records;
        match end? {
            LoopEnd::Interrupted => Err(RunnerError::Interrupted),
            LoopEnd::Completed => {
                self.lateness_ns.extend(start_lateness_ns(&self.buf));
                Ok(BatchOutcome {
                    jobs: self.buf.len() as u64,
                    violations: self.buf.iter().filter(|r| r.timeout).count() as u64,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::SpinExecutor;
    use isolane_core::maxrate::{find_max_rate, MaxRateConfig, Step};

    #[test]
    fn finds_a_rate_below_the_ideal() {
        let _serial = crate::serial_test_lock();
        // 2 ms jobs: ideal 500 jobs/s. Small batches and a coarse step keep this quick.
        let exec = Box::new(SpinExecutor::new(2_000_000, 0, 1));
        let mut runner =
            LoopRunner::new(exec, 200_000, 1_000_000, Arc::new(AtomicBool::new(false)));
        let cfg = MaxRateConfig {
            jobs: 50,
            validations: 1,
            step: Step::Relative(0.05),
            ..MaxRateConfig::default()
        };
        let r = find_max_rate(&mut runner, &cfg).unwrap();
        // Wiring, not precision (tests/maxrate.rs checks the figure): a machine loaded by
        // parallel builds can push the rate far below the ideal, never above it.
        assert!(
            r.max_rate_hz <= 505.0 && r.max_rate_hz > 0.0,
            "{}",
            r.max_rate_hz
        );
        assert!(!runner.lateness_ns.is_empty());
    }
}
