//! `isolane run [SCENARIO]`: run every workload of a scenario at once and write the results.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use isolane_core::results::RunSummary;
use isolane_core::spec::Scenario;
use isolane_executors::run_input::{run_input, RunInput};
use isolane_metrics::RunMetrics;
pub use isolane_session::run_path::{preflight, prepare_out_for, Maker};

#[derive(Args)]
#[command(
    about = "Run a scenario's workloads at once and measure their deadline keeping",
    long_about = "Run every workload of SCENARIO at once, each on its own schedule, and write \
                  summary.json, jobs/<workload>.csv and scenario.toml (resolved) to the output \
                  directory. Without SCENARIO, a built-in quickstart runs (about 5 s): ResNet-18 \
                  and MobileNetV2 in fp16 on the GPU when a CUDA GPU is present \
                  (scenarios/quickstart-gpu.toml), otherwise on the CPU \
                  (scenarios/quickstart.toml; `--backend cpu` picks it on a GPU machine too, \
                  `--backend cuda` insists on the GPU one). When the \
                  GPU one cannot run, a note says why (no driver, no device, a CUDA library \
                  missing). A scenario with [[app]] tables runs its apps (pipelines and \
                  ensembles with end-to-end deadlines) and writes summary.json's `apps` and \
                  apps/<app>.csv (docs/apps.md)."
)]
pub struct RunArgs {
    /// Scenario file (TOML). Default: the built-in quickstart.
    pub scenario: Option<PathBuf>,
    /// Output directory. Default: a new runs/<YYYYmmdd-HHMMSS> under the current directory.
    #[arg(long, short = 'o', value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Use --out even if it is not empty, replacing a run's files in it (not another command's).
    #[arg(long)]
    pub force: bool,
    /// No progress bar.
    #[arg(long, short = 'q')]
    pub quiet: bool,
    /// Without SCENARIO: which quickstart runs — `cpu` even when a GPU is present, `cuda` or an
    /// error saying why the GPU cannot be used. Default: the GPU one when it can run. With a
    /// SCENARIO, `cpu` runs its workloads on the CPU backend whatever its [device] says (its
    /// partitions, GPUs and reduced precisions are dropped, each said in a note).
    #[arg(long, value_parser = ["cpu", "cuda"])]
    pub backend: Option<String>,
    /// The old name of `--backend cpu`.
    #[arg(long, hide = true, conflicts_with_all = ["scenario", "backend"])]
    pub cpu: bool,
    /// Skip the plan check of imported (.onnx) models on cuda for every workload (as
    /// `plan_check = false` in each; docs/cuda.md, Plan check).
    #[arg(long)]
    pub no_plan_check: bool,
    /// Every column of the results table (default: the ones that fit 80 columns).
    #[arg(long)]
    pub wide: bool,
    /// Also write DIR/trace.json, the run's timeline for ui.perfetto.dev (as `isolane trace`).
    #[arg(long)]
    pub trace: bool,
    /// Serve live metrics (OpenMetrics / Prometheus) at http://HOST:PORT/metrics while the run
    /// goes on; port 0 picks a free port (the address is printed on stderr).
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics_addr: Option<String>,
    /// Print the result as one JSON object on stdout (`out`, `workloads_csv` and `summary`,
    /// summary.json's content); the table and notes go to stderr (docs/report.md, Reading results
    /// in Python).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub partitions: super::PartitionFlags,
}

pub fn run(args: RunArgs, engine: &isolane_runtime::exec::Engine) -> anyhow::Result<u8> {
    // `--cpu` conflicts with SCENARIO and `--backend`: it is `--backend cpu`'s old name.
    let backend = args.cpu.then_some("cpu").or(args.backend.as_deref());
    let input = run_input(args.scenario.as_deref(), backend, args.json, &mut |n| {
        eprintln!("{n}")
    })
    .map_err(|e| blame!(e))?;
    let (scenario, scenario_name) = match input {
        RunInput::Workloads { scenario, name } => (scenario, name),
        RunInput::Apps {
            scenario,
            name,
            file,
            apps,
        } => return super::app::run(scenario, name, &file.text, apps, &args),
    };
    let live = super::serve_metrics(args.metrics_addr.as_deref())?;
    run_scenario(
        scenario,
        scenario_name,
        &args,
        engine,
        live.as_ref().map(|l| &l.metrics),
    )
}

/// `isolane run` of a scenario that is already loaded (a file, the quickstart, or a sweep
/// point built as a value): the run and its files ([`isolane_session::run_path::run_scenario`]),
/// `--trace`, then what it says. `metrics`: live metrics to feed (`--metrics-addr`).
pub fn run_scenario(
    scenario: Scenario,
    scenario_name: String,
    args: &RunArgs,
    engine: &isolane_runtime::exec::Engine,
    metrics: Option<&Arc<RunMetrics>>,
) -> anyhow::Result<u8> {
    let flags = isolane_session::run_path::ScenarioRun {
        machine: &super::studies::Executors,
        out: args.out.as_deref(),
        force: args.force,
        quiet: args.quiet,
        no_plan_check: args.no_plan_check,
        choices: args.partitions.choices(),
        engine,
    };
    let (scenario, m) =
        isolane_session::run_path::run_scenario(scenario, scenario_name, &flags, metrics)?;
    if args.trace {
        super::trace::write(&m.out, &m.out.join("trace.json"))?;
    }
    let title = super::device_title(&scenario);
    isolane_session::run_path::report(&title, &m, args.wide, args.json)
}

/// The results table of a run of `scenario`, titled with its device and mechanism.
pub fn results_table(scenario: &Scenario, summary: &RunSummary, wide: bool) -> String {
    let title = super::device_title(scenario);
    isolane_report::run_text::run_results_table(&title, summary, wide)
}

pub fn report_failures(summary: &RunSummary) {
    for line in isolane_report::run_text::failure_lines(summary) {
        eprintln!("{line}");
    }
}
