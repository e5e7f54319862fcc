//! `isolane maxrate`: the max stable inference frequency of one model (Algorithm 1 of paper 000).

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::Context as _;
use clap::Args;
use isolane_core::maxrate::{Acceptance, MaxRateConfig, Step};
use isolane_core::results::{MaxrateReport, SCHEMA_VERSION};
use isolane_core::spec::{
    Backend, Criticality, DeviceSpec, Host, LatePolicy, MaxRate, Mechanism, PartitionSpec,
    Precision, ProtectionSpec, Rate, Role, RunLength, Scenario, TimingSpec, WorkloadSpec,
};
use isolane_runtime::maxrate::{self, SearchError, SearchOutcome, SearchRequest};
use isolane_runtime::{affinity, exec, output};
use isolane_session::maxrate::Searched;

use super::{user, EXIT_INTERRUPTED};

#[derive(Args)]
#[command(
    about = "Find a model's max stable rate (jobs/s with no deadline miss) and L_max",
    long_about = "Find a model's max stable inference frequency with Algorithm 1 of paper 000: \
                  N jobs back to back give an initial rate (1 / mean of the 5 worst times); \
                  batches of N jobs at rate f with deadline 1/f then raise f by the step while \
                  clean and lower it on a miss; K clean validation batches at f accept it. \
                  Prints the rate, L_max = 1/f and the search trace; --out writes maxrate.json \
                  and maxrate_trace.csv."
)]
pub struct MaxrateArgs {
    /// Model: a built-in architecture (`isolane models`), an .onnx file, or
    /// `spin:<time>[~<jitter>]`.
    #[arg(long, short = 'm')]
    model: String,
    /// Weights for a built-in architecture (safetensors); default: seeded synthetic weights.
    #[arg(long, value_name = "FILE")]
    weights: Option<String>,
    /// Where the model runs.
    #[arg(long, default_value = "cpu", value_parser = ["cpu", "cuda"])]
    backend: String,
    /// Numeric precision (the CPU backend runs fp32 only).
    #[arg(long, default_value = "fp32", value_parser = ["fp32", "tf32", "fp16", "bf16"])]
    precision: String,
    /// GPU index (backend cuda).
    #[arg(long, default_value_t = 0)]
    gpu: u32,
    /// How the model's share of the GPU is confined (backend cuda): `timeslice` (the whole GPU,
    /// the default there; `none` means the same), `green` (needs --sms) or `mps` (needs
    /// --thread-pct; the search runs in an `isolane worker` client process of a private MPS
    /// daemon).
    #[arg(long, default_value = "none", value_parser = ["none", "timeslice", "green", "mps"])]
    mechanism: String,
    /// green: SMs of the partition.
    #[arg(long)]
    sms: Option<u32>,
    /// mps: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE of the client.
    #[arg(long)]
    thread_pct: Option<u32>,
    /// Skip the plan check of an imported (.onnx) model on cuda (docs/cuda.md, Plan check).
    #[arg(long)]
    no_plan_check: bool,
    /// Images per job.
    #[arg(long, default_value_t = 1, value_parser = super::help::at_least_one_u32)]
    batch: u32,
    /// Jobs per batch (N).
    #[arg(long, default_value_t = 1000, value_parser = super::help::at_least_one)]
    jobs: u64,
    /// Validation batches (K).
    #[arg(long, default_value_t = 3)]
    validations: u32,
    /// Absolute rate step in jobs/s.
    #[arg(long, default_value_t = 1.0, conflicts_with = "relative_step", value_parser = positive)]
    step: f64,
    /// Relative rate step instead: multiply/divide the rate by 1 + F, 0 < F < 1 (e.g. 0.01).
    #[arg(long, value_name = "F", value_parser = positive)]
    relative_step: Option<f64>,
    /// Statistical acceptance: confidence of the on-time claim (e.g. 0.95); needs --target.
    #[arg(long, requires = "target", value_parser = positive)]
    confidence: Option<f64>,
    /// Statistical acceptance: on-time fraction to claim (e.g. 0.99); needs --confidence.
    #[arg(long, requires = "confidence", value_parser = positive)]
    target: Option<f64>,
    /// Warm-up jobs before the search (excluded).
    #[arg(long, default_value_t = 10)]
    warmup: u64,
    /// CPU cores to pin the workload's thread to, e.g. `2` or `2,3`.
    #[arg(long, value_delimiter = ',')]
    cpu: Vec<usize>,
    /// Sleep until this many µs before a release, then spin.
    #[arg(long, default_value_t = TimingSpec::default().spin_us)]
    spin_us: u64,
    /// Write maxrate.json and maxrate_trace.csv here.
    #[arg(long, short = 'o', value_name = "DIR")]
    out: Option<PathBuf>,
    /// Use --out even if it is not empty.
    #[arg(long)]
    force: bool,
    /// No time estimate and no progress on stderr.
    #[arg(long, short = 'q')]
    quiet: bool,
}

fn positive(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("`{s}` is not a number > 0")),
    }
}

/// One batch of N jobs (the search keeps one batch's records at a time) and the warm-up against
/// this machine's memory.
fn check_search_records(args: &MaxrateArgs) -> anyhow::Result<()> {
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

fn parse_value<T: serde::de::DeserializeOwned>(flag: &str, v: &str) -> anyhow::Result<T> {
    serde_json::from_value(serde_json::Value::String(v.to_string()))
        .map_err(|e| user(format!("--{flag} {v}: {e}")))
}

pub fn run(args: MaxrateArgs, engine: &isolane_runtime::exec::Engine) -> anyhow::Result<u8> {
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
    let request = search_request(&args, backend, mechanism, precision);
    let scenario = Scenario {
        device: request.device.clone(),
        timing: request.timing.clone(),
        protection: ProtectionSpec::default(),
        workloads: vec![request.workload.clone()],
    };
    let models: Vec<&str> = isolane_engine::builtin_models()
        .iter()
        .map(|m| m.name)
        .collect();
    scenario
        .validate(&models)
        .map_err(|e| user(in_flag_terms(&e)))?;
    let admitted = super::admit_or_refuse(&scenario, "maxrate arguments")?;
    // Everything the user can get wrong is refused here, before a partition or a worker exists.
    request.config.validate().map_err(user)?;
    check_model(&args, engine, &request)?;
    check_search_records(&args)?;
    affinity::check_cores(&args.cpu).map_err(user)?;
    let out = match &args.out {
        Some(dir) => Some(super::run::prepare_out(Some(dir), args.force)?),
        None => None,
    };

    let stop = super::install_stop_handler()?;
    let mut progress = super::progress::SearchProgress::new(
        super::progress::SearchSize {
            jobs: args.jobs,
            validations: args.validations,
        },
        args.quiet,
    );
    let searched = match (&admitted, mechanism) {
        // A process's MPS share is fixed when CUDA starts in it: the search runs in a worker
        // process, a client of the private daemon the session starts.
        (Some(plan), Mechanism::Mps) => {
            let worker = isolane_runtime::worker_client::WorkerCommand::isolane()
                .context("finding this executable")?;
            isolane_session::maxrate::search_in_partition(
                args.gpu,
                plan,
                isolane_session::PartitionChoices::default(),
                &worker,
                &request,
                &stop,
                &mut |e| progress.observe(e),
            )
            .map_err(maxrate_error)?
        }
        // green: the search runs on this thread, in its partition's green context.
        (Some(plan), Mechanism::Green) => isolane_session::with_partitions(
            args.gpu,
            plan,
            isolane_session::PartitionChoices::default(),
            |session| {
                for r in session.records() {
                    eprintln!(
                        "partition: {} (granted {:?} SMs)",
                        r.partition, r.granted_sms
                    );
                }
                let partition = session
                    .take_green_group(&request.workload.name)
                    .map(|g| Box::new(g) as isolane_runtime::partition::Partition);
                search_here(engine, partition, &request, &stop, &mut progress)
            },
        )
        .map_err(super::session_error)??,
        _ => search_here(engine, None, &request, &stop, &mut progress)?,
    };
    progress.finish();
    match searched {
        Searched::Done(outcome) => {
            report(&args, &request, &outcome, out.as_deref())?;
            Ok(0)
        }
        Searched::Interrupted => {
            eprintln!("interrupted: no max rate found");
            Ok(EXIT_INTERRUPTED)
        }
    }
}

/// The search the flags describe: one workload, where it runs, and Algorithm 1's settings.
fn search_request(
    args: &MaxrateArgs,
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
        plan_check: !args.no_plan_check,
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
    args: &MaxrateArgs,
    engine: &isolane_runtime::exec::Engine,
    request: &SearchRequest,
) -> anyhow::Result<()> {
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
            _ => anyhow::Error::new(e),
        },
    )
}

/// The search on this thread, in `partition` (a green group) when given.
fn search_here(
    engine: &isolane_runtime::exec::Engine,
    partition: Option<isolane_runtime::partition::Partition>,
    request: &SearchRequest,
    stop: &Arc<AtomicBool>,
    progress: &mut super::progress::SearchProgress,
) -> anyhow::Result<Searched> {
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
        _ => anyhow::Error::new(e),
    })?;
    match maxrate::search(executor, request, Arc::clone(stop), &mut |e| {
        progress.observe(e)
    }) {
        Ok(outcome) => Ok(Searched::Done(Box::new(outcome))),
        Err(SearchError::Interrupted) => Ok(Searched::Interrupted),
        Err(e @ (SearchError::Config(_) | SearchError::Exec(exec::ExecError::BadModel { .. }))) => {
            Err(user(e))
        }
        Err(e) => Err(anyhow::Error::new(e)),
    }
}

/// A search in a worker that failed: a refused partition request is the user's (exit 2).
fn maxrate_error(e: isolane_session::maxrate::MaxrateError) -> anyhow::Error {
    match e {
        isolane_session::maxrate::MaxrateError::Session(e) => super::session_error(e),
        e => anyhow::Error::new(e),
    }
}

/// Prints the trace and the result; with `--out`, writes maxrate.json and maxrate_trace.csv.
fn report(
    args: &MaxrateArgs,
    request: &SearchRequest,
    outcome: &SearchOutcome,
    out: Option<&std::path::Path>,
) -> anyhow::Result<()> {
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
    println!(
        "{}",
        isolane_report::plain_table(
            &["batch", "phase", "rate Hz", "jobs", "misses", "clean"],
            &rows,
            &[1]
        )
    );
    // A search on a VM whose host took CPU settles lower than the machine allows.
    if let Some(steal) = outcome.cpu_steal_pct.filter(|&p| p > 1.0) {
        eprintln!(
            "note: the hypervisor took {steal:.1} % of this machine's CPU during the search:\n  \
             the rate found may be lower than the machine allows"
        );
    }
    let lateness = &outcome.start_lateness_us;
    let us = |v: Option<f64>| v.unwrap_or(f64::NAN);
    println!(
        "max stable rate {:.3} jobs/s, L_max {:.4} ms (model {}, batch {})",
        result.max_rate_hz, result.l_max_ms, args.model, args.batch
    );
    println!("initial rate {:.3} jobs/s", result.initial_rate_hz);
    println!(
        "start lateness: p50 {:.1} µs, p99 {:.1} µs, max {:.1} µs (all timed batches)",
        us(lateness.p50),
        us(lateness.p99),
        us(lateness.max)
    );
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
        .context("writing maxrate_trace.csv")?;
    println!("results: {}", dir.display());
    Ok(())
}
