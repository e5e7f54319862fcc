//! `isolane worker` (hidden): one workload of a `host = "process"` run. The coordinator starts
//! it and speaks the protocol of `isolane_runtime::protocol` on its stdin/stdout.

use std::io::BufReader;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::Context as _;
use clap::Args;

#[derive(Args)]
pub struct WorkerArgs {
    /// The workload's name: informational only (shows in `ps`), the set-up message says which
    /// workload to run.
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
    let code = isolane_runtime::worker::run_worker(
        BufReader::new(std::io::stdin()),
        std::io::stdout(),
        stop,
        Some(engine.as_ref()),
    );
    Ok(code.clamp(0, 255) as u8)
}
