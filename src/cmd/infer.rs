//! `isolane infer`: one model on one input, top-5 classes and the raw output, so anyone can
//! compare isolane with their framework exactly (`--input x.npy --save-output y.npy`).

use std::path::PathBuf;

use clap::Args;
use isolane_executors::infer::{self, InferRequest};

#[derive(Args)]
#[command(
    about = "Run one model on an image, a .npy tensor or random data; print the top-5 classes",
    long_about = "Runs a model once on one input and prints the output shape and, for \
                  classifiers, the top-5 classes with softmax probabilities. MODEL is a built-in \
                  name (see `isolane models`), a path to an .onnx file or a saved plan \
                  (.isoplan, `isolane build`). Images are decoded \
                  (PNG, JPEG), resized (shorter side 256) and centre-cropped to 224 and \
                  normalised with the ImageNet mean and std, as torchvision's classification \
                  transform does (for other input sizes S: resize to S·256/224, crop S). \
                  `--save-output` writes the raw output tensor as .npy."
)]
pub struct InferArgs {
    /// A built-in model name, a path to an .onnx file, or a saved plan (.isoplan).
    #[arg(long, value_name = "MODEL")]
    model: String,
    /// A safetensors state dict (torchvision/Ultralytics names) for a built-in model; without
    /// it the built-in uses seeded synthetic weights.
    #[arg(long, value_name = "FILE")]
    weights: Option<PathBuf>,
    /// Seed of a built-in model's synthetic weights (when no --weights is given).
    #[arg(long, default_value_t = 0, value_name = "SEED")]
    weights_seed: u64,
    /// The backend that runs the model.
    #[arg(long, default_value = "cpu", value_name = "BACKEND", value_parser = ["cpu", "cuda"])]
    backend: String,
    /// Numeric precision (the CPU backend runs fp32 only). int8 / fp8: the model quantized
    /// from --calibration first, then run at fp16 on cuda (its products on the int8 / fp8
    /// tensor cores), fp32 on the CPU.
    #[arg(long, default_value = "fp32", value_parser = ["fp32", "tf32", "fp16", "bf16", "int8", "fp8"])]
    precision: String,
    /// Calibration folder (.npy files or images of the model's input) for --precision int8 / fp8.
    #[arg(long, value_name = "DIR")]
    calibration: Option<PathBuf>,
    /// How --calibration sets each activation's scale (default percentile; entropy is int8 only).
    #[arg(long, value_name = "METHOD", value_parser = ["percentile", "entropy", "minmax"])]
    calibration_method: Option<String>,
    /// What --calibration does with a residual block's skip: quantized (the default; on cuda
    /// it stays in bytes, half the memory traffic of a block's output) or float (added in
    /// floats: a little closer to the float model).
    #[arg(long, value_name = "SKIPS", value_parser = ["quantized", "float"])]
    calibration_skips: Option<String>,
    /// GPU index (backend cuda).
    #[arg(long, default_value_t = 0)]
    gpu: u32,
    /// CPU threads (0 = one per core).
    #[arg(long, default_value_t = 0, value_name = "N")]
    threads: usize,
    #[command(flatten)]
    source: Source,
    /// Seed of `--random`'s input.
    #[arg(long, default_value_t = 0, value_name = "SEED")]
    seed: u64,
    /// Write the raw output tensor (f32, C order) to this .npy file.
    #[arg(long, value_name = "FILE")]
    save_output: Option<PathBuf>,
    /// Batch size (the image or per-image tensor is repeated). An input .npy with a batch
    /// dimension sets the batch itself.
    #[arg(long, value_name = "B", value_parser = super::help::at_least_one_usize)]
    batch: Option<usize>,
    /// After the first run, run N more times and print the median and p99 latency.
    #[arg(long, default_value_t = 0, value_name = "N")]
    repeat: usize,
    /// Time every step of one more run and print the slowest ones (kernel choice per node).
    #[arg(long)]
    profile: bool,
    /// Skip the plan check of an imported (.onnx) model on cuda: its compiled plan is
    /// otherwise compared once with the CPU reference before it runs (docs/cuda.md).
    #[arg(long)]
    no_plan_check: bool,
    /// Class labels of --input's items (.npy of integers, one per item): print the top-1
    /// accuracy and the top-1 agreement with the model's fp32 answers on the CPU backend.
    #[arg(long, value_name = "FILE.npy")]
    labels: Option<PathBuf>,
}

#[derive(Args)]
#[group(required = true, multiple = false)]
struct Source {
    /// An image file (PNG or JPEG).
    #[arg(long, value_name = "FILE")]
    image: Option<PathBuf>,
    /// Seeded standard-normal random input.
    #[arg(long)]
    random: bool,
    /// A .npy tensor (f32): the whole input `[B, ...]` or one sample (without the batch dim).
    #[arg(long, value_name = "FILE.npy")]
    input: Option<PathBuf>,
}

pub fn run(args: InferArgs) -> anyhow::Result<u8> {
    isolane_core::flag_values::check_threads(args.threads).map_err(super::user)?;
    let source = match (args.source.image, args.source.input) {
        (Some(p), _) => infer::Source::Image(p),
        (None, Some(p)) => infer::Source::Npy(p),
        (None, None) => infer::Source::Random,
    };
    let request = InferRequest {
        model: args.model,
        weights: args.weights,
        weights_seed: args.weights_seed,
        backend: args.backend,
        precision: args.precision,
        calibration: args.calibration,
        calibration_method: args.calibration_method,
        calibration_skips: args.calibration_skips,
        gpu: args.gpu,
        threads: args.threads,
        source,
        seed: args.seed,
        batch: args.batch,
        repeat: args.repeat,
        profile: args.profile,
        plan_check: !args.no_plan_check,
        labels: args.labels,
    };
    // Checked before the model runs, so that a clash costs nothing.
    if let Some(p) = &args.save_output {
        // A built-in model's name (no extension) is no file, whatever the folder holds.
        let model = Some(std::path::Path::new(&request.model)).filter(|m| m.extension().is_some());
        let mut inputs: Vec<_> = model.map(|m| ("--model", m)).into_iter().collect();
        inputs.extend(request.weights.as_deref().map(|w| ("--weights", w)));
        inputs.extend(request.labels.as_deref().map(|l| ("--labels", l)));
        if let infer::Source::Image(f) | infer::Source::Npy(f) = &request.source {
            inputs.push(("the input", f));
        }
        let clash = isolane_core::files::refuse_input_as_output("--save-output", p, &inputs);
        clash.map_err(|e| blame!(e))?;
        isolane_core::files::check_output(p).map_err(|e| blame!(e))?;
    }
    let out = infer::infer(&request, &mut |line| println!("{line}")).map_err(|e| blame!(e))?;
    if let Some(p) = &args.save_output {
        let npy = isolane_engine::io::npy::encode_npy(&out.shape, &out.data);
        super::write_output(p, &npy)?;
        println!("wrote    {} ({:?})", p.display(), out.shape);
    }
    Ok(0)
}
