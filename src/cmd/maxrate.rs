//! `isolane maxrate`: the max stable inference frequency of one model (Algorithm 1 of paper 000).

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;
use isolane_core::maxrate::{find_max_rate, Acceptance, MaxRateConfig, MaxRateError, Step};
use isolane_core::spec::{
    Backend, DeviceSpec, Host, LatePolicy, Mechanism, NoBuiltinModels, PartitionSpec, Precision,
    Rate, Role, RunLength, Scenario, TimingSpec, WorkloadSpec,
};
use isolane_runtime::maxrate::{LoopRunner, RunnerError};
use isolane_runtime::{affinity, exec, output};

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
    /// Model: `spin:<time>[~<jitter>]` for now (real models when the engine lands).
    #[arg(long, short = 'm')]
    model: String,
    /// Images per job.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    batch: u32,
    /// Jobs per batch (N).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    jobs: u64,
    /// Validation batches (K).
    #[arg(long, default_value_t = 3)]
    validations: u32,
    /// Absolute rate step in jobs/s.
    #[arg(long, default_value_t = 1.0, conflicts_with = "relative_step", value_parser = positive)]
    step: f64,
    /// Relative rate step instead: multiply/divide the rate by 1 + F (e.g. 0.01).
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
}

fn positive(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("`{s}` is not a number > 0")),
    }
}

pub fn run(args: MaxrateArgs) -> anyhow::Result<u8> {
    let spec = WorkloadSpec {
        name: "maxrate".into(),
        model: args.model.clone(),
        weights: None,
        batch: args.batch,
        precision: Precision::Fp32,
        rate: Rate::Hz(1.0),
        deadline_ms: None,
        length: RunLength::Jobs(args.jobs),
        warmup_jobs: args.warmup,
        late: LatePolicy::Skip,
        cpu: args.cpu.clone(),
        role: Role::Standalone,
        ramp: None,
        host: Host::Thread,
        partition: PartitionSpec::default(),
    };
    let timing = TimingSpec {
        spin_us: args.spin_us,
        ..TimingSpec::default()
    };
    let scenario = Scenario {
        device: DeviceSpec {
            backend: Backend::Cpu,
            gpu: 0,
            mechanism: Mechanism::None,
            host: Host::Thread,
        },
        timing: timing.clone(),
        workloads: vec![spec.clone()],
    };
    scenario.validate(&NoBuiltinModels).map_err(user)?;
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
    let executor = exec::executor_for(&spec, timing.seed, 0).map_err(|e| match e {
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
    let result = match find_max_rate(&mut runner, &cfg) {
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
            &["batch", "phase", "rate /s", "jobs", "misses", "clean"],
            &rows,
            &[1]
        )
    );
    let lateness = percentiles_us(&mut runner.lateness_ns);
    println!(
        "model {}  batch {}: max stable rate {:.3} jobs/s, L_max {:.4} ms (initial rate {:.3} jobs/s)",
        args.model, args.batch, result.max_rate_hz, result.l_max_ms, result.initial_rate_hz
    );
    println!(
        "start lateness over all timed batches: p50 {:.1} µs, p99 {:.1} µs, max {:.1} µs",
        lateness.0, lateness.1, lateness.2
    );

    if let Some(dir) = out {
        let json = serde_json::json!({
            "isolane_version": env!("CARGO_PKG_VERSION"),
            "model": args.model,
            "batch": args.batch,
            "config": cfg,
            "max_rate_hz": result.max_rate_hz,
            "l_max_ms": result.l_max_ms,
            "initial_rate_hz": result.initial_rate_hz,
            "start_lateness_us": { "p50": lateness.0, "p99": lateness.1, "max": lateness.2 },
            "trace": result.trace,
        });
        output::write_json(&dir.join("maxrate.json"), &json)?;
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

/// p50, p99, max of ns values, in µs (NaN when empty).
fn percentiles_us(v: &mut [i64]) -> (f64, f64, f64) {
    if v.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    v.sort_unstable();
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize] as f64 / 1e3;
    (at(0.5), at(0.99), at(1.0))
}
