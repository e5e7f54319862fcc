//! `isolane maxrate` in a partition that a process must be started in: for MPS, a process's
//! share (thread percentage, pinned memory) is fixed when CUDA starts in it, so the search runs
//! in an `isolane worker` client of the private daemon, in the protocol's `maxrate` role. The
//! partition comes from [`crate::with_partitions`], as for a run.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use isolane_core::admission::Plan;
use isolane_runtime::maxrate::{SearchEvent, SearchOutcome, SearchRequest};
use isolane_runtime::protocol::{DoneStatus, FromWorker, ToWorker, PROTOCOL_VERSION};
use isolane_runtime::worker_client::{WorkerClient, WorkerClientError, WorkerCommand};

use crate::{with_partitions, PartitionChoices, SessionError};

/// How often the wait for the worker's next message looks at the stop flag.
const STOP_POLL: Duration = Duration::from_millis(100);

/// How long a stopped worker may take to send what it has and exit before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum MaxrateError {
    #[error(transparent)]
    Session(#[from] SessionError),
    #[error("the max-rate search's worker: {0}")]
    Worker(#[from] WorkerClientError),
}

/// How a search in a worker ended.
#[derive(Debug)]
pub enum Searched {
    Done(Box<SearchOutcome>),
    /// `stop` was raised (Ctrl-C) before a rate was found.
    Interrupted,
}

/// Sets the partition of `admitted` (one workload, the search's) up on GPU `gpu`, runs the
/// search of `request` in a worker process with that partition's environment (adopted as the
/// MPS daemon's client), and takes the partition down after the worker has exited.
/// `observe` sees the worker's progress; `stop` asks the worker to stop.
pub fn search_in_partition(
    gpu: u32,
    admitted: &Plan,
    choices: PartitionChoices,
    worker: &WorkerCommand,
    request: &SearchRequest,
    stop: &AtomicBool,
    observe: &mut dyn FnMut(&SearchEvent),
) -> Result<Searched, MaxrateError> {
    let searched = with_partitions(gpu, admitted, choices, |session| {
        let env = session
            .worker_env()
            .get(&request.workload.name)
            .cloned()
            .unwrap_or_default();
        let adopt = session.client_adopter();
        search_in_worker(worker, &env, &adopt, request, stop, observe)
    })?;
    searched
}

/// Runs the search of `request` in a worker started from `worker` with extra `env`; `adopt` is
/// called with its pid as soon as it runs.
pub fn search_in_worker(
    worker: &WorkerCommand,
    env: &[(String, String)],
    adopt: &dyn Fn(u32),
    request: &SearchRequest,
    stop: &AtomicBool,
    observe: &mut dyn FnMut(&SearchEvent),
) -> Result<Searched, MaxrateError> {
    let role = ToWorker::Maxrate {
        protocol_version: PROTOCOL_VERSION,
        search: Box::new(request.clone()),
    };
    let mut client = WorkerClient::start(&request.workload.name, worker, env, &role)?;
    adopt(client.pid());
    let mut stop_sent = false;
    let mut outcome = None;
    loop {
        if stop.load(Ordering::Relaxed) && !stop_sent {
            client.send(&ToWorker::Stop)?;
            stop_sent = true;
        }
        let msg = match client.recv(STOP_POLL) {
            Err(WorkerClientError::NoAnswer { .. }) => continue,
            other => other?,
        };
        match msg {
            FromWorker::Progress { event } => observe(&event),
            FromWorker::MaxrateDone { outcome: o } => outcome = Some(o),
            FromWorker::Done { status, .. } => {
                client.finish(STOP_GRACE);
                return match (status, outcome) {
                    (DoneStatus::Ok, Some(o)) => Ok(Searched::Done(o)),
                    (DoneStatus::Interrupted, _) => Ok(Searched::Interrupted),
                    (DoneStatus::Ok, None) => Err(WorkerClientError::Failed {
                        label: request.workload.name.clone(),
                        message: "the worker finished without the search's outcome".into(),
                    }
                    .into()),
                };
            }
            other => return Err(client.unexpected(&other).into()),
        }
    }
}
