//! The coordinator's side of apps in worker processes (`[device] host = "process"`, the default
//! of MPS and time-slicing): one `isolane worker` per app in the worker protocol's `app` role
//! (`isolane_runtime::app_role`), started with its workload's environment (under MPS: the
//! private daemon's pipe, the app's thread percentage and pinned memory limit), all built
//! before one t0 (CLOCK_MONOTONIC is one clock for every process of the machine), their
//! records sent back typed ([`crate::run::AppRecords`]). The worker side is the binary's (it
//! builds models on the engine's backends).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use isolane_core::spec::{DeviceSpec, TimingSpec};
use isolane_runtime::clock;
use isolane_runtime::protocol::{AppSetup, FromWorker, ToWorker, PROTOCOL_VERSION};
use isolane_runtime::worker_client::{WorkerClient, WorkerClientError, WorkerCommand};

use crate::protection::AppGuard;
use crate::run::{AppRecords, RunError, RunOutcome};
use crate::spec::AppSpec;

/// How long an app worker may take to build its stages (CUDA set-up, cuDNN's algorithm
/// search, model compilation) and report ready.
const READY_TIMEOUT: Duration = Duration::from_secs(900);
/// How often the coordinator looks at the stop flag while it waits for records.
const POLL: Duration = Duration::from_millis(200);

/// What every app worker of a run shares.
pub struct WorkerRun<'a> {
    /// How to start `isolane worker` (`WorkerCommand::isolane()`; tests pass a script).
    pub command: &'a WorkerCommand,
    pub scenario: &'a Path,
    pub text: &'a str,
    pub device: &'a DeviceSpec,
    pub timing: &'a TimingSpec,
    pub out: Option<&'a Path>,
    pub no_plan_check: bool,
    /// Extra environment per workload name (the partition session's: MPS client settings).
    pub env: &'a BTreeMap<String, Vec<(String, String)>>,
    /// Called with each worker's pid (the session adopts MPS clients, to end them first).
    pub on_start: &'a dyn Fn(u32),
    pub stop: &'a AtomicBool,
    /// The apps' parts in the run's criticality guard, which stays here (the workers map its
    /// file).
    pub guard: &'a AppGuard,
}

/// Runs each app in a worker process of its own: starts them all, waits until every one is
/// built, releases them at one t0, and collects their records (in `apps`' order). An app that
/// cannot be built stops the run before any frame (the others are aborted); one that fails
/// later keeps its error in its records, as a failed stage does in-process.
pub fn run_in_workers(apps: &[AppSpec], run: &WorkerRun<'_>) -> Result<RunOutcome, RunError> {
    let mut clients = Vec::new();
    for (a, app) in apps.iter().enumerate() {
        let env = run
            .env
            .get(&app.name)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let role = ToWorker::App {
            protocol_version: PROTOCOL_VERSION,
            setup: Box::new(setup_for(run, app, a)),
        };
        let label = format!("app `{}`", app.name);
        // The client's errors name the app (its label).
        let client = WorkerClient::start(&label, run.command, env, &role)
            .map_err(|e| RunError::Worker(e.to_string()))?;
        (run.on_start)(client.pid());
        clients.push(client);
    }
    // Dropping the clients on an error stops every worker (`stop`, then EOF).
    for (app, client) in apps.iter().zip(&mut clients) {
        wait_ready(app, client, run.stop)?;
    }
    let t0 = clock::now_ns() + run.timing.start_delay_ms as i64 * 1_000_000;
    for client in &mut clients {
        client
            .send(&ToWorker::Start { t0_ns: t0 })
            .map_err(|e| RunError::Worker(e.to_string()))?;
    }
    let mut stopped = false;
    let records = apps
        .iter()
        .zip(&mut clients)
        .map(|(app, c)| {
            let records = records_of(app, c, run.stop, &mut stopped);
            // A worker that died never freed its guard slot; best effort must not wait for it.
            run.guard.finish(&app.name);
            records
        })
        .collect::<Vec<_>>();
    if stopped {
        for c in &mut clients {
            let _ = c.send(&ToWorker::Stop);
        }
    }
    for c in clients {
        c.finish(Duration::from_secs(5));
    }
    Ok(RunOutcome {
        apps: records,
        t0_ns: t0,
        wall_s: (clock::now_ns() - t0) as f64 / 1e9,
    })
}

/// Waits for a worker's `app_ready`, looking at the stop flag meanwhile: a Ctrl-C while the
/// apps are being built ends the run before any frame.
fn wait_ready(app: &AppSpec, client: &mut WorkerClient, stop: &AtomicBool) -> Result<(), RunError> {
    let deadline = std::time::Instant::now() + READY_TIMEOUT;
    loop {
        if stop.load(Ordering::Relaxed) {
            return Err(RunError::Setup {
                app: app.name.clone(),
                message: "interrupted before the start".into(),
            });
        }
        match client.recv(POLL) {
            Ok(FromWorker::AppReady) => return Ok(()),
            Ok(other) => return Err(RunError::Worker(client.unexpected(&other).to_string())),
            Err(WorkerClientError::NoAnswer { .. }) if std::time::Instant::now() < deadline => {}
            Err(e) => return Err(RunError::Worker(e.to_string())),
        }
    }
}

/// The set-up of app `a`: its seed is the one its stages get in-process (`run_apps` seeds stage
/// `j` of app `a` with `seed ^ (a << 32 | j)`; alone in its worker the app is app 0), so a
/// built-in model gets the same synthetic weights in a worker as in a thread.
fn setup_for(run: &WorkerRun<'_>, app: &AppSpec, a: usize) -> AppSetup {
    let mut timing = run.timing.clone();
    timing.seed ^= (a as u64) << 32;
    AppSetup {
        scenario: PathBuf::from(run.scenario),
        text: run.text.to_string(),
        app: app.name.clone(),
        device: run.device.clone(),
        timing,
        out: run.out.map(Path::to_path_buf),
        no_plan_check: run.no_plan_check,
        render_devices: crate::placement::render_devices(app),
        guard: run.guard.setup(&app.name).cloned(),
    }
}

/// The records one worker sends back; while waiting, a raised `stop` is passed on to every
/// worker once (through `stopped`: the caller tells the others). A worker that fails or exits
/// gives records with its error and no frames.
fn records_of(
    app: &AppSpec,
    client: &mut WorkerClient,
    stop: &AtomicBool,
    stopped: &mut bool,
) -> AppRecords {
    loop {
        if stop.load(Ordering::Relaxed) && !*stopped {
            *stopped = true;
            let _ = client.send(&ToWorker::Stop);
        }
        match client.recv(POLL) {
            Ok(FromWorker::AppDone { records }) => return *records,
            Ok(_) => {}
            Err(WorkerClientError::NoAnswer { .. }) => {}
            Err(e) => {
                return AppRecords {
                    stages: vec![Vec::new(); app.stages.len()],
                    error: Some(e.to_string()),
                    ..Default::default()
                }
            }
        }
    }
}
