//! `isolane infer`'s work: one model on one input, its output and top-5 classes, so anyone can
//! compare isolane with their framework exactly. The lines a person reads go to the caller's
//! `say`, one at a time as they become known; the raw output comes back to the caller.

use std::path::{Path, PathBuf};
use std::time::Instant;

use isolane_engine::backend::{CompiledModel, Precision};
use isolane_engine::io::{self, image};
use isolane_engine::ir::ValueKind;
use isolane_engine::saved::{is_saved_plan_path, SavedPlan};
use isolane_engine::{build_model, CpuBackend, EngineError, Graph, Weights};

/// What to run, on what (the flags of `isolane infer`).
#[derive(Debug, Clone)]
pub struct InferRequest {
    /// A built-in model name, or a path to an .onnx file.
    pub model: String,
    /// A safetensors state dict for a built-in model (`None`: seeded synthetic weights).
    pub weights: Option<PathBuf>,
    pub weights_seed: u64,
    /// `"cpu"` or `"cuda"`.
    pub backend: String,
    /// `fp32`, `tf32`, `fp16`, `bf16`, or `int8` / `fp8` (the model quantized from
    /// `calibration` first, then run at fp16 on cuda, fp32 on the CPU), as the user wrote it.
    pub precision: String,
    /// The calibration folder (.npy files or images) of `int8` / `fp8`.
    pub calibration: Option<PathBuf>,
    /// `percentile` (the default), `entropy` (int8 only) or `minmax`.
    pub calibration_method: Option<String>,
    /// `quantized` (the default: a residual block's skip quantized too) or `float`.
    pub calibration_skips: Option<String>,
    pub gpu: u32,
    /// CPU threads (0 = one per core).
    pub threads: usize,
    pub source: Source,
    /// Seed of a random input.
    pub seed: u64,
    pub batch: Option<usize>,
    /// Timed runs after the first one.
    pub repeat: usize,
    /// Time every step of one more run.
    pub profile: bool,
    /// Compare an imported model's compiled cuda plan with the CPU reference first.
    pub plan_check: bool,
    /// The class of each of the input's items (.npy of class indices): the output's top-1
    /// answers are scored against them and against the model's fp32 answers on the CPU
    /// backend (unquantized), one line.
    pub labels: Option<PathBuf>,
}

/// Where the input comes from.
#[derive(Debug, Clone)]
pub enum Source {
    /// An image file (PNG or JPEG).
    Image(PathBuf),
    /// Seeded standard-normal values.
    Random,
    /// A .npy tensor: the whole input `[B, ...]` or one sample.
    Npy(PathBuf),
}

/// The raw output of the run.
pub struct Inferred {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

#[derive(Debug, thiserror::Error)]
pub enum InferError {
    /// A mistake in the request or the files it names (exit code 2 at the CLI).
    #[error("{0}")]
    User(String),
    /// The engine failed running the model (at its batch, once that is known).
    #[error("running {model}{}", .batch.map(|b| format!(" at batch {b}")).unwrap_or_default())]
    Engine {
        model: String,
        batch: Option<usize>,
        #[source]
        source: EngineError,
    },
    #[error("internal: {0}")]
    Internal(&'static str),
}

impl InferError {
    /// Whether this is the user's mistake (exit code 2) rather than a runtime failure.
    pub fn is_user_error(&self) -> bool {
        matches!(self, InferError::User(_))
    }
}

fn user(msg: impl std::fmt::Display) -> InferError {
    InferError::User(msg.to_string())
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

/// The float precision a request runs at and, for `int8` / `fp8`, how to quantize the model
/// first (cuda runs the quantized graph at fp16 with its products on the int8 / fp8 tensor
/// cores, docs/cuda.md; the CPU at fp32).
fn parse_precision(
    args: &InferRequest,
) -> Result<
    (
        Precision,
        Option<(isolane_engine::calibrate::CalibOptions, PathBuf)>,
    ),
    InferError,
> {
    use isolane_engine::calibrate::CalibOptions;
    use isolane_engine::quant::QuantType;
    let qtype = match args.precision.as_str() {
        "int8" => QuantType::Int8,
        "fp8" => QuantType::Float8E4M3Fn,
        p => {
            let skips = args.calibration_skips.is_some();
            if args.calibration.is_some() || args.calibration_method.is_some() || skips {
                return Err(user(format!(
                    "--calibration, --calibration-method and --calibration-skips are for \
                     --precision int8 or fp8, not {p}"
                )));
            }
            return Ok((p.parse().map_err(user)?, None));
        }
    };
    let Some(dir) = args.calibration.clone() else {
        return Err(user(format!(
            "--precision {} needs --calibration DIR (a folder of .npy files or images of the \
             model's input)",
            args.precision
        )));
    };
    let method = crate::engine::calib_method(args.calibration_method.as_deref()).map_err(user)?;
    let residual_skips =
        crate::engine::residual_skips(args.calibration_skips.as_deref()).map_err(user)?;
    let float = if args.backend == "cuda" {
        Precision::Fp16
    } else {
        Precision::Fp32
    };
    let opts = CalibOptions {
        qtype,
        method,
        residual_skips,
        ..Default::default()
    };
    Ok((float, Some((opts, dir))))
}

/// Runs the model once (and `repeat` more times, and once more profiled), saying what it did
/// through `say`, line by line; returns the output.
pub fn infer(args: &InferRequest, say: &mut dyn FnMut(String)) -> Result<Inferred, InferError> {
    let (precision, quantize) = parse_precision(args)?;
    let mut files = vec![("--model", Path::new(&args.model))];
    files.extend(args.weights.as_deref().map(|w| ("--weights", w)));
    files.extend(args.labels.as_deref().map(|l| ("--labels", l)));
    if let Source::Image(f) | Source::Npy(f) = &args.source {
        files.push((
            if matches!(args.source, Source::Npy(_)) {
                "--input"
            } else {
                "--image"
            },
            f,
        ));
    }
    for (flag, f) in files {
        isolane_core::files::refuse_device(flag, f).map_err(user)?;
    }
    // Read first: a bad labels file is reported before any compile.
    let labels = match &args.labels {
        Some(p) => Some(io::read_npy_labels(p).map_err(user)?),
        None => None,
    };
    if args.backend == "cpu" && precision != Precision::Fp32 {
        return Err(user(format!(
            "--precision {precision}: the CPU backend runs fp32 only (use --backend cuda)"
        )));
    }
    if args.batch == Some(0) {
        return Err(user("--batch must be at least 1"));
    }
    // A saved plan (`isolane build`): its fused graph, loaded below without compiling it again.
    let saved = if is_saved_plan_path(&args.model) {
        if args.weights.is_some() {
            return Err(user(format!(
                "--weights applies to built-in models; {} is a saved plan, which carries its own \
                 weights",
                args.model
            )));
        }
        Some(SavedPlan::load(Path::new(&args.model)).map_err(user)?)
    } else {
        None
    };
    let (graph, described) = match &saved {
        Some(s) => (
            s.graph.clone(),
            format!(
                "{} (saved plan, batch {})",
                args.model,
                s.batch().unwrap_or(0)
            ),
        ),
        None => load_model(args)?,
    };
    if quantize.is_some() && saved.is_some() {
        return Err(user(format!(
            "--precision {}: a saved plan is already compiled at its own precision; quantize the \
             model it was built from",
            args.precision
        )));
    }
    let rank = input_rank(&graph)?;

    // The input tensor as given, before the batch is known.
    enum Given {
        Sample(Vec<usize>, Vec<f32>),
        Batch(Vec<usize>, Vec<f32>),
        Random,
        Image(PathBuf),
    }
    let npy = match &args.source {
        Source::Npy(p) => p.as_path(),
        _ => Path::new(""),
    };
    let given = if let Source::Npy(p) = &args.source {
        let t = io::read_npy(p).map_err(user)?;
        if t.shape.len() == rank && t.shape.first() == Some(&0) {
            return Err(user(format!(
                "{}: shape {:?} holds no item; --input needs at least one",
                p.display(),
                t.shape
            )));
        }
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
    } else if let Source::Image(p) = &args.source {
        Given::Image(p.clone())
    } else {
        Given::Random
    };
    let batch = match (&given, args.batch) {
        (Given::Batch(s, _), Some(b)) if s[0] != b => {
            return Err(user(format!(
                "--batch {b}, but {} holds a batch of {}",
                npy.display(),
                s[0]
            )))
        }
        (Given::Batch(s, _), _) => s[0],
        (_, b) => b
            .or_else(|| saved.as_ref().and_then(SavedPlan::batch))
            .unwrap_or(1),
    };

    let target = if args.backend == "cuda" {
        crate::engine::Target::Cuda {
            gpu: args.gpu,
            precision,
        }
    } else {
        crate::engine::Target::Cpu
    };
    crate::engine::check_batch_fits(&graph, batch, target)
        .map_err(|reason| user(format!("--batch {batch}: {reason}")))?;
    if let (Some(l), Some(p)) = (&labels, &args.labels) {
        if l.len() != batch {
            return Err(user(format!(
                "--labels {}: {} labels, but the input holds {batch} items (one label per item)",
                p.display(),
                l.len()
            )));
        }
    }
    // The model before quantization: what --labels scores against (at fp32 on the CPU), and a
    // calibrated model's whole-model fallback on cuda.
    let float =
        (labels.is_some() || (quantize.is_some() && args.backend == "cuda")).then(|| graph.clone());
    let graph = match &quantize {
        Some((opts, dir)) => {
            let threads = if args.threads == 0 {
                std::thread::available_parallelism().map_or(1, |n| n.get())
            } else {
                args.threads
            };
            let (q, report) =
                isolane_engine::calibrate::quantize_from_folder(&graph, batch, dir, opts, threads)
                    .map_err(|e| user(format!("--calibration {}: {e}", dir.display())))?;
            let skips = crate::engine::skips_name(opts.residual_skips);
            say(format!("calibration: {report}; residual skips {skips}"));
            q
        }
        None => graph,
    };

    let t0 = Instant::now();
    let (mut loaded, backend_line) = if args.backend == "cuda" {
        let backend = isolane_cuda::CudaBackend::new(args.gpu)
            .map_err(|e| engine_error(e, &args.model, Some(batch)))?;
        // Quantized from --calibration here, so its layers may run plain fp16 (a QDQ file's
        // keep their fake-quant arithmetic).
        let build = backend.build_options().for_calibrated(quantize.is_some());
        let backend = backend.with_build_options(build);
        // Every model is checked, built-ins too (one inference: the check's CPU pass is what a
        // user of `infer` waits for anyway).
        let options = isolane_cuda::CompileOptions {
            plan_check: args.plan_check,
            ..Default::default()
        };
        let m = match (&saved, &float) {
            (Some(s), _) => backend.load_saved(s, &args.model, batch, precision),
            // Calibrated here: its float plan is built too, and the faster runs.
            (None, Some(f)) if quantize.is_some() => backend
                .compile_calibrated(f, &graph, batch, precision, &options)
                .map(|(m, choice)| {
                    if let Some(line) = choice.describe(&args.precision, precision.as_str()) {
                        say(format!("whole model: {line}"));
                    }
                    m
                }),
            _ => backend.compile_cuda_with(&graph, batch, precision, &options),
        }
        .map_err(|e| engine_error(e, &args.model, Some(batch)))?;
        let line = match m.plan_check() {
            Some(r) => format!(
                "cuda (GPU {}), {precision}; {}",
                args.gpu,
                crate::engine::plan_check_line(&r)
            ),
            None => format!("cuda (GPU {}), {precision}", args.gpu),
        };
        (Loaded::Cuda(Box::new(m)), line)
    } else {
        if let Some(s) = &saved {
            s.check_key(
                &args.model,
                &isolane_engine::saved::cpu_key(precision, batch),
            )
            .map_err(user)?;
        }
        let m = CpuBackend::new(args.threads)
            .compile_cpu(&graph, batch, Precision::Fp32)
            .map_err(|e| engine_error(e, &args.model, Some(batch)))?;
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
                    npy.display()
                )));
            }
            (d, format!("{}", npy.display()))
        }
        Given::Sample(s, d) => {
            if s != sample_shape {
                return Err(user(format!(
                    "{}: shape {s:?}, but one sample of the model's input is {sample_shape:?}",
                    npy.display()
                )));
            }
            (
                repeat(&d, batch),
                format!("{} (repeated ×{batch})", npy.display()),
            )
        }
        Given::Image(p) => {
            let one = image_input(&p, &sample_shape)?;
            (repeat(&one, batch), format!("{}", p.display()))
        }
        Given::Random => (
            crate::seeded_input::random_normal(per * batch, args.seed),
            format!("random N(0,1), seed {}", args.seed),
        ),
    };
    check_finite(&data, &from)?;
    model.input_mut().copy_from_slice(&data);

    let t1 = Instant::now();
    model
        .run()
        .map_err(|e| engine_error(e, &args.model, Some(batch)))?;
    let first_ms = t1.elapsed().as_secs_f64() * 1e3;

    say(format!("model    {described}"));
    say(format!(
        "backend  {backend_line}; compiled for batch {batch} in {compile_s:.2} s"
    ));
    say(format!("input    {in_shape:?} from {from}"));
    for i in 0..model.num_outputs() {
        say(format!("output   {:?}", model.output_shape_at(i)));
    }
    say(format!("run      {first_ms:.2} ms (first run)"));
    if let (Some(labels), Some(float)) = (&labels, &float) {
        // The CPU at fp32 without quantization is its own reference: one pass, not two.
        let own = args.backend == "cpu" && quantize.is_none();
        let reference = if own {
            model.output().to_vec()
        } else {
            let threads = if args.threads == 0 {
                std::thread::available_parallelism().map_or(1, |n| n.get())
            } else {
                args.threads
            };
            isolane_engine::calibrate::cpu_reference(float, batch, &data, threads)
                .map_err(|e| engine_error(e, &args.model, Some(batch)))?
        };
        let path = args.labels.as_deref().unwrap_or(Path::new(""));
        let scores = isolane_engine::calibrate::score_top1(model.output(), &reference, labels)
            .map_err(|e| user(format!("--labels {}: {e}", path.display())))?;
        say(format!(
            "labels   {scores} ({} {}; fp32: the model as given, on the CPU backend)",
            args.backend, args.precision
        ));
    }

    if args.repeat > 0 {
        let mut times = Vec::with_capacity(args.repeat);
        for _ in 0..args.repeat {
            let t = Instant::now();
            model
                .run()
                .map_err(|e| engine_error(e, &args.model, Some(batch)))?;
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
        times.sort_by(f64::total_cmp);
        let q =
            |p: f64| times[((p * (times.len() - 1) as f64).round() as usize).min(times.len() - 1)];
        let mean = times.iter().sum::<f64>() / times.len() as f64;
        say(format!(
            "latency  over {} runs: median {:.3} ms, p99 {:.3} ms, min {:.3} ms, mean {:.3} ms",
            times.len(),
            q(0.5),
            q(0.99),
            times[0],
            mean
        ));
    }

    if args.profile {
        let mut steps = loaded
            .profile()
            .map_err(|e| engine_error(e, &args.model, Some(batch)))?;
        let total: f64 = steps.iter().map(|s| s.1).sum();
        steps.sort_by(|a, b| b.1.total_cmp(&a.1));
        say(format!(
            "profile  one run, {total:.2} ms in {} steps; the slowest:",
            steps.len()
        ));
        for (name, ms) in steps.iter().take(15) {
            say(format!(
                "  {ms:8.3} ms  {:5.1}%  {name}",
                100.0 * ms / total.max(1e-9)
            ));
        }
    }

    let model = loaded.model();
    let shape = model.output_shape().to_vec();
    top5(model.output(), &shape, say);
    Ok(Inferred {
        shape,
        data: model.output().to_vec(),
    })
}

/// Reads a built-in or an ONNX file; returns the graph and a one-line description.
/// As in scenarios (isolane-core's ModelSource): a name ending in .onnx is a file, anything
/// else a built-in name.
fn is_onnx_path(model: &str) -> bool {
    Path::new(model)
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("onnx"))
}

fn load_model(args: &InferRequest) -> Result<(Graph, String), InferError> {
    let path = Path::new(&args.model);
    if is_onnx_path(&args.model) {
        if args.weights.is_some() {
            return Err(user(format!(
                "--weights applies to built-in models; {} carries its own weights",
                path.display()
            )));
        }
        // An ONNX file with dynamic sizes past the batch (optimum's exports) is sized by the
        // array given with --input, as onnxruntime is; read here for its shape only.
        let given = match &args.source {
            Source::Npy(p) => Some(io::read_npy(p).map_err(user)?.shape),
            _ => None,
        };
        // Every import failure concerns the file the user gave: exit code 2, file named.
        let g = isolane_engine::onnx::import_file_sized(path, given.as_deref()).map_err(user)?;
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
    let g = build_model(&args.model, weights).map_err(|e| engine_error(e, &args.model, None))?;
    Ok((g, format!("{} (built-in, {what})", args.model)))
}

/// A model the engine cannot take (unknown, bad weights, a malformed graph, an op or precision
/// the backend lacks) and a request that does not fit are the user's mistakes (exit 2, naming
/// the model or its file); an out-of-memory and a library failure keep their structure up to
/// the CLI, which tells them apart (exit 3 and 1).
fn engine_error(e: EngineError, model: &str, batch: Option<usize>) -> InferError {
    match e {
        EngineError::UnknownModel { .. }
        | EngineError::Weights { .. }
        | EngineError::InvalidArgument(_) => user(e),
        e if e.is_bad_model() => user(format!("{model}: {e}")),
        other => InferError::Engine {
            model: model.to_string(),
            batch,
            source: other,
        },
    }
}

fn input_rank(g: &Graph) -> Result<usize, InferError> {
    if g.inputs.len() != 1 {
        return Err(user(format!(
            "the model has {} inputs; `isolane infer` feeds models with exactly one",
            g.inputs.len()
        )));
    }
    // The first dim is the batch (Dim::Batch), or fixed in a fixed-batch ONNX export.
    match &g.values[g.inputs[0]].kind {
        ValueKind::Input(dims) => Ok(dims.len()),
        _ => Err(InferError::Internal("graph input is not an input value")),
    }
}

/// One image, preprocessed for a `[3, S, S]` input.
fn image_input(path: &Path, sample: &[usize]) -> Result<Vec<f32>, InferError> {
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
    // torchvision's ImageNet transform at 224 is Resize(256) + CenterCrop(224); other sizes
    // keep that ratio. An image too long for its resize is refused there, naming its size.
    image::load_image_sized(path, *h).map_err(user)
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
fn check_finite(data: &[f32], from: &str) -> Result<(), InferError> {
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
fn top5(out: &[f32], shape: &[usize], say: &mut dyn FnMut(String)) {
    let bad = out.iter().filter(|v| !v.is_finite()).count();
    if bad > 0 {
        say(format!(
            "(the output has {bad} NaN or infinite values of {}: no top-5; a NaN comes from the \
             model's weights or an overflow at this precision)",
            out.len()
        ));
        return;
    }
    if out.is_empty() {
        say("(the output is empty)".to_string());
        return;
    }
    let [b, k] = shape else {
        let (lo, hi) = out
            .iter()
            .fold((f32::INFINITY, f32::NEG_INFINITY), |(l, h), &x| {
                (l.min(x), h.max(x))
            });
        let mean = out.iter().map(|&x| x as f64).sum::<f64>() / out.len().max(1) as f64;
        say(format!(
            "(not a classifier output: min {lo:.4}, max {hi:.4}, mean {mean:.4})"
        ));
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
            say(format!("sample {i}:"));
        }
        say("  rank  class  probability  logit      name".to_string());
        for (r, &c) in idx.iter().take(5).enumerate() {
            let name = names.as_ref().and_then(|n| n.get(c)).copied().unwrap_or("");
            say(format!(
                "  {:>4}  {c:>5}  {:>11.5}  {:>9.4}  {name}",
                r + 1,
                exps[c] / sum,
                row[c]
            ));
        }
    }
    if *b > SHOWN {
        say(format!(
            "({} more samples not shown; --save-output writes them all)",
            b - SHOWN
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(precision: &str, skips: Option<&str>) -> InferRequest {
        InferRequest {
            model: "resnet18".into(),
            weights: None,
            weights_seed: 0,
            backend: "cuda".into(),
            precision: precision.into(),
            calibration: Some("cal".into()),
            calibration_method: Some("entropy".into()),
            calibration_skips: skips.map(str::to_string),
            gpu: 0,
            threads: 1,
            source: Source::Random,
            seed: 0,
            batch: None,
            repeat: 0,
            profile: false,
            plan_check: true,
            labels: None,
        }
    }

    /// `--calibration-skips` reaches the calibration's options with the method; it is
    /// refused, as the other calibration flags are, without --precision int8 or fp8.
    #[test]
    fn calibration_skips_reach_the_calibration_options() {
        use isolane_engine::calibrate::CalibMethod;
        for (skips, want) in [
            (None, true),
            (Some("quantized"), true),
            (Some("float"), false),
        ] {
            let (float, quantize) = parse_precision(&request("int8", skips)).unwrap();
            let (opts, dir) = quantize.unwrap();
            assert_eq!(float, Precision::Fp16);
            assert_eq!(dir, Path::new("cal"));
            assert_eq!(opts.method, CalibMethod::Entropy);
            assert_eq!(opts.residual_skips, want, "{skips:?}");
        }
        let e = parse_precision(&request("int8", Some("bytes"))).unwrap_err();
        assert!(e.is_user_error());
        assert_eq!(
            e.to_string(),
            "--calibration-skips bytes: expected quantized or float"
        );
        let alone = InferRequest {
            calibration: None,
            calibration_method: None,
            ..request("fp16", Some("float"))
        };
        let e = parse_precision(&alone).unwrap_err();
        assert!(e.is_user_error());
        assert!(
            e.to_string()
                .contains("--calibration-skips are for --precision int8 or fp8, not fp16"),
            "{e}"
        );
    }
}
