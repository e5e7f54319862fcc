//! One run of a scenario's apps: every stage on a thread of its own, connected by channels
//! along the app's graph; each app's source releases frame k at `t0 + k·T` on an absolute
//! schedule (t0 common to all apps, after every stage is built and warmed up); a frame's
//! end-to-end latency runs from that scheduled release to the sink's end (docs/apps.md).
//!
//! Stages process frames in order. With `late = "skip"` a stage does not start a frame whose
//! deadline has already passed: it passes a drop on, and the frame counts as a timeout; the
//! sink measures every frame that reaches it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, OnceLock};
use std::thread;

use isolane_core::spec::{DeviceSpec, TimingSpec};
use isolane_runtime::clock;
use isolane_runtime::partition::Partition;

use crate::data::{Frame, Payload};
use crate::models::{input_shape, ModelBuilder};
use crate::protection::{AppGuard, AppProtection, FramePublisher, StageHold};
use crate::source::{self, FrameSource};
use crate::spec::{AppSpec, Input, Late, StageKind};
use crate::stage::{self, StageContext};

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// A source or a stage could not be set up (nothing ran).
    #[error("app `{app}`: {message}")]
    Setup { app: String, message: String },
    /// An app's worker process failed before the start (`crate::workers`); the message names
    /// the app.
    #[error("{0}")]
    Worker(String),
}

/// Records reserved up front per stage (more grow as needed): enough for most runs without
/// reallocating while frames flow.
const PREALLOCATED: u64 = 1 << 16;

pub use isolane_core::app_records::{AppRecords, StageRecord};

/// The sink's records of `rec`: each frame's end to end (none for an app without a sink, which
/// validation refuses).
pub fn sink<'a>(app: &AppSpec, rec: &'a AppRecords) -> &'a [StageRecord] {
    app.stages
        .iter()
        .position(|s| s.kind == StageKind::Sink)
        .and_then(|j| rec.stages.get(j))
        .map_or(&[], Vec::as_slice)
}

/// A frame on its way: its index, scheduled release, the source frame, and the producing
/// stage's output (`None`: dropped).
#[derive(Clone)]
struct Msg {
    index: u64,
    release_ns: i64,
    frame: Arc<Frame>,
    payload: Option<Arc<Payload>>,
}

/// The run's settings shared by every app.
pub struct RunSettings<'a> {
    pub device: &'a DeviceSpec,
    pub timing: &'a TimingSpec,
    pub models: Arc<dyn ModelBuilder + Send>,
    /// Partitions by workload name `<app>.<model name>` (see [`crate::partitions`]).
    pub partitions: HashMap<String, Partition>,
    /// Set to stop releasing frames (Ctrl-C): what was measured is kept.
    pub stop: &'a AtomicBool,
    /// The run's output folder: stages that save what they make (a graphics stage's
    /// `save_every`) write under `<out>/apps/<app>/`. `None`: nothing is saved.
    pub out: Option<&'a std::path::Path>,
    /// Called once every stage is built and warmed up: the t0 (monotonic ns) to release the
    /// first frames at, or why not to run. An app in an `isolane worker` process reports ready
    /// here and waits for the coordinator's t0; `None`: now plus `timing.start_delay_ms`.
    pub start: Option<StartGate<'a>>,
    /// The apps' parts in the run's criticality guard (default: an unprotected run).
    pub guard: AppGuard,
}

/// See [`RunSettings::start`].
pub type StartGate<'a> = Box<dyn FnOnce() -> Result<i64, String> + 'a>;

/// The records of each app, in order, and the t0 they are relative to (monotonic ns).
pub struct RunOutcome {
    pub apps: Vec<AppRecords>,
    pub t0_ns: i64,
    pub wall_s: f64,
}

/// The graph's wiring of one app: per stage its receivers and senders.
struct Wiring {
    source_out: Vec<Sender<Msg>>,
    stage_in: Vec<Vec<Receiver<Msg>>>,
    stage_out: Vec<Vec<Sender<Msg>>>,
}

fn wire(app: &AppSpec) -> Wiring {
    let n = app.stages.len();
    let mut w = Wiring {
        source_out: Vec::new(),
        stage_in: (0..n).map(|_| Vec::new()).collect(),
        stage_out: (0..n).map(|_| Vec::new()).collect(),
    };
    for (j, s) in app.stages.iter().enumerate() {
        for input in &s.inputs {
            let (tx, rx) = mpsc::channel();
            w.stage_in[j].push(rx);
            match input {
                Input::Source => w.source_out.push(tx),
                Input::Stage(k) => w.stage_out[*k].push(tx),
            }
        }
    }
    w
}

/// The size a preprocess without one takes: the input of the model or ensemble reading it.
fn preprocess_sizes(app: &AppSpec) -> Result<Vec<Option<[u32; 2]>>, String> {
    let mut sizes = vec![None; app.stages.len()];
    for (j, s) in app.stages.iter().enumerate() {
        let StageKind::Preprocess(p) = &s.kind else {
            continue;
        };
        if p.size.is_some() {
            continue;
        }
        let Some(model) = app.fed_model(j) else {
            return Err(format!(
                "stage `{}`: no size = [width, height], and it feeds no model whose input gives one",
                s.name
            ));
        };
        let shape = input_shape(model)?;
        let [1, 3, h, w] = shape[..] else {
            return Err(format!(
                "stage `{}`: model `{}` takes a {shape:?} input, not an RGB image [1, 3, H, W]",
                s.name, model.model
            ));
        };
        sizes[j] = Some([w as u32, h as u32]);
    }
    Ok(sizes)
}

/// Runs `apps` to their last frame and returns what was measured.
pub fn run_apps(apps: &[AppSpec], settings: RunSettings<'_>) -> Result<RunOutcome, RunError> {
    run_apps_observed(apps, settings, None)
}

/// [`run_apps`], showing each stage's every frame to `meters` (live metrics,
/// `--metrics-addr`) as the stage hands it on; app `a` and stage `j` are `apps[a].stages[j]`.
pub fn run_apps_observed(
    apps: &[AppSpec],
    mut settings: RunSettings<'_>,
    meters: Option<&isolane_metrics::AppMeters>,
) -> Result<RunOutcome, RunError> {
    let mut sources = Vec::new();
    let mut sizes = Vec::new();
    let mut frame_sizes = Vec::new();
    let mut protections = Vec::new();
    for app in apps {
        protections.push(
            AppProtection::attach(app, &settings.guard)
                .map_err(|e| setup(app, format!("opening the criticality guard: {e}")))?,
        );
        sources.push(source::open(&app.source.kind).map_err(|e| setup(app, e.to_string()))?);
        sizes.push(preprocess_sizes(app).map_err(|m| setup(app, m))?);
        frame_sizes.push(frame_size(app).map_err(|m| setup(app, m))?);
    }
    let t0 = Arc::new(OnceLock::<i64>::new());
    thread::scope(|scope| {
        let (ready_tx, ready_rx) = mpsc::channel();
        let mut source_outs = Vec::new();
        let mut stage_threads = Vec::new();
        for (a, app) in apps.iter().enumerate() {
            let wiring = wire(app);
            source_outs.push(wiring.source_out);
            let ins = wiring.stage_in.into_iter();
            let outs = wiring.stage_out.into_iter();
            let handles: Vec<_> = ins
                .zip(outs)
                .enumerate()
                .map(|(j, (inputs, outputs))| {
                    let ctx = StageContext {
                        device: settings.device,
                        models: settings.models.clone(),
                        seed: settings.timing.seed ^ ((a as u64) << 32 | j as u64),
                        partitions: take_partitions(
                            &mut settings.partitions,
                            &*settings.models,
                            app,
                            settings.device,
                            j,
                        ),
                        preprocess_size: sizes[a][j],
                        frame_size: frame_sizes[a],
                        cpu: app.cpu.clone(),
                        save_dir: settings.out.map(|o| o.join("apps").join(&app.name)),
                        gpu: app.stage_gpu(j, settings.device),
                        transfer: app.transfer,
                    };
                    let is_sink = app.stages[j].kind == StageKind::Sink;
                    let worker = StageWorker {
                        app,
                        index: j,
                        inputs,
                        outputs,
                        t0: t0.clone(),
                        hold: protections[a].stage_hold(app, j),
                        publisher: protections[a].publisher().filter(|_| is_sink).cloned(),
                        stop: settings.stop,
                        meters,
                    };
                    let ready = ready_tx.clone();
                    scope.spawn(move || worker.run(ctx, ready, a))
                })
                .collect();
            stage_threads.push(handles);
        }
        drop(ready_tx);
        let stages: usize = stage_threads.iter().map(Vec::len).sum();
        if let Some(e) = first_setup_error(apps, &ready_rx, stages) {
            // Dropping the sources' senders ends every stage loop before it saw a frame; the
            // scope joins them.
            drop(source_outs);
            return Err(e);
        }
        let start = match settings.start.take() {
            Some(gate) => match gate() {
                Ok(t0) => t0,
                Err(message) => {
                    drop(source_outs);
                    return Err(RunError::Setup {
                        app: apps
                            .iter()
                            .map(|a| a.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", "),
                        message,
                    });
                }
            },
            None => clock::now_ns() + settings.timing.start_delay_ms as i64 * 1_000_000,
        };
        let _ = t0.set(start);
        let spin_ns = settings.timing.spin_us as i64 * 1000;
        let stop = settings.stop;
        let source_threads: Vec<_> = apps
            .iter()
            .zip(sources)
            .zip(source_outs)
            .zip(&protections)
            .map(|(((app, src), outs), protection)| {
                let release = Release {
                    t0: start,
                    spin_ns,
                    stop,
                    publisher: protection.publisher().cloned(),
                };
                scope.spawn(move || release_frames(app, src, outs, release))
            })
            .collect();
        // From here on only a critical app's source and sink hold its publisher: when both
        // have ended, its slot is freed for good and best effort no longer waits for it.
        drop(protections);
        let records = apps
            .iter()
            .zip(source_threads)
            .zip(stage_threads)
            .map(|((app, src), stages)| collect(app, src, stages))
            .collect();
        Ok(RunOutcome {
            apps: records,
            t0_ns: start,
            wall_s: (clock::now_ns() - start) as f64 / 1e9,
        })
    })
}

fn setup(app: &AppSpec, message: String) -> RunError {
    RunError::Setup {
        app: app.name.clone(),
        message,
    }
}

/// Waits for every stage to say it is built; the first failure, if any.
fn first_setup_error(
    apps: &[AppSpec],
    ready: &Receiver<Result<(), (usize, String)>>,
    stages: usize,
) -> Option<RunError> {
    let mut failed = None;
    for _ in 0..stages {
        match ready.recv() {
            Ok(Ok(())) => {}
            Ok(Err((a, m))) => {
                failed.get_or_insert_with(|| setup(&apps[a], m));
            }
            Err(_) => break,
        }
    }
    failed
}

type StageResult = (Vec<StageRecord>, Option<String>);

/// One app's records, once its source and every stage have ended.
fn collect(
    app: &AppSpec,
    source: thread::ScopedJoinHandle<'_, SourceResult>,
    stages: Vec<thread::ScopedJoinHandle<'_, StageResult>>,
) -> AppRecords {
    let (release_ns, sent_ns, source_error) = source.join().unwrap_or_else(|_| {
        let panicked = Some("the source thread panicked".to_string());
        (Vec::new(), Vec::new(), panicked)
    });
    let mut records = AppRecords {
        release_ns,
        sent_ns,
        stages: Vec::new(),
        error: source_error,
    };
    for (j, h) in stages.into_iter().enumerate() {
        let (recs, err) = h.join().unwrap_or_else(|_| {
            let name = &app.stages[j].name;
            (Vec::new(), Some(format!("stage `{name}` panicked")))
        });
        records.stages.push(recs);
        if records.error.is_none() {
            records.error = err;
        }
    }
    records
}

/// The source's frame size, read from its first frame, for an app with a GPU preprocess (built
/// for one frame size before the run) or a graphics stage (its renderer made and warmed up
/// before the run); `None` for the others, which need not know it.
fn frame_size(app: &AppSpec) -> Result<Option<[u32; 2]>, String> {
    let renders = app
        .stages
        .iter()
        .any(|s| matches!(s.kind, StageKind::Graphics { .. }));
    if app.gpu_preprocesses().is_empty() && !renders {
        return Ok(None);
    }
    let first = source::open(&app.source.kind)
        .and_then(|mut s| s.next_frame())
        .map_err(|e| e.to_string())?;
    Ok(Some([first.width, first.height]))
}

/// The partitions of stage `j`'s models, renamed from `<app>.<model>` to the model's name. A
/// GPU preprocess gets a shared handle on the partition of the model it feeds, under its own
/// stage name (taken before that model's stage takes the partition itself: stages are built
/// in file order and a preprocess comes before the model it feeds). A GPU preprocess on
/// another GPU than that model's runs outside any partition, on its own GPU.
fn take_partitions(
    all: &mut HashMap<String, Partition>,
    models: &dyn ModelBuilder,
    app: &AppSpec,
    device: &DeviceSpec,
    j: usize,
) -> HashMap<String, Partition> {
    if let StageKind::Preprocess(p) = &app.stages[j].kind {
        let name = &app.stages[j].name;
        let shared = (p.device == crate::spec::PreprocessDevice::Gpu)
            .then(|| app.fed_model(j))
            .flatten()
            .filter(|m| Some(app.model_gpu(m, device)) == app.stage_gpu(j, device))
            .and_then(|m| all.get(&crate::partitions::workload_name(app, &m.name)))
            .and_then(|p| models.share_partition(p));
        return shared.map(|p| (name.clone(), p)).into_iter().collect();
    }
    let names: Vec<String> = match &app.stages[j].kind {
        StageKind::Model(m) => vec![m.name.clone()],
        StageKind::Ensemble { members, vote } => {
            let mut n: Vec<String> = members.iter().map(|m| m.name.clone()).collect();
            if let crate::spec::Vote::Onnx(m) = vote {
                n.push(m.name.clone());
            }
            n
        }
        _ => Vec::new(),
    };
    names
        .into_iter()
        .filter_map(|n| {
            all.remove(&crate::partitions::workload_name(app, &n))
                .map(|p| (n, p))
        })
        .collect()
}

type SourceResult = (Vec<i64>, Vec<i64>, Option<String>);

/// How a source releases its frames.
struct Release<'a> {
    t0: i64,
    spin_ns: i64,
    stop: &'a AtomicBool,
    /// A critical app's: each frame is announced to the guard before it is made.
    publisher: Option<Arc<FramePublisher>>,
}

/// The source's loop: the next frame is read before its release, then sent at it.
fn release_frames(
    app: &AppSpec,
    mut src: Box<dyn FrameSource>,
    outs: Vec<Sender<Msg>>,
    r: Release<'_>,
) -> SourceResult {
    let Release {
        t0,
        spin_ns,
        stop,
        publisher,
    } = r;
    let period = app.period_ns();
    let mut release_ns = Vec::with_capacity(app.frames.min(PREALLOCATED) as usize);
    if let Err(e) = isolane_runtime::affinity::pin_current_thread(&app.cpu) {
        return (release_ns, Vec::new(), Some(e.to_string()));
    }
    let mut sent_ns = Vec::with_capacity(app.frames.min(PREALLOCATED) as usize);
    for k in 0..app.frames {
        let release = t0 + k as i64 * period;
        if let Some(p) = &publisher {
            p.announce(k, release);
        }
        let frame = match src.next_frame() {
            Ok(f) => f,
            Err(e) => return (release_ns, sent_ns, Some(e.to_string())),
        };
        if !clock::wait_until_ns(release, spin_ns, stop) || stop.load(Ordering::Relaxed) {
            break;
        }
        let msg = Msg {
            index: k,
            release_ns: release - t0,
            frame: frame.clone(),
            payload: Some(Arc::new(Payload::Frame(frame))),
        };
        sent_ns.push(clock::now_ns() - t0);
        release_ns.push(release - t0);
        for o in &outs {
            // A stage that failed has gone; the others still get their frames.
            let _ = o.send(msg.clone());
        }
    }
    (release_ns, sent_ns, None)
}

/// One stage's thread: builds the stage, then processes frames until its inputs close.
struct StageWorker<'a> {
    app: &'a AppSpec,
    index: usize,
    inputs: Vec<Receiver<Msg>>,
    outputs: Vec<Sender<Msg>>,
    t0: Arc<OnceLock<i64>>,
    /// A best-effort app's stage that competes with critical work: held by the guard.
    hold: Option<StageHold>,
    /// A critical app's sink: tells the guard each frame has arrived.
    publisher: Option<Arc<FramePublisher>>,
    stop: &'a AtomicBool,
    meters: Option<&'a isolane_metrics::AppMeters>,
}

impl StageWorker<'_> {
    fn run(
        mut self,
        mut ctx: StageContext<'_>,
        ready: Sender<Result<(), (usize, String)>>,
        app_index: usize,
    ) -> StageResult {
        let name = &self.app.stages[self.index].name;
        // Pinned before the build, so that whatever threads the stage starts inherit it.
        let built = isolane_runtime::affinity::pin_current_thread(&self.app.cpu)
            .map_err(|e| e.to_string())
            .and_then(|()| stage::build(&self.app.stages[self.index], &mut ctx));
        let mut stage = match built {
            Ok(s) => {
                let _ = ready.send(Ok(()));
                s
            }
            Err(e) => {
                let _ = ready.send(Err((app_index, format!("stage `{name}`: {e}"))));
                return (Vec::new(), Some(e));
            }
        };
        drop(ready);
        let mut records = Vec::with_capacity(self.app.frames.min(PREALLOCATED) as usize);
        let mut error = None;
        while let Some(msgs) = self.receive() {
            let first = &msgs[0];
            let payloads: Option<Vec<Arc<Payload>>> =
                msgs.iter().map(|m| m.payload.clone()).collect();
            let (record, output) = match payloads {
                Some(p) if error.is_none() && !self.too_late(first.release_ns) => {
                    let (record, out) = self.process(&mut *stage, first, &p);
                    if let (Some(p), Some(end)) = (&self.publisher, record.end_ns) {
                        p.arrived(first.index, end + self.t0());
                    }
                    match out {
                        Ok(o) => (record, Some(Arc::new(o))),
                        Err(e) => {
                            error = Some(format!("stage `{name}`, frame {}: {e}", first.index));
                            (StageRecord::skipped(first.index), None)
                        }
                    }
                }
                _ => {
                    if let Some(p) = &self.publisher {
                        p.arrived(first.index, clock::now_ns());
                    }
                    (StageRecord::skipped(first.index), None)
                }
            };
            if let Some(m) = self.meters {
                m.stage_done(app_index, self.index, first.release_ns, &record);
            }
            records.push(record);
            let msg = Msg {
                index: first.index,
                release_ns: first.release_ns,
                frame: first.frame.clone(),
                payload: output,
            };
            for o in &self.outputs {
                let _ = o.send(msg.clone());
            }
        }
        (records, error)
    }

    fn t0(&self) -> i64 {
        self.t0.get().copied().unwrap_or(0)
    }

    /// `late = "skip"` and the frame's deadline has passed: it is not started. Never at the
    /// sink: a frame that got there is measured, late or not (dropping it there would leave
    /// the late frames' latencies out of the distribution).
    fn too_late(&self, release_ns: i64) -> bool {
        self.app.late == Late::Skip
            && self.app.stages[self.index].kind != StageKind::Sink
            && clock::now_ns() - self.t0() > release_ns + self.app.deadline_ns()
    }

    /// Runs the stage on one frame and records its times (since t0), its ensemble members'
    /// and, for the sink, what reached it (described after the end time is taken).
    fn process(
        &mut self,
        stage: &mut dyn stage::Stage,
        msg: &Msg,
        inputs: &[Arc<Payload>],
    ) -> (StageRecord, Result<Payload, String>) {
        let t0 = self.t0();
        if let Some(h) = &mut self.hold {
            h.before(self.stop);
        }
        let start = clock::now_ns();
        let out = stage.process(&msg.frame, inputs);
        let end = clock::now_ns();
        let held_ns = self.hold.as_mut().map_or(0, |h| h.after(end - start));
        let is_sink = self.app.stages[self.index].kind == StageKind::Sink;
        let record = StageRecord {
            frame: msg.index,
            start_ns: Some(start - t0),
            end_ns: Some(end - t0),
            members: stage
                .member_times()
                .iter()
                .map(|(s, e)| (s - t0, e - t0))
                .collect(),
            output: is_sink.then(|| {
                let what: Vec<String> = inputs.iter().map(|x| x.describe()).collect();
                what.join("; ")
            }),
            held_ns,
            transfer: stage.transfer(),
        };
        (record, out)
    }

    /// One message from every input (they arrive in frame order), or `None` once one closes.
    fn receive(&self) -> Option<Vec<Msg>> {
        self.inputs.iter().map(|r| r.recv().ok()).collect()
    }
}
