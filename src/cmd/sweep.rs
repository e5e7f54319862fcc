//! `isolane sweep partition|concurrency`: one results folder holding `sweep.json` and one
//! ordinary run folder per point. Each point's scenario is generated
//! (`isolane_runtime::sweep`), written into its folder and run by `isolane run`'s own code, so
//! a point is exactly a run (admission, partitions, telemetry included).

use isolane_core::spec::limits::{MAX_RATE_HZ, MAX_SECONDS, MIN_SECONDS};
use std::path::{Path, PathBuf};

use std::cell::OnceCell;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use isolane_core::results::{SweepIndex, SweepPoint, SCHEMA_VERSION};
use isolane_core::spec::{self, DeviceSpec, Host, Mechanism, ModelSource, Precision, Scenario};
use isolane_runtime::coordinator::RunPlan;
use isolane_runtime::sweep::{self, PointWorkload};
use isolane_session::studies::sweep::{self as study, Point, PointRuns};
use isolane_session::studies::Failure;

use super::user;

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
enum Backend {
    Cpu,
    Cuda,
}

impl Backend {
    fn as_str(self) -> &'static str {
        match self {
            Backend::Cpu => "cpu",
            Backend::Cuda => "cuda",
        }
    }

    fn spec(self) -> spec::Backend {
        match self {
            Backend::Cpu => spec::Backend::Cpu,
            Backend::Cuda => spec::Backend::Cuda,
        }
    }
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
    backend: Backend,
    /// GPU index (cuda).
    #[arg(long, default_value_t = 0)]
    gpu: u32,
    /// Release rate per workload in Hz, or `max` for closed loop (throughput).
    #[arg(long, default_value = "max", value_parser = parse_rate)]
    rate: Rate,
    /// Seconds each point runs (after warm-up).
    #[arg(long, default_value_t = 10.0, value_parser = seconds)]
    duration_s: f64,
    /// Warm-up jobs per workload before each point's t0.
    #[arg(long, default_value_t = 20)]
    warmup: u64,
    /// Output directory. Default: a new runs/<YYYYmmdd-HHMMSS>.
    #[arg(long, short = 'o', value_name = "DIR")]
    out: Option<PathBuf>,
    /// Use --out even if it is not empty (each point's folder is replaced).
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

#[derive(Clone, Copy)]
enum Rate {
    Max,
    Hz(f64),
}

fn parse_rate(s: &str) -> Result<Rate, String> {
    if s == "max" {
        return Ok(Rate::Max);
    }
    match positive(s) {
        Ok(hz) if hz <= MAX_RATE_HZ => Ok(Rate::Hz(hz)),
        Ok(_) => Err(format!(
            "`{s}` is above {MAX_RATE_HZ:e} Hz (one job per ns, the clock's resolution)"
        )),
        Err(e) => Err(e),
    }
}

/// A duration flag: as a scenario's `duration_s`, 1 ns to 100 days.
fn seconds(s: &str) -> Result<f64, String> {
    match positive(s) {
        Ok(v) if (MIN_SECONDS..=MAX_SECONDS).contains(&v) => Ok(v),
        _ => Err(format!(
            "`{s}` is not a number of seconds from {MIN_SECONDS:e} (1 ns) to {MAX_SECONDS:e} \
             (100 days)"
        )),
    }
}

fn positive(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("`{s}` is not a number > 0")),
    }
}

pub fn run(args: SweepArgs, engine: &isolane_runtime::exec::Engine) -> anyhow::Result<u8> {
    match args.kind {
        SweepKind::Partition(a) => partition(a, engine),
        SweepKind::Concurrency(a) => concurrency(a, engine),
    }
}

/// Where every workload of a point runs.
fn point_device(c: &Common, mechanism: Mechanism, host: Host) -> DeviceSpec {
    DeviceSpec {
        backend: c.backend.spec(),
        gpu: c.gpu,
        mechanism,
        host,
        gpus: Vec::new(),
    }
}

/// `--precision` as the scenario's type (a mistake names the flag and what is allowed).
fn precision(v: &str) -> anyhow::Result<Precision> {
    serde_json::from_value(serde_json::Value::String(v.to_string())).map_err(|_| {
        user(format!(
            "--precision {v}: expected one of fp32, tf32, fp16, bf16"
        ))
    })
}

/// `--model` as a point's scenario names it: an `.onnx` path made absolute, since the point's
/// `scenario.toml` lives in the point's folder (as a scenario file's own paths come back
/// absolute from parsing).
fn point_model(model: &str) -> anyhow::Result<String> {
    match ModelSource::classify(model) {
        Ok(ModelSource::Onnx(path)) => Ok(std::path::absolute(&path)
            .with_context(|| format!("--model {model}: resolving the path"))?
            .display()
            .to_string()),
        _ => Ok(model.to_string()),
    }
}

fn partition(a: PartitionArgs, engine: &isolane_runtime::exec::Engine) -> anyhow::Result<u8> {
    let c = &a.common;
    let device = match (&a.device_model, c.backend) {
        (Some(name), _) => isolane_core::device_model::device_model(name).ok_or_else(|| {
            user(format!(
                "--device-model: unknown `{name}` (allowed: {})",
                isolane_core::device_model::device_model_names().join(", ")
            ))
        })?,
        (None, Backend::Cuda) => super::detected_device_model(c.gpu)?,
        (None, Backend::Cpu) => isolane_core::device_model::device_model("h100-sxm")
            .context("the built-in h100-sxm device model is missing")?,
    };
    let sizes = match (a.mechanism, a.sizes.is_empty()) {
        (PartitionMechanism::Green, true) => sweep::green_sizes(&device).map_err(user)?,
        (PartitionMechanism::Green, false) => {
            sweep::check_green_sizes(&device, &a.sizes).map_err(user)?;
            a.sizes.clone()
        }
        (PartitionMechanism::Mps, true) => sweep::mps_sizes(),
        (PartitionMechanism::Mps, false) => {
            sweep::check_mps_sizes(&a.sizes).map_err(user)?;
            a.sizes.clone()
        }
    };
    let (mechanism, host, unit) = match (c.backend, a.mechanism) {
        (Backend::Cpu, PartitionMechanism::Green) => (Mechanism::None, Host::Thread, "sms"),
        (Backend::Cpu, PartitionMechanism::Mps) => (Mechanism::None, Host::Thread, "thread_pct"),
        (Backend::Cuda, PartitionMechanism::Green) => (Mechanism::Green, Host::Thread, "sms"),
        (Backend::Cuda, PartitionMechanism::Mps) => (Mechanism::Mps, Host::Process, "thread_pct"),
    };
    let point_precision = precision(&a.precision)?;
    let model = point_model(&a.model)?;
    let on_gpu = c.backend == Backend::Cuda;
    let points = sizes
        .iter()
        .map(|&size| {
            let green = a.mechanism == PartitionMechanism::Green;
            let w = PointWorkload {
                name: sweep::workload_name(&a.model),
                model: model.clone(),
                batch: a.batch,
                precision: point_precision,
                rate_hz: rate_hz(c.rate),
                duration_s: c.duration_s,
                warmup_jobs: c.warmup,
                sms: (on_gpu && green).then_some(size),
                thread_pct: (on_gpu && !green).then_some(size),
            };
            Point {
                entry: SweepPoint {
                    dir: format!("{unit}-{size:03}"),
                    status: "pending".into(),
                    sms: green.then_some(size),
                    thread_pct: (!green).then_some(size),
                    batch: Some(a.batch),
                    precision: Some(a.precision.clone()),
                    ..SweepPoint::default()
                },
                scenario: sweep::point_scenario(point_device(c, mechanism, host), &[w]),
            }
        })
        .collect();
    let index = SweepIndex {
        schema_version: SCHEMA_VERSION,
        isolane_version: env!("CARGO_PKG_VERSION").into(),
        kind: "partition".into(),
        model: a.model.clone(),
        backend: c.backend.as_str().into(),
        mechanism: match a.mechanism {
            PartitionMechanism::Green => "green",
            PartitionMechanism::Mps => "mps",
        }
        .into(),
        precision: a.precision.clone(),
        device_model: Some(device.name.to_string()),
        unit: Some(unit.into()),
        partition_applied: on_gpu,
        rate_hz: rate_hz(c.rate),
        duration_s: c.duration_s,
        points: Vec::new(),
    };
    run_points(index, points, c, engine)
}

fn concurrency(a: ConcurrencyArgs, engine: &isolane_runtime::exec::Engine) -> anyhow::Result<u8> {
    let c = &a.common;
    for (flag, list) in [("workloads", &a.workloads), ("batch", &a.batch)] {
        if list.is_empty() || list.contains(&0) {
            return Err(user(format!(
                "--{flag}: expected a comma-separated list of numbers ≥ 1"
            )));
        }
    }
    if a.precision.is_empty() {
        return Err(user("--precision: the list is empty"));
    }
    let (mechanism, host) = match (c.backend, a.mechanism) {
        (Backend::Cpu, _) => (Mechanism::None, Host::Thread),
        (Backend::Cuda, ConcurrencyMechanism::Timeslice) => (Mechanism::Timeslice, Host::Process),
        (Backend::Cuda, ConcurrencyMechanism::Mps) => (Mechanism::Mps, Host::Process),
    };
    let model = point_model(&a.model)?;
    let several_precisions = a.precision.len() > 1;
    let mut points = Vec::new();
    for precision_flag in &a.precision {
        let point_precision = precision(precision_flag)?;
        for &n in &a.workloads {
            for &b in &a.batch {
                let ws: Vec<PointWorkload> = (0..n)
                    .map(|i| PointWorkload {
                        name: format!("{}-{i}", sweep::workload_name(&a.model)),
                        model: model.clone(),
                        batch: b,
                        precision: point_precision,
                        rate_hz: rate_hz(c.rate),
                        duration_s: c.duration_s,
                        warmup_jobs: c.warmup,
                        sms: None,
                        // Equal shares that add up to at most 100 % (admission's budget).
                        thread_pct: (mechanism == Mechanism::Mps).then(|| (100 / n).max(1)),
                    })
                    .collect();
                let dir = if several_precisions {
                    format!("{precision_flag}-w{n}-b{b:02}")
                } else {
                    format!("w{n}-b{b:02}")
                };
                points.push(Point {
                    entry: SweepPoint {
                        dir,
                        status: "pending".into(),
                        workloads: Some(n),
                        batch: Some(b),
                        precision: Some(precision_flag.clone()),
                        ..SweepPoint::default()
                    },
                    scenario: sweep::point_scenario(point_device(c, mechanism, host), &ws),
                });
            }
        }
    }
    let index = SweepIndex {
        schema_version: SCHEMA_VERSION,
        isolane_version: env!("CARGO_PKG_VERSION").into(),
        kind: "concurrency".into(),
        model: a.model.clone(),
        backend: c.backend.as_str().into(),
        mechanism: mechanism.name().into(),
        precision: a.precision.join(","),
        device_model: None,
        unit: None,
        partition_applied: c.backend == Backend::Cuda && mechanism == Mechanism::Mps,
        rate_hz: rate_hz(c.rate),
        duration_s: c.duration_s,
        points: Vec::new(),
    };
    run_points(index, points, c, engine)
}

fn rate_hz(r: Rate) -> Option<f64> {
    match r {
        Rate::Max => None,
        Rate::Hz(h) => Some(h),
    }
}

/// `isolane run`'s arguments for one point (its scenario is given as a value).
fn run_args(out: &Path, c: &Common) -> super::run::RunArgs {
    super::run::RunArgs {
        scenario: None,
        out: Some(out.to_path_buf()),
        force: true,
        quiet: c.quiet,
        backend: None,
        cpu: false,
        // Each point's scenario carries its workloads' own `plan_check`.
        no_plan_check: false,
        wide: false,
        trace: false,
        // The sweep serves one endpoint for all its points (`run_points`).
        metrics_addr: None,
        json: false,
        partitions: super::PartitionFlags {
            join_mps: c.join_mps,
            ..Default::default()
        },
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
    let out = super::run::prepare_out(c.out.as_deref(), c.force)?;
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
        super::run::run_scenario(
            s,
            name,
            &run_args(dir, self.common),
            self.engine,
            live.map(|l| &l.metrics),
        )
        .map_err(super::studies::failure)
    }

    fn say(&self, line: &str) {
        eprintln!("{line}");
    }
}
