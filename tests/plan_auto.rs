//! `isolane plan --auto` on the CPU (issue 15): spin workloads planned onto cores, profiled
//! once and then planned from the cache, verified by running the plan; and the refusals. The
//! deadlines (100 ms for 1–2 ms jobs) leave room for a loaded CI machine's preemptions.

mod common;

use common::*;

/// Profiles pin to core 0 (and verification to cores 0 and 1): one test at a time.
fn cores() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

const TWO: &str = r#"
[[workload]]
name = "camera"
model = "spin:1ms"
rate_hz = 10
deadline_ms = 100
duration_s = 1

[[workload]]
name = "lidar"
model = "spin:2ms"
rate_hz = 8
deadline_ms = 100
duration_s = 1
"#;

#[test]
fn a_cpu_plan_pins_each_workload_to_a_core_and_verifies() {
    let _cores = cores();
    let tmp = tempfile::tempdir().unwrap();
    let s = scenario(tmp.path(), "s.toml", TWO);
    let cache = tmp.path().join("cache");
    let planned = tmp.path().join("planned.toml");
    let o = run_ok(
        isolane()
            .args(["plan", "--auto", "--profile-jobs", "50", "--profile-cache"])
            .arg(&cache)
            .arg("-o")
            .arg(&planned)
            .args(["--verify", "--verify-out"])
            .arg(tmp.path().join("v"))
            .arg(&s),
    );
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("profiled camera in one core"), "{err}");
    // Each profile run says when it starts off a terminal (issue 31: 38-46 s without a line).
    assert!(
        err.contains("profiling camera in one core: 50 jobs back to back"),
        "{err}"
    );
    assert!(err.contains("cpu cores: planned"), "{err}");
    assert!(out.contains("camera") && out.contains("met"), "{out}");
    let text = std::fs::read_to_string(&planned).unwrap();
    assert!(text.contains("# planned: 1 core; predicted p99"), "{text}");
    assert!(
        text.contains("cpu = [0]") && text.contains("cpu = [1]"),
        "{text}"
    );
    // The planned file is a scenario isolane runs as it is.
    run_ok(isolane().args(["plan"]).arg(&planned));

    // A second plan comes from the cache: nothing is measured again.
    let o = run_ok(
        isolane()
            .args(["plan", "--auto", "--profile-cache"])
            .arg(&cache)
            .arg(&s),
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("profiled"), "{err}");
    // ... and each workload's stretch is the one the verification run measured beside the
    // other (kept in the cache folder).
    assert!(
        err.contains("camera: stretch") && err.contains("measured by an earlier verification"),
        "{err}"
    );
    assert!(String::from_utf8_lossy(&o.stdout).contains("# planned: 1 core"));
}

#[test]
fn an_impossible_deadline_is_named_and_exits_2() {
    let _cores = cores();
    let tmp = tempfile::tempdir().unwrap();
    let s = scenario(
        tmp.path(),
        "s.toml",
        &TWO.replace(
            "rate_hz = 8\ndeadline_ms = 100",
            "rate_hz = 8\ndeadline_ms = 1",
        ),
    );
    let o = isolane()
        .args(["plan", "--auto", "--profile-jobs", "30", "--profile-cache"])
        .arg(tmp.path().join("cache"))
        .arg(&s)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("no plan") && err.contains("`lidar` cannot meet its deadline even in 1 core"),
        "{err}"
    );
    assert!(err.contains("best partial plan: camera 1 core"), "{err}");
}

#[test]
fn a_closed_loop_workload_cannot_be_planned() {
    let tmp = tempfile::tempdir().unwrap();
    let s = scenario(
        tmp.path(),
        "s.toml",
        &TWO.replace("rate_hz = 8", "rate_hz = \"max\""),
    );
    let o = isolane()
        .args(["plan", "--auto", "--profile-cache"])
        .arg(tmp.path().join("cache"))
        .arg(&s)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("`lidar`: rate_hz = \"max\" cannot be planned"),
        "{err}"
    );
    assert!(!tmp.path().join("cache").exists(), "nothing was measured");
}

/// `--stretch-from` takes each workload's stretch from a matrix measured with the same
/// mechanism (here the CPU's `none`): the victim it measured gets it; the other, a model the
/// matrix never measured as a victim, gets the matrix's worst.
#[test]
fn an_interference_matrix_gives_each_workload_its_stretch() {
    let _cores = cores();
    let tmp = tempfile::tempdir().unwrap();
    let m = tmp.path().join("m");
    run_ok(
        isolane()
            .args([
                "interference",
                "--backend",
                "cpu",
                "--victims",
                "spin:1ms",
                "--neighbours",
                "spin:2ms",
                "--victim-rate-hz",
                "50",
                "--duration-s",
                "0.2",
                "--warmup",
                "5",
                "--quiet",
                "--out",
            ])
            .arg(&m),
    );
    let s = scenario(tmp.path(), "s.toml", TWO);
    let o = isolane()
        .args(["plan", "--auto", "--profile-jobs", "30", "--profile-cache"])
        .arg(tmp.path().join("cache"))
        .arg("--stretch-from")
        .arg(&m)
        .arg(&s)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    // The value is measured in real time on the CI machine (a loaded 2-core one once gave
    // 1.10, a busier one 13.70, with which no plan met the deadlines: exit 2, "no plan"):
    // what is checked is where it came from, not its digits, nor whether a plan was found.
    assert!(
        o.status.code() == Some(0) || (o.status.code() == Some(2) && err.contains("no plan")),
        "{:?}\n{err}",
        o.status
    );
    assert!(
        err.contains("camera: stretch ") && err.contains("from the interference matrix"),
        "{err}"
    );
    assert!(
        err.contains("lidar: stretch") && err.contains("the matrix's worst at fp32"),
        "{err}"
    );
    // A matrix that is not one is refused by name.
    let bad = scenario(tmp.path(), "bad.json", "{}");
    let o = isolane()
        .args(["plan", "--auto", "--stretch-from"])
        .arg(&bad)
        .arg(&s)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("bad.json"));
}

/// `--profile-budget 0` measures nothing: each workload's first size is named as not profiled,
/// and without a plan the exit code is 2.
#[test]
fn a_spent_profile_budget_names_what_was_not_measured() {
    let tmp = tempfile::tempdir().unwrap();
    let s = scenario(tmp.path(), "s.toml", TWO);
    let o = isolane()
        .args(["plan", "--auto", "--profile-budget", "0", "--profile-cache"])
        .arg(tmp.path().join("cache"))
        .arg(&s)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    // Wrapped to 80 columns: read as one line.
    let err = String::from_utf8_lossy(&o.stderr)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    assert!(
        err.contains(
            "not profiled: `camera` (spin:1ms, batch 1, fp32, none) in 1 core: the profiling \
             budget is spent (0.0 s of 0.0 s)"
        ) && err.contains("not profiled: `lidar`"),
        "{err}"
    );
    assert!(!err.contains("profiled camera in"), "{err}");
    assert!(
        err.contains("plan again (with a larger --profile-budget)"),
        "{err}"
    );
}

/// `--verify-duration` runs each workload that long in the verification run (not its own
/// duration), leaves the planned file's own, and the table counts each workload's jobs.
#[test]
fn a_verification_runs_as_long_as_asked() {
    let _cores = cores();
    let tmp = tempfile::tempdir().unwrap();
    let s = scenario(tmp.path(), "s.toml", TWO);
    let planned = tmp.path().join("planned.toml");
    let v = tmp.path().join("v");
    let o = run_ok(
        isolane()
            .args(["plan", "--auto", "--profile-jobs", "50", "--profile-cache"])
            .arg(tmp.path().join("cache"))
            .arg("-o")
            .arg(&planned)
            .args([
                "--verify",
                "--rounds",
                "1",
                "--verify-duration",
                "2",
                "--verify-out",
            ])
            .arg(&v)
            .arg(&s),
    );
    let out = String::from_utf8_lossy(&o.stdout);
    let s = summary(&v);
    // 2 s at 10 Hz and 8 Hz.
    assert_eq!(workload(&s, "camera")["jobs"], 20, "{out}");
    assert_eq!(workload(&s, "lidar")["jobs"], 16, "{out}");
    assert!(
        out.contains(" jobs ") && out.contains("at 95 % confidence"),
        "{out}"
    );
    let text = std::fs::read_to_string(&planned).unwrap();
    assert!(text.contains("duration_s = 1.0"), "{text}");
    // Not a duration.
    let o = isolane()
        .args(["plan", "--auto", "--verify", "--verify-duration", "0"])
        .arg(tmp.path().join("s.toml"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("seconds > 0"));
}

/// A Ctrl-C during `plan --auto`'s verification stopped only that run: each run installed a
/// stop flag of its own, so the plan went on to its next round (or printed its verdict from
/// the stopped run) and exited 0. It now ends there with exit 130, the stopped run's records
/// readable by `report`, and no next round.
#[test]
fn a_ctrl_c_during_the_verification_ends_the_plan_with_130() {
    use std::time::{Duration, Instant};
    let _cores = cores();
    let tmp = tempfile::tempdir().unwrap();
    let s = scenario(tmp.path(), "s.toml", TWO);
    let v = tmp.path().join("v");
    let err = tmp.path().join("stderr.txt");
    let mut child = isolane()
        .args(["plan", "--auto", "--profile-jobs", "50", "--profile-cache"])
        .arg(tmp.path().join("cache"))
        .arg("-o")
        .arg(tmp.path().join("planned.toml"))
        .args(["--verify", "--verify-duration", "60", "--verify-out"])
        .arg(&v)
        .arg(&s)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let wait = |child: &mut std::process::Child, what: &str| {
        let since = Instant::now();
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return Some(status);
            }
            if since.elapsed() > Duration::from_secs(300) {
                let _ = child.kill();
                panic!("{what}: {}", std::fs::read_to_string(&err).unwrap());
            }
            if v.join("scenario.toml").exists() && what == "verification" {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    // The verification run has begun once its resolved scenario is in its folder.
    if let Some(status) = wait(&mut child, "verification") {
        panic!(
            "ended before its verification ({status}): {}",
            std::fs::read_to_string(&err).unwrap()
        );
    }
    let sent = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let status = wait(&mut child, "still running after Ctrl-C").unwrap();
    let stderr = std::fs::read_to_string(&err).unwrap();
    assert_eq!(status.code(), Some(130), "{stderr}");
    assert!(
        stderr.contains("interrupted (Ctrl-C or SIGTERM)"),
        "{stderr}"
    );
    assert!(!tmp.path().join("v.round2").exists(), "{stderr}");
    run_ok(
        isolane()
            .arg("report")
            .arg(&v)
            .arg("-o")
            .arg(tmp.path().join("r.html")),
    );
}

/// `--phases stagger` releases a workload without a phase where its jobs keep clear of the
/// others' (a phase the scenario gives is kept), writes it to the planned file, and the
/// verification run releases the jobs there.
#[test]
fn staggered_releases_keep_the_jobs_apart() {
    let _cores = cores();
    let tmp = tempfile::tempdir().unwrap();
    let s = scenario(
        tmp.path(),
        "s.toml",
        r#"
[[workload]]
name = "camera"
model = "spin:2ms"
rate_hz = 2
deadline_ms = 100
duration_s = 1

[[workload]]
name = "lidar"
model = "spin:1ms"
rate_hz = 4
phase_ms = 50
deadline_ms = 100
duration_s = 1
"#,
    );
    let planned = tmp.path().join("planned.toml");
    let v = tmp.path().join("v");
    let o = run_ok(
        isolane()
            .args(["plan", "--auto", "--profile-jobs", "30", "--profile-cache"])
            .arg(tmp.path().join("cache"))
            .args(["--phases", "stagger", "-o"])
            .arg(&planned)
            .args(["--verify", "--rounds", "1", "--verify-duration", "0.5"])
            .arg("--verify-out")
            .arg(&v)
            .arg(&s),
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("release phases (--phases stagger, over 500.0 ms): camera +")
            && err.contains("lidar +50.00 ms (0 % overlapped, 0 % in phase)"),
        "{err}"
    );
    let text = std::fs::read_to_string(&planned).unwrap();
    assert!(text.contains("phase_ms = 50.0"), "{text}");
    let first = |w: &str| -> f64 { jobs_rows(&v, w)[0][1].parse().unwrap() };
    assert_eq!(first("lidar"), 50.0);
    // The camera's 2 ms jobs every 500 ms miss the lidar's 1 ms jobs at 50 and 300 ms (periods
    // long enough that a loaded machine's profiles, however slow, leave room between them).
    let camera = first("camera");
    let written: Vec<f64> = (text.lines())
        .filter_map(|l| l.strip_prefix("phase_ms = ")?.parse().ok())
        .collect();
    assert!(written.contains(&camera), "{camera} {text}");
    let clear = |start: f64| camera + 2.0 <= start || camera >= start + 1.0;
    assert!(
        clear(50.0) && clear(300.0) && clear(550.0),
        "camera at {camera} ms"
    );
    // Without -o the planned scenario alone goes to stdout, a file as it is.
    let o = run_ok(
        isolane()
            .args(["plan", "--auto", "--phases", "stagger", "--profile-cache"])
            .arg(tmp.path().join("cache"))
            .arg(&s),
    );
    let printed = tmp.path().join("printed.toml");
    std::fs::write(&printed, &o.stdout).unwrap();
    run_ok(isolane().args(["plan"]).arg(&printed));
    let text = std::fs::read_to_string(&printed).unwrap();
    assert_eq!(text.matches("phase_ms").count(), 2, "{text}");
    // Without --phases the scenario's own phases stay.
    let o = run_ok(
        isolane()
            .args(["plan", "--auto", "--profile-cache"])
            .arg(tmp.path().join("cache"))
            .arg(&s),
    );
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(text.matches("phase_ms").count(), 1, "{text}");
}
