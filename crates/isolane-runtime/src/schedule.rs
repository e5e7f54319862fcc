//! When jobs are released: the absolute schedule of DESIGN.md ("Timing semantics").
//!
//! Times here are nanoseconds relative to the run's `t0`. A [`Schedule`] is plain data so that
//! the coordinator can send it to a worker process unchanged.

use isolane_core::schedule::{jobs_in, release_ns};
use isolane_core::spec::{LatePolicy, Rate, RunLength, WorkloadSpec};
use serde::{Deserialize, Serialize};

/// How releases are spaced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Pace {
    /// `r_k = k·T`, computed from k each time (never accumulated), so there is no drift.
    Periodic { period_ns: f64 },
    /// Closed loop (`rate = "max"`): the next job is released when the previous one ends.
    ClosedLoop,
    /// The isolation experiment's interferer: step `i` covers `[i·step_ns, (i+1)·step_ns)` and
    /// releases at `rates_hz[i]` from the start of the step.
    Ramp { step_ns: i64, rates_hz: Vec<f64> },
}

/// When the run of a workload ends.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum End {
    /// Exactly this many jobs are released.
    Jobs(u64),
    /// Jobs released before `t0 + duration` (r_k < duration).
    DurationNs(i64),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Schedule {
    pub pace: Pace,
    /// Relative deadline. `None` with a periodic pace cannot happen (D defaults to T); with a
    /// ramp it means "the period of the current step"; closed loop without one never times out.
    pub deadline_ns: Option<i64>,
    pub end: End,
    pub late: LatePolicy,
    /// Every release is this much after t0 later (the workload's `phase_ms`); the end counts
    /// from it too.
    #[serde(default)]
    pub phase_ns: i64,
}

/// One release as the loop sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Release {
    pub release_ns: i64,
    /// Relative deadline of this job, `None` = never times out.
    pub deadline_ns: Option<i64>,
}

impl Schedule {
    /// The schedule a workload spec asks for.
    pub fn from_workload(spec: &WorkloadSpec) -> Schedule {
        let pace = match spec.rate {
            Rate::Hz(hz) => Pace::Periodic {
                period_ns: 1e9 / hz,
            },
            Rate::Max(_) => Pace::ClosedLoop,
        };
        Schedule {
            pace,
            deadline_ns: spec.deadline_s().map(|d| (d * 1e9).round() as i64),
            end: end_of(spec.length),
            late: spec.late,
            phase_ns: spec.phase_ms.map_or(0, |p| (p * 1e6).round() as i64),
        }
    }

    /// A periodic schedule at `hz` with deadline = period, for `n` jobs (max-rate search).
    pub fn periodic_jobs(hz: f64, n: u64, late: LatePolicy) -> Schedule {
        let period_ns = 1e9 / hz;
        Schedule {
            pace: Pace::Periodic { period_ns },
            deadline_ns: Some(period_ns.round() as i64),
            end: End::Jobs(n),
            late,
            phase_ns: 0,
        }
    }

    /// The time a periodic schedule gives `released` jobs: each job owns one period, so N jobs
    /// at rate f cover N/f seconds (within a duration: at most the duration). Throughput is
    /// measured over at least this span; over only t0 → the last completion, 25 jobs at 5 Hz
    /// would count 24 periods plus one latency and report 5.2 /s. `None` for closed loop and
    /// ramps, whose span is where their last job ends.
    pub fn span_ns(&self, released: u64) -> Option<i64> {
        let Pace::Periodic { period_ns } = self.pace else {
            return None;
        };
        // Saturating float-to-int `as`: an absurdly slow rate gives i64::MAX, not a wrap.
        let span = (released as f64 * period_ns).round() as i64;
        Some(match self.end {
            End::DurationNs(d) => span.min(d),
            End::Jobs(_) => span,
        })
    }

    /// How many jobs the schedule will release, as far as it can be known ahead (closed loop
    /// with a duration: `None`).
    pub fn expected_jobs(&self) -> Option<u64> {
        match (&self.pace, self.end) {
            (_, End::Jobs(n)) => Some(n),
            (Pace::Periodic { period_ns }, End::DurationNs(d)) => {
                Some(jobs_in(d as f64 / 1e9, 1e9 / period_ns))
            }
            (Pace::Ramp { step_ns, rates_hz }, End::DurationNs(d)) => Some(
                rates_hz
                    .iter()
                    .enumerate()
                    .map(|(i, r)| {
                        let span = (d - i as i64 * step_ns).clamp(0, *step_ns);
                        (span as f64 * r / 1e9).ceil().max(0.0) as u64
                    })
                    .sum(),
            ),
            (Pace::ClosedLoop, End::DurationNs(_)) => None,
        }
    }

    /// Wall time the schedule spans from t0 (its phase included), when known.
    pub fn duration_ns(&self) -> Option<i64> {
        let own = match (&self.pace, self.end) {
            (_, End::DurationNs(d)) => Some(d),
            (Pace::Periodic { period_ns }, End::Jobs(n)) => Some((n as f64 * period_ns) as i64),
            _ => None,
        };
        own.map(|d| d.saturating_add(self.phase_ns))
    }

    pub fn cursor(&self) -> Cursor<'_> {
        Cursor {
            schedule: self,
            k: 0,
            step: 0,
            in_step: 0,
        }
    }
}

pub fn end_of(length: RunLength) -> End {
    match length {
        RunLength::Jobs(n) => End::Jobs(n),
        RunLength::DurationS(s) => End::DurationNs((s * 1e9).round() as i64),
    }
}

/// Walks a schedule job by job without allocating.
pub struct Cursor<'a> {
    schedule: &'a Schedule,
    k: u64,
    step: usize,
    in_step: u64,
}

impl Cursor<'_> {
    /// Index the next release will get.
    pub fn index(&self) -> u64 {
        self.k
    }

    /// The next release, given when the previous job ended (closed loop needs it; `prev_end_ns`
    /// is 0 = t0 before the first job). `None` when the schedule is exhausted.
    pub fn next(&mut self, prev_end_ns: i64) -> Option<Release> {
        let s = self.schedule;
        if let End::Jobs(n) = s.end {
            if self.k >= n {
                return None;
            }
        }
        let rel = match &s.pace {
            Pace::Periodic { period_ns } => Release {
                release_ns: release_ns(self.k, *period_ns),
                deadline_ns: s.deadline_ns,
            },
            // In the schedule's own time (from its phase), as the others.
            Pace::ClosedLoop => Release {
                release_ns: if self.k == 0 {
                    0
                } else {
                    prev_end_ns.saturating_sub(s.phase_ns)
                },
                deadline_ns: s.deadline_ns,
            },
            Pace::Ramp { step_ns, rates_hz } => loop {
                let rate = *rates_hz.get(self.step)?;
                let step_start = self.step as i64 * step_ns;
                if rate > 0.0 {
                    let period = 1e9 / rate;
                    let r = step_start + (self.in_step as f64 * period).round() as i64;
                    if r < step_start + step_ns {
                        self.in_step += 1;
                        break Release {
                            release_ns: r,
                            deadline_ns: s.deadline_ns.or(Some(period.round() as i64)),
                        };
                    }
                }
                self.step += 1;
                self.in_step = 0;
            },
        };
        if let End::DurationNs(d) = s.end {
            if rel.release_ns >= d {
                return None;
            }
        }
        self.k += 1;
        Some(Release {
            release_ns: rel.release_ns.saturating_add(s.phase_ns),
            ..rel
        })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_periodic_span_is_one_period_per_released_job_within_the_duration() {
        use super::*;
        let at = |hz: f64, end: End| Schedule {
            pace: Pace::Periodic {
                period_ns: 1e9 / hz,
            },
            deadline_ns: None,
            end,
            late: LatePolicy::Skip,
            phase_ns: 0,
        };
        // 5 Hz for 5 s: 25 jobs cover 5 s, not 4.8 s + a latency.
        assert_eq!(
            at(5.0, End::DurationNs(5_000_000_000)).span_ns(25),
            Some(5_000_000_000)
        );
        // One job at 1e-300 Hz in a 5 s run: the run's 5 s, not the job's latency.
        assert_eq!(
            at(1e-300, End::DurationNs(5_000_000_000)).span_ns(1),
            Some(5_000_000_000)
        );
        // A job count: N periods, saturating instead of wrapping.
        assert_eq!(at(100.0, End::Jobs(10)).span_ns(10), Some(100_000_000));
        assert_eq!(at(1e-300, End::Jobs(1)).span_ns(1), Some(i64::MAX));
        let closed = Schedule {
            pace: Pace::ClosedLoop,
            ..at(1.0, End::Jobs(3))
        };
        assert_eq!(closed.span_ns(3), None);
    }

    use super::*;

    fn releases(s: &Schedule) -> Vec<Release> {
        let mut c = s.cursor();
        let mut v = Vec::new();
        while let Some(r) = c.next(0) {
            v.push(r);
        }
        v
    }

    #[test]
    fn periodic_is_absolute_and_ends_on_duration() {
        let s = Schedule {
            pace: Pace::Periodic {
                period_ns: 1e9 / 300.0,
            },
            deadline_ns: Some(3_333_333),
            end: End::DurationNs(1_000_000_000),
            late: LatePolicy::Skip,
            phase_ns: 0,
        };
        let r = releases(&s);
        assert_eq!(r.len(), 300);
        assert_eq!(s.expected_jobs(), Some(300));
        // k·T computed from k: job 299 sits at 299/300 s exactly (to the ns), no accumulated error.
        assert_eq!(r[299].release_ns, 996_666_667);
    }

    #[test]
    fn jobs_end_releases_exactly_n() {
        let s = Schedule::periodic_jobs(100.0, 7, LatePolicy::Queue);
        let r = releases(&s);
        assert_eq!(r.len(), 7);
        assert_eq!(r[6].release_ns, 60_000_000);
        assert_eq!(r[0].deadline_ns, Some(10_000_000));
    }

    #[test]
    fn ramp_steps_change_rate_at_boundaries() {
        let s = Schedule {
            pace: Pace::Ramp {
                step_ns: 1_000_000_000,
                rates_hz: vec![2.0, 4.0, 0.0, 1.0],
            },
            deadline_ns: None,
            end: End::DurationNs(4_000_000_000),
            late: LatePolicy::Skip,
            phase_ns: 0,
        };
        let r: Vec<i64> = releases(&s)
            .iter()
            .map(|r| r.release_ns / 1_000_000)
            .collect();
        assert_eq!(r, vec![0, 500, 1000, 1250, 1500, 1750, 3000]);
        assert_eq!(s.expected_jobs(), Some(7));
        assert_eq!(releases(&s)[2].deadline_ns, Some(250_000_000));
    }

    #[test]
    fn closed_loop_follows_previous_end() {
        let s = Schedule {
            pace: Pace::ClosedLoop,
            deadline_ns: None,
            end: End::Jobs(3),
            late: LatePolicy::Skip,
            phase_ns: 0,
        };
        let mut c = s.cursor();
        assert_eq!(c.next(0).map(|r| r.release_ns), Some(0));
        assert_eq!(c.next(40).map(|r| r.release_ns), Some(40));
        assert_eq!(c.next(90).map(|r| r.release_ns), Some(90));
        assert_eq!(c.next(95), None);
    }

    /// A phase shifts every release and the end with it: the same jobs, later.
    #[test]
    fn a_phase_shifts_every_release_and_the_end() {
        let s = Schedule {
            pace: Pace::Periodic { period_ns: 1e7 },
            deadline_ns: Some(10_000_000),
            end: End::DurationNs(50_000_000),
            late: LatePolicy::Skip,
            phase_ns: 4_000_000,
        };
        let mut c = s.cursor();
        let mut r = Vec::new();
        while let Some(x) = c.next(0) {
            r.push(x.release_ns / 1_000_000);
        }
        assert_eq!(r, vec![4, 14, 24, 34, 44]);
        assert_eq!(s.expected_jobs(), Some(5));
        assert_eq!(s.duration_ns(), Some(54_000_000));
        assert_eq!(s.span_ns(5), Some(50_000_000));
    }

    /// Closed loop: the first job at the phase, then each when the previous ended, and the
    /// duration counts from the phase.
    #[test]
    fn a_closed_loop_starts_at_its_phase() {
        let s = Schedule {
            pace: Pace::ClosedLoop,
            deadline_ns: None,
            end: End::DurationNs(100),
            late: LatePolicy::Skip,
            phase_ns: 1_000,
        };
        let mut c = s.cursor();
        assert_eq!(c.next(0).map(|r| r.release_ns), Some(1_000));
        assert_eq!(c.next(1_060).map(|r| r.release_ns), Some(1_060));
        assert_eq!(c.next(1_099).map(|r| r.release_ns), Some(1_099));
        assert_eq!(c.next(1_100).map(|r| r.release_ns), None);
    }
}
