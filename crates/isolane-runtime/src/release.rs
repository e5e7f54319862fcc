//! The release loop: runs one workload's jobs on its schedule (DESIGN.md, "Timing semantics").
//!
//! - Job k is released at `r_k = t0 + k·T` (absolute; see [`crate::schedule`]).
//! - It starts at `max(r_k, end of the previous job)`.
//! - `skip`: if the job's deadline `r_k + D` has already passed when it could start, it is not run
//!   and counts as a timeout (its record has no start/end). `queue`: every job runs.
//! - Response time is measured from the scheduled release; timeout ⇔ `R_k > D`.
//! - The loop sleeps until `spin_ns` before a release and spins the rest, so that a sleep's
//!   wake-up latency does not become start lateness.

use std::sync::atomic::{AtomicBool, Ordering};

use isolane_core::schedule::{is_timeout, late_decision, LateDecision};
use isolane_core::JobRecord;

use crate::clock;
use crate::exec::{ExecError, Executor};
use crate::guard::GuardRole;
use crate::schedule::Schedule;

/// Where the loop puts each job's record. Called on the hot path: implementations must not
/// allocate per job (push into a pre-sized Vec, or a fixed buffer).
pub trait RecordSink {
    fn record(&mut self, rec: &JobRecord);
    /// Called when the loop is about to wait until `until_ns` (absolute) with nothing to do, so
    /// that a sink can flush. Only called when at least [`IDLE_MIN_NS`] of waiting is ahead.
    fn idle(&mut self, _until_ns: i64) {}
}

/// Minimum wait before a release for the loop to call [`RecordSink::idle`] (beyond the spin).
pub const IDLE_MIN_NS: i64 = 300_000;

/// A sink that keeps everything in memory, pre-sized so that pushing does not reallocate.
pub struct VecSink<'a> {
    pub records: Vec<JobRecord>,
    pub counter: Option<&'a std::sync::atomic::AtomicU64>,
}

impl<'a> VecSink<'a> {
    pub fn with_capacity(n: usize, counter: Option<&'a std::sync::atomic::AtomicU64>) -> Self {
        VecSink {
            records: Vec::with_capacity(n),
            counter,
        }
    }
}

impl RecordSink for VecSink<'_> {
    fn record(&mut self, rec: &JobRecord) {
        self.records.push(*rec);
        if let Some(c) = self.counter {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// How a loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoopEnd {
    /// Every scheduled job was released.
    Completed,
    /// `stop` was raised (Ctrl-C): jobs not yet released were never released.
    Interrupted,
}

/// Capacity to reserve for a schedule's records. Closed loop with a duration has no count known
/// ahead; `service_hint_ns` (from warm-up) estimates it.
pub fn capacity_for(schedule: &Schedule, service_hint_ns: Option<i64>) -> usize {
    const CAP: u64 = 8_000_000;
    let n = schedule.expected_jobs().unwrap_or_else(|| {
        match (schedule.duration_ns(), service_hint_ns) {
            (Some(d), Some(s)) if s > 0 => (d / s) as u64 * 5 / 4 + 64,
            _ => 65_536,
        }
    });
    n.min(CAP) as usize + 1
}

/// Capacity to reserve for `warmup` warm-up times: all of them up to a bound, beyond which the
/// vector grows as the jobs run (a count the user wrote must never be allocated blindly).
pub fn warmup_capacity(warmup: u64) -> usize {
    const CAP: u64 = 1 << 20;
    warmup.min(CAP) as usize
}

/// Runs `warmup` jobs back to back, returning their service times (ns) in `out`.
pub fn warm_up(
    exec: &mut dyn Executor,
    warmup: u64,
    out: &mut Vec<i64>,
    stop: &AtomicBool,
) -> Result<(), ExecError> {
    for _ in 0..warmup {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let a = clock::now_ns();
        exec.run_job()?;
        out.push(clock::now_ns() - a);
    }
    Ok(())
}

/// Runs the schedule from the absolute monotonic time `t0_ns`. Records carry times relative
/// to `t0_ns`. On an executor error, the records so far are already in the sink.
pub fn run_loop(
    exec: &mut dyn Executor,
    schedule: &Schedule,
    t0_ns: i64,
    spin_ns: i64,
    stop: &AtomicBool,
    sink: &mut dyn RecordSink,
) -> Result<LoopEnd, ExecError> {
    let mut off = GuardRole::Off;
    run_loop_guarded(exec, schedule, t0_ns, spin_ns, stop, sink, &mut off)
}

/// [`run_loop`] for a workload with a part in the criticality guard: a critical one publishes
/// each job before waiting for its release, a best-effort one is held between pieces.
pub fn run_loop_guarded(
    exec: &mut dyn Executor,
    schedule: &Schedule,
    t0_ns: i64,
    spin_ns: i64,
    stop: &AtomicBool,
    sink: &mut dyn RecordSink,
    guard: &mut GuardRole,
) -> Result<LoopEnd, ExecError> {
    let mut cursor = schedule.cursor();
    // Relative to t0; the first closed-loop job is released at t0.
    let mut prev_end_rel: i64 = 0;
    loop {
        if stop.load(Ordering::Relaxed) {
            return Ok(LoopEnd::Interrupted);
        }
        let index = cursor.index();
        let Some(rel) = cursor.next(prev_end_rel) else {
            return Ok(LoopEnd::Completed);
        };
        // Saturating: validation bounds every release and deadline to 100 days, but a
        // schedule built in code (a max-rate probe at an absurd rate) may still hold a release
        // of i64::MAX (a saturated k·T); the loop then waits for it (until stopped) instead
        // of panicking.
        let release = t0_ns.saturating_add(rel.release_ns);
        let deadline = rel.deadline_ns.map(|d| release.saturating_add(d));
        guard.next_release(index, release, deadline);
        let now = clock::now_ns();
        if now < release {
            if release - now > spin_ns.saturating_add(IDLE_MIN_NS) {
                sink.idle(release);
            }
            if !clock::wait_until_ns(release, spin_ns, stop) {
                return Ok(LoopEnd::Interrupted);
            }
        } else {
            // The job could start now at the earliest; under `skip`, if its deadline is already
            // behind us, running it could only produce a miss and delay the jobs after it.
            if late_decision(schedule.late, now, release, rel.deadline_ns) == LateDecision::Skip {
                sink.record(&JobRecord {
                    index,
                    release_ns: rel.release_ns,
                    start_ns: None,
                    end_ns: None,
                    timeout: true,
                    held_ns: 0,
                });
                continue;
            }
        }
        let (start, end, held_ns) = guard.run_job(exec, index, stop)?;
        let latency = end.saturating_sub(release);
        sink.record(&JobRecord {
            index,
            release_ns: rel.release_ns,
            start_ns: Some(start - t0_ns),
            end_ns: Some(end - t0_ns),
            timeout: is_timeout(latency, rel.deadline_ns),
            held_ns,
        });
        prev_end_rel = end - t0_ns;
    }
}

/// Start lateness of each completed job in ns: actual start − scheduled start, where the
/// scheduled start is `max(r_k, end of the previous completed job)`.
pub fn start_lateness_ns(records: &[JobRecord]) -> Vec<i64> {
    let mut prev_end = i64::MIN;
    let mut out = Vec::with_capacity(records.len());
    for r in records {
        if let (Some(s), Some(e)) = (r.start_ns, r.end_ns) {
            out.push(s - r.release_ns.max(prev_end));
            prev_end = e;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::SpinExecutor;
    use crate::schedule::{End, Pace};
    use isolane_core::spec::LatePolicy;

    fn run(schedule: &Schedule, service_ns: i64) -> (Vec<JobRecord>, i64) {
        run_measuring_steal(schedule, service_ns).0
    }

    /// Above this share of the machine's CPU taken by the hypervisor during a run, a missed
    /// timing bound says more about the host than about the loop (as in tests/common).
    const STEAL_LIMIT: f64 = 0.05;

    /// The run, and the share of the machine's CPU the hypervisor took meanwhile.
    fn run_measuring_steal(schedule: &Schedule, service_ns: i64) -> ((Vec<JobRecord>, i64), f64) {
        let mut exec = SpinExecutor::new(service_ns, 0, 1);
        let stop = AtomicBool::new(false);
        let mut sink = VecSink::with_capacity(capacity_for(schedule, Some(service_ns)), None);
        let steal = clock::StealMeter::start();
        let t0 = clock::now_ns() + 2_000_000;
        let end = run_loop(&mut exec, schedule, t0, 200_000, &stop, &mut sink).unwrap();
        assert_eq!(end, LoopEnd::Completed);
        let wall = clock::now_ns() - t0;
        let steal = steal.fraction().unwrap_or(0.0);
        ((sink.records, wall), steal)
    }

    /// Runs until `ok` holds, 3 tries on an undisturbed machine (runs during which the host took
    /// more than STEAL_LIMIT of the CPU do not count, up to 3 more). Returns the last run and
    /// whether a failure can be blamed on the host.
    fn until_ok(
        schedule: &Schedule,
        service_ns: i64,
        ok: impl Fn(&(Vec<JobRecord>, i64)) -> bool,
    ) -> ((Vec<JobRecord>, i64), bool) {
        let (mut counted, mut extra) = (0, 0);
        loop {
            let (r, steal) = run_measuring_steal(schedule, service_ns);
            let disturbed = steal > STEAL_LIMIT;
            if ok(&r) {
                return (r, false);
            }
            eprintln!(
                "missed a bound; the host took {:.1} % of the CPU",
                steal * 100.0
            );
            if disturbed && extra < 3 {
                extra += 1;
            } else {
                counted += 1;
            }
            if counted >= 3 || (extra >= 3 && disturbed) {
                return (r, disturbed);
            }
        }
    }

    /// Issue 31: `rate_hz = 1e-12` with `jobs = 2` made job 1's release k·T = 1e21 ns,
    /// saturated to i64::MAX, and `t0 + release` overflowed (a panic). Now the loop waits for
    /// it like any release, until stopped.
    #[test]
    fn a_release_beyond_i64_waits_until_stopped_instead_of_overflowing() {
        let s = Schedule {
            pace: Pace::Periodic { period_ns: 1e21 },
            deadline_ns: Some(i64::MAX),
            end: End::Jobs(2),
            late: LatePolicy::Skip,
            phase_ns: 0,
        };
        let mut exec = SpinExecutor::new(10_000, 0, 1);
        let stop = AtomicBool::new(false);
        let mut sink = VecSink::with_capacity(2, None);
        let end = std::thread::scope(|scope| {
            scope.spawn(|| {
                std::thread::sleep(std::time::Duration::from_millis(100));
                stop.store(true, Ordering::Relaxed);
            });
            run_loop(&mut exec, &s, clock::now_ns(), 0, &stop, &mut sink).unwrap()
        });
        assert_eq!(end, LoopEnd::Interrupted);
        assert_eq!(sink.records.len(), 1);
        assert!(!sink.records[0].timeout);
    }

    #[test]
    fn underloaded_periodic_meets_deadlines() {
        let _serial = crate::serial_test_lock();
        let s = Schedule::periodic_jobs(200.0, 40, LatePolicy::Skip);
        // Exact on an idle machine (0 misses); a box saturated by other work can keep the
        // thread off the CPU past the 4 ms of slack now and then, so only most must be on time,
        // and a VM stall of a few hundred ms (measured here) gets more attempts.
        let misses = |r: &(Vec<JobRecord>, i64)| r.0.iter().filter(|j| j.timeout).count();
        let ((recs, wall), host_to_blame) = until_ok(&s, 1_000_000, |r| misses(r) <= 10);
        assert_eq!(recs.len(), 40);
        let missed = misses(&(recs.clone(), wall));
        if host_to_blame {
            eprintln!("INCONCLUSIVE: {missed} misses while the hypervisor took the CPU");
        } else {
            assert!(missed <= 10, "{missed} misses");
        }
        for (k, r) in recs.iter().enumerate() {
            assert_eq!(r.release_ns, k as i64 * 5_000_000, "absolute schedule");
            // A stall past the next release makes `skip` drop a job: that is a miss, not a bug.
            let (Some(s), Some(e)) = (r.start_ns, r.end_ns) else {
                assert!(r.timeout, "a skipped job counts as a timeout");
                continue;
            };
            assert!(s >= r.release_ns, "started before its release");
            assert!(e - s >= 1_000_000, "shorter than the service time");
            assert_eq!(r.timeout, e - r.release_ns > 5_000_000, "timeout ⇔ R > D");
        }
    }

    #[test]
    fn skip_drops_jobs_and_ends_on_schedule() {
        let _serial = crate::serial_test_lock();
        // 2 ms jobs every 1 ms: about half can run, the rest are skipped.
        let s = Schedule {
            pace: Pace::Periodic { period_ns: 1e6 },
            deadline_ns: Some(1_000_000),
            end: End::Jobs(100),
            late: LatePolicy::Skip,
            phase_ns: 0,
        };
        // A VM stall of a few hundred ms (measured here) stretches the wall time: more
        // attempts before the bound counts.
        let ((recs, wall), host_to_blame) = until_ok(&s, 2_000_000, |r| r.1 < 160_000_000);
        assert_eq!(recs.len(), 100);
        let skipped = recs.iter().filter(|r| r.start_ns.is_none()).count();
        assert!(skipped >= 40, "{skipped} skipped");
        assert!(recs.iter().all(|r| r.timeout));
        // 100 ms of schedule, plus at most one job in flight and some slack for a busy box.
        if host_to_blame {
            eprintln!("INCONCLUSIVE: wall {wall} ns while the hypervisor took the CPU");
        } else {
            assert!(wall < 160_000_000, "wall {wall} ns");
        }
    }

    #[test]
    fn queue_runs_every_job_and_backlog_grows() {
        let _serial = crate::serial_test_lock();
        let s = Schedule {
            pace: Pace::Periodic { period_ns: 1e6 },
            deadline_ns: Some(1_000_000),
            end: End::Jobs(50),
            late: LatePolicy::Queue,
            phase_ns: 0,
        };
        let (recs, _) = run(&s, 2_000_000);
        assert!(recs.iter().all(|r| r.end_ns.is_some()));
        let lat = |r: &JobRecord| r.latency_ns().unwrap();
        assert!(lat(&recs[49]) > lat(&recs[0]) + 30_000_000);
        // Back to back: each job starts when the previous ends.
        for w in recs.windows(2) {
            assert!(w[1].start_ns.unwrap() >= w[0].end_ns.unwrap());
        }
    }

    #[test]
    fn stop_interrupts_promptly() {
        let _serial = crate::serial_test_lock();
        // One job every 10 s: the stop at 100 ms must end the wait for the second release, not
        // only the loop after it (5 s of room for a stalled VM).
        let s = Schedule::periodic_jobs(0.1, 100, LatePolicy::Skip);
        let mut exec = SpinExecutor::new(1000, 0, 1);
        let stop = AtomicBool::new(false);
        let mut sink = VecSink::with_capacity(8, None);
        std::thread::scope(|sc| {
            sc.spawn(|| {
                std::thread::sleep(std::time::Duration::from_millis(100));
                stop.store(true, Ordering::Relaxed);
            });
            let t0 = clock::now_ns();
            let end = run_loop(&mut exec, &s, t0, 0, &stop, &mut sink).unwrap();
            assert_eq!(end, LoopEnd::Interrupted);
            assert!(clock::now_ns() - t0 < 5_000_000_000);
        });
        assert_eq!(sink.records.len(), 1);
    }

    #[test]
    fn lateness_uses_previous_end_when_backlogged() {
        let recs = [
            JobRecord {
                index: 0,
                release_ns: 0,
                start_ns: Some(10),
                end_ns: Some(500),
                timeout: false,
                held_ns: 0,
            },
            JobRecord {
                index: 1,
                release_ns: 100,
                start_ns: Some(520),
                end_ns: Some(900),
                timeout: true,
                held_ns: 0,
            },
            JobRecord {
                index: 2,
                release_ns: 200,
                start_ns: None,
                end_ns: None,
                timeout: true,
                held_ns: 0,
            },
            JobRecord {
                index: 3,
                release_ns: 1000,
                start_ns: Some(1003),
                end_ns: Some(1100),
                timeout: false,
                held_ns: 0,
            },
        ];
        assert_eq!(start_lateness_ns(&recs), vec![10, 20, 3]);
    }
}
