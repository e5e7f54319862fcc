//! `isolane maxrate`: the max stable inference frequency of one model (Algorithm 1 of paper 000).

use std::path::PathBuf;

use clap::Args;
use isolane_core::flag_values::{positive, rate_hz};
use isolane_core::spec::TimingSpec;
use isolane_session::maxrate::Searched;
use isolane_session::search::{self, MaxrateFlags, SearchCommandError};

use super::EXIT_INTERRUPTED;

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
    #[arg(long, default_value_t = 1.0, conflicts_with = "relative_step", value_parser = rate_hz)]
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
    /// Use --out even if it is not empty, replacing maxrate's files (not another command's).
    #[arg(long)]
    force: bool,
    /// No time estimate and no progress on stderr.
    #[arg(long, short = 'q')]
    quiet: bool,
}

pub fn run(args: MaxrateArgs, engine: &isolane_runtime::exec::Engine) -> anyhow::Result<u8> {
    let flags = MaxrateFlags {
        model: args.model,
        weights: args.weights,
        backend: args.backend,
        precision: args.precision,
        gpu: args.gpu,
        mechanism: args.mechanism,
        sms: args.sms,
        thread_pct: args.thread_pct,
        plan_check: !args.no_plan_check,
        batch: args.batch,
        jobs: args.jobs,
        validations: args.validations,
        step: args.step,
        relative_step: args.relative_step,
        confidence: args.confidence,
        target: args.target,
        warmup: args.warmup,
        cpu: args.cpu,
        spin_us: args.spin_us,
        quiet: args.quiet,
    };
    let models = isolane_executors::machine::builtin_names();
    let request = search::request(&flags, &models).map_err(search_error)?;
    let admitted = super::admit_or_refuse(&search::scenario(&request), "maxrate arguments")?;
    search::check(&flags, engine, &request).map_err(search_error)?;
    let out = match &args.out {
        Some(dir) => Some(super::run::prepare_out_for(
            Some(dir),
            args.force,
            super::run::Maker::Maxrate,
        )?),
        None => None,
    };
    let stop = super::install_stop_handler()?;
    let note = &mut |line: String| eprintln!("{line}");
    match search::search(&flags, &request, admitted.as_ref(), engine, &stop, note)
        .map_err(search_error)?
    {
        Searched::Done(outcome) => {
            let say = &mut |line: String| println!("{line}");
            search::report(&flags, &request, &outcome, out.as_deref(), say, note)
                .map_err(search_error)?;
            Ok(0)
        }
        Searched::Interrupted => {
            eprintln!("interrupted: no max rate found");
            Ok(EXIT_INTERRUPTED)
        }
    }
}

fn search_error(e: SearchCommandError) -> anyhow::Error {
    blame!(e)
}
