//! The worker's probe role: `isolane verify`'s agent of one partition (a timeslice context, an
//! MPS client, a MIG instance) in its own process, driven over the worker protocol
//! ([`crate::protocol`]: `probe`, then `measure` / `start_saturate` / `stop_saturate`).
//!
//! The probe itself is a CUDA kernel of `isolane-gpu`, which this crate does not depend on: the
//! binary passes a [`ProbeFactory`] in (`isolane_session::verify::GpuProbes`), and tests pass a
//! fake one.

use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use isolane_core::probe::ProbeResult;

use crate::protocol::{DoneStatus, FromWorker, ToWorker};
use crate::worker::{send, WorkerError};

/// One probe, set up in this process.
pub trait ProbeTarget {
    /// The probe's throughput over `duration`, alone or beside whatever else runs.
    fn measure(&mut self, duration: Duration) -> Result<ProbeResult, String>;
    /// Runs the probe flat out until `stop` is raised; returns the number of launches.
    fn saturate(&mut self, stop: &AtomicBool) -> Result<u64, String>;
}

/// Sets a probe up on a CUDA device.
pub trait ProbeFactory {
    /// `gpu` as the coordinator numbers the devices; an implementation behind an MPS daemon or
    /// a MIG binding uses the index its environment gives (`ISOLANE_WORKER_GPU`).
    fn open(&self, gpu: u32) -> Result<Box<dyn ProbeTarget>, String>;
}

/// Serves the probe role until `stop` or the end of `input`: each `measure` is answered by
/// `measured`, `start_saturate` by `saturating` and, once `stop_saturate` arrives,
/// `saturate_stopped`. A failure ends the role (the caller reports it as an `error`).
pub fn serve<R, W>(
    input: R,
    output: &mut W,
    gpu: u32,
    probes: &dyn ProbeFactory,
) -> Result<DoneStatus, WorkerError>
where
    R: BufRead + Send + 'static,
    W: Write,
{
    let mut probe = probes.open(gpu).map_err(WorkerError::Setup)?;
    send(output, &FromWorker::ProbeReady)?;
    // `stop_saturate` must reach the probe while it saturates on this thread, so a reader
    // thread raises the flag itself and forwards every other message.
    let stop_saturating = Arc::new(AtomicBool::new(false));
    let requests = read_requests(input, Arc::clone(&stop_saturating))?;
    for request in requests {
        match request? {
            ToWorker::Measure { duration_s } => {
                let duration = duration_from_secs(duration_s)?;
                let result = probe.measure(duration).map_err(WorkerError::Setup)?;
                send(output, &FromWorker::Measured { result })?;
            }
            ToWorker::StartSaturate => {
                // Lowered before `saturating` is sent: the coordinator's `stop_saturate`
                // comes only after it, so it cannot be lost.
                stop_saturating.store(false, Ordering::SeqCst);
                send(output, &FromWorker::Saturating)?;
                let launches = probe
                    .saturate(&stop_saturating)
                    .map_err(WorkerError::Setup)?;
                send(output, &FromWorker::SaturateStopped { launches })?;
            }
            ToWorker::Stop => break,
            other => {
                return Err(WorkerError::Setup(format!(
                    "unexpected message in the probe role: {other:?}"
                )))
            }
        }
    }
    Ok(DoneStatus::Ok)
}

/// A measurement's length from the wire: finite and not negative.
fn duration_from_secs(secs: f64) -> Result<Duration, WorkerError> {
    Duration::try_from_secs_f64(secs)
        .map_err(|_| WorkerError::Setup(format!("measure: {secs} is not a duration in seconds")))
}

/// The coordinator's messages after the first, on a thread of their own. `stop_saturate` (and
/// the end of input, the coordinator being gone) raises `stop_saturating`; the rest come out of
/// the returned channel, which closes at the end of input.
fn read_requests<R>(
    mut input: R,
    stop_saturating: Arc<AtomicBool>,
) -> Result<mpsc::Receiver<Result<ToWorker, WorkerError>>, WorkerError>
where
    R: BufRead + Send + 'static,
{
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("isolane-probe-stdin".into())
        .spawn(move || {
            let mut line = String::new();
            loop {
                line.clear();
                match input.read_line(&mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
                let request = serde_json::from_str::<ToWorker>(&line).map_err(|e| {
                    WorkerError::Setup(format!("malformed message from the coordinator: {e}"))
                });
                if matches!(request, Ok(ToWorker::StopSaturate)) {
                    stop_saturating.store(true, Ordering::SeqCst);
                } else if tx.send(request).is_err() {
                    break;
                }
            }
            stop_saturating.store(true, Ordering::SeqCst);
        })?;
    Ok(rx)
}
