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
//! Served here: thread-hosted workloads (the CPU, green contexts). Worker processes (MPS,
//! MIG, time slices) are refused at start with their reason (docs/serve.md).

pub mod grpc;
pub mod http;
mod model;
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
use isolane_core::spec::{Backend, Criticality, Host};
use isolane_runtime::coordinator::{RunPlan, WorkloadPlan};
use isolane_runtime::exec::{executor_for, Engine};
use isolane_runtime::guard::{CriticalPublisher, Guard, GuardRole, GuardSetup};
use isolane_runtime::jobs_stream::BatchSender;
use tokio::sync::oneshot;

pub use model::ModelInfo;
pub use request::{InferRequest, InferResponse, Refusal};
pub use stats::{InferenceStats, ModelStatistics, ServeMetrics, StatDuration};

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
    by_name: HashMap<String, usize>,
    metrics: Arc<ServeMetrics>,
    draining: AtomicBool,
    /// Cuts a held best-effort piece short at shutdown.
    stop: Arc<AtomicBool>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    started: Instant,
    /// The system shared memory regions clients registered.
    regions: shm::SharedRegions,
    /// The first drain's outcome, which later calls return.
    drained: Mutex<Option<Drained>>,
    // Kept for as long as the models publish in it.
    guard: Option<Arc<Guard>>,
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
        refuse_unservable(plan)?;
        let guard = plan.guard().map_err(ServeError::Guard)?;
        let metrics = Arc::new(ServeMetrics::new());
        let stop = Arc::new(AtomicBool::new(false));
        let mut models = Vec::new();
        let mut threads = Vec::new();
        for (i, w) in plan.workloads.iter().enumerate() {
            let setup = guard.as_ref().and_then(|(_, s)| s.get(i).cloned());
            let (words, sms) = words.get(i).cloned().unwrap_or(("cpu".into(), None));
            let started = start_model(
                plan,
                w,
                (words, sms),
                options,
                guard.as_ref().map(|(g, _)| Arc::clone(g)),
                setup,
                &metrics,
                &stop,
            );
            match started {
                Ok((model, thread)) => {
                    models.push(model);
                    threads.push(thread);
                }
                Err(e) => {
                    stop.store(true, Ordering::Relaxed);
                    for m in &models {
                        m.close();
                    }
                    for t in threads {
                        let _ = t.join();
                    }
                    return Err(e);
                }
            }
        }
        let by_name = models
            .iter()
            .enumerate()
            .map(|(i, m)| (m.info.name.clone(), i))
            .collect();
        Ok(Server {
            shared: Arc::new(Shared {
                models,
                by_name,
                metrics,
                draining: AtomicBool::new(false),
                stop,
                threads: Mutex::new(threads),
                started: Instant::now(),
                regions: shm::SharedRegions::default(),
                drained: Mutex::new(None),
                guard: guard.map(|(g, _)| g),
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

    /// The served models, in the scenario's order.
    pub fn models(&self) -> impl Iterator<Item = &ModelInfo> {
        self.shared.models.iter().map(|m| &m.info)
    }

    pub fn model(&self, name: &str) -> Option<&ModelInfo> {
        self.find(name).map(|m| &m.info)
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
                .map(|m| format!("`{}`", m.info.name))
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
        let before = self.in_flight();
        let until = Instant::now() + grace;
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
        let threads = std::mem::take(
            &mut *self
                .shared
                .threads
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
        );
        for t in threads {
            let _ = t.join();
        }
        let d = Drained {
            answered: before.saturating_sub(abandoned),
            abandoned,
        };
        *done = Some(d.clone());
        d
    }
}

/// Serving runs models on threads of this process; a workload hosted in a worker process
/// (MPS, MIG, time slices) or an external program cannot be served yet.
fn refuse_unservable(plan: &RunPlan) -> Result<(), ServeError> {
    for w in &plan.workloads {
        let name = &w.spec.name;
        if w.spec.program.is_some() {
            return Err(ServeError::Refused(format!(
                "workload `{name}` runs a program (`command`), which has no inputs to serve; \
                 serve takes models"
            )));
        }
        if w.spec.host == Host::Process {
            return Err(ServeError::Refused(format!(
                "workload `{name}`: host = \"process\" (mechanisms mps, mig and timeslice) is \
                 not served yet; serve runs models on threads of its own process: the CPU, or \
                 green contexts on a GPU (docs/serve.md)"
            )));
        }
        if w.spec.kernel().is_some() {
            return Err(ServeError::Refused(format!(
                "workload `{name}`: a `kernel:` workload has no inputs to serve"
            )));
        }
    }
    Ok(())
}

/// Builds workload `w`'s model on its own thread and waits until it is warm.
#[allow(clippy::too_many_arguments)]
fn start_model(
    plan: &RunPlan,
    w: &WorkloadPlan,
    (words, sms): (String, Option<u32>),
    options: &ServeOptions,
    guard: Option<Arc<Guard>>,
    setup: Option<GuardSetup>,
    metrics: &Arc<ServeMetrics>,
    stop: &Arc<AtomicBool>,
) -> Result<(Arc<ServedModel>, JoinHandle<()>), ServeError> {
    let spec = w.spec.clone();
    let device = spec.device(&plan.device);
    let partition = w.partition.take();
    let engine = options.engine.clone();
    let seed = options.seed;
    let index = w.index;
    let poll_ns = plan.timing.spin_us as i64 * 1000;
    let records = options
        .records
        .as_ref()
        .and_then(|(sinks, t0)| sinks.get(index).map(|s| (s.clone(), *t0)));
    let metrics = Arc::clone(metrics);
    let stop = Arc::clone(stop);
    let (ready_tx, ready_rx) = mpsc::channel::<Result<Arc<ServedModel>, ServeError>>();
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
            // affinity (one engine thread per listed core).
            if !spec.cpu.is_empty() {
                if let Err(e) = isolane_runtime::affinity::pin_current_thread(&spec.cpu) {
                    let _ = ready_tx.send(Err(fail(e.to_string())));
                    return;
                }
            }
            let built = executor_for(
                Some(engine.as_ref()),
                &device,
                &spec,
                seed,
                index,
                partition,
            );
            let mut exec = match built {
                Ok(e) => e,
                Err(e) => {
                    let _ = ready_tx.send(Err(fail(e.to_string())));
                    return;
                }
            };
            let warm = match warm_up(exec.as_mut(), spec.warmup_jobs.max(1)) {
                Ok(w) => w,
                Err(e) => {
                    let _ = ready_tx.send(Err(fail(format!("warm-up: {e}"))));
                    return;
                }
            };
            let critical = spec.criticality == Criticality::Critical;
            let mut role = match (&setup, critical) {
                (Some(s), false) => {
                    match GuardRole::attach(Some(s), guard.as_ref(), exec.as_mut(), &warm) {
                        Ok(r) => r,
                        Err(e) => {
                            let _ = ready_tx.send(Err(fail(format!("the guard: {e}"))));
                            return;
                        }
                    }
                }
                _ => GuardRole::Off,
            };
            let publisher = match (&setup, &guard) {
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
                    median(&warm),
                    *stretch,
                ))),
                _ => None,
            };
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
                warm_service: Duration::from_nanos(median(&warm).max(0) as u64),
                pieces: exec.pieces(),
            };
            let criticality = spec.criticality.name();
            let stats = metrics.model(&spec.name, (info.backend, &words, criticality), sms);
            let model = Arc::new(ServedModel::new(info, publisher, stats, records, poll_ns));
            if ready_tx.send(Ok(Arc::clone(&model))).is_err() {
                return;
            }
            model.serve(exec.as_mut(), &mut role, &stop);
        })
        .map_err(|e| failed(format!("cannot start its thread: {e}")))?;
    match ready_rx.recv() {
        Ok(Ok(model)) => Ok((model, thread)),
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

/// Runs `n` jobs on the model's seeded input; their service times (ns).
fn warm_up(
    exec: &mut dyn isolane_runtime::exec::Executor,
    n: u64,
) -> Result<Vec<i64>, isolane_runtime::ExecError> {
    (0..n)
        .map(|_| {
            let t = isolane_runtime::clock::now_ns();
            exec.run_job()?;
            Ok(isolane_runtime::clock::now_ns() - t)
        })
        .collect()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn median(v: &[i64]) -> i64 {
    let mut s = v.to_vec();
    s.sort_unstable();
    s.get(s.len() / 2).copied().unwrap_or(0)
}

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
) -> Result<(T, Drained), ServeError> {
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
    let run = |plan: &RunPlan| -> Result<(T, Drained), ServeError> {
        let server = Server::start(plan, &words, options)?;
        let out = body(&server);
        let drained = server.drain(grace);
        Ok((out, drained))
    };
    let Some(admitted) = admitted else {
        return run(plan);
    };
    let urgency = isolane_session::urgency_of(plan);
    isolane_session::with_urgent_partitions(
        plan.device.gpu,
        admitted,
        choices,
        urgency,
        |session| {
            let plan = isolane_session::plan_in(session, plan);
            run(&plan)
        },
    )?
}

#[cfg(test)]
mod tests;
