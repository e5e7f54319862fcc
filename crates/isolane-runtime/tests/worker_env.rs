//! A worker process gets its partition's environment, and the start hook sees its pid.

mod common;

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use isolane_core::spec::Scenario;
use isolane_runtime::coordinator::{self, RunOptions, RunPlan, WorkloadStatus};

const SCENARIO: &str = r#"
[device]
backend = "cpu"
host = "process"

[[workload]]
name = "a"
model = "spin:1ms"
rate_hz = 10
jobs = 2
warmup_jobs = 0
"#;

#[test]
fn each_worker_gets_its_environment_and_the_hook_its_pid() {
    let dir = tempfile::tempdir().unwrap();
    let seen = dir.path().join("seen");
    // Not a real worker: it records its environment and exits 3 (the run reports the failure,
    // which is all this test needs from it).
    let exe = dir.path().join("fake-worker");
    common::write_executable(
        &exe,
        &format!(
            "#!/bin/sh\nprintf '%s %s' \"$PARTITION_VAR\" \"$1\" > {}\nexit 3\n",
            seen.display()
        ),
    );

    let scenario = Scenario::from_toml_str(SCENARIO, "test.toml", &Vec::<String>::new()).unwrap();
    let plan = RunPlan::from_scenario(&scenario);
    let mut opts = RunOptions::new(Arc::new(AtomicBool::new(false)));
    opts.worker_exe = Some(exe);
    opts.worker_env
        .insert("a".into(), vec![("PARTITION_VAR".into(), "mps-25".into())]);
    let started: Arc<Mutex<Vec<(String, u32)>>> = Arc::default();
    let log = Arc::clone(&started);
    opts.on_worker_start = Some(Arc::new(move |name: &str, pid: u32| {
        log.lock().unwrap().push((name.to_string(), pid))
    }));
    let result = coordinator::run(&plan, &opts, &mut |_| {}).unwrap();

    assert_eq!(std::fs::read_to_string(&seen).unwrap(), "mps-25 worker");
    let w = &result.workloads[0];
    match &w.status {
        WorkloadStatus::Failed(f) => assert_eq!(f.exit_code, Some(3), "{f:?}"),
        s => panic!("expected the fake worker to fail, got {s:?}"),
    }
    assert_eq!(
        *started.lock().unwrap(),
        vec![("a".to_string(), w.pid.unwrap())]
    );
}
