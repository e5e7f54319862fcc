//! Command workloads (external programs, docs/programs.md) and per-workload backends, through
//! the built binary on the CPU: a program that succeeds, one that fails, one that hangs past
//! its timeout, one stopped at its duration, all beside a model workload whose results are
//! kept; Ctrl-C stops a program and what it started; validation errors exit 2 naming the
//! field. Without NVML the GPU fields are absent.

mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;

const PROGRAMS: &str = r#"
[timing]
start_delay_ms = 20

[[workload]]
name = "spin"
model = "spin:1ms"
rate_hz = 50
duration_s = 1
late = "queue"

[[workload]]
name = "hello"
command = ["sh", "-c", "sleep 0.2; echo hi; echo \"$GREETING\" >&2"]
env = { GREETING = "from env" }

[[workload]]
name = "fails"
command = ["sh", "-c", "echo oops >&2; exit 3"]

[[workload]]
name = "hangs"
command = ["sleep", "100"]
timeout_s = 0.5

[[workload]]
name = "server"
command = ["sleep", "100"]
duration_s = 0.5
timeout_s = 60
"#;

#[test]
fn programs_run_beside_a_model_and_each_ending_is_reported() {
    let tmp = tempfile::tempdir().unwrap();
    let sc = scenario(tmp.path(), "s.toml", PROGRAMS);
    let out = tmp.path().join("out");
    let started = Instant::now();
    let o = isolane()
        .args(["run", "--quiet", "--out"])
        .arg(&out)
        .arg(&sc)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    let stderr = String::from_utf8_lossy(&o.stderr);
    // A failed workload: exit 1, everything written.
    assert_eq!(o.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "the hanging program was not stopped"
    );
    for needle in ["exit 0", "exit 3", "timed out", "stopped at duration"] {
        assert!(stdout.contains(needle), "{needle:?} not in:\n{stdout}");
    }
    assert!(
        stderr.contains("workload `fails` failed: the program exited with status 3; stderr: oops"),
        "{stderr}"
    );
    assert!(
        stderr.contains("workload `hangs` failed: timed out"),
        "{stderr}"
    );

    let s = summary(&out);
    assert_eq!(s["schema_version"], isolane_core::results::SCHEMA_VERSION);
    assert_eq!(s["status"], "failed");
    let spin = workload(&s, "spin");
    assert_eq!(spin["status"], "ok");
    assert_eq!(spin["jobs"], 50, "the model's results are kept");

    let hello = workload(&s, "hello");
    assert_eq!(hello["status"], "ok");
    assert_eq!(hello["exit_code"], 0);
    assert!(f(&hello["wall_s"]) >= 0.19, "{hello}");
    let p = &hello["program"];
    assert_eq!(p["end"], "exited");
    assert_eq!(p["command"][0], "sh");
    assert!(
        p["cpu_user_s"].is_number() && p["max_rss_mib"].is_number(),
        "{p}"
    );
    assert!(!p["pids"].as_array().unwrap().is_empty());
    // No NVML here: nothing GPU is claimed.
    assert!(
        p.get("gpu_share_pct").is_none() && p.get("energy_j").is_none(),
        "{p}"
    );
    assert!(hello["gpu_memory_mib"].is_null());
    assert_eq!(
        std::fs::read_to_string(out.join("hello.stdout")).unwrap(),
        "hi\n"
    );
    assert_eq!(
        std::fs::read_to_string(out.join("hello.stderr")).unwrap(),
        "from env\n"
    );

    let fails = workload(&s, "fails");
    assert_eq!(
        (&fails["status"], &fails["exit_code"]),
        (&"failed".into(), &3.into())
    );
    let hangs = workload(&s, "hangs");
    assert_eq!(hangs["status"], "failed");
    assert_eq!(hangs["program"]["end"], "timed_out");
    assert!(f(&hangs["wall_s"]) < 30.0, "{hangs}");
    let server = workload(&s, "server");
    assert_eq!(server["status"], "ok");
    assert_eq!(server["program"]["end"], "stopped_at_duration");

    // The resolved scenario reads back and keeps the command workloads.
    let resolved = std::fs::read_to_string(out.join("scenario.toml")).unwrap();
    assert!(
        resolved.contains("command = [\"sleep\", \"100\"]"),
        "{resolved}"
    );
    run_ok(isolane().args(["plan"]).arg(out.join("scenario.toml")));
    // The report shows them.
    let report = tmp.path().join("r.html");
    run_ok(isolane().arg("report").arg(&out).arg("--out").arg(&report));
    let html = std::fs::read_to_string(&report).unwrap();
    assert!(html.contains("stopped at duration") && html.contains("timed out"));
    // The trace has each program as one span on its workload's track.
    let trace = tmp.path().join("t.json");
    run_ok(isolane().arg("trace").arg(&out).arg("--out").arg(&trace));
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    let spans: Vec<&str> = doc["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["cat"] == "program")
        .filter_map(|e| e["name"].as_str())
        .collect();
    assert_eq!(spans.len(), 4, "{spans:?}");
    assert!(spans.contains(&"hangs: timed out"), "{spans:?}");
}

#[test]
fn ctrl_c_stops_a_program_and_what_it_started() {
    let tmp = tempfile::tempdir().unwrap();
    let pidfile = tmp.path().join("bg.pid");
    let text = format!(
        r#"
[[workload]]
name = "busy"
command = ["sh", "-c", "sleep 100 & echo $! > {}; wait"]
"#,
        pidfile.display()
    );
    let sc = scenario(tmp.path(), "s.toml", &text);
    let out = tmp.path().join("out");
    let mut child = isolane()
        .args(["run", "--quiet", "--out"])
        .arg(&out)
        .arg(&sc)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let bg: i32 = loop {
        if let Some(pid) = std::fs::read_to_string(&pidfile)
            .ok()
            .and_then(|s| s.trim().parse().ok())
        {
            break pid;
        }
        assert!(Instant::now() < deadline, "the program never started");
        std::thread::sleep(Duration::from_millis(20));
    };
    // SAFETY: plain kill(2) of our own child.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130));
    let s = summary(&out);
    let w = workload(&s, "busy");
    assert_eq!(w["status"], "interrupted");
    assert_eq!(w["program"]["end"], "interrupted");
    // The background sleep, in the program's group, is gone (a zombie until reaped counts).
    let gone = || {
        std::fs::read_to_string(format!("/proc/{bg}/stat"))
            .map(|s| {
                s.rsplit_once(')')
                    .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
            })
            .unwrap_or(true)
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while !gone() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        gone(),
        "process {bg} started by the program outlived isolane's stop"
    );
}

#[test]
fn program_mistakes_exit_2_naming_the_field() {
    let tmp = tempfile::tempdir().unwrap();
    let cases = [
        (
            "[[workload]]\nname = \"p\"\ncommand = [\"true\"]\nrate_hz = 10\n",
            "workload[0].rate_hz: not allowed with `command`",
        ),
        (
            "[device]\nbackend = \"cuda\"\nmechanism = \"green\"\n\n[[workload]]\nname = \"p\"\n\
             command = [\"true\"]\npartition = { sms = 8 }\n",
            "cannot be imposed on another program",
        ),
        (
            "[[workload]]\nname = \"p\"\ncommand = [\"true\"]\nduration_s = 2\ntimeout_s = 1\n",
            "expected timeout_s > duration_s",
        ),
        (
            "[device]\nbackend = \"cuda\"\nmechanism = \"mps\"\n\n[[workload]]\nname = \"m\"\n\
             model = \"spin:1ms\"\nbackend = \"cpu\"\nrate_hz = 10\njobs = 3\n\
             partition = { thread_pct = 50 }\n",
            "workload[0].partition.thread_pct: not allowed with backend \"cpu\"",
        ),
        (
            "[[workload]]\nname = \"m\"\nmodel = \"spin:1ms\"\nbackend = \"cuda\"\nrate_hz = 10\n\
             jobs = 3\n",
            "workload[0].backend: found \"cuda\" with device.backend \"cpu\"",
        ),
    ];
    for (i, (text, needle)) in cases.iter().enumerate() {
        let sc = scenario(tmp.path(), &format!("s{i}.toml"), text);
        let out = tmp.path().join(format!("out{i}"));
        let o = isolane()
            .arg("run")
            .arg(&sc)
            .arg("--out")
            .arg(&out)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "case {i}: {err}");
        assert!(err.contains(needle), "case {i}: {needle:?} not in {err}");
        assert!(
            !out.exists(),
            "case {i}: an invalid scenario created output"
        );
    }
}

#[test]
fn other_commands_refuse_programs() {
    let tmp = tempfile::tempdir().unwrap();
    let sc = scenario(
        tmp.path(),
        "s.toml",
        "[[workload]]\nname = \"p\"\ncommand = [\"true\"]\n",
    );
    let o = isolane().arg("isolation").arg(&sc).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("only `isolane run` runs"), "{err}");
    // The planner sizes every workload on the device's backend.
    let mixed = scenario(
        tmp.path(),
        "m.toml",
        "[device]\nbackend = \"cuda\"\n\n[[workload]]\nname = \"a\"\nmodel = \"spin:1ms\"\n\
         backend = \"cpu\"\nrate_hz = 10\njobs = 3\n",
    );
    let o = isolane()
        .args(["plan", "--auto", "--device-model", "h100-sxm"])
        .arg(&mixed)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("takes every workload to the device's backend"),
        "{err}"
    );
    let o = isolane().arg("verify").arg(&mixed).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("`isolane verify` takes every workload"),
        "{err}"
    );
}

#[test]
fn a_cpu_backend_model_runs_beside_spin_workloads() {
    let tmp = tempfile::tempdir().unwrap();
    let sc = scenario(
        tmp.path(),
        "s.toml",
        r#"
[[workload]]
name = "net"
model = "mobilenet_v2"
backend = "cpu"
rate_hz = 2
jobs = 2
warmup_jobs = 1
deadline_ms = 10000

[[workload]]
name = "spin"
model = "spin:1ms"
rate_hz = 20
jobs = 10
"#,
    );
    let out = tmp.path().join("out");
    run_ok(
        isolane()
            .args(["run", "--quiet", "--out"])
            .arg(&out)
            .arg(&sc),
    );
    let s = summary(&out);
    let net = workload(&s, "net");
    assert_eq!((&net["backend"], &net["jobs"]), (&"cpu".into(), &2.into()));
    assert_eq!(workload(&s, "spin")["jobs"], 10);
}

#[test]
fn a_cuda_workload_without_a_gpu_gets_the_clear_error() {
    if std::path::Path::new("/dev/nvidiactl").exists() {
        // On a GPU machine the run goes ahead: nothing to check here.
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let sc = scenario(
        tmp.path(),
        "s.toml",
        r#"
[device]
backend = "cuda"
mechanism = "timeslice"

[[workload]]
name = "on-cpu"
model = "spin:1ms"
backend = "cpu"
rate_hz = 10
jobs = 3

[[workload]]
name = "on-gpu"
model = "resnet18"
precision = "fp16"
rate_hz = 10
jobs = 3
"#,
    );
    let o = isolane()
        .arg("run")
        .arg(&sc)
        .arg("--out")
        .arg(tmp.path().join("out"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_ne!(o.status.code(), Some(0), "{err}");
    assert!(
        err.to_lowercase().contains("cuda") || err.contains("GPU"),
        "{err}"
    );
    assert!(!tmp.path().join("out").exists());
}

/// scenarios/programs.toml, the documented example, runs on the CPU as it says.
#[test]
fn the_programs_example_runs_on_the_cpu() {
    let tmp = tempfile::tempdir().unwrap();
    let example = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/programs.toml");
    let out = tmp.path().join("out");
    let o = run_ok(
        isolane()
            .args(["run", "--quiet", "--out"])
            .arg(&out)
            .arg(&example),
    );
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.lines().all(|l| l.chars().count() <= 80), "{stdout}");
    let s = summary(&out);
    assert_eq!(workload(&s, "logger")["program"]["end"], "exited");
    assert_eq!(
        workload(&s, "server")["program"]["end"],
        "stopped_at_duration"
    );
    let ticks = std::fs::read_to_string(out.join("logger.stdout")).unwrap();
    assert_eq!(
        ticks,
        "tick 1 (isolane)\ntick 2 (isolane)\ntick 3 (isolane)\n"
    );
    // Rebuilt from jobs/ (as after a kill), a program's outcome is unknown: not complete.
    std::fs::remove_file(out.join("summary.json")).unwrap();
    run_ok(isolane().arg("summarize").arg(&out));
    let s = summary(&out);
    assert_eq!(s["complete"], false);
    assert_eq!(workload(&s, "logger")["status"], "interrupted");
    assert_eq!(workload(&s, "detector")["status"], "ok");
}

/// On the GPU: a program (isolane's own `bench`, a CUDA program every GPU machine of ours has)
/// in its MPS client beside a model in another, and one under timeslice. Its device memory
/// comes from NVML's process list; its GPU share and attributed energy are printed (NVML's
/// per-process utilisation is not reported by every driver under MPS, so they are not
/// required), and when there, the energy is labelled attributed.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_a_program_in_its_partition_beside_a_model() {
    let bin = std::env::var("ISOLANE_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_isolane").into());
    for (mechanism, partition) in [
        ("mps", "partition = { thread_pct = 50 }"),
        ("timeslice", ""),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let text = format!(
            r#"
[device]
backend = "cuda"
mechanism = "{mechanism}"

[[workload]]
name = "resnet18"
model = "resnet18"
precision = "fp16"
rate_hz = 100
duration_s = 6
{partition}

[[workload]]
name = "bench"
command = ["{bin}", "bench", "--model", "resnet18", "--replays", "3000"]
timeout_s = 120
{partition}
"#
        );
        let sc = scenario(tmp.path(), "s.toml", &text);
        let out = tmp.path().join("out");
        let o = run_ok(
            isolane()
                .args(["run", "--quiet", "--out"])
                .arg(&out)
                .arg(&sc),
        );
        println!("{mechanism}:\n{}", String::from_utf8_lossy(&o.stdout));
        let s = summary(&out);
        let w = workload(&s, "bench");
        assert_eq!(w["program"]["end"], "exited", "{w}");
        let mem = f(&w["gpu_memory_mib"]);
        assert!(
            mem > 100.0,
            "{mechanism}: the program's device memory: {mem} MiB"
        );
        println!(
            "{mechanism}: bench gpu_share_pct {} energy_j {} ({})",
            w["program"]["gpu_share_pct"], w["program"]["energy_j"], w["program"]["energy_source"]
        );
        if w["program"]["energy_j"].is_number() {
            assert_eq!(w["program"]["energy_source"], "attributed_by_sm_share");
        }
        assert_eq!(workload(&s, "resnet18")["status"], "ok");
        let stdout = std::fs::read_to_string(out.join("bench.stdout")).unwrap();
        assert!(stdout.contains("resnet18"), "{stdout}");
    }
}
