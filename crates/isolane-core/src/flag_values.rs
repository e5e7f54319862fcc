//! The values a command-line flag may take, checked where clap parses them (`value_parser`):
//! each check says in plain words what was given and what is allowed. Negative numbers reach
//! these checks (the CLI allows them as values) and are refused here, not as unknown flags.

use crate::spec::limits::{MAX_RATE_HZ, MAX_SECONDS, MIN_SECONDS};

/// A number > 0 (finite).
pub fn positive(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("`{s}` is not a number > 0")),
    }
}

/// A fraction in (0, 1].
pub fn fraction(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 1.0 => Ok(v),
        _ => Err(format!("`{s}` is not a number in (0, 1]")),
    }
}

/// A factor >= 1 (finite).
pub fn factor(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 1.0 => Ok(v),
        _ => Err(format!("`{s}` is not a number >= 1")),
    }
}

/// A budget of seconds >= 0 (finite).
pub fn seconds_or_none(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!("`{s}` is not a number of seconds >= 0")),
    }
}

/// Seconds > 0, at most a day.
pub fn seconds_within_a_day(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v <= 86_400.0 => Ok(v),
        _ => Err(format!(
            "`{s}` is not a number of seconds > 0 (at most 86400)"
        )),
    }
}

/// A duration, as a scenario's `duration_s`: 1 ns to 100 days.
pub fn run_seconds(s: &str) -> Result<f64, String> {
    match positive(s) {
        Ok(v) if (MIN_SECONDS..=MAX_SECONDS).contains(&v) => Ok(v),
        _ => Err(format!(
            "`{s}` is not a number of seconds from {MIN_SECONDS:e} (1 ns) to {MAX_SECONDS:e} \
             (100 days)"
        )),
    }
}

/// A release rate in Hz (at most one job per ns), or `max` (closed loop): `None`.
pub fn rate_or_max(s: &str) -> Result<Option<f64>, String> {
    if s == "max" {
        return Ok(None);
    }
    rate_hz(s).map(Some)
}

/// A release rate in Hz, > 0 and at most one job per ns (as a scenario's `rate_hz`).
pub fn rate_hz(s: &str) -> Result<f64, String> {
    match positive(s) {
        Ok(hz) if hz <= MAX_RATE_HZ => Ok(hz),
        Ok(_) => Err(format!(
            "`{s}` is above {MAX_RATE_HZ:e} Hz (one job per ns, the clock's resolution)"
        )),
        Err(e) => Err(e),
    }
}

/// A time in ms (any finite number: a window's ends may precede t0).
pub fn millis(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() => Ok(v),
        _ => Err(format!("`{s}` is not a time in ms (a number, e.g. 1500)")),
    }
}

/// A count (`--batch`, `--jobs`): a whole number >= 1.
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

/// `--threads N` of the CPU backend (0 = one per core) against the cores this process may use:
/// more threads than cores only take turns on them, and a typo such as 100000 would start that
/// many threads.
pub fn check_threads(threads: usize) -> Result<(), String> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if threads > cores {
        return Err(format!(
            "--threads {threads}: this machine has {cores} CPU core(s) available to isolane; \
             expected 0 (one thread per core) to {cores}"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn numbers_keep_to_their_ranges() {
        assert_eq!(positive("0.5"), Ok(0.5));
        assert!(positive("0").is_err() && positive("inf").is_err() && positive("-2").is_err());
        assert_eq!(fraction("1"), Ok(1.0));
        assert!(fraction("1.01").is_err() && fraction("0").is_err());
        assert!(factor("0.99").is_err() && factor("1").is_ok());
        assert_eq!(seconds_or_none("0"), Ok(0.0));
        assert!(seconds_within_a_day("86401").is_err() && seconds_within_a_day("0").is_err());
        assert!(run_seconds("1e-10").unwrap_err().contains("(1 ns)"));
        assert_eq!(rate_or_max("max"), Ok(None));
        assert_eq!(rate_or_max("50"), Ok(Some(50.0)));
        assert!(rate_or_max("2e9").unwrap_err().contains("one job per ns"));
        assert_eq!(rate_hz("50"), Ok(50.0));
        assert!(rate_hz("1e300").unwrap_err().contains("one job per ns"));
        assert!(rate_hz("max").is_err() && rate_hz("0").is_err());
        assert_eq!(millis("-3"), Ok(-3.0));
        assert!(millis("nan").is_err());
    }
}
