//! The run path every command that makes a run shares (`run`, `isolation`, the studies,
//! `plan --auto`'s profile and verification runs): the plan checked, the output folder made
//! with the resolved scenario in it, then [`crate::measure`], and the run's files written.
//! Errors are `anyhow` with a [`UserError`] where the mistake is the user's (the CLI exits 2
//! for it, 1 for anything else).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context as _;
use isolane_core::admission::{AdmissionOptions, Plan};
use isolane_core::predict::MemoryProfile;
use isolane_core::results::{workloads_csv, RunStatus, RunSummary, WORKLOADS_CSV};
use isolane_core::spec::Scenario;
use isolane_core::user_error::UserError;
use isolane_metrics::RunMetrics;
use isolane_runtime::coordinator::{self, RunPlan, RunResult};
use isolane_runtime::exec::Engine;
use isolane_runtime::output;
pub use isolane_runtime::output::Maker;

use crate::progress::ProgressView;
use crate::{Observer, PartitionChoices, RunRequest};

/// What only the machine layer above this crate (`isolane-executors`) knows, lent to the runs
/// made here (`plan --auto`'s, the studies').
pub trait Machine {
    /// Admission before a run; a refusal is the user's. The admitted plan (`None` on the CPU).
    fn admit(
        &self,
        scenario: &Scenario,
        name: &str,
        options: &AdmissionOptions,
    ) -> anyhow::Result<Option<Plan>>;
    /// Each workload's memory estimate in MiB.
    fn memory_estimates(&self, scenario: &Scenario) -> Vec<Option<u64>>;
    /// Each workload's memory-system demand on a device whose L2 holds `l2_bytes`.
    fn memory_profiles(&self, scenario: &Scenario, l2_bytes: u64) -> Vec<Option<MemoryProfile>>;
    /// On the CPU, what to say when the host was busy while `workload` was profiled.
    fn busy_host_note(&self, workload: &str, cache_dir: &Path) -> Option<String>;
    /// The built-in models' names.
    fn builtin_names(&self) -> Vec<&'static str>;
    /// Says (through `say`) or refuses (the user's) a critical deadline predicted to miss
    /// beside its neighbours (`[protection] admission`).
    fn foresee(
        &self,
        scenario: &Scenario,
        name: &str,
        say: &mut dyn FnMut(&str),
    ) -> anyhow::Result<()>;
}

/// One run of an admitted scenario.
pub struct Request<'a> {
    /// The subcommand, for summary.json.
    pub command: &'static str,
    pub scenario: &'a Scenario,
    pub scenario_name: String,
    /// The admitted plan on a GPU (`None` on the CPU).
    pub admitted: Option<&'a Plan>,
    pub plan: &'a RunPlan,
    /// The run folder. Default: a new runs/<YYYYmmdd-HHMMSS> under the current directory.
    pub out: Option<&'a Path>,
    /// Use `out` even if it is not empty, replacing a run's files in it (not another command's).
    pub force: bool,
    /// No progress bar ([`measure_observed`]).
    pub quiet: bool,
    pub choices: PartitionChoices,
    /// Builds the workloads whose model is not `spin:`.
    pub engine: &'a Engine,
}

/// What a run measured, not yet written (except scenario.toml and telemetry.csv).
pub struct Measured {
    pub out: PathBuf,
    pub result: RunResult,
    pub summary: RunSummary,
}

/// An error whose type says whether it is the user's: the user's keeps only its words (as a
/// [`UserError`]), any other its source chain.
pub(crate) fn blame<E: std::error::Error + Send + Sync + 'static>(
    e: E,
    is_user: bool,
) -> anyhow::Error {
    if is_user {
        UserError(e.to_string()).into()
    } else {
        anyhow::Error::new(e)
    }
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
    view: &mut dyn Observer,
) -> anyhow::Result<Measured> {
    preflight(r.plan, r.engine)?;
    // Job records stream to jobs/*.csv: they must fit the output folder's disk as well.
    let out_dir = r.out.unwrap_or(Path::new("runs"));
    if let Some(free) = isolane_runtime::limits::disk_free_bytes(out_dir) {
        let demands = coordinator::record_demands(r.plan);
        isolane_runtime::limits::check_disk(&demands, free, out_dir).map_err(|e| blame(e, true))?;
    }
    let toml = r
        .scenario
        .to_toml_string()
        .context("writing the resolved scenario")?;
    let maker = match r.command {
        "isolation" => Maker::Isolation,
        _ => Maker::Run,
    };
    let out = prepare_out_for(r.out, r.force, maker)?;
    output::write_atomic(&out.join("scenario.toml"), toml.as_bytes())?;

    let stop = crate::signals::install_stop_handler()?;
    let (result, summary) = crate::measure(
        RunRequest {
            command: r.command,
            scenario: r.scenario,
            scenario_name: r.scenario_name,
            admitted: r.admitted,
            plan: r.plan,
            out: &out,
            choices: r.choices,
            engine: r.engine,
            stop,
            metrics: metrics.cloned(),
        },
        view,
    )
    .map_err(|e| {
        let is_user = e.is_user_error();
        blame(e, is_user)
    })?;
    Ok(Measured {
        out,
        result,
        summary,
    })
}

/// Models and CPU cores are checked before any output exists.
pub fn preflight(plan: &RunPlan, engine: &Engine) -> anyhow::Result<()> {
    coordinator::preflight(plan, Some(engine.as_ref())).map_err(|e| {
        let is_user = e.is_user_error();
        blame(e, is_user)
    })
}

/// The output folder, made (or, with `force`, reused): `out`, or a new
/// runs/<YYYYmmdd-HHMMSS> under the current directory.
pub fn prepare_out(out: Option<&Path>, force: bool) -> anyhow::Result<PathBuf> {
    prepare_out_for(out, force, Maker::Run)
}

/// [`prepare_out`] for `maker`'s results: `--force` replaces only its own files and refuses a
/// folder holding another command's results (exit 2).
pub fn prepare_out_for(out: Option<&Path>, force: bool, maker: Maker) -> anyhow::Result<PathBuf> {
    output::prepare_out_dir_for(out, force, Path::new("."), maker).map_err(|e| {
        let is_user = e.is_user_error();
        blame(e, is_user)
    })
}

/// jobs/<workload>.csv for every workload and workloads.csv, then summary.json last (its
/// presence means the rest is complete). A full disk leaves what fits, a summary that says what
/// is short, and the way to rebuild it ([`output::write_run_files`]), said on stderr.
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

/// `isolane run` of a loaded scenario (a file, the quickstart, or a sweep point built as a
/// value), up to its files: `plan_check` dropped where asked, admission, the prediction before
/// it, the run and its files. `scenario_name` names it in messages and summary.json.
pub fn run_scenario(
    mut scenario: Scenario,
    scenario_name: String,
    r: &ScenarioRun<'_>,
    metrics: Option<&Arc<RunMetrics>>,
) -> anyhow::Result<(Scenario, Measured)> {
    if r.no_plan_check {
        scenario
            .workloads
            .iter_mut()
            .for_each(|w| w.plan_check = false);
    }
    let admitted = r
        .machine
        .admit(&scenario, &scenario_name, &Default::default())?;
    // A critical deadline predicted to miss beside its neighbours is said (or refused) before
    // anything runs ([protection] admission).
    r.machine
        .foresee(&scenario, &scenario_name, &mut |l| eprintln!("{l}"))?;
    let plan = RunPlan::from_scenario(&scenario);
    let m = measure_observed(
        Request {
            command: "run",
            scenario: &scenario,
            scenario_name,
            admitted: admitted.as_ref(),
            plan: &plan,
            out: r.out,
            force: r.force,
            quiet: r.quiet,
            choices: r.choices,
            engine: r.engine,
        },
        metrics,
    )?;
    write_run_files(&m)?;
    Ok((scenario, m))
}

/// [`run_scenario`]'s flags.
pub struct ScenarioRun<'a> {
    pub machine: &'a dyn Machine,
    pub out: Option<&'a Path>,
    pub force: bool,
    pub quiet: bool,
    /// Skip the plan check of imported models on cuda for every workload.
    pub no_plan_check: bool,
    pub choices: PartitionChoices,
    pub engine: &'a Engine,
}

/// What `isolane run` says when a run has ended: its results table titled `title`, the
/// programs' table, held lines, failures (stderr) and the folder; with `json`, the human text
/// goes to stderr and stdout is the JSON object alone. The exit code: 3 when workers whose
/// models did not fit are the only failure (as `infer` exits), else the status's.
pub fn report(title: &str, m: &Measured, wide: bool, json: bool) -> anyhow::Result<u8> {
    let say = |text: &str| {
        if json {
            eprintln!("{text}")
        } else {
            println!("{text}")
        }
    };
    say(&isolane_report::run_text::run_results_table(
        title, &m.summary, wide,
    ));
    let layout = isolane_report::Layout { wide };
    if let Some(programs) = isolane_report::programs_table(&m.summary.workloads, layout) {
        say(&programs);
    }
    for line in isolane_report::run_text::held_lines(&m.summary) {
        say(&line);
    }
    for line in isolane_report::run_text::failure_lines(&m.summary) {
        eprintln!("{line}");
    }
    say(&format!("results: {}", m.out.display()));
    if json {
        println!(
            "{}",
            isolane_report::run_text::json_result(&m.out, &m.summary)?
        );
    }
    if m.summary.status == RunStatus::Failed && m.summary.failed_out_of_memory() {
        return Ok(isolane_core::exit_codes::EXIT_OUT_OF_MEMORY);
    }
    Ok(isolane_core::exit_codes::exit_for(m.summary.status))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The CLI exits 2 for an error whose chain holds a [`UserError`]: an occupied output
    /// folder must keep being one after the run path left the binary.
    #[test]
    fn an_occupied_output_folder_is_the_users_mistake() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("notes.txt"), "mine").unwrap();
        let e = prepare_out(Some(dir.path()), false).unwrap_err();
        assert!(
            e.chain().any(|c| c.downcast_ref::<UserError>().is_some()),
            "{e:#}"
        );
        assert!(dir.path().join("notes.txt").exists());
        // With force, the folder is used and the user's own file kept.
        prepare_out(Some(dir.path()), true).unwrap();
        assert!(dir.path().join("notes.txt").exists());
    }
}
