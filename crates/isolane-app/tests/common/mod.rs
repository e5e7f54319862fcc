//! What the integration tests share.

use isolane_app::spec::ModelNames;

/// Takes every model name as a built-in: the tests' builders make stand-ins for whatever a
/// stage names.
pub struct Names;

impl ModelNames for Names {
    fn is_builtin(&self, _: &str) -> bool {
        true
    }
    fn builtins(&self) -> Vec<String> {
        vec![]
    }
}
