//! What a workload's `model` string names: the synthetic spin workload, a synthetic kernel
//! (`kernel:`, in `kernel.rs`), a built-in architecture or an ONNX file.

use std::path::PathBuf;
use std::time::Duration;

/// The built-in models known to this build. The engine owns the list; core only asks. The CLI
/// passes the engine's catalog, tests and the runtime may pass [`NoBuiltinModels`] or a slice.
pub trait ModelCatalog {
    /// Whether `name` is a built-in model.
    fn is_builtin(&self, name: &str) -> bool;
    /// Every built-in name, for error messages.
    fn builtin_names(&self) -> Vec<String>;
}

/// A catalog without built-in models: only `spin:` and `.onnx` models validate.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoBuiltinModels;

impl ModelCatalog for NoBuiltinModels {
    fn is_builtin(&self, _name: &str) -> bool {
        false
    }
    fn builtin_names(&self) -> Vec<String> {
        Vec::new()
    }
}

impl<S: AsRef<str>> ModelCatalog for [S] {
    fn is_builtin(&self, name: &str) -> bool {
        self.iter().any(|n| n.as_ref() == name)
    }
    fn builtin_names(&self) -> Vec<String> {
        self.iter().map(|n| n.as_ref().to_string()).collect()
    }
}

impl<S: AsRef<str>, const N: usize> ModelCatalog for [S; N] {
    fn is_builtin(&self, name: &str) -> bool {
        self[..].is_builtin(name)
    }
    fn builtin_names(&self) -> Vec<String> {
        self[..].builtin_names()
    }
}

impl<S: AsRef<str>> ModelCatalog for Vec<S> {
    fn is_builtin(&self, name: &str) -> bool {
        self[..].is_builtin(name)
    }
    fn builtin_names(&self) -> Vec<String> {
        self[..].builtin_names()
    }
}

/// `spin:<service>[~<jitter>]`: a CPU busy-wait per job. Each job's service time is drawn
/// uniformly (seeded) from `[service − jitter, service + jitter]`, so the mean stays `service`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpinModel {
    pub service: Duration,
    pub jitter: Duration,
}

/// Why a `spin:` model string is malformed. The message says what is allowed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SpinParseError(String);

/// Why a synthetic model string (`spin:` or `kernel:`) is malformed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelParseError {
    #[error(transparent)]
    Spin(#[from] SpinParseError),
    #[error(transparent)]
    Kernel(#[from] super::kernel::KernelParseError),
}

/// The accepted syntax, quoted in every spin error.
pub(crate) const SPIN_SYNTAX: &str =
    "spin:<time>[~<jitter>] with units ns, us, ms or s, e.g. \"spin:4ms\" or \"spin:4ms~0.5ms\"";

impl SpinModel {
    /// Parse `spin:4ms`, `spin:250us~20us`, `spin:1.5ms`. The service time must be > 0 and the
    /// jitter ≤ the service time (a service time is never negative).
    pub fn parse(s: &str) -> Result<SpinModel, SpinParseError> {
        let body = s.strip_prefix("spin:").ok_or_else(|| {
            SpinParseError(format!(
                "{s:?} does not start with \"spin:\"; expected {SPIN_SYNTAX}"
            ))
        })?;
        let (service, jitter) = match body.split_once('~') {
            Some((a, b)) => (a, Some(b)),
            None => (body, None),
        };
        let service = parse_duration(service.trim()).map_err(|why| {
            SpinParseError(format!(
                "service time in {s:?}: {why}; expected {SPIN_SYNTAX}"
            ))
        })?;
        if service.is_zero() {
            return Err(SpinParseError(format!(
                "service time in {s:?} is 0; expected a time > 0 ({SPIN_SYNTAX})"
            )));
        }
        let jitter = match jitter {
            None => Duration::ZERO,
            Some(j) => parse_duration(j.trim()).map_err(|why| {
                SpinParseError(format!("jitter in {s:?}: {why}; expected {SPIN_SYNTAX}"))
            })?,
        };
        if jitter > service {
            return Err(SpinParseError(format!(
                "jitter in {s:?} is larger than the service time; expected jitter <= service time \
                 (service times are drawn from [service - jitter, service + jitter])"
            )));
        }
        Ok(SpinModel { service, jitter })
    }
}

impl std::fmt::Display for SpinModel {
    /// Writes the canonical form, in ns, so that parse(display(x)) == x exactly.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "spin:{}ns", self.service.as_nanos())?;
        if !self.jitter.is_zero() {
            write!(f, "~{}ns", self.jitter.as_nanos())?;
        }
        Ok(())
    }
}

/// `4ms`, `0.5ms`, `250us`, `250µs`, `1s`, `100ns` → a duration rounded to the nanosecond.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| format!("{s:?} has no unit"))?;
    if split == 0 {
        return Err(format!("{s:?} is not a number followed by a unit"));
    }
    let (num, unit) = s.split_at(split);
    let ns_per_unit = match unit {
        "ns" => 1.0,
        "us" | "µs" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        _ => return Err(format!("{s:?} has unknown unit {unit:?}")),
    };
    // Only plain decimals: no sign, exponent, inf or nan, which f64::from_str would accept.
    if num.is_empty() || num.chars().filter(|&c| c == '.').count() > 1 || num == "." {
        return Err(format!("{s:?} is not a number followed by a unit"));
    }
    let value: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a number followed by a unit"))?;
    let ns = (value * ns_per_unit).round();
    // A day of spinning per job is certainly a typo; it also keeps the cast below exact.
    if ns > 86_400e9 {
        return Err(format!("{s:?} is longer than a day"));
    }
    Ok(Duration::from_nanos(ns as u64))
}

/// What a validated `model` string refers to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSource {
    /// The synthetic busy-wait workload.
    Spin(SpinModel),
    /// A synthetic kernel of a known resource profile (`kernel:`).
    Kernel(super::kernel::KernelModel),
    /// A built-in architecture of the engine, by name.
    Builtin(String),
    /// An ONNX file or a saved plan (`.isoplan`) (absolute after validation).
    Onnx(PathBuf),
}

impl ModelSource {
    /// Classify a model string. Only the `spin:` and `kernel:` syntax is checked here; whether a
    /// built-in name exists or a file is there is checked by scenario validation.
    pub fn classify(model: &str) -> Result<ModelSource, ModelParseError> {
        if model.starts_with("spin:") {
            Ok(SpinModel::parse(model).map(ModelSource::Spin)?)
        } else if model.starts_with("kernel:") {
            Ok(super::kernel::KernelModel::parse(model).map(ModelSource::Kernel)?)
        } else if is_onnx_path(model) {
            Ok(ModelSource::Onnx(PathBuf::from(model)))
        } else {
            Ok(ModelSource::Builtin(model.to_string()))
        }
    }
}

/// A model given as a file: an ONNX file, or a saved plan (`.isoplan`, `isolane build`), which
/// is validated, resolved and read like one.
pub(crate) fn is_onnx_path(model: &str) -> bool {
    let m = model.to_ascii_lowercase();
    m.ends_with(".onnx") || m.ends_with(".isoplan")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spin_parses_units_and_jitter() {
        let m = SpinModel::parse("spin:4ms").unwrap();
        assert_eq!(
            m,
            SpinModel {
                service: Duration::from_millis(4),
                jitter: Duration::ZERO
            }
        );
        let m = SpinModel::parse("spin:4ms~0.5ms").unwrap();
        assert_eq!(m.jitter, Duration::from_micros(500));
        assert_eq!(
            SpinModel::parse("spin:250us").unwrap().service,
            Duration::from_micros(250)
        );
        assert_eq!(
            SpinModel::parse("spin:250µs").unwrap().service,
            Duration::from_micros(250)
        );
        assert_eq!(
            SpinModel::parse("spin:1.5s").unwrap().service,
            Duration::from_millis(1500)
        );
        assert_eq!(
            SpinModel::parse("spin:100ns").unwrap().service,
            Duration::from_nanos(100)
        );
    }

    #[test]
    fn spin_display_round_trips() {
        for s in ["spin:4ms", "spin:4ms~0.5ms", "spin:1.25us~1ns"] {
            let m = SpinModel::parse(s).unwrap();
            assert_eq!(SpinModel::parse(&m.to_string()).unwrap(), m);
        }
    }

    #[test]
    fn spin_rejects_malformed() {
        for (s, needle) in [
            ("spin:", "no unit"),
            ("spin:4", "no unit"),
            ("spin:4 ms", "unknown unit"),
            ("spin:4min", "unknown unit"),
            ("spin:-4ms", "not a number"),
            ("spin:4.5.5ms", "not a number"),
            ("spin:1e3ms", "unknown unit"),
            ("spin:0ms", "is 0"),
            ("spin:4ms~5ms", "larger than the service time"),
            ("spin:4ms~", "jitter"),
            ("spin:2days", "unknown unit"),
            ("spin:100000s", "longer than a day"),
        ] {
            let e = SpinModel::parse(s).unwrap_err().to_string();
            assert!(e.contains(needle), "{s}: {e}");
            assert!(
                e.contains("spin:<time>") || e.contains("jitter <="),
                "{s}: {e}"
            );
        }
    }

    #[test]
    fn classify() {
        assert!(matches!(
            ModelSource::classify("spin:1ms"),
            Ok(ModelSource::Spin(_))
        ));
        assert!(matches!(
            ModelSource::classify("a/b.ONNX"),
            Ok(ModelSource::Onnx(_))
        ));
        assert_eq!(
            ModelSource::classify("resnet18"),
            Ok(ModelSource::Builtin("resnet18".into()))
        );
    }
}
