//! `isolane run [SCENARIO]`: run every workload of a scenario at once and write the results.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context as _;
use clap::Args;
use isolane_core::admission::Plan;
use isolane_core::results::{workloads_csv, RunStatus, RunSummary, WORKLOADS_CSV};
use isolane_core::spec::{Backend, Host, Mechanism, PartitionSpec, Precision, Scenario};
use isolane_metrics::RunMetrics;
use isolane_runtime::coordinator::{self, RunPlan, RunResult};
use isolane_runtime::output;

use super::{user, wrap_message, ProgressView, ERROR_WIDTH, EXIT_FAILED, EXIT_INTERRUPTED};

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
    let (scenario, scenario_name) = match &args.scenario {
        Some(p) => {
            let file = super::ScenarioFile::read(p)?;
            let (mut scenario, name) = file.scenario()?;
            let apps = file.apps()?;
            if !apps.is_empty() && args.json {
                return Err(user(format!(
                    "--json: {} has [[app]]s, whose results --json does not print yet; run it \
                     without --json and read its summary.json (`apps`) and apps/<app>.csv",
                    p.display()
                )));
            }
            if let Some(backend) = args.backend.as_deref() {
                if !apps.is_empty() {
                    return Err(user(format!(
                        "--backend {backend}: {} has [[app]]s, whose stages name their own \
                         devices; --backend overrides only a scenario of [[workload]]s (edit \
                         the stages' device and the apps' partitions instead)",
                        p.display()
                    )));
                }
                override_backend(&mut scenario, &name, backend)?;
            }
            if !apps.is_empty() {
                return super::app::run(scenario, name, &file.text, apps, &args);
            }
            if needs_gpu(&scenario) {
                if let Some(why) = super::gpu_missing_reason() {
                    return Err(no_gpu_for(&scenario, &name, &why));
                }
            }
            (scenario, name)
        }
        None => {
            let backend = if args.cpu {
                Some("cpu")
            } else {
                args.backend.as_deref()
            };
            let (scenario, name, no_gpu) = super::quickstart(backend == Some("cpu"))?;
            if let (Some(why), Some("cuda")) = (&no_gpu, backend) {
                return Err(anyhow::anyhow!(
                    "--backend cuda: the GPU quickstart cannot run here ({why})"
                ));
            }
            if let Some(why) = no_gpu {
                let note = format!(
                    "note: running the CPU quickstart: the GPU one cannot run here ({why})"
                );
                eprintln!("{}", wrap_message(&note, 80));
            }
            (scenario, name)
        }
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

/// Whether a workload of `s` runs on a CUDA GPU.
pub(super) fn needs_gpu(s: &Scenario) -> bool {
    s.device.backend == Backend::Cuda && s.workloads.iter().any(|w| w.on_gpu())
}

/// A GPU scenario on a machine without a usable GPU: which file and field ask for cuda, why it
/// cannot run here, and the override that runs it on the CPU (exit 1, as any GPU failure).
pub(super) fn no_gpu_for(s: &Scenario, file: &str, why: &str) -> anyhow::Error {
    let gpu_workloads: Vec<&str> = s
        .workloads
        .iter()
        .filter(|w| w.on_gpu())
        .map(|w| w.name.as_str())
        .collect();
    anyhow::anyhow!(wrap_message(
        &format!(
            "{file}: device.backend = \"cuda\" (mechanism \"{}\"): {} on a CUDA GPU, and \
             none can be used here: {why}.\nTo run the workloads on the CPU instead: isolane \
             run {file} --backend cpu (partitions, GPUs and fp16/bf16/tf32 are dropped, each \
             said in a note; rates sized for a GPU may miss their deadlines on the CPU).",
            s.device.mechanism.name(),
            match gpu_workloads.as_slice() {
                [one] => format!("workload `{one}` runs"),
                all => format!("its {} workloads run", all.len()),
            },
        ),
        ERROR_WIDTH
    ))
}

/// `run SCENARIO --backend B`. `cpu`: every workload on the CPU backend, the scenario's GPU
/// settings dropped and each drop said on stderr; `cuda`: the scenario must already be one.
pub(super) fn override_backend(s: &mut Scenario, file: &str, backend: &str) -> anyhow::Result<()> {
    if backend == "cuda" {
        if s.device.backend == Backend::Cuda {
            return Ok(());
        }
        return Err(user(format!(
            "--backend cuda: {file} runs on the CPU (device.backend = \"cpu\"); a GPU scenario \
             needs [device] backend = \"cuda\" and a mechanism (docs/scenario.md); --backend \
             cpu is the only override of a scenario's backend"
        )));
    }
    for note in on_cpu(s) {
        eprintln!(
            "{}",
            wrap_message(&format!("note: --backend cpu: {note}"), 80)
        );
    }
    let models: Vec<&str> = isolane_engine::builtin_models()
        .iter()
        .map(|m| m.name)
        .collect();
    s.validate(&models).map_err(|e| {
        user(format!(
            "--backend cpu: {file} cannot run on the CPU as it is: {e}"
        ))
    })
}

/// The scenario with every workload on the CPU backend: no mechanism, partitions, GPUs or
/// reduced precisions (the CPU backend runs fp32); returns what was dropped, in words.
fn on_cpu(s: &mut Scenario) -> Vec<String> {
    let mut notes = Vec::new();
    if s.device.backend == Backend::Cpu && !s.workloads.iter().any(|w| w.on_gpu()) {
        return notes; // already a CPU scenario: its hosts are its own
    }
    let d = &mut s.device;
    if d.backend == Backend::Cuda && d.mechanism != Mechanism::None {
        notes.push(format!(
            "device.backend \"cuda\" and mechanism \"{}\" dropped: the workloads run on the \
             CPU, not partitioned",
            d.mechanism.name()
        ));
    }
    if d.several_gpus() {
        notes.push("device.gpus dropped".into());
    }
    d.backend = Backend::Cpu;
    d.mechanism = Mechanism::None;
    d.host = Host::Thread;
    d.gpus.clear();
    d.gpu = 0;
    let (mut partitioned, mut reduced, mut pinned) = (Vec::new(), Vec::new(), Vec::new());
    for w in &mut s.workloads {
        if w.partition != PartitionSpec::default() {
            partitioned.push(w.name.clone());
        }
        if w.program.is_none() && w.precision != Precision::Fp32 {
            reduced.push(format!("{} ({})", w.name, w.precision.name()));
            w.precision = Precision::Fp32;
        }
        if w.gpu.is_some() {
            pinned.push(w.name.clone());
        }
        w.partition = PartitionSpec::default();
        w.backend = Backend::Cpu;
        w.gpu = None;
        if w.program.is_none() {
            w.host = Host::Thread;
        }
    }
    if !partitioned.is_empty() {
        notes.push(format!("partitions dropped: {}", partitioned.join(", ")));
    }
    if !reduced.is_empty() {
        notes.push(format!(
            "fp32 instead of {} (the CPU backend computes in fp32)",
            reduced.join(", ")
        ));
    }
    if !pinned.is_empty() {
        notes.push(format!("`gpu` dropped: {}", pinned.join(", ")));
    }
    notes
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
    super::foresee::foresee_or_refuse(&scenario, &scenario_name)?;
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
    for line in held_lines(&m.summary) {
        say(&line);
    }
    report_failures(&m.summary);
    say(&format!("results: {}", m.out.display()));
    if args.json {
        println!("{}", json_result(&m.out, &m.summary)?);
    }
    Ok(exit_for(m.summary.status))
}

/// `run --json`'s stdout: where the results are and summary.json's content, in one object.
fn json_result(out: &Path, summary: &RunSummary) -> anyhow::Result<String> {
    let value = serde_json::json!({
        "out": out,
        "workloads_csv": out.join(WORKLOADS_CSV),
        "summary": summary,
    });
    Ok(serde_json::to_string(&value)?)
}

/// One line per best-effort workload the criticality guard held back (docs/criticality.md).
fn held_lines(summary: &RunSummary) -> Vec<String> {
    summary
        .workloads
        .iter()
        .filter_map(|w| {
            let h = w.held.as_ref()?;
            Some(format!(
                "{} (best effort): held {:.2} s, {} of {} jobs, max {:.2} ms, {} pieces/job",
                w.name,
                h.total_ms / 1e3,
                h.jobs_held,
                w.metrics.jobs,
                h.max_ms,
                h.pieces
            ))
        })
        .collect()
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
    coordinator::preflight(plan, Some(engine.as_ref())).map_err(|e| {
        if e.is_user_error() {
            user(e)
        } else {
            anyhow::Error::new(e)
        }
    })
}

pub fn prepare_out(out: Option<&Path>, force: bool) -> anyhow::Result<PathBuf> {
    output::prepare_out_dir(out, force, Path::new(".")).map_err(|e| {
        if e.is_user_error() {
            user(e)
        } else {
            anyhow::Error::new(e)
        }
    })
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

/// The results table of a run of `scenario`'s model workloads, titled with its device and
/// mechanism (command workloads have their own table: `isolane_report::programs_table`); only
/// the title when every workload is a program.
pub fn results_table(scenario: &Scenario, summary: &RunSummary, wide: bool) -> String {
    let models: Vec<&isolane_core::results::WorkloadSummary> = summary
        .workloads
        .iter()
        .filter(|w| w.program.is_none())
        .collect();
    if models.is_empty() {
        return super::device_title(scenario);
    }
    let status: Vec<String> = models.iter().map(|w| w.status.word().to_string()).collect();
    let rows: Vec<isolane_report::ResultRow> = models
        .iter()
        .zip(&status)
        .map(|(w, s)| isolane_report::ResultRow {
            workload: &w.name,
            status: s,
            metrics: &w.metrics,
        })
        .collect();
    isolane_report::results_table(
        &super::device_title(scenario),
        &rows,
        isolane_report::Layout { wide },
    )
}

pub fn report_failures(summary: &RunSummary) {
    for w in &summary.workloads {
        if let Some(e) = &w.error {
            eprintln!("workload `{}` failed: {e}", w.name);
        }
    }
    if summary.interrupted {
        eprintln!("interrupted: results cover the jobs released before Ctrl-C");
    }
    // Above 1 % the host's share shows in the tail latencies of a VM (docs/runtime.md).
    if let Some(steal) = summary.cpu_steal_pct.filter(|&p| p > 1.0) {
        eprintln!(
            "note: the hypervisor took {steal:.1} % of this machine's CPU during the run\n  \
             (summary.json cpu_steal_pct): late starts and missed deadlines may be the host's"
        );
    }
}

pub fn exit_for(status: RunStatus) -> u8 {
    match status {
        RunStatus::Ok => 0,
        RunStatus::Failed => EXIT_FAILED,
        RunStatus::Interrupted => EXIT_INTERRUPTED,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_messages_wrap_at_words_with_indented_continuations() {
        let text = "a scenario that asks for cuda: ".repeat(8) + "/a/very/long/path/name.toml";
        let wrapped = wrap_message(&format!("{text}\nsecond paragraph"), ERROR_WIDTH);
        let lines: Vec<&str> = wrapped.lines().collect();
        assert!(lines.len() > 3, "{wrapped}");
        assert!(
            lines.iter().all(|l| l.chars().count() <= ERROR_WIDTH),
            "{wrapped}"
        );
        assert!(
            lines[1].starts_with("  ") && !lines[1].starts_with("   "),
            "{wrapped}"
        );
        assert_eq!(*lines.last().unwrap(), "second paragraph");
        // Nothing is lost: the words are the same.
        let words = |s: &str| s.split_whitespace().map(str::to_string).collect::<Vec<_>>();
        assert_eq!(words(&wrapped), words(&format!("{text} second paragraph")));
    }

    #[test]
    fn backend_cpu_runs_a_gpu_scenario_on_the_cpu_and_says_what_it_dropped() {
        let models: Vec<&str> = isolane_engine::builtin_models()
            .iter()
            .map(|m| m.name)
            .collect();
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/scenarios/gpu/green-2x64-resnet18.toml"
        );
        let mut s = Scenario::load(path, &models).unwrap();
        assert!(needs_gpu(&s));
        let notes = on_cpu(&mut s).join("\n");
        assert!(!needs_gpu(&s));
        assert!(notes.contains("mechanism \"green\" dropped"), "{notes}");
        assert!(notes.contains("partitions dropped: front, rear"), "{notes}");
        assert!(s.workloads.iter().all(|w| w.backend == Backend::Cpu
            && w.partition == PartitionSpec::default()
            && w.precision == Precision::Fp32));
        // The result is a scenario the CPU runs.
        s.validate(&models).unwrap();
        // The error without a GPU names the file, the field and the override.
        let e = no_gpu_for(
            &Scenario::load(path, &models).unwrap(),
            "g.toml",
            "no CUDA driver: libcuda not found",
        )
        .to_string();
        let flat = e.split_whitespace().collect::<Vec<_>>().join(" ");
        for want in [
            "g.toml: device.backend = \"cuda\"",
            "no CUDA driver",
            "isolane run g.toml --backend cpu",
        ] {
            assert!(flat.contains(want), "{want}: {e}");
        }
        assert!(e.lines().all(|l| l.chars().count() <= ERROR_WIDTH), "{e}");
    }
}
