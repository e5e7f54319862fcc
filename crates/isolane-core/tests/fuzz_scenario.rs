//! Property tests of the scenario TOML parser and validation: whatever the text, parsing returns
//! a scenario or an error, never panics. Two generators: byte-level mutations of the shipped
//! scenarios, and scenarios assembled from every known key with edge-case values (huge, zero,
//! negative, NaN, wrong type). Below them, the summary.json reader's target (mutated summaries). `cargo test` runs a bounded number of cases
//! (`ISOLANE_FUZZ_CASES`, default 3000, well under a second); `scripts/fuzz.sh` runs many more.

use isolane_core::spec::limits::{MAX_BATCH_DELAY_MS, MAX_QUEUE_LIMIT, MAX_SECONDS};
use isolane_core::spec::{
    Rate, Role, RunLength, Scenario, BATCHING_KEYS, DEVICE_KEYS, SERVE_KEYS, TIMING_KEYS,
    WORKLOAD_KEYS,
};
use proptest::prelude::*;

/// The shipped scenarios, as seeds for mutation.
const SEEDS: &[&str] = &[
    include_str!("../../../scenarios/quickstart.toml"),
    include_str!("../../../scenarios/quickstart-gpu.toml"),
    include_str!("../../../scenarios/isolation-2.toml"),
    include_str!("../../../scenarios/overload-queue.toml"),
    include_str!("../../../scenarios/two-process.toml"),
    include_str!("../../../scenarios/gpu/mps-4x25-resnet18.toml"),
    include_str!("../../../scenarios/gpu/green-2x64-resnet18.toml"),
];

/// Values that sit at or past the edges of what a field allows, or are of the wrong type.
const VALUES: &[&str] = &[
    "0",
    "1",
    "-1",
    "0.5",
    "100000",
    "4294967295",
    "4294967296",
    "9223372036854775807",
    "-9223372036854775808",
    "1e300",
    "-1e300",
    "1e-300",
    "1e-12",
    "nan",
    "inf",
    "-inf",
    "true",
    "\"\"",
    "\"x\"",
    "\"max\"",
    "\"spin:1ms\"",
    "\"spin:0ms\"",
    "\"spin:99999999999h\"",
    "\"resnet18\"",
    "\"model.onnx\"",
    "\"cpu\"",
    "\"cuda\"",
    "\"mps\"",
    "\"green\"",
    "\"mig\"",
    "\"process\"",
    "\"fp16\"",
    "\"queue\"",
    "\"interferer\"",
    "\"victim\"",
    "[]",
    "[0, 1]",
    "[18446744073709551615]",
    "{}",
    "{ sms = 8 }",
    "{ thread_pct = 25, mem_limit_mib = 18446744073709551615 }",
    "{ mig_profile = \"1g.10gb\" }",
    "{ from_hz = 1, to_hz = 1e300, steps = 4294967295, step_s = 1e-300 }",
    "{ from_hz = nan, to_hz = 1, steps = 0, step_s = 1 }",
    "65536",
    "65537",
    "\"drop_oldest\"",
    "[4, 8]",
    "[8, 4]",
    "[1, 4294967295]",
    "{ batching = {} }",
    "{ queue_limit = 0, when_full = \"drop_oldest\", batching = { max_delay_ms = nan, preferred = \
     [0, 8, 4] } }",
];

fn config() -> ProptestConfig {
    isolane_core::fuzz::config(3000)
}

/// One byte-level change to a text.
#[derive(Debug, Clone)]
enum Mutation {
    Flip { at: usize, bit: u8 },
    Insert { at: usize, text: &'static str },
    Delete { at: usize, len: usize },
    Truncate { at: usize },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 0u8..8).prop_map(|(at, bit)| Mutation::Flip { at, bit }),
        (
            any::<usize>(),
            prop::sample::select(
                &[
                    "=",
                    "[",
                    "]",
                    "{",
                    "}",
                    "\"",
                    "\n",
                    "#",
                    ",",
                    ".",
                    "[[workload]]\n",
                    "e999",
                    "-",
                    "0x",
                    "\u{0}",
                    "é",
                ][..]
            )
        )
            .prop_map(|(at, text)| Mutation::Insert { at, text }),
        (any::<usize>(), 1usize..16).prop_map(|(at, len)| Mutation::Delete { at, len }),
        any::<usize>().prop_map(|at| Mutation::Truncate { at }),
    ]
}

fn apply(bytes: &mut Vec<u8>, m: &Mutation) {
    if bytes.is_empty() {
        return;
    }
    let n = bytes.len();
    match *m {
        Mutation::Flip { at, bit } => bytes[at % n] ^= 1 << bit,
        Mutation::Insert { at, text } => {
            let at = at % (n + 1);
            bytes.splice(at..at, text.bytes());
        }
        Mutation::Delete { at, len } => {
            let at = at % n;
            bytes.drain(at..(at + len).min(n));
        }
        Mutation::Truncate { at } => bytes.truncate(at % (n + 1)),
    }
}

/// `key = value` lines for a random subset of the parser's own `keys` and one key it does not
/// know, values from [`VALUES`].
fn table(keys: &[&'static str]) -> impl Strategy<Value = String> {
    let keys: Vec<&'static str> = keys.iter().copied().chain(["unknown_key"]).collect();
    let most = keys.len() + 1;
    prop::collection::vec(
        (prop::sample::select(keys), prop::sample::select(VALUES)),
        0..most,
    )
    .prop_map(|pairs| pairs.iter().map(|(k, v)| format!("{k} = {v}\n")).collect())
}

/// A workload's keys, then maybe its `[workload.serve]` and `[workload.serve.batching]` tables.
fn workload_tables() -> impl Strategy<Value = String> {
    (
        table(WORKLOAD_KEYS),
        prop::option::of(table(SERVE_KEYS)),
        prop::option::of(table(BATCHING_KEYS)),
    )
        .prop_map(|(w, serve, batching)| {
            let mut s = format!("[[workload]]\n{w}\n");
            if let Some(t) = serve {
                s += &format!("[workload.serve]\n{t}\n");
            }
            if let Some(t) = batching {
                s += &format!("[workload.serve.batching]\n{t}\n");
            }
            s
        })
}

fn assembled_scenario() -> impl Strategy<Value = String> {
    (
        table(DEVICE_KEYS),
        table(TIMING_KEYS),
        prop::collection::vec(workload_tables(), 0..4),
    )
        .prop_map(|(device, timing, workloads)| {
            format!(
                "[device]\n{device}\n[timing]\n{timing}\n{}",
                workloads.concat()
            )
        })
}

fn parse(text: &str) {
    let models = vec!["resnet18".to_string(), "mobilenet_v2".to_string()];
    if let Ok(s) = Scenario::from_toml_str(text, "fuzz.toml", &models) {
        // What parsed must also survive validation and a round trip.
        let _ = s.validate(&models);
        times_are_bounded(&s);
        serve_is_bounded(&s);
    }
}

/// Every accepted `[workload.serve]` is one a server can hold: a bounded queue, a finite
/// delay, and preferred batch sizes that a job of the workload's batch holds, in order.
fn serve_is_bounded(s: &Scenario) {
    for w in &s.workloads {
        let q = u64::from(w.serve.queue_limit);
        assert!((1..=MAX_QUEUE_LIMIT).contains(&q), "{}: queue {q}", w.name);
        let Some(b) = &w.serve.batching else { continue };
        assert!(
            (0.0..=MAX_BATCH_DELAY_MS).contains(&b.max_delay_ms),
            "{}: delay {}",
            w.name,
            b.max_delay_ms
        );
        let p = &b.preferred;
        assert!(
            p.iter().all(|&n| (1..=w.batch).contains(&n)) && p.windows(2).all(|x| x[0] < x[1]),
            "{}: preferred {p:?} at batch {}",
            w.name,
            w.batch
        );
    }
}

/// Every time an accepted scenario makes (a count × a period, a deadline, a phase) is at most
/// 100 days, so that the release loop's i64 nanoseconds cannot overflow (issue 31: `jobs = 2`
/// at `rate_hz = 1e-12` passed and overflowed).
fn times_are_bounded(s: &Scenario) {
    for w in &s.workloads {
        let (Rate::Hz(hz), None, true) = (w.rate, &w.program, w.role != Role::Interferer) else {
            continue;
        };
        let span_s = match w.length {
            RunLength::Jobs(n) => n as f64 / hz,
            RunLength::DurationS(d) => d.max(1.0 / hz),
        };
        assert!(span_s <= MAX_SECONDS, "{}: spans {span_s} s", w.name);
        let deadline_s = w.deadline_s().unwrap_or(0.0);
        assert!(
            deadline_s <= MAX_SECONDS,
            "{}: deadline {deadline_s} s",
            w.name
        );
        let phase_s = w.phase_ms.unwrap_or(0.0) / 1e3;
        assert!(phase_s <= MAX_SECONDS, "{}: phase {phase_s} s", w.name);
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn mutated_scenarios_never_panic(
        seed in prop::sample::select(SEEDS),
        mutations in prop::collection::vec(mutation(), 1..8),
    ) {
        let mut bytes = seed.as_bytes().to_vec();
        for m in &mutations {
            apply(&mut bytes, m);
        }
        parse(&String::from_utf8_lossy(&bytes));
    }

    #[test]
    fn assembled_scenarios_never_panic(text in assembled_scenario()) {
        parse(&text);
    }
}

/// Finished runs' summary.json files (a run of workloads, a run of apps), as seeds for the
/// results reader's target.
const SUMMARY_SEEDS: &[&str] = &[
    include_str!("../../isolane-report/tests/data/run-cpu/summary.json"),
    include_str!("../../isolane-report/tests/data/apps-cpu/summary.json"),
];

proptest! {
    #![proptest_config(isolane_core::fuzz::config(300))]

    /// The reader of summary.json (`compare`, `report`, `trace`, `plan --auto --stretch-from`):
    /// whatever a damaged file holds, a summary or an error naming the file, never a panic;
    /// what reads back also writes and reads again the same.
    #[test]
    fn fuzz_mutated_summaries_are_read_or_refused(
        seed in prop::sample::select(SUMMARY_SEEDS),
        mutations in prop::collection::vec(mutation(), 1..8),
    ) {
        use isolane_core::results::{read_json, write_json, RunSummary};
        let mut bytes = seed.as_bytes().to_vec();
        for m in &mutations {
            apply(&mut bytes, m);
        }
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("summary.json");
        std::fs::write(&path, &bytes).unwrap();
        match read_json::<RunSummary>(&path) {
            Ok(s) => {
                let _ = s.total_throughput_ips();
                write_json(&path, &s).unwrap();
                let again: RunSummary = read_json(&path).unwrap();
                prop_assert_eq!(
                    serde_json::to_value(&again).unwrap(),
                    serde_json::to_value(&s).unwrap()
                );
            }
            Err(e) => prop_assert!(e.to_string().contains("summary.json"), "{e}"),
        }
    }
}

/// The summary seeds read: the mutations start from valid files.
#[test]
fn the_summary_seeds_read() {
    let d = tempfile::tempdir().unwrap();
    for (i, s) in SUMMARY_SEEDS.iter().enumerate() {
        let path = d.path().join(format!("{i}.json"));
        std::fs::write(&path, s).unwrap();
        isolane_core::results::read_json::<isolane_core::results::RunSummary>(&path).unwrap();
    }
}

/// The seeds themselves parse: the mutations start from valid scenarios.
#[test]
fn the_seeds_are_valid_scenarios() {
    let models = vec!["resnet18".to_string(), "mobilenet_v2".to_string()];
    for s in SEEDS {
        Scenario::from_toml_str(s, "seed.toml", &models).unwrap();
    }
}
