//! A command workload in the coordinator: its partition's environment (what
//! `isolane_session` hands over for an MPS client or a MIG instance) reaches the program, the
//! worker-start hook (the MPS daemon's adopter) sees its pid, and its result is summarised.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use isolane_core::results::ProgramEnd;
use isolane_core::spec::Scenario;
use isolane_runtime::coordinator::{self, RunOptions, RunPlan};
use isolane_runtime::results::{summarize_run, RunInfo};
use isolane_runtime::WorkloadStatus;

#[test]
fn the_partition_environment_and_the_start_hook_reach_a_program() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = Scenario::from_toml_str(
        r#"
[timing]
start_delay_ms = 10

[[workload]]
name = "client"
command = ["sh", "-c", "echo $CUDA_MPS_ACTIVE_THREAD_PERCENTAGE $CUDA_VISIBLE_DEVICES"]
timeout_s = 60

[[workload]]
name = "spin"
model = "spin:1ms"
rate_hz = 50
jobs = 5
warmup_jobs = 0
"#,
        dir.path().join("s.toml"),
        &Vec::<String>::new(),
    )
    .unwrap();
    let plan = RunPlan::from_scenario(&scenario);
    let mut opts = RunOptions::new(Arc::new(AtomicBool::new(false)));
    opts.jobs_dir = Some(dir.path().to_path_buf());
    opts.worker_env = BTreeMap::from([(
        "client".to_string(),
        vec![
            (
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".to_string(),
                "25".to_string(),
            ),
            ("CUDA_VISIBLE_DEVICES".to_string(), "0".to_string()),
        ],
    )]);
    let started: Arc<Mutex<Vec<(String, u32)>>> = Arc::default();
    let seen = Arc::clone(&started);
    opts.on_worker_start = Some(Arc::new(move |name: &str, pid: u32| {
        seen.lock().unwrap().push((name.to_string(), pid));
    }));
    let result = coordinator::run(&plan, &opts, &mut |_| {}).unwrap();
    let client = &result.workloads[0];
    assert_eq!(client.status, WorkloadStatus::Ok);
    let outcome = client.program.as_ref().expect("a program outcome");
    assert_eq!(outcome.end, ProgramEnd::Exited);
    let out = std::fs::read_to_string(dir.path().join("client.stdout")).unwrap();
    assert_eq!(out, "25 0\n");
    let started = started.lock().unwrap().clone();
    assert_eq!(started, [("client".to_string(), outcome.pids[0])]);
    assert_eq!(result.workloads[1].records.len(), 5);

    let info = RunInfo {
        command: "run",
        started_at: chrono::Utc::now(),
        scenario: "s.toml".into(),
    };
    let summary = summarize_run(&info, &plan.workloads, &result);
    let w = &summary.workloads[0];
    let p = w.program.as_ref().unwrap();
    assert_eq!(w.exit_code, Some(0));
    assert_eq!(w.pid, Some(outcome.pids[0]));
    assert_eq!(p.stdout, "client.stdout");
    assert!(p.started_s >= 0.0 && p.ended_s >= p.started_s, "{p:?}");
    assert_eq!(
        w.model,
        "sh -c \"echo $CUDA_MPS_ACTIVE_THREAD_PERCENTAGE $CUDA_VISIBLE_DEVICES\""
    );
}

#[test]
fn a_program_is_neither_protected_nor_held_by_the_criticality_guard() {
    let text = r#"
[[workload]]
name = "program"
command = ["true"]

[[workload]]
name = "best-effort"
model = "spin:1ms"
criticality = "best_effort"
rate_hz = 50
jobs = 3
"#;
    let scenario = Scenario::from_toml_str(text, "s.toml", &Vec::<String>::new()).unwrap();
    // Only best effort besides the program: nothing to protect.
    assert!(!RunPlan::from_scenario(&scenario).protects());
}
