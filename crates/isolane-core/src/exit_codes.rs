//! The exit codes of every command (docs/runtime.md), and the paragraph each command's help
//! ends with: 0 success, 2 a mistake in the input, 130 interrupted are the same everywhere;
//! what 1 means, and whether 3 (out of memory) or 130 can happen, depends on the command.

use crate::results::RunStatus;

/// A runtime failure.
pub const EXIT_FAILED: u8 = 1;
/// A mistake in the input: nothing was run.
pub const EXIT_USER: u8 = 2;
/// The model at its batch did not fit the memory it was given (an allocation was refused).
pub const EXIT_OUT_OF_MEMORY: u8 = 3;
/// Interrupted by Ctrl-C; what was measured is written.
pub const EXIT_INTERRUPTED: u8 = 130;

/// A command of several runs (`plan --auto`) stopped between two of them by Ctrl-C or SIGTERM:
/// an error that exits 130, as an interrupted run does; its message says so and what is kept.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Interrupted(pub String);

/// The exit code of a run that ended with `status`.
pub fn exit_for(status: RunStatus) -> u8 {
    match status {
        RunStatus::Ok => 0,
        RunStatus::Failed => EXIT_FAILED,
        RunStatus::Interrupted => EXIT_INTERRUPTED,
    }
}

/// What exit code 1 means for each command; 0, 2 and 130 mean the same everywhere.
fn failure_meaning(command: &str) -> &'static str {
    match command {
        "run" | "isolation" => {
            "a workload failed (its results and the others' are still written), or a runtime or \
             GPU failure"
        }
        "sweep" | "partition" | "concurrency" => {
            "a point failed (the other points still ran), or a runtime or GPU failure"
        }
        "interference" => "a cell failed (the other cells still ran), or a runtime or GPU failure",
        "coexec" => {
            "a run failed (the other runs still ran; skipped cells are not failures), or a \
             runtime or GPU failure"
        }
        "plan" => {
            "no GPU here to plan a backend = \"cuda\" scenario for (pass --device-model NAME to \
             plan for a GPU that is not here), or the GPU could not be queried"
        }
        "bench" | "infer" | "maxrate" => {
            "a runtime or GPU failure, including no usable GPU for --backend cuda (no driver, no \
             device or a CUDA library missing: use --backend cpu)"
        }
        "devices" => "the driver answered with an error (no GPU at all is not one: exit 0)",
        "verify" => "a runtime or GPU failure (verify needs a CUDA GPU)",
        "report" => "a chart could not be drawn or the page not written",
        "trace" => "the trace file could not be written",
        "explain" => "RUN_DIR/explain.json could not be written (the table is printed first)",
        "completions" | "man" => "the output could not be written",
        _ => "a runtime failure",
    }
}

/// Commands that stop cleanly on Ctrl-C and keep what they measured.
fn is_interruptible(command: &str) -> bool {
    matches!(
        command,
        "run"
            | "isolation"
            | "interference"
            | "coexec"
            | "maxrate"
            | "sweep"
            | "partition"
            | "concurrency"
            | "verify"
    )
}

/// Commands whose engine errors reach the exit code whole, so that an out-of-memory is told
/// apart from other failures (exit 3).
fn may_run_out_of_memory(command: &str) -> bool {
    matches!(command, "infer" | "bench" | "build")
}

/// The "Exit codes" paragraph of one command's help (a paragraph, so that clap wraps it
/// cleanly at any width).
pub fn exit_codes_text(command: &str) -> String {
    let mut s = format!(
        "Exit codes: 0 success; 1 {}; 2 a mistake in the input: a flag value, a scenario or a \
         file (the message names it; nothing is run)",
        failure_meaning(command)
    );
    if may_run_out_of_memory(command) {
        s.push_str(
            "; 3 out of memory: the model at its batch did not fit (the message names the \
             allocation and the bytes asked, and a hint follows)",
        );
    }
    if command == "run" {
        s.push_str(
            "; 3 out of memory: every workload that failed ran out of memory in its worker \
             process (host = \"process\"): its model at its batch did not fit",
        );
    }
    if is_interruptible(command) {
        s.push_str("; 130 interrupted by Ctrl-C (what was measured is written)");
    }
    s.push('.');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_running_commands_list_130_and_plan_lists_no_gpu() {
        assert!(exit_codes_text("maxrate").contains("130"));
        assert!(!exit_codes_text("models").contains("130"));
        assert!(exit_codes_text("plan").contains("--device-model"));
        assert!(exit_codes_text("bench").contains("--backend cpu"));
        assert!(exit_codes_text("infer").contains("; 3 out of memory"));
        assert!(exit_codes_text("run").contains("; 3 out of memory"));
        assert!(!exit_codes_text("sweep").contains("; 3 "));
    }
}
