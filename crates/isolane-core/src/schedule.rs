//! Schedule math of DESIGN.md ("Timing semantics"), as pure functions. Times are ns since t0.

use crate::spec::LatePolicy;

/// Seconds → whole nanoseconds, rounded; saturates instead of wrapping on absurd inputs.
pub fn secs_to_ns(s: f64) -> i64 {
    // `as` saturates for floats (and maps NaN to 0), which is what we want here.
    (s * 1e9).round() as i64
}

/// Period in (fractional) ns of a rate in Hz. Kept fractional: rounding the period once would
/// make the schedule drift by k × rounding error.
pub fn period_ns(rate_hz: f64) -> f64 {
    1e9 / rate_hz
}

/// Release of job k, `r_k = k·T`, computed from k each time (never accumulated) so there is no
/// drift. Exact to the ns while k·T < 2^53 ns (104 days).
pub fn release_ns(k: u64, period_ns: f64) -> i64 {
    (k as f64 * period_ns).round() as i64
}

/// Jobs released in `[0, duration)` at `rate_hz`: the k with `k·T < duration`. A product that
/// is an integer up to float noise counts as one (5 s at 100 Hz is 500 jobs, not 501; 0.3 s at
/// 10 Hz is 3, although 0.3 × 10 = 3.0000000000000004).
pub fn jobs_in(duration_s: f64, rate_hz: f64) -> u64 {
    let n = duration_s * rate_hz;
    if n.is_nan() || n <= 0.0 {
        return 0;
    }
    let r = n.round();
    if (n - r).abs() <= 1e-9 * n.max(1.0) {
        r as u64
    } else {
        n.ceil() as u64
    }
}

/// When a job may start: `max(r_k, end of the previous job that ran)`.
pub fn scheduled_start_ns(release_ns: i64, prev_end_ns: Option<i64>) -> i64 {
    prev_end_ns.map_or(release_ns, |e| e.max(release_ns))
}

/// Timeout (deadline miss) ⇔ `R_k > D`. No deadline: never.
pub fn is_timeout(latency_ns: i64, deadline_ns: Option<i64>) -> bool {
    deadline_ns.is_some_and(|d| latency_ns > d)
}

/// What the release loop does with a job that could start at `now_ns`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LateDecision {
    Run,
    /// Not run; counts as a timeout.
    Skip,
}

/// `skip`: a job whose absolute deadline `r_k + D` has passed before it could start is not run.
/// `queue`, or no deadline: always run.
pub fn late_decision(
    policy: LatePolicy,
    now_ns: i64,
    release_ns: i64,
    deadline_ns: Option<i64>,
) -> LateDecision {
    match (policy, deadline_ns) {
        (LatePolicy::Skip, Some(d)) if now_ns > release_ns.saturating_add(d) => LateDecision::Skip,
        _ => LateDecision::Run,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_do_not_drift() {
        let t = period_ns(300.0); // 3_333_333.33… ns
        assert_eq!(release_ns(0, t), 0);
        assert_eq!(release_ns(1, t), 3_333_333);
        assert_eq!(release_ns(2, t), 6_666_667);
        assert_eq!(release_ns(3, t), 10_000_000);
        // One hour at 300 Hz lands exactly on the hour.
        assert_eq!(release_ns(1_080_000, t), 3_600_000_000_000);
    }

    #[test]
    fn jobs_in_duration() {
        assert_eq!(jobs_in(5.0, 100.0), 500);
        assert_eq!(jobs_in(0.3, 10.0), 3);
        assert_eq!(jobs_in(0.31, 10.0), 4); // r_3 = 0.3 s < 0.31 s
        assert_eq!(jobs_in(1.0, 3.0), 3);
        assert_eq!(jobs_in(0.0, 100.0), 0);
        assert_eq!(jobs_in(f64::NAN, 100.0), 0);
    }

    #[test]
    fn start_timeout_and_skip() {
        assert_eq!(scheduled_start_ns(100, None), 100);
        assert_eq!(scheduled_start_ns(100, Some(50)), 100);
        assert_eq!(scheduled_start_ns(100, Some(150)), 150);
        assert!(!is_timeout(10, Some(10)));
        assert!(is_timeout(11, Some(10)));
        assert!(!is_timeout(i64::MAX, None));
        use LateDecision::*;
        assert_eq!(late_decision(LatePolicy::Skip, 110, 100, Some(10)), Run);
        assert_eq!(late_decision(LatePolicy::Skip, 111, 100, Some(10)), Skip);
        assert_eq!(late_decision(LatePolicy::Queue, 1_000, 100, Some(10)), Run);
        assert_eq!(late_decision(LatePolicy::Skip, 1_000, 100, None), Run);
        assert_eq!(
            late_decision(LatePolicy::Skip, i64::MAX, i64::MAX - 1, Some(i64::MAX)),
            Run
        );
    }
}
