//! What a workload's release-loop thread cost the CPU (issue 17: paper 001 found scheduling and
//! context switches to be the bottleneck on Jetson): CPU time, time spent runnable but waiting
//! for a core (run-queue delay), voluntary and involuntary context switches. Read from
//! /proc/thread-self (Linux; `schedstat` needs the kernel's scheduler statistics, present in
//! the usual distribution kernels), at t0 and at the loop's end.

use serde::{Deserialize, Serialize};

/// Counters of the calling thread, or their difference over a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadCpu {
    /// Time on a CPU (ns).
    pub cpu_ns: u64,
    /// Time runnable but waiting for a CPU (ns).
    pub runqueue_ns: u64,
    /// Switches away because the thread blocked or slept.
    pub voluntary_switches: u64,
    /// Switches away because the scheduler preempted it.
    pub involuntary_switches: u64,
}

impl ThreadCpu {
    /// The calling thread's counters; `None` where /proc does not say (not Linux, no
    /// scheduler statistics).
    pub fn now() -> Option<ThreadCpu> {
        let sched = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
        let status = std::fs::read_to_string("/proc/thread-self/status").ok()?;
        parse(&sched, &status)
    }

    /// The counters from `earlier` to `self` (saturating: a counter never goes back).
    pub fn since(&self, earlier: &ThreadCpu) -> ThreadCpu {
        ThreadCpu {
            cpu_ns: self.cpu_ns.saturating_sub(earlier.cpu_ns),
            runqueue_ns: self.runqueue_ns.saturating_sub(earlier.runqueue_ns),
            voluntary_switches: self
                .voluntary_switches
                .saturating_sub(earlier.voluntary_switches),
            involuntary_switches: self
                .involuntary_switches
                .saturating_sub(earlier.involuntary_switches),
        }
    }
}

/// `schedstat` is "<run ns> <wait ns> <timeslices>"; `status` has the two switch counters.
fn parse(schedstat: &str, status: &str) -> Option<ThreadCpu> {
    let mut f = schedstat.split_whitespace().map(|v| v.parse::<u64>().ok());
    let (cpu_ns, runqueue_ns) = (f.next()??, f.next()??);
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim_start_matches(':').trim().parse::<u64>().ok())
    };
    Some(ThreadCpu {
        cpu_ns,
        runqueue_ns,
        voluntary_switches: field("voluntary_ctxt_switches")?,
        involuntary_switches: field("nonvoluntary_ctxt_switches")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_procfs_and_counts_a_busy_thread() {
        let t = parse(
            "123456 7890 12\n",
            "Name:\tx\nvoluntary_ctxt_switches:\t5\nnonvoluntary_ctxt_switches:\t2\n",
        )
        .unwrap();
        assert_eq!(
            t,
            ThreadCpu {
                cpu_ns: 123456,
                runqueue_ns: 7890,
                voluntary_switches: 5,
                involuntary_switches: 2
            }
        );
        assert_eq!(parse("x y", "").map(|_| ()), None);
        // This thread's CPU time grows while it works (however busy the machine: it works until
        // the counter says 10 ms, within a generous wall-clock bound), and a sleep is a
        // voluntary switch.
        let a = ThreadCpu::now().expect("Linux with scheduler statistics");
        let give_up = crate::clock::now_ns() + 30_000_000_000;
        let mut d = ThreadCpu::default();
        while d.cpu_ns < 10_000_000 && crate::clock::now_ns() < give_up {
            d = ThreadCpu::now().unwrap().since(&a);
        }
        assert!(d.cpu_ns >= 10_000_000, "{d:?}");
        std::thread::sleep(std::time::Duration::from_millis(1));
        let d = ThreadCpu::now().unwrap().since(&a);
        assert!(d.voluntary_switches >= 1, "{d:?}");
    }
}
