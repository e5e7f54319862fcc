//! The studies' runs (`isolane_session::studies`) made by `isolane run`'s own path.

use std::path::Path;

use isolane_core::admission::AdmissionOptions;
use isolane_core::spec::Scenario;
use isolane_runtime::coordinator::RunPlan;
use isolane_session::studies::{Failure, Ran, RunError, Runs, StudyError};

/// A failure as a study records it: its whole text, and whether it is the user's.
pub fn failure(e: anyhow::Error) -> Failure {
    Failure {
        text: format!("{e:#}"),
        user: e
            .chain()
            .any(|c| c.downcast_ref::<super::UserError>().is_some()),
    }
}

/// A study's failure at the CLI's edge: the user's is exit code 2.
pub fn failure_error(f: Failure) -> anyhow::Error {
    if f.user {
        super::user(f)
    } else {
        anyhow::Error::new(f)
    }
}

/// A study's error at the CLI's edge: the user's is exit code 2.
pub fn study_error(e: StudyError) -> anyhow::Error {
    blame!(e)
}

pub use isolane_executors::machine::builtin_names;

/// `coexec`'s and `interference`'s runs: `run`'s `measure`, then the run folder's files.
pub struct StudyRuns<'a> {
    pub quiet: bool,
    pub partitions: &'a super::PartitionFlags,
    pub engine: &'a isolane_runtime::exec::Engine,
}

impl Runs for StudyRuns<'_> {
    fn models(&self) -> Vec<&'static str> {
        builtin_names()
    }

    fn admit(&self, s: &Scenario, name: &str, options: &AdmissionOptions) -> Result<(), Failure> {
        super::admit_or_refuse_with(s, name, options)
            .map(drop)
            .map_err(failure)
    }

    fn measure(
        &self,
        command: &'static str,
        s: &Scenario,
        name: &str,
        dir: &Path,
        options: &AdmissionOptions,
    ) -> Result<Ran, RunError> {
        let admitted = super::admit_or_refuse_with(s, name, options)
            .map_err(|e| RunError::Measuring(failure(e)))?;
        let plan = RunPlan::from_scenario(s);
        let m = super::run::measure(super::run::Request {
            command,
            scenario: s,
            scenario_name: name.to_string(),
            admitted: admitted.as_ref(),
            plan: &plan,
            out: Some(dir),
            force: true,
            quiet: self.quiet,
            partitions: self.partitions,
            engine: self.engine,
        })
        .map_err(|e| RunError::Measuring(failure(e)))?;
        super::run::write_run_files(&m).map_err(|e| RunError::Writing(failure(e)))?;
        super::run::report_failures(&m.summary);
        Ok(Ran {
            result: m.result,
            summary: m.summary,
        })
    }

    fn say(&self, line: &str) {
        eprintln!("{line}");
    }
}
