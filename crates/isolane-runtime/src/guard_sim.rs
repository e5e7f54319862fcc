//! A replay of trio a's timeline on the H200 (results/h200-levers/trio-a.md: resnet18 in 24
//! SMs and resnet50 in 48, critical at 75 % of their capacity alone, deadline 1.3 × their p99
//! alone; vit_l_32 flat out as best effort in 48 SMs, pieces of about 100 µs; or trio b or c,
//! [`Trio`]) through the
//! guard's own decisions ([`admits_piece`], [`retry_at_piece`], the service estimates), with
//! each job's progress slowed at every instant by the fitted interference model
//! (`isolane_core::predict`: the H200's coefficients and the profiles of `h200-models.csv`)
//! for whatever runs beside it: the other critical model and best effort's pieces. So it
//! checks the decisions against the model they are taken by, not the GPU: "predicted
//! lateness". With `truth` ≠ 1, best effort's pieces really slow the victims `truth` times
//! what the model predicts (the H200's trio a: the model under-predicted what vit_l_32 did to
//! resnet50), which the guard only learns through its closed loop ([`Feedback`]), as on the
//! GPU: the loop's decisions against a world that is not the model. One job in [`OUTLIER_EVERY`] runs [`OUTLIER`] × its time alone (the H200's
//! slow jobs beside the other victim: resnet18 up to 0.58 ms of 0.26): those miss with or
//! without best effort.

use super::*;
use isolane_core::predict::{
    fitted, memory_system, Coefficients, MemoryProfile, MemorySystem, Neighbour, ProfileSource,
    Terms,
};
use isolane_core::spec::Mechanism;

const US: i64 = 1_000;
const STEP: i64 = US;
/// One job in this many is an outlier when the replay has them.
pub const OUTLIER_EVERY: u64 = 211;
const OUTLIER: f64 = 1.8;

/// A model's recorded profile: `h200-models.csv` (fp16, batch 1).
fn profile(model: &str) -> MemoryProfile {
    let csv = include_str!("../../isolane-core/src/predict/h200-models.csv");
    let line = csv
        .lines()
        .find(|l| l.starts_with(&format!("{model},fp16,1,")))
        .unwrap_or_else(|| panic!("{model} not in h200-models.csv"));
    let f: Vec<&str> = line.split(',').collect();
    MemoryProfile {
        dram_bytes_per_job: f[7].parse().unwrap(),
        l2_footprint_bytes: f[8].parse().unwrap(),
        resident: f[9] == "true",
        flops_per_job: 0.0,
        source: ProfileSource::Computed,
    }
}

/// One workload of the trio: trio-a.md's alone figures (capacity /s, p99 ms).
struct Workload {
    name: &'static str,
    exec_ns: i64,
    p99_ns: i64,
    neighbour: Neighbour,
}

fn workload(name: &'static str, capacity_per_s: f64, p99_ms: f64) -> Workload {
    let exec_ms = 1e3 / capacity_per_s;
    Workload {
        name,
        exec_ns: (exec_ms * 1e6) as i64,
        p99_ns: (p99_ms * 1e6) as i64,
        neighbour: Neighbour {
            name: name.into(),
            profile: profile(name),
            exec_ms,
        },
    }
}

struct Critical {
    w: Workload,
    period: i64,
    deadline: i64,
    view: SlotView,
    recent: Option<RecentService>,
    feedback: Option<Feedback>,
    /// The job running: (its release, its work left in ns alone).
    running: Option<(i64, f64)>,
    jobs: u64,
    late: u64,
    latencies: Vec<i64>,
    late_seqs: Vec<i64>,
    outliers: bool,
    rng: u64,
    /// The idle gaps before its jobs and their median, as its publisher keeps them.
    gaps: Gaps,
    gap: Option<i64>,
}

impl Critical {
    fn work(&mut self, seq: u64) -> f64 {
        // A deterministic ±2 % around the time alone (an LCG), and the outliers.
        self.rng = self
            .rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let jitter = ((self.rng >> 33) as f64 / (1u64 << 31) as f64 - 0.5) * 0.04;
        let outlier = if self.outliers && seq % OUTLIER_EVERY == OUTLIER_EVERY - 1 {
            OUTLIER
        } else {
            1.0
        };
        self.w.exec_ns as f64 * (1.0 + jitter) * outlier
    }
}

/// What one replay measured.
#[derive(Debug)]
pub struct Outcome {
    /// Per critical model: (name, late %).
    pub late_pct: Vec<(&'static str, f64)>,
    /// Best effort's time running pieces, of the time (what it gets alone: all of it).
    pub best_effort: f64,
    /// Per critical model, the sequence numbers of its late jobs.
    pub late_seqs: Vec<Vec<i64>>,
    /// Per critical model, its p99 latency (ns).
    pub p99_ns: Vec<i64>,
    /// Per critical model under a closed loop, its gain and budget at the end.
    pub learned: Vec<(f64, f64)>,
    /// The share of the time no critical job ran (the gaps best effort can fill for free).
    pub idle: f64,
    /// Best effort's piece length at the end (ns).
    pub piece_ns: i64,
    /// Where best effort's held time went, as shares of the time ([`Held`]).
    pub held: Held,
}

/// Why the guard held best effort, as shares of the replay's time: the time from a refused
/// decision to the next one, by the guard's own reason ([`why_held`], [`Hold::index`]).
#[derive(Debug, Default, Clone, Copy)]
pub struct Held {
    pub by: [f64; HOLDS.len()],
    /// Of the refusals that were not [`Hold::TooLong`], the share in which the shortest piece
    /// would have been admitted had each critical job's service estimate been its time alone
    /// (+2 %): the estimate (which carries the other critical model's stretch and its
    /// outliers), not the job, left no slack.
    pub estimate: f64,
}

impl Held {
    pub fn of(&self, h: Hold) -> f64 {
        self.by[h.index()]
    }
}

/// Each critical model's deadline: `x` × its p99 alone, or × its p99 in the victims-only
/// replay (the two deadlines).
#[derive(Clone, Copy, Debug)]
pub enum Deadlines {
    Alone(f64),
    Together(f64),
}

/// The guard as it stood before the sharing lever's pacing: its delay charged over the whole
/// overlap and the stall model's decaying maximum as the service estimate.
#[derive(Clone, Copy, PartialEq)]
pub enum Guarding {
    /// No best effort (the victims-only baseline).
    VictimsOnly,
    /// Best effort under a policy, service estimates as that policy's publisher keeps them.
    Guarded(Policy),
    /// Best effort unprotected.
    None,
}

/// Replays `seconds` of trio a under `guarding`, with `deadlines`, with or without `outliers`;
/// best effort's pieces slow each victim `truth` × the model's predicted stretch beyond 1.
pub fn trio_a(
    guarding: Guarding,
    seconds: f64,
    deadlines: Deadlines,
    outliers: bool,
    truth: f64,
) -> Outcome {
    replay(&Replay {
        guarding,
        seconds,
        deadlines,
        outliers,
        truth,
        ..Replay::default()
    })
}

/// One replay's set-up: [`trio_a`]'s arguments, best effort's piece length and the critical
/// models' release phases.
#[derive(Clone, Copy)]
pub struct Replay {
    pub guarding: Guarding,
    pub seconds: f64,
    pub deadlines: Deadlines,
    pub outliers: bool,
    pub truth: f64,
    /// Best effort's job is split into this many pieces (vit_l_32's ~0.95 ms: 10 of ~95 µs).
    pub pieces: i64,
    /// Under a sharing guard, best effort splits its job again once the critical models have
    /// measured their gaps between jobs, as [`BestEffortHold::fit_gaps`] does.
    pub fit_gaps: bool,
    /// Which of the H200 study's trios ([`Trio`]).
    pub trio: Trio,
    /// A held piece asks again every 2 µs ([`HoldWait::Poll`], the H200 runs' thread host on
    /// a machine with a core for it), not at [`retry_at_piece`]'s time ([`HoldWait::Sleep`]).
    pub poll: bool,
}

/// How best effort launches its pieces in a replay ([`replay_launching`]); the default is
/// [`replay`]'s: one piece at a time, each free.
#[derive(Clone, Copy, Debug, Default)]
pub struct Launches {
    /// Best effort in runs of fine pieces (`[protection] fine_piece_us`): its job split into
    /// this many pieces instead of [`Replay::pieces`], each run the longest the guard admits
    /// ([`longest_run`]) of at most the length of one of [`Replay::pieces`]; 0: off.
    pub fine: i64,
    /// What each launch waited for costs best effort after its work: the wait's round trip
    /// and the next launch (ns), time in which it runs nothing on the GPU but which its
    /// pieces' measured lengths, and so their estimates, include. 0: free.
    pub sync_ns: i64,
}

/// The H200 study's trios (scripts/levers-h200.sh), each with its alone figures as recorded
/// (results/h200-levers/trio-*.md: capacity /s, p99 ms), the light CNN first.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Trio {
    /// resnet18:24 + resnet50:48, vit_l_32:48 best effort.
    A,
    /// mobilenet_v2:24 + convnext_base:48, vit_b_16:48 best effort.
    B,
    /// mobilenet_v2:24 + resnet50:48, vit_l_32:48 best effort.
    C,
}

impl Trio {
    fn workloads(self) -> ([Workload; 2], Workload) {
        match self {
            Trio::A => (
                [
                    workload("resnet18", 3982.1, 0.262),
                    workload("resnet50", 2411.5, 0.420),
                ],
                workload("vit_l_32", 1053.2, 0.961),
            ),
            Trio::B => (
                [
                    workload("mobilenet_v2", 2619.6, 0.392),
                    workload("convnext_base", 847.4, 1.198),
                ],
                workload("vit_b_16", 1308.8, 0.781),
            ),
            Trio::C => (
                [
                    workload("mobilenet_v2", 2592.3, 0.403),
                    workload("resnet50", 2411.6, 0.425),
                ],
                workload("vit_l_32", 1027.3, 0.992),
            ),
        }
    }
}

impl Default for Replay {
    fn default() -> Replay {
        Replay {
            guarding: Guarding::VictimsOnly,
            seconds: 1.0,
            deadlines: Deadlines::Alone(1.3),
            outliers: false,
            truth: 1.0,
            pieces: 10,
            fit_gaps: false,
            trio: Trio::A,
            poll: false,
        }
    }
}

/// Replays one of the trios as `r` says.
pub fn replay(r: &Replay) -> Outcome {
    replay_launching(r, Launches::default())
}

/// [`replay`] with best effort's pieces launched as `launches` says.
pub fn replay_launching(r: &Replay, launches: Launches) -> Outcome {
    let Launches { fine, sync_ns } = launches;
    let Replay {
        guarding,
        seconds,
        deadlines,
        outliers,
        truth,
        pieces,
        fit_gaps,
        trio,
        poll,
    } = *r;
    let deadline = |k: usize, p99_alone: i64| match deadlines {
        Deadlines::Alone(x) => (x * p99_alone as f64) as i64,
        Deadlines::Together(x) => {
            let base = replay(&Replay {
                guarding: Guarding::VictimsOnly,
                deadlines: Deadlines::Alone(1e3),
                ..*r
            });
            (x * base.p99_ns[k] as f64) as i64
        }
    };
    let sys: MemorySystem = memory_system("h200").unwrap();
    let coeffs: Coefficients = fitted("h200", Mechanism::Green).unwrap().coefficients;
    let (critical, be) = trio.workloads();
    let mut piece_ns = be.exec_ns / pieces.max(1);
    // With runs, the longest run; the pieces are the fine ones.
    let run_cap = (fine > 0).then_some(piece_ns);
    if fine > 0 {
        piece_ns = be.exec_ns / fine;
    }
    // Best effort's job as pieces: each one's estimate (as `BestEffortHold` keeps them, from
    // the measured lengths of the runs they were in) and the next to run.
    let job_pieces = |piece_ns: i64| (be.exec_ns / piece_ns.max(1)).max(1) as usize;
    let mut est = vec![piece_ns; job_pieces(piece_ns)];
    let mut next_piece = 0usize;
    let intensity = Intensity::of_job(&be.neighbour.profile, be.exec_ns, &sys).unwrap();
    let sharing = matches!(guarding, Guarding::Guarded(p) if p.share.is_some());
    let mut unfitted = fit_gaps && sharing;
    let (looped, margin) = match guarding {
        Guarding::Guarded(p) => (sharing && p.feedback, p.margin_ns),
        _ => (false, 0),
    };
    let mut crit: Vec<Critical> = critical
        .into_iter()
        .enumerate()
        .map(|(i, w)| {
            let period = (1e9 / (0.75 * 1e9 / w.exec_ns as f64)) as i64;
            let deadline = deadline(i, w.p99_ns);
            // The warm-up's estimate: the p99 alone.
            let seed = w.p99_ns;
            let view = SlotView::pending(0, 0, deadline, seed);
            Critical {
                view: if looped {
                    view.with_loop(1.0, CREDIT_JOB)
                } else {
                    view
                },
                recent: (sharing && !looped).then(|| RecentService::new(seed)),
                feedback: looped.then(|| Feedback::new(seed)),
                period,
                deadline,
                w,
                running: None,
                jobs: 0,
                late: 0,
                latencies: Vec::new(),
                late_seqs: Vec::new(),
                outliers,
                rng: 0x5eed + i as u64,
                gaps: Gaps::new(),
                gap: None,
            }
        })
        .collect();
    // Each critical model's stretch beside: [the other running][best effort running].
    let stretch: Vec<[[f64; 2]; 2]> = (0..crit.len())
        .map(|k| {
            let victim_ms = crit[k].w.exec_ns as f64 / 1e6;
            let of = |other: bool, be_on: bool| {
                let mut beside: Vec<Neighbour> = Vec::new();
                if other {
                    beside.push(crit[1 - k].w.neighbour.clone());
                }
                if be_on {
                    beside.push(be.neighbour.clone());
                }
                coeffs.stretch(&Terms::beside(&beside, victim_ms, &sys))
            };
            let real = |other: bool| {
                let without = of(other, false);
                without + truth * (of(other, true) - without)
            };
            [
                [of(false, false), real(false)],
                [of(true, false), real(true)],
            ]
        })
        .collect();
    let end_t = (seconds * 1e9) as i64;
    // The run in progress: when its work ends, when it ends (its wait seen and the next
    // launch made), its first piece and how many.
    let mut piece_end: Option<(i64, i64, usize, usize)> = None;
    // When the last admitted piece was to end (the guard file's `be_until`).
    let mut be_until = i64::MIN;
    let mut retry = 0i64;
    let mut busy = 0i64;
    let mut idle_steps = 0i64;
    // The reason of the last refusal (a [`Hold::index`], and whether the estimate made it) and
    // the steps held for each.
    let mut reason: Option<(usize, bool)> = None;
    let mut held_steps = [0i64; HOLDS.len()];
    let mut estimate_steps = 0i64;
    let mut t = 0;
    while t < end_t {
        // Starts: a released job whose workload is free.
        for c in crit.iter_mut() {
            if c.running.is_none() && c.view.release <= t {
                c.view.start = t.max(1);
                let work = c.work(c.view.seq as u64);
                c.running = Some((c.view.release, work));
            }
        }
        if crit.iter().all(|c| c.running.is_none()) {
            idle_steps += 1;
        }
        // Progress over this step, each slowed by what runs beside it: best effort's work
        // until the step in which it ends (that step counts whole, as the critical jobs' do).
        let be_on = piece_end.is_some_and(|(work, ..)| t < work + STEP)
            && guarding != Guarding::VictimsOnly;
        for k in 0..crit.len() {
            let Some((release, left)) = crit[k].running else {
                continue;
            };
            let other_on = crit
                .iter()
                .enumerate()
                .any(|(j, o)| j != k && o.running.is_some());
            let s = stretch[k][usize::from(other_on)][usize::from(be_on)];
            let left = left - STEP as f64 / s;
            let c = &mut crit[k];
            if left > 0.0 {
                c.running = Some((release, left));
                continue;
            }
            // Ended: recorded, the estimate updated as `CriticalPublisher::ended` does, the
            // next job published.
            let done = t + STEP;
            c.jobs += 1;
            c.latencies.push(done - release);
            if done - release > c.deadline {
                c.late += 1;
                c.late_seqs.push(c.view.seq);
            }
            let v = c.view;
            let overlap = if v.acct_seq == v.seq {
                v.acct_overlap
            } else {
                0
            };
            let sample = (done - v.start - overlap).max(0);
            let (mut gain_milli, mut credit) = (v.gain_milli, v.credit);
            let service = match (c.feedback.as_mut(), c.recent.as_mut()) {
                // As `CriticalPublisher::ended` and `apply_learned` do.
                (Some(fb), _) => {
                    let clean = be_until < v.start;
                    let l = fb.ended(&v, done, done - v.start, clean, margin);
                    gain_milli = l.gain_milli.max(1);
                    if l.backed_off {
                        credit = credit.min(0);
                    }
                    credit = (credit + l.credit).min(CREDIT_CAP);
                    l.service
                }
                (None, Some(r)) => r.push(sample),
                (None, None) => decaying_max(v.service, sample),
            };
            let next = v.seq + 1;
            let release = next * c.period;
            c.gaps.last_end = done;
            if let Some(m) = c.gaps.released(release) {
                c.gap = Some(m);
            }
            c.view = SlotView {
                acct_seq: v.acct_seq,
                acct_overlap: v.acct_overlap,
                gain_milli,
                credit,
                ..SlotView::pending(next, release, release + c.deadline, service)
            };
            c.running = None;
        }
        // Best effort: a piece ends, or the next one asks.
        if let Some((_, e, first, k)) = piece_end {
            if t >= e {
                busy += piece_ns * k as i64;
                // As `BestEffortHold` measures a run: its work and the wait's round trip.
                apportion(&mut est[first..first + k], piece_ns * k as i64 + sync_ns);
                next_piece = (first + k) % est.len();
                piece_end = None;
            }
        }
        if unfitted && piece_end.is_none() && crit.iter().all(|c| c.gap.is_some()) {
            piece_ns = gap_piece_ns(crit.iter().filter_map(|c| c.gap).min(), piece_ns);
            est = vec![piece_ns; job_pieces(piece_ns)];
            next_piece = 0;
            unfitted = false;
        }
        if piece_end.is_none() && t >= retry {
            reason = None;
            // The next piece's estimate is what a piece alone asks for (without runs, the
            // scenario's piece length: the estimates never move when `sync_ns` is 0).
            let first_ns = est[next_piece];
            let run = |t: i64, k: usize| {
                let work = t + piece_ns * k as i64;
                Some((work, work + sync_ns, next_piece, k))
            };
            match guarding {
                Guarding::VictimsOnly => {}
                Guarding::None => piece_end = run(t, 1),
                Guarding::Guarded(policy) => {
                    let i = Some(&intensity);
                    let held = crit
                        .iter()
                        .filter(|c| admits_piece(&c.view, t, first_ns, &policy, i).is_none())
                        .map(|c| retry_at_piece(&c.view, t, &policy, i))
                        .min();
                    match held {
                        Some(at) => {
                            retry = if poll { t + 2 * US } else { at };
                            let refusing = crit
                                .iter()
                                .position(|c| {
                                    admits_piece(&c.view, t, first_ns, &policy, i).is_none()
                                })
                                .unwrap_or(0);
                            let others = crit
                                .iter()
                                .enumerate()
                                .filter(|(k, _)| *k != refusing)
                                .map(|(_, c)| c.view);
                            let why =
                                why_held(&crit[refusing].view, others, t, first_ns, &policy, i);
                            let alone = crit.iter().all(|c| {
                                let v = SlotView {
                                    service: c.w.exec_ns * 102 / 100,
                                    ..c.view
                                };
                                admits_piece(&v, t, MIN_PIECE_NS, &policy, i).is_some()
                            });
                            reason = Some((why.index(), why != Hold::TooLong && alone));
                        }
                        None => {
                            // As `Guard::try_run_why` chooses the run (one piece without
                            // runs) and `Guard::reserve` reserves a piece of its total.
                            let k = match run_cap {
                                Some(cap) => longest_run(&est[next_piece..], cap, |len| {
                                    crit.iter().all(|c| {
                                        admits_piece(&c.view, t, len, &policy, i).is_some()
                                    })
                                }),
                                None => 1,
                            };
                            let len: i64 = est[next_piece..next_piece + k].iter().sum();
                            for c in crit.iter_mut() {
                                let o = admits_piece(&c.view, t, len, &policy, i).unwrap();
                                if o == 0 {
                                    continue;
                                }
                                if c.view.acct_seq != c.view.seq {
                                    c.view.acct_seq = c.view.seq;
                                    c.view.acct_overlap = 0;
                                    if c.view.gain_milli > 0 {
                                        c.view.credit -= CREDIT_JOB;
                                    }
                                }
                                c.view.acct_overlap += o;
                            }
                            piece_end = run(t, k);
                            be_until = be_until.max(t + len);
                        }
                    }
                }
            }
        }
        if piece_end.is_none() {
            if let Some((k, estimate)) = reason {
                held_steps[k] += 1;
                estimate_steps += i64::from(estimate);
            }
        }
        t += STEP;
    }
    let share = |n: i64| (n * STEP) as f64 / end_t as f64;
    Outcome {
        held: Held {
            by: held_steps.map(share),
            estimate: share(estimate_steps),
        },
        learned: crit
            .iter()
            .filter_map(|c| c.feedback.as_ref().map(|f| (f.gain(), f.budget())))
            .collect(),
        late_pct: crit
            .iter()
            .map(|c| (c.w.name, 100.0 * c.late as f64 / c.jobs.max(1) as f64))
            .collect(),
        best_effort: busy as f64 / end_t as f64,
        idle: (idle_steps * STEP) as f64 / end_t as f64,
        piece_ns,
        late_seqs: crit.iter().map(|c| c.late_seqs.clone()).collect(),
        p99_ns: crit
            .iter_mut()
            .map(|c| {
                c.latencies.sort_unstable();
                let n = c.latencies.len();
                c.latencies.get(n * 99 / 100).copied().unwrap_or(0)
            })
            .collect(),
    }
}
