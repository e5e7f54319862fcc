use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;

use super::*;

fn rec(index: u64, release: i64, start: Option<i64>, end: Option<i64>, timeout: bool) -> JobRecord {
    JobRecord {
        index,
        release_ns: release,
        start_ns: start,
        end_ns: end,
        timeout,
        held_ns: 0,
    }
}

fn info(name: &str) -> WorkloadInfo {
    WorkloadInfo {
        name: name.into(),
        mechanism: "green".into(),
        partition: "green 64 SMs".into(),
        host: "thread".into(),
    }
}

/// The value of the sample line starting with `prefix` (name and labels).
fn value(text: &str, prefix: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no `{prefix}` in:\n{text}"))
}

#[test]
fn records_become_counters_and_histograms_per_workload() {
    let m = RunMetrics::new();
    m.begin_run("run", "s.toml", &[info("a"), info("b")]);
    // a: on time (started 2 µs late), late (started 1 ms after the previous end), skipped.
    // The late one was held back 0.5 ms by the criticality guard.
    let mut held = rec(1, 1_000_000, Some(5_000_000), Some(12_000_000), true);
    held.held_ns = 500_000;
    m.observe(
        0,
        &[
            rec(0, 0, Some(2_000), Some(4_000_000), false),
            held,
            rec(2, 2_000_000, None, None, true),
        ],
    );
    let t = m.encode();
    assert_eq!(value(&t, "isolane_jobs_total{workload=\"a\"}"), 3.0);
    assert_eq!(
        value(&t, "isolane_jobs_completed_total{workload=\"a\"}"),
        2.0
    );
    assert_eq!(value(&t, "isolane_timeouts_total{workload=\"a\"}"), 2.0);
    assert_eq!(value(&t, "isolane_jobs_skipped_total{workload=\"a\"}"), 1.0);
    assert_eq!(
        value(&t, "isolane_jobs_total{workload=\"b\"}"),
        0.0,
        "b shows at 0"
    );
    assert_eq!(value(&t, "isolane_jobs_held_total{workload=\"a\"}"), 1.0);
    assert_eq!(
        value(&t, "isolane_held_seconds_total{workload=\"a\"}"),
        0.0005
    );
    assert_eq!(value(&t, "isolane_held_seconds_total{workload=\"b\"}"), 0.0);
    assert_eq!(
        value(&t, "isolane_latency_seconds_count{workload=\"a\"}"),
        2.0
    );
    assert!((value(&t, "isolane_latency_seconds_sum{workload=\"a\"}") - 0.015).abs() < 1e-9);
    // Lateness: 2 µs from the release, then 1 ms from the previous end (4 → 5 ms).
    assert!(
        (value(&t, "isolane_start_lateness_seconds_sum{workload=\"a\"}") - 0.001002).abs() < 1e-9
    );
    assert_eq!(
        value(
            &t,
            "isolane_start_lateness_seconds_bucket{le=\"0.000004\",workload=\"a\"}"
        ),
        1.0,
        "{t}"
    );
    assert!(t.contains(
        "isolane_partition{workload=\"a\",mechanism=\"green\",partition=\"green 64 SMs\",host=\"thread\"} 1"
    ), "{t}");
    assert!(t.trim_end().ends_with("# EOF"));
    // A slot the run does not have is ignored rather than misfiled.
    m.observe(7, &[rec(0, 0, Some(1), Some(2), false)]);
    assert_eq!(
        m.encode().matches("workload=\"a\"}").count(),
        t.matches("workload=\"a\"}").count()
    );
}

#[test]
fn a_second_run_keeps_the_counters_and_marks_the_first_done() {
    let m = RunMetrics::new();
    m.begin_run("sweep", "point-1", &[info("a")]);
    m.observe(0, &[rec(0, 0, Some(0), Some(10), false)]);
    let mut bigger = info("a");
    bigger.partition = "green 128 SMs".into();
    m.begin_run("sweep", "point-2", &[bigger]);
    m.observe(0, &[rec(0, 0, Some(0), Some(10), false)]);
    let t = m.encode();
    assert_eq!(value(&t, "isolane_jobs_total{workload=\"a\"}"), 2.0);
    assert_eq!(
        value(&t, "isolane_run{command=\"sweep\",scenario=\"point-1\"}"),
        0.0
    );
    assert_eq!(
        value(&t, "isolane_run{command=\"sweep\",scenario=\"point-2\"}"),
        1.0
    );
    let partition = |p: &str| {
        let series = format!(
            "isolane_partition{{workload=\"a\",mechanism=\"green\",partition=\"{p}\",host=\"thread\"}}"
        );
        value(&t, &series)
    };
    assert_eq!(partition("green 64 SMs"), 0.0, "the earlier point's");
    assert_eq!(partition("green 128 SMs"), 1.0);
}

#[test]
fn telemetry_readings_set_gauges_in_base_units() {
    let m = RunMetrics::new();
    m.observe_device(&Reading {
        power_w: Some(312.5),
        sm_clock_mhz: Some(1980.0),
        memory_used_mib: Some(2.0),
        sm_util_pct: Some(50.0),
        dram_bw_util_pct: Some(f64::NAN),
        ..Reading::default()
    });
    let t = m.encode();
    assert_eq!(value(&t, "isolane_gpu_power_watts "), 312.5);
    assert_eq!(value(&t, "isolane_gpu_sm_clock_hertz "), 1.98e9);
    assert_eq!(value(&t, "isolane_gpu_memory_used_bytes "), 2.0 * MIB);
    assert_eq!(value(&t, "isolane_gpu_sm_utilization_ratio "), 0.5);
    assert_eq!(
        value(&t, "isolane_gpu_dram_bandwidth_utilization_ratio "),
        0.0,
        "NaN is no value"
    );
}

fn get(addr: std::net::SocketAddr, request: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[test]
fn the_server_answers_metrics_404_and_405_and_stops_when_dropped() {
    let m = Arc::new(RunMetrics::new());
    m.begin_run("run", "s.toml", &[info("a")]);
    let server = serve("127.0.0.1:0", Arc::clone(&m)).unwrap();
    let addr = server.addr();
    assert_ne!(addr.port(), 0);
    let ok = get(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
    assert!(
        ok.contains("Content-Type: application/openmetrics-text"),
        "{ok}"
    );
    assert!(ok.contains("isolane_jobs_total{workload=\"a\"} 0"), "{ok}");
    assert!(get(addr, "GET / HTTP/1.0\r\n\r\n").starts_with("HTTP/1.1 404"));
    assert!(get(addr, "POST /metrics HTTP/1.0\r\n\r\n").starts_with("HTTP/1.1 405"));
    drop(server);
    assert!(
        TcpStream::connect(addr).is_err(),
        "still listening after drop"
    );
}

#[test]
fn a_bad_or_busy_address_is_the_users_mistake() {
    let e = serve("no-port", Arc::new(RunMetrics::new())).err().unwrap();
    assert!(
        e.is_user_error() && e.to_string().contains("HOST:PORT"),
        "{e}"
    );
    let first = serve("127.0.0.1:0", Arc::new(RunMetrics::new())).unwrap();
    let taken = first.addr().to_string();
    let e = serve(&taken, Arc::new(RunMetrics::new())).err().unwrap();
    assert!(e.is_user_error() && e.to_string().contains(&taken), "{e}");
}
