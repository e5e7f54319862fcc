//! `isolane maxrate`: the max stable inference frequency of one model (Algorithm 1 of paper 000).

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;
use isolane_core::maxrate::{find_max_rate, Acceptance, MaxRateConfig, MaxRateError, Step};
use isolane_core::results::{LatenessSummary, MaxrateReport, SCHEMA_VERSION};
use isolane_core::spec::{
    Backend, Criticality, DeviceSpec, Host, LatePolicy, Mechanism, PartitionSpec, Precision,
    ProtectionSpec, Rate, Role, RunLength, Scenario, TimingSpec, WorkloadSpec,
};
use isolane_runtime::maxrate::{LoopRunner, RunnerError};
use isolane_runtime::{affinity, clock, exec, output};

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
    /// --thread-pct; the search runs in a client process of a private MPS daemon).
    #[arg(long, default_value = "none", value_parser = ["none", "timeslice", "green", "mps"])]
    mechanism: String,
    /// green: SMs of the partition.
    #[arg(long)]
    sms: Option<u32>,
    /// mps: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE of the client.
    #[arg(long)]
    thread_pct: Option<u32>,
    /// Set by isolane on the MPS client process it starts: the partition exists already.
    #[arg(long, hide = true)]
    in_partition: bool,
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
    // Alone on the GPU, "none" is the whole GPU (timeslice with nobody to take turns with). The
    // MPS client process isolane started also runs as if alone: its partition is the daemon's.
    let mechanism = match (backend, mechanism) {
        (Backend::Cuda, Mechanism::None) => Mechanism::Timeslice,
        (Backend::Cuda, _) if args.in_partition => Mechanism::Timeslice,
        (_, m) => m,
    };
    // The search itself runs in this process (or, for mps, in the one client process): with one
    // workload, "process" only says that nothing shares a context with it.
    let host = match mechanism {
        Mechanism::Mps | Mechanism::Timeslice => Host::Process,
        _ => Host::Thread,
    };
    let spec = WorkloadSpec {
        name: "maxrate".into(),
        model: args.model.clone(),
        weights: args.weights.clone(),
        batch: args.batch,
        precision,
        rate: Rate::Hz(1.0),
        deadline_ms: None,
        length: RunLength::Jobs(args.jobs),
        warmup_jobs: args.warmup,
        late: LatePolicy::Skip,
        cpu: args.cpu.clone(),
        role: Role::Standalone,
        ramp: None,
        host,
        // The MPS client's share is its environment's; it has no partition of its own.
        partition: if args.in_partition {
            PartitionSpec::default()
        } else {
            PartitionSpec {
                sms: args.sms,
                thread_pct: args.thread_pct,
                ..PartitionSpec::default()
            }
        },
        plan_check: !args.no_plan_check,
        criticality: Criticality::Critical,
    };
    let timing = TimingSpec {
        spin_us: args.spin_us,
        ..TimingSpec::default()
    };
    let scenario = Scenario {
        device: DeviceSpec {
            backend,
            gpu: args.gpu,
            mechanism,
            host,
        },
        timing: timing.clone(),
        protection: ProtectionSpec::default(),
        workloads: vec![spec.clone()],
    };
    let models: Vec<&str> = isolane_engine::builtin_models()
        .iter()
        .map(|m| m.name)
        .collect();
    scenario
        .validate(&models)
        .map_err(|e| user(in_flag_terms(&e)))?;
    let admitted = if args.in_partition {
        None
    } else {
        super::admit_or_refuse(&scenario, "maxrate arguments")?
    };
    if let (Some(plan), Mechanism::Mps) = (&admitted, mechanism) {
        return run_in_mps_client(&scenario, plan);
    }
    // green: the search runs on this thread, in its partition's green context.
    match (&admitted, mechanism) {
        (Some(plan), Mechanism::Green) => {
            let searched = isolane_session::with_partitions(
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
                        .take_green_group(&spec.name)
                        .map(|g| Box::new(g) as isolane_runtime::partition::Partition);
                    search(&args, engine, partition, &scenario.device, &spec, &timing)
                },
            )
            .map_err(super::session_error)?;
            searched
        }
        _ => search(&args, engine, None, &scenario.device, &spec, &timing),
    }
}

/// mps: a private daemon, and the search itself in a client process of it (this program again,
/// with the client environment), since a process's MPS settings are fixed when CUDA starts in it.
fn run_in_mps_client(
    scenario: &Scenario,
    plan: &isolane_core::admission::Plan,
) -> anyhow::Result<u8> {
    let status = isolane_session::with_partitions(
        scenario.device.gpu,
        plan,
        isolane_session::PartitionChoices::default(),
        |session| run_client(session),
    )
    .map_err(super::session_error)??;
    Ok(match status.code() {
        Some(c) => u8::try_from(c).unwrap_or(super::EXIT_FAILED),
        None => EXIT_INTERRUPTED,
    })
}

/// Starts the client process with its partition's environment, adopts it as the daemon's
/// client, and waits for it.
fn run_client(
    session: &isolane_gpu::PartitionSession<'_>,
) -> anyhow::Result<std::process::ExitStatus> {
    let env = session
        .worker_env()
        .get("maxrate")
        .cloned()
        .unwrap_or_default();
    // A terminal's Ctrl-C reaches the client too, which stops and writes what it measured; this
    // process waits for it and then stops the daemon (a second Ctrl-C stops it at once).
    let _stop = super::install_stop_handler()?;
    let exe = std::env::current_exe().context("finding this executable")?;
    let mut client = std::process::Command::new(exe);
    client
        .args(std::env::args_os().skip(1))
        .arg("--in-partition")
        .envs(env);
    // Ends with this process even on `kill -9` (the daemon's watchdog then stops the daemon).
    isolane_core::process::die_with_parent(&mut client);
    let mut child = client.spawn().context("starting the MPS client process")?;
    (session.client_adopter())(child.id());
    child.wait().context("waiting for the MPS client process")
}

fn search(
    args: &MaxrateArgs,
    engine: &isolane_runtime::exec::Engine,
    partition: Option<isolane_runtime::partition::Partition>,
    device: &DeviceSpec,
    spec: &WorkloadSpec,
    timing: &TimingSpec,
) -> anyhow::Result<u8> {
    let cfg = MaxRateConfig {
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
    };
    // The model (and a batch of its activations) and the search's job records must fit this
    // machine before anything of their size is allocated.
    exec::check_model(Some(engine.as_ref()), device, spec).map_err(|e| match e {
        // In flag terms: there is no workload the user named.
        exec::ExecError::BadModel { reason, .. } => {
            let batch = format!("batch = {}: ", args.batch);
            match reason.strip_prefix(&batch) {
                Some(rest) => user(format!("--batch {}: {rest}", args.batch)),
                None => user(format!("--model {}: {reason}", args.model)),
            }
        }
        _ => anyhow::Error::new(e),
    })?;
    check_search_records(args)?;
    let executor = exec::executor_for(
        Some(engine.as_ref()),
        device,
        spec,
        timing.seed,
        0,
        partition,
    )
    .map_err(|e| match e {
        exec::ExecError::BadModel { .. } => user(e),
        _ => anyhow::Error::new(e),
    })?;
    affinity::check_cores(&args.cpu).map_err(user)?;
    let out = match &args.out {
        Some(dir) => Some(super::run::prepare_out(Some(dir), args.force)?),
        None => None,
    };

    let stop = super::install_stop_handler()?;
    affinity::pin_current_thread(&args.cpu)?;
    let mut runner = LoopRunner::new(executor, args.spin_us as i64 * 1000, 5_000_000, stop);
    let mut warm = Vec::new();
    for _ in 0..args.warmup {
        warm.push(runner_warm(&mut runner)?);
    }
    let size = super::progress::SearchSize {
        jobs: args.jobs,
        validations: args.validations,
    };
    if let (false, Some(per_job_s)) = (args.quiet, super::progress::median_s(&warm)) {
        eprintln!("{}", super::progress::estimate_text(size, per_job_s));
    }
    let steal = clock::StealMeter::start();
    let mut shown = super::progress::SearchProgress::new(
        &mut runner,
        size,
        super::progress::bar_allowed(args.quiet),
    );
    let searched = find_max_rate(&mut shown, &cfg);
    shown.finish();
    let result = match searched {
        Ok(r) => r,
        Err(MaxRateError::Runner(RunnerError::Interrupted)) => {
            eprintln!("interrupted: no max rate found");
            return Ok(EXIT_INTERRUPTED);
        }
        Err(e @ MaxRateError::Config(_)) => return Err(user(e)),
        Err(e) => return Err(anyhow::anyhow!("{e}")),
    };

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
    let cpu_steal_pct = steal.pct();
    if let Some(steal) = cpu_steal_pct.filter(|&p| p > 1.0) {
        eprintln!(
            "note: the hypervisor took {steal:.1} % of this machine's CPU during the search:\n  \
             the rate found may be lower than the machine allows"
        );
    }
    let lateness = percentiles_us(&mut runner.lateness_ns);
    println!(
        "max stable rate {:.3} jobs/s, L_max {:.4} ms (model {}, batch {})",
        result.max_rate_hz, result.l_max_ms, args.model, args.batch
    );
    println!("initial rate {:.3} jobs/s", result.initial_rate_hz);
    println!(
        "start lateness: p50 {:.1} µs, p99 {:.1} µs, max {:.1} µs (all timed batches)",
        lateness.0, lateness.1, lateness.2
    );

    if let Some(dir) = out {
        // The partition the user asked for (`none` is the whole GPU), also in the MPS client.
        let recorded_mechanism = match (device.backend, parse_value("mechanism", &args.mechanism)?)
        {
            (Backend::Cuda, Mechanism::None) => Mechanism::Timeslice,
            (_, m) => m,
        };
        let report = MaxrateReport {
            schema_version: SCHEMA_VERSION,
            isolane_version: env!("CARGO_PKG_VERSION").into(),
            model: args.model.clone(),
            batch: args.batch,
            backend: device.backend,
            precision: spec.precision,
            mechanism: recorded_mechanism,
            sms: args.sms,
            thread_pct: args.thread_pct,
            config: cfg,
            max_rate_hz: result.max_rate_hz,
            l_max_ms: result.l_max_ms,
            initial_rate_hz: result.initial_rate_hz,
            start_lateness_us: LatenessSummary {
                p50: finite(lateness.0),
                p99: finite(lateness.1),
                max: finite(lateness.2),
            },
            cpu_steal_pct,
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
    }
    Ok(0)
}

fn runner_warm(runner: &mut LoopRunner) -> anyhow::Result<f64> {
    use isolane_core::maxrate::BatchRunner;
    match runner.run_back_to_back(1) {
        Ok(t) => Ok(t.first().copied().unwrap_or(0.0)),
        Err(RunnerError::Interrupted) => Ok(0.0),
        Err(e) => Err(e.into()),
    }
}

fn finite(v: f64) -> Option<f64> {
    v.is_finite().then_some(v)
}

/// p50, p99, max of ns values, in µs (NaN when empty).
fn percentiles_us(v: &mut [i64]) -> (f64, f64, f64) {
    if v.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    v.sort_unstable();
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize] as f64 / 1e3;
    (at(0.5), at(0.99), at(1.0))
}
