use super::*;
use std::path::Path;

/// Every results file committed under results/ (the H100 studies and engine runs) and the
/// report's samples (written by earlier versions, CPU and GPU).
fn committed(name: &str) -> Vec<PathBuf> {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = Vec::new();
    let mut stack = vec![
        here.join("../../results"),
        here.join("../isolane-report/tests/data"),
    ];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.file_name().is_some_and(|n| n == name) {
                found.push(p);
            }
        }
    }
    found.sort();
    found
}

fn loads_all<T: serde::de::DeserializeOwned + Versioned + serde::Serialize>(name: &str) -> usize {
    let files = committed(name);
    for f in &files {
        let v: T = read_json(f).unwrap_or_else(|e| panic!("{e}"));
        assert!(v.schema_version() <= SCHEMA_VERSION);
        // No field is lost on the way: written back, it holds all of the file.
        let original: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(f).unwrap()).unwrap();
        let again = serde_json::to_value(&v).unwrap();
        if let Some(d) = first_difference(&original, &again, String::new()) {
            panic!("{}: {d}", f.display());
        }
    }
    files.len()
}

/// Where `b` lost or changed something of `a` (a JSON path): every key of `a` must be in `b`
/// with the same value (an absent key counts as `null`); `b` may add keys (defaults of fields
/// a legacy file did not have).
fn first_difference(a: &serde_json::Value, b: &serde_json::Value, at: String) -> Option<String> {
    use serde_json::Value;
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => x.iter().find_map(|(k, v)| {
            let null = Value::Null;
            first_difference(v, y.get(k).unwrap_or(&null), format!("{at}.{k}"))
        }),
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .find_map(|(i, (p, q))| first_difference(p, q, format!("{at}[{i}]"))),
        (Value::Number(x), Value::Number(y)) if x.as_f64() == y.as_f64() => None,
        _ if a == b => None,
        _ => Some(format!("{at}: {a} vs {b}")),
    }
}

#[test]
fn the_committed_results_folders_still_load() {
    assert!(loads_all::<RunSummary>("summary.json") > 50);
    assert!(loads_all::<MaxrateReport>("maxrate.json") > 10);
    assert!(loads_all::<SweepIndex>("sweep.json") > 2);
    // results/h100-interference: the matrix and its four front-end repeats (issue 14).
    assert!(loads_all::<super::InterferenceIndex>("interference.json") >= 5);
    for f in committed("isolation.csv") {
        let rows = read_isolation_csv(&f).unwrap_or_else(|e| panic!("{e}"));
        assert!(!rows.is_empty(), "{}", f.display());
    }
}

#[test]
fn an_old_summary_reads_as_version_1_and_keeps_its_isolation_steps() {
    let files = committed("summary.json");
    let iso = files
        .iter()
        .find(|f| f.to_string_lossy().contains("isolation"))
        .expect("an isolation summary under results/");
    let s: RunSummary = read_json(iso).unwrap();
    assert_eq!(s.schema_version, 1);
    let steps = s.isolation.expect("isolation steps");
    assert!(steps.step_s > 0.0 && !steps.steps.is_empty());
}

#[test]
fn a_file_from_a_newer_schema_is_refused_by_name() {
    let d = tempfile::tempdir().unwrap();
    let f = committed("maxrate.json").into_iter().next().unwrap();
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(f).unwrap()).unwrap();
    v["schema_version"] = (SCHEMA_VERSION + 1).into();
    let p = d.path().join("maxrate.json");
    std::fs::write(&p, v.to_string()).unwrap();
    let e = read_json::<MaxrateReport>(&p).unwrap_err().to_string();
    assert!(
        e.contains("maxrate.json") && e.contains("newer isolane"),
        "{e}"
    );
}

#[test]
fn a_missing_field_is_named() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("summary.json");
    std::fs::write(&p, r#"{"isolane_version": "0.1.0"}"#).unwrap();
    let e = read_json::<RunSummary>(&p).unwrap_err().to_string();
    assert!(e.contains("summary.json") && e.contains("command"), "{e}");
}

/// A summary edited by hand (a negative job count, a string for a rate) was refused with only
/// serde_json's line and column: in a one-line summary, "line 1 column 876". The field is
/// named first; inside a flattened part (a workload's metrics) serde tracks no deeper than
/// the object that holds it, which is named.
#[test]
fn a_wrong_value_is_refused_naming_its_field() {
    let d = tempfile::tempdir().unwrap();
    let f = committed("summary.json").into_iter().next().unwrap();
    let good: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(f).unwrap()).unwrap();
    assert!(good["workloads"].as_array().is_some_and(|w| !w.is_empty()));
    let p = d.path().join("summary.json");
    for (field, value, named) in [
        (
            "jobs",
            serde_json::json!(-5),
            "workloads[0]: invalid value: integer `-5`",
        ),
        (
            "rate_hz",
            serde_json::json!("fast"),
            "workloads[0].rate_hz: invalid type",
        ),
    ] {
        let mut v = good.clone();
        v["workloads"][0][field] = value;
        std::fs::write(&p, v.to_string()).unwrap();
        let e = read_json::<RunSummary>(&p).unwrap_err().to_string();
        assert!(e.starts_with(&format!("{}: {named}", p.display())), "{e}");
    }
    // What serde_json refuses after the value is still refused.
    std::fs::write(&p, format!("{good} x")).unwrap();
    let e = read_json::<RunSummary>(&p).unwrap_err().to_string();
    assert!(e.contains("trailing characters"), "{e}");
}

#[test]
fn isolation_csv_round_trips_through_the_reader() {
    let d = tempfile::tempdir().unwrap();
    let metrics = crate::metrics::workload_metrics(&[], 1, 1.0, None);
    let steps = vec![StepResult {
        step: 3,
        start_s: 3.0,
        interferer_rates_hz: vec![("i".into(), 40.0)],
        interferer_rate_hz: 40.0,
        victims: vec![VictimStep {
            victim: "v".into(),
            metrics,
        }],
    }];
    let p = d.path().join("isolation.csv");
    std::fs::write(&p, isolation_csv(&steps)).unwrap();
    let rows = read_isolation_csv(&p).unwrap();
    assert_eq!(
        rows,
        vec![IsolationRow {
            step: 3,
            interferer_rate_hz: 40.0,
            victim: "v".into(),
            timeout_pct: 0.0
        }]
    );
    std::fs::write(&p, "step,interferer_rate_hz,victim,timeout_pct\n1,x,v,0\n").unwrap();
    let e = read_isolation_csv(&p).unwrap_err().to_string();
    assert!(
        e.contains("line 2") && e.contains("interferer_rate_hz"),
        "{e}"
    );
}

/// summary.json's `apps` round-trips, is left out when there are none, and a summary written
/// before apps existed reads with none.
#[test]
fn apps_round_trip_and_are_optional() {
    let metrics = crate::metrics::workload_metrics(&[], 1, 1.0, Some(1));
    let stats = metrics.latency_ms.clone();
    let mut s = RunSummary::new("run");
    assert!(!serde_json::to_string(&s).unwrap().contains("\"apps\""));
    s.apps.push(AppSummary {
        name: "a".into(),
        deadline_ms: 5.0,
        rate_hz: 30.0,
        source: "synthetic 8x8".into(),
        frames: 30,
        dropped_first: 10,
        dropped_last: 10,
        end_to_end: metrics,
        source_late_ms: Some(stats.clone()),
        stages: vec![StageSummary {
            name: "e".into(),
            kind: "ensemble".into(),
            partition: "cpu".into(),
            processed: 9,
            skipped: 1,
            latency_ms: stats.clone(),
            members: vec![MemberSummary {
                name: "e.m".into(),
                model: "resnet18".into(),
                partition: "green 8 SMs".into(),
                latency_ms: stats.clone(),
                made_late: 1,
            }],
            transfer: Some(super::TransferSummary {
                links: vec![crate::app_records::Link::Peer],
                latency_ms: stats,
            }),
        }],
        criticality: crate::spec::Criticality::BestEffort,
        held: Some(HeldSummary {
            pieces: 2,
            total_ms: 3.5,
            jobs_held: 4,
            max_ms: 1.25,
        }),
    });
    let text = serde_json::to_string(&s).unwrap();
    let back: RunSummary = serde_json::from_str(&text).unwrap();
    assert_eq!(back, s);
    let mut old: serde_json::Value = serde_json::from_str(&text).unwrap();
    old.as_object_mut().unwrap().remove("apps");
    let back: RunSummary = serde_json::from_value(old).unwrap();
    assert!(back.apps.is_empty());
}

#[test]
fn app_csv_latencies_are_the_measured_completed_frames() {
    let csv = format!(
        "{APP_CSV_COLUMNS},pre_ms\n0,0,0,3,3,0,0,0,1\n1,10,10,15,5,0,1,0,1\n2,20,20,,,1,1,0,\n3,30,30,37,7,1,1,0.5,1\n"
    );
    assert_eq!(app_latencies_from_csv(&csv).unwrap(), vec![5.0, 7.0]);
    let bad = format!("{APP_CSV_COLUMNS}\n0,0,0,1,x,0,1,0\n");
    assert!(app_latencies_from_csv(&bad).unwrap_err().contains("row 2"));
}

fn coexec_cell(reason: Option<&str>) -> CoexecCell {
    CoexecCell {
        a: "a,1".into(),
        b: "b".into(),
        mechanism: "mps".into(),
        dir: "pairs/a,1+b/mps".into(),
        status: "skipped".into(),
        reason: reason.map(str::to_string),
        class: PairClass::Mixed,
        partition_a: Some("50 %".into()),
        partition_b: None,
        m: CellMetrics {
            speedup: Some(1.25),
            ..CellMetrics::default()
        },
    }
}

#[test]
fn coexec_csv_quotes_text_and_leaves_absent_values_empty() {
    let csv = coexec_csv(&[coexec_cell(Some("admission: \"x\", y"))]);
    let mut lines = csv.lines();
    assert_eq!(lines.next(), Some(COEXEC_CSV_HEADER));
    assert_eq!(
        lines.next().unwrap(),
        "\"a,1\",b,mps,skipped,mixed,50 %,,,,,,1.250000,,,,,,\"admission: \"\"x\"\", y\",\
         \"pairs/a,1+b/mps\""
    );
    assert_eq!(COEXEC_CSV_HEADER.split(',').count(), 19);
}

#[test]
fn coexec_index_round_trips_with_flattened_metrics() {
    let index = CoexecIndex {
        schema_version: SCHEMA_VERSION,
        isolane_version: "0".into(),
        jobs_file: "jobs.toml".into(),
        backend: "cpu".into(),
        mechanisms: vec!["none".into()],
        thresholds: IntensityThresholds {
            dram_bw_util_pct: 40.0,
            flop_per_byte: 4.0,
        },
        energy_note: None,
        jobs: Vec::new(),
        cells: vec![coexec_cell(None)],
    };
    let text = serde_json::to_string(&index).unwrap();
    // The metrics sit in the cell itself, as the CSV's columns do; absent ones are left out.
    assert!(text.contains("\"speedup\":1.25") && !text.contains("\"m\""));
    assert!(!text.contains("makespan_s") && !text.contains("energy_note"));
    let back: CoexecIndex = serde_json::from_str(&text).unwrap();
    assert_eq!(back, index);
}
