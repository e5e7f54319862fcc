//! The stop signals of a command that runs workloads: Ctrl-C (SIGINT) and SIGTERM.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// Exit code of a process stopped by a second Ctrl-C (docs/runtime.md).
const EXIT_INTERRUPTED: i32 = 130;

#[derive(Debug, thiserror::Error)]
pub enum SignalError {
    #[error("installing the Ctrl-C handler")]
    Install(#[source] std::io::Error),
    #[error("starting the signal thread")]
    Thread(#[source] std::io::Error),
}

/// Ctrl-C (SIGINT) and SIGTERM raise the returned flag: the run stops releasing jobs and
/// writes what it measured. A second Ctrl-C while stopping exits at once (code 130), after
/// stopping any MPS daemon this process started and its clients (an exit skips destructors).
pub fn install_stop_handler() -> Result<Arc<AtomicBool>, SignalError> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let stop = Arc::new(AtomicBool::new(false));
    // The first signal raises the flag inside the handler itself, so a stop is never missed
    // even if the watcher thread below is slow to be scheduled.
    for sig in [SIGINT, SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&stop)).map_err(SignalError::Install)?;
    }
    let mut signals =
        signal_hook::iterator::Signals::new([SIGINT, SIGTERM]).map_err(SignalError::Install)?;
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
                    std::process::exit(EXIT_INTERRUPTED);
                }
            }
        })
        .map_err(SignalError::Thread)?;
    Ok(stop)
}
