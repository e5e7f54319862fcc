//! The studies that run many scenarios, one after another, into one results folder:
//! `isolane coexec` ([`coexec`]), `isolane interference` ([`interference`]) and `isolane sweep`
//! ([`sweep`]). Each run of a study is an ordinary run, made by the caller's [`Runs`] (the
//! binary's `isolane run` path: admission, partitions, telemetry, the run folder's files), so a
//! cell or a point is exactly a run. What a study writes (its index files) and how it goes on
//! after a failed run is here; what a person sees goes through [`Runs::say`].

pub mod coexec;
pub mod interference;
pub mod sweep;

use std::path::Path;

use isolane_core::admission::AdmissionOptions;
use isolane_core::results::{RunStatus, RunSummary};
use isolane_core::spec::Scenario;
use isolane_runtime::coordinator::RunResult;

/// Exit code of a study some of whose runs failed (docs/runtime.md).
pub const EXIT_FAILED: u8 = 1;
/// Exit code of a study stopped by Ctrl-C (what was measured is written).
pub const EXIT_INTERRUPTED: u8 = 130;

/// A refusal or a failure, in the words the CLI prints; `user`: the user's mistake (exit 2).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{text}")]
pub struct Failure {
    pub text: String,
    pub user: bool,
}

impl Failure {
    /// The user's mistake (exit code 2).
    pub fn user(text: impl std::fmt::Display) -> Failure {
        Failure {
            text: text.to_string(),
            user: true,
        }
    }
}

/// Why a study stopped before its end.
#[derive(Debug, thiserror::Error)]
pub enum StudyError {
    #[error(transparent)]
    Failed(#[from] Failure),
    #[error(transparent)]
    Results(#[from] isolane_core::results::ResultsError),
    #[error(transparent)]
    Output(#[from] isolane_runtime::output::OutputError),
}

impl StudyError {
    /// Whether this is the user's mistake (exit code 2) rather than a runtime failure.
    pub fn is_user_error(&self) -> bool {
        matches!(self, StudyError::Failed(f) if f.user)
    }
}

/// A run that was measured: what the coordinator returned and its summary.
pub struct Ran {
    pub result: RunResult,
    pub summary: RunSummary,
}

/// How one run of a study failed.
pub enum RunError {
    /// Admission, set-up or the run itself.
    Measuring(Failure),
    /// Writing the run folder's files after a run that was measured.
    Writing(Failure),
}

/// How a study runs one scenario: the caller's `isolane run` path.
pub trait Runs {
    /// The built-in model names a scenario may use.
    fn models(&self) -> Vec<&'static str>;
    /// Admits `s` (named `name`) on this machine; the refusal when it does not fit.
    fn admit(&self, s: &Scenario, name: &str, options: &AdmissionOptions) -> Result<(), Failure>;
    /// Reads what `s` loads (model files, CPU cores) before any output exists: a corrupt model
    /// is the user's mistake (exit 2), found before the study runs, not a point that failed.
    fn preflight(&self, s: &Scenario, name: &str) -> Result<(), Failure>;
    /// Admits and runs `s` into the run folder `dir` (its files written, failed workloads
    /// said), as `command` in summary.json.
    fn measure(
        &self,
        command: &'static str,
        s: &Scenario,
        name: &str,
        dir: &Path,
        options: &AdmissionOptions,
    ) -> Result<Ran, RunError>;
    /// A line for the person watching (stderr).
    fn say(&self, line: &str);
}

/// A run's status as the index files write it.
pub fn status_word(s: RunStatus) -> &'static str {
    match s {
        RunStatus::Ok => "ok",
        RunStatus::Failed => "failed",
        RunStatus::Interrupted => "interrupted",
    }
}
