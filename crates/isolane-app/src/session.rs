//! One run of a scenario's `[[app]]`s, as `isolane run` does it (docs/apps.md): the apps'
//! models checked as workloads (core's partition rules), sources and model files opened before
//! anything is written ([`check`]), graphics stages pinned to their GPUs' Vulkan devices
//! ([`place`]), then ([`run`]) the partitions set up by the partition session, the apps run
//! (in threads, [`crate::run`], or in worker processes, [`crate::workers`]), device telemetry
//! around them, live metrics fed as frames go through (`--metrics-addr`), and
//! `apps/<app>.csv` and summary.json written. The command turns flags into an [`AppRun`],
//! admits the workloads and prints the tables.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use isolane_core::admission::Plan;
use isolane_core::results::{PartitionRecord, RunStatus, RunSummary};
use isolane_core::spec::{Criticality, Host, Scenario};
use isolane_gpu::partitions::Urgency;
use isolane_gpu::GreenGroup;
use isolane_metrics::{AppInfo, AppMeters, RunMetrics, WorkloadInfo};
use isolane_runtime::output;
use isolane_runtime::partition::Partition;
use isolane_runtime::worker_client::WorkerCommand;
use isolane_session::{Observer, PartitionChoices};

use crate::models::ModelBuilder;
use crate::partitions::{
    as_workloads, check_device, check_gpu_stages, check_gpus, check_process_partitions,
    partition_workload, workload_name,
};
use crate::protection::{protects, AppGuard};
use crate::run::{run_apps_observed, RunOutcome, RunSettings};
use crate::spec::{parse_apps, AppSpec, EngineModels, StageKind};
use crate::workers::{run_in_workers, WorkerRun};

#[derive(Debug, thiserror::Error)]
pub enum AppRunError {
    /// The user's to fix (exit code 2): the message names the file and the field.
    #[error("{0}")]
    Refused(String),
    /// Setting the partitions up or taking them down.
    #[error(transparent)]
    Session(#[from] isolane_session::SessionError),
    /// The run itself (a file that could not be written, an app that could not be set up).
    #[error("{0}")]
    Failed(String),
}

impl AppRunError {
    /// A mistake of the user's (exit code 2 at the CLI).
    pub fn is_user_error(&self) -> bool {
        match self {
            AppRunError::Refused(_) => true,
            AppRunError::Session(e) => e.is_user_error(),
            AppRunError::Failed(_) => false,
        }
    }
}

fn refused(m: impl std::fmt::Display) -> AppRunError {
    AppRunError::Refused(m.to_string())
}

fn failed(m: impl std::fmt::Display) -> AppRunError {
    AppRunError::Failed(m.to_string())
}

/// The `[[app]]`s of the scenario file `path`, whose text is `text` (none: an ordinary
/// scenario).
pub fn apps_of(text: &str, path: &Path) -> Result<Vec<AppSpec>, AppRunError> {
    parse_apps(text, path, &EngineModels).map_err(refused)
}

/// Everything that can be found wrong with `apps` before anything runs or is written: the
/// apps' cores, their models as the workloads of a scenario on the same device (core's
/// rules: a partition key the mechanism does not take, a precision the CPU does not run),
/// their sources and model files. Returns those workloads, for admission. `no_plan_check`:
/// every model is built without checking its plan (`--no-plan-check`).
pub fn check(
    scenario: &Scenario,
    apps: &mut [AppSpec],
    file: &str,
    no_plan_check: bool,
) -> Result<Scenario, AppRunError> {
    if no_plan_check {
        for m in apps.iter_mut().flat_map(AppSpec::models_mut) {
            m.plan_check = false;
        }
    }
    for (i, app) in apps.iter().enumerate() {
        isolane_runtime::affinity::check_cores(&app.cpu)
            .map_err(|e| refused(format!("{file}: app[{i}].cpu: {e}")))?;
    }
    let workloads = model_workloads(scenario, apps, file)?;
    preflight(apps, file)?;
    Ok(workloads)
}

/// The apps' models as the workloads of a scenario on the same device, checked by core's
/// rules (a partition key the mechanism does not take, a precision the CPU does not run).
pub fn model_workloads(
    scenario: &Scenario,
    apps: &[AppSpec],
    file: &str,
) -> Result<Scenario, AppRunError> {
    if !scenario.workloads.is_empty() {
        return Err(refused(format!(
            "{file}: [[app]]s beside [[workload]]s in one run are not built yet; put them in \
             separate scenario files"
        )));
    }
    check_device(&scenario.device)
        .map_err(|m| refused(format!("{file}: device.mechanism: {m}")))?;
    let field = |(field, m): (String, String)| refused(format!("{file}: {field}: {m}"));
    check_gpu_stages(&scenario.device, apps).map_err(field)?;
    check_process_partitions(apps, scenario.device.host).map_err(field)?;
    // Apps on several GPUs: each app's workloads name its GPU (admission and partitions per
    // GPU, as for [[workload]]s); its graphics stages are pinned to GPUs in [`place`].
    check_gpus(&scenario.device, apps).map_err(field)?;
    let mut s = scenario.clone();
    s.workloads = as_workloads(apps, &scenario.device);
    if s.workloads.is_empty() {
        // Apps of CPU operators only: no model, nothing to partition.
        return Ok(s);
    }
    let models: Vec<&str> = isolane_engine::builtin_models()
        .iter()
        .map(|m| m.name)
        .collect();
    s.validate(&models).map_err(|e| {
        // Core names a workload by its index; here that is a model of an app (or, in a
        // process, the app), by its name.
        let mut text = e.to_string();
        for (i, w) in s.workloads.iter().enumerate() {
            text = text.replace(
                &format!("workload[{i}]."),
                &format!("app model `{}`: ", w.name),
            );
        }
        refused(format!("{file}: {text}"))
    })?;
    Ok(s)
}

/// Sources are opened and model files read once before anything is written, so that one that
/// cannot be used is the user's to fix (exit 2, no output), as a workload's is. Built-ins
/// without a weights file cannot fail here (their names were validated).
fn preflight(apps: &[AppSpec], file: &str) -> Result<(), AppRunError> {
    for (i, app) in apps.iter().enumerate() {
        // A source file that cannot be read (a folder without images, a file that is not
        // .y4m) is the user's too.
        crate::source::open(&app.source.kind)
            .map_err(|e| refused(format!("{file}: app[{i}].source: {e}")))?;
        for m in app.models() {
            if m.model.ends_with(".onnx") || m.weights.is_some() {
                crate::models::load_graph(m, 0).map_err(|e| {
                    refused(format!(
                        "{file}: app model `{}`: {e}",
                        workload_name(app, &m.name)
                    ))
                })?;
            }
        }
    }
    Ok(())
}

/// Pins each graphics stage to the Vulkan device of its CUDA GPU and gives each GPU stage its
/// GPU. After admission, which has found the GPUs (a machine without CUDA is told so there).
pub fn place(apps: &mut [AppSpec], scenario: &Scenario, file: &str) -> Result<(), AppRunError> {
    crate::placement::pin_render_devices(apps, &scenario.device, &cuda_uuid)
        .map_err(|(field, m)| refused(format!("{file}: {field}: {m}")))?;
    crate::placement::resolve_compute_gpus(apps, &scenario.device);
    Ok(())
}

/// The UUID of CUDA GPU `index` as this process numbers the GPUs (the numbering of
/// `device.gpus`), for the Vulkan device of a graphics stage pinned to it.
fn cuda_uuid(index: u32) -> Result<String, String> {
    let devices = isolane_gpu::devices::list_devices().map_err(|e| e.to_string())?;
    devices
        .iter()
        .find(|d| d.index == index)
        .map(|d| d.uuid.clone())
        .ok_or_else(|| {
            format!(
                "GPU {index} renders here, but this machine has {} CUDA device(s)",
                devices.len()
            )
        })
}

/// One run of checked and placed apps.
pub struct AppRun<'a> {
    pub scenario: &'a Scenario,
    /// The scenario file as given (messages, summary.json's `scenario`, the workers' file).
    pub file: &'a str,
    /// Its text, read once by the caller (the workers parse it as written).
    pub text: &'a str,
    pub apps: &'a [AppSpec],
    /// [`check`]'s workloads, and their admission (`None`: nothing to partition).
    pub workloads: &'a Scenario,
    pub admitted: Option<Plan>,
    pub choices: PartitionChoices,
    /// Raised by Ctrl-C: no new frame is released, what was measured is kept.
    pub stop: &'a AtomicBool,
    /// The results folder, made by the caller.
    pub out: &'a Path,
    pub no_plan_check: bool,
    /// Builds the stages' models (the engine's executors).
    pub models: Arc<dyn ModelBuilder + Send>,
    /// A green group as a partition the models take.
    pub share: fn(GreenGroup) -> Partition,
    /// `--metrics-addr`'s metrics, fed while the apps run.
    pub metrics: Option<&'a Arc<RunMetrics>>,
    /// Telemetry's warnings.
    pub observer: &'a mut dyn Observer,
}

/// What a run of apps measured: the records and summary.json as written.
pub struct Ran {
    pub outcome: RunOutcome,
    pub summary: RunSummary,
}

/// Runs the apps of `r` and writes `apps/<app>.csv` and summary.json into `r.out`.
pub fn run(r: AppRun<'_>) -> Result<Ran, AppRunError> {
    let started_at = chrono::Utc::now();
    let meters = r.metrics.map(|m| begin_metrics(m, &r));
    // Device telemetry (cuda) around the run, as for workloads: telemetry.csv and summary.json's
    // `telemetry`. Without NVML the run goes on with a warning.
    let hook = r.metrics.map(|m| {
        let m = Arc::clone(m);
        Arc::new(move |reading: &isolane_telemetry::Reading| m.observe_device(reading))
            as isolane_telemetry::SampleHook
    });
    let telemetry = isolane_session::telemetry::start(r.scenario, hook, &mut *r.observer);
    let guard = AppGuard::create(r.apps, &r.scenario.protection)
        .map_err(|e| failed(format!("creating the criticality guard's shared file: {e}")))?;
    let (outcome, records) = match r.scenario.device.host {
        Host::Thread => in_threads(&r, &guard, meters.as_ref())?,
        Host::Process => {
            let ran = in_processes(&r, &guard)?;
            // A worker sends its records when it ends: they reach the metrics then.
            if let (Ok(outcome), Some(m)) = (&ran.0, &meters) {
                observe_all(m, outcome);
            }
            ran
        }
    };
    let outcome = outcome.map_err(failed)?;
    let host = r.scenario.device.host;
    let mut summary = summary(r.apps, &outcome, &records, r.file, started_at, host);
    let window = (Some(outcome.t0_ns), outcome.wall_s);
    isolane_session::telemetry::finish(
        telemetry,
        r.scenario,
        r.out,
        window,
        &mut summary,
        &mut *r.observer,
    );
    summary.interrupted = r.stop.load(Ordering::Relaxed);
    if summary.interrupted {
        summary.status = RunStatus::Interrupted;
    }
    write_files(r.out, r.apps, &outcome, &summary)?;
    Ok(Ran { outcome, summary })
}

/// Announces the run to `metrics`: the partitions of its workloads, and every app's and
/// stage's series.
fn begin_metrics(metrics: &RunMetrics, r: &AppRun<'_>) -> AppMeters {
    let device = &r.scenario.device;
    let partitions: Vec<WorkloadInfo> = r
        .workloads
        .workloads
        .iter()
        .map(|w| {
            let resolved = r
                .admitted
                .as_ref()
                .and_then(|p| p.workloads.iter().find(|a| a.workload == w.name))
                .map(|a| &a.partition);
            WorkloadInfo {
                name: w.name.clone(),
                mechanism: device.mechanism.name().into(),
                partition: isolane_session::live::partition_words(device.backend, resolved),
                host: match device.host {
                    Host::Process => "process".into(),
                    Host::Thread => "thread".into(),
                },
            }
        })
        .collect();
    let apps: Vec<AppInfo> = r
        .apps
        .iter()
        .map(|a| AppInfo {
            name: a.name.clone(),
            deadline_ns: a.deadline_ns(),
            stages: a.stages.iter().map(|s| s.name.clone()).collect(),
            sink: a
                .stages
                .iter()
                .position(|s| s.kind == StageKind::Sink)
                .unwrap_or(usize::MAX),
        })
        .collect();
    metrics.begin_apps("run", r.file, &partitions, &apps)
}

/// Every record of `outcome` to `meters`, stage by stage.
fn observe_all(meters: &AppMeters, outcome: &RunOutcome) {
    for (a, rec) in outcome.apps.iter().enumerate() {
        for (j, stage) in rec.stages.iter().enumerate() {
            for s in stage {
                let release = rec.release_ns.get(s.frame as usize).copied().unwrap_or(0);
                meters.stage_done(a, j, release, s);
            }
        }
    }
}

type Outcome = (
    Result<RunOutcome, crate::run::RunError>,
    Vec<PartitionRecord>,
);

/// Runs the apps in threads, inside their models' partitions when the run has any (a GPU):
/// each green group reaches its model by the model's workload name. Returns what each
/// partition was.
fn in_threads(
    r: &AppRun<'_>,
    guard: &AppGuard,
    meters: Option<&AppMeters>,
) -> Result<Outcome, AppRunError> {
    let settings = |partitions: HashMap<String, Partition>| RunSettings {
        device: &r.scenario.device,
        timing: &r.scenario.timing,
        models: r.models.clone(),
        partitions,
        stop: r.stop,
        out: Some(r.out),
        start: None,
        guard: guard.clone(),
    };
    let Some(plan) = &r.admitted else {
        return Ok((
            run_apps_observed(r.apps, settings(HashMap::new()), meters),
            Vec::new(),
        ));
    };
    let ran = isolane_session::with_urgent_partitions(
        r.scenario.device.gpu,
        plan,
        r.choices,
        urgency(r.scenario, r.apps),
        |session| {
            let mut parts: HashMap<String, Partition> = HashMap::new();
            for w in &r.workloads.workloads {
                if let Some(g) = session.take_green_group(&w.name) {
                    parts.insert(w.name.clone(), (r.share)(g));
                }
            }
            let records = session.records().to_vec();
            let outcome = run_apps_observed(r.apps, settings(parts), meters);
            Ok::<_, std::convert::Infallible>((outcome, records))
        },
    )?;
    match ran {
        Ok(r) => Ok(r),
        Err(never) => match never {},
    }
}

/// Runs each app in a worker process of its own (`host = "process"`), inside the partitions of
/// the admission when the run has any: each app's process gets its workload's environment
/// (under MPS: the private daemon's pipe, the app's thread percentage and pinned memory
/// limit).
fn in_processes(r: &AppRun<'_>, guard: &AppGuard) -> Result<Outcome, AppRunError> {
    let command = WorkerCommand::isolane().map_err(|e| {
        failed(format!(
            "finding the isolane executable for the app workers: {e}"
        ))
    })?;
    let workers = |env: &BTreeMap<String, Vec<(String, String)>>, on_start: &dyn Fn(u32)| {
        let w = WorkerRun {
            command: &command,
            scenario: Path::new(r.file),
            text: r.text,
            device: &r.scenario.device,
            timing: &r.scenario.timing,
            out: Some(r.out),
            no_plan_check: r.no_plan_check,
            env,
            on_start,
            stop: r.stop,
            guard,
        };
        run_in_workers(r.apps, &w)
    };
    let Some(plan) = &r.admitted else {
        return Ok((workers(&BTreeMap::new(), &|_| {}), Vec::new()));
    };
    let ran = isolane_session::with_urgent_partitions(
        r.scenario.device.gpu,
        plan,
        r.choices,
        urgency(r.scenario, r.apps),
        |session| {
            let env = session.worker_env().clone();
            let adopt = session.client_adopter();
            let records = session.records().to_vec();
            Ok::<_, std::convert::Infallible>((workers(&env, &adopt), records))
        },
    )?;
    match ran {
        Ok(r) => Ok(r),
        Err(never) => match never {},
    }
}

/// In a protected run with `[protection] priorities` on, critical apps' models go first where
/// the hardware arbitrates (their streams at the greatest priority) and best-effort apps' MPS
/// clients go last, as for workloads (docs/criticality.md, Apps); otherwise nobody does.
fn urgency(scenario: &Scenario, apps: &[AppSpec]) -> Urgency {
    if !protects(apps, &scenario.protection) || !scenario.protection.priorities {
        return Urgency::default();
    }
    let host = scenario.device.host;
    // Each app's partitions by their workload names: its models' on threads, its own in a
    // worker process.
    let named = |c: Criticality| {
        apps.iter()
            .filter(|a| a.criticality == c)
            .flat_map(|a| {
                a.models()
                    .into_iter()
                    .map(move |m| partition_workload(a, &m.name, host))
            })
            .collect()
    };
    Urgency {
        urgent: named(Criticality::Critical),
        background: named(Criticality::BestEffort),
    }
}

fn summary(
    apps: &[AppSpec],
    outcome: &RunOutcome,
    records: &[PartitionRecord],
    scenario_name: &str,
    started_at: chrono::DateTime<chrono::Utc>,
    host: Host,
) -> RunSummary {
    let mut s = RunSummary::new("run");
    s.started_at = started_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    s.host = output::host_name();
    s.scenario = scenario_name.to_string();
    s.t0_monotonic_ns = Some(outcome.t0_ns);
    s.wall_s = outcome.wall_s;
    s.partitions = records.to_vec();
    s.apps = apps
        .iter()
        .zip(&outcome.apps)
        .map(|(app, rec)| {
            let partition = |model: &str| {
                let name = partition_workload(app, model, host);
                records
                    .iter()
                    .find(|r| r.workload == name)
                    .map_or_else(|| "cpu".to_string(), |r| r.partition.clone())
            };
            crate::metrics::summarize(app, rec, &partition)
        })
        .collect();
    if outcome.apps.iter().any(|r| r.error.is_some()) {
        s.status = RunStatus::Failed;
    }
    s
}

/// apps/<app>.csv for every app, then summary.json last.
fn write_files(
    out: &Path,
    apps: &[AppSpec],
    outcome: &RunOutcome,
    summary: &RunSummary,
) -> Result<(), AppRunError> {
    let dir = out.join("apps");
    std::fs::create_dir_all(&dir)
        .map_err(|e| failed(format!("creating {}: {e}", dir.display())))?;
    for (app, rec) in apps.iter().zip(&outcome.apps) {
        let csv = crate::metrics::frames_csv(app, rec);
        output::write_atomic(&dir.join(format!("{}.csv", app.name)), csv.as_bytes())
            .map_err(failed)?;
    }
    isolane_core::results::write_json(&out.join("summary.json"), summary).map_err(failed)?;
    Ok(())
}
