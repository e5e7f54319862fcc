//! A scenario file as the CLI reads it: once. A pipe, a process substitution (`<(...)`) or a
//! FIFO gives its text only once, so its workloads and its `[[app]]`s are both parsed from
//! this text (issue 31: `run <(cat apps.toml)` read the apps from an empty second read and ran
//! nothing). Every problem with it is the user's (exit 2).

use std::path::{Path, PathBuf};

use isolane_core::spec::Scenario;
use isolane_core::user_error::{user, UserError};

use crate::spec::AppSpec;

pub struct ScenarioFile {
    pub path: PathBuf,
    pub text: String,
}

impl ScenarioFile {
    /// Reads `path` (at most [`isolane_core::files::MAX_CONFIG_BYTES`]).
    pub fn read(path: &Path) -> Result<ScenarioFile, UserError> {
        let text = Scenario::read_file(path).map_err(user)?;
        Ok(ScenarioFile {
            path: path.to_path_buf(),
            text,
        })
    }

    /// The validated scenario (its models checked against the engine's built-in ones) and how
    /// to name it in summary.json.
    pub fn scenario(&self) -> Result<(Scenario, String), UserError> {
        let models: Vec<&str> = isolane_engine::builtin_models()
            .iter()
            .map(|m| m.name)
            .collect();
        let s = Scenario::from_toml_str(&self.text, &self.path, &models).map_err(user)?;
        Ok((s, self.path.display().to_string()))
    }

    /// Its `[[app]]`s (none: an ordinary scenario).
    pub fn apps(&self) -> Result<Vec<AppSpec>, UserError> {
        crate::session::apps_of(&self.text, &self.path).map_err(user)
    }
}
