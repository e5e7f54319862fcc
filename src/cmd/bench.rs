//! `isolane bench`: latency and throughput of one model on one backend, measured job by job
//! the way a workload runs it (input copy in, forward, output copy out, wait).

use std::time::Instant;

use anyhow::Context as _;
use clap::Args;
use isolane_engine::{build_model, model_info, CompiledModel, CpuBackend, Precision, Weights};

use super::user;

#[derive(Args, Debug)]
#[command(
    about = "Measure a model's latency (median, p99), throughput and device memory",
    long_about = "Compiles a built-in model once per (batch, precision) on the chosen backend with \
                  seeded synthetic weights and a seeded random input, runs warm-up jobs, then times \
                  --replays jobs one by one. A job is what a workload runs: copy the input in, run \
                  the forward (one CUDA graph replay on cuda), copy the output out, wait. Comma \
                  lists in --model, --batch and --precision measure every combination."
)]
pub struct BenchArgs {
    /// Built-in model(s), comma-separated (see `isolane models`).
    #[arg(long, value_delimiter = ',', required = true)]
    model: Vec<String>,
    /// Batch size(s), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    batch: Vec<usize>,
    /// Precision(s): fp32, tf32, fp16, bf16 (cpu: fp32 only). Default: fp16 on cuda, fp32
    /// on cpu.
    #[arg(long, value_delimiter = ',')]
    precision: Vec<String>,
    /// cuda or cpu.
    #[arg(long, default_value = "cuda")]
    backend: String,
    /// Timed jobs per configuration.
    #[arg(long, default_value_t = 200)]
    replays: usize,
    /// Untimed jobs first.
    #[arg(long, default_value_t = 20)]
    warmup: usize,
    /// CUDA device index.
    #[arg(long, default_value_t = 0)]
    gpu: u32,
    /// CPU threads (cpu backend; 0 = all cores).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Seed of the synthetic weights and the input.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print one JSON object per configuration instead of a table.
    #[arg(long)]
    json: bool,
}

/// One measured configuration.
#[derive(Debug, serde::Serialize)]
pub struct BenchResult {
    pub backend: String,
    pub model: String,
    pub batch: usize,
    pub precision: String,
    pub replays: usize,
    pub median_ms: f64,
    pub p99_ms: f64,
    pub mean_ms: f64,
    pub min_ms: f64,
    pub throughput_ips: f64,
    pub compile_ms: f64,
    pub weights_mib: Option<f64>,
    pub arena_mib: f64,
    pub workspace_mib: Option<f64>,
    pub device_mib: Option<f64>,
    /// cuda: device time of the forward alone (no copies), median of 50 event-timed replays.
    pub forward_ms: Option<f64>,
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn time_jobs(
    m: &mut dyn CompiledModel,
    warmup: usize,
    replays: usize,
) -> anyhow::Result<(Vec<f64>, f64)> {
    for _ in 0..warmup {
        m.run()?;
    }
    let mut t = Vec::with_capacity(replays);
    let start = Instant::now();
    for _ in 0..replays {
        let t0 = Instant::now();
        m.run()?;
        t.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    let wall = start.elapsed().as_secs_f64();
    t.sort_by(|a, b| a.total_cmp(b));
    Ok((t, wall))
}

pub fn run(args: BenchArgs) -> anyhow::Result<u8> {
    if args.replays == 0 {
        return Err(user("--replays must be at least 1"));
    }
    let mut precisions = Vec::new();
    let default = [if args.backend == "cpu" {
        "fp32"
    } else {
        "fp16"
    }
    .to_string()];
    let wanted: &[String] = if args.precision.is_empty() {
        &default
    } else {
        &args.precision
    };
    for p in wanted {
        precisions.push(p.parse::<Precision>().map_err(user)?);
    }
    for m in &args.model {
        if model_info(m).is_none() {
            return Err(user(format!(
                "--model: unknown model `{m}` (see `isolane models`)"
            )));
        }
    }
    if args.batch.contains(&0) {
        return Err(user("--batch must be at least 1"));
    }
    let cuda = match args.backend.as_str() {
        "cuda" => Some(isolane_cuda::CudaBackend::new(args.gpu).context("cuda backend")?),
        "cpu" => None,
        other => {
            return Err(user(format!(
                "--backend: `{other}` is not a backend (cuda, cpu)"
            )))
        }
    };
    if !args.json {
        println!(
            "{:<8} {:<15} {:>5} {:<5} {:>10} {:>10} {:>11} {:>10} {:>10} {:>9} {:>9}",
            "backend",
            "model",
            "batch",
            "prec",
            "median_ms",
            "p99_ms",
            "images/s",
            "weights_MiB",
            "arena_MiB",
            "ws_MiB",
            "dev_MiB"
        );
    }
    for name in &args.model {
        let graph = build_model(name, Weights::Synthetic { seed: args.seed })?;
        for &batch in &args.batch {
            for &p in &precisions {
                let t0 = Instant::now();
                let mib = |b: usize| b as f64 / (1u64 << 20) as f64;
                let mut forward_ms = None;
                let (mut model, mem): (Box<dyn CompiledModel>, Option<isolane_cuda::MemoryReport>) =
                    match &cuda {
                        Some(b) => {
                            // Built-in models only: covered by the GPU tests, so no plan check
                            // (it would add a CPU forward pass to every compile).
                            let options = isolane_cuda::CompileOptions {
                                plan_check: false,
                                ..Default::default()
                            };
                            let mut m = b
                                .compile_cuda_with(&graph, batch, p, &options)
                                .with_context(|| {
                                    format!("compiling {name} batch {batch} {p} for cuda")
                                })?;
                            let input = super::infer::random_normal(m.input_mut().len(), args.seed);
                            m.input_mut().copy_from_slice(&input);
                            m.run()?;
                            forward_ms = Some(m.device_ms(50)?);
                            let mem = m.memory();
                            (Box::new(m), Some(mem))
                        }
                        None => (
                            Box::new(
                                CpuBackend::new(args.threads)
                                    .compile_cpu(&graph, batch, p)
                                    .with_context(|| format!("compiling {name} for cpu"))?,
                            ),
                            None,
                        ),
                    };
                let compile_ms = t0.elapsed().as_secs_f64() * 1e3;
                let input = super::infer::random_normal(model.input_mut().len(), args.seed);
                model.input_mut().copy_from_slice(&input);
                let (t, wall) = time_jobs(model.as_mut(), args.warmup, args.replays)?;
                let r = BenchResult {
                    backend: args.backend.clone(),
                    model: name.clone(),
                    batch,
                    precision: p.to_string(),
                    replays: args.replays,
                    median_ms: percentile(&t, 0.5),
                    p99_ms: percentile(&t, 0.99),
                    mean_ms: t.iter().sum::<f64>() / t.len() as f64,
                    min_ms: t[0],
                    throughput_ips: (args.replays * batch) as f64 / wall,
                    compile_ms,
                    weights_mib: mem.map(|m| mib(m.weights_bytes)),
                    arena_mib: mib(model.arena_bytes()),
                    workspace_mib: mem.map(|m| mib(m.workspace_bytes)),
                    device_mib: mem.map(|m| mib(m.device_delta_bytes)),
                    forward_ms,
                };
                if args.json {
                    println!("{}", serde_json::to_string(&r)?);
                } else {
                    let o = |v: Option<f64>| v.map_or("-".to_string(), |x| format!("{x:.1}"));
                    println!(
                        "{:<8} {:<15} {:>5} {:<5} {:>10.3} {:>10.3} {:>11.0} {:>10} {:>10.1} {:>9} {:>9}",
                        r.backend, r.model, r.batch, r.precision, r.median_ms, r.p99_ms, r.throughput_ips,
                        o(r.weights_mib), r.arena_mib, o(r.workspace_mib), o(r.device_mib)
                    );
                }
            }
        }
    }
    Ok(0)
}
