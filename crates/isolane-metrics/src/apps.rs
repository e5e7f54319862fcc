//! Live figures of a run's `[[app]]`s (docs/apps.md, docs/observability.md).
//!
//! Per app, end to end, on the per-workload families every run has (`workload` = the app's
//! name): a frame is a job, counted when the sink has it (reached, or dropped on the way), its
//! latency the sink's end minus its scheduled release, as summary.json's `end_to_end` has it.
//! Per stage, on `isolane_stage_*` families labelled `app` and `stage`: the frames it ran and
//! did not run, its own time per frame and the criticality guard's hold.
//!
//! [`AppMeters`] holds every series of the run resolved up front, so that a stage thread that
//! hands a frame on only adds to atomics (and observes the histogram of its own stage, whose
//! lock nothing but a scrape takes): no map lookup, no lock shared between stages.

use std::sync::atomic::AtomicU64;

use isolane_core::app_records::StageRecord;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use crate::{latency_histogram, RunMetrics, WorkloadInfo, WorkloadLabels};

/// The label set of every per-stage family.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StageLabels {
    pub app: String,
    pub stage: String,
}

type StageHistograms = Family<StageLabels, Histogram, fn() -> Histogram>;

/// The per-stage families, registered with the run's others.
pub(crate) struct StageFamilies {
    frames: Family<StageLabels, Counter>,
    skipped: Family<StageLabels, Counter>,
    held_seconds: Family<StageLabels, Counter<f64, AtomicU64>>,
    latency: StageHistograms,
}

impl StageFamilies {
    pub(crate) fn register(registry: &mut Registry) -> StageFamilies {
        let f = StageFamilies {
            frames: Family::default(),
            skipped: Family::default(),
            held_seconds: Family::default(),
            latency: Family::new_with_constructor(latency_histogram),
        };
        registry.register(
            "isolane_stage_frames",
            "frames an app's stage ran",
            f.frames.clone(),
        );
        registry.register(
            "isolane_stage_skipped",
            "frames an app's stage did not run (late = skip past the deadline, dropped upstream)",
            f.skipped.clone(),
        );
        registry.register_with_unit(
            "isolane_stage_held",
            "time the criticality guard held an app's stage back (best-effort apps)",
            Unit::Seconds,
            f.held_seconds.clone(),
        );
        registry.register_with_unit(
            "isolane_stage_latency",
            "an app's stage's own time per frame, its start to its end",
            Unit::Seconds,
            f.latency.clone(),
        );
        f
    }
}

/// One app of a run as the metrics see it.
#[derive(Clone, Debug)]
pub struct AppInfo {
    pub name: String,
    /// End to end, from the frame's scheduled release.
    pub deadline_ns: i64,
    /// Its stages' names, in the app's order (the stage index of [`AppMeters::stage_done`]).
    pub stages: Vec<String>,
    /// The index of its sink.
    pub sink: usize,
}

struct StageMeter {
    frames: Counter,
    skipped: Counter,
    held_seconds: Counter<f64, AtomicU64>,
    latency: Histogram,
}

struct AppMeter {
    deadline_ns: i64,
    sink: usize,
    jobs: Counter,
    completed: Counter,
    timeouts: Counter,
    skipped: Counter,
    held_seconds: Counter<f64, AtomicU64>,
    latency: Histogram,
    stages: Vec<StageMeter>,
}

/// The series of one run's apps, each resolved once (see the module's note).
pub struct AppMeters {
    apps: Vec<AppMeter>,
}

impl RunMetrics {
    /// A run of apps starts: its partitions (`<app>.<model>` workloads, or the apps' own in
    /// worker processes) and every app's and stage's series, at 0.
    pub fn begin_apps(
        &self,
        command: &str,
        scenario: &str,
        partitions: &[WorkloadInfo],
        apps: &[AppInfo],
    ) -> AppMeters {
        self.announce(command, scenario, partitions);
        // No workload of the coordinator's: a stray `observe` finds no slot.
        self.job.clear();
        let apps = apps
            .iter()
            .map(|a| {
                // The guard's count of held jobs has no app figure: a frame is held stage by
                // stage (isolane_stage_held_seconds_total).
                self.job.show(&a.name, false);
                let w = WorkloadLabels {
                    workload: a.name.clone(),
                };
                let f = &self.stages;
                AppMeter {
                    deadline_ns: a.deadline_ns,
                    sink: a.sink,
                    jobs: self.job.jobs.get_or_create_owned(&w),
                    completed: self.job.completed.get_or_create_owned(&w),
                    timeouts: self.job.timeouts.get_or_create_owned(&w),
                    skipped: self.job.skipped.get_or_create_owned(&w),
                    held_seconds: self.job.held_seconds.get_or_create_owned(&w),
                    latency: self.job.latency.get_or_create_owned(&w),
                    stages: a
                        .stages
                        .iter()
                        .map(|s| {
                            let l = StageLabels {
                                app: a.name.clone(),
                                stage: s.clone(),
                            };
                            StageMeter {
                                frames: f.frames.get_or_create_owned(&l),
                                skipped: f.skipped.get_or_create_owned(&l),
                                held_seconds: f.held_seconds.get_or_create_owned(&l),
                                latency: f.latency.get_or_create_owned(&l),
                            }
                        })
                        .collect(),
                }
            })
            .collect();
        AppMeters { apps }
    }
}

impl AppMeters {
    /// Stage `stage` of app `app` is done with frame `record.frame`, released `release_ns`
    /// after t0 (the same clock as the record's times): ran it, or passed it on dropped. At the
    /// sink the frame's end to end is counted too. Indices outside the run are ignored.
    pub fn stage_done(&self, app: usize, stage: usize, release_ns: i64, record: &StageRecord) {
        let Some(a) = self.apps.get(app) else { return };
        let Some(s) = a.stages.get(stage) else { return };
        let ran = record.start_ns.zip(record.end_ns);
        match ran {
            Some((start, end)) => {
                s.frames.inc();
                s.latency.observe((end - start).max(0) as f64 / 1e9);
            }
            None => {
                s.skipped.inc();
            }
        }
        if record.held_ns > 0 {
            let held = record.held_ns as f64 / 1e9;
            s.held_seconds.inc_by(held);
            a.held_seconds.inc_by(held);
        }
        if stage != a.sink {
            return;
        }
        a.jobs.inc();
        match ran {
            Some((_, end)) => {
                a.completed.inc();
                let latency = end - release_ns;
                a.latency.observe(latency.max(0) as f64 / 1e9);
                if latency > a.deadline_ns {
                    a.timeouts.inc();
                }
            }
            None => {
                a.skipped.inc();
                a.timeouts.inc();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ran(frame: u64, start: i64, end: i64, held_ns: i64) -> StageRecord {
        StageRecord {
            start_ns: Some(start),
            end_ns: Some(end),
            held_ns,
            ..StageRecord::skipped(frame)
        }
    }

    fn value(text: &str, series: &str) -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no `{series}` in:\n{text}"))
    }

    #[test]
    fn frames_count_at_the_sink_and_stages_each_on_their_own() {
        let m = RunMetrics::new();
        let partition = WorkloadInfo {
            name: "det.net".into(),
            mechanism: "none".into(),
            partition: "cpu".into(),
            host: "thread".into(),
        };
        let meters = m.begin_apps(
            "run",
            "s.toml",
            &[partition],
            &[AppInfo {
                name: "det".into(),
                deadline_ns: 10_000_000,
                stages: vec!["net".into(), "out".into()],
                sink: 1,
            }],
        );
        let text = m.encode();
        // Shown from the start, at 0; the partition's workload gets no job series.
        assert_eq!(value(&text, "isolane_jobs_total{workload=\"det\"}"), 0.0);
        assert_eq!(
            value(
                &text,
                "isolane_stage_frames_total{app=\"det\",stage=\"out\"}"
            ),
            0.0
        );
        assert!(!text.contains("isolane_jobs_total{workload=\"det.net\"}"));
        assert!(text.contains("isolane_partition{workload=\"det.net\""));
        // Frame 0 in time, frame 1 late (12 ms after its release at 1 ms), frame 2 dropped.
        meters.stage_done(0, 0, 0, &ran(0, 0, 2_000_000, 500_000));
        meters.stage_done(0, 1, 0, &ran(0, 2_000_000, 3_000_000, 0));
        meters.stage_done(0, 0, 1_000_000, &ran(1, 3_000_000, 12_000_000, 0));
        meters.stage_done(0, 1, 1_000_000, &ran(1, 12_000_000, 13_000_000, 0));
        meters.stage_done(0, 0, 2_000_000, &StageRecord::skipped(2));
        meters.stage_done(0, 1, 2_000_000, &StageRecord::skipped(2));
        // Outside the run: ignored, no panic.
        meters.stage_done(1, 0, 0, &ran(0, 0, 1, 0));
        meters.stage_done(0, 7, 0, &ran(0, 0, 1, 0));
        let text = m.encode();
        let app = |n: &str| value(&text, &format!("{n}{{workload=\"det\"}}"));
        assert_eq!(app("isolane_jobs_total"), 3.0);
        assert_eq!(app("isolane_jobs_completed_total"), 2.0);
        assert_eq!(app("isolane_jobs_skipped_total"), 1.0);
        assert_eq!(
            app("isolane_timeouts_total"),
            2.0,
            "the late one and the dropped one"
        );
        assert_eq!(app("isolane_held_seconds_total"), 0.0005);
        assert_eq!(app("isolane_latency_seconds_count"), 2.0);
        assert!((app("isolane_latency_seconds_sum") - 0.015).abs() < 1e-12);
        let stage = |n: &str, s: &str| value(&text, &format!("{n}{{app=\"det\",stage=\"{s}\"}}"));
        assert_eq!(stage("isolane_stage_frames_total", "net"), 2.0);
        assert_eq!(stage("isolane_stage_skipped_total", "net"), 1.0);
        assert_eq!(stage("isolane_stage_held_seconds_total", "net"), 0.0005);
        assert_eq!(stage("isolane_stage_held_seconds_total", "out"), 0.0);
        assert_eq!(stage("isolane_stage_latency_seconds_count", "net"), 2.0);
        assert!((stage("isolane_stage_latency_seconds_sum", "net") - 0.011).abs() < 1e-12);
        assert_eq!(stage("isolane_stage_latency_seconds_count", "out"), 2.0);
    }
}
