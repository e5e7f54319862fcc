//! The studies' runs ([`crate::studies::Runs`]: `coexec`, `interference`) made by the run path
//! ([`crate::run_path`]), with the run folder's files written and failures said.

use std::path::Path;

use isolane_core::admission::AdmissionOptions;
use isolane_core::spec::Scenario;
use isolane_core::user_error::UserError;
use isolane_runtime::coordinator::RunPlan;
use isolane_runtime::exec::Engine;

use crate::run_path::{self, Machine, Request};
use crate::studies::{Failure, Ran, RunError, Runs, StudyError};
use crate::PartitionChoices;

/// A failure as a study records it: its whole text, and whether it is the user's.
pub fn failure(e: anyhow::Error) -> Failure {
    Failure {
        text: format!("{e:#}"),
        user: e.chain().any(|c| c.downcast_ref::<UserError>().is_some()),
    }
}

/// A study's failure as an error: the user's is a [`UserError`] (exit code 2).
pub fn failure_error(f: Failure) -> anyhow::Error {
    if f.user {
        UserError(f.to_string()).into()
    } else {
        anyhow::Error::new(f)
    }
}

/// A study's error: the user's is a [`UserError`] (exit code 2).
pub fn study_error(e: StudyError) -> anyhow::Error {
    let is_user = e.is_user_error();
    run_path::blame(e, is_user)
}

/// `coexec`'s and `interference`'s runs: `run`'s `measure`, then the run folder's files.
pub struct StudyRuns<'a> {
    pub machine: &'a dyn Machine,
    /// No progress bars.
    pub quiet: bool,
    pub choices: PartitionChoices,
    pub engine: &'a Engine,
}

impl Runs for StudyRuns<'_> {
    fn models(&self) -> Vec<&'static str> {
        self.machine.builtin_names()
    }

    fn admit(&self, s: &Scenario, name: &str, options: &AdmissionOptions) -> Result<(), Failure> {
        self.machine
            .admit(s, name, options)
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
        let admitted = self
            .machine
            .admit(s, name, options)
            .map_err(|e| RunError::Measuring(failure(e)))?;
        let plan = RunPlan::from_scenario(s);
        let m = run_path::measure(Request {
            command,
            scenario: s,
            scenario_name: name.to_string(),
            admitted: admitted.as_ref(),
            plan: &plan,
            out: Some(dir),
            force: true,
            quiet: self.quiet,
            choices: self.choices,
            engine: self.engine,
        })
        .map_err(|e| RunError::Measuring(failure(e)))?;
        run_path::write_run_files(&m).map_err(|e| RunError::Writing(failure(e)))?;
        for line in isolane_report::run_text::failure_lines(&m.summary) {
            eprintln!("{line}");
        }
        Ok(Ran {
            result: m.result,
            summary: m.summary,
        })
    }

    fn preflight(&self, s: &Scenario, name: &str) -> Result<(), Failure> {
        run_path::preflight(&RunPlan::from_scenario(s), self.engine)
            .map_err(|e| failure(e.context(name.to_string())))
    }

    fn say(&self, line: &str) {
        eprintln!("{line}");
    }
}
