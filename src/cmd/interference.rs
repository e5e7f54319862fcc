//! `isolane interference`: the interference matrix (issue 14). Flags → a
//! `isolane_runtime::interference::MatrixConfig`; `isolane_session::studies::interference` runs
//! the matrix, each cell through `run`'s own `measure` (`isolane_session::study_runs::StudyRuns`).

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use isolane_core::flag_values::{positive, rate_hz, run_seconds};
use isolane_core::spec::{self, Mechanism, Precision};
use isolane_runtime::interference::{MatrixConfig, VictimRate};
use isolane_session::studies::interference;

use super::{user, BackendFlag};

#[derive(Args)]
#[command(
    about = "Measure how much each model slows down beside each other model (the matrix)",
    long_about = "The interference matrix: each victim model alone in its partition (closed \
                  loop: its capacity; then at its rate: the reference), then at its rate \
                  beside each neighbour model running flat out in a partition of its own. Per \
                  cell: the victim's execution time (end - start) p50 and p99 against alone \
                  (its stretch), timeouts, the neighbour's throughput and the GPU's DRAM, SM \
                  and tensor activity (GPM, Hopper and later). Models: built-in names, .onnx \
                  files, spin:<time> and kernel: workloads (kernel:triad:<size> memory-bound, \
                  kernel:gemm:<n>[:<precision>] compute-bound, kernel:l2:<size>[:<passes>]). \
                  Writes interference.json, interference.csv and one run folder per cell, \
                  which `isolane report` draws as a heatmap (docs/interference.md)."
)]
pub struct InterferenceArgs {
    /// Victim models, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    victims: Vec<String>,
    /// Neighbour models, comma-separated. Default: the victims.
    #[arg(long, value_delimiter = ',')]
    neighbours: Vec<String>,
    /// Engine backend (on cpu only --mechanism none runs: spin/kernel models for tests).
    #[arg(long, value_enum, default_value = "cuda")]
    backend: BackendFlag,
    /// GPU index (cuda).
    #[arg(long, default_value_t = 0)]
    gpu: u32,
    /// How victim and neighbour share the device. Default: green on cuda, none on cpu.
    #[arg(long, value_enum)]
    mechanism: Option<MechanismFlag>,
    /// The victim's partition: SMs (green) or thread % (mps).
    #[arg(long, value_parser = super::help::at_least_one_u32)]
    victim_size: Option<u32>,
    /// The neighbour's partition sizes, comma-separated; each is a column of pairs.
    #[arg(long, value_delimiter = ',', value_parser = super::help::at_least_one_u32)]
    neighbour_sizes: Vec<u32>,
    /// Precisions of victim and neighbour, comma-separated (kernel: models keep their own).
    /// Default: fp16 on cuda, fp32 on cpu.
    #[arg(long, value_enum, value_delimiter = ',')]
    precisions: Vec<PrecisionFlag>,
    /// The victim's rate as a fraction of its capacity alone in its partition (0 < F <= 1).
    #[arg(long, default_value_t = 0.5, conflicts_with = "victim_rate_hz")]
    victim_load: f64,
    /// A fixed victim rate in Hz instead (no capacity cells).
    #[arg(long, value_parser = rate_hz)]
    victim_rate_hz: Option<f64>,
    /// The victim's relative deadline in ms. Default: one period.
    #[arg(long, value_parser = positive)]
    deadline_ms: Option<f64>,
    /// Also run each neighbour alone, closed loop, at each size and precision: its own
    /// throughput and device activity (GPM), the reference of its throughput in the pairs.
    #[arg(long)]
    neighbour_alone: bool,
    /// Seconds each cell runs (after warm-up).
    #[arg(long, default_value_t = 5.0, value_parser = run_seconds)]
    duration_s: f64,
    /// Warm-up jobs of each workload before each cell's t0.
    #[arg(long, default_value_t = 20)]
    warmup: u64,
    /// Output directory. Default: a new runs/<YYYYmmdd-HHMMSS>.
    #[arg(long, short = 'o', value_name = "DIR")]
    out: Option<PathBuf>,
    /// Use --out even if it is not empty: its files and each cell's folder are replaced.
    #[arg(long)]
    force: bool,
    /// No progress bars.
    #[arg(long, short = 'q')]
    quiet: bool,
    /// Every column of the matrix table (default: the ones that fit 80 columns).
    #[arg(long)]
    wide: bool,
    #[command(flatten)]
    partitions: super::PartitionFlags,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum MechanismFlag {
    Green,
    Mps,
    Timeslice,
    None,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum PrecisionFlag {
    Fp32,
    Tf32,
    Fp16,
    Bf16,
}

/// The flags as the library's configuration.
fn config(a: &InterferenceArgs) -> anyhow::Result<MatrixConfig> {
    let backend: spec::Backend = a.backend.into();
    let on_gpu = backend == spec::Backend::Cuda;
    let mechanism = match (a.mechanism, on_gpu) {
        (Some(MechanismFlag::Green), _) | (None, true) => Mechanism::Green,
        (Some(MechanismFlag::Mps), _) => Mechanism::Mps,
        (Some(MechanismFlag::Timeslice), _) => Mechanism::Timeslice,
        (Some(MechanismFlag::None), _) | (None, false) => Mechanism::None,
    };
    let precisions = match (a.precisions.is_empty(), on_gpu) {
        (true, true) => vec![Precision::Fp16],
        (true, false) => vec![Precision::Fp32],
        (false, _) => a.precisions.iter().map(|&p| precision(p)).collect(),
    };
    let models = |list: &[String]| -> anyhow::Result<Vec<String>> {
        list.iter().map(|m| model_path(m)).collect()
    };
    let victims = models(&a.victims)?;
    let neighbours = if a.neighbours.is_empty() {
        victims.clone()
    } else {
        models(&a.neighbours)?
    };
    let c = MatrixConfig {
        backend,
        gpu: a.gpu,
        mechanism,
        victim_size: a.victim_size,
        neighbour_sizes: a.neighbour_sizes.clone(),
        victims,
        neighbours,
        precisions,
        rate: match a.victim_rate_hz {
            Some(hz) => VictimRate::Hz(hz),
            None => VictimRate::Load(a.victim_load),
        },
        deadline_ms: a.deadline_ms,
        duration_s: a.duration_s,
        warmup_jobs: a.warmup,
        neighbour_alone: a.neighbour_alone,
    };
    c.check().map_err(user)?;
    Ok(c)
}

fn precision(p: PrecisionFlag) -> Precision {
    match p {
        PrecisionFlag::Fp32 => Precision::Fp32,
        PrecisionFlag::Tf32 => Precision::Tf32,
        PrecisionFlag::Fp16 => Precision::Fp16,
        PrecisionFlag::Bf16 => Precision::Bf16,
    }
}

/// An `.onnx` model made absolute: each cell's `scenario.toml` lives in the cell's folder.
fn model_path(model: &str) -> anyhow::Result<String> {
    match spec::ModelSource::classify(model) {
        Ok(spec::ModelSource::Onnx(p)) => Ok(std::path::absolute(&p)
            .map_err(|e| user(format!("--victims/--neighbours {model}: {e}")))?
            .display()
            .to_string()),
        _ => Ok(model.to_string()),
    }
}

pub fn run(a: InterferenceArgs, engine: &isolane_runtime::exec::Engine) -> anyhow::Result<u8> {
    let c = config(&a)?;
    let runs = super::studies::StudyRuns {
        machine: &super::studies::Executors,
        quiet: a.quiet,
        choices: a.partitions.choices(),
        engine,
    };
    interference::check(&c, &runs).map_err(super::studies::study_error)?;
    let out =
        super::run::prepare_out_for(a.out.as_deref(), a.force, super::run::Maker::Interference)?;
    let (code, index) = interference::run(&c, &out, &runs, env!("CARGO_PKG_VERSION"))
        .map_err(super::studies::study_error)?;
    println!(
        "{}",
        isolane_report::interference_table(&index.cells, a.wide)
    );
    println!("results: {}", out.display());
    Ok(code)
}
