//! The trace file against the trace-event format (the "JSON Object Format" of Google's Trace
//! Event Format document that chrome://tracing and ui.perfetto.dev read), checked by a
//! validator written from that document rather than from the writer: the fields every event
//! needs, what each phase needs, µs timestamps, sorting.

use std::collections::BTreeSet;
use std::path::Path;

use isolane_core::results::{
    write_json, IsolationSteps, PartitionRecord, RunSummary, StepResult, WorkloadSummary,
};
use isolane_core::spec::Mechanism;
use serde_json::Value;

/// Every problem found, one line each (empty: valid).
fn violations(doc: &Value) -> Vec<String> {
    let mut bad = Vec::new();
    let Some(events) = doc["traceEvents"].as_array() else {
        return vec!["no traceEvents array".into()];
    };
    let mut last_ts = f64::NEG_INFINITY;
    let mut seen_non_meta = false;
    for (i, e) in events.iter().enumerate() {
        let mut why = |w: &str| bad.push(format!("event {i}: {w}: {e}"));
        for f in ["ph", "name"] {
            if !e[f].is_string() {
                why(&format!("`{f}` is not a string"));
            }
        }
        for f in ["pid", "tid"] {
            if !e[f].is_u64() {
                why(&format!("`{f}` is not an integer"));
            }
        }
        let Some(ts) = e["ts"].as_f64() else {
            why("`ts` is not a number");
            continue;
        };
        if ts < 0.0 {
            why("negative ts");
        }
        match e["ph"].as_str().unwrap_or_default() {
            "M" => {
                if seen_non_meta {
                    why("metadata after other events");
                }
                let name = e["name"].as_str().unwrap_or_default();
                match name {
                    "process_name" | "thread_name" => {
                        if !e["args"]["name"].is_string() {
                            why("a name event without args.name");
                        }
                    }
                    "process_sort_index" | "thread_sort_index" => {
                        if !e["args"]["sort_index"].is_i64() {
                            why("a sort index without args.sort_index");
                        }
                    }
                    _ => why("unknown metadata event"),
                }
                continue;
            }
            "X" => match e["dur"].as_f64() {
                Some(d) if d >= 0.0 => {}
                _ => why("an X event without a non-negative dur"),
            },
            "C" => match e["args"].as_object() {
                Some(a) if !a.is_empty() && a.values().all(Value::is_number) => {}
                _ => why("a counter without numeric args"),
            },
            "i" | "I" => {
                if !matches!(e["s"].as_str(), None | Some("g" | "p" | "t")) {
                    why("an instant with a scope other than g, p, t");
                }
            }
            other => why(&format!("phase `{other}` is not written by isolane")),
        }
        seen_non_meta = true;
        if ts < last_ts {
            why("not sorted by ts");
        }
        last_ts = ts;
    }
    bad
}

fn job_rows(rows: &[&str]) -> String {
    let mut s = "job,release_ms,start_ms,end_ms,latency_ms,timeout,held_ns\n".to_string();
    for r in rows {
        s.push_str(r);
        s.push('\n');
    }
    s
}

/// An isolation folder of two workloads with every kind of event: jobs on time and late, a
/// skipped job, a held job, a partition, two steps and telemetry before and after t0.
fn sample(dir: &Path) {
    let mut s = RunSummary::new("isolation");
    s.wall_s = 0.02;
    let mut v = WorkloadSummary::new("victim", "resnet18", 1);
    v.deadline_ms = Some(5.0);
    s.workloads = vec![v, WorkloadSummary::new("noisy", "spin:3ms", 1)];
    s.partitions = vec![PartitionRecord {
        workload: "victim".into(),
        mechanism: Mechanism::Green,
        partition: "green 64 SMs".into(),
        granted_sms: Some(64),
        mig_device: None,
        mps_pipe_dir: None,
    }];
    s.isolation = Some(IsolationSteps {
        step_s: 0.01,
        steps: (0..2)
            .map(|k| StepResult {
                step: k,
                start_s: f64::from(k) * 0.01,
                interferer_rates_hz: vec![("noisy".into(), 100.0)],
                interferer_rate_hz: 100.0 * f64::from(k + 1),
                victims: Vec::new(),
            })
            .collect(),
    });
    write_json(&dir.join("summary.json"), &s).unwrap();
    std::fs::create_dir(dir.join("jobs")).unwrap();
    std::fs::write(
        dir.join("jobs/victim.csv"),
        job_rows(&[
            "0,0.000000,0.010000,4.000000,4.000000,0,",
            "1,5.000000,5.001000,11.000000,6.000000,1,",
            "2,10.000000,,,,1,",
            "3,15.000000,16.000000,17.000000,2.000000,0,1000000",
        ]),
    )
    .unwrap();
    std::fs::write(
        dir.join("jobs/noisy.csv"),
        job_rows(&["0,0.000000,0.000500,3.000000,3.000000,0,0"]),
    )
    .unwrap();
    std::fs::write(
        dir.join("telemetry.csv"),
        "t_s,power_w,throttle_reasons,sm_clock_mhz\n-0.050,100.5,,1980\n0.000,300,,1980\n\
         0.050,310,sw_power_cap,1755\n",
    )
    .unwrap();
}

fn trace_of(dir: &Path) -> Value {
    let out = dir.join("trace.json");
    isolane_trace::write_trace(dir, &out, None).unwrap();
    serde_json::from_str(&std::fs::read_to_string(out).unwrap()).unwrap()
}

fn named<'a>(doc: &'a Value, name: &str) -> Vec<&'a Value> {
    doc["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["name"] == name)
        .collect()
}

#[test]
fn a_sample_run_is_a_valid_trace_with_every_kind_of_event() {
    let d = tempfile::tempdir().unwrap();
    sample(d.path());
    let doc = trace_of(d.path());
    assert_eq!(violations(&doc), Vec::<String>::new());

    // Telemetry 50 ms before t0 starts the trace: t0 is at 50 000 µs.
    assert_eq!(doc["otherData"]["t0_us"], 50_000.0);
    let jobs = named(&doc, "job");
    assert_eq!(jobs.len(), 3, "two on-time victim jobs and the noisy one");
    let first = jobs.iter().find(|e| e["args"]["job"] == 0 && e["tid"] == 1);
    let first = first.unwrap();
    assert_eq!(first["ts"], 50_010.0, "start in µs");
    assert_eq!(first["dur"], 3_990.0);
    let late = named(&doc, "job (timeout)");
    assert_eq!(late.len(), 1);
    assert_eq!(late[0]["cat"], "job,timeout");
    let skipped = named(&doc, "skipped");
    assert_eq!(skipped.len(), 1);
    assert_eq!(skipped[0]["ts"], 60_000.0, "at its release");
    assert_eq!(named(&doc, "release").len(), 5);

    // The hold: from the release, for held_ns, on the workload's own hold track.
    let held = named(&doc, "held");
    assert_eq!(held.len(), 1);
    assert_eq!(held[0]["cat"], "hold");
    assert_eq!(
        (held[0]["ts"].clone(), held[0]["dur"].clone()),
        (65_000.0.into(), 1_000.0.into())
    );
    let threads: BTreeSet<String> = named(&doc, "thread_name")
        .iter()
        .map(|e| e["args"]["name"].as_str().unwrap().to_string())
        .collect();
    for t in [
        "victim (resnet18)",
        "noisy (spin:3ms)",
        "victim: held",
        "partitions",
    ] {
        assert!(threads.contains(t), "no track {t}: {threads:?}");
    }
    assert!(
        !threads.contains("noisy: held"),
        "a zero hold makes no track"
    );

    let partition = named(&doc, "partition set-up: victim: green 64 SMs");
    assert_eq!(partition[0]["args"]["granted_sms"], 64);
    let steps: Vec<&Value> = doc["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["cat"] == "step")
        .collect();
    assert_eq!(steps.len(), 2);
    assert_eq!(steps[1]["ts"], 60_000.0);
    assert_eq!(steps[1]["dur"], 10_000.0);

    let power = named(&doc, "power_w");
    assert_eq!(power.len(), 3);
    assert_eq!(power[0]["ph"], "C");
    assert_eq!(power[0]["ts"], 0.0);
    assert!(
        named(&doc, "throttle_reasons").is_empty(),
        "text is no counter"
    );
}

#[test]
fn the_validator_rejects_what_viewers_reject() {
    let bad = serde_json::json!({"traceEvents": [
        {"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 5.0},
        {"ph": "C", "name": "c", "pid": 1, "tid": 1, "ts": 1.0, "args": {"v": "x"}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "ts": 0, "args": {}},
    ]});
    let v = violations(&bad);
    assert!(
        v.iter().any(|l| l.contains("without a non-negative dur")),
        "{v:?}"
    );
    assert!(v.iter().any(|l| l.contains("numeric args")), "{v:?}");
    assert!(v.iter().any(|l| l.contains("not sorted")), "{v:?}");
    assert!(v.iter().any(|l| l.contains("metadata after")), "{v:?}");
}

/// A real 2-workload isolation run of the H100 (green contexts, resnet18): what Perfetto is
/// to show, read from the committed results.
#[test]
fn a_committed_h100_isolation_run_traces_jobs_steps_and_telemetry() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../results/h100/b-isolation-2/resnet18-green-2w");
    let out = tempfile::tempdir().unwrap();
    let path = out.path().join("trace.json");
    let t = isolane_trace::timeline::Timeline::load(&dir).unwrap();
    std::fs::write(&path, isolane_trace::chrome::trace_json(&t)).unwrap();
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(violations(&doc), Vec::<String>::new());
    let lanes: Vec<&str> = t.lanes.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(lanes, ["victim", "interferer"]);
    let jobs: usize = t.lanes.iter().map(|l| l.jobs.len()).sum();
    assert_eq!(jobs, 4780 + 2394);
    assert_eq!(t.steps.len(), 5);
    for c in ["power_w", "sm_clock_mhz", "sm_util_pct", "dram_bw_util_pct"] {
        assert!(t.counters.iter().any(|x| x.name == c), "no {c} counter");
    }
    assert_eq!(t.partitions.len(), 2);
}
