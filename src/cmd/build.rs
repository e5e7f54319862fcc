//! `isolane build`: a model compiled once and saved as a plan (`.isoplan`) that `run`, `serve`,
//! `infer` and `bench` load without compiling and timing it again (flags → library call:
//! `isolane_executors::saved_plan`).

use std::path::PathBuf;

use clap::Args;
use isolane_executors::saved_plan::{self, BuildRequest};

#[derive(Args)]
#[command(
    about = "Compile a model once for a batch, precision and device and save the plan (.isoplan)",
    long_about = "Compiles MODEL (a built-in name or an .onnx file) for one batch size, \
                  precision and device and writes the compiled plan to FILE (.isoplan): the \
                  graph after the engine's passes, and on cuda every kernel and library \
                  algorithm the build chose by timing. A scenario's `model`, `isolane serve` \
                  and `isolane infer` accept the file where a model path is accepted and load it \
                  without timing anything. The file's key (device, precision, batch, engine \
                  revision; on cuda the GPU, compute capability, driver, cuDNN, cuBLASLt and \
                  NVRTC versions and the plan format) must match where it is loaded, or the \
                  load is refused naming the field and both values (exit code 2). It loads in \
                  any partition of that GPU; on cuda a load whose outputs differ in any bit \
                  from the build's names the first node that computed other bits."
)]
pub struct BuildArgs {
    /// A built-in model name (see `isolane models`) or a path to an .onnx file.
    #[arg(value_name = "MODEL")]
    model: String,
    /// Numeric precision of the plan (the CPU backend: fp32 only).
    #[arg(long, default_value = "fp32", value_parser = ["fp32", "tf32", "fp16", "bf16"])]
    precision: String,
    /// The batch size the plan is compiled for.
    #[arg(long, default_value_t = 1, value_name = "B", value_parser = super::help::at_least_one_usize)]
    batch: usize,
    /// The backend the plan is for.
    #[arg(long, default_value = "cuda", value_name = "DEVICE", value_parser = ["cuda", "cpu"])]
    device: String,
    /// GPU index (device cuda).
    #[arg(long, default_value_t = 0)]
    gpu: u32,
    /// A safetensors state dict for a built-in model; without it the built-in uses seeded
    /// synthetic weights.
    #[arg(long, value_name = "FILE")]
    weights: Option<PathBuf>,
    /// Seed of a built-in model's synthetic weights (when no --weights is given).
    #[arg(long, default_value_t = 0, value_name = "SEED")]
    weights_seed: u64,
    /// The plan file to write (its name ends in .isoplan).
    #[arg(short = 'o', long = "out", value_name = "FILE")]
    out: PathBuf,
}

pub fn run(args: BuildArgs) -> anyhow::Result<u8> {
    let req = BuildRequest {
        model: args.model,
        weights: args.weights,
        weights_seed: args.weights_seed,
        precision: args.precision,
        batch: args.batch,
        device: args.device,
        gpu: args.gpu,
        out: args.out,
    };
    saved_plan::build(&req, &mut |line| println!("{line}")).map_err(|e| blame!(e))?;
    Ok(0)
}
