//! `isolane build`: a model compiled once for a batch, a precision and a device, saved as a
//! plan (`.isoplan`) that `run`, `serve`, `infer` and `bench` load instead of compiling and
//! timing it again (docs/engine.md and docs/cuda.md, "Saved plans").

use std::path::{Path, PathBuf};
use std::time::Instant;

use isolane_engine::saved::{self, is_saved_plan_path, SavedPlan};
use isolane_engine::{build_model, CompiledModel, CpuBackend, EngineError, Precision, Weights};

/// What to build.
#[derive(Clone, Debug)]
pub struct BuildRequest {
    /// A built-in name or an .onnx file.
    pub model: String,
    /// A safetensors state dict for a built-in (else seeded synthetic weights).
    pub weights: Option<PathBuf>,
    pub weights_seed: u64,
    /// `fp32`, `tf32`, `fp16`, `bf16` (the CPU backend: fp32).
    pub precision: String,
    pub batch: usize,
    /// `cpu` or `cuda`.
    pub device: String,
    pub gpu: u32,
    /// The plan file to write.
    pub out: PathBuf,
}

/// Why a build failed: the user's input (exit 2) or the machine (exit 1).
#[derive(Debug)]
pub enum BuildError {
    User(String),
    Failed(String),
    /// The engine failed doing `what` (not the user's input): its error is kept whole as the
    /// source, so that the CLI tells an out-of-memory (exit 3) from a library failure (1).
    Engine {
        what: String,
        source: EngineError,
    },
}

impl std::fmt::Display for BuildError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BuildError::User(m) | BuildError::Failed(m) => f.write_str(m),
            BuildError::Engine { what, .. } => f.write_str(what),
        }
    }
}

impl std::error::Error for BuildError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BuildError::Engine { source, .. } => Some(source),
            _ => None,
        }
    }
}

impl BuildError {
    pub fn is_user_error(&self) -> bool {
        matches!(self, BuildError::User(_))
    }
}

/// An engine error of a model the user gave while doing `what`: the model's or the request's
/// fault (exit 2), or else the machine's (memory: exit 3; a library, a failed run: exit 1).
fn classify(what: String) -> impl FnOnce(EngineError) -> BuildError {
    move |e| match e {
        EngineError::InvalidGraph { .. }
        | EngineError::Shape { .. }
        | EngineError::Unsupported(_)
        | EngineError::UnknownModel { .. }
        | EngineError::Weights { .. }
        | EngineError::InvalidArgument(_) => BuildError::User(e.to_string()),
        source => BuildError::Engine { what, source },
    }
}

/// Builds the plan, writes it to `req.out` and says what it did through `say`.
pub fn build(req: &BuildRequest, say: &mut dyn FnMut(String)) -> Result<SavedPlan, BuildError> {
    let user = |m: String| BuildError::User(m);
    if req.batch == 0 {
        return Err(user("--batch must be at least 1".into()));
    }
    if is_saved_plan_path(&req.model) {
        return Err(user(format!(
            "`{}` is a saved plan already: give the model it was built from (a built-in name or \
             an .onnx file)",
            req.model
        )));
    }
    if !is_saved_plan_path(&req.out.to_string_lossy()) {
        return Err(user(format!(
            "-o {}: a saved plan's file name ends in .{} (so that run, serve, infer and bench \
             know it for one)",
            req.out.display(),
            saved::EXTENSION
        )));
    }
    // Checked before the build, which may take minutes, and never over the model it reads.
    let mut inputs = vec![("the model", Path::new(&req.model))];
    inputs.extend(req.weights.as_deref().map(|w| ("--weights", w)));
    isolane_core::files::refuse_input_as_output("-o", &req.out, &inputs)
        .map_err(|e| user(e.to_string()))?;
    isolane_core::files::check_output(&req.out).map_err(|e| user(e.to_string()))?;
    for (what, f) in inputs {
        isolane_core::files::refuse_device(what, f).map_err(user)?;
    }
    let precision: Precision = req
        .precision
        .parse()
        .map_err(|e: EngineError| user(format!("--precision: {e}")))?;
    let t0 = Instant::now();
    let graph = if req.model.to_ascii_lowercase().ends_with(".onnx") {
        if req.weights.is_some() {
            return Err(user(format!(
                "--weights applies to built-in models; {} carries its own weights",
                req.model
            )));
        }
        isolane_engine::onnx::import_file(Path::new(&req.model)).map_err(|e| user(e.to_string()))?
    } else {
        let weights = match &req.weights {
            Some(p) => Weights::Safetensors(p.clone()),
            None => Weights::Synthetic {
                seed: req.weights_seed,
            },
        };
        build_model(&req.model, weights).map_err(|e| user(e.to_string()))?
    };
    let doing = format!(
        "building {} for batch {} on {}",
        req.model, req.batch, req.device
    );
    let saved = match req.device.as_str() {
        "cpu" => {
            if precision != Precision::Fp32 {
                return Err(user(format!(
                    "--precision {}: the CPU backend runs fp32 only (allowed with --device cpu: \
                     fp32)",
                    precision.as_str()
                )));
            }
            let saved =
                saved::cpu_plan(&graph, &req.model, req.batch).map_err(classify(doing.clone()))?;
            // Compiled once here, so that a plan that cannot run at this batch is never written.
            CpuBackend::new(1)
                .compile_cpu(&saved.graph, req.batch, precision)
                .map_err(classify(doing))?;
            saved
        }
        "cuda" => {
            let backend =
                isolane_cuda::CudaBackend::new(req.gpu).map_err(classify(doing.clone()))?;
            let (model, saved) = backend
                .build_saved(&graph, &req.model, req.batch, precision)
                .map_err(classify(doing))?;
            say(format!(
                "compiled {} for batch {} at {} on cuda in {:.0} ms (plan built and timed in \
                 {:.0} ms)",
                req.model,
                req.batch,
                precision.as_str(),
                t0.elapsed().as_secs_f64() * 1e3,
                model.build_ms()
            ));
            saved
        }
        other => {
            return Err(user(format!(
                "--device {other}: allowed values are cpu, cuda"
            )))
        }
    };
    isolane_core::files::write_output(&req.out, &saved.to_bytes()).map_err(|e| {
        if e.is_user_error() {
            BuildError::User(e.to_string())
        } else {
            BuildError::Failed(e.to_string())
        }
    })?;
    say(format!("wrote {}", req.out.display()));
    for (k, v) in &saved.key {
        say(format!("  {k:<18} {v}"));
    }
    Ok(saved)
}

/// A saved plan's model on the CPU backend for `precision` and `batch`, after its key is
/// checked against them: what `infer` and `bench` run for a `.isoplan` model.
pub fn load_cpu(
    path: &Path,
    precision: Precision,
    batch: usize,
    threads: usize,
) -> Result<Box<dyn CompiledModel>, BuildError> {
    let file = path.display().to_string();
    let saved = SavedPlan::load(path).map_err(|e| BuildError::User(e.to_string()))?;
    saved
        .check_key(&file, &saved::cpu_key(precision, batch))
        .map_err(|e| BuildError::User(e.to_string()))?;
    let m = CpuBackend::new(threads)
        .compile_cpu(&saved.graph, batch, precision)
        .map_err(classify(format!("loading {file} for batch {batch} on cpu")))?;
    Ok(Box::new(m))
}

/// A saved plan's model on cuda (GPU `gpu`) for `precision` and `batch`, its choices replayed
/// (nothing timed), after its key is checked against them and this GPU.
pub fn load_cuda(
    path: &Path,
    precision: Precision,
    batch: usize,
    gpu: u32,
) -> Result<isolane_cuda::CudaModel, BuildError> {
    let file = path.display().to_string();
    let saved = SavedPlan::load(path).map_err(|e| BuildError::User(e.to_string()))?;
    let doing = format!("loading {file} for batch {batch} on cuda");
    let backend = isolane_cuda::CudaBackend::new(gpu).map_err(classify(doing.clone()))?;
    backend
        .load_saved(&saved, &file, batch, precision)
        .map_err(classify(doing))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(dir: &Path, model: &str, precision: &str, batch: usize) -> BuildRequest {
        BuildRequest {
            model: model.into(),
            weights: None,
            weights_seed: 3,
            precision: precision.into(),
            batch,
            device: "cpu".into(),
            gpu: 0,
            out: dir.join("m.isoplan"),
        }
    }

    /// A folder of the test's own (no tempfile dependency in this crate), removed after.
    struct Dir(PathBuf);
    impl Dir {
        fn new(name: &str) -> Dir {
            let p =
                std::env::temp_dir().join(format!("isolane-saved-{name}-{}", std::process::id()));
            std::fs::create_dir_all(&p).unwrap();
            Dir(p)
        }
        fn path(&self) -> &Path {
            &self.0
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn a_cpu_build_loads_and_computes_the_models_bits() {
        let dir = Dir::new("build");
        let req = request(dir.path(), "resnet18", "fp32", 2);
        let mut lines = Vec::new();
        build(&req, &mut |l| lines.push(l)).unwrap();
        assert!(lines.iter().any(|l| l.contains("model hash")), "{lines:?}");
        let mut loaded = load_cpu(&req.out, Precision::Fp32, 2, 1).unwrap();
        let g = build_model("resnet18", Weights::Synthetic { seed: 3 }).unwrap();
        let mut direct = CpuBackend::new(1)
            .compile_cpu(&g, 2, Precision::Fp32)
            .unwrap();
        let input = crate::seeded_input::random_normal(direct.input_mut().len(), 9);
        direct.input_mut().copy_from_slice(&input);
        loaded.input_mut().copy_from_slice(&input);
        direct.run().unwrap();
        loaded.run().unwrap();
        let bits = |o: &[f32]| o.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(loaded.output()), bits(direct.output()));
        // Another batch or precision than the plan's is refused naming both values.
        let e = load_cpu(&req.out, Precision::Fp32, 4, 1).err().unwrap();
        assert!(
            e.is_user_error() && e.to_string().contains("batch \"2\""),
            "{e}"
        );
    }

    #[test]
    fn bad_requests_are_the_users_with_the_allowed_values() {
        let dir = Dir::new("bad");
        let e = build(&request(dir.path(), "resnet18", "fp16", 1), &mut |_| {})
            .err()
            .unwrap();
        assert!(
            e.is_user_error() && e.to_string().contains("fp32 only"),
            "{e}"
        );
        let e = build(&request(dir.path(), "resnet18", "fp64", 1), &mut |_| {})
            .err()
            .unwrap();
        assert!(
            e.is_user_error() && e.to_string().contains("fp32, tf32"),
            "{e}"
        );
        let e = build(&request(dir.path(), "nope", "fp32", 1), &mut |_| {})
            .err()
            .unwrap();
        assert!(e.is_user_error() && e.to_string().contains("nope"), "{e}");
        let mut req = request(dir.path(), "resnet18", "fp32", 1);
        req.out = dir.path().join("m.bin");
        let e = build(&req, &mut |_| {}).err().unwrap();
        assert!(
            e.is_user_error() && e.to_string().contains(".isoplan"),
            "{e}"
        );
        let mut req = request(dir.path(), "m.onnx", "fp32", 1);
        req.weights = Some(dir.path().join("w.safetensors"));
        let e = build(&req, &mut |_| {}).err().unwrap();
        assert!(
            e.is_user_error() && e.to_string().contains("own weights"),
            "{e}"
        );
        let mut req = request(dir.path(), "resnet18", "fp32", 1);
        req.device = "tpu".into();
        let e = build(&req, &mut |_| {}).err().unwrap();
        assert!(e.to_string().contains("cpu, cuda"), "{e}");
    }
}
