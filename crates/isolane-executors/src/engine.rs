//! Plugs the inference engine into the runtime: every workload whose model is not `spin:` is a
//! real network (a built-in architecture or an ONNX file), compiled once for its batch and
//! precision and run once per job, or a synthetic `kernel:` workload (`kernel.rs`).
//!
//! The runtime does not depend on the engine; the binary's `main` builds one
//! [`EngineExecutorsImpl`] and passes it down (to the coordinator and to `isolane worker`
//! alike), so both build models the same way.

use std::path::Path;
use std::sync::Mutex;

use isolane_core::spec::{
    Backend as SpecBackend, DeviceSpec, Host, Mechanism, ModelSource, Precision as SpecPrecision,
    WorkloadSpec,
};
use isolane_engine::saved::{self as saved_file, is_saved_plan_path, SavedPlan};
use isolane_engine::{
    build_model, model_info, CompiledModel, CpuBackend, Graph, Precision, Weights,
};
use isolane_runtime::exec::{EngineExecutors, ExecError, Executor, TensorInfo};
use isolane_runtime::partition::Partition;

/// The engine as the runtime sees it: the CPU backend, or the CUDA backend for
/// `backend = "cuda"`.
#[derive(Default)]
pub struct EngineExecutorsImpl {
    /// Graphs loaded from files during `check`, handed to `build` so that a file is read once
    /// per process. `build` takes its entry out: a second workload on the same file reads it
    /// again rather than the cache pinning a large model in memory for the whole run.
    checked: Mutex<Vec<CheckedGraph>>,
}

/// A graph `check` read from a file: (model, weights, graph).
type CheckedGraph = (String, Option<String>, Graph);

impl EngineExecutorsImpl {
    /// The engine as the value the runtime is given.
    pub fn shared() -> isolane_runtime::exec::Engine {
        std::sync::Arc::new(EngineExecutorsImpl::default())
    }
}

/// Built-in or ONNX, by core's rule (scenario validation classifies models the same way).
fn is_onnx(model: &str) -> bool {
    matches!(ModelSource::classify(model), Ok(ModelSource::Onnx(_)))
}

/// Whether a workload's cuda model is checked against the CPU reference before its first job
/// (`plan_check`, on by default; docs/cuda.md, Plan check). Imported models always are.
/// Built-ins are covered by the GPU tests on a whole GPU or a green context, but not as MPS
/// clients with part of the threads, where cuBLASLt computed wrong results on the H100 and
/// where, on the H200 (session 27), vit_b_16's saved plan computed NaN at its first Linear at
/// 30 % of the threads: there built-ins are checked too.
fn checks_against_cpu(spec: &WorkloadSpec, build: &isolane_cuda::BuildOptions) -> bool {
    spec.plan_check && (is_onnx(&spec.model) || build.mps_thread_pct.is_some())
}

pub(crate) fn precision(p: SpecPrecision) -> Precision {
    match p {
        SpecPrecision::Fp32 => Precision::Fp32,
        SpecPrecision::Tf32 => Precision::Tf32,
        SpecPrecision::Fp16 => Precision::Fp16,
        SpecPrecision::Bf16 => Precision::Bf16,
        // The float precision between a quantized model's quantized ops on cuda; the CPU
        // backend runs the quantized graph at fp32 ([`cpu_precision`]).
        SpecPrecision::Int8 | SpecPrecision::Fp8 => Precision::Fp16,
    }
}

/// The CPU backend's precision for a workload: fp32, which is also what it runs an int8 or
/// fp8 workload's quantized graph at.
fn cpu_precision(p: SpecPrecision) -> Precision {
    if p.quantized() {
        Precision::Fp32
    } else {
        precision(p)
    }
}

/// A `precision = "int8"` or `"fp8"` workload's graph quantized from its calibration folder
/// (docs/engine.md, Post-training quantization), with its top-1 agreement with the float
/// graph over that folder printed; `None` for any other workload (its graph runs as it is).
/// A calibrated model's layers may run plain fp16 on cuda, and the whole model may run its
/// float plan where that is faster ([`isolane_cuda::CudaBackend::compile_calibrated`]); a
/// QDQ file's keep their fake-quant arithmetic
/// ([`isolane_cuda::BuildOptions::quant_float_plain`]).
fn quantized(spec: &WorkloadSpec, graph: &Graph) -> Result<Option<Graph>, ExecError> {
    use isolane_engine::calibrate;
    use isolane_engine::quant::QuantType;
    let qtype = match spec.precision {
        SpecPrecision::Int8 => QuantType::Int8,
        SpecPrecision::Fp8 => QuantType::Float8E4M3Fn,
        _ => return Ok(None),
    };
    let Some(c) = spec.calibration.as_ref().filter(|c| !c.dir.is_empty()) else {
        return Err(bad_model(
            spec,
            "precision int8 and fp8 need calibration = \"DIR\" (a folder of .npy files or images)",
        ));
    };
    let opts = calib_options(qtype, c);
    let threads = spec.cpu.len().max(1);
    let dir = Path::new(&c.dir);
    let (q, report) =
        calibrate::quantize_from_folder(graph, spec.batch as usize, dir, &opts, threads)
            .map_err(|e| bad_model(spec, e))?;
    let skips = skips_name(opts.residual_skips);
    eprintln!("workload {}: {report}; residual skips {skips}", spec.name);
    Ok(Some(q))
}

/// How a workload's `calibration`, `calibration_method` and `calibration_skips` calibrate
/// its model to `qtype`.
fn calib_options(
    qtype: isolane_engine::quant::QuantType,
    c: &isolane_core::spec::CalibrationSpec,
) -> isolane_engine::calibrate::CalibOptions {
    use isolane_core::spec::{CalibrationMethod as M, CalibrationSkips};
    use isolane_engine::calibrate::{CalibMethod, CalibOptions};
    let method = match c.method {
        M::Percentile => CalibMethod::Percentile(99.99),
        M::Entropy => CalibMethod::Entropy,
        M::Minmax => CalibMethod::MinMax,
    };
    CalibOptions {
        qtype,
        method,
        residual_skips: c.skips == CalibrationSkips::Quantized,
        ..Default::default()
    }
}

/// `--calibration-method`'s value: percentile (the 99.99th) unless another is asked for; the
/// message of a name that is none of them.
pub(crate) fn calib_method(
    flag: Option<&str>,
) -> Result<isolane_engine::calibrate::CalibMethod, String> {
    use isolane_engine::calibrate::CalibMethod;
    let name = flag.unwrap_or("percentile");
    CalibMethod::from_name(name).ok_or_else(|| {
        format!("--calibration-method {name}: expected percentile, entropy or minmax")
    })
}

/// `--calibration-skips`' value ([`isolane_engine::calibrate::CalibOptions::residual_skips`]):
/// quantized unless `float` is asked for; the message of a value that is neither.
pub(crate) fn residual_skips(flag: Option<&str>) -> Result<bool, String> {
    match flag {
        None | Some("quantized") => Ok(true),
        Some("float") => Ok(false),
        Some(s) => Err(format!(
            "--calibration-skips {s}: expected quantized or float"
        )),
    }
}

/// The name of a calibration's residual skips, as `calibration_skips` and
/// `--calibration-skips` write it, for the line that reports the calibration.
pub(crate) fn skips_name(residual_skips: bool) -> &'static str {
    if residual_skips {
        "quantized"
    } else {
        "float"
    }
}

/// An engine error of building `spec`'s model: an out-of-memory kept as one (exit 3), the
/// rest as [`engine_err`].
fn build_err(spec: &WorkloadSpec, e: isolane_engine::EngineError) -> ExecError {
    if e.kind() == isolane_engine::ErrorKind::OutOfMemory {
        return ExecError::OutOfMemory {
            workload: spec.name.clone(),
            message: e.to_string(),
        };
    }
    engine_err(spec, e)
}

pub(crate) fn engine_err(spec: &WorkloadSpec, message: impl std::fmt::Display) -> ExecError {
    ExecError::Engine {
        workload: spec.name.clone(),
        message: message.to_string(),
    }
}

///
/// Runs again at every reload while serving (`isolane ctl load`), long after the scenario's
/// files were checked: a plan or an ONNX file is read by the engine's capped reader, which
/// refuses anything but a regular file (a model now linked to /dev/zero is a refusal naming
/// it, not all of memory); a weights file is refused if it has become a device.
fn load_graph(spec: &WorkloadSpec, seed: u64) -> Result<Graph, ExecError> {
    if let Some(w) = &spec.weights {
        isolane_core::files::refuse_device("weights", Path::new(w))
            .map_err(|e| bad_model(spec, e))?;
    }
    if is_saved_plan_path(&spec.model) {
        return load_saved(spec).map(|s| s.graph);
    }
    if is_onnx(&spec.model) {
        return isolane_engine::onnx::import_file(Path::new(&spec.model))
            .map_err(|e| bad_model(spec, e));
    }
    let weights = match &spec.weights {
        Some(p) => Weights::Safetensors(p.into()),
        None => Weights::Synthetic { seed },
    };
    build_model(&spec.model, weights).map_err(|e| bad_model(spec, e))
}

/// A saved plan (`isolane build`), its precision and batch checked against the workload's
/// (a plan is compiled for one of each).
fn load_saved(spec: &WorkloadSpec) -> Result<SavedPlan, ExecError> {
    let saved = SavedPlan::load(Path::new(&spec.model)).map_err(|e| bad_model(spec, e))?;
    let here = [
        (
            saved_file::FIELD_PRECISION,
            precision(spec.precision).as_str().to_string(),
        ),
        (saved_file::FIELD_BATCH, spec.batch.to_string()),
    ]
    .map(|(k, v)| (k.to_string(), v));
    saved
        .check_key(&spec.model, &here)
        .map_err(|e| bad_model(spec, e))?;
    Ok(saved)
}

/// The key a saved plan must have to run on `device` (its GPU's fields on cuda).
fn saved_key_here(
    device: &DeviceSpec,
    spec: &WorkloadSpec,
) -> Result<Vec<(String, String)>, ExecError> {
    let p = precision(spec.precision);
    let batch = spec.batch as usize;
    match device.backend {
        SpecBackend::Cuda => {
            let gpu =
                isolane_cuda::saved::gpu_key(gpu_index(device)).map_err(|e| engine_err(spec, e))?;
            Ok(isolane_cuda::saved::expected_key(gpu, p, batch))
        }
        SpecBackend::Cpu => Ok(saved_file::cpu_key(p, batch)),
    }
}

/// A model file or weights file that cannot be used is the user's to fix (exit code 2).
fn bad_model(spec: &WorkloadSpec, e: impl std::fmt::Display) -> ExecError {
    ExecError::BadModel {
        workload: spec.name.clone(),
        model: spec.model.clone(),
        reason: e.to_string(),
    }
}

fn check_name(spec: &WorkloadSpec) -> Result<(), ExecError> {
    if !is_onnx(&spec.model) && model_info(&spec.model).is_none() {
        return Err(bad_model(
            spec,
            "not a built-in model (see `isolane models`) nor an .onnx file",
        ));
    }
    Ok(())
}

/// Real networks on `backend = "cuda"` run on the engine's CUDA backend: its libraries
/// (libcuda, NVRTC, cuDNN, cuBLASLt) must load, or the run stops before it starts.
pub(crate) fn check_backend(device: &DeviceSpec, spec: &WorkloadSpec) -> Result<(), ExecError> {
    if device.backend == SpecBackend::Cuda {
        isolane_cuda::libs::ensure_all().map_err(|e| engine_err(spec, e))?;
    }
    Ok(())
}

/// The CUDA device this process should use: a worker behind our MPS daemon or bound to a MIG
/// instance sees only that one device (index 0), which the run says through
/// `ISOLANE_WORKER_GPU`; otherwise the scenario's `device.gpu`.
pub(crate) fn gpu_index(device: &DeviceSpec) -> u32 {
    std::env::var(isolane_gpu::partitions::WORKER_GPU_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(device.gpu)
}

/// Whether this worker process runs a critical workload of a protected run, whose stream
/// goes at the device's greatest priority (the session says so through the environment, as it
/// does the GPU index; a thread-hosted workload's priority comes with its green group).
pub(crate) fn worker_is_urgent() -> bool {
    std::env::var(isolane_gpu::partitions::WORKER_STREAM_PRIORITY_ENV)
        .is_ok_and(|v| v == "greatest")
}

/// The green group a thread-hosted workload's plan carried (the only partition a thread host
/// is given; MPS and MIG reach worker processes through their environment).
pub(crate) fn green_group(
    spec: &WorkloadSpec,
    p: Partition,
) -> Result<isolane_gpu::GreenGroup, ExecError> {
    p.downcast::<isolane_gpu::GreenGroup>()
        .map(|g| *g)
        .map_err(|_| engine_err(spec, "its partition is not a green group"))
}

/// Compiles `graph` on the CUDA backend: in the workload's green context when its plan carried
/// one (`group`), else on a stream of its own in the device's primary context. `calibrated`:
/// `graph` quantized by [`quantized`] (not a QDQ file), compiled with `graph` itself as its
/// whole-model fallback, the faster kept and said on stderr.
fn build_cuda(
    device: &DeviceSpec,
    spec: &WorkloadSpec,
    (graph, calibrated): (&Graph, Option<&Graph>),
    seed: u64,
    group: Option<isolane_gpu::GreenGroup>,
) -> Result<Box<dyn Executor>, ExecError> {
    let backend = cuda_backend(device, spec, &group)?;
    let build = backend.build_options().for_calibrated(calibrated.is_some());
    let backend = backend.with_build_options(build);
    let options = isolane_cuda::CompileOptions {
        plan_check: checks_against_cpu(spec, &build),
        ..Default::default()
    };
    let (batch, p) = (spec.batch as usize, precision(spec.precision));
    let (model, ran) = match calibrated {
        Some(q) => {
            let (model, choice) = backend
                .compile_calibrated(graph, q, batch, p, &options)
                .map_err(|e| build_err(spec, e))?;
            if let Some(line) = choice.describe(spec.precision.name(), p.as_str()) {
                eprintln!("workload {}: {line}", spec.name);
            }
            (model, if choice.kept_float() { graph } else { q })
        }
        None => (
            backend
                .compile_cuda_with(graph, batch, p, &options)
                .map_err(|e| build_err(spec, e))?,
            graph,
        ),
    };
    Ok(cuda_executor(spec, model, ran, seed, group))
}

/// A saved plan's model: on cuda its choices replayed (nothing timed; the load checks its key
/// against this GPU and its outputs' bits against the build's; where the bits would differ here,
/// as at some MPS shares, the model is built again from the plan's graph, said once on stderr),
/// on the CPU its fused graph compiled.
fn build_saved(
    device: &DeviceSpec,
    spec: &WorkloadSpec,
    seed: u64,
    partition: Option<Partition>,
) -> Result<Box<dyn Executor>, ExecError> {
    let saved = load_saved(spec)?;
    if device.backend == SpecBackend::Cuda {
        let group = partition.map(|p| green_group(spec, p)).transpose()?;
        let backend = cuda_backend(device, spec, &group)?;
        let model = backend
            .load_saved_or_build(
                &saved,
                &spec.model,
                spec.batch as usize,
                precision(spec.precision),
            )
            .map_err(|e| build_err(spec, e))?;
        return Ok(cuda_executor(spec, model, &saved.graph, seed, group));
    }
    saved
        .check_key(&spec.model, &saved_key_here(device, spec)?)
        .map_err(|e| bad_model(spec, e))?;
    let threads = spec.cpu.len().max(1);
    let mut model = CpuBackend::new(threads)
        .compile_cpu(&saved.graph, spec.batch as usize, precision(spec.precision))
        .map_err(|e| build_err(spec, e))?;
    let io = TensorNames::of(&saved.graph);
    let input = crate::seeded_input::random_normal(model.input_mut().len(), seed);
    model.input_mut().copy_from_slice(&input);
    Ok(Box::new(ModelExecutor {
        model: Box::new(model),
        io,
    }))
}

/// The CUDA backend a workload's model is built on: in its green context when its plan carried
/// one (`group`), else on a stream of its own in the device's primary context.
fn cuda_backend(
    device: &DeviceSpec,
    spec: &WorkloadSpec,
    group: &Option<isolane_gpu::GreenGroup>,
) -> Result<isolane_cuda::CudaBackend, ExecError> {
    match group {
        Some(g) => {
            g.make_current().map_err(|e| engine_err(spec, e))?;
            // SAFETY: the group (its context and stream) is moved into the executor below and
            // outlives the model, which is dropped first.
            unsafe { isolane_cuda::CudaBackend::with_stream(g.context(), g.stream()) }
        }
        None => isolane_cuda::CudaBackend::with_own_stream(gpu_index(device), worker_is_urgent()),
    }
    .map_err(|e| engine_err(spec, e))
}

/// The executor of a model compiled (or loaded) on cuda, its input seeded.
fn cuda_executor(
    spec: &WorkloadSpec,
    mut model: isolane_cuda::CudaModel,
    graph: &Graph,
    seed: u64,
    group: Option<isolane_gpu::GreenGroup>,
) -> Box<dyn Executor> {
    if let Some(r) = model.plan_check() {
        eprintln!("workload {}: {}", spec.name, plan_check_line(&r));
    }
    let input = crate::seeded_input::random_normal(model.input_mut().len(), seed);
    model.input_mut().copy_from_slice(&input);
    let io = TensorNames::of(graph);
    // The device's L2 is read in the model's own context (current here); a guard that shares
    // charges this model's pieces by what one job asks of the memory system.
    let profile = isolane_cuda::l2::l2_bytes()
        .ok()
        .and_then(|l2| profile_of(graph, spec, l2 as u64));
    Box::new(CudaExecutor {
        slots: None,
        model,
        io,
        profile,
        _group: group,
    })
}

/// The names of a graph's inputs and outputs, in the compiled model's order, kept beside the
/// model so that a server can describe and fill its tensors.
struct TensorNames {
    inputs: Vec<String>,
    outputs: Vec<String>,
}

impl TensorNames {
    fn of(graph: &Graph) -> TensorNames {
        let name = |&id: &usize| graph.values[id].name.clone();
        TensorNames {
            inputs: graph.inputs.iter().map(name).collect(),
            outputs: graph.outputs.iter().map(name).collect(),
        }
    }

    fn inputs(&self, model: &dyn CompiledModel) -> Vec<TensorInfo> {
        (0..model.num_inputs())
            .map(|i| TensorInfo {
                name: self
                    .inputs
                    .get(i)
                    .cloned()
                    .unwrap_or_else(|| format!("input{i}")),
                shape: model.input_shape_at(i).to_vec(),
            })
            .collect()
    }

    fn outputs(&self, model: &dyn CompiledModel) -> Vec<TensorInfo> {
        (0..model.num_outputs())
            .map(|i| TensorInfo {
                name: self
                    .outputs
                    .get(i)
                    .cloned()
                    .unwrap_or_else(|| format!("output{i}")),
                shape: model.output_shape_at(i).to_vec(),
            })
            .collect()
    }
}

/// A model's input `i`, `None` out of range (the trait's accessors give an empty slice there).
fn input_of(model: &mut dyn CompiledModel, i: usize) -> Option<&mut [f32]> {
    (i < model.num_inputs()).then(|| model.input_mut_at(i))
}

fn output_of(model: &dyn CompiledModel, i: usize) -> Option<&[f32]> {
    (i < model.num_outputs()).then(|| model.output_at(i))
}

/// What a passed plan check found and cost, in one line (`isolane infer`/`bench` print it too).
pub fn plan_check_line(r: &isolane_cuda::check::CheckReport) -> String {
    let limit = match r.sensitivity {
        Some(s) => format!(
            "limit {:.1e}: {} × {s:.1e}, how far rounding the weights and input to the \
             precision alone moves this model's output",
            r.tolerance,
            isolane_cuda::check::SENSITIVITY_FACTOR
        ),
        None => format!("limit {:.0e}", r.tolerance),
    };
    format!(
        "plan check passed: rel L2 {:.2e} against the CPU reference ({limit}), {:.0} ms \
         (--no-plan-check skips it)",
        r.rel_l2, r.ms
    )
}

/// A model on the GPU; a job is one CUDA graph launch and the wait for its output copy.
struct CudaExecutor {
    /// A server's input/output slots ([`Executor::prepare_slots`]); before the model so that
    /// they drop first (their drop waits for their jobs).
    slots: Option<isolane_cuda::Slots>,
    model: isolane_cuda::CudaModel,
    io: TensorNames,
    profile: Option<isolane_core::predict::MemoryProfile>,
    // Declared after the model so that it is dropped after it: the model runs on its stream.
    _group: Option<isolane_gpu::GreenGroup>,
}

impl Executor for CudaExecutor {
    fn run_job(&mut self) -> Result<(), ExecError> {
        self.model.run().map_err(|e| ExecError::Job(e.to_string()))
    }

    /// One CUDA graph per piece. A model that cannot be split (a capture fails) keeps running
    /// whole jobs: the guard then holds it only between jobs, and says so in its piece count.
    fn split(&mut self, piece_ns: i64) {
        if let Err(e) = self.model.split(piece_ns as f64 / 1e6) {
            eprintln!("cannot split the model into pieces ({e}); it runs whole jobs");
        }
    }

    fn pieces(&self) -> usize {
        self.model.pieces()
    }

    fn run_piece(&mut self, i: usize) -> Result<(), ExecError> {
        self.model
            .run_piece(i)
            .map_err(|e| ExecError::Job(e.to_string()))
    }

    /// The run's graphs launched back to back, one wait ([`isolane_cuda::CudaModel::run_pieces`]).
    fn run_pieces(&mut self, range: std::ops::Range<usize>) -> Result<(), ExecError> {
        self.model
            .run_pieces(range)
            .map_err(|e| ExecError::Job(e.to_string()))
    }

    fn persist_weights_in_l2(&mut self, mib: u64) -> Result<(), ExecError> {
        self.model
            .persist_weights_in_l2(mib)
            .map(drop)
            .map_err(|e| ExecError::Job(e.to_string()))
    }

    fn memory_profile(&self) -> Option<isolane_core::predict::MemoryProfile> {
        self.profile
    }

    /// The model's own allocations (weights, arena, workspace), exact: the free-memory drop
    /// would also count whatever the other workloads of this process allocated meanwhile.
    fn device_memory_mib(&self) -> Option<f64> {
        Some(self.model.memory().total_bytes as f64 / MIB as f64)
    }

    fn inputs(&self) -> Vec<TensorInfo> {
        self.io.inputs(&self.model)
    }

    fn outputs(&self) -> Vec<TensorInfo> {
        self.io.outputs(&self.model)
    }

    fn input_mut(&mut self, i: usize) -> Option<&mut [f32]> {
        input_of(&mut self.model, i)
    }

    fn output(&self, i: usize) -> Option<&[f32]> {
        output_of(&self.model, i)
    }

    /// Slots of their own beside the model's buffers (which `run_job` keeps using); a model
    /// split into pieces keeps one: its jobs run piece by piece under the guard.
    fn prepare_slots(&mut self, n: usize) -> usize {
        if n < 2 || self.model.pieces() > 1 {
            return 1;
        }
        if self.slots.as_ref().is_none_or(|s| s.len() < n) {
            match isolane_cuda::Slots::new(&self.model, n) {
                Ok(s) => self.slots = Some(s),
                Err(e) => {
                    eprintln!("cannot make {n} input slots ({e}); the model serves from one");
                    self.slots = None;
                }
            }
        }
        self.slots.as_ref().map_or(1, |s| s.len())
    }

    fn slot_input_mut(&mut self, slot: usize, i: usize) -> Option<&mut [f32]> {
        match &mut self.slots {
            Some(s) => s.input_mut(slot, i),
            None if slot == 0 => input_of(&mut self.model, i),
            None => None,
        }
    }

    /// Only with slots of their own: the model's own buffers are captured in its graph.
    unsafe fn slot_input_from(
        &mut self,
        slot: usize,
        i: usize,
        src: *const u8,
        len: usize,
    ) -> bool {
        match &mut self.slots {
            // SAFETY: the caller's promise (the range stays mapped until the slot's job is seen
            // done) is what `Slots::input_from` asks.
            Some(s) => unsafe { s.input_from(slot, i, src, len) },
            None => false,
        }
    }

    fn launch_slot(&mut self, slot: usize) -> Result<(), ExecError> {
        match &mut self.slots {
            Some(s) => s
                .launch(&mut self.model, slot)
                .map_err(|e| ExecError::Job(e.to_string())),
            None if slot == 0 => self.run_job(),
            None => Err(ExecError::Job(format!("input slot {slot} of 1"))),
        }
    }

    fn slot_done(&mut self, slot: usize) -> Result<bool, ExecError> {
        match &mut self.slots {
            Some(s) => s.is_done(slot).map_err(|e| ExecError::Job(e.to_string())),
            None => Ok(true),
        }
    }

    fn wait_slot(&mut self, slot: usize) -> Result<(), ExecError> {
        match &mut self.slots {
            Some(s) => s.wait(slot).map_err(|e| ExecError::Job(e.to_string())),
            None => Ok(()),
        }
    }

    fn slot_output(&self, slot: usize, i: usize) -> Option<&[f32]> {
        match &self.slots {
            Some(s) => s.output(slot, i),
            None if slot == 0 => self.output(i),
            None => None,
        }
    }
}

pub(crate) const MIB: u64 = 1 << 20;

/// Device memory of one process's CUDA context with the engine's libraries loaded (cuDNN,
/// cuBLASLt, the NVRTC module, the CUDA graph), MiB, whatever the model. Measured on the H100
/// (driver 580, CUDA 13; results/h100/e-concurrency-sweep, NVML's per-process memory of
/// timeslice workers at fp16): resnet50 at batch 1, 4, 16 took 598, 632–634, 768 MiB, whose
/// plans ([`planned_model_mib`]) are 60, 94, 228 MiB; yolov8n took 574, 658, 1000 MiB for plans
/// of 35, 120, 461 MiB. Measured minus planned is 538–540 MiB in all six: the plan follows the
/// batch exactly and this is the rest.
pub const CUDA_PROCESS_MIB: u64 = 540;

/// A workload's device memory as admission control counts it (MiB): the engine's plan of its
/// model (weights + arena + workspace cap, [`isolane_cuda::planned_memory`]). `None` for the
/// CPU backend, `spin:` models, and a model that cannot be loaded (preflight reports that one
/// with its reason).
pub fn planned_model_mib(device: &DeviceSpec, spec: &WorkloadSpec) -> Option<u64> {
    if device.backend != SpecBackend::Cuda {
        return None;
    }
    if let Some(kernel) = spec.kernel() {
        return Some(crate::kernel::device_bytes(kernel).div_ceil(MIB));
    }
    if check_name(spec).is_err() {
        return None;
    }
    // A built-in model's memory depends on its shapes only: zero weights build it in a
    // fraction of the time its seeded ones take (convnext_large: 198 M parameters).
    let graph = if is_onnx(&spec.model) {
        load_graph(spec, 0).ok()?
    } else {
        build_model(&spec.model, Weights::Zeros).ok()?
    };
    let planned =
        isolane_cuda::planned_memory(&graph, spec.batch as usize, precision(spec.precision))
            .ok()?;
    Some((planned.total_bytes() as u64).div_ceil(MIB))
}

/// A workload's memory-system demand per job (`isolane_core::predict`), computed from its
/// model's graph at its batch and precision against an L2 of `l2_bytes`
/// (`isolane_engine::traffic`): what the planner predicts interference from. `None` on the
/// CPU, for `kernel:` and `spin:` models, and for a model that cannot be loaded.
pub fn memory_profile(
    device: &DeviceSpec,
    spec: &WorkloadSpec,
    l2_bytes: u64,
) -> Option<isolane_core::predict::MemoryProfile> {
    if device.backend != SpecBackend::Cuda || spec.kernel().is_some() || check_name(spec).is_err() {
        return None;
    }
    let graph = if is_onnx(&spec.model) {
        load_graph(spec, 0).ok()?
    } else {
        build_model(&spec.model, Weights::Zeros).ok()?
    };
    profile_of(&graph, spec, l2_bytes)
}

/// [`memory_profile`] of a graph at hand (the one a model was just built from).
fn profile_of(
    graph: &Graph,
    spec: &WorkloadSpec,
    l2_bytes: u64,
) -> Option<isolane_core::predict::MemoryProfile> {
    let element_bytes = match precision(spec.precision) {
        Precision::Fp16 | Precision::Bf16 => 2,
        Precision::Fp32 | Precision::Tf32 => 4,
    };
    let t = isolane_engine::traffic::traffic(graph, spec.batch as usize, element_bytes, l2_bytes)
        .ok()?;
    Some(isolane_core::predict::MemoryProfile {
        dram_bytes_per_job: t.dram_bytes() as f64,
        resident: t.resident(),
        l2_footprint_bytes: t.l2_footprint() as f64,
        flops_per_job: t.flops,
        source: isolane_core::predict::ProfileSource::Computed,
    })
}

/// Where a model is to run, for [`check_batch_fits`].
#[derive(Debug, Clone, Copy)]
pub enum Target {
    Cpu,
    /// GPU `index` of this machine, at a precision.
    Cuda {
        gpu: u32,
        precision: Precision,
    },
}

/// Refuses a batch whose activations cannot fit this machine, before anything of its size is
/// allocated: on the CPU, the engine's lower bound of the activation arena against the host's
/// memory; on a GPU, the cuda plan's exact arena against the device's memory and the pinned
/// input and output buffers against the host's. `Err` is the reason, in words, to follow the
/// batch's name and value (`--batch 100000 needs at least ...`). A graph whose shapes cannot be
/// worked out passes: compiling it reports that, before anything of the batch's size exists.
pub fn check_batch_fits(graph: &Graph, batch: usize, target: Target) -> Result<(), String> {
    let Ok(fp) = isolane_engine::footprint::footprint(graph, batch) else {
        return Ok(());
    };
    let host = isolane_runtime::limits::host_memory_bytes();
    match target {
        Target::Cpu => {
            let need = fp.min_activation_elements.saturating_mul(4);
            // Half, as for the job records: the footprint is a lower bound of the arena, and
            // the weights, the other workloads and other processes need the rest (a crafted
            // Resize by 5000 needed 19 GB of a 24 GiB machine, passed, and took it all).
            fits(
                need,
                batch,
                host.map(|h| h / 2),
                "its activations",
                "half of this machine's memory",
            )
            // Which node of the model is too large (a crafted Pad or Resize, not the batch).
            .map_err(|reason| match &fp.busiest {
                Some(b) => format!(
                    "{reason}; the busiest is {}, {} in f32",
                    b.describe(),
                    isolane_runtime::limits::human_bytes(b.largest_elements().saturating_mul(4))
                ),
                None => reason,
            })
        }
        Target::Cuda { gpu, precision } => {
            // The host side: pinned f32 input and output buffers of the whole batch.
            let pinned = (fp.input_elements + fp.output_elements).saturating_mul(4);
            fits(
                pinned,
                batch,
                host,
                "its pinned input and output buffers",
                "this machine's memory",
            )?;
            let device = isolane_gpu::devices::list_devices()
                .ok()
                .and_then(|d| d.into_iter().find(|d| d.index == gpu))
                .map(|d| d.memory_mib.saturating_mul(1 << 20));
            let plan = isolane_engine::passes::optimize(graph, batch)
                .and_then(|g| isolane_cuda::plan::plan(&g, batch, precision));
            let Ok(plan) = plan else { return Ok(()) };
            fits(
                plan.arena_bytes as u128,
                batch,
                device,
                "its activation arena",
                &format!("GPU {gpu}'s memory"),
            )
        }
    }
}

/// `need` bytes at `batch` against `have` (unknown: not checked). The largest batch that would
/// fit is estimated from the bytes per image, which the activations are proportional to.
fn fits(
    need: u128,
    batch: usize,
    have: Option<u64>,
    what: &str,
    where_: &str,
) -> Result<(), String> {
    use isolane_runtime::limits::human_bytes;
    let Some(have) = have else { return Ok(()) };
    if need <= u128::from(have) {
        return Ok(());
    }
    let per_image = (need / batch.max(1) as u128).max(1);
    let most = u128::from(have) / per_image;
    let hint = if most >= 1 {
        format!("a batch of at most about {most} fits")
    } else {
        "not even a batch of 1 fits".to_string()
    };
    Err(format!(
        "needs at least {} for {what} ({} per image), more than {where_} ({}); {hint}",
        human_bytes(need),
        human_bytes(per_image),
        human_bytes(u128::from(have))
    ))
}

/// The graph a workload's check measures: its file's, or a built-in's with zero weights (the
/// shapes are the same, and zeros cost no time to make).
fn shape_graph(spec: &WorkloadSpec) -> Result<Graph, ExecError> {
    if reads_a_file(spec) {
        load_graph(spec, 0)
    } else {
        build_model(&spec.model, Weights::Zeros).map_err(|e| bad_model(spec, e))
    }
}

fn target(device: &DeviceSpec, spec: &WorkloadSpec) -> Target {
    match device.backend {
        SpecBackend::Cpu => Target::Cpu,
        SpecBackend::Cuda => Target::Cuda {
            gpu: device.gpu,
            precision: precision(spec.precision),
        },
    }
}

fn reads_a_file(spec: &WorkloadSpec) -> bool {
    is_onnx(&spec.model) || spec.weights.is_some()
}

impl EngineExecutors for EngineExecutorsImpl {
    fn check(&self, device: &DeviceSpec, spec: &WorkloadSpec) -> Result<(), ExecError> {
        if let Some(kernel) = crate::kernel::parse(spec)? {
            check_backend(device, spec)?;
            return crate::kernel::check(device, spec, kernel);
        }
        check_name(spec)?;
        check_backend(device, spec)?;
        if spec.precision.quantized() && is_saved_plan_path(&spec.model) {
            return Err(bad_model(
                spec,
                "precision int8 and fp8 quantize a model from its calibration folder at start; \
                 a saved plan holds a graph already compiled (save a QDQ .onnx model's plan, or \
                 give the float model here)",
            ));
        }
        // Files are read now, before any output exists, so that a corrupt ONNX file or a
        // safetensors file with a wrong or missing tensor stops the run at once; and a batch
        // that does not fit this machine is refused before it is allocated.
        let graph = if is_saved_plan_path(&spec.model) {
            // Before any output exists: a plan built for another GPU, driver, library or
            // engine is refused naming the field and both values. (A MIG instance is a device of
            // its own, which only its worker sees: there the load checks the GPU's fields.)
            let saved = load_saved(spec)?;
            if !(device.backend == SpecBackend::Cuda && device.mechanism == Mechanism::Mig) {
                saved
                    .check_key(&spec.model, &saved_key_here(device, spec)?)
                    .map_err(|e| bad_model(spec, e))?;
            }
            // Its graph, read once here, is what the batch is checked on.
            saved.graph
        } else {
            shape_graph(spec)?
        };
        check_batch_fits(&graph, spec.batch as usize, target(device, spec))
            .map_err(|reason| bad_model(spec, format!("batch = {}: {reason}", spec.batch)))?;
        if let Some(c) = spec
            .calibration
            .as_ref()
            .filter(|_| spec.precision.quantized())
        {
            // The calibration files are read now too (calibrating waits for build).
            isolane_engine::calibrate::load_calibration_set(
                Path::new(&c.dir),
                &graph,
                spec.batch as usize,
                isolane_engine::calibrate::CALIBRATION_ITEMS,
            )
            .map_err(|e| bad_model(spec, e))?;
        }
        if reads_a_file(spec) && !is_saved_plan_path(&spec.model) {
            // A worker process builds its own copy; only thread hosts can reuse this one.
            if spec.host == Host::Thread {
                if let Ok(mut cache) = self.checked.lock() {
                    cache.push((spec.model.clone(), spec.weights.clone(), graph));
                }
            }
        }
        Ok(())
    }

    fn build(
        &self,
        device: &DeviceSpec,
        spec: &WorkloadSpec,
        seed: u64,
        _index: usize,
        partition: Option<Partition>,
    ) -> Result<Box<dyn Executor>, ExecError> {
        check_backend(device, spec)?;
        if let Some(kernel) = crate::kernel::parse(spec)? {
            let group = match device.backend {
                SpecBackend::Cuda => partition.map(|p| green_group(spec, p)).transpose()?,
                SpecBackend::Cpu => None,
            };
            return crate::kernel::build(device, spec, kernel, group);
        }
        if is_saved_plan_path(&spec.model) {
            return build_saved(device, spec, seed, partition);
        }
        let cached = if reads_a_file(spec) {
            self.checked.lock().ok().and_then(|mut cache| {
                let i = cache
                    .iter()
                    .position(|(m, w, _)| *m == spec.model && *w == spec.weights)?;
                Some(cache.swap_remove(i).2)
            })
        } else {
            None
        };
        let graph = match cached {
            Some(g) => g,
            // Not read by `check` in this process (a worker, or a second workload on the same
            // file): read it once here.
            None => {
                check_name(spec)?;
                load_graph(spec, seed)?
            }
        };
        let calibrated = quantized(spec, &graph)?;
        if device.backend == SpecBackend::Cuda {
            let group = partition.map(|p| green_group(spec, p)).transpose()?;
            return build_cuda(device, spec, (&graph, calibrated.as_ref()), seed, group);
        }
        let graph = calibrated.unwrap_or(graph);
        // One engine thread per core the workload is pinned to (1 when unpinned): the pool is
        // created here, on the workload's pinned thread, so its threads inherit that affinity.
        let threads = spec.cpu.len().max(1);
        let mut model = CpuBackend::new(threads)
            .compile_cpu(&graph, spec.batch as usize, cpu_precision(spec.precision))
            .map_err(|e| build_err(spec, e))?;
        let io = TensorNames::of(&graph);
        drop(graph);
        let input = crate::seeded_input::random_normal(model.input_mut().len(), seed);
        model.input_mut().copy_from_slice(&input);
        Ok(Box::new(ModelExecutor {
            model: Box::new(model),
            io,
        }))
    }
}

/// One compiled model; a job is one forward pass over the (fixed, seeded) input batch.
struct ModelExecutor {
    model: Box<dyn CompiledModel>,
    io: TensorNames,
}

impl Executor for ModelExecutor {
    fn run_job(&mut self) -> Result<(), ExecError> {
        self.model.run().map_err(|e| ExecError::Job(e.to_string()))
    }

    fn inputs(&self) -> Vec<TensorInfo> {
        self.io.inputs(self.model.as_ref())
    }

    fn outputs(&self) -> Vec<TensorInfo> {
        self.io.outputs(self.model.as_ref())
    }

    fn input_mut(&mut self, i: usize) -> Option<&mut [f32]> {
        input_of(self.model.as_mut(), i)
    }

    fn output(&self, i: usize) -> Option<&[f32]> {
        output_of(self.model.as_ref(), i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use isolane_core::spec::{NoBuiltinModels, Scenario};

    fn fixture(name: &str) -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../isolane-engine/tests/fixtures/onnx")
            .join(name)
    }

    fn run_once(e: &EngineExecutorsImpl, device: &DeviceSpec, w: &WorkloadSpec) -> Vec<f32> {
        e.check(device, w).unwrap();
        let mut x = e.build(device, w, 7, 0, None).unwrap();
        x.run_job().unwrap();
        x.output(0).unwrap().to_vec()
    }

    #[test]
    fn built_ins_are_checked_against_the_cpu_only_as_mps_clients_with_part_of_the_threads() {
        let text = format!(
            "[[workload]]\nname = \"v\"\nmodel = \"{}\"\nrate_hz = 5\njobs = 1\n",
            fixture("tiny_cnn_op14.onnx").display()
        );
        let s = Scenario::from_toml_str(&text, Path::new("s.toml"), &NoBuiltinModels).unwrap();
        let onnx = s.workloads[0].clone();
        let built_in = &WorkloadSpec {
            model: "vit_b_16".into(),
            ..onnx.clone()
        };
        let opts = |pct: Option<&str>| {
            isolane_cuda::BuildOptions::from_vars(|k| {
                (k == "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE").then(|| pct.map(str::to_string))?
            })
        };
        let (whole, mps_all, mps_part) = (opts(None), opts(Some("100")), opts(Some("30")));
        assert!(!checks_against_cpu(built_in, &whole));
        assert!(!checks_against_cpu(built_in, &mps_all));
        assert!(checks_against_cpu(built_in, &mps_part));
        assert!(checks_against_cpu(&onnx, &whole) && checks_against_cpu(&onnx, &mps_part));
        // `plan_check = false` (or --no-plan-check) turns it off everywhere.
        let off = |w: &WorkloadSpec| WorkloadSpec {
            plan_check: false,
            ..w.clone()
        };
        assert!(!checks_against_cpu(&off(built_in), &mps_part));
        assert!(!checks_against_cpu(&off(&onnx), &whole));
    }

    #[test]
    fn an_int8_workload_runs_its_model_quantized_from_the_calibration_folder() {
        let dir = std::env::temp_dir().join(format!("isolane-int8-{}", std::process::id()));
        let cal = dir.join("cal");
        std::fs::create_dir_all(&cal).unwrap();
        std::fs::copy(fixture("tiny_cnn_op14.input.npy"), cal.join("a.npy")).unwrap();
        let text = format!(
            "[[workload]]\nname = \"q\"\nmodel = \"{}\"\nprecision = \"int8\"\n\
             calibration = \"cal\"\nrate_hz = 5\njobs = 1\n",
            fixture("tiny_cnn_op14.onnx").display()
        );
        let s = Scenario::from_toml_str(&text, dir.join("s.toml"), &NoBuiltinModels).unwrap();
        let (device, w) = (&s.device, &s.workloads[0]);
        let e = EngineExecutorsImpl::default();
        let q = run_once(&e, device, w);
        let float = WorkloadSpec {
            precision: SpecPrecision::Fp32,
            calibration: None,
            ..w.clone()
        };
        let f = run_once(&e, device, &float);
        // Quantized: near the float model's answer, not equal to it.
        let (num, den) = q.iter().zip(&f).fold((0f64, 0f64), |(n, d), (a, b)| {
            (n + ((a - b) as f64).powi(2), d + (*b as f64).powi(2))
        });
        let rel = (num / den).sqrt();
        assert!(rel > 1e-5 && rel < 0.1, "relative L2 {rel}");
        // Calibrated: on cuda its float steps may run plain fp16; the float model is not.
        let g = load_graph(w, 7).unwrap();
        assert!(quantized(w, &g).unwrap().is_some());
        assert!(quantized(&float, &g).unwrap().is_none());
        // A calibration file of another shape stops the run at check, naming the file.
        std::fs::write(
            cal.join("b.npy"),
            isolane_engine::io::npy::encode_npy(&[3, 5, 5], &[0.0; 75]),
        )
        .unwrap();
        let err = e.check(device, w).unwrap_err();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(matches!(err, ExecError::BadModel { .. }), "{err}");
        assert!(err.to_string().contains("b.npy"), "{err}");
    }

    /// A workload's `calibration_skips` reaches the calibration's options with its method:
    /// quantized unless written `"float"`; `--calibration-skips` takes the same two names.
    #[test]
    fn calibration_skips_reach_the_calibration_options() {
        use isolane_engine::calibrate::CalibMethod;
        use isolane_engine::quant::QuantType;
        let options = |extra: &str| {
            let text = format!(
                "[[workload]]\nname = \"q\"\nmodel = \"{}\"\nprecision = \"fp8\"\n\
                 calibration = \".\"\ncalibration_method = \"minmax\"\n{extra}rate_hz = 5\n\
                 jobs = 1\n",
                fixture("tiny_cnn_op14.onnx").display()
            );
            let at = std::env::temp_dir().join("s.toml");
            let s = Scenario::from_toml_str(&text, at, &NoBuiltinModels).unwrap();
            let c = s.workloads[0].calibration.clone().unwrap();
            calib_options(QuantType::Float8E4M3Fn, &c)
        };
        let quantized = options("");
        assert!(quantized.residual_skips);
        assert_eq!(quantized.method, CalibMethod::MinMax);
        assert_eq!(quantized.qtype, QuantType::Float8E4M3Fn);
        let float = options("calibration_skips = \"float\"\n");
        assert!(!float.residual_skips);
        assert_eq!(float.method, CalibMethod::MinMax);
        assert!(options("calibration_skips = \"quantized\"\n").residual_skips);

        assert_eq!(residual_skips(None), Ok(true));
        assert_eq!(residual_skips(Some("quantized")), Ok(true));
        assert_eq!(residual_skips(Some("float")), Ok(false));
        assert_eq!(
            residual_skips(Some("bytes")),
            Err("--calibration-skips bytes: expected quantized or float".to_string())
        );
        assert_eq!(
            (skips_name(true), skips_name(false)),
            ("quantized", "float")
        );
    }

    /// A served model is loaded again from its file at each `ctl load`: a file that has become
    /// a link to /dev/zero, or a FIFO, is the user's error naming it (once reading it took all
    /// of memory; a FIFO blocked the reload for good).
    #[test]
    fn a_model_file_that_became_a_device_or_a_fifo_is_refused_on_reload() {
        let d = std::env::temp_dir().join(format!("isolane-reload-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let plan = d.join("live.isoplan");
        std::os::unix::fs::symlink("/dev/zero", &plan).unwrap();
        let onnx = d.join("live.onnx");
        assert!(std::process::Command::new("mkfifo")
            .arg(&onnx)
            .status()
            .unwrap()
            .success());
        for (model, what) in [(&plan, "a character device"), (&onnx, "a FIFO")] {
            let text = format!(
                "[[workload]]\nname = \"m\"\nmodel = \"{}\"\nrate_hz = 5\njobs = 1\n",
                fixture("tiny_cnn_op14.onnx").display()
            );
            let s = Scenario::from_toml_str(&text, d.join("s.toml"), &NoBuiltinModels).unwrap();
            let w = WorkloadSpec {
                model: model.display().to_string(),
                ..s.workloads[0].clone()
            };
            let err = load_graph(&w, 7).unwrap_err();
            assert!(matches!(err, ExecError::BadModel { .. }), "{err}");
            std::fs::remove_file(model).unwrap();
            let e = err.to_string();
            assert!(
                e.contains("live.") && e.contains(&format!("is {what}")),
                "{e}"
            );
            assert_eq!(e.matches("workload `m`").count(), 1, "{e}");
        }
        std::fs::remove_dir_all(&d).unwrap();
    }
}
