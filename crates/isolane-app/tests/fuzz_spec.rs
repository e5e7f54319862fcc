//! Property test of the `[[app]]` reader: the shipped app scenarios, mutated byte by byte or
//! with a value replaced by one at or past a field's edge, are read or refused, never a panic
//! (the run's arithmetic relies on what validation lets through). `ISOLANE_FUZZ_CASES` sets
//! the number of cases (default 2000, about a second); `cargo test` replays a fixed seed.

use isolane_app::spec::{parse_apps, ModelNames};
use proptest::prelude::*;

const SEEDS: &[&str] = &[
    include_str!("../../../scenarios/apps/endoscopy-cpu.toml"),
    include_str!("../../../scenarios/apps/ensemble-cpu.toml"),
    include_str!("../../../scenarios/apps/tools-and-ensemble-gpu.toml"),
];

/// Values at or past the edges of what a field allows, or of the wrong type.
const VALUES: &[&str] = &[
    "0",
    "-1",
    "1e300",
    "1e-300",
    "nan",
    "inf",
    "9223372036854775807",
    "18446744073709551615",
    "\"\"",
    "\"source\"",
    "\"graphics\"",
    "\"onnx\"",
    "[]",
    "[0, 0]",
    "[4294967295, 4294967295]",
    "[4294967295, 4294967295, 1, 1]",
    "[\"nope\"]",
    "{ sms = 0 }",
    "true",
];

struct Builtins;
impl ModelNames for Builtins {
    fn is_builtin(&self, m: &str) -> bool {
        isolane_engine::model_info(m).is_some()
    }
    fn builtins(&self) -> Vec<String> {
        vec![]
    }
}

/// `text` with the value of its `line`-th `key = value` line replaced.
fn replace_value(text: &str, line: usize, value: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let with_values: Vec<usize> = (0..lines.len())
        .filter(|&i| lines[i].contains(" = ") && !lines[i].trim_start().starts_with('#'))
        .collect();
    if with_values.is_empty() {
        return text.to_string();
    }
    let at = with_values[line % with_values.len()];
    let key = lines[at].split(" = ").next().unwrap_or("");
    let mut out: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
    out[at] = format!("{key} = {value}");
    out.join("\n")
}

fn mutate(text: &str, at: usize, byte: u8, cut: bool) -> String {
    let mut bytes = text.as_bytes().to_vec();
    let n = bytes.len();
    if cut {
        bytes.truncate(at % (n + 1));
    } else {
        bytes[at % n] = byte;
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

proptest! {
    #![proptest_config(isolane_core::fuzz::config(2000))]

    #[test]
    fn a_replaced_value_is_read_or_refused(
        seed in 0..SEEDS.len(),
        line in any::<usize>(),
        value in prop::sample::select(VALUES),
    ) {
        let text = replace_value(SEEDS[seed], line, value);
        if let Ok(apps) = parse_apps(&text, std::path::Path::new("fuzz.toml"), &Builtins) {
            every_number_is_finite(&apps);
        }
    }

    #[test]
    fn a_mutated_file_is_read_or_refused(
        seed in 0..SEEDS.len(),
        at in any::<usize>(),
        byte in any::<u8>(),
        cut in any::<bool>(),
    ) {
        let text = mutate(SEEDS[seed], at, byte, cut);
        if let Ok(apps) = parse_apps(&text, std::path::Path::new("fuzz.toml"), &Builtins) {
            every_number_is_finite(&apps);
        }
    }
}

/// What the reader accepts has no NaN or infinity in it (issue 31: every parser refuses
/// non-finite numbers).
fn every_number_is_finite(apps: &[isolane_app::spec::AppSpec]) {
    use isolane_app::spec::StageKind;
    for a in apps {
        assert!(a.deadline_ms.is_finite() && a.source.fps.is_finite());
        assert!(a.stretch.is_none_or(f64::is_finite));
        for s in &a.stages {
            if let StageKind::Preprocess(p) = &s.kind {
                assert!(
                    p.mean.iter().chain(&p.std).all(|v| v.is_finite()),
                    "{}: {:?} {:?}",
                    s.name,
                    p.mean,
                    p.std
                );
            }
        }
    }
}

/// Issue 31: a preprocess `mean` of NaN, an infinity or a number past f32's range (read as an
/// infinity) was taken, and made every pixel NaN. It is refused by field.
#[test]
fn a_preprocess_mean_that_is_not_finite_is_refused() {
    let seed = SEEDS[0];
    assert!(seed.contains("mean = [0.485, 0.456, 0.406]"));
    for bad in [
        "[nan, 0.456, 0.406]",
        "[0.485, inf, 0.406]",
        "[0.485, 0.456, 1e300]",
    ] {
        let text = seed.replace("[0.485, 0.456, 0.406]", bad);
        let e = parse_apps(&text, std::path::Path::new("fuzz.toml"), &Builtins)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("fuzz.toml") && e.contains(".mean") && e.contains("three finite numbers"),
            "{bad}: {e}"
        );
    }
    parse_apps(seed, std::path::Path::new("fuzz.toml"), &Builtins).unwrap();
}
