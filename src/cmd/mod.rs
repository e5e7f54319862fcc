//! Subcommands, and what they share: exit codes, scenario loading, Ctrl-C, the progress bar.

pub mod app;
pub mod bench;
pub mod build;
pub mod coexec;
pub mod compare;
pub mod completions;
pub mod ctl;
pub mod devices;
pub mod explain;
pub mod export;
pub mod help;
pub mod infer;
pub mod interference;
pub mod isolation;
pub mod maxrate;
pub mod models;
pub mod plan;
pub mod plan_auto;
pub mod report;
pub mod run;
pub mod serve;
pub mod studies;
pub mod summarize;
pub mod sweep;
pub mod trace;
pub mod verify;
pub mod worker;

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::Context as _;
use isolane_core::spec::{Backend, Host, Scenario};

/// A mistake of the user's (bad scenario, bad flag value, unreadable file, occupied output
/// directory): exit code 2. Everything else that fails is a runtime failure: exit code 1.
#[derive(Debug)]
pub struct UserError(pub String);

impl std::fmt::Display for UserError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UserError {}

pub fn user(msg: impl std::fmt::Display) -> anyhow::Error {
    UserError(msg.to_string()).into()
}

/// Writes a file the user named for output (`--out FILE`, `--save-output`): only a regular
/// file, a new path in an existing folder or a character device, never anything replaced that
/// is not a file ([`isolane_core::files::write_output`]); a path that cannot be one is the
/// user's (exit 2), a failed write (a full disk) a runtime failure (exit 1).
pub fn write_output(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    isolane_core::files::write_output(path, bytes).map_err(|e| {
        if e.is_user_error() {
            user(e)
        } else {
            anyhow::Error::new(e)
        }
    })
}

/// `--threads N` of the CPU backend (0 = one per core) against the cores this process may use:
/// more threads than cores only take turns on them, and a typo such as 100000 would start that
/// many threads.
pub fn check_threads(threads: usize) -> anyhow::Result<()> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if threads > cores {
        return Err(user(format!(
            "--threads {threads}: this machine has {cores} CPU core(s) available to isolane; \
             expected 0 (one thread per core) to {cores}"
        )));
    }
    Ok(())
}

/// Exit codes of docs/runtime.md.
pub const EXIT_FAILED: u8 = 1;
pub const EXIT_USER: u8 = 2;
pub const EXIT_INTERRUPTED: u8 = 130;

pub fn exit_code(result: anyhow::Result<u8>) -> ExitCode {
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            let text = format!("{e:#}");
            // On a terminal an error wraps at 80 columns as the tables do (a library search
            // made one 515 columns long); piped, to a log or grep, it stays a line a message.
            if std::io::stderr().is_terminal() {
                eprintln!("error: {}", wrap_message(&text, ERROR_WIDTH));
            } else {
                eprintln!("error: {text}");
            }
            if e.chain().any(|c| c.downcast_ref::<UserError>().is_some()) {
                ExitCode::from(EXIT_USER)
            } else {
                ExitCode::from(EXIT_FAILED)
            }
        }
    }
}

/// Columns a message printed after `error: ` wraps at, so that it reads whole in an 80-column
/// terminal as the tables do.
pub const ERROR_WIDTH: usize = 80 - "error: ".len();

/// The wrapping rule of every message ([`isolane_core::text::wrap_message`]).
pub use isolane_core::text::wrap_message;

/// The scenario `isolane run` uses without a file (`scenarios/quickstart.toml`, built in).
pub const QUICKSTART: &str = include_str!("../../scenarios/quickstart.toml");
pub const QUICKSTART_NAME: &str = "<built-in quickstart>";
/// The same on a machine with a CUDA GPU (`scenarios/quickstart-gpu.toml`).
pub const QUICKSTART_GPU: &str = include_str!("../../scenarios/quickstart-gpu.toml");
pub const QUICKSTART_GPU_NAME: &str = "<built-in GPU quickstart>";

/// Whether the GPU quickstart can run here (a CUDA device, and the CUDA backend's libraries),
/// or why not, in the words of discovery: no driver, no device, a library missing.
fn gpu_unusable_reason() -> Option<String> {
    gpu_missing_reason().or_else(|| {
        isolane_cuda::libs::ensure_all()
            .err()
            .map(|e| format!("a CUDA library is missing: {e}"))
    })
}

/// Why this machine has no CUDA device to run on, if it has none: no driver, no device.
fn gpu_missing_reason() -> Option<String> {
    use isolane_gpu::GpuError;
    match isolane_gpu::devices::list_devices() {
        // One line: the folders searched are in `isolane devices`.
        Err(GpuError::LibraryNotFound { library, .. }) => Some(format!(
            "no CUDA driver: {library} not found; `isolane devices` says where it was looked for"
        )),
        Err(GpuError::NoDevice(why)) => Some(format!("no CUDA device: {why}")),
        Err(e) => Some(format!("the CUDA driver failed: {e}")),
        Ok(d) if d.is_empty() => Some("no CUDA device".into()),
        Ok(_) => None,
    }
}

/// The built-in quickstart: on the GPU when one is ready (unless `cpu_only`), else on the CPU.
/// Returns the scenario, its name, and why the GPU was not used when it could have been asked
/// for (`None` with `cpu_only` or on the GPU).
pub fn quickstart(cpu_only: bool) -> anyhow::Result<(Scenario, String, Option<String>)> {
    let models: Vec<&str> = isolane_engine::builtin_models()
        .iter()
        .map(|m| m.name)
        .collect();
    let no_gpu = if cpu_only {
        None
    } else {
        gpu_unusable_reason()
    };
    let (text, name) = if cpu_only || no_gpu.is_some() {
        (QUICKSTART, QUICKSTART_NAME)
    } else {
        (QUICKSTART_GPU, QUICKSTART_GPU_NAME)
    };
    let s = Scenario::from_toml_str(text, name, &models)
        .map_err(|e| anyhow::anyhow!("the built-in quickstart scenario is invalid: {e}"))?;
    Ok((s, name.to_string(), no_gpu))
}

/// Loads and validates a scenario; a problem with it is the user's (exit 2). Returns the
/// scenario and how to name it in summary.json.
pub fn load_scenario(path: Option<&Path>) -> anyhow::Result<(Scenario, String)> {
    match path {
        Some(p) => ScenarioFile::read(p)?.scenario(),
        None => quickstart(false).map(|(s, name, _)| (s, name)),
    }
}

/// A scenario file, read once: a pipe, a process substitution (`<(...)`) or a FIFO gives its
/// text only once, so its workloads and its `[[app]]`s are both parsed from this text (issue
/// 31: `run <(cat apps.toml)` read the apps from an empty second read and ran nothing).
pub struct ScenarioFile {
    pub path: PathBuf,
    pub text: String,
}

impl ScenarioFile {
    /// Reads `path` (at most [`isolane_core::files::MAX_CONFIG_BYTES`]); a file that cannot be
    /// read is the user's (exit 2).
    pub fn read(path: &Path) -> anyhow::Result<ScenarioFile> {
        let text = Scenario::read_file(path).map_err(user)?;
        Ok(ScenarioFile {
            path: path.to_path_buf(),
            text,
        })
    }

    /// The validated scenario and how to name it in summary.json.
    pub fn scenario(&self) -> anyhow::Result<(Scenario, String)> {
        let models: Vec<&str> = isolane_engine::builtin_models()
            .iter()
            .map(|m| m.name)
            .collect();
        let s = Scenario::from_toml_str(&self.text, &self.path, &models).map_err(user)?;
        Ok((s, self.path.display().to_string()))
    }

    /// Its `[[app]]`s (none: an ordinary scenario).
    pub fn apps(&self) -> anyhow::Result<Vec<isolane_app::spec::AppSpec>> {
        app::apps_of(&self.text, &self.path)
    }
}

/// Command workloads (external programs, docs/programs.md) run only under `isolane run`: a
/// program has no jobs to search a rate for, profile, verify or ramp. `command` names the
/// subcommand refusing them (a user's mistake: exit code 2).
pub fn refuse_programs(scenario: &Scenario, file: &str, command: &str) -> anyhow::Result<()> {
    match scenario.workloads.iter().find(|w| w.program.is_some()) {
        None => Ok(()),
        Some(w) => Err(user(format!(
            "{file}: workload `{}` is a command workload (an external program), which only \
             `isolane run` runs; `isolane {command}` needs model workloads (remove it, or run \
             the scenario with `isolane run`)",
            w.name
        ))),
    }
}

/// Several GPUs (`device.gpus`) are built for `isolane run`, `isolane plan` (with `--auto`)
/// and `isolane verify` (admission, partitions, telemetry, placement and probes per GPU): the
/// commands that ramp or pair workloads on one device refuse such a scenario by name rather
/// than run it on its first GPU alone (docs/partitions.md, Several GPUs; a user's mistake:
/// exit code 2).
pub fn refuse_several_gpus(scenario: &Scenario, file: &str, command: &str) -> anyhow::Result<()> {
    if !scenario.device.several_gpus() {
        return Ok(());
    }
    let list: Vec<String> = scenario.device.gpus.iter().map(u32::to_string).collect();
    Err(user(format!(
        "{file}: device.gpus = [{}]: `isolane {command}` works on one GPU; several GPUs are \
         built for `isolane run`, `isolane plan` and `isolane verify` (write device.gpu = N to \
         use one GPU)",
        list.join(", ")
    )))
}

/// `plan --auto` sizes, and `verify` probes, every workload on the device: a workload with a
/// backend of its own (a CPU one in a GPU scenario, docs/programs.md) is refused by name
/// rather than planned or probed wrongly (exit code 2).
pub fn refuse_mixed_backends(scenario: &Scenario, file: &str, command: &str) -> anyhow::Result<()> {
    let name = |b: Backend| match b {
        Backend::Cpu => "cpu",
        Backend::Cuda => "cuda",
    };
    match scenario
        .workloads
        .iter()
        .find(|w| w.backend != scenario.device.backend)
    {
        None => Ok(()),
        Some(w) => Err(user(format!(
            "{file}: workload `{}` runs on backend \"{}\" and the device on \"{}\"; `isolane \
             {command}` takes every workload to the device's backend (remove its backend key, \
             or give the GPU workloads a scenario of their own)",
            w.name,
            name(w.backend),
            name(scenario.device.backend)
        ))),
    }
}

/// Ctrl-C (SIGINT) and SIGTERM raise the returned flag: the run stops releasing jobs and
/// writes what it measured. A second Ctrl-C while stopping exits at once (code 130), after
/// stopping any MPS daemon this process started and its clients (an exit skips destructors).
pub fn install_stop_handler() -> anyhow::Result<Arc<AtomicBool>> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let stop = Arc::new(AtomicBool::new(false));
    // The first signal raises the flag inside the handler itself, so a stop is never missed
    // even if the watcher thread below is slow to be scheduled.
    for sig in [SIGINT, SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&stop))
            .context("installing the Ctrl-C handler")?;
    }
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])
        .context("installing the Ctrl-C handler")?;
    std::thread::Builder::new()
        .name("isolane:signals".into())
        .spawn(move || {
            let mut seen = 0;
            for _ in signals.forever() {
                seen += 1;
                if seen >= 2 {
                    for e in isolane_gpu::mps::shutdown_all() {
                        eprintln!("isolane: stopping the MPS daemon: {e}");
                    }
                    std::process::exit(i32::from(EXIT_INTERRUPTED));
                }
            }
        })
        .context("starting the signal thread")?;
    Ok(stop)
}

pub use isolane_session::progress::ProgressView;

/// The title of a results table: where the workloads ran and how the device was shared, e.g.
/// `cuda GPU 0 (NVIDIA H100 80GB HBM3), green contexts` or `cpu, no partitions`.
pub fn device_title(scenario: &Scenario) -> String {
    use isolane_core::spec::Mechanism;
    let d = &scenario.device;
    let mechanism = match d.mechanism {
        Mechanism::None => "no partitions",
        Mechanism::Timeslice => "time-slicing",
        Mechanism::Mps => "MPS",
        Mechanism::Mig => "MIG",
        Mechanism::Green => "green contexts",
    };
    match d.backend {
        Backend::Cpu => format!("cpu, {mechanism}"),
        Backend::Cuda => {
            let name = isolane_gpu::devices::list_devices()
                .ok()
                .and_then(|list| list.into_iter().find(|g| g.index == d.gpu))
                .map(|g| format!(" ({})", g.name))
                .unwrap_or_default();
            if d.several_gpus() {
                let list: Vec<String> = d.gpus.iter().map(u32::to_string).collect();
                return format!("cuda GPUs {}{name}, {mechanism}", list.join(", "));
            }
            format!("cuda GPU {}{name}, {mechanism}", d.gpu)
        }
    }
}

/// Device-memory estimate per workload (MiB) for admission control: its model's plan, plus
/// the CUDA context of its process — each worker process has its own; thread-hosted workloads
/// share this process's context on their GPU, counted once per GPU, with the first of them.
/// `None` on the CPU and for `spin:` models (they allocate nothing on the device).
pub fn memory_estimates_mib(scenario: &Scenario) -> Vec<Option<u64>> {
    use isolane_executors::engine::{planned_model_mib, CUDA_PROCESS_MIB};
    let mut own_context_counted = std::collections::BTreeSet::new();
    scenario
        .workloads
        .iter()
        .map(|w| {
            let model = planned_model_mib(&w.device(&scenario.device), w)?;
            let context = match w.host {
                Host::Process => CUDA_PROCESS_MIB,
                Host::Thread if own_context_counted.insert(w.gpu_on(&scenario.device)) => {
                    CUDA_PROCESS_MIB
                }
                Host::Thread => 0,
            };
            Some(model + context)
        })
        .collect()
}

/// The device model of GPU `index` of this machine, as discovered through the CUDA driver.
pub fn detected_device_model(
    index: u32,
) -> anyhow::Result<isolane_core::device_model::DeviceModel> {
    let devices = isolane_gpu::devices::list_devices()?;
    let d = devices.iter().find(|d| d.index == index).ok_or_else(|| {
        user(format!(
            "device.gpu = {index}, but this machine has {} CUDA device(s) (device.gpus: every \
             index must be one of them)",
            devices.len()
        ))
    })?;
    Ok(isolane_gpu::devices::model_for(
        &d.name,
        d.sm_count,
        d.memory_mib,
        d.compute_capability,
    ))
}

/// Admission takes one device model for every GPU of the scenario (each GPU's budget is its
/// own, the rules are the first GPU's): the GPUs of a scenario on several GPUs must be alike.
pub(super) fn same_model_on_every_gpu(
    scenario: &Scenario,
    first: &isolane_core::device_model::DeviceModel,
) -> anyhow::Result<()> {
    for &g in scenario.device.gpus.iter().skip(1) {
        let other = detected_device_model(g)?;
        if other != *first {
            return Err(user(format!(
                "device.gpus: GPU {} is {} ({} SMs, {} MiB) but GPU {g} is {} ({} SMs, {} MiB); \
                 the GPUs of one scenario must be of one model",
                scenario.device.gpu,
                first.name,
                first.sm_count,
                first.memory_mib,
                other.name,
                other.sm_count,
                other.memory_mib
            )));
        }
    }
    Ok(())
}

/// Admission control before a run starts anything (the same check as `isolane plan`): on the
/// CPU there is nothing to partition; on a GPU every workload's partition must fit the device
/// of this machine, or the run is refused with one reason per workload (exit 2).
///
/// Returns the admitted plan (`None` on the CPU).
pub fn admit_or_refuse(
    scenario: &Scenario,
    file: &str,
) -> anyhow::Result<Option<isolane_core::admission::Plan>> {
    admit_or_refuse_with(scenario, file, &Default::default())
}

/// [`admit_or_refuse`] with options other than the defaults (`isolane coexec`'s unprovisioned
/// MPS cell lets every client have 100 % of the threads).
pub fn admit_or_refuse_with(
    scenario: &Scenario,
    file: &str,
    options: &isolane_core::admission::AdmissionOptions,
) -> anyhow::Result<Option<isolane_core::admission::Plan>> {
    // A scenario whose workloads all run on the CPU (`backend = "cpu"` each) needs no GPU.
    if scenario.device.backend != Backend::Cuda || !scenario.workloads.iter().any(|w| w.on_gpu()) {
        return Ok(None);
    }
    let device = detected_device_model(scenario.device.gpu)?;
    same_model_on_every_gpu(scenario, &device)?;
    isolane_core::admission::admit(scenario, &device, &memory_estimates_mib(scenario), options)
        .map(Some)
        .map_err(|rejections| user(plan::rejection_text(file, &device, &rejections)))
}

/// The live metrics of a command's runs and the endpoint serving them (`--metrics-addr`);
/// the endpoint stops when this is dropped, at the command's end.
pub struct LiveMetrics {
    pub metrics: Arc<isolane_metrics::RunMetrics>,
    _server: isolane_metrics::MetricsServer,
}

/// Starts serving live metrics at `addr` (HOST:PORT; port 0 picks a free one) before anything
/// runs, and says where on stderr. An address that cannot be used is the user's mistake.
pub fn serve_metrics(addr: Option<&str>) -> anyhow::Result<Option<LiveMetrics>> {
    let Some(addr) = addr else { return Ok(None) };
    let metrics = Arc::new(isolane_metrics::RunMetrics::new());
    let server = isolane_metrics::serve(addr, Arc::clone(&metrics)).map_err(|e| {
        if e.is_user_error() {
            user(e)
        } else {
            anyhow::Error::new(e)
        }
    })?;
    eprintln!("metrics: http://{}/metrics", server.addr());
    Ok(Some(LiveMetrics {
        metrics,
        _server: server,
    }))
}

/// Flags of the commands that set partitions up.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct PartitionFlags {
    /// mig: create the planned GPU/compute instances (MIG mode must already be on; they are
    /// destroyed afterwards). Changes the GPU's layout for every user while the run lasts.
    #[arg(long)]
    pub allow_mig_reconfigure: bool,
    /// mps: use an MPS daemon that is already running for this GPU instead of refusing (it is
    /// left running afterwards).
    #[arg(long)]
    pub join_mps: bool,
}

impl PartitionFlags {
    /// The flags as the session library takes them.
    pub fn choices(&self) -> isolane_session::PartitionChoices {
        isolane_session::PartitionChoices {
            allow_mig_reconfigure: self.allow_mig_reconfigure,
            join_mps: self.join_mps,
        }
    }
}

/// A session's error at the CLI's edge: a refused partition request is the user's (exit 2).
pub fn session_error(e: isolane_session::SessionError) -> anyhow::Error {
    if e.is_user_error() {
        user(e)
    } else {
        anyhow::Error::new(e)
    }
}
