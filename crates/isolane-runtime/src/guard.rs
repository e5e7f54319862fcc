//! The criticality guard: best-effort work runs only when it cannot make a critical job late
//! (docs/criticality.md).
//!
//! Every critical workload publishes, lock-free, the job it is about to run or running: its
//! release, absolute deadline, start and expected service time. A best-effort workload asks
//! before each piece of its job ([`BestEffortHold::before_piece`]) and is held back while the
//! piece would eat more of some critical job's slack than is left. The model is deliberately
//! conservative: a best-effort piece that overlaps a critical job for `o` ns may delay it by up
//! to `o` (a full stall), so the overlaps reserved against one critical job never add up to more
//! than its slack: `deadline − margin − (start or release) − service`. Under that bound a
//! critical job meets its deadline whenever its service time is within its estimate, whatever
//! the sharing mechanism does to it meanwhile; best effort gets the gaps between critical jobs
//! and the slack inside them.
//!
//! The state lives in a small shared memory file, so that worker processes (`host = "process"`)
//! take part exactly like threads: the coordinator creates it, each worker maps it by path.
//! Critical workloads only store to their own slot (their release loop never waits on a lock);
//! best-effort workloads decide under a spin lock taken only by best-effort workloads.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;

use memmap2::MmapMut;

use serde::{Deserialize, Serialize};

use crate::clock;
use crate::exec::{ExecError, Executor};

const MAGIC: i64 = 0x0150_1a4e_6a7e;

/// What a critical slot says of its workload.
const UNKNOWN: i64 = 0;
const PUBLISHED: i64 = 1;
const FINISHED: i64 = 2;
/// A served critical model with nothing queued: a request may arrive at any moment, due
/// `deadline` ns (a relative deadline in this state) after it.
const IDLE: i64 = 3;

/// One critical workload's published state, in the shared file (thirteen 8-byte words).
#[repr(C)]
struct Slot {
    state: AtomicI64,
    seq: AtomicI64,
    release: AtomicI64,
    deadline: AtomicI64,
    /// Start of the published job, 0 while it has not started.
    start: AtomicI64,
    service: AtomicI64,
    /// Written by best-effort workloads under the lock: overlap reserved against job `acct_seq`.
    acct_seq: AtomicI64,
    acct_overlap: AtomicI64,
    /// This workload's own stretch beside best effort, in thousandths (0: the run's policy).
    stretch_milli: AtomicI64,
    /// Written by the critical workload itself: how long it held its published job between its
    /// pieces so far, yielding to another critical job (`[protection] slack_order`). It delays
    /// the job's end as best effort's overlap does, so it counts against the job's slack.
    held: AtomicI64,
    /// The closed loop of a sharing guard ([`Feedback`]), written by the critical workload at
    /// each job's end: the measured delay per unit of the model's, in thousandths (0: no loop,
    /// the model's charge stands).
    gain_milli: AtomicI64,
    /// Its budget's credit, in thousandths of a job: best effort may begin overlapping a job
    /// only by spending [`CREDIT_JOB`] of it (subtracted under the lock).
    credit: AtomicI64,
    /// Under a sharing guard: the median idle time before the workload's recent jobs (its
    /// next release less its last job's end, 0 when queued), plus 1; 0 while not measured.
    /// Best effort sizes its pieces to it ([`gap_piece_ns`]).
    gap: AtomicI64,
}

/// The file's first words: magic, slot count, the best-effort lock, and when the last
/// admitted best-effort piece is expected to end (a critical job that began after it ran
/// without best effort: the loop's clean samples).
#[repr(C)]
struct Header {
    magic: AtomicI64,
    slots: AtomicI64,
    lock: AtomicI64,
    be_until: AtomicI64,
}

/// A plain copy of a slot, as one decision sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SlotView {
    pub state: i64,
    pub seq: i64,
    pub release: i64,
    pub deadline: i64,
    pub start: i64,
    pub service: i64,
    pub acct_seq: i64,
    pub acct_overlap: i64,
    /// The workload's own stretch in thousandths; 0: the run's policy decides.
    pub stretch_milli: i64,
    /// Held between its own pieces so far, yielding to another critical job.
    pub held: i64,
    /// The loop's measured delay per unit of the model's, in thousandths (0: no loop).
    pub gain_milli: i64,
    /// The loop's budget credit, in thousandths of a job.
    pub credit: i64,
}

impl SlotView {
    /// A critical job published and waiting for (or past) its release.
    pub fn pending(seq: i64, release: i64, deadline: i64, service: i64) -> SlotView {
        SlotView {
            state: PUBLISHED,
            seq,
            release,
            deadline,
            start: 0,
            service,
            acct_seq: -1,
            acct_overlap: 0,
            stretch_milli: 0,
            held: 0,
            gain_milli: 0,
            credit: 0,
        }
    }

    /// The same job under a sharing guard's closed loop: the measured `gain` on the model's
    /// delay and `credit` thousandths of a job of budget.
    pub fn with_loop(self, gain: f64, credit: i64) -> SlotView {
        SlotView {
            gain_milli: (gain * 1000.0).round().max(1.0) as i64,
            credit,
            ..self
        }
    }

    /// The loop's gain on the model's delay (1 without a loop).
    fn gain(&self) -> f64 {
        if self.gain_milli > 0 {
            self.gain_milli as f64 / 1000.0
        } else {
            1.0
        }
    }

    /// Whether best effort may not begin overlapping this job: a loop runs, nothing was
    /// reserved against the job yet and its budget has no whole job of credit left.
    fn over_budget(&self) -> bool {
        self.gain_milli > 0 && self.acct_seq != self.seq && self.credit < CREDIT_JOB
    }

    /// The same job, its workload stating its own stretch beside best effort.
    pub fn with_stretch(self, stretch: f64) -> SlotView {
        SlotView {
            stretch_milli: stretch_milli(Some(stretch)),
            ..self
        }
    }

    /// Delay per ns of overlap for this job: its workload's own stretch, else (with
    /// `[protection] share`) the stretch the piece's memory intensity is predicted to cause it,
    /// else the run's.
    fn delay_per_overlap(&self, policy: &Policy, piece: Option<&Intensity>) -> f64 {
        if self.stretch_milli >= 1000 {
            return 1.0 - 1000.0 / self.stretch_milli as f64;
        }
        match (policy.share, piece) {
            (Some(model), Some(i)) => 1.0 - 1.0 / model.stretch(i, self.service),
            _ => policy.delay_per_overlap,
        }
    }

    pub fn finished() -> SlotView {
        SlotView {
            state: FINISHED,
            ..SlotView::pending(0, 0, 0, 0)
        }
    }

    pub fn unknown() -> SlotView {
        SlotView {
            state: UNKNOWN,
            ..SlotView::pending(0, 0, 0, 0)
        }
    }

    /// When the published job runs from: its start, or (not started yet) its release but no
    /// earlier than `now`.
    fn begins(&self, now: i64) -> i64 {
        if self.start > 0 {
            self.start
        } else {
            self.release.max(now)
        }
    }

    /// Whether the published job begins more than the margin after its release: it waited for
    /// the job before it, which overran, and the jobs released behind it are queued too, with
    /// less slack than it shows. (In the replay of trio a, every miss the sharing guard added
    /// was such a job, one to four behind a slow one.)
    fn backlog(&self, now: i64) -> bool {
        self.begins(now).saturating_sub(self.release) > BACKLOG_NS
    }

    /// The delay best effort has reserved against the published job, and the time it held
    /// itself yielding to other critical jobs.
    fn reserved(&self) -> i64 {
        self.overlap_reserved().saturating_add(self.held)
    }

    /// Best effort's reservation alone (the delay its pieces may still add).
    fn overlap_reserved(&self) -> i64 {
        if self.acct_seq == self.seq {
            self.acct_overlap
        } else {
            0
        }
    }

    /// When the published job is expected to end: from its start (or release, not before
    /// `now`), its service estimate and the delays reserved against it.
    fn expected_end(&self, now: i64) -> i64 {
        self.begins(now)
            .saturating_add(self.service)
            .saturating_add(self.reserved())
    }
}

/// How a run's guard judges a piece.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Policy {
    /// Kept free before every critical deadline (ns).
    pub margin_ns: i64,
    /// Delay a critical job may suffer per ns of overlap with best effort: 1 (a full stall, the
    /// default) or `1 − 1/stretch` for a stated worst stretch (`[protection] stretch`).
    pub delay_per_overlap: f64,
    /// A critical job with slack delays its start while a critical job without slack runs, as
    /// long as it still ends in time itself (`[protection] slack_order`; [`yields`]).
    #[serde(default)]
    pub slack_order: bool,
    /// Best-effort pieces are charged the stretch their memory intensity is predicted to cause
    /// (`[protection] share`), by this device's fitted model; `None`: the stall or stated model.
    #[serde(default)]
    pub share: Option<ShareModel>,
    /// L2 set aside for each critical model's weights (MiB; `[protection] l2_persist_mib`),
    /// applied when its workload attaches ([`Executor::persist_weights_in_l2`]).
    #[serde(default)]
    pub l2_persist_mib: u64,
    /// A sharing guard's closed loop ([`Feedback`]): each critical workload measures what the
    /// pieces admitted beside its jobs really cost them and corrects the model's charge, and
    /// a budget per critical workload bounds the share of its jobs best effort may overlap.
    /// On with `share` ([`Policy::of`]); off: the fitted model alone (open loop).
    #[serde(default)]
    pub feedback: bool,
    /// Best effort in runs of fine pieces (`[protection] fine_piece_us`, ns; 0: off): a
    /// best-effort job is split into pieces this long, and before each run the guard admits
    /// the longest run of them that fits ([`Guard::try_run_why`]), at most the scenario's
    /// piece length, launched back to back and waited for once.
    #[serde(default)]
    pub fine_piece_ns: i64,
}

impl Policy {
    pub fn new(margin_ns: i64, stretch: Option<f64>) -> Policy {
        Policy {
            margin_ns,
            delay_per_overlap: stretch.map_or(1.0, |s| (1.0 - 1.0 / s).clamp(0.0, 1.0)),
            slack_order: false,
            share: None,
            l2_persist_mib: 0,
            feedback: false,
            fine_piece_ns: 0,
        }
    }

    /// The policy a scenario's `[protection]` table asks for; `share` is the device's model,
    /// used only when the table turns `share` on (none is fitted for the device, or the
    /// mechanism is not one that splits the SMs only: the stall or stated model stays).
    pub fn of(p: &isolane_core::spec::ProtectionSpec, share: Option<ShareModel>) -> Policy {
        Policy {
            slack_order: p.slack_order,
            share: if p.share { share } else { None },
            feedback: p.share && share.is_some(),
            l2_persist_mib: p.l2_persist_mib,
            fine_piece_ns: p.fine_piece_us as i64 * 1000,
            ..Policy::new(p.margin_us as i64 * 1000, p.stretch)
        }
    }
}

/// The interference model a sharing guard charges best-effort pieces by
/// (`isolane_core::predict`): a victim's stretch is `1 + dram × DRAM + l2 × L2`, the piece's
/// share of the device's DRAM bandwidth and of its L2.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ShareModel {
    /// Stretch per unit of DRAM share.
    pub dram: f64,
    /// Stretch per unit of L2 share.
    pub l2: f64,
    /// The device's peak DRAM bandwidth (bytes/s) and L2 (bytes), the shares' scales.
    pub dram_bytes_per_s: f64,
    pub l2_bytes: u64,
}

impl ShareModel {
    /// The fitted model of a device model under a mechanism (`None` where nothing is fitted).
    pub fn fitted(device_model: &str, mechanism: isolane_core::spec::Mechanism) -> Option<Self> {
        let f = isolane_core::predict::fitted(device_model, mechanism)?;
        let sys = isolane_core::predict::memory_system(device_model)?;
        Some(ShareModel {
            dram: f.coefficients.dram,
            l2: f.coefficients.l2,
            dram_bytes_per_s: sys.dram_bytes_per_s,
            l2_bytes: sys.l2_bytes,
        })
    }

    fn memory_system(&self) -> isolane_core::predict::MemorySystem {
        isolane_core::predict::MemorySystem {
            dram_bytes_per_s: self.dram_bytes_per_s,
            l2_bytes: self.l2_bytes,
        }
    }

    /// The stretch a piece of intensity `i` is predicted to cause a critical job of
    /// `victim_service_ns` (a streaming piece pushes more of the L2 through the longer the
    /// victim runs). Never below 1, and 1 for figures that are not numbers.
    pub fn stretch(&self, i: &Intensity, victim_service_ns: i64) -> f64 {
        let l2 = (i.l2_resident + i.l2_per_ns * victim_service_ns.max(0) as f64).clamp(0.0, 1.0);
        let s = 1.0 + self.dram * i.dram + self.l2 * l2;
        if s.is_finite() {
            s.max(1.0)
        } else {
            f64::INFINITY
        }
    }
}

/// What a best-effort piece asks of the memory system while it runs, as shares of the
/// device's (from `isolane_core::predict::MemoryProfile` and its measured length).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Intensity {
    /// Its DRAM bandwidth as a share of the device's peak.
    pub dram: f64,
    /// The share of the L2 it keeps (its weights and activations stay there).
    pub l2_resident: f64,
    /// The share of the L2 it pushes through per ns (a streaming piece).
    pub l2_per_ns: f64,
}

impl Intensity {
    /// A job's figures spread evenly over its `job_ns`: each of its pieces takes the job's
    /// bandwidth. `None` for a job without a length.
    pub fn of_job(
        p: &isolane_core::predict::MemoryProfile,
        job_ns: i64,
        sys: &isolane_core::predict::MemorySystem,
    ) -> Option<Intensity> {
        if job_ns <= 0 || sys.dram_bytes_per_s <= 0.0 || sys.l2_bytes == 0 {
            return None;
        }
        let bytes_per_ns = p.dram_bytes_per_job / job_ns as f64;
        let l2 = sys.l2_bytes as f64;
        Some(Intensity {
            dram: (bytes_per_ns * 1e9 / sys.dram_bytes_per_s).max(0.0),
            l2_resident: if p.resident {
                (p.l2_footprint_bytes / l2).clamp(0.0, 1.0)
            } else {
                0.0
            },
            l2_per_ns: if p.resident {
                0.0
            } else {
                (bytes_per_ns / l2).max(0.0)
            },
        })
    }
}

/// Why the guard held a best-effort piece: where best effort's held time goes
/// ([`BestEffortHold`] adds it up and its run's log says it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    /// A piece of [`MIN_PIECE_NS`] would have been admitted: the piece was longer than the
    /// slack (or the gap before a release) left.
    TooLong,
    /// A critical job running had no slack left for even the shortest piece: its service
    /// estimate and what was already reserved against it took it all.
    Running,
    /// A critical job not begun yet (waiting for its release or for its predecessor) had no
    /// slack left for the shortest piece overlapping it.
    Next,
    /// A critical workload between two jobs (its next release not yet published) or before its
    /// first.
    Between,
    /// A sharing guard's closed loop: the critical workload's budget of overlapped jobs had
    /// no whole job of credit left.
    Budget,
    /// A sharing guard: a critical job began over 20 µs after its release (an overrun before
    /// it queued the jobs behind it).
    Backlog,
    /// A sharing guard: a critical job ran past its service estimate (its end is unknown).
    Overrun,
}

/// The holds in the order [`Hold::index`] numbers them, with the words the log uses.
pub const HOLDS: [(Hold, &str); 7] = [
    (Hold::TooLong, "too long for the slack"),
    (Hold::Running, "no slack in a running critical job"),
    (Hold::Next, "no slack before the next critical job"),
    (Hold::Between, "between critical jobs"),
    (Hold::Budget, "the sharing loop's budget spent"),
    (Hold::Backlog, "a critical backlog"),
    (Hold::Overrun, "a critical job past its estimate"),
];

impl Hold {
    /// Its place in [`HOLDS`], which lists the holds in their declaration order.
    pub fn index(self) -> usize {
        self as usize
    }
}

/// Why a piece of `piece_ns` at `now` was refused: `refusing` is the slot that refused it,
/// `others` the rest. [`Hold::TooLong`] when every slot would admit the shortest piece, else
/// what the first slot refusing that one is.
pub fn why_held(
    refusing: &SlotView,
    others: impl IntoIterator<Item = SlotView>,
    now: i64,
    piece_ns: i64,
    policy: &Policy,
    piece: Option<&Intensity>,
) -> Hold {
    let short = piece_ns.min(MIN_PIECE_NS);
    let refuses = |v: &SlotView| admits_piece(v, now, short, policy, piece).is_none();
    let blocking = if refuses(refusing) {
        Some(*refusing)
    } else {
        others.into_iter().find(|v| refuses(v))
    };
    let Some(v) = blocking else {
        return Hold::TooLong;
    };
    // As `admits_piece` tests them, in its order.
    let partial = v.delay_per_overlap(policy, piece) < 1.0 && v.state == PUBLISHED;
    match v.state {
        UNKNOWN => Hold::Between,
        _ if v.state == PUBLISHED && v.over_budget() => Hold::Budget,
        _ if partial && v.start > 0 && v.expected_end(now) <= now => Hold::Overrun,
        _ if partial && v.backlog(now) => Hold::Backlog,
        _ if v.start > 0 => Hold::Running,
        _ => Hold::Next,
    }
}

/// The delay (ns) a piece of `piece_ns` started at `now` could add to the critical job `v`
/// describes, if its slack allows it (the delay to reserve), or `None`: hold the piece.
pub fn admits(v: &SlotView, now: i64, piece_ns: i64, policy: &Policy) -> Option<i64> {
    admits_piece(v, now, piece_ns, policy, None)
}

/// [`admits`] for a piece of a known memory intensity: with `[protection] share`, the piece
/// is charged the delay its intensity is predicted to cause (a compute-heavy piece little of
/// its overlap, a memory-heavy one more), not a full stall.
pub fn admits_piece(
    v: &SlotView,
    now: i64,
    piece_ns: i64,
    policy: &Policy,
    piece: Option<&Intensity>,
) -> Option<i64> {
    match v.state {
        FINISHED => return Some(0),
        // Between two of its jobs (or before its first): its next release is not known yet,
        // and may be now.
        UNKNOWN => return None,
        // A request arriving now would wait for the whole piece at worst: the piece fits when
        // that leaves the request its service time. Nothing is reserved: the request the
        // reservation would be for does not exist yet.
        IDLE => {
            // A request with the model's deadline could not be met even alone (serve refuses
            // it up front): holding best effort would protect nothing and starve it for good
            // (seen on the H200: an MPS-served critical model slower than its deadline).
            if v.deadline < v.service {
                return Some(0);
            }
            let slack = v
                .deadline
                .saturating_sub(policy.margin_ns)
                .saturating_sub(v.service);
            let f = v.delay_per_overlap(policy, piece);
            let delay = gained(charge(piece_ns, v.service, f), f, v);
            return (delay <= slack).then_some(0);
        }
        _ => {}
    }
    let from = v.begins(now).max(now);
    let overlap = now.saturating_add(piece_ns).saturating_sub(from);
    if overlap <= 0 {
        return Some(0);
    }
    let f = v.delay_per_overlap(policy, piece);
    let end = v.expected_end(now);
    // Under a partial stretch, which spends a job's slack to the end, best effort waits for a
    // job that runs past its estimate (its end is unknown) and for a backlog (see
    // [`SlotView::backlog`]). Under the stall model, as before, a piece is charged its whole
    // overlap against what is left before the deadline.
    if v.over_budget() || f < 1.0 && (v.start > 0 && end <= now || v.backlog(now)) {
        return None;
    }
    let delay = gained(charge(overlap, end.saturating_sub(from), f), f, v);
    let slack = v
        .deadline
        .saturating_sub(policy.margin_ns)
        .saturating_sub(end);
    if delay > slack {
        return None;
    }
    // A piece that outlasts the job (the rest of it charged, not the whole overlap) runs into
    // the workload's next job, not published yet: it must fit that job's slack too, were it
    // released the moment this one ends.
    let spill = now
        .saturating_add(piece_ns)
        .saturating_sub(end.saturating_add(delay));
    if f < 1.0 && spill > 0 {
        let next_slack = v
            .deadline
            .saturating_sub(v.release)
            .saturating_sub(policy.margin_ns)
            .saturating_sub(v.service);
        if gained(charge(spill, v.service, f), f, v) > next_slack {
            return None;
        }
    }
    Some(delay)
}

/// How many of the pieces whose estimates `est` lists, in order, run as one run: the most
/// whose estimated total `fits` (every critical job admits a piece that long), within `cap_ns`
/// in all, but always the first (the caller has checked that it fits; 0 for no pieces).
/// Admission is monotone in a piece's length: a longer piece overlaps every critical job at
/// least as long and is charged at least as much ([`admits_piece`], [`charge`]). So the
/// longest run is bisected, a few looks at the slots whatever the number of pieces.
pub fn longest_run(est: &[i64], cap_ns: i64, mut fits: impl FnMut(i64) -> bool) -> usize {
    let Some(&first) = est.first() else {
        return 0;
    };
    // The most pieces the cap allows (at least the first).
    let mut most = 1;
    let mut sum = first;
    while most < est.len() {
        let next = sum.saturating_add(est[most]);
        if next > cap_ns {
            break;
        }
        sum = next;
        most += 1;
    }
    // `lo` fits; the longest that fits is in lo..=hi.
    let (mut lo, mut hi) = (1, most);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if fits(run_ns(&est[..mid])) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

/// A run's estimated length: its pieces' estimates added (saturating).
fn run_ns(est: &[i64]) -> i64 {
    est.iter().fold(0i64, |a, &e| a.saturating_add(e))
}

/// A partial stretch's charge times the loop's measured gain ([`Feedback`]); the stall
/// model's (`f` = 1) is already the worst a piece can do.
fn gained(delay: i64, f: f64, v: &SlotView) -> i64 {
    if f < 1.0 {
        (delay as f64 * v.gain()).round() as i64
    } else {
        delay
    }
}

/// The delay a piece adds to a critical job it overlaps for `overlap` ns, `remaining` ns of
/// the job's own work left when the overlap begins, charged `f` = 1 − 1/s per ns of overlap
/// (stretch s): `overlap × f` while the job outlasts the piece, but no more than
/// `remaining × (s − 1)`, the whole rest of the job stretched, when the piece outlasts the
/// job. Under the stall model (f = 1) the job makes no progress beside the piece, so the
/// whole overlap is charged whatever is left.
fn charge(overlap: i64, remaining: i64, f: f64) -> i64 {
    let beside = overlap as f64 * f;
    let delay = if f < 1.0 {
        beside.min(remaining.max(0) as f64 * f / (1.0 - f))
    } else {
        beside
    };
    delay.round() as i64
}

/// When a piece held back by the critical job `v` describes is worth asking about again:
/// when that job is expected to end (its start, or release, plus its service estimate and the
/// delay already reserved against it), within [[`POLL_NS`], [`MAX_HOLD_SLEEP_NS`]] from now.
/// Between two jobs the next release is published within microseconds: soon.
pub fn retry_at(v: &SlotView, now: i64) -> i64 {
    retry_at_piece(v, now, &Policy::new(0, None), None)
}

/// [`retry_at`] under a partial stretch (`[protection] share` or a stated `stretch`): a held
/// piece is charged less the closer the job is to its end ([`charge`]: the rest of the job
/// stretched), so it fits once what is left of the job, stretched, fits the job's slack:
/// `slack / (s − 1)` before its expected end, not at the end. Paced, not stalled.
pub fn retry_at_piece(v: &SlotView, now: i64, policy: &Policy, piece: Option<&Intensity>) -> i64 {
    let soon = now + POLL_NS as i64;
    if v.state != PUBLISHED {
        return soon;
    }
    let end = v.expected_end(now);
    let f = v.delay_per_overlap(policy, piece);
    let slack = v
        .deadline
        .saturating_sub(policy.margin_ns)
        .saturating_sub(end);
    // Charged gain × f / (1 − f) per ns of the job left; over budget, not before the next job.
    let at = if f > 0.0 && f < 1.0 && slack > 0 && !v.backlog(now) && !v.over_budget() {
        end.saturating_sub((slack as f64 * (1.0 - f) / (f * v.gain())) as i64)
    } else {
        end
    };
    at.clamp(soon, now + MAX_HOLD_SLEEP_NS)
}

/// Whether critical job `me` (its next piece of `piece_ns` started `now`, `remaining_ns` of its
/// service still to run) yields to critical job `other`, and until when (`[protection]
/// slack_order`). It yields only when all of these hold:
///
/// - its piece would run while `other` does;
/// - `other` has no slack for it: the delay the piece may cause (the run's delay model) is more
///   than what is left before `other`'s deadline less the margin;
/// - `me` has more slack than `other`, and still ends in time (margin kept) if it waits until
///   `other`'s expected end.
///
/// So a job never yields itself late, and of two jobs only the one with more slack yields:
/// they never wait for each other.
pub fn yields(
    me: &SlotView,
    remaining_ns: i64,
    other: &SlotView,
    now: i64,
    piece_ns: i64,
    policy: &Policy,
) -> Option<i64> {
    if other.state != PUBLISHED || me.deadline == i64::MAX || other.deadline == i64::MAX {
        return None;
    }
    let other_begins = other.begins(now);
    let overlap = now
        .saturating_add(piece_ns)
        .saturating_sub(other_begins.max(now));
    if overlap <= 0 {
        return None;
    }
    let other_end = other.expected_end(now);
    let other_slack = other
        .deadline
        .saturating_sub(policy.margin_ns)
        .saturating_sub(other_end);
    let delay = (overlap as f64 * policy.delay_per_overlap).round() as i64;
    if delay <= other_slack {
        return None;
    }
    // `me` is running (its start is published) or about to: what is left of it runs from now.
    // Its own holds are past (in `now`); best effort's reservation may still delay it.
    let my_end = now
        .saturating_add(remaining_ns)
        .saturating_add(me.overlap_reserved());
    let my_slack = me
        .deadline
        .saturating_sub(policy.margin_ns)
        .saturating_sub(my_end);
    let wait = other_end.saturating_sub(now).max(0);
    (my_slack > other_slack && my_slack >= wait).then_some(other_end)
}

/// The shortest piece best effort is split into to fit a gap (`[protection] piece_us`'s own
/// lower bound): each piece is a launch waited for, whose cost grows with their number.
pub const MIN_PIECE_NS: i64 = 20_000;

/// The idle gaps a critical workload's median is taken over, and how many it needs first.
const GAP_JOBS: usize = 64;
const GAP_MIN_JOBS: usize = 16;

/// The piece length a sharing guard gives best effort: half the narrowest of the critical
/// workloads' median gaps between jobs (`narrowest_gap`, `None`: none to fit), at most the
/// scenario's `piece_us`; the scenario's where half a gap is under [`MIN_PIECE_NS`]. On the
/// H200 (session 22) the gaps at 75 % load were 2–30 µs, not the replay's ~47 µs, and pieces
/// cut to the 20 µs floor (about 180 a vit_l_32 job) fitted none of them and cost more than
/// they gave: trio a at 1.3 × the victims-only p99, best effort 20.9 % against the default
/// guard's 37.3 %, with more critical misses (0.39 / 0.11 % against 0.12 / 0.00 %).
///
/// Why: a critical model with little slack inside its jobs (a light CNN at a deadline of
/// 1.3 × its p99 alone, beside another critical model) leaves best effort only the time between
/// them, and a piece admitted there must end before its next release. At 75 % load resnet18's
/// gaps are about 85 µs: vit_l_32's 100 µs pieces fitted none of them, and best effort got 1 %
/// on the H200; pieces of half a gap fit about two a gap (the replay: 17 % instead of 0.6 %).
pub fn gap_piece_ns(narrowest_gap: Option<i64>, configured_ns: i64) -> i64 {
    let most = configured_ns.max(MIN_PIECE_NS);
    match narrowest_gap {
        Some(g) if g / 2 >= MIN_PIECE_NS => (g / 2).min(most),
        _ => configured_ns,
    }
}

/// A critical workload's recent idle gaps before its jobs (a sharing guard's publisher).
#[derive(Debug, Clone)]
struct Gaps {
    ring: Vec<i64>,
    next: usize,
    /// When its last job ended (0: none yet).
    last_end: i64,
    scratch: Vec<i64>,
}

impl Gaps {
    fn new() -> Gaps {
        Gaps {
            ring: Vec::with_capacity(GAP_JOBS),
            next: 0,
            last_end: 0,
            scratch: Vec::with_capacity(GAP_JOBS),
        }
    }

    /// The next job is released at `release`: records its gap and returns the median gap once
    /// [`GAP_MIN_JOBS`] are in.
    fn released(&mut self, release: i64) -> Option<i64> {
        if self.last_end <= 0 {
            return None;
        }
        let gap = release.saturating_sub(self.last_end).max(0);
        if self.ring.len() < GAP_JOBS {
            self.ring.push(gap);
        } else {
            self.ring[self.next] = gap;
        }
        self.next = (self.next + 1) % GAP_JOBS;
        if self.ring.len() < GAP_MIN_JOBS {
            return None;
        }
        self.scratch.clear();
        self.scratch.extend_from_slice(&self.ring);
        let n = self.scratch.len();
        Some(*self.scratch.select_nth_unstable(n / 2).1)
    }
}

/// How late after its release a job may begin before a sharing guard takes it for a backlog
/// ([`SlotView::backlog`]): more than a release loop's wake-up (it spins the last `spin_us`),
/// and not the margin, which a user raises to be safer (a looser backlog test would not be).
const BACKLOG_NS: i64 = 20_000;

/// Longest sleep of a held piece before it asks again, whatever the estimates say (they may be
/// high: a job that ends early must not keep best effort asleep long).
const MAX_HOLD_SLEEP_NS: i64 = 200_000;

/// The shared state of one run's guard.
pub struct Guard {
    map: MmapMut,
    slots: usize,
    policy: Policy,
    /// Removes the file when the coordinator's guard is dropped (workers' guards have none).
    _file: Option<tempfile::TempPath>,
}

impl std::fmt::Debug for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard").field("slots", &self.slots).finish()
    }
}

fn file_len(slots: usize) -> usize {
    std::mem::size_of::<Header>() + slots * std::mem::size_of::<Slot>()
}

impl Guard {
    /// Creates the guard of a run with `slots` critical workloads, in a new file under
    /// /dev/shm (or the temporary directory), whose path the workers are given.
    pub fn create(slots: usize, policy: Policy) -> std::io::Result<Guard> {
        let dir = Path::new("/dev/shm");
        let builder = tempfile::Builder::new()
            .prefix("isolane-guard-")
            .tempfile_in(if dir.is_dir() {
                dir.to_path_buf()
            } else {
                std::env::temp_dir()
            });
        let file = builder?;
        file.as_file().set_len(file_len(slots) as u64)?;
        // SAFETY: the file is ours, just sized, and only ever accessed through atomics.
        let map = unsafe { MmapMut::map_mut(file.as_file())? };
        let g = Guard {
            map,
            slots,
            policy,
            _file: Some(file.into_temp_path()),
        };
        g.header().slots.store(slots as i64, Ordering::Relaxed);
        g.header().magic.store(MAGIC, Ordering::Release);
        Ok(g)
    }

    /// Maps the guard file a coordinator created (a worker process's side).
    pub fn open(path: &Path, policy: Policy) -> std::io::Result<Guard> {
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        let len = file.metadata()?.len() as usize;
        if len < file_len(0) {
            return Err(std::io::Error::other("the guard file is too short"));
        }
        // SAFETY: the coordinator created and sized the file; all access goes through atomics.
        let map = unsafe { MmapMut::map_mut(&file)? };
        let mut g = Guard {
            map,
            slots: 0,
            policy,
            _file: None,
        };
        let h = g.header();
        let slots = h.slots.load(Ordering::Relaxed);
        if h.magic.load(Ordering::Acquire) != MAGIC || slots < 0 || file_len(slots as usize) > len {
            return Err(std::io::Error::other("not an isolane guard file"));
        }
        g.slots = slots as usize;
        Ok(g)
    }

    /// The file's path (`None` for a worker's mapping).
    pub fn path(&self) -> Option<PathBuf> {
        self._file.as_ref().map(|p| p.to_path_buf())
    }

    pub fn policy(&self) -> Policy {
        self.policy
    }

    fn header(&self) -> &Header {
        // SAFETY: the map is page-aligned and at least a header long (checked at creation and
        // opening); Header is atomics only, valid for any bit pattern, shared by design.
        unsafe { &*(self.map.as_ptr() as *const Header) }
    }

    fn slot(&self, i: usize) -> &Slot {
        assert!(i < self.slots, "guard slot {i} of {}", self.slots);
        let off = std::mem::size_of::<Header>() + i * std::mem::size_of::<Slot>();
        let p = self.map[off..off + std::mem::size_of::<Slot>()].as_ptr();
        // SAFETY: a slot-sized range of the map (bounds-checked just above), 8-byte aligned
        // (header and slots are multiples of 8 from a page-aligned base); atomics only.
        unsafe { &*(p as *const Slot) }
    }

    /// Slot `i` as one decision sees it (what a critical workload last published).
    pub fn view(&self, i: usize) -> SlotView {
        let s = self.slot(i);
        SlotView {
            state: s.state.load(Ordering::Acquire),
            seq: s.seq.load(Ordering::Acquire),
            release: s.release.load(Ordering::Acquire),
            deadline: s.deadline.load(Ordering::Acquire),
            start: s.start.load(Ordering::Acquire),
            service: s.service.load(Ordering::Relaxed),
            acct_seq: s.acct_seq.load(Ordering::Relaxed),
            acct_overlap: s.acct_overlap.load(Ordering::Relaxed),
            stretch_milli: s.stretch_milli.load(Ordering::Relaxed),
            held: s.held.load(Ordering::Relaxed),
            gain_milli: s.gain_milli.load(Ordering::Relaxed),
            credit: s.credit.load(Ordering::Relaxed),
        }
    }

    /// Slot `i`'s workload has ended, whatever its own side last said (the coordinator calls
    /// this when a workload's driver returns: a killed worker never says so itself).
    pub fn finish(&self, i: usize) {
        if i < self.slots {
            self.slot(i).state.store(FINISHED, Ordering::Release);
        }
    }

    fn lock(&self) -> LockGuard<'_> {
        let l = &self.header().lock;
        while l
            .compare_exchange_weak(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            std::hint::spin_loop();
        }
        LockGuard(l)
    }

    /// Tries to start a best-effort piece of `piece_ns` now: reserves the delay it may add to every
    /// critical job it would overlap and returns true, or returns false and reserves nothing.
    pub fn try_piece(&self, piece_ns: i64) -> Result<(), i64> {
        self.try_piece_with(piece_ns, None)
    }

    /// [`Guard::try_piece`] for a piece of a known memory intensity ([`admits_piece`]).
    pub fn try_piece_with(&self, piece_ns: i64, piece: Option<&Intensity>) -> Result<(), i64> {
        self.try_piece_why(piece_ns, piece).map_err(|(at, _)| at)
    }

    /// [`Guard::try_piece_with`], saying on a refusal why the piece was held ([`Hold`]).
    pub fn try_piece_why(
        &self,
        piece_ns: i64,
        piece: Option<&Intensity>,
    ) -> Result<(), (i64, Hold)> {
        let _l = self.lock();
        let now = clock::now_ns();
        if let Some(refused) = self.refusal(now, piece_ns, piece) {
            return Err(refused);
        }
        self.reserve(now, piece_ns, piece);
        Ok(())
    }

    /// Tries to start a run of best effort's next pieces, whose estimates `est` lists in order
    /// (`[protection] fine_piece_us`): under one lock, the longest run of them every critical
    /// job admits ([`longest_run`]: at least the first piece, at most `cap_ns` in all), its
    /// delay reserved as for one piece of the run's total length. Returns how many pieces, or,
    /// as [`Guard::try_piece_why`] does, why the first piece alone was held and when to ask
    /// again.
    pub fn try_run_why(
        &self,
        est: &[i64],
        cap_ns: i64,
        piece: Option<&Intensity>,
    ) -> Result<usize, (i64, Hold)> {
        let _l = self.lock();
        self.run_at(clock::now_ns(), est, cap_ns, piece)
    }

    /// [`Guard::try_run_why`]'s decision at `now`, the lock held.
    fn run_at(
        &self,
        now: i64,
        est: &[i64],
        cap_ns: i64,
        piece: Option<&Intensity>,
    ) -> Result<usize, (i64, Hold)> {
        let Some(&first) = est.first() else {
            return Ok(0);
        };
        if let Some(refused) = self.refusal(now, first, piece) {
            return Err(refused);
        }
        let k = longest_run(est, cap_ns, |len| self.admitted(now, len, piece));
        self.reserve(now, run_ns(&est[..k]), piece);
        Ok(k)
    }

    /// Whether every critical job admits a piece of `piece_ns` at `now` (the lock held).
    fn admitted(&self, now: i64, piece_ns: i64, piece: Option<&Intensity>) -> bool {
        (0..self.slots)
            .all(|i| admits_piece(&self.view(i), now, piece_ns, &self.policy, piece).is_some())
    }

    /// Why a piece of `piece_ns` may not start at `now`, and when to ask again; `None` when
    /// every critical job admits it (the lock held).
    fn refusal(&self, now: i64, piece_ns: i64, piece: Option<&Intensity>) -> Option<(i64, Hold)> {
        // Two passes over the slots with the same `now` (no allocation): check all here, then
        // reserve ([`Guard::reserve`]). A critical slot may change in between (it never takes
        // the lock); the second pass reserves what it sees then, which is what the next
        // decision will count.
        let mut refused: Option<(i64, usize, SlotView)> = None;
        for i in 0..self.slots {
            let v = self.view(i);
            if admits_piece(&v, now, piece_ns, &self.policy, piece).is_none() {
                let at = retry_at_piece(&v, now, &self.policy, piece);
                refused = Some(refused.map_or((at, i, v), |(a, k, first)| (a.min(at), k, first)));
            }
        }
        let (at, k, first) = refused?;
        // The others read again: a slot that changed meanwhile may name the hold wrongly,
        // never the decision.
        let others = (0..self.slots).filter(|&j| j != k).map(|j| self.view(j));
        Some((
            at,
            why_held(&first, others, now, piece_ns, &self.policy, piece),
        ))
    }

    /// Reserves against every critical job the delay an admitted piece of `piece_ns` started
    /// at `now` may add to it (the lock held).
    fn reserve(&self, now: i64, piece_ns: i64, piece: Option<&Intensity>) {
        for i in 0..self.slots {
            let v = self.view(i);
            let Some(o) = admits_piece(&v, now, piece_ns, &self.policy, piece) else {
                continue;
            };
            if o == 0 {
                continue;
            }
            let s = self.slot(i);
            if v.acct_seq != v.seq {
                s.acct_seq.store(v.seq, Ordering::Relaxed);
                s.acct_overlap.store(0, Ordering::Relaxed);
                if v.gain_milli > 0 {
                    s.credit.fetch_sub(CREDIT_JOB, Ordering::Relaxed);
                }
            }
            s.acct_overlap.fetch_add(o, Ordering::Relaxed);
        }
        self.header()
            .be_until
            .fetch_max(now.saturating_add(piece_ns), Ordering::Relaxed);
    }
}

impl Guard {
    /// The narrowest of the live critical workloads' median gaps ([`Slot::gap`]): `None` while
    /// one of them has not measured its gaps yet, `Some(None)` when none is live.
    pub fn narrowest_gap(&self) -> Option<Option<i64>> {
        let mut narrowest = None;
        for i in 0..self.slots {
            let s = self.slot(i);
            if s.state.load(Ordering::Acquire) == FINISHED {
                continue;
            }
            let g = s.gap.load(Ordering::Relaxed);
            if g <= 0 {
                return None;
            }
            narrowest = Some(narrowest.map_or(g - 1, |n: i64| n.min(g - 1)));
        }
        Some(narrowest)
    }
}

impl Guard {
    /// Whether critical slot `me`'s next piece of `piece_ns` may start now, `remaining_ns` of its
    /// job still to run: `Err(retry_at)` while it yields to another critical job ([`yields`]).
    /// Lock-free: critical workloads only read the others' slots.
    pub fn critical_may_run(&self, me: usize, remaining_ns: i64, piece_ns: i64) -> Result<(), i64> {
        if !self.policy.slack_order || me >= self.slots {
            return Ok(());
        }
        let now = clock::now_ns();
        let mine = self.view(me);
        let until = (0..self.slots)
            .filter(|&i| i != me)
            .filter_map(|i| {
                yields(
                    &mine,
                    remaining_ns,
                    &self.view(i),
                    now,
                    piece_ns,
                    &self.policy,
                )
            })
            .min();
        match until {
            Some(at) => Err(at.clamp(now + POLL_NS as i64, now + MAX_HOLD_SLEEP_NS)),
            None => Ok(()),
        }
    }
}

struct LockGuard<'a>(&'a AtomicI64);

impl Drop for LockGuard<'_> {
    fn drop(&mut self) {
        self.0.store(0, Ordering::Release);
    }
}

/// A critical workload's side: publishes each job before its release and when it starts/ends.
pub struct CriticalPublisher {
    guard: Arc<Guard>,
    slot: usize,
    /// Under a sharing guard: the recent service times the estimate is taken from
    /// ([`RecentService`]); `None`: the decaying maximum.
    recent: Option<std::sync::Mutex<RecentService>>,
    /// Under a sharing guard's closed loop ([`Policy::feedback`]): the loop, which keeps the
    /// estimate itself (`recent` is then `None`).
    feedback: Option<std::sync::Mutex<Feedback>>,
    /// Under a sharing guard: the idle gaps before its jobs, published for best effort's
    /// pieces ([`Slot::gap`]).
    gaps: Option<std::sync::Mutex<Gaps>>,
}

/// The service estimate of a sharing guard (`[protection] share`): about the 99th percentile of
/// the last [`RECENT_JOBS`] jobs (the warm-up's estimate counting as one of them until it ages
/// out). Not the decaying maximum of the stall model: beside another critical model a job's
/// service time has outliers (on the H200, resnet18 up to 0.58 ms of 0.26 beside resnet50),
/// and a maximum that one outlier raises for a hundred jobs leaves no slack at all, so best
/// effort got nothing. An outlier past the deadline misses with or without best effort; the
/// guard protects the jobs that can still be met.
#[derive(Debug, Clone)]
pub struct RecentService {
    ring: Vec<i64>,
    next: usize,
    /// Where the quantile is selected (allocated once: no allocation per job).
    scratch: Vec<i64>,
}

/// How many jobs a sharing guard's service estimate looks back on.
pub const RECENT_JOBS: usize = 256;

impl RecentService {
    pub fn new(seed_ns: i64) -> RecentService {
        let mut r = RecentService {
            ring: Vec::with_capacity(RECENT_JOBS),
            next: 0,
            scratch: Vec::with_capacity(RECENT_JOBS),
        };
        r.push(seed_ns);
        r
    }

    /// Adds a job's service time and returns the new estimate: the sample that 1 in 100 of
    /// the window is above (the maximum while fewer than 100 are in).
    pub fn push(&mut self, sample_ns: i64) -> i64 {
        let sample = sample_ns.max(0);
        if self.ring.len() < RECENT_JOBS {
            self.ring.push(sample);
        } else {
            self.ring[self.next] = sample;
        }
        self.next = (self.next + 1) % RECENT_JOBS;
        self.scratch.clear();
        self.scratch.extend_from_slice(&self.ring);
        let n = self.scratch.len();
        *self.scratch.select_nth_unstable(n - 1 - n / 100).1
    }
}

/// Credit (thousandths) that best effort spends to begin overlapping one critical job.
pub const CREDIT_JOB: i64 = 1000;
/// The most credit a budget banks: two jobs, so that a budget that grew while best effort was
/// elsewhere is not spent on a run of consecutive jobs.
const CREDIT_CAP: i64 = 2 * CREDIT_JOB;
/// A budget's share of jobs best effort may overlap: where it starts, its floor (best effort
/// keeps probing, so the gain stays measured), its ceiling (one job in eight at least runs
/// without best effort: the clean samples the gain is measured against) and its growth per
/// job that kept its slack.
const BUDGET_START: f64 = 0.25;
const BUDGET_MIN: f64 = 1.0 / 32.0;
const BUDGET_MAX: f64 = 7.0 / 8.0;
const BUDGET_STEP: f64 = 1.0 / 64.0;
/// A job that ends within max(margin, this part of its relative deadline) of its deadline
/// backs its budget off.
const NEAR_PART: i64 = 32;
/// A job without best effort moves the gain this part of the way back towards 1.
const GAIN_RELAX_JOBS: f64 = 256.0;
/// The gain's bounds: the model may be wrong by much, not without limit.
const GAIN_MIN: f64 = 0.5;
const GAIN_MAX: f64 = 16.0;
/// Weight of one job in the loop's running figures (about the last 16 count).
const LOOP_WEIGHT: f64 = 1.0 / 16.0;
/// The prior of the gain: the model's charge, as if 50 µs of it had been measured exactly (a
/// first overlapped job's noise does not set the gain alone).
const GAIN_PRIOR_NS: f64 = 50_000.0;

/// A sharing guard's closed loop for one critical workload (`[protection] share`): the
/// fitted model is an open-loop guess (on the H200 it under-predicted what vit_l_32's pieces
/// did to resnet50, 3.88 % late), so each finished job corrects it:
///
/// - **gain**: the job's service time beyond the mean of its clean jobs (no best effort
///   beside them), over the delay the model charged the pieces admitted beside it, summed
///   over the last jobs: the measured delay per unit of the model's. The guard charges each
///   piece the model's delay times this gain.
/// - **budget**: the share of its jobs best effort may begin to overlap (credit a job's
///   end adds and an overlap's first piece spends). A job that ends within max(margin, an
///   eighth of its relative deadline) of its deadline, or late, or begins behind a backlog,
///   halves it and voids the credit at once; each job that kept its slack adds 1/64.
///
/// So whatever the model says, a victim near its deadline sees best effort's overlap cut
/// within one job, and best effort regains it only while the victim's jobs keep slack.
#[derive(Debug, Clone)]
pub struct Feedback {
    recent: RecentService,
    clean_mean: f64,
    excess: f64,
    charged: f64,
    gain: f64,
    budget: f64,
    last_overlapped: bool,
}

/// What a finished job teaches the loop: the slot's new service estimate, gain (thousandths)
/// and the credit to add; `backed_off`: void the credit first.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Learned {
    pub service: i64,
    pub gain_milli: i64,
    pub credit: i64,
    pub backed_off: bool,
}

impl Feedback {
    pub fn new(seed_ns: i64) -> Feedback {
        Feedback {
            recent: RecentService::new(seed_ns),
            clean_mean: seed_ns.max(0) as f64,
            excess: GAIN_PRIOR_NS,
            charged: GAIN_PRIOR_NS,
            gain: 1.0,
            budget: BUDGET_START,
            last_overlapped: false,
        }
    }

    pub fn gain(&self) -> f64 {
        self.gain
    }

    pub fn budget(&self) -> f64 {
        self.budget
    }

    /// Job `v` (as published at its end: its release, deadline, start and best effort's
    /// reservation, charged with the gain in `v`) ran `service_ns` of its own (its holds
    /// excluded) and ended at `end`. `clean`: no best-effort piece was admitted since it
    /// began (one charged to the job before may have run into it: such a job teaches nothing).
    pub fn ended(
        &mut self,
        v: &SlotView,
        end: i64,
        service_ns: i64,
        clean: bool,
        margin_ns: i64,
    ) -> Learned {
        let service = service_ns.max(0) as f64;
        let reserved = v.overlap_reserved();
        let sample = if reserved > 0 {
            let model = reserved as f64 / v.gain();
            // Not clipped at 0: a job faster than the clean mean is evidence too (clipping
            // biased the gain upwards by the jobs' own jitter: 1.2 where the truth was 1).
            let excess = service - self.clean_mean;
            self.excess = self.excess * (1.0 - LOOP_WEIGHT) + excess;
            self.charged = self.charged * (1.0 - LOOP_WEIGHT) + model;
            self.gain = (self.excess / self.charged).clamp(GAIN_MIN, GAIN_MAX);
            // The estimate stays the job's own service time: what best effort added, as now
            // measured, is taken out.
            (service - self.gain * model).max(0.0)
        } else {
            if clean {
                self.clean_mean += (service - self.clean_mean) * LOOP_WEIGHT;
            }
            // A gain that keeps best effort out entirely is never measured again: without
            // new evidence it drifts back towards the model's (the budget catches a probe
            // that finds it was right). In the replay of trio a a gain of 1.2 learned in its
            // first jobs otherwise held best effort for good.
            self.excess += (self.charged - self.excess) / GAIN_RELAX_JOBS;
            self.gain = (self.excess / self.charged).clamp(GAIN_MIN, GAIN_MAX);
            service
        };
        let relative = v.deadline.saturating_sub(v.release);
        let near = relative.saturating_sub(margin_ns.max(relative / NEAR_PART));
        let backed_off = v.deadline != i64::MAX
            && (end.saturating_sub(v.release) > near || v.backlog(end) && self.last_overlapped);
        self.last_overlapped = reserved > 0;
        self.budget = if backed_off {
            (self.budget / 2.0).max(BUDGET_MIN)
        } else {
            (self.budget + BUDGET_STEP).min(BUDGET_MAX)
        };
        Learned {
            service: self.recent.push(sample.round() as i64),
            gain_milli: (self.gain * 1000.0).round() as i64,
            credit: (self.budget * CREDIT_JOB as f64).round() as i64,
            backed_off,
        }
    }
}

/// Applies what a job taught ([`Feedback::ended`]) to a slot's words: the estimate and gain
/// stored, the credit voided on a back-off, then topped up to at most [`CREDIT_CAP`] (best
/// effort only subtracts it, under its lock: a race leaves it off by one top-up at worst).
fn apply_learned(s: &Slot, l: &Learned) {
    s.service.store(l.service, Ordering::Relaxed);
    s.gain_milli.store(l.gain_milli.max(1), Ordering::Relaxed);
    if l.backed_off {
        s.credit.fetch_min(0, Ordering::Relaxed);
    }
    let c = s.credit.fetch_add(l.credit, Ordering::Relaxed) + l.credit;
    if c > CREDIT_CAP {
        s.credit.fetch_sub(c - CREDIT_CAP, Ordering::Relaxed);
    }
}

impl CriticalPublisher {
    /// Slot `slot` of `guard`, with `service_ns` as the first estimate of a job's service time
    /// (from the warm-up) and the workload's own `stretch` beside best effort, if it states one
    /// (otherwise the run's policy charges its overlaps).
    pub fn new(
        guard: Arc<Guard>,
        slot: usize,
        service_ns: i64,
        stretch: Option<f64>,
    ) -> CriticalPublisher {
        let s = guard.slot(slot);
        s.service.store(service_ns.max(0), Ordering::Relaxed);
        // No job charged yet (the file starts zeroed, and the first job is number 0).
        s.acct_seq.store(-1, Ordering::Relaxed);
        s.acct_overlap.store(0, Ordering::Relaxed);
        s.stretch_milli
            .store(stretch_milli(stretch), Ordering::Relaxed);
        let policy = guard.policy();
        let looped = policy.share.is_some() && policy.feedback;
        let recent = (policy.share.is_some() && !looped)
            .then(|| std::sync::Mutex::new(RecentService::new(service_ns)));
        let feedback = looped.then(|| std::sync::Mutex::new(Feedback::new(service_ns)));
        let gaps = policy
            .share
            .is_some()
            .then(|| std::sync::Mutex::new(Gaps::new()));
        s.gap.store(0, Ordering::Relaxed);
        if looped {
            s.gain_milli.store(1000, Ordering::Relaxed);
            s.credit.store(CREDIT_JOB, Ordering::Relaxed);
        }
        CriticalPublisher {
            guard,
            slot,
            recent,
            feedback,
            gaps,
        }
    }

    fn s(&self) -> &Slot {
        self.guard.slot(self.slot)
    }

    /// Job `seq` is next: released at `release` (absolute), due at `deadline`.
    pub fn pending(&self, seq: u64, release: i64, deadline: Option<i64>) {
        let s = self.s();
        if let Some(g) = &self.gaps {
            if let Some(median) = g
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .released(release)
            {
                s.gap.store(median.saturating_add(1), Ordering::Relaxed);
            }
        }
        s.start.store(0, Ordering::Release);
        s.held.store(0, Ordering::Release);
        s.seq.store(seq as i64, Ordering::Release);
        s.release.store(release, Ordering::Release);
        s.deadline
            .store(deadline.unwrap_or(i64::MAX), Ordering::Release);
        s.state.store(PUBLISHED, Ordering::Release);
    }

    pub fn started(&self, start: i64) {
        self.s().start.store(start.max(1), Ordering::Release);
    }

    /// The job ended after `service_ns`: the slot goes back to "unknown" until the next job is
    /// published, and the service estimate follows it (a decaying maximum, so one slow job
    /// raises it at once and it relaxes over about a hundred jobs). The overlap reserved
    /// against the job is subtracted first: under the stall model it is what best effort
    /// may have added.
    pub fn ended(&self, seq: u64, service_ns: i64) {
        let s = self.s();
        if let Some(g) = &self.gaps {
            let start = s.start.load(Ordering::Acquire);
            g.lock().unwrap_or_else(|e| e.into_inner()).last_end = start.saturating_add(service_ns);
        }
        if let Some(fb) = &self.feedback {
            let v = self.guard.view(self.slot);
            s.state.store(UNKNOWN, Ordering::Release);
            let own = (service_ns - v.held).max(0);
            let end = v.start.saturating_add(service_ns);
            let clean = self.guard.header().be_until.load(Ordering::Relaxed) < v.start;
            let v = SlotView {
                // A reservation against another job (the one before) is not this one's.
                acct_overlap: if v.acct_seq == seq as i64 {
                    v.acct_overlap
                } else {
                    0
                },
                acct_seq: v.seq,
                ..v
            };
            let l = fb.lock().unwrap_or_else(|e| e.into_inner()).ended(
                &v,
                end,
                own,
                clean,
                self.guard.policy().margin_ns,
            );
            apply_learned(s, &l);
            return;
        }
        s.state.store(UNKNOWN, Ordering::Release);
        let overlap = if s.acct_seq.load(Ordering::Relaxed) == seq as i64 {
            s.acct_overlap.load(Ordering::Relaxed)
        } else {
            0
        };
        let sample = (service_ns - overlap - s.held.load(Ordering::Relaxed)).max(0);
        let est = s.service.load(Ordering::Relaxed);
        let next = match &self.recent {
            Some(r) => r.lock().unwrap_or_else(|e| e.into_inner()).push(sample),
            None => decaying_max(est, sample),
        };
        s.service.store(next, Ordering::Relaxed);
    }

    /// Blocks while the current job's next piece (of `piece_ns`, `remaining_ns` of the job left)
    /// yields to another critical job, or until `stop`; `started`: the job has begun, so the
    /// hold delays its published end (before its start, its begin moves with the clock).
    /// Returns the time held.
    pub fn yield_before_piece(
        &self,
        remaining_ns: i64,
        piece_ns: i64,
        started: bool,
        stop: &AtomicBool,
    ) -> i64 {
        let t = clock::now_ns();
        let mut last = t;
        while self
            .guard
            .critical_may_run(self.slot, remaining_ns, piece_ns)
            .is_err()
        {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            // Polled, not slept: a critical job that yields resumes within microseconds of the
            // other's end (a sleeping thread wakes tens of microseconds late).
            poll_pause();
            let now = clock::now_ns();
            if started {
                self.s().held.fetch_add(now - last, Ordering::Relaxed);
            }
            last = now;
        }
        last - t
    }

    /// Replaces the service estimate (an app's, once its first frames have measured it).
    pub fn set_estimate(&self, service_ns: i64) {
        self.s().service.store(service_ns.max(0), Ordering::Relaxed);
    }

    /// Nothing queued (a served model): a request may arrive at any moment, due `deadline_ns`
    /// after it (`None`: no deadline, nothing to protect).
    pub fn idle(&self, deadline_ns: Option<i64>) {
        let s = self.s();
        s.start.store(0, Ordering::Release);
        s.deadline
            .store(deadline_ns.unwrap_or(i64::MAX), Ordering::Release);
        s.state.store(IDLE, Ordering::Release);
    }

    /// No more jobs: best effort no longer has to leave room for this workload.
    pub fn finished(&self) {
        self.s().state.store(FINISHED, Ordering::Release);
    }
}

impl Drop for CriticalPublisher {
    /// A workload that ends (or fails) frees best effort from waiting on it.
    fn drop(&mut self) {
        self.finished();
    }
}

/// A best-effort workload's side: holds each piece until the guard admits it.
pub struct BestEffortHold {
    guard: Arc<Guard>,
    /// Estimated length of each piece (ns): about the 90th percentile of the measured ones
    /// ([`track_upper_quantile`]).
    piece_ns: Vec<i64>,
    /// The warm-up's estimate of each piece, which a held piece's estimate relaxes back to.
    seed_ns: Vec<i64>,
    /// The run in progress: its first piece, how many pieces, and when it was admitted (a
    /// piece alone is a run of one).
    current: Option<(usize, usize, i64)>,
    /// With fine pieces (`[protection] fine_piece_us`): the longest run, the scenario's piece
    /// length; `None`: one piece at a time.
    run_cap_ns: Option<i64>,
    /// Held so far in the current job.
    held_ns: i64,
    wait: HoldWait,
    /// Each piece's memory intensity (the job's, spread evenly), for a sharing guard.
    intensity: Option<Intensity>,
    /// Under a sharing guard, until its pieces are sized to the critical workloads' gaps: the
    /// scenario's piece length and the warm-up's job length ([`BestEffortHold::fit_gaps`]).
    unfitted: Option<(i64, i64)>,
    /// Where its time went, said in the run's log at its end ([`HoldAccount`]).
    account: HoldAccount,
}

/// A best-effort workload's time under the guard: held, by why ([`Hold`]), and running
/// pieces. Dropped with its hold, it says so on stderr (the run's log), one line, so that a
/// GPU run tells where best effort's time went without a profiler.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HoldAccount {
    /// Held ns by [`Hold::index`].
    pub held_ns: [i64; HOLDS.len()],
    /// Running pieces: ns from admission to the next ask (its launch, run and wait).
    pub ran_ns: i64,
    /// Launches waited for: pieces, or with fine pieces runs of them.
    pub pieces: u64,
    /// With fine pieces (`[protection] fine_piece_us`): the fine pieces those runs held (0
    /// without: `pieces` are then the pieces themselves).
    pub fine_pieces: u64,
    /// From its first ask to its last piece's end.
    pub first: i64,
    pub last: i64,
}

impl HoldAccount {
    /// One line for the run's log (`None` before any piece ran): every figure in ms, and the
    /// shares of the time from the first ask to the last piece's end.
    pub fn line(&self) -> Option<String> {
        if self.pieces == 0 {
            return None;
        }
        let ms = |ns: i64| ns as f64 / 1e6;
        let span = (self.last - self.first).max(1);
        let pct = |ns: i64| 100.0 * ns as f64 / span as f64;
        let held: i64 = self.held_ns.iter().sum();
        let parts: Vec<String> = HOLDS
            .iter()
            .zip(self.held_ns)
            .map(|((_, words), ns)| format!("{words} {:.1} ms ({:.1} %)", ms(ns), pct(ns)))
            .collect();
        if self.fine_pieces > 0 {
            return Some(format!(
                "best effort time: {:.1} ms; ran {} runs {:.1} ms ({:.1} %, {:.1} µs a run; {} \
                 fine pieces, {:.2} a run); held {:.1} ms ({:.1} %): {}",
                ms(span),
                self.pieces,
                ms(self.ran_ns),
                pct(self.ran_ns),
                self.ran_ns as f64 / self.pieces as f64 / 1e3,
                self.fine_pieces,
                self.fine_pieces as f64 / self.pieces as f64,
                ms(held),
                pct(held),
                parts.join(", ")
            ));
        }
        Some(format!(
            "best effort time: {:.1} ms; ran {} pieces {:.1} ms ({:.1} %, {:.1} µs a piece); \
             held {:.1} ms ({:.1} %): {}",
            ms(span),
            self.pieces,
            ms(self.ran_ns),
            pct(self.ran_ns),
            self.ran_ns as f64 / self.pieces as f64 / 1e3,
            ms(held),
            pct(held),
            parts.join(", ")
        ))
    }
}

/// The shortest sleep of a held piece between two looks at the guard. Sleeping (not spinning)
/// frees the core when best effort and critical work share one.
const POLL_NS: u64 = 20_000;

impl BestEffortHold {
    pub fn new(guard: Arc<Guard>, wait: HoldWait) -> BestEffortHold {
        set_fine_timer_slack();
        BestEffortHold {
            guard,
            piece_ns: Vec::new(),
            seed_ns: Vec::new(),
            current: None,
            run_cap_ns: None,
            held_ns: 0,
            wait,
            intensity: None,
            unfitted: None,
            account: HoldAccount::default(),
        }
    }

    /// Where its time went so far.
    pub fn account(&self) -> &HoldAccount {
        &self.account
    }

    /// Once every live critical workload has measured its gaps between jobs, splits `exec`
    /// again into pieces of [`gap_piece_ns`] where that is shorter than the scenario's (once:
    /// a re-split captures the pieces again). Returns the new piece length when it split.
    pub fn fit_gaps(&mut self, exec: &mut dyn Executor) -> Option<i64> {
        let (configured, job_ns) = self.unfitted?;
        let narrowest = self.guard.narrowest_gap()?;
        self.unfitted = None;
        let piece = gap_piece_ns(narrowest, configured);
        if piece >= configured {
            return None;
        }
        exec.split(piece);
        self.seed_estimate(exec.pieces(), job_ns);
        eprintln!(
            "best effort: pieces of {} µs ({} a job) to fit the critical workloads' gaps \
             (the narrowest median gap: {} µs; [protection] piece_us = {})",
            piece / 1000,
            exec.pieces(),
            narrowest.unwrap_or(0) / 1000,
            configured / 1000
        );
        Some(piece)
    }

    /// Seeds the estimate of a whole job (one piece) from the warm-up's service times.
    pub fn seed_estimate(&mut self, pieces: usize, job_ns: i64) {
        let per = job_ns / pieces.max(1) as i64;
        self.piece_ns = vec![per.max(1); pieces.max(1)];
        self.seed_ns = self.piece_ns.clone();
    }

    /// Blocks until piece `i` of the current job may start (or `stop` is raised). Returns the
    /// time it was held.
    pub fn before_piece(&mut self, i: usize, stop: &AtomicBool) -> i64 {
        self.hold_for(i, i + 1, None, stop).1
    }

    /// Blocks until a run of the job's pieces from `i` (of `pieces` in the job) may start (or
    /// `stop` is raised): with fine pieces, the longest run the guard admits
    /// ([`Guard::try_run_why`]), at most the scenario's piece length; without, piece `i` alone.
    /// Returns how many pieces (at least 1, at most those left) and the time it was held.
    pub fn before_run(&mut self, i: usize, pieces: usize, stop: &AtomicBool) -> (usize, i64) {
        self.hold_for(i, pieces.max(i + 1), self.run_cap_ns, stop)
    }

    /// Holds until the guard admits a run from piece `i` (of `n`) within `cap` (`None`: the
    /// piece alone): returns its length in pieces and the time held.
    fn hold_for(
        &mut self,
        i: usize,
        n: usize,
        cap: Option<i64>,
        stop: &AtomicBool,
    ) -> (usize, i64) {
        self.end_piece();
        if self.piece_ns.len() < n {
            self.piece_ns.resize(n, 1);
        }
        let seed = self.seed_ns.get(i).copied().unwrap_or(1);
        let t = clock::now_ns();
        if self.account.first == 0 {
            self.account.first = t;
        }
        let mut now = t;
        let k = loop {
            let est = &self.piece_ns[i..n];
            let asked = match cap {
                Some(cap) => self.guard.try_run_why(est, cap, self.intensity.as_ref()),
                None => self
                    .guard
                    .try_piece_why(est[0], self.intensity.as_ref())
                    .map(|()| 1),
            };
            let (at, why) = match asked {
                Ok(k) => break k.max(1),
                Err(held) => held,
            };
            if stop.load(Ordering::Relaxed) {
                break 1;
            }
            // An estimate raised by pieces that ran preempted (a flood beside them) is only
            // lowered by pieces that run; held, none does, and one above every gap would hold
            // best effort for good (seen serving: idle critical models, best effort stuck).
            // So while held it relaxes towards the warm-up's estimate, never below it.
            self.piece_ns[i] = relax_towards(self.piece_ns[i], seed);
            match self.wait {
                // Asleep until the blocking critical job should be over: a best-effort thread
                // that shares a core with critical work then wakes (and preempts it) once per
                // job, not every 20 µs.
                HoldWait::Sleep => {
                    std::thread::sleep(std::time::Duration::from_nanos((at - now).max(0) as u64))
                }
                HoldWait::Poll => poll_pause(),
            }
            let then = clock::now_ns();
            self.account.held_ns[why.index()] += then - now;
            now = then;
        };
        self.held_ns += now - t;
        self.current = Some((i, k, clock::now_ns()));
        (k, now - t)
    }

    /// Measures the run that just ended (called by the next `before_piece`/`before_run` or
    /// `job_done`).
    fn end_piece(&mut self) {
        if let Some((i, k, began)) = self.current.take() {
            let end = clock::now_ns();
            let d = end - began;
            let last = (i + k).min(self.piece_ns.len());
            apportion(&mut self.piece_ns[i.min(last)..last], d);
            self.account.ran_ns += d;
            self.account.pieces += 1;
            if self.run_cap_ns.is_some() {
                self.account.fine_pieces += k as u64;
            }
            self.account.last = end;
        }
    }

    /// The job ended: returns the time it was held in all and starts afresh.
    pub fn job_done(&mut self) -> i64 {
        self.end_piece();
        std::mem::take(&mut self.held_ns)
    }
}

impl Drop for BestEffortHold {
    fn drop(&mut self) {
        if let Some(line) = self.account.line() {
            eprintln!("{line}");
        }
    }
}

/// A run of pieces measured `d` ns in all (launched back to back and waited for once, so its
/// pieces cannot be timed one by one): each piece's estimate tracks its share of `d`, in
/// proportion to the estimates ([`track_upper_quantile`]). A run of one tracks `d` itself.
fn apportion(est: &mut [i64], d: i64) {
    let total = est.iter().fold(0i128, |a, &e| a + e.max(0) as i128).max(1);
    for e in est.iter_mut() {
        let share = (d as i128 * (*e).max(0) as i128 / total) as i64;
        track_upper_quantile(e, share);
    }
}

/// The stall model's service estimate after a job of `sample`: a decaying maximum, so one slow
/// job raises it at once and it relaxes over about a hundred jobs.
pub fn decaying_max(est: i64, sample: i64) -> i64 {
    if sample >= est {
        sample
    } else {
        est - (est - sample) / 128
    }
}

/// One step of a held piece's estimate back towards `seed`: a 36th of the gap, the step
/// [`track_upper_quantile`] takes down.
fn relax_towards(est: i64, seed: i64) -> i64 {
    if est > seed {
        est - (est - seed + 35) / 36
    } else {
        est
    }
}

/// Between two looks of a polling hold: a few microseconds on the spot (asking the guard takes
/// its lock, which other best-effort workloads share).
fn poll_pause() {
    let until = clock::now_ns() + POLL_PAUSE_NS;
    while clock::now_ns() < until {
        std::hint::spin_loop();
    }
}

const POLL_PAUSE_NS: i64 = 2_000;

/// A stretch in thousandths for the shared file (0: none stated).
fn stretch_milli(stretch: Option<f64>) -> i64 {
    stretch.map_or(0, |s| (s.max(1.0) * 1000.0).round() as i64)
}

/// Moves `estimate` towards about the 90th percentile of the samples it is fed: up by a quarter
/// of the gap when a sample is above it, down by a 36th when below (the steps' ratio, 9:1, puts
/// the fixed point where 1 sample in 10 is above). Not the mean: a piece that runs longer than
/// its estimate overlaps a critical job longer than the guard reserved, and the H100 runs had
/// that (pieces beside critical work run slower than alone). Not the maximum either: a piece's
/// wall time includes whatever preempted it, and an estimate raised for good by one such
/// outlier would keep best effort from ever fitting a gap again.
pub fn track_upper_quantile(estimate: &mut i64, sample: i64) {
    if sample > *estimate {
        *estimate += (sample - *estimate + 3) / 4;
    } else {
        *estimate -= (*estimate - sample) / 36;
    }
}

/// What a workload is to the guard of its run, as the coordinator hands it to a thread or (over
/// the protocol) to a worker process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GuardSetup {
    /// The shared file ([`Guard::path`]).
    pub path: PathBuf,
    pub policy: Policy,
    /// Target length of a best-effort piece; with fine pieces ([`Policy::fine_piece_ns`]) the
    /// longest run of them.
    pub piece_ns: i64,
    /// `Some(slot)`: critical, publishing in that slot; `None`: best effort.
    pub critical_slot: Option<usize>,
    /// How a held best-effort piece waits ([`HoldWait`]).
    #[serde(default)]
    pub wait: HoldWait,
    /// A critical workload's own worst stretch beside best effort (`stretch` of its workload),
    /// overriding the run's [`Policy`] for its jobs.
    #[serde(default)]
    pub stretch: Option<f64>,
}

/// How a held best-effort piece waits before it asks the guard again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HoldWait {
    /// Asleep until the blocking critical job should be over: for a best-effort thread that
    /// may share a core with critical work, which its polling would preempt.
    #[default]
    Sleep,
    /// Polling every few microseconds on a core of its own: a sleeping thread wakes tens of
    /// microseconds late, and the gaps between short critical jobs are not much longer.
    Poll,
}

/// A workload's part in the guard, as its release loop uses it.
pub enum GuardRole {
    /// Unprotected run, or nothing to protect.
    Off,
    Critical(CriticalPublisher),
    BestEffort(BestEffortHold),
}

impl GuardRole {
    /// The role `setup` gives, on `guard` (the coordinator's own, for a thread host) or on the
    /// file it names (a worker process). A best-effort executor is split into pieces here;
    /// `warmup_ns` seeds the estimates.
    pub fn attach(
        setup: Option<&GuardSetup>,
        guard: Option<&Arc<Guard>>,
        exec: &mut dyn Executor,
        warmup_ns: &[i64],
    ) -> std::io::Result<GuardRole> {
        GuardRole::attach_with(setup, guard, exec, warmup_ns, None)
    }

    /// [`GuardRole::attach`] knowing a best-effort workload's memory-system demand per job
    /// (`isolane_core::predict::MemoryProfile`, e.g. the engine's `memory_profile`; else the
    /// executor's own, [`Executor::memory_profile`]): with `[protection] share` its pieces are
    /// charged by their predicted intensity. A critical workload gets its L2 set aside
    /// (`[protection] l2_persist_mib`); it runs its jobs whole (under `[protection]
    /// slack_order` it may delay a job's start, yielding to a critical job without slack).
    pub fn attach_with(
        setup: Option<&GuardSetup>,
        guard: Option<&Arc<Guard>>,
        exec: &mut dyn Executor,
        warmup_ns: &[i64],
        traffic: Option<&isolane_core::predict::MemoryProfile>,
    ) -> std::io::Result<GuardRole> {
        let Some(setup) = setup else {
            return Ok(GuardRole::Off);
        };
        let guard = match guard {
            Some(g) => Arc::clone(g),
            None => Arc::new(Guard::open(&setup.path, setup.policy)?),
        };
        let job_ns = high_estimate(warmup_ns);
        let policy = guard.policy();
        Ok(match setup.critical_slot {
            Some(slot) => {
                if policy.l2_persist_mib > 0 {
                    exec.persist_weights_in_l2(policy.l2_persist_mib)
                        .map_err(|e| std::io::Error::other(e.to_string()))?;
                }
                GuardRole::Critical(CriticalPublisher::new(guard, slot, job_ns, setup.stretch))
            }
            None => {
                // With fine pieces a run sizes itself to the slack at each decision, so the
                // gaps are not fitted by a re-split (which profiles the job again unguarded).
                let fine = policy.fine_piece_ns > 0;
                exec.split(if fine {
                    policy.fine_piece_ns
                } else {
                    setup.piece_ns
                });
                let own = exec.memory_profile();
                let intensity = match (policy.share, traffic.or(own.as_ref())) {
                    (Some(m), Some(t)) => Intensity::of_job(t, job_ns, &m.memory_system()),
                    _ => None,
                };
                let mut hold = BestEffortHold::new(guard, setup.wait);
                hold.seed_estimate(exec.pieces(), job_ns);
                hold.intensity = intensity;
                if fine {
                    hold.run_cap_ns = Some(setup.piece_ns.max(policy.fine_piece_ns));
                } else if policy.share.is_some() {
                    hold.unfitted = Some((setup.piece_ns, job_ns));
                }
                GuardRole::BestEffort(hold)
            }
        })
    }

    /// Runs job `index`: a critical workload says when it starts and ends (its release was
    /// published by [`GuardRole::next_release`]), a best-effort one is held before each piece.
    /// Returns (start, end, held), absolute ns.
    pub fn run_job(
        &mut self,
        exec: &mut dyn Executor,
        index: u64,
        stop: &AtomicBool,
    ) -> Result<(i64, i64, i64), ExecError> {
        match self {
            GuardRole::Off => {
                let start = clock::now_ns();
                exec.run_job()?;
                Ok((start, clock::now_ns(), 0))
            }
            GuardRole::Critical(p) if p.guard.policy().slack_order => {
                // Whole, after yielding before its start to a critical job without slack, only
                // while it still ends in time itself ([`yields`]). Not piece by piece: on the
                // H200 a critical job split into pieces waited for one by one took longer than
                // its deadline left (every job missed).
                let est = p.s().service.load(Ordering::Relaxed);
                let held = p.yield_before_piece(est, est, false, stop);
                let start = clock::now_ns();
                p.started(start);
                exec.run_job()?;
                let end = clock::now_ns();
                p.ended(index, end - start);
                Ok((start, end, held))
            }
            GuardRole::Critical(p) => {
                let start = clock::now_ns();
                p.started(start);
                exec.run_job()?;
                let end = clock::now_ns();
                p.ended(index, end - start);
                Ok((start, end, 0))
            }
            GuardRole::BestEffort(h) => {
                // Without fine pieces each run is one piece; with them, the longest run the
                // guard admits, launched back to back and waited for once. The job starts
                // when its first run is admitted.
                h.fit_gaps(exec);
                let n = exec.pieces();
                let mut start = None;
                let mut i = 0;
                while i < n {
                    let (k, _) = h.before_run(i, n, stop);
                    start.get_or_insert_with(clock::now_ns);
                    let end = (i + k).min(n);
                    match end - i {
                        1 => exec.run_piece(i)?,
                        _ => exec.run_pieces(i..end)?,
                    }
                    i = end;
                }
                let start = start.unwrap_or_else(clock::now_ns);
                Ok((start, clock::now_ns(), h.job_done()))
            }
        }
    }

    /// Publishes the next job of a critical workload before the loop waits for its release.
    pub fn next_release(&self, index: u64, release: i64, deadline: Option<i64>) {
        if let GuardRole::Critical(p) = self {
            p.pending(index, release, deadline);
        }
    }
}

/// A high estimate of a job's service time from warm-up samples: the 90th percentile of the
/// second half (the first jobs pay for caches and lazy initialisation).
fn high_estimate(samples: &[i64]) -> i64 {
    let mut v: Vec<i64> = samples[samples.len() / 2..].to_vec();
    if v.is_empty() {
        return 0;
    }
    v.sort_unstable();
    v[(v.len() * 9 / 10).min(v.len() - 1)]
}

/// Sleeps of a held best-effort thread wake within a few µs instead of the default 50 µs slack.
fn set_fine_timer_slack() {
    // SAFETY: PR_SET_TIMERSLACK takes a plain integer and affects only the calling thread.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1_000 as libc::c_ulong);
    }
}

#[cfg(test)]
#[path = "guard_sim.rs"]
mod sim;

#[cfg(test)]
mod tests {
    use super::*;

    const MS: i64 = 1_000_000;

    fn stall(margin_ns: i64) -> Policy {
        Policy::new(margin_ns, None)
    }

    #[test]
    fn a_stated_stretch_charges_part_of_the_overlap() {
        // Running since 10 ms, 3 ms service, due at 15: 2 ms of slack. With a worst stretch
        // of 1.5 an overlap of o delays it by o/3, and a piece that outlasts it by no more than
        // its whole 3 ms stretched: 1.5 ms, whatever the piece's length.
        let mut v = SlotView::pending(0, 10 * MS, 15 * MS, 3 * MS);
        v.start = 10 * MS;
        let p = Policy::new(0, Some(1.5));
        assert_eq!(admits(&v, 10 * MS, 3 * MS, &p), Some(MS));
        assert_eq!(admits(&v, 10 * MS, 6 * MS, &p), Some(3 * MS / 2));
        assert_eq!(admits(&v, 10 * MS, 50 * MS, &p), Some(3 * MS / 2));
        // With a worst stretch of 2 the whole job stretched is 3 ms late: held.
        assert_eq!(
            admits(&v, 10 * MS, 6 * MS, &Policy::new(0, Some(2.0))),
            None
        );
        // A stretch of 1 (no slowdown at all) charges nothing.
        assert_eq!(
            admits(&v, 10 * MS, 50 * MS, &Policy::new(0, Some(1.0))),
            Some(0)
        );
    }

    #[test]
    fn a_held_estimate_relaxes_to_the_warm_ups_and_no_further() {
        let mut est = 10 * MS;
        let mut steps = 0;
        while est > MS && steps < 10_000 {
            est = relax_towards(est, MS);
            steps += 1;
        }
        assert_eq!(est, MS);
        // About 36 steps per e-fold: from 10× down in a few hundred looks, not one.
        assert!((50..500).contains(&steps), "{steps} steps");
        assert_eq!(relax_towards(MS / 2, MS), MS / 2);
    }

    #[test]
    fn an_idle_served_model_admits_pieces_its_next_request_could_absorb() {
        // Nothing queued; a request arriving now has 5 ms, needs 3 ms: 2 ms of slack.
        let idle = SlotView {
            state: IDLE,
            ..SlotView::pending(7, 0, 5 * MS, 3 * MS)
        };
        assert_eq!(admits(&idle, 100 * MS, 2 * MS, &stall(0)), Some(0));
        assert_eq!(admits(&idle, 100 * MS, 2 * MS + 1, &stall(0)), None);
        assert_eq!(admits(&idle, 100 * MS, 2 * MS, &stall(MS)), None);
        // Nothing is reserved in this state: the next piece is judged afresh, however many
        // ran before it.
        let reserved = SlotView {
            acct_seq: 7,
            acct_overlap: 10 * MS,
            ..idle
        };
        assert_eq!(admits(&reserved, 100 * MS, MS, &stall(0)), Some(0));
        // Without a deadline there is nothing to protect.
        let free = SlotView {
            deadline: i64::MAX,
            ..idle
        };
        assert_eq!(admits(&free, 100 * MS, 1_000 * MS, &stall(0)), Some(0));
        // A model slower than its deadline has no request to protect: its requests are
        // refused, and best effort runs.
        let hopeless = SlotView {
            state: IDLE,
            ..SlotView::pending(7, 0, 2 * MS, 2 * MS + 78_000)
        };
        assert_eq!(admits(&hopeless, 100 * MS, 10 * MS, &stall(0)), Some(0));
        // At its deadline exactly it can still be met: protected.
        let tight = SlotView {
            service: 2 * MS,
            ..hopeless
        };
        assert_eq!(admits(&tight, 100 * MS, MS, &stall(0)), None);
    }

    #[test]
    fn a_piece_that_ends_before_the_next_release_is_free() {
        // Critical job released at 10 ms, 3 ms of service, due at 15 ms: no slack to spare,
        // but a 1 ms piece at t = 5 ms ends before it.
        let v = SlotView::pending(0, 10 * MS, 15 * MS, 5 * MS);
        assert_eq!(admits(&v, 5 * MS, MS, &stall(0)), Some(0));
        // Starting at 9.5 ms it would overlap by 0.5 ms, more than the 0 slack.
        assert_eq!(admits(&v, 9 * MS + MS / 2, MS, &stall(0)), None);
    }

    #[test]
    fn overlap_is_allowed_up_to_the_slack_and_reservations_add_up() {
        // Released at 10, running since 10, 3 ms service, due at 15: 2 ms slack (margin 0).
        let mut v = SlotView::pending(4, 10 * MS, 15 * MS, 3 * MS);
        v.start = 10 * MS;
        assert_eq!(admits(&v, 11 * MS, MS, &stall(0)), Some(MS));
        assert_eq!(admits(&v, 11 * MS, 2 * MS, &stall(0)), Some(2 * MS));
        assert_eq!(admits(&v, 11 * MS, 2 * MS + 1, &stall(0)), None);
        // With 1.5 ms already reserved against this job, only 0.5 ms is left.
        v.acct_seq = 4;
        v.acct_overlap = 3 * MS / 2;
        assert_eq!(admits(&v, 11 * MS, MS / 2, &stall(0)), Some(MS / 2));
        assert_eq!(admits(&v, 11 * MS, MS, &stall(0)), None);
        // A reservation against an earlier job does not count.
        v.acct_seq = 3;
        assert_eq!(admits(&v, 11 * MS, MS, &stall(0)), Some(MS));
        // The margin comes off the slack.
        assert_eq!(admits(&v, 11 * MS, 2 * MS, &stall(MS / 2)), None);
    }

    #[test]
    fn a_held_piece_sleeps_until_the_blocking_job_should_end_within_bounds() {
        let mut v = SlotView::pending(3, 10 * MS, 15 * MS, 3 * MS);
        v.start = 10 * MS;
        v.acct_seq = 3;
        v.acct_overlap = MS / 2;
        // Expected end: 10 + 3 + 0.5 ms.
        assert_eq!(retry_at(&v, 13 * MS + MS / 3), 13 * MS + MS / 2);
        // Never more than 0.2 ms ahead, never less than one poll.
        assert_eq!(retry_at(&v, 10 * MS), 10 * MS + MS / 5);
        assert_eq!(retry_at(&v, 20 * MS), 20 * MS + POLL_NS as i64);
        assert_eq!(retry_at(&SlotView::unknown(), 5), 5 + POLL_NS as i64);
    }

    #[test]
    fn unknown_holds_and_finished_frees() {
        assert_eq!(admits(&SlotView::unknown(), 0, 1, &stall(0)), None);
        assert_eq!(admits(&SlotView::finished(), 0, 1, &stall(0)), Some(0));
    }

    #[test]
    fn a_late_pending_job_counts_from_now() {
        // Released at 10 ms but not started at 12 ms (its thread is late): it begins no
        // earlier than now, so its slack is measured from now.
        let v = SlotView::pending(0, 10 * MS, 15 * MS, 2 * MS);
        assert_eq!(admits(&v, 12 * MS, MS, &stall(0)), Some(MS));
        assert_eq!(admits(&v, 12 * MS, MS + 1, &stall(0)), None);
    }

    #[test]
    fn the_shared_file_is_seen_by_a_second_mapping_and_reserves() {
        let g = Arc::new(Guard::create(1, stall(0)).unwrap());
        let other = Guard::open(&g.path().unwrap(), stall(0)).unwrap();
        let p = CriticalPublisher::new(Arc::clone(&g), 0, 3 * MS, None);
        // Unknown until published: held.
        assert!(other.try_piece(MS).is_err());
        let now = clock::now_ns();
        // Running since now, due in 5 ms: 2 ms of slack.
        p.pending(7, now, Some(now + 5 * MS));
        p.started(now);
        assert!(other.try_piece(MS).is_ok());
        assert!(other.try_piece(MS / 2).is_ok());
        // 1.5 ms reserved: another 1 ms does not fit.
        assert!(other.try_piece(MS).is_err());
        assert_eq!(other.view(0).acct_overlap, 3 * MS / 2);
        p.ended(7, 3 * MS);
        assert!(
            other.try_piece(MS).is_err(),
            "between jobs the next release is unknown"
        );
        drop(p);
        assert!(
            other.try_piece(100 * MS).is_ok(),
            "a finished workload frees best effort"
        );
    }

    #[test]
    fn a_slot_finished_by_the_coordinator_frees_best_effort() {
        let g = Guard::create(2, stall(0)).unwrap();
        assert!(g.try_piece(MS).is_err(), "never published");
        g.finish(0);
        assert!(g.try_piece(MS).is_err(), "slot 1 still unknown");
        g.finish(1);
        g.finish(7);
        assert!(g.try_piece(MS).is_ok());
    }

    #[test]
    fn the_service_estimate_rises_at_once_and_relaxes_slowly() {
        let g = Arc::new(Guard::create(1, stall(0)).unwrap());
        let p = CriticalPublisher::new(Arc::clone(&g), 0, MS, None);
        p.pending(0, 0, None);
        p.ended(0, 2 * MS);
        assert_eq!(g.view(0).service, 2 * MS);
        p.pending(1, 0, None);
        p.ended(1, MS);
        let s = g.view(0).service;
        assert!(s < 2 * MS && s > 19 * MS / 10, "{s}");
    }

    #[test]
    fn a_workloads_own_stretch_overrides_the_runs_model() {
        // A job released at 10 ms, due at 20, 4 ms of service: 6 ms of slack. A 10-ms piece
        // started at 10 ms overlaps it entirely (10 ms).
        let v = SlotView::pending(1, 10 * MS, 20 * MS, 4 * MS);
        // The run's full-stall model: 10 ms of delay, more than the slack.
        assert_eq!(admits(&v, 10 * MS, 10 * MS, &stall(0)), None);
        // The workload's own stretch 1.25: the piece outlasts the job, whose 4 ms stretched
        // end 1 ms later (not 0.2 of the 10 ms overlap): admitted.
        assert_eq!(
            admits(&v.with_stretch(1.25), 10 * MS, 10 * MS, &stall(0)),
            Some(MS)
        );
        // Its own 5.0 charges 0.8: 8 ms, held, even where the run's model (stretch 1.25) would
        // have admitted it.
        let lenient = Policy::new(0, Some(1.25));
        assert_eq!(admits(&v, 10 * MS, 10 * MS, &lenient), Some(MS));
        assert_eq!(
            admits(&v.with_stretch(5.0), 10 * MS, 10 * MS, &lenient),
            None
        );
    }

    #[test]
    fn the_piece_estimate_settles_near_the_90th_percentile() {
        // Pieces of 100 µs, one in five taking 200 µs: the mean (120 µs) would under-reserve
        // every fifth overlap; the estimate must end above the common length, near the slow one.
        let mut e = 100_000;
        for k in 0..5_000 {
            track_upper_quantile(&mut e, if k % 5 == 0 { 200_000 } else { 100_000 });
        }
        assert!((150_000..=200_000).contains(&e), "estimate {e}");
        // All pieces equal: the estimate converges to them, from above and from below.
        for start in [10_000, 1_000_000] {
            let mut e = start;
            for _ in 0..2_000 {
                track_upper_quantile(&mut e, 100_000);
            }
            assert!((99_000..=101_000).contains(&e), "from {start}: {e}");
        }
    }

    fn running(seq: i64, start: i64, deadline: i64, service: i64) -> SlotView {
        SlotView {
            start,
            ..SlotView::pending(seq, start, deadline, service)
        }
    }

    #[test]
    fn a_critical_job_with_slack_yields_to_one_without_until_its_expected_end() {
        let p = Policy {
            slack_order: true,
            ..stall(0)
        };
        // B runs since 10 ms, 2 ms of service, due at 12.1: 0.1 ms of slack. A (due at 20,
        // 3 ms left) would overlap it with a 0.5 ms piece: it yields until B's end, 12 ms.
        let b = running(1, 10 * MS, 12 * MS + MS / 10, 2 * MS);
        let a = running(1, 10 * MS, 20 * MS, 4 * MS);
        assert_eq!(yields(&a, 3 * MS, &b, 11 * MS, MS / 2, &p), Some(12 * MS));
        // B with slack for the piece's whole overlap: A runs.
        let roomy = running(1, 10 * MS, 13 * MS, 2 * MS);
        assert_eq!(yields(&a, 3 * MS, &roomy, 11 * MS, MS / 2, &p), None);
        // A that could not wait until B's end and still make its own deadline runs: never
        // yield oneself late. Due at 14.9 with 3 ms left: waiting 1 ms leaves -0.1 ms.
        let a_tight = running(1, 10 * MS, 14 * MS + 9 * MS / 10, 4 * MS);
        assert_eq!(yields(&a_tight, 3 * MS, &b, 11 * MS, MS / 2, &p), None);
        // The margin comes off A's slack as well: 1 ms of margin leaves A 5 ms.
        let margin = Policy {
            margin_ns: 5 * MS + MS / 2,
            ..p
        };
        assert_eq!(yields(&a, 3 * MS, &b, 11 * MS, MS / 2, &margin), None);
        // A piece that ends before B's release overlaps nothing.
        let b_later = SlotView::pending(2, 13 * MS, 15 * MS, 2 * MS);
        assert_eq!(yields(&a, 3 * MS, &b_later, 11 * MS, MS / 2, &p), None);
        // B between jobs, finished, or without a deadline: nothing to yield to.
        assert_eq!(
            yields(&a, 3 * MS, &SlotView::unknown(), 11 * MS, MS, &p),
            None
        );
        assert_eq!(
            yields(&a, 3 * MS, &SlotView::finished(), 11 * MS, MS, &p),
            None
        );
        let free = SlotView {
            deadline: i64::MAX,
            ..b
        };
        assert_eq!(yields(&a, 3 * MS, &free, 11 * MS, MS, &p), None);
    }

    #[test]
    fn of_two_critical_jobs_only_the_one_with_more_slack_yields() {
        let p = Policy {
            slack_order: true,
            ..stall(0)
        };
        // Both running since 10 ms with 2 ms of service; X due at 12.2 (0.2 ms of slack), Y
        // at 12.3 (0.3 ms). A 1 ms piece of either would eat more than the other's slack.
        let x = running(1, 10 * MS, 12 * MS + MS / 5, 2 * MS);
        let y = running(1, 10 * MS, 12 * MS + 3 * MS / 10, 2 * MS);
        let now = 11 * MS;
        // Each has 1 ms left. Y has more slack but waiting for X's end (12) would end it at 13,
        // past 12.3: it cannot afford the wait, and X has less slack: neither yields.
        assert_eq!(yields(&y, MS, &x, now, MS, &p), None);
        assert_eq!(yields(&x, MS, &y, now, MS, &p), None);
        // With Y due at 14, Y yields to X, and X never to Y.
        let y = running(1, 10 * MS, 14 * MS, 2 * MS);
        assert_eq!(yields(&y, MS, &x, now, MS, &p), Some(12 * MS));
        assert_eq!(yields(&x, MS, &y, now, MS, &p), None);
        // Time Y already held itself counts against its own slack as its published end moves
        // (X sees it), but not twice against its own remaining time.
        let y_held = SlotView { held: MS / 2, ..y };
        assert_eq!(y_held.expected_end(now), 12 * MS + MS / 2);
        assert_eq!(yields(&y_held, MS, &x, now, MS, &p), Some(12 * MS));
    }

    #[test]
    fn slack_order_is_off_unless_asked_and_reads_the_published_slots() {
        let now = clock::now_ns();
        for (order, held) in [(false, false), (true, true)] {
            let policy = Policy {
                slack_order: order,
                ..stall(0)
            };
            let g = Arc::new(Guard::create(2, policy).unwrap());
            let roomy = CriticalPublisher::new(Arc::clone(&g), 0, 2 * MS, None);
            let tight = CriticalPublisher::new(Arc::clone(&g), 1, 2 * MS, None);
            roomy.pending(0, now, Some(now + 50 * MS));
            roomy.started(now);
            tight.pending(0, now, Some(now + 2 * MS + MS / 10));
            tight.started(now);
            assert_eq!(
                g.critical_may_run(0, MS, MS).is_err(),
                held,
                "order {order}"
            );
            // The tight job never yields to the roomy one.
            assert!(g.critical_may_run(1, MS, MS).is_ok());
            // Its end frees the roomy one.
            tight.ended(0, 2 * MS);
            assert!(g.critical_may_run(0, MS, MS).is_ok());
        }
    }

    #[test]
    fn a_critical_job_under_slack_order_runs_whole_and_waits_for_a_tight_one() {
        let policy = Policy {
            slack_order: true,
            ..stall(0)
        };
        let g = Arc::new(Guard::create(2, policy).unwrap());
        let setup = GuardSetup {
            path: g.path().unwrap(),
            policy,
            piece_ns: MS,
            critical_slot: Some(0),
            wait: HoldWait::Poll,
            stretch: None,
        };
        let mut exec = crate::exec::SpinExecutor::new(4 * MS, 0, 1);
        let mut role = GuardRole::attach(Some(&setup), Some(&g), &mut exec, &[4 * MS; 4]).unwrap();
        // Whole: a critical job split into pieces waited for one by one missed every deadline
        // on the H200.
        assert_eq!(exec.pieces(), 1, "not split");
        // Slot 1: a job running now with 0.1 ms of slack, which ends 20 ms from now.
        let tight = CriticalPublisher::new(Arc::clone(&g), 1, 2 * MS, None);
        let now = clock::now_ns();
        tight.pending(0, now, Some(now + 2 * MS + MS / 10));
        tight.started(now);
        let ender = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(20));
            let ended = clock::now_ns();
            tight.ended(0, 2 * MS);
            ended
        });
        let release = clock::now_ns();
        role.next_release(0, release, Some(release + 1_000 * MS));
        let stop = AtomicBool::new(false);
        let (start, end, held) = role.run_job(&mut exec, 0, &stop).unwrap();
        let ended = ender.join().unwrap();
        // It waited for the tight job's end before its first piece, held (and said so).
        assert!(
            start >= ended,
            "started {} ms before the end",
            (ended - start) / MS
        );
        assert!(held >= 10 * MS, "held {held} ns");
        assert!(end - start >= 4 * MS);
        // Without slack order the same job runs whole at once.
        let off = Arc::new(Guard::create(2, stall(0)).unwrap());
        let mut whole = crate::exec::SpinExecutor::new(4 * MS, 0, 1);
        let setup = GuardSetup {
            policy: stall(0),
            ..setup
        };
        GuardRole::attach(Some(&setup), Some(&off), &mut whole, &[4 * MS; 4]).unwrap();
        assert_eq!(whole.pieces(), 1);
    }

    /// A spin job that says what a GPU model would: its memory-system demand, and the L2
    /// asked for its weights.
    struct Recording {
        spin: crate::exec::SpinExecutor,
        persisted: Vec<u64>,
        refuse_above: u64,
    }

    impl Executor for Recording {
        fn run_job(&mut self) -> Result<(), ExecError> {
            self.spin.run_job()
        }
        fn split(&mut self, piece_ns: i64) {
            self.spin.split(piece_ns)
        }
        fn pieces(&self) -> usize {
            self.spin.pieces()
        }
        fn run_piece(&mut self, i: usize) -> Result<(), ExecError> {
            self.spin.run_piece(i)
        }
        fn persist_weights_in_l2(&mut self, mib: u64) -> Result<(), ExecError> {
            if mib > self.refuse_above {
                return Err(ExecError::Job(format!("l2_persist_mib = {mib}: too much")));
            }
            self.persisted.push(mib);
            Ok(())
        }
        fn memory_profile(&self) -> Option<isolane_core::predict::MemoryProfile> {
            Some(isolane_core::predict::MemoryProfile {
                dram_bytes_per_job: 480_000.0,
                resident: false,
                l2_footprint_bytes: 480_000.0,
                flops_per_job: 0.0,
                source: isolane_core::predict::ProfileSource::Computed,
            })
        }
    }

    #[test]
    fn attaching_sets_a_critical_models_l2_aside_and_charges_best_effort_by_its_profile() {
        use isolane_core::spec::{Mechanism, ProtectionSpec};
        let spec = ProtectionSpec {
            l2_persist_mib: 24,
            share: true,
            ..ProtectionSpec::default()
        };
        let policy = Policy::of(&spec, ShareModel::fitted("h200", Mechanism::Green));
        let g = Arc::new(Guard::create(1, policy).unwrap());
        let setup = GuardSetup {
            path: g.path().unwrap(),
            policy,
            piece_ns: MS,
            critical_slot: Some(0),
            wait: HoldWait::Poll,
            stretch: None,
        };
        let exec = |refuse_above| Recording {
            spin: crate::exec::SpinExecutor::new(MS, 0, 1),
            persisted: Vec::new(),
            refuse_above,
        };
        let mut critical = exec(u64::MAX);
        GuardRole::attach(Some(&setup), Some(&g), &mut critical, &[MS; 4]).unwrap();
        assert_eq!(critical.persisted, [24]);
        // More than the device sets aside: the workload fails to start, naming the key.
        let e = GuardRole::attach(Some(&setup), Some(&g), &mut exec(16), &[MS; 4])
            .err()
            .unwrap();
        assert!(e.to_string().contains("l2_persist_mib = 24"), "{e}");
        // Best effort: no L2, and its pieces take its profile's intensity: 480 kB a 1 ms job
        // is 0.48 GB/s, 0.01 % of the H200's 4.8 TB/s.
        let mut be = exec(u64::MAX);
        let be_setup = GuardSetup {
            critical_slot: None,
            ..setup.clone()
        };
        let role = GuardRole::attach(Some(&be_setup), Some(&g), &mut be, &[MS; 4]).unwrap();
        assert!(be.persisted.is_empty());
        let GuardRole::BestEffort(hold) = role else {
            panic!("not best effort")
        };
        let i = hold
            .intensity
            .expect("an intensity from the executor's profile");
        assert!((i.dram - 1e-4).abs() < 1e-6, "{i:?}");
        // Without `share`, none: the stall model.
        let stall_setup = GuardSetup {
            policy: Policy::new(100_000, None),
            ..be_setup
        };
        let off = Arc::new(Guard::create(1, stall_setup.policy).unwrap());
        let role = GuardRole::attach(Some(&stall_setup), Some(&off), &mut exec(0), &[MS; 4]);
        let Ok(GuardRole::BestEffort(hold)) = role else {
            panic!("not best effort")
        };
        assert_eq!(hold.intensity, None);
    }

    #[test]
    fn a_sharing_guard_charges_a_piece_the_stretch_its_intensity_predicts() {
        // The H200's fit: a piece taking 10 % of the DRAM bandwidth and no L2 stretches a
        // victim 1 + 1.2359 × 0.1 = 1.124: it is charged 0.11 of its overlap.
        let model = ShareModel::fitted("h200", isolane_core::spec::Mechanism::Green).unwrap();
        let light = Intensity {
            dram: 0.1,
            l2_resident: 0.0,
            l2_per_ns: 0.0,
        };
        let s = model.stretch(&light, 3 * MS);
        assert!((s - 1.12359).abs() < 1e-4, "{s}");
        let share = Policy {
            share: Some(model),
            ..stall(0)
        };
        // Running since 10 ms, 3 ms service, due at 14: 1 ms of slack. A 5 ms piece is held
        // under the stall model, admitted as a light piece: it outlasts the job, whose 3 ms
        // stretched 1.124 end 0.37 ms late (0.11 of the 5 ms overlap would be 0.55).
        let v = running(0, 10 * MS, 14 * MS, 3 * MS);
        assert_eq!(
            admits_piece(&v, 10 * MS, 5 * MS, &stall(0), Some(&light)),
            None
        );
        let charged = admits_piece(&v, 10 * MS, 5 * MS, &share, Some(&light)).unwrap();
        assert!((360_000..380_000).contains(&charged), "{charged}");
        // A memory-heavy piece (80 % of the bandwidth, streaming the L2): stretch ~2.2, charged
        // over half its overlap: held.
        let heavy = Intensity {
            dram: 0.8,
            l2_resident: 0.0,
            l2_per_ns: 1.0 / (3 * MS) as f64,
        };
        assert!(model.stretch(&heavy, 3 * MS) > 2.0);
        assert_eq!(
            admits_piece(&v, 10 * MS, 5 * MS, &share, Some(&heavy)),
            None
        );
        // ... but paced, not stalled: a 1.5 ms piece fits the 1 ms of slack.
        assert!(admits_piece(&v, 10 * MS, 3 * MS / 2, &share, Some(&heavy)).is_some());
        assert_eq!(
            admits_piece(&v, 10 * MS, 3 * MS / 2, &stall(0), Some(&heavy)),
            None
        );
        // A piece of unknown intensity keeps the stall model; a victim's own stretch wins.
        assert_eq!(admits_piece(&v, 10 * MS, 5 * MS, &share, None), None);
        assert_eq!(
            admits_piece(&v.with_stretch(5.0), 10 * MS, 5 * MS, &share, Some(&light)),
            None
        );
    }

    #[test]
    fn a_jobs_intensity_comes_from_its_profile_and_length() {
        use isolane_core::predict::{memory_system, MemoryProfile, ProfileSource};
        let sys = memory_system("h200").unwrap();
        // vit_l_32 at fp16 (613 MB per job, streaming) in 1.076 ms: 613e6 / 1.076e-3 s is
        // 570 GB/s, 11.9 % of 4.8 TB/s.
        let streaming = MemoryProfile {
            dram_bytes_per_job: 613_070_848.0,
            resident: false,
            l2_footprint_bytes: 613_070_848.0,
            flops_per_job: 0.0,
            source: ProfileSource::Computed,
        };
        let i = Intensity::of_job(&streaming, 1_076_108, &sys).unwrap();
        assert!((i.dram - 0.1187).abs() < 1e-3, "{i:?}");
        assert_eq!(i.l2_resident, 0.0);
        // A 1 ms victim sees 570 kB/µs × 1000 µs = 570 MB pushed through 60 MB: all of it.
        assert!(i.l2_per_ns * MS as f64 > 1.0);
        // resnet18: resident, 25 MB of 60.
        let resident = MemoryProfile {
            dram_bytes_per_job: 0.0,
            resident: true,
            l2_footprint_bytes: 25_376_464.0,
            ..streaming
        };
        let r = Intensity::of_job(&resident, 345_151, &sys).unwrap();
        assert_eq!((r.dram, r.l2_per_ns), (0.0, 0.0));
        assert!((r.l2_resident - 0.4229).abs() < 1e-3, "{r:?}");
        assert_eq!(Intensity::of_job(&streaming, 0, &sys), None);
    }

    #[test]
    fn the_protection_table_sets_the_levers() {
        use isolane_core::spec::{Mechanism, ProtectionSpec};
        let model = ShareModel::fitted("h200", Mechanism::Mps);
        assert!(model.is_some());
        // Time-slicing has no fitted memory-system model.
        assert_eq!(ShareModel::fitted("h200", Mechanism::Timeslice), None);
        let d = Policy::of(&ProtectionSpec::default(), model);
        assert_eq!(d, Policy::new(100_000, None), "defaults: today's guard");
        let on = ProtectionSpec {
            slack_order: true,
            share: true,
            stretch: Some(2.0),
            ..ProtectionSpec::default()
        };
        let p = Policy::of(
            &ProtectionSpec {
                l2_persist_mib: 24,
                ..on
            },
            model,
        );
        assert_eq!(p.l2_persist_mib, 24);
        assert!(p.slack_order);
        assert_eq!(p.share, model);
        assert_eq!(p.delay_per_overlap, 0.5);
        // A policy travels to worker processes: it reads back the same, and an older
        // coordinator's (without the levers) reads as today's.
        let text = serde_json::to_string(&p).unwrap();
        assert_eq!(serde_json::from_str::<Policy>(&text).unwrap(), p);
        let old: Policy =
            serde_json::from_str(r#"{"margin_ns":100000,"delay_per_overlap":1.0}"#).unwrap();
        assert_eq!(old, Policy::new(100_000, None));
    }

    #[test]
    fn a_file_that_is_not_a_guard_is_refused() {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), [0u8; 64]).unwrap();
        assert!(Guard::open(f.path(), stall(0)).is_err());
        assert!(Guard::open(Path::new("/nonexistent/guard"), stall(0)).is_err());
    }

    fn sharing() -> Policy {
        Policy {
            share: ShareModel::fitted("h200", isolane_core::spec::Mechanism::Green),
            ..Policy::new(20_000, None)
        }
    }

    /// The sharing guard with its closed loop, as `[protection] share` runs it.
    fn looped() -> Policy {
        Policy {
            feedback: true,
            ..sharing()
        }
    }

    #[test]
    fn the_replay_of_trio_a_gives_best_effort_work_and_no_predicted_miss() {
        // Trio a as recorded on the H200 (deadlines 1.3 × p99 alone, margin 20 µs), every job
        // at its time alone ± 2 %, slowed at each instant by the fitted model for what runs
        // beside it. Unprotected, both critical models miss everything; today's stall model
        // holds them but best effort gets (almost) nothing, as measured on the H200.
        let alone = sim::Deadlines::Alone(1.3);
        let none = sim::trio_a(sim::Guarding::None, 1.0, alone, false, 1.0);
        assert!(none.late_pct.iter().all(|(_, l)| *l > 90.0), "{none:?}");
        let stalled = sim::trio_a(
            sim::Guarding::Guarded(stall(20_000)),
            1.0,
            alone,
            false,
            1.0,
        );
        assert!(
            stalled.late_pct.iter().all(|(_, l)| *l == 0.0),
            "{stalled:?}"
        );
        assert!(stalled.best_effort < 0.01, "{stalled:?}");
        // The sharing guard: no predicted miss, and best effort runs over a quarter of the
        // time (under today's `share`, charged over the whole overlap, 2 %).
        let share = sim::trio_a(sim::Guarding::Guarded(sharing()), 1.0, alone, false, 1.0);
        assert!(share.late_pct.iter().all(|(_, l)| *l == 0.0), "{share:?}");
        assert!(share.best_effort > 0.25, "{share:?}");
        // With the deadlines at 1.3 × each p99 in the victims-only replay (the issue's second
        // deadline), both targets: no predicted miss, best effort over 30 % of alone.
        let together = sim::Deadlines::Together(1.3);
        let roomy = sim::trio_a(sim::Guarding::Guarded(sharing()), 1.0, together, false, 1.0);
        assert!(roomy.late_pct.iter().all(|(_, l)| *l == 0.0), "{roomy:?}");
        assert!(roomy.best_effort > 0.3, "{roomy:?}");
        let stalled = sim::trio_a(
            sim::Guarding::Guarded(stall(20_000)),
            1.0,
            together,
            false,
            1.0,
        );
        // (The stall model: 13 %.)
        assert!(stalled.best_effort < roomy.best_effort / 3.0, "{stalled:?}");
    }

    #[test]
    fn beside_slow_outliers_the_sharing_guard_adds_few_misses() {
        // One job in 211 at 1.8 × its time alone (the H200's slow jobs beside the other
        // victim): those, and some queued behind them, miss without best effort too. The
        // guard holds best effort during a backlog; what it still adds are jobs queued behind
        // an outlier that it had charged before the outlier was seen to overrun.
        for x in [sim::Deadlines::Alone(1.3), sim::Deadlines::Together(1.3)] {
            let base = sim::trio_a(sim::Guarding::VictimsOnly, 1.0, x, true, 1.0);
            let share = sim::trio_a(sim::Guarding::Guarded(sharing()), 1.0, x, true, 1.0);
            for k in 0..2 {
                let (name, b) = base.late_pct[k];
                let s = share.late_pct[k].1;
                assert!(
                    s <= b + 1.0,
                    "{name} at {x:?}: {s} % beside best effort, {b} % without"
                );
                // Every added miss is a job queued just behind an outlier.
                for seq in &share.late_seqs[k] {
                    let behind = (*seq as u64 + 1) % sim::OUTLIER_EVERY;
                    assert!(
                        base.late_seqs[k].contains(seq) || behind <= 5,
                        "{name} job {seq} at {x:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_sharing_guard_charges_only_what_is_left_of_a_job_and_retries_when_it_fits() {
        // Running since 10 ms, 1 ms of service, due at 11.05: 0.05 ms of slack. Stretched 1.25
        // beside a piece (0.2 of the overlap charged), a 0.5 ms piece at 10.7 ms would cost it
        // 0.1 ms over the whole overlap, but only 0.3 ms of its own work is left: stretched, it
        // ends 0.075 ms later. Still more than the slack: held.
        let p = Policy::new(0, Some(1.25));
        let v = running(3, 10 * MS, 11 * MS + MS / 20, MS);
        let at = 10 * MS + 7 * MS / 10;
        assert_eq!(admits(&v, at, MS / 2, &p), None);
        // It fits once what is left, stretched, fits: 0.05 / 0.25 = 0.2 ms before the end,
        // at 10.8 (the stall model asks again at the end, 0.2 ms from now at most: 10.9).
        assert_eq!(retry_at_piece(&v, at, &p, None), 10 * MS + 8 * MS / 10);
        assert_eq!(retry_at(&v, at), 10 * MS + 9 * MS / 10);
        // Then: charged 0.05 ms (the whole overlap would be 0.1 ms: held, as it was before).
        let then = 10 * MS + 8 * MS / 10;
        assert_eq!(admits(&v, then, MS / 2, &p), Some(MS / 20));
        assert_eq!(admits(&v, then, MS / 2, &stall(0)), None);
        // Running past its estimate: its end is unknown, best effort waits.
        assert_eq!(admits(&v, 11 * MS + MS / 10, MS / 10, &p), None);
    }

    #[test]
    fn a_sharing_guard_waits_out_a_backlog_and_leaves_the_next_job_its_slack() {
        let p = Policy::new(20_000, Some(1.25));
        // Released at 10 ms but started at 10.3 (the job before it overran): the jobs behind
        // it are queued too. Held, however much slack it shows.
        let queued = SlotView {
            start: 10 * MS + 3 * MS / 10,
            ..SlotView::pending(4, 10 * MS, 20 * MS, MS)
        };
        assert_eq!(admits(&queued, 10 * MS + MS / 2, MS / 10, &p), None);
        // Whatever the margin: a larger one is asked for safety, not for a looser test.
        let safe = Policy::new(MS, Some(1.25));
        assert_eq!(admits(&queued, 10 * MS + MS / 2, MS / 10, &safe), None);
        // On time: admitted.
        let on_time = running(4, 10 * MS, 20 * MS, MS);
        assert!(admits(&on_time, 10 * MS + MS / 2, MS / 10, &p).is_some());
        // A job with 0.1 ms of relative slack, 0.05 ms from its end: a 1 ms piece costs it
        // 12.5 µs, but runs 0.94 ms into the next job, charged 0.2 of that (0.19 ms): more
        // than that job's 0.1 ms. A 0.5 ms piece (0.09 ms charged) fits.
        let tight = running(5, 10 * MS, 11 * MS + MS / 10, MS);
        let p = Policy::new(0, Some(1.25));
        assert_eq!(admits(&tight, 10 * MS + 95 * MS / 100, MS, &p), None);
        assert!(admits(&tight, 10 * MS + 95 * MS / 100, MS / 2, &p).is_some());
    }

    #[test]
    fn a_sharing_guards_service_estimate_forgets_an_outlier() {
        // 300 jobs of 0.25 ms and one of 0.58: the decaying maximum is still near 0.3 ms 100
        // jobs later (slack gone for a 0.34 ms deadline); the recent 99th percentile is back
        // at 0.25 ms at once.
        let mut max = 250_000;
        let mut recent = RecentService::new(250_000);
        let mut r = 0;
        for k in 0..400 {
            let s = if k == 300 { 580_000 } else { 250_000 };
            max = decaying_max(max, s);
            r = recent.push(s);
            if k == 400 - 1 {
                assert!(max > 290_000, "{max}");
            }
        }
        assert_eq!(r, 250_000);
        // Under a sharing guard the publisher keeps it.
        let g = Arc::new(Guard::create(1, sharing()).unwrap());
        let p = CriticalPublisher::new(Arc::clone(&g), 0, 250_000, None);
        for k in 0..200 {
            p.pending(k, 0, None);
            p.ended(k, if k == 100 { 580_000 } else { 250_000 });
        }
        assert_eq!(g.view(0).service, 250_000);
    }

    #[test]
    fn the_closed_loop_contains_a_stretch_the_model_under_predicts() {
        // The H200's trio a (00:41 UTC, session 21): best effort's pieces slowed resnet50 more
        // than the fitted model said (share: 3.88 % late, 97 misses queued). The replay with
        // pieces really twice the model's stretch, the H200's slow outliers, and the
        // victims-only deadline: the open loop (the fitted model alone) adds misses behind
        // the outliers; the closed loop learns the gain and backs its budget off, and adds at
        // most a third of them, still giving best effort work.
        let x = sim::Deadlines::Together(1.3);
        let base = sim::trio_a(sim::Guarding::VictimsOnly, 2.0, x, true, 2.0);
        let open = sim::trio_a(sim::Guarding::Guarded(sharing()), 2.0, x, true, 2.0);
        let closed = sim::trio_a(sim::Guarding::Guarded(looped()), 2.0, x, true, 2.0);
        let added = |o: &sim::Outcome| -> f64 {
            (0..2)
                .map(|k| (o.late_pct[k].1 - base.late_pct[k].1).max(0.0))
                .sum()
        };
        assert!(added(&open) > 0.8, "open {open:?} base {base:?}");
        assert!(
            added(&closed) <= added(&open) / 3.0,
            "closed {closed:?} open {open:?}"
        );
        assert!(closed.best_effort > 0.05, "{closed:?}");
        // What it learned of resnet50 (48 SMs, the one vit_l_32 hurts most): a higher gain
        // than where the pieces cost what the model says (its charge is a reservation for
        // the worst overlap, so the gain is not the truth's factor itself).
        let as_modelled = sim::trio_a(sim::Guarding::Guarded(looped()), 2.0, x, true, 1.0);
        assert!(
            closed.learned[1].0 > as_modelled.learned[1].0,
            "{closed:?} {as_modelled:?}"
        );
    }

    #[test]
    fn where_the_model_holds_the_closed_loop_keeps_best_effort_over_30_percent() {
        // Pieces as the model says, the victims-only deadline: no predicted miss and best
        // effort over the issue's 30 % (the loop's ceiling keeps one job in eight clean: the
        // open loop's 69 % is not reached).
        let x = sim::Deadlines::Together(1.3);
        let closed = sim::trio_a(sim::Guarding::Guarded(looped()), 2.0, x, false, 1.0);
        assert!(closed.late_pct.iter().all(|(_, l)| *l == 0.0), "{closed:?}");
        assert!(closed.best_effort > 0.3, "{closed:?}");
    }

    #[test]
    fn pieces_sized_to_the_light_models_gaps_give_best_effort_work_at_the_alone_deadline() {
        // Trio a at 1.3 × p99 alone with the H200's slow outliers: resnet18 (period 335 µs,
        // ~250 µs a job alone, more beside resnet50) leaves gaps of well under 100 µs and has
        // almost no slack inside its jobs, so vit_l_32's ~95 µs pieces (the study's 100 µs)
        // fit almost nowhere: best effort got 1 % on the H200 and gets as little here. Pieces
        // of ~24 µs fit those gaps, overlapping resnet50 by its loop's budget: best effort
        // gets several times more, and no critical model misses more than 0.1 % of its jobs
        // beyond what the victims-only replay misses, also where the pieces really cost twice
        // what the model says (`truth` 2).
        let replay = |guarding, pieces, truth, deadlines| {
            sim::replay(&sim::Replay {
                guarding,
                pieces,
                truth,
                deadlines,
                outliers: true,
                seconds: 1.0,
                fit_gaps: false,
                trio: sim::Trio::A,
                poll: false,
            })
        };
        let added = |o: &sim::Outcome, base: &sim::Outcome| -> Vec<f64> {
            (0..2)
                .map(|k| o.late_pct[k].1 - base.late_pct[k].1)
                .collect()
        };
        let alone = sim::Deadlines::Alone(1.3);
        let base = replay(sim::Guarding::VictimsOnly, 10, 1.0, alone);
        let looped = sim::Guarding::Guarded(looped());
        let long = replay(looped, 10, 1.0, alone);
        assert!(long.best_effort < 0.02, "{long:?}");
        for truth in [1.0, 2.0] {
            let long = replay(looped, 10, truth, alone);
            let short = replay(looped, 40, truth, alone);
            assert!(
                short.best_effort > 0.05 && short.best_effort > 4.0 * long.best_effort,
                "truth {truth}: {short:?} against {long:?}"
            );
            assert!(
                added(&short, &base).iter().all(|a| *a <= 0.1),
                "truth {truth}: {short:?} against {base:?}"
            );
            // Not only the instants where no critical job runs (about 2 % of the time): the
            // pieces overlap resnet50 between resnet18's jobs.
            assert!(short.best_effort > 2.0 * base.idle, "{short:?} {base:?}");
        }
        // (Truth 1: 17 % of the time against 0.6 %; the ceiling is resnet18's idle time.)
        assert!(replay(looped, 40, 1.0, alone).best_effort > 0.12);
        // At 1.3 × the victims-only p99 the pieces may overlap resnet18's jobs too.
        let together = sim::Deadlines::Together(1.3);
        let base = replay(sim::Guarding::VictimsOnly, 40, 1.0, together);
        let short = replay(looped, 40, 1.0, together);
        assert!(short.best_effort > 0.25, "{short:?}");
        assert!(
            added(&short, &base).iter().all(|a| *a <= 0.1),
            "{short:?} against {base:?}"
        );
    }

    #[test]
    fn a_sharing_guards_best_effort_sizes_its_pieces_to_the_critical_gaps() {
        // Half the narrowest median gap, never over the scenario's piece; gaps too narrow for
        // a 20 µs piece (the H200's 2–30 µs at 75 %) keep the scenario's pieces.
        assert_eq!(gap_piece_ns(Some(85_000), 100_000), 42_500);
        assert_eq!(gap_piece_ns(Some(40_000), 100_000), MIN_PIECE_NS);
        assert_eq!(gap_piece_ns(Some(39_998), 100_000), 100_000);
        assert_eq!(gap_piece_ns(Some(19_000), 100_000), 100_000);
        assert_eq!(gap_piece_ns(Some(0), 100_000), 100_000);
        assert_eq!(gap_piece_ns(Some(MS), 100_000), 100_000);
        assert_eq!(gap_piece_ns(None, 100_000), 100_000);
        // Through the shared file: a critical workload with jobs of 250 µs every 335 µs (gaps
        // of 85 µs, resnet18's at 75 %), a best-effort job of 1 ms in pieces of 100 µs.
        let fitted = |policy: Policy| {
            let g = Arc::new(Guard::create(1, policy).unwrap());
            let setup = GuardSetup {
                path: g.path().unwrap(),
                policy,
                piece_ns: 100_000,
                critical_slot: None,
                wait: HoldWait::Poll,
                stretch: None,
            };
            let mut exec = crate::exec::SpinExecutor::new(MS, 0, 1);
            let mut role = GuardRole::attach(Some(&setup), Some(&g), &mut exec, &[MS; 4]).unwrap();
            assert_eq!(exec.pieces(), 10);
            let crit = CriticalPublisher::new(Arc::clone(&g), 0, 250_000, None);
            let t0 = clock::now_ns() - 100 * MS;
            for k in 0..20 {
                let release = t0 + k as i64 * 335_000;
                // Not measured before 16 gaps: the pieces stay as they are.
                if k <= GAP_MIN_JOBS as u64 {
                    assert_eq!(g.narrowest_gap(), None, "job {k}");
                }
                crit.pending(k, release, Some(release + 340_000));
                crit.started(release);
                crit.ended(k, 250_000);
            }
            // Its next job a second away: best effort runs now, free.
            let next = clock::now_ns() + 1_000 * MS;
            crit.pending(20, next, Some(next + 340_000));
            let stop = AtomicBool::new(false);
            role.run_job(&mut exec, 0, &stop).unwrap();
            (g.narrowest_gap(), exec.pieces())
        };
        // Under `share`: the median gap published, the job split again into pieces of 42.5 µs.
        assert_eq!(fitted(looped()), (Some(Some(85_000)), 24));
        // The stall model (no `share`) measures no gap and keeps the scenario's pieces.
        assert_eq!(fitted(stall(20_000)), (None, 10));
    }

    #[test]
    fn best_effort_fitted_to_the_gaps_gets_work_at_the_alone_deadline() {
        // The replay with the H200's 100 µs pieces (~95 µs) and the guard left to size them
        // ([`BestEffortHold::fit_gaps`]), 2 s, the slow outliers: at 1.3 × p99 alone it picks
        // about 24 µs (half resnet18's median gap) and best effort gets about 17 % of the time
        // against 0.6 % (7.5 % against 0.2 % where the pieces cost twice the model's stretch),
        // no critical model more than 0.1 points over the victims-only replay.
        let replay = |guarding, fit_gaps, truth, deadlines| {
            sim::replay(&sim::Replay {
                guarding,
                fit_gaps,
                truth,
                deadlines,
                outliers: true,
                seconds: 2.0,
                pieces: 10,
                trio: sim::Trio::A,
                poll: false,
            })
        };
        let looped = sim::Guarding::Guarded(looped());
        let alone = sim::Deadlines::Alone(1.3);
        let base = replay(sim::Guarding::VictimsOnly, true, 1.0, alone);
        for (truth, least) in [(1.0, 0.12), (2.0, 0.05)] {
            let fixed = replay(looped, false, truth, alone);
            let fit = replay(looped, true, truth, alone);
            assert!(
                (20_000..30_000).contains(&fit.piece_ns) && fixed.piece_ns > 90_000,
                "{fit:?}"
            );
            assert!(
                fit.best_effort > least && fit.best_effort > 4.0 * fixed.best_effort,
                "truth {truth}: {fit:?} against {fixed:?}"
            );
            for k in 0..2 {
                let added = fit.late_pct[k].1 - base.late_pct[k].1;
                assert!(added <= 0.1, "truth {truth}: {fit:?} against {base:?}");
            }
        }
        // At 1.3 × the victims-only p99, overlapped more, resnet18's median gap is under
        // 40 µs: too narrow for a 20 µs piece, so the scenario's pieces stay.
        let together = sim::Deadlines::Together(1.3);
        let fit = replay(looped, true, 1.0, together);
        assert_eq!(fit.piece_ns, replay(looped, false, 1.0, together).piece_ns);
    }

    #[test]
    fn in_trios_b_and_c_fitted_pieces_give_best_effort_more_and_add_no_misses() {
        // The study's other trios replayed at 1.3 × p99 alone with the slow outliers: in trio b
        // (mobilenet_v2 + convnext_base, vit_b_16 best effort) 100 µs pieces get best effort
        // nothing (0.1 %), fitted ones about 4 %; in trio c (mobilenet_v2 + resnet50, vit_l_32)
        // 24 % against 26 %. Either way, fitting the pieces costs the critical models at most
        // 0.1 points of misses over the same guard with the scenario's pieces.
        for trio in [sim::Trio::B, sim::Trio::C] {
            for truth in [1.0, 2.0] {
                let replay = |fit_gaps| {
                    sim::replay(&sim::Replay {
                        guarding: sim::Guarding::Guarded(looped()),
                        fit_gaps,
                        truth,
                        deadlines: sim::Deadlines::Alone(1.3),
                        outliers: true,
                        seconds: 2.0,
                        pieces: 10,
                        trio,
                        poll: false,
                    })
                };
                let (fixed, fit) = (replay(false), replay(true));
                assert!(fit.piece_ns < fixed.piece_ns / 2, "{trio:?}: {fit:?}");
                assert!(
                    fit.best_effort >= fixed.best_effort && fit.best_effort > 0.03,
                    "{trio:?} truth {truth}: {fit:?} against {fixed:?}"
                );
                for k in 0..2 {
                    assert!(
                        fit.late_pct[k].1 <= fixed.late_pct[k].1 + 0.1,
                        "{trio:?} truth {truth}: {fit:?} against {fixed:?}"
                    );
                }
            }
        }
        let b = |fit_gaps| {
            sim::replay(&sim::Replay {
                guarding: sim::Guarding::Guarded(looped()),
                fit_gaps,
                outliers: true,
                seconds: 2.0,
                trio: sim::Trio::B,
                ..sim::Replay::default()
            })
        };
        assert!(b(true).best_effort > 10.0 * b(false).best_effort);
    }

    #[test]
    fn the_loops_gain_follows_the_measured_delay_and_its_budget_backs_off_at_once() {
        // Clean jobs of 300 µs, then overlapped ones the model charged 20 µs that took 40 µs
        // longer: the gain goes to 2.
        let mut fb = Feedback::new(300_000);
        let deadline = 1_000_000;
        let job = |seq: i64, reserved: i64| SlotView {
            start: seq * MS + 1,
            acct_seq: seq,
            acct_overlap: reserved,
            ..SlotView::pending(seq, seq * MS, seq * MS + deadline, 300_000).with_loop(1.0, 0)
        };
        for seq in 0..50 {
            fb.ended(&job(seq, 0), seq * MS + 300_000, 300_000, true, 20_000);
            // Each job that kept its slack grows the budget by 1/64 from 1/4, up to 7/8.
            let grown = BUDGET_START + (seq + 1) as f64 * BUDGET_STEP;
            assert_eq!(fb.budget(), grown.min(BUDGET_MAX));
        }
        let mut l = None;
        for seq in 50..150 {
            let v = job(seq, 20_000);
            l = Some(fb.ended(&v, seq * MS + 340_000, 340_000, false, 20_000));
        }
        let l = l.unwrap();
        assert!((fb.gain() - 2.0).abs() < 0.1, "{}", fb.gain());
        assert_eq!(l.gain_milli, (fb.gain() * 1000.0).round() as i64);
        // The estimate is the job's own time, the measured delay taken out.
        // (The window's 99th percentile: a sample from before the gain had risen.)
        assert!(l.service >= 300_000 && l.service < 320_000, "{l:?}");
        let before = fb.budget();
        // A job 10 µs before its deadline (within the 20 µs margin): halved at once, the credit
        // voided.
        let near = fb.ended(&job(150, 0), 150 * MS + 990_000, 990_000, true, 20_000);
        assert!(near.backed_off);
        assert_eq!(fb.budget(), before / 2.0);
        // A job that began behind a backlog backs off too when best effort overlapped the job
        // before it (which it then helped to overrun), not otherwise.
        let queued = |seq: i64, reserved: i64| SlotView {
            start: seq * MS + 100_000,
            ..job(seq, reserved)
        };
        let at = |seq: i64| seq * MS + 400_000;
        assert!(
            !fb.ended(&queued(151, 0), at(151), 300_000, true, 0)
                .backed_off
        );
        assert!(
            !fb.ended(&queued(152, 10), at(152), 300_000, false, 0)
                .backed_off
        );
        assert!(
            fb.ended(&queued(153, 0), at(153), 300_000, true, 0)
                .backed_off
        );
    }

    #[test]
    fn best_effort_spends_a_victims_credit_to_overlap_a_job_and_waits_without_it() {
        let p = Policy::new(0, Some(1.25));
        // Running since 10 ms, 1 ms of service, due at 12: room for a piece.
        let v = running(3, 10 * MS, 12 * MS, MS);
        let now = 10 * MS + MS / 10;
        assert!(admits(&v.with_loop(1.0, CREDIT_JOB), now, MS / 10, &p).is_some());
        // Without a job's credit it may not begin overlapping it; once it has (reserved
        // against this job), its later pieces need none.
        let broke = v.with_loop(1.0, CREDIT_JOB - 1);
        assert_eq!(admits(&broke, now, MS / 10, &p), None);
        let begun = SlotView {
            acct_seq: 3,
            acct_overlap: 1,
            ..broke
        };
        assert!(admits(&begun, now, MS / 10, &p).is_some());
        // The gain multiplies the charge: 0.2 of a 0.1 ms overlap at gain 2 is 40 µs.
        assert_eq!(
            admits(&v.with_loop(2.0, CREDIT_JOB), now, MS / 10, &p),
            Some(40_000)
        );
        // Through the shared file: the publisher under `share` starts a loop with one job of
        // credit, the first admitted piece spends it, and the next job waits for the credit
        // its end adds.
        let g = Arc::new(Guard::create(1, looped()).unwrap());
        let pubr = CriticalPublisher::new(Arc::clone(&g), 0, 300_000, None);
        assert_eq!((g.view(0).gain_milli, g.view(0).credit), (1000, CREDIT_JOB));
        let t = clock::now_ns();
        pubr.pending(0, t, Some(t + 100 * MS));
        pubr.started(t);
        assert!(g.try_piece(10_000).is_ok());
        assert_eq!(g.view(0).credit, 0);
        assert!(g.view(0).acct_overlap > 0);
        pubr.ended(0, 310_000);
        // Kept its slack: a quarter of a job plus 1/64 of credit, not a whole one.
        let c = g.view(0).credit;
        assert!(c > 0 && c < CREDIT_JOB, "{c}");
        let t = clock::now_ns();
        pubr.pending(1, t, Some(t + 100 * MS));
        pubr.started(t);
        assert!(g.try_piece(10_000).is_err());
    }

    #[test]
    fn a_refused_piece_says_why() {
        let p = stall(20_000);
        let at = 10 * MS;
        // Running since 10 ms, 300 µs of service, due 50 µs after its expected end less the
        // margin: a 100 µs piece is too long, a 20 µs one fits.
        let roomy = running(1, at, at + 370_000, 300_000);
        let why = |vs: &[SlotView], piece: i64, p: &Policy| {
            let k = vs
                .iter()
                .position(|v| admits(v, at, piece, p).is_none())
                .unwrap();
            let others = vs.iter().enumerate().filter(|(j, _)| *j != k);
            why_held(&vs[k], others.map(|(_, v)| *v), at, piece, p, None)
        };
        assert_eq!(why(&[roomy], 100_000, &p), Hold::TooLong);
        // No slack left in it at all.
        let full = running(1, at, at + 320_000, 300_000);
        assert_eq!(why(&[full], 100_000, &p), Hold::Running);
        // The next job, released 10 µs from now with no slack: the first refusing slot names
        // the hold, and one that admits the shortest piece does not.
        let next = SlotView::pending(2, at + 10_000, at + 330_000, 300_000);
        assert_eq!(why(&[roomy, next], 100_000, &p), Hold::Next);
        assert_eq!(why(&[SlotView::unknown()], 100_000, &p), Hold::Between);
        // A sharing loop's own holds, in the order `admits_piece` tests them.
        let sharing = Policy::new(20_000, Some(1.25));
        let broke = running(1, at - 100_000, at + MS, 300_000).with_loop(1.0, 0);
        assert_eq!(why(&[broke], 100_000, &sharing), Hold::Budget);
        let overrun = running(1, at - 400_000, at + MS, 300_000);
        assert_eq!(why(&[overrun], 100_000, &sharing), Hold::Overrun);
        let queued = SlotView {
            start: at - 10_000,
            ..SlotView::pending(1, at - 100_000, at + MS, 300_000)
        };
        assert_eq!(why(&[queued], 100_000, &sharing), Hold::Backlog);
        // Each hold has its words, in the order of its index.
        for (k, (h, words)) in HOLDS.iter().enumerate() {
            assert_eq!(h.index(), k);
            assert!(!words.is_empty());
        }
    }

    #[test]
    fn best_efforts_account_says_where_its_time_went() {
        let a = HoldAccount {
            held_ns: [3 * MS, MS, 0, 2 * MS, 0, 0, 0],
            ran_ns: 4 * MS,
            pieces: 40,
            fine_pieces: 0,
            first: 100 * MS,
            last: 110 * MS,
        };
        assert_eq!(
            a.line().unwrap(),
            "best effort time: 10.0 ms; ran 40 pieces 4.0 ms (40.0 %, 100.0 µs a piece); \
             held 6.0 ms (60.0 %): too long for the slack 3.0 ms (30.0 %), no slack in a \
             running critical job 1.0 ms (10.0 %), no slack before the next critical job \
             0.0 ms (0.0 %), between critical jobs 2.0 ms (20.0 %), the sharing loop's budget \
             spent 0.0 ms (0.0 %), a critical backlog 0.0 ms (0.0 %), a critical job past its \
             estimate 0.0 ms (0.0 %)"
        );
        assert_eq!(HoldAccount::default().line(), None);
        // Through the shared file: a critical workload that has published nothing yet holds
        // best effort (between jobs) until it finishes; then the piece runs and is counted.
        let g = Arc::new(Guard::create(1, stall(20_000)).unwrap());
        let mut hold = BestEffortHold::new(Arc::clone(&g), HoldWait::Poll);
        hold.seed_estimate(1, 100_000);
        let stop = AtomicBool::new(false);
        let freer = {
            let g = Arc::clone(&g);
            std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(5));
                g.finish(0);
            })
        };
        let held = hold.before_piece(0, &stop);
        freer.join().unwrap();
        hold.job_done();
        let acc = hold.account().clone();
        assert!(
            held > 0 && acc.held_ns[Hold::Between.index()] > 0,
            "{acc:?}"
        );
        let others: i64 = acc.held_ns.iter().sum::<i64>() - acc.held_ns[Hold::Between.index()];
        assert_eq!(others, 0, "{acc:?}");
        assert_eq!(acc.pieces, 1);
        assert!(acc.last >= acc.first && acc.line().is_some());
    }

    #[test]
    fn the_replays_say_where_best_efforts_time_goes() {
        // The three trios at 1.3 × the victims-only p99, the slow outliers, best effort
        // polling (as on the H200) in ~100 µs pieces. Under the default stall model the piece
        // is too long for what the critical jobs' slack leaves most of the time it is held
        // (a 20 µs piece would have been admitted): 32, 24 and 43 % of the time in trios a, b
        // and c. Under `share` the pieces fit, and the closed loop's budget of overlapped
        // jobs, halved at each backlog behind an overlapped job, holds best effort most: 63
        // and 71 % of the time in trios a and c, where it gets less than the stall model.
        for trio in [sim::Trio::A, sim::Trio::B, sim::Trio::C] {
            let replay = |policy| {
                sim::replay(&sim::Replay {
                    guarding: sim::Guarding::Guarded(policy),
                    deadlines: sim::Deadlines::Together(1.3),
                    outliers: true,
                    poll: true,
                    trio,
                    ..sim::Replay::default()
                })
            };
            let stalled = replay(stall(20_000));
            let h = stalled.held;
            let largest = HOLDS.iter().map(|(k, _)| h.of(*k)).fold(0.0, f64::max);
            assert_eq!(h.of(Hold::TooLong), largest, "{trio:?}: {stalled:?}");
            assert!(h.of(Hold::TooLong) > 0.2, "{trio:?}: {stalled:?}");
            // Not its service estimate (the decaying maximum, which carries the other
            // critical model's stretch): with each at its time alone, far less would fit.
            assert!(
                h.estimate < h.of(Hold::TooLong) / 2.0,
                "{trio:?}: {stalled:?}"
            );
            let shared = replay(looped());
            assert!(shared.held.of(Hold::TooLong) < 0.05, "{trio:?}: {shared:?}");
            if trio != sim::Trio::B {
                assert!(shared.held.of(Hold::Budget) > 0.5, "{trio:?}: {shared:?}");
                assert!(shared.best_effort < stalled.best_effort, "{trio:?}");
            }
        }
    }

    // ---- best effort in runs of fine pieces (`[protection] fine_piece_us`) ----

    const US: i64 = 1_000;

    /// A guard of one critical workload whose job runs since `at` for 300 µs, due `slack` µs
    /// after its expected end (margin 0, the stall model), and a decision at `at`.
    fn one_running(slack_us: i64) -> (Guard, CriticalPublisher, i64) {
        let g = Arc::new(Guard::create(1, stall(0)).unwrap());
        let p = CriticalPublisher::new(Arc::clone(&g), 0, 300 * US, None);
        let at = 10 * MS;
        p.pending(1, at, Some(at + (300 + slack_us) * US));
        p.started(at);
        // The publisher's own slot, mapped again: the guard best effort asks.
        let other = Guard::open(&g.path().unwrap(), stall(0)).unwrap();
        (other, p, at)
    }

    #[test]
    fn a_run_of_fine_pieces_is_as_long_as_the_slack_allows_and_no_longer_than_piece_us() {
        let est = [25 * US; 8];
        let cap = 100 * US;
        // Slack for two pieces of 25 µs, not three.
        let (g, _p, at) = one_running(60);
        assert_eq!(g.run_at(at, &est, cap, None), Ok(2));
        // Ample slack: the run stops at piece_us (four pieces), and at the job's end.
        let (g, _p, at) = one_running(1_000);
        assert_eq!(g.run_at(at, &est, cap, None), Ok(4));
        let (g, _p, at) = one_running(1_000);
        assert_eq!(g.run_at(at, &est[5..], cap, None), Ok(3));
        // A piece estimated longer than piece_us still runs alone when it fits.
        let (g, _p, at) = one_running(1_000);
        assert_eq!(g.run_at(at, &[150 * US, 10 * US], cap, None), Ok(1));
        // Pieces of their own lengths: their running totals are 10, 60 and 70 µs.
        let (g, _p, at) = one_running(65);
        assert_eq!(
            g.run_at(at, &[10 * US, 50 * US, 10 * US, 10 * US], cap, None),
            Ok(2)
        );
        // Under the first piece's length: held, and why, as a piece would be: too long where
        // the shortest piece (20 µs) fits, no slack in the running job where it does not.
        let (g, _p, at) = one_running(22);
        let (_, why) = g.run_at(at, &est, cap, None).unwrap_err();
        assert_eq!(why, Hold::TooLong);
        let (g, _p, at) = one_running(10);
        let (_, why) = g.run_at(at, &est, cap, None).unwrap_err();
        assert_eq!(why, Hold::Running);
        assert_eq!(g.view(0).acct_overlap, 0, "a refused run reserves nothing");
    }

    #[test]
    fn a_runs_reservation_is_a_piece_of_its_total_and_reservations_add_up() {
        let est = [25 * US; 8];
        let cap = 100 * US;
        // 120 µs of slack: a run of four (100 µs) reserves 100 µs, as one 100 µs piece does.
        let (g, _p, at) = one_running(120);
        assert_eq!(g.run_at(at, &est, cap, None), Ok(4));
        let (single, _q, at2) = one_running(120);
        assert_eq!(single.refusal(at2, 100 * US, None), None);
        single.reserve(at2, 100 * US, None);
        assert_eq!(g.view(0).acct_overlap, 100 * US);
        assert_eq!(single.view(0).acct_overlap, 100 * US);
        // The 20 µs left: the next run is refused (its first piece is 25 µs) ...
        assert!(g.run_at(at, &est[4..], cap, None).is_err());
        // ... and a shorter one fits exactly, and adds up to the whole slack.
        assert_eq!(g.run_at(at, &[10 * US, 10 * US, 10 * US], cap, None), Ok(2));
        assert_eq!(g.view(0).acct_overlap, 120 * US);
        // Through the public call (the clock's now, past the job's start: the same overlap).
        let (g, _p, _) = one_running(1_000);
        assert_eq!(g.try_run_why(&est, cap, None), Ok(4));
        assert_eq!(g.view(0).acct_overlap, 100 * US);
    }

    #[test]
    fn the_longest_run_is_bisected_within_the_cap() {
        let est = [10, 20, 30, 40];
        let mut looked = Vec::new();
        let k = longest_run(&est, 1_000, |len| {
            looked.push(len);
            len <= 60
        });
        assert_eq!(k, 3);
        assert!(looked.len() <= 2, "{looked:?}");
        assert_eq!(longest_run(&est, 35, |_| true), 2);
        assert_eq!(longest_run(&est, 5, |_| true), 1, "always the first");
        assert_eq!(longest_run(&est, 1_000, |_| false), 1);
        assert_eq!(longest_run(&[], 1_000, |_| true), 0);
        // Many pieces: a few looks, not one a piece.
        let many = vec![1; 10_000];
        let mut looks = 0;
        assert_eq!(
            longest_run(&many, i64::MAX, |len| {
                looks += 1;
                len <= 7_777
            }),
            7_777
        );
        assert!(looks <= 14, "{looks}");
    }

    #[test]
    fn a_runs_measured_length_is_shared_by_its_pieces_estimates() {
        // A run of a 10 and a 30 µs piece measured 80 µs: 20 and 60 µs as samples, each
        // estimate moving a quarter of the way up.
        let mut est = [10 * US, 30 * US];
        apportion(&mut est, 80 * US);
        assert_eq!(est, [10 * US + 10 * US / 4, 30 * US + 30 * US / 4]);
        // A run of one tracks its length, as a piece always has.
        let (mut a, mut b) = ([50 * US], 50 * US);
        apportion(&mut a, 20 * US);
        track_upper_quantile(&mut b, 20 * US);
        assert_eq!(a[0], b);
    }

    /// A job of `pieces` split at `piece_ns` that records how it is run.
    struct Pieces {
        job_ns: i64,
        pieces: usize,
        calls: Vec<String>,
    }

    impl Executor for Pieces {
        fn run_job(&mut self) -> Result<(), ExecError> {
            self.calls.push("job".into());
            Ok(())
        }
        fn split(&mut self, piece_ns: i64) {
            self.pieces = (self.job_ns / piece_ns).max(1) as usize;
            self.calls.push(format!("split {}", piece_ns / US));
        }
        fn pieces(&self) -> usize {
            self.pieces
        }
        fn run_piece(&mut self, i: usize) -> Result<(), ExecError> {
            self.calls.push(format!("piece {i}"));
            Ok(())
        }
        fn run_pieces(&mut self, range: std::ops::Range<usize>) -> Result<(), ExecError> {
            self.calls.push(format!("run {range:?}"));
            Ok(())
        }
    }

    /// Best effort attached to a guard whose one critical workload has finished (every piece
    /// admitted), with `[protection]` `piece_us = 100` and `fine_piece_us`; its first job's
    /// calls.
    fn first_job(fine_piece_us: u64) -> (Vec<String>, HoldAccount) {
        use isolane_core::spec::ProtectionSpec;
        let spec = ProtectionSpec {
            piece_us: 100,
            margin_us: 0,
            fine_piece_us,
            ..ProtectionSpec::default()
        };
        let policy = Policy::of(&spec, None);
        let g = Arc::new(Guard::create(1, policy).unwrap());
        g.finish(0);
        let setup = GuardSetup {
            path: g.path().unwrap(),
            policy,
            piece_ns: 100 * US,
            critical_slot: None,
            wait: HoldWait::Poll,
            stretch: None,
        };
        let mut exec = Pieces {
            job_ns: 200 * US,
            pieces: 1,
            calls: Vec::new(),
        };
        let mut role =
            GuardRole::attach(Some(&setup), Some(&g), &mut exec, &[200 * US; 4]).unwrap();
        role.run_job(&mut exec, 0, &AtomicBool::new(false)).unwrap();
        let GuardRole::BestEffort(hold) = role else {
            panic!("best effort");
        };
        (exec.calls, hold.account().clone())
    }

    #[test]
    fn fine_pieces_run_in_runs_and_without_them_nothing_changes() {
        // fine_piece_us = 25: eight pieces of 25 µs, run four at a time (piece_us = 100).
        let (calls, acc) = first_job(25);
        assert_eq!(calls, ["split 25", "run 0..4", "run 4..8"]);
        assert_eq!((acc.pieces, acc.fine_pieces), (2, 8));
        let line = acc.line().unwrap();
        assert!(
            line.contains("ran 2 runs") && line.contains("8 fine pieces, 4.00 a run"),
            "{line}"
        );
        // Off (the default): two pieces of 100 µs, each run and waited for alone.
        let (calls, acc) = first_job(0);
        assert_eq!(calls, ["split 100", "piece 0", "piece 1"]);
        assert_eq!((acc.pieces, acc.fine_pieces), (2, 0));
        assert!(acc.line().unwrap().contains("ran 2 pieces"));
        // The policy carries it to worker processes; an older coordinator's has none.
        let p = Policy::of(
            &isolane_core::spec::ProtectionSpec {
                fine_piece_us: 25,
                ..Default::default()
            },
            None,
        );
        assert_eq!(p.fine_piece_ns, 25 * US);
        let text = serde_json::to_string(&p).unwrap();
        assert_eq!(serde_json::from_str::<Policy>(&text).unwrap(), p);
        assert_eq!(Policy::new(1, None).fine_piece_ns, 0);
    }

    #[test]
    fn runs_of_fine_pieces_give_best_effort_more_at_the_same_critical_outcome() {
        // Trio b at 1.3 × the victims-only p99, the slow outliers, best effort polling, each
        // launch waited for costing it 5 µs (a few µs on the H200). Pieces of ~76 µs (a
        // vit_b_16 job in 10) are too long for the slack 23 % of the time; ~19 µs pieces one
        // by one fit it, but pay the wait 40 times a job and get less than the long ones
        // (61 against 65 %); runs of them, up to 76 µs, fit the slack and wait far less often:
        // best effort gets more than either (67 %), and no critical job is late that was not
        // (trios a and c: see docs/criticality.md, where they add misses).
        let r = sim::Replay {
            guarding: sim::Guarding::Guarded(stall(20_000)),
            deadlines: sim::Deadlines::Together(1.3),
            outliers: true,
            poll: true,
            trio: sim::Trio::B,
            ..sim::Replay::default()
        };
        let replay = |pieces, fine| {
            sim::replay_launching(
                &sim::Replay { pieces, ..r },
                sim::Launches {
                    fine,
                    sync_ns: 5_000,
                },
            )
        };
        let (long, short, runs) = (replay(10, 0), replay(40, 0), replay(10, 40));
        assert!(long.held.of(Hold::TooLong) > 0.2, "{long:?}");
        assert!(runs.held.of(Hold::TooLong) < 0.05, "{runs:?}");
        assert!(
            short.best_effort < long.best_effort,
            "{short:?} against {long:?}"
        );
        assert!(
            runs.best_effort > long.best_effort + 0.015,
            "{runs:?} against {long:?}"
        );
        assert!(runs.best_effort > short.best_effort + 0.05, "{runs:?}");
        assert_eq!(runs.late_pct, long.late_pct);
        assert_eq!(runs.late_seqs, long.late_seqs);
    }
}
