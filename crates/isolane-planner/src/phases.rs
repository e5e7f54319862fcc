//! Release phases (`plan --auto --phases stagger`, docs/planner.md): workloads at rates that
//! repeat together are released out of phase, so that their jobs overlap as little as the rates
//! allow. Partitions keep the SMs apart, not the copy engine, the memory bandwidth or the
//! caches: on the H100 two cameras released with resnet50 at batch 64 waited 0.65–0.87 ms for
//! it (its 38.5 MB input copy goes first), and 0.22–0.33 ms released 1.5 ms later
//! (`results/h100-planner/session16/`).
//!
//! The search works on one hyperperiod (the time after which every workload's releases repeat)
//! in bins of [`BIN_MS`]: workloads with a phase of their own are placed first; then, busiest
//! (busy time over period) first, each takes the phase whose jobs overlap least the jobs placed
//! so far (of equals, the middle of the widest run: as far from the neighbours as they allow). Where
//! that leaves any workload overlapping more than in phase (more work than time), none is
//! moved. A job occupies its busy time (its p99 alone in its
//! partition) and a guard after it, for a job that runs longer.

/// The phase search's resolution (ms).
pub const BIN_MS: f64 = 0.01;

/// The longest hyperperiod searched (ms): rates that repeat together less often than this are
/// left in phase (see [`StaggerError`]).
pub const MAX_HYPERPERIOD_MS: f64 = 1000.0;

/// One workload's periodic jobs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Periodic {
    pub rate_hz: f64,
    /// How long one job keeps the GPU busy (ms): its p99 alone in its partition.
    pub busy_ms: f64,
    /// A phase the scenario gives (ms): kept, and its jobs placed first.
    pub fixed_ms: Option<f64>,
}

/// The phases chosen, and how much the jobs still overlap.
#[derive(Debug, Clone, PartialEq)]
pub struct Staggered {
    /// Per workload, in the order given (ms, in `[0, period)` for those chosen).
    pub phases_ms: Vec<f64>,
    /// Per workload: the fraction of its busy time during which another workload's job (with
    /// its guard) is busy too, with these phases.
    pub overlap: Vec<f64>,
    /// The same with every workload released at its scenario phase (0 where it has none).
    pub overlap_in_phase: Vec<f64>,
    pub hyperperiod_ms: f64,
    /// False where staggering would have left a workload overlapping more than in phase, and
    /// every workload keeps its scenario phase.
    pub moved: bool,
}

/// Why no phases were chosen.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StaggerError {
    #[error(
        "rate {0} Hz is not a multiple of 0.001 Hz: its releases never repeat with the others'"
    )]
    Irregular(f64),
    #[error(
        "the rates repeat together only every {0:.0} ms (more than {MAX_HYPERPERIOD_MS:.0} ms)"
    )]
    Hyperperiod(f64),
}

/// Chooses a phase for every workload without one (see the module's text).
pub fn stagger(jobs: &[Periodic]) -> Result<Staggered, StaggerError> {
    let hyper_ms = hyperperiod_ms(jobs)?;
    let bins = (hyper_ms / BIN_MS).round() as usize;
    let timeline = Timeline { bins, hyper_ms };
    let fixed: Vec<f64> = jobs.iter().map(|j| j.fixed_ms.unwrap_or(0.0)).collect();
    let mut phases = fixed.clone();
    let mut occupied = vec![0u32; bins];
    let mut order: Vec<usize> = (0..jobs.len()).collect();
    // Fixed first, then the busiest: it has the fewest phases that fit.
    order.sort_by(|&a, &b| {
        let busy = |j: &Periodic| j.busy_ms * j.rate_hz;
        (jobs[a].fixed_ms.is_none())
            .cmp(&jobs[b].fixed_ms.is_none())
            .then(busy(&jobs[b]).total_cmp(&busy(&jobs[a])))
    });
    for &i in &order {
        if jobs[i].fixed_ms.is_none() {
            phases[i] = timeline.least_overlap(&jobs[i], &occupied);
        }
        timeline.mark(&jobs[i], phases[i], &mut occupied);
    }
    let overlap = timeline.overlaps(jobs, &phases);
    let overlap_in_phase = timeline.overlaps(jobs, &fixed);
    // Where the jobs cannot all keep apart (more work than time), the greedy choice may leave
    // one overlapping more than in phase: then none is moved.
    let worse = overlap
        .iter()
        .zip(&overlap_in_phase)
        .any(|(s, p)| s > &(p + 1e-9));
    let (phases_ms, overlap) = if worse {
        (fixed, overlap_in_phase.clone())
    } else {
        (phases, overlap)
    };
    Ok(Staggered {
        moved: !worse,
        phases_ms,
        overlap,
        overlap_in_phase,
        hyperperiod_ms: hyper_ms,
    })
}

/// The time after which every release repeats: 1 / the greatest common divisor of the rates
/// (in mHz, so that 0.5 Hz and 333.333 Hz count).
fn hyperperiod_ms(jobs: &[Periodic]) -> Result<f64, StaggerError> {
    let mut g: u64 = 0;
    for j in jobs {
        let milli = j.rate_hz * 1000.0;
        if milli.is_nan() || milli < 0.5 || (milli - milli.round()).abs() > 1e-6 {
            return Err(StaggerError::Irregular(j.rate_hz));
        }
        g = gcd(g, milli.round() as u64);
    }
    if g == 0 {
        return Ok(0.0);
    }
    let hyper_ms = 1e6 / g as f64;
    if hyper_ms > MAX_HYPERPERIOD_MS + 1e-9 {
        return Err(StaggerError::Hyperperiod(hyper_ms));
    }
    Ok(hyper_ms)
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// One hyperperiod in bins; a workload's jobs are windows on it, wrapping at the end.
struct Timeline {
    bins: usize,
    hyper_ms: f64,
}

impl Timeline {
    /// The first bin of each of a workload's jobs in one hyperperiod, released at `phase_ms`.
    fn starts(&self, j: &Periodic, phase_ms: f64) -> impl Iterator<Item = usize> + '_ {
        let n = (self.hyper_ms * j.rate_hz / 1000.0).round() as usize;
        let period_ms = 1000.0 / j.rate_hz;
        let bins = self.bins;
        (0..n).map(move |k| (((phase_ms + k as f64 * period_ms) / BIN_MS).round() as usize) % bins)
    }

    /// Bins a job occupies: its busy time and a guard after it (a tenth of it, at least
    /// 50 µs), never more than its period.
    fn window(&self, j: &Periodic) -> (usize, usize) {
        let busy = (j.busy_ms / BIN_MS).ceil().max(1.0) as usize;
        let guard = (busy / 10).max((0.05 / BIN_MS) as usize);
        let period = ((1000.0 / j.rate_hz) / BIN_MS).floor().max(1.0) as usize;
        (busy.min(period), (busy + guard).min(period))
    }

    fn mark(&self, j: &Periodic, phase_ms: f64, occupied: &mut [u32]) {
        let (_, len) = self.window(j);
        for s in self.starts(j, phase_ms) {
            for b in 0..len {
                occupied[(s + b) % self.bins] += 1;
            }
        }
    }

    /// Overlap of a workload's jobs at `phase_ms` with `occupied`, over a hyperperiod, from
    /// prefix sums of the circular timeline.
    fn cost(&self, j: &Periodic, phase_ms: f64, prefix: &[u64]) -> u64 {
        let (_, len) = self.window(j);
        let total = prefix[self.bins];
        let upto = |b: usize| -> u64 { total * (b / self.bins) as u64 + prefix[b % self.bins] };
        self.starts(j, phase_ms)
            .map(|s| upto(s + len) - upto(s))
            .sum()
    }

    fn least_overlap(&self, j: &Periodic, occupied: &[u32]) -> f64 {
        let mut prefix = vec![0u64; self.bins + 1];
        for (b, &o) in occupied.iter().enumerate() {
            prefix[b + 1] = prefix[b] + u64::from(o);
        }
        let candidates = ((1000.0 / j.rate_hz) / BIN_MS).floor().max(1.0) as usize;
        let costs: Vec<u64> = (0..candidates)
            .map(|c| self.cost(j, c as f64 * BIN_MS, &prefix))
            .collect();
        let least = costs.iter().copied().min().unwrap_or(0);
        if costs.iter().all(|&c| c == least) {
            return 0.0; // nothing to keep away from
        }
        // Of the phases that overlap least, the middle of the widest run: as far from the
        // neighbours' jobs as they allow.
        let (mut best, mut run_start) = ((0usize, 0usize), None);
        for (c, &cost) in costs.iter().chain([&u64::MAX]).enumerate() {
            match (cost == least, run_start) {
                (true, None) => run_start = Some(c),
                (false, Some(s)) => {
                    if c - s > best.1 - best.0 {
                        best = (s, c);
                    }
                    run_start = None;
                }
                _ => {}
            }
        }
        ((best.0 + best.1 - 1) / 2) as f64 * BIN_MS
    }

    /// Per workload, the fraction of its busy bins that another workload's window covers.
    fn overlaps(&self, jobs: &[Periodic], phases: &[f64]) -> Vec<f64> {
        let mut all = vec![0u32; self.bins];
        for (j, &p) in jobs.iter().zip(phases) {
            self.mark(j, p, &mut all);
        }
        jobs.iter()
            .zip(phases)
            .map(|(j, &p)| {
                let mut own = vec![0u32; self.bins];
                self.mark(j, p, &mut own);
                let (busy, _) = self.window(j);
                let (mut hit, mut of) = (0usize, 0usize);
                for s in self.starts(j, p) {
                    for b in 0..busy {
                        let at = (s + b) % self.bins;
                        of += 1;
                        if all[at] > own[at] {
                            hit += 1;
                        }
                    }
                }
                if of == 0 {
                    0.0
                } else {
                    hit as f64 / of as f64
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(rate_hz: f64, busy_ms: f64) -> Periodic {
        Periodic {
            rate_hz,
            busy_ms,
            fixed_ms: None,
        }
    }

    #[test]
    fn a_batch_job_and_two_cameras_at_one_rate_are_released_one_after_another() {
        // resnet50 b64 3.6 ms, two cameras 0.5 and 0.6 ms, all at 100 Hz: they fit in a period.
        let s = stagger(&[job(100.0, 3.6), job(100.0, 0.5), job(100.0, 0.6)]).unwrap();
        assert_eq!(s.hyperperiod_ms, 10.0);
        assert_eq!(s.phases_ms[0], 0.0);
        // Each camera after the batch job's busy time and guard, and after each other.
        let ends = |i: usize, busy: f64| s.phases_ms[i] + busy;
        assert!(
            s.phases_ms[1] >= 3.6 && s.phases_ms[2] >= 3.6,
            "{:?}",
            s.phases_ms
        );
        assert!(
            ends(1, 0.5) <= s.phases_ms[2] || ends(2, 0.6) <= s.phases_ms[1],
            "{:?}",
            s.phases_ms
        );
        assert!(s.overlap.iter().all(|&o| o == 0.0), "{:?}", s.overlap);
        // In phase the cameras overlap the batch job all the time, it them at its start.
        assert_eq!(s.overlap_in_phase[1..], [1.0, 1.0]);
        assert!(s.overlap_in_phase[0] > 0.1, "{:?}", s.overlap_in_phase);
    }

    #[test]
    fn a_phase_the_scenario_gives_is_kept_and_avoided() {
        let mut fixed = job(100.0, 2.0);
        fixed.fixed_ms = Some(1.0);
        let s = stagger(&[job(100.0, 1.0), fixed]).unwrap();
        assert_eq!(s.phases_ms[1], 1.0);
        // The fixed job and its guard hold [1 ms, 3.2 ms): the free one (1.1 ms with its guard)
        // goes in the middle of [3.2, 9.9] ms.
        assert!((s.phases_ms[0] - 6.55).abs() < 0.011, "{:?}", s.phases_ms);
        assert_eq!(s.overlap, vec![0.0, 0.0]);
    }

    #[test]
    fn rates_of_different_periods_are_staggered_over_their_hyperperiod() {
        // 400, 300 and 200 Hz repeat every 10 ms; the busy times add up to 60 % of the GPU.
        let s = stagger(&[job(400.0, 0.6), job(300.0, 0.6), job(200.0, 0.9)]).unwrap();
        assert!((s.hyperperiod_ms - 10.0).abs() < 1e-9);
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        assert!(
            mean(&s.overlap) < 0.5 * mean(&s.overlap_in_phase),
            "staggered {:?} in phase {:?}",
            s.overlap,
            s.overlap_in_phase
        );
    }

    #[test]
    fn more_work_than_a_period_overlaps_but_less_than_in_phase() {
        let s = stagger(&[job(100.0, 6.0), job(100.0, 6.0)]).unwrap();
        assert!(s.overlap[0] > 0.0 && s.overlap[0] < 1.0, "{:?}", s.overlap);
        // Every phase in [3.4, 6.6] ms overlaps as little: the middle, half a period apart.
        assert_eq!(s.phases_ms, vec![0.0, 5.0]);
    }

    #[test]
    fn rates_that_never_repeat_together_are_refused_with_the_reason() {
        assert_eq!(
            stagger(&[job(100.0, 1.0), job(100.0001, 1.0)]),
            Err(StaggerError::Irregular(100.0001))
        );
        let e = stagger(&[job(0.5, 1.0), job(0.3, 1.0)]).unwrap_err();
        assert!(matches!(e, StaggerError::Hyperperiod(h) if (h - 10_000.0).abs() < 1e-6));
        assert!(e.to_string().contains("10000 ms"), "{e}");
    }

    #[test]
    fn no_workload_is_moved_where_one_would_overlap_more_than_in_phase() {
        // Three cameras at 400, 300 and 200 Hz busy for 128 % of the time (session 15's plan).
        let s = stagger(&[job(400.0, 1.487), job(300.0, 1.164), job(200.0, 1.784)]).unwrap();
        assert!(!s.moved);
        assert_eq!(s.phases_ms, vec![0.0; 3]);
        assert_eq!(s.overlap, s.overlap_in_phase);
    }

    #[test]
    fn one_workload_is_left_at_phase_zero() {
        let s = stagger(&[job(250.0, 1.0)]).unwrap();
        assert_eq!(s.phases_ms, vec![0.0]);
        assert_eq!(s.overlap, vec![0.0]);
    }
}
