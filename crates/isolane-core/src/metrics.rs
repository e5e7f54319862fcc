//! Per-workload metrics with exactly the names of DESIGN.md ("Metrics").
//!
//! Percentiles come from an HDR histogram (3 significant digits, ns resolution, auto-resizing);
//! min, max, mean and std are exact. Latency is over completed jobs only; a skipped job counts as
//! a timeout. Every statistic of an empty set is `None` (`null` in JSON), never a panic or a 0
//! that would read as a measurement.

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::job::JobRecord;
use crate::schedule::{is_timeout, scheduled_start_ns};

/// One workload's results, serialised into summary.json under these names.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkloadMetrics {
    /// Jobs released (warm-up excluded).
    pub jobs: u64,
    /// Jobs that ran to completion.
    pub completed: u64,
    /// Deadline misses: completed with `R_k > D`, plus skipped jobs.
    pub timeouts: u64,
    /// `100 × timeouts / jobs`; 0 when there were no jobs.
    pub timeout_pct: f64,
    pub latency_ms: LatencyStats,
    /// Images per second: `completed × batch / wall time`.
    pub throughput_ips: f64,
    pub start_lateness_us: LatenessStats,
    /// Filled in by the runtime when a GPU reports it.
    pub gpu_memory_mib: Option<f64>,
    pub energy_j: Option<f64>,
    /// `energy_j / (completed × batch)`.
    pub j_per_image: Option<f64>,
}

/// Response-time statistics in ms, over completed jobs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LatencyStats {
    pub mean: Option<f64>,
    /// Sample standard deviation (n − 1); 0 for a single job.
    pub std: Option<f64>,
    pub min: Option<f64>,
    pub p10: Option<f64>,
    pub p50: Option<f64>,
    pub p90: Option<f64>,
    pub p95: Option<f64>,
    pub p99: Option<f64>,
    pub p999: Option<f64>,
    pub max: Option<f64>,
    /// `max − p95` (paper 004: how far the outliers stretch).
    pub tail: Option<f64>,
    /// `p90 − p10` (paper 004: how concentrated the common latencies are).
    pub flatness: Option<f64>,
}

/// Start lateness (actual start − `max(r_k, end of the previous job)`) in µs, over jobs that ran.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LatenessStats {
    pub p50: Option<f64>,
    pub p99: Option<f64>,
    pub max: Option<f64>,
}

impl WorkloadMetrics {
    /// Adds the energy the workload used and derives `j_per_image`.
    pub fn set_energy(&mut self, energy_j: f64, batch: u32) {
        self.energy_j = Some(energy_j);
        let images = self.completed * u64::from(batch);
        self.j_per_image = (images > 0).then(|| energy_j / images as f64);
    }
}

/// Exact mean and variance in one pass (Welford), without the cancellation of Σx² − (Σx)²/n.
#[derive(Debug, Clone, Default)]
struct Welford {
    n: u64,
    mean: f64,
    m2: f64,
}

impl Welford {
    fn push(&mut self, x: f64) {
        self.n += 1;
        let d = x - self.mean;
        self.mean += d / self.n as f64;
        self.m2 += d * (x - self.mean);
    }
    fn mean(&self) -> Option<f64> {
        (self.n > 0).then_some(self.mean)
    }
    fn std(&self) -> Option<f64> {
        match self.n {
            0 => None,
            1 => Some(0.0),
            n => Some((self.m2 / (n - 1) as f64).sqrt()),
        }
    }
}

/// A histogram plus exact extremes of ns values.
#[derive(Debug, Clone)]
struct Dist {
    hist: Histogram<u64>,
    min: i64,
    max: i64,
}

impl Dist {
    fn new() -> Dist {
        // 3 significant digits is within the crate's 0..=5 range, so this cannot fail; with
        // auto-resize the histogram grows to whatever values arrive.
        let mut hist =
            Histogram::<u64>::new(3).expect("3 significant digits is a valid HDR precision");
        hist.auto(true);
        Dist {
            hist,
            min: i64::MAX,
            max: i64::MIN,
        }
    }

    fn record(&mut self, ns: i64) {
        self.min = self.min.min(ns);
        self.max = self.max.max(ns);
        // The histogram holds non-negative values; a negative one (a clock hiccup) is kept
        // exactly in min and counted as 0 for the percentiles.
        // `record` auto-resizes; `saturating_record` would clamp to the current (tiny) range.
        // It can only fail beyond the histogram's absolute limit, where clamping is right.
        let v = ns.max(0) as u64;
        if self.hist.record(v).is_err() {
            self.hist.saturating_record(v);
        }
    }

    fn is_empty(&self) -> bool {
        self.hist.is_empty()
    }

    /// Percentile in ns, clamped into the exact [min, max] so that HDR rounding can never put
    /// p99.9 above max (a negative tail would be nonsense).
    fn quantile(&self, q: f64) -> Option<f64> {
        if self.is_empty() {
            return None;
        }
        let v = self.hist.value_at_quantile(q) as f64;
        Some(v.clamp(self.min as f64, self.max as f64))
    }
}

/// Streaming computation of [`WorkloadMetrics`]: feed records in index order, then `finish`.
#[derive(Debug, Clone)]
pub struct MetricsAccumulator {
    batch: u32,
    deadline_ns: Option<i64>,
    jobs: u64,
    completed: u64,
    timeouts: u64,
    welford: Welford,
    latency: Dist,
    lateness: Dist,
    prev_end_ns: Option<i64>,
}

impl MetricsAccumulator {
    /// `deadline_ns`: the relative deadline D (`None` = never times out, e.g. closed loop).
    pub fn new(batch: u32, deadline_ns: Option<i64>) -> MetricsAccumulator {
        MetricsAccumulator {
            batch,
            deadline_ns,
            jobs: 0,
            completed: 0,
            timeouts: 0,
            welford: Welford::default(),
            latency: Dist::new(),
            lateness: Dist::new(),
            prev_end_ns: None,
        }
    }

    /// Add the next job (records must come in index order: start lateness depends on the end of
    /// the previous job that ran).
    ///
    /// A job is a timeout if the runtime flagged it, if it did not complete, or if `R_k > D`:
    /// recomputing the rule keeps the metric to DESIGN.md even if a flag were set differently.
    pub fn record(&mut self, job: &JobRecord) {
        self.jobs += 1;
        let mut timeout = job.timeout;
        match job.latency_ns() {
            Some(lat) => {
                self.completed += 1;
                timeout |= is_timeout(lat, self.deadline_ns);
                self.welford.push(lat as f64);
                self.latency.record(lat);
            }
            None => timeout = true,
        }
        if timeout {
            self.timeouts += 1;
        }
        if let Some(start) = job.start_ns {
            let sched = scheduled_start_ns(job.release_ns, self.prev_end_ns);
            self.lateness.record(start - sched);
        }
        if job.end_ns.is_some() {
            self.prev_end_ns = job.end_ns;
        }
    }

    /// The metrics so far; `wall_s` is the workload's wall time for throughput.
    pub fn finish(&self, wall_s: f64) -> WorkloadMetrics {
        let ms = |ns: Option<f64>| ns.map(|v| v / 1e6);
        let lat = &self.latency;
        let (p10, p50, p90, p95, p99, p999) = (
            lat.quantile(0.10),
            lat.quantile(0.50),
            lat.quantile(0.90),
            lat.quantile(0.95),
            lat.quantile(0.99),
            lat.quantile(0.999),
        );
        let (min, max) = if lat.is_empty() {
            (None, None)
        } else {
            (Some(lat.min as f64), Some(lat.max as f64))
        };
        let latency_ms = LatencyStats {
            mean: ms(self.welford.mean()),
            std: ms(self.welford.std()),
            min: ms(min),
            p10: ms(p10),
            p50: ms(p50),
            p90: ms(p90),
            p95: ms(p95),
            p99: ms(p99),
            p999: ms(p999),
            max: ms(max),
            tail: ms(max.zip(p95).map(|(a, b)| a - b)),
            flatness: ms(p90.zip(p10).map(|(a, b)| a - b)),
        };
        let us = |ns: Option<f64>| ns.map(|v| v / 1e3);
        let late = &self.lateness;
        let start_lateness_us = LatenessStats {
            p50: us(late.quantile(0.50)),
            p99: us(late.quantile(0.99)),
            max: us((!late.is_empty()).then_some(late.max as f64)),
        };
        let images = self.completed as f64 * f64::from(self.batch);
        WorkloadMetrics {
            jobs: self.jobs,
            completed: self.completed,
            timeouts: self.timeouts,
            timeout_pct: if self.jobs == 0 {
                0.0
            } else {
                100.0 * self.timeouts as f64 / self.jobs as f64
            },
            latency_ms,
            throughput_ips: if wall_s > 0.0 { images / wall_s } else { 0.0 },
            start_lateness_us,
            gpu_memory_mib: None,
            energy_j: None,
            j_per_image: None,
        }
    }
}

/// Metrics of a whole run of one workload (records in index order).
pub fn workload_metrics(
    records: &[JobRecord],
    batch: u32,
    wall_s: f64,
    deadline_ns: Option<i64>,
) -> WorkloadMetrics {
    let mut acc = MetricsAccumulator::new(batch, deadline_ns);
    for r in records {
        acc.record(r);
    }
    acc.finish(wall_s)
}

/// The records released in `[from_ns, to_ns)`, e.g. one step of an interferer's ramp in the
/// isolation experiment. Records must be in index (hence release) order.
pub fn released_between(records: &[JobRecord], from_ns: i64, to_ns: i64) -> &[JobRecord] {
    let a = records.partition_point(|r| r.release_ns < from_ns);
    let b = records.partition_point(|r| r.release_ns < to_ns).max(a);
    &records[a..b]
}

/// Completed jobs' response times in ms, e.g. for [`crate::stats::mann_whitney_u`].
pub fn latencies_ms(records: &[JobRecord]) -> Vec<f64> {
    records
        .iter()
        .filter_map(|r| r.latency_ns())
        .map(|ns| ns as f64 / 1e6)
        .collect()
}

/// Execution times (end − start) of completed jobs, ms: what a job itself took, without the
/// queueing a response time adds. The interference matrix compares these, since a victim's
/// stretch beside a neighbour is the stretch of its own work.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct ExecTimes {
    pub jobs: u64,
    pub mean: Option<f64>,
    pub p50: Option<f64>,
    pub p99: Option<f64>,
    /// The 99.9th percentile: the tail a 0.1 % timeout budget must fit.
    #[serde(default)]
    pub p999: Option<f64>,
    pub max: Option<f64>,
}

/// [`ExecTimes`] of `records`, exact (sorted, nearest rank).
pub fn exec_times(records: &[JobRecord]) -> ExecTimes {
    let mut ms: Vec<f64> = records
        .iter()
        .filter_map(|r| Some((r.end_ns? - r.start_ns?) as f64 / 1e6))
        .collect();
    ms.sort_by(f64::total_cmp);
    let rank = |q: f64| -> Option<f64> {
        let n = ms.len();
        (n > 0).then(|| ms[((q * n as f64).ceil() as usize).clamp(1, n) - 1])
    };
    ExecTimes {
        jobs: ms.len() as u64,
        mean: (!ms.is_empty()).then(|| ms.iter().sum::<f64>() / ms.len() as f64),
        p50: rank(0.5),
        p99: rank(0.99),
        p999: rank(0.999),
        max: ms.last().copied(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_times_are_end_minus_start_by_nearest_rank() {
        // 100 jobs taking 1..=100 ms, each released 50 ms before it starts (queueing that
        // must not count), plus a skipped one.
        let mut rs: Vec<JobRecord> = (1..=100)
            .map(|i| done(i as u64, 0, 50_000_000, 50_000_000 + i * 1_000_000))
            .collect();
        rs.push(skipped(101, 0));
        let e = exec_times(&rs);
        assert_eq!(e.jobs, 100);
        assert_eq!(e.p50, Some(50.0));
        assert_eq!(e.p99, Some(99.0));
        assert_eq!(e.max, Some(100.0));
        assert_eq!(e.mean, Some(50.5));
        assert_eq!(exec_times(&[]), ExecTimes::default());
    }

    fn done(index: u64, release: i64, start: i64, end: i64) -> JobRecord {
        JobRecord {
            index,
            release_ns: release,
            start_ns: Some(start),
            end_ns: Some(end),
            timeout: false,
            held_ns: 0,
        }
    }

    fn skipped(index: u64, release: i64) -> JobRecord {
        JobRecord {
            index,
            release_ns: release,
            start_ns: None,
            end_ns: None,
            timeout: true,
            held_ns: 0,
        }
    }

    fn close(a: Option<f64>, b: f64, tol: f64) -> bool {
        a.is_some_and(|a| (a - b).abs() <= tol)
    }

    #[test]
    fn json_names_are_the_design_names() {
        let m = workload_metrics(&[], 1, 1.0, Some(10));
        let v = serde_json::to_value(&m).unwrap();
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(|s| s.as_str()).collect();
        let mut expected = vec![
            "jobs",
            "completed",
            "timeouts",
            "timeout_pct",
            "latency_ms",
            "throughput_ips",
            "start_lateness_us",
            "gpu_memory_mib",
            "energy_j",
            "j_per_image",
        ];
        let mut keys_sorted = keys.clone();
        keys_sorted.sort();
        expected.sort();
        assert_eq!(keys_sorted, expected);
        let mut lat: Vec<String> = v["latency_ms"]
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect();
        lat.sort();
        let mut exp_lat = [
            "mean", "std", "min", "p10", "p50", "p90", "p95", "p99", "p999", "max", "tail",
            "flatness",
        ];
        exp_lat.sort();
        assert_eq!(lat, exp_lat);
        let mut sl: Vec<String> = v["start_lateness_us"]
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect();
        sl.sort();
        assert_eq!(sl, ["max", "p50", "p99"]);
        // Unknowns are null, not absent and not 0.
        assert!(v["latency_ms"]["p50"].is_null());
        assert!(v["energy_j"].is_null());
        assert!(v["j_per_image"].is_null());
    }

    #[test]
    fn empty_set_gives_nulls_not_panics() {
        let m = workload_metrics(&[skipped(0, 0), skipped(1, 10)], 1, 1.0, Some(5));
        assert_eq!(m.jobs, 2);
        assert_eq!(m.completed, 0);
        assert_eq!(m.timeouts, 2);
        assert_eq!(m.timeout_pct, 100.0);
        assert_eq!(m.latency_ms, LatencyStats::default());
        assert_eq!(m.start_lateness_us, LatenessStats::default());
        assert_eq!(m.throughput_ips, 0.0);
        let m = workload_metrics(&[], 4, 0.0, None);
        assert_eq!((m.jobs, m.timeout_pct, m.throughput_ips), (0, 0.0, 0.0));
    }

    #[test]
    fn exact_stats_and_percentiles() {
        // 1000 jobs at 100 Hz with latencies 1.000, 1.001, …, 1.999 ms (exact in ns).
        let period = 10_000_000;
        let recs: Vec<JobRecord> = (0..1000)
            .map(|k| {
                let r = k as i64 * period;
                done(k, r, r, r + 1_000_000 + k as i64 * 1_000)
            })
            .collect();
        let m = workload_metrics(&recs, 2, 10.0, Some(period));
        assert_eq!((m.jobs, m.completed, m.timeouts), (1000, 1000, 0));
        assert_eq!(m.timeout_pct, 0.0);
        assert_eq!(m.throughput_ips, 200.0);
        let l = &m.latency_ms;
        assert!(close(l.mean, 1.4995, 1e-12));
        // Sample std of 0..999 µs steps: sqrt(1000·1001/12) µs.
        assert!(close(l.std, (1000.0f64 * 1001.0 / 12.0).sqrt() / 1e3, 1e-9));
        assert_eq!(l.min, Some(1.0));
        assert_eq!(l.max, Some(1.999));
        // HDR with 3 significant digits: within 0.1 %.
        for (p, want) in [
            (l.p10, 1.099),
            (l.p50, 1.499),
            (l.p90, 1.899),
            (l.p95, 1.949),
            (l.p99, 1.989),
        ] {
            assert!(close(p, want, want * 1e-3), "{p:?} vs {want}");
        }
        assert!(l.p999.unwrap() <= l.max.unwrap());
        assert!(close(l.tail, 1.999 - l.p95.unwrap(), 1e-12));
        assert!(close(l.flatness, l.p90.unwrap() - l.p10.unwrap(), 1e-12));
        assert!(l.tail.unwrap() >= 0.0);
        assert_eq!(m.start_lateness_us.max, Some(0.0));
    }

    #[test]
    fn timeouts_are_recomputed_from_the_deadline() {
        let recs = [
            done(0, 0, 0, 10),      // R = 10 = D: on time
            done(1, 100, 100, 111), // R = 11 > D
            skipped(2, 200),
        ];
        let m = workload_metrics(&recs, 1, 1.0, Some(10));
        assert_eq!((m.jobs, m.completed, m.timeouts), (3, 2, 2));
        assert!((m.timeout_pct - 200.0 / 3.0).abs() < 1e-12);
        // Closed loop without deadline: only skipped jobs (none here) time out.
        let m = workload_metrics(&recs[..2], 1, 1.0, None);
        assert_eq!(m.timeouts, 0);
    }

    #[test]
    fn start_lateness_is_relative_to_max_of_release_and_previous_end() {
        let recs = [
            done(0, 0, 5_000, 20_000),       // scheduled 0 → 5 µs late
            done(1, 10_000, 21_000, 30_000), // previous ended at 20 µs → 1 µs late
            skipped(2, 20_000),              // no start
            done(3, 40_000, 40_000, 45_000), // previous that ran ended at 30 µs < r_3 → 0
        ];
        let m = workload_metrics(&recs, 1, 1.0, Some(100_000));
        assert_eq!(m.start_lateness_us.max, Some(5.0));
        assert!(close(m.start_lateness_us.p50, 1.0, 1e-3));
        // Latency counts the queueing delay: job 1 is measured from its release, not its start.
        assert_eq!(m.latency_ms.max, Some(0.020));
    }

    #[test]
    fn streaming_equals_slice_and_energy() {
        let recs: Vec<JobRecord> = (0..50)
            .map(|k| {
                done(
                    k,
                    k as i64 * 1000,
                    k as i64 * 1000,
                    k as i64 * 1000 + 700 + k as i64,
                )
            })
            .collect();
        let mut acc = MetricsAccumulator::new(3, Some(1000));
        recs.iter().for_each(|r| acc.record(r));
        let mut m = acc.finish(2.0);
        assert_eq!(m, workload_metrics(&recs, 3, 2.0, Some(1000)));
        m.set_energy(15.0, 3);
        assert_eq!(m.energy_j, Some(15.0));
        assert_eq!(m.j_per_image, Some(0.1));
        assert_eq!(latencies_ms(&recs).len(), 50);
        let w = released_between(&recs, 10_000, 20_000);
        assert_eq!((w.len(), w[0].index), (10, 10));
        assert!(released_between(&recs, 20_000, 10_000).is_empty());
    }
}
