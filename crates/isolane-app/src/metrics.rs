//! An app's records as summary.json's `apps` entry (paper 004's metrics, through core's one
//! definition of each statistic), the per-frame CSV, and the comparison of two runs.
//!
//! - End to end, per frame: the sink's end minus the frame's scheduled release; a frame
//!   dropped on the way (late, or a failed stage) is a timeout with no latency.
//! - Per stage: its own time per frame (its start to its end), so the stages of a pipeline
//!   add up to the frame's work and the rest of its end to end is waiting.
//! - The first and last `drop_frames` frames are left out (warm-up and cool-down).
//! - An ensemble's member: its own inference time; it *made the vote late* on a frame whose
//!   vote ended after the deadline while this member was the last to answer.

use isolane_core::app_records::Link;
use isolane_core::job::JobRecord;
use isolane_core::metrics::{workload_metrics, LatencyStats};
use isolane_core::results::{
    AppSummary, HeldSummary, MemberSummary, StageSummary, TransferSummary,
};
use isolane_core::spec::Criticality;
use isolane_core::stats::{mann_whitney_u, MannWhitney, MwMethod, StatsError};

use crate::protection::held_stage;
use crate::run::{AppRecords, StageRecord};
use crate::spec::{AppSpec, PreprocessDevice, StageKind, Vote};

/// The frames the metrics cover: all but the first and last `drop_frames` released.
fn measured(app: &AppSpec, released: u64) -> std::ops::Range<u64> {
    let first = app.drop_frames.min(released);
    let last = released.saturating_sub(app.drop_frames).max(first);
    first..last
}

/// Each measured frame's end-to-end record: its release, the sink's end, and how long the
/// criticality guard held its stages back (their sum). No start: a workload's start lateness
/// assumes each job waits for the previous one's end, which the frames of a pipeline do not
/// (frame k+1 enters while frame k is still in a later stage).
pub fn frame_records(app: &AppSpec, rec: &AppRecords) -> Vec<JobRecord> {
    let sink = crate::run::sink(app, rec);
    measured(app, rec.release_ns.len() as u64)
        .map(|k| {
            let i = k as usize;
            let end = sink.get(i).and_then(|s| s.end_ns);
            JobRecord {
                index: k,
                release_ns: rec.release_ns[i],
                start_ns: None,
                end_ns: end,
                timeout: end.is_none(),
                held_ns: frame_held_ns(rec, i),
            }
        })
        .collect()
}

/// How long the guard held frame `i` back, over all its stages.
fn frame_held_ns(rec: &AppRecords, i: usize) -> i64 {
    rec.stages
        .iter()
        .filter_map(|s| s.get(i))
        .map(|s| s.held_ns)
        .sum()
}

/// A best-effort app's holds, when the guard acted on it (`None` otherwise).
fn held(app: &AppSpec, frames: &[JobRecord]) -> Option<HeldSummary> {
    let held_any = frames.iter().any(|f| f.held_ns > 0);
    (app.criticality == Criticality::BestEffort && held_any).then(|| {
        let pieces = app.stages.iter().filter(|s| held_stage(&s.kind)).count();
        HeldSummary::of(frames, pieces as u64)
    })
}

/// The source's hand-over of each measured frame against its release (`None` where the
/// records have no hand-over times).
fn source_lateness(app: &AppSpec, rec: &AppRecords) -> Option<LatencyStats> {
    if rec.sent_ns.len() != rec.release_ns.len() || rec.sent_ns.is_empty() {
        return None;
    }
    let range = measured(app, rec.release_ns.len() as u64);
    let pairs = range.map(|k| (rec.release_ns[k as usize], rec.sent_ns[k as usize]));
    Some(own_time_stats(pairs))
}

/// A warning where the source itself fell behind its schedule (p99 of its lateness over a
/// quarter of the frame period): what was measured then includes the source's own wait.
pub fn late_source_warning(s: &AppSummary) -> Option<String> {
    let late = s.source_late_ms.as_ref()?;
    let (p99, max) = (late.p99?, late.max?);
    let period_ms = 1000.0 / s.rate_hz;
    (p99 > period_ms / 4.0).then(|| {
        format!(
            "warning: app `{}`: its source handed frames over late (p99 {p99:.1} ms, max \
             {max:.1} ms, against a period of {period_ms:.1} ms): this machine makes or reads \
             them slower than the frame rate, and that wait is in every end-to-end latency",
            s.name
        )
    })
}

/// A stage's own times as records released at their start (so that their latency is the
/// stage's time and core computes every statistic of it).
fn own_time_stats(times: impl Iterator<Item = (i64, i64)>) -> LatencyStats {
    let records: Vec<JobRecord> = times
        .enumerate()
        .map(|(i, (start, end))| JobRecord {
            index: i as u64,
            release_ns: start,
            start_ns: Some(start),
            end_ns: Some(end),
            timeout: false,
            held_ns: 0,
        })
        .collect();
    workload_metrics(&records, 1, 0.0, None).latency_ms
}

/// A stage's input copies from device memory, where it had any.
fn transfer_summary<'a>(
    measured: impl Iterator<Item = &'a StageRecord>,
) -> Option<TransferSummary> {
    let moved: Vec<(i64, Link)> = measured.filter_map(|s| s.transfer).collect();
    if moved.is_empty() {
        return None;
    }
    let mut links = Vec::new();
    for (_, link) in &moved {
        if !links.contains(link) {
            links.push(*link);
        }
    }
    Some(TransferSummary {
        links,
        latency_ms: own_time_stats(moved.iter().map(|(ns, _)| (0, *ns))),
    })
}

/// How long frame `i`'s values took to move between GPU stages, over all its stages.
fn frame_transfer_ns(rec: &AppRecords, i: usize) -> i64 {
    rec.stages
        .iter()
        .filter_map(|s| s.get(i)?.transfer)
        .map(|(ns, _)| ns)
        .sum()
}

fn measured_stage<'a>(
    app: &AppSpec,
    rec: &AppRecords,
    stage: &'a [StageRecord],
) -> impl Iterator<Item = &'a StageRecord> + Clone {
    let range = measured(app, rec.release_ns.len() as u64);
    stage.iter().filter(move |s| range.contains(&s.frame))
}

/// Where a GPU preprocess at stage `j` ran: on the GPU, in the partition of the model it feeds,
/// or outside any partition where it names another GPU than that model's.
fn gpu_preprocess_partition(app: &AppSpec, j: usize, partition: &dyn Fn(&str) -> String) -> String {
    let own = match &app.stages[j].kind {
        StageKind::Preprocess(p) => p.gpu,
        _ => None,
    };
    match app.fed_model(j) {
        Some(m) if own.is_none() || own == m.gpu => {
            format!("gpu, in {}'s partition: {}", m.name, partition(&m.name))
        }
        _ => match own {
            Some(g) => format!("gpu, outside any partition, on GPU {g}"),
            None => "gpu".to_string(),
        },
    }
}

/// summary.json's entry for `app`; `partition` says where a model (by its name) ran.
pub fn summarize(
    app: &AppSpec,
    rec: &AppRecords,
    partition: &dyn Fn(&str) -> String,
) -> AppSummary {
    let frames = frame_records(app, rec);
    let period_s = app.period_ns() as f64 / 1e9;
    let end_to_end = workload_metrics(
        &frames,
        1,
        frames.len() as f64 * period_s,
        Some(app.deadline_ns()),
    );
    let stages = app
        .stages
        .iter()
        .zip(&rec.stages)
        .enumerate()
        .map(|(j, (spec, records))| {
            let m = measured_stage(app, rec, records);
            let ran = m.clone().filter_map(|s| Some((s.start_ns?, s.end_ns?)));
            StageSummary {
                name: spec.name.clone(),
                kind: spec.kind.name().to_string(),
                partition: match &spec.kind {
                    StageKind::Model(model) => partition(&model.name),
                    StageKind::Ensemble {
                        vote: Vote::Onnx(v),
                        ..
                    } => partition(&v.name),
                    StageKind::Preprocess(p) if p.device == PreprocessDevice::Gpu => {
                        gpu_preprocess_partition(app, j, partition)
                    }
                    // Vulkan renders outside the CUDA partitions; a stage pinned to a GPU
                    // names it by its UUID (crate::placement).
                    StageKind::Graphics { device, .. } => format!("vulkan, device {device}"),
                    _ => "cpu".to_string(),
                },
                processed: ran.clone().count() as u64,
                skipped: m.clone().filter(|s| s.end_ns.is_none()).count() as u64,
                latency_ms: own_time_stats(ran),
                members: members(app, rec, spec, m.clone(), partition),
                transfer: transfer_summary(m),
            }
        })
        .collect();
    let released = rec.release_ns.len() as u64;
    let range = measured(app, released);
    AppSummary {
        name: app.name.clone(),
        deadline_ms: app.deadline_ms,
        rate_hz: app.source.fps,
        source: app.source_words(),
        frames: released,
        dropped_first: range.start,
        dropped_last: released - range.end,
        end_to_end,
        source_late_ms: source_lateness(app, rec),
        stages,
        criticality: app.criticality,
        held: held(app, &frames),
    }
}

fn members<'a>(
    app: &AppSpec,
    rec: &AppRecords,
    spec: &crate::spec::StageSpec,
    measured: impl Iterator<Item = &'a StageRecord> + Clone,
    partition: &dyn Fn(&str) -> String,
) -> Vec<MemberSummary> {
    let StageKind::Ensemble { members, .. } = &spec.kind else {
        return Vec::new();
    };
    let blame = made_late(app, rec, measured.clone(), members.len());
    members
        .iter()
        .enumerate()
        .map(|(i, m)| MemberSummary {
            name: m.name.clone(),
            model: m.model.clone(),
            partition: partition(&m.name),
            latency_ms: own_time_stats(measured.clone().filter_map(|s| s.members.get(i).copied())),
            made_late: blame[i],
        })
        .collect()
}

/// Per member: the frames whose vote ended after the deadline with it the last to answer.
fn made_late<'a>(
    app: &AppSpec,
    rec: &AppRecords,
    measured: impl Iterator<Item = &'a StageRecord>,
    n: usize,
) -> Vec<u64> {
    let mut blame = vec![0; n];
    for s in measured {
        let (Some(end), Some(&release)) = (s.end_ns, rec.release_ns.get(s.frame as usize)) else {
            continue;
        };
        if end - release <= app.deadline_ns() {
            continue;
        }
        let last = s
            .members
            .iter()
            .enumerate()
            .max_by_key(|(_, (_, member_end))| *member_end)
            .map(|(i, _)| i);
        if let Some(i) = last {
            blame[i] += 1;
        }
    }
    blame
}

/// `apps/<app>.csv`: one row per frame released (all of them, the dropped ones included):
/// `frame,release_ms,sent_ms,end_ms,latency_ms,timeout,measured,held_ms,transfer_ms`
/// (`held_ms`: how long the criticality guard held the frame's stages back; `transfer_ms`: how
/// long its values took to move between GPU stages), then each stage's own time
/// (`<stage>_ms`, empty where it did not run), then when each stage started the frame
/// (`<stage>.start_ms`, ms since t0: where the trace places it; a stage name has no `.`, so
/// no stage's own-time column can take that name), then `output`: what reached the sink.
pub fn frames_csv(app: &AppSpec, rec: &AppRecords) -> String {
    let mut out = String::from(isolane_core::results::APP_CSV_COLUMNS);
    for s in &app.stages {
        out.push_str(&format!(",{}_ms", s.name));
    }
    for s in &app.stages {
        out.push_str(&format!(",{}.start_ms", s.name));
    }
    out.push_str(",output\n");
    let sink = crate::run::sink(app, rec);
    let range = measured(app, rec.release_ns.len() as u64);
    let ms = |ns: i64| format!("{:.6}", ns as f64 / 1e6);
    for (i, &release) in rec.release_ns.iter().enumerate() {
        let end = sink.get(i).and_then(|s| s.end_ns);
        let timeout = end.is_none_or(|e| e - release > app.deadline_ns());
        out.push_str(&format!(
            "{i},{},{},{},{},{},{},{},{}",
            ms(release),
            rec.sent_ns.get(i).map(|s| ms(*s)).unwrap_or_default(),
            end.map(ms).unwrap_or_default(),
            end.map(|e| ms(e - release)).unwrap_or_default(),
            timeout as u8,
            range.contains(&(i as u64)) as u8,
            ms(frame_held_ns(rec, i)),
            ms(frame_transfer_ns(rec, i))
        ));
        for stage in &rec.stages {
            let own = stage
                .get(i)
                .and_then(|s| Some(s.end_ns? - s.start_ns?))
                .map(ms);
            out.push(',');
            out.push_str(&own.unwrap_or_default());
        }
        for stage in &rec.stages {
            let start = stage.get(i).and_then(|s| s.end_ns.and(s.start_ns)).map(ms);
            out.push(',');
            out.push_str(&start.unwrap_or_default());
        }
        let output = sink.get(i).and_then(|s| s.output.as_deref()).unwrap_or("");
        out.push(',');
        out.push_str(&output.replace(',', ";"));
        out.push('\n');
    }
    out
}

/// The measured frames' end-to-end latencies (ms) of an `apps/<app>.csv`: core reads the
/// format (`isolane_core::results::app_latencies_from_csv`), so the report reads it the same.
pub use isolane_core::results::app_latencies_from_csv as latencies_from_csv;

/// Two runs of an app compared: the two-sided Mann–Whitney U test of their measured frames'
/// end-to-end latencies (paper 004 reports it for every pair of set-ups).
pub fn compare(a: &[f64], b: &[f64]) -> Result<MannWhitney, StatsError> {
    mann_whitney_u(a, b, MwMethod::Auto)
}

#[cfg(test)]
mod tests;
