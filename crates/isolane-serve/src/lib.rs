//! isolane-serve: a scenario's workloads as models served over the KServe v2 / Triton
//! inference protocol (docs/serve.md).
//!
//! [`Server`] is the long-lived session: every workload's model is built on a thread of its
//! own, inside its partition (the CPU, or a green context on the GPU), warmed up and kept; a
//! request is [`Server::submit`]ted to a model by name, admitted against its deadline
//! (`deadline_ms`, else the workload's) and answered from the model's thread. Critical models
//! run one request per job and publish what they run to the criticality guard; best-effort
//! models batch what is queued (Triton's dynamic batcher) and run in pieces the guard may
//! hold. The front ends ([`http`], [`grpc`]) only decode, submit and encode. [`serve_plan`]
//! sets the partitions up around a server and takes them down after its drain.
//!
//! The server is a session of model instances as `isolane run` is: each instance is built,
//! warmed up and given its part in the guard by `isolane_runtime::instance::Instances`, the
//! same code that builds a run's; a run drives its instances by their fixed-rate schedules,
//! the server by the requests in each model's queue. A server may also release some
//! workloads on their fixed-rate schedules beside the served models ([`Server::start_releasing`],
//! `released.rs`): jobs beside requests, in one session, under one guard.
//!
//! A `host = "thread"` workload (the CPU, green contexts) runs on its model's thread; a
//! `host = "process"` one (MPS, MIG, time slices) in a worker of its own that the model's
//! thread drives as an executor ([`ProcessHosts`], docs/serve.md).

pub mod autoplan;
pub mod cli_session;
mod control;
mod control_http;
pub mod ctl_client;
pub mod grpc;
mod host;
pub mod http;
mod model;
mod released;
mod request;
pub mod shm;
mod stats;
pub mod wire;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use isolane_core::admission::Plan;
use isolane_core::spec::{Backend, Criticality, Host, WorkloadSpec};
use isolane_runtime::coordinator::RunPlan;
use isolane_runtime::exec::Engine;
use isolane_runtime::guard::{CriticalPublisher, Guard, GuardSetup};
use isolane_runtime::instance::{GuardPart, How, Instances, PrepareError, Prepared};
use isolane_runtime::jobs_stream::BatchSender;
use tokio::sync::oneshot;

pub use control::{Change, ControlError, ModelStatus};
pub use host::{ProcessHosts, WorkerStarted};
pub use model::{Load, ModelInfo};
pub use released::ReleasedRun;
pub use request::{InferRequest, InferResponse, Refusal};
pub use stats::{BatchStatistics, InferenceStats, ModelStatistics, ServeMetrics, StatDuration};

use model::ServedModel;

/// What serving needs besides the plan.
#[derive(Clone)]
pub struct ServeOptions {
    /// Builds the models whose workload is not `spin:`.
    pub engine: Engine,
    /// The scenario's seed: a built-in model's synthetic weights.
    pub seed: u64,
    /// Each workload's sink for its requests' job records (`serve --out`: jobs/<model>.csv),
    /// in the plan's order, and the time the records count from (ns, monotonic clock).
    pub records: Option<(Vec<BatchSender>, i64)>,
    /// Workloads released on their own fixed-rate schedules beside the served models
    /// (`serve --release NAME`), as `run` releases them; not served.
    pub released: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The plan cannot be served as it is (the user's to change: exit code 2).
    #[error("{0}")]
    Refused(String),
    /// A model could not be built or warmed up.
    #[error("workload `{workload}`: {message}")]
    Model { workload: String, message: String },
    #[error("the criticality guard: {0}")]
    Guard(std::io::Error),
    #[error(transparent)]
    Partitions(#[from] isolane_session::SessionError),
}

impl ServeError {
    pub fn is_user_error(&self) -> bool {
        match self {
            ServeError::Refused(_) => true,
            ServeError::Partitions(e) => e.is_user_error(),
            _ => false,
        }
    }
}

/// A running server's shared state.
struct Shared {
    models: Vec<Arc<ServedModel>>,
    /// Each model's instance and what it was built from, in the models' order.
    slots: Vec<Slot>,
    by_name: HashMap<String, usize>,
    metrics: Arc<ServeMetrics>,
    draining: AtomicBool,
    /// Cuts a held best-effort piece short at shutdown.
    stop: Arc<AtomicBool>,
    /// What a new instance is built with.
    context: InstanceContext,
    /// Held by a change from its checks to its end, and by the drain: one change at a time,
    /// checked against the partitions as the last change left them.
    control: Mutex<()>,
    /// The scenario's `[protection] enabled`.
    protection: bool,
    started: Instant,
    /// The system shared memory regions clients registered.
    regions: shm::SharedRegions,
    /// The first drain's outcome, which later calls return.
    drained: Mutex<Option<Drained>>,
    /// The workloads released on their schedules beside the served models (`None`: none),
    /// and what they ran (once drained).
    released: Option<released::Released>,
    released_runs: Mutex<Vec<ReleasedRun>>,
    /// Where a resized green partition comes from (`None`: green partitions cannot be resized
    /// here: none, or not made resizable).
    repartition: Mutex<Option<Arc<dyn isolane_runtime::partition::Repartition>>>,
    // Kept for as long as the models publish in it.
    guard: Option<Arc<Guard>>,
}

/// One served model's instance: the thread that owns its executor, and the workload it was
/// built from (a change builds the next instance from a changed copy).
struct Slot {
    /// The workload's position in the scenario (seeds its random stream, names its guard part).
    index: usize,
    spec: Mutex<WorkloadSpec>,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// The last change, for `ctl status`.
    last: Mutex<Option<Change>>,
}

/// What every instance is built with, whichever model it serves.
#[derive(Clone)]
struct InstanceContext {
    /// The session's instances: the device, the guard and each workload's part in it, the
    /// stop flag, the build turn (shared with `run`'s coordinator).
    instances: Arc<Instances>,
    engine: Engine,
    seed: u64,
    poll_ns: i64,
    guard: Option<Arc<Guard>>,
    records: Option<(Vec<BatchSender>, i64)>,
    metrics: Arc<ServeMetrics>,
    /// How `host = "process"` workloads' workers start (`None`: this executable's, without
    /// a partition environment).
    processes: Option<ProcessHosts>,
}

/// The serving session's handle (cheap to clone; every front end holds one).
#[derive(Clone)]
pub struct Server {
    shared: Arc<Shared>,
}

/// How the drain went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drained {
    /// Requests that were taken and answered during the drain.
    pub answered: usize,
    /// Requests still queued when the drain's time ran out: refused (503 / UNAVAILABLE).
    pub abandoned: usize,
}

impl Server {
    /// Builds and warms up every workload of `plan` on a thread of its own (in its green
    /// group when the plan carries one), one after the other so that no build is timed beside
    /// another, and returns once all serve. `words` names each workload's partition (metrics).
    pub fn start(
        plan: &RunPlan,
        words: &[(String, Option<u32>)],
        options: &ServeOptions,
    ) -> Result<Server, ServeError> {
        Server::start_with(plan, words, options, None)
    }

    /// [`Server::start`], with the worker processes of `host = "process"` workloads started
    /// as `processes` says (their partition environment: [`serve_plan`] passes its session's).
    pub fn start_with(
        plan: &RunPlan,
        words: &[(String, Option<u32>)],
        options: &ServeOptions,
        processes: Option<ProcessHosts>,
    ) -> Result<Server, ServeError> {
        Server::start_releasing(plan, words, options, processes, &[])
    }

    /// [`Server::start_with`], where the workloads named in `released` are not served but
    /// released on their own fixed-rate schedules (as `isolane run` releases them) from one
    /// t0, taken once every instance is warm; the drain stops them, and
    /// [`Server::released_runs`] says what they ran.
    pub fn start_releasing(
        plan: &RunPlan,
        words: &[(String, Option<u32>)],
        options: &ServeOptions,
        processes: Option<ProcessHosts>,
        released: &[String],
    ) -> Result<Server, ServeError> {
        for name in released {
            if !plan.workloads.iter().any(|w| &w.spec.name == name) {
                return Err(ServeError::Refused(format!(
                    "released workload `{name}` is not a workload of the scenario"
                )));
            }
        }
        refuse_unservable(plan, released)?;
        let metrics = Arc::new(ServeMetrics::new());
        let stop = Arc::new(AtomicBool::new(false));
        let instances = Instances::new(plan, Some(options.engine.clone()), Arc::clone(&stop))
            .map_err(ServeError::Guard)?;
        let context = InstanceContext {
            guard: instances.guard().cloned(),
            instances: Arc::new(instances),
            engine: options.engine.clone(),
            seed: options.seed,
            poll_ns: plan.timing.spin_us as i64 * 1000,
            records: options.records.clone(),
            metrics: Arc::clone(&metrics),
            processes,
        };
        let mut models = Vec::new();
        let mut slots = Vec::new();
        // The released workloads' hosts build in the same turn as the served models.
        let releasing = released::Released::start(&context, plan, released)?;
        let mut started = Ok(());
        for (i, w) in plan.workloads.iter().enumerate() {
            if released.contains(&w.spec.name) {
                continue;
            }
            let (words, sms) = words.get(i).cloned().unwrap_or(("cpu".into(), None));
            started = spawn_instance(
                &context,
                w.index,
                w.spec.clone(),
                (words, sms),
                w.partition.take(),
                None,
            )
            .map(|(model, thread, _)| {
                models.push(model);
                slots.push(Slot {
                    index: w.index,
                    spec: Mutex::new(w.spec.clone()),
                    thread: Mutex::new(Some(thread)),
                    last: Mutex::new(None),
                });
            });
            if started.is_err() {
                break;
            }
        }
        // Every served instance is warm: the released workloads' common t0, once theirs are.
        if let (Ok(()), Some(r)) = (&started, &releasing) {
            let delay_ns = (plan.timing.start_delay_ms as i64).saturating_mul(1_000_000);
            started = r.go(isolane_runtime::clock::now_ns().saturating_add(delay_ns));
        }
        if let Err(e) = started {
            stop.store(true, Ordering::Relaxed);
            if let Some(r) = &releasing {
                r.finish();
            }
            for m in &models {
                m.close();
            }
            for s in slots {
                if let Some(t) = s.thread.into_inner().unwrap_or_else(|p| p.into_inner()) {
                    let _ = t.join();
                }
            }
            return Err(e);
        }
        let by_name = models
            .iter()
            .enumerate()
            .map(|(i, m)| (m.info().name.clone(), i))
            .collect();
        Ok(Server {
            shared: Arc::new(Shared {
                models,
                slots,
                by_name,
                metrics,
                draining: AtomicBool::new(false),
                stop,
                control: Mutex::new(()),
                protection: plan.protection.enabled,
                started: Instant::now(),
                regions: shm::SharedRegions::default(),
                drained: Mutex::new(None),
                released: releasing,
                released_runs: Mutex::new(Vec::new()),
                repartition: Mutex::new(None),
                guard: context.guard.clone(),
                context,
            }),
        })
    }

    /// What a person should know before the first request: a critical model whose deadline
    /// leaves less slack than a best-effort piece, beside which that best effort runs only
    /// while no request of the critical model could arrive, which is never (docs/serve.md).
    pub fn warnings(&self) -> Vec<String> {
        let Some(guard) = &self.shared.guard else {
            return Vec::new();
        };
        let margin = Duration::from_nanos(guard.policy().margin_ns.max(0) as u64);
        let mut out = Vec::new();
        for c in self
            .models()
            .filter(|m| m.criticality == Criticality::Critical)
        {
            let Some(deadline) = c.deadline else { continue };
            let slack = deadline.saturating_sub(margin + c.warm_service);
            for b in self
                .models()
                .filter(|m| m.criticality == Criticality::BestEffort)
            {
                let piece = b.warm_service / b.pieces.max(1) as u32;
                if piece > slack {
                    out.push(format!(
                        "best-effort model `{}` will not run: each of its pieces takes about \
                         {:.3} ms, more than the {:.3} ms that critical model `{}` leaves \
                         (deadline {:.3} ms − service {:.3} ms − margin {:.3} ms), and a request \
                         of `{}` may arrive at any moment; give `{}` a longer deadline_ms, or \
                         [protection] a smaller piece_us or margin_us",
                        b.name,
                        ms(piece),
                        ms(slack),
                        c.name,
                        ms(deadline),
                        ms(c.warm_service),
                        ms(margin),
                        c.name,
                        c.name
                    ));
                }
            }
        }
        out
    }

    /// The served models as they are now, in the scenario's order (an unloaded one too).
    pub fn models(&self) -> impl Iterator<Item = Arc<ModelInfo>> + '_ {
        self.shared.models.iter().map(|m| m.info())
    }

    /// A served model as it is now (loaded or not).
    pub fn model(&self, name: &str) -> Option<Arc<ModelInfo>> {
        self.find(name).map(|m| m.info())
    }

    /// Whether model `name` is served and ready: loaded, and the server not draining.
    pub fn is_model_ready(&self, name: &str) -> bool {
        self.is_ready() && self.find(name).is_some_and(|m| m.is_loaded())
    }

    fn find(&self, name: &str) -> Option<&Arc<ServedModel>> {
        self.shared
            .by_name
            .get(name)
            .map(|&i| &self.shared.models[i])
    }

    /// Live: the process serves (also while draining).
    pub fn is_live(&self) -> bool {
        true
    }

    /// Ready: every model is loaded and new requests are taken (false once draining).
    pub fn is_ready(&self) -> bool {
        !self.shared.draining.load(Ordering::Relaxed)
    }

    pub fn uptime(&self) -> Duration {
        self.shared.started.elapsed()
    }

    pub fn metrics(&self) -> &ServeMetrics {
        &self.shared.metrics
    }

    /// The system shared memory regions registered with this server.
    pub fn shared_memory(&self) -> &shm::SharedRegions {
        &self.shared.regions
    }

    /// Admits `req` to model `name` or refuses it at once; the answer arrives on the
    /// receiver when its job has run.
    pub fn submit(
        &self,
        name: &str,
        req: InferRequest,
    ) -> Result<oneshot::Receiver<Result<InferResponse, Refusal>>, Refusal> {
        let Some(model) = self.find(name) else {
            return Err(self.unknown(name));
        };
        model.stats.received();
        if self.shared.draining.load(Ordering::Relaxed) {
            model.stats.rejected("draining");
            return Err(Refusal::Draining {
                model: name.to_string(),
            });
        }
        model
            .submit(req)
            .inspect_err(|r| model.stats.rejected(r.reason()))
    }

    /// The refusal of a request for a model that is not served (counted).
    pub fn unknown(&self, name: &str) -> Refusal {
        self.shared.metrics.unknown_model(name);
        Refusal::UnknownModel {
            name: name.chars().take(200).collect(),
            served: self
                .shared
                .models
                .iter()
                .map(|m| format!("`{}`", m.info().name))
                .collect::<Vec<_>>()
                .join(", "),
        }
    }

    /// Submits and waits for the answer.
    pub async fn infer(&self, name: &str, req: InferRequest) -> Result<InferResponse, Refusal> {
        let rx = self.submit(name, req)?;
        rx.await.unwrap_or_else(|_| {
            Err(Refusal::Failed {
                model: name.to_string(),
                message: "the model's thread ended before answering".into(),
            })
        })
    }

    /// Triton's statistics extension: the model named, or every model (`None`); `None` back
    /// for an unknown name.
    pub fn statistics(&self, name: Option<&str>) -> Option<Vec<ModelStatistics>> {
        match name {
            Some(n) => self.find(n).map(|m| vec![m.statistics()]),
            None => Some(self.shared.models.iter().map(|m| m.statistics()).collect()),
        }
    }

    /// Requests taken and not answered yet, all models.
    pub fn in_flight(&self) -> usize {
        self.shared.models.iter().map(|m| m.in_flight()).sum()
    }

    /// What the released workloads ([`Server::start_releasing`]) ran, in the scenario's
    /// order; empty before the drain.
    pub fn released_runs(&self) -> Vec<ReleasedRun> {
        self.shared
            .released_runs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Refuses new requests from now on (ready turns false), answers those already taken
    /// (for at most `grace`), then stops the model threads. A later call returns the first
    /// one's outcome.
    pub fn drain(&self, grace: Duration) -> Drained {
        let mut done = self
            .shared
            .drained
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(d) = &*done {
            return d.clone();
        }
        self.shared.draining.store(true, Ordering::Relaxed);
        if let Some(r) = &self.shared.released {
            r.stop();
        }
        let before = self.in_flight();
        let until = Instant::now() + grace;
        // A change under way ends first (its new instance serves or was never switched in), so
        // that every instance's thread is joined below. It waits for the old instance's job,
        // which a held best-effort piece could make endless: past the grace, held pieces stop.
        let _control = loop {
            match self.shared.control.try_lock() {
                Ok(g) => break g,
                Err(std::sync::TryLockError::Poisoned(p)) => break p.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => {
                    if Instant::now() >= until {
                        self.shared.stop.store(true, Ordering::Relaxed);
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
        };
        for m in &self.shared.models {
            m.close();
        }
        while self.in_flight() > 0 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(2));
        }
        // Past the grace: what is still queued is refused; a held best-effort piece stops
        // waiting; a job already on the device still ends (there is no taking it back), and its
        // requests get their answers.
        let abandoned: usize = self.shared.models.iter().map(|m| m.abandon_queued()).sum();
        self.shared.stop.store(true, Ordering::Relaxed);
        for slot in &self.shared.slots {
            let thread = slot.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
            if let Some(t) = thread {
                let _ = t.join();
            }
        }
        let runs = self
            .shared
            .released
            .as_ref()
            .map(|r| r.finish())
            .unwrap_or_default();
        *self
            .shared
            .released_runs
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = runs;
        let d = Drained {
            answered: before.saturating_sub(abandoned),
            abandoned,
        };
        *done = Some(d.clone());
        d
    }
}

/// Serving runs models: an external program or a `kernel:` takes no requests.
fn refuse_unservable(plan: &RunPlan, released: &[String]) -> Result<(), ServeError> {
    for w in &plan.workloads {
        let name = &w.spec.name;
        if w.spec.program.is_some() {
            return Err(ServeError::Refused(format!(
                "workload `{name}` runs a program (`command`), which has no inputs to serve; \
                 serve takes models"
            )));
        }
        // A released `kernel:` takes no inputs, and needs none.
        if w.spec.kernel().is_some() && !released.contains(name) {
            return Err(ServeError::Refused(format!(
                "workload `{name}`: a `kernel:` workload has no inputs to serve"
            )));
        }
    }
    Ok(())
}

/// A started instance: its model, its thread, and how it took over (a later instance).
type Started = (Arc<ServedModel>, JoinHandle<()>, Option<model::TakeOver>);

/// Builds an instance of workload `spec` (scenario position `index`) on a thread of its own,
/// in `partition`, pinned to `spec.cpu`, and waits until it is warm. A first instance
/// (`existing` none) makes the served model; a later one takes `existing`'s queue over from
/// the instance serving it (which ends after its job) once warm, and says how that went.
/// `words`: the partition in words, and its SMs on a GPU.
fn spawn_instance(
    ctx: &InstanceContext,
    index: usize,
    spec: WorkloadSpec,
    (words, sms): (String, Option<u32>),
    partition: Option<isolane_runtime::partition::Partition>,
    existing: Option<(Arc<ServedModel>, i64)>,
) -> Result<Started, ServeError> {
    let ctx = ctx.clone();
    let device = spec.device(ctx.instances.device());
    let words = control::cpu_words(device.backend, &spec.cpu, words);
    let (ready_tx, ready_rx) =
        mpsc::channel::<Result<(Arc<ServedModel>, Option<model::TakeOver>), ServeError>>();
    let name = spec.name.clone();
    let failed = |message: String| ServeError::Model {
        workload: name.clone(),
        message,
    };
    let thread = std::thread::Builder::new()
        .name(format!("serve-{}", spec.name))
        .spawn(move || {
            let fail = |m: String| ServeError::Model {
                workload: spec.name.clone(),
                message: m,
            };
            // Pinned before the model is built: a CPU model's thread pool inherits the
            // affinity (one engine thread per listed core). A worker process pins itself;
            // the thread that drives it stays off its cores. A critical model publishes to
            // the guard through its queue (below), not through a role of its own.
            let mut build = |partition| {
                host::build_executor(
                    &ctx.engine,
                    &device,
                    &spec,
                    (ctx.seed, index, ctx.poll_ns),
                    partition,
                    ctx.processes.as_ref(),
                )
            };
            let how = How {
                warmup_jobs: spec.warmup_jobs.max(1),
                pin: spec.host != Host::Process,
                // A replacement warms up beside the models serving: held by the guard.
                guard: if existing.is_some() {
                    GuardPart::Replacement
                } else {
                    GuardPart::BestEffortOnly
                },
                build: Some(&mut build),
                check: None,
            };
            let prepared = ctx.instances.prepare(index, &spec, index, partition, how);
            let Prepared {
                executor: mut exec,
                warmup_ns: warm,
                mut role,
            } = match prepared {
                Ok(p) => p,
                Err(e) => {
                    let message = match e {
                        PrepareError::WarmUp(e) => format!("warm-up: {e}"),
                        PrepareError::Guard(e) => format!("the guard: {e}"),
                        e => e.to_string(),
                    };
                    let _ = ready_tx.send(Err(fail(message)));
                    return;
                }
            };
            let setup = ctx.instances.guard_setup(index).cloned();
            let warm_median = median(&warm);
            let info = ModelInfo {
                name: spec.name.clone(),
                source: spec.model.clone(),
                inputs: exec.inputs(),
                outputs: exec.outputs(),
                max_batch: spec.batch.max(1) as usize,
                criticality: spec.criticality,
                deadline: spec.deadline_s().map(Duration::from_secs_f64),
                queue_limit: spec.serve.queue_limit.max(1),
                when_full: spec.serve.when_full,
                batching: spec.serve.batching_for(spec.criticality),
                backend: match device.backend {
                    Backend::Cpu => "cpu",
                    Backend::Cuda => "cuda",
                },
                partition: words.clone(),
                // The thread's own mask, as the kernel has it (the cores it was pinned to).
                cpu: if spec.cpu.is_empty() {
                    Vec::new()
                } else {
                    isolane_runtime::affinity::available_cores()
                },
                sms,
                warm_service: Duration::from_nanos(warm_median.max(0) as u64),
                pieces: exec.pieces(),
            };
            let criticality = spec.criticality.name();
            let (model, instance, took) = match existing {
                Some((model, requested)) => {
                    model.stats.describe((&words, criticality), sms);
                    model.set_info(info);
                    let instance = model.next_instance();
                    let took = model.take_over(instance, warm_median.max(0), requested);
                    model.stats.set_ready(true);
                    (model, instance, Some(took))
                }
                None => {
                    let publisher = match (&setup, &ctx.guard) {
                        (
                            Some(GuardSetup {
                                critical_slot: Some(slot),
                                stretch,
                                ..
                            }),
                            Some(g),
                        ) => Some(Arc::new(CriticalPublisher::new(
                            Arc::clone(g),
                            *slot,
                            warm_median,
                            *stretch,
                        ))),
                        _ => None,
                    };
                    let records = ctx
                        .records
                        .as_ref()
                        .and_then(|(sinks, t0)| sinks.get(index).map(|s| (s.clone(), *t0)));
                    let stats =
                        ctx.metrics
                            .model(&spec.name, (info.backend, &words, criticality), sms);
                    let model = Arc::new(ServedModel::new(
                        info,
                        publisher,
                        stats,
                        records,
                        ctx.poll_ns,
                    ));
                    (model, 0, None)
                }
            };
            if ready_tx.send(Ok((Arc::clone(&model), took))).is_err() {
                return;
            }
            model.serve(instance, exec.as_mut(), &mut role, ctx.instances.stop());
        })
        .map_err(|e| failed(format!("cannot start its thread: {e}")))?;
    match ready_rx.recv() {
        Ok(Ok((model, took))) => Ok((model, thread, took)),
        Ok(Err(e)) => {
            let _ = thread.join();
            Err(e)
        }
        Err(_) => {
            let _ = thread.join();
            Err(failed("its thread ended while the model was built".into()))
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn median(v: &[i64]) -> i64 {
    let mut s = v.to_vec();
    s.sort_unstable();
    s.get(s.len() / 2).copied().unwrap_or(0)
}

/// What [`serve_plan`] returns: `body`'s result, how the drain went, and what the released
/// workloads ran ([`ServeOptions::released`]).
pub type Served<T> = (T, Drained, Vec<ReleasedRun>);

/// Sets up `admitted`'s partitions on `gpu` (none on the CPU), starts a [`Server`] in them,
/// runs `body` with it (the front ends, until they are told to stop), drains the server for
/// at most `grace`, and takes the partitions down.
pub fn serve_plan<T>(
    plan: &RunPlan,
    admitted: Option<&Plan>,
    choices: isolane_session::PartitionChoices,
    options: &ServeOptions,
    grace: Duration,
    body: impl FnOnce(&Server) -> T,
) -> Result<Served<T>, ServeError> {
    let words: Vec<(String, Option<u32>)> = plan
        .workloads
        .iter()
        .map(|w| {
            let resolved = admitted
                .and_then(|p| p.workloads.iter().find(|a| a.workload == w.spec.name))
                .map(|a| &a.partition);
            let sms = match resolved {
                Some(isolane_core::admission::ResolvedPartition::Green { sms, .. }) => Some(*sms),
                _ => None,
            };
            (
                isolane_session::live::partition_words(
                    w.spec.device(&plan.device).backend,
                    resolved,
                ),
                sms,
            )
        })
        .collect();
    let run = |plan: &RunPlan,
               processes: Option<ProcessHosts>,
               repartition: Option<Arc<dyn isolane_runtime::partition::Repartition>>|
     -> Result<Served<T>, ServeError> {
        let server = Server::start_releasing(plan, &words, options, processes, &options.released)?;
        *control::lock(&server.shared.repartition) = repartition;
        let out = body(&server);
        let drained = server.drain(grace);
        Ok((out, drained, server.released_runs()))
    };
    let Some(admitted) = admitted else {
        return run(plan, None, None);
    };
    // A green partition is resized while serving from one split at the driver's unit.
    let choices = isolane_session::PartitionChoices {
        resizable_green: true,
        ..choices
    };
    isolane_session::in_partitions(plan.device.gpu, admitted, choices, plan, |placed| {
        let processes = match placed
            .plan
            .workloads
            .iter()
            .any(|w| w.spec.host == Host::Process)
        {
            true => {
                let command =
                    isolane_runtime::worker_client::WorkerCommand::isolane().map_err(|e| {
                        ServeError::Refused(format!(
                            "cannot find the isolane executable for the worker processes: {e}"
                        ))
                    })?;
                Some(ProcessHosts {
                    command,
                    env: placed.worker_env,
                    on_start: Some(placed.adopt),
                })
            }
            false => None,
        };
        run(&placed.plan, processes, placed.repartition)
    })?
}

#[cfg(test)]
mod tests;
