//! `isolane run` of a scenario with `[[app]]`s: the apps' models checked as workloads (core's
//! partition rules and admission control), their partitions set up, the apps run by
//! isolane-app, and summary.json (`apps`), `apps/<app>.csv` and the tables written
//! (docs/apps.md).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::Context as _;
use isolane_app::partitions::{
    as_workloads, check_device, check_gpu_stages, check_gpus, check_process_partitions,
    partition_workload, workload_name,
};
use isolane_app::protection::{protects, AppGuard};
use isolane_app::run::{run_apps, RunError, RunOutcome, RunSettings};
use isolane_app::spec::{parse_apps, AppSpec, EngineModels};
use isolane_core::results::{AppSummary, PartitionRecord, RunStatus, RunSummary};
use isolane_core::spec::{Criticality, Host, Scenario};
use isolane_gpu::partitions::Urgency;
use isolane_runtime::output;
use isolane_runtime::partition::Partition;

use super::run::RunArgs;
use super::user;
use isolane_app::workers::{run_in_workers, WorkerRun};

/// The `[[app]]`s of the scenario file `path`, whose text is `text` (none: an ordinary
/// scenario).
pub fn apps_of(text: &str, path: &Path) -> anyhow::Result<Vec<AppSpec>> {
    parse_apps(text, path, &EngineModels).map_err(user)
}

/// The apps' models as the workloads of a scenario on the same device, checked by core's
/// rules (a partition key the mechanism does not take, a precision the CPU does not run).
pub fn model_workloads(
    scenario: &Scenario,
    apps: &[AppSpec],
    file: &str,
) -> anyhow::Result<Scenario> {
    if !scenario.workloads.is_empty() {
        return Err(user(format!(
            "{file}: [[app]]s beside [[workload]]s in one run are not built yet; put them in \
             separate scenario files"
        )));
    }
    check_device(&scenario.device).map_err(|m| user(format!("{file}: device.mechanism: {m}")))?;
    check_gpu_stages(&scenario.device, apps)
        .map_err(|(field, m)| user(format!("{file}: {field}: {m}")))?;
    check_process_partitions(apps, scenario.device.host)
        .map_err(|(field, m)| user(format!("{file}: {field}: {m}")))?;
    // Apps on several GPUs: each app's workloads name its GPU (admission and partitions per
    // GPU, as for [[workload]]s); its graphics stages are pinned to GPUs in `run`.
    check_gpus(&scenario.device, apps)
        .map_err(|(field, m)| user(format!("{file}: {field}: {m}")))?;
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
        user(format!("{file}: {text}"))
    })?;
    Ok(s)
}

/// `text`: the scenario file's text, as read once by the caller (written to scenario.toml and
/// given to the workers).
pub fn run(
    scenario: Scenario,
    scenario_name: String,
    text: &str,
    mut apps: Vec<AppSpec>,
    args: &RunArgs,
) -> anyhow::Result<u8> {
    if args.trace || args.metrics_addr.is_some() {
        return Err(user(
            "--trace and --metrics-addr are not built for scenarios with [[app]]s yet (docs/apps.md, \
             What is built)",
        ));
    }
    if args.no_plan_check {
        for m in apps.iter_mut().flat_map(AppSpec::models_mut) {
            m.plan_check = false;
        }
    }
    for (i, app) in apps.iter().enumerate() {
        isolane_runtime::affinity::check_cores(&app.cpu)
            .map_err(|e| user(format!("{scenario_name}: app[{i}].cpu: {e}")))?;
    }
    let workloads = model_workloads(&scenario, &apps, &scenario_name)?;
    preflight(&apps, &scenario_name)?;
    let admitted = super::admit_or_refuse(&workloads, &scenario_name)?;
    // After admission, which has found the GPUs (a machine without CUDA is told so there).
    isolane_app::placement::pin_render_devices(&mut apps, &scenario.device, &cuda_uuid)
        .map_err(|(field, m)| user(format!("{scenario_name}: {field}: {m}")))?;
    isolane_app::placement::resolve_compute_gpus(&mut apps, &scenario.device);
    let out = super::run::prepare_out(args.out.as_deref(), args.force)?;
    output::write_atomic(&out.join("scenario.toml"), text.as_bytes())?;
    let stop = super::install_stop_handler()?;
    let started_at = chrono::Utc::now();
    // Device telemetry (cuda) around the run, as for workloads: telemetry.csv and summary.json's
    // `telemetry`. Without NVML the run goes on with a warning.
    let mut view = super::ProgressView::new(args.quiet);
    let telemetry = isolane_session::telemetry::start(&scenario, None, &mut view);
    let (outcome, records) = match scenario.device.host {
        Host::Thread => {
            run_in_partitions(&scenario, &apps, &workloads, admitted, args, &stop, &out)?
        }
        Host::Process => {
            // The workers parse the file as written to scenario.toml (read once, by the caller).
            let run = ProcessRun {
                scenario: &scenario,
                file: Path::new(&scenario_name),
                text,
                args,
                stop: &stop,
                out: &out,
            };
            run_in_processes(&run, &apps, admitted)?
        }
    };
    let outcome = outcome.map_err(|e| anyhow::anyhow!(e))?;
    let host = scenario.device.host;
    let mut summary = summary(&apps, &outcome, &records, &scenario_name, started_at, host);
    let window = (Some(outcome.t0_ns), outcome.wall_s);
    isolane_session::telemetry::finish(telemetry, &scenario, &out, window, &mut summary, &mut view);
    summary.interrupted = stop.load(std::sync::atomic::Ordering::Relaxed);
    if summary.interrupted {
        summary.status = RunStatus::Interrupted;
    }
    write_files(&out, &apps, &outcome, &summary)?;
    println!("{}", tables(&scenario, &summary.apps));
    for (app, rec) in apps.iter().zip(&outcome.apps) {
        if let Some(e) = &rec.error {
            eprintln!("app `{}` failed: {e}", app.name);
        }
    }
    for warning in summary
        .apps
        .iter()
        .filter_map(isolane_app::metrics::late_source_warning)
    {
        eprintln!("{warning}");
    }
    println!("results: {}", out.display());
    Ok(super::run::exit_for(summary.status))
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

/// Sources are opened and model files read once before anything is written, so that one that
/// cannot be used is the user's to fix (exit 2, no output), as a workload's is. Built-ins without a weights file
/// cannot fail here (their names were validated).
fn preflight(apps: &[AppSpec], file: &str) -> anyhow::Result<()> {
    for (i, app) in apps.iter().enumerate() {
        // A source file that cannot be read (a folder without images, a file that is not
        // .y4m) is the user's too.
        isolane_app::source::open(&app.source.kind)
            .map_err(|e| user(format!("{file}: app[{i}].source: {e}")))?;
        for m in app.models() {
            if m.model.ends_with(".onnx") || m.weights.is_some() {
                isolane_app::models::load_graph(m, 0).map_err(|e| {
                    user(format!(
                        "{file}: app model `{}`: {e}",
                        workload_name(app, &m.name)
                    ))
                })?;
            }
        }
    }
    Ok(())
}

/// Runs the apps, inside their models' partitions when the run has any (a GPU): each green
/// group reaches its model by the model's workload name. Returns what each partition was.
fn run_in_partitions(
    scenario: &Scenario,
    apps: &[AppSpec],
    workloads: &Scenario,
    admitted: Option<isolane_core::admission::Plan>,
    args: &RunArgs,
    stop: &AtomicBool,
    out: &Path,
) -> anyhow::Result<(Result<RunOutcome, RunError>, Vec<PartitionRecord>)> {
    let guard = AppGuard::create(apps, &scenario.protection)
        .context("creating the criticality guard's shared file")?;
    let settings = |partitions: HashMap<String, Partition>| RunSettings {
        device: &scenario.device,
        timing: &scenario.timing,
        models: Arc::new(isolane_executors::app_models::AppModels),
        partitions,
        stop,
        out: Some(out),
        start: None,
        guard: guard.clone(),
    };
    let Some(plan) = admitted else {
        return Ok((run_apps(apps, settings(HashMap::new())), Vec::new()));
    };
    let ran = isolane_session::with_urgent_partitions(
        scenario.device.gpu,
        &plan,
        args.partitions.choices(),
        urgency(scenario, apps),
        |session| {
            let mut parts: HashMap<String, Partition> = HashMap::new();
            for w in &workloads.workloads {
                if let Some(g) = session.take_green_group(&w.name) {
                    parts.insert(
                        w.name.clone(),
                        isolane_executors::app_models::shared_partition(g),
                    );
                }
            }
            let records = session.records().to_vec();
            Ok::<_, std::convert::Infallible>((run_apps(apps, settings(parts)), records))
        },
    )
    .map_err(super::session_error)?;
    match ran {
        Ok(r) => Ok(r),
        Err(never) => match never {},
    }
}

/// What every app worker process of a run needs from the command.
struct ProcessRun<'a> {
    scenario: &'a Scenario,
    file: &'a Path,
    text: &'a str,
    args: &'a RunArgs,
    stop: &'a AtomicBool,
    out: &'a Path,
}

/// Runs each app in a worker process of its own (`host = "process"`), inside the partitions of
/// `admitted` when the run has any: each app's process gets its workload's environment (under
/// MPS: the private daemon's pipe, the app's thread percentage and pinned memory limit).
fn run_in_processes(
    run: &ProcessRun<'_>,
    apps: &[AppSpec],
    admitted: Option<isolane_core::admission::Plan>,
) -> anyhow::Result<(Result<RunOutcome, RunError>, Vec<PartitionRecord>)> {
    let command = isolane_runtime::worker_client::WorkerCommand::isolane()
        .context("finding the isolane executable for the app workers")?;
    let guard = AppGuard::create(apps, &run.scenario.protection)
        .context("creating the criticality guard's shared file")?;
    let workers = |env: &BTreeMap<String, Vec<(String, String)>>, on_start: &dyn Fn(u32)| {
        let w = WorkerRun {
            command: &command,
            scenario: run.file,
            text: run.text,
            device: &run.scenario.device,
            timing: &run.scenario.timing,
            out: Some(run.out),
            no_plan_check: run.args.no_plan_check,
            env,
            on_start,
            stop: run.stop,
            guard: &guard,
        };
        run_in_workers(apps, &w)
    };
    let Some(plan) = admitted else {
        return Ok((workers(&BTreeMap::new(), &|_| {}), Vec::new()));
    };
    let ran = isolane_session::with_urgent_partitions(
        run.scenario.device.gpu,
        &plan,
        run.args.partitions.choices(),
        urgency(run.scenario, apps),
        |session| {
            let env = session.worker_env().clone();
            let adopt = session.client_adopter();
            let records = session.records().to_vec();
            Ok::<_, std::convert::Infallible>((workers(&env, &adopt), records))
        },
    )
    .map_err(super::session_error)?;
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
            isolane_app::metrics::summarize(app, rec, &partition)
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
) -> anyhow::Result<()> {
    let dir = out.join("apps");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    for (app, rec) in apps.iter().zip(&outcome.apps) {
        let csv = isolane_app::metrics::frames_csv(app, rec);
        output::write_atomic(&dir.join(format!("{}.csv", app.name)), csv.as_bytes())?;
    }
    isolane_core::results::write_json(&out.join("summary.json"), summary)?;
    Ok(())
}

/// Per app its end to end (paper 004's metrics), then every stage's own time.
fn tables(scenario: &Scenario, apps: &[AppSummary]) -> String {
    use isolane_report::{ms, plain_table};
    let e2e: Vec<Vec<String>> = apps
        .iter()
        .map(|a| {
            let m = &a.end_to_end;
            let l = &m.latency_ms;
            vec![
                a.name.clone(),
                m.jobs.to_string(),
                format!("{:.2}", m.timeout_pct),
                ms(l.mean),
                ms(l.std),
                ms(l.max),
                ms(l.tail),
                ms(l.flatness),
            ]
        })
        .collect();
    let header = [
        "app", "frames", "miss %", "mean ms", "std ms", "max ms", "tail ms", "flat ms",
    ];
    let stages: Vec<Vec<String>> = apps
        .iter()
        .flat_map(|a| {
            a.stages.iter().enumerate().map(move |(j, s)| {
                vec![
                    if j == 0 {
                        a.name.clone()
                    } else {
                        String::new()
                    },
                    s.name.clone(),
                    s.processed.to_string(),
                    s.skipped.to_string(),
                    ms(s.latency_ms.mean),
                    ms(s.latency_ms.p95),
                    ms(s.latency_ms.max),
                ]
            })
        })
        .collect();
    // Each stage's kind is in summary.json; the table keeps to 80 columns.
    let stage_header = [
        "app", "stage", "done", "skip", "mean ms", "p95 ms", "max ms",
    ];
    format!(
        "{}, apps (end to end, first and last frames dropped)\n{}\n{}",
        super::device_title(scenario),
        plain_table(&header, &e2e, &[0]),
        plain_table(&stage_header, &stages, &[0, 1])
    )
}
