//! What every command's help and parsing share: the exit codes (docs/runtime.md,
//! `isolane_core::exit_codes`) listed in each command's help, and negative numbers passed on
//! to the flags' own checks (`isolane_core::flag_values`, so that `--batch -1` is refused as a
//! batch of −1, not as an unknown flag `-1`).

pub use isolane_core::flag_values::{at_least_one, at_least_one_u32, at_least_one_usize};

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
        cmd.after_help(isolane_core::exit_codes::exit_codes_text(&name))
    }
}

#[cfg(test)]
mod tests {
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
}
