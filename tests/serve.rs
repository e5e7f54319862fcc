//! `isolane serve` end to end, driven by Triton's own Python client (`tritonclient`, HTTP and
//! gRPC) through tests/serve_client.py: health and metadata, outputs bit-identical to
//! `isolane infer`'s, a refusal for an impossible deadline, and the drain on SIGTERM.
//! Without tritonclient the test skips (fails under ISOLANE_STRICT=1; .ci/run installs it).

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::*;
use isolane_core::system_packages::{skip_without, TRITONCLIENT};

/// The seed `isolane infer --weights-seed` must be given to build the served model's weights:
/// a scenario's default `[timing] seed`.
const DEFAULT_SEED: &str = "22026830";

/// Generous bounds for a loaded 2-core machine; none is a measurement.
const READY_WITHIN: Duration = Duration::from_secs(120);
const EXIT_WITHIN: Duration = Duration::from_secs(60);

/// Three served models: the real CNN whose outputs are compared, a 50 ms spin that a 1 ms
/// deadline cannot be met on, and a 1 s spin whose requests are still in flight at SIGTERM.
/// `deadline_ms` is set because the default, the period (1 / rate_hz), would refuse a
/// mobilenet request on a busy machine; `warmup_jobs = 0` (serve still runs 3) keeps the slow
/// spin's warm-up at 3 s.
const SCENARIO: &str = r#"
[device]
backend = "cpu"

[[workload]]
name = "mnet"
model = "mobilenet_v2"
batch = 1
rate_hz = 20
duration_s = 1
deadline_ms = 60000
warmup_jobs = 0

[[workload]]
name = "spin50"
model = "spin:50ms"
batch = 1
rate_hz = 20
duration_s = 1
deadline_ms = 60000
warmup_jobs = 0

[[workload]]
name = "slow"
model = "spin:1000ms"
batch = 1
rate_hz = 1
duration_s = 1
deadline_ms = 60000
warmup_jobs = 0
"#;

fn python() -> PathBuf {
    std::env::var_os("ISOLANE_PYTHON")
        .unwrap_or_else(|| "python3".into())
        .into()
}

fn client_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/serve_client.py")
}

/// Why the client cannot run here, if it cannot: no Python, or no tritonclient / numpy.
fn client_missing() -> Option<String> {
    let py = python();
    match Command::new(&py)
        .args([
            "-c",
            "import numpy, tritonclient.http, tritonclient.grpc, tritonclient.utils",
        ])
        .output()
    {
        Err(e) => Some(format!("`{}`: {e}", py.display())),
        Ok(o) if !o.status.success() => Some(format!(
            "`{} -c 'import tritonclient.http, tritonclient.grpc'`: {}",
            py.display(),
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Ok(_) => None,
    }
}

/// The server process, killed if the test ends before it has exited by itself.
struct Served(Child);

impl Drop for Served {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// The address after `label` in the ready line
/// (`isolane serve: ready; HTTP on 127.0.0.1:PORT, gRPC on 127.0.0.1:PORT; models: ...`).
fn address_after<'a>(line: &'a str, label: &str) -> Option<&'a str> {
    let rest = &line[line.find(label)? + label.len()..];
    let end = rest.find([',', ';', ' ']).unwrap_or(rest.len());
    Some(&rest[..end]).filter(|a| a.contains(':'))
}

/// A fixed pseudo-random image in [-2, 2) (an xorshift; nothing is read from outside).
fn image() -> Vec<f32> {
    let mut s: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..3 * 224 * 224)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
        })
        .collect()
}

#[test]
fn tritonclient_over_http_and_grpc_gets_infers_outputs_refusals_and_a_drain() {
    if let Some(why) = client_missing() {
        skip_without(&TRITONCLIENT, &why);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let x = dir.path().join("x.npy");
    let y = dir.path().join("y.npy");
    isolane_engine::io::write_npy(&x, &[1, 3, 224, 224], &image()).unwrap();
    run_ok(isolane().args([
        "infer",
        "--model",
        "mobilenet_v2",
        "--weights-seed",
        DEFAULT_SEED,
        "--threads",
        "1",
        "--input",
        x.to_str().unwrap(),
        "--save-output",
        y.to_str().unwrap(),
    ]));

    let file = scenario(dir.path(), "serve.toml", SCENARIO);
    let log = dir.path().join("serve.log");
    let mut child = isolane()
        .arg("serve")
        .arg(&file)
        .args(["--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let served = Served(child);
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();

    // The ready line, read on a thread of its own so that a server that never gets ready
    // fails the test instead of hanging it.
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let ready = rx
        .recv_timeout(READY_WITHIN)
        .unwrap_or_else(|_| panic!("no ready line in {READY_WITHIN:?}; stderr:\n{}", log_text()));
    assert!(
        ready.starts_with("isolane serve: ready; "),
        "ready line {ready:?}; stderr:\n{}",
        log_text()
    );
    let http = address_after(&ready, "HTTP on ").unwrap_or_else(|| panic!("{ready}"));
    let grpc = address_after(&ready, "gRPC on ").unwrap_or_else(|| panic!("{ready}"));
    for m in ["mnet (cpu", "spin50 (cpu", "slow (cpu"] {
        assert!(ready.contains(m), "{m} in {ready}");
    }

    let client = Command::new(python())
        .arg(client_script())
        .args(["--http", http, "--grpc", grpc])
        .args(["--pid", &served.0.id().to_string()])
        .args(["--model", "mnet", "--spin", "spin50", "--slow", "slow"])
        .arg("--input")
        .arg(&x)
        .arg("--expect")
        .arg(&y)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&client.stdout).into_owned();
    assert!(
        client.status.success(),
        "the client failed ({:?}):\n{said}\n{}\nthe server's stderr:\n{}",
        client.status.code(),
        String::from_utf8_lossy(&client.stderr),
        log_text()
    );
    for check in [
        "ok: HTTP, binary tensor data: outputs equal isolane infer's",
        "ok: HTTP, JSON data: outputs equal isolane infer's",
        "ok: gRPC: outputs equal isolane infer's",
        "ok: HTTP: model metadata",
        "ok: gRPC: model metadata",
        "ok: HTTP: the repository index",
        "ok: HTTP: an impossible deadline is refused with 429",
        "ok: gRPC: an impossible deadline is refused with RESOURCE_EXHAUSTED",
        "ok: HTTP: a new request after SIGTERM",
        "ok: gRPC: a new request after SIGTERM",
        "ok: HTTP: the request in flight at SIGTERM is answered",
        "ok: gRPC: the request in flight at SIGTERM is answered",
    ] {
        assert!(said.contains(check), "`{check}` missing from:\n{said}");
    }

    // The client sent SIGTERM: the server answers what it took, then exits 0 by itself.
    let mut served = served;
    let until = Instant::now() + EXIT_WITHIN;
    let status = loop {
        if let Some(s) = served.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < until,
            "still running {EXIT_WITHIN:?} after SIGTERM; stderr:\n{}",
            log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let log = log_text();
    assert_eq!(status.code(), Some(0), "stderr:\n{log}");
    assert!(
        log.contains("isolane serve: stopping; no new requests") && log.contains(" 0 abandoned"),
        "{log}"
    );
    // One access-log line a request, refusals included.
    for line in [
        r#"protocol="http" method=POST path=/v2/models/spin50/infer model="spin50" status=429"#,
        r#"protocol="grpc" method="ModelInfer" model="mnet" status=0"#,
    ] {
        assert!(log.contains(line), "`{line}` missing from:\n{log}");
    }
}
