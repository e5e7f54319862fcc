//! What `isolane run` runs, from its SCENARIO and `--backend`: a scenario file's workloads
//! (moved to the CPU by `--backend cpu`), its `[[app]]`s, or the built-in quickstart (the GPU
//! one when it can run here, else the CPU one, said in a note). `serve` checks its workloads
//! the same way ([`workloads_here`]).

use std::path::Path;

use isolane_app::scenario_file::ScenarioFile;
use isolane_app::spec::AppSpec;
use isolane_core::backend::{needs_gpu, no_gpu_text, override_backend};
use isolane_core::spec::Scenario;
use isolane_core::text::wrap_message;
use isolane_core::user_error::{user, UserError};

use crate::machine::{self, MachineError};

/// What a run runs.
pub enum RunInput {
    /// A scenario of workloads (a file's, or the quickstart), and how to name it.
    Workloads { scenario: Scenario, name: String },
    /// A scenario file with `[[app]]`s, its text read once.
    Apps {
        scenario: Scenario,
        name: String,
        file: ScenarioFile,
        apps: Vec<AppSpec>,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum RunInputError {
    #[error(transparent)]
    User(#[from] UserError),
    #[error(transparent)]
    Machine(#[from] MachineError),
    /// A GPU scenario on a machine without a usable GPU: a runtime failure (exit 1), as any
    /// GPU failure.
    #[error("{0}")]
    NoGpu(String),
}

impl RunInputError {
    /// Whether this is the user's mistake (exit code 2) rather than a runtime failure.
    pub fn is_user_error(&self) -> bool {
        match self {
            RunInputError::User(_) => true,
            RunInputError::Machine(e) => e.is_user_error(),
            RunInputError::NoGpu(_) => false,
        }
    }
}

/// The input of `run [SCENARIO] [--backend B] [--json]`; notes go to `note`.
pub fn run_input(
    scenario: Option<&Path>,
    backend: Option<&str>,
    json: bool,
    note: &mut dyn FnMut(&str),
) -> Result<RunInput, RunInputError> {
    let Some(p) = scenario else {
        return quickstart(backend, note);
    };
    let file = ScenarioFile::read(p)?;
    let (mut scenario, name) = file.scenario()?;
    let apps = file.apps()?;
    if apps.is_empty() {
        workloads_here(&mut scenario, &name, backend, note)?;
        return Ok(RunInput::Workloads { scenario, name });
    }
    if json {
        return Err(user(format!(
            "--json: {} has [[app]]s, whose results --json does not print yet; run it \
             without --json and read its summary.json (`apps`) and apps/<app>.csv",
            p.display()
        ))
        .into());
    }
    if let Some(backend) = backend {
        return Err(user(format!(
            "--backend {backend}: {} has [[app]]s, whose stages name their own \
             devices; --backend overrides only a scenario of [[workload]]s (edit \
             the stages' device and the apps' partitions instead)",
            p.display()
        ))
        .into());
    }
    Ok(RunInput::Apps {
        scenario,
        name,
        file,
        apps,
    })
}

/// A scenario of workloads as `--backend` asks (`cpu`: moved to the CPU, each drop said in a
/// note), refused when it needs a GPU and none can be used here.
pub fn workloads_here(
    scenario: &mut Scenario,
    name: &str,
    backend: Option<&str>,
    note: &mut dyn FnMut(&str),
) -> Result<(), RunInputError> {
    if let Some(backend) = backend {
        let models = machine::builtin_names();
        override_backend(scenario, name, backend, &models, note)?;
    }
    if needs_gpu(scenario) {
        if let Some(why) = machine::gpu_missing_reason() {
            return Err(RunInputError::NoGpu(no_gpu_text(scenario, name, &why)));
        }
    }
    Ok(())
}

/// The built-in quickstart: `cpu` even when a GPU is present; `cuda`, or an error saying why
/// the GPU cannot be used; by default the GPU one when it can run.
fn quickstart(
    backend: Option<&str>,
    note: &mut dyn FnMut(&str),
) -> Result<RunInput, RunInputError> {
    let (scenario, name, no_gpu) = machine::quickstart(backend == Some("cpu"))?;
    if let Some(why) = no_gpu {
        if backend == Some("cuda") {
            return Err(RunInputError::NoGpu(format!(
                "--backend cuda: the GPU quickstart cannot run here ({why})"
            )));
        }
        note(&wrap_message(
            &format!("note: running the CPU quickstart: the GPU one cannot run here ({why})"),
            80,
        ));
    }
    Ok(RunInput::Workloads { scenario, name })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scenario(rel: &str) -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../..")
            .join(rel)
    }

    #[test]
    fn a_file_of_apps_refuses_json_and_backend_and_is_run_as_apps() {
        let apps = scenario("scenarios/apps/ensemble-cpu.toml");
        let quiet = &mut |_: &str| {};
        let e = run_input(Some(&apps), None, true, quiet).err().unwrap();
        assert!(
            e.is_user_error() && e.to_string().starts_with("--json: "),
            "{e}"
        );
        let e = run_input(Some(&apps), Some("cpu"), false, quiet)
            .err()
            .unwrap();
        assert!(
            e.is_user_error() && e.to_string().contains("[[app]]s"),
            "{e}"
        );
        assert!(matches!(
            run_input(Some(&apps), None, false, quiet),
            Ok(RunInput::Apps { .. })
        ));
        let missing = scenario("scenarios/no-such-file.toml");
        let e = run_input(Some(&missing), None, false, quiet).err().unwrap();
        assert!(e.is_user_error(), "{e}");
    }

    #[test]
    fn backend_cpu_moves_a_gpu_file_to_the_cpu_and_picks_the_cpu_quickstart() {
        let mut notes = Vec::new();
        let gpu = scenario("scenarios/gpu/green-2x64-resnet18.toml");
        match run_input(Some(&gpu), Some("cpu"), false, &mut |n| {
            notes.push(n.to_string())
        }) {
            Ok(RunInput::Workloads { scenario, .. }) => assert!(!needs_gpu(&scenario)),
            _ => panic!("not run as workloads"),
        }
        assert!(
            notes.iter().any(|n| n.contains("partitions dropped")),
            "{notes:?}"
        );
        match run_input(None, Some("cpu"), false, &mut |_| {}) {
            Ok(RunInput::Workloads { scenario, .. }) => assert!(!needs_gpu(&scenario)),
            _ => panic!("no CPU quickstart"),
        }
    }
}
