//! `isolane serve SCENARIO`: the scenario's workloads as models served over the KServe v2 /
//! Triton protocol until SIGTERM or SIGINT (docs/serve.md). Flags → configuration; the
//! session is `isolane_serve`'s.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use isolane_runtime::coordinator::RunPlan;
use isolane_runtime::exec::{check_model, Engine, ExecError};
use isolane_serve::autoplan::{Autoplan, AutoplanOptions, CachedProfiles};
use isolane_serve::{serve_plan, ServeOptions, Server};

use super::user;

#[derive(Args)]
#[command(
    about = "Serve a scenario's models over the KServe v2 / Triton protocol (HTTP and gRPC)",
    long_about = "Loads every workload of SCENARIO into its partition, keeps it warm and serves \
                  it under the workload's name over the KServe v2 / Triton inference protocol \
                  until SIGTERM or SIGINT: HTTP/REST (with the binary tensor data extension and \
                  GET /metrics) and gRPC. A request may carry its own deadline (parameter \
                  `deadline_ms`; default the workload's): one predicted to complete late is \
                  refused at once (HTTP 429, gRPC RESOURCE_EXHAUSTED), one that completes late \
                  is answered with `late = true`. Critical models are protected from best-effort \
                  ones by the guard; best-effort ones batch their queued requests \
                  ([workload.serve], docs/serve.md). On SIGTERM or SIGINT it stops taking \
                  requests, answers those it took, and exits 0."
)]
pub struct ServeArgs {
    /// Scenario file (TOML): its workloads are the models served.
    pub scenario: PathBuf,
    /// HTTP/REST address (HOST:PORT; port 0: any free one).
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:8000")]
    pub http: String,
    /// gRPC address (HOST:PORT; port 0: any free one).
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:8001")]
    pub grpc: String,
    /// `cpu` serves the workloads on the CPU backend whatever the scenario's [device] says
    /// (as `run --backend cpu`).
    #[arg(long, value_parser = ["cpu", "cuda"])]
    pub backend: Option<String>,
    /// Record every request taken as a job of its model in DIR/jobs/<model>.csv while serving
    /// (released at its arrival; late counts as a timeout), and write DIR/summary.json and
    /// workloads.csv when stopped, as `run` does (`isolane trace DIR` shows the requests).
    #[arg(long, short = 'o', value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Use --out even if it is not empty, replacing isolane's own files in it.
    #[arg(long, requires = "out")]
    pub force: bool,
    /// Also write DIR/trace.json when stopped, the requests' timeline for ui.perfetto.dev.
    #[arg(long, requires = "out")]
    pub trace: bool,
    /// On SIGTERM/SIGINT, how long the requests already taken may take to be answered.
    #[arg(long, value_name = "SECONDS", default_value_t = 30.0)]
    pub drain_timeout: f64,
    /// No access log lines (one per request on stderr otherwise; ISOLANE_LOG filters them as
    /// RUST_LOG does, e.g. ISOLANE_LOG=warn).
    #[arg(long)]
    pub no_access_log: bool,
    /// Release this workload of the scenario on its own fixed-rate schedule (rate_hz,
    /// duration_s, deadline_ms, as `run` releases it) beside the served models instead of
    /// serving it; repeatable. Its jobs go to --out's jobs/ like the requests', and a line
    /// per workload says what it ran when serve stops.
    #[arg(long = "release", value_name = "WORKLOAD")]
    pub release: Vec<String>,
    /// Re-plan the partitions while serving: when a critical model's p99 passes the margin
    /// or a model's request rate moves past --autoplan-load-change, plan again with the
    /// planner from the profiles in --profile-cache (measuring nothing) and resize the models
    /// live (CPU cores, green SMs, MPS thread %). A critical model is never shrunk.
    #[arg(long)]
    pub autoplan: bool,
    /// The planner's margin: a predicted tail holds within this fraction of the deadline, and
    /// a critical model's measured p99 past it triggers a re-plan.
    #[arg(
        long,
        value_name = "FRACTION",
        default_value_t = 0.9,
        requires = "autoplan"
    )]
    pub autoplan_margin: f64,
    /// A model's request rate this fraction away from the rate it was planned for (0.5: ±50 %)
    /// triggers a re-plan.
    #[arg(
        long,
        value_name = "FRACTION",
        default_value_t = 0.5,
        requires = "autoplan"
    )]
    pub autoplan_load_change: f64,
    /// At least this long between two re-plans (and from the start to the first).
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 10.0,
        requires = "autoplan"
    )]
    pub autoplan_dwell: f64,
    /// Where --autoplan reads the profiles it plans from (`isolane plan --auto`'s cache;
    /// default as there: $XDG_CACHE_HOME/isolane/profiles or ~/.cache/isolane/profiles).
    #[arg(long, value_name = "DIR", requires = "autoplan")]
    pub profile_cache: Option<PathBuf>,
    #[command(flatten)]
    pub partitions: super::PartitionFlags,
}

pub fn run(args: ServeArgs, engine: &Engine) -> anyhow::Result<u8> {
    if !(args.drain_timeout.is_finite() && (0.0..=3600.0).contains(&args.drain_timeout)) {
        return Err(user(format!(
            "--drain-timeout {}: expected seconds from 0 to 3600",
            args.drain_timeout
        )));
    }
    let file = super::ScenarioFile::read(&args.scenario)?;
    let (mut scenario, name) = file.scenario()?;
    if !file.apps()?.is_empty() {
        return Err(user(format!(
            "{}: [[app]]s are not served yet; serve takes a scenario of [[workload]]s",
            args.scenario.display()
        )));
    }
    if let Some(backend) = args.backend.as_deref() {
        super::run::override_backend(&mut scenario, &name, backend)?;
    }
    if super::run::needs_gpu(&scenario) {
        if let Some(why) = super::gpu_missing_reason() {
            return Err(super::run::no_gpu_for(&scenario, &name, &why));
        }
    }
    let admitted = super::admit_or_refuse(&scenario, &name)?;
    // As `run` does: a critical deadline predicted to miss beside its neighbours is said (or
    // refused) before any model is built ([protection] admission).
    super::foresee::foresee_or_refuse(&scenario, &name)?;
    let plan = RunPlan::from_scenario(&scenario);
    let autoplan = match args.autoplan {
        true => Some(autoplan_setup(&args, &scenario, &plan)?),
        false => None,
    };
    for w in &plan.workloads {
        check_model(Some(engine.as_ref()), &w.spec.device(&plan.device), &w.spec)
            .map_err(model_error)?;
    }
    // Bound before anything is built: a port in use is said at once.
    let http = bind("--http", &args.http)?;
    let grpc = bind("--grpc", &args.grpc)?;
    if !args.no_access_log {
        init_access_log();
    }
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(signal, Arc::clone(&stop))
            .map_err(|e| anyhow::anyhow!("cannot handle signal {signal}: {e}"))?;
    }
    let recording = match &args.out {
        Some(dir) => Some(Recording::start(dir, args.force, &scenario, &plan)?),
        None => None,
    };
    // The records' t0, which autoplan.csv and the trace's autoplan events count from too.
    let t0 = isolane_runtime::clock::now_ns();
    let options = ServeOptions {
        engine: engine.clone(),
        seed: scenario.timing.seed,
        records: recording.as_ref().map(|r| (r.senders.clone(), t0)),
        released: args.release.clone(),
    };
    let decisions = Decisions {
        csv: recording.as_ref().map(|r| r.out.join(AUTOPLAN_CSV)),
        t0,
        kept: Arc::default(),
    };
    let kept = Arc::clone(&decisions.kept);
    let grace = Duration::from_secs_f64(args.drain_timeout);
    let served = serve_plan(
        &plan,
        admitted.as_ref(),
        args.partitions.choices(),
        &options,
        grace,
        |server| front_ends(server, (http, grpc), &stop, grace, autoplan, decisions),
    );
    let (fronts, drained, released) = served.map_err(|e| {
        if e.is_user_error() {
            user(e)
        } else {
            anyhow::anyhow!(e)
        }
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
        r.finish(&plan, args.trace, &kept)?;
    }
    Ok(if drained.abandoned == 0 { 0 } else { 1 })
}

/// What a released workload ran, in one line: its jobs, completed, late, p99 (the run's
/// metrics, `isolane_core::metrics`).
fn released_line(run: &isolane_serve::ReleasedRun) -> String {
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
        dir: &std::path::Path,
        force: bool,
        scenario: &isolane_core::spec::Scenario,
        plan: &RunPlan,
    ) -> anyhow::Result<Recording> {
        use anyhow::Context as _;
        let toml = scenario
            .to_toml_string()
            .context("writing the resolved scenario")?;
        let out = super::run::prepare_out(Some(dir), force)?;
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
        decisions: &[(f64, isolane_serve::autoplan::Event)],
    ) -> anyhow::Result<()> {
        use isolane_core::results::{workloads_csv, RunStatus, WORKLOADS_CSV};
        drop(self.senders);
        if let Err(e) = self.stream.finish() {
            eprintln!("warning: the request records could not all be written: {e}");
        }
        let (mut summary, notes) = super::summarize::folder_summary(&self.out, plan, "serve")?;
        for n in notes {
            eprintln!("note: {n}");
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
            super::trace::write(&self.out, &path)?;
            if !decisions.is_empty() {
                trace_decisions(&path, decisions)?;
            }
        }
        eprintln!("isolane serve: requests recorded in {}", self.out.display());
        Ok(())
    }
}

fn model_error(e: ExecError) -> anyhow::Error {
    match e {
        ExecError::BadModel { .. } => user(e),
        e => anyhow::anyhow!(e),
    }
}

fn bind(flag: &str, addr: &str) -> anyhow::Result<std::net::TcpListener> {
    use std::net::ToSocketAddrs;
    let resolved: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|_| {
            user(format!(
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

/// Serves HTTP and gRPC until `stop` is raised, then drains `server` (no new requests, those
/// taken answered) before the front ends stop, so that every answer reaches its client.
fn front_ends(
    server: &Server,
    (http, grpc): (std::net::TcpListener, std::net::TcpListener),
    stop: &AtomicBool,
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
    let http_task = runtime.spawn(isolane_serve::http::serve_http(
        server.clone(),
        http,
        until(stopped.clone()),
    ));
    let grpc_task = runtime.spawn(isolane_serve::grpc::serve_grpc(
        server.clone(),
        grpc,
        until(stopped.clone()),
    ));
    for w in server.warnings() {
        eprintln!(
            "{}",
            super::wrap_message(&format!("warning: {w}"), super::ERROR_WIDTH)
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
    while !stop.load(Ordering::Relaxed) {
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
    server.drain(grace);
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
    kept: Arc<std::sync::Mutex<Vec<(f64, isolane_serve::autoplan::Event)>>>,
}

/// Each decision as an instant on a track `autoplan` of the trace's `run` process, at its time
/// since t0 (`otherData.t0_us` places t0 in the trace).
fn trace_decisions(
    path: &std::path::Path,
    decisions: &[(f64, isolane_serve::autoplan::Event)],
) -> anyhow::Result<()> {
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
    args: &ServeArgs,
    scenario: &isolane_core::spec::Scenario,
    plan: &RunPlan,
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
    let margin = fraction("--autoplan-margin", args.autoplan_margin, 1.0)?;
    let load_change = fraction("--autoplan-load-change", args.autoplan_load_change, 100.0)?;
    if !(args.autoplan_dwell.is_finite() && (0.0..=3600.0).contains(&args.autoplan_dwell)) {
        return Err(user(format!(
            "--autoplan-dwell {}: expected seconds from 0 to 3600",
            args.autoplan_dwell
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
            return Err(user(format!(
                "{}: workload `{}` runs on the {} and the scenario's device is the {}: \
                 --autoplan plans one kind of partition, all models on the CPU or all on the GPU",
                args.scenario.display(),
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
            return Err(user(format!(
                "{}: workload `{}`: --autoplan resizes partitions it can plan: a CPU model's \
                 cores (cpu = [...]), a green context's SMs (partition.sms) or an MPS client's \
                 thread % (partition.thread_pct); this one has none of them (mechanism {})",
                args.scenario.display(),
                spec.name,
                mechanism.name()
            )));
        }
    }
    let cache = isolane_planner::ProfileCache::new(
        args.profile_cache
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
                (Some(f), Some(system)) => Some(isolane_serve::autoplan::Interference {
                    memory: plan
                        .workloads
                        .iter()
                        .map(|w| {
                            isolane_executors::engine::memory_profile(
                                &w.spec.device(&plan.device),
                                &w.spec,
                                system.l2_bytes,
                            )
                        })
                        .collect(),
                    system,
                    coefficients: f.coefficients,
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
            dwell: Duration::from_secs_f64(args.autoplan_dwell),
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
