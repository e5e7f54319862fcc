//! A coordinator killed with SIGKILL runs none of its clean-up; its worker processes must end
//! with it all the same (PR_SET_PDEATHSIG, docs/runtime.md).

mod common;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use isolane_core::spec::Scenario;
use isolane_runtime::coordinator::{self, RunOptions, RunPlan};

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

/// Not a real worker: it writes its pid and then sleeps without ever speaking the protocol, as a
/// worker busy warming up would, so only the kernel can end it once the coordinator is gone.
const SLEEPING_WORKER: &str = "#!/bin/sh\necho $$ > \"$WORKER_PID_FILE\"\nexec sleep 120\n";

/// Run as a child process by the test below: a coordinator with one sleeping worker.
#[test]
fn coordinator_child_helper() {
    let Some(exe) = std::env::var_os("ISOLANE_TEST_COORDINATOR_WORKER") else {
        return; // not the child: nothing to do
    };
    let scenario = Scenario::from_toml_str(SCENARIO, "test.toml", &Vec::<String>::new()).unwrap();
    let plan = RunPlan::from_scenario(&scenario);
    let mut opts = RunOptions::new(Arc::new(AtomicBool::new(false)));
    opts.worker_exe = Some(PathBuf::from(exe));
    let _ = coordinator::run(&plan, &opts, &mut |_| {});
    panic!("the coordinator was to be killed while its worker slept");
}

fn alive(pid: i32) -> bool {
    // A zombie counts as gone: it has exited and only waits to be reaped.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !matches!(
            s.rsplit_once(')')
                .and_then(|(_, r)| r.split_whitespace().next()),
            Some("Z") | Some("X")
        ),
        Err(_) => false,
    }
}

/// Polls `f` until it is true, for at most 20 s (a loaded machine may be slow; a leak never
/// ends).
fn within_20s(mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !f() {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

#[test]
fn a_coordinator_killed_with_sigkill_takes_its_workers_along() {
    let dir = tempfile::tempdir().unwrap();
    let worker = dir.path().join("sleeping-worker");
    common::write_executable(&worker, SLEEPING_WORKER);
    let pid_file = dir.path().join("worker.pid");
    let mut coordinator = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            test_name("coordinator_child_helper").as_str(),
            "--test-threads=1",
        ])
        .env("ISOLANE_TEST_COORDINATOR_WORKER", &worker)
        .env("WORKER_PID_FILE", &pid_file)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut worker_pid = None;
    assert!(
        within_20s(|| {
            worker_pid = std::fs::read_to_string(&pid_file)
                .ok()
                .and_then(|s| s.trim().parse::<i32>().ok());
            worker_pid.is_some()
        }),
        "the worker never started"
    );
    let worker_pid = worker_pid.unwrap();
    assert!(alive(worker_pid));
    coordinator.kill().unwrap();
    coordinator.wait().unwrap();
    assert!(
        within_20s(|| !alive(worker_pid)),
        "worker {worker_pid} outlived its coordinator's SIGKILL"
    );
}

/// The name libtest knows `function` of this file by: its module's path inside the test binary
/// (tests/suite.rs makes each file a module), less the binary's own name, then the function.
fn test_name(function: &str) -> String {
    match module_path!().split_once("::") {
        Some((_, module)) => format!("{module}::{function}"),
        None => function.to_string(),
    }
}
