//! isolane-session: one run as a library — partitions, hosts, telemetry, typed results.
//!
//! A run is admit → partitions → hosts → telemetry → typed results (docs/design.md, "Where
//! things are"). The caller admits the scenario and prepares the output folder; this crate
//! does the rest ([`measure`]): it sets an admitted plan's partitions up once
//! ([`with_partitions`], used by `run`, `isolation`, `sweep`, `maxrate` ([`maxrate`]) and
//! `verify` ([`verify`]): the only partition set-up in the tree), hands each
//! workload its partition — a green group in its plan ([`isolane_runtime::partition`]), MPS
//! and MIG settings in its worker's environment — runs the coordinator with the engine the
//! caller passes in ([`run_in_partitions`]), and takes the partitions down after the last
//! workload has ended; around the run it samples device telemetry ([`telemetry`]) and it
//! summarises the result as `isolane_core::results::RunSummary`. What a person should see
//! (progress, warnings, notes) goes to the caller's [`Observer`]. It keeps no process-wide state: the engine, the partitions and the
//! options are values the caller gives.
//!
//! It sits above `isolane-runtime` (which knows nothing of GPUs) and `isolane-gpu` (which
//! knows nothing of workloads' hosts), so that neither depends on the other.

pub mod auto_bench;
pub mod checks;
pub mod isolation_run;
pub mod live;
pub mod maxrate;
pub mod progress;
pub mod rebuild;
pub mod run_path;
pub mod search;
pub mod signals;
pub mod studies;
pub mod study_runs;
pub mod telemetry;
pub mod verify;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use isolane_core::results::RunSummary;
use isolane_core::spec::Scenario;
use isolane_runtime::exec::Engine;
use isolane_runtime::results::{summarize_run, RunInfo};

use isolane_core::admission::Plan;
use isolane_core::spec::{Criticality, Mechanism};
use isolane_gpu::mig::MigBackend;
use isolane_gpu::partitions::Urgency;
use isolane_gpu::{MpsOptions, PartitionRecord, PartitionSession, SessionOptions};
use isolane_runtime::coordinator::{self, PlanError, Progress, RunOptions, RunPlan, RunResult};
use isolane_runtime::partition::PartitionHandle;

/// The user's say in how partitions are set up (the CLI's `--allow-mig-reconfigure` and
/// `--join-mps`).
#[derive(Debug, Clone, Copy, Default)]
pub struct PartitionChoices {
    /// mig: create the planned instances (MIG mode must already be on).
    pub allow_mig_reconfigure: bool,
    /// mps: use an MPS daemon that is already running for the GPU instead of refusing.
    pub join_mps: bool,
    /// green: make the groups resizable while serving (one split at the driver's unit;
    /// `isolane serve` asks for it, [`repartition_of`]).
    pub resizable_green: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// Setting the partitions up or taking them down failed.
    #[error(transparent)]
    Partitions(#[from] isolane_gpu::GpuError),
    /// The run itself failed.
    #[error(transparent)]
    Run(#[from] PlanError),
}

impl SessionError {
    /// A mistake of the user's (exit code 2 at the CLI): a partition request this GPU refuses.
    /// A run's failure is never one here (its user errors are caught by preflight).
    pub fn is_user_error(&self) -> bool {
        match self {
            SessionError::Partitions(e) => e.is_user_error(),
            SessionError::Run(_) => false,
        }
    }
}

/// Sets up the partitions of `admitted` on GPU `gpu`, runs `body` with them, and takes them
/// down again whatever `body` returned. The outer error is the partitions' (set-up, or
/// take-down after a `body` that succeeded); the inner result is `body`'s, which wins when
/// both fail.
pub fn with_partitions<T, E>(
    gpu: u32,
    admitted: &Plan,
    choices: PartitionChoices,
    body: impl FnOnce(&mut PartitionSession<'_>) -> Result<T, E>,
) -> Result<Result<T, E>, SessionError> {
    with_urgent_partitions(gpu, admitted, choices, Urgency::default(), body)
}

/// [`with_partitions`], with some workloads' GPU work going first ([`urgency_of`]; an app's
/// models by their workload names).
pub fn with_urgent_partitions<T, E>(
    gpu: u32,
    admitted: &Plan,
    choices: PartitionChoices,
    urgency: Urgency,
    body: impl FnOnce(&mut PartitionSession<'_>) -> Result<T, E>,
) -> Result<Result<T, E>, SessionError> {
    let mig_backend = match admitted.mechanism {
        Mechanism::Mig => Some(isolane_gpu::mig::nvml::NvmlMig::new()?),
        _ => None,
    };
    let options = SessionOptions {
        mps: MpsOptions {
            join_existing: choices.join_mps,
            ..Default::default()
        },
        allow_mig_reconfigure: choices.allow_mig_reconfigure,
        urgency,
        resizable_green: choices.resizable_green,
    };
    let mut session = PartitionSession::set_up(
        gpu,
        admitted,
        &options,
        mig_backend.as_ref().map(|b| b as &dyn MigBackend),
    )?;
    let out = body(&mut session);
    let finished = session.finish();
    match out {
        Err(e) => Ok(Err(e)),
        Ok(v) => {
            finished?;
            Ok(Ok(v))
        }
    }
}

/// A plan placed in its partitions: what a session's hosts get from them.
pub struct Placed {
    /// The plan with each workload's green group (if the session made one for it) in its
    /// `partition`, and the GPU's fitted interference model for `[protection] share`.
    pub plan: RunPlan,
    /// Each worker process's (or program's) partition environment, by workload name: MPS
    /// thread share and pipe directory, MIG device, client priority.
    pub worker_env: BTreeMap<String, Vec<(String, String)>>,
    /// To be called with each worker's pid once it runs (an MPS client the session adopts).
    pub adopt: Arc<dyn Fn(u32) + Send + Sync>,
    /// What each workload got (summary.json's `partitions`).
    pub records: Vec<PartitionRecord>,
    /// Where a resized green partition comes from (`None`: not made resizable, or none).
    pub repartition: Option<Arc<dyn isolane_runtime::partition::Repartition>>,
}

/// Sets up the partitions of `admitted` on GPU `gpu` (critical work first where `plan`
/// protects it: [`urgency_of`]), runs `body` with `plan` placed in them, and takes them down
/// after `body` has returned (and dropped the plan with any group no workload took). The one
/// partition set-up of a session, whether its workloads are released (`run`, the studies) or
/// served (`isolane serve`). Errors as [`with_partitions`].
pub fn in_partitions<T, E>(
    gpu: u32,
    admitted: &Plan,
    choices: PartitionChoices,
    plan: &RunPlan,
    body: impl FnOnce(Placed) -> Result<T, E>,
) -> Result<Result<T, E>, SessionError> {
    with_urgent_partitions(gpu, admitted, choices, urgency_of(plan), |session| {
        let mut plan = plan_in(session, plan);
        plan.share =
            isolane_runtime::guard::ShareModel::fitted(&admitted.device, admitted.mechanism);
        body(Placed {
            plan,
            worker_env: session.worker_env().clone(),
            adopt: Arc::new(session.client_adopter()),
            records: session.records().to_vec(),
            repartition: repartition_of(session),
        })
    })
}

/// Runs `plan` on GPU `gpu` inside the partitions of `admitted` (`None`: on the CPU, or
/// nothing to partition): each workload gets its partition, the coordinator runs them with
/// `opts` (whose `engine` builds the models), and the partitions are taken down after every
/// workload has ended. Returns the run and what each workload got.
pub fn run_in_partitions(
    gpu: u32,
    admitted: Option<&Plan>,
    choices: PartitionChoices,
    plan: &RunPlan,
    mut opts: RunOptions,
    progress: &mut dyn FnMut(&Progress),
) -> Result<(RunResult, Vec<PartitionRecord>), SessionError> {
    let Some(admitted) = admitted else {
        return Ok((coordinator::run(plan, &opts, progress)?, Vec::new()));
    };
    let ran = in_partitions(gpu, admitted, choices, plan, |placed| {
        opts.worker_env = placed.worker_env;
        let adopt = placed.adopt;
        opts.on_worker_start = Some(Arc::new(move |_name: &str, pid: u32| adopt(pid)));
        coordinator::run(&placed.plan, &opts, progress).map(|result| (result, placed.records))
    })?;
    Ok(ran?)
}

/// In a protected run with `[protection] priorities` on, critical work goes first where the
/// hardware arbitrates (its streams at the greatest priority) and best effort's MPS clients go
/// last; otherwise nobody does (docs/criticality.md).
pub fn urgency_of(plan: &RunPlan) -> Urgency {
    if !plan.protects() || !plan.protection.priorities {
        return Urgency::default();
    }
    let named = |c: Criticality| {
        plan.workloads
            .iter()
            .filter(|w| w.spec.criticality == c)
            .map(|w| w.spec.name.clone())
            .collect()
    };
    Urgency {
        urgent: named(Criticality::Critical),
        background: named(Criticality::BestEffort),
    }
}

/// Where a run reports what a person should see while it goes on.
pub trait Observer {
    /// About ten times a second while the workloads run.
    fn progress(&mut self, progress: &Progress);
    /// Once, when every workload has ended (before any warning about the run's end).
    fn finished(&mut self);
    /// Something went wrong that the run survived.
    fn warning(&mut self, message: &str);
    /// Something worth a line.
    fn note(&mut self, message: &str);
}

/// One run, admitted and with its output folder ready.
pub struct RunRequest<'a> {
    /// The subcommand, for summary.json.
    pub command: &'static str,
    pub scenario: &'a Scenario,
    /// Names the scenario in summary.json.
    pub scenario_name: String,
    /// The admitted plan on a GPU (`None` on the CPU).
    pub admitted: Option<&'a Plan>,
    pub plan: &'a RunPlan,
    /// The run folder: jobs/*.csv stream there, telemetry.csv is written there.
    pub out: &'a Path,
    pub choices: PartitionChoices,
    /// Builds the workloads whose model is not `spin:`.
    pub engine: &'a Engine,
    /// Raised by the caller's Ctrl-C handler: stop releasing, keep what was measured.
    pub stop: Arc<AtomicBool>,
    /// Live metrics to feed while the run goes on (`--metrics-addr`), from the jobs writer
    /// and telemetry threads.
    pub metrics: Option<Arc<isolane_metrics::RunMetrics>>,
}

/// Runs an admitted plan inside its partitions with telemetry around it and summarises the
/// result (summary.json's types; the caller writes it).
pub fn measure(
    r: RunRequest<'_>,
    observer: &mut dyn Observer,
) -> Result<(RunResult, RunSummary), SessionError> {
    let started_at = chrono::Utc::now();
    let mut options = RunOptions::new(r.stop);
    let hook = r.metrics.as_ref().map(|m| {
        let names: Vec<String> = r
            .plan
            .workloads
            .iter()
            .map(|w| w.spec.name.clone())
            .collect();
        let (records, hook) = live::begin(
            m,
            r.command,
            &r.scenario_name,
            r.scenario,
            r.admitted,
            &names,
        );
        options.observer = Some(records);
        hook
    });
    let sampler = telemetry::start(r.scenario, hook, observer);
    // Every job's record reaches jobs/<workload>.csv while the run goes on: a killed run
    // leaves them for `isolane summarize`.
    options.jobs_dir = Some(r.out.to_path_buf());
    options.engine = Some(r.engine.clone());
    let ran = run_in_partitions(
        r.scenario.device.gpu,
        r.admitted,
        r.choices,
        r.plan,
        options,
        &mut |p| observer.progress(p),
    );
    observer.finished();
    let (result, partitions) = ran?;
    if let Some(e) = &result.jobs_stream_error {
        observer.warning(&format!(
            "the per-job records stopped streaming to jobs/ during the run ({e}); they are \
             written from memory at the run's end (what does not fit is said then)"
        ));
    }
    let info = RunInfo {
        command: r.command,
        started_at,
        scenario: r.scenario_name,
    };
    let mut summary = summarize_run(&info, &r.plan.workloads, &result);
    summary.partitions = partitions;
    if let Some(plan) = r.admitted {
        for w in &mut summary.workloads {
            w.memory_estimate_mib = plan
                .workloads
                .iter()
                .find(|a| a.workload == w.name)
                .and_then(|a| a.memory_mib);
        }
    }
    let window = (result.t0_ns, result.wall_s);
    telemetry::finish(sampler, r.scenario, r.out, window, &mut summary, observer);
    Ok((result, summary))
}

/// `plan` with each workload's green group (if the session made one for it) in its
/// `partition`.
/// The session's green partitions as something a server resizes through (`None`: they
/// were not made resizable, or there are none).
pub fn repartition_of(
    session: &PartitionSession<'_>,
) -> Option<std::sync::Arc<dyn isolane_runtime::partition::Repartition>> {
    let pool = session.green_pool()?;
    Some(std::sync::Arc::new(GreenResizes(pool)))
}

/// [`isolane_runtime::partition::Repartition`] over a GPU's resizable green split.
struct GreenResizes(std::sync::Arc<isolane_gpu::GreenPool>);

impl isolane_runtime::partition::Repartition for GreenResizes {
    fn green_unit_sms(&self) -> u32 {
        self.0.unit_sms()
    }

    fn free_green_sms(&self) -> u32 {
        self.0.free_sms()
    }

    fn green(
        &self,
        index: usize,
        workload: &str,
        sms: u32,
    ) -> Result<isolane_runtime::partition::Partition, String> {
        let group = self
            .0
            .group(index, workload, sms)
            .map_err(|e| e.to_string())?;
        Ok(Box::new(group))
    }
}

pub fn plan_in(session: &mut PartitionSession<'_>, plan: &RunPlan) -> RunPlan {
    let mut plan = plan.clone();
    for w in &mut plan.workloads {
        if let Some(group) = session.take_green_group(&w.spec.name) {
            w.partition = PartitionHandle::new(Box::new(group));
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use isolane_core::admission::{AdmittedWorkload, ResolvedPartition};
    use isolane_core::spec::Scenario;
    use std::sync::atomic::AtomicBool;

    fn timeslice_plan(names: &[&str]) -> Plan {
        Plan {
            device: "test".into(),
            mechanism: Mechanism::Timeslice,
            workloads: names
                .iter()
                .map(|n| AdmittedWorkload {
                    workload: n.to_string(),
                    partition: ResolvedPartition::Whole,
                    memory_mib: None,
                    gpu: None,
                })
                .collect(),
        }
    }

    #[test]
    fn the_body_runs_with_the_partitions_and_its_error_wins() {
        // timeslice creates nothing on the GPU: every workload gets the whole device.
        let plan = timeslice_plan(&["a", "b"]);
        let seen = with_partitions(0, &plan, PartitionChoices::default(), |s| {
            Ok::<_, String>(
                s.records()
                    .iter()
                    .map(|r| format!("{} {}", r.workload, r.partition))
                    .collect::<Vec<_>>(),
            )
        })
        .unwrap()
        .unwrap();
        assert_eq!(seen, ["a whole GPU", "b whole GPU"]);
        let failed = with_partitions(0, &plan, PartitionChoices::default(), |_| {
            Err::<(), _>("the body failed")
        })
        .unwrap();
        assert_eq!(failed, Err("the body failed"));
    }

    fn plan_of(protection: &str, best_effort: bool) -> RunPlan {
        let w =
            |n: &str, be: bool| {
                format!(
                "[[workload]]\nname = \"{n}\"\nmodel = \"spin:1ms\"\nrate_hz = 100\njobs = 1\n{}",
                if be { "criticality = \"best_effort\"\n" } else { "" }
            )
            };
        let text = format!(
            "[device]\nbackend = \"cpu\"\n{protection}\n{}\n{}",
            w("camera", false),
            w("analytics", best_effort)
        );
        let scenario = Scenario::from_toml_str(&text, "test.toml", &Vec::<String>::new()).unwrap();
        RunPlan::from_scenario(&scenario)
    }

    #[test]
    fn only_a_protected_run_with_priorities_makes_anyone_urgent() {
        let u = urgency_of(&plan_of("", true));
        assert_eq!(u.urgent, ["camera".to_string()].into());
        assert_eq!(u.background, ["analytics".to_string()].into());
        for quiet in [
            plan_of("[protection]\npriorities = false\n", true),
            plan_of("[protection]\nenabled = false\n", true),
            // Nothing best effort: nothing to go ahead of, so nothing changes.
            plan_of("", false),
        ] {
            assert_eq!(urgency_of(&quiet), Urgency::default());
        }
    }

    #[test]
    fn without_partitions_the_plan_runs_as_is() {
        let scenario = Scenario::from_toml_str(
            "[device]\nbackend = \"cpu\"\n\n[[workload]]\nname = \"a\"\nmodel = \"spin:1ms\"\n\
             rate_hz = 100\njobs = 3\nwarmup_jobs = 0\n",
            "test.toml",
            &Vec::<String>::new(),
        )
        .unwrap();
        let plan = RunPlan::from_scenario(&scenario);
        let opts = RunOptions::new(Arc::new(AtomicBool::new(false)));
        let (result, records) = run_in_partitions(
            0,
            None,
            PartitionChoices::default(),
            &plan,
            opts,
            &mut |_| {},
        )
        .unwrap();
        assert!(records.is_empty());
        assert_eq!(result.workloads.len(), 1);
        assert_eq!(
            result.workloads[0].status,
            isolane_runtime::WorkloadStatus::Ok
        );
        assert_eq!(result.workloads[0].records.len(), 3);
    }
}
