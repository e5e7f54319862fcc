//! The engine is a value the caller passes in, and a workload's partition reaches the engine's
//! `build` through the workload's plan: no process-wide registry on either path.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use isolane_core::spec::{DeviceSpec, Scenario, WorkloadSpec};
use isolane_runtime::coordinator::{self, RunOptions, RunPlan};
use isolane_runtime::exec::{EngineExecutors, ExecError, Executor, SpinExecutor};
use isolane_runtime::partition::{Partition, PartitionHandle};
use isolane_runtime::WorkloadStatus;

const SCENARIO: &str = r#"
[device]
backend = "cpu"

[[workload]]
name = "a"
model = "tiny"
rate_hz = 200
jobs = 2
warmup_jobs = 0

[[workload]]
name = "b"
model = "tiny"
rate_hz = 200
jobs = 2
warmup_jobs = 0
"#;

/// A stand-in engine: every model is a 100 µs spin; it notes what each build was given.
#[derive(Default)]
struct FakeEngine {
    built: Mutex<Vec<(String, Option<u32>)>>,
}

impl EngineExecutors for FakeEngine {
    fn check(&self, _device: &DeviceSpec, _spec: &WorkloadSpec) -> Result<(), ExecError> {
        Ok(())
    }

    fn build(
        &self,
        _device: &DeviceSpec,
        spec: &WorkloadSpec,
        seed: u64,
        _index: usize,
        partition: Option<Partition>,
    ) -> Result<Box<dyn Executor>, ExecError> {
        let partition = partition.map(|p| *p.downcast::<u32>().expect("a u32 partition"));
        self.built
            .lock()
            .unwrap()
            .push((spec.name.clone(), partition));
        Ok(Box::new(SpinExecutor::new(100_000, 0, seed)))
    }
}

fn scenario() -> Scenario {
    // "tiny" is a built-in model of this test's catalog.
    Scenario::from_toml_str(SCENARIO, "test.toml", &vec!["tiny".to_string()]).unwrap()
}

#[test]
fn the_engine_passed_in_builds_each_workload_in_the_partition_its_plan_carries() {
    let scenario = scenario();
    let mut plan = RunPlan::from_scenario(&scenario);
    plan.workloads[1].partition = PartitionHandle::new(Box::new(7u32));
    let engine = Arc::new(FakeEngine::default());
    coordinator::preflight(&plan, Some(engine.as_ref())).unwrap();
    let mut opts = RunOptions::new(Arc::new(AtomicBool::new(false)));
    opts.engine = Some(engine.clone());
    let result = coordinator::run(&plan, &opts, &mut |_| {}).unwrap();

    for w in &result.workloads {
        assert_eq!(w.status, WorkloadStatus::Ok, "{}", w.name);
        assert_eq!(w.records.len(), 2, "{}", w.name);
    }
    let mut built = engine.built.lock().unwrap().clone();
    built.sort();
    assert_eq!(built, [("a".to_string(), None), ("b".to_string(), Some(7))]);
    // Taken once: the plan's handle is empty after the run.
    assert!(plan.workloads[1].partition.take().is_none());
}

#[test]
fn without_an_engine_a_real_model_is_refused_before_the_run() {
    let plan = RunPlan::from_scenario(&scenario());
    let err = coordinator::preflight(&plan, None).unwrap_err();
    assert!(
        err.to_string().contains("needs the inference engine"),
        "{err}"
    );
}

/// An engine that notes the backend each check and build was given.
#[derive(Default)]
struct BackendRecorder {
    seen: Mutex<Vec<(String, &'static str, isolane_core::spec::Backend)>>,
}

impl EngineExecutors for BackendRecorder {
    fn check(&self, device: &DeviceSpec, spec: &WorkloadSpec) -> Result<(), ExecError> {
        let seen = (spec.name.clone(), "check", device.backend);
        self.seen.lock().unwrap().push(seen);
        Ok(())
    }

    fn build(
        &self,
        device: &DeviceSpec,
        spec: &WorkloadSpec,
        seed: u64,
        _index: usize,
        _partition: Option<Partition>,
    ) -> Result<Box<dyn Executor>, ExecError> {
        let seen = (spec.name.clone(), "build", device.backend);
        self.seen.lock().unwrap().push(seen);
        Ok(Box::new(SpinExecutor::new(100_000, 0, seed)))
    }
}

#[test]
fn each_workload_is_checked_and_built_for_its_own_backend() {
    use isolane_core::spec::{Backend, Mechanism};
    // A GPU scenario (green: thread hosts) with one workload on the CPU.
    let text = r#"
[device]
backend = "cuda"
mechanism = "green"

[[workload]]
name = "on-cpu"
model = "tiny"
backend = "cpu"
rate_hz = 200
jobs = 2
warmup_jobs = 0

[[workload]]
name = "on-gpu"
model = "tiny"
rate_hz = 200
jobs = 2
warmup_jobs = 0
partition = { sms = 8 }
"#;
    let scenario = Scenario::from_toml_str(text, "test.toml", &vec!["tiny".to_string()]).unwrap();
    assert_eq!(scenario.device.mechanism, Mechanism::Green);
    let plan = RunPlan::from_scenario(&scenario);
    let engine = Arc::new(BackendRecorder::default());
    coordinator::preflight(&plan, Some(engine.as_ref())).unwrap();
    let mut opts = RunOptions::new(Arc::new(AtomicBool::new(false)));
    opts.engine = Some(engine.clone());
    coordinator::run(&plan, &opts, &mut |_| {}).unwrap();
    let mut seen = engine.seen.lock().unwrap().clone();
    seen.sort_by_key(|(name, step, _)| (name.clone(), *step));
    assert_eq!(
        seen,
        [
            ("on-cpu".to_string(), "build", Backend::Cpu),
            ("on-cpu".to_string(), "check", Backend::Cpu),
            ("on-gpu".to_string(), "build", Backend::Cuda),
            ("on-gpu".to_string(), "check", Backend::Cuda),
        ]
    );
}

/// An engine whose builds take a while and note when they ran.
#[derive(Default)]
struct SlowBuilds {
    spans: Mutex<Vec<(std::time::Instant, std::time::Instant)>>,
}

impl EngineExecutors for SlowBuilds {
    fn check(&self, _device: &DeviceSpec, _spec: &WorkloadSpec) -> Result<(), ExecError> {
        Ok(())
    }

    fn build(
        &self,
        _device: &DeviceSpec,
        _spec: &WorkloadSpec,
        seed: u64,
        _index: usize,
        _partition: Option<Partition>,
    ) -> Result<Box<dyn Executor>, ExecError> {
        let start = std::time::Instant::now();
        std::thread::sleep(std::time::Duration::from_millis(30));
        self.spans
            .lock()
            .unwrap()
            .push((start, std::time::Instant::now()));
        Ok(Box::new(SpinExecutor::new(100_000, 0, seed)))
    }
}

/// Workloads build one at a time (a CUDA build times its kernels on the GPU: beside another
/// build, its choice changed from run to run), though each builds on its own thread.
#[test]
fn workloads_build_one_at_a_time() {
    let text = SCENARIO.to_string()
        + "\n[[workload]]\nname = \"c\"\nmodel = \"tiny\"\nrate_hz = 200\njobs = 2\nwarmup_jobs = 0\n";
    let scenario = Scenario::from_toml_str(&text, "test.toml", &vec!["tiny".to_string()]).unwrap();
    let plan = RunPlan::from_scenario(&scenario);
    let engine = Arc::new(SlowBuilds::default());
    let mut opts = RunOptions::new(Arc::new(AtomicBool::new(false)));
    opts.engine = Some(engine.clone());
    let result = coordinator::run(&plan, &opts, &mut |_| {}).unwrap();
    assert!(result
        .workloads
        .iter()
        .all(|w| w.status == WorkloadStatus::Ok));
    let mut spans = engine.spans.lock().unwrap().clone();
    assert_eq!(spans.len(), 3);
    spans.sort();
    for pair in spans.windows(2) {
        assert!(pair[0].1 <= pair[1].0, "two builds overlapped: {pair:?}");
    }
}
