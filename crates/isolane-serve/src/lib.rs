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
pub mod stream;
pub mod wire;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use isolane_core::admission::Plan;
use isolane_core::spec::{Backend, Criticality, Host, WorkloadSpec};
use isolane_runtime::coordinator::RunPlan;
use isolane_runtime::exec::Engine;
use isolane_runtime::guard::{CriticalPublisher, Guard, GuardSetup};
use isolane_runtime::handle::{AdmitChange, Coordinator, Driver, InstanceError, Place, Start};
use isolane_runtime::instance::{Instances, PrepareError, Prepared};
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
    /// (`serve --release NAME`), as `run` releases them; not served. A command workload (a
    /// program) is started once every instance is warm and stopped by the drain.
    pub released: Vec<String>,
    /// Where a released program writes `<workload>.stdout` and `.stderr` (`serve --out`);
    /// `None`: discarded.
    pub programs_dir: Option<std::path::PathBuf>,
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
    /// The session's handle: each served model's slot (its front, the [`ServedModel`], and
    /// the instance serving it), and the changes made to them (add, remove, resize), one at a
    /// time, checked against the partitions as the last change left them.
    coordinator: Coordinator<InstanceContext>,
    /// Each model's last change, for `ctl status`, in the models' order.
    last: Vec<Mutex<Option<Change>>>,
    metrics: Arc<ServeMetrics>,
    draining: AtomicBool,
    /// Cuts a held best-effort piece short at shutdown.
    stop: Arc<AtomicBool>,
    /// The scenario's `[protection] enabled`.
    protection: bool,
    started: Instant,
    /// The system shared memory regions clients registered.
    regions: shm::SharedRegions,
    /// The first drain's outcome, which later calls return.
    drained: Mutex<Option<Drained>>,
    /// The workloads released on their schedules beside the served models (`None`: none),
    /// and what they ran (once drained).
    released: Option<Arc<released::Released>>,
    released_runs: Mutex<Vec<ReleasedRun>>,
    // Kept for as long as the models publish in it.
    guard: Option<Arc<Guard>>,
}

impl Shared {
    /// The served models: the coordinator's fronts, in its (the scenario's) order. The set
    /// does not change while serving, only their instances do, so the handle's list is the
    /// only one.
    fn models(&self) -> impl ExactSizeIterator<Item = &Arc<ServedModel>> + '_ {
        self.coordinator.slots().iter().map(|s| s.front())
    }

    /// Served model `i`, in the coordinator's order.
    fn model(&self, i: usize) -> &Arc<ServedModel> {
        self.coordinator.slots()[i].front()
    }
}

/// What every instance is built with, whichever model it serves: the coordinator's
/// [`Driver`] of served models.
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
    /// [`ServeOptions::programs_dir`].
    programs_dir: Option<std::path::PathBuf>,
    /// The shared memory ranges page-locked for the GPU: the server's regions record them,
    /// the models' threads read inputs from them in place.
    pinned: Arc<shm::PinnedRanges>,
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
            programs_dir: options.programs_dir.clone(),
            pinned: Arc::default(),
        };
        // The released workloads' hosts build in the same turn as the served models.
        let releasing = released::Released::start(&context, plan, released)?;
        let starts = plan
            .workloads
            .iter()
            .enumerate()
            .filter(|(_, w)| !released.contains(&w.spec.name))
            .map(|(i, w)| {
                let (words, sms) = words.get(i).cloned().unwrap_or(("cpu".into(), None));
                Start {
                    index: w.index,
                    place: place(&context, &w.spec, words, sms),
                    spec: w.spec.clone(),
                    partition: w.partition.take(),
                }
            })
            .collect();
        let coordinator =
            Coordinator::start(Arc::clone(&context.instances), context.clone(), starts)
                .map_err(model_error);
        // Every served instance is warm: the released workloads' common t0, once theirs are.
        let started = match (coordinator, &releasing) {
            (Ok(c), Some(r)) => {
                let delay_ns = (plan.timing.start_delay_ms as i64).saturating_mul(1_000_000);
                match r.go(isolane_runtime::clock::now_ns().saturating_add(delay_ns)) {
                    Ok(()) => Ok(c),
                    Err(e) => Err((e, Some(c))),
                }
            }
            (Ok(c), None) => Ok(c),
            (Err(e), _) => Err((e, None)),
        };
        let coordinator = match started {
            Ok(c) => c,
            Err((e, started)) => {
                stop.store(true, Ordering::Relaxed);
                if let Some(r) = &releasing {
                    r.finish();
                }
                if let Some(c) = started {
                    c.end();
                }
                return Err(e);
            }
        };
        Ok(Server {
            shared: Arc::new(Shared {
                last: coordinator
                    .slots()
                    .iter()
                    .map(|_| Mutex::new(None))
                    .collect(),
                coordinator,
                metrics,
                draining: AtomicBool::new(false),
                stop,
                protection: plan.protection.enabled,
                started: Instant::now(),
                regions: shm::SharedRegions::pinned_on(
                    pin_gpu(plan, released),
                    Arc::clone(&context.pinned),
                ),
                drained: Mutex::new(None),
                released: releasing.map(Arc::new),
                released_runs: Mutex::new(Vec::new()),
                guard: context.guard.clone(),
            }),
        })
    }

    /// Asks `admission` about every change made while serving (`ctl resize`, `ctl load`,
    /// autoplan's re-plans) before anything is made; its refusal is the change's (409). The
    /// workloads released beside the served models (`serve --release`) are among the
    /// neighbours it is asked about, as long as they are released.
    pub fn set_admission(&self, admission: Option<Arc<dyn AdmitChange>>) {
        let admission = match (admission, &self.shared.released) {
            (Some(admission), Some(released)) => Some(Arc::new(released::BesideReleased {
                admission,
                released: Arc::clone(released),
            }) as Arc<dyn AdmitChange>),
            (admission, _) => admission,
        };
        self.shared.coordinator.set_admission(admission);
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
        self.shared.models().map(|m| m.info())
    }

    /// A served model as it is now (loaded or not).
    pub fn model(&self, name: &str) -> Option<Arc<ModelInfo>> {
        self.find(name).map(|m| m.info())
    }

    /// Model `name` at `version` (a URL's or a gRPC request's; empty: none asked), or the
    /// refusal of a model not served (counted) or of a version it does not have.
    pub fn model_at(&self, name: &str, version: &str) -> Result<Arc<ModelInfo>, Refusal> {
        let info = self.model(name).ok_or_else(|| self.unknown(name))?;
        if !is_served_version(version) {
            self.shared.metrics.unknown_model(name);
            return Err(Refusal::UnknownVersion {
                model: name.to_string(),
                version: version.chars().take(40).collect(),
            });
        }
        Ok(info)
    }

    /// Whether model `name` is served and ready: loaded, and the server not draining.
    pub fn is_model_ready(&self, name: &str) -> bool {
        self.is_ready() && self.find(name).is_some_and(|m| m.is_loaded())
    }

    /// Whether model `name` is ready at `version`: a version it does not have is not ready,
    /// as Triton answers.
    pub fn is_model_version_ready(&self, name: &str, version: &str) -> bool {
        is_served_version(version) && self.is_model_ready(name)
    }

    fn find(&self, name: &str) -> Option<&Arc<ServedModel>> {
        self.shared.coordinator.front(name)
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
                .models()
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
            None => Some(self.shared.models().map(|m| m.statistics()).collect()),
        }
    }

    /// Requests taken and not answered yet, all models.
    pub fn in_flight(&self) -> usize {
        self.shared.models().map(|m| m.in_flight()).sum()
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
        self.drain_until(grace, || false)
    }

    /// [`Server::drain`], whose grace ends early once `cut` says so (`isolane serve`: a second
    /// SIGTERM or SIGINT): what is still queued is then dropped as when the grace runs out.
    pub fn drain_until(&self, grace: Duration, cut: impl Fn() -> bool) -> Drained {
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
        let over = || Instant::now() >= until || cut();
        // A change under way ends first (its new instance serves or was never switched in), so
        // that every instance's thread is joined below. It waits for the old instance's job,
        // which a held best-effort piece could make endless: past the grace, held pieces stop.
        let _control = loop {
            if let Some(turn) = self.shared.coordinator.try_change_turn() {
                break turn;
            }
            if over() {
                self.shared.stop.store(true, Ordering::Relaxed);
            }
            std::thread::sleep(Duration::from_millis(2));
        };
        for m in self.shared.models() {
            m.close();
        }
        while self.in_flight() > 0 && !over() {
            std::thread::sleep(Duration::from_millis(2));
        }
        // Past the grace: what is still queued is refused; a held best-effort piece stops
        // waiting; a job already on the device still ends (there is no taking it back), and its
        // requests get their answers.
        let abandoned: usize = self.shared.models().map(|m| m.abandon_queued()).sum();
        self.shared.stop.store(true, Ordering::Relaxed);
        self.shared.coordinator.join();
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

/// Serving runs models: an external program or a `kernel:` takes no requests (released,
/// both run beside the served models).
fn refuse_unservable(plan: &RunPlan, released: &[String]) -> Result<(), ServeError> {
    for w in &plan.workloads {
        let name = &w.spec.name;
        if w.spec.program.is_some() && !released.contains(name) {
            return Err(ServeError::Refused(format!(
                "workload `{name}` runs a program (`command`), which has no inputs to serve; \
                 serve takes models, and runs a program beside them with --release {name}"
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

/// The GPU that page-locks clients' shared memory regions: the first served model's that runs
/// on cuda in this process (a worker process's model reads its input from the server's
/// messages, not from the region); `None` where none does.
fn pin_gpu(plan: &RunPlan, released: &[String]) -> Option<u32> {
    // On unless `ISOLANE_SERVE_PIN_SHM=0` (docs/serve.md, "Shared memory"): the H200 checked
    // the in-place copy in session 24, and it took grpc-shm's input stage from 31 to 0.4 µs.
    if std::env::var_os("ISOLANE_SERVE_PIN_SHM").is_some_and(|v| v == "0") {
        return None;
    }
    plan.workloads
        .iter()
        .filter(|w| !released.contains(&w.spec.name) && w.spec.host == Host::Thread)
        .map(|w| w.spec.device(&plan.device))
        .find(|d| d.backend == Backend::Cuda)
        .map(|d| d.gpu)
}

/// A served model's place: a CPU model's in its cores (`cpu 2,3`), else `words`; `sms` on a
/// GPU.
fn place(ctx: &InstanceContext, spec: &WorkloadSpec, words: String, sms: Option<u32>) -> Place {
    let backend = spec.device(ctx.instances.device()).backend;
    Place {
        words: control::cpu_words(backend, &spec.cpu, words),
        sms,
    }
}

fn model_error(e: InstanceError) -> ServeError {
    ServeError::Model {
        workload: e.workload,
        message: e.message,
    }
}

impl isolane_runtime::handle::Front for ServedModel {
    fn is_loaded(&self) -> bool {
        ServedModel::is_loaded(self)
    }
}

impl isolane_runtime::handle::Submit for ServedModel {
    type Input = InferRequest;
    type Answer = oneshot::Receiver<Result<InferResponse, Refusal>>;
    type Refusal = Refusal;
    fn submit(&self, req: InferRequest) -> Result<Self::Answer, Refusal> {
        ServedModel::submit(self, req)
    }
}

/// Served models' instances: built where the workload's host says, warmed up (at least one
/// job: admission predicts from it), then serving the model's queue until another instance
/// takes it over or it is unloaded or closed.
impl Driver for InstanceContext {
    type Front = ServedModel;
    type Took = model::TakeOver;

    fn build(
        &self,
        spec: &WorkloadSpec,
        index: usize,
        partition: Option<isolane_runtime::partition::Partition>,
    ) -> Result<Box<dyn isolane_runtime::exec::Executor>, isolane_runtime::exec::ExecError> {
        host::build_executor(
            &self.engine,
            &spec.device(self.instances.device()),
            spec,
            (self.seed, index, self.poll_ns),
            partition,
            self.processes.as_ref(),
        )
    }

    fn warmup_jobs(&self, spec: &WorkloadSpec) -> u64 {
        spec.warmup_jobs.max(1)
    }

    fn thread_name(&self, spec: &WorkloadSpec) -> String {
        format!("serve-{}", spec.name)
    }

    fn prepare_failed(&self, e: PrepareError) -> String {
        match e {
            PrepareError::WarmUp(e) => format!("warm-up: {e}"),
            PrepareError::Guard(e) => format!("the guard: {e}"),
            // The instance error names the workload already: the model and why, once.
            PrepareError::Build(isolane_runtime::exec::ExecError::BadModel {
                model,
                reason,
                ..
            }) => {
                format!("model `{model}`: {reason}")
            }
            e => e.to_string(),
        }
    }

    /// A first instance makes the served model (a critical one publishes to the guard through
    /// its queue); a later one takes its queue over from the instance serving it (which ends
    /// after its job).
    fn warm(
        &self,
        index: usize,
        spec: &WorkloadSpec,
        place: &Place,
        prepared: &Prepared,
        existing: Option<(&Arc<ServedModel>, i64)>,
    ) -> (Arc<ServedModel>, u64, Option<model::TakeOver>) {
        let exec = &prepared.executor;
        let device = spec.device(self.instances.device());
        let warm_median = median(&prepared.warmup_ns);
        let (words, sms) = (&place.words, place.sms);
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
        if let Some((model, requested)) = existing {
            model.stats.describe((words, criticality), sms);
            model.set_info(info);
            let instance = model.next_instance();
            let took = model.take_over(instance, warm_median.max(0), requested);
            model.stats.set_ready(true);
            return (Arc::clone(model), instance, Some(took));
        }
        let setup = self.instances.guard_setup(index).cloned();
        let publisher = match (&setup, &self.guard) {
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
        let records = self
            .records
            .as_ref()
            .and_then(|(sinks, t0)| sinks.get(index).map(|s| (s.clone(), *t0)));
        let stats = self
            .metrics
            .model(&spec.name, (info.backend, words, criticality), sms);
        let model = Arc::new(ServedModel::new(
            info,
            publisher,
            stats,
            records,
            self.poll_ns,
            Arc::clone(&self.pinned),
        ));
        (model, 0, None)
    }

    fn drive(
        &self,
        model: &ServedModel,
        instance: u64,
        mut prepared: Prepared,
        stop: &Arc<AtomicBool>,
    ) {
        model.serve(
            instance,
            prepared.executor.as_mut(),
            &mut prepared.role,
            stop,
        );
    }

    fn close(&self, model: &ServedModel) {
        model.close();
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
        server.shared.coordinator.set_repartition(repartition);
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

/// Whether a model version asked for is the one each served model has: `1`, or none (empty:
/// the server's choice, as tritonclient and perf_analyzer send by default). Triton reads the
/// version as an integer, so `01` is version 1 too.
pub fn is_served_version(version: &str) -> bool {
    version.is_empty() || version.parse::<u64>() == Ok(1)
}

#[cfg(test)]
mod tests;
