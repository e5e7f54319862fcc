//! Errors of scenario files. Every one of them is the user's to fix, so the CLI maps all of them
//! to exit code 2 ([`SpecError::exit_code`]).

use std::fmt;

/// One thing wrong with a scenario file, located as precisely as the file allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// 1-based line of the offending key or value; 0 for a scenario built in code (no file).
    pub line: usize,
    /// 1-based column (in characters, not bytes).
    pub column: usize,
    /// Dotted path of the field, e.g. `workload[1].rate_hz` (workload indices are 0-based, in
    /// file order).
    pub field: String,
    /// What was found and what is allowed.
    pub message: String,
}

/// Why a scenario file was refused.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// The file could not be read at all.
    #[error("{file}: cannot read the scenario file: {source}")]
    Read {
        file: String,
        #[source]
        source: std::io::Error,
    },
    /// The text is not valid TOML.
    #[error("{file}:{line}:{column}: TOML syntax error: {message}")]
    Syntax {
        file: String,
        line: usize,
        column: usize,
        message: String,
    },
    /// Valid TOML that is not a valid scenario. All problems found are listed (in file order),
    /// so that one round of editing can fix them all.
    #[error("{}", ProblemList { file, problems })]
    Invalid {
        file: String,
        problems: Vec<Problem>,
    },
    /// A scenario built in code could not be written as TOML (e.g. a seed above `i64::MAX`,
    /// which TOML cannot represent).
    #[error("cannot write the scenario as TOML: {0}")]
    Write(String),
}

impl SpecError {
    /// Exit code the CLI should use: 2, "the user's input is wrong", for every variant.
    pub fn exit_code(&self) -> i32 {
        2
    }

    /// Always true: a scenario error is a user error, never a runtime or GPU failure.
    pub fn is_user_error(&self) -> bool {
        true
    }

    /// The individual problems (empty for read and syntax errors).
    pub fn problems(&self) -> &[Problem] {
        match self {
            SpecError::Invalid { problems, .. } => problems,
            _ => &[],
        }
    }
}

/// The most problems a refused scenario lists: a file of thousands of unknown keys would
/// otherwise print megabytes; the rest are counted.
pub const MAX_LISTED_PROBLEMS: usize = 50;

struct ProblemList<'a> {
    file: &'a str,
    problems: &'a [Problem],
}

impl fmt::Display for ProblemList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.problems.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            if i == MAX_LISTED_PROBLEMS {
                let left = self.problems.len() - i;
                let at = if self.file.is_empty() {
                    String::new()
                } else {
                    format!("{}: ", self.file)
                };
                return write!(
                    f,
                    "{at}and {left} more problem(s), not shown: fix the ones above and run again"
                );
            }
            // A scenario built in code has no file and no positions: the field says it all.
            if p.line == 0 {
                write!(f, "{}: {}", p.field, p.message)?;
            } else {
                write!(
                    f,
                    "{}:{}:{}: {}: {}",
                    self.file, p.line, p.column, p.field, p.message
                )?;
            }
        }
        Ok(())
    }
}
