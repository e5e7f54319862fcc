//! External programs as workloads: a `[[workload]]` with `command = [...]` instead of `model`
//! (docs/programs.md). isolane starts the program inside the workload's partition, measures it
//! (wall time, exit status, CPU time, device memory, GPU share) and stops it at its duration or
//! timeout; it has no rate, deadline or jobs.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// What a command workload runs and for how long.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProgramSpec {
    /// The program and its arguments, run without a shell (`["sh", "-c", "…"]` for one).
    pub command: Vec<String>,
    /// Extra environment, on top of isolane's own and before the partition's (which wins).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Working directory: relative to the scenario file's directory in the file, absolute once
    /// resolved. `None`: isolane's own working directory.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Stop the program this many seconds after t0 (a normal end: "stopped at duration").
    /// `None`: it runs to completion.
    #[serde(default)]
    pub duration_s: Option<f64>,
    /// A program still running this many seconds after t0 is stopped and reported as timed
    /// out (a failure).
    #[serde(default)]
    pub timeout_s: Option<f64>,
}

impl ProgramSpec {
    /// The command line as one string, for tables and summary.json's `model`.
    pub fn command_line(&self) -> String {
        self.command
            .iter()
            .map(|a| {
                if a.is_empty() || a.contains(char::is_whitespace) {
                    format!("{a:?}")
                } else {
                    a.clone()
                }
            })
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// Keys of a model workload that a command workload refuses: it has no model, rate, deadline,
/// jobs or warm-up, it always runs as its own process, and the criticality guard cannot hold
/// another program back between pieces.
pub const MODEL_ONLY_KEYS: &[&str] = &[
    "model",
    "weights",
    "batch",
    "precision",
    "calibration",
    "calibration_method",
    "calibration_skips",
    "rate_hz",
    "deadline_ms",
    "phase_ms",
    "jobs",
    "warmup_jobs",
    "late",
    "role",
    "ramp",
    "host",
    "plan_check",
    "criticality",
    "stretch",
    "gpu",
];

/// Keys only a command workload has.
pub const PROGRAM_ONLY_KEYS: &[&str] = &["command", "env", "cwd", "timeout_s"];

/// Environment variables through which isolane confines a program to its MPS or MIG
/// partition: a program's `env` may not set them.
pub const PARTITION_ENV: &[&str] = &[
    "CUDA_VISIBLE_DEVICES",
    "CUDA_MPS_PIPE_DIRECTORY",
    "CUDA_MPS_LOG_DIRECTORY",
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
];

/// Whether `name` can be an environment variable's name (no `=`, no NUL, not empty).
pub fn valid_env_name(name: &str) -> bool {
    !name.is_empty() && !name.contains(['=', '\0'])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_quotes_what_a_shell_would_split() {
        let p = ProgramSpec {
            command: vec!["sh".into(), "-c".into(), "sleep 1; echo hi".into()],
            env: BTreeMap::new(),
            cwd: None,
            duration_s: None,
            timeout_s: None,
        };
        assert_eq!(p.command_line(), "sh -c \"sleep 1; echo hi\"");
    }

    #[test]
    fn env_names_refuse_equals_and_nul() {
        assert!(valid_env_name("CUDA_LAUNCH_BLOCKING"));
        assert!(!valid_env_name(""));
        assert!(!valid_env_name("A=B"));
        assert!(!valid_env_name("A\0"));
    }
}
