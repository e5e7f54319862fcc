//! Subcommands, and what they share: exit codes, scenario loading, Ctrl-C, the progress bar.

/// A library error at the CLI's edge: one its type says is the user's (`is_user_error`) exits
/// 2, any other 1.
macro_rules! blame {
    ($e:expr) => {{
        let e = $e;
        if e.is_user_error() {
            $crate::cmd::user(e)
        } else {
            anyhow::Error::new(e)
        }
    }};
}

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
use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use isolane_core::spec::Scenario;

/// A mistake of the user's: exit code 2 (`isolane_core::user_error`). Everything else that
/// fails is a runtime failure: exit code 1.
pub use isolane_core::user_error::UserError;

pub fn user(msg: impl std::fmt::Display) -> anyhow::Error {
    UserError(msg.to_string()).into()
}

/// Writes a file the user named for output (`--out FILE`, `--save-output`): only a regular
/// file, a new path in an existing folder or a character device, never anything replaced that
/// is not a file ([`isolane_core::files::write_output`]); a path that cannot be one is the
/// user's (exit 2), a failed write (a full disk) a runtime failure (exit 1).
pub fn write_output(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    isolane_core::files::write_output(path, bytes).map_err(|e| blame!(e))
}

/// Exit codes of docs/runtime.md.
pub use isolane_core::exit_codes::{exit_for, EXIT_INTERRUPTED, EXIT_USER};

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
            if let Some(m) = out_of_memory(&e) {
                eprintln!("hint: {}", m.hint());
            }
            ExitCode::from(failure_code(&e))
        }
    }
}

/// The exit code of a failed command ([`isolane_executors::exit::failure_code`]): 3 for an
/// out-of-memory anywhere in its chain, 2 for a user's mistake, else 1.
pub fn failure_code(e: &anyhow::Error) -> u8 {
    isolane_executors::exit::failure_code(e.as_ref())
}

fn out_of_memory(e: &anyhow::Error) -> Option<&isolane_engine::OutOfMemory> {
    isolane_executors::exit::out_of_memory(e.as_ref())
}

/// The wrapping rule of every message, and its width after `error: `.
pub use isolane_core::text::{wrap_message, ERROR_WIDTH};

pub use isolane_executors::machine::{device_title, memory_estimates_mib};

/// A finding about this machine at the CLI's edge: a scenario that does not fit it is the
/// user's (exit 2).
pub(super) fn machine_error(e: isolane_executors::machine::MachineError) -> anyhow::Error {
    blame!(e)
}

/// [`isolane_executors::machine::quickstart`].
pub fn quickstart(cpu_only: bool) -> anyhow::Result<(Scenario, String, Option<String>)> {
    isolane_executors::machine::quickstart(cpu_only).map_err(machine_error)
}

/// Loads and validates a scenario; a problem with it is the user's (exit 2). Returns the
/// scenario and how to name it in summary.json.
pub fn load_scenario(path: Option<&Path>) -> anyhow::Result<(Scenario, String)> {
    match path {
        Some(p) => Ok(ScenarioFile::read(p)?.scenario()?),
        None => quickstart(false).map(|(s, name, _)| (s, name)),
    }
}

pub use isolane_app::scenario_file::ScenarioFile;

/// The checks of `isolane_session::checks` at the CLI's edge: a refusal is the user's (exit 2).
pub fn refuse_programs(scenario: &Scenario, file: &str, command: &str) -> anyhow::Result<()> {
    isolane_session::checks::refuse_programs(scenario, file, command).map_err(user)
}

pub fn refuse_several_gpus(scenario: &Scenario, file: &str, command: &str) -> anyhow::Result<()> {
    isolane_session::checks::refuse_several_gpus(scenario, file, command).map_err(user)
}

pub fn refuse_mixed_backends(scenario: &Scenario, file: &str, command: &str) -> anyhow::Result<()> {
    isolane_session::checks::refuse_mixed_backends(scenario, file, command).map_err(user)
}

/// Ctrl-C and SIGTERM raise the returned flag ([`isolane_session::signals::install_stop_handler`]).
pub fn install_stop_handler() -> anyhow::Result<Arc<AtomicBool>> {
    Ok(isolane_session::signals::install_stop_handler()?)
}

/// Admission before a run starts anything ([`isolane_executors::machine::admit`]); a refusal
/// is the user's (exit 2). Returns the admitted plan (`None` on the CPU).
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
    isolane_executors::machine::admit(scenario, file, options).map_err(machine_error)
}

pub use isolane_session::live::LiveMetrics;

/// Starts serving live metrics at `addr` (HOST:PORT; port 0 picks a free one) before anything
/// runs, and says where on stderr. An address that cannot be used is the user's mistake.
pub fn serve_metrics(addr: Option<&str>) -> anyhow::Result<Option<LiveMetrics>> {
    let Some(addr) = addr else { return Ok(None) };
    let live = LiveMetrics::serve(addr).map_err(|e| blame!(e))?;
    eprintln!("metrics: http://{}/metrics", live.addr());
    Ok(Some(live))
}

/// `--backend cpu|cuda` of the studies (`sweep`, `interference`).
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendFlag {
    Cpu,
    Cuda,
}

impl From<BackendFlag> for isolane_core::spec::Backend {
    fn from(b: BackendFlag) -> Self {
        match b {
            BackendFlag::Cpu => isolane_core::spec::Backend::Cpu,
            BackendFlag::Cuda => isolane_core::spec::Backend::Cuda,
        }
    }
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
            // Only a server resizes green groups while it runs.
            ..Default::default()
        }
    }
}
