//! `run_worker` in the probe, maxrate and app roles, driven over pipes as a parent process
//! would drive `isolane worker` (no GPU: a fake probe; a `spin:` model for the search; a fake
//! app runner).

use std::io::{BufRead, BufReader, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use isolane_core::maxrate::{MaxRateConfig, Step};
use isolane_core::probe::{ProbeConfig, ProbeResult};
use isolane_core::spec::{
    Backend, Criticality, DeviceSpec, Host, LatePolicy, Mechanism, PartitionSpec, Precision, Rate,
    Role, RunLength, TimingSpec, WorkloadSpec,
};
use isolane_runtime::maxrate::{SearchEvent, SearchRequest};
use isolane_runtime::probe_role::{ProbeFactory, ProbeTarget};
use isolane_runtime::protocol::{DoneStatus, FromWorker, ToWorker, PROTOCOL_VERSION};
use isolane_runtime::worker::{run_worker, WorkerRoles};

/// A probe that does 1000 items alone and 250 while any probe of its factory saturates.
struct FakeProbes {
    busy: Arc<AtomicUsize>,
    gpu_seen: Arc<AtomicUsize>,
    /// The launches the last saturation counted.
    launches: Arc<AtomicU64>,
}

struct FakeProbe {
    busy: Arc<AtomicUsize>,
    launches: Arc<AtomicU64>,
}

impl ProbeFactory for FakeProbes {
    fn open(&self, gpu: u32) -> Result<Box<dyn ProbeTarget>, String> {
        self.gpu_seen.store(gpu as usize, Ordering::SeqCst);
        Ok(Box::new(FakeProbe {
            busy: Arc::clone(&self.busy),
            launches: Arc::clone(&self.launches),
        }))
    }
}

impl ProbeTarget for FakeProbe {
    fn measure(&mut self, _duration: Duration) -> Result<ProbeResult, String> {
        let items = if self.busy.load(Ordering::SeqCst) > 0 {
            250
        } else {
            1000
        };
        Ok(ProbeResult::from_counts(
            items,
            1.0,
            &[1],
            1,
            ProbeConfig::default(),
        ))
    }

    fn saturate(&mut self, stop: &AtomicBool) -> Result<u64, String> {
        self.busy.fetch_add(1, Ordering::SeqCst);
        // One launch at least, then until the flag, however long the test takes to send
        // `stop_saturate`; the count is also kept for the test.
        let mut launches = 1000;
        while !stop.load(Ordering::SeqCst) {
            launches += 1;
            std::thread::sleep(Duration::from_millis(1));
        }
        self.busy.fetch_sub(1, Ordering::SeqCst);
        self.launches.store(launches, Ordering::SeqCst);
        Ok(launches)
    }
}

/// The parent's ends of a worker run on its own thread: its stdin and its stdout.
struct Parent {
    to_worker: std::io::PipeWriter,
    from_worker: BufReader<std::io::PipeReader>,
    worker: std::thread::JoinHandle<i32>,
}

impl Parent {
    fn start(
        roles: impl FnOnce(std::io::PipeReader, std::io::PipeWriter) -> i32 + Send + 'static,
    ) -> Self {
        let (worker_in, to_worker) = std::io::pipe().unwrap();
        let (from_worker, worker_out) = std::io::pipe().unwrap();
        let worker = std::thread::spawn(move || roles(worker_in, worker_out));
        Parent {
            to_worker,
            from_worker: BufReader::new(from_worker),
            worker,
        }
    }

    fn send(&mut self, msg: &ToWorker) {
        let mut line = serde_json::to_vec(msg).unwrap();
        line.push(b'\n');
        self.to_worker.write_all(&line).unwrap();
    }

    fn recv(&mut self) -> FromWorker {
        let mut line = String::new();
        assert_ne!(
            self.from_worker.read_line(&mut line).unwrap(),
            0,
            "worker closed"
        );
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"))
    }

    /// Closes the worker's input and returns its exit code.
    fn finish(self) -> i32 {
        drop(self.to_worker);
        self.worker.join().unwrap()
    }
}

#[test]
fn the_probe_role_measures_and_saturates_on_request() {
    let busy = Arc::new(AtomicUsize::new(0));
    let gpu_seen = Arc::new(AtomicUsize::new(99));
    let counted = Arc::new(AtomicU64::new(0));
    let probes = FakeProbes {
        busy: Arc::clone(&busy),
        gpu_seen: Arc::clone(&gpu_seen),
        launches: Arc::clone(&counted),
    };
    let mut parent = Parent::start(move |input, output| {
        let roles = WorkerRoles {
            probes: Some(&probes),
            ..WorkerRoles::default()
        };
        run_worker(
            BufReader::new(input),
            output,
            Arc::new(AtomicBool::new(false)),
            roles,
        )
    });
    assert!(
        matches!(parent.recv(), FromWorker::Hello { protocol_version, .. } if protocol_version == PROTOCOL_VERSION)
    );
    parent.send(&ToWorker::Probe {
        protocol_version: PROTOCOL_VERSION,
        gpu: 3,
    });
    assert_eq!(parent.recv(), FromWorker::ProbeReady);
    assert_eq!(
        gpu_seen.load(Ordering::SeqCst),
        3,
        "the probe opens the GPU named"
    );

    parent.send(&ToWorker::Measure { duration_s: 0.01 });
    let FromWorker::Measured { result } = parent.recv() else {
        panic!("not measured")
    };
    assert_eq!(result.items, 1000);

    parent.send(&ToWorker::StartSaturate);
    assert_eq!(parent.recv(), FromWorker::Saturating);
    parent.send(&ToWorker::StopSaturate);
    let FromWorker::SaturateStopped { launches } = parent.recv() else {
        panic!("not stopped")
    };
    assert_eq!(launches, counted.load(Ordering::SeqCst));
    assert!(launches >= 1000, "{launches}");
    assert_eq!(busy.load(Ordering::SeqCst), 0, "saturation ended");

    parent.send(&ToWorker::Stop);
    assert!(matches!(
        parent.recv(),
        FromWorker::Done {
            status: DoneStatus::Ok,
            ..
        }
    ));
    assert_eq!(parent.finish(), 0);
}

#[test]
fn a_worker_without_probes_refuses_the_probe_role() {
    let mut parent = Parent::start(|input, output| {
        run_worker(
            BufReader::new(input),
            output,
            Arc::new(AtomicBool::new(false)),
            WorkerRoles::default(),
        )
    });
    parent.recv();
    parent.send(&ToWorker::Probe {
        protocol_version: PROTOCOL_VERSION,
        gpu: 0,
    });
    let FromWorker::Error { message } = parent.recv() else {
        panic!("no error")
    };
    assert!(message.contains("cannot run the GPU probe"), "{message}");
    assert_eq!(parent.finish(), 1);
}

#[test]
fn a_first_message_of_another_version_is_refused_with_exit_code_2() {
    let mut parent = Parent::start(|input, output| {
        run_worker(
            BufReader::new(input),
            output,
            Arc::new(AtomicBool::new(false)),
            WorkerRoles::default(),
        )
    });
    parent.recv();
    parent.send(&ToWorker::Probe {
        protocol_version: PROTOCOL_VERSION - 1,
        gpu: 0,
    });
    let FromWorker::Error { message } = parent.recv() else {
        panic!("no error")
    };
    assert!(message.contains("version mismatch"), "{message}");
    assert_eq!(parent.finish(), 2);
}

fn spin_search(model: &str) -> SearchRequest {
    SearchRequest {
        workload: WorkloadSpec {
            name: "maxrate".into(),
            model: model.into(),
            weights: None,
            batch: 1,
            precision: Precision::Fp32,
            calibration: None,
            rate: Rate::Hz(1.0),
            deadline_ms: None,
            phase_ms: None,
            length: RunLength::Jobs(20),
            warmup_jobs: 2,
            late: LatePolicy::Skip,
            cpu: Vec::new(),
            role: Role::Standalone,
            ramp: None,
            host: Host::Process,
            partition: PartitionSpec::default(),
            plan_check: true,
            criticality: Criticality::Critical,
            stretch: None,
            backend: Backend::Cpu,
            program: None,
            gpu: None,
            serve: Default::default(),
        },
        device: DeviceSpec {
            backend: Backend::Cpu,
            gpu: 0,
            mechanism: Mechanism::None,
            host: Host::Process,
            gpus: Vec::new(),
        },
        timing: TimingSpec::default(),
        config: MaxRateConfig {
            jobs: 20,
            validations: 1,
            step: Step::Relative(0.5),
            ..MaxRateConfig::default()
        },
    }
}

#[test]
fn the_maxrate_role_reports_progress_and_its_outcome() {
    let mut parent = Parent::start(|input, output| {
        run_worker(
            BufReader::new(input),
            output,
            Arc::new(AtomicBool::new(false)),
            WorkerRoles::default(),
        )
    });
    parent.recv();
    parent.send(&ToWorker::Maxrate {
        protocol_version: PROTOCOL_VERSION,
        search: Box::new(spin_search("spin:1ms")),
    });
    let mut events = Vec::new();
    let outcome = loop {
        match parent.recv() {
            FromWorker::Progress { event } => events.push(event),
            FromWorker::MaxrateDone { outcome } => break outcome,
            other => panic!("unexpected {other:?}"),
        }
    };
    assert!(matches!(
        parent.recv(),
        FromWorker::Done {
            status: DoneStatus::Ok,
            ..
        }
    ));
    assert_eq!(parent.finish(), 0);
    assert!(
        matches!(&events[0], SearchEvent::WarmedUp { job_s } if job_s.len() == 2),
        "{events:?}"
    );
    assert!(matches!(events[1], SearchEvent::BackToBack { jobs: 20 }));
    let batches = events
        .iter()
        .filter(|e| matches!(e, SearchEvent::BatchDone { .. }))
        .count();
    assert_eq!(
        batches,
        outcome.result.trace.len() - 1,
        "one per timed batch"
    );
    // 1 ms jobs: never above 1000 jobs/s, however the machine is loaded.
    let rate = outcome.result.max_rate_hz;
    assert!(rate > 0.0 && rate <= 1010.0, "{rate}");
    assert!(outcome.start_lateness_us.p50.is_some());
}

#[test]
fn a_search_that_cannot_start_reports_why() {
    let mut parent = Parent::start(|input, output| {
        run_worker(
            BufReader::new(input),
            output,
            Arc::new(AtomicBool::new(false)),
            WorkerRoles::default(),
        )
    });
    parent.recv();
    parent.send(&ToWorker::Maxrate {
        protocol_version: PROTOCOL_VERSION,
        search: Box::new(spin_search("resnet18")),
    });
    let FromWorker::Error { message } = parent.recv() else {
        panic!("no error")
    };
    assert!(message.contains("needs the inference engine"), "{message}");
    assert_eq!(parent.finish(), 1);
}

/// An app that records the t0 it was given and, until `stop`, one frame per millisecond (at
/// most `frames`).
struct FakeApp {
    frames: u64,
}

impl isolane_runtime::app_role::AppRunner for FakeApp {
    fn run(
        &self,
        setup: &isolane_runtime::protocol::AppSetup,
        start: &mut dyn FnMut() -> Result<i64, String>,
        stop: &AtomicBool,
    ) -> Result<isolane_core::app_records::AppRecords, String> {
        if setup.app == "unbuildable" {
            return Err("stage `pre`: no such thing".into());
        }
        let t0 = start()?;
        let mut rec = isolane_core::app_records::AppRecords {
            stages: vec![Vec::new()],
            ..Default::default()
        };
        for k in 0..self.frames {
            if stop.load(Ordering::SeqCst) {
                break;
            }
            rec.release_ns.push(t0 + k as i64);
            rec.stages[0].push(isolane_core::app_records::StageRecord::skipped(k));
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(rec)
    }
}

fn app_setup(app: &str) -> ToWorker {
    ToWorker::App {
        protocol_version: PROTOCOL_VERSION,
        setup: Box::new(isolane_runtime::protocol::AppSetup {
            scenario: "s.toml".into(),
            text: String::new(),
            app: app.into(),
            device: spin_search("spin:1ms").device,
            timing: TimingSpec::default(),
            out: None,
            no_plan_check: false,
            render_devices: Default::default(),
            guard: None,
        }),
    }
}

fn app_worker(frames: u64) -> Parent {
    Parent::start(move |input, output| {
        let app = FakeApp { frames };
        let roles = WorkerRoles {
            apps: Some(&app),
            ..WorkerRoles::default()
        };
        run_worker(
            BufReader::new(input),
            output,
            Arc::new(AtomicBool::new(false)),
            roles,
        )
    })
}

/// Ready once built, released at the coordinator's t0, records back typed; `stop` ends the app
/// early (interrupted, with what it measured); `abort` before the start runs nothing; an app
/// that cannot be built is an error naming it.
#[test]
fn the_app_role_reports_ready_starts_at_t0_and_sends_its_records() {
    let mut parent = app_worker(3);
    parent.recv();
    parent.send(&app_setup("a"));
    assert_eq!(parent.recv(), FromWorker::AppReady);
    parent.send(&ToWorker::Start { t0_ns: 1_000 });
    let FromWorker::AppDone { records } = parent.recv() else {
        panic!("no records")
    };
    assert_eq!(records.release_ns, vec![1_000, 1_001, 1_002]);
    assert_eq!(records.stages[0].len(), 3);
    assert!(matches!(
        parent.recv(),
        FromWorker::Done {
            status: DoneStatus::Ok,
            ..
        }
    ));
    assert_eq!(parent.finish(), 0);

    let mut parent = app_worker(u64::MAX);
    parent.recv();
    parent.send(&app_setup("a"));
    assert_eq!(parent.recv(), FromWorker::AppReady);
    parent.send(&ToWorker::Start { t0_ns: 0 });
    parent.send(&ToWorker::Stop);
    let FromWorker::AppDone { records } = parent.recv() else {
        panic!("no records")
    };
    assert!(!records.release_ns.is_empty());
    assert!(matches!(
        parent.recv(),
        FromWorker::Done {
            status: DoneStatus::Interrupted,
            ..
        }
    ));
    assert_eq!(parent.finish(), 0);

    let mut parent = app_worker(3);
    parent.recv();
    parent.send(&app_setup("a"));
    assert_eq!(parent.recv(), FromWorker::AppReady);
    parent.send(&ToWorker::Abort);
    assert!(matches!(
        parent.recv(),
        FromWorker::Done {
            status: DoneStatus::Interrupted,
            ..
        }
    ));
    assert_eq!(parent.finish(), 0);

    let mut parent = app_worker(3);
    parent.recv();
    parent.send(&app_setup("unbuildable"));
    let FromWorker::Error { message } = parent.recv() else {
        panic!("no error")
    };
    // The coordinator names the app (its worker's label); the worker sends the reason.
    assert_eq!(message, "stage `pre`: no such thing");
    assert_eq!(parent.finish(), 1);
}

/// An engine whose every model is an out-of-memory at build, as the engine reports one.
struct OutOfMemoryEngine;

impl isolane_runtime::exec::EngineExecutors for OutOfMemoryEngine {
    fn check(
        &self,
        _device: &DeviceSpec,
        _spec: &WorkloadSpec,
    ) -> Result<(), isolane_runtime::exec::ExecError> {
        Ok(())
    }

    fn build(
        &self,
        _device: &DeviceSpec,
        spec: &WorkloadSpec,
        _seed: u64,
        _index: usize,
        _partition: Option<isolane_runtime::partition::Partition>,
    ) -> Result<Box<dyn isolane_runtime::exec::Executor>, isolane_runtime::exec::ExecError> {
        Err(isolane_runtime::exec::ExecError::OutOfMemory {
            workload: spec.name.clone(),
            message: "out of memory: the activation arena asked for 1.1 GiB".into(),
        })
    }
}

/// A workload worker whose model does not fit exits 3, as `infer` does (the coordinator keeps
/// the worker's exit status in the workload's summary), and says why; another failure of the
/// same worker is still 1.
#[test]
fn a_workload_worker_out_of_memory_exits_3() {
    static ENGINE: OutOfMemoryEngine = OutOfMemoryEngine;
    let setup = |model: &str| {
        let mut spec = spin_search(model).workload;
        spec.name = "big".into();
        ToWorker::Setup {
            protocol_version: PROTOCOL_VERSION,
            index: 0,
            schedule: Box::new(isolane_runtime::schedule::Schedule::from_workload(&spec)),
            workload: Box::new(spec),
            device: Box::new(spin_search(model).device),
            timing: TimingSpec::default(),
            guard: None,
        }
    };
    for (model, code) in [("resnet18", 3), ("spin:nonsense", 1)] {
        let mut parent = Parent::start(|input, output| {
            run_worker(
                BufReader::new(input),
                output,
                Arc::new(AtomicBool::new(false)),
                WorkerRoles {
                    engine: Some(&ENGINE),
                    ..WorkerRoles::default()
                },
            )
        });
        parent.recv();
        parent.send(&setup(model));
        let FromWorker::Error { message } = parent.recv() else {
            panic!("{model}: no error")
        };
        if code == 3 {
            assert!(message.contains("out of memory"), "{message}");
        }
        assert_eq!(parent.finish(), code, "{model}: {message}");
    }
}
