//! Releases workloads on their fixed-rate schedules: thread hosts, worker processes and
//! command programs, the start barrier, the common `t0`, stopping, and collecting the records.
//!
//! [`Releasing`] is the session handle that does it for some or all of a plan's workloads,
//! with the session's [`Instances`]: each thread-hosted workload's instance is built and
//! warmed up through them (as `isolane serve`'s models are), then its release loop runs on the
//! same thread from the common t0; a worker process builds its instance and runs the same loop
//! itself (the `setup` role), in the build turn of the same [`Instances`]. [`run`] releases
//! every workload of a plan (`isolane run` and the studies); `isolane serve --release` releases
//! some beside the models it serves, through the same handle (isolane-serve's `released.rs`).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use isolane_core::results::ProgramEnd;
use isolane_core::spec::{
    Criticality, DeviceSpec, Host, ProgramSpec, ProtectionSpec, TimingSpec, WorkloadSpec,
};
use isolane_core::JobRecord;

use crate::exec::{Engine, EngineExecutors};
use crate::guard::{Guard, GuardRole, GuardSetup, HoldWait, Policy, ShareModel};
use crate::instance::{GuardPart, How, Instances, PrepareError};
use crate::jobs_stream::{BatchSender, JobsStream, RecordObserver, StreamingSink};
use crate::partition::PartitionHandle;
use crate::program::{run_program, ProgramLaunch, ProgramOutcome};
use crate::protocol::{
    check_version, record_from_wire, truncate, DoneStatus, FromWorker, ToWorker,
};
use crate::release::{capacity_for, run_loop_guarded, LoopEnd};
use crate::schedule::Schedule;
use crate::thread_cpu::ThreadCpu;
use crate::{affinity, clock, exec};

/// One workload of a run, with the schedule it is to follow (usually the spec's own; the
/// isolation experiment gives victims and interferers other ones).
#[derive(Debug, Clone)]
pub struct WorkloadPlan {
    pub spec: WorkloadSpec,
    /// Position in the scenario: seeds the workload's random stream.
    pub index: usize,
    pub schedule: Schedule,
    /// The partition a thread host hands the engine (a green group), put here by whoever set
    /// the partitions up; empty for processes and unpartitioned runs.
    pub partition: PartitionHandle,
}

#[derive(Debug, Clone)]
pub struct RunPlan {
    /// Where the models run (backend, GPU): the engine builds each workload for it.
    pub device: DeviceSpec,
    pub workloads: Vec<WorkloadPlan>,
    pub timing: TimingSpec,
    /// How critical workloads are protected from best-effort ones (when the plan has both).
    pub protection: ProtectionSpec,
    /// The GPU's fitted interference model, for `[protection] share` (set by the session from
    /// the admitted plan; `None`: not fitted for the device, or on the CPU).
    pub share: Option<ShareModel>,
}

impl RunPlan {
    /// Every workload of `scenario` on its own schedule.
    pub fn from_scenario(scenario: &isolane_core::spec::Scenario) -> RunPlan {
        RunPlan {
            device: scenario.device.clone(),
            workloads: scenario
                .workloads
                .iter()
                .enumerate()
                .map(|(index, spec)| WorkloadPlan {
                    spec: spec.clone(),
                    index,
                    schedule: Schedule::from_workload(spec),
                    partition: PartitionHandle::default(),
                })
                .collect(),
            timing: scenario.timing.clone(),
            protection: scenario.protection,
            share: None,
        }
    }

    /// Whether the guard acts in this plan: protection enabled, and both critical and
    /// best-effort workloads present.
    pub fn protects(&self) -> bool {
        let has = |c: Criticality| self.workloads.iter().any(|w| guarded(w) == Some(c));
        self.protection.enabled && has(Criticality::Critical) && has(Criticality::BestEffort)
    }

    /// The guard of this plan and each workload's part in it (`None`: unprotected run).
    pub fn guard(&self) -> std::io::Result<Option<(Arc<Guard>, Vec<GuardSetup>)>> {
        if !self.protects() || !self.protection.guard {
            return Ok(None);
        }
        let critical: Vec<bool> = self
            .workloads
            .iter()
            .map(|w| guarded(w) == Some(Criticality::Critical))
            .collect();
        let policy = Policy::of(&self.protection, self.share);
        let guard = Guard::create(critical.iter().filter(|c| **c).count(), policy)?;
        let path = guard.path().unwrap_or_default();
        let cores = affinity::available_cores().len();
        let mut next_slot = 0;
        let setups = critical
            .iter()
            .zip(&self.workloads)
            .map(|(&c, w)| GuardSetup {
                path: path.clone(),
                policy,
                piece_ns: self.protection.piece_us as i64 * 1000,
                critical_slot: c.then(|| {
                    next_slot += 1;
                    next_slot - 1
                }),
                wait: self.hold_wait(&w.spec, cores),
                stretch: w.spec.stretch,
            })
            .collect();
        Ok(Some((Arc::new(guard), setups)))
    }

    /// How best-effort workload `be` waits while held: polling when it has a core to itself
    /// (more cores than workloads, and not pinned onto a critical workload's core), asleep
    /// otherwise, where its polls would take the core from critical work.
    fn hold_wait(&self, be: &WorkloadSpec, cores: usize) -> HoldWait {
        let shares_a_core = self.workloads.iter().any(|w| {
            w.spec.criticality == Criticality::Critical
                && w.spec.cpu.iter().any(|c| be.cpu.contains(c))
        });
        let own_core = if be.cpu.is_empty() {
            cores > self.workloads.len()
        } else {
            !shares_a_core
        };
        if own_core {
            HoldWait::Poll
        } else {
            HoldWait::Sleep
        }
    }
}

/// What the criticality guard counts a workload as: its criticality, or `None` for a command
/// workload, whose program isolane can neither protect (it knows no deadline of it) nor hold
/// back (it has no pieces).
fn guarded(w: &WorkloadPlan) -> Option<Criticality> {
    w.spec.program.is_none().then_some(w.spec.criticality)
}

/// Things a run needs from its caller.
pub struct RunOptions {
    /// Raised by Ctrl-C: stop releasing, keep what was measured.
    pub stop: Arc<AtomicBool>,
    /// The executable a `process` host re-executes as `<exe> worker`; default: this executable
    /// (`ISOLANE_WORKER_EXE` overrides it, for tests that drive the runtime from another binary).
    pub worker_exe: Option<PathBuf>,
    /// Extra environment of a workload's worker process (or a command workload's program), by
    /// workload name: how a partition reaches a process it cannot be handed to (MPS pipe directory and thread percentage,
    /// `CUDA_VISIBLE_DEVICES=MIG-<uuid>`). Thread-hosted workloads ignore it.
    pub worker_env: BTreeMap<String, Vec<(String, String)>>,
    /// Called with (workload name, pid) right after a worker process starts, e.g. so that an
    /// MPS daemon's shutdown path can end its clients.
    pub on_worker_start: Option<WorkerStartHook>,
    /// The run's output folder: when set, every workload's records stream to
    /// `jobs/<workload>.csv` there while it runs ([`crate::jobs_stream`]), so a killed run
    /// leaves its measured jobs behind, and a command workload's program writes its
    /// `<workload>.stdout` and `.stderr` there (without it, they are discarded).
    pub jobs_dir: Option<PathBuf>,
    /// Builds every workload whose model is not `spin:` (in thread hosts; a worker process is
    /// given its own). `None`: only `spin:` models run.
    pub engine: Option<Engine>,
    /// Sees every workload's records during the run (live metrics), on the jobs writer
    /// thread, never on a release loop's ([`crate::jobs_stream::RecordObserver`]).
    pub observer: Option<Arc<dyn RecordObserver>>,
    /// Where a command workload's program writes `<workload>.stdout` and `.stderr` when the
    /// records do not stream to `jobs_dir` (a server's `--out`, whose own writer has jobs/);
    /// default: `jobs_dir`.
    pub programs_dir: Option<PathBuf>,
}

/// See [`RunOptions::on_worker_start`].
pub type WorkerStartHook = Arc<dyn Fn(&str, u32) + Send + Sync>;

impl RunOptions {
    pub fn new(stop: Arc<AtomicBool>) -> Self {
        RunOptions {
            stop,
            worker_exe: None,
            worker_env: BTreeMap::new(),
            on_worker_start: None,
            jobs_dir: None,
            engine: None,
            observer: None,
            programs_dir: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkloadStatus {
    Ok,
    /// Stopped by Ctrl-C: the records are those released before it.
    Interrupted,
    Failed(Failure),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub message: String,
    /// The worker process's exit code, when it exited with one.
    pub exit_code: Option<i32>,
    /// The signal that killed the worker process.
    pub signal: Option<i32>,
    /// The engine ran out of device or host memory building or warming the model in this
    /// process (a thread host; a worker says so by exiting 3), so that `run` exits 3 as `infer`
    /// does.
    pub out_of_memory: bool,
}

impl Failure {
    fn msg(message: impl Into<String>) -> Self {
        Failure {
            message: message.into(),
            exit_code: None,
            signal: None,
            out_of_memory: false,
        }
    }
}

#[derive(Debug, Clone)]
pub struct WorkloadResult {
    pub name: String,
    pub status: WorkloadStatus,
    pub records: Vec<JobRecord>,
    /// Warm-up service times (ns), excluded from the records.
    pub warmup_ns: Vec<i64>,
    /// The worker's pid for a process host.
    pub pid: Option<u32>,
    /// Device memory the executor holds (MiB), as its engine measured it: what telemetry
    /// cannot attribute to one of several workloads sharing this process.
    pub device_memory_mib: Option<f64>,
    /// A best-effort workload the criticality guard acted on: the pieces each job ran as.
    pub pieces: Option<usize>,
    /// What the release-loop thread cost the CPU from t0 to its end (where /proc says).
    pub cpu: Option<ThreadCpu>,
    /// A command workload: how its program ran (`None` for models, and for a program that
    /// never reached t0).
    pub program: Option<ProgramOutcome>,
}

#[derive(Debug, Clone)]
pub struct RunResult {
    /// Absolute CLOCK_MONOTONIC time of t0; `None` when the run never started.
    pub t0_ns: Option<i64>,
    /// From t0 to the end of the last workload (s).
    pub wall_s: f64,
    pub interrupted: bool,
    pub workloads: Vec<WorkloadResult>,
    /// Share of the machine's CPU time (all CPUs, %) that the hypervisor took from t0 to the
    /// end (`clock::StealMeter`); `None` where not reported or the run never started.
    pub cpu_steal_pct: Option<f64>,
    /// Why streaming the records to `jobs/*.csv` stopped, if it did (a full disk): the records
    /// are all in `workloads` all the same.
    pub jobs_stream_error: Option<String>,
}

/// A progress snapshot for the caller's progress bar.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    pub jobs_done: u64,
    /// `None` when a closed-loop workload makes the total unknowable.
    pub jobs_expected: Option<u64>,
    pub elapsed_s: f64,
    /// Scheduled length of the run (s), when known.
    pub planned_s: Option<f64>,
}

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error(transparent)]
    Model(#[from] exec::ExecError),
    #[error("workload `{workload}`: {source}")]
    Cpu {
        workload: String,
        source: affinity::AffinityError,
    },
    #[error("cannot find the isolane executable to start worker processes: {0}")]
    WorkerExe(std::io::Error),
    #[error(transparent)]
    Records(#[from] crate::limits::RecordsTooLarge),
    #[error("cannot create the per-job CSV files in {}/jobs: {source}", dir.display())]
    JobsFiles {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot create the criticality guard's shared file: {0}")]
    Guard(std::io::Error),
}

impl PlanError {
    /// A user's mistake (exit code 2) rather than a missing capability.
    pub fn is_user_error(&self) -> bool {
        matches!(
            self,
            PlanError::Model(exec::ExecError::BadModel { .. })
                | PlanError::Cpu { .. }
                | PlanError::Records(_)
        )
    }
}

/// Everything that can be checked before a run creates output: models (and that a batch of
/// their activations fits this machine), CPU cores, and the memory the job records will take.
pub fn preflight(plan: &RunPlan, engine: Option<&dyn EngineExecutors>) -> Result<(), PlanError> {
    if let Some(memory) = crate::limits::host_memory_bytes() {
        crate::limits::check_records(&record_demands(plan), memory)?;
    }
    for w in &plan.workloads {
        if w.spec.program.is_none() {
            exec::check_model(engine, &w.spec.device(&plan.device), &w.spec)?;
        }
        affinity::check_cores(&w.spec.cpu).map_err(|source| PlanError::Cpu {
            workload: w.spec.name.clone(),
            source,
        })?;
    }
    Ok(())
}

/// What each workload of `plan` keeps in memory, named in the scenario's terms.
pub fn record_demands(plan: &RunPlan) -> Vec<crate::limits::RecordDemand> {
    plan.workloads
        .iter()
        .map(|w| {
            let (jobs, source) = match w.schedule.expected_jobs() {
                Some(n) => (Some(n), count_source(&w.spec)),
                None => (
                    closed_loop_spin_jobs(w),
                    "duration_s / the spin time, closed loop".into(),
                ),
            };
            crate::limits::RecordDemand {
                workload: w.spec.name.clone(),
                jobs,
                warmup_jobs: w.spec.warmup_jobs,
                source,
            }
        })
        .collect()
}

/// Which settings make a workload's job count, in the scenario's words.
fn count_source(spec: &WorkloadSpec) -> String {
    match (spec.length, spec.ramp) {
        (_, Some(_)) => "the ramp's steps × step_s × rate".into(),
        (isolane_core::spec::RunLength::Jobs(_), _) => "jobs".into(),
        (isolane_core::spec::RunLength::DurationS(_), _) => "rate_hz × duration_s".into(),
    }
}

/// The most jobs a closed-loop `spin:` workload with a duration can run: one per shortest
/// service time (`time − jitter`). `None` for other models, whose service time is known only
/// once they run, and for a jitter that allows 0.
fn closed_loop_spin_jobs(w: &WorkloadPlan) -> Option<u64> {
    let spin = exec::parse_spin_model(&w.spec.model)?.ok()?;
    let shortest = spin.service_ns - spin.jitter_ns;
    let duration = w.schedule.duration_ns()?;
    (shortest > 0).then(|| (duration / shortest) as u64 + 1)
}

enum GateState {
    Waiting,
    Go(i64),
    Abort,
}

/// The start barrier: every workload reports ready (or failed) after its warm-up; then the
/// coordinator opens the gate with the common t0.
struct Gate {
    state: Mutex<GateState>,
    cv: Condvar,
}

impl Gate {
    fn open(&self, s: GateState) {
        if let Ok(mut g) = self.state.lock() {
            *g = s;
        }
        self.cv.notify_all();
    }

    /// `Some(t0)` or `None` when aborted.
    fn wait(&self) -> Option<i64> {
        let mut g = self.state.lock().ok()?;
        loop {
            match *g {
                GateState::Go(t0) => return Some(t0),
                GateState::Abort => return None,
                GateState::Waiting => g = self.cv.wait(g).ok()?,
            }
        }
    }
}

struct Shared {
    gate: Gate,
    /// Jobs done so far, by plan slot.
    done: Vec<AtomicU64>,
    /// What the session's instances are built with: the engine, the guard, the stop flag and
    /// the turn that lets one instance build and warm up at a time.
    instances: Arc<Instances>,
    /// Raised to stop releasing (Ctrl-C in a run, the drain in a server); the released
    /// workloads keep what they measured.
    stop: Arc<AtomicBool>,
}

/// Readiness report of one workload to the coordinator.
enum Report {
    Ready,
    Failed,
}

/// Reports a workload to the barrier exactly once: `ready()` after its warm-up, or, if the
/// driver returns (or panics) before that, `Failed` on drop, so the barrier never waits for a
/// workload that is gone.
struct Reporter {
    tx: mpsc::Sender<Report>,
    sent: bool,
}

impl Reporter {
    fn ready(&mut self) {
        let _ = self.tx.send(Report::Ready);
        self.sent = true;
    }
}

impl Drop for Reporter {
    fn drop(&mut self) {
        if !self.sent {
            let _ = self.tx.send(Report::Failed);
        }
    }
}

/// A driver thread: the workload's result and when it ended (ns, monotonic clock).
type Driver = std::io::Result<std::thread::JoinHandle<(WorkloadResult, i64)>>;

/// The fixed-rate side of a session, as a handle: some workloads of a plan, each released on
/// its own schedule by its host (a thread that builds its instance through the session's
/// [`Instances`] and runs the release loop, an `isolane worker` process that does the same,
/// or a command workload's program), from one t0, under the session's guard, its records
/// streamed as they are measured. `isolane run` (and every study) releases all of a plan's
/// workloads through it ([`run`]); `isolane serve` the ones named by `--release`, beside the
/// models it serves from the same [`Instances`] (isolane-serve's `Server`). One
/// implementation of releasing, failure isolation (a workload that fails ends alone),
/// stopping and collecting records for both.
///
/// Its life: [`Releasing::start`] (the hosts begin to build and warm up, one at a time),
/// [`Releasing::wait_ready`] (the start barrier), [`Releasing::go`] (the common t0, or none:
/// abort), then [`Releasing::finish`] once the schedules ended or the stop flag was raised.
pub struct Releasing {
    shared: Arc<Shared>,
    /// Each released workload's plan slot, name and driver.
    drivers: Vec<(usize, String, Driver)>,
    reports: mpsc::Receiver<Report>,
    stream: Option<JobsStream>,
    t0: Option<i64>,
    opened: bool,
}

/// What [`Releasing::wait_ready`] saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Barrier {
    /// Workloads warm and waiting for t0.
    pub ready: usize,
    /// Workloads whose host failed before it was ready (see their results).
    pub failed: usize,
    /// The stop flag was raised before every workload had reported.
    pub stopped: bool,
}

/// What the released workloads ran, once they have all ended.
pub struct Finished {
    /// In the order of the slots given to [`Releasing::start`].
    pub workloads: Vec<WorkloadResult>,
    /// When the last of them ended (ns, monotonic clock; `i64::MIN` when none started).
    pub end_ns: i64,
    /// Why streaming the records stopped, if it did ([`RunResult::jobs_stream_error`]).
    pub jobs_stream_error: Option<String>,
}

impl Releasing {
    /// Starts a host for each of `plan`'s workloads in `slots` (plan slots, ascending), built
    /// through `instances` (made from the same plan). Records stream to `opts.jobs_dir`'s
    /// jobs/ and `opts.observer` by plan slot; the release loops stop at `opts.stop`.
    pub fn start(
        plan: &RunPlan,
        slots: &[usize],
        instances: Arc<Instances>,
        opts: &RunOptions,
    ) -> Result<Releasing, PlanError> {
        let hosts_processes = slots
            .iter()
            .filter_map(|&s| plan.workloads.get(s))
            .any(|w| w.spec.host == Host::Process && w.spec.program.is_none());
        let worker_exe = if hosts_processes {
            Some(
                match (&opts.worker_exe, std::env::var_os("ISOLANE_WORKER_EXE")) {
                    (Some(p), _) => p.clone(),
                    (None, Some(p)) => PathBuf::from(p),
                    (None, None) => std::env::current_exe().map_err(PlanError::WorkerExe)?,
                },
            )
        } else {
            None
        };
        let shared = Arc::new(Shared {
            gate: Gate {
                state: Mutex::new(GateState::Waiting),
                cv: Condvar::new(),
            },
            done: plan.workloads.iter().map(|_| AtomicU64::new(0)).collect(),
            instances,
            stop: Arc::clone(&opts.stop),
        });
        // Records flow to the writer thread when files or an observer want them.
        let stream = if opts.jobs_dir.is_some() || opts.observer.is_some() {
            let names: Vec<String> = plan.workloads.iter().map(|w| w.spec.name.clone()).collect();
            let dir = opts.jobs_dir.as_deref();
            Some(
                JobsStream::start(dir, &names, opts.observer.clone()).map_err(|source| {
                    PlanError::JobsFiles {
                        dir: dir.map(PathBuf::from).unwrap_or_default(),
                        source,
                    }
                })?,
            )
        } else {
            None
        };
        let (tx, reports) = mpsc::channel::<Report>();
        let mut drivers = Vec::with_capacity(slots.len());
        for &slot in slots {
            let Some(w) = plan.workloads.get(slot) else {
                continue;
            };
            let w = w.clone();
            let shared = Arc::clone(&shared);
            let mut reporter = Reporter {
                tx: tx.clone(),
                sent: false,
            };
            let exe = worker_exe.clone();
            let name = w.spec.name.clone();
            let env = opts.worker_env.get(&name).cloned().unwrap_or_default();
            let hook = opts.on_worker_start.clone();
            let out = stream.as_ref().map(|s| s.sender(slot));
            let program_dir = opts.programs_dir.clone().or_else(|| opts.jobs_dir.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("isolane:{}", truncate(&name, 8)))
                .spawn(move || {
                    let result = match (&w.spec.program, w.spec.host, exe) {
                        (Some(program), _, _) => {
                            let launch = ProgramHost {
                                env: &env,
                                hook: hook.as_ref(),
                                out_dir: program_dir.as_deref(),
                            };
                            drive_program(&w, program, &shared, &mut reporter, &launch)
                        }
                        (None, Host::Process, Some(exe)) => {
                            let launch = WorkerLaunch {
                                exe: &exe,
                                env: &env,
                                hook: hook.as_ref(),
                            };
                            drive_process(slot, &w, &shared, &mut reporter, &launch, out)
                        }
                        _ => drive_thread(slot, &w, &shared, &mut reporter, out),
                    };
                    // However the workload ended (a worker killed, a model that failed to
                    // build before it ever published a job), best effort must stop leaving
                    // room for it.
                    shared.instances.guard_done(slot);
                    // When this workload ended: the run's wall time is the latest of these,
                    // not the moment the coordinator's polling noticed.
                    (result, clock::now_ns())
                });
            drivers.push((slot, name, spawned));
        }
        Ok(Releasing {
            shared,
            drivers,
            reports,
            stream,
            t0: None,
            opened: false,
        })
    }

    /// The start barrier: waits until every workload is warm (or has failed), or the stop
    /// flag is raised first.
    pub fn wait_ready(&self) -> Barrier {
        let mut b = Barrier {
            ready: 0,
            failed: 0,
            stopped: false,
        };
        // A thread that could not be spawned dropped its reporter, which reported it failed.
        while b.ready + b.failed < self.drivers.len() {
            match self.reports.recv_timeout(Duration::from_millis(20)) {
                Ok(Report::Ready) => b.ready += 1,
                Ok(Report::Failed) => b.failed += 1,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if self.shared.stop.load(Ordering::Relaxed) {
                        b.stopped = true;
                        break;
                    }
                }
                // Every driver has ended.
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        b
    }

    /// Opens the barrier: every warm workload releases its schedule from `t0` (ns, monotonic
    /// clock); `None` aborts them. Only the first call counts.
    pub fn go(&mut self, t0: Option<i64>) {
        if self.opened {
            return;
        }
        self.opened = true;
        self.t0 = t0;
        self.shared.gate.open(match t0 {
            Some(t0) => GateState::Go(t0),
            None => GateState::Abort,
        });
    }

    /// The common t0, once [`Releasing::go`] gave one.
    pub fn t0(&self) -> Option<i64> {
        self.t0
    }

    /// Whether any released workload is still going.
    pub fn running(&self) -> bool {
        self.drivers
            .iter()
            .any(|(_, _, h)| h.as_ref().is_ok_and(|h| !h.is_finished()))
    }

    /// Jobs the released workloads have done so far.
    pub fn jobs_done(&self) -> u64 {
        self.shared
            .done
            .iter()
            .map(|d| d.load(Ordering::Relaxed))
            .sum()
    }

    /// Waits for every released workload to end (the gate is opened with none if it was not
    /// yet: they stop before t0) and collects what each ran.
    pub fn finish(mut self) -> Finished {
        self.go(None);
        let mut end = i64::MIN;
        let mut workloads = Vec::with_capacity(self.drivers.len());
        for (_, name, h) in self.drivers.drain(..) {
            let result = match h {
                Ok(h) => match h.join() {
                    Ok((r, ended)) => {
                        end = end.max(ended);
                        r
                    }
                    Err(_) => failed(
                        &name,
                        Failure::msg("the workload's thread panicked"),
                        Vec::new(),
                    ),
                },
                Err(e) => failed(
                    &name,
                    Failure::msg(format!("cannot start a thread: {e}")),
                    Vec::new(),
                ),
            };
            workloads.push(result);
        }
        let jobs_stream_error = self.stream.take().and_then(|s| s.finish().err());
        Finished {
            workloads,
            end_ns: end,
            jobs_stream_error,
        }
    }
}

/// Runs a plan to the end (or until `opts.stop`), calling `progress` about ten times a second:
/// a session whose every workload is released ([`Releasing`]).
pub fn run(
    plan: &RunPlan,
    opts: &RunOptions,
    progress: &mut dyn FnMut(&Progress),
) -> Result<RunResult, PlanError> {
    let instances = Instances::new(plan, opts.engine.clone(), Arc::clone(&opts.stop))
        .map_err(PlanError::Guard)?;
    let every: Vec<usize> = (0..plan.workloads.len()).collect();
    let mut releasing = Releasing::start(plan, &every, Arc::new(instances), opts)?;
    let barrier = releasing.wait_ready();
    let steal = clock::StealMeter::start();
    let t0 = if barrier.stopped || barrier.ready == 0 {
        None
    } else {
        // Bounded by validation (1 hour); saturating all the same.
        let delay_ns = (plan.timing.start_delay_ms as i64).saturating_mul(1_000_000);
        Some(clock::now_ns().saturating_add(delay_ns))
    };
    releasing.go(t0);

    let expected: Option<u64> = plan
        .workloads
        .iter()
        .map(|w| w.schedule.expected_jobs())
        .sum::<Option<u64>>();
    // A program counts with its duration, if it has one (it may run to completion at any time).
    let planned_s = plan
        .workloads
        .iter()
        .map(|w| match &w.spec.program {
            Some(p) => Some(p.duration_s.map_or(0, isolane_core::schedule::secs_to_ns)),
            None => w.schedule.duration_ns(),
        })
        .collect::<Option<Vec<i64>>>()
        .map(|v| v.into_iter().max().unwrap_or(0) as f64 / 1e9);
    while releasing.running() {
        std::thread::sleep(Duration::from_millis(100));
        let p = Progress {
            jobs_done: releasing.jobs_done(),
            jobs_expected: expected,
            elapsed_s: t0.map_or(0.0, |t0| (clock::now_ns() - t0).max(0) as f64 / 1e9),
            planned_s,
        };
        progress(&p);
    }
    let finished = releasing.finish();
    let wall_s = match t0 {
        Some(t0) if finished.end_ns > t0 => (finished.end_ns - t0) as f64 / 1e9,
        _ => 0.0,
    };
    // Read after the workloads ended (a little past `end`): the interval is the run's, to
    // within the start delay and the join's few ms.
    let cpu_steal_pct = t0.and(steal.pct());
    Ok(RunResult {
        t0_ns: t0,
        wall_s,
        interrupted: opts.stop.load(Ordering::Relaxed),
        workloads: finished.workloads,
        cpu_steal_pct,
        jobs_stream_error: finished.jobs_stream_error,
    })
}

impl WorkloadResult {
    /// A workload that ran no job (yet), with `status`.
    fn nothing_run(name: &str, status: WorkloadStatus) -> WorkloadResult {
        WorkloadResult {
            name: name.to_string(),
            status,
            records: Vec::new(),
            warmup_ns: Vec::new(),
            pid: None,
            device_memory_mib: None,
            pieces: None,
            cpu: None,
            program: None,
        }
    }
}

fn failed(name: &str, f: Failure, records: Vec<JobRecord>) -> WorkloadResult {
    WorkloadResult {
        records,
        ..WorkloadResult::nothing_run(name, WorkloadStatus::Failed(f))
    }
}

/// A thread-hosted workload: its instance is prepared on this thread through the session's
/// [`Instances`], then driven by its fixed-rate schedule from the common t0.
fn drive_thread(
    slot: usize,
    w: &WorkloadPlan,
    shared: &Shared,
    reporter: &mut Reporter,
    out: Option<BatchSender>,
) -> WorkloadResult {
    let name = &w.spec.name;
    let check = |warmup: &[i64]| check_closed_loop_records(w, warmup);
    let how = How {
        warmup_jobs: w.spec.warmup_jobs,
        pin: true,
        guard: GuardPart::Full,
        build: None,
        check: Some(&check),
    };
    let prepared = shared
        .instances
        .prepare(slot, &w.spec, w.index, w.partition.take(), how)
        .map_err(|e| {
            let out_of_memory = matches!(
                &e,
                PrepareError::Build(x) | PrepareError::WarmUp(x) if x.is_out_of_memory()
            );
            let message = match e {
                PrepareError::Pin(e) => format!("workload `{name}`: {e}"),
                PrepareError::Guard(e) => {
                    format!("workload `{name}`: cannot join the criticality guard: {e}")
                }
                e => e.to_string(),
            };
            Failure {
                out_of_memory,
                ..Failure::msg(message)
            }
        });
    let (mut executor, warmup, mut role) = match prepared {
        Ok(p) => (p.executor, p.warmup_ns, p.role),
        Err(f) => return failed(name, f, Vec::new()),
    };
    reporter.ready();
    let mut result = WorkloadResult {
        name: name.clone(),
        status: WorkloadStatus::Interrupted,
        records: Vec::new(),
        warmup_ns: warmup,
        pid: None,
        device_memory_mib: executor.device_memory_mib(),
        pieces: matches!(role, GuardRole::BestEffort(_)).then(|| executor.pieces()),
        cpu: None,
        program: None,
    };
    let Some(t0) = shared.gate.wait() else {
        return result;
    };
    let hint = mean(&result.warmup_ns);
    let mut sink = StreamingSink::new(
        capacity_for(&w.schedule, hint),
        Some(&shared.done[slot]),
        out,
    );
    let spin_ns = shared.instances.timing().spin_us as i64 * 1000;
    let cpu_at_t0 = ThreadCpu::now();
    let end = run_loop_guarded(
        executor.as_mut(),
        &w.schedule,
        t0,
        spin_ns,
        &shared.stop,
        &mut sink,
        &mut role,
    );
    result.cpu = cpu_at_t0.and_then(|a| Some(ThreadCpu::now()?.since(&a)));
    // A critical workload that is done frees best effort from leaving room for it.
    drop(role);
    sink.flush();
    result.records = sink.records;
    result.status = match end {
        Ok(LoopEnd::Completed) => WorkloadStatus::Ok,
        Ok(LoopEnd::Interrupted) => WorkloadStatus::Interrupted,
        Err(e) => WorkloadStatus::Failed(Failure::msg(e.to_string())),
    };
    result
}

/// A closed-loop workload with a duration has no job count ahead (preflight checks only
/// `spin:` models): once its warm-up has measured the service time, the records it would keep
/// are estimated and checked against this machine's memory before t0, so that a run that would
/// end in an out-of-memory abort stops at once with a reason.
fn check_closed_loop_records(w: &WorkloadPlan, warmup_ns: &[i64]) -> Result<(), String> {
    if w.schedule.expected_jobs().is_some() {
        return Ok(());
    }
    let (Some(duration), Some(service), Some(memory)) = (
        w.schedule.duration_ns(),
        mean(warmup_ns),
        crate::limits::host_memory_bytes(),
    ) else {
        return Ok(());
    };
    let demand = crate::limits::RecordDemand {
        workload: w.spec.name.clone(),
        jobs: Some((duration / service.max(1)) as u64),
        warmup_jobs: 0,
        source: format!(
            "duration_s / the mean warm-up time of {:.3} ms, closed loop",
            service as f64 / 1e6
        ),
    };
    crate::limits::check_records(&[demand], memory).map_err(|e| e.to_string())
}

fn mean(v: &[i64]) -> Option<i64> {
    if v.is_empty() {
        None
    } else {
        Some(v.iter().sum::<i64>() / v.len() as i64)
    }
}

/// Where a command workload's program gets its partition and writes its output.
struct ProgramHost<'a> {
    /// The partition's environment (MPS client settings, a MIG binding).
    env: &'a [(String, String)],
    hook: Option<&'a WorkerStartHook>,
    /// The run's folder: `<workload>.stdout` and `.stderr` go there.
    out_dir: Option<&'a std::path::Path>,
}

/// A command workload (crate::program): ready at once (a program has no warm-up), started at
/// t0, watched to its end; its failure is the workload's, the others run on.
fn drive_program(
    w: &WorkloadPlan,
    program: &ProgramSpec,
    shared: &Shared,
    reporter: &mut Reporter,
    host: &ProgramHost<'_>,
) -> WorkloadResult {
    let name = &w.spec.name;
    reporter.ready();
    let mut result = WorkloadResult::nothing_run(name, WorkloadStatus::Interrupted);
    let Some(t0) = shared.gate.wait() else {
        return result;
    };
    let stop = &shared.stop;
    if !clock::wait_until_ns(t0, 0, stop) {
        return result;
    }
    let launch = ProgramLaunch {
        name,
        spec: program,
        cpu: &w.spec.cpu,
        partition_env: host.env,
        out_dir: host.out_dir,
    };
    let on_start = |pid: u32| {
        if let Some(hook) = host.hook {
            hook(name, pid);
        }
    };
    let outcome = run_program(&launch, t0, stop, &on_start);
    result.pid = outcome.pids.first().copied();
    result.status = match (outcome.end, outcome.failure(program)) {
        (ProgramEnd::Interrupted, _) => WorkloadStatus::Interrupted,
        (_, None) => WorkloadStatus::Ok,
        (_, Some(message)) => WorkloadStatus::Failed(Failure {
            message: match outcome.stderr_tail(500) {
                Some(tail) => format!("{message}; stderr: {tail}"),
                None => message,
            },
            exit_code: outcome.exit_code,
            signal: outcome.signal,
            out_of_memory: false,
        }),
    };
    result.program = Some(outcome);
    result
}

fn send_line(stdin: &mut ChildStdin, msg: &ToWorker) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(msg).map_err(std::io::Error::other)?;
    line.push(b'\n');
    stdin.write_all(&line)?;
    stdin.flush()
}

/// A worker process's stderr, kept (last 4 KiB) to explain a failure.
fn collect_stderr(mut child_stderr: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        while let Ok(n) = child_stderr.read(&mut chunk) {
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
            if buf.len() > 8192 {
                buf.drain(..buf.len() - 4096);
            }
        }
        String::from_utf8_lossy(&buf).trim().to_string()
    })
}

/// How to start one worker process.
struct WorkerLaunch<'a> {
    exe: &'a std::path::Path,
    env: &'a [(String, String)],
    hook: Option<&'a WorkerStartHook>,
}

/// Drives one worker process through the protocol. Never blocks the barrier: any failure before
/// `ready` drops the sender by returning.
fn drive_process(
    slot: usize,
    w: &WorkloadPlan,
    shared: &Shared,
    reporter: &mut Reporter,
    launch: &WorkerLaunch<'_>,
    csv: Option<BatchSender>,
) -> WorkloadResult {
    let name = &w.spec.name;
    let exe = launch.exe;
    // Its own process group: a terminal's Ctrl-C reaches only the coordinator, which then stops
    // the workers through the protocol, so they still report their last records. A `kill -9`
    // of the coordinator runs none of its clean-up: the kernel ends the worker then. This
    // thread waits for the worker (`finish`), so it outlives it as PDEATHSIG needs.
    let args = ["worker", "--workload", name.as_str()];
    let mut cmd = crate::worker_client::worker_process(exe, &args, launch.env);
    // Kept (its tail) to explain a failure.
    cmd.stderr(Stdio::piped());
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            return failed(
                name,
                Failure::msg(format!("cannot start worker `{}`: {e}", exe.display())),
                Vec::new(),
            )
        }
    };
    let pid = child.id();
    if let Some(hook) = launch.hook {
        hook(name, pid);
    }
    let (Some(mut stdin), Some(stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        let _ = child.kill();
        let _ = child.wait();
        return failed(name, Failure::msg("worker pipes missing"), Vec::new());
    };
    let stderr = collect_stderr(stderr);
    let mut out = BufReader::new(stdout);
    let mut result = WorkloadResult {
        name: name.clone(),
        status: WorkloadStatus::Interrupted,
        records: Vec::new(),
        warmup_ns: Vec::new(),
        pid: Some(pid),
        device_memory_mib: None,
        pieces: None,
        cpu: None,
        program: None,
    };
    let mut error: Option<String> = None;
    let mut done: Option<DoneStatus> = None;

    // Handshake and warm-up.
    let setup = (|| -> Result<(), String> {
        let line = read_line(&mut out).ok_or("the worker closed its output before saying hello")?;
        check_version(&line, "worker").map_err(|e| e.to_string())?;
        // The worker builds and warms up between this set-up and its answer.
        let _turn = shared.instances.turn();
        send_line(
            &mut stdin,
            &ToWorker::Setup {
                protocol_version: crate::protocol::PROTOCOL_VERSION,
                index: w.index,
                workload: Box::new(w.spec.clone()),
                device: Box::new(w.spec.device(shared.instances.device())),
                timing: shared.instances.timing().clone(),
                schedule: Box::new(w.schedule.clone()),
                guard: shared.instances.guard_setup(slot).cloned(),
            },
        )
        .map_err(|e| format!("cannot send the set-up to the worker: {e}"))?;
        let line = read_line(&mut out).ok_or("the worker ended during set-up or warm-up")?;
        match serde_json::from_str::<FromWorker>(&line) {
            Ok(FromWorker::Ready { warmup_ns, pieces }) => {
                result.warmup_ns = warmup_ns;
                result.pieces = pieces;
                check_closed_loop_records(w, &result.warmup_ns)
            }
            Ok(FromWorker::Error { message }) => Err(message),
            Ok(_) => Err("unexpected message from the worker during set-up".into()),
            Err(e) => Err(format!("malformed message from the worker: {e}")),
        }
    })();
    if let Err(e) = setup {
        error = Some(e);
    } else {
        reporter.ready();
        match shared.gate.wait() {
            None => {
                let _ = send_line(&mut stdin, &ToWorker::Abort);
            }
            Some(t0) => {
                if let Err(e) = send_line(&mut stdin, &ToWorker::Start { t0_ns: t0 }) {
                    error = Some(format!("cannot send start to the worker: {e}"));
                }
                let expected = w.schedule.expected_jobs().unwrap_or(0);
                result.records.reserve(expected.min(8_000_000) as usize);
                let finished = Arc::new(AtomicBool::new(false));
                let watcher =
                    spawn_stop_watcher(stdin, Arc::clone(&shared.stop), Arc::clone(&finished));
                while let Some(line) = read_line(&mut out) {
                    match serde_json::from_str::<FromWorker>(&line) {
                        Ok(FromWorker::Jobs { records }) => {
                            shared.done[slot].fetch_add(records.len() as u64, Ordering::Relaxed);
                            let first = result.records.len();
                            result
                                .records
                                .extend(records.into_iter().map(record_from_wire));
                            // This thread only reads the pipe: the worker's loop is elsewhere.
                            if let Some(csv) = &csv {
                                csv.send(&result.records[first..]);
                            }
                        }
                        Ok(FromWorker::Done { status, cpu }) => {
                            done = Some(status);
                            result.cpu = cpu;
                        }
                        Ok(FromWorker::Error { message }) => error = Some(message),
                        Ok(_) => {}
                        // A torn last line from a killed worker: the complete ones are kept.
                        Err(_) => {}
                    }
                }
                finished.store(true, Ordering::Relaxed);
                let _ = watcher.join();
                return finish(result, child, stderr, done, error);
            }
        }
    }
    drop(stdin);
    // Drain what is left so the worker never blocks on a full pipe. A worker told to abort
    // (the run stopped while it warmed up) answers that it was interrupted: without its
    // answer it read as failed ("exited without finishing its run").
    while let Some(line) = read_line(&mut out) {
        match serde_json::from_str::<FromWorker>(&line) {
            Ok(FromWorker::Error { message }) => {
                error.get_or_insert(message);
            }
            Ok(FromWorker::Done { status, cpu }) => {
                done = Some(status);
                result.cpu = cpu;
            }
            _ => {}
        }
    }
    finish(result, child, stderr, done, error)
}

fn spawn_stop_watcher(
    mut stdin: ChildStdin,
    stop: Arc<AtomicBool>,
    finished: Arc<AtomicBool>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || loop {
        if finished.load(Ordering::Relaxed) {
            return;
        }
        if stop.load(Ordering::Relaxed) {
            let _ = send_line(&mut stdin, &ToWorker::Stop);
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    })
}

fn read_line(r: &mut impl BufRead) -> Option<String> {
    let mut line = String::new();
    match r.read_line(&mut line) {
        Ok(0) | Err(_) => None,
        Ok(_) => Some(line),
    }
}

fn finish(
    mut result: WorkloadResult,
    mut child: Child,
    stderr: std::thread::JoinHandle<String>,
    done: Option<DoneStatus>,
    error: Option<String>,
) -> WorkloadResult {
    let status = child.wait();
    let stderr = stderr.join().unwrap_or_default();
    result.status = match (status, done, error) {
        (Ok(st), Some(d), None) if st.success() => match d {
            DoneStatus::Ok => WorkloadStatus::Ok,
            DoneStatus::Interrupted => WorkloadStatus::Interrupted,
        },
        (Ok(st), _, error) => {
            let mut f = Failure {
                message: String::new(),
                exit_code: st.code(),
                signal: st.signal(),
                out_of_memory: false,
            };
            f.message = match (st.signal(), st.code(), error) {
                (Some(sig), _, _) => {
                    format!("worker killed by signal {sig} ({})", signal_name(sig))
                }
                (_, _, Some(e)) => e,
                (_, Some(0), None) => "the worker exited without finishing its run".into(),
                (_, Some(c), None) => format!("worker exited with status {c}"),
                (None, None, None) => "the worker ended for an unknown reason".into(),
            };
            if !stderr.is_empty() && f.signal.is_none() {
                f.message = format!("{}; stderr: {}", f.message, truncate(&stderr, 500));
            }
            WorkloadStatus::Failed(f)
        }
        (Err(e), _, _) => {
            WorkloadStatus::Failed(Failure::msg(format!("cannot wait for the worker: {e}")))
        }
    };
    result
}

pub fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGTERM => "SIGTERM",
        _ => "signal",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(pins: &[(&str, bool, &[usize])]) -> RunPlan {
        let body: String = pins
            .iter()
            .map(|(name, be, cpu)| {
                format!(
                    "[[workload]]\nname = \"{name}\"\nmodel = \"spin:1ms\"\nrate_hz = 10\n\
                     jobs = 1\ncpu = {cpu:?}\n{}\n",
                    if *be {
                        "criticality = \"best_effort\""
                    } else {
                        ""
                    }
                )
            })
            .collect();
        let s = isolane_core::spec::Scenario::from_toml_str(
            &format!("[device]\nbackend = \"cpu\"\n\n{body}"),
            "t.toml",
            &Vec::<String>::new(),
        )
        .unwrap();
        RunPlan::from_scenario(&s)
    }

    /// Issue 34's levers parsed and validated but reached no guard: the policy was built from
    /// the margin and stretch alone.
    #[test]
    fn the_guard_takes_the_scenarios_levers_and_the_gpus_share_model() {
        let s = isolane_core::spec::Scenario::from_toml_str(
            "[device]\nbackend = \"cpu\"\n\n[protection]\nmargin_us = 300\n\
             slack_order = true\nshare = true\n\n[[workload]]\nname = \"c\"\n\
             model = \"spin:1ms\"\nrate_hz = 10\njobs = 1\n\n[[workload]]\nname = \"b\"\n\
             model = \"spin:1ms\"\nrate_hz = 10\njobs = 1\ncriticality = \"best_effort\"\n",
            "t.toml",
            &Vec::<String>::new(),
        )
        .unwrap();
        let mut p = RunPlan::from_scenario(&s);
        let policy = |p: &RunPlan| p.guard().unwrap().unwrap().0.policy();
        assert!(policy(&p).slack_order);
        assert_eq!(policy(&p).margin_ns, 300_000);
        // No model fitted (the CPU): `share` has nothing to price by.
        assert_eq!(policy(&p).share, None);
        let fitted = ShareModel {
            dram: 1.5,
            l2: 0.25,
            dram_bytes_per_s: 4.8e12,
            l2_bytes: 50 << 20,
        };
        p.share = Some(fitted);
        assert_eq!(policy(&p).share, Some(fitted));
        // Without `share = true` the fitted model is not used.
        p.protection.share = false;
        assert_eq!(policy(&p).share, None);
    }

    /// A server releases some of its plan's workloads: only those slots get a host, their
    /// records stream by plan slot, and nothing runs before `go`. (Both critical: a
    /// best-effort one would be held for a critical slot that no one drives here, where a
    /// server's served model publishes through its queue.)
    #[test]
    fn releasing_some_slots_runs_only_those_from_the_t0_given() {
        struct Seen(Mutex<Vec<(usize, usize)>>);
        impl RecordObserver for Seen {
            fn records(&self, slot: usize, records: &[JobRecord]) {
                self.0.lock().unwrap().push((slot, records.len()));
            }
        }
        let p = plan(&[("served", false, &[]), ("tick", false, &[])]);
        let stop = Arc::new(AtomicBool::new(false));
        let instances = Arc::new(Instances::new(&p, None, Arc::clone(&stop)).unwrap());
        let seen = Arc::new(Seen(Mutex::new(Vec::new())));
        let mut opts = RunOptions::new(stop);
        opts.observer = Some(Arc::clone(&seen) as Arc<dyn RecordObserver>);
        let mut r = Releasing::start(&p, &[1], instances, &opts).unwrap();
        let b = r.wait_ready();
        assert_eq!((b.ready, b.failed, b.stopped), (1, 0, false));
        assert_eq!(r.jobs_done(), 0);
        let t0 = clock::now_ns() + 1_000_000;
        r.go(Some(t0));
        assert_eq!(r.t0(), Some(t0));
        let done = r.finish();
        assert_eq!(done.workloads.len(), 1);
        let tick = &done.workloads[0];
        assert_eq!(tick.name, "tick");
        assert_eq!(tick.status, WorkloadStatus::Ok);
        assert_eq!(tick.records.len(), 1);
        assert!(done.end_ns > t0);
        assert_eq!(*seen.0.lock().unwrap(), [(1, 1)]);
    }

    /// Finished before `go`: the hosts are aborted at the barrier, nothing released.
    #[test]
    fn a_releasing_finished_before_go_releases_nothing() {
        let p = plan(&[("tick", false, &[])]);
        let stop = Arc::new(AtomicBool::new(false));
        let instances = Arc::new(Instances::new(&p, None, Arc::clone(&stop)).unwrap());
        let r = Releasing::start(&p, &[0], instances, &RunOptions::new(stop)).unwrap();
        assert_eq!(r.wait_ready().ready, 1);
        let done = r.finish();
        assert_eq!(done.workloads[0].status, WorkloadStatus::Interrupted);
        assert!(done.workloads[0].records.is_empty());
    }

    #[test]
    fn best_effort_polls_only_on_a_core_of_its_own() {
        // Pinned onto the critical workload's core: its polls would preempt it.
        let p = plan(&[("c", false, &[0]), ("b", true, &[0])]);
        assert_eq!(p.hold_wait(&p.workloads[1].spec, 16), HoldWait::Sleep);
        // Pinned elsewhere: polls.
        let p = plan(&[("c", false, &[0]), ("b", true, &[1])]);
        assert_eq!(p.hold_wait(&p.workloads[1].spec, 16), HoldWait::Poll);
        // Unpinned: polls only where the machine has a core for every workload and more.
        let p = plan(&[("c", false, &[]), ("b", true, &[])]);
        assert_eq!(p.hold_wait(&p.workloads[1].spec, 16), HoldWait::Poll);
        assert_eq!(p.hold_wait(&p.workloads[1].spec, 2), HoldWait::Sleep);
    }
}
