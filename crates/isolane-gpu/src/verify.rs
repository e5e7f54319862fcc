//! `isolane verify`: the proof of isolation is a measurement. For each partition of a
//! scenario, the probe's throughput is measured (a) alone in its partition and (b) while every
//! other partition runs the probe flat out; the report gives the share of the whole GPU each
//! partition achieved (alone ÷ the probe on the whole GPU) and the interference
//! (1 − beside ÷ alone).
//!
//! Partitions are driven by *agents*: a thread per green context (green contexts of one process
//! run concurrently), or a worker process per partition for timeslice, MPS and MIG (separate
//! contexts). Worker processes are the same binary re-executed (`isolane verify --probe-worker`,
//! or a test binary) and speak a line protocol on stdin/stdout, every line of theirs prefixed
//! with [`PROTO`] so that other output is ignored.

use std::io::{BufRead as _, Write as _};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use isolane_core::admission::{admit, AdmissionOptions, ResolvedPartition};
use isolane_core::spec::{Backend, Mechanism, Scenario};

use crate::error::{GpuError, Result};
use crate::green::{GreenGroup, GreenPartitioning};
use crate::mps::{MpsDaemon, MpsOptions};
use crate::probe::{Probe, ProbeConfig, ProbeResult, WholeDevice};

/// Prefix of every protocol line a worker writes.
pub const PROTO: &str = "@isolane ";

/// How long an agent may take beyond the measurement itself before it counts as hung
/// (context creation, NVRTC, PTX JIT).
const SLACK: Duration = Duration::from_secs(120);

/// One partition's probe, wherever it runs.
pub trait ProbeAgent: Send {
    fn label(&self) -> &str;
    /// The probe's throughput over `duration`, alone or beside whatever else runs.
    fn measure(&mut self, duration: Duration) -> Result<ProbeResult>;
    /// Starts running the probe flat out; returns once it runs.
    fn start_saturate(&mut self) -> Result<()>;
    /// Stops [`ProbeAgent::start_saturate`]'s work; returns the number of launches.
    fn stop_saturate(&mut self) -> Result<u64>;
}

// ------------------------------------------------------------------ in-process agent

enum Cmd {
    Measure(Duration),
    Saturate,
    Exit,
}

enum Reply {
    Ready,
    Measured(ProbeResult),
    Saturating,
    Stopped(u64),
    Failed(String),
}

/// A probe on its own thread, in a green context or the primary context.
pub struct ThreadAgent {
    label: String,
    tx: Sender<Cmd>,
    rx: Receiver<Reply>,
    stop: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<()>>,
}

/// Where a thread agent's probe runs.
pub enum ThreadTarget {
    /// A stream of the device's primary context: the whole GPU.
    Whole { device_index: u32 },
    /// A green context's stream.
    Green {
        device_index: u32,
        group: GreenGroup,
    },
}

impl ThreadAgent {
    pub fn spawn(
        label: impl Into<String>,
        target: ThreadTarget,
        config: ProbeConfig,
    ) -> Result<Self> {
        let label = label.into();
        let (tx, cmd_rx) = mpsc::channel::<Cmd>();
        let (reply_tx, rx) = mpsc::channel::<Reply>();
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = Arc::clone(&stop);
        let handle = std::thread::Builder::new()
            .name(format!("probe-{label}"))
            .spawn(move || agent_thread(target, config, cmd_rx, reply_tx, stop2))
            .map_err(|e| GpuError::io("spawning a probe thread", e))?;
        let agent = ThreadAgent {
            label,
            tx,
            rx,
            stop,
            handle: Some(handle),
        };
        match agent.rx.recv_timeout(SLACK) {
            Ok(Reply::Ready) => Ok(agent),
            Ok(Reply::Failed(e)) => Err(GpuError::Worker(format!("{}: {e}", agent.label))),
            Ok(_) => Err(GpuError::Worker(format!(
                "{}: unexpected reply",
                agent.label
            ))),
            Err(_) => Err(GpuError::Worker(format!("{}: did not start", agent.label))),
        }
    }

    fn ask(&self, cmd: Cmd, timeout: Duration) -> Result<Reply> {
        self.tx
            .send(cmd)
            .map_err(|_| GpuError::Worker(format!("{}: thread is gone", self.label)))?;
        match self.rx.recv_timeout(timeout) {
            Ok(Reply::Failed(e)) => Err(GpuError::Worker(format!("{}: {e}", self.label))),
            Ok(r) => Ok(r),
            Err(_) => Err(GpuError::Worker(format!("{}: no answer", self.label))),
        }
    }
}

fn agent_thread(
    target: ThreadTarget,
    config: ProbeConfig,
    rx: Receiver<Cmd>,
    tx: Sender<Reply>,
    stop: Arc<AtomicBool>,
) {
    // Declared before the probe so that it is dropped after it.
    let (whole, group, device_index);
    match target {
        ThreadTarget::Whole { device_index: d } => {
            device_index = d;
            whole = match WholeDevice::new(d) {
                Ok(w) => Some(w),
                Err(e) => {
                    let _ = tx.send(Reply::Failed(e.to_string()));
                    return;
                }
            };
            group = None;
        }
        ThreadTarget::Green {
            device_index: d,
            group: g,
        } => {
            device_index = d;
            whole = None;
            group = Some(g);
        }
    }
    let made = match (&whole, &group) {
        (Some(w), _) => Probe::new(w.context(), w.stream(), device_index, config),
        (None, Some(g)) => g
            .make_current()
            .and_then(|_| Probe::new(g.context(), g.stream(), device_index, config)),
        (None, None) => Err(GpuError::Other("no target".into())),
    };
    let mut probe = match made {
        Ok(p) => p,
        Err(e) => {
            let _ = tx.send(Reply::Failed(e.to_string()));
            return;
        }
    };
    let _ = tx.send(Reply::Ready);
    while let Ok(cmd) = rx.recv() {
        let reply = match cmd {
            Cmd::Measure(d) => match probe.measure_throughput(d) {
                Ok(r) => Reply::Measured(r),
                Err(e) => Reply::Failed(e.to_string()),
            },
            Cmd::Saturate => {
                stop.store(false, Ordering::SeqCst);
                let _ = tx.send(Reply::Saturating);
                match probe.saturate(&stop) {
                    Ok(n) => Reply::Stopped(n),
                    Err(e) => Reply::Failed(e.to_string()),
                }
            }
            Cmd::Exit => break,
        };
        if tx.send(reply).is_err() {
            break;
        }
    }
    drop(probe);
    drop(group);
    drop(whole);
}

impl ProbeAgent for ThreadAgent {
    fn label(&self) -> &str {
        &self.label
    }
    fn measure(&mut self, duration: Duration) -> Result<ProbeResult> {
        match self.ask(Cmd::Measure(duration), duration + SLACK)? {
            Reply::Measured(r) => Ok(r),
            _ => Err(GpuError::Worker(format!(
                "{}: unexpected reply",
                self.label
            ))),
        }
    }
    fn start_saturate(&mut self) -> Result<()> {
        match self.ask(Cmd::Saturate, SLACK)? {
            Reply::Saturating => Ok(()),
            _ => Err(GpuError::Worker(format!(
                "{}: unexpected reply",
                self.label
            ))),
        }
    }
    fn stop_saturate(&mut self) -> Result<u64> {
        self.stop.store(true, Ordering::SeqCst);
        match self.rx.recv_timeout(SLACK) {
            Ok(Reply::Stopped(n)) => Ok(n),
            Ok(Reply::Failed(e)) => Err(GpuError::Worker(format!("{}: {e}", self.label))),
            _ => Err(GpuError::Worker(format!("{}: did not stop", self.label))),
        }
    }
}

impl Drop for ThreadAgent {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.tx.send(Cmd::Exit);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

// ------------------------------------------------------------------ worker processes

/// How to start a probe worker process: `program args...`, then the worker reads commands.
#[derive(Debug, Clone)]
pub struct WorkerCommand {
    pub program: PathBuf,
    pub args: Vec<String>,
    /// Extra environment for every worker (e.g. to select a test binary's worker mode).
    pub env: Vec<(String, String)>,
    /// Append `--gpu N` to the arguments. The device is always also passed in the environment
    /// as [`WORKER_GPU_ENV`] (for workers, such as test binaries, that take no such argument).
    pub gpu_arg: bool,
}

/// Environment variable carrying a worker's CUDA device index.
pub const WORKER_GPU_ENV: &str = "ISOLANE_PROBE_WORKER_GPU";

impl WorkerCommand {
    /// This binary as `isolane verify --probe-worker --gpu N` (N is appended per worker).
    pub fn current_isolane() -> Result<Self> {
        let program = std::env::current_exe()
            .map_err(|e| GpuError::io("finding the current executable", e))?;
        Ok(WorkerCommand {
            program,
            args: vec!["verify".into(), "--probe-worker".into()],
            env: Vec::new(),
            gpu_arg: true,
        })
    }
}

/// A probe in a child process (MPS client, MIG instance, or a time-sliced context).
pub struct ProcessAgent {
    label: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
}

impl ProcessAgent {
    /// Starts a worker on CUDA device `gpu` (as the worker sees it) with extra `env`.
    pub fn spawn(
        label: impl Into<String>,
        cmd: &WorkerCommand,
        gpu: u32,
        env: &[(String, String)],
    ) -> Result<Self> {
        let label = label.into();
        let mut c = Command::new(&cmd.program);
        c.args(&cmd.args);
        if cmd.gpu_arg {
            c.args(["--gpu", &gpu.to_string()]);
        }
        c.env(WORKER_GPU_ENV, gpu.to_string())
            .envs(cmd.env.iter().map(|(k, v)| (k, v)))
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        // Ends with us even on `kill -9`; the agent lives on the thread that spawns it.
        isolane_core::process::die_with_parent(&mut c);
        let mut child = c
            .spawn()
            .map_err(|e| GpuError::io(format!("starting {}", cmd.program.display()), e))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| GpuError::Worker("no stdout".into()))?;
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                // Anywhere in the line: a test binary used as the worker may have printed
                // "test name ... " before it.
                if let Some(rest) = line.find(PROTO).map(|i| &line[i + PROTO.len()..]) {
                    if tx.send(rest.to_string()).is_err() {
                        break;
                    }
                }
            }
        });
        let stdin = child.stdin.take();
        let mut agent = ProcessAgent {
            label,
            child,
            stdin,
            lines,
        };
        let first = agent.next_line(SLACK)?;
        if first != "READY" {
            return Err(GpuError::Worker(format!("{}: {first}", agent.label)));
        }
        Ok(agent)
    }

    fn send(&mut self, line: &str) -> Result<()> {
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| GpuError::Worker(format!("{}: stdin closed", self.label)))?;
        writeln!(stdin, "{line}")
            .and_then(|_| stdin.flush())
            .map_err(|e| GpuError::io(format!("{}: writing to the worker", self.label), e))
    }

    fn next_line(&mut self, timeout: Duration) -> Result<String> {
        match self.lines.recv_timeout(timeout) {
            Ok(l) => match l.strip_prefix("ERROR ") {
                Some(e) => Err(GpuError::Worker(format!("{}: {e}", self.label))),
                None => Ok(l),
            },
            Err(RecvTimeoutError::Timeout) => Err(GpuError::Worker(format!(
                "{}: no answer within {timeout:?}",
                self.label
            ))),
            Err(RecvTimeoutError::Disconnected) => {
                let status = self.child.wait().ok();
                Err(GpuError::Worker(format!(
                    "{}: the worker exited ({})",
                    self.label,
                    status.map(|s| s.to_string()).unwrap_or_default()
                )))
            }
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl ProbeAgent for ProcessAgent {
    fn label(&self) -> &str {
        &self.label
    }
    fn measure(&mut self, duration: Duration) -> Result<ProbeResult> {
        self.send(&format!("measure {}", duration.as_secs_f64()))?;
        let l = self.next_line(duration + SLACK)?;
        let json = l
            .strip_prefix("RESULT ")
            .ok_or_else(|| GpuError::Worker(format!("{}: unexpected '{l}'", self.label)))?;
        serde_json::from_str(json)
            .map_err(|e| GpuError::Worker(format!("{}: bad result: {e}", self.label)))
    }
    fn start_saturate(&mut self) -> Result<()> {
        self.send("saturate")?;
        let l = self.next_line(SLACK)?;
        if l == "SATURATING" {
            Ok(())
        } else {
            Err(GpuError::Worker(format!(
                "{}: unexpected '{l}'",
                self.label
            )))
        }
    }
    fn stop_saturate(&mut self) -> Result<u64> {
        self.send("stop")?;
        let l = self.next_line(SLACK)?;
        l.strip_prefix("STOPPED ")
            .and_then(|n| n.trim().parse().ok())
            .ok_or_else(|| GpuError::Worker(format!("{}: unexpected '{l}'", self.label)))
    }
}

impl Drop for ProcessAgent {
    fn drop(&mut self) {
        let _ = self.send("exit");
        self.stdin = None; // EOF also makes the worker exit
        for _ in 0..250 {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The worker side: probe on CUDA device `gpu` of this process, commands on stdin, answers on
/// stdout. Returns the process exit code. Used by `isolane verify --probe-worker` and by test
/// binaries.
pub fn worker_main(gpu: u32) -> i32 {
    fn out(s: &str) {
        let mut o = std::io::stdout().lock();
        let _ = writeln!(o, "{PROTO}{}", s.replace('\n', " | "));
        let _ = o.flush();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, rx) = mpsc::channel::<String>();
    {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().lines() {
                let Ok(line) = line else { break };
                if line.trim() == "stop" {
                    stop.store(true, Ordering::SeqCst);
                } else if tx.send(line).is_err() {
                    break;
                }
            }
            // EOF: the parent is gone; stop whatever runs and leave.
            stop.store(true, Ordering::SeqCst);
            let _ = tx.send("exit".into());
        });
    }
    let whole = match WholeDevice::new(gpu) {
        Ok(w) => w,
        Err(e) => {
            out(&format!("ERROR {e}"));
            return 1;
        }
    };
    let mut probe = match Probe::new(whole.context(), whole.stream(), gpu, ProbeConfig::default()) {
        Ok(p) => p,
        Err(e) => {
            out(&format!("ERROR {e}"));
            return 1;
        }
    };
    out("READY");
    while let Ok(line) = rx.recv() {
        let mut words = line.split_whitespace();
        match (words.next(), words.next()) {
            (Some("measure"), Some(secs)) => {
                let Ok(secs) = secs.parse::<f64>() else {
                    out("ERROR bad duration");
                    continue;
                };
                match probe.measure_throughput(Duration::from_secs_f64(secs.max(0.0))) {
                    Ok(r) => match serde_json::to_string(&r) {
                        Ok(j) => out(&format!("RESULT {j}")),
                        Err(e) => out(&format!("ERROR {e}")),
                    },
                    Err(e) => out(&format!("ERROR {e}")),
                }
            }
            (Some("saturate"), _) => {
                stop.store(false, Ordering::SeqCst);
                out("SATURATING");
                match probe.saturate(&stop) {
                    Ok(n) => out(&format!("STOPPED {n}")),
                    Err(e) => out(&format!("ERROR {e}")),
                }
            }
            (Some("exit"), _) => break,
            _ => out(&format!("ERROR unknown command '{line}'")),
        }
    }
    drop(probe);
    drop(whole);
    0
}

// ------------------------------------------------------------------ the measurement

/// One partition's line of the report.
#[derive(Debug, Clone, Serialize)]
pub struct PartitionRow {
    pub workload: String,
    /// e.g. "green 8 SMs", "mps 25%", "timeslice", "mig 1g.10gb".
    pub partition: String,
    /// SMs granted (green) or of the MIG instance.
    pub granted_sms: Option<u32>,
    /// The share of the GPU the partition is meant to get (SMs ÷ total, or thread %).
    pub nominal_share: Option<f64>,
    pub alone: ProbeResult,
    pub beside: Option<ProbeResult>,
    /// alone ÷ the probe on the whole GPU.
    pub share_of_gpu: Option<f64>,
    /// (1 − beside ÷ alone) × 100.
    pub interference_pct: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct VerifyReport {
    pub device: String,
    pub gpu: u32,
    pub sm_count: u32,
    pub mechanism: Mechanism,
    pub duration_s: f64,
    /// The probe alone on the whole GPU (`None` under MIG, where no process sees the whole GPU).
    pub whole_gpu: Option<ProbeResult>,
    pub partitions: Vec<PartitionRow>,
    pub notes: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct VerifyOptions {
    /// Length of each measurement (at least 0.5 s is used).
    pub duration: Duration,
    pub allow_mig_reconfigure: bool,
    pub mps: MpsOptions,
    /// How worker processes are started (default: this binary's `verify --probe-worker`).
    pub worker: Option<WorkerCommand>,
    /// Progress lines on stderr.
    pub verbose: bool,
}

impl Default for VerifyOptions {
    fn default() -> Self {
        VerifyOptions {
            duration: Duration::from_secs(1),
            allow_mig_reconfigure: false,
            mps: MpsOptions::default(),
            worker: None,
            verbose: false,
        }
    }
}

/// share = alone ÷ whole; interference = (1 − beside ÷ alone) × 100 (pure; tested on CPU).
pub fn share_and_interference(
    whole: Option<f64>,
    alone: f64,
    beside: Option<f64>,
) -> (Option<f64>, Option<f64>) {
    let share = whole.filter(|w| *w > 0.0).map(|w| alone / w);
    let interference = beside
        .filter(|_| alone > 0.0)
        .map(|b| (1.0 - b / alone) * 100.0);
    (share, interference)
}

/// Measures every agent alone, then each beside all the others saturating.
pub fn measure_agents(
    agents: &mut [Box<dyn ProbeAgent>],
    duration: Duration,
    verbose: bool,
) -> Result<Vec<(ProbeResult, Option<ProbeResult>)>> {
    let mut alone = Vec::with_capacity(agents.len());
    for a in agents.iter_mut() {
        if verbose {
            eprintln!("verify: {} alone", a.label());
        }
        alone.push(a.measure(duration)?);
    }
    let mut beside = Vec::with_capacity(agents.len());
    for i in 0..agents.len() {
        if agents.len() < 2 {
            beside.push(None);
            continue;
        }
        if verbose {
            eprintln!(
                "verify: {} beside {} saturating neighbours",
                agents[i].label(),
                agents.len() - 1
            );
        }
        let mut started = Vec::new();
        let mut result = Ok(None);
        for j in (0..agents.len()).filter(|&j| j != i) {
            match agents[j].start_saturate() {
                Ok(()) => started.push(j),
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        if result.is_ok() {
            // Let the neighbours' first launches get going before the clock starts.
            std::thread::sleep(Duration::from_millis(200));
            result = agents[i].measure(duration).map(Some);
        }
        for j in started {
            let stopped = agents[j].stop_saturate();
            if let (Ok(_), Err(e)) = (&result, stopped) {
                result = Err(e);
            }
        }
        beside.push(result?);
    }
    Ok(alone.into_iter().zip(beside).collect())
}

/// Runs the verification of `scenario` on its GPU.
pub fn verify(scenario: &Scenario, opts: &VerifyOptions) -> Result<VerifyReport> {
    if scenario.device.backend != Backend::Cuda {
        return Err(GpuError::Usage(
            "verify needs a scenario with device.backend = \"cuda\"".into(),
        ));
    }
    let gpu = scenario.device.gpu;
    let devices = crate::devices::list_devices()?;
    let info = devices
        .iter()
        .find(|d| d.index == gpu)
        .ok_or(GpuError::DeviceIndex {
            index: gpu,
            count: devices.len() as u32,
        })?;
    let model = crate::devices::model_for(
        &info.name,
        info.sm_count,
        info.memory_mib,
        info.compute_capability,
    );
    // Admission control first: nothing is created for a plan that does not fit.
    let plan =
        admit(scenario, &model, &[], &AdmissionOptions::default()).map_err(GpuError::Rejected)?;
    let duration = opts.duration.max(Duration::from_millis(500));
    let worker = match &opts.worker {
        Some(w) => w.clone(),
        None => WorkerCommand::current_isolane()?,
    };
    let cfg = ProbeConfig::default();
    let mut notes = Vec::new();
    let total = info.sm_count.max(1);

    // Per workload: label, partition text, granted SMs, nominal share.
    let mut meta: Vec<(String, String, Option<u32>, Option<f64>)> = Vec::new();
    // Declared before the agents so that, on an early error, the agents (worker processes,
    // MPS clients) are dropped first and the daemon / MIG instances after them.
    let mut daemon: Option<MpsDaemon> = None;
    let mig_backend;
    let mut mig_instances = None;
    let mut agents: Vec<Box<dyn ProbeAgent>> = Vec::new();

    let whole_gpu = match plan.mechanism {
        Mechanism::Green => {
            let base = measure_whole_in_thread(gpu, duration, cfg, opts.verbose)?;
            let sizes: Vec<u32> = plan
                .workloads
                .iter()
                .filter_map(|w| match w.partition {
                    ResolvedPartition::Green { sms, .. } => Some(sms),
                    _ => None,
                })
                .collect();
            let parts = GreenPartitioning::create(gpu, &sizes)?;
            let drv = parts.sm_info();
            notes.push(format!(
                "green: split {:?}; the driver's minimum group is {} SMs, alignment {}",
                parts.plan(),
                drv.min_partition_sms,
                drv.coscheduled_alignment
            ));
            for (w, g) in plan.workloads.iter().zip(parts.into_groups()) {
                let granted = g.granted_sms();
                meta.push((
                    w.workload.clone(),
                    format!("green {} SMs", g.requested_sms()),
                    Some(granted),
                    Some(f64::from(granted) / f64::from(total)),
                ));
                agents.push(Box::new(ThreadAgent::spawn(
                    w.workload.clone(),
                    ThreadTarget::Green {
                        device_index: gpu,
                        group: g,
                    },
                    cfg,
                )?));
            }
            Some(base)
        }
        Mechanism::Timeslice => {
            let base = measure_whole_in_process(&worker, gpu, &[], duration, opts.verbose)?;
            for w in &plan.workloads {
                meta.push((w.workload.clone(), "timeslice".into(), None, None));
                agents.push(Box::new(ProcessAgent::spawn(
                    &w.workload,
                    &worker,
                    gpu,
                    &[],
                )?));
            }
            Some(base)
        }
        Mechanism::Mps => {
            // The baseline runs before the daemon exists: a plain context on the whole GPU.
            let base = measure_whole_in_process(&worker, gpu, &[], duration, opts.verbose)?;
            let d: &MpsDaemon = daemon.insert(MpsDaemon::start(gpu, &opts.mps)?);
            if !d.owned() {
                notes.push(format!(
                    "joined the existing MPS daemon at {}",
                    d.pipe_dir().display()
                ));
            }
            for w in &plan.workloads {
                if let ResolvedPartition::Mps {
                    thread_pct,
                    mem_limit_mib,
                } = w.partition
                {
                    meta.push((
                        w.workload.clone(),
                        format!("mps {thread_pct}%"),
                        None,
                        Some(f64::from(thread_pct) / 100.0),
                    ));
                    let env = d.client_env(thread_pct, mem_limit_mib);
                    agents.push(Box::new(ProcessAgent::spawn(
                        &w.workload,
                        &worker,
                        d.client_device_index(),
                        &env,
                    )?));
                }
            }
            notes.push(
                "inside MPS clients %smid is virtualised: SM ids prove nothing, throughput does"
                    .into(),
            );
            Some(base)
        }
        Mechanism::Mig => {
            mig_backend = crate::mig::nvml::NvmlMig::new()?;
            let inst = mig_instances.insert(crate::mig::plan_and_create(
                &mig_backend,
                gpu,
                &plan,
                opts.allow_mig_reconfigure,
            )?);
            for w in &plan.workloads {
                if let ResolvedPartition::Mig { profile, sms, .. } = &w.partition {
                    let uuid = inst
                        .visible_devices(&w.workload)
                        .unwrap_or_default()
                        .to_string();
                    meta.push((
                        w.workload.clone(),
                        format!("mig {profile}"),
                        Some(*sms),
                        Some(f64::from(*sms) / f64::from(total)),
                    ));
                    let env = vec![("CUDA_VISIBLE_DEVICES".to_string(), uuid)];
                    agents.push(Box::new(ProcessAgent::spawn(
                        &w.workload,
                        &worker,
                        0,
                        &env,
                    )?));
                }
            }
            notes.push(
                "MIG: no process sees the whole GPU, so there is no whole-GPU baseline".into(),
            );
            None
        }
        Mechanism::None => {
            return Err(GpuError::Usage(
                "verify needs a mechanism other than none".into(),
            ))
        }
    };

    let measured = measure_agents(&mut agents, duration, opts.verbose);
    drop(agents); // workers exit before the daemon stops / the instances go
    let measured = measured?;
    if let Some(d) = daemon.take() {
        d.stop()?;
    }
    if let Some(i) = mig_instances.take() {
        i.destroy()?;
    }

    let base = whole_gpu.as_ref().map(|b| b.blocks_per_s);
    let partitions = meta
        .into_iter()
        .zip(measured)
        .map(
            |((workload, partition, granted_sms, nominal_share), (alone, beside))| {
                let (share_of_gpu, interference_pct) = share_and_interference(
                    base,
                    alone.blocks_per_s,
                    beside.as_ref().map(|b| b.blocks_per_s),
                );
                PartitionRow {
                    workload,
                    partition,
                    granted_sms,
                    nominal_share,
                    alone,
                    beside,
                    share_of_gpu,
                    interference_pct,
                }
            },
        )
        .collect();
    Ok(VerifyReport {
        device: info.name.clone(),
        gpu,
        sm_count: info.sm_count,
        mechanism: plan.mechanism,
        duration_s: duration.as_secs_f64(),
        whole_gpu,
        partitions,
        notes,
    })
}

fn measure_whole_in_thread(
    gpu: u32,
    d: Duration,
    cfg: ProbeConfig,
    verbose: bool,
) -> Result<ProbeResult> {
    if verbose {
        eprintln!("verify: the probe on the whole GPU");
    }
    let mut a = ThreadAgent::spawn("whole-gpu", ThreadTarget::Whole { device_index: gpu }, cfg)?;
    a.measure(d)
}

fn measure_whole_in_process(
    worker: &WorkerCommand,
    gpu: u32,
    env: &[(String, String)],
    d: Duration,
    verbose: bool,
) -> Result<ProbeResult> {
    if verbose {
        eprintln!("verify: the probe on the whole GPU");
    }
    let mut a = ProcessAgent::spawn("whole-gpu", worker, gpu, env)?;
    a.measure(d)
}

/// The report as a text table.
pub fn format_table(r: &VerifyReport) -> String {
    let mut s = format!(
        "{} (GPU {}, {} SMs), mechanism {:?}, {:.1} s per measurement\n",
        r.device, r.gpu, r.sm_count, r.mechanism, r.duration_s
    );
    if let Some(w) = &r.whole_gpu {
        s += &format!(
            "whole GPU: {:.0} blocks/s, {:.0} GFLOP/s, {} SMs seen\n",
            w.blocks_per_s,
            w.gflops,
            w.sm_ids_seen.len()
        );
    }
    s += &format!(
        "{:<16} {:<18} {:>8} {:>8} {:>12} {:>8} {:>12} {:>13} {:>9}\n",
        "workload",
        "partition",
        "granted",
        "nominal",
        "alone blk/s",
        "share",
        "beside blk/s",
        "interference",
        "SMs seen"
    );
    let pct = |v: Option<f64>| {
        v.map(|x| format!("{:.1}%", x * 100.0))
            .unwrap_or_else(|| "-".into())
    };
    for p in &r.partitions {
        s += &format!(
            "{:<16} {:<18} {:>8} {:>8} {:>12.0} {:>8} {:>12} {:>13} {:>9}\n",
            p.workload,
            p.partition,
            p.granted_sms
                .map(|g| g.to_string())
                .unwrap_or_else(|| "-".into()),
            pct(p.nominal_share),
            p.alone.blocks_per_s,
            pct(p.share_of_gpu),
            p.beside
                .as_ref()
                .map(|b| format!("{:.0}", b.blocks_per_s))
                .unwrap_or_else(|| "-".into()),
            p.interference_pct
                .map(|x| format!("{x:.1}%"))
                .unwrap_or_else(|| "-".into()),
            p.alone.sm_ids_seen.len(),
        );
    }
    for n in &r.notes {
        s += &format!("note: {n}\n");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn share_and_interference_follow_their_definitions() {
        let (s, i) = share_and_interference(Some(1320.0), 80.0, Some(76.0));
        assert!((s.unwrap() - 80.0 / 1320.0).abs() < 1e-12);
        assert!((i.unwrap() - 5.0).abs() < 1e-9);
        assert_eq!(share_and_interference(None, 80.0, None), (None, None));
        assert_eq!(share_and_interference(Some(0.0), 80.0, Some(0.0)).0, None);
    }

    #[test]
    fn the_table_has_a_row_per_partition() {
        let r = |items| ProbeResult::from_counts(items, 1.0, &[1, 1], 8, ProbeConfig::default());
        let report = VerifyReport {
            device: "NVIDIA H100 80GB HBM3".into(),
            gpu: 0,
            sm_count: 132,
            mechanism: Mechanism::Green,
            duration_s: 1.0,
            whole_gpu: Some(r(1320)),
            partitions: (0..2)
                .map(|i| PartitionRow {
                    workload: format!("p{i}"),
                    partition: "green 8 SMs".into(),
                    granted_sms: Some(8),
                    nominal_share: Some(8.0 / 132.0),
                    alone: r(80),
                    beside: Some(r(79)),
                    share_of_gpu: Some(80.0 / 1320.0),
                    interference_pct: Some(1.25),
                })
                .collect(),
            notes: vec!["a note".into()],
        };
        let t = format_table(&report);
        assert_eq!(t.lines().filter(|l| l.starts_with('p')).count(), 2, "{t}");
        assert!(
            t.contains("6.1%") && t.contains("1.2%") && t.contains("note: a note"),
            "{t}"
        );
        let j = serde_json::to_value(&report).unwrap();
        assert_eq!(j["partitions"][0]["interference_pct"], 1.25);
        assert_eq!(j["mechanism"], "green");
    }

    /// A fake agent: a fixed rate alone, divided by (1 + k·saturating neighbours).
    struct Fake {
        label: String,
        rate: f64,
        k: f64,
        busy: Arc<std::sync::atomic::AtomicUsize>,
        saturating: bool,
    }

    impl ProbeAgent for Fake {
        fn label(&self) -> &str {
            &self.label
        }
        fn measure(&mut self, _d: Duration) -> Result<ProbeResult> {
            let n = self.busy.load(Ordering::SeqCst) as f64;
            let r = self.rate / (1.0 + self.k * n);
            Ok(ProbeResult::from_counts(
                r as u64,
                1.0,
                &[1],
                1,
                ProbeConfig::default(),
            ))
        }
        fn start_saturate(&mut self) -> Result<()> {
            assert!(!self.saturating);
            self.saturating = true;
            self.busy.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
        fn stop_saturate(&mut self) -> Result<u64> {
            assert!(self.saturating);
            self.saturating = false;
            self.busy.fetch_sub(1, Ordering::SeqCst);
            Ok(1)
        }
    }

    #[test]
    fn each_agent_is_measured_alone_and_beside_all_the_others() {
        let busy = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut agents: Vec<Box<dyn ProbeAgent>> = (0..4)
            .map(|i| {
                Box::new(Fake {
                    label: format!("w{i}"),
                    rate: 1000.0,
                    k: 1.0,
                    busy: Arc::clone(&busy),
                    saturating: false,
                }) as Box<dyn ProbeAgent>
            })
            .collect();
        let r = measure_agents(&mut agents, Duration::from_millis(1), false).unwrap();
        assert_eq!(r.len(), 4);
        for (alone, beside) in &r {
            assert_eq!(alone.items, 1000);
            // Three neighbours saturating: time-sliced four ways.
            assert_eq!(beside.as_ref().unwrap().items, 250);
        }
        assert_eq!(
            busy.load(Ordering::SeqCst),
            0,
            "every neighbour was stopped"
        );
    }
}
