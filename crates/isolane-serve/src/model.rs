//! One served model: its queue, the admission of each request against its deadline, and the
//! thread that owns the model and runs its jobs (one request, or a dynamic batch of them).
//!
//! Admission predicts a request's completion when it arrives: the job running now ends at its
//! start plus the service estimate, each job queued ahead takes the estimate, and so does the
//! request's own. A request predicted past its deadline is refused at once; one taken that
//! still ends late is answered with `late = true` and counted. The estimate is the 90th
//! percentile of the last 31 jobs' service times (the warm-up's median to begin with): the
//! median let 8 of 320 burst requests on the H200 complete late, and a mean or the maximum
//! would let one preempted job refuse a burst of requests that would have made it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::time::Duration;

use isolane_core::spec::{Batching, Criticality, WhenFull};
use isolane_core::JobRecord;
use isolane_protocol::{DataType, Tensor};
use isolane_runtime::clock;
use isolane_runtime::exec::{Executor, TensorInfo};
use isolane_runtime::guard::{CriticalPublisher, GuardRole};
use isolane_runtime::jobs_stream::BatchSender;
use tokio::sync::oneshot;

use crate::request::{
    check_inputs, copy_le_f32, le_bytes, CheckedInputs, InferRequest, InferResponse, Refusal,
    Stamps,
};
use crate::stats::ModelStats;

/// What a served model is, as clients and metrics see it.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    /// The workload's name.
    pub name: String,
    /// The workload's model (a built-in name, a file, `spin:`).
    pub source: String,
    pub inputs: Vec<TensorInfo>,
    pub outputs: Vec<TensorInfo>,
    /// Rows per job: the workload's `batch`, which the model was compiled for.
    pub max_batch: usize,
    pub criticality: Criticality,
    /// The deadline of a request that states none.
    pub deadline: Option<Duration>,
    pub queue_limit: u32,
    pub when_full: WhenFull,
    pub batching: Option<Batching>,
    /// `cpu` or `cuda`.
    pub backend: &'static str,
    /// The partition in words (`cpu`, `green 24 SMs`, `whole GPU`).
    pub partition: String,
    /// The cores its threads are pinned to (none: unpinned).
    pub cpu: Vec<usize>,
    /// The SMs of its green partition, on a GPU.
    pub sms: Option<u32>,
    /// Median service time of the warm-up's jobs.
    pub warm_service: Duration,
    /// The pieces a job runs as (best effort under the guard; 1: whole).
    pub pieces: usize,
}

type Reply = oneshot::Sender<Result<InferResponse, Refusal>>;

/// A request taken into the queue.
struct Queued {
    inputs: CheckedInputs,
    reply: Reply,
    arrived: i64,
    /// Absolute, ns on the monotonic clock.
    deadline: Option<i64>,
}

#[derive(Default)]
struct Queue {
    items: VecDeque<Queued>,
    rows: usize,
    /// When the running job began (0: none running).
    running_since: i64,
    /// Jobs launched behind the running one, into free input slots (`serve_slotted`): each
    /// starts when the one before ends.
    staged: usize,
    /// When the model last ran out of work (0: it has work, or has never had any): the next
    /// arrival's gap from it is what the thread's poll learns from ([`IdleGaps`]).
    idle_since: i64,
    idle_gaps: IdleGaps,
    /// No more requests: drain what is queued, then end.
    closing: bool,
    /// Requests taken and not yet answered (queued or running).
    in_flight: usize,
    /// The instance that may take jobs from the queue: an instance whose number this is not
    /// has been replaced (or the model unloaded) and ends after the job it runs.
    instance: u64,
    /// Unloaded (Triton's repository extension): new requests are refused; no instance runs.
    unloaded: bool,
    /// When the replaced instance stopped serving (its last job's end, or the switch when it
    /// ran none): the start of the pause, which ends when the new instance may take a job.
    handoff_from: i64,
    /// Arrivals and answers of the last [`WINDOW_NS`], for the model's load (`ctl status`).
    window: Window,
}

/// How far back a model's load is measured (`ctl status`: rate and p99).
pub(crate) const WINDOW_NS: i64 = 10_000_000_000;
/// Entries kept at most per list, whatever the rate (100 k requests in the window).
const WINDOW_CAP: usize = 100_000;

/// An idle model whose last job ended this long ago (ns) is admitted by its warm-up's service
/// time when its recent jobs' estimate is above it: the estimate is refreshed only by jobs,
/// and one raised by a moment of interference (a neighbour's rebuild on the H200) otherwise
/// refused every request for good (3076 of mobilenet_v2's 4104, issue 35). The request taken
/// so is a probe: its job brings the estimate back, or keeps it up. At most one an interval.
pub(crate) const PROBE_AFTER_NS: i64 = 100_000_000;

#[derive(Default)]
struct Window {
    arrivals: VecDeque<i64>,
    /// (answered at, latency), ns.
    answers: VecDeque<(i64, i64)>,
}

impl Window {
    fn prune(&mut self, now: i64) {
        let from = now - WINDOW_NS;
        while self.arrivals.front().is_some_and(|&t| t < from) || self.arrivals.len() > WINDOW_CAP {
            self.arrivals.pop_front();
        }
        while self.answers.front().is_some_and(|&(t, _)| t < from)
            || self.answers.len() > WINDOW_CAP
        {
            self.answers.pop_front();
        }
    }
}

/// A model's load over the last [`WINDOW_NS`] (or since it started, when younger).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Load {
    /// Requests that reached the model (taken or refused), per second.
    pub rate_hz: f64,
    /// Requests waiting for a job now.
    pub queued: usize,
    /// Requests taken and not answered yet.
    pub in_flight: usize,
    /// The 99th percentile of the window's answers' latencies (ms); `None` without answers.
    pub p99_ms: Option<f64>,
    pub answered: usize,
    /// The admission's service estimate now (ms).
    pub service_ms: f64,
}

/// How an instance's take-over went: from the change's request to the new instance serving,
/// and the pause within it (no instance could take a request).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TakeOver {
    /// ns from the request to the new instance serving.
    pub took_ns: i64,
    /// ns during which the model served nothing: from the old instance's last job (or the
    /// switch) to the new instance free to take one; `None` when no instance was serving
    /// before (a load).
    pub pause_ns: Option<i64>,
}

/// The state a model's submitters and its thread share.
pub(crate) struct ServedModel {
    /// What the model is now (a change replaces it; readers take a snapshot).
    info: RwLock<Arc<ModelInfo>>,
    queue: Mutex<Queue>,
    wake: Condvar,
    /// The 90th percentile of recent jobs' service times (ns), for admission.
    service_ns: AtomicI64,
    /// The guard's view of this model when it is critical in a protected server.
    publisher: Option<Arc<CriticalPublisher>>,
    pub stats: Arc<ModelStats>,
    next_seq: AtomicU64,
    /// Where each answered request goes as a job record (`serve --out`), and the server's t0.
    records: Option<(BatchSender, i64)>,
    /// Requests recorded so far (the records' index).
    recorded: AtomicU64,
    /// The queue's length, read without the lock by the thread's poll before it sleeps.
    queued: AtomicUsize,
    /// How long the thread polls its queue before it sleeps (`[timing] spin_us`): a request
    /// arriving meanwhile is taken without a wake-up, which costs tens of µs on a machine
    /// whose cores sleep.
    poll_ns: i64,
    /// How long past its answer's predicted time a front end polls for it before its task
    /// parks (0: it parks at once; `answer_spin_until`, `Server::set_answer_spin`).
    answer_spin_ns: AtomicI64,
    /// Instance numbers handed out so far (the first instance is 0).
    instances: AtomicU64,
    /// When the model was first served (ns, monotonic clock): its load's window is shorter
    /// before [`WINDOW_NS`] has passed.
    started: i64,
    /// The usual gap (ns) from the model running out of work to the next request
    /// ([`IdleGaps`]; 0: none seen yet), which the thread's poll follows where the front ends
    /// poll for answers.
    idle_gap_ns: AtomicI64,
    /// The server's shared memory ranges page-locked for the GPU, whose inputs a slot's launch
    /// reads in place ([`fill_inputs`]).
    pinned: Arc<crate::shm::PinnedRanges>,
}

impl ServedModel {
    pub fn new(
        info: ModelInfo,
        publisher: Option<Arc<CriticalPublisher>>,
        stats: Arc<ModelStats>,
        records: Option<(BatchSender, i64)>,
        poll_ns: i64,
        pinned: Arc<crate::shm::PinnedRanges>,
    ) -> ServedModel {
        let service = info.warm_service.as_nanos().min(i64::MAX as u128) as i64;
        if let Some(p) = &publisher {
            p.set_estimate(service);
            p.idle(deadline_ns(info.deadline));
        }
        ServedModel {
            info: RwLock::new(Arc::new(info)),
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
            service_ns: AtomicI64::new(service),
            publisher,
            stats,
            next_seq: AtomicU64::new(0),
            records,
            recorded: AtomicU64::new(0),
            queued: AtomicUsize::new(0),
            poll_ns,
            answer_spin_ns: AtomicI64::new(default_answer_spin_ns(poll_ns, cores())),
            idle_gap_ns: AtomicI64::new(0),
            instances: AtomicU64::new(1),
            started: clock::now_ns(),
            pinned,
        }
    }

    /// What the model is now.
    pub fn info(&self) -> Arc<ModelInfo> {
        Arc::clone(&self.info.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// Replaces what the model is (a change of its deadline, criticality or partition).
    pub fn set_info(&self, info: ModelInfo) {
        *self.info.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(info);
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        // A panic on the model thread while holding the lock leaves the queue as it was
        // between two whole operations: keep serving from it.
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes `req` or refuses it (not ready, bad input, queue full, predicted late). The
    /// answer comes on the receiver when its job has run.
    pub fn submit(
        &self,
        req: InferRequest,
    ) -> Result<oneshot::Receiver<Result<InferResponse, Refusal>>, Refusal> {
        let arrived = clock::now_ns();
        let info = self.info();
        let name = &info.name;
        let relative = req.deadline.or(info.deadline);
        let inputs = check_inputs(name, &info.inputs, &info.outputs, info.max_batch, req)?;
        let (tx, rx) = oneshot::channel();
        let mut q = self.lock();
        q.window.arrivals.push_back(arrived);
        if q.idle_since > 0 && q.items.is_empty() && q.running_since == 0 {
            let gap = arrived - q.idle_since;
            self.idle_gap_ns
                .store(q.idle_gaps.push(gap), Ordering::Relaxed);
        }
        q.idle_since = 0;
        // Pruned by time when jobs end; bounded here too, for a model whose requests are all
        // refused.
        if q.window.arrivals.len() > WINDOW_CAP {
            q.window.arrivals.pop_front();
        }
        if q.closing {
            return Err(Refusal::Draining {
                model: name.clone(),
            });
        }
        if q.unloaded {
            return Err(Refusal::Unloaded {
                model: name.clone(),
            });
        }
        if q.items.len() >= info.queue_limit as usize {
            match info.when_full {
                WhenFull::Refuse => {
                    return Err(Refusal::QueueFull {
                        model: name.clone(),
                        limit: info.queue_limit,
                    })
                }
                WhenFull::DropOldest => {
                    if let Some(old) = q.items.pop_front() {
                        q.rows -= old.inputs.rows;
                        q.in_flight -= 1;
                        self.stats.rejected("dropped");
                        self.record(std::slice::from_ref(&old), None, 0);
                        let _ = old.reply.send(Err(Refusal::Dropped {
                            model: name.clone(),
                        }));
                    }
                }
            }
        }
        let deadline = relative.map(|d| arrived.saturating_add(duration_ns(d)));
        if let Some(due) = deadline {
            let (mut predicted, ahead) = self.predict(&info, &q, arrived, inputs.rows);
            let idle = q.items.is_empty() && q.running_since == 0;
            let quiet = q
                .window
                .answers
                .back()
                .is_none_or(|&(end, _)| arrived - end > PROBE_AFTER_NS);
            let warm = duration_ns(info.warm_service);
            if predicted > due && idle && quiet && warm < self.service_ns.load(Ordering::Relaxed) {
                predicted = self.predict_with(warm, &info, &q, arrived, inputs.rows).0;
            }
            if predicted > due {
                let ms = |ns: i64| ns as f64 / 1e6;
                return Err(Refusal::WouldBeLate {
                    model: name.clone(),
                    predicted_ms: ms(predicted - arrived),
                    deadline_ms: ms(due - arrived),
                    lateness_ms: ms(predicted - due),
                    ahead,
                    service_ms: ms(self.service_ns.load(Ordering::Relaxed)),
                });
            }
        }
        if let Some(p) = &self.publisher {
            if q.items.is_empty() && q.running_since == 0 {
                let seq = self.next_seq.load(Ordering::Relaxed);
                p.pending(seq, arrived, deadline);
            }
        }
        q.rows += inputs.rows;
        q.in_flight += 1;
        q.items.push_back(Queued {
            inputs,
            reply: tx,
            arrived,
            deadline,
        });
        self.stats.queue_length(q.items.len());
        self.queued.store(q.items.len(), Ordering::Release);
        drop(q);
        self.wake.notify_one();
        Ok(rx)
    }

    /// When a request of `rows` arriving at `now` would complete, and how many jobs are ahead
    /// of its own.
    fn predict(&self, info: &ModelInfo, q: &Queue, now: i64, rows: usize) -> (i64, usize) {
        let service = self.service_ns.load(Ordering::Relaxed);
        self.predict_with(service, info, q, now, rows)
    }

    /// [`ServedModel::predict`] with jobs taking `service` (ns).
    fn predict_with(
        &self,
        service: i64,
        info: &ModelInfo,
        q: &Queue,
        now: i64,
        rows: usize,
    ) -> (i64, usize) {
        let free_at = if q.running_since > 0 {
            (q.running_since + service).max(now) + q.staged as i64 * service
        } else {
            now
        };
        let ahead = match &info.batching {
            // Batched: the queued rows and its own fill jobs of max_batch rows; it waits at
            // most the batch delay for company.
            Some(b) => {
                let jobs = (q.rows + rows).div_ceil(info.max_batch.max(1));
                let delay = (b.max_delay_ms * 1e6) as i64;
                return (free_at + jobs as i64 * service + delay, jobs - 1);
            }
            None => q.items.len(),
        };
        (free_at + (ahead as i64 + 1) * service, ahead)
    }

    /// Stops taking requests; the thread answers what is queued, then ends.
    pub fn close(&self) {
        self.lock().closing = true;
        self.wake.notify_all();
    }

    /// Answers every request still queued with a refusal (a drain whose time is up); the job
    /// running goes on. Returns how many were refused.
    pub fn abandon_queued(&self) -> usize {
        let name = self.info().name.clone();
        self.abandon_queued_as("draining", || Refusal::Abandoned {
            model: name.clone(),
        })
    }

    /// A number no instance has had yet, for the next one.
    pub fn next_instance(&self) -> u64 {
        self.instances.fetch_add(1, Ordering::Relaxed)
    }

    /// Whether the model takes requests (not unloaded).
    pub fn is_loaded(&self) -> bool {
        !self.lock().unloaded
    }

    /// Makes `instance` (built and warm, its jobs taking `service_ns`) the one that takes the
    /// queue's jobs, as one step under the queue's lock: the instance it replaces ends after
    /// the job it runs, if any, which this waits for. `requested`: when the change was asked
    /// for (ns, monotonic clock). Requests queued meanwhile stay queued for the new instance.
    pub fn take_over(&self, instance: u64, service_ns: i64, requested: i64) -> TakeOver {
        let mut q = self.lock();
        let serving_before = !q.unloaded;
        q.instance = instance;
        q.unloaded = false;
        q.handoff_from = if q.running_since == 0 {
            clock::now_ns()
        } else {
            0
        };
        // From now on admission predicts with the new instance's service time.
        self.service_ns.store(service_ns, Ordering::Relaxed);
        if let Some(p) = &self.publisher {
            p.set_estimate(service_ns);
        }
        self.wake.notify_all();
        while q.running_since != 0 {
            q = self.wake.wait(q).unwrap_or_else(|p| p.into_inner());
        }
        let now = clock::now_ns();
        TakeOver {
            took_ns: now - requested,
            pause_ns: serving_before.then(|| now - q.handoff_from),
        }
    }

    /// Triton's unload: new requests are refused from now on; those taken are answered for at
    /// most `grace` (past it, what is still queued is refused); then no instance serves (its
    /// thread ends after its job). Returns how many queued requests were refused.
    pub fn unload(&self, grace: Duration) -> usize {
        self.lock().unloaded = true;
        let until = clock::now_ns().saturating_add(duration_ns(grace));
        while self.in_flight() > 0 && clock::now_ns() < until {
            std::thread::sleep(Duration::from_millis(2));
        }
        let name = self.info().name.clone();
        let abandoned = self.abandon_queued_as("unloaded", || Refusal::Unloaded {
            model: name.clone(),
        });
        let none = self.next_instance();
        let mut q = self.lock();
        q.instance = none;
        self.wake.notify_all();
        while q.running_since != 0 {
            q = self.wake.wait(q).unwrap_or_else(|p| p.into_inner());
        }
        abandoned
    }

    /// The model's load now ([`Load`]).
    pub fn load(&self) -> Load {
        let now = clock::now_ns();
        let mut q = self.lock();
        q.window.prune(now);
        let span = (now - self.started).clamp(1_000_000, WINDOW_NS);
        let mut latencies: Vec<i64> = q.window.answers.iter().map(|&(_, l)| l).collect();
        latencies.sort_unstable();
        let p99 = (!latencies.is_empty()).then(|| {
            let i = (latencies.len() * 99).div_ceil(100).max(1) - 1;
            latencies[i.min(latencies.len() - 1)] as f64 / 1e6
        });
        Load {
            rate_hz: q.window.arrivals.len() as f64 / (span as f64 / 1e9),
            queued: q.items.len(),
            in_flight: q.in_flight,
            p99_ms: p99,
            answered: latencies.len(),
            service_ms: self.service_ns.load(Ordering::Relaxed) as f64 / 1e6,
        }
    }

    fn abandon_queued_as(&self, reason: &str, refusal: impl Fn() -> Refusal) -> usize {
        let mut q = self.lock();
        let dropped: Vec<Queued> = q.items.drain(..).collect();
        self.queued.store(0, Ordering::Release);
        q.rows = 0;
        q.in_flight -= dropped.len();
        self.stats.queue_length(0);
        drop(q);
        // Taken, so recorded: `--out` holds every request taken as a job.
        self.record(&dropped, None, 0);
        for r in &dropped {
            self.stats.rejected(reason);
            self.stats.failed(clock::now_ns() - r.arrived);
        }
        let n = dropped.len();
        for r in dropped {
            let _ = r.reply.send(Err(refusal()));
        }
        n
    }

    /// Triton's statistics extension for this model.
    pub fn statistics(&self) -> crate::stats::ModelStatistics {
        self.stats.statistics(&self.info().name)
    }

    /// Requests taken and not answered yet.
    pub fn in_flight(&self) -> usize {
        self.lock().in_flight
    }

    /// Instance `instance`'s loop, until the model is closed and empty or the instance
    /// replaced. `stop` cuts a held best-effort piece short at shutdown.
    pub fn serve(
        &self,
        instance: u64,
        exec: &mut dyn Executor,
        role: &mut GuardRole,
        stop: &AtomicBool,
    ) {
        // Slots only for whole jobs: a guarded best-effort model runs its job in pieces, each
        // held or let go by the guard as it comes. A critical model's jobs are whole; its
        // publisher learns each one's start as the end of the job before it
        // (`serve_slotted`).
        let slotted = match role {
            GuardRole::BestEffort(_) => false,
            _ if self.publisher.is_some() => critical_slots(),
            _ => true,
        };
        if slotted {
            let slots = exec.prepare_slots(SLOTS);
            if slots >= 2 {
                return self.serve_slotted(instance, exec, slots);
            }
        }
        let mut recent = Recent::new(self.service_ns.load(Ordering::Relaxed));
        while let Some(batch) = self.next_batch(instance) {
            let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
            let rows: usize = batch.iter().map(|r| r.inputs.rows).sum();
            let copy_in = clock::now_ns();
            fill_inputs(exec, None, &batch, &self.pinned);
            let input_ns = clock::now_ns() - copy_in;
            let ran = match &self.publisher {
                Some(p) => run_critical(exec, p, seq),
                None => role.run_job(exec, seq, stop),
            };
            let job = Job {
                batch,
                slot: None,
                seq,
                rows,
                taken: copy_in,
                input_ns,
            };
            self.complete(instance, exec, job, ran, &mut recent, After::Idle);
        }
    }

    /// A job's end: the queue's bookkeeping, the service estimate, statistics, records and the
    /// answers (or each request's failure). `after`: what runs once it has ended.
    fn complete(
        &self,
        instance: u64,
        exec: &dyn Executor,
        job: Job,
        ran: Result<(i64, i64, i64), isolane_runtime::ExecError>,
        recent: &mut Recent,
        after: After,
    ) {
        let Job {
            batch,
            slot,
            seq: _,
            rows,
            taken: copy_in,
            input_ns,
        } = job;
        let info = self.info();
        {
            let mut q = self.lock();
            match after {
                After::Idle => {
                    q.running_since = 0;
                    q.staged = 0;
                    if q.items.is_empty() {
                        q.idle_since = clock::now_ns();
                    }
                }
                After::Next => {
                    q.running_since = ran.as_ref().map_or_else(|_| clock::now_ns(), |r| r.1);
                    q.staged = q.staged.saturating_sub(1);
                }
                After::Same => q.staged = q.staged.saturating_sub(1),
            }
            q.in_flight -= batch.len();
            if let Ok((_, end, _)) = &ran {
                for r in &batch {
                    q.window.answers.push_back((*end, end - r.arrived));
                }
                q.window.prune(*end);
            }
            if q.instance != instance {
                // Replaced while this job ran: the pause starts now; the new instance waits
                // for it.
                q.handoff_from = clock::now_ns();
                self.wake.notify_all();
            }
            // With a job staged behind this one (or still running before it), the guard
            // already has that job (`serve_slotted`); the queue's front comes after it.
            if let (Some(p), After::Idle) = (&self.publisher, after) {
                match q.items.front() {
                    // The next job's number: a staged job that failed to launch took one too.
                    Some(next) => p.pending(
                        self.next_seq.load(Ordering::Relaxed),
                        next.arrived,
                        next.deadline,
                    ),
                    None => p.idle(deadline_ns(info.deadline)),
                }
            }
            drop(q);
        }
        match ran {
            Ok((start, end, held)) => {
                let job = end - start;
                self.service_ns.store(recent.push(job), Ordering::Relaxed);
                self.stats.job(rows, held);
                let requests = batch.len() as u64;
                self.record(&batch, Some((start, end)), held);
                let copy_out = clock::now_ns();
                let replies = self.answers(exec, slot, batch, (copy_in, start, end), rows);
                let answered = clock::now_ns();
                // Counted before the answers go: a client that reads the statistics
                // after its answer finds its request in them.
                self.stats
                    .phases((requests, rows as u64), input_ns, job, answered - copy_out);
                for (tx, mut reply) in replies {
                    if let Ok(r) = &mut reply {
                        r.stamps.answered = answered;
                    }
                    let _ = tx.send(reply);
                }
            }
            Err(e) => {
                self.record(&batch, None, 0);
                let message = e.to_string();
                let now = clock::now_ns();
                for r in batch {
                    self.stats.rejected("failed");
                    self.stats.failed(now - r.arrived);
                    let _ = r.reply.send(Err(Refusal::Failed {
                        model: info.name.clone(),
                        message: message.clone(),
                    }));
                }
            }
        }
    }

    /// Waits for the next job's requests: one request, or (batching) what is queued up to the
    /// compiled batch, waiting up to the batch delay for a preferred size. `None`: closed and
    /// empty.
    fn next_batch(&self, instance: u64) -> Option<Vec<Queued>> {
        self.poll();
        let info = self.info();
        let mut q = self.lock();
        loop {
            if q.instance != instance {
                return None;
            }
            if !q.items.is_empty() {
                break;
            }
            if q.closing {
                return None;
            }
            q = self.wake.wait(q).unwrap_or_else(|p| p.into_inner());
        }
        let max = info.max_batch.max(1);
        if let Some(b) = &info.batching {
            let first = q.items.front().map_or(0, |r| r.arrived);
            let until = first.saturating_add((b.max_delay_ms * 1e6) as i64);
            loop {
                let rows = fitting_rows(&q.items, max);
                let full = rows == max || b.preferred.iter().any(|&p| p as usize == rows);
                let now = clock::now_ns();
                // A later request that does not fit ends the batch, as does the delay.
                let blocked = q.items.len() > fitting_count(&q.items, max);
                if full || blocked || now >= until || q.closing || q.instance != instance {
                    break;
                }
                let wait = Duration::from_nanos((until - now) as u64);
                q = self
                    .wake
                    .wait_timeout(q, wait)
                    .map(|(g, _)| g)
                    .unwrap_or_else(|p| p.into_inner().0);
            }
        }
        if q.instance != instance {
            return None;
        }
        let take = match &info.batching {
            Some(_) => fitting_count(&q.items, max).max(1),
            None => 1,
        };
        let batch: Vec<Queued> = q.items.drain(..take).collect();
        self.queued.store(q.items.len(), Ordering::Release);
        q.rows -= batch.iter().map(|r| r.inputs.rows).sum::<usize>();
        q.running_since = clock::now_ns();
        self.stats.queue_length(q.items.len());
        Some(batch)
    }

    /// The next job's requests if a job could start with them now, without waiting: one
    /// request, or (batching) a batch that is full, of a preferred size, blocked by the next
    /// request, or past its delay (the same rule as [`ServedModel::next_batch`], which would
    /// wait). The job is staged behind the running one (`Queue::staged`).
    fn try_next_batch(&self, instance: u64) -> Option<Vec<Queued>> {
        if self.queued.load(Ordering::Acquire) == 0 {
            return None;
        }
        let info = self.info();
        let mut q = self.lock();
        if q.instance != instance || q.items.is_empty() {
            return None;
        }
        let max = info.max_batch.max(1);
        let take = match &info.batching {
            Some(b) => {
                let rows = fitting_rows(&q.items, max);
                let full = rows == max || b.preferred.iter().any(|&p| p as usize == rows);
                let blocked = q.items.len() > fitting_count(&q.items, max);
                let first = q.items.front().map_or(0, |r| r.arrived);
                let until = first.saturating_add((b.max_delay_ms * 1e6) as i64);
                if !(full || blocked || q.closing || clock::now_ns() >= until) {
                    return None;
                }
                fitting_count(&q.items, max).max(1)
            }
            None => 1,
        };
        let batch: Vec<Queued> = q.items.drain(..take).collect();
        self.queued.store(q.items.len(), Ordering::Release);
        q.rows -= batch.iter().map(|r| r.inputs.rows).sum::<usize>();
        q.staged += 1;
        self.stats.queue_length(q.items.len());
        Some(batch)
    }

    /// Instance `instance`'s loop on an executor of `slots` input slots: the next job's input
    /// is written into a free slot and launched behind the running job while it runs, so the
    /// model does not idle between jobs for the input's copy and the answers (docs/serve.md,
    /// "Input slots"). A slot is written only when free: taken by no job, or its job seen done.
    fn serve_slotted(&self, instance: u64, exec: &mut dyn Executor, slots: usize) {
        let mut recent = Recent::new(self.service_ns.load(Ordering::Relaxed));
        // Jobs launched, oldest first, each with the time it started (its launch, or the end
        // of the job before it).
        let mut flights: VecDeque<(Job, i64)> = VecDeque::with_capacity(slots);
        let mut free: Vec<usize> = (0..slots).rev().collect();
        // The queue's length when it last held requests that could not be staged, and when to
        // look at them again anyway (a batch's delay runs out without new arrivals).
        let mut unstaged = (0, 0);
        loop {
            // Stage: into a free slot, a job's requests if there are any (waiting for them
            // only when nothing runs).
            if let Some(&slot) = free.last() {
                let next = if flights.is_empty() {
                    self.next_batch(instance)
                } else {
                    self.try_next_batch(instance)
                };
                match next {
                    Some(batch) => {
                        free.pop();
                        unstaged = (0, 0);
                        let (job, staged) = self.stage(exec, slot, batch);
                        let launched = clock::now_ns();
                        match staged.and_then(|()| exec.launch_slot(slot)) {
                            Ok(()) => {
                                // Behind a running job it starts when that one ends, and is
                                // published then.
                                if let (Some(p), true) = (&self.publisher, flights.is_empty()) {
                                    p.started(launched);
                                }
                                flights.push_back((job, launched))
                            }
                            Err(e) => {
                                // Whatever of it did start has to end before the slot is
                                // written again.
                                let _ = exec.wait_slot(slot);
                                free.push(slot);
                                let after = if flights.is_empty() {
                                    After::Idle
                                } else {
                                    After::Same
                                };
                                self.complete(instance, exec, job, Err(e), &mut recent, after);
                            }
                        }
                        continue;
                    }
                    None if flights.is_empty() => return,
                    None => {
                        unstaged = (
                            self.queued.load(Ordering::Acquire),
                            clock::now_ns() + RETRY_NS,
                        )
                    }
                }
            }
            // The oldest job: polled while a slot is free, so that a request arriving meanwhile
            // is staged behind it; waited for when every slot is taken.
            let slot = flights
                .front()
                .map(|(j, _)| j.slot.unwrap_or(0))
                .unwrap_or(0);
            let done = if free.is_empty() {
                exec.wait_slot(slot).map(|()| true)
            } else {
                // Requests that were queued and could not be staged (a batch still filling,
                // or this instance replaced) are looked at again only when more arrive or
                // every RETRY_NS, not on every poll: the queue's lock is the submitters'.
                loop {
                    match exec.slot_done(slot) {
                        Ok(false) => {
                            let queued = self.queued.load(Ordering::Acquire);
                            if queued > 0 && (queued != unstaged.0 || clock::now_ns() >= unstaged.1)
                            {
                                break Ok(false);
                            }
                            std::hint::spin_loop()
                        }
                        other => break other,
                    }
                }
            };
            if matches!(done, Ok(false)) {
                continue;
            }
            let end = clock::now_ns();
            let Some((job, start)) = flights.pop_front() else {
                continue;
            };
            free.push(slot);
            if let (Some(p), Ok(_)) = (&self.publisher, &done) {
                p.ended(job.seq, end - start);
            }
            let after = match flights.front_mut() {
                Some((next, next_start)) => {
                    // It has been queued behind this one on the device: it starts now.
                    *next_start = (*next_start).max(end);
                    if let (Some(p), Some(first)) = (&self.publisher, next.batch.first()) {
                        p.pending(next.seq, first.arrived, first.deadline);
                        p.started(*next_start);
                    }
                    After::Next
                }
                None => After::Idle,
            };
            let ran = done.map(|_| (start, end, 0));
            self.complete(instance, exec, job, ran, &mut recent, after);
        }
    }

    /// Writes `batch`'s rows into `slot`'s inputs: the job to launch from it, and an error
    /// when the slot handed out no buffer for an input (it must not run on another job's data).
    fn stage(
        &self,
        exec: &mut dyn Executor,
        slot: usize,
        batch: Vec<Queued>,
    ) -> (Job, Result<(), isolane_runtime::ExecError>) {
        let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
        let rows: usize = batch.iter().map(|r| r.inputs.rows).sum();
        let taken = clock::now_ns();
        let missing = fill_inputs(exec, Some(slot), &batch, &self.pinned);
        let staged = match missing {
            Some(i) => Err(isolane_runtime::ExecError::Job(format!(
                "input slot {slot} gave no buffer for input {i} (busy or out of range)"
            ))),
            None => Ok(()),
        };
        let job = Job {
            batch,
            slot: Some(slot),
            seq,
            rows,
            taken,
            input_ns: clock::now_ns() - taken,
        };
        (job, staged)
    }

    /// The job's requests as job records (`jobs/<model>.csv`): released at their arrival, late
    /// as a timeout; a failed job's as not run.
    fn record(&self, batch: &[Queued], ran: Option<(i64, i64)>, held: i64) {
        let Some((sink, t0)) = &self.records else {
            return;
        };
        let first = self
            .recorded
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
        let records: Vec<JobRecord> = batch
            .iter()
            .enumerate()
            .map(|(i, r)| JobRecord {
                index: first + i as u64,
                release_ns: r.arrived - t0,
                start_ns: ran.map(|(s, _)| s - t0),
                end_ns: ran.map(|(_, e)| e - t0),
                timeout: match ran {
                    Some((_, end)) => r.deadline.is_some_and(|d| end > d),
                    None => true,
                },
                held_ns: held,
            })
            .collect();
        sink.send(&records);
    }

    /// Polls the queue while it is empty, without the lock: for `poll_ns`, or, where the front
    /// ends poll for answers too (8 cores or more by default, [`crate::Server::set_answer_spin`]),
    /// until just past the usual next arrival ([`poll_bound_ns`]).
    fn poll(&self) {
        if self.poll_ns <= 0 || self.queued.load(Ordering::Acquire) > 0 {
            return;
        }
        let gap = self.idle_gap_ns.load(Ordering::Relaxed);
        let learns = self.answer_spin_ns.load(Ordering::Relaxed) > 0;
        let until = clock::now_ns() + poll_bound_ns(self.poll_ns, gap, learns);
        while self.queued.load(Ordering::Acquire) == 0 && clock::now_ns() < until {
            std::hint::spin_loop();
        }
    }

    /// Each request's rows of the outputs, with where to send them. `(taken, start, end)`: when
    /// the job took its requests from the queue (a request's queueing ends there; its input copy
    /// is the job's), and when the model ran.
    fn answers(
        &self,
        exec: &dyn Executor,
        slot: Option<usize>,
        batch: Vec<Queued>,
        (taken, start, end): (i64, i64, i64),
        rows: usize,
    ) -> Vec<(Reply, Result<InferResponse, Refusal>)> {
        let info = self.info();
        let infos = &info.outputs;
        let mut row = 0;
        let mut replies = Vec::with_capacity(batch.len());
        for r in batch {
            let n = r.inputs.rows;
            let outputs = r
                .inputs
                .outputs
                .iter()
                .map(|&o| {
                    let info = &infos[o];
                    let per = info.row_elements();
                    let data = match slot {
                        Some(s) => exec.slot_output(s, o),
                        None => exec.output(o),
                    }
                    .unwrap_or(&[]);
                    let mine = data.get(row * per..(row + n) * per).unwrap_or(&[]);
                    let mut shape: Vec<u64> = info.shape.iter().map(|&d| d as u64).collect();
                    if let Some(b) = shape.first_mut() {
                        *b = n as u64;
                    }
                    Tensor::new(info.name.clone(), DataType::Fp32, shape, le_bytes(mine))
                })
                .collect::<Result<Vec<_>, _>>();
            row += n;
            let late = r.deadline.is_some_and(|d| end > d);
            self.stats
                .answered(end - r.arrived, late, (taken - r.arrived).max(0), n);
            let reply = outputs
                .map(|outputs| InferResponse {
                    outputs,
                    late,
                    queued_us: ((taken - r.arrived).max(0) / 1000) as u64,
                    job_us: ((end - start) / 1000) as u64,
                    job_rows: rows,
                    stamps: Stamps {
                        arrived: r.arrived,
                        picked: taken,
                        started: start,
                        done: end,
                        answered: 0,
                    },
                })
                .map_err(|e| Refusal::Failed {
                    model: info.name.clone(),
                    message: e.to_string(),
                });
            replies.push((r.reply, reply));
        }
        replies
    }
}

/// What runs once a job has ended ([`ServedModel::complete`]).
#[derive(Clone, Copy)]
enum After {
    /// Nothing: the model is idle.
    Idle,
    /// The job staged behind it, which starts now.
    Next,
    /// The running job goes on (the one that ended was staged and never ran).
    Same,
}

/// How often a model thread polling its running job looks again at queued requests it could
/// not stage (ns).
const RETRY_NS: i64 = 50_000;

/// Input slots a served model asks its executor for: the running job's and the next one's.
const SLOTS: usize = 2;

/// Whether a critical model runs its jobs in input slots: yes unless
/// `ISOLANE_SERVE_CRITICAL_SLOTS=0`, which keeps it in one buffer, one job at a time, as before
/// session 28 (for an A/B on the GPU: docs/serve.md, "Input slots").
fn critical_slots() -> bool {
    std::env::var_os("ISOLANE_SERVE_CRITICAL_SLOTS").is_none_or(|v| v != "0")
}

/// One job of a served model: its requests, the slot its input is in (`None`: the executor's
/// one input), and when they were taken from the queue and how long their input's copy took.
struct Job {
    batch: Vec<Queued>,
    slot: Option<usize>,
    seq: u64,
    rows: usize,
    taken: i64,
    input_ns: i64,
}

/// The fewest cores on which a front end polls for an answer due soon by default: below it
/// the polling would take the core the model's thread, the other front-end worker or a local
/// client needs (`isolane serve` runs 2 front-end workers and a thread per model, each of which
/// polls its own queue for `[timing] spin_us` after a job).
pub(crate) const ANSWER_SPIN_MIN_CORES: usize = 8;

/// An answer predicted further ahead than this is waited for parked: polling a core for longer
/// than a 2 ms job costs more than the wake-up it saves (tens of µs).
const ANSWER_SPIN_AHEAD_NS: i64 = 2_000_000;

/// The front ends' default answer spin: the model thread's `poll_ns` (`[timing] spin_us`) on a
/// machine of [`ANSWER_SPIN_MIN_CORES`] cores or more, none on fewer.
pub(crate) fn default_answer_spin_ns(poll_ns: i64, cores: usize) -> i64 {
    if cores >= ANSWER_SPIN_MIN_CORES {
        poll_ns.max(0)
    } else {
        0
    }
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

impl ServedModel {
    /// Until when (ns, monotonic clock) a front end that has just submitted a request polls for
    /// its answer: the answer's predicted time plus the answer spin; `None`: it parks at once
    /// (no spin, or the answer is further than [`ANSWER_SPIN_AHEAD_NS`] ahead). The request is
    /// queued or running (or answered) already, so every job still queued may be ahead of it.
    fn answer_spin_until(&self) -> Option<i64> {
        let spin = self.answer_spin_ns.load(Ordering::Relaxed);
        if spin <= 0 {
            return None;
        }
        let info = self.info();
        let service = self.service_ns.load(Ordering::Relaxed);
        let now = clock::now_ns();
        let q = self.lock();
        let free_at = if q.running_since > 0 {
            (q.running_since + service).max(now) + q.staged as i64 * service
        } else {
            now
        };
        let due = match &info.batching {
            Some(b) => {
                let jobs = q.rows.div_ceil(info.max_batch.max(1)) as i64;
                free_at + jobs * service + (b.max_delay_ms * 1e6) as i64
            }
            None => free_at + q.items.len() as i64 * service,
        };
        drop(q);
        (due - now <= ANSWER_SPIN_AHEAD_NS).then(|| due.saturating_add(spin))
    }
}

/// Waits for an answer by polling it until `until` (ns, monotonic clock), yielding to the
/// runtime's other tasks between polls, then parked. While it polls, its worker thread stays
/// awake (tokio runs a yielded task again after a non-blocking look at the sockets), so the
/// answer is taken without the wake-up of a parked worker, and the model's thread sends it
/// without waking anyone; the other connections' tasks still run in between. `None`: the
/// sender went without an answer.
async fn answer_polled<T>(mut rx: oneshot::Receiver<T>, until: i64) -> Option<T> {
    loop {
        match rx.try_recv() {
            Ok(answer) => return Some(answer),
            // The receiver is spent once it has said so: awaiting it now would panic.
            Err(oneshot::error::TryRecvError::Closed) => return None,
            Err(oneshot::error::TryRecvError::Empty) => {}
        }
        if clock::now_ns() >= until {
            break;
        }
        tokio::task::yield_now().await;
    }
    rx.await.ok()
}

impl crate::Server {
    /// From now on, the front ends poll for each answer of the models served now until `spin`
    /// past its predicted time (when that is at most 2 ms ahead) before their task parks;
    /// `Duration::ZERO`: they park at once. The default is `[timing] spin_us` on a machine of
    /// 8 cores or more and none on fewer (docs/serve.md, "Waiting for answers").
    pub fn set_answer_spin(&self, spin: Duration) {
        for m in self.shared.models() {
            m.answer_spin_ns.store(duration_ns(spin), Ordering::Relaxed);
        }
    }

    /// The front ends' inference: submits and waits for the answer, polling for it first when
    /// it is due soon ([`crate::Server::set_answer_spin`]).
    pub(crate) async fn answer(
        &self,
        name: &str,
        req: InferRequest,
    ) -> Result<InferResponse, Refusal> {
        let rx = self.submit(name, req)?;
        let until = self.find(name).and_then(|m| m.answer_spin_until());
        let answer = match until {
            Some(until) => answer_polled(rx, until).await,
            None => rx.await.ok(),
        };
        answer.unwrap_or_else(|| {
            Err(Refusal::Failed {
                model: name.to_string(),
                message: "the model's thread ended before answering".into(),
            })
        })
    }
}

/// A critical model's job: the guard knows when it starts and how long it took.
fn run_critical(
    exec: &mut dyn Executor,
    p: &CriticalPublisher,
    seq: u64,
) -> Result<(i64, i64, i64), isolane_runtime::ExecError> {
    let start = clock::now_ns();
    p.started(start);
    exec.run_job()?;
    let end = clock::now_ns();
    p.ended(seq, end - start);
    Ok((start, end, 0))
}

/// Copies each request's rows into the model's input buffers (`slot`'s, or the executor's one
/// set), one after the other; the rows past them (a batch not full) are zeros, so that a job's
/// result never depends on an earlier request's data. Returns the first input that had no
/// buffer.
///
/// A job of one request whose input lies in shared memory page-locked for the GPU
/// (`pinned`, [`crate::shm::PinnedRanges::holds`]) and fills the whole input is not copied: the
/// slot's launch reads it from the region itself ([`Executor::slot_input_from`]).
fn fill_inputs(
    exec: &mut dyn Executor,
    slot: Option<usize>,
    batch: &[Queued],
    pinned: &crate::shm::PinnedRanges,
) -> Option<usize> {
    let n = batch.first().map_or(0, |r| r.inputs.tensors.len());
    let mut missing = None;
    for i in 0..n {
        if let (Some(s), [only]) = (slot, batch) {
            let data = only.inputs.tensors[i].data();
            if pinned.holds(data) {
                // SAFETY: `data` is a view of a region's mapping, which the tensor holds (with
                // its lock) until the job ends: the job keeps its requests until `complete`,
                // which runs after the slot's job is seen done, or after its failed launch and
                // a wait for the slot (`serve_slotted`).
                if unsafe { exec.slot_input_from(s, i, data.as_ptr(), data.len()) } {
                    continue;
                }
            }
        }
        let buf = match slot {
            Some(s) => exec.slot_input_mut(s, i),
            None => exec.input_mut(i),
        };
        let Some(buf) = buf else {
            missing = missing.or(Some(i));
            continue;
        };
        let mut at = 0;
        for r in batch {
            let src = r.inputs.tensors[i].data();
            let len = (src.len() / 4).min(buf.len() - at);
            copy_le_f32(&mut buf[at..at + len], src);
            at += len;
        }
        buf[at..].fill(0.0);
    }
    missing
}

/// How many requests from the front fit in one job of `max` rows (at least the first).
fn fitting_count(items: &VecDeque<Queued>, max: usize) -> usize {
    let mut rows = 0;
    let mut n = 0;
    for r in items {
        if rows + r.inputs.rows > max {
            break;
        }
        rows += r.inputs.rows;
        n += 1;
    }
    n
}

fn fitting_rows(items: &VecDeque<Queued>, max: usize) -> usize {
    items
        .iter()
        .take(fitting_count(items, max))
        .map(|r| r.inputs.rows)
        .sum()
}

fn duration_ns(d: Duration) -> i64 {
    d.as_nanos().min(i64::MAX as u128) as i64
}

fn deadline_ns(d: Option<Duration>) -> Option<i64> {
    d.map(duration_ns)
}

/// The gaps (ns) between the model running out of work and the next request, the last
/// [`IdleGaps::KEEP`] of them: one client sending its next request as soon as it has its answer
/// leaves about the same gap each time (its own time and the socket's, 0.8 ms over gRPC on the
/// H200), longer than the thread's `[timing] spin_us` poll, so each request found the thread
/// asleep and paid its wake-up (`queue`, 38 µs in session 21).
struct IdleGaps {
    window: LastValues,
}

impl Default for IdleGaps {
    fn default() -> Self {
        IdleGaps {
            window: LastValues::new(Self::KEEP),
        }
    }
}

impl IdleGaps {
    const KEEP: usize = 16;

    /// Records `gap`; returns the 75th percentile of those kept.
    fn push(&mut self, gap: i64) -> i64 {
        self.window.push(gap.max(0), 75)
    }
}

/// How long (ns) a model's thread polls its empty queue: `poll_ns` (`[timing] spin_us`), or,
/// when it `learns` (8 cores or more) and the usual gap to the next request is known and within
/// [`ANSWER_SPIN_AHEAD_NS`], that gap plus `poll_ns`, so that a client that sends again as soon
/// as it is answered finds the thread awake; a longer gap is waited for asleep.
fn poll_bound_ns(poll_ns: i64, gap_ns: i64, learns: bool) -> i64 {
    if learns && gap_ns > 0 && gap_ns <= ANSWER_SPIN_AHEAD_NS {
        poll_ns.max(0) + gap_ns
    } else {
        poll_ns.max(0)
    }
}

/// The last jobs' service times and their 90th percentile.
struct Recent {
    window: LastValues,
}

impl Recent {
    const KEEP: usize = 31;

    fn new(first: i64) -> Recent {
        let mut window = LastValues::new(Self::KEEP);
        window.push(first, 90);
        Recent { window }
    }

    fn push(&mut self, ns: i64) -> i64 {
        self.window.push(ns, 90)
    }
}

/// The last `keep` values of a series and a percentile of them: one home for the model
/// thread's service times and the queue's idle gaps. Its sort buffer is kept, so a push (one
/// per job or request) allocates nothing.
struct LastValues {
    values: VecDeque<i64>,
    keep: usize,
    sorted: Vec<i64>,
}

impl LastValues {
    fn new(keep: usize) -> LastValues {
        LastValues {
            values: VecDeque::with_capacity(keep),
            keep,
            sorted: Vec::with_capacity(keep),
        }
    }

    /// Records `v`; returns the `pct`th percentile (0 to 100) of the values kept.
    fn push(&mut self, v: i64, pct: usize) -> i64 {
        if self.values.len() == self.keep {
            self.values.pop_front();
        }
        self.values.push_back(v);
        self.sorted.clear();
        self.sorted.extend(self.values.iter().copied());
        self.sorted.sort_unstable();
        let n = self.sorted.len();
        self.sorted[(n * pct / 100).min(n - 1)]
    }
}

#[cfg(test)]
mod answer_spin_tests {
    use super::*;
    use crate::tests::{server, ONE};
    use isolane_runtime::exec::SPIN_INPUT;

    fn one_row(v: f32) -> InferRequest {
        InferRequest {
            inputs: vec![Tensor::new(
                SPIN_INPUT,
                DataType::Fp32,
                vec![1, 1],
                v.to_le_bytes().to_vec(),
            )
            .unwrap()],
            outputs: None,
            deadline: None,
        }
    }

    #[test]
    fn the_thread_polls_past_the_usual_gap_only_where_it_learns_and_the_gap_is_short() {
        let mut g = IdleGaps::default();
        // One client at concurrency 1: gaps of about 0.8 ms, one of them a 30 ms pause.
        let mut usual = 0;
        for i in 0..20 {
            usual = g.push(if i == 7 {
                30_000_000
            } else {
                800_000 + i * 1_000
            });
        }
        assert!((800_000..=820_000).contains(&usual), "{usual}");
        assert_eq!(poll_bound_ns(200_000, usual, true), 200_000 + usual);
        // Fewer than 8 cores (it does not learn), no gap yet, a gap past 2 ms, or spin_us 0.
        assert_eq!(poll_bound_ns(200_000, usual, false), 200_000);
        assert_eq!(poll_bound_ns(200_000, 0, true), 200_000);
        assert_eq!(poll_bound_ns(200_000, 2_500_000, true), 200_000);
        // A pause past the 75th percentile moves it only once pauses are the usual.
        for _ in 0..16 {
            usual = g.push(30_000_000);
        }
        assert_eq!(poll_bound_ns(200_000, usual, true), 200_000);
    }

    #[test]
    fn a_models_gap_to_its_next_request_is_learnt_from_arrivals_at_an_idle_model() {
        let s = server(ONE);
        let m = Arc::clone(s.find("echo").unwrap());
        for _ in 0..4 {
            let rx = m.submit(one_row(1.0)).unwrap();
            rx.blocking_recv().unwrap().unwrap();
            std::thread::sleep(Duration::from_millis(3));
        }
        // Three gaps after the first answer, each at least the 3 ms slept.
        let gap = m.idle_gap_ns.load(Ordering::Relaxed);
        assert!(gap >= 3_000_000, "{gap}");
        s.drain(Duration::from_secs(5));
    }

    #[test]
    fn front_ends_poll_for_answers_only_on_machines_with_cores_to_spare() {
        for cores in [1, 2, ANSWER_SPIN_MIN_CORES - 1] {
            assert_eq!(default_answer_spin_ns(200_000, cores), 0, "{cores} cores");
        }
        assert_eq!(
            default_answer_spin_ns(200_000, ANSWER_SPIN_MIN_CORES),
            200_000
        );
        assert_eq!(default_answer_spin_ns(200_000, 128), 200_000);
        // `[timing] spin_us = 0` turns it off everywhere.
        assert_eq!(default_answer_spin_ns(0, 128), 0);
    }

    #[test]
    fn a_polled_answer_arrives_while_polling_or_after_and_a_lost_one_is_none() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let later = |ms: u64, v: u32| {
            let (tx, rx) = oneshot::channel::<u32>();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(ms));
                let _ = tx.send(v);
            });
            rx
        };
        // Polled for long enough: taken while polling.
        let polled = later(5, 1);
        let far = clock::now_ns() + 10_000_000_000;
        assert_eq!(rt.block_on(answer_polled(polled, far)), Some(1));
        // The polling ends before the answer: the parked wait still gets it.
        let parked = later(30, 2);
        let soon = clock::now_ns();
        assert_eq!(rt.block_on(answer_polled(parked, soon)), Some(2));
        // The sender gone without an answer: none (neither a hang nor a panic), whether it
        // went while polling or while parked.
        let (tx, rx) = oneshot::channel::<u32>();
        drop(tx);
        assert_eq!(rt.block_on(answer_polled(rx, far)), None);
        let (tx, rx) = oneshot::channel::<u32>();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            drop(tx);
        });
        assert_eq!(rt.block_on(answer_polled(rx, clock::now_ns())), None);
    }

    #[test]
    fn an_answer_is_polled_for_only_when_set_and_due_within_the_bound() {
        let s = server(ONE);
        let m = Arc::clone(s.find("echo").unwrap());
        s.set_answer_spin(Duration::ZERO);
        assert_eq!(m.answer_spin_until(), None, "off");
        s.set_answer_spin(Duration::from_micros(300));
        // Nothing queued or running: due now, polled for the spin past it.
        let before = clock::now_ns();
        let until = m
            .answer_spin_until()
            .expect("an idle model's answer is due now");
        let after = clock::now_ns();
        assert!(until >= before + 300_000 && until <= after + 300_000);
        s.drain(Duration::from_secs(5));

        // A one-second job running (or queued): its answer is far ahead, waited for parked.
        let slow = server(
            "[[workload]]\nname = \"slow\"\nmodel = \"spin:1s\"\nbatch = 1\nrate_hz = 1\n\
             duration_s = 1\ndeadline_ms = 60000\nwarmup_jobs = 1\n",
        );
        slow.set_answer_spin(Duration::from_micros(300));
        let m = Arc::clone(slow.find("slow").unwrap());
        let rx = slow.submit("slow", one_row(1.0)).unwrap();
        assert_eq!(m.answer_spin_until(), None, "due a second ahead");
        let answer = rx.blocking_recv().unwrap().unwrap();
        assert_eq!(answer.outputs[0].data(), &1.0f32.to_le_bytes());
        slow.drain(Duration::from_secs(5));
    }
}

#[cfg(test)]
mod admission_tests {
    use super::*;
    use crate::tests::server;
    use isolane_runtime::exec::SPIN_INPUT;

    #[test]
    fn a_service_estimate_raised_past_the_deadline_recovers_through_a_probe() {
        // On the H200 a neighbour's rebuild slowed mobilenet_v2's jobs for a moment; their
        // p90 passed its deadline, every request was refused as late from then on, and with
        // no job run the estimate never came down. An idle model now takes one request after
        // a quiet interval, whose job brings the estimate back.
        let s = server(
            "[[workload]]\nname = \"c\"\nmodel = \"spin:200us\"\nbatch = 1\nrate_hz = 10\n\
             duration_s = 1\ndeadline_ms = 5\nwarmup_jobs = 2\n",
        );
        let m = Arc::clone(s.find("c").unwrap());
        let one = || InferRequest {
            inputs: vec![Tensor::new(
                SPIN_INPUT,
                DataType::Fp32,
                vec![1, 1],
                1.0f32.to_le_bytes().to_vec(),
            )
            .unwrap()],
            outputs: None,
            deadline: None,
        };
        let rx = s.submit("c", one()).unwrap();
        let first = rx.blocking_recv().unwrap();
        first.unwrap_or_else(|e| panic!("the first request was not answered: {e:?}"));
        // The estimate a moment of interference leaves: a second, 200 × the deadline.
        m.service_ns.store(1_000_000_000, Ordering::Relaxed);
        let until = clock::now_ns() + 5_000_000_000;
        let mut refused = 0;
        let answered = loop {
            match s.submit("c", one()) {
                Ok(rx) => break rx.blocking_recv().unwrap().is_ok(),
                Err(Refusal::WouldBeLate { .. }) => refused += 1,
                Err(e) => panic!("{e:?}"),
            }
            assert!(
                clock::now_ns() < until,
                "refused {refused} requests for 5 s: the estimate never recovered"
            );
            std::thread::sleep(Duration::from_millis(5));
        };
        assert!(answered);
        // Far below the second it was raised to: the probe's job (200 µs of spinning, more on
        // a loaded machine, whose slowest jobs the estimate's 90th percentile may still hold).
        let estimate = m.service_ns.load(Ordering::Relaxed);
        assert!(
            estimate < 100_000_000,
            "the probe's job did not bring the estimate down: {estimate} ns"
        );
        // And the requests after it are taken (one refused while a loaded machine's slow job
        // still holds the estimate above the deadline is tried again).
        let taken = loop {
            match s.submit("c", one()) {
                Ok(rx) => break rx.blocking_recv().unwrap().is_ok(),
                Err(Refusal::WouldBeLate { .. }) if clock::now_ns() < until => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                Err(e) => panic!("{e:?}"),
            }
        };
        assert!(taken);
        // A deadline not even the warm-up's time meets is still refused, quiet or not.
        std::thread::sleep(Duration::from_millis(150));
        m.service_ns.store(1_000_000_000, Ordering::Relaxed);
        let tight = InferRequest {
            deadline: Some(Duration::from_micros(50)),
            ..one()
        };
        assert!(matches!(
            s.submit("c", tight),
            Err(Refusal::WouldBeLate { .. })
        ));
        s.drain(Duration::from_secs(5));
    }
}

#[cfg(test)]
mod slot_tests {
    //! The hand-off between a served model's input slots, on an executor that behaves as a
    //! GPU stream does: launched jobs run one after the other, each reading its slot's input
    //! when it runs, and a slot is in flight from its launch until it is seen done.
    use super::*;
    use isolane_core::spec::{Criticality, WhenFull};
    use isolane_runtime::exec::{ExecError, SPIN_INPUT, SPIN_OUTPUT};
    use std::sync::mpsc;

    /// Two slots of one value each; a job doubles its input and takes `JOB_NS` after the one
    /// before it ends. A value of -1 fails its launch. An input given by address
    /// ([`Executor::slot_input_from`]) is read from there when the job ends, as a device copy
    /// from host memory reads it while the job runs.
    struct Stream {
        inputs: [f32; 2],
        outputs: [f32; 2],
        /// Each slot's input address for its next launch, and each launched job's.
        sources: [Option<usize>; 2],
        launched_from: [Option<usize>; 2],
        /// Inputs read in place, and those read after what held them was dropped (by address:
        /// whether it is still held).
        direct: Arc<AtomicUsize>,
        read_after_drop: Arc<AtomicUsize>,
        held: Arc<Mutex<std::collections::HashMap<usize, Arc<AtomicBool>>>>,
        /// Launched and not seen done: (slot, the time it ends).
        queued: VecDeque<(usize, i64)>,
        /// Writes asked for a slot in flight (each refused), and the most jobs queued at once.
        busy_writes: Arc<AtomicUsize>,
        most_queued: Arc<AtomicUsize>,
    }

    const JOB_NS: i64 = 2_000_000;

    impl Stream {
        fn in_flight(&self, slot: usize) -> bool {
            self.queued.iter().any(|&(s, _)| s == slot)
        }

        /// Ends (in order) every queued job whose time has come: it reads its input now.
        fn advance(&mut self) {
            let now = clock::now_ns();
            while let Some(&(slot, end)) = self.queued.front() {
                if end > now {
                    break;
                }
                let input = match self.launched_from[slot].take() {
                    Some(at) => {
                        let gone = self
                            .held
                            .lock()
                            .unwrap()
                            .get(&at)
                            .is_none_or(|dropped| dropped.load(Ordering::SeqCst));
                        if gone {
                            // Never read: what the address pointed to may be freed.
                            self.read_after_drop.fetch_add(1, Ordering::Relaxed);
                            f32::NAN
                        } else {
                            // SAFETY: the bytes' owner is alive (its drop flag is unset) and
                            // holds 4 bytes there.
                            f32::from_le_bytes(unsafe { *(at as *const [u8; 4]) })
                        }
                    }
                    None => self.inputs[slot],
                };
                self.outputs[slot] = input * 2.0;
                self.queued.pop_front();
            }
        }
    }

    impl Executor for Stream {
        fn run_job(&mut self) -> Result<(), ExecError> {
            unreachable!("a slotted model launches its jobs")
        }
        fn inputs(&self) -> Vec<TensorInfo> {
            vec![TensorInfo {
                name: SPIN_INPUT.into(),
                shape: vec![1, 1],
            }]
        }
        fn outputs(&self) -> Vec<TensorInfo> {
            vec![TensorInfo {
                name: SPIN_OUTPUT.into(),
                shape: vec![1, 1],
            }]
        }
        fn prepare_slots(&mut self, _n: usize) -> usize {
            2
        }
        fn slot_input_mut(&mut self, slot: usize, i: usize) -> Option<&mut [f32]> {
            self.advance();
            if self.in_flight(slot) {
                self.busy_writes.fetch_add(1, Ordering::Relaxed);
                return None;
            }
            if i == 0 && slot < 2 {
                self.sources[slot] = None;
            }
            (i == 0 && slot < 2).then(|| std::slice::from_mut(&mut self.inputs[slot]))
        }
        unsafe fn slot_input_from(
            &mut self,
            slot: usize,
            i: usize,
            src: *const u8,
            len: usize,
        ) -> bool {
            self.advance();
            if i != 0 || slot >= 2 || len != 4 || self.in_flight(slot) {
                return false;
            }
            self.sources[slot] = Some(src as usize);
            true
        }
        fn launch_slot(&mut self, slot: usize) -> Result<(), ExecError> {
            self.launched_from[slot] = self.sources[slot].take();
            if self.launched_from[slot].is_some() {
                self.direct.fetch_add(1, Ordering::Relaxed);
            } else if self.inputs[slot] == -1.0 {
                return Err(ExecError::Job("refused at launch".into()));
            }
            let after = self
                .queued
                .back()
                .map_or(clock::now_ns(), |&(_, e)| e.max(clock::now_ns()));
            self.queued.push_back((slot, after + JOB_NS));
            self.most_queued
                .fetch_max(self.queued.len(), Ordering::Relaxed);
            Ok(())
        }
        fn slot_done(&mut self, slot: usize) -> Result<bool, ExecError> {
            self.advance();
            Ok(!self.in_flight(slot))
        }
        fn wait_slot(&mut self, slot: usize) -> Result<(), ExecError> {
            while !self.slot_done(slot)? {
                std::thread::yield_now();
            }
            Ok(())
        }
        fn slot_output(&self, slot: usize, i: usize) -> Option<&[f32]> {
            (i == 0 && !self.in_flight(slot)).then(|| std::slice::from_ref(&self.outputs[slot]))
        }
    }

    fn model() -> Arc<ServedModel> {
        model_with(Criticality::BestEffort, None)
    }

    fn model_with(
        criticality: Criticality,
        publisher: Option<Arc<CriticalPublisher>>,
    ) -> Arc<ServedModel> {
        let tensor = |name: &str| TensorInfo {
            name: name.into(),
            shape: vec![1, 1],
        };
        let info = ModelInfo {
            name: "slots".into(),
            source: "test".into(),
            inputs: vec![tensor(SPIN_INPUT)],
            outputs: vec![tensor(SPIN_OUTPUT)],
            max_batch: 1,
            criticality,
            deadline: None,
            queue_limit: 64,
            when_full: WhenFull::Refuse,
            batching: None,
            backend: "cpu",
            partition: "cpu".into(),
            cpu: Vec::new(),
            sms: None,
            warm_service: Duration::from_nanos(JOB_NS as u64),
            pieces: 1,
        };
        let stats = Arc::new(crate::stats::ServeMetrics::new()).model(
            "slots",
            ("cpu", "cpu", "best_effort"),
            None,
        );
        Arc::new(ServedModel::new(
            info,
            publisher,
            stats,
            None,
            0,
            Arc::default(),
        ))
    }

    fn request(v: f32) -> InferRequest {
        InferRequest {
            inputs: vec![Tensor::new(
                SPIN_INPUT,
                DataType::Fp32,
                vec![1, 1],
                v.to_le_bytes().to_vec(),
            )
            .unwrap()],
            outputs: None,
            deadline: None,
        }
    }

    /// Runs the model's loop on a thread with a fresh [`Stream`]; returns the refused writes,
    /// the most jobs queued at once, and the thread.
    fn serving(
        m: &Arc<ServedModel>,
    ) -> (
        Arc<AtomicUsize>,
        Arc<AtomicUsize>,
        std::thread::JoinHandle<()>,
    ) {
        serving_with(m, Default::default())
    }

    /// What a [`Stream`] tells of inputs read in place: how many, how many after what held
    /// them was gone, and the owners' drop flags by address.
    #[derive(Default, Clone)]
    struct InPlace {
        direct: Arc<AtomicUsize>,
        read_after_drop: Arc<AtomicUsize>,
        held: Arc<Mutex<std::collections::HashMap<usize, Arc<AtomicBool>>>>,
    }

    fn serving_with(
        m: &Arc<ServedModel>,
        in_place: InPlace,
    ) -> (
        Arc<AtomicUsize>,
        Arc<AtomicUsize>,
        std::thread::JoinHandle<()>,
    ) {
        let busy = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let mut exec = Stream {
            inputs: [0.0; 2],
            outputs: [0.0; 2],
            sources: [None; 2],
            launched_from: [None; 2],
            direct: in_place.direct,
            read_after_drop: in_place.read_after_drop,
            held: in_place.held,
            queued: VecDeque::new(),
            busy_writes: Arc::clone(&busy),
            most_queued: Arc::clone(&most),
        };
        let (m2, (tx, rx)) = (Arc::clone(m), mpsc::channel());
        let t = std::thread::spawn(move || {
            let mut role = GuardRole::Off;
            tx.send(()).unwrap();
            m2.serve(0, &mut exec, &mut role, &AtomicBool::new(false));
        });
        rx.recv().unwrap();
        (busy, most, t)
    }

    fn value(r: Result<InferResponse, Refusal>) -> f32 {
        let r = r.unwrap_or_else(|e| panic!("{e:?}"));
        f32::from_le_bytes(r.outputs[0].data().try_into().unwrap())
    }

    /// Queues `n` requests before the model's loop starts (so every job after the first finds
    /// one running), serves them, and checks that each answer is its own, that no slot in
    /// flight was written and that a job was launched behind a running one.
    fn serve_queued_in_two_slots(m: &Arc<ServedModel>, n: usize) {
        let rxs: Vec<_> = (0..n)
            .map(|i| m.submit(request(i as f32)).unwrap())
            .collect();
        let (busy, most, t) = serving(m);
        for (i, rx) in rxs.into_iter().enumerate() {
            assert_eq!(
                value(rx.blocking_recv().unwrap()),
                2.0 * i as f32,
                "request {i}"
            );
        }
        m.close();
        t.join().unwrap();
        assert_eq!(
            busy.load(Ordering::Relaxed),
            0,
            "a slot in flight was written"
        );
        assert_eq!(
            most.load(Ordering::Relaxed),
            2,
            "no job was ever launched behind a running one"
        );
    }

    #[test]
    fn the_next_job_is_staged_in_the_free_slot_and_each_answer_is_its_own() {
        let m = model();
        serve_queued_in_two_slots(&m, 24);
        let q = m.lock();
        assert_eq!((q.in_flight, q.running_since, q.staged), (0, 0, 0));
    }

    /// A critical model runs its jobs in two slots as a best-effort one does, and the guard
    /// still learns each job: its start (the launch, or the end of the job before it) and its
    /// service time. The estimate is seeded at 1 ns, so only published jobs can raise it.
    #[test]
    fn a_critical_model_uses_both_slots_and_publishes_every_job() {
        use isolane_runtime::guard::{Guard, Policy};
        let guard = Arc::new(Guard::create(1, Policy::new(0, None)).unwrap());
        let publisher = Arc::new(CriticalPublisher::new(Arc::clone(&guard), 0, 1, None));
        let m = model_with(Criticality::Critical, Some(publisher));
        serve_queued_in_two_slots(&m, 12);
        let v = guard.view(0);
        assert!(
            v.service >= JOB_NS / 2,
            "the guard's service estimate {} ns was not learned from the jobs ({JOB_NS} ns each)",
            v.service
        );
        assert_eq!(v.seq, 11, "the last job published is not the last one run");
        assert_eq!(v.start, 0, "an idle model still shows a job started");
    }

    #[test]
    fn a_failed_launch_or_a_client_gone_frees_its_slot() {
        let m = model();
        let mut rxs: Vec<_> = (0..6)
            .map(|i| m.submit(request(i as f32)).unwrap())
            .collect();
        // A job refused at its launch, behind a running one, and a client that gave up.
        rxs[2] = m.submit(request(-1.0)).unwrap();
        drop(m.submit(request(100.0)).unwrap());
        let rest: Vec<_> = (6..12)
            .map(|i| m.submit(request(i as f32)).unwrap())
            .collect();
        let (busy, _, t) = serving(&m);
        for (i, rx) in rxs.into_iter().enumerate() {
            let answer = rx.blocking_recv().unwrap();
            if i == 2 {
                assert!(matches!(answer, Err(Refusal::Failed { .. })), "{answer:?}");
            } else if i < 6 {
                assert_eq!(value(answer), 2.0 * i as f32);
            }
        }
        // Both slots still serve after them.
        for (i, rx) in (6..12).zip(rest) {
            assert_eq!(value(rx.blocking_recv().unwrap()), 2.0 * i as f32);
        }
        m.close();
        t.join().unwrap();
        assert_eq!(busy.load(Ordering::Relaxed), 0);
        assert_eq!(m.lock().in_flight, 0);
    }

    /// An input's bytes that set a flag when dropped (a region's view, whose drop may unmap it),
    /// holding what keeps them counted as page-locked, as a view holds its region's lock.
    struct Owned {
        bytes: [u8; 4],
        dropped: Arc<AtomicBool>,
        _lock: Option<Arc<dyn std::any::Any + Send + Sync>>,
    }

    impl AsRef<[u8]> for Owned {
        fn as_ref(&self) -> &[u8] {
            &self.bytes
        }
    }

    impl Drop for Owned {
        fn drop(&mut self) {
            self.dropped.store(true, Ordering::SeqCst);
        }
    }

    /// Requests whose input lies in page-locked memory are launched from it in place, the
    /// others copied into the slot, each answer its own input's (as the copy gives it); an
    /// input read in place is still held when its job reads it, at the job's end, though the
    /// client has let go of it and the region may have been unregistered meanwhile.
    #[test]
    fn a_pinned_input_is_read_in_place_and_held_until_its_job_ends() {
        let m = model();
        let in_place = InPlace::default();
        let mut rxs = Vec::new();
        for i in 0..12 {
            let v = i as f32;
            let dropped = Arc::new(AtomicBool::new(false));
            let lock: Arc<dyn std::any::Any + Send + Sync> = Arc::new(());
            let data = bytes::Bytes::from_owner(Owned {
                bytes: v.to_le_bytes(),
                dropped: Arc::clone(&dropped),
                _lock: (i % 2 == 0).then(|| Arc::clone(&lock)),
            });
            if i % 2 == 0 {
                m.pinned.pretend(&data, &lock);
                in_place
                    .held
                    .lock()
                    .unwrap()
                    .insert(data.as_ptr() as usize, dropped);
            }
            let req = InferRequest {
                inputs: vec![
                    Tensor::with_bytes(SPIN_INPUT, DataType::Fp32, vec![1, 1], data).unwrap(),
                ],
                outputs: None,
                deadline: None,
            };
            rxs.push(m.submit(req).unwrap());
        }
        let (busy, _, t) = serving_with(&m, in_place.clone());
        for (i, rx) in rxs.into_iter().enumerate() {
            assert_eq!(
                value(rx.blocking_recv().unwrap()),
                2.0 * i as f32,
                "request {i}"
            );
        }
        m.close();
        t.join().unwrap();
        assert_eq!(
            in_place.direct.load(Ordering::Relaxed),
            6,
            "pinned inputs read in place"
        );
        assert_eq!(
            in_place.read_after_drop.load(Ordering::Relaxed),
            0,
            "an input read in place after its request let go of it"
        );
        assert_eq!(busy.load(Ordering::Relaxed), 0);
        // Every request is answered and gone: so is each input.
        assert!(in_place
            .held
            .lock()
            .unwrap()
            .values()
            .all(|d| d.load(Ordering::SeqCst)));
    }
}
