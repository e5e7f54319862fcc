//! `host = "process"`: worker processes, a worker killed mid-run, and Ctrl-C (issue 2).

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;

const TWO_PROCESSES: &str = r#"
[device]
backend = "cpu"
mechanism = "none"
host = "process"

[timing]
start_delay_ms = 20

# `queue`: a job delayed by a busy machine runs late instead of being skipped, so the survivor
# completes every one of its 300 jobs however loaded the machine is.
[[workload]]
name = "doomed"
model = "spin:1ms"
rate_hz = 100
duration_s = 3
warmup_jobs = 2
late = "queue"

[[workload]]
name = "survivor"
model = "spin:1ms"
rate_hz = 100
duration_s = 3
warmup_jobs = 2
late = "queue"
"#;

fn wait_for_worker(parent: u32, workload: &str) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(&pid) = worker_pids(parent, workload).first() {
            return pid;
        }
        assert!(
            Instant::now() < deadline,
            "no worker for {workload} appeared"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_killed_worker_is_reported_and_the_other_workload_finishes() {
    let tmp = tempfile::tempdir().unwrap();
    let sc = scenario(tmp.path(), "s.toml", TWO_PROCESSES);
    let out = tmp.path().join("out");
    let mut child = isolane()
        .arg("run")
        .arg(&sc)
        .arg("--out")
        .arg(&out)
        .arg("--quiet")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = wait_for_worker(child.id(), "doomed");
    // Both warm up in a few ms; 1.2 s in, the doomed worker has completed about 100 jobs.
    std::thread::sleep(Duration::from_millis(1200));
    // SAFETY: plain kill(2) of a pid we found as our child's worker.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
    let status = child.wait().unwrap();
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    // Documented: exit code 1 when any workload failed (its results are still written).
    assert_eq!(status.code(), Some(1), "stderr: {stderr}");
    assert!(
        stderr.contains("doomed") && stderr.contains("signal 9"),
        "{stderr}"
    );

    let s = summary(&out);
    assert_eq!(s["status"], "failed");
    let doomed = workload(&s, "doomed");
    assert_eq!(doomed["status"], "failed");
    assert_eq!(doomed["signal"], 9);
    assert!(
        doomed["error"].as_str().unwrap().contains("SIGKILL"),
        "{doomed}"
    );
    // The jobs it completed before dying were streamed out and kept.
    let kept = doomed["completed"].as_u64().unwrap();
    println!("killed worker kept {kept} completed jobs");
    // About 100 on an idle machine; a slow start under load leaves fewer, never none.
    assert!((10..300).contains(&kept), "kept {kept}");
    assert_eq!(
        jobs_rows(&out, "doomed").len() as u64,
        doomed["jobs"].as_u64().unwrap()
    );

    let survivor = workload(&s, "survivor");
    assert_eq!(survivor["status"], "ok");
    assert_eq!(survivor["jobs"], 300);
    assert_eq!(survivor["completed"], 300);
    // 1 ms of work a job: the neighbour's death leaves the survivor's typical job alone (5 ms of
    // room for a loaded machine).
    assert!(f(&survivor["latency_ms"]["p50"]) < 5.0, "{survivor}");
    assert_eq!(jobs_rows(&out, "survivor").len(), 300);
}

#[test]
fn ctrl_c_stops_threads_and_workers_and_writes_what_was_measured() {
    let tmp = tempfile::tempdir().unwrap();
    let sc = scenario(
        tmp.path(),
        "s.toml",
        r#"
[device]
backend = "cpu"
mechanism = "none"
host = "thread"

[[workload]]
name = "in-thread"
model = "spin:1ms"
rate_hz = 50
duration_s = 30

[[workload]]
name = "in-process"
host = "process"
model = "spin:1ms"
rate_hz = 50
duration_s = 30
"#,
    );
    let out = tmp.path().join("out");
    let mut child = isolane()
        .arg("run")
        .arg(&sc)
        .arg("--out")
        .arg(&out)
        .arg("--quiet")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for_worker(child.id(), "in-process");
    std::thread::sleep(Duration::from_millis(1200));
    let sent = Instant::now();
    // SAFETY: plain kill(2) of our own child.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let status = child.wait().unwrap();
    println!(
        "stopped {:.0} ms after SIGINT",
        sent.elapsed().as_secs_f64() * 1e3
    );
    assert_eq!(status.code(), Some(130));
    // Far inside the 30 s the run would take, with room for a stalled VM.
    assert!(sent.elapsed() < Duration::from_secs(10));
    let s = summary(&out);
    assert_eq!(s["status"], "interrupted");
    assert_eq!(s["interrupted"], true);
    for name in ["in-thread", "in-process"] {
        let w = workload(&s, name);
        assert_eq!(w["status"], "interrupted", "{w}");
        let jobs = w["jobs"].as_u64().unwrap();
        assert!((20..1500).contains(&jobs), "{name}: {jobs} jobs");
        assert_eq!(jobs_rows(&out, name).len() as u64, jobs);
    }
    assert!(out.join("scenario.toml").exists());
}

/// SIGTERM while a worker warms up: the run stops, and the worker, told to abort, answers
/// that it was interrupted. The coordinator dropped that answer and reported the workload
/// FAILED ("the worker exited without finishing its run").
#[test]
fn a_worker_stopped_during_its_warm_up_is_interrupted_not_failed() {
    let tmp = tempfile::tempdir().unwrap();
    let sc = scenario(
        tmp.path(),
        "s.toml",
        r#"
[device]
backend = "cpu"
mechanism = "none"

[[workload]]
name = "warming"
host = "process"
model = "spin:50ms"
rate_hz = 10
duration_s = 30
warmup_jobs = 60
"#,
    );
    let out = tmp.path().join("out");
    let mut child = isolane()
        .arg("run")
        .arg(&sc)
        .arg("--out")
        .arg(&out)
        .arg("--quiet")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // The worker is up and in its 3 s warm-up.
    wait_for_worker(child.id(), "warming");
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: plain kill(2) of our own child.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130));
    let s = summary(&out);
    assert_eq!(s["status"], "interrupted", "{s}");
    let w = workload(&s, "warming");
    assert_eq!(w["status"], "interrupted", "{w}");
    assert!(w.get("error").is_none_or(|e| e.is_null()), "{w}");
    assert_eq!(w["jobs"], 0, "{w}");
}

#[test]
fn worker_refuses_another_protocol_version() {
    // Every role's first message is checked before it is read.
    for role in ["setup", "probe", "maxrate", "app", "exec"] {
        let mut child = isolane()
            .arg("worker")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let hello: serde_json::Value =
            serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
        assert_eq!(hello["type"], "hello");
        assert_eq!(
            hello["protocol_version"],
            isolane_runtime::protocol::PROTOCOL_VERSION
        );
        writeln!(stdin, r#"{{"type":"{role}","protocol_version":99}}"#).unwrap();
        let err: serde_json::Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
        assert_eq!(err["type"], "error", "{role}");
        let msg = err["message"].as_str().unwrap();
        assert!(
            msg.contains("version mismatch") && msg.contains("99"),
            "{role}: {msg}"
        );
        assert_eq!(child.wait().unwrap().code(), Some(2), "{role}");
    }
}

#[test]
fn a_worker_that_cannot_start_fails_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let sc = scenario(
        tmp.path(),
        "s.toml",
        r#"
[device]
backend = "cpu"
mechanism = "none"
host = "thread"

[[workload]]
name = "fine"
model = "spin:1ms"
rate_hz = 100
jobs = 50
late = "queue"

[[workload]]
name = "broken"
host = "process"
model = "spin:1ms"
rate_hz = 100
jobs = 50
"#,
    );
    let out = tmp.path().join("out");
    // `true` exits at once without a word of the protocol.
    let o = isolane()
        .env("ISOLANE_WORKER_EXE", "/bin/true")
        .arg("run")
        .arg(&sc)
        .arg("--out")
        .arg(&out)
        .arg("-q")
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let s = summary(&out);
    assert_eq!(workload(&s, "fine")["status"], "ok");
    assert_eq!(workload(&s, "fine")["completed"], 50);
    let broken = workload(&s, "broken");
    assert_eq!(broken["status"], "failed");
    assert!(
        broken["error"].as_str().unwrap().contains("hello"),
        "{broken}"
    );
}

/// Served in worker processes (`host = "process"`, which MPS, MIG and time slices need): a
/// critical model and a best-effort one the guard splits into pieces, each in an `isolane
/// worker` of its own; what a client sends comes back (a `spin:` model echoes its rows), and
/// SIGTERM drains the server and ends its workers.
const SERVED_IN_WORKERS: &str = r#"
[device]
backend = "cpu"
mechanism = "none"
host = "process"

[[workload]]
name = "crit"
model = "spin:2ms"
criticality = "critical"
rate_hz = 50
duration_s = 1
deadline_ms = 60000
warmup_jobs = 1

[[workload]]
name = "be"
model = "spin:20ms"
batch = 2
criticality = "best_effort"
rate_hz = 10
duration_s = 1
deadline_ms = 60000
warmup_jobs = 1
"#;

fn outputs(body: &str) -> Vec<f64> {
    let v: serde_json::Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
    v["outputs"][0]["data"]
        .as_array()
        .unwrap_or_else(|| panic!("no outputs in {body}"))
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

#[test]
fn serve_runs_process_hosted_models_in_workers_of_their_own() {
    let dir = tempfile::tempdir().unwrap();
    let file = scenario(dir.path(), "served.toml", SERVED_IN_WORKERS);
    let mut server = ServeProcess::start(dir.path(), &file);
    let pid = server.child.id();
    let addr = server.http.clone();
    let workers: Vec<u32> = ["crit", "be"]
        .iter()
        .flat_map(|name| {
            let pids = worker_pids(pid, name);
            assert_eq!(pids.len(), 1, "one worker for `{name}`: {pids:?}");
            pids
        })
        .collect();

    let one = r#"{"inputs":[{"name":"input","shape":[1,1],"datatype":"FP32","data":[7.5]}]}"#;
    let (status, body) = http(&addr, "POST", "/v2/models/crit/infer", one);
    assert_eq!(status, 200, "{body}; stderr:\n{}", server.log());
    assert_eq!(outputs(&body), vec![7.5]);
    // The best-effort model runs in pieces the guard may hold (split in its worker).
    let two = r#"{"inputs":[{"name":"input","shape":[2,1],"datatype":"FP32","data":[1.25,-3]}]}"#;
    for _ in 0..3 {
        let (status, body) = http(&addr, "POST", "/v2/models/be/infer", two);
        assert_eq!(status, 200, "{body}; stderr:\n{}", server.log());
        assert_eq!(outputs(&body), vec![1.25, -3.0]);
    }
    let (status, body) = http(&addr, "GET", "/v2/models/be/ready", "");
    assert_eq!(status, 200, "{body}");

    // SAFETY: kill sends a signal to the child this test started and still holds.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGTERM) }, 0);
    let until = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = server.child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < until, "no exit; stderr:\n{}", server.log());
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(0), "stderr:\n{}", server.log());
    // The workers end with the server (reparented, a finished one is reaped at once).
    let gone = |pid: &u32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |st| {
            st.rsplit_once(')')
                .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
        })
    };
    let until = Instant::now() + Duration::from_secs(20);
    while !workers.iter().all(gone) {
        assert!(
            Instant::now() < until,
            "workers {workers:?} outlived the server"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A process-hosted workload whose model does not fit its worker's memory fails alone, its
/// worker exits 3 (summary.json's `exit_code`), and `run` exits 3 as `infer` does. The
/// address-space limit makes the out-of-memory deterministic: resnet18's CPU arena at batch
/// 256 is about 1.1 GiB, more than the 1 GiB each process gets; the spin workload fits.
#[test]
fn a_worker_out_of_memory_fails_its_workload_and_run_exits_3() {
    let (o, s) = run_out_of_memory("process");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert_eq!(workload(&s, "fine")["status"], "ok");
    let big = workload(&s, "big");
    assert_eq!(big["status"], "failed");
    assert_eq!(big["exit_code"], 3, "{big}");
    assert!(
        big["error"].as_str().unwrap().contains("out of memory"),
        "{big}"
    );
}

/// The same with thread hosts: the failed workload has no exit code of its own, so
/// summary.json says `ran_out_of_memory`, and `run` still exits 3.
#[test]
fn a_thread_out_of_memory_fails_its_workload_and_run_exits_3() {
    let (o, s) = run_out_of_memory("thread");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert_eq!(workload(&s, "fine")["status"], "ok");
    let big = workload(&s, "big");
    assert_eq!(big["status"], "failed");
    assert_eq!(big["ran_out_of_memory"], true, "{big}");
    assert!(
        big["error"].as_str().unwrap().contains("out of memory"),
        "{big}"
    );
}

fn run_out_of_memory(host: &str) -> (std::process::Output, serde_json::Value) {
    let tmp = tempfile::tempdir().unwrap();
    let sc = scenario(
        tmp.path(),
        "s.toml",
        &r#"
[device]
backend = "cpu"
mechanism = "none"
host = "HOST"

[[workload]]
name = "fine"
model = "spin:1ms"
rate_hz = 100
jobs = 20
late = "queue"

[[workload]]
name = "big"
model = "resnet18"
batch = 256
rate_hz = 1
jobs = 1
"#
        .replace("HOST", host),
    );
    let out = tmp.path().join("out");
    let o = std::process::Command::new("sh")
        .arg("-c")
        .arg("ulimit -v 1048576 && exec \"$@\"")
        .arg("sh")
        .arg(env!("CARGO_BIN_EXE_isolane"))
        .arg("run")
        .arg(&sc)
        .arg("--out")
        .arg(&out)
        .arg("-q")
        .output()
        .unwrap();
    let s = summary(&out);
    (o, s)
}
