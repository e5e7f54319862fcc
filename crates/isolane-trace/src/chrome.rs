//! A [`Timeline`] as a Chrome trace-event file (the JSON object format that ui.perfetto.dev
//! and chrome://tracing open): one process per kind of track, `ts` and `dur` in µs, every
//! event sorted by `ts` after the metadata that names the processes and threads.
//!
//! | pid | process | threads (tracks) |
//! | --- | --- | --- |
//! | 1 | workloads | one per workload: each job an `X` span from its start to its end (`cat` `job`, or `job,timeout` for a missed deadline), its release an instant; a skipped job an instant `skipped` |
//! | 1 | workloads | a command workload's track: one `X` span (`cat` `program`) from its program's start to its end, named by how it ended |
//! | 1 | workloads | `<workload>: held`, when the jobs CSV has the guard's holds (`held_ms`): an `X` span `held` (`cat` `hold`) as long as the job's total hold, from its release (the CSV keeps the sum, not where the pauses fell) |
//! | 1 | apps (a run of `[[app]]`s) | one per app: each frame an `X` span `frame` (`cat` `frame`, or `frame,timeout`) from its release to the sink's end, its release and its deadline instants, a frame dropped on the way an instant `dropped`; then one per stage, `<app>/<stage>`: each frame it ran an `X` span named after the track (`cat` `stage`), one it did not run an instant `skipped`; the app's holds as a workload's |
//! | 2 | run | `partitions`: an instant per workload's partition, at the start of the trace (set up before t0), and `t0`; `isolation steps`: an `X` span per step of the ramp |
//! | 3 | device telemetry | a counter track (`C`) per numeric telemetry.csv column |
//!
//! The trace starts at the earliest event (telemetry samples precede t0): ts 0 is that, and
//! `otherData.t0_us` says where t0 is.

use serde::Serialize;
use serde_json::{json, Value};

use crate::timeline::{Job, Lane, LaneKind, Timeline};

const PID_WORKLOADS: u32 = 1;
const PID_RUN: u32 = 2;
const PID_TELEMETRY: u32 = 3;
const TID_PARTITIONS: u32 = 1;
const TID_STEPS: u32 = 2;
/// Hold tracks come after every workload's own track.
const TID_HELD_BASE: u32 = 10_000;

/// One trace event. `ts`/`dur` in µs.
#[derive(Debug, Clone, Serialize)]
struct Event {
    name: String,
    #[serde(skip_serializing_if = "str::is_empty")]
    cat: &'static str,
    ph: &'static str,
    ts: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    dur: Option<f64>,
    pid: u32,
    tid: u32,
    /// Scope of an instant event: `g` global, `p` process, `t` thread.
    #[serde(skip_serializing_if = "Option::is_none")]
    s: Option<&'static str>,
    /// chrome://tracing's colour name (Perfetto colours by name).
    #[serde(skip_serializing_if = "Option::is_none")]
    cname: Option<&'static str>,
    #[serde(skip_serializing_if = "Value::is_null")]
    args: Value,
}

/// ms since t0 → µs since the trace's origin, rounded to the ns the CSVs hold.
struct Clock {
    origin_ms: f64,
}

impl Clock {
    fn us(&self, ms: f64) -> f64 {
        ((ms - self.origin_ms) * 1e6).round() / 1e3
    }

    fn dur(from_ms: f64, to_ms: f64) -> f64 {
        ((to_ms - from_ms).max(0.0) * 1e6).round() / 1e3
    }
}

fn event(name: impl Into<String>, ph: &'static str, ts: f64, pid: u32, tid: u32) -> Event {
    Event {
        name: name.into(),
        cat: "",
        ph,
        ts,
        dur: None,
        pid,
        tid,
        s: None,
        cname: None,
        args: Value::Null,
    }
}

fn metadata(kind: &'static str, pid: u32, tid: u32, args: Value) -> Event {
    Event {
        args,
        ..event(kind, "M", 0.0, pid, tid)
    }
}

/// The earliest time (ms since t0) anything happened: t0 itself, or an earlier sample.
fn origin_ms(t: &Timeline) -> f64 {
    let jobs = t
        .lanes
        .iter()
        .flat_map(|l| l.jobs.first())
        .map(|j| j.release_ms);
    let samples = t
        .counters
        .iter()
        .flat_map(|c| c.points.first())
        .map(|p| p.0);
    jobs.chain(samples).fold(0.0, f64::min)
}

/// The trace of `t` as a JSON document.
pub fn trace_json(t: &Timeline) -> String {
    let clock = Clock {
        origin_ms: origin_ms(t),
    };
    let mut meta = names(t);
    let mut events = Vec::new();
    for (i, lane) in t.lanes.iter().enumerate() {
        let tid = i as u32 + 1;
        for job in &lane.jobs {
            match lane.kind {
                LaneKind::Workload => job_events(&clock, job, tid, lane.deadline_ms, &mut events),
                LaneKind::App => frame_events(&clock, job, tid, lane, &mut events),
                LaneKind::Stage => stage_events(&clock, job, tid, lane, &mut events),
            }
        }
        if let Some(p) = &lane.program {
            events.push(Event {
                cat: "program",
                dur: Some(Clock::dur(p.start_ms, p.end_ms)),
                args: json!({ "command": lane.model, "ended": p.ended, "exit_code": p.exit_code }),
                ..event(
                    format!("{}: {}", lane.name, p.ended),
                    "X",
                    clock.us(p.start_ms),
                    PID_WORKLOADS,
                    tid,
                )
            });
        }
        if lane.jobs.iter().any(|j| j.held_ms.is_some_and(|h| h > 0.0)) {
            meta.push(metadata(
                "thread_name",
                PID_WORKLOADS,
                TID_HELD_BASE + tid,
                json!({ "name": format!("{}: held", lane.name) }),
            ));
            // Right under its workload's track.
            meta.push(metadata(
                "thread_sort_index",
                PID_WORKLOADS,
                TID_HELD_BASE + tid,
                json!({ "sort_index": 2 * tid + 1 }),
            ));
        }
    }
    run_events(&clock, t, &mut events);
    for c in &t.counters {
        for &(ms, v) in &c.points {
            events.push(Event {
                args: json!({ "value": v }),
                ..event(c.name.clone(), "C", clock.us(ms), PID_TELEMETRY, 0)
            });
        }
    }
    // Stable: events of one instant keep their order (a release before its job's span).
    events.sort_by(|a, b| a.ts.total_cmp(&b.ts));
    meta.extend(events);
    let doc = json!({
        "traceEvents": meta,
        "displayTimeUnit": "ms",
        "otherData": {
            "generator": concat!("isolane ", env!("CARGO_PKG_VERSION")),
            "results": t.dir.display().to_string(),
            "command": t.command,
            "t0_us": clock.us(0.0),
        },
    });
    // A Value of plain numbers and strings always serialises.
    serde_json::to_string(&doc).unwrap_or_default()
}

/// `M` events: the processes and each workload's thread, in the scenario's order.
fn names(t: &Timeline) -> Vec<Event> {
    let apps = t.lanes.iter().any(|l| l.kind != LaneKind::Workload);
    let mut m = vec![
        metadata(
            "process_name",
            PID_WORKLOADS,
            0,
            json!({"name": if apps { "apps" } else { "workloads" }}),
        ),
        metadata(
            "process_sort_index",
            PID_WORKLOADS,
            0,
            json!({"sort_index": 1}),
        ),
        metadata("process_name", PID_RUN, 0, json!({"name": "run"})),
        metadata("process_sort_index", PID_RUN, 0, json!({"sort_index": 2})),
        metadata(
            "thread_name",
            PID_RUN,
            TID_PARTITIONS,
            json!({"name": "partitions"}),
        ),
    ];
    if !t.steps.is_empty() {
        m.push(metadata(
            "thread_name",
            PID_RUN,
            TID_STEPS,
            json!({"name": "isolation steps"}),
        ));
    }
    if !t.counters.is_empty() {
        m.push(metadata(
            "process_name",
            PID_TELEMETRY,
            0,
            json!({"name": "device telemetry"}),
        ));
        m.push(metadata(
            "process_sort_index",
            PID_TELEMETRY,
            0,
            json!({"sort_index": 3}),
        ));
    }
    for (i, lane) in t.lanes.iter().enumerate() {
        let tid = i as u32 + 1;
        m.push(metadata(
            "thread_name",
            PID_WORKLOADS,
            tid,
            json!({ "name": format!("{} ({})", lane.name, lane.model) }),
        ));
        m.push(metadata(
            "thread_sort_index",
            PID_WORKLOADS,
            tid,
            json!({ "sort_index": 2 * tid }),
        ));
    }
    m
}

/// A job: its release (an instant), its run (a span) or, skipped, an instant; its hold.
fn job_events(clock: &Clock, job: &Job, tid: u32, deadline_ms: Option<f64>, out: &mut Vec<Event>) {
    let mut args = json!({
        "job": job.index,
        "release_ms": job.release_ms,
        "start_ms": job.start_ms,
        "end_ms": job.end_ms,
        "latency_ms": job.latency_ms,
        "deadline_ms": deadline_ms,
        "timeout": job.timeout,
        "held_ms": job.held_ms,
    });
    // What a job does not have (a skipped job's start, a hold without the column) is left out.
    if let Some(map) = args.as_object_mut() {
        map.retain(|_, v| !v.is_null());
    }
    let release = clock.us(job.release_ms);
    out.push(Event {
        cat: "release",
        s: Some("t"),
        ..event("release", "i", release, PID_WORKLOADS, tid)
    });
    if let Some(held) = job.held_ms.filter(|h| *h > 0.0) {
        out.push(Event {
            cat: "hold",
            dur: Some(Clock::dur(0.0, held)),
            args: json!({ "job": job.index, "held_ms": held }),
            ..event("held", "X", release, PID_WORKLOADS, TID_HELD_BASE + tid)
        });
    }
    let cname = job.timeout.then_some("terrible");
    match (job.start_ms, job.end_ms) {
        (Some(s), Some(e)) => out.push(Event {
            cat: if job.timeout { "job,timeout" } else { "job" },
            dur: Some(Clock::dur(s, e)),
            cname,
            args,
            ..event(
                if job.timeout { "job (timeout)" } else { "job" },
                "X",
                clock.us(s),
                PID_WORKLOADS,
                tid,
            )
        }),
        _ => out.push(Event {
            cat: "job,timeout",
            s: Some("t"),
            cname,
            args,
            ..event("skipped", "i", release, PID_WORKLOADS, tid)
        }),
    }
}

/// An app's frame: its release and deadline (instants), its span from the release to the
/// sink's end or, dropped on the way, an instant; its hold.
fn frame_events(clock: &Clock, job: &Job, tid: u32, lane: &Lane, out: &mut Vec<Event>) {
    let release = clock.us(job.release_ms);
    out.push(Event {
        cat: "release",
        s: Some("t"),
        args: json!({ "frame": job.index }),
        ..event("release", "i", release, PID_WORKLOADS, tid)
    });
    if let Some(d) = lane.deadline_ms {
        out.push(Event {
            cat: "deadline",
            s: Some("t"),
            args: json!({ "frame": job.index }),
            ..event(
                "deadline",
                "i",
                clock.us(job.release_ms + d),
                PID_WORKLOADS,
                tid,
            )
        });
    }
    if let Some(held) = job.held_ms.filter(|h| *h > 0.0) {
        out.push(Event {
            cat: "hold",
            dur: Some(Clock::dur(0.0, held)),
            args: json!({ "frame": job.index, "held_ms": held }),
            ..event("held", "X", release, PID_WORKLOADS, TID_HELD_BASE + tid)
        });
    }
    let mut args = json!({
        "frame": job.index,
        "release_ms": job.release_ms,
        "end_ms": job.end_ms,
        "latency_ms": job.latency_ms,
        "deadline_ms": lane.deadline_ms,
        "timeout": job.timeout,
        "held_ms": job.held_ms,
    });
    if let Some(map) = args.as_object_mut() {
        map.retain(|_, v| !v.is_null());
    }
    let cname = job.timeout.then_some("terrible");
    match (job.start_ms, job.end_ms) {
        (Some(s), Some(e)) => out.push(Event {
            cat: if job.timeout {
                "frame,timeout"
            } else {
                "frame"
            },
            dur: Some(Clock::dur(s, e)),
            cname,
            args,
            ..event(
                if job.timeout {
                    "frame (timeout)"
                } else {
                    "frame"
                },
                "X",
                clock.us(s),
                PID_WORKLOADS,
                tid,
            )
        }),
        _ => out.push(Event {
            cat: "frame,timeout",
            s: Some("t"),
            cname,
            args,
            ..event("dropped", "i", release, PID_WORKLOADS, tid)
        }),
    }
}

/// A stage's frame: a span from its start to its end, named after the stage's track, or an
/// instant at the frame's release where the stage did not run it.
fn stage_events(clock: &Clock, job: &Job, tid: u32, lane: &Lane, out: &mut Vec<Event>) {
    match (job.start_ms, job.end_ms) {
        (Some(s), Some(e)) => out.push(Event {
            cat: "stage",
            dur: Some(Clock::dur(s, e)),
            args: json!({
                "frame": job.index,
                "release_ms": job.release_ms,
                "start_ms": s,
                "own_ms": job.latency_ms,
            }),
            ..event(lane.name.clone(), "X", clock.us(s), PID_WORKLOADS, tid)
        }),
        _ => out.push(Event {
            cat: "stage,skipped",
            s: Some("t"),
            args: json!({ "frame": job.index, "release_ms": job.release_ms }),
            ..event("skipped", "i", clock.us(job.release_ms), PID_WORKLOADS, tid)
        }),
    }
}

/// The run's own events: t0, each workload's partition, the isolation steps.
fn run_events(clock: &Clock, t: &Timeline, out: &mut Vec<Event>) {
    out.push(Event {
        cat: "run",
        s: Some("g"),
        ..event("t0", "i", clock.us(0.0), PID_RUN, TID_PARTITIONS)
    });
    // Partitions are set up before t0 (summary.json keeps no time for it): they are shown
    // where the trace begins.
    for p in &t.partitions {
        out.push(Event {
            cat: "partition",
            s: Some("t"),
            args: serde_json::to_value(p).unwrap_or(Value::Null),
            ..event(
                format!("partition set-up: {}: {}", p.workload, p.partition),
                "i",
                0.0,
                PID_RUN,
                TID_PARTITIONS,
            )
        });
    }
    for s in &t.steps {
        out.push(Event {
            cat: "step",
            dur: Some(Clock::dur(s.start_ms, s.end_ms)),
            args: json!({ "step": s.step, "interferer_rate_hz": s.interferer_rate_hz }),
            ..event(
                format!(
                    "step {}: interferers {:.1} Hz",
                    s.step, s.interferer_rate_hz
                ),
                "X",
                clock.us(s.start_ms),
                PID_RUN,
                TID_STEPS,
            )
        });
    }
}
