//! The monotonic clock every timestamp of a run is taken on.
//!
//! `CLOCK_MONOTONIC` is one clock for the whole machine on Linux, so an absolute time taken in
//! the coordinator means the same instant in a worker process: that is how `t0` crosses the
//! process boundary (DESIGN.md, "Timing semantics").

use std::time::Duration;

/// Nanoseconds on `CLOCK_MONOTONIC`.
pub fn now_ns() -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC is always supported on Linux,
    // so the call cannot fail and leaves `ts` fully written.
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts);
    }
    // time_t and c_long are i64 on 64-bit Linux but not everywhere.
    #[allow(clippy::useless_conversion)]
    let ns = i64::from(ts.tv_sec) * 1_000_000_000 + i64::from(ts.tv_nsec);
    ns
}

/// Sleeps until the absolute monotonic time `t_ns` (or returns at once if it has passed).
/// Absolute sleeps do not accumulate the error of relative ones across a long schedule.
pub fn sleep_until_ns(t_ns: i64) {
    if t_ns <= now_ns() {
        return;
    }
    let ts = libc::timespec {
        tv_sec: (t_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (t_ns % 1_000_000_000) as libc::c_long,
    };
    loop {
        // SAFETY: `ts` is a valid timespec; a null remainder is allowed with TIMER_ABSTIME.
        let rc = unsafe {
            libc::clock_nanosleep(
                libc::CLOCK_MONOTONIC,
                libc::TIMER_ABSTIME,
                &ts,
                std::ptr::null_mut(),
            )
        };
        // EINTR (a signal such as Ctrl-C) just means: check the time again.
        if rc != libc::EINTR {
            break;
        }
    }
}

/// Busy-waits until `t_ns`. Used for the last stretch before a release, where a sleep's wake-up
/// latency would show up as start lateness, and for the synthetic spin workload.
#[inline]
pub fn spin_until_ns(t_ns: i64) {
    while now_ns() < t_ns {
        std::hint::spin_loop();
    }
}

/// Waits until `t_ns`: sleeps until `spin_ns` before it, then spins. Returns early (false) when
/// `stop` becomes true; long sleeps are cut into slices so that a stop is noticed quickly.
pub fn wait_until_ns(t_ns: i64, spin_ns: i64, stop: &std::sync::atomic::AtomicBool) -> bool {
    use std::sync::atomic::Ordering;
    const SLICE_NS: i64 = 20_000_000;
    loop {
        if stop.load(Ordering::Relaxed) {
            return false;
        }
        let now = now_ns();
        let sleep_to = t_ns - spin_ns;
        if now >= sleep_to {
            break;
        }
        sleep_until_ns(sleep_to.min(now + SLICE_NS));
    }
    spin_until_ns(t_ns);
    true
}

pub fn ns_to_duration(ns: i64) -> Duration {
    Duration::from_nanos(ns.max(0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_is_monotonic_and_sleep_reaches_target() {
        let a = now_ns();
        let target = a + 2_000_000;
        sleep_until_ns(target);
        let b = now_ns();
        assert!(b >= target, "woke {} ns early", target - b);
    }

    #[test]
    fn wait_stops_early_when_asked() {
        let stop = std::sync::atomic::AtomicBool::new(true);
        let start = now_ns();
        // A 60 s wait that must end at once; 10 s of room for a stalled VM.
        assert!(!wait_until_ns(start + 60_000_000_000, 0, &stop));
        assert!(now_ns() - start < 10_000_000_000);
    }
}
