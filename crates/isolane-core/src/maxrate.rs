//! Max stable inference frequency: Algorithm 1 of paper 000, as DESIGN.md states it, as pure
//! logic. The runtime supplies a [`BatchRunner`] that actually runs jobs; this module only
//! decides which batch to run next.
//!
//! 1. Run N jobs back to back; f₀ = 1 / mean(5 worst times).
//! 2. Search: run N jobs at f (deadline 1/f). Clean → raise f by the step, repeat. A violation →
//!    lower f by the step and validate.
//! 3. Validation: K batches of N at f. All clean → f is the max stable rate, `L_max = 1/f`.
//!    Any violation → lower f by the step and validate again (from the first of the K).

use serde::{Deserialize, Serialize};

use crate::stats::{claims_on_time_fraction, StatsError};

/// What one timed batch produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchOutcome {
    /// Jobs released in the batch (normally N; fewer if the runner had to stop early).
    pub jobs: u64,
    /// Deadline misses (timeouts, skipped jobs included).
    pub violations: u64,
}

/// Runs batches for the search. Implemented by the runtime; tests use a fake.
pub trait BatchRunner {
    type Error;
    /// Run `n` jobs back to back (closed loop) and return each job's time in seconds.
    fn run_back_to_back(&mut self, n: u64) -> Result<Vec<f64>, Self::Error>;
    /// Run `n` jobs released at `rate_hz` with deadline `1 / rate_hz`.
    fn run_at_rate(&mut self, n: u64, rate_hz: f64) -> Result<BatchOutcome, Self::Error>;
}

/// How the rate moves between batches.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Step {
    /// Add / subtract this many jobs per second (the paper: 1).
    Absolute(f64),
    /// Multiply / divide by `1 + fraction`, so that a raise and a lowering cancel exactly.
    Relative(f64),
}

impl Step {
    fn up(self, f: f64) -> f64 {
        match self {
            Step::Absolute(s) => f + s,
            Step::Relative(r) => f * (1.0 + r),
        }
    }
    fn down(self, f: f64) -> f64 {
        match self {
            Step::Absolute(s) => f - s,
            Step::Relative(r) => f / (1.0 + r),
        }
    }
}

/// When a batch counts as clean.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Acceptance {
    /// The paper's rule: not a single violation.
    ZeroViolations,
    /// Clean when the misses allow claiming an on-time fraction ≥ `target` at `confidence`
    /// (one-sided binomial / Clopper–Pearson, as MLPerf LoadGen's early stopping).
    Statistical { confidence: f64, target: f64 },
}

impl Acceptance {
    fn accepts(self, o: BatchOutcome) -> Result<bool, StatsError> {
        match self {
            Acceptance::ZeroViolations => Ok(o.violations == 0),
            Acceptance::Statistical { confidence, target } => {
                claims_on_time_fraction(o.jobs, o.violations.min(o.jobs), target, confidence)
            }
        }
    }
}

/// Parameters of the search. `Default` is the paper's: N = 1000, K = 3, step 1 job/s.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct MaxRateConfig {
    /// Jobs per batch (N).
    pub jobs: u64,
    /// Validation batches (K).
    pub validations: u32,
    pub step: Step,
    pub acceptance: Acceptance,
    /// Timed batches at most (search + validation), so a runner that never fails (or never
    /// passes) ends in an error instead of running forever.
    pub max_batches: u32,
}

impl Default for MaxRateConfig {
    fn default() -> Self {
        MaxRateConfig {
            jobs: 1000,
            validations: 3,
            step: Step::Absolute(1.0),
            acceptance: Acceptance::ZeroViolations,
            max_batches: 10_000,
        }
    }
}

/// Worst times averaged for the initial rate.
pub const WORST_TIMES: usize = 5;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// The back-to-back batch that gives f₀.
    Initial,
    Search,
    Validation,
}

/// One batch of the search, for the printed and saved trace.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TraceStep {
    pub phase: Phase,
    /// The rate of the batch (for `Initial`: f₀ derived from it).
    pub rate_hz: f64,
    pub jobs: u64,
    pub violations: u64,
    /// Whether the batch counted as clean.
    pub accepted: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MaxRateResult {
    /// The max stable rate f (IMS), jobs per second.
    pub max_rate_hz: f64,
    /// `L_max = 1/f` in ms.
    pub l_max_ms: f64,
    pub initial_rate_hz: f64,
    pub trace: Vec<TraceStep>,
}

#[derive(Debug, thiserror::Error)]
pub enum MaxRateError<E> {
    #[error("the runner failed: {0}")]
    Runner(E),
    #[error("invalid max-rate configuration: {0}")]
    Config(String),
    #[error("the back-to-back batch returned no usable times ({0})")]
    NoTimes(String),
    // A step above the rate takes it below 0: said as 0 ("fell to -1e20 jobs/s" read as a bug).
    #[error(
        "the rate fell to {} jobs/s: no rate > 0 is stable with this step",
        .rate_hz.max(0.0)
    )]
    RateExhausted { rate_hz: f64 },
    #[error("no result after {0} timed batches (max_batches); last rate {1} jobs/s")]
    TooManyBatches(u32, f64),
    #[error(transparent)]
    Stats(#[from] StatsError),
}

impl MaxRateConfig {
    /// The checks [`find_max_rate`] makes before its first batch, for a caller that must refuse
    /// a bad configuration before it starts anything (e.g. a worker process).
    pub fn validate(&self) -> Result<(), String> {
        self.check::<std::convert::Infallible>()
            .map_err(|e| match e {
                MaxRateError::Config(m) => m,
                other => other.to_string(),
            })
    }

    fn check<E>(&self) -> Result<(), MaxRateError<E>> {
        let bad = |m: String| Err(MaxRateError::Config(m));
        if self.jobs == 0 {
            return bad("jobs per batch (N) must be >= 1".into());
        }
        match self.step {
            Step::Absolute(s) if !(s.is_finite() && s > 0.0) => {
                return bad(format!("absolute step {s} must be a finite number > 0"))
            }
            // A step of 100 % or more is almost always a percentage typed as a fraction (5 for
            // 5 %), and would halve or worse the rate at each failure.
            Step::Relative(r) if !(r.is_finite() && r > 0.0 && r < 1.0) => {
                return bad(format!(
                    "relative step {r} must be a fraction of the rate, 0 < F < 1 (0.05 = 5 %)"
                ))
            }
            _ => {}
        }
        if let Acceptance::Statistical { confidence, target } = self.acceptance {
            // Probe once, so a bad pair is a config error and not a mid-search failure.
            claims_on_time_fraction(self.jobs, 0, target, confidence)
                .map_err(|e| MaxRateError::Config(e.to_string()))?;
        }
        Ok(())
    }
}

/// Initial rate: 1 / mean of the `WORST_TIMES` largest times (all of them if fewer).
pub fn initial_rate(times_s: &[f64]) -> Option<f64> {
    let mut t: Vec<f64> = times_s
        .iter()
        .copied()
        .filter(|x| x.is_finite() && *x >= 0.0)
        .collect();
    if t.is_empty() {
        return None;
    }
    t.sort_by(|a, b| b.total_cmp(a));
    let worst = &t[..t.len().min(WORST_TIMES)];
    let mean = worst.iter().sum::<f64>() / worst.len() as f64;
    let f = 1.0 / mean;
    (f.is_finite() && f > 0.0).then_some(f)
}

/// Run Algorithm 1 against `runner`.
pub fn find_max_rate<R: BatchRunner>(
    runner: &mut R,
    cfg: &MaxRateConfig,
) -> Result<MaxRateResult, MaxRateError<R::Error>> {
    cfg.check()?;
    let n = cfg.jobs;
    let mut trace = Vec::new();

    let times = runner.run_back_to_back(n).map_err(MaxRateError::Runner)?;
    let f0 = initial_rate(&times).ok_or_else(|| {
        MaxRateError::NoTimes(format!(
            "{} times, none finite, >= 0 and with a mean > 0",
            times.len()
        ))
    })?;
    trace.push(TraceStep {
        phase: Phase::Initial,
        rate_hz: f0,
        jobs: times.len() as u64,
        violations: 0,
        accepted: true,
    });

    let mut batches = 0u32;
    let mut timed = |runner: &mut R, rate: f64, phase: Phase, trace: &mut Vec<TraceStep>| {
        if batches >= cfg.max_batches {
            return Err(MaxRateError::TooManyBatches(batches, rate));
        }
        if !(rate.is_finite() && rate > 0.0) {
            return Err(MaxRateError::RateExhausted { rate_hz: rate });
        }
        batches += 1;
        let o = runner.run_at_rate(n, rate).map_err(MaxRateError::Runner)?;
        let accepted = cfg.acceptance.accepts(o)?;
        trace.push(TraceStep {
            phase,
            rate_hz: rate,
            jobs: o.jobs,
            violations: o.violations,
            accepted,
        });
        Ok(accepted)
    };

    // Search: raise while clean; the first violation lowers once.
    let mut f = f0;
    while timed(runner, f, Phase::Search, &mut trace)? {
        f = cfg.step.up(f);
    }
    f = cfg.step.down(f);

    // Validation: K clean batches in a row at f, else lower and start over.
    'validate: loop {
        for _ in 0..cfg.validations {
            if !timed(runner, f, Phase::Validation, &mut trace)? {
                f = cfg.step.down(f);
                continue 'validate;
            }
        }
        // With K = 0 a rate that was never run could be "validated"; refuse a rate ≤ 0 anyway.
        if !(f.is_finite() && f > 0.0) {
            return Err(MaxRateError::RateExhausted { rate_hz: f });
        }
        return Ok(MaxRateResult {
            max_rate_hz: f,
            l_max_ms: 1e3 / f,
            initial_rate_hz: f0,
            trace,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Violations iff the rate is above `limit`; back-to-back times give f₀ = `start`.
    struct Fake {
        limit: f64,
        start: f64,
        /// Extra violations at a given rate on its k-th validation run: (rate, nth call at rate).
        flaky: Vec<(f64, u32)>,
        calls: Vec<f64>,
        /// Violations reported when over the limit.
        over_violations: u64,
        /// Violations reported in (limit, soft] (statistical tests).
        soft: Option<(f64, u64)>,
    }

    impl Fake {
        fn new(limit: f64, start: f64) -> Fake {
            Fake {
                limit,
                start,
                flaky: vec![],
                calls: vec![],
                over_violations: 7,
                soft: None,
            }
        }
    }

    impl BatchRunner for Fake {
        type Error = String;
        fn run_back_to_back(&mut self, n: u64) -> Result<Vec<f64>, String> {
            // Five worst equal to 1/start, the rest faster.
            let mut v = vec![0.5 / self.start; n as usize - 5];
            v.extend([1.0 / self.start; 5]);
            Ok(v)
        }
        fn run_at_rate(&mut self, n: u64, rate: f64) -> Result<BatchOutcome, String> {
            self.calls.push(rate);
            let nth = self.calls.iter().filter(|&&r| r == rate).count() as u32;
            let mut violations = if rate > self.limit {
                self.over_violations
            } else {
                0
            };
            if let Some((soft, v)) = self.soft {
                if rate > self.limit && rate <= soft {
                    violations = v;
                }
            }
            if self.flaky.contains(&(rate, nth)) {
                violations += 1;
            }
            Ok(BatchOutcome {
                jobs: n,
                violations,
            })
        }
    }

    fn step(phase: Phase, rate_hz: f64, violations: u64, accepted: bool) -> TraceStep {
        TraceStep {
            phase,
            rate_hz,
            jobs: 1000,
            violations,
            accepted,
        }
    }

    #[test]
    fn initial_rate_is_mean_of_five_worst() {
        assert_eq!(
            initial_rate(&[0.001, 0.004, 0.004, 0.002, 0.004, 0.004, 0.004]),
            Some(250.0)
        );
        assert_eq!(initial_rate(&[0.002, 0.002]), Some(500.0));
        assert_eq!(initial_rate(&[]), None);
        assert_eq!(initial_rate(&[0.0, 0.0]), None);
        assert_eq!(initial_rate(&[f64::NAN]), None);
    }

    #[test]
    fn paper_rule_exact_trace() {
        let mut r = Fake::new(237.0, 230.5);
        let res = find_max_rate(&mut r, &MaxRateConfig::default()).unwrap();
        assert_eq!(res.max_rate_hz, 236.5);
        assert_eq!(res.initial_rate_hz, 230.5);
        assert!((res.l_max_ms - 1e3 / 236.5).abs() < 1e-12);
        let mut want = vec![step(Phase::Initial, 230.5, 0, true)];
        for f in [230.5, 231.5, 232.5, 233.5, 234.5, 235.5, 236.5] {
            want.push(step(Phase::Search, f, 0, true));
        }
        want.push(step(Phase::Search, 237.5, 7, false));
        for _ in 0..3 {
            want.push(step(Phase::Validation, 236.5, 0, true));
        }
        assert_eq!(res.trace, want);
    }

    #[test]
    fn violation_at_the_initial_rate_lowers_first() {
        let mut r = Fake::new(237.0, 240.0);
        let res = find_max_rate(&mut r, &MaxRateConfig::default()).unwrap();
        // 240 fails, validate 239 (fails), 238 (fails), 237 (clean ×3).
        assert_eq!(res.max_rate_hz, 237.0);
        let phases: Vec<(Phase, f64, bool)> = res
            .trace
            .iter()
            .map(|s| (s.phase, s.rate_hz, s.accepted))
            .collect();
        assert_eq!(
            phases,
            vec![
                (Phase::Initial, 240.0, true),
                (Phase::Search, 240.0, false),
                (Phase::Validation, 239.0, false),
                (Phase::Validation, 238.0, false),
                (Phase::Validation, 237.0, true),
                (Phase::Validation, 237.0, true),
                (Phase::Validation, 237.0, true),
            ]
        );
    }

    #[test]
    fn a_failed_validation_lowers_and_restarts_all_k() {
        let mut r = Fake::new(237.0, 235.0);
        // Search: 235, 236, 237 clean, 238 fails → validate 237. Its third validation batch
        // (4th call at 237) fails once: lower to 236 and run all K again.
        r.flaky = vec![(237.0, 4)];
        let res = find_max_rate(&mut r, &MaxRateConfig::default()).unwrap();
        assert_eq!(res.max_rate_hz, 236.0);
        let v: Vec<(f64, bool)> = res
            .trace
            .iter()
            .filter(|s| s.phase == Phase::Validation)
            .map(|s| (s.rate_hz, s.accepted))
            .collect();
        assert_eq!(
            v,
            vec![
                (237.0, true),
                (237.0, true),
                (237.0, false),
                (236.0, true),
                (236.0, true),
                (236.0, true)
            ]
        );
    }

    #[test]
    fn relative_step_cancels_exactly() {
        let mut r = Fake::new(237.0, 200.0);
        let cfg = MaxRateConfig {
            step: Step::Relative(0.05),
            ..MaxRateConfig::default()
        };
        let res = find_max_rate(&mut r, &cfg).unwrap();
        // 200, 210, 220.5, 231.525 clean; 243.10125 fails; back to 231.525.
        assert!(
            (res.max_rate_hz - 231.525).abs() < 1e-9,
            "{}",
            res.max_rate_hz
        );
        assert!(res.max_rate_hz <= 237.0);
    }

    #[test]
    fn statistical_rule_tolerates_rare_misses() {
        // Between 237 and 240 Hz a batch of 1000 has 2 misses: the paper's rule rejects it,
        // the statistical rule (99 % on time at 95 % confidence allows up to 4 misses) accepts.
        let mut r = Fake::new(237.0, 230.0);
        r.soft = Some((240.0, 2));
        let stat = MaxRateConfig {
            acceptance: Acceptance::Statistical {
                confidence: 0.95,
                target: 0.99,
            },
            ..MaxRateConfig::default()
        };
        let res = find_max_rate(&mut r, &stat).unwrap();
        assert_eq!(res.max_rate_hz, 240.0);
        let last_search = res
            .trace
            .iter()
            .rfind(|s| s.phase == Phase::Search)
            .unwrap();
        assert_eq!(
            (
                last_search.rate_hz,
                last_search.violations,
                last_search.accepted
            ),
            (241.0, 7, false)
        );
        let mut r = Fake::new(237.0, 230.0);
        r.soft = Some((240.0, 2));
        assert_eq!(
            find_max_rate(&mut r, &MaxRateConfig::default())
                .unwrap()
                .max_rate_hz,
            237.0
        );
    }

    #[test]
    fn guards_end_in_errors_not_loops() {
        // Never violates: max_batches stops it.
        let mut r = Fake::new(f64::INFINITY, 10.0);
        let cfg = MaxRateConfig {
            max_batches: 50,
            ..MaxRateConfig::default()
        };
        assert!(matches!(
            find_max_rate(&mut r, &cfg),
            Err(MaxRateError::TooManyBatches(50, _))
        ));
        // Always violates: the rate reaches 0.
        let mut r = Fake::new(0.0, 3.0);
        assert!(matches!(
            find_max_rate(&mut r, &MaxRateConfig::default()),
            Err(MaxRateError::RateExhausted { .. })
        ));
        // A step larger than the rate goes below 0, said as 0.
        let e = MaxRateError::<String>::RateExhausted { rate_hz: -1e20 }.to_string();
        assert!(e.starts_with("the rate fell to 0 jobs/s"), "{e}");
        // Bad configurations.
        let mut r = Fake::new(237.0, 230.0);
        for cfg in [
            MaxRateConfig {
                jobs: 0,
                ..MaxRateConfig::default()
            },
            MaxRateConfig {
                step: Step::Absolute(0.0),
                ..MaxRateConfig::default()
            },
            MaxRateConfig {
                step: Step::Relative(f64::NAN),
                ..MaxRateConfig::default()
            },
            MaxRateConfig {
                step: Step::Relative(5.0),
                ..MaxRateConfig::default()
            },
            MaxRateConfig {
                acceptance: Acceptance::Statistical {
                    confidence: 1.5,
                    target: 0.99,
                },
                ..MaxRateConfig::default()
            },
        ] {
            assert!(
                matches!(find_max_rate(&mut r, &cfg), Err(MaxRateError::Config(_))),
                "{cfg:?}"
            );
        }
    }

    #[test]
    fn runner_errors_propagate() {
        struct Broken;
        impl BatchRunner for Broken {
            type Error = &'static str;
            fn run_back_to_back(&mut self, _: u64) -> Result<Vec<f64>, &'static str> {
                Ok(vec![0.004; 10])
            }
            fn run_at_rate(&mut self, _: u64, _: f64) -> Result<BatchOutcome, &'static str> {
                Err("worker died")
            }
        }
        let e = find_max_rate(&mut Broken, &MaxRateConfig::default()).unwrap_err();
        assert_eq!(e.to_string(), "the runner failed: worker died");
    }
}
