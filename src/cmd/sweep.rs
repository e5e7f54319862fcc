//! `isolane sweep partition|concurrency`: one results folder holding `sweep.json` and one
//! ordinary run folder per point. The points are built and run by
//! `isolane_session::studies::sweep` (scenarios from `isolane_runtime::sweep`); each is written
//! into its folder and run by `isolane run`'s own path (`SweepRuns` below), so a point is
//! exactly a run (admission, partitions, telemetry included).

use std::path::{Path, PathBuf};

use std::cell::OnceCell;

use clap::{Args, Subcommand};
use isolane_core::results::SweepIndex;
use isolane_core::spec::Scenario;
use isolane_runtime::coordinator::RunPlan;
use isolane_session::run_path;
use isolane_session::studies::sweep::{self as study, Point, PointRuns};
use isolane_session::studies::Failure;

use super::BackendFlag;

#[derive(Args)]
#[command(
    about = "Sweep partition sizes or workloads × batch sizes; one results folder per sweep",
    long_about = "Run one scenario per point of a sweep and collect them in one results folder: \
                  sweep.json (the index) and one run folder per point (summary.json, \
                  jobs/*.csv, scenario.toml, telemetry.csv on a GPU), which `isolane report` \
                  draws."
)]
pub struct SweepArgs {
    #[command(subcommand)]
    kind: SweepKind,
}

#[derive(Subcommand)]
enum SweepKind {
    /// One model alone, partition size from the device's minimum to the whole GPU (paper 000,
    /// Figs. 4–5): green by the device's SM granularity, mps by thread percentage.
    Partition(PartitionArgs),
    /// N copies of one model at once for each N × batch × precision (paper 001, Figs. 6–7).
    Concurrency(ConcurrencyArgs),
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum PartitionMechanism {
    Green,
    Mps,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum ConcurrencyMechanism {
    Timeslice,
    Mps,
}

/// Flags every sweep shares.
#[derive(Args)]
struct Common {
    /// Engine backend. On `cpu` the points are run without partitions (a dry run of the
    /// machinery with spin models).
    #[arg(long, value_enum, default_value = "cuda")]
    backend: BackendFlag,
    /// GPU index (cuda).
    #[arg(long, default_value_t = 0)]
    gpu: u32,
    /// Release rate per workload in Hz, or `max` for closed loop (throughput).
    #[arg(long, default_value = "max", value_parser = parse_rate)]
    rate: Rate,
    /// Seconds each point runs (after warm-up).
    #[arg(long, default_value_t = 10.0, value_parser = isolane_core::flag_values::run_seconds)]
    duration_s: f64,
    /// Warm-up jobs per workload before each point's t0.
    #[arg(long, default_value_t = 20)]
    warmup: u64,
    /// Output directory. Default: a new runs/<YYYYmmdd-HHMMSS>.
    #[arg(long, short = 'o', value_name = "DIR")]
    out: Option<PathBuf>,
    /// Use --out even if it is not empty: sweep.json and each point's folder are replaced.
    #[arg(long)]
    force: bool,
    /// No progress bars.
    #[arg(long, short = 'q')]
    quiet: bool,
    /// mps: use an MPS daemon that is already running for this GPU (it is left running).
    #[arg(long)]
    join_mps: bool,
    /// Serve live metrics (OpenMetrics / Prometheus) of every point at
    /// http://HOST:PORT/metrics while the sweep goes on; port 0 picks a free port.
    #[arg(long, value_name = "HOST:PORT")]
    metrics_addr: Option<String>,
}

#[derive(Args)]
struct PartitionArgs {
    /// Model: a built-in name, a .onnx file or spin:<time>.
    #[arg(long, short = 'm')]
    model: String,
    #[arg(long, value_enum)]
    mechanism: PartitionMechanism,
    /// Partition sizes: SMs (green) or thread % (mps). Default: green from the device's
    /// minimum to its SM count by its step; mps 10,20,…,100.
    #[arg(long, value_delimiter = ',')]
    sizes: Vec<u32>,
    #[arg(long, default_value_t = 1, value_parser = super::help::at_least_one_u32)]
    batch: u32,
    #[arg(long, default_value = "fp32")]
    precision: String,
    /// Offline device model whose green rules give the sizes (default: this machine's GPU
    /// on cuda, h100-sxm on cpu, where the points run without partitions).
    #[arg(long)]
    device_model: Option<String>,
    #[command(flatten)]
    common: Common,
}

#[derive(Args)]
struct ConcurrencyArgs {
    #[arg(long, short = 'm')]
    model: String,
    /// Numbers of concurrent workloads.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8", value_parser = super::help::at_least_one_u32)]
    workloads: Vec<u32>,
    /// Batch sizes.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16", value_parser = super::help::at_least_one_u32)]
    batch: Vec<u32>,
    /// Precisions (fp32 | tf32 | fp16 | bf16; only fp32 on cpu).
    #[arg(long, value_delimiter = ',', default_value = "fp32")]
    precision: Vec<String>,
    /// How the workloads share the GPU (cuda): separate processes taking turns, or MPS with
    /// equal thread shares.
    #[arg(long, value_enum, default_value = "timeslice")]
    mechanism: ConcurrencyMechanism,
    #[command(flatten)]
    common: Common,
}

/// A rate in Hz, or `max` (`None`): closed loop.
#[derive(Clone, Copy)]
struct Rate(Option<f64>);

fn parse_rate(s: &str) -> Result<Rate, String> {
    isolane_core::flag_values::rate_or_max(s).map(Rate)
}

pub fn run(args: SweepArgs, engine: &isolane_runtime::exec::Engine) -> anyhow::Result<u8> {
    match args.kind {
        SweepKind::Partition(a) => partition(a, engine),
        SweepKind::Concurrency(a) => concurrency(a, engine),
    }
}

fn partition(a: PartitionArgs, engine: &isolane_runtime::exec::Engine) -> anyhow::Result<u8> {
    let c = &a.common;
    let on_gpu = c.backend == BackendFlag::Cuda;
    let device =
        isolane_executors::machine::sweep_device_model(a.device_model.as_deref(), on_gpu, c.gpu)
            .map_err(super::machine_error)?;
    let sweep = study::PartitionSweep {
        model: a.model.clone(),
        green: a.mechanism == PartitionMechanism::Green,
        sizes: a.sizes.clone(),
        batch: a.batch,
        precision: a.precision.clone(),
    };
    let (index, points) =
        study::partition_points(&common(c), &sweep, &device, env!("CARGO_PKG_VERSION"))
            .map_err(super::studies::failure_error)?;
    run_points(index, points, c, engine)
}

fn concurrency(a: ConcurrencyArgs, engine: &isolane_runtime::exec::Engine) -> anyhow::Result<u8> {
    let c = &a.common;
    let sweep = study::ConcurrencySweep {
        model: a.model.clone(),
        workloads: a.workloads.clone(),
        batch: a.batch.clone(),
        precision: a.precision.clone(),
        mps: a.mechanism == ConcurrencyMechanism::Mps,
    };
    let (index, points) = study::concurrency_points(&common(c), &sweep, env!("CARGO_PKG_VERSION"))
        .map_err(super::studies::failure_error)?;
    run_points(index, points, c, engine)
}

/// The flags every point shares, as the library takes them.
fn common(c: &Common) -> study::SweepCommon {
    study::SweepCommon {
        backend: c.backend.into(),
        gpu: c.gpu,
        rate_hz: c.rate.0,
        duration_s: c.duration_s,
        warmup: c.warmup,
    }
}

fn run_points(
    index: SweepIndex,
    points: Vec<Point>,
    c: &Common,
    engine: &isolane_runtime::exec::Engine,
) -> anyhow::Result<u8> {
    let runs = SweepRuns {
        common: c,
        engine,
        live: OnceCell::new(),
    };
    let out_dir = c.out.as_deref().unwrap_or(Path::new("runs"));
    study::check_points(&points, &runs, out_dir).map_err(super::studies::study_error)?;
    let out = super::run::prepare_out_for(c.out.as_deref(), c.force, super::run::Maker::Sweep)?;
    let (code, table) = study::run_points(index, &points, &out, &runs, &mut || {
        let live =
            super::serve_metrics(c.metrics_addr.as_deref()).map_err(super::studies::failure)?;
        let _ = runs.live.set(live);
        Ok(())
    })
    .map_err(super::studies::study_error)?;
    println!("{table}");
    println!("sweep: {}", out.display());
    Ok(code)
}

/// The points' runs: `isolane run`'s own, one endpoint of live metrics for all of them.
struct SweepRuns<'a> {
    common: &'a Common,
    engine: &'a isolane_runtime::exec::Engine,
    live: OnceCell<Option<super::LiveMetrics>>,
}

impl PointRuns for SweepRuns<'_> {
    fn models(&self) -> Vec<&'static str> {
        super::studies::builtin_names()
    }

    fn admit(&self, s: &Scenario, name: &str) -> Result<(), Failure> {
        super::admit_or_refuse(s, name)
            .map(drop)
            .map_err(super::studies::failure)
    }

    fn preflight(&self, plan: &RunPlan, name: &str) -> Result<(), Failure> {
        super::run::preflight(plan, self.engine)
            .map_err(|e| super::studies::failure(e.context(name.to_string())))
    }

    fn run(&self, s: Scenario, name: String, dir: &Path) -> Result<u8, Failure> {
        let live = self.live.get().and_then(Option::as_ref);
        let flags = run_path::ScenarioRun {
            machine: &super::studies::Executors,
            out: Some(dir),
            force: true,
            quiet: self.common.quiet,
            // Each point's scenario carries its workloads' own `plan_check`.
            no_plan_check: false,
            choices: isolane_session::PartitionChoices {
                join_mps: self.common.join_mps,
                ..Default::default()
            },
            engine: self.engine,
        };
        run_path::run_scenario(s, name, &flags, live.map(|l| &l.metrics))
            .and_then(|(s, m)| run_path::report(&super::device_title(&s), &m, false, false))
            .map_err(super::studies::failure)
    }

    fn say(&self, line: &str) {
        eprintln!("{line}");
    }
}
