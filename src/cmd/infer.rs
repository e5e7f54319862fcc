//! `isolane infer`: one model on one input, top-5 classes and the raw output, so anyone can
//! compare isolane with their framework exactly (`--input x.npy --save-output y.npy`).

use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::Args;
use isolane_engine::backend::{CompiledModel, Precision};
use isolane_engine::io::{self, image};
use isolane_engine::ir::ValueKind;
use isolane_engine::{build_model, CpuBackend, EngineError, Graph, Weights};

use super::user;

#[derive(Args)]
#[command(
    about = "Run one model on an image, a .npy tensor or random data; print the top-5 classes",
    long_about = "Runs a model once on one input and prints the output shape and, for \
                  classifiers, the top-5 classes with softmax probabilities. MODEL is a built-in \
                  name (see `isolane models`) or a path to an .onnx file. Images are decoded \
                  (PNG, JPEG), resized (shorter side 256) and centre-cropped to 224 and \
                  normalised with the ImageNet mean and std, as torchvision's classification \
                  transform does (for other input sizes S: resize to S·256/224, crop S). \
                  `--save-output` writes the raw output tensor as .npy."
)]
pub struct InferArgs {
    /// A built-in model name, or a path to an .onnx file.
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
    /// Numeric precision (the CPU backend runs fp32 only).
    #[arg(long, default_value = "fp32", value_parser = ["fp32", "tf32", "fp16", "bf16"])]
    precision: String,
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

/// The compiled model, on whichever backend was asked for.
enum Loaded {
    Cpu(isolane_engine::cpu::CpuModel),
    // Boxed: the CUDA model is the larger of the two by far.
    Cuda(Box<isolane_cuda::CudaModel>),
}

impl Loaded {
    fn model(&mut self) -> &mut dyn CompiledModel {
        match self {
            Loaded::Cpu(m) => m,
            Loaded::Cuda(m) => m.as_mut(),
        }
    }

    /// (step, ms) of one timed run, step by step.
    fn profile(&mut self) -> Result<Vec<(String, f64)>, EngineError> {
        match self {
            Loaded::Cpu(m) => Ok(m.profile()),
            Loaded::Cuda(m) => Ok(m
                .profile()?
                .into_iter()
                .map(|(node, kind, ms)| (format!("{node} ({kind})"), ms))
                .collect()),
        }
    }
}

pub fn run(args: InferArgs) -> anyhow::Result<u8> {
    let precision: Precision = args.precision.parse().map_err(user)?;
    if args.backend == "cpu" && precision != Precision::Fp32 {
        return Err(user(format!(
            "--precision {precision}: the CPU backend runs fp32 only (use --backend cuda)"
        )));
    }
    if args.batch == Some(0) {
        return Err(user("--batch must be at least 1"));
    }
    super::check_threads(args.threads)?;
    let (graph, described) = load_model(&args)?;
    let rank = input_rank(&graph)?;

    // The input tensor as given, before the batch is known.
    enum Given {
        Sample(Vec<usize>, Vec<f32>),
        Batch(Vec<usize>, Vec<f32>),
        Random,
        Image(PathBuf),
    }
    let given = if let Some(p) = &args.source.input {
        let t = io::read_npy(p).map_err(user)?;
        if t.shape.len() == rank {
            Given::Batch(t.shape, t.data)
        } else if t.shape.len() + 1 == rank {
            Given::Sample(t.shape, t.data)
        } else {
            return Err(user(format!(
                "{}: shape {:?} does not fit the model's rank-{rank} input",
                p.display(),
                t.shape
            )));
        }
    } else if let Some(p) = &args.source.image {
        Given::Image(p.clone())
    } else {
        Given::Random
    };
    let batch = match (&given, args.batch) {
        (Given::Batch(s, _), Some(b)) if s[0] != b => {
            return Err(user(format!(
                "--batch {b}, but {} holds a batch of {}",
                args.source
                    .input
                    .as_deref()
                    .unwrap_or(Path::new(""))
                    .display(),
                s[0]
            )))
        }
        (Given::Batch(s, _), _) => s[0],
        (_, b) => b.unwrap_or(1),
    };

    let target = if args.backend == "cuda" {
        isolane_executors::engine::Target::Cuda {
            gpu: args.gpu,
            precision,
        }
    } else {
        isolane_executors::engine::Target::Cpu
    };
    isolane_executors::engine::check_batch_fits(&graph, batch, target)
        .map_err(|reason| user(format!("--batch {batch}: {reason}")))?;

    let t0 = Instant::now();
    let (mut loaded, backend_line) = if args.backend == "cuda" {
        let backend =
            isolane_cuda::CudaBackend::new(args.gpu).map_err(|e| engine_error(e, &args.model))?;
        // Every model is checked, built-ins too (one inference: the check's CPU pass is what a
        // user of `infer` waits for anyway).
        let options = isolane_cuda::CompileOptions {
            plan_check: !args.no_plan_check,
            ..Default::default()
        };
        let m = backend
            .compile_cuda_with(&graph, batch, precision, &options)
            .map_err(|e| engine_error(e, &args.model))?;
        let line = match m.plan_check() {
            Some(r) => format!(
                "cuda (GPU {}), {precision}; {}",
                args.gpu,
                isolane_executors::engine::plan_check_line(&r)
            ),
            None => format!("cuda (GPU {}), {precision}", args.gpu),
        };
        (Loaded::Cuda(Box::new(m)), line)
    } else {
        let m = CpuBackend::new(args.threads)
            .compile_cpu(&graph, batch, Precision::Fp32)
            .map_err(|e| engine_error(e, &args.model))?;
        let line = format!("cpu, {} thread(s), fp32", m.threads());
        (Loaded::Cpu(m), line)
    };
    let compile_s = t0.elapsed().as_secs_f64();
    let model = loaded.model();
    let in_shape = model.input_shape().to_vec();
    if in_shape.first() != Some(&batch) {
        return Err(user(format!(
            "{} has a fixed batch of {}; use --batch {} (or re-export it with a dynamic batch axis)",
            args.model,
            in_shape.first().copied().unwrap_or(0),
            in_shape.first().copied().unwrap_or(0)
        )));
    }
    let sample_shape = in_shape[1..].to_vec();
    let per: usize = sample_shape.iter().product();

    let (data, from) = match given {
        Given::Batch(s, d) => {
            if s != in_shape {
                return Err(user(format!(
                    "{}: shape {s:?}, but the model's input is {in_shape:?}",
                    args.source
                        .input
                        .as_deref()
                        .unwrap_or(Path::new(""))
                        .display()
                )));
            }
            (
                d,
                format!(
                    "{}",
                    args.source
                        .input
                        .as_deref()
                        .unwrap_or(Path::new(""))
                        .display()
                ),
            )
        }
        Given::Sample(s, d) => {
            if s != sample_shape {
                return Err(user(format!(
                    "{}: shape {s:?}, but one sample of the model's input is {sample_shape:?}",
                    args.source
                        .input
                        .as_deref()
                        .unwrap_or(Path::new(""))
                        .display()
                )));
            }
            (
                repeat(&d, batch),
                format!(
                    "{} (repeated ×{batch})",
                    args.source
                        .input
                        .as_deref()
                        .unwrap_or(Path::new(""))
                        .display()
                ),
            )
        }
        Given::Image(p) => {
            let one = image_input(&p, &sample_shape)?;
            (repeat(&one, batch), format!("{}", p.display()))
        }
        Given::Random => (
            isolane_executors::seeded_input::random_normal(per * batch, args.seed),
            format!("random N(0,1), seed {}", args.seed),
        ),
    };
    check_finite(&data, &from)?;
    model.input_mut().copy_from_slice(&data);

    let t1 = Instant::now();
    model.run().map_err(|e| engine_error(e, &args.model))?;
    let first_ms = t1.elapsed().as_secs_f64() * 1e3;

    println!("model    {described}");
    println!("backend  {backend_line}; compiled for batch {batch} in {compile_s:.2} s");
    println!("input    {in_shape:?} from {from}");
    for i in 0..model.num_outputs() {
        println!("output   {:?}", model.output_shape_at(i));
    }
    println!("run      {first_ms:.2} ms (first run)");

    if args.repeat > 0 {
        let mut times = Vec::with_capacity(args.repeat);
        for _ in 0..args.repeat {
            let t = Instant::now();
            model.run().map_err(|e| engine_error(e, &args.model))?;
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
        times.sort_by(f64::total_cmp);
        let q =
            |p: f64| times[((p * (times.len() - 1) as f64).round() as usize).min(times.len() - 1)];
        let mean = times.iter().sum::<f64>() / times.len() as f64;
        println!(
            "latency  over {} runs: median {:.3} ms, p99 {:.3} ms, min {:.3} ms, mean {:.3} ms",
            times.len(),
            q(0.5),
            q(0.99),
            times[0],
            mean
        );
    }

    if args.profile {
        let mut steps = loaded.profile().map_err(|e| engine_error(e, &args.model))?;
        let total: f64 = steps.iter().map(|s| s.1).sum();
        steps.sort_by(|a, b| b.1.total_cmp(&a.1));
        println!(
            "profile  one run, {total:.2} ms in {} steps; the slowest:",
            steps.len()
        );
        for (name, ms) in steps.iter().take(15) {
            println!(
                "  {ms:8.3} ms  {:5.1}%  {name}",
                100.0 * ms / total.max(1e-9)
            );
        }
    }

    let model = loaded.model();
    let out_shape = model.output_shape().to_vec();
    print_top5(model.output(), &out_shape);

    if let Some(p) = &args.save_output {
        super::write_output(p, &io::npy::encode_npy(&out_shape, model.output()))?;
        println!("wrote    {} ({out_shape:?})", p.display());
    }
    Ok(0)
}

/// Reads a built-in or an ONNX file; returns the graph and a one-line description.
/// As in scenarios (isolane-core's ModelSource): a name ending in .onnx is a file, anything
/// else a built-in name.
fn is_onnx_path(model: &str) -> bool {
    Path::new(model)
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("onnx"))
}

fn load_model(args: &InferArgs) -> anyhow::Result<(Graph, String)> {
    let path = Path::new(&args.model);
    if is_onnx_path(&args.model) {
        if args.weights.is_some() {
            return Err(user(format!(
                "--weights applies to built-in models; {} carries its own weights",
                path.display()
            )));
        }
        // Every import failure concerns the file the user gave: exit code 2, file named.
        let g = isolane_engine::onnx::import_file(path).map_err(user)?;
        return Ok((g, format!("{} (ONNX)", path.display())));
    }
    let (weights, what) = match &args.weights {
        Some(p) => (
            Weights::Safetensors(p.clone()),
            format!("weights {}", p.display()),
        ),
        None => (
            Weights::Synthetic {
                seed: args.weights_seed,
            },
            format!("synthetic weights, seed {}", args.weights_seed),
        ),
    };
    let g = build_model(&args.model, weights).map_err(|e| engine_error(e, &args.model))?;
    Ok((g, format!("{} (built-in, {what})", args.model)))
}

/// Unknown models and bad weight files are the user's mistakes (exit 2); the rest is ours.
fn engine_error(e: EngineError, model: &str) -> anyhow::Error {
    match e {
        EngineError::UnknownModel { .. }
        | EngineError::Weights { .. }
        | EngineError::InvalidArgument(_) => user(e),
        other => anyhow::Error::new(other).context(format!("running {model}")),
    }
}

fn input_rank(g: &Graph) -> anyhow::Result<usize> {
    if g.inputs.len() != 1 {
        return Err(user(format!(
            "the model has {} inputs; `isolane infer` feeds models with exactly one",
            g.inputs.len()
        )));
    }
    // The first dim is the batch (Dim::Batch), or fixed in a fixed-batch ONNX export.
    match &g.values[g.inputs[0]].kind {
        ValueKind::Input(dims) => Ok(dims.len()),
        _ => Err(anyhow::anyhow!(
            "internal: graph input is not an input value"
        )),
    }
}

/// One image, preprocessed for a `[3, S, S]` input.
fn image_input(path: &Path, sample: &[usize]) -> anyhow::Result<Vec<f32>> {
    let [3, h, w] = sample else {
        return Err(user(format!(
            "--image: the model's input {sample:?} (per sample) is not an RGB image [3, H, W]"
        )));
    };
    if h != w {
        return Err(user(format!(
            "--image: the model's input is {h}x{w}; only square inputs are supported (use --input with a .npy)"
        )));
    }
    let img = image::decode(path).map_err(user)?;
    // torchvision's ImageNet transform at 224 is Resize(256) + CenterCrop(224); other sizes
    // keep that ratio.
    let resize = ((*h as f64) * 256.0 / 224.0).round() as usize;
    Ok(image::preprocess(&img, resize, *h))
}

fn repeat(one: &[f32], n: usize) -> Vec<f32> {
    let mut v = Vec::with_capacity(one.len() * n);
    for _ in 0..n {
        v.extend_from_slice(one);
    }
    v
}

/// An input with NaN or infinite values gives an output that means nothing (an all-NaN image
/// can still give a finite top-5: max-pooling and ReLU drop NaNs), so it is refused (exit 2).
fn check_finite(data: &[f32], from: &str) -> anyhow::Result<()> {
    let bad = data.iter().filter(|v| !v.is_finite()).count();
    if bad == 0 {
        return Ok(());
    }
    Err(user(format!(
        "{from}: {bad} of the {} input values are NaN or infinite; every value must be a finite \
         number",
        data.len()
    )))
}

/// Top-5 classes with softmax probabilities, for outputs shaped `[B, K]`.
fn print_top5(out: &[f32], shape: &[usize]) {
    let bad = out.iter().filter(|v| !v.is_finite()).count();
    if bad > 0 {
        println!(
            "(the output has {bad} NaN or infinite values of {}: no top-5; a NaN comes from the \
             model's weights or an overflow at this precision)",
            out.len()
        );
        return;
    }
    if out.is_empty() {
        println!("(the output is empty)");
        return;
    }
    let [b, k] = shape else {
        let (lo, hi) = out
            .iter()
            .fold((f32::INFINITY, f32::NEG_INFINITY), |(l, h), &x| {
                (l.min(x), h.max(x))
            });
        let mean = out.iter().map(|&x| x as f64).sum::<f64>() / out.len().max(1) as f64;
        println!("(not a classifier output: min {lo:.4}, max {hi:.4}, mean {mean:.4})");
        return;
    };
    let names = if *k == 1000 {
        io::imagenet_classes()
    } else {
        None
    };
    const SHOWN: usize = 4;
    for i in 0..(*b).min(SHOWN) {
        let row = &out[i * k..(i + 1) * k];
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let exps: Vec<f64> = row.iter().map(|&x| ((x - max) as f64).exp()).collect();
        let sum: f64 = exps.iter().sum();
        let mut idx: Vec<usize> = (0..*k).collect();
        idx.sort_by(|&a, &c| row[c].total_cmp(&row[a]));
        if *b > 1 {
            println!("sample {i}:");
        }
        println!("  rank  class  probability  logit      name");
        for (r, &c) in idx.iter().take(5).enumerate() {
            let name = names.as_ref().and_then(|n| n.get(c)).copied().unwrap_or("");
            println!(
                "  {:>4}  {c:>5}  {:>11.5}  {:>9.4}  {name}",
                r + 1,
                exps[c] / sum,
                row[c]
            );
        }
    }
    if *b > SHOWN {
        println!(
            "({} more samples not shown; --save-output writes them all)",
            b - SHOWN
        );
    }
}
