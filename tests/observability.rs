//! `isolane trace` / `run --trace` and `--metrics-addr` on the CPU (docs/observability.md):
//! a run's trace file and its exit codes, and the metrics endpoint scraped while a run with a
//! thread-hosted and a process-hosted workload goes on.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Stdio;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::*;

const SHORT: &str = r#"
[device]
backend = "cpu"

[timing]
start_delay_ms = 20

[[workload]]
name = "camera"
model = "spin:1ms"
rate_hz = 200
jobs = 40
warmup_jobs = 2

[[workload]]
name = "lidar"
model = "spin:2ms"
rate_hz = 100
jobs = 20
warmup_jobs = 2
"#;

fn events(trace: &Path) -> Vec<serde_json::Value> {
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(trace).unwrap()).unwrap();
    doc["traceEvents"].as_array().unwrap().clone()
}

/// The track (tid) the trace names `<workload> (<model>)`.
fn track(events: &[serde_json::Value], name: &str) -> u64 {
    events
        .iter()
        .find(|e| e["name"] == "thread_name" && e["args"]["name"] == name)
        .and_then(|e| e["tid"].as_u64())
        .unwrap_or_else(|| panic!("no track `{name}`"))
}

#[test]
fn run_trace_writes_every_job_on_its_workloads_track() {
    let tmp = tempfile::tempdir().unwrap();
    let sc = scenario(tmp.path(), "s.toml", SHORT);
    let out = tmp.path().join("out");
    let o = run_ok(
        isolane()
            .arg("run")
            .arg(&sc)
            .arg("--out")
            .arg(&out)
            .args(["--trace", "-q"]),
    );
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("trace.json"), "{stdout}");
    let ev = events(&out.join("trace.json"));
    let s = summary(&out);
    for (name, model) in [("camera", "spin:1ms"), ("lidar", "spin:2ms")] {
        let tid = track(&ev, &format!("{name} ({model})"));
        let on_track = |n: &str| {
            ev.iter()
                .filter(|e| e["tid"] == tid && e["pid"] == 1 && e["name"] == n)
                .count() as u64
        };
        let w = workload(&s, name);
        let spans = on_track("job") + on_track("job (timeout)");
        assert_eq!(spans, w["completed"].as_u64().unwrap(), "{name}");
        assert_eq!(on_track("release"), w["jobs"].as_u64().unwrap(), "{name}");
    }
    // The standalone command writes the same file from the folder.
    let again = tmp.path().join("again.json");
    run_ok(isolane().arg("trace").arg(&out).arg("--out").arg(&again));
    assert_eq!(events(&again), ev);

    // A window: the jobs whose release-to-end span meets 50–100 ms: camera's releases at 50,
    // 55, …, 100 ms, and the one at 45 ms only if a busy machine made it end after 50.
    let part = tmp.path().join("part.json");
    run_ok(
        isolane()
            .arg("trace")
            .arg(&out)
            .arg("--out")
            .arg(&part)
            .args(["--from-ms", "50", "--to-ms", "100"]),
    );
    let camera = track(&ev, "camera (spin:1ms)");
    let releases = events(&part)
        .iter()
        .filter(|e| e["tid"] == camera && e["pid"] == 1 && e["name"] == "release")
        .map(|e| e["ts"].as_f64().unwrap())
        .collect::<Vec<_>>();
    assert!((11..=12).contains(&releases.len()), "{releases:?}");
    let o = isolane()
        .arg("trace")
        .arg(&out)
        .args(["--from-ms", "100", "--to-ms", "50"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn trace_names_what_is_wrong_with_the_folder_and_exits_2() {
    let tmp = tempfile::tempdir().unwrap();
    let o = isolane().arg("trace").arg(tmp.path()).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("summary.json") && err.contains(&tmp.path().display().to_string()),
        "{err}"
    );

    let sc = scenario(tmp.path(), "s.toml", SHORT);
    let out = tmp.path().join("out");
    run_ok(
        isolane()
            .arg("run")
            .arg(&sc)
            .arg("--out")
            .arg(&out)
            .arg("-q"),
    );
    let csv = out.join("jobs/lidar.csv");
    let text = std::fs::read_to_string(&csv).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    lines[3] = "2,20.000000,twenty,22.0,2.0,0";
    std::fs::write(&csv, lines.join("\n")).unwrap();
    let o = isolane().arg("trace").arg(&out).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("lidar.csv") && err.contains("line 4") && err.contains("`start_ms`"),
        "{err}"
    );
    assert!(!out.join("trace.json").exists());
}

/// A run of one `[[app]]` (issue 31: `trace` wrote an empty trace of it and exited 0; issue
/// 32: it is traced).
const APP: &str = r#"
[device]
backend = "cpu"

[[app]]
name = "a"
deadline_ms = 50
frames = 24
[app.source]
kind = "synthetic"
width = 32
height = 32
fps = 100
[[app.stage]]
name = "pre"
kind = "preprocess"
size = [8, 8]
[[app.stage]]
name = "out"
kind = "sink"
"#;

#[test]
fn trace_takes_app_runs_and_refuses_other_folders_with_what_reads_them() {
    let tmp = tempfile::tempdir().unwrap();
    let trace = |dir: &Path| {
        let o = isolane().arg("trace").arg(dir).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(!dir.join("trace.json").exists(), "{err}");
        err
    };

    let sc = scenario(tmp.path(), "app.toml", APP);
    let app = tmp.path().join("app");
    run_ok(
        isolane()
            .arg("run")
            .arg(&sc)
            .arg("--out")
            .arg(&app)
            .arg("-q"),
    );
    // Traced since its frames CSV keeps when each stage started (tests/apps.rs checks it).
    run_ok(isolane().arg("trace").arg(&app));
    assert!(std::fs::read_to_string(app.join("trace.json"))
        .unwrap()
        .contains("\"a/pre (preprocess, cpu)\""));

    // A max-rate folder is no killed run: the hint is the command that reads it, and it does.
    let maxrate = tmp.path().join("maxrate");
    run_ok(
        isolane()
            .args(["maxrate", "--model", "spin:1ms", "--jobs", "30"])
            .args([
                "--validations",
                "1",
                "--relative-step",
                "0.5",
                "-q",
                "--out",
            ])
            .arg(&maxrate),
    );
    let err = trace(&maxrate);
    assert!(
        err.contains("max-rate search")
            && err.contains("isolane report")
            && !err.contains("summarize"),
        "{err}"
    );
    run_ok(
        isolane()
            .arg("report")
            .arg(&maxrate)
            .arg("--out")
            .arg(tmp.path().join("r.html")),
    );

    // A run killed before its summary: summarize, as suggested, makes it traceable.
    let short = scenario(tmp.path(), "s.toml", SHORT);
    let cut = tmp.path().join("cut");
    run_ok(
        isolane()
            .arg("run")
            .arg(&short)
            .arg("--out")
            .arg(&cut)
            .arg("-q"),
    );
    std::fs::remove_file(cut.join("summary.json")).unwrap();
    let err = trace(&cut);
    assert!(err.contains("isolane summarize"), "{err}");
    run_ok(isolane().arg("summarize").arg(&cut));
    run_ok(isolane().arg("trace").arg(&cut));
}

/// GET `path` from `addr`; the body, or why not.
fn get(addr: &str, path: &str) -> Result<String, String> {
    let mut s = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").map_err(|e| e.to_string())?;
    let mut text = String::new();
    s.read_to_string(&mut text).map_err(|e| e.to_string())?;
    let (head, body) = text.split_once("\r\n\r\n").ok_or("no header end")?;
    if !head.starts_with("HTTP/1.1 200") {
        return Err(head.to_string());
    }
    Ok(body.to_string())
}

/// A sample's value: `name{labels} value`.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// The rules of the OpenMetrics text a scraper relies on: `# EOF` last, every sample a
/// number, every histogram's `+Inf` bucket equal to its count.
fn check_exposition(text: &str) {
    assert_eq!(text.lines().last(), Some("# EOF"), "{text}");
    for l in text.lines().filter(|l| !l.starts_with('#')) {
        let value = l.rsplit(' ').next().unwrap_or_default();
        assert!(value.parse::<f64>().is_ok(), "not a sample: {l}");
    }
    for l in text.lines().filter(|l| l.contains("_bucket{le=\"+Inf\"")) {
        let labels = l
            .split("le=\"+Inf\",")
            .nth(1)
            .unwrap()
            .split('}')
            .next()
            .unwrap();
        let name = l.split("_bucket").next().unwrap();
        let inf = sample(text, l.rsplit_once(' ').unwrap().0).unwrap();
        let count = sample(text, &format!("{name}_count{{{labels}}}"));
        assert_eq!(Some(inf), count, "{l}");
    }
}

const LONG: &str = r#"
[device]
backend = "cpu"

[timing]
start_delay_ms = 20

[[workload]]
name = "in-thread"
model = "spin:1ms"
rate_hz = 100
duration_s = 120
warmup_jobs = 2

[[workload]]
name = "in-process"
host = "process"
model = "spin:1ms"
rate_hz = 100
duration_s = 120
warmup_jobs = 2
"#;

#[test]
fn metrics_are_served_while_a_run_goes_on() {
    let tmp = tempfile::tempdir().unwrap();
    let sc = scenario(tmp.path(), "s.toml", LONG);
    let out = tmp.path().join("out");
    let mut child = isolane()
        .arg("run")
        .arg(&sc)
        .arg("--out")
        .arg(&out)
        .args(["--quiet", "--metrics-addr", "127.0.0.1:0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The address is the first line of stderr; the rest is drained so the run never blocks.
    let (tx, rx) = mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(url) = line.strip_prefix("metrics: http://") {
                let _ = tx.send(url.trim_end_matches("/metrics").to_string());
            }
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    let addr = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("no metrics address on stderr");

    // Poll until both workloads have run jobs: a loaded machine only makes it take longer.
    let deadline = Instant::now() + Duration::from_secs(90);
    let (text, scraped) = loop {
        let body = get(&addr, "/metrics");
        if let Ok(text) = &body {
            let jobs = |w: &str| sample(text, &format!("isolane_jobs_total{{workload=\"{w}\"}}"));
            if let (Some(a), Some(b)) = (jobs("in-thread"), jobs("in-process")) {
                if a >= 5.0 && b >= 5.0 {
                    break (text.clone(), [a, b]);
                }
            }
        }
        assert!(
            Instant::now() < deadline,
            "no jobs counted in time: {body:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    // SAFETY: plain kill(2) of our own child.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    assert_eq!(child.wait().unwrap().code(), Some(130));
    let log = reader.join().unwrap();

    check_exposition(&text);
    for family in [
        "# TYPE isolane_jobs counter",
        "# TYPE isolane_timeouts counter",
        "# TYPE isolane_latency_seconds histogram",
        "# TYPE isolane_start_lateness_seconds histogram",
        "isolane_partition{workload=\"in-process\",mechanism=\"none\",partition=\"cpu\",host=\"process\"} 1",
    ] {
        assert!(text.contains(family), "no `{family}` in:\n{text}");
    }
    // What was scraped mid-run is part of what the run recorded.
    let s = summary(&out);
    for (name, seen) in ["in-thread", "in-process"].iter().zip(scraped) {
        let jobs = workload(&s, name)["jobs"].as_u64().unwrap() as f64;
        assert!(
            seen <= jobs,
            "{name}: scraped {seen}, recorded {jobs}\n{log}"
        );
    }
}

#[test]
fn a_bad_metrics_address_is_refused_before_anything_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let sc = scenario(tmp.path(), "s.toml", SHORT);
    let out = tmp.path().join("out");
    let o = isolane()
        .arg("run")
        .arg(&sc)
        .arg("--out")
        .arg(&out)
        .args(["--metrics-addr", "localhost"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--metrics-addr `localhost`") && err.contains("HOST:PORT"),
        "{err}"
    );
    assert!(!out.exists(), "nothing is created");
}

#[test]
fn isolation_trace_shows_the_ramps_steps() {
    let tmp = tempfile::tempdir().unwrap();
    let sc = scenario(
        tmp.path(),
        "iso.toml",
        r#"
[device]
backend = "cpu"

[[workload]]
name = "victim"
role = "victim"
model = "spin:1ms"
rate_hz = 100
duration_s = 1
warmup_jobs = 2

[[workload]]
name = "interferer"
role = "interferer"
model = "spin:1ms"
ramp = { from_hz = 10, to_hz = 50, steps = 3, step_s = 0.2 }
warmup_jobs = 2
"#,
    );
    let out = tmp.path().join("out");
    run_ok(
        isolane()
            .arg("isolation")
            .arg(&sc)
            .arg("--out")
            .arg(&out)
            .args(["--trace", "-q"]),
    );
    let ev = events(&out.join("trace.json"));
    let steps: Vec<(f64, f64)> = ev
        .iter()
        .filter(|e| e["cat"] == "step")
        .map(|e| (e["ts"].as_f64().unwrap(), e["dur"].as_f64().unwrap()))
        .collect();
    assert_eq!(steps.len(), 3, "{steps:?}");
    // Back to back, 200 ms each, in µs.
    for w in steps.windows(2) {
        assert!((w[1].0 - w[0].0 - 200_000.0).abs() < 0.01, "{steps:?}");
    }
    assert!(
        steps.iter().all(|s| (s.1 - 200_000.0).abs() < 0.01),
        "{steps:?}"
    );
}
