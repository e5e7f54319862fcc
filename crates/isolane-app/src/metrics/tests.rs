use super::*;
use crate::spec::{parse_apps, ModelNames};

struct Models;
impl ModelNames for Models {
    fn is_builtin(&self, m: &str) -> bool {
        matches!(m, "mobilenet_v2" | "resnet18")
    }
    fn builtins(&self) -> Vec<String> {
        vec![]
    }
}

/// 5 frames at 100 Hz, 6 ms deadline, 1 frame dropped at each end: frames 1..4 measured.
fn app() -> AppSpec {
    let text = r#"
[[app]]
name = "a"
deadline_ms = 6
frames = 5
drop_frames = 1
[app.source]
kind = "synthetic"
width = 4
height = 4
fps = 100
[[app.stage]]
name = "pre"
kind = "preprocess"
size = [4, 4]
[[app.stage]]
name = "ens"
kind = "ensemble"
members = [{ name = "x", model = "mobilenet_v2" }, { name = "y", model = "resnet18" }]
[[app.stage]]
name = "out"
kind = "sink"
"#;
    parse_apps(text, std::path::Path::new("t.toml"), &Models)
        .unwrap()
        .remove(0)
}

const MS: i64 = 1_000_000;

fn rec(frame: u64, start: i64, end: i64, members: Vec<(i64, i64)>) -> StageRecord {
    StageRecord {
        frame,
        start_ns: Some(start * MS),
        end_ns: Some(end * MS),
        members: members.into_iter().map(|(s, e)| (s * MS, e * MS)).collect(),
        output: None,
        held_ns: 0,
        transfer: None,
    }
}

fn dropped(frame: u64) -> StageRecord {
    StageRecord {
        frame,
        start_ns: None,
        end_ns: None,
        members: vec![],
        output: None,
        held_ns: 0,
        transfer: None,
    }
}

/// Frame k released at 10k ms. Latencies: frame 1: 5 ms, frame 2: 8 ms (late: member y
/// answered last), frame 3: dropped by the ensemble; frames 0 and 4 are outside the metrics.
fn records() -> AppRecords {
    let pre = (0..5)
        .map(|k| rec(k, 10 * k as i64, 10 * k as i64 + 1, vec![]))
        .collect();
    let ens = vec![
        rec(0, 1, 2, vec![(1, 2), (1, 2)]),
        rec(1, 11, 14, vec![(11, 13), (11, 12)]),
        rec(2, 21, 27, vec![(21, 22), (21, 26)]),
        dropped(3),
        rec(4, 41, 42, vec![(41, 42), (41, 42)]),
    ];
    let mut sink = vec![
        rec(0, 2, 3, vec![]),
        rec(1, 14, 15, vec![]),
        rec(2, 27, 28, vec![]),
        dropped(3),
        rec(4, 42, 43, vec![]),
    ];
    sink[0].output = Some("class 1 score 0.500".into());
    AppRecords {
        release_ns: (0..5).map(|k| 10 * k * MS).collect(),
        sent_ns: (0..5).map(|k| 10 * k * MS).collect(),
        stages: vec![pre, ens, sink],
        error: None,
    }
}

#[test]
fn end_to_end_by_hand() {
    let s = summarize(&app(), &records(), &|m| format!("p:{m}"));
    assert_eq!((s.frames, s.dropped_first, s.dropped_last), (5, 1, 1));
    let e = &s.end_to_end;
    assert_eq!((e.jobs, e.completed, e.timeouts), (3, 2, 2));
    let l = &e.latency_ms;
    assert_eq!(l.mean, Some(6.5));
    assert_eq!(l.max, Some(8.0));
    assert_eq!(l.min, Some(5.0));
    // sample std of {5, 8}: sqrt(4.5)
    assert!((l.std.unwrap() - 4.5f64.sqrt()).abs() < 1e-9);
    assert!((l.tail.unwrap() - (l.max.unwrap() - l.p95.unwrap())).abs() < 1e-9);
    // 3 frames over 10 ms periods: 2 completed / 0.03 s
    assert!((e.throughput_ips - 2.0 / 0.03).abs() < 1e-6);
}

#[test]
fn stages_and_members_by_hand() {
    let s = summarize(&app(), &records(), &|m| format!("p:{m}"));
    let [pre, ens, sink] = &s.stages[..] else {
        panic!()
    };
    assert_eq!(
        (pre.kind.as_str(), pre.partition.as_str()),
        ("preprocess", "cpu")
    );
    assert_eq!((pre.processed, pre.skipped), (3, 0));
    assert_eq!(pre.latency_ms.mean, Some(1.0));
    // the ensemble's own time: 3 and 6 ms; frame 3 skipped
    assert_eq!((ens.processed, ens.skipped), (2, 1));
    assert_eq!(ens.latency_ms.mean, Some(4.5));
    assert_eq!(sink.processed, 2);
    let [x, y] = &ens.members[..] else { panic!() };
    assert_eq!(
        (x.partition.as_str(), y.model.as_str()),
        ("p:ens.x", "resnet18")
    );
    // x: 2 and 1 ms; y: 1 and 5 ms
    assert_eq!(x.latency_ms.mean, Some(1.5));
    assert_eq!(y.latency_ms.max, Some(5.0));
    // frame 2's vote ended at 27 ms, 7 ms after its release (> 6): y answered last
    assert_eq!((x.made_late, y.made_late), (0, 1));
}

#[test]
fn csv_round_trips_the_measured_latencies() {
    let csv = frames_csv(&app(), &records());
    let mut lines = csv.lines();
    assert_eq!(
        lines.next().unwrap(),
        "frame,release_ms,sent_ms,end_ms,latency_ms,timeout,measured,held_ms,transfer_ms,pre_ms,ens_ms,out_ms,\
         pre.start_ms,ens.start_ms,out.start_ms,output"
    );
    assert_eq!(
        lines.next().unwrap(),
        "0,0.000000,0.000000,3.000000,3.000000,0,0,0.000000,0.000000,1.000000,1.000000,1.000000,\
         0.000000,1.000000,2.000000,class 1 score 0.500"
    );
    assert_eq!(
        lines.nth(2).unwrap(),
        "3,30.000000,30.000000,,,1,1,0.000000,0.000000,1.000000,,,30.000000,,,"
    );
    assert_eq!(latencies_from_csv(&csv).unwrap(), vec![5.0, 8.0]);
    assert!(latencies_from_csv("a,b\n1,2\n")
        .unwrap_err()
        .contains("latency_ms"));
}

#[test]
fn mann_whitney_of_two_runs() {
    // completely separated samples of 3: exact two-sided p = 2/20
    let r = compare(&[1.0, 2.0, 3.0], &[4.0, 5.0, 6.0]).unwrap();
    assert_eq!(r.u, 0.0);
    assert!((r.p_value - 0.1).abs() < 1e-9, "{r:?}");
    assert!(compare(&[], &[1.0]).is_err());
}

/// The source's own lateness over the measured frames (1, 2, 3 of 5): its hand-over minus the
/// scheduled release; a warning only when its p99 exceeds a quarter of the period.
#[test]
fn the_sources_lateness_is_recorded_and_warned_about() {
    let mut r = records();
    r.sent_ns = vec![0, 10 * MS + MS / 2, 20 * MS, 30 * MS + 3 * MS, 40 * MS];
    let s = summarize(&app(), &r, &|m| format!("p:{m}"));
    let late = s.source_late_ms.as_ref().expect("hand-over times recorded");
    assert_eq!((late.min, late.max), (Some(0.0), Some(3.0)));
    // 100 fps: 3 ms late is over a quarter of the 10 ms period.
    let warning = late_source_warning(&s).expect("a warning");
    assert!(
        warning.contains("p99 3.0 ms") && warning.contains("period of 10.0 ms"),
        "{warning}"
    );
    // On time: nothing to say.
    let on_time = summarize(&app(), &records(), &|m| format!("p:{m}"));
    assert_eq!(on_time.source_late_ms.as_ref().unwrap().max, Some(0.0));
    assert_eq!(late_source_warning(&on_time), None);
    // Records without hand-over times (an older worker): no statistic.
    let mut none = records();
    none.sent_ns.clear();
    assert_eq!(
        summarize(&app(), &none, &|m| format!("p:{m}")).source_late_ms,
        None
    );
}

#[test]
fn a_best_effort_apps_holds_are_summed_per_frame() {
    let mut app = app();
    let mut r = records();
    // Unheld: no `held` even for a best-effort app; a critical app never has one.
    assert_eq!(summarize(&app, &r, &|m| m.to_string()).held, None);
    app.criticality = Criticality::BestEffort;
    assert_eq!(summarize(&app, &r, &|m| m.to_string()).held, None);
    // Frame 1 held 2 ms before the ensemble, frame 2 0.5 ms; frame 0 (not measured) 9 ms.
    r.stages[1][1].held_ns = 2 * MS;
    r.stages[1][2].held_ns = MS / 2;
    r.stages[1][0].held_ns = 9 * MS;
    let s = summarize(&app, &r, &|m| m.to_string());
    assert_eq!(s.criticality, Criticality::BestEffort);
    let h = s.held.expect("held");
    // One held stage (the ensemble; the preprocess runs on the CPU).
    assert_eq!((h.pieces, h.jobs_held), (1, 2));
    assert!((h.total_ms - 2.5).abs() < 1e-9 && (h.max_ms - 2.0).abs() < 1e-9);
    let csv = frames_csv(&app, &r);
    let row = |k: usize| {
        csv.lines()
            .nth(k + 1)
            .unwrap()
            .split(',')
            .nth(7)
            .unwrap()
            .to_string()
    };
    assert_eq!(
        (row(0), row(1), row(3)),
        ("9.000000".into(), "2.000000".into(), "0.000000".into())
    );
}
