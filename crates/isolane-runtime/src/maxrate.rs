//! The runtime side of the max-rate search (Algorithm 1): core's `BatchRunner` on the release
//! loop, one workload on the calling thread, and [`search`], the whole search (pinning,
//! warm-up, Algorithm 1, start lateness, CPU steal) that `isolane maxrate` runs in its own
//! process and, for an MPS partition, in an `isolane worker` client process (the `maxrate` role
//! of the worker protocol, [`crate::protocol`]).

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use isolane_core::maxrate::{
    find_max_rate, BatchOutcome, BatchRunner, MaxRateConfig, MaxRateError, MaxRateResult,
};
use isolane_core::results::LatenessSummary;
use isolane_core::spec::{DeviceSpec, LatePolicy, TimingSpec, WorkloadSpec};
use isolane_core::JobRecord;
use serde::{Deserialize, Serialize};

use crate::affinity::{self, AffinityError};
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

/// What one max-rate search measures: the workload (model, batch, precision, warm-up jobs, CPU
/// cores), where it runs, the timing (seed, spin) and Algorithm 1's settings. Sent as it is to
/// a worker process in the protocol's `maxrate` role.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SearchRequest {
    pub workload: WorkloadSpec,
    pub device: DeviceSpec,
    pub timing: TimingSpec,
    pub config: MaxRateConfig,
}

/// A finished search: Algorithm 1's result, the start lateness of every timed job, and the CPU
/// time a hypervisor took from the machine meanwhile.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SearchOutcome {
    pub result: MaxRateResult,
    /// µs over every job of every timed batch (`None` where no job ran).
    pub start_lateness_us: LatenessSummary,
    pub cpu_steal_pct: Option<f64>,
}

/// What a search tells its observer as it goes (a progress bar; over the protocol, the
/// worker's `progress` messages).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum SearchEvent {
    /// The warm-up jobs ran; their times in seconds (an estimate of the search's length).
    WarmedUp { job_s: Vec<f64> },
    /// The back-to-back batch that gives the initial rate starts.
    BackToBack { jobs: u64 },
    /// A batch at a fixed rate starts.
    AtRate { jobs: u64, rate_hz: f64 },
    /// That batch ended.
    BatchDone { outcome: BatchOutcome },
}

#[derive(Debug, thiserror::Error)]
pub enum SearchError {
    /// Stopped (Ctrl-C) before a rate was found.
    #[error("interrupted: no max rate found")]
    Interrupted,
    /// The configuration is not usable (a user's mistake).
    #[error(transparent)]
    Config(#[from] MaxRateConfigError),
    #[error(transparent)]
    Affinity(#[from] AffinityError),
    #[error(transparent)]
    Exec(#[from] ExecError),
    /// The search ran but found no rate (e.g. none is stable with this step).
    #[error("{0}")]
    NoRate(String),
}

/// Algorithm 1's settings refused (`MaxRateError::Config`).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct MaxRateConfigError(pub String);

/// Runs the search of `request` with `executor` on the calling thread (pinned to the
/// workload's `cpu` cores) until done or `stop`: the warm-up jobs, Algorithm 1 on the release
/// loop, and the start lateness and CPU steal over it. `observe` sees each step as it starts.
pub fn search(
    executor: Box<dyn Executor>,
    request: &SearchRequest,
    stop: Arc<AtomicBool>,
    observe: &mut dyn FnMut(&SearchEvent),
) -> Result<SearchOutcome, SearchError> {
    request.config.validate().map_err(MaxRateConfigError)?;
    affinity::pin_current_thread(&request.workload.cpu)?;
    let spin_ns = (request.timing.spin_us as i64).saturating_mul(1000);
    let mut runner = LoopRunner::new(executor, spin_ns, 5_000_000, stop);
    let job_s = warm_up(&mut runner, request.workload.warmup_jobs)?;
    observe(&SearchEvent::WarmedUp { job_s });
    let steal = clock::StealMeter::start();
    let mut observed = ObservedRunner {
        inner: &mut runner,
        observe,
    };
    let result = find_max_rate(&mut observed, &request.config).map_err(|e| match e {
        MaxRateError::Runner(RunnerError::Interrupted) => SearchError::Interrupted,
        MaxRateError::Runner(RunnerError::Exec(e)) => SearchError::Exec(e),
        MaxRateError::Config(m) => SearchError::Config(MaxRateConfigError(m)),
        e => SearchError::NoRate(e.to_string()),
    })?;
    Ok(SearchOutcome {
        result,
        start_lateness_us: lateness_summary_us(&mut runner.lateness_ns),
        cpu_steal_pct: steal.pct(),
    })
}

/// `jobs` jobs one at a time (not recorded); their times in seconds. A stop during the warm-up
/// ends it early: the search then stops at its first batch.
fn warm_up(runner: &mut LoopRunner, jobs: u64) -> Result<Vec<f64>, SearchError> {
    let mut times = Vec::new();
    for _ in 0..jobs {
        match runner.run_back_to_back(1) {
            Ok(t) => times.extend(t),
            Err(RunnerError::Interrupted) => break,
            Err(RunnerError::Exec(e)) => return Err(e.into()),
        }
    }
    Ok(times)
}

/// p50, p99 and max of ns values, in µs (`None` when there are none).
fn lateness_summary_us(ns: &mut [i64]) -> LatenessSummary {
    if ns.is_empty() {
        return LatenessSummary {
            p50: None,
            p99: None,
            max: None,
        };
    }
    ns.sort_unstable();
    let at = |q: f64| Some(ns[((ns.len() - 1) as f64 * q).round() as usize] as f64 / 1e3);
    LatenessSummary {
        p50: at(0.5),
        p99: at(0.99),
        max: at(1.0),
    }
}

/// The runner the search sees: the loop runner, telling `observe` what each batch is.
struct ObservedRunner<'a> {
    inner: &'a mut LoopRunner,
    observe: &'a mut dyn FnMut(&SearchEvent),
}

impl BatchRunner for ObservedRunner<'_> {
    type Error = RunnerError;

    fn run_back_to_back(&mut self, n: u64) -> Result<Vec<f64>, RunnerError> {
        (self.observe)(&SearchEvent::BackToBack { jobs: n });
        self.inner.run_back_to_back(n)
    }

    fn run_at_rate(&mut self, n: u64, rate_hz: f64) -> Result<BatchOutcome, RunnerError> {
        (self.observe)(&SearchEvent::AtRate { jobs: n, rate_hz });
        let outcome = self.inner.run_at_rate(n, rate_hz)?;
        (self.observe)(&SearchEvent::BatchDone { outcome });
        Ok(outcome)
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
