use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::http::Limits;

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

/// A server's released workloads: run's job families in its own registry, under its prefix,
/// for the slots that release only (a served model's slot counts nothing here).
#[test]
fn job_meters_count_the_releasing_slots_under_a_servers_prefix() {
    let meters = JobMeters::new();
    let mut registry = Registry::with_prefix("isolane_serve");
    meters.register(registry.sub_registry_with_prefix("released"));
    meters.begin(&[None, Some("tick")]);
    meters.observe(0, &[rec(0, 0, Some(0), Some(10), false)]);
    meters.observe(1, &[rec(0, 0, Some(0), Some(1_000), false)]);
    meters.observe(1, &[rec(1, 10, None, None, true)]);
    let mut t = String::new();
    prometheus_client::encoding::text::encode(&mut t, &registry).unwrap();
    let tick = "{workload=\"tick\"}";
    assert_eq!(
        value(&t, &format!("isolane_serve_released_jobs_total{tick}")),
        2.0
    );
    assert_eq!(
        value(
            &t,
            &format!("isolane_serve_released_jobs_skipped_total{tick}")
        ),
        1.0
    );
    assert_eq!(
        value(
            &t,
            &format!("isolane_serve_released_latency_seconds_count{tick}")
        ),
        1.0
    );
    // Every series is the releasing slot's (a histogram's buckets put `le` first).
    assert_eq!(
        t.matches("workload=").count(),
        t.matches("workload=\"tick\"").count(),
        "{t}"
    );
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
    assert!(
        !t.contains("isolane_gpu_dram_bandwidth_utilization_ratio"),
        "NaN is no value: {t}"
    );
    assert!(!t.contains("isolane_gpu_temperature_celsius"), "{t}");
    assert!(
        t.contains("# HELP isolane_gpu_power_watts GPU power draw (NVML).\n# TYPE isolane_gpu_power_watts gauge\n"),
        "{t}"
    );
    // A later reading without power keeps the last one.
    m.observe_device(&Reading {
        temperature_c: Some(41.0),
        ..Reading::default()
    });
    let t = m.encode();
    assert_eq!(value(&t, "isolane_gpu_power_watts "), 312.5);
    assert_eq!(value(&t, "isolane_gpu_temperature_celsius "), 41.0);
    assert!(t.trim_end().ends_with("# EOF"), "{t}");
}

/// The reproducer: a CPU run's endpoint said 0 W and 0 °C.
#[test]
fn without_telemetry_there_are_no_gpu_gauges() {
    let m = RunMetrics::new();
    m.begin_run("run", "cpu.toml", &[info("a")]);
    let t = m.encode();
    assert!(!t.contains("isolane_gpu_"), "{t}");
    assert!(t.contains("isolane_jobs_total{workload=\"a\"} 0"), "{t}");
    // A reading with nothing in it (a source that could read nothing) adds nothing either.
    m.observe_device(&Reading::default());
    assert!(!m.encode().contains("isolane_gpu_"));
}

/// A client connection that reads responses one by one (by their Content-Length), keeping
/// what follows for the next: the server keeps HTTP/1.1 connections open.
struct Client {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Client {
    fn connect(addr: SocketAddr) -> Client {
        let stream = TcpStream::connect(addr).unwrap();
        // Far beyond any deadline of the server's: a hang fails the test rather than blocking it.
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        Client {
            stream,
            buf: Vec::new(),
        }
    }

    fn send(&mut self, request: &str) {
        self.stream.write_all(request.as_bytes()).unwrap();
    }

    /// The next response, head and body; what came before the close if the server closed.
    fn response(&mut self) -> String {
        let mut chunk = [0u8; 16384];
        loop {
            if let Some(end) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&self.buf[..end]).to_ascii_lowercase();
                let len = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .map(|v| v.trim().parse::<usize>().unwrap());
                if let Some(len) = len {
                    if self.buf.len() >= end + 4 + len {
                        let rest = self.buf.split_off(end + 4 + len);
                        let text = String::from_utf8(std::mem::replace(&mut self.buf, rest));
                        return text.unwrap();
                    }
                }
            }
            match self.stream.read(&mut chunk) {
                Ok(0) => return String::from_utf8(std::mem::take(&mut self.buf)).unwrap(),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) => panic!("reading a response: {e}"),
            }
        }
    }
}

fn get(addr: SocketAddr, request: &str) -> String {
    let mut c = Client::connect(addr);
    c.send(request);
    c.response()
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
    // The endpoint closes each connection after its answer, as it always did: a client that
    // reads to the close gets its scrape at once, HTTP/1.1 or not.
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\nGET /metrics HTTP/1.1\r\n\r\n")
        .unwrap();
    let t = Instant::now();
    let mut all = String::new();
    s.read_to_string(&mut all).unwrap();
    assert!(
        t.elapsed() < SCRAPE_BOUND,
        "read to the close in {:?}",
        t.elapsed()
    );
    assert_eq!(all.matches("HTTP/1.1 200 OK").count(), 1, "{all}");
    assert!(all.contains("Connection: close\r\n"), "{all}");
    // An HTTP/1.0 client is answered in HTTP/1.0 (hyper's rule).
    assert!(get(addr, "GET / HTTP/1.0\r\n\r\n").starts_with("HTTP/1.0 404"));
    let post = get(
        addr,
        "POST /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert!(post.starts_with("HTTP/1.1 405"), "{post}");
    assert!(
        post.to_ascii_lowercase().contains("allow: get\r\n"),
        "{post}"
    );
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

/// Long enough for a scrape on a loaded 2-core machine (it takes a few ms), far shorter than
/// the stalls of the one-connection-at-a-time endpoint (40 s for one dribbling client).
const SCRAPE_BOUND: Duration = Duration::from_secs(4);

fn served() -> (Arc<RunMetrics>, MetricsServer) {
    let m = Arc::new(RunMetrics::new());
    m.begin_run("run", "s.toml", &[info("a")]);
    let server = serve("127.0.0.1:0", Arc::clone(&m)).unwrap();
    (m, server)
}

/// A scrape on a fresh connection: its answer and how long it took.
fn scrape(addr: SocketAddr) -> (String, Duration) {
    let t = Instant::now();
    let text = get(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    (text, t.elapsed())
}

fn assert_quick_scrape(addr: SocketAddr, during: &str) {
    let (text, took) = scrape(addr);
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{during}: {text}");
    assert!(
        text.contains("isolane_jobs_total{workload=\"a\"} 0"),
        "{during}: {text}"
    );
    assert!(took < SCRAPE_BOUND, "{during}: the scrape took {took:?}");
}

/// Whether the server has closed `s` (non-blocking socket): EOF or a reset. Data (an answer
/// the test does not expect) counts as not closed.
fn closed(s: &TcpStream) -> bool {
    let mut b = [0u8; 512];
    match (&*s).read(&mut b) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != ErrorKind::WouldBlock && e.kind() != ErrorKind::Interrupted,
    }
}

/// Sockets that send `first` and then one byte every `every` until the server closes them
/// (or `give_up` passes): when each was closed, counted from just before its connect.
fn trickle(
    addr: SocketAddr,
    n: usize,
    first: &[u8],
    every: Duration,
    give_up: Duration,
) -> Vec<Option<Duration>> {
    let start = Instant::now();
    let mut socks: Vec<(TcpStream, Option<Duration>)> = (0..n)
        .map(|_| {
            let s = TcpStream::connect(addr).unwrap();
            (&s).write_all(first).unwrap();
            s.set_nonblocking(true).unwrap();
            (s, None)
        })
        .collect();
    while start.elapsed() < give_up && socks.iter().any(|(_, c)| c.is_none()) {
        thread::sleep(every);
        for (s, at) in socks.iter_mut().filter(|(_, c)| c.is_none()) {
            // A header line that never ends; a write the server no longer reads fails.
            if closed(s)
                || (&*s)
                    .write(b"a")
                    .is_err_and(|e| e.kind() != ErrorKind::WouldBlock)
            {
                *at = Some(start.elapsed());
            }
        }
    }
    socks.into_iter().map(|(_, at)| at).collect()
}

/// The reproducer of issue 31 item 11: one connection dribbling a byte at a time held the
/// endpoint (each byte came within its per-read timeout). Now a scrape goes through beside it,
/// and the dribbler is cut off at the whole-request deadline however steadily it sends.
#[test]
fn a_dribbling_client_neither_stalls_a_scrape_nor_outlives_the_request_deadline() {
    let (_m, server) = served();
    let addr = server.addr();
    let deadline = Limits::METRICS.request_deadline;
    let dribbler = thread::spawn(move || {
        trickle(
            addr,
            1,
            b"GET /metrics HTTP/1.1\r\nX-Slow: ",
            Duration::from_millis(300),
            deadline * 4,
        )
    });
    for i in 0..3 {
        thread::sleep(Duration::from_millis(500));
        assert_quick_scrape(addr, &format!("scrape {i} beside a dribbling client"));
    }
    let closed_at = dribbler.join().unwrap()[0].expect("the dribbler was never cut off");
    assert!(
        closed_at >= deadline,
        "cut off at {closed_at:?}, before the deadline"
    );
    assert!(closed_at < deadline * 3, "cut off only at {closed_at:?}");
}

#[test]
fn slowloris_connections_neither_stall_scrapes_nor_outlive_the_request_deadline() {
    let (_m, server) = served();
    let addr = server.addr();
    let deadline = Limits::METRICS.request_deadline;
    const SLOW: usize = 120;
    let slow = thread::spawn(move || {
        trickle(
            addr,
            SLOW,
            b"GET /metrics HTTP/1.1\r\nX-Slow: ",
            Duration::from_millis(400),
            deadline * 4,
        )
    });
    // Once they are all open (a scrape's connection comes after theirs), and again later.
    let t = Instant::now();
    while server.open_connections() < SLOW && t.elapsed() < deadline {
        thread::sleep(Duration::from_millis(20));
    }
    assert!(
        server.open_connections() >= SLOW,
        "only {} open",
        server.open_connections()
    );
    for i in 0..3 {
        assert_quick_scrape(
            addr,
            &format!("scrape {i} beside {SLOW} slowloris connections"),
        );
        thread::sleep(Duration::from_millis(700));
    }
    let closed_at = slow.join().unwrap();
    for (i, at) in closed_at.iter().enumerate() {
        let at = at.unwrap_or_else(|| panic!("slow connection {i} was never cut off"));
        assert!(
            at >= deadline && at < deadline * 3,
            "connection {i} cut off at {at:?}"
        );
    }
    let t = Instant::now();
    while server.open_connections() > 0 && t.elapsed() < deadline {
        thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        server.open_connections(),
        0,
        "the server still holds connections"
    );
}

#[test]
fn connections_beyond_the_cap_are_answered_503_at_once_and_scrapes_resume() {
    let m = Arc::new(RunMetrics::new());
    m.begin_run("run", "s.toml", &[info("a")]);
    let limits = Limits {
        max_connections: 8,
        request_deadline: Duration::from_secs(6),
        ..Limits::METRICS
    };
    let server = server::serve_with("127.0.0.1:0", m, limits).unwrap();
    let addr = server.addr();
    // Silent connections, five times the cap.
    let start = Instant::now();
    let flood: Vec<TcpStream> = (0..40).map(|_| TcpStream::connect(addr).unwrap()).collect();
    let mut answers: Vec<Option<String>> = vec![None; flood.len()];
    for s in &flood {
        s.set_nonblocking(true).unwrap();
    }
    // Well before the deadline: the refused ones hear at once, the first eight wait.
    while start.elapsed() < limits.request_deadline / 2
        && answers.iter().filter(|a| a.is_some()).count() < 32
    {
        thread::sleep(Duration::from_millis(20));
        for (s, a) in flood
            .iter()
            .zip(answers.iter_mut())
            .filter(|(_, a)| a.is_none())
        {
            let mut b = [0u8; 512];
            match (&*s).read(&mut b) {
                Ok(n) => *a = Some(String::from_utf8_lossy(&b[..n]).into_owned()),
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                // Closed without an answer.
                Err(_) => *a = Some(String::new()),
            }
        }
    }
    let refused = answers
        .iter()
        .flatten()
        .filter(|a| a.starts_with("HTTP/1.1 503 "))
        .count();
    assert!(refused >= 32, "{refused} of 40 answered 503: {answers:?}");
    assert!(server.open_connections() <= 8);
    // Once the eight are cut off at their deadline, a scrape goes through.
    let mut scraped = None;
    while scraped.is_none() && start.elapsed() < limits.request_deadline * 4 {
        let (text, _) = scrape(addr);
        if text.starts_with("HTTP/1.1 200 OK\r\n") {
            scraped = Some(start.elapsed());
        } else {
            assert!(
                text.is_empty() || text.starts_with("HTTP/1.1 503 "),
                "{text}"
            );
            thread::sleep(Duration::from_millis(100));
        }
    }
    let at = scraped.expect("no scrape went through");
    assert!(
        at < limits.request_deadline * 3,
        "the first scrape through at {at:?}"
    );
}

#[test]
fn a_connect_and_close_flood_does_not_stall_scrapes() {
    let (_m, server) = served();
    let addr = server.addr();
    let flooders: Vec<_> = (0..2)
        .map(|_| {
            thread::spawn(move || {
                for _ in 0..300 {
                    // Some connect and leave, some send half a request and leave.
                    if let Ok(mut s) = TcpStream::connect(addr) {
                        let _ = s.write_all(b"GET /met");
                    }
                    let _ = TcpStream::connect(addr);
                }
            })
        })
        .collect();
    for i in 0..5 {
        assert_quick_scrape(addr, &format!("scrape {i} during a flood"));
    }
    for f in flooders {
        f.join().unwrap();
    }
    let t = Instant::now();
    while server.open_connections() > 0 && t.elapsed() < Limits::METRICS.request_deadline * 2 {
        thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        server.open_connections(),
        0,
        "closed connections still held"
    );
}

#[test]
fn kept_alive_connections_serve_several_requests_then_close_when_idle() {
    let m = Arc::new(RunMetrics::new());
    m.begin_run("run", "s.toml", &[info("a")]);
    let limits = Limits {
        request_deadline: Duration::from_secs(8),
        keep_alive: true,
        idle_timeout: Duration::from_secs(1),
        ..Limits::METRICS
    };
    let server = server::serve_with("127.0.0.1:0", m, limits).unwrap();
    let mut c = Client::connect(server.addr());
    let request = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
    c.send(request);
    assert!(c.response().starts_with("HTTP/1.1 200 OK\r\n"));
    // Two more, pipelined in one write.
    c.send(&format!(
        "{request}GET /nothing HTTP/1.1\r\nHost: x\r\n\r\n"
    ));
    assert!(c.response().starts_with("HTTP/1.1 200 OK\r\n"));
    assert!(c.response().starts_with("HTTP/1.1 404 "));
    // Idle now: closed after the idle timeout, not the request deadline.
    let t = Instant::now();
    assert_eq!(c.response(), "", "the server closes without a word");
    let idle = t.elapsed();
    assert!(
        idle >= limits.idle_timeout / 2 && idle < limits.request_deadline / 2,
        "closed after {idle:?} idle"
    );
}

#[test]
fn an_oversized_header_is_refused_with_431() {
    let (_m, server) = served();
    let big = format!(
        "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "a".repeat(20 * 1024)
    );
    let mut c = Client::connect(server.addr());
    // The server may answer and close before it has read it all.
    let _ = c.stream.write_all(big.as_bytes());
    let answer = c.response();
    assert!(answer.starts_with("HTTP/1.1 431 "), "{answer}");
    let many: String = (0..100).map(|i| format!("X-{i}: 1\r\n")).collect();
    let answer = get(
        server.addr(),
        &format!("GET /metrics HTTP/1.1\r\n{many}\r\n"),
    );
    assert!(answer.starts_with("HTTP/1.1 431 "), "{answer}");
    assert_quick_scrape(server.addr(), "after the oversized headers");
}

#[test]
fn stopping_the_server_does_not_wait_for_slow_clients() {
    let (_m, server) = served();
    let addr = server.addr();
    let silent = TcpStream::connect(addr).unwrap();
    let mut partial = TcpStream::connect(addr).unwrap();
    partial
        .write_all(b"GET /metrics HTTP/1.1\r\nHost:")
        .unwrap();
    let t = Instant::now();
    while server.open_connections() < 2 && t.elapsed() < SCRAPE_BOUND {
        thread::sleep(Duration::from_millis(10));
    }
    let t = Instant::now();
    drop(server);
    let took = t.elapsed();
    assert!(
        took < Limits::METRICS.request_deadline - Duration::from_secs(1),
        "stopping took {took:?}"
    );
    for mut s in [silent, partial] {
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
        assert!(rest.is_empty(), "{}", String::from_utf8_lossy(&rest));
    }
    assert!(TcpStream::connect(addr).is_err(), "still listening");
}

/// Whatever a client sends, the server answers it (an HTTP response) or closes, within the
/// deadline, and goes on serving scrapes. The parsing is hyper's; this checks the server
/// around it (the watchdog, the handler's routing, the cap's bookkeeping).
#[test]
fn arbitrary_requests_are_answered_or_closed_and_scrapes_go_on() {
    use proptest::prelude::*;
    use proptest::test_runner::TestRunner;
    let (_m, server) = served();
    let addr = server.addr();
    let starts = prop::sample::select(vec![
        "",
        "GET /metrics HTTP/1.1\r\n",
        "GET /metrics?x=1 HTTP/1.0\r\n",
        "POST /metrics HTTP/1.1\r\nContent-Length: 5\r\n",
        "GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n",
        "DELETE /x HTTP/1.1\r\nHost: ",
        "GET /metrics HTTP/9.9\r\n",
    ]);
    let junk = prop::collection::vec(any::<u8>(), 0..600);
    let ends = prop::sample::select(vec!["", "\r\n", "\r\n\r\n", "\r\n\r\nabcde"]);
    // 64 cases in `cargo test`; ISOLANE_FUZZ_CASES and ISOLANE_FUZZ_SEED as for every target.
    let mut runner = TestRunner::new(isolane_core::fuzz::config(64));
    runner
        .run(&(starts, junk, ends), |(start, junk, end)| {
            let mut s = TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(Limits::METRICS.request_deadline * 4))
                .unwrap();
            let mut request = start.as_bytes().to_vec();
            request.extend_from_slice(&junk);
            request.extend_from_slice(end.as_bytes());
            // The server may have answered and closed before all of it is written.
            let _ = s.write_all(&request);
            let _ = s.shutdown(Shutdown::Write);
            let mut answer = Vec::new();
            let t = Instant::now();
            match s.read_to_end(&mut answer) {
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::ConnectionReset => {}
                Err(e) => panic!("no answer nor close after {:?}: {e}", t.elapsed()),
            }
            prop_assert!(
                answer.is_empty()
                    || answer.starts_with(b"HTTP/1.1 ")
                    || answer.starts_with(b"HTTP/1.0 "),
                "{}",
                String::from_utf8_lossy(&answer)
            );
            Ok(())
        })
        .unwrap();
    assert_quick_scrape(addr, "after the arbitrary requests");
}

/// Silent connections filling the cap held every place for the whole request deadline
/// (`isolane serve`'s 60 s), so that many sockets that never spoke shut every client out.
/// Now each is closed at the first-byte timeout, and a client gets in well before the
/// request deadline.
#[test]
fn silent_connections_at_the_cap_are_closed_at_the_first_byte_timeout() {
    let m = Arc::new(RunMetrics::new());
    m.begin_run("run", "s.toml", &[info("a")]);
    let limits = Limits {
        max_connections: 8,
        request_deadline: Duration::from_secs(60),
        first_byte_timeout: Duration::from_secs(1),
        ..Limits::METRICS
    };
    let server = server::serve_with("127.0.0.1:0", m, limits).unwrap();
    let addr = server.addr();
    let start = Instant::now();
    let silent: Vec<TcpStream> = (0..8).map(|_| TcpStream::connect(addr).unwrap()).collect();
    for s in &silent {
        s.set_nonblocking(true).unwrap();
    }
    let mut open = silent.len();
    while open > 0 && start.elapsed() < Duration::from_secs(30) {
        thread::sleep(Duration::from_millis(50));
        open = silent.iter().filter(|s| !closed(s)).count();
    }
    let took = start.elapsed();
    assert_eq!(
        open, 0,
        "{open} silent connections still open after {took:?}"
    );
    assert!(
        took >= limits.first_byte_timeout,
        "closed after {took:?}, before the first-byte timeout"
    );
    assert_quick_scrape(addr, "after the silent connections were closed");
}
