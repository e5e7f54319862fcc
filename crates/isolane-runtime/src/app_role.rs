//! The worker's app role: one `[[app]]` of `isolane run` in its own process (an MPS client with
//! its thread percentage and pinned memory limit, or a time slice of the GPU), driven over the
//! worker protocol ([`crate::protocol`]: `app`, `app_ready`, `start`, `app_done`).
//!
//! The app itself (its stages, threads and records) is `isolane-app`'s, which this crate does
//! not depend on: the binary passes an [`AppRunner`] in, and tests pass a fake one. This module
//! is the handshake around it: ready once every stage is built, the coordinator's t0 (one
//! CLOCK_MONOTONIC for every process of the machine), `stop` at any time after the start, and
//! the records back, typed.

use std::io::{BufRead, Write};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use isolane_core::app_records::AppRecords;

use crate::protocol::{AppSetup, DoneStatus, FromWorker, ToWorker};
use crate::worker::{read_line, send, watch_for_stop, WorkerError};

/// Runs one app in this process.
pub trait AppRunner {
    /// Builds the app of `setup`, then calls `start` once every stage is built and warmed up:
    /// it reports ready and returns the t0 to release the first frame at, or why not to run
    /// (the run then ends without frames). Runs the app to its last frame or until `stop` is
    /// raised, and returns what it measured; `Err`: the app could not be set up.
    fn run(
        &self,
        setup: &AppSetup,
        start: &mut dyn FnMut() -> Result<i64, String>,
        stop: &AtomicBool,
    ) -> Result<AppRecords, String>;
}

/// Serves the app role: the runner's `start` sends `app_ready` and waits for `start` (or
/// `abort`), after which a `stop` or the coordinator going away raises `stop`; the records go
/// back as `app_done`. The caller sends `done` (or `error`).
pub fn serve<R, W>(
    input: R,
    output: &mut W,
    setup: &AppSetup,
    runner: &dyn AppRunner,
    stop: &Arc<AtomicBool>,
) -> Result<DoneStatus, WorkerError>
where
    R: BufRead + Send + 'static,
    W: Write,
{
    let mut input = Some(input);
    let mut aborted = false;
    let records = {
        let out = &mut *output;
        let aborted = &mut aborted;
        let mut start = || -> Result<i64, String> {
            let mut input = input.take().ok_or("the app asked to start twice")?;
            send(out, &FromWorker::AppReady).map_err(|e| e.to_string())?;
            let t0 = wait_for_start(&mut input).map_err(|e| e.to_string())?;
            let Some(t0) = t0 else {
                *aborted = true;
                return Err("aborted by the coordinator before the start".into());
            };
            watch_for_stop(input, stop).map_err(|e| e.to_string())?;
            Ok(t0)
        };
        runner.run(setup, &mut start, stop)
    };
    if aborted {
        return Ok(DoneStatus::Interrupted);
    }
    // The coordinator names the app (it started this worker for it).
    let records = records.map_err(WorkerError::Setup)?;
    send(
        output,
        &FromWorker::AppDone {
            records: Box::new(records),
        },
    )?;
    Ok(if stop.load(std::sync::atomic::Ordering::Relaxed) {
        DoneStatus::Interrupted
    } else {
        DoneStatus::Ok
    })
}

/// The coordinator's answer to `app_ready`: `Some(t0)`, or `None` for `abort` (or `stop`).
fn wait_for_start(input: &mut impl BufRead) -> Result<Option<i64>, WorkerError> {
    let line = read_line(input, "starting the app")?;
    let msg: ToWorker = serde_json::from_str(&line)
        .map_err(|e| WorkerError::Setup(format!("malformed start message: {e}")))?;
    match msg {
        ToWorker::Start { t0_ns } => Ok(Some(t0_ns)),
        ToWorker::Abort | ToWorker::Stop => Ok(None),
        _ => Err(WorkerError::Setup(
            "expected `start` or `abort` after `app_ready`".into(),
        )),
    }
}
