//! `isolane serve`'s session from its configuration (docs/serve.md): the plan's models served
//! over HTTP and gRPC until SIGTERM or SIGINT, then drained; `--out`'s records, summary and
//! trace; `--autoplan`'s set-up, loop and decisions. The binary reads the scenario, admits it,
//! turns its flags into a [`ServeConfig`] and calls [`serve`].

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use isolane_core::admission::Plan;
use isolane_core::predict::MemoryProfile;
use isolane_core::spec::{DeviceSpec, Scenario, WorkloadSpec};
use isolane_core::user_error::user;
use isolane_runtime::coordinator::RunPlan;
use isolane_runtime::exec::{check_model, Engine, ExecError};

use crate::autoplan::{Autoplan, AutoplanOptions, CachedProfiles};
use crate::{serve_plan, ServeOptions, Server};

/// What `isolane serve`'s flags ask for.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// The scenario file, as the user named it (in `--autoplan`'s refusals).
    pub scenario_path: PathBuf,
    /// HTTP/REST address (HOST:PORT; port 0: any free one).
    pub http: String,
    /// gRPC address (HOST:PORT; port 0: any free one).
    pub grpc: String,
    /// Where requests are recorded as jobs, and summary.json written when stopped.
    pub out: Option<PathBuf>,
    /// Use `out` even if it is not empty.
    pub force: bool,
    /// Also write `out`/trace.json when stopped.
    pub trace: bool,
    /// Seconds the requests already taken may take to be answered on SIGTERM/SIGINT.
    pub drain_timeout: f64,
    /// One structured line per request on stderr.
    pub access_log: bool,
    /// Workloads released on their fixed-rate schedules instead of served.
    pub release: Vec<String>,
    /// `--autoplan` and its settings.
    pub autoplan: Option<AutoplanFlags>,
    pub partitions: isolane_session::PartitionChoices,
}

/// `--autoplan`'s settings as given, checked by [`serve`].
#[derive(Debug, Clone)]
pub struct AutoplanFlags {
    pub margin: f64,
    pub load_change: f64,
    /// Seconds.
    pub dwell: f64,
    /// Default: the planner's profile cache.
    pub profile_cache: Option<PathBuf>,
}

/// A workload's memory-system demand on a GPU with `l2_bytes` of L2, from the engine that
/// builds its model (this crate builds none): `--autoplan`'s interference prediction.
pub type MemoryProfileOf<'a> = &'a dyn Fn(&DeviceSpec, &WorkloadSpec, u64) -> Option<MemoryProfile>;

/// `--drain-timeout`, checked before anything else is read.
pub fn check_drain_timeout(seconds: f64) -> Result<(), isolane_core::user_error::UserError> {
    if !(seconds.is_finite() && (0.0..=3600.0).contains(&seconds)) {
        return Err(user(format!(
            "--drain-timeout {seconds}: expected seconds from 0 to 3600"
        )));
    }
    Ok(())
}

/// The user's mistake (exit 2) as this module's errors.
fn user_error(msg: impl std::fmt::Display) -> anyhow::Error {
    user(msg).into()
}

/// A library error whose type tells the user's mistakes (exit 2) apart.
fn blame<E: std::error::Error + Send + Sync + 'static>(e: E, users: bool) -> anyhow::Error {
    if users {
        user_error(e)
    } else {
        anyhow::Error::new(e)
    }
}

/// Serves `scenario` (loaded, validated and admitted: `admitted` on a GPU) as `config` says
/// until SIGTERM or SIGINT, then drains it and writes `--out`'s files; `admission` is asked
/// about every change while serving (`Server::set_admission`: the binary's interference
/// prediction). The exit code: 0, or 1 when requests were abandoned at the drain's end.
pub fn serve(
    scenario: &Scenario,
    admitted: Option<&Plan>,
    config: &ServeConfig,
    engine: &Engine,
    memory_profile: MemoryProfileOf<'_>,
    admission: Option<Arc<dyn isolane_runtime::handle::AdmitChange>>,
) -> anyhow::Result<u8> {
    let plan = RunPlan::from_scenario(scenario);
    let autoplan = match &config.autoplan {
        Some(flags) => Some(autoplan_setup(
            flags,
            &config.scenario_path,
            scenario,
            &plan,
            memory_profile,
        )?),
        None => None,
    };
    for w in plan.workloads.iter().filter(|w| w.spec.program.is_none()) {
        check_model(Some(engine.as_ref()), &w.spec.device(&plan.device), &w.spec)
            .map_err(model_error)?;
    }
    // Bound before anything is built: a port in use is said at once.
    let http = bind("--http", &config.http)?;
    let grpc = bind("--grpc", &config.grpc)?;
    if config.access_log {
        init_access_log();
    }
    // SIGTERM and SIGINT received: the first starts the drain, a second ends it at once (a
    // user's second Ctrl-C), as the drain's timeout would.
    let stop = Arc::new(AtomicUsize::new(0));
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        let count = Arc::clone(&stop);
        // SAFETY: the action only adds to an atomic integer: no lock, no allocation, nothing
        // that is not async-signal-safe.
        unsafe {
            signal_hook::low_level::register(signal, move || {
                count.fetch_add(1, Ordering::SeqCst);
            })
        }
        .map_err(|e| anyhow::anyhow!("cannot handle signal {signal}: {e}"))?;
    }
    let recording = match &config.out {
        Some(dir) => Some(Recording::start(dir, config.force, scenario, &plan)?),
        None => None,
    };
    // The records' t0, which autoplan.csv and the trace's autoplan events count from too.
    let t0 = isolane_runtime::clock::now_ns();
    let options = ServeOptions {
        engine: engine.clone(),
        seed: scenario.timing.seed,
        records: recording.as_ref().map(|r| (r.senders.clone(), t0)),
        released: config.release.clone(),
        programs_dir: recording.as_ref().map(|r| r.out.clone()),
    };
    let decisions = Decisions {
        csv: recording.as_ref().map(|r| r.out.join(AUTOPLAN_CSV)),
        t0,
        kept: Arc::default(),
    };
    let kept = Arc::clone(&decisions.kept);
    let grace = Duration::from_secs_f64(config.drain_timeout);
    let served = serve_plan(
        &plan,
        admitted,
        config.partitions,
        &options,
        grace,
        |server| {
            server.set_admission(admission);
            front_ends(server, (http, grpc), &stop, grace, autoplan, decisions)
        },
    );
    let (fronts, drained, released) = served.map_err(|e| {
        let users = e.is_user_error();
        blame(e, users)
    })?;
    // The model threads have ended: only these senders keep the jobs writer going.
    drop(options);
    fronts?;
    eprintln!(
        "isolane serve: stopped; {} requests answered during the drain, {} abandoned",
        drained.answered, drained.abandoned
    );
    for run in &released {
        eprintln!("isolane serve: {}", released_line(run));
    }
    if let Some(r) = recording {
        let kept = kept.lock().unwrap_or_else(|p| p.into_inner());
        r.finish(&plan, config.trace, &kept, (&released, t0))?;
    }
    Ok(if drained.abandoned == 0 { 0 } else { 1 })
}

/// What a released workload ran, in one line: its jobs, completed, late, p99 (the run's
/// metrics, `isolane_core::metrics`); a program's end, exit code and time.
fn released_line(run: &crate::ReleasedRun) -> String {
    if let Some(p) = &run.program {
        let how = match (p.exit_code, p.signal, &p.error) {
            (_, _, Some(e)) => e.clone(),
            (Some(code), _, _) => format!("exit code {code}"),
            (_, Some(sig), _) => format!(
                "signal {sig} ({})",
                isolane_runtime::coordinator::signal_name(sig)
            ),
            _ => "no exit status".into(),
        };
        let end = match &run.end {
            Ok(isolane_runtime::release::LoopEnd::Completed) => "completed".to_string(),
            Ok(_) => "stopped by the drain".to_string(),
            Err(e) => format!("failed: {e}"),
        };
        return format!(
            "released `{}`: program {}, {how}, after {:.3} s ({end})",
            run.name,
            p.end.words(),
            p.wall_s()
        );
    }
    let m = isolane_core::metrics::workload_metrics(&run.records, 1, 0.0, None);
    let p99 = m
        .latency_ms
        .p99
        .map_or("-".to_string(), |ms| format!("{ms:.3} ms"));
    let end = match &run.end {
        Ok(isolane_runtime::release::LoopEnd::Completed) => "completed".to_string(),
        Ok(_) => "stopped by the drain".to_string(),
        Err(e) => format!("failed: {e}"),
    };
    format!(
        "released `{}`: {} jobs, {} completed, {} late, p99 {p99} ({end})",
        run.name, m.jobs, m.completed, m.timeouts
    )
}

/// `--out DIR`: the folder, its scenario.toml, and the jobs writer the models' records go to.
struct Recording {
    out: PathBuf,
    stream: isolane_runtime::jobs_stream::JobsStream,
    senders: Vec<isolane_runtime::jobs_stream::BatchSender>,
}

impl Recording {
    fn start(
        dir: &Path,
        force: bool,
        scenario: &Scenario,
        plan: &RunPlan,
    ) -> anyhow::Result<Recording> {
        use anyhow::Context as _;
        let toml = scenario
            .to_toml_string()
            .context("writing the resolved scenario")?;
        let out = isolane_runtime::output::prepare_out_dir(Some(dir), force, Path::new("."))
            .map_err(|e| {
                let users = e.is_user_error();
                blame(e, users)
            })?;
        isolane_runtime::output::write_atomic(&out.join("scenario.toml"), toml.as_bytes())?;
        let names: Vec<String> = plan.workloads.iter().map(|w| w.spec.name.clone()).collect();
        let stream = isolane_runtime::jobs_stream::JobsStream::start(Some(&out), &names, None)
            .with_context(|| format!("{}: cannot create jobs/", out.display()))?;
        let senders = (0..names.len()).map(|i| stream.sender(i)).collect();
        Ok(Recording {
            out,
            stream,
            senders,
        })
    }

    /// Waits for the last records, then writes summary.json and workloads.csv from them (and
    /// trace.json).
    fn finish(
        self,
        plan: &RunPlan,
        trace: bool,
        decisions: &[(f64, crate::autoplan::Event)],
        (released, t0): (&[crate::ReleasedRun], i64),
    ) -> anyhow::Result<()> {
        use isolane_core::results::{workloads_csv, RunStatus, WORKLOADS_CSV};
        drop(self.senders);
        if let Err(e) = self.stream.finish() {
            eprintln!("warning: the request records could not all be written: {e}");
        }
        // A malformed record is the user's (exit 2), as for `isolane summarize`.
        let (mut summary, notes) =
            isolane_session::rebuild::folder_summary(&self.out, plan, "serve").map_err(user)?;
        for n in notes {
            eprintln!("note: {n}");
        }
        // A released program's outcome (it has no records): how it ended, its times.
        for (w, s) in plan.workloads.iter().zip(summary.workloads.iter_mut()) {
            let (Some(program), Some(run)) = (
                &w.spec.program,
                released.iter().find(|r| r.name == w.spec.name),
            ) else {
                continue;
            };
            *s = isolane_runtime::results::summarize_program(
                &w.spec,
                program,
                &released_result(run),
                Some(t0),
            );
        }
        // A server has no planned number of jobs: stopped by its signal, it is complete.
        summary.complete = true;
        summary.interrupted = false;
        summary.status = RunStatus::Ok;
        for w in &mut summary.workloads {
            if w.status == RunStatus::Interrupted {
                w.status = RunStatus::Ok;
            }
        }
        isolane_runtime::output::write_atomic(
            &self.out.join(WORKLOADS_CSV),
            workloads_csv(&summary).as_bytes(),
        )?;
        isolane_core::results::write_json(&self.out.join("summary.json"), &summary)?;
        if trace {
            let path = self.out.join("trace.json");
            let t = isolane_trace::write_trace(&self.out, &path, None).map_err(|e| {
                let users = e.is_user_error();
                blame(e, users)
            })?;
            println!("{}", isolane_trace::written_line(&t, &path));
            if !decisions.is_empty() {
                trace_decisions(&path, decisions)?;
            }
        }
        eprintln!("isolane serve: requests recorded in {}", self.out.display());
        Ok(())
    }
}

/// A released workload's run as the runtime's summary code takes it.
fn released_result(run: &crate::ReleasedRun) -> isolane_runtime::coordinator::WorkloadResult {
    use isolane_runtime::coordinator::{Failure, WorkloadStatus};
    let status = match &run.end {
        Ok(isolane_runtime::release::LoopEnd::Completed) => WorkloadStatus::Ok,
        Ok(_) => WorkloadStatus::Interrupted,
        Err(message) => WorkloadStatus::Failed(Failure {
            message: message.clone(),
            exit_code: run.program.as_ref().and_then(|p| p.exit_code),
            signal: run.program.as_ref().and_then(|p| p.signal),
            out_of_memory: false,
        }),
    };
    isolane_runtime::coordinator::WorkloadResult {
        name: run.name.clone(),
        status,
        records: run.records.clone(),
        warmup_ns: run.warmup_ns.clone(),
        pid: run.program.as_ref().and_then(|p| p.pids.first().copied()),
        device_memory_mib: None,
        pieces: None,
        cpu: None,
        program: run.program.clone(),
    }
}

fn model_error(e: ExecError) -> anyhow::Error {
    match e {
        ExecError::BadModel { .. } => user_error(e),
        e => anyhow::anyhow!(e),
    }
}

fn bind(flag: &str, addr: &str) -> anyhow::Result<std::net::TcpListener> {
    use std::net::ToSocketAddrs;
    let resolved: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|_| {
            user_error(format!(
                "{flag} `{addr}`: expected HOST:PORT, e.g. 127.0.0.1:8000 (port 0: any free one)"
            ))
        })?
        .collect();
    let listener = std::net::TcpListener::bind(&resolved[..])
        .map_err(|e| user(format!("{flag} {addr}: cannot listen there: {e}")))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| anyhow::anyhow!("{flag} {addr}: {e}"))?;
    Ok(listener)
}

/// One structured line per request on stderr (`ISOLANE_LOG` filters, default info).
fn init_access_log() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("ISOLANE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
}

/// Serves HTTP and gRPC until the first stop signal (`stop` counts them), then drains `server`
/// (no new requests, those taken answered; a second signal ends the drain at once) before the
/// front ends stop, so that every answer reaches its client.
fn front_ends(
    server: &Server,
    (http, grpc): (std::net::TcpListener, std::net::TcpListener),
    stop: &AtomicUsize,
    grace: Duration,
    autoplan: Option<Autoplan>,
    decisions: Decisions,
) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("isolane-serve-io")
        .enable_io()
        .enable_time()
        .build()
        .map_err(|e| anyhow::anyhow!("starting the server's runtime: {e}"))?;
    let (http, grpc) = {
        let _in = runtime.enter();
        (
            tokio::net::TcpListener::from_std(http)?,
            tokio::net::TcpListener::from_std(grpc)?,
        )
    };
    let (http_addr, grpc_addr) = (http.local_addr()?, grpc.local_addr()?);
    let (done, stopped) = tokio::sync::watch::channel(false);
    let until = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|d| *d).await;
    };
    let http_task = runtime.spawn(crate::http::serve_http(
        server.clone(),
        http,
        until(stopped.clone()),
    ));
    let grpc_task = runtime.spawn(crate::grpc::serve_grpc(
        server.clone(),
        grpc,
        until(stopped.clone()),
    ));
    for w in server.warnings() {
        eprintln!(
            "{}",
            isolane_core::text::wrap_message(
                &format!("warning: {w}"),
                isolane_core::text::ERROR_WIDTH
            )
        );
    }
    let models: Vec<String> = server
        .models()
        .map(|m| {
            let criticality = m.criticality.name().replace('_', " ");
            format!("{} ({}, {criticality})", m.name, m.partition)
        })
        .collect();
    println!(
        "isolane serve: ready; HTTP on {http_addr}, gRPC on {grpc_addr}; models: {}",
        models.join(", ")
    );
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    let autoplan_stop = Arc::new(AtomicBool::new(false));
    let autoplan_thread = match autoplan {
        Some(a) => Some(spawn_autoplan(server, a, &autoplan_stop, decisions)?),
        None => None,
    };
    while stop.load(Ordering::SeqCst) == 0 {
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!("isolane serve: stopping; no new requests, answering those taken");
    // The loop ends first: no change starts while the server drains.
    autoplan_stop.store(true, Ordering::Relaxed);
    if let Some(t) = autoplan_thread {
        if t.join().is_err() {
            eprintln!("isolane serve: the autoplan loop ended with a panic");
        }
    }
    let said = AtomicBool::new(false);
    server.drain_until(grace, || {
        let cut = stop.load(Ordering::SeqCst) > 1;
        if cut && !said.swap(true, Ordering::Relaxed) {
            eprintln!(
                "isolane serve: a second stop signal: ending the drain now (queued requests are \
                 dropped; jobs running finish)"
            );
        }
        cut
    });
    let _ = done.send(true);
    runtime.block_on(async {
        let _ = http_task.await;
        if let Ok(Err(e)) = grpc_task.await {
            eprintln!("isolane serve: the gRPC front end stopped with an error: {e}");
        }
    });
    Ok(())
}

/// `--out`'s file of autoplan decisions, one row each (docs/serve.md, "Autoplan").
const AUTOPLAN_CSV: &str = "autoplan.csv";

/// Where autoplan's decisions go besides the log and the metrics: `--out`'s autoplan.csv
/// (`t_ms` since `t0`, `reason`, `action`, `why`, `what`), and kept for the trace.
struct Decisions {
    csv: Option<PathBuf>,
    /// ns on the monotonic clock: the request records' t0.
    t0: i64,
    /// (ms since t0, the decision).
    kept: Arc<std::sync::Mutex<Vec<(f64, crate::autoplan::Event)>>>,
}

/// Each decision as an instant on a track `autoplan` of the trace's `run` process, at its time
/// since t0 (`otherData.t0_us` places t0 in the trace).
fn trace_decisions(path: &Path, decisions: &[(f64, crate::autoplan::Event)]) -> anyhow::Result<()> {
    use anyhow::Context as _;
    // The `run` process of isolane-trace's trace (pid 2); its tracks 1 and 2 are the
    // partitions and the isolation steps.
    const PID_RUN: u32 = 2;
    const TID_AUTOPLAN: u32 = 3;
    let text = std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
    let mut doc: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{}", path.display()))?;
    let t0_us = doc["otherData"]["t0_us"].as_f64().unwrap_or(0.0);
    let Some(events) = doc["traceEvents"].as_array_mut() else {
        anyhow::bail!("{}: no traceEvents", path.display());
    };
    events.push(serde_json::json!({
        "name": "thread_name", "ph": "M", "pid": PID_RUN, "tid": TID_AUTOPLAN,
        "args": {"name": "autoplan"},
    }));
    for (t_ms, e) in decisions {
        events.push(serde_json::json!({
            "name": format!("autoplan: {}", e.action),
            "cat": "autoplan",
            "ph": "i",
            "s": "t",
            "ts": ((t0_us + t_ms * 1e3) * 1e3).round() / 1e3,
            "pid": PID_RUN,
            "tid": TID_AUTOPLAN,
            "args": {"reason": e.reason, "why": e.why, "what": e.what},
        }));
    }
    isolane_runtime::output::write_atomic(path, serde_json::to_string(&doc)?.as_bytes())?;
    Ok(())
}

/// The autoplan loop on a thread of its own; its decisions also go to `decisions`.
fn spawn_autoplan(
    server: &Server,
    autoplan: Autoplan,
    stop: &Arc<AtomicBool>,
    decisions: Decisions,
) -> anyhow::Result<std::thread::JoinHandle<()>> {
    use std::io::Write as _;
    let mut file = match &decisions.csv {
        Some(p) => {
            let mut f = std::fs::File::create(p)
                .map_err(|e| anyhow::anyhow!("{}: cannot create it: {e}", p.display()))?;
            writeln!(f, "t_ms,reason,action,why,what")?;
            Some(f)
        }
        None => None,
    };
    let (server, stop) = (server.clone(), Arc::clone(stop));
    std::thread::Builder::new()
        .name("serve-autoplan".into())
        .spawn(move || {
            server.autoplan(autoplan, &stop, |e| {
                let t_ms = (e.at_ns - decisions.t0) as f64 / 1e6;
                decisions
                    .kept
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((t_ms, e.clone()));
                if let Some(f) = file.as_mut() {
                    let row = format!(
                        "{t_ms:.3},{},{},{},{}",
                        e.reason,
                        e.action,
                        csv_cell(&e.why),
                        csv_cell(&e.what)
                    );
                    if let Err(err) = writeln!(f, "{row}").and_then(|_| f.flush()) {
                        eprintln!("warning: {AUTOPLAN_CSV}: {err}");
                    }
                }
            })
        })
        .map_err(|e| anyhow::anyhow!("cannot start the autoplan loop: {e}"))
}

/// A CSV cell: quoted, with its quotes doubled.
fn csv_cell(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

/// What `--autoplan` plans with: the flags checked, each model's profile key, the ladder of
/// the partitions (cores, green SMs, MPS thread %) and, on a GPU with fitted coefficients,
/// the interference prediction. A model whose partition cannot be resized live is refused by
/// name (exit 2).
fn autoplan_setup(
    flags: &AutoplanFlags,
    scenario_path: &Path,
    scenario: &Scenario,
    plan: &RunPlan,
    memory_profile: MemoryProfileOf<'_>,
) -> anyhow::Result<Autoplan> {
    use isolane_core::spec::{Backend, Mechanism, Rate};
    use isolane_planner::{Ladder, Unit};
    let fraction = |flag: &str, v: f64, max: f64| {
        if v.is_finite() && v > 0.0 && v <= max {
            Ok(v)
        } else {
            Err(user(format!(
                "{flag} {v}: expected a fraction above 0, at most {max}"
            )))
        }
    };
    let margin = fraction("--autoplan-margin", flags.margin, 1.0)?;
    let load_change = fraction("--autoplan-load-change", flags.load_change, 100.0)?;
    if !(flags.dwell.is_finite() && (0.0..=3600.0).contains(&flags.dwell)) {
        return Err(user_error(format!(
            "--autoplan-dwell {}: expected seconds from 0 to 3600",
            flags.dwell
        )));
    }
    let backend = scenario.device.backend;
    let mechanism = match backend {
        Backend::Cpu => Mechanism::None,
        Backend::Cuda => scenario.device.mechanism,
    };
    for w in &plan.workloads {
        let spec = &w.spec;
        let own = spec.device(&plan.device).backend;
        if own != backend {
            // One ladder is planned: cores, or the GPU's SMs or thread shares.
            return Err(user_error(format!(
                "{}: workload `{}` runs on the {} and the scenario's device is the {}: \
                 --autoplan plans one kind of partition, all models on the CPU or all on the GPU",
                scenario_path.display(),
                spec.name,
                backend_word(own),
                backend_word(backend)
            )));
        }
        let movable = match (own, mechanism) {
            (Backend::Cpu, _) => !spec.cpu.is_empty(),
            (Backend::Cuda, Mechanism::Green) => spec.partition.sms.is_some(),
            (Backend::Cuda, Mechanism::Mps) => spec.partition.thread_pct.is_some(),
            _ => false,
        };
        if !movable {
            return Err(user_error(format!(
                "{}: workload `{}`: --autoplan resizes partitions it can plan: a CPU model's \
                 cores (cpu = [...]), a green context's SMs (partition.sms) or an MPS client's \
                 thread % (partition.thread_pct); this one has none of them (mechanism {})",
                scenario_path.display(),
                spec.name,
                mechanism.name()
            )));
        }
    }
    let cache = isolane_planner::ProfileCache::new(
        flags
            .profile_cache
            .clone()
            .unwrap_or_else(isolane_planner::ProfileCache::default_dir),
    );
    let (ladder, gpu, driver, interference) = match backend {
        Backend::Cpu => {
            let n = isolane_runtime::affinity::available_cores().len() as u32;
            let ladder = Ladder {
                unit: Unit::Cores,
                sizes: (1..=n).collect(),
                capacity: n,
                device_memory_mib: None,
                mig: None,
            };
            (
                ladder,
                isolane_planner::cpu_name(),
                "none".to_string(),
                None,
            )
        }
        Backend::Cuda => {
            let devices = isolane_gpu::devices::list_devices()
                .map_err(|e| anyhow::anyhow!("--autoplan: the GPUs: {e}"))?;
            let d = devices
                .into_iter()
                .find(|d| d.index == scenario.device.gpu)
                .ok_or_else(|| {
                    user(format!(
                        "device.gpu = {}: no such GPU here",
                        scenario.device.gpu
                    ))
                })?;
            let model = isolane_gpu::devices::model_for(
                &d.name,
                d.sm_count,
                d.memory_mib,
                d.compute_capability,
            );
            let ladder = match mechanism {
                Mechanism::Green => {
                    let r = model.green_rules().ok_or_else(|| {
                        user(format!("--autoplan: {} has no green contexts", model.name))
                    })?;
                    let mut l = Ladder::green(model.sm_count, r.min_sms, r.step_sms);
                    // As plan --auto: several green contexts hold what one split gives.
                    if let Some((unit, groups)) = model.green_split_limit() {
                        if plan.workloads.len() > 1 {
                            l.capacity = l.capacity.min(unit * groups);
                        }
                    }
                    l
                }
                _ => Ladder::mps(5),
            };
            let interference = match (
                isolane_core::predict::fitted(model.name, mechanism),
                isolane_core::predict::memory_system(model.name),
            ) {
                (Some(f), Some(system)) => Some(crate::autoplan::Interference {
                    memory: plan
                        .workloads
                        .iter()
                        .map(|w| {
                            memory_profile(&w.spec.device(&plan.device), &w.spec, system.l2_bytes)
                        })
                        .collect(),
                    system,
                    fitted: *f,
                }),
                _ => None,
            };
            let driver = d
                .driver_version
                .clone()
                .unwrap_or(d.cuda_driver_version.clone());
            (ladder, d.name.clone(), driver, interference)
        }
    };
    let ids = isolane_planner::auto::workload_ids(scenario);
    let models = plan
        .workloads
        .iter()
        .map(|w| {
            let id = ids.iter().find(|i| i.name == w.spec.name);
            (
                w.spec.name.clone(),
                id.map_or_else(|| w.spec.model.clone(), |i| i.model.clone()),
                w.spec.batch,
                id.map_or_else(String::new, |i| i.precision.clone()),
            )
        })
        .collect();
    Ok(Autoplan {
        options: AutoplanOptions {
            margin,
            load_change,
            dwell: Duration::from_secs_f64(flags.dwell),
            ..AutoplanOptions::default()
        },
        profiles: CachedProfiles {
            cache,
            gpu,
            driver,
            mechanism: mechanism.name().to_string(),
            models,
            ladder: ladder.clone(),
        },
        ladder,
        planned_hz: plan
            .workloads
            .iter()
            .map(|w| match w.spec.rate {
                Rate::Hz(hz) => hz,
                _ => 0.0,
            })
            .collect(),
        interference,
    })
}

fn backend_word(b: isolane_core::spec::Backend) -> &'static str {
    match b {
        isolane_core::spec::Backend::Cpu => "CPU",
        isolane_core::spec::Backend::Cuda => "GPU",
    }
}
