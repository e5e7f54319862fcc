//! `isolane maxrate`'s work: the search its flags describe (one workload, where it runs,
//! Algorithm 1's settings), every check before a partition or a worker exists, the search in
//! its partition (this thread, a green group, or an MPS client worker), and its report.

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use isolane_core::admission::Plan;
use isolane_core::maxrate::{Acceptance, MaxRateConfig, Step};
use isolane_core::results::{MaxrateReport, SCHEMA_VERSION};
use isolane_core::spec::{
    Backend, Criticality, DeviceSpec, Host, LatePolicy, MaxRate, Mechanism, PartitionSpec,
    Precision, ProtectionSpec, Rate, Role, RunLength, Scenario, TimingSpec, WorkloadSpec,
};
use isolane_runtime::maxrate::{self, SearchError, SearchOutcome, SearchRequest};
use isolane_runtime::{affinity, exec, output};

use crate::maxrate::{MaxrateError, Searched};
use crate::progress::{SearchProgress, SearchSize};
use crate::{PartitionChoices, SessionError};

/// The flags of `isolane maxrate`, as the user wrote them (a mistake is told in flag terms).
#[derive(Debug, Clone)]
pub struct MaxrateFlags {
    pub model: String,
    pub weights: Option<String>,
    pub backend: String,
    pub precision: String,
    pub gpu: u32,
    pub mechanism: String,
    pub sms: Option<u32>,
    pub thread_pct: Option<u32>,
    pub plan_check: bool,
    pub batch: u32,
    pub jobs: u64,
    pub validations: u32,
    pub step: f64,
    pub relative_step: Option<f64>,
    pub confidence: Option<f64>,
    pub target: Option<f64>,
    pub warmup: u64,
    pub cpu: Vec<usize>,
    pub spin_us: u64,
    /// No time estimate and no progress on stderr.
    pub quiet: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum SearchCommandError {
    /// A flag's value, or what it asks of this machine (exit code 2 at the CLI).
    #[error("{0}")]
    User(String),
    #[error(transparent)]
    Session(#[from] SessionError),
    #[error(transparent)]
    Worker(#[from] MaxrateError),
    #[error(transparent)]
    Exec(#[from] exec::ExecError),
    #[error(transparent)]
    Search(#[from] SearchError),
    #[error("finding this executable")]
    Executable(#[source] std::io::Error),
    #[error(transparent)]
    Results(#[from] isolane_core::results::ResultsError),
    #[error("writing maxrate_trace.csv")]
    Trace(#[source] output::OutputError),
}

impl SearchCommandError {
    /// Whether this is the user's mistake (exit code 2): a flag, or a partition request this
    /// GPU refuses.
    pub fn is_user_error(&self) -> bool {
        match self {
            SearchCommandError::User(_) => true,
            SearchCommandError::Session(e)
            | SearchCommandError::Worker(MaxrateError::Session(e)) => e.is_user_error(),
            _ => false,
        }
    }
}

fn user(msg: impl std::fmt::Display) -> SearchCommandError {
    SearchCommandError::User(msg.to_string())
}

/// The search the flags ask for, checked as a scenario file would be (in flag terms) against
/// the built-in `models`.
pub fn request(
    args: &MaxrateFlags,
    models: &dyn isolane_core::spec::ModelCatalog,
) -> Result<SearchRequest, SearchCommandError> {
    let backend: Backend = parse_value("backend", &args.backend)?;
    let mechanism: Mechanism = parse_value("mechanism", &args.mechanism)?;
    let precision: Precision = parse_value("precision", &args.precision)?;
    if backend == Backend::Cpu && mechanism != Mechanism::None {
        return Err(user(format!(
            "--mechanism {}: the CPU backend has nothing to partition (use --backend cuda)",
            args.mechanism
        )));
    }
    // Alone on the GPU, "none" is the whole GPU (timeslice with nobody to take turns with).
    let mechanism = match (backend, mechanism) {
        (Backend::Cuda, Mechanism::None) => Mechanism::Timeslice,
        (_, m) => m,
    };
    let request = search_request(args, backend, mechanism, precision);
    scenario(&request)
        .validate(models)
        .map_err(|e| user(in_flag_terms(&e)))?;
    Ok(request)
}

/// The one-workload scenario of a search, for admission.
pub fn scenario(request: &SearchRequest) -> Scenario {
    Scenario {
        device: request.device.clone(),
        timing: request.timing.clone(),
        protection: ProtectionSpec::default(),
        workloads: vec![request.workload.clone()],
    }
}

/// Everything the user can get wrong, refused before a partition or a worker exists.
pub fn check(
    args: &MaxrateFlags,
    engine: &isolane_runtime::exec::Engine,
    request: &SearchRequest,
) -> Result<(), SearchCommandError> {
    request.config.validate().map_err(user)?;
    check_model(args, engine, request)?;
    check_search_records(args)?;
    affinity::check_cores(&args.cpu).map_err(user)?;
    Ok(())
}

/// Runs the search in its partition (`admitted`, on a GPU), showing its progress on the
/// terminal; `note` gets the lines worth saying (the partition granted).
pub fn search(
    args: &MaxrateFlags,
    request: &SearchRequest,
    admitted: Option<&Plan>,
    engine: &isolane_runtime::exec::Engine,
    stop: &Arc<AtomicBool>,
    note: &mut dyn FnMut(String),
) -> Result<Searched, SearchCommandError> {
    let mechanism = request.device.mechanism;
    let mut progress = SearchProgress::new(
        SearchSize {
            jobs: args.jobs,
            validations: args.validations,
        },
        args.quiet,
    );
    let searched = match (admitted, mechanism) {
        // A process's MPS share is fixed when CUDA starts in it: the search runs in a worker
        // process, a client of the private daemon the session starts.
        (Some(plan), Mechanism::Mps) => {
            let worker = isolane_runtime::worker_client::WorkerCommand::isolane()
                .map_err(SearchCommandError::Executable)?;
            crate::maxrate::search_in_partition(
                args.gpu,
                plan,
                PartitionChoices::default(),
                &worker,
                request,
                stop,
                &mut |e| progress.observe(e),
            )?
        }
        // green: the search runs on this thread, in its partition's green context.
        (Some(plan), Mechanism::Green) => {
            crate::with_partitions(args.gpu, plan, PartitionChoices::default(), |session| {
                for r in session.records() {
                    note(format!(
                        "partition: {} (granted {:?} SMs)",
                        r.partition, r.granted_sms
                    ));
                }
                let partition = session
                    .take_green_group(&request.workload.name)
                    .map(|g| Box::new(g) as isolane_runtime::partition::Partition);
                search_here(engine, partition, request, stop, &mut progress)
            })??
        }
        _ => search_here(engine, None, request, stop, &mut progress)?,
    };
    progress.finish();
    Ok(searched)
}

/// One batch of N jobs (the search keeps one batch's records at a time) and the warm-up against
/// this machine's memory.
fn check_search_records(args: &MaxrateFlags) -> Result<(), SearchCommandError> {
    let Some(memory) = isolane_runtime::limits::host_memory_bytes() else {
        return Ok(());
    };
    let demand = isolane_runtime::limits::RecordDemand {
        workload: "maxrate".into(),
        jobs: Some(args.jobs),
        warmup_jobs: args.warmup,
        source: "--jobs per batch".into(),
    };
    isolane_runtime::limits::check_records(&[demand], memory).map_err(|e| {
        user(format!(
            "--jobs {} / --warmup {}: {e}",
            args.jobs, args.warmup
        ))
    })
}

/// The flag that sets a field of the scenario `maxrate` builds from its flags.
fn flag_for(field: &str) -> &str {
    let key = field.strip_prefix("workload[0].").unwrap_or(field);
    match key {
        "model" => "--model",
        "weights" => "--weights",
        "batch" => "--batch",
        "precision" => "--precision",
        "jobs" => "--jobs",
        "warmup_jobs" => "--warmup",
        "cpu" => "--cpu",
        "partition.sms" => "--sms",
        "partition.thread_pct" => "--thread-pct",
        "timing.spin_us" => "--spin-us",
        "device.gpu" => "--gpu",
        "device.backend" => "--backend",
        "device.mechanism" | "host" | "device.host" => "--mechanism",
        _ => key,
    }
}

/// A refused scenario built from the flags, told in flag names (`--model foo: ...`), not in
/// the fields of a file the user never wrote.
fn in_flag_terms(e: &isolane_core::spec::SpecError) -> String {
    if e.problems().is_empty() {
        return e.to_string();
    }
    e.problems()
        .iter()
        .map(|p| format!("{}: {}", flag_for(&p.field), p.message))
        .collect::<Vec<_>>()
        .join("\n")
}

fn parse_value<T: serde::de::DeserializeOwned>(
    flag: &str,
    v: &str,
) -> Result<T, SearchCommandError> {
    serde_json::from_value(serde_json::Value::String(v.to_string()))
        .map_err(|e| user(format!("--{flag} {v}: {e}")))
}

/// The search the flags describe: one workload, where it runs, and Algorithm 1's settings.
fn search_request(
    args: &MaxrateFlags,
    backend: Backend,
    mechanism: Mechanism,
    precision: Precision,
) -> SearchRequest {
    // The search runs in this process (or, for mps, in the one worker process): with one
    // workload, "process" only says that nothing shares a context with it.
    let host = match mechanism {
        Mechanism::Mps | Mechanism::Timeslice => Host::Process,
        _ => Host::Thread,
    };
    let workload = WorkloadSpec {
        name: "maxrate".into(),
        model: args.model.clone(),
        weights: args.weights.clone(),
        batch: args.batch,
        precision,
        calibration: None,
        // The search sets each batch's rate; until then the workload is closed-loop, so that a
        // bound on jobs / rate_hz (a scheduled run's) is not asked of a rate nobody chose.
        rate: Rate::Max(MaxRate::Max),
        deadline_ms: None,
        phase_ms: None,
        length: RunLength::Jobs(args.jobs),
        warmup_jobs: args.warmup,
        late: LatePolicy::Skip,
        cpu: args.cpu.clone(),
        role: Role::Standalone,
        ramp: None,
        host,
        partition: PartitionSpec {
            sms: args.sms,
            thread_pct: args.thread_pct,
            ..PartitionSpec::default()
        },
        plan_check: args.plan_check,
        criticality: Criticality::Critical,
        stretch: None,
        backend,
        program: None,
        gpu: None,
        serve: Default::default(),
    };
    SearchRequest {
        workload,
        device: DeviceSpec {
            backend,
            gpu: args.gpu,
            mechanism,
            host,
            gpus: Vec::new(),
        },
        timing: TimingSpec {
            spin_us: args.spin_us,
            ..TimingSpec::default()
        },
        config: MaxRateConfig {
            jobs: args.jobs,
            validations: args.validations,
            step: match args.relative_step {
                Some(f) => Step::Relative(f),
                None => Step::Absolute(args.step),
            },
            acceptance: match (args.confidence, args.target) {
                (Some(confidence), Some(target)) => Acceptance::Statistical { confidence, target },
                _ => Acceptance::ZeroViolations,
            },
            ..MaxRateConfig::default()
        },
    }
}

/// The model (and a batch of its activations) must fit this machine before anything of its
/// size is allocated; refused in flag terms.
fn check_model(
    args: &MaxrateFlags,
    engine: &isolane_runtime::exec::Engine,
    request: &SearchRequest,
) -> Result<(), SearchCommandError> {
    exec::check_model(Some(engine.as_ref()), &request.device, &request.workload).map_err(
        |e| match e {
            // In flag terms: there is no workload the user named.
            exec::ExecError::BadModel { reason, .. } => {
                let batch = format!("batch = {}: ", args.batch);
                match reason.strip_prefix(&batch) {
                    Some(rest) => user(format!("--batch {}: {rest}", args.batch)),
                    None => user(format!("--model {}: {reason}", args.model)),
                }
            }
            _ => SearchCommandError::Exec(e),
        },
    )
}

/// The search on this thread, in `partition` (a green group) when given.
fn search_here(
    engine: &isolane_runtime::exec::Engine,
    partition: Option<isolane_runtime::partition::Partition>,
    request: &SearchRequest,
    stop: &Arc<AtomicBool>,
    progress: &mut SearchProgress,
) -> Result<Searched, SearchCommandError> {
    let executor = exec::executor_for(
        Some(engine.as_ref()),
        &request.device,
        &request.workload,
        request.timing.seed,
        0,
        partition,
    )
    .map_err(|e| match e {
        exec::ExecError::BadModel { .. } => user(e),
        _ => SearchCommandError::Exec(e),
    })?;
    match maxrate::search(executor, request, Arc::clone(stop), &mut |e| {
        progress.observe(e)
    }) {
        Ok(outcome) => Ok(Searched::Done(Box::new(outcome))),
        Err(SearchError::Interrupted) => Ok(Searched::Interrupted),
        Err(e @ (SearchError::Config(_) | SearchError::Exec(exec::ExecError::BadModel { .. }))) => {
            Err(user(e))
        }
        Err(e) => Err(SearchCommandError::Search(e)),
    }
}

/// Says the trace and the result through `say` (and a note on `note`); with `out`, writes
/// maxrate.json and maxrate_trace.csv there.
pub fn report(
    args: &MaxrateFlags,
    request: &SearchRequest,
    outcome: &SearchOutcome,
    out: Option<&Path>,
    say: &mut dyn FnMut(String),
    note: &mut dyn FnMut(String),
) -> Result<(), SearchCommandError> {
    let result = &outcome.result;
    let rows: Vec<Vec<String>> = result
        .trace
        .iter()
        .enumerate()
        .map(|(i, t)| {
            vec![
                (i + 1).to_string(),
                format!("{:?}", t.phase).to_lowercase(),
                format!("{:.3}", t.rate_hz),
                t.jobs.to_string(),
                t.violations.to_string(),
                if t.accepted { "yes" } else { "no" }.to_string(),
            ]
        })
        .collect();
    say(isolane_report::plain_table(
        &["batch", "phase", "rate Hz", "jobs", "misses", "clean"],
        &rows,
        &[1],
    ));
    // A search on a VM whose host took CPU settles lower than the machine allows.
    if let Some(steal) = outcome.cpu_steal_pct.filter(|&p| p > 1.0) {
        note(format!(
            "note: the hypervisor took {steal:.1} % of this machine's CPU during the search:\n  \
             the rate found may be lower than the machine allows"
        ));
    }
    let lateness = &outcome.start_lateness_us;
    let us = |v: Option<f64>| v.unwrap_or(f64::NAN);
    say(format!(
        "max stable rate {:.3} jobs/s, L_max {:.4} ms (model {}, batch {})",
        result.max_rate_hz, result.l_max_ms, args.model, args.batch
    ));
    say(format!("initial rate {:.3} jobs/s", result.initial_rate_hz));
    say(format!(
        "start lateness: p50 {:.1} µs, p99 {:.1} µs, max {:.1} µs (all timed batches)",
        us(lateness.p50),
        us(lateness.p99),
        us(lateness.max)
    ));
    let Some(dir) = out else {
        return Ok(());
    };
    let report = MaxrateReport {
        schema_version: SCHEMA_VERSION,
        isolane_version: env!("CARGO_PKG_VERSION").into(),
        model: args.model.clone(),
        batch: args.batch,
        backend: request.device.backend,
        precision: request.workload.precision,
        // The partition the user asked for (`none` on a GPU is the whole GPU, timeslice).
        mechanism: request.device.mechanism,
        sms: args.sms,
        thread_pct: args.thread_pct,
        config: request.config,
        max_rate_hz: result.max_rate_hz,
        l_max_ms: result.l_max_ms,
        initial_rate_hz: result.initial_rate_hz,
        start_lateness_us: *lateness,
        cpu_steal_pct: outcome.cpu_steal_pct,
        trace: result.trace.clone(),
    };
    isolane_core::results::write_json(&dir.join("maxrate.json"), &report)?;
    let mut csv = String::from("batch,phase,rate_hz,jobs,violations,accepted\n");
    for (i, t) in result.trace.iter().enumerate() {
        csv.push_str(&format!(
            "{},{},{},{},{},{}\n",
            i + 1,
            format!("{:?}", t.phase).to_lowercase(),
            t.rate_hz,
            t.jobs,
            t.violations,
            t.accepted as u8
        ));
    }
    output::write_atomic(&dir.join("maxrate_trace.csv"), csv.as_bytes())
        .map_err(SearchCommandError::Trace)?;
    say(format!("results: {}", dir.display()));
    Ok(())
}
