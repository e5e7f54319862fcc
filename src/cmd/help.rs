//! What every command's help and parsing share: the exit codes (docs/runtime.md) listed in each
//! command's help, and negative numbers passed on to the flags' own checks (so `--batch -1`
//! is refused as a batch of −1, not as an unknown flag `-1`).

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
    if is_interruptible(command) {
        s.push_str("; 130 interrupted by Ctrl-C (what was measured is written)");
    }
    s.push('.');
    s
}

/// A count flag (`--batch`, `--jobs`): a whole number >= 1. Negative values reach this check
/// (see [`finish`]) and are refused in these words instead of clap's "unexpected argument".
pub fn at_least_one(s: &str) -> Result<u64, String> {
    match s.trim().parse::<i128>() {
        Ok(v) if v >= 1 => u64::try_from(v).map_err(|_| format!("{s} is too large")),
        Ok(_) => Err(format!("{s} is not allowed: a whole number >= 1 is")),
        Err(_) => Err(format!("`{s}` is not a whole number (>= 1)")),
    }
}

/// [`at_least_one`] for flags stored as `u32`.
pub fn at_least_one_u32(s: &str) -> Result<u32, String> {
    let v = at_least_one(s)?;
    u32::try_from(v).map_err(|_| format!("{s} is too large (at most {})", u32::MAX))
}

/// [`at_least_one`] for flags stored as `usize`.
pub fn at_least_one_usize(s: &str) -> Result<usize, String> {
    let v = at_least_one(s)?;
    usize::try_from(v).map_err(|_| format!("{s} is too large"))
}

/// Applies the shared settings to `cmd` and every subcommand below it (help wrapped at 80
/// columns, like every table).
pub fn finish(cmd: clap::Command) -> clap::Command {
    let name = cmd.get_name().to_string();
    let cmd = cmd
        .allow_negative_numbers(true)
        .term_width(80)
        .mut_subcommands(finish);
    if name == "isolane" || name == "worker" {
        cmd
    } else {
        cmd.after_help(exit_codes_text(&name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_command_lists_its_exit_codes() {
        let mut root = crate::cli();
        root.build();
        let mut checked = 0;
        let mut stack: Vec<&clap::Command> = root.get_subcommands().collect();
        while let Some(c) = stack.pop() {
            if c.is_hide_set() || c.get_name() == "help" {
                continue;
            }
            stack.extend(c.get_subcommands());
            let help = c.clone().render_long_help().to_string();
            // clap never wraps the usage line (infer's has three alternatives).
            let widest = help
                .lines()
                .filter(|l| !l.starts_with("Usage:"))
                .map(|l| l.chars().count())
                .max()
                .unwrap_or(0);
            assert!(widest <= 80, "`{}` --help is {widest} wide", c.get_name());
            let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
            for code in ["0 success;", "; 1 ", "; 2 a mistake"] {
                assert!(
                    help.contains("Exit codes:") && help.contains(code),
                    "`{}` --help lacks exit code{code}:\n{help}",
                    c.get_name()
                );
            }
            checked += 1;
        }
        assert!(checked >= 14, "only {checked} commands checked");
    }

    #[test]
    fn counts_refuse_zero_negative_and_words_in_plain_terms() {
        assert_eq!(at_least_one("3"), Ok(3));
        assert_eq!(
            at_least_one("-1"),
            Err("-1 is not allowed: a whole number >= 1 is".into())
        );
        assert!(at_least_one("0").unwrap_err().contains(">= 1"));
        assert!(at_least_one("two")
            .unwrap_err()
            .contains("not a whole number"));
        assert!(at_least_one_u32("99999999999")
            .unwrap_err()
            .contains("too large"));
    }

    #[test]
    fn long_running_commands_list_130_and_plan_lists_no_gpu() {
        assert!(exit_codes_text("maxrate").contains("130"));
        assert!(!exit_codes_text("models").contains("130"));
        assert!(exit_codes_text("plan").contains("--device-model"));
        assert!(exit_codes_text("bench").contains("--backend cpu"));
        assert!(exit_codes_text("infer").contains("; 3 out of memory"));
        assert!(!exit_codes_text("run").contains("; 3 "));
    }
}
