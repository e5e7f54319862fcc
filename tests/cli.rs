//! The command line: output directories, exit codes, help, the quickstart, compare, isolation.

mod common;

use common::*;

const SMALL: &str = r#"
[device]
backend = "cpu"
mechanism = "none"
host = "thread"

[[workload]]
name = "a"
model = "spin:1ms~0.2ms"
rate_hz = 200
jobs = 100
warmup_jobs = 2
"#;

#[test]
fn invalid_scenario_runs_nothing_creates_no_directory_and_exits_2() {
    let tmp = tempfile::tempdir().unwrap();
    let sc = scenario(
        tmp.path(),
        "bad.toml",
        &SMALL.replace("rate_hz = 200", "rate_hz = -5"),
    );
    let out = tmp.path().join("out");
    let o = isolane()
        .arg("run")
        .arg(&sc)
        .arg("--out")
        .arg(&out)
        .current_dir(tmp.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("bad.toml") && stderr.contains("rate_hz"),
        "{stderr}"
    );
    assert!(!out.exists());
    assert!(!tmp.path().join("runs").exists());
}

#[test]
fn missing_scenario_file_and_bad_cpu_and_engine_models_create_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let o = isolane()
        .arg("run")
        .arg(tmp.path().join("nope.toml"))
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let sc = scenario(
        tmp.path(),
        "cpu.toml",
        &SMALL.replace("warmup_jobs = 2", "cpu = [4096]"),
    );
    let o = isolane()
        .arg("run")
        .arg(&sc)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("cpu core 4096"), "{stderr}");
    let onnx = tmp.path().join("m.onnx");
    std::fs::write(&onnx, b"not really").unwrap();
    let sc = scenario(
        tmp.path(),
        "engine.toml",
        &SMALL.replace("spin:1ms~0.2ms", &onnx.display().to_string()),
    );
    let o = isolane()
        .arg("run")
        .arg(&sc)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("m.onnx"), "{stderr}");
    assert!(!out.exists());
}

#[test]
fn non_empty_out_is_refused_unless_forced() {
    let tmp = tempfile::tempdir().unwrap();
    let sc = scenario(tmp.path(), "s.toml", SMALL);
    let out = tmp.path().join("out");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("keep.txt"), "x").unwrap();
    let o = isolane()
        .arg("run")
        .arg(&sc)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--force"));
    run_ok(
        isolane()
            .arg("run")
            .arg(&sc)
            .arg("--out")
            .arg(&out)
            .arg("--force")
            .arg("-q"),
    );
    assert!(out.join("summary.json").exists() && out.join("keep.txt").exists());
}

/// Two runs into one --out at once, the second with --force, both exited 0 and left one's
/// scenario.toml beside the other's summary.json and jobs/. The second is refused now and the
/// first, stopped by SIGTERM, writes its own files whole (and says what stopped it).
#[test]
fn a_second_run_into_a_busy_out_is_refused_and_sigterm_keeps_the_first_ones_results() {
    let tmp = tempfile::tempdir().unwrap();
    let long = SMALL.replace("jobs = 100", "duration_s = 60");
    let sc = scenario(tmp.path(), "long.toml", &long);
    let other = scenario(tmp.path(), "s.toml", SMALL);
    let out = tmp.path().join("out");
    let first = isolane()
        .arg("run")
        .arg(&sc)
        .arg("--out")
        .arg(&out)
        .arg("-q")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The run has its folder once its resolved scenario is written; a loaded machine may be slow.
    let t0 = std::time::Instant::now();
    while !out.join("scenario.toml").exists() {
        assert!(
            t0.elapsed().as_secs() < 60,
            "the first run never wrote scenario.toml"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let o = isolane()
        .arg("run")
        .arg(&other)
        .arg("--out")
        .arg(&out)
        .arg("--force")
        .arg("-q")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("in use by another isolane process"),
        "{stderr}"
    );
    assert!(
        out.join("scenario.toml").exists(),
        "--force removed the busy run's files"
    );
    // SAFETY: kill(2) on the child this test started and has not reaped.
    assert_eq!(unsafe { libc::kill(first.id() as i32, libc::SIGTERM) }, 0);
    let o = first.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&o.stdout) + String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(130), "{text}");
    assert!(text.contains("SIGTERM"), "{text}");
    let scenario_toml = std::fs::read_to_string(out.join("scenario.toml")).unwrap();
    assert!(scenario_toml.contains("duration_s = 60"), "{scenario_toml}");
    assert_eq!(summary(&out)["interrupted"], serde_json::json!(true));
    run_ok(isolane().arg("report").arg(&out));
}

#[test]
fn quickstart_runs_without_arguments_into_a_new_runs_folder() {
    let tmp = tempfile::tempdir().unwrap();
    let o = run_ok(isolane().arg("run").current_dir(tmp.path()));
    let runs: Vec<_> = std::fs::read_dir(tmp.path().join("runs"))
        .unwrap()
        .flatten()
        .collect();
    assert_eq!(runs.len(), 1);
    let dir = runs[0].path();
    let name = dir.file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.len() == 15 && name.as_bytes()[8] == b'-', "{name}");
    let s = summary(&dir);
    assert_eq!(s["status"], "ok");
    // Linux reports steal time (0 on bare metal): a share of the machine's CPU, in %.
    let steal = f(&s["cpu_steal_pct"]);
    assert!((0.0..=100.0).contains(&steal), "cpu_steal_pct {steal}");
    // On a machine with a CUDA GPU the GPU quickstart runs instead (CI has none).
    let gpu = std::path::Path::new("/dev/nvidiactl").exists();
    let expected = if gpu {
        "<built-in GPU quickstart>"
    } else {
        "<built-in quickstart>"
    };
    assert_eq!(s["scenario"], expected);
    assert!(s["workloads"].as_array().unwrap().len() >= 2);
    assert!(dir.join("scenario.toml").exists());
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        stdout.contains("p99 ms") && stdout.contains("img/s"),
        "{stdout}"
    );
    let widest = stdout.lines().map(|l| l.chars().count()).max().unwrap_or(0);
    assert!(widest <= 80, "{widest} columns:\n{stdout}");
    if !gpu {
        // Why the GPU quickstart did not run, in one line (no driver, no device, a library).
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(
            stderr.contains("note: running the CPU quickstart: the GPU one cannot run here ("),
            "{stderr}"
        );
        assert!(stdout.starts_with("cpu, no partitions\n"), "{stdout}");
    }
}

#[test]
fn beside_a_scenario_backend_overrides_only_to_the_cpu() {
    // `--backend cpu` runs a scenario's workloads on the CPU (issue 31; tested with a cuda
    // scenario in a_gpu_scenario_without_a_gpu_…); `--backend cuda` cannot make a CPU
    // scenario a GPU one, and the old `--cpu` stays the quickstart's.
    for (flags, says) in [
        (
            &["--backend", "cuda"][..],
            "--backend cuda: scenarios/quickstart.toml runs on the CPU",
        ),
        (&["--cpu"][..], "cannot be used with"),
    ] {
        let o = isolane()
            .arg("run")
            .args(flags)
            .arg("scenarios/quickstart.toml")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{flags:?}: {err}");
        assert!(err.contains(says), "{flags:?}: {err}");
    }
    let help = run_ok(isolane().args(["run", "--help"]));
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("--backend"), "{help}");
    assert!(!help.contains("--cpu"), "the old name is hidden: {help}");
}

#[test]
fn help_and_version() {
    let o = run_ok(isolane().arg("--version"));
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("isolane "));
    for sub in ["run", "maxrate", "isolation", "compare"] {
        let o = run_ok(isolane().arg(sub).arg("--help"));
        assert!(
            String::from_utf8_lossy(&o.stdout).contains("Usage"),
            "{sub}"
        );
    }
    let o = run_ok(isolane().arg("--help"));
    assert!(
        !String::from_utf8_lossy(&o.stdout).contains("worker"),
        "worker is hidden"
    );
    let o = isolane()
        .args(["maxrate", "--model", "spin:4ms", "--jobs", "0"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn compare_prints_both_runs_and_a_p_value() {
    let tmp = tempfile::tempdir().unwrap();
    let a = scenario(tmp.path(), "a.toml", SMALL);
    let b = scenario(
        tmp.path(),
        "b.toml",
        &SMALL
            .replace("spin:1ms~0.2ms", "spin:8ms")
            .replace("rate_hz = 200", "rate_hz = 50"),
    );
    let (ra, rb) = (tmp.path().join("ra"), tmp.path().join("rb"));
    run_ok(isolane().arg("run").arg(&a).arg("--out").arg(&ra).arg("-q"));
    run_ok(isolane().arg("run").arg(&b).arg("--out").arg(&rb).arg("-q"));
    let o = run_ok(isolane().arg("compare").arg(&ra).arg(&rb));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        stdout.contains("ra") && stdout.contains("rb") && stdout.contains("latency p50"),
        "{stdout}"
    );
    assert!(
        stdout.contains("CPU taken by the hypervisor during the run: ra "),
        "{stdout}"
    );
    // 1 ms vs 8 ms jobs: the distributions differ beyond doubt, even where other tests running
    // beside this one stretch some 1 ms jobs (1 vs 2 ms gave p = 6e-4 on a busy machine).
    let p: f64 = stdout
        .split("two-sided p = ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no p-value in {stdout}"));
    assert!(p < 1e-6, "p = {p}");
    let o = isolane()
        .arg("compare")
        .arg(&ra)
        .arg(tmp.path())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn isolation_reports_every_step_for_every_victim() {
    let tmp = tempfile::tempdir().unwrap();
    let sc = scenario(
        tmp.path(),
        "iso.toml",
        r#"
[device]
backend = "cpu"
mechanism = "none"
host = "thread"

[[workload]]
name = "v"
role = "victim"
model = "spin:1ms"
rate_hz = 100
duration_s = 1

[[workload]]
name = "i"
role = "interferer"
model = "spin:1ms"
ramp = { from_hz = 10, to_hz = 50, steps = 3, step_s = 0.5 }
"#,
    );
    let out = tmp.path().join("out");
    run_ok(
        isolane()
            .arg("isolation")
            .arg(&sc)
            .arg("--out")
            .arg(&out)
            .arg("-q"),
    );
    let s = summary(&out);
    let steps = s["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 3);
    assert_eq!(f(&steps[0]["interferer_rate_hz"]), 10.0);
    assert_eq!(f(&steps[2]["interferer_rate_hz"]), 50.0);
    for st in steps {
        let v = &st["victims"][0];
        assert_eq!(v["victim"], "v");
        assert_eq!(v["jobs"], 50, "{st}");
        assert!(v["timeout_pct"].is_number() && v["latency_ms"]["p99"].is_number());
    }
    // The victim ran for all 3 steps (1.5 s), not its own 1 s.
    assert_eq!(workload(&s, "v")["jobs"], 150);
    assert_eq!(workload(&s, "i")["jobs"], 5 + 15 + 25);
    let csv = std::fs::read_to_string(out.join("isolation.csv")).unwrap();
    let mut lines = csv.lines();
    assert!(lines
        .next()
        .unwrap()
        .starts_with("step,interferer_rate_hz,victim,jobs,"));
    assert_eq!(lines.count(), 3);
    assert_eq!(jobs_rows(&out, "i").len(), 45);
}

#[test]
fn isolation_without_a_victim_is_refused_before_any_output() {
    let tmp = tempfile::tempdir().unwrap();
    let sc = scenario(tmp.path(), "s.toml", SMALL);
    let out = tmp.path().join("out");
    let o = isolane()
        .arg("isolation")
        .arg(&sc)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("interferer"), "{stderr}");
    assert!(!out.exists());
}

/// A workload released at a fixed rate cannot report more throughput than its rate: 100 jobs at
/// 200 Hz own 0.5 s of schedule, although the last one ends 1 ms after its release at 0.495 s
/// (counted to the last completion, the throughput was 100 / 0.496 = 201.6 /s).
#[test]
fn a_rate_limited_workload_reports_at_most_its_rate() {
    let tmp = tempfile::tempdir().unwrap();
    let sc = scenario(tmp.path(), "small.toml", SMALL);
    let out = tmp.path().join("out");
    run_ok(
        isolane()
            .arg("run")
            .arg(&sc)
            .arg("--out")
            .arg(&out)
            .arg("-q"),
    );
    let s = summary(&out);
    let w = workload(&s, "a");
    let throughput = f(&w["throughput_ips"]);
    assert!(throughput > 0.0 && throughput <= 200.0, "{throughput}");
    assert!(f(&w["wall_s"]) >= 0.5, "{w}");
}

/// `isolane models | head -1`: a reader that closes the pipe early ends `models` quietly, as
/// it would any Unix filter, never with a panic. The pipe's read end is closed before the
/// child starts, so every write meets a closed pipe.
#[test]
fn a_closed_pipe_ends_a_printing_command_quietly() {
    use std::os::fd::FromRawFd;
    let mut fds = [0i32; 2];
    // SAFETY: pipe(2) fills both descriptors of a valid two-element array.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: fds[0] is the read end pipe(2) just returned; closing it is all that is done with it.
    unsafe { libc::close(fds[0]) };
    // SAFETY: fds[1] is an open descriptor owned by nothing else; Stdio takes it over.
    let write_end = unsafe { std::process::Stdio::from_raw_fd(fds[1]) };
    let out = isolane()
        .args(["models"])
        .stdout(write_end)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        out.status.success() || out.status.code().is_none(),
        "exit {:?}: {stderr}",
        out.status
    );
}

/// `phase_ms` shifts a workload's releases (and its run with them): two workloads of one rate
/// released out of phase, as unsynchronised cameras are.
#[test]
fn a_phase_shifts_a_workloads_releases() {
    let tmp = tempfile::tempdir().unwrap();
    let s = scenario(
        tmp.path(),
        "s.toml",
        "[device]\nbackend = \"cpu\"\nmechanism = \"none\"\nhost = \"thread\"\n\n\
         [[workload]]\nname = \"a\"\nmodel = \"spin:1ms\"\nrate_hz = 50\njobs = 4\n\
         warmup_jobs = 0\n\n\
         [[workload]]\nname = \"b\"\nmodel = \"spin:1ms\"\nrate_hz = 50\njobs = 4\n\
         warmup_jobs = 0\nphase_ms = 7.5\n",
    );
    let out = tmp.path().join("out");
    run_ok(isolane().args(["run", "-q", "-o"]).arg(&out).arg(&s));
    let releases =
        |w: &str| -> Vec<String> { jobs_rows(&out, w).iter().map(|r| r[1].clone()).collect() };
    assert_eq!(
        releases("a"),
        ["0.000000", "20.000000", "40.000000", "60.000000"]
    );
    assert_eq!(
        releases("b"),
        ["7.500000", "27.500000", "47.500000", "67.500000"]
    );
    let resolved = std::fs::read_to_string(out.join("scenario.toml")).unwrap();
    assert!(resolved.contains("phase_ms = 7.5"), "{resolved}");
}

/// The python block of docs/report.md's "Reading results in Python" (```python test).
fn pandas_recipe() -> String {
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/report.md")).unwrap();
    let start = doc.find("```python test\n").expect("the recipe's block") + 15;
    let len = doc[start..].find("```").unwrap();
    doc[start..start + len].to_string()
}

/// workloads.csv's columns as docs/report.md lists them (its table's first column).
fn documented_columns() -> Vec<String> {
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/report.md")).unwrap();
    let table = &doc[doc.find("| column | meaning").expect("the columns table")..];
    table
        .lines()
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .flat_map(|l| {
            let first = l.split('|').nth(1).unwrap_or("");
            first
                .split(',')
                .map(|c| c.trim().trim_matches('`').to_string())
                .collect::<Vec<_>>()
        })
        .collect()
}

fn pandas_here() -> bool {
    std::process::Command::new("python3")
        .args(["-c", "import pandas"])
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn the_pandas_recipe_of_docs_report_md_runs() {
    // Issue 31: Python users had no flat per-run table and no --json. The tour's step-2
    // scenario, quicker (spin models, 0.5 s), as runs/mine, then the documented recipe.
    let tmp = tempfile::tempdir().unwrap();
    let text = "[device]\nbackend = \"cpu\"\n\n\
                [[workload]]\nname = \"detector\"\nmodel = \"spin:1ms\"\nrate_hz = 50\n\
                deadline_ms = 20\nduration_s = 0.5\n\n\
                [[workload]]\nname = \"classifier\"\nmodel = \"spin:2ms\"\nrate_hz = 10\n\
                duration_s = 0.5\n";
    scenario(tmp.path(), "my-scenario.toml", text);
    run_ok(
        isolane()
            .args(["run", "my-scenario.toml", "--out", "runs/mine"])
            .current_dir(tmp.path()),
    );
    let csv = std::fs::read_to_string(tmp.path().join("runs/mine/workloads.csv")).unwrap();
    let mut lines = csv.lines();
    let header: Vec<String> = lines
        .next()
        .unwrap()
        .split(',')
        .map(str::to_string)
        .collect();
    assert_eq!(header, documented_columns(), "docs/report.md's table");
    let rows: Vec<&str> = lines.collect();
    assert_eq!(rows.len(), 2, "{csv}");
    assert!(
        rows[0].starts_with("detector,spin:1ms,1,cpu,thread,critical,ok,"),
        "{csv}"
    );

    if !pandas_here() {
        eprintln!("skipped the python recipe: python3 with pandas is not here (header checked)");
        return;
    }
    // `isolane` on PATH, as the recipe calls it.
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_isolane"))
        .parent()
        .unwrap()
        .to_path_buf();
    let path = std::env::join_paths(
        std::iter::once(bin).chain(std::env::split_paths(&std::env::var_os("PATH").unwrap())),
    )
    .unwrap();
    let o = std::process::Command::new("python3")
        .args(["-c", &pandas_recipe()])
        .env("PATH", path)
        .current_dir(tmp.path())
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        out.contains("timeout_pct") && out.contains("classifier"),
        "{out}"
    );
    assert!(tmp.path().join("runs/again/workloads.csv").is_file());
}

#[test]
fn run_and_compare_print_json_on_stdout_and_their_tables_on_stderr() {
    let tmp = tempfile::tempdir().unwrap();
    let sc = scenario(tmp.path(), "s.toml", SMALL);
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    let o = run_ok(
        isolane()
            .arg("run")
            .arg(&sc)
            .arg("--out")
            .arg(&a)
            .arg("--json"),
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("stdout is one JSON value");
    assert_eq!(v["summary"]["workloads"][0]["name"], "a");
    assert!(v["workloads_csv"]
        .as_str()
        .unwrap()
        .ends_with("workloads.csv"));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("miss %") && err.contains("results:"), "{err}");
    run_ok(isolane().arg("run").arg(&sc).arg("--out").arg(&b).arg("-q"));
    let o = run_ok(isolane().arg("compare").arg(&a).arg(&b).arg("--json"));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("stdout is one JSON value");
    let w = &v["workloads"][0];
    assert_eq!(w["name"], "a");
    assert_eq!(w["a"]["jobs"], 100);
    assert!(w["mann_whitney"]["p_value"].as_f64().is_some(), "{v}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("Mann–Whitney U ="));
}

#[test]
fn a_gpu_scenario_without_a_gpu_names_its_backend_and_runs_on_the_cpu_when_asked() {
    if std::path::Path::new("/dev/nvidiactl").exists() {
        return; // a GPU machine runs it on the GPU
    }
    // Issue 31: a 515-column library-search line that never said the scenario asks for cuda,
    // and `--backend cpu` was refused beside a scenario file.
    let tmp = tempfile::tempdir().unwrap();
    let gpu = SMALL
        .replace("backend = \"cpu\"", "backend = \"cuda\"")
        .replace("mechanism = \"none\"", "mechanism = \"green\"")
        .replace(
            "warmup_jobs = 2",
            "warmup_jobs = 2\nprecision = \"fp16\"\npartition = { sms = 16 }",
        );
    let sc = scenario(tmp.path(), "gpu.toml", &gpu);
    let o = isolane()
        .arg("run")
        .arg(&sc)
        .arg("--out")
        .arg(tmp.path().join("out"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    let flat = err.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        flat.contains("gpu.toml: device.backend = \"cuda\""),
        "{err}"
    );
    assert!(flat.contains("--backend cpu"), "{err}");
    assert!(err.lines().all(|l| l.chars().count() <= 80), "{err}");
    assert!(!tmp.path().join("out").exists());

    let o = run_ok(
        isolane()
            .arg("run")
            .arg(&sc)
            .args(["--backend", "cpu", "--out"])
            .arg(tmp.path().join("out")),
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("partitions dropped: a"), "{err}");
    assert!(err.contains("fp32 instead of a (fp16)"), "{err}");
    let s = summary(&tmp.path().join("out"));
    assert_eq!(workload(&s, "a")["backend"], "cpu");
}

/// An error printed to a terminal wraps at 80 columns, as the tables do; piped it stays one line
/// (so that a log or grep has the whole message). The terminal is `script`'s pseudo-terminal
/// (util-linux, on every Debian); the error is a long one: a job count over its 100-day bound.
#[test]
fn an_error_wraps_on_a_terminal_and_stays_one_line_in_a_pipe() {
    let tmp = tempfile::tempdir().unwrap();
    let sc = scenario(
        tmp.path(),
        "long.toml",
        &SMALL
            .replace("rate_hz = 200", "rate_hz = 1e-12")
            .replace("jobs = 100", "jobs = 2"),
    );
    let piped = isolane().arg("run").arg(&sc).output().unwrap();
    assert_eq!(piped.status.code(), Some(2));
    let err = String::from_utf8_lossy(&piped.stderr);
    let longest = err.lines().map(|l| l.chars().count()).max().unwrap();
    assert!(
        longest > 80,
        "the test needs an error over 80 columns: {err}"
    );
    if std::process::Command::new("script")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipped the terminal half: no `script` (util-linux) here");
        return;
    }
    let command = format!(
        "{} run {} 2>&1",
        env!("CARGO_BIN_EXE_isolane"),
        sc.display()
    );
    let tty = std::process::Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .env("COLUMNS", "200")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&tty.stdout).replace('\r', "");
    assert_eq!(tty.status.code(), Some(2), "{text}");
    assert!(text.contains("error: "), "{text}");
    for line in text.lines() {
        assert!(
            line.chars().count() <= 80,
            "{} columns: {line}",
            line.chars().count()
        );
    }
    // The same words, wrapped.
    let words = |s: &str| s.split_whitespace().map(str::to_string).collect::<Vec<_>>();
    assert_eq!(words(&text), words(&err));
}

/// `isolane build` on the CPU, then the plan run by a scenario; another batch, a truncated file,
/// another format version and a GPU precision on the CPU are each refused with exit code 2,
/// naming the file and what is wrong, before any output exists.
#[test]
fn a_saved_plan_is_built_run_and_refused_where_it_does_not_fit() {
    let tmp = tempfile::tempdir().unwrap();
    let plan = tmp.path().join("m.isoplan");
    let o = isolane()
        .args([
            "build",
            "mobilenet_v2",
            "--device",
            "cpu",
            "--batch",
            "1",
            "-o",
        ])
        .arg(&plan)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(stdout.contains("model hash"), "{stdout}");
    let with = |model: &str, extra: &str| {
        SMALL
            .replace("spin:1ms~0.2ms", model)
            .replace("rate_hz = 200", "rate_hz = 50")
            .replace("jobs = 100", &format!("jobs = 10{extra}"))
    };
    let out = tmp.path().join("out");
    let sc = scenario(
        tmp.path(),
        "plan.toml",
        &with(&plan.display().to_string(), ""),
    );
    run_ok(isolane().arg("run").arg(&sc).arg("--out").arg(&out));
    let s = summary(&out);
    assert_eq!(workload(&s, "a")["jobs"], 10, "{s}");

    // infer and bench take the plan too: infer's output is the built-in's, bit for bit.
    let a = tmp.path().join("a.npy");
    let b = tmp.path().join("b.npy");
    for (model, out) in [(plan.to_str().unwrap(), &a), ("mobilenet_v2", &b)] {
        run_ok(
            isolane()
                .args([
                    "infer",
                    "--model",
                    model,
                    "--random",
                    "--seed",
                    "3",
                    "--save-output",
                ])
                .arg(out),
        );
    }
    assert!(std::fs::read(&a).unwrap() == std::fs::read(&b).unwrap());
    let o = isolane()
        .args([
            "infer",
            "--model",
            plan.to_str().unwrap(),
            "--random",
            "--batch",
            "2",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("batch \"1\"") && stderr.contains("\"2\""),
        "{stderr}"
    );
    let o = run_ok(isolane().args([
        "bench",
        "--model",
        plan.to_str().unwrap(),
        "--backend",
        "cpu",
        "--replays",
        "2",
    ]));
    assert!(String::from_utf8_lossy(&o.stdout).contains("m.isoplan"));

    let refused = |name: &str, model: &str, extra: &str, wants: &[&str]| {
        let sc = scenario(tmp.path(), name, &with(model, extra));
        let out = tmp.path().join(format!("out-{name}"));
        let o = isolane()
            .arg("run")
            .arg(&sc)
            .arg("--out")
            .arg(&out)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{name}: {stderr}");
        for w in wants {
            assert!(stderr.contains(w), "{name}: wants {w:?}: {stderr}");
        }
        assert!(!out.exists(), "{name}");
    };
    let p = plan.display().to_string();
    refused(
        "batch.toml",
        &p,
        "\nbatch = 2",
        &["m.isoplan", "batch \"1\"", "\"2\""],
    );
    let bytes = std::fs::read(&plan).unwrap();
    let cut = tmp.path().join("cut.isoplan");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    refused(
        "cut.toml",
        &cut.display().to_string(),
        "",
        &["cut.isoplan", "truncated"],
    );
    let mut v9 = bytes.clone();
    v9[8..12].copy_from_slice(&9u32.to_le_bytes());
    let old = tmp.path().join("v9.isoplan");
    std::fs::write(&old, &v9).unwrap();
    refused(
        "v9.toml",
        &old.display().to_string(),
        "",
        &["v9.isoplan", "format version 9"],
    );

    let o = isolane()
        .args([
            "build",
            "mobilenet_v2",
            "--device",
            "cpu",
            "--precision",
            "fp16",
            "-o",
        ])
        .arg(tmp.path().join("x.isoplan"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("fp32 only"), "{stderr}");
    assert!(!tmp.path().join("x.isoplan").exists());
}
