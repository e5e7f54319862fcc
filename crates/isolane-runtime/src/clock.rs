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

/// /proc/stat's steal counter (summed over all CPUs, in ns) and the number of CPUs it sums
/// over, from one read of the file.
fn read_steal() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    // cpu user nice system idle iowait irq softirq steal ...
    let jiffies: u64 = line.split_whitespace().nth(8)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions; it returns -1 for an unknown name.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let cpus = stat
        .lines()
        .filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
        .count() as u64;
    (hz > 0).then(|| {
        (
            jiffies.saturating_mul(1_000_000_000) / hz as u64,
            cpus.max(1),
        )
    })
}

/// CPU time the hypervisor has taken from this machine's vCPUs since boot ("steal", summed over
/// all CPUs, from /proc/stat), in ns; `None` where the kernel does not report it. On a shared VM
/// a vCPU held off by the host looks, from inside, like a thread that was late for no reason:
/// the difference of two readings says how much of an interval the machine did not have.
pub fn cpu_steal_ns() -> Option<u64> {
    read_steal().map(|(ns, _)| ns)
}

/// Number of CPUs that /proc/stat lists (what `cpu_steal_ns` is summed over), at least 1.
pub fn online_cpus() -> u64 {
    read_steal().map_or(1, |(_, cpus)| cpus)
}

/// How much of the machine's CPU the hypervisor takes over an interval: started where the
/// interval starts, read where it ends.
#[derive(Debug, Clone, Copy)]
pub struct StealMeter {
    start_ns: i64,
    steal_ns: Option<u64>,
}

impl StealMeter {
    pub fn start() -> StealMeter {
        StealMeter {
            start_ns: now_ns(),
            steal_ns: cpu_steal_ns(),
        }
    }

    /// Share of the machine's CPU time (all CPUs) taken since `start`, in [0, 1] (the counter
    /// ticks in 10 ms jiffies, so a very short interval could otherwise read above 1); `None`
    /// where the kernel does not report steal.
    pub fn fraction(&self) -> Option<f64> {
        let before = self.steal_ns?;
        let (after, cpus) = read_steal()?;
        let wall = (now_ns() - self.start_ns).max(1) as f64;
        Some((after.saturating_sub(before) as f64 / (wall * cpus as f64)).min(1.0))
    }

    /// `fraction` in %.
    pub fn pct(&self) -> Option<f64> {
        self.fraction().map(|f| 100.0 * f)
    }
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
    fn steal_is_read_and_never_decreases() {
        // Linux reports steal (0 on bare metal); the counter is monotonic.
        let a = cpu_steal_ns().expect("/proc/stat has a steal column");
        let b = cpu_steal_ns().unwrap();
        assert!(b >= a);
        assert!(online_cpus() >= 1);
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
