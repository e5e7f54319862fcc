//! The worker side of every child process isolane starts: the hidden `isolane worker`
//! subcommand runs [`run_worker`] with its stdin/stdout. The coordinator's first message
//! says the role: a workload of a run (`setup`), `verify`'s probe agent (`probe`,
//! [`crate::probe_role`]), `maxrate`'s search in an MPS client (`maxrate`) or an `[[app]]` of
//! a run (`app`, [`crate::app_role`]). See
//! [`crate::protocol`] for the messages.

use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use isolane_core::spec::{DeviceSpec, TimingSpec, WorkloadSpec};
use isolane_core::JobRecord;

use crate::exec::EngineExecutors;
use crate::guard::{GuardRole, GuardSetup};
use crate::maxrate::{SearchError, SearchRequest};
use crate::probe_role::ProbeFactory;
use crate::protocol::{check_version, DoneStatus, FromWorker, ToWorker, PROTOCOL_VERSION};
use crate::release::{run_loop_guarded, warm_up, LoopEnd, RecordSink};
use crate::schedule::Schedule;
use crate::thread_cpu::ThreadCpu;
use crate::{affinity, clock, exec};

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("i/o on the coordinator pipe: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Protocol(#[from] crate::protocol::ProtocolError),
    #[error("the coordinator closed the pipe before {0}")]
    Closed(&'static str),
    #[error("{0}")]
    Setup(String),
    #[error(transparent)]
    Exec(#[from] exec::ExecError),
    #[error(transparent)]
    Search(#[from] SearchError),
}

/// What a worker process can do beyond `spin:` models, passed in by the binary (no registry):
/// the engine builds workloads' and searches' models, the probe factory serves the probe role.
#[derive(Clone, Copy, Default)]
pub struct WorkerRoles<'a> {
    pub engine: Option<&'a dyn EngineExecutors>,
    pub probes: Option<&'a dyn ProbeFactory>,
    /// Runs an `[[app]]` of a scenario (`isolane-app`, through the binary).
    pub apps: Option<&'a dyn crate::app_role::AppRunner>,
}

/// Records are streamed in chunks: flushed while the loop waits for a release, or when the
/// chunk is 5 ms old or 256 records long (overload, no idle time). A worker that dies loses at
/// most its unflushed chunk, i.e. the jobs of its last few milliseconds.
const MAX_PENDING: usize = 256;
const MAX_AGE_NS: i64 = 5_000_000;

struct PipeSink<W: Write> {
    out: W,
    buf: Vec<u8>,
    pending: usize,
    last_flush_ns: i64,
    stop: Arc<AtomicBool>,
}

impl<W: Write> PipeSink<W> {
    fn flush_chunk(&mut self) {
        if self.pending == 0 {
            return;
        }
        self.buf.extend_from_slice(b"]}\n");
        let ok = self
            .out
            .write_all(&self.buf)
            .and_then(|_| self.out.flush())
            .is_ok();
        self.buf.clear();
        self.pending = 0;
        self.last_flush_ns = clock::now_ns();
        if !ok {
            // Nobody is listening any more: measuring on is pointless.
            self.stop.store(true, Ordering::Relaxed);
        }
    }
}

impl<W: Write> RecordSink for PipeSink<W> {
    fn record(&mut self, r: &JobRecord) {
        // Written by hand into a reused buffer: no allocation per job.
        if self.pending == 0 {
            self.buf.extend_from_slice(br#"{"type":"jobs","records":["#);
        } else {
            self.buf.push(b',');
        }
        let opt = |v: Option<i64>| v.unwrap_or(i64::MIN);
        let (s, e) = (opt(r.start_ns), opt(r.end_ns));
        let _ = write!(self.buf, "[{},{},", r.index, r.release_ns);
        if s == i64::MIN {
            self.buf.extend_from_slice(b"null,null,");
        } else {
            let _ = write!(self.buf, "{s},{e},");
        }
        let _ = write!(self.buf, "{},{}]", r.timeout as u8, r.held_ns);
        self.pending += 1;
        if self.pending >= MAX_PENDING || clock::now_ns() - self.last_flush_ns >= MAX_AGE_NS {
            self.flush_chunk();
        }
    }

    fn idle(&mut self, _until_ns: i64) {
        self.flush_chunk();
    }
}

pub(crate) fn send(out: &mut impl Write, msg: &FromWorker) -> Result<(), WorkerError> {
    let mut line = serde_json::to_vec(msg)
        .map_err(|e| WorkerError::Setup(format!("cannot encode a message: {e}")))?;
    line.push(b'\n');
    out.write_all(&line)?;
    out.flush()?;
    Ok(())
}

pub(crate) fn read_line(
    input: &mut impl BufRead,
    what: &'static str,
) -> Result<String, WorkerError> {
    let mut line = String::new();
    if input.read_line(&mut line)? == 0 {
        return Err(WorkerError::Closed(what));
    }
    Ok(line)
}

/// Plays the role the coordinator gives in its first message on `input`, answering on
/// `output`. `stop` is raised by a SIGINT handler the caller installs, by a `stop` message, or
/// when the coordinator goes away. Returns the process exit code: 0 after a finished or
/// interrupted run, 2 on a protocol version mismatch, 1 on any other failure (reported as an
/// `error` message first). `roles.engine` builds a model that is not `spin:` (`None`: only
/// `spin:` models run); `roles.probes` serves the probe role (`None`: refused).
pub fn run_worker<R, W>(
    input: R,
    mut output: W,
    stop: Arc<AtomicBool>,
    roles: WorkerRoles<'_>,
) -> i32
where
    R: BufRead + Send + 'static,
    W: Write,
{
    match worker_inner(input, &mut output, &stop, roles) {
        Ok((status, cpu)) => match send(&mut output, &FromWorker::Done { status, cpu }) {
            Ok(()) => 0,
            Err(_) => 1,
        },
        Err(e) => {
            let _ = send(
                &mut output,
                &FromWorker::Error {
                    message: e.to_string(),
                },
            );
            match e {
                WorkerError::Protocol(_) => 2,
                // As the CLI's exit codes: the coordinator reads it as the worker's exit status.
                WorkerError::Exec(e) if e.is_out_of_memory() => 3,
                _ => 1,
            }
        }
    }
}

fn worker_inner<R, W>(
    mut input: R,
    output: &mut W,
    stop: &Arc<AtomicBool>,
    roles: WorkerRoles<'_>,
) -> Result<(DoneStatus, Option<ThreadCpu>), WorkerError>
where
    R: BufRead + Send + 'static,
    W: Write,
{
    send(
        output,
        &FromWorker::Hello {
            protocol_version: PROTOCOL_VERSION,
            pid: std::process::id(),
            isolane_version: env!("CARGO_PKG_VERSION").to_string(),
        },
    )?;
    let line = read_line(&mut input, "sending the set-up")?;
    let value = check_version(&line, "coordinator")?;
    let first: ToWorker = serde_json::from_value(value).map_err(|e| {
        WorkerError::Setup(format!(
            "malformed set-up message from the coordinator: {e}"
        ))
    })?;
    match first {
        ToWorker::Setup {
            index,
            workload,
            device,
            timing,
            schedule,
            guard,
            ..
        } => {
            let setup = WorkloadSetup {
                index,
                workload: *workload,
                device: *device,
                timing,
                schedule: *schedule,
                guard,
            };
            run_workload(input, output, stop, roles.engine, setup)
        }
        ToWorker::Probe { gpu, .. } => {
            let probes = roles
                .probes
                .ok_or_else(|| WorkerError::Setup("this worker cannot run the GPU probe".into()))?;
            crate::probe_role::serve(input, output, gpu, probes).map(|s| (s, None))
        }
        ToWorker::Maxrate { search, .. } => {
            run_search(input, output, stop, roles.engine, &search).map(|s| (s, None))
        }
        ToWorker::Exec { setup, .. } => {
            crate::remote_exec::serve(input, output, &setup, roles.engine, stop).map(|s| (s, None))
        }
        ToWorker::App { setup, .. } => {
            let apps = roles
                .apps
                .ok_or_else(|| WorkerError::Setup("this worker cannot run apps".into()))?;
            crate::app_role::serve(input, output, &setup, apps, stop).map(|s| (s, None))
        }
        _ => Err(WorkerError::Setup(
            "expected a role first (a `setup`, `probe`, `maxrate`, `exec` or `app` message)".into(),
        )),
    }
}

/// The workload role's set-up message.
struct WorkloadSetup {
    index: usize,
    workload: WorkloadSpec,
    device: DeviceSpec,
    timing: TimingSpec,
    schedule: Schedule,
    guard: Option<GuardSetup>,
}

/// Role workload: pin, build, warm up, report ready, wait for the start, run the release loop
/// streaming the records, report the end.
fn run_workload<R, W>(
    mut input: R,
    output: &mut W,
    stop: &Arc<AtomicBool>,
    engine: Option<&dyn EngineExecutors>,
    setup: WorkloadSetup,
) -> Result<(DoneStatus, Option<ThreadCpu>), WorkerError>
where
    R: BufRead + Send + 'static,
    W: Write,
{
    let WorkloadSetup {
        index,
        workload,
        device,
        timing,
        schedule,
        guard,
    } = setup;
    affinity::pin_current_thread(&workload.cpu)
        .map_err(|e| WorkerError::Setup(format!("workload `{}`: {e}", workload.name)))?;
    let mut executor = exec::executor_for(engine, &device, &workload, timing.seed, index, None)?;
    let mut warmup = Vec::with_capacity(crate::release::warmup_capacity(workload.warmup_jobs));
    warm_up(executor.as_mut(), workload.warmup_jobs, &mut warmup, stop)?;
    let mut role =
        GuardRole::attach(guard.as_ref(), None, executor.as_mut(), &warmup).map_err(|e| {
            WorkerError::Setup(format!(
                "workload `{}`: cannot join the criticality guard: {e}",
                workload.name
            ))
        })?;
    let pieces = matches!(role, GuardRole::BestEffort(_)).then(|| executor.pieces());
    send(
        output,
        &FromWorker::Ready {
            warmup_ns: warmup,
            pieces,
        },
    )?;

    let line = read_line(&mut input, "starting the run")?;
    let msg: ToWorker = serde_json::from_str(&line)
        .map_err(|e| WorkerError::Setup(format!("malformed start message: {e}")))?;
    let t0_ns = match msg {
        ToWorker::Start { t0_ns } => t0_ns,
        ToWorker::Abort | ToWorker::Stop => return Ok((DoneStatus::Interrupted, None)),
        _ => {
            return Err(WorkerError::Setup(
                "expected `start` or `abort` after the set-up".into(),
            ))
        }
    };

    // From here on the coordinator may only say `stop`; its going away means the same.
    watch_for_stop(input, stop)?;

    let mut sink = PipeSink {
        out: &mut *output,
        buf: Vec::with_capacity(64 * 1024),
        pending: 0,
        last_flush_ns: clock::now_ns(),
        stop: Arc::clone(stop),
    };
    let spin_ns = (timing.spin_us as i64) * 1000;
    let cpu_at_t0 = ThreadCpu::now();
    let end = run_loop_guarded(
        executor.as_mut(),
        &schedule,
        t0_ns,
        spin_ns,
        stop,
        &mut sink,
        &mut role,
    );
    let cpu = cpu_at_t0.and_then(|a| Some(ThreadCpu::now()?.since(&a)));
    drop(role);
    sink.flush_chunk();
    match end? {
        LoopEnd::Completed => Ok((DoneStatus::Ok, cpu)),
        LoopEnd::Interrupted => Ok((DoneStatus::Interrupted, cpu)),
    }
}

/// From here on the coordinator may only say `stop`; its going away means the same. The
/// thread is detached: it ends with the process.
pub(crate) fn watch_for_stop<R>(mut input: R, stop: &Arc<AtomicBool>) -> Result<(), WorkerError>
where
    R: BufRead + Send + 'static,
{
    let stop = Arc::clone(stop);
    std::thread::Builder::new()
        .name("isolane-worker-stdin".into())
        .spawn(move || {
            let mut line = String::new();
            loop {
                line.clear();
                match input.read_line(&mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        if matches!(serde_json::from_str(&line), Ok(ToWorker::Stop)) {
                            break;
                        }
                    }
                }
            }
            stop.store(true, Ordering::Relaxed);
        })?;
    Ok(())
}

/// Role maxrate: build the model in this process (whose partition is its environment, e.g. an
/// MPS client's), run the search with progress messages, and send its outcome.
fn run_search<R, W>(
    input: R,
    output: &mut W,
    stop: &Arc<AtomicBool>,
    engine: Option<&dyn EngineExecutors>,
    request: &SearchRequest,
) -> Result<DoneStatus, WorkerError>
where
    R: BufRead + Send + 'static,
    W: Write,
{
    watch_for_stop(input, stop)?;
    let executor = exec::executor_for(
        engine,
        &request.device,
        &request.workload,
        request.timing.seed,
        0,
        None,
    )?;
    // A progress line that cannot be written means the coordinator is gone: stop searching.
    let searched = crate::maxrate::search(executor, request, Arc::clone(stop), &mut |event| {
        let progress = FromWorker::Progress {
            event: event.clone(),
        };
        if send(output, &progress).is_err() {
            stop.store(true, Ordering::Relaxed);
        }
    });
    match searched {
        Ok(outcome) => {
            send(
                output,
                &FromWorker::MaxrateDone {
                    outcome: Box::new(outcome),
                },
            )?;
            Ok(DoneStatus::Ok)
        }
        Err(SearchError::Interrupted) => Ok(DoneStatus::Interrupted),
        Err(e) => Err(e.into()),
    }
}
