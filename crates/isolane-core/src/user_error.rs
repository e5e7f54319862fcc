//! A mistake of the user's (bad scenario, bad flag value, unreadable file, occupied output
//! directory), told apart from a runtime failure wherever it arises: the CLI finds it in an
//! error's chain and exits 2 for it, 1 for anything else (docs/runtime.md, exit codes).

/// The user's mistake, in the words to show them.
#[derive(Debug)]
pub struct UserError(pub String);

impl std::fmt::Display for UserError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UserError {}

/// A [`UserError`] of anything displayable.
pub fn user(msg: impl std::fmt::Display) -> UserError {
    UserError(msg.to_string())
}
