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

/// One critical workload's published state, in the shared file (ten 8-byte words).
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
    _pad: AtomicI64,
}

/// The file's first words: magic, slot count, the best-effort lock.
#[repr(C)]
struct Header {
    magic: AtomicI64,
    slots: AtomicI64,
    lock: AtomicI64,
    _pad: AtomicI64,
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
        }
    }

    /// The same job, its workload stating its own stretch beside best effort.
    pub fn with_stretch(self, stretch: f64) -> SlotView {
        SlotView {
            stretch_milli: stretch_milli(Some(stretch)),
            ..self
        }
    }

    /// Delay per ns of overlap for this job: its workload's own stretch, else the run's.
    fn delay_per_overlap(&self, policy: &Policy) -> f64 {
        if self.stretch_milli >= 1000 {
            1.0 - 1000.0 / self.stretch_milli as f64
        } else {
            policy.delay_per_overlap
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

    /// The delay best effort has reserved against the published job.
    fn reserved(&self) -> i64 {
        if self.acct_seq == self.seq {
            self.acct_overlap
        } else {
            0
        }
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
}

impl Policy {
    pub fn new(margin_ns: i64, stretch: Option<f64>) -> Policy {
        Policy {
            margin_ns,
            delay_per_overlap: stretch.map_or(1.0, |s| (1.0 - 1.0 / s).clamp(0.0, 1.0)),
        }
    }
}

/// The delay (ns) a piece of `piece_ns` started at `now` could add to the critical job `v`
/// describes, if its slack allows it (the delay to reserve), or `None`: hold the piece.
pub fn admits(v: &SlotView, now: i64, piece_ns: i64, policy: &Policy) -> Option<i64> {
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
            let delay = (piece_ns as f64 * v.delay_per_overlap(policy)).round() as i64;
            return (delay <= slack).then_some(0);
        }
        _ => {}
    }
    let begins = v.begins(now);
    let overlap = now.saturating_add(piece_ns).saturating_sub(begins.max(now));
    if overlap <= 0 {
        return Some(0);
    }
    let delay = (overlap as f64 * v.delay_per_overlap(policy)).round() as i64;
    let slack = v
        .deadline
        .saturating_sub(policy.margin_ns)
        .saturating_sub(begins.saturating_add(v.service))
        .saturating_sub(v.reserved());
    (delay <= slack).then_some(delay)
}

/// When a piece held back by the critical job `v` describes is worth asking about again:
/// when that job is expected to end (its start, or release, plus its service estimate and the
/// delay already reserved against it), within [[`POLL_NS`], [`MAX_HOLD_SLEEP_NS`]] from now.
/// Between two jobs the next release is published within microseconds: soon.
pub fn retry_at(v: &SlotView, now: i64) -> i64 {
    let soon = now + POLL_NS as i64;
    if v.state != PUBLISHED {
        return soon;
    }
    v.begins(now)
        .saturating_add(v.service)
        .saturating_add(v.reserved())
        .clamp(soon, now + MAX_HOLD_SLEEP_NS)
}

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

    fn view(&self, i: usize) -> SlotView {
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
        let _l = self.lock();
        let now = clock::now_ns();
        // Two passes over the slots with the same `now` (no allocation): check all, then
        // reserve. A critical slot may change in between (it never takes the lock); the second
        // pass reserves what it sees then, which is what the next decision will count.
        let retry = (0..self.slots)
            .map(|i| self.view(i))
            .filter(|v| admits(v, now, piece_ns, &self.policy).is_none())
            .map(|v| retry_at(&v, now))
            .min();
        if let Some(at) = retry {
            return Err(at);
        }
        for i in 0..self.slots {
            let v = self.view(i);
            let Some(o) = admits(&v, now, piece_ns, &self.policy) else {
                continue;
            };
            if o == 0 {
                continue;
            }
            let s = self.slot(i);
            if v.acct_seq != v.seq {
                s.acct_seq.store(v.seq, Ordering::Relaxed);
                s.acct_overlap.store(0, Ordering::Relaxed);
            }
            s.acct_overlap.fetch_add(o, Ordering::Relaxed);
        }
        Ok(())
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
        s.stretch_milli
            .store(stretch_milli(stretch), Ordering::Relaxed);
        CriticalPublisher { guard, slot }
    }

    fn s(&self) -> &Slot {
        self.guard.slot(self.slot)
    }

    /// Job `seq` is next: released at `release` (absolute), due at `deadline`.
    pub fn pending(&self, seq: u64, release: i64, deadline: Option<i64>) {
        let s = self.s();
        s.start.store(0, Ordering::Release);
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
        s.state.store(UNKNOWN, Ordering::Release);
        let overlap = if s.acct_seq.load(Ordering::Relaxed) == seq as i64 {
            s.acct_overlap.load(Ordering::Relaxed)
        } else {
            0
        };
        let sample = (service_ns - overlap).max(0);
        let est = s.service.load(Ordering::Relaxed);
        let next = if sample >= est {
            sample
        } else {
            est - (est - sample) / 128
        };
        s.service.store(next, Ordering::Relaxed);
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
    /// The piece in progress and when it was admitted.
    current: Option<(usize, i64)>,
    /// Held so far in the current job.
    held_ns: i64,
    wait: HoldWait,
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
            held_ns: 0,
            wait,
        }
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
        self.end_piece();
        if self.piece_ns.len() <= i {
            self.piece_ns.resize(i + 1, 1);
        }
        let mut est = self.piece_ns[i];
        let seed = self.seed_ns.get(i).copied().unwrap_or(1);
        let t = clock::now_ns();
        let mut now = t;
        while let Err(at) = self.guard.try_piece(est) {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            // An estimate raised by pieces that ran preempted (a flood beside them) is only
            // lowered by pieces that run; held, none does, and one above every gap would hold
            // best effort for good (seen serving: idle critical models, best effort stuck).
            // So while held it relaxes towards the warm-up's estimate, never below it.
            est = relax_towards(est, seed);
            self.piece_ns[i] = est;
            match self.wait {
                // Asleep until the blocking critical job should be over: a best-effort thread
                // that shares a core with critical work then wakes (and preempts it) once per
                // job, not every 20 µs.
                HoldWait::Sleep => {
                    std::thread::sleep(std::time::Duration::from_nanos((at - now).max(0) as u64))
                }
                HoldWait::Poll => poll_pause(),
            }
            now = clock::now_ns();
        }
        self.held_ns += now - t;
        self.current = Some((i, clock::now_ns()));
        now - t
    }

    /// Measures the piece that just ended (called by the next `before_piece` or `job_done`).
    fn end_piece(&mut self) {
        if let Some((i, began)) = self.current.take() {
            let d = clock::now_ns() - began;
            track_upper_quantile(&mut self.piece_ns[i], d);
        }
    }

    /// The job ended: returns the time it was held in all and starts afresh.
    pub fn job_done(&mut self) -> i64 {
        self.end_piece();
        std::mem::take(&mut self.held_ns)
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
    /// Target length of a best-effort piece.
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
        let Some(setup) = setup else {
            return Ok(GuardRole::Off);
        };
        let guard = match guard {
            Some(g) => Arc::clone(g),
            None => Arc::new(Guard::open(&setup.path, setup.policy)?),
        };
        let job_ns = high_estimate(warmup_ns);
        Ok(match setup.critical_slot {
            Some(slot) => {
                GuardRole::Critical(CriticalPublisher::new(guard, slot, job_ns, setup.stretch))
            }
            None => {
                exec.split(setup.piece_ns);
                let mut hold = BestEffortHold::new(guard, setup.wait);
                hold.seed_estimate(exec.pieces(), job_ns);
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
            GuardRole::Critical(p) => {
                let start = clock::now_ns();
                p.started(start);
                exec.run_job()?;
                let end = clock::now_ns();
                p.ended(index, end - start);
                Ok((start, end, 0))
            }
            GuardRole::BestEffort(h) => {
                h.before_piece(0, stop);
                let start = clock::now_ns();
                exec.run_piece(0)?;
                for i in 1..exec.pieces() {
                    h.before_piece(i, stop);
                    exec.run_piece(i)?;
                }
                let end = clock::now_ns();
                Ok((start, end, h.job_done()))
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
mod tests {
    use super::*;

    const MS: i64 = 1_000_000;

    fn stall(margin_ns: i64) -> Policy {
        Policy::new(margin_ns, None)
    }

    #[test]
    fn a_stated_stretch_charges_part_of_the_overlap() {
        // Running since 10 ms, 3 ms service, due at 15: 2 ms of slack. With a worst stretch
        // of 1.5 an overlap of o delays it by o/3: up to 6 ms of overlap fit.
        let mut v = SlotView::pending(0, 10 * MS, 15 * MS, 3 * MS);
        v.start = 10 * MS;
        let p = Policy::new(0, Some(1.5));
        assert_eq!(admits(&v, 10 * MS, 3 * MS, &p), Some(MS));
        assert_eq!(admits(&v, 10 * MS, 6 * MS, &p), Some(2 * MS));
        assert_eq!(admits(&v, 10 * MS, 6 * MS + 10, &p), None);
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
        // The workload's own stretch 1.25 charges 1 − 1/1.25 = 0.2 of it: 2 ms, admitted.
        assert_eq!(
            admits(&v.with_stretch(1.25), 10 * MS, 10 * MS, &stall(0)),
            Some(2 * MS)
        );
        // Its own 5.0 charges 0.8: 8 ms, held, even where the run's model (stretch 1.25) would
        // have admitted it.
        let lenient = Policy::new(0, Some(1.25));
        assert_eq!(admits(&v, 10 * MS, 10 * MS, &lenient), Some(2 * MS));
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

    #[test]
    fn a_file_that_is_not_a_guard_is_refused() {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), [0u8; 64]).unwrap();
        assert!(Guard::open(f.path(), stall(0)).is_err());
        assert!(Guard::open(Path::new("/nonexistent/guard"), stall(0)).is_err());
    }
}
