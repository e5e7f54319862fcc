//! Criticality protection for apps (docs/criticality.md, Apps): the guard that workloads use
//! (`isolane_runtime::guard`), with an app's frame as the job.
//!
//! - A **critical** app publishes each frame in its guard slot: released at its scheduled
//!   release, due at release + the app's deadline, expected to take the app's end-to-end time.
//!   Its frames overlap in a pipeline (frame k+1 may enter while frame k is in a later stage),
//!   and a slot holds one frame: the oldest frame not yet at the sink, so that best effort never
//!   loses sight of a frame still on its way.
//! - The estimate of that time is learned as a workload's is from its warm-up: the app's first
//!   frames (those the metrics leave out, `drop_frames`, at least one) run with the estimate at
//!   the deadline, so that best effort runs only where it ends before a frame is released; their
//!   longest end to end is then the estimate, which follows the frames as a decaying maximum.
//!   (Learned with best effort beside it, one slow first frame would have held best effort back
//!   for hundreds of frames.)
//! - A **best-effort** app's stages that use the GPU (models, ensembles, GPU preprocess,
//!   graphics) — and models on the CPU backend, which use the cores critical work needs — ask
//!   the guard before each frame, as one piece of their measured length, and wait (asleep)
//!   while it could make a critical frame late. CPU operators are never held.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use isolane_core::spec::{Criticality, ProtectionSpec};
use isolane_runtime::guard::{
    BestEffortHold, CriticalPublisher, Guard, GuardSetup, HoldWait, Policy,
};

use crate::spec::{AppSpec, PreprocessDevice, StageKind};

/// Whether the guard and priorities act in a run of `apps`: protection enabled, and both
/// critical and best-effort apps present (nothing to protect, or nobody to hold, otherwise).
pub fn protects(apps: &[AppSpec], protection: &ProtectionSpec) -> bool {
    let has = |c: Criticality| apps.iter().any(|a| a.criticality == c);
    protection.enabled && has(Criticality::Critical) && has(Criticality::BestEffort)
}

/// The apps' parts in their run's guard, as [`crate::run::run_apps`] is given them. The default
/// is an unprotected run.
#[derive(Clone, Default)]
pub struct AppGuard {
    /// The run's guard, for apps on threads of this process; `None` in a worker process, which
    /// maps the file its set-up names.
    pub guard: Option<Arc<Guard>>,
    /// Each protected app's part, by app name.
    pub setups: HashMap<String, GuardSetup>,
}

impl AppGuard {
    /// The guard of a run of `apps` with `protection` (none when [`protects`] says no or the
    /// guard lever is off): one slot per critical app, in the apps' order.
    pub fn create(apps: &[AppSpec], protection: &ProtectionSpec) -> std::io::Result<AppGuard> {
        if !protects(apps, protection) || !protection.guard {
            return Ok(AppGuard::default());
        }
        let critical = |a: &&AppSpec| a.criticality == Criticality::Critical;
        let policy = Policy::new(protection.margin_us as i64 * 1000, protection.stretch);
        let guard = Guard::create(apps.iter().filter(critical).count(), policy)?;
        let path = guard.path().unwrap_or_default();
        let mut next_slot = 0;
        let setups = apps
            .iter()
            .map(|a| {
                let slot = critical(&a).then(|| {
                    next_slot += 1;
                    next_slot - 1
                });
                let setup = GuardSetup {
                    path: path.clone(),
                    policy,
                    piece_ns: protection.piece_us as i64 * 1000,
                    critical_slot: slot,
                    // An app has a thread per stage, more than the cores it could poll on
                    // without taking one from critical work; frames are milliseconds apart.
                    wait: HoldWait::Sleep,
                    stretch: a.stretch,
                };
                (a.name.clone(), setup)
            })
            .collect();
        Ok(AppGuard {
            guard: Some(Arc::new(guard)),
            setups,
        })
    }

    /// App `name`'s part (`None`: not protected).
    pub fn setup(&self, name: &str) -> Option<&GuardSetup> {
        self.setups.get(name)
    }

    /// The slot of critical app `name` is free for good (its worker process ended, whatever it
    /// said last): best effort no longer waits for it.
    pub fn finish(&self, name: &str) {
        if let (Some(g), Some(slot)) = (&self.guard, self.setup(name).and_then(|s| s.critical_slot))
        {
            g.finish(slot);
        }
    }
}

/// What one app's threads do for the guard.
pub(crate) enum AppProtection {
    Off,
    Critical(Arc<FramePublisher>),
    BestEffort(Arc<Guard>),
}

impl AppProtection {
    /// The part `guards` gives `app`, on the run's guard or on the file its set-up names.
    pub(crate) fn attach(app: &AppSpec, guards: &AppGuard) -> std::io::Result<AppProtection> {
        let Some(setup) = guards.setup(&app.name) else {
            return Ok(AppProtection::Off);
        };
        let guard = match &guards.guard {
            Some(g) => Arc::clone(g),
            None => Arc::new(Guard::open(&setup.path, setup.policy)?),
        };
        Ok(match setup.critical_slot {
            Some(slot) => AppProtection::Critical(Arc::new(FramePublisher::new(
                guard,
                slot,
                app.deadline_ns(),
                setup.stretch,
                app.drop_frames,
            ))),
            None => AppProtection::BestEffort(guard),
        })
    }

    /// The publisher of a critical app (its source and sink call it).
    pub(crate) fn publisher(&self) -> Option<&Arc<FramePublisher>> {
        match self {
            AppProtection::Critical(p) => Some(p),
            _ => None,
        }
    }

    /// The hold of stage `j` of a best-effort app, for a stage that competes with critical work
    /// (`None` for every other stage).
    pub(crate) fn stage_hold(&self, app: &AppSpec, j: usize) -> Option<StageHold> {
        let AppProtection::BestEffort(guard) = self else {
            return None;
        };
        held_stage(&app.stages[j].kind).then(|| StageHold::new(Arc::clone(guard)))
    }
}

/// Stages a best-effort app holds: those that run a model or use the GPU.
pub fn held_stage(kind: &StageKind) -> bool {
    match kind {
        StageKind::Model(_) | StageKind::Ensemble { .. } | StageKind::Graphics { .. } => true,
        StageKind::Preprocess(p) => p.device == PreprocessDevice::Gpu,
        _ => false,
    }
}

/// A critical app's frames in its guard slot: the oldest frame released (or about to be) and
/// not yet at the sink.
pub(crate) struct FramePublisher {
    state: Mutex<Published>,
    deadline_ns: i64,
}

struct Published {
    publisher: CriticalPublisher,
    /// Frames still to learn the estimate from, and the longest end to end among those seen.
    learning: u64,
    learned_ns: i64,
    /// The frame in the slot.
    in_slot: Option<u64>,
    /// Frames announced by the source and not yet at the sink: (index, release, absolute ns).
    on_the_way: VecDeque<(u64, i64)>,
}

impl FramePublisher {
    /// Slot `slot` of `guard`, learning the estimate from the first `learn` frames (module
    /// docs).
    fn new(
        guard: Arc<Guard>,
        slot: usize,
        deadline_ns: i64,
        stretch: Option<f64>,
        learn: u64,
    ) -> Self {
        FramePublisher {
            state: Mutex::new(Published {
                publisher: CriticalPublisher::new(guard, slot, deadline_ns, stretch),
                learning: learn.max(1),
                learned_ns: 0,
                in_slot: None,
                on_the_way: VecDeque::new(),
            }),
            deadline_ns,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Published> {
        // A thread that panicked while holding it left consistent data (plain stores).
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The source is about to make frame `k`, released at `release` (absolute ns): published at
    /// once when no earlier frame is on its way.
    pub(crate) fn announce(&self, k: u64, release: i64) {
        let mut s = self.lock();
        s.on_the_way.push_back((k, release));
        if s.in_slot.is_none() {
            self.publish(&mut s, k, release);
        }
    }

    /// Frame `k` reached the sink (or was dropped on the way) at `end` (absolute ns): its time
    /// since release feeds the estimate, and the next frame on its way takes the slot.
    pub(crate) fn arrived(&self, k: u64, end: i64) {
        let mut s = self.lock();
        while let Some(&(i, release)) = s.on_the_way.front() {
            if i > k {
                break;
            }
            s.on_the_way.pop_front();
            if s.in_slot == Some(i) {
                s.publisher.ended(i, end - release);
                s.in_slot = None;
            }
            if s.learning > 0 {
                s.learned_ns = s.learned_ns.max(end - release);
                s.learning -= 1;
                if s.learning == 0 {
                    s.publisher.set_estimate(s.learned_ns);
                }
            }
        }
        if s.in_slot.is_none() {
            if let Some(&(i, release)) = s.on_the_way.front() {
                self.publish(&mut s, i, release);
            }
        }
    }

    fn publish(&self, s: &mut Published, k: u64, release: i64) {
        s.publisher
            .pending(k, release, Some(release.saturating_add(self.deadline_ns)));
        s.in_slot = Some(k);
    }
}

/// A best-effort stage's hold: one piece per frame, its estimate the stage's own time.
pub(crate) struct StageHold {
    hold: BestEffortHold,
    /// Whether a frame's time has seeded the estimate yet (the first one does).
    seeded: bool,
}

impl StageHold {
    fn new(guard: Arc<Guard>) -> StageHold {
        StageHold {
            hold: BestEffortHold::new(guard, HoldWait::Sleep),
            seeded: false,
        }
    }

    /// Waits until the guard lets the stage start its frame (or `stop` is raised).
    pub(crate) fn before(&mut self, stop: &AtomicBool) {
        self.hold.before_piece(0, stop);
    }

    /// The frame took `own_ns`: returns how long it was held.
    pub(crate) fn after(&mut self, own_ns: i64) -> i64 {
        let held = self.hold.job_done();
        if !self.seeded {
            // Before the first frame the estimate knows nothing; from here on it tracks about
            // the 90th percentile of the stage's times.
            self.hold.seed_estimate(1, own_ns);
            self.seeded = true;
        }
        held
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: i64 = 1_000_000;

    #[test]
    fn the_slot_keeps_the_oldest_frame_on_its_way() {
        let guard = Arc::new(Guard::create(1, Policy::new(0, None)).unwrap());
        let frames = FramePublisher::new(Arc::clone(&guard), 0, 10 * MS, None, 1);
        let now = isolane_runtime::clock::now_ns;
        // Before any frame the next release is unknown: best effort waits.
        assert!(guard.try_piece(MS).is_err());
        frames.announce(0, now());
        // Frame 0 is learned from: its estimate is the deadline, and nothing may overlap it.
        assert!(guard.try_piece(MS).is_err());
        frames.arrived(0, now());
        // Nothing announced after it: unknown again.
        assert!(guard.try_piece(MS).is_err());
        let t = now();
        frames.announce(1, t);
        // Frame 1 is due in 10 ms and (learned) takes microseconds: a 50 ms piece could stall
        // it past its deadline, a 1 ms one cannot.
        assert!(guard.try_piece(50 * MS).is_err());
        assert!(guard.try_piece(MS).is_ok());
        // Frame 2 (released in 100 ms) is announced while frame 1 is still on its way: the
        // slot stays on frame 1.
        frames.announce(2, t + 100 * MS);
        assert!(guard.try_piece(50 * MS).is_err());
        // Frame 1 arrives: frame 2 takes the slot, and a 50 ms piece ends before its release.
        frames.arrived(1, now());
        assert!(guard.try_piece(50 * MS).is_ok());
        frames.arrived(2, now());
        assert!(guard.try_piece(MS).is_err());
        // The app has ended: best effort no longer waits for it.
        drop(frames);
        assert!(guard.try_piece(50 * MS).is_ok());
    }

    #[test]
    fn a_frame_dropped_on_the_way_frees_the_slot_for_the_next() {
        let guard = Arc::new(Guard::create(1, Policy::new(0, None)).unwrap());
        let frames = FramePublisher::new(Arc::clone(&guard), 0, 10 * MS, None, 1);
        let t = isolane_runtime::clock::now_ns();
        frames.announce(0, t);
        frames.announce(1, t + 1000 * MS);
        frames.announce(2, t + 2000 * MS);
        // The sink hears of frame 1 first (frame 0 never reached it): both leave the slot.
        frames.arrived(1, isolane_runtime::clock::now_ns());
        assert!(guard.try_piece(500 * MS).is_ok());
    }

    #[test]
    fn only_runs_with_both_kinds_and_protection_on_are_guarded() {
        let text = |c2: &str| {
            format!(
                r#"
[[app]]
name = "a"
deadline_ms = 50
frames = 30
[app.source]
kind = "synthetic"
width = 8
height = 8
fps = 30
[[app.stage]]
name = "out"
kind = "sink"

[[app]]
name = "b"
deadline_ms = 50
frames = 30
criticality = "{c2}"
[app.source]
kind = "synthetic"
width = 8
height = 8
fps = 30
[[app.stage]]
name = "out"
kind = "sink"
"#
            )
        };
        struct NoModels;
        impl crate::spec::ModelNames for NoModels {
            fn is_builtin(&self, _: &str) -> bool {
                false
            }
            fn builtins(&self) -> Vec<String> {
                vec![]
            }
        }
        let parse = |t: &str| {
            crate::spec::parse_apps(t, std::path::Path::new("t.toml"), &NoModels).unwrap()
        };
        let on = ProtectionSpec::default();
        let both = parse(&text("best_effort"));
        assert!(protects(&both, &on));
        assert!(!protects(&parse(&text("critical")), &on));
        let off = ProtectionSpec {
            enabled: false,
            ..on
        };
        assert!(!protects(&both, &off));
        let g = AppGuard::create(&both, &on).unwrap();
        assert_eq!(g.setup("a").unwrap().critical_slot, Some(0));
        assert_eq!(g.setup("b").unwrap().critical_slot, None);
        // Priorities only: no guard.
        let no_guard = ProtectionSpec { guard: false, ..on };
        assert!(AppGuard::create(&both, &no_guard).unwrap().guard.is_none());
    }
}
