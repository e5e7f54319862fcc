//! `isolane bench`: latency and throughput of one model on one backend, measured job by job
//! the way a workload runs it (input copy in, forward, output copy out, wait).

use clap::Args;
use isolane_executors::bench::{self, BenchError, BenchRequest};

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
    /// Built-in model(s), comma-separated (see `isolane models`), or saved plans (.isoplan,
    /// `isolane build`: loaded, not compiled).
    #[arg(long, value_delimiter = ',', required = true)]
    model: Vec<String>,
    /// Batch size(s), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1", value_parser = super::help::at_least_one_usize)]
    batch: Vec<usize>,
    /// Precision(s): fp32, tf32, fp16, bf16 (cpu: fp32 only), int8, fp8 (the model quantized
    /// from --calibration at each batch, then run at fp16 on cuda with its products on the
    /// tensor cores, fp32 on cpu). Default: fp16 on cuda, fp32 on cpu.
    #[arg(long, value_delimiter = ',')]
    precision: Vec<String>,
    /// Calibration folder (.npy files or images of the model's input) for int8 / fp8.
    #[arg(long, value_name = "DIR")]
    calibration: Option<std::path::PathBuf>,
    /// How --calibration sets each activation's scale (default percentile; entropy is int8 only).
    #[arg(long, value_name = "METHOD", value_parser = ["percentile", "entropy", "minmax"])]
    calibration_method: Option<String>,
    /// What --calibration does with a residual block's skip: quantized (the default; on cuda
    /// it stays in bytes, half the memory traffic of a block's output) or float (added in
    /// floats: a little closer to the float model).
    #[arg(long, value_name = "SKIPS", value_parser = ["quantized", "float"])]
    calibration_skips: Option<String>,
    /// cuda or cpu. Default: cuda where a CUDA GPU can run it, else cpu with a note saying why
    /// (as `isolane run` picks its quickstart); `--backend cuda` insists on the GPU.
    #[arg(long, value_parser = ["cuda", "cpu"])]
    backend: Option<String>,
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
    /// Every column of the table (default: the ones that fit 80 columns).
    #[arg(long)]
    wide: bool,
}

pub fn run(args: BenchArgs) -> anyhow::Result<u8> {
    if args.replays == 0 {
        return Err(user("--replays must be at least 1"));
    }
    isolane_core::flag_values::check_threads(args.threads).map_err(super::user)?;
    let request = BenchRequest {
        models: args.model,
        batches: args.batch,
        precisions: args.precision,
        calibration: args.calibration,
        calibration_method: args.calibration_method,
        calibration_skips: args.calibration_skips,
        backend: args.backend,
        replays: args.replays,
        warmup: args.warmup,
        gpu: args.gpu,
        threads: args.threads,
        seed: args.seed,
    };
    let json = args.json;
    let results = bench::bench(
        &request,
        isolane_executors::machine::gpu_unusable_reason,
        &mut |note| eprintln!("{note}"),
        &mut |r| {
            if json {
                let line =
                    serde_json::to_string(r).map_err(|e| BenchError::Output(e.to_string()))?;
                println!("{line}");
            } else {
                eprintln!(
                    "measured {} batch {} {}: median {:.3} ms",
                    r.model, r.batch, r.precision, r.median_ms
                );
            }
            Ok(())
        },
    )
    .map_err(|e| blame!(e))?;
    if !json {
        println!("{}", bench::results_table(&results, args.wide));
    }
    Ok(0)
}
