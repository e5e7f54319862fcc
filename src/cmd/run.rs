//! `isolane run [SCENARIO]`: run every workload of a scenario at once and write the results.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context as _;
use clap::Args;
use isolane_core::admission::Plan;
use isolane_core::results::{workloads_csv, RunStatus, RunSummary, WORKLOADS_CSV};
use isolane_core::spec::Scenario;
use isolane_executors::run_input::{run_input, RunInput};
use isolane_metrics::RunMetrics;
use isolane_runtime::coordinator::{self, RunPlan, RunResult};
use isolane_runtime::output;

use super::{exit_for, user, ProgressView};

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
    /// Use --out even if it is not empty, replacing isolane's own files in it (others are kept).
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

/// Runs a scenario that is already loaded (a file, the quickstart, or a sweep point built as a
/// value): admission, the run, its files and the results table. `scenario_name` names it in
/// messages and summary.json. `metrics`: live metrics to feed (`--metrics-addr`).
pub fn run_scenario(
    mut scenario: Scenario,
    scenario_name: String,
    args: &RunArgs,
    engine: &isolane_runtime::exec::Engine,
    metrics: Option<&Arc<RunMetrics>>,
) -> anyhow::Result<u8> {
    if args.no_plan_check {
        scenario
            .workloads
            .iter_mut()
            .for_each(|w| w.plan_check = false);
    }
    let admitted = super::admit_or_refuse(&scenario, &scenario_name)?;
    // A critical deadline predicted to miss beside its neighbours is said (or refused) before
    // anything runs ([protection] admission).
    isolane_executors::foresee::foresee_or_refuse(&scenario, &scenario_name, &mut |l| {
        eprintln!("{l}")
    })?;
    let plan = RunPlan::from_scenario(&scenario);
    let m = measure_observed(
        Request {
            command: "run",
            scenario: &scenario,
            scenario_name,
            admitted: admitted.as_ref(),
            plan: &plan,
            out: args.out.as_deref(),
            force: args.force,
            quiet: args.quiet,
            partitions: &args.partitions,
            engine,
        },
        metrics,
    )?;
    write_run_files(&m)?;
    if args.trace {
        super::trace::write(&m.out, &m.out.join("trace.json"))?;
    }
    // With --json, stdout is the JSON object alone: the human text goes to stderr.
    let say = |text: &str| {
        if args.json {
            eprintln!("{text}")
        } else {
            println!("{text}")
        }
    };
    say(&results_table(&scenario, &m.summary, args.wide));
    let layout = isolane_report::Layout { wide: args.wide };
    if let Some(programs) = isolane_report::programs_table(&m.summary.workloads, layout) {
        say(&programs);
    }
    for line in isolane_report::run_text::held_lines(&m.summary) {
        say(&line);
    }
    report_failures(&m.summary);
    say(&format!("results: {}", m.out.display()));
    if args.json {
        println!(
            "{}",
            isolane_report::run_text::json_result(&m.out, &m.summary)?
        );
    }
    // Workers whose models did not fit, and no other failure: 3, as `infer` exits.
    if m.summary.status == RunStatus::Failed && m.summary.failed_out_of_memory() {
        return Ok(super::EXIT_OUT_OF_MEMORY);
    }
    Ok(exit_for(m.summary.status))
}

/// One run of an admitted scenario, as `run` and `isolation` make it.
pub struct Request<'a> {
    /// The subcommand, for summary.json.
    pub command: &'static str,
    pub scenario: &'a Scenario,
    pub scenario_name: String,
    /// The admitted plan on a GPU (`None` on the CPU).
    pub admitted: Option<&'a Plan>,
    pub plan: &'a RunPlan,
    pub out: Option<&'a Path>,
    pub force: bool,
    pub quiet: bool,
    pub partitions: &'a super::PartitionFlags,
    /// Builds the workloads whose model is not `spin:`.
    pub engine: &'a isolane_runtime::exec::Engine,
}

/// What a run measured, not yet written (except scenario.toml and telemetry.csv).
pub struct Measured {
    pub out: PathBuf,
    pub result: RunResult,
    pub summary: RunSummary,
}

/// Checks the plan, creates the output folder with the resolved scenario in it, then runs the
/// workloads inside their partitions with telemetry around them and summarises the result.
pub fn measure(r: Request<'_>) -> anyhow::Result<Measured> {
    measure_observed(r, None)
}

/// [`measure`], feeding live metrics (`--metrics-addr`) while the run goes on.
pub fn measure_observed(
    r: Request<'_>,
    metrics: Option<&Arc<RunMetrics>>,
) -> anyhow::Result<Measured> {
    let mut view = ProgressView::new(r.quiet);
    measure_with(r, metrics, &mut view)
}

/// [`measure_observed`], showing the run through `view` (`plan --auto`'s profile runs show
/// their own progress) instead of the run's progress bar.
pub fn measure_with(
    r: Request<'_>,
    metrics: Option<&Arc<RunMetrics>>,
    view: &mut dyn isolane_session::Observer,
) -> anyhow::Result<Measured> {
    preflight(r.plan, r.engine)?;
    // Job records stream to jobs/*.csv: they must fit the output folder's disk as well.
    let out_dir = r.out.unwrap_or(Path::new("runs"));
    if let Some(free) = isolane_runtime::limits::disk_free_bytes(out_dir) {
        let demands = coordinator::record_demands(r.plan);
        isolane_runtime::limits::check_disk(&demands, free, out_dir).map_err(user)?;
    }
    let toml = r
        .scenario
        .to_toml_string()
        .context("writing the resolved scenario")?;
    let out = prepare_out(r.out, r.force)?;
    output::write_atomic(&out.join("scenario.toml"), toml.as_bytes())?;

    let stop = super::install_stop_handler()?;
    let (result, summary) = isolane_session::measure(
        isolane_session::RunRequest {
            command: r.command,
            scenario: r.scenario,
            scenario_name: r.scenario_name,
            admitted: r.admitted,
            plan: r.plan,
            out: &out,
            choices: r.partitions.choices(),
            engine: r.engine,
            stop,
            metrics: metrics.cloned(),
        },
        view,
    )
    .map_err(super::session_error)?;
    Ok(Measured {
        out,
        result,
        summary,
    })
}

/// Models and CPU cores are checked before any output exists.
pub fn preflight(plan: &RunPlan, engine: &isolane_runtime::exec::Engine) -> anyhow::Result<()> {
    coordinator::preflight(plan, Some(engine.as_ref())).map_err(|e| blame!(e))
}

pub fn prepare_out(out: Option<&Path>, force: bool) -> anyhow::Result<PathBuf> {
    output::prepare_out_dir(out, force, Path::new(".")).map_err(|e| blame!(e))
}

/// jobs/<workload>.csv for every workload and workloads.csv, then summary.json last (its
/// presence means the rest is complete). A full disk leaves what fits, a summary that says what
/// is short, and the way to rebuild it ([`output::write_run_files`]).
pub fn write_run_files(m: &Measured) -> anyhow::Result<()> {
    let workloads: Vec<(&str, &[isolane_core::JobRecord])> = m
        .result
        .workloads
        .iter()
        .map(|w| (w.name.as_str(), w.records.as_slice()))
        .collect();
    let table = workloads_csv(&m.summary);
    let others = [(WORKLOADS_CSV, table.as_bytes())];
    if let Some(note) = output::write_run_files(&m.out, &workloads, &others, &m.summary)? {
        eprintln!("warning: {note}");
    }
    Ok(())
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
