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

/// The process's one stop flag, once its handler is installed.
static STOP: std::sync::Mutex<Option<Arc<AtomicBool>>> = std::sync::Mutex::new(None);

/// Whether Ctrl-C or SIGTERM has asked this process to stop: a command made of several runs
/// (`plan --auto`'s profiles and verifications) checks it between them.
pub fn stop_requested() -> bool {
    let stop = STOP.lock().unwrap_or_else(|e| e.into_inner());
    stop.as_ref()
        .is_some_and(|s| s.load(std::sync::atomic::Ordering::SeqCst))
}

/// Ctrl-C (SIGINT) and SIGTERM raise the returned flag: the run stops releasing jobs and
/// writes what it measured. A second Ctrl-C while stopping exits at once (code 130), after
/// stopping any MPS daemon this process started and its clients (an exit skips destructors).
/// Installed once per process, every later call returning the same flag: each run of `plan
/// --auto` used to install a fresh one, so a Ctrl-C stopped only the run it fell in, and the
/// plan went on to its next profile and verification round and exited 0.
pub fn install_stop_handler() -> Result<Arc<AtomicBool>, SignalError> {
    let mut installed = STOP.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(stop) = installed.as_ref() {
        return Ok(Arc::clone(stop));
    }
    let stop = install()?;
    *installed = Some(Arc::clone(&stop));
    Ok(stop)
}

fn install() -> Result<Arc<AtomicBool>, SignalError> {
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

/// A closed pipe ends a command quietly, as it ends other Unix tools (`isolane models | head`):
/// the process's SIGPIPE handling and the panic `println!` makes on a closed stdout.
pub mod closed_pipe {
    /// SIGPIPE back to its default action (end the process), for a command that only prints;
    /// call it before any thread starts.
    pub fn restore_default_sigpipe() {
        // SAFETY: signal(2) with a valid signal number and SIG_DFL; called before any thread
        // starts.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }

    /// Whether a panic is `println!`'s on a closed stdout (or stderr): `isolane trace DIR |
    /// head -c 0` closes the pipe before anything is printed.
    pub fn is_closed_pipe_panic(payload: &(dyn std::any::Any + Send)) -> bool {
        let text = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("");
        let epipe = std::io::Error::from_raw_os_error(libc::EPIPE).to_string();
        text.starts_with("failed printing to std") && text.ends_with(&epipe)
    }

    /// A closed pipe ends a command quietly, as it ends other Unix tools (killed by SIGPIPE),
    /// for every command: the ones that start processes keep SIGPIPE ignored (the binary's
    /// `Command::only_prints`), so their `println!` panics instead. The panic says nothing, the
    /// command unwinds (partitions and processes are released on the way, as for an error),
    /// and the caller then ends by [`end_by_sigpipe`].
    pub fn quiet_on_closed_pipe() {
        let report = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !is_closed_pipe_panic(info.payload()) {
                report(info);
            }
        }));
    }

    /// Ends the process as a closed pipe ends a Unix filter: by SIGPIPE (a shell sees 141).
    pub fn end_by_sigpipe() -> std::process::ExitCode {
        restore_default_sigpipe();
        // SAFETY: raise(3) with a valid signal number; SIGPIPE's action is the default (end).
        unsafe {
            libc::raise(libc::SIGPIPE);
        }
        std::process::ExitCode::from(128 + libc::SIGPIPE as u8)
    }
}
