//! `isolane run` of a scenario with `[[app]]`s, from its flags: [`check`] (the apps checked,
//! admitted and placed, before anything is served or written), then [`run`] (the results
//! folder with the scenario file in it, Ctrl-C, the progress bar, and [`crate::session::run`]).
//! The binary turns its flags into an [`AppCommand`], calls both, and prints what ran.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use isolane_core::admission::Plan;
use isolane_core::spec::Scenario;
use isolane_core::user_error::UserError;
use isolane_gpu::GreenGroup;
use isolane_metrics::RunMetrics;
use isolane_runtime::output;
use isolane_runtime::partition::Partition;
use isolane_session::progress::ProgressView;
use isolane_session::PartitionChoices;

use crate::models::ModelBuilder;
use crate::session::{self, AppRun, AppRunError, Ran};
use crate::spec::AppSpec;

/// Admission of the apps' models as a scenario's workloads (`None`: nothing to partition); a
/// refusal is the user's.
pub type Admit<'a> = &'a dyn Fn(&Scenario, &str) -> anyhow::Result<Option<Plan>>;

/// Apps that may run: checked, their models' workloads admitted, each app placed.
pub struct Checked {
    apps: Vec<AppSpec>,
    workloads: Scenario,
    admitted: Option<Plan>,
}

/// A library error at the command's edge: the user's mistakes keep only their words (exit 2).
pub fn error(e: AppRunError) -> anyhow::Error {
    if e.is_user_error() {
        UserError(e.to_string()).into()
    } else {
        anyhow::Error::new(e)
    }
}

/// Checks `apps` of `scenario` (`file`: its name in messages), admits their models' workloads
/// through `admit`, and places each app.
pub fn check(
    scenario: &Scenario,
    file: &str,
    mut apps: Vec<AppSpec>,
    no_plan_check: bool,
    admit: Admit<'_>,
) -> anyhow::Result<Checked> {
    let workloads = session::check(scenario, &mut apps, file, no_plan_check).map_err(error)?;
    let admitted = admit(&workloads, file)?;
    session::place(&mut apps, scenario, file).map_err(error)?;
    Ok(Checked {
        apps,
        workloads,
        admitted,
    })
}

/// `isolane run`'s flags for apps, as configuration.
pub struct AppCommand<'a> {
    pub scenario: &'a Scenario,
    /// The scenario file as given.
    pub file: &'a str,
    /// Its text, read once (written to scenario.toml and given to the workers).
    pub text: &'a str,
    /// The results folder. Default: a new runs/<YYYYmmdd-HHMMSS> under the current directory.
    pub out: Option<&'a Path>,
    pub force: bool,
    /// No progress bar.
    pub quiet: bool,
    pub no_plan_check: bool,
    pub choices: PartitionChoices,
    /// Builds the stages' models (the engine's executors).
    pub models: Arc<dyn ModelBuilder + Send>,
    /// A green group as a partition the models take.
    pub share: fn(GreenGroup) -> Partition,
    /// `--metrics-addr`'s metrics, fed while the apps run.
    pub metrics: Option<&'a Arc<RunMetrics>>,
}

/// What the apps ran, and where it was written.
pub struct AppsRan {
    pub apps: Vec<AppSpec>,
    pub ran: Ran,
    pub out: PathBuf,
}

/// Runs the checked apps as `c` says: the results folder (with the scenario file's text as
/// scenario.toml), Ctrl-C and SIGTERM stop releasing frames, then the run and its files.
pub fn run(checked: Checked, c: AppCommand<'_>) -> anyhow::Result<AppsRan> {
    let out = isolane_session::run_path::prepare_out(c.out, c.force)?;
    output::write_atomic(&out.join("scenario.toml"), c.text.as_bytes())?;
    let stop = isolane_session::signals::install_stop_handler()?;
    let mut view = ProgressView::new(c.quiet);
    let ran = session::run(AppRun {
        scenario: c.scenario,
        file: c.file,
        text: c.text,
        apps: &checked.apps,
        workloads: &checked.workloads,
        admitted: checked.admitted,
        choices: c.choices,
        stop: &stop,
        out: &out,
        no_plan_check: c.no_plan_check,
        models: c.models,
        share: c.share,
        metrics: c.metrics,
        observer: &mut view,
    })
    .map_err(error)?;
    Ok(AppsRan {
        apps: checked.apps,
        ran,
        out,
    })
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;
    use crate::scenario_file::ScenarioFile;

    const APP: &str = "[device]\nbackend = \"cpu\"\n\n[[app]]\nname = \"endo\"\n\
                       deadline_ms = 50\nframes = 30\n[app.source]\nkind = \"synthetic\"\n\
                       width = 32\nheight = 32\nfps = 60\n[[app.stage]]\nname = \"pre\"\n\
                       kind = \"preprocess\"\n[[app.stage]]\nname = \"net\"\nkind = \"model\"\n\
                       model = \"yolov8n\"\n[[app.stage]]\nname = \"out\"\nkind = \"sink\"\n";

    fn read(text: &str) -> (Scenario, String, Vec<AppSpec>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("apps.toml");
        std::fs::write(&path, text).unwrap();
        let file = ScenarioFile::read(&path).unwrap();
        let (scenario, name) = file.scenario().unwrap();
        (scenario, name, file.apps().unwrap())
    }

    /// What the binary's app.rs assembled: the apps' models are admitted as workloads (the
    /// admission sees them, and its refusal is the command's, unchanged), and an app
    /// beside [[workload]]s is refused as the user's before admission is asked.
    #[test]
    fn the_apps_models_are_admitted_as_workloads_before_anything_runs() {
        let (scenario, name, apps) = read(APP);
        let seen = RefCell::new(Vec::new());
        let refuse = |w: &Scenario, _: &str| -> anyhow::Result<Option<Plan>> {
            seen.borrow_mut()
                .extend(w.workloads.iter().map(|w| w.model.clone()));
            Err(UserError("no room for it".into()).into())
        };
        let e = check(&scenario, &name, apps, false, &refuse).err().unwrap();
        assert_eq!(e.to_string(), "no room for it");
        assert_eq!(*seen.borrow(), ["yolov8n"]);

        let admit = |_: &Scenario, _: &str| -> anyhow::Result<Option<Plan>> { Ok(None) };
        let (scenario, name, apps) = read(APP);
        let checked = check(&scenario, &name, apps, false, &admit).unwrap();
        assert_eq!(checked.apps.len(), 1);
        assert_eq!(checked.workloads.workloads.len(), 1);

        let beside = format!(
            "{APP}\n[[workload]]\nname = \"w\"\nmodel = \"spin:1ms\"\nrate_hz = 10\njobs = 1\n"
        );
        let (scenario, name, apps) = read(&beside);
        seen.borrow_mut().clear();
        let e = check(&scenario, &name, apps, false, &refuse).err().unwrap();
        assert!(e.downcast_ref::<UserError>().is_some(), "{e:#}");
        assert!(e.to_string().contains("beside [[workload]]s"), "{e}");
        assert!(
            seen.borrow().is_empty(),
            "admission asked about a refused scenario"
        );
    }
}
