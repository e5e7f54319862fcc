//! The attribution itself: each job's time beyond what it needs by itself, split among the
//! causes that were there while it waited and ran (docs/criticality.md, "Why jobs were
//! late"). Everything here works on records in memory, so that the arithmetic is tested with
//! hand-built jobs whose right answer is known.

use isolane_core::spec::Criticality;
use isolane_trace::Job;

use super::{Cause, CauseKind, CauseShare, LateJob, Neighbour, WorkloadExplanation};

/// Where a workload ran, as far as sharing goes.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Placement {
    /// The GPU it ran on; `None` on the CPU backend.
    pub gpu: Option<u32>,
    /// The cores its threads were pinned to; empty when unpinned.
    pub cores: Vec<usize>,
}

impl Placement {
    /// Whether the two may take CPU time from each other. Pinned threads do where their core
    /// lists meet. An unpinned CPU-backend workload runs on any core, so it competes with every
    /// other CPU-backend workload; an unpinned GPU workload's host thread mostly waits for its
    /// GPU, so it is not counted as competing for cores.
    pub fn shares_cores(&self, other: &Placement) -> bool {
        if !self.cores.is_empty() && !other.cores.is_empty() {
            return self.cores.iter().any(|c| other.cores.contains(c));
        }
        self.gpu.is_none() && other.gpu.is_none()
    }

    /// Whether the two share a GPU: its memory system (DRAM bandwidth, L2) and copy engines
    /// are shared whatever partitions split its SMs (docs/interference.md).
    pub fn shares_gpu(&self, other: &Placement) -> bool {
        matches!((self.gpu, other.gpu), (Some(a), Some(b)) if a == b)
    }

    /// A neighbour while the job runs: anything sharing its GPU or its cores.
    fn runs_beside(&self, other: &Placement) -> bool {
        self.shares_gpu(other) || self.shares_cores(other)
    }

    /// What the two share, in words (`GPU 0`, `cores 0`, `GPU 0 and cores 2, 3`).
    fn shared_words(&self, other: &Placement) -> String {
        let mut parts = Vec::new();
        if let Some(g) = self.gpu.filter(|_| self.shares_gpu(other)) {
            parts.push(format!("GPU {g}"));
        }
        if self.shares_cores(other) {
            let common: Vec<String> = if self.cores.is_empty() || other.cores.is_empty() {
                Vec::new()
            } else {
                self.cores
                    .iter()
                    .filter(|c| other.cores.contains(c))
                    .map(|c| c.to_string())
                    .collect()
            };
            parts.push(if common.is_empty() {
                "the host's cores (unpinned)".to_string()
            } else if common.len() == 1 {
                format!("core {}", common[0])
            } else {
                format!("cores {}", common.join(", "))
            });
        }
        parts.join(" and ")
    }
}

/// One workload's records as the run left them.
#[derive(Debug, Clone)]
pub struct WorkloadRecords {
    pub name: String,
    pub model: String,
    pub criticality: Criticality,
    /// The deadline its jobs were judged by (ms after release), when known.
    pub deadline_ms: Option<f64>,
    pub placement: Placement,
    /// jobs/<workload>.csv, in release order.
    pub jobs: Vec<Job>,
    /// A command workload's program: when it ran (ms since t0). It has no jobs of its own and
    /// is a neighbour all along its run.
    pub program: Option<(f64, f64)>,
}

/// The fewest jobs without a neighbour beside them whose median is taken as a workload's
/// typical service time. With 10, the sample median lies between the 2nd and the 9th smallest
/// of them with 98.9 % probability (binomial, p = 1/2), i.e. within the middle 80 % of the
/// workload's undisturbed times; fewer would let two or three odd jobs set it.
pub const MIN_CLEAN_JOBS: usize = 10;

/// A stretch of time a workload was busy (ms since t0), and how much of it, at least, the
/// guard held it (so that it did not run).
#[derive(Debug, Clone, Copy)]
struct Busy {
    start: f64,
    end: f64,
    held: f64,
}

/// Each completed job's times, split as the attribution needs them (ms).
#[derive(Debug, Clone, Copy)]
struct Split {
    /// When it could have started: its release or the end of its previous job, the later.
    ready: f64,
    start: f64,
    end: f64,
    /// Held by the guard before its start (the guard asks before a job's first piece).
    hold_before: f64,
    /// Held between its pieces, after its start.
    hold_inside: f64,
    /// Its own running time: start to end, less the holds inside.
    run: f64,
}

/// A job's holds are one total (`held_ms`). The guard asks before every piece, the first one
/// before the job's start, so the total is taken from the wait before the start first and the
/// rest lies between the job's pieces.
fn split(job: &Job, prev_end: f64) -> Option<Split> {
    let (start, end) = (job.start_ms?, job.end_ms?);
    let ready = job.release_ms.max(prev_end);
    let before = (start - ready).max(0.0);
    let inside = (end - start).max(0.0);
    let held = job.held_ms.unwrap_or(0.0).max(0.0);
    let hold_before = held.min(before);
    let hold_inside = (held - hold_before).min(inside);
    Some(Split {
        ready,
        start,
        end: end.max(start),
        hold_before,
        hold_inside,
        run: inside - hold_inside,
    })
}

/// The share of its run (from its first release to its last job's end) that a workload's jobs
/// spent running, the guard's holds left out (%). Near 100 %, a job over its typical delays the
/// ones after it, and a few per cent of stretch on every job build a queue that never drains
/// (session 29: a light CNN busy ~95 % beside its critical neighbour missed 99.9 % beside a
/// best effort that stretched it 7 %). `None` without a completed job.
fn busy_pct(w: &WorkloadRecords, busy: &[Busy]) -> Option<f64> {
    let first = w
        .jobs
        .iter()
        .map(|j| j.release_ms)
        .fold(f64::INFINITY, f64::min);
    let last = busy.iter().map(|b| b.end).fold(f64::NEG_INFINITY, f64::max);
    let span = last - first;
    if w.program.is_some() || !(span.is_finite() && span > 0.0) {
        return None;
    }
    let running: f64 = busy
        .iter()
        .map(|b| (b.end - b.start - b.held).max(0.0))
        .sum();
    Some((100.0 * running / span).min(100.0))
}

fn busy_of(w: &WorkloadRecords) -> Vec<Busy> {
    if let Some((start, end)) = w.program {
        return vec![Busy {
            start,
            end: end.max(start),
            held: 0.0,
        }];
    }
    let mut prev_end = f64::NEG_INFINITY;
    let mut out = Vec::with_capacity(w.jobs.len());
    for j in &w.jobs {
        if let Some(s) = split(j, prev_end) {
            out.push(Busy {
                start: s.start,
                end: s.end,
                held: s.hold_inside,
            });
            prev_end = s.end;
        }
    }
    out.sort_by(|a, b| a.start.total_cmp(&b.start));
    out
}

/// How much of `[from, to]` the workloads `who` ran in: per workload, its busy time there less
/// its holds (at least that much it ran: where in its job the guard held it is not recorded),
/// and over all of them the covered time, at most the union of their busy spans.
struct Cover {
    per: Vec<(usize, f64)>,
    covered: f64,
}

fn cover(busy: &[Vec<Busy>], who: &[usize], from: f64, to: f64) -> Cover {
    let mut per = Vec::new();
    let mut spans: Vec<(f64, f64)> = Vec::new();
    if to <= from {
        return Cover { per, covered: 0.0 };
    }
    for &n in who {
        let list = &busy[n];
        // Busy spans of one workload follow each other, so their ends rise with their starts.
        let first = list.partition_point(|b| b.end <= from);
        let mut ran = 0.0;
        for b in list[first..].iter().take_while(|b| b.start < to) {
            let (s, e) = (b.start.max(from), b.end.min(to));
            if e > s {
                ran += (e - s - b.held).max(0.0);
                spans.push((s, e));
            }
        }
        if ran > 0.0 {
            per.push((n, ran));
        }
    }
    spans.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut union = 0.0;
    let mut cur: Option<(f64, f64)> = None;
    for (s, e) in spans {
        cur = match cur {
            Some((cs, ce)) if s <= ce => Some((cs, ce.max(e))),
            Some((cs, ce)) => {
                union += ce - cs;
                Some((s, e))
            }
            None => Some((s, e)),
        };
    }
    if let Some((cs, ce)) = cur {
        union += ce - cs;
    }
    let sum: f64 = per.iter().map(|p| p.1).sum();
    Cover {
        per,
        covered: union.min(sum),
    }
}

fn median(v: &mut [f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

// Indices into a job's vector of causes: then one slot per workload of the run (a neighbour).
const HOST: usize = 0;
const GUARD: usize = 1;
const OWN: usize = 2;
const TYPICAL: usize = 3;
const FIRST_NEIGHBOUR: usize = 4;

/// Adds `amount` to `into`, split as `by` is (its causes' shares); what `by` cannot explain
/// (more than its total) is the workload's own.
fn inherit(into: &mut [f64], by: Option<&[f64]>, amount: f64) {
    if amount <= 0.0 {
        return;
    }
    let total: f64 = by.map_or(0.0, |b| b.iter().sum());
    if total <= 0.0 {
        into[OWN] += amount;
        return;
    }
    let explained = amount.min(total);
    for (i, v) in by.unwrap_or_default().iter().enumerate() {
        into[i] += explained * v / total;
    }
    into[OWN] += amount - explained;
}

/// What one workload's typical service time is, and from which jobs.
struct Typical {
    ms: Option<f64>,
    from: String,
}

/// Explains every workload of a run. `memory` gives a neighbour's memory-system figures by
/// its model, when known.
pub fn explain_run(
    workloads: &[WorkloadRecords],
    memory: &dyn Fn(&str) -> Option<crate::explain::MemoryFigures>,
) -> Vec<WorkloadExplanation> {
    explain_run_against(workloads, memory, &|_| None)
}

/// A workload's typical service time taken from elsewhere (a run of it alone): ms, and where
/// from in words.
pub type Baseline = (f64, String);

/// [`explain_run`] with each workload's typical service time from `baseline` (by workload
/// name) where it gives one, instead of from the run's own jobs.
pub fn explain_run_against(
    workloads: &[WorkloadRecords],
    memory: &dyn Fn(&str) -> Option<crate::explain::MemoryFigures>,
    baseline: &dyn Fn(&str) -> Option<Baseline>,
) -> Vec<WorkloadExplanation> {
    let busy: Vec<Vec<Busy>> = workloads.iter().map(busy_of).collect();
    workloads
        .iter()
        .enumerate()
        .filter(|(_, w)| w.program.is_none())
        .map(|(v, w)| explain_one(workloads, &busy, v, memory, baseline(&w.name)))
        .collect()
}

/// Each workload's typical service time in this run (ms, `None` without a completed job) and
/// which jobs it is the median of: what a run of the workloads alone gives
/// [`explain_run_against`].
pub fn typical_times(workloads: &[WorkloadRecords]) -> Vec<(String, Option<f64>, String)> {
    let busy: Vec<Vec<Busy>> = workloads.iter().map(busy_of).collect();
    workloads
        .iter()
        .enumerate()
        .filter(|(_, w)| w.program.is_none())
        .map(|(v, w)| {
            let beside = beside_of(workloads, v);
            let (splits, covers) = splits_and_covers(w, &busy, &beside);
            let t = typical_of(&splits, &covers);
            (w.name.clone(), t.ms, t.from)
        })
        .collect()
}

fn beside_of(all: &[WorkloadRecords], v: usize) -> Vec<usize> {
    (0..all.len())
        .filter(|&n| n != v && all[v].placement.runs_beside(&all[n].placement))
        .collect()
}

/// Each job's split (`None` for a skipped one) and what ran beside it while it ran.
fn splits_and_covers(
    w: &WorkloadRecords,
    busy: &[Vec<Busy>],
    beside: &[usize],
) -> (Vec<Option<Split>>, Vec<Option<Cover>>) {
    let mut splits: Vec<Option<Split>> = Vec::with_capacity(w.jobs.len());
    let mut prev_end = f64::NEG_INFINITY;
    for j in &w.jobs {
        let s = split(j, prev_end);
        if let Some(s) = &s {
            prev_end = s.end;
        }
        splits.push(s);
    }
    let covers = splits
        .iter()
        .map(|s| s.map(|s| cover(busy, beside, s.start, s.end)))
        .collect();
    (splits, covers)
}

fn explain_one(
    all: &[WorkloadRecords],
    busy: &[Vec<Busy>],
    v: usize,
    memory: &dyn Fn(&str) -> Option<crate::explain::MemoryFigures>,
    baseline: Option<Baseline>,
) -> WorkloadExplanation {
    let w = &all[v];
    let beside = beside_of(all, v);
    let on_cores: Vec<usize> = beside
        .iter()
        .copied()
        .filter(|&n| w.placement.shares_cores(&all[n].placement))
        .collect();
    let deadline = w.deadline_ms.filter(|d| d.is_finite() && *d > 0.0);

    // Completed jobs' splits (by position in `w.jobs`) and what ran beside each.
    let (splits, run_cover) = splits_and_covers(w, busy, &beside);
    let typical = match baseline {
        Some((ms, from)) => Typical { ms: Some(ms), from },
        None => typical_of(&splits, &run_cover),
    };

    let slots = FIRST_NEIGHBOUR + all.len();
    let mut totals = vec![0.0; slots];
    let mut shares = vec![0.0; slots];
    let mut late_jobs = Vec::new();
    let mut prev: Option<Vec<f64>> = None;
    let mut prev_end = f64::NEG_INFINITY;
    for (i, j) in w.jobs.iter().enumerate() {
        let mut parts = vec![0.0; slots];
        let backlog = (prev_end - j.release_ms).max(0.0);
        inherit(&mut parts, prev.as_deref(), backlog);
        match (&splits[i], &run_cover[i]) {
            (Some(s), Some(rc)) => {
                parts[GUARD] += s.hold_before + s.hold_inside;
                // Waiting for the core: a neighbour pinned beside it was running meanwhile,
                // or else the host was slow to wake or schedule it.
                let wait = (s.start - s.ready).max(0.0);
                let host_wait = wait - s.hold_before;
                if host_wait > 0.0 {
                    let wc = cover(busy, &on_cores, s.ready, s.start);
                    let by_neighbours = host_wait * (wc.covered / wait).min(1.0);
                    spread(&mut parts, &wc, by_neighbours);
                    parts[HOST] += host_wait - by_neighbours;
                }
                let excess = typical.ms.map_or(0.0, |t| (s.run - t).max(0.0));
                if excess > 0.0 {
                    let len = s.end - s.start;
                    let frac = if len > 0.0 {
                        (rc.covered / len).min(1.0)
                    } else {
                        0.0
                    };
                    let by_neighbours = excess * frac;
                    spread(&mut parts, rc, by_neighbours);
                    parts[OWN] += excess - by_neighbours;
                }
                prev_end = s.end;
            }
            _ => {
                // Skipped: it could start only after its deadline had passed. What it waited
                // for its previous job is inherited above; the rest of the time up to its
                // deadline, the loop did not get to it.
                if let Some(d) = deadline {
                    let ready = j.release_ms.max(prev_end);
                    parts[HOST] += (j.release_ms + d - ready).max(0.0);
                }
            }
        }
        if j.timeout {
            let sum: f64 = parts.iter().sum();
            let over = match (j.latency_ms, deadline) {
                (Some(l), Some(d)) => Some(l - d),
                _ => None,
            };
            let mut job_parts = parts.clone();
            if sum <= 0.0 {
                // Nothing beyond its typical service: its deadline is shorter than what it
                // needs by itself (as measured in this run: `typical_from` says whether
                // neighbours ran beside the jobs it is the median of).
                job_parts[TYPICAL] = over.unwrap_or(0.0).max(0.0);
                shares[TYPICAL] += 1.0;
            } else {
                for (s, p) in shares.iter_mut().zip(&parts) {
                    *s += p / sum;
                }
            }
            for (t, p) in totals.iter_mut().zip(&job_parts) {
                *t += p;
            }
            late_jobs.push(LateJob {
                job: j.index,
                release_ms: j.release_ms,
                latency_ms: j.latency_ms,
                over_ms: over,
                skipped: j.start_ms.is_none(),
                parts: causes_of(all, &job_parts, None, 0),
            });
        }
        if splits[i].is_some() || prev.is_none() {
            prev = Some(parts);
        }
    }
    let jobs = w.jobs.len() as u64;
    let late = late_jobs.len() as u64;
    let pct = |n: f64| {
        if jobs == 0 {
            0.0
        } else {
            100.0 * n / jobs as f64
        }
    };
    WorkloadExplanation {
        name: w.name.clone(),
        model: w.model.clone(),
        criticality: w.criticality,
        deadline_ms: w.deadline_ms,
        jobs,
        late,
        late_pct: pct(late as f64),
        typical_service_ms: typical.ms,
        typical_from: typical.from,
        busy_pct: busy_pct(w, &busy[v]),
        neighbours: beside
            .iter()
            .map(|&n| Neighbour {
                name: all[n].name.clone(),
                model: all[n].model.clone(),
                shares: w.placement.shared_words(&all[n].placement),
                memory: memory(&all[n].model),
            })
            .collect(),
        causes: causes_of(all, &totals, Some(&shares), jobs),
        late_jobs,
    }
}

/// Adds `amount` to the neighbours of `c`, each by how long it ran in the window.
fn spread(parts: &mut [f64], c: &Cover, amount: f64) {
    let sum: f64 = c.per.iter().map(|p| p.1).sum();
    if sum <= 0.0 || amount <= 0.0 {
        return;
    }
    for &(n, ran) in &c.per {
        parts[FIRST_NEIGHBOUR + n] += amount * ran / sum;
    }
}

fn typical_of(splits: &[Option<Split>], covers: &[Option<Cover>]) -> Typical {
    let mut clean: Vec<f64> = splits
        .iter()
        .zip(covers)
        .filter_map(|(s, c)| match (s, c) {
            (Some(s), Some(c)) if c.covered <= 0.0 => Some(s.run),
            _ => None,
        })
        .collect();
    if clean.len() >= MIN_CLEAN_JOBS {
        let n = clean.len();
        return Typical {
            ms: median(&mut clean),
            from: format!("the median of the {n} jobs that ran with no neighbour beside them"),
        };
    }
    let mut all: Vec<f64> = splits.iter().flatten().map(|s| s.run).collect();
    let n = all.len();
    Typical {
        ms: median(&mut all),
        from: if n == 0 {
            "none: no job completed".to_string()
        } else {
            format!(
                "the median of all {n} completed jobs (only {} ran with no neighbour beside \
                 it; fewer than {MIN_CLEAN_JOBS})",
                clean.len()
            )
        },
    }
}

/// The causes with time or share, largest share first. With `shares`, each cause's share of
/// the workload's jobs (summing to its late %) over `jobs`.
fn causes_of(
    all: &[WorkloadRecords],
    times: &[f64],
    shares: Option<&[f64]>,
    jobs: u64,
) -> Vec<CauseShare> {
    let mut out: Vec<CauseShare> = times
        .iter()
        .enumerate()
        .filter(|(i, t)| **t > 0.0 || shares.is_some_and(|s| s[*i] > 0.0))
        .map(|(i, t)| CauseShare {
            cause: match i {
                HOST => Cause::of(CauseKind::Host),
                GUARD => Cause::of(CauseKind::Guard),
                OWN => Cause::of(CauseKind::OwnService),
                TYPICAL => Cause::of(CauseKind::DeadlineBelowTypical),
                n => Cause::neighbour(&all[n - FIRST_NEIGHBOUR].name),
            },
            late_pct: shares.map(|s| {
                if jobs == 0 {
                    0.0
                } else {
                    100.0 * s[i] / jobs as f64
                }
            }),
            time_ms: *t,
        })
        .collect();
    out.sort_by(|a, b| {
        b.late_pct
            .unwrap_or(0.0)
            .total_cmp(&a.late_pct.unwrap_or(0.0))
            .then(b.time_ms.total_cmp(&a.time_ms))
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(index: u64, release: f64, start: f64, end: f64, deadline: f64, held: f64) -> Job {
        Job {
            index,
            release_ms: release,
            start_ms: Some(start),
            end_ms: Some(end),
            latency_ms: Some(end - release),
            timeout: end - release > deadline,
            held_ms: Some(held),
        }
    }

    fn skipped(index: u64, release: f64) -> Job {
        Job {
            index,
            release_ms: release,
            start_ms: None,
            end_ms: None,
            latency_ms: None,
            timeout: true,
            held_ms: None,
        }
    }

    fn workload(
        name: &str,
        cores: &[usize],
        deadline: Option<f64>,
        jobs: Vec<Job>,
    ) -> WorkloadRecords {
        WorkloadRecords {
            name: name.into(),
            model: format!("spin:{name}"),
            criticality: Criticality::Critical,
            deadline_ms: deadline,
            placement: Placement {
                gpu: None,
                cores: cores.to_vec(),
            },
            jobs,
            program: None,
        }
    }

    /// A victim at 10 ms periods, 1 ms of service, deadline 1.5 ms: `n` jobs, the ones in
    /// `slow` taking `slow_ms` and starting `late_ms` after release.
    fn victim(n: u64, slow: &[u64], slow_ms: f64, late_ms: f64) -> Vec<Job> {
        (0..n)
            .map(|k| {
                let r = 10.0 * k as f64;
                if slow.contains(&k) {
                    job(k, r, r + late_ms, r + late_ms + slow_ms, 1.5, 0.0)
                } else {
                    job(k, r, r, r + 1.0, 1.5, 0.0)
                }
            })
            .collect()
    }

    fn none(_: &str) -> Option<crate::explain::MemoryFigures> {
        None
    }

    fn cause<'a>(w: &'a WorkloadExplanation, c: &Cause) -> Option<&'a CauseShare> {
        w.causes.iter().find(|s| &s.cause == c)
    }

    /// The busy share: running time over the span from the first release to the last end.
    /// 20 jobs of 1 ms every 10 ms run 20 of 191 ms; 0.95 ms of every 1 ms is 95 %, which the
    /// text calls a queue waiting to happen; a job held by the guard runs less than it spans.
    #[test]
    fn the_busy_share_is_running_time_over_the_runs_span() {
        let out = explain_run(
            &[workload("v", &[0], Some(1.5), victim(20, &[], 0.0, 0.0))],
            &none,
        );
        let b = out[0].busy_pct.unwrap();
        assert!((b - 100.0 * 20.0 / 191.0).abs() < 1e-9, "{b}");
        let dense: Vec<Job> = (0..100)
            .map(|k| job(k, k as f64, k as f64, k as f64 + 0.95, 2.0, 0.0))
            .collect();
        let out = explain_run(&[workload("d", &[0], Some(2.0), dense)], &none);
        let b = out[0].busy_pct.unwrap();
        assert!((b - 100.0 * 95.0 / 99.95).abs() < 1e-9, "{b}");
        let held: Vec<Job> = (0..100)
            .map(|k| job(k, k as f64, k as f64, k as f64 + 0.95, 2.0, 0.45))
            .collect();
        let out = explain_run(&[workload("h", &[0], Some(2.0), held)], &none);
        let b = out[0].busy_pct.unwrap();
        assert!((b - 100.0 * 50.0 / 99.95).abs() < 1e-6, "{b}");
        assert_eq!(
            explain_run(&[workload("e", &[0], Some(2.0), vec![])], &none)[0].busy_pct,
            None
        );
    }

    #[test]
    fn a_slow_job_beside_a_neighbour_on_its_core_is_the_neighbours() {
        // Job 5 ran 3 ms instead of 1 while `noisy` (same core) ran beside it the whole time;
        // `far` ran on another core at the same time and is no neighbour.
        let v = workload("victim", &[0], Some(1.5), victim(20, &[5], 3.0, 0.0));
        let noisy = workload(
            "noisy",
            &[0],
            None,
            vec![job(0, 49.0, 49.0, 54.0, 99.0, 0.0)],
        );
        let far = workload("far", &[1], None, vec![job(0, 49.0, 49.0, 54.0, 99.0, 0.0)]);
        let out = explain_run(&[v, noisy, far], &none);
        let w = &out[0];
        assert_eq!((w.jobs, w.late), (20, 1));
        assert!((w.late_pct - 5.0).abs() < 1e-9);
        assert_eq!(w.typical_service_ms, Some(1.0));
        assert!(w.typical_from.contains("19 jobs"), "{}", w.typical_from);
        let n = cause(w, &Cause::neighbour("noisy")).expect("noisy named");
        assert!((n.late_pct.unwrap() - 5.0).abs() < 1e-9, "{n:?}");
        assert!((n.time_ms - 2.0).abs() < 1e-9, "{n:?}");
        assert!(
            cause(w, &Cause::neighbour("far")).is_none(),
            "{:?}",
            w.causes
        );
        let names: Vec<&str> = w.neighbours.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["noisy"]);
        assert_eq!(w.neighbours[0].shares, "core 0");
        assert_eq!(w.late_jobs[0].job, 5);
        assert!((w.late_jobs[0].over_ms.unwrap() - 1.5).abs() < 1e-9);
    }

    #[test]
    fn half_an_overlap_explains_half_the_excess_and_the_rest_is_its_own() {
        // Job 5 ran 3 ms (2 ms beyond typical); the neighbour ran in the first 1.5 ms of it.
        let v = workload("victim", &[0], Some(1.5), victim(20, &[5], 3.0, 0.0));
        let n = workload("n", &[0], None, vec![job(0, 49.0, 49.0, 51.5, 99.0, 0.0)]);
        let out = explain_run(&[v, n], &none);
        let w = &out[0];
        let by_n = cause(w, &Cause::neighbour("n")).unwrap();
        let own = cause(w, &Cause::of(CauseKind::OwnService)).unwrap();
        assert!((by_n.time_ms - 1.0).abs() < 1e-9, "{by_n:?}");
        assert!((own.time_ms - 1.0).abs() < 1e-9, "{own:?}");
        assert!((by_n.late_pct.unwrap() - 2.5).abs() < 1e-9);
        assert!((own.late_pct.unwrap() - 2.5).abs() < 1e-9);
        // The shares add up to the workload's late %.
        let sum: f64 = w.causes.iter().filter_map(|c| c.late_pct).sum();
        assert!((sum - w.late_pct).abs() < 1e-9);
    }

    #[test]
    fn a_late_start_with_nobody_on_its_cores_is_the_hosts() {
        // Job 3 started 1 ms late and ran its usual 1 ms: nobody ran beside it.
        let v = workload("victim", &[0], Some(1.5), victim(20, &[3], 1.0, 1.0));
        let out = explain_run(&[v], &none);
        let w = &out[0];
        assert_eq!(w.late, 1);
        let host = cause(w, &Cause::of(CauseKind::Host)).unwrap();
        assert!((host.time_ms - 1.0).abs() < 1e-9);
        assert!((host.late_pct.unwrap() - 5.0).abs() < 1e-9);
        assert_eq!(w.causes.len(), 1, "{:?}", w.causes);
    }

    #[test]
    fn a_late_start_while_a_neighbour_held_the_core_is_the_neighbours() {
        // Job 3 became ready at 30 but started at 31: `n` on the same core ran 29.5–31.2.
        let v = workload("victim", &[0], Some(1.5), victim(20, &[3], 1.0, 1.0));
        let n = workload("n", &[0], None, vec![job(0, 29.5, 29.5, 31.2, 99.0, 0.0)]);
        let out = explain_run(&[v, n], &none);
        let w = &out[0];
        let by_n = cause(w, &Cause::neighbour("n")).unwrap();
        // 1 ms of waiting, all of it covered; its 1 ms run overlapped 0.2 ms but was not slow.
        assert!((by_n.time_ms - 1.0).abs() < 1e-9, "{:?}", w.causes);
        assert!(cause(w, &Cause::of(CauseKind::Host)).is_none());
    }

    #[test]
    fn the_guards_holds_count_as_the_guards_and_a_held_neighbour_did_not_run() {
        // A best-effort victim with a deadline: job 4 held 2 ms before its start (then ran its
        // usual 1 ms), job 6 held 1.5 ms between its pieces.
        let mut jobs = victim(20, &[], 1.0, 0.0);
        jobs[4] = job(4, 40.0, 42.0, 43.0, 1.5, 2.0);
        jobs[6] = job(6, 60.0, 60.0, 62.5, 1.5, 1.5);
        let v = WorkloadRecords {
            criticality: Criticality::BestEffort,
            ..workload("be", &[0], Some(1.5), jobs)
        };
        // A neighbour whose job spans job 6 but was held all through it (1 ms of its 3.5 ms of
        // holds before its start, the rest inside).
        let n = workload("n", &[0], None, vec![job(0, 59.0, 60.0, 62.5, 99.0, 3.5)]);
        let out = explain_run(&[v, n], &none);
        let w = &out[0];
        assert_eq!(w.late, 2);
        let guard = cause(w, &Cause::of(CauseKind::Guard)).unwrap();
        assert!((guard.time_ms - 3.5).abs() < 1e-9, "{:?}", w.causes);
        assert!(
            (guard.late_pct.unwrap() - 10.0).abs() < 1e-9,
            "{:?}",
            w.causes
        );
        assert!(cause(w, &Cause::neighbour("n")).is_none(), "{:?}", w.causes);
    }

    #[test]
    fn a_job_queued_behind_a_slow_one_inherits_its_causes_and_a_skip_too() {
        // Job 2 ran 18 ms beside `n` (17 beyond typical); job 3 waited for it and was skipped
        // (ready at 38.0, after its deadline at 31.5).
        let mut jobs = victim(10, &[], 1.0, 0.0);
        jobs[2] = job(2, 20.0, 20.0, 38.0, 1.5, 0.0);
        jobs[3] = skipped(3, 30.0);
        let v = workload("victim", &[0], Some(1.5), jobs);
        let n = workload("n", &[0], None, vec![job(0, 20.0, 20.0, 38.0, 99.0, 0.0)]);
        let out = explain_run(&[v, n], &none);
        let w = &out[0];
        assert_eq!(w.late, 2);
        let by_n = cause(w, &Cause::neighbour("n")).unwrap();
        // Job 2: all of it; job 3: the 8 ms it waited for job 2, explained as job 2 was.
        assert!(
            (by_n.late_pct.unwrap() - 20.0).abs() < 1e-9,
            "{:?}",
            w.causes
        );
        assert!((by_n.time_ms - (17.0 + 8.0)).abs() < 1e-9, "{:?}", w.causes);
        assert!(w.late_jobs[1].skipped);
    }

    #[test]
    fn a_deadline_below_its_typical_service_is_its_own() {
        // Every job takes 1 ms against a 0.5 ms deadline: nothing beyond typical, all late.
        let jobs = (0..10)
            .map(|k| {
                job(
                    k,
                    10.0 * k as f64,
                    10.0 * k as f64,
                    10.0 * k as f64 + 1.0,
                    0.5,
                    0.0,
                )
            })
            .collect();
        let out = explain_run(&[workload("v", &[], Some(0.5), jobs)], &none);
        let w = &out[0];
        assert_eq!(w.late, 10);
        let own = cause(w, &Cause::of(CauseKind::DeadlineBelowTypical)).unwrap();
        assert!((own.late_pct.unwrap() - 100.0).abs() < 1e-9);
        assert!((own.time_ms - 5.0).abs() < 1e-9, "0.5 ms over, 10 times");
        assert_eq!(w.causes.len(), 1, "{:?}", w.causes);
    }

    #[test]
    fn gpu_neighbours_share_the_memory_system_not_the_cores() {
        let gpu = |g, cores: &[usize]| Placement {
            gpu: Some(g),
            cores: cores.to_vec(),
        };
        assert!(gpu(0, &[]).runs_beside(&gpu(0, &[])));
        assert!(!gpu(0, &[]).shares_cores(&gpu(0, &[])));
        assert!(!gpu(0, &[]).runs_beside(&gpu(1, &[])));
        assert!(gpu(0, &[2]).runs_beside(&gpu(1, &[2, 3])));
        assert_eq!(
            gpu(0, &[2]).shared_words(&gpu(0, &[2, 3])),
            "GPU 0 and core 2"
        );
        let cpu = |cores: &[usize]| Placement {
            gpu: None,
            cores: cores.to_vec(),
        };
        assert!(cpu(&[]).shares_cores(&cpu(&[1])));
        assert!(!cpu(&[0]).shares_cores(&cpu(&[1])));
        assert_eq!(
            cpu(&[]).shared_words(&cpu(&[])),
            "the host's cores (unpinned)"
        );
        // A slow GPU job beside a GPU neighbour on other cores is the neighbour's.
        let mut v = workload("v", &[0], Some(1.5), victim(20, &[5], 3.0, 0.0));
        v.placement = gpu(0, &[0]);
        let mut n = workload("n", &[1], None, vec![job(0, 49.0, 49.0, 54.0, 99.0, 0.0)]);
        n.placement = gpu(0, &[1]);
        let out = explain_run(&[v, n], &|m: &str| {
            (m == "spin:n").then_some(crate::explain::MemoryFigures {
                dram_gb_s: Some(800.0),
                l2_mib: None,
                source: None,
            })
        });
        let w = &out[0];
        assert!(cause(w, &Cause::neighbour("n")).is_some());
        assert_eq!(w.neighbours[0].shares, "GPU 0");
        assert_eq!(
            w.neighbours[0].memory.as_ref().unwrap().dram_gb_s,
            Some(800.0)
        );
    }

    #[test]
    fn too_few_undisturbed_jobs_take_the_median_of_all() {
        // Every job overlaps the neighbour: its typical is the median of all, and says so.
        let v = workload("v", &[0], Some(1.5), victim(5, &[2], 3.0, 0.0));
        let n = workload("n", &[0], None, vec![job(0, 0.0, 0.0, 60.0, 99.0, 0.0)]);
        let out = explain_run(&[v, n], &none);
        assert_eq!(out[0].typical_service_ms, Some(1.0));
        assert!(
            out[0].typical_from.contains("all 5"),
            "{}",
            out[0].typical_from
        );
    }

    #[test]
    fn a_typical_time_from_a_run_alone_puts_the_usual_slowdown_on_the_neighbour() {
        // Every job ran 2 ms beside `n`, against 1.5 ms; alone it takes 1 ms.
        let jobs: Vec<Job> = (0..20)
            .map(|k| {
                let r = 10.0 * k as f64;
                job(k, r, r, r + 2.0, 1.5, 0.0)
            })
            .collect();
        let v = workload("v", &[0], Some(1.5), jobs);
        let n = workload("n", &[0], None, vec![job(0, 0.0, 0.0, 300.0, 999.0, 0.0)]);
        let own = explain_run(&[v.clone(), n.clone()], &none);
        assert_eq!(
            own[0].causes[0].cause,
            Cause::of(CauseKind::DeadlineBelowTypical),
            "typical from its own disturbed jobs: {:?}",
            own[0].causes
        );
        let alone = typical_times(&[victim_alone()]);
        assert_eq!(alone[0].1, Some(1.0));
        let out = explain_run_against(&[v, n], &none, &|name| {
            (name == "v").then(|| (1.0, "alone".to_string()))
        });
        let w = &out[0];
        assert_eq!(w.typical_from, "alone");
        let by_n = cause(w, &Cause::neighbour("n")).unwrap();
        assert!(
            (by_n.late_pct.unwrap() - 100.0).abs() < 1e-9,
            "{:?}",
            w.causes
        );
        assert!((by_n.time_ms - 20.0).abs() < 1e-9, "{:?}", w.causes);
    }

    fn victim_alone() -> WorkloadRecords {
        workload("v", &[0], Some(1.5), victim(20, &[], 1.0, 0.0))
    }

    #[test]
    fn a_program_is_a_neighbour_all_along_its_run_and_not_explained_itself() {
        let v = workload("v", &[0], Some(1.5), victim(20, &[5], 3.0, 0.0));
        let mut p = workload("prog", &[0], None, Vec::new());
        p.program = Some((45.0, 60.0));
        let out = explain_run(&[v, p], &none);
        assert_eq!(out.len(), 1);
        assert!(cause(&out[0], &Cause::neighbour("prog")).is_some());
    }
}
