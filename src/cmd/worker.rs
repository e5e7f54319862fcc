//! `isolane worker` (hidden): every child process isolane starts. The parent speaks the one
//! protocol of `isolane_runtime::protocol` on its stdin/stdout; its first message gives the
//! role: a workload of a `host = "process"` run, `verify`'s probe agent of one partition,
//! `maxrate`'s search in an MPS client, or an `[[app]]` in its own process.

use std::io::BufReader;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::Context as _;
use clap::Args;

#[derive(Args)]
pub struct WorkerArgs {
    /// The workload's name: informational only (shows in `ps`), the first message says what to
    /// do.
    #[arg(long)]
    workload: Option<String>,
}

pub fn run(_args: WorkerArgs, engine: &isolane_runtime::exec::Engine) -> anyhow::Result<u8> {
    let stop = Arc::new(AtomicBool::new(false));
    // The coordinator normally stops a worker with a `stop` message; a SIGINT or SIGTERM sent to
    // the worker directly does the same, so its records still reach the coordinator.
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&stop))
            .context("installing signal handlers")?;
    }
    let roles = isolane_runtime::worker::WorkerRoles {
        engine: Some(engine.as_ref()),
        probes: Some(&isolane_session::verify::GpuProbes),
        apps: Some(&isolane_executors::app_worker::AppWorker),
    };
    let code = isolane_runtime::worker::run_worker(
        BufReader::new(std::io::stdin()),
        std::io::stdout(),
        stop,
        roles,
    );
    Ok(code.clamp(0, 255) as u8)
}
