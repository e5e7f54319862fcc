//! What the front ends add to a request, on the CPU (issue 32's "Measure": at batch 1 over
//! loopback with binary data, ≤ 50 µs added at p50 for gRPC, throughput ≥ 90 % of in-process).
//!
//! One server, two models: `frame`, shaped as mobilenet_v2 (input [1, 3, 224, 224] FP32: a
//! 602,112-byte body; output [1, 1000]) whose job spins for `--service-us`, and `tiny`, a
//! `spin:` model of one value (4 bytes each way). Each is measured in-process
//! ([`Server::infer`], the request built before the clock starts), over plain TCP (`loopback`:
//! the request's tensor bytes to an echo task on the front ends' runtime and an answer of the
//! output's size back, no model: what the socket alone costs), over gRPC (a tonic client, raw
//! contents, as tritonclient sends them) and over HTTP (binary tensor data on a kept-alive
//! connection): p50 and p90 at concurrency 1, the front ends' CPU time and the process's minor
//! page faults per request, and requests per second (with p50 and p99) at each concurrency of
//! `--concurrency` (that many clients at once, each on its own connection, all on the client's
//! one thread), the best against in-process's best. A second table
//! splits each front end's mean request into the server's own stages (the statistics
//! extension's `isolane_stages`: receive, decode, queue, input, infer, output, wake, encode)
//! and what the client waited beyond them (`outside`: the socket both ways and the client).
//! The front ends run on a 2-worker runtime as `isolane serve`'s do (`--io-threads N`; 0: one
//! current-thread runtime); the client on a thread of its own.
//!
//!   cargo run --release -p isolane-serve --example serve_overhead -- [--service-us 375]
//!       [--requests 2000] [--models frame,tiny] [--paths grpc,http] [--io-threads 2]
//!       [--concurrency 1,2,4] [--spin-us 200] [--answer-spin-us auto|N]
//!
//! `--spin-us` is the scenario's `[timing] spin_us` (the model thread's poll of its queue, and
//! the front ends' poll for an answer); `--answer-spin-us` sets the front ends' poll apart
//! (`Server::set_answer_spin`; `auto`: the server's default, none below 8 cores).
//!
//! On a machine with few cores the model thread's spin and the client compete with the front
//! ends for them: compare runs on one machine, not figures across machines.

use std::sync::Arc;
use std::time::{Duration, Instant};

use isolane_core::spec::{DeviceSpec, Scenario, WorkloadSpec};
use isolane_protocol::grpc::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use isolane_protocol::grpc::inference::ModelInferRequest;
use isolane_protocol::grpc::{decode_infer_response, encode_infer_request};
use isolane_protocol::{encode_request, DataType, Limits, OutputChoice, Parameters, Tensor};
use isolane_runtime::clock;
use isolane_runtime::coordinator::RunPlan;
use isolane_runtime::exec::{EngineExecutors, ExecError, Executor, TensorInfo};
use isolane_serve::{InferRequest, ServeOptions, Server};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// A model shaped as mobilenet_v2 whose job spins for its service time.
struct Frame {
    service_ns: i64,
    input: Vec<f32>,
    output: Vec<f32>,
}

const FRAME_IN: [usize; 4] = [1, 3, 224, 224];
const FRAME_OUT: [usize; 2] = [1, 1000];

impl Executor for Frame {
    fn run_job(&mut self) -> Result<(), ExecError> {
        clock::spin_until_ns(clock::now_ns() + self.service_ns);
        // Something of the input reaches the output, as a model's would.
        self.output[0] = self.input[0];
        Ok(())
    }

    fn inputs(&self) -> Vec<TensorInfo> {
        vec![TensorInfo {
            name: "input".into(),
            shape: FRAME_IN.to_vec(),
        }]
    }

    fn outputs(&self) -> Vec<TensorInfo> {
        vec![TensorInfo {
            name: "output".into(),
            shape: FRAME_OUT.to_vec(),
        }]
    }

    fn input_mut(&mut self, i: usize) -> Option<&mut [f32]> {
        (i == 0).then_some(self.input.as_mut_slice())
    }

    fn output(&self, i: usize) -> Option<&[f32]> {
        (i == 0).then_some(self.output.as_slice())
    }
}

struct FrameEngine {
    service_ns: i64,
}

impl EngineExecutors for FrameEngine {
    fn check(&self, _: &DeviceSpec, _: &WorkloadSpec) -> Result<(), ExecError> {
        Ok(())
    }

    fn build(
        &self,
        _: &DeviceSpec,
        _: &WorkloadSpec,
        _: u64,
        _: usize,
        _: Option<isolane_runtime::partition::Partition>,
    ) -> Result<Box<dyn Executor>, ExecError> {
        Ok(Box::new(Frame {
            service_ns: self.service_ns,
            input: vec![0.0; FRAME_IN.iter().product()],
            output: vec![0.0; FRAME_OUT.iter().product()],
        }))
    }
}

struct Args {
    service_us: u64,
    requests: usize,
    models: Vec<String>,
    /// Front ends measured besides the in-process baseline (always measured first).
    paths: Vec<Path>,
    /// The front ends' runtime: its worker threads (`isolane serve`'s: 2), or 0 for one
    /// current-thread runtime on a thread of its own.
    io_threads: usize,
    /// Clients at once in the throughput rows.
    concurrency: Vec<usize>,
    /// The scenario's `[timing] spin_us`.
    spin_us: u64,
    /// The front ends' answer spin (µs; `None`: the server's default).
    answer_spin_us: Option<u64>,
}

fn args() -> Args {
    let mut a = Args {
        service_us: 375,
        requests: 2000,
        models: vec!["frame".into(), "tiny".into()],
        paths: vec![Path::Grpc, Path::Http],
        io_threads: 2,
        concurrency: vec![1, 2, 4],
        spin_us: 200,
        answer_spin_us: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--service-us" => a.service_us = value.parse().expect("--service-us: µs"),
            "--requests" => a.requests = value.parse().expect("--requests: a count"),
            "--io-threads" => a.io_threads = value.parse().expect("--io-threads: a count"),
            "--models" => a.models = value.split(',').map(str::to_owned).collect(),
            "--concurrency" => {
                a.concurrency = value
                    .split(',')
                    .map(|c| c.parse().expect("--concurrency: counts, comma-separated"))
                    .collect();
                assert!(
                    a.concurrency.iter().all(|&c| c >= 1),
                    "--concurrency: counts of 1 or more"
                );
            }
            "--spin-us" => a.spin_us = value.parse().expect("--spin-us: µs"),
            "--answer-spin-us" => {
                a.answer_spin_us = match value.as_str() {
                    "auto" => None,
                    v => Some(v.parse().expect("--answer-spin-us: auto or µs")),
                }
            }
            "--paths" => {
                a.paths = value
                    .split(',')
                    .map(|p| match p {
                        "grpc" => Path::Grpc,
                        "http" => Path::Http,
                        _ => panic!("--paths: grpc and/or http, not {p}"),
                    })
                    .collect()
            }
            _ => panic!(
                "unknown flag {flag}; flags: --service-us, --requests, --models, --paths, \
                 --io-threads, --concurrency, --spin-us, --answer-spin-us"
            ),
        }
    }
    a
}

fn scenario(service_us: u64, spin_us: u64) -> String {
    format!(
        r#"
[timing]
spin_us = {spin_us}

[[workload]]
name = "frame"
model = "frame"
batch = 1
rate_hz = 10
duration_s = 1
warmup_jobs = 20

[[workload]]
name = "tiny"
model = "spin:{service_us}us"
batch = 1
rate_hz = 10
duration_s = 1
warmup_jobs = 20
"#
    )
}

/// The input a client sends to `model`: seeded values, FP32.
fn input(model: &str) -> Tensor {
    let (name, shape): (&str, Vec<u64>) = match model {
        "frame" => ("input", FRAME_IN.iter().map(|&d| d as u64).collect()),
        _ => ("input", vec![1, 1]),
    };
    let n: u64 = shape.iter().product();
    let data: Vec<u8> = (0..n)
        .flat_map(|i| ((i % 251) as f32 / 251.0).to_le_bytes())
        .collect();
    Tensor::new(name, DataType::Fp32, shape, data).unwrap()
}

#[derive(Clone, Copy, PartialEq)]
enum Path {
    InProcess,
    /// The request's bytes over plain TCP and an answer of the response's size back, to and
    /// from an echo task on the front ends' runtime: what the socket alone costs.
    Loopback,
    Grpc,
    Http,
}

impl Path {
    fn name(self) -> &'static str {
        match self {
            Path::InProcess => "in-process",
            Path::Loopback => "loopback",
            Path::Grpc => "gRPC",
            Path::Http => "HTTP",
        }
    }

    /// The statistics extension's name of its front end.
    fn protocol(self) -> Option<&'static str> {
        match self {
            Path::Grpc => Some("grpc"),
            Path::Http => Some("http"),
            _ => None,
        }
    }
}

/// The bytes a loopback exchange carries each way for `model`: its request body's tensor and
/// its output.
fn loopback_sizes(model: &str) -> (usize, usize) {
    match model {
        "frame" => (
            FRAME_IN.iter().product::<usize>() * 4,
            FRAME_OUT.iter().product::<usize>() * 4,
        ),
        _ => (4, 4),
    }
}

/// Serves loopback exchanges: each is an 8-byte header (the request's and the answer's
/// length, u32 LE) and the request's bytes, answered with the answer's bytes. Buffers are
/// reused, as a server's should be.
async fn echo(listener: tokio::net::TcpListener) {
    while let Ok((mut io, _)) = listener.accept().await {
        io.set_nodelay(true).unwrap();
        tokio::spawn(async move {
            let (mut inb, mut outb) = (Vec::new(), Vec::new());
            let mut head = [0u8; 8];
            while io.read_exact(&mut head).await.is_ok() {
                let n = u32::from_le_bytes(head[..4].try_into().unwrap()) as usize;
                let m = u32::from_le_bytes(head[4..].try_into().unwrap()) as usize;
                inb.resize(n, 0);
                outb.resize(m, 7);
                if io.read_exact(&mut inb).await.is_err() || io.write_all(&outb).await.is_err() {
                    return;
                }
            }
        });
    }
}

/// One client: sends a request and waits for its answer, `n` times; each one's µs.
struct Client {
    path: Path,
    model: String,
    server: Server,
    grpc: Option<(
        GrpcInferenceServiceClient<tonic::transport::Channel>,
        ModelInferRequest,
    )>,
    http: Option<(BufReader<TcpStream>, Vec<u8>)>,
    /// The connection, the request (header and bytes) and the answer's buffer.
    loopback: Option<(TcpStream, Vec<u8>, Vec<u8>)>,
    tensor: Tensor,
}

impl Client {
    async fn new(
        path: Path,
        model: &str,
        server: &Server,
        (grpc_addr, http_addr, echo_addr): Addrs,
    ) -> Client {
        let tensor = input(model);
        let outputs = [OutputChoice {
            name: "output".into(),
            binary: Some(true),
        }];
        let grpc = match path {
            Path::Grpc => {
                let channel =
                    tonic::transport::Endpoint::from_shared(format!("http://{grpc_addr}"))
                        .unwrap()
                        .tcp_nodelay(true)
                        .connect()
                        .await
                        .unwrap();
                let client = GrpcInferenceServiceClient::new(channel)
                    .max_decoding_message_size(64 << 20)
                    .max_encoding_message_size(64 << 20);
                let req = encode_infer_request(
                    model,
                    None,
                    None,
                    &Parameters::new(),
                    std::slice::from_ref(&tensor),
                    Some(&outputs),
                )
                .unwrap();
                Some((client, req))
            }
            _ => None,
        };
        let http = match path {
            Path::Http => {
                let stream = TcpStream::connect(http_addr).await.unwrap();
                stream.set_nodelay(true).unwrap();
                let body =
                    encode_request(None, &Parameters::new(), &[(&tensor, true)], Some(&outputs))
                        .unwrap();
                let mut wire = format!(
                    "POST /v2/models/{model}/infer HTTP/1.1\r\nHost: {http_addr}\r\n\
                     Content-Type: application/octet-stream\r\n\
                     Inference-Header-Content-Length: {}\r\nContent-Length: {}\r\n\r\n",
                    body.header_len.unwrap(),
                    body.body.len()
                )
                .into_bytes();
                wire.extend_from_slice(&body.body);
                Some((BufReader::with_capacity(1 << 16, stream), wire))
            }
            _ => None,
        };
        let loopback = match path {
            Path::Loopback => {
                let stream = TcpStream::connect(echo_addr).await.unwrap();
                stream.set_nodelay(true).unwrap();
                let (n, m) = loopback_sizes(model);
                let mut wire = Vec::with_capacity(8 + n);
                wire.extend_from_slice(&(n as u32).to_le_bytes());
                wire.extend_from_slice(&(m as u32).to_le_bytes());
                wire.extend_from_slice(&tensor.data()[..n]);
                Some((stream, wire, vec![0; m]))
            }
            _ => None,
        };
        Client {
            path,
            model: model.into(),
            server: server.clone(),
            grpc,
            http,
            loopback,
            tensor,
        }
    }

    /// One request; its µs.
    async fn once(&mut self) -> f64 {
        match self.path {
            Path::InProcess => {
                let req = InferRequest {
                    inputs: vec![self.tensor.clone()],
                    outputs: None,
                    deadline: None,
                };
                let t = Instant::now();
                let r = self.server.infer(&self.model, req).await.unwrap();
                let us = t.elapsed().as_secs_f64() * 1e6;
                assert!(!r.outputs.is_empty());
                us
            }
            Path::Loopback => {
                let (stream, wire, answer) = self.loopback.as_mut().unwrap();
                let t = Instant::now();
                stream.write_all(wire).await.unwrap();
                stream.read_exact(answer).await.unwrap();
                t.elapsed().as_secs_f64() * 1e6
            }
            Path::Grpc => {
                let (client, req) = self.grpc.as_mut().unwrap();
                let req = req.clone();
                let t = Instant::now();
                let resp = client.model_infer(req).await.unwrap().into_inner();
                let back = decode_infer_response(resp, &Limits::default()).unwrap();
                let us = t.elapsed().as_secs_f64() * 1e6;
                assert_eq!(back.outputs.len(), 1);
                us
            }
            Path::Http => {
                let (stream, wire) = self.http.as_mut().unwrap();
                let t = Instant::now();
                stream.get_mut().write_all(wire).await.unwrap();
                let mut line = String::new();
                stream.read_line(&mut line).await.unwrap();
                assert!(line.starts_with("HTTP/1.1 200"), "{line}");
                let mut length = 0usize;
                loop {
                    line.clear();
                    stream.read_line(&mut line).await.unwrap();
                    if line == "\r\n" {
                        break;
                    }
                    if let Some((k, v)) = line.split_once(':') {
                        if k.eq_ignore_ascii_case("content-length") {
                            length = v.trim().parse().unwrap();
                        }
                    }
                }
                let mut body = vec![0; length];
                stream.read_exact(&mut body).await.unwrap();
                t.elapsed().as_secs_f64() * 1e6
            }
        }
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// CPU time (ns) the front ends' runtime threads have used so far: what a request costs them,
/// whatever else the machine runs meanwhile (`/proc/self/task/*/schedstat`).
fn front_end_cpu_ns() -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm"))
                .is_ok_and(|c| c.starts_with("isolane-serve-i"))
        })
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// Minor page faults of this process so far (`/proc/self/stat`, field 10): a fresh buffer per
/// request faults its pages in each time.
fn minor_faults() -> u64 {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            // The fields after the command's closing parenthesis, from field 3 on.
            let rest = s.rsplit_once(')')?.1.to_string();
            rest.split_whitespace().nth(7)?.parse().ok()
        })
        .unwrap_or(0)
}

/// The statistics extension's per-stage totals of `model` through `protocol`: (stage, count,
/// ns), in the server's order.
fn stage_totals(server: &Server, model: &str, protocol: &str) -> Vec<(String, u64, u64)> {
    server
        .statistics(Some(model))
        .and_then(|s| s.into_iter().next())
        .map(|s| {
            s.isolane_stages
                .iter()
                .filter(|t| t.protocol == protocol)
                .map(|t| (t.stage.to_string(), t.count, t.ns))
                .collect()
        })
        .unwrap_or_default()
}

struct Figures {
    p10: f64,
    p50: f64,
    p90: f64,
    /// The mean at concurrency 1 (the stages are means too).
    mean: f64,
    rps1: f64,
    /// Requests per second and latencies with that many clients at once.
    levels: Vec<Level>,
    /// The front ends' CPU time per request at concurrency 1.
    cpu_us: f64,
    /// Minor page faults per request at concurrency 1 (the whole process: client included).
    faults: f64,
    /// Mean µs per stage at concurrency 1, as the server measured them.
    stages: Vec<(String, f64)>,
}

type Addrs = (
    std::net::SocketAddr,
    std::net::SocketAddr,
    std::net::SocketAddr,
);

/// Throughput with `clients` clients at once.
struct Level {
    clients: usize,
    rps: f64,
    p50: f64,
    p99: f64,
}

/// `n` requests from `clients` clients at once, each on its own connection, all on this
/// thread (a request's encoding and the next one's sending overlap the others' waits, as the
/// server's receive and decode should overlap a running job).
async fn at_once(
    path: Path,
    model: &str,
    server: &Server,
    addrs: Addrs,
    n: usize,
    clients: usize,
) -> Level {
    let mut ready = Vec::with_capacity(clients);
    for _ in 0..clients {
        let mut c = Client::new(path, model, server, addrs).await;
        for _ in 0..10 {
            c.once().await;
        }
        ready.push(c);
    }
    let each = (n / clients).max(1);
    let began = Instant::now();
    let tasks: Vec<_> = ready
        .into_iter()
        .map(|mut c| {
            tokio::spawn(async move {
                let mut times = Vec::with_capacity(each);
                for _ in 0..each {
                    times.push(c.once().await);
                }
                times
            })
        })
        .collect();
    let mut times = Vec::with_capacity(each * clients);
    for t in tasks {
        times.extend(t.await.expect("a client task"));
    }
    let rps = times.len() as f64 / began.elapsed().as_secs_f64();
    times.sort_by(f64::total_cmp);
    Level {
        clients,
        rps,
        p50: percentile(&times, 0.5),
        p99: percentile(&times, 0.99),
    }
}

impl Figures {
    /// The level of the most requests per second.
    fn best(&self) -> Option<&Level> {
        self.levels.iter().max_by(|a, b| a.rps.total_cmp(&b.rps))
    }
}

async fn measure(
    path: Path,
    model: &str,
    server: &Server,
    addrs: Addrs,
    n: usize,
    concurrency: &[usize],
) -> Figures {
    let mut c = Client::new(path, model, server, addrs).await;
    for _ in 0..n / 10 {
        c.once().await;
    }
    let protocol = path.protocol().unwrap_or("");
    let before = stage_totals(server, model, protocol);
    let began = Instant::now();
    let cpu = front_end_cpu_ns();
    let faults = minor_faults();
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        times.push(c.once().await);
    }
    let rps1 = n as f64 / began.elapsed().as_secs_f64();
    let cpu_us = (front_end_cpu_ns() - cpu) as f64 / n as f64 / 1e3;
    let faults = (minor_faults() - faults) as f64 / n as f64;
    let stages = stage_totals(server, model, protocol)
        .into_iter()
        .map(|(stage, count, ns)| {
            let (c0, ns0) = before
                .iter()
                .find(|b| b.0 == stage)
                .map_or((0, 0), |b| (b.1, b.2));
            let us = (ns - ns0) as f64 / (count - c0).max(1) as f64 / 1e3;
            (stage, us)
        })
        .collect();
    let mean = times.iter().sum::<f64>() / n as f64;
    times.sort_by(f64::total_cmp);
    let mut levels = Vec::new();
    for &clients in concurrency {
        levels.push(at_once(path, model, server, addrs, n, clients).await);
    }
    Figures {
        p10: percentile(&times, 0.1),
        cpu_us,
        p50: percentile(&times, 0.5),
        p90: percentile(&times, 0.9),
        mean,
        rps1,
        levels,
        faults,
        stages,
    }
}

fn main() {
    let a = args();
    let scenario = Scenario::from_toml_str(
        &scenario(a.service_us, a.spin_us),
        "overhead.toml",
        &["frame"],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let plan = RunPlan::from_scenario(&scenario);
    let words: Vec<_> = plan
        .workloads
        .iter()
        .map(|_| ("cpu".into(), None))
        .collect();
    let options = ServeOptions {
        engine: Arc::new(FrameEngine {
            service_ns: a.service_us as i64 * 1000,
        }),
        seed: 1,
        records: None,
        released: Vec::new(),
        programs_dir: None,
    };
    let server = Server::start(&plan, &words, &options).unwrap_or_else(|e| panic!("{e}"));
    if let Some(us) = a.answer_spin_us {
        server.set_answer_spin(Duration::from_micros(us));
    }
    let bind = || {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        l
    };
    let (http, grpc, echoes) = (bind(), bind(), bind());
    let addrs = (
        grpc.local_addr().unwrap(),
        http.local_addr().unwrap(),
        echoes.local_addr().unwrap(),
    );
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let until = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|d| *d).await;
    };
    let front_ends = {
        let (server, stopped) = (server.clone(), stopped.clone());
        async move {
            let listen = |l| tokio::net::TcpListener::from_std(l).unwrap();
            let (http, grpc, echoes) = (listen(http), listen(grpc), listen(echoes));
            tokio::spawn(echo(echoes));
            let (_, grpc) = tokio::join!(
                isolane_serve::http::serve_http(server.clone(), http, until(stopped.clone())),
                isolane_serve::grpc::serve_grpc(server, grpc, until(stopped)),
            );
            grpc.unwrap();
        }
    };
    let serving = if a.io_threads == 0 {
        std::thread::Builder::new()
            .name("isolane-serve-io".into())
            .spawn(move || {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap()
                    .block_on(front_ends)
            })
            .unwrap()
    } else {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(a.io_threads)
            .thread_name("isolane-serve-io")
            .enable_all()
            .build()
            .unwrap();
        std::thread::spawn(move || runtime.block_on(front_ends))
    };
    let client = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    println!(
        "service {} µs, {} requests per row, spin_us {}, answer spin {} (µs at concurrency 1, \
         `added` at p50, for loopback its whole p50; the front ends' CPU µs and the process's \
         minor page faults per request; req/s at concurrency 1)",
        a.service_us,
        a.requests,
        a.spin_us,
        a.answer_spin_us
            .map_or("auto".to_string(), |us| format!("{us} µs"))
    );
    println!(
        "{:<6} {:<10} {:>8} {:>8} {:>8} {:>8} {:>7} {:>7} {:>8}",
        "model", "path", "p10", "p50", "p90", "added", "cpu", "faults", "req/s 1"
    );
    let mut breakdown = Vec::new();
    let mut sweeps = Vec::new();
    for model in &a.models {
        let mut base: Option<Figures> = None;
        let paths = [Path::InProcess, Path::Loopback]
            .into_iter()
            .chain(a.paths.iter().copied());
        for path in paths {
            let f = client.block_on(measure(
                path,
                model,
                &server,
                addrs,
                a.requests,
                &a.concurrency,
            ));
            let added = match (&base, path) {
                (_, Path::Loopback) => f.p50,
                (Some(b), _) => f.p50 - b.p50,
                (None, _) => 0.0,
            };
            println!(
                "{:<6} {:<10} {:>8.1} {:>8.1} {:>8.1} {:>+8.1} {:>7.1} {:>7.1} {:>8.0}",
                model,
                path.name(),
                f.p10,
                f.p50,
                f.p90,
                added,
                f.cpu_us,
                f.faults,
                f.rps1
            );
            if path != Path::Loopback {
                let in_best = base
                    .as_ref()
                    .and_then(|b| b.best())
                    .or_else(|| f.best())
                    .map_or(f64::NAN, |l| l.rps);
                for l in &f.levels {
                    sweeps.push((model.clone(), path, l.clients, l.rps, l.p50, l.p99, in_best));
                }
            }
            if !f.stages.is_empty() {
                breakdown.push((model.clone(), path, f.mean, f.stages.clone()));
            }
            if base.is_none() {
                base = Some(f);
            }
        }
    }
    // What the server sustains with requests waiting behind each other: each level's
    // throughput against in-process's best level.
    println!();
    println!("throughput with N clients at once (µs; `% of in`: against in-process's best level)");
    println!(
        "{:<6} {:<10} {:>3} {:>8} {:>8} {:>8} {:>7}",
        "model", "path", "N", "req/s", "p50", "p99", "% of in"
    );
    for (model, path, n, rps, p50, p99, in_best) in &sweeps {
        println!(
            "{:<6} {:<10} {:>3} {:>8.0} {:>8.1} {:>8.1} {:>6.0}%",
            model,
            path.name(),
            n,
            rps,
            p50,
            p99,
            100.0 * rps / in_best
        );
    }
    // Where a request's time went: the server's stages (means at concurrency 1), and what the
    // client waited beyond them (the socket both ways, the client's own encoding and wake-ups).
    if let Some((_, _, _, first)) = breakdown.first() {
        println!();
        println!("mean µs per stage at concurrency 1 (the server's own stamps; `outside`: the client's mean minus the server's span)");
        let mut head = format!("{:<6} {:<6}", "model", "path");
        for (stage, _) in first {
            head += &format!(" {stage:>8}");
        }
        head += &format!(" {:>8} {:>8} {:>8}", "server", "client", "outside");
        println!("{head}");
        for (model, path, mean, stages) in &breakdown {
            let mut line = format!("{:<6} {:<6}", model, path.name());
            for (_, us) in stages {
                line += &format!(" {us:>8.1}");
            }
            let server: f64 = stages.iter().map(|(_, us)| us).sum();
            line += &format!(" {server:>8.1} {mean:>8.1} {:>8.1}", mean - server);
            println!("{line}");
        }
    }
    server.drain(Duration::from_secs(5));
    let _ = stop.send(true);
    let _ = serving.join();
}
