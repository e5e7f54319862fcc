//! Saved plans on the cuda backend (`isolane build`, docs/cuda.md "Saved plans").
//!
//! A build records every choice it makes among timed candidates ([`ChoiceLog`]): per
//! convolution the path (a legacy cuDNN algorithm and math type, a cuDNN graph-API execution
//! plan as cuDNN serialises it, or the im2col + cuBLASLt GEMM path), per cuBLASLt matmul shape
//! the algorithm (`cublasLtMatmulAlgo_t`, which cuBLASLt documents as serialisable for the same
//! library version), and per depthwise convolution, attention and LayerNorm the kernel picked.
//! A load replays them: the same plan is made from the saved fused graph, and each choice is
//! taken from the file instead of timed (cuBLASLt's algorithm checked by
//! `cublasLtMatmulAlgoCheck`, cuDNN's workspace asked of cuDNN), so nothing is timed, and the
//! libraries are told the SM count the build saw ([`SmTargets`]). The file's key holds what
//! the choices are valid for (GPU, compute capability, driver, cuDNN, cuBLASLt and NVRTC
//! versions, engine revision, the cuda part's format); a load anywhere else is refused.
//!
//! At build time the model runs once on a seeded input and the bits of each output are kept
//! (their hash); a load runs the same input and refuses a model whose bits differ, so a loaded
//! plan is known to compute what the built one did (whose outputs the plan check compared with
//! the CPU reference).

use cudarc::cublaslt::sys as lt;
use cudarc::cudnn::sys as dnn;
use cudarc::driver::sys as cu;
use cudarc::nvrtc::sys as rtc;
use isolane_engine::saved::{self as file, Reader, SavedPlan, Writer};
use isolane_engine::{passes, CompiledModel, EngineError, Graph, Precision, Result};

use crate::error::{cu_check, rtc_check};
use crate::{model, plan, CudaBackend, CudaModel};

/// One choice a build made among timed candidates, in the order the build meets them.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Choice {
    /// The index among a step's candidate kernels (depthwise, attention, LayerNorm).
    Pick(u32),
    /// A convolution by cuDNN's legacy API: `cudnnConvolutionFwdAlgo_t`, `cudnnMathType_t`.
    ConvLegacy { algo: u32, math: u32 },
    /// A convolution by a cuDNN graph-API execution plan, as cuDNN serialises it.
    ConvGraph {
        json: String,
        engine: i64,
        fused: bool,
        bias: bool,
        residual: bool,
    },
    /// A convolution by im2col + a cuBLASLt GEMM (its algorithm is a matmul choice).
    ConvGemm,
    /// A convolution by isolane's direct kernel for inputs of few channels (`conv_stem_*`).
    ConvStem,
    /// A choice that cannot be saved (why): the build goes on, saving it is refused.
    Unsaveable(String),
}

/// The choices of one build: recorded, or replayed from a saved plan.
#[derive(Debug, Default)]
pub(crate) struct ChoiceLog {
    replay: bool,
    /// Choices are kept (for a saved plan); otherwise (every other build) nothing is noted,
    /// and no choice is serialised.
    recording: bool,
    steps: Vec<Choice>,
    next: usize,
    /// cuBLASLt algorithms by matmul shape (the build's own algorithm cache's key).
    pub(crate) matmuls: Vec<(String, [u64; 8])>,
    /// The SM count the libraries are told to split their work for ([`SmTargets`]): a replay's
    /// is the build's; 0 until the build asks the device.
    pub(crate) sm_count: u32,
}

impl ChoiceLog {
    /// A log that keeps the build's choices.
    pub(crate) fn record() -> ChoiceLog {
        ChoiceLog {
            recording: true,
            ..ChoiceLog::default()
        }
    }

    /// A log that neither keeps nor gives choices: a build that is not saved.
    pub(crate) fn none() -> ChoiceLog {
        ChoiceLog::default()
    }

    /// Whether choices are kept.
    pub(crate) fn recording(&self) -> bool {
        self.recording
    }

    pub(crate) fn replay(
        steps: Vec<Choice>,
        matmuls: Vec<(String, [u64; 8])>,
        sm_count: u32,
    ) -> ChoiceLog {
        ChoiceLog {
            replay: true,
            recording: false,
            steps,
            next: 0,
            matmuls,
            sm_count,
        }
    }

    pub(crate) fn replaying(&self) -> bool {
        self.replay
    }

    /// Records a choice (nothing while replaying: the choice came from the log). Returns its
    /// place in the log where it was kept, for [`ChoiceLog::renote`].
    pub(crate) fn note(&mut self, c: Choice) -> Option<usize> {
        if self.recording {
            self.steps.push(c);
            return Some(self.steps.len() - 1);
        }
        None
    }

    /// Replaces the choice noted at `at` (a later, whole-model decision overrode a step's own:
    /// the quantized products' all-graph chain, `quant_gemm::keep_faster_whole`), so that a
    /// saved plan replays what the build kept.
    pub(crate) fn renote(&mut self, at: usize, c: Choice) {
        if let Some(slot) = self.steps.get_mut(at) {
            *slot = c;
        }
    }

    /// While replaying, the next choice (for `what`, named in errors); `None` while recording.
    pub(crate) fn take(&mut self, what: &str) -> Result<Option<Choice>> {
        if !self.replay {
            return Ok(None);
        }
        let c = self.steps.get(self.next).cloned().ok_or_else(|| {
            stale(format!(
                "it has {} choices and the plan made here needs more (at {what})",
                self.steps.len()
            ))
        })?;
        self.next += 1;
        Ok(Some(c))
    }

    /// While replaying, the saved index among `n` candidates of `what`.
    pub(crate) fn pick(&mut self, n: usize, what: &str) -> Result<Option<usize>> {
        match self.take(what)? {
            None => Ok(None),
            Some(Choice::Pick(i)) if (i as usize) < n => Ok(Some(i as usize)),
            Some(c) => Err(stale(format!(
                "at {what} (one of {n} kernels) it holds {c:?}"
            ))),
        }
    }

    /// While replaying, the saved algorithm of a matmul shape.
    pub(crate) fn matmul(&self, shape_key: &str) -> Option<lt::cublasLtMatmulAlgo_t> {
        self.matmuls
            .iter()
            .find(|(k, _)| k == shape_key)
            .map(|(_, data)| lt::cublasLtMatmulAlgo_t { data: *data })
    }

    /// Every saved choice was used (a replay that used fewer made another plan).
    pub(crate) fn finish(&self) -> Result<()> {
        if self.replay && self.next != self.steps.len() {
            return Err(stale(format!(
                "it has {} choices and the plan made here used {}",
                self.steps.len(),
                self.next
            )));
        }
        Ok(())
    }
}

/// A saved plan whose choices do not fit the plan made from its graph: a file written by
/// another engine that kept the revision, or damaged in a way the checksum missed.
fn stale(msg: String) -> EngineError {
    EngineError::InvalidArgument(format!(
        "the saved plan's choices do not fit the plan made from its graph: {msg}; build it \
         again with `isolane build`"
    ))
}

/// The cuda backend's part of a saved plan.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct CudaPart {
    pub channels_last: bool,
    pub fused_attention: bool,
    /// The build options that change a step's launches without a timed choice
    /// (`depthwise_pairs`, `block_rows`, `exact_gelu`): a load records with the build's.
    pub depthwise_pairs: bool,
    pub block_rows: bool,
    pub exact_gelu: bool,
    pub steps: Vec<Choice>,
    pub matmuls: Vec<(String, [u64; 8])>,
    /// The SM count the build's cuBLASLt matmuls (and cuDNN's heuristics) split their work
    /// for: the SMs its device reported. A load sets it again ([`SmTargets`]).
    pub sm_count: u32,
    /// [`file::bits_hash`] of each output of the check run ([`probe_input`]).
    pub outputs: Vec<String>,
    /// [`file::bits_hash`] of each value the plan stores, in the plan's order, on the same
    /// input run step by step ([`crate::check::value_bits`]): where a load's outputs differ,
    /// the first of these that differs names the node whose kernel computed other bits.
    pub values: Vec<String>,
}

impl CudaPart {
    pub(crate) fn to_bytes(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.bool(self.channels_last);
        w.bool(self.fused_attention);
        w.bool(self.depthwise_pairs);
        w.bool(self.block_rows);
        w.bool(self.exact_gelu);
        w.usize(self.steps.len());
        for c in &self.steps {
            match c {
                Choice::Pick(i) => {
                    w.u8(0);
                    w.u32(*i)
                }
                Choice::ConvLegacy { algo, math } => {
                    w.u8(1);
                    w.u32(*algo);
                    w.u32(*math);
                }
                Choice::ConvGraph {
                    json,
                    engine,
                    fused,
                    bias,
                    residual,
                } => {
                    w.u8(2);
                    w.str(json);
                    w.i64(*engine);
                    w.bool(*fused);
                    w.bool(*bias);
                    w.bool(*residual);
                }
                Choice::ConvGemm => w.u8(3),
                Choice::ConvStem => w.u8(5),
                Choice::Unsaveable(why) => {
                    w.u8(4);
                    w.str(why)
                }
            }
        }
        w.usize(self.matmuls.len());
        for (k, data) in &self.matmuls {
            w.str(k);
            data.iter().for_each(|&d| w.u64(d));
        }
        w.u32(self.sm_count);
        w.usize(self.outputs.len());
        self.outputs.iter().for_each(|h| w.str(h));
        w.usize(self.values.len());
        self.values.iter().for_each(|h| w.str(h));
        w.into_bytes()
    }

    pub(crate) fn from_bytes(b: &[u8]) -> std::result::Result<CudaPart, String> {
        let mut r = Reader::new(b);
        let channels_last = r.bool()?;
        let fused_attention = r.bool()?;
        let depthwise_pairs = r.bool()?;
        let block_rows = r.bool()?;
        let exact_gelu = r.bool()?;
        let n = r.count(1)?;
        let mut steps = Vec::with_capacity(n);
        for _ in 0..n {
            steps.push(match r.u8()? {
                0 => Choice::Pick(r.u32()?),
                1 => Choice::ConvLegacy {
                    algo: r.u32()?,
                    math: r.u32()?,
                },
                2 => Choice::ConvGraph {
                    json: r.str()?,
                    engine: r.i64()?,
                    fused: r.bool()?,
                    bias: r.bool()?,
                    residual: r.bool()?,
                },
                3 => Choice::ConvGemm,
                4 => Choice::Unsaveable(r.str()?),
                5 => Choice::ConvStem,
                t => return Err(format!("an unknown kind of choice {t}")),
            });
        }
        let n = r.count(8 + 64)?;
        let mut matmuls = Vec::with_capacity(n);
        for _ in 0..n {
            let k = r.str()?;
            let mut data = [0u64; 8];
            for d in &mut data {
                *d = r.u64()?;
            }
            matmuls.push((k, data));
        }
        let sm_count = r.u32()?;
        if sm_count == 0 {
            return Err("an SM count target of 0".into());
        }
        let n = r.count(8)?;
        let outputs = (0..n)
            .map(|_| r.str())
            .collect::<std::result::Result<_, _>>()?;
        let n = r.count(8)?;
        let values = (0..n)
            .map(|_| r.str())
            .collect::<std::result::Result<_, _>>()?;
        r.end()?;
        Ok(CudaPart {
            channels_last,
            fused_attention,
            depthwise_pairs,
            block_rows,
            exact_gelu,
            steps,
            matmuls,
            sm_count,
            outputs,
            values,
        })
    }
}

/// The version of the cuda part's layout ([`CudaPart::to_bytes`]), a field of the key so that
/// a file of another layout is refused naming it (exit 2) rather than misread. 2: session 23
/// (the SM count target); 3: session 28 (each stored value's bits).
pub const CUDA_PART_FORMAT: u32 = 3;

/// The key field holding [`CUDA_PART_FORMAT`].
pub const FIELD_CUDA_FORMAT: &str = "cuda plan format";

/// The SM counts a build or a load tells the libraries to split their work for.
///
/// cuBLASLt sizes some kernels' grids (split-K, stream-K, persistent tiles) by the SMs it
/// thinks it has, which is what the device reports unless `CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET`
/// says otherwise; an MPS client's device reports its thread share's SMs (38 of 132 at 25 % on
/// the H200). A saved plan's matmuls computed other bits at 30 % than on the whole GPU
/// (session 22), so a load tells every matmul the build's count. cuDNN's heuristics take a
/// target too (`CUDNN_ATTR_ENGINEHEUR_SM_COUNT_TARGET`, "SM carveout"), but set at all they may
/// offer only the engines that support a carveout: it is set only where the count differs from
/// the device's, so a build's candidates stay what they were.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SmTargets {
    /// Every cuBLASLt matmul descriptor's `SM_COUNT_TARGET`.
    pub matmul: i32,
    /// cuDNN's heuristics' `SM_COUNT_TARGET`, where the device reports another count.
    pub cudnn_heuristics: Option<i32>,
}

impl SmTargets {
    /// `saved`: a replayed plan's count (0 for a build: the device's own); `reported`: the SMs
    /// this device reports here.
    pub(crate) fn new(saved: u32, reported: u32) -> SmTargets {
        let target = if saved == 0 { reported } else { saved };
        SmTargets {
            matmul: target as i32,
            cudnn_heuristics: (target != reported).then_some(target as i32),
        }
    }
}

/// The legacy convolution algorithm numbered `v` (`None` past cuDNN's enum).
pub(crate) fn conv_algo(v: u32) -> Option<dnn::cudnnConvolutionFwdAlgo_t> {
    use dnn::cudnnConvolutionFwdAlgo_t as F;
    [
        F::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
        F::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM,
        F::CUDNN_CONVOLUTION_FWD_ALGO_GEMM,
        F::CUDNN_CONVOLUTION_FWD_ALGO_DIRECT,
        F::CUDNN_CONVOLUTION_FWD_ALGO_FFT,
        F::CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING,
        F::CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD,
        F::CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED,
    ]
    .into_iter()
    .find(|a| *a as u32 == v)
}

/// The cuDNN math type numbered `v`.
pub(crate) fn math_type(v: u32) -> Option<dnn::cudnnMathType_t> {
    use dnn::cudnnMathType_t as M;
    [
        M::CUDNN_DEFAULT_MATH,
        M::CUDNN_TENSOR_OP_MATH,
        M::CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION,
        M::CUDNN_FMA_MATH,
    ]
    .into_iter()
    .find(|m| *m as u32 == v)
}

/// The key fields of the GPU at `dev` and the libraries loaded here: what a saved plan's
/// choices are valid for. No SM count: an MPS client's device reports its thread share's SMs
/// (38 of 132 at 25 % on the H200, session 20), and a plan is meant to load in any partition of
/// the GPU; a load's check run refuses one whose bits differ wherever it is.
pub fn gpu_key_of(dev: cu::CUdevice) -> Result<Vec<(String, String)>> {
    let mut name = [0u8; 256];
    // SAFETY: the buffer holds 256 bytes, its length is passed; the driver is initialised.
    cu_check("cuDeviceGetName", unsafe {
        cu::cuDeviceGetName(name.as_mut_ptr() as *mut std::ffi::c_char, 256, dev)
    })?;
    let name = String::from_utf8_lossy(&name[..name.iter().position(|&b| b == 0).unwrap_or(0)])
        .into_owned();
    let attr = |a: cu::CUdevice_attribute| -> Result<i32> {
        let mut v = 0;
        // SAFETY: valid out-pointer and device.
        cu_check("cuDeviceGetAttribute", unsafe {
            cu::cuDeviceGetAttribute(&mut v, a, dev)
        })?;
        Ok(v)
    };
    use cu::CUdevice_attribute as At;
    let cc = (
        attr(At::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
        attr(At::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
    );
    let mut driver = 0;
    // SAFETY: valid out-pointer.
    cu_check("cuDriverGetVersion", unsafe {
        cu::cuDriverGetVersion(&mut driver)
    })?;
    let (mut vmaj, mut vmin) = (0, 0);
    // SAFETY: valid out-pointers; NVRTC is loaded (libs::ensure_all).
    rtc_check("nvrtcVersion", unsafe {
        rtc::nvrtcVersion(&mut vmaj, &mut vmin)
    })?;
    // SAFETY: plain version queries of loaded libraries.
    let (cudnn, cublaslt) = unsafe { (dnn::cudnnGetVersion(), lt::cublasLtGetVersion()) };
    Ok(vec![
        ("GPU".into(), name),
        ("compute capability".into(), format!("{}.{}", cc.0, cc.1)),
        ("driver".into(), driver.to_string()),
        ("cuDNN".into(), cudnn.to_string()),
        ("cuBLASLt".into(), cublaslt.to_string()),
        ("NVRTC".into(), format!("{vmaj}.{vmin}")),
        (
            file::FIELD_ENGINE.into(),
            format!("cuda {}", crate::ENGINE_REVISION),
        ),
    ])
}

/// [`gpu_key_of`] for device `index`, without a context (the check before a run).
pub fn gpu_key(index: u32) -> Result<Vec<(String, String)>> {
    crate::libs::ensure_all().map_err(EngineError::Runtime)?;
    isolane_gpu::driver::init().map_err(crate::error::from_gpu)?;
    gpu_key_of(isolane_gpu::driver::device(index).map_err(crate::error::from_gpu)?)
}

/// What a plan for `precision` and `batch` on this GPU must have in its key.
pub fn expected_key(
    gpu: Vec<(String, String)>,
    precision: Precision,
    batch: usize,
) -> Vec<(String, String)> {
    let mut key = vec![
        (file::FIELD_DEVICE.to_string(), "cuda".to_string()),
        (file::FIELD_PRECISION.into(), precision.as_str().into()),
        (file::FIELD_BATCH.into(), batch.to_string()),
    ];
    key.extend(gpu);
    key.push((FIELD_CUDA_FORMAT.into(), CUDA_PART_FORMAT.to_string()));
    key
}

/// The check run's input `i` of `n` elements: fixed values in [-1, 1), the same at build and
/// at load.
pub fn probe_input(i: usize, n: usize) -> Vec<f32> {
    (0..n)
        .map(|j| ((j.wrapping_mul(2_654_435_761) ^ (i * 97)) % 2000) as f32 / 1000.0 - 1.0)
        .collect()
}

/// The check input ([`probe_input`]) for each of `m`'s inputs.
fn probe_inputs(m: &mut CudaModel) -> Vec<Vec<f32>> {
    (0..m.num_inputs())
        .map(|i| probe_input(i, m.input_mut_at(i).len()))
        .collect()
}

/// Runs the check input through `m` and returns each output's [`file::bits_hash`].
fn probe(m: &mut CudaModel) -> Result<Vec<String>> {
    let inputs = probe_inputs(m);
    let outputs = crate::check::StepRunner::run_plan(m, &inputs)?;
    Ok(outputs.iter().map(|o| file::bits_hash(o)).collect())
}

/// The bits of each value `m`'s plan stores ([`crate::check::value_bits`]) on the check input.
fn probe_values(m: &mut CudaModel, probes: &[plan::Probe]) -> Result<Vec<String>> {
    let inputs = probe_inputs(m);
    crate::check::value_bits(probes, &inputs, m)
}

impl CudaBackend {
    /// The key fields of this backend's GPU ([`gpu_key_of`]).
    pub fn gpu_key(&self) -> Result<Vec<(String, String)>> {
        model::make_current(self.ctx)?;
        let mut dev: cu::CUdevice = 0;
        // SAFETY: valid out-pointer, a context is current.
        cu_check("cuCtxGetDevice", unsafe { cu::cuCtxGetDevice(&mut dev) })?;
        gpu_key_of(dev)
    }

    pub(crate) fn target(&self) -> model::Target {
        model::Target {
            ctx: self.ctx,
            stream: self.stream,
            build: self.build,
            keep: self
                ._owned
                .clone()
                .map(|o| o as std::sync::Arc<dyn std::any::Any + Send + Sync>),
            barred: Vec::new(),
        }
    }

    /// Compiles `graph` as [`CudaBackend::compile_cuda`] does (plan check included) and
    /// returns the model with its saved plan (`model` and its hash name the source in the
    /// key). Refused where a choice cannot be saved.
    pub fn build_saved(
        &self,
        graph: &Graph,
        model_name: &str,
        batch: usize,
        precision: Precision,
    ) -> Result<(CudaModel, SavedPlan)> {
        if batch == 0 {
            return Err(EngineError::InvalidArgument(
                "batch must be at least 1".into(),
            ));
        }
        let g = passes::optimize(graph, batch)?;
        let opts = self.plan_options(batch, precision)?;
        let p = plan::plan_with(&g, batch, precision, opts)?;
        let ((mut m, log), report) = crate::rebuild::build_checked(
            |barred| {
                let target = self.target().barring(barred);
                CudaModel::build_logged(p.clone(), &target, ChoiceLog::record())
            },
            |(m, _)| crate::check_model(m, graph, &g, &p, batch),
            |(m, _), steps| m.conv_paths_in(steps),
            &mut |note| eprintln!("{note}"),
        )?;
        m.set_plan_check(report);
        if let Some(Choice::Unsaveable(why)) = log
            .steps
            .iter()
            .find(|c| matches!(c, Choice::Unsaveable(_)))
        {
            return Err(EngineError::Unsupported(format!(
                "this plan cannot be saved: {why}"
            )));
        }
        let outputs = probe(&mut m)?;
        let values = probe_values(&mut m, &p.probes)?;
        let part = CudaPart {
            channels_last: opts.channels_last,
            fused_attention: opts.fused_attention,
            depthwise_pairs: self.build.depthwise_pairs,
            block_rows: self.build.block_rows,
            exact_gelu: self.build.exact_gelu,
            steps: log.steps,
            matmuls: log.matmuls,
            sm_count: log.sm_count,
            outputs,
            values,
        };
        let mut key = expected_key(self.gpu_key()?, precision, batch);
        key.push((file::FIELD_MODEL.into(), model_name.into()));
        key.push((file::FIELD_MODEL_HASH.into(), file::model_hash(graph)));
        Ok((
            m,
            SavedPlan {
                key,
                graph: g,
                backend: part.to_bytes(),
            },
        ))
    }

    /// The model of a saved plan, for `precision` and `batch` (the caller's, checked against
    /// the key with this GPU's fields), its choices replayed, nothing timed; `file` names it in
    /// errors. A model whose outputs on the check input differ in any bit from the built one's
    /// is refused as the user's to build again here (`InvalidArgument`, exit code 2): what
    /// `infer --model F.isoplan` and `bench` ask for, a plan named to run with its bits.
    pub fn load_saved(
        &self,
        saved: &SavedPlan,
        file: &str,
        batch: usize,
        precision: Precision,
    ) -> Result<CudaModel> {
        match self.load_checked(saved, file, batch, precision)? {
            Checked::Same(m) => Ok(m),
            Checked::Unfit(why) => Err(EngineError::InvalidArgument(why)),
            Checked::OtherBits(why, _) => Err(EngineError::InvalidArgument(format!(
                "{why}; build the plan again here (`isolane build` in this partition), or name \
                 the model instead of the plan"
            ))),
        }
    }

    /// [`CudaBackend::load_saved`], except that a plan that cannot take the build's bits here
    /// still runs, said once on stderr naming the file and why: for a workload's `.isoplan`
    /// in `run` and `serve`, which must run rather than fail because the file was built
    /// elsewhere. A plan whose outputs differ here in some bit is kept if its plan check
    /// against the CPU reference passes here (its choices replayed, nothing rebuilt); one that
    /// fails it, or whose choices this partition cannot take, is built again here from the
    /// plan's graph (its choices timed here, its plan checked). Every other refusal (a key for
    /// another GPU, precision or batch; a damaged file; memory this GPU lacks) is an error.
    pub fn load_saved_or_build(
        &self,
        saved: &SavedPlan,
        file: &str,
        batch: usize,
        precision: Precision,
    ) -> Result<CudaModel> {
        or_build(
            || self.load_checked(saved, file, batch, precision),
            |m| self.check_loaded(m, saved, file, batch, precision),
            || self.build_from_saved(saved, file, batch, precision),
            &mut |note| eprintln!("{note}"),
        )
    }

    /// The plan check of a loaded model against the CPU reference of the plan's graph.
    fn check_loaded(
        &self,
        m: &mut CudaModel,
        saved: &SavedPlan,
        file: &str,
        batch: usize,
        precision: Precision,
    ) -> Result<()> {
        let (_, p) = saved_plan(saved, file, batch, precision)?;
        plan_check(m, saved, &p, batch)
    }

    /// The target a saved plan's model is built for here: this backend's, with the build
    /// options the plan was made with.
    fn saved_target(&self, part: &CudaPart) -> model::Target {
        let mut target = self.target();
        target.build.depthwise_pairs = part.depthwise_pairs;
        target.build.block_rows = part.block_rows;
        target.build.exact_gelu = part.exact_gelu;
        target
    }

    /// The saved plan's model, its choices replayed, and whether its outputs' bits are the
    /// build's.
    fn load_checked(
        &self,
        saved: &SavedPlan,
        file: &str,
        batch: usize,
        precision: Precision,
    ) -> Result<Checked<CudaModel>> {
        let here = expected_key(self.gpu_key()?, precision, batch);
        saved
            .check_key(file, &here)
            .map_err(|e| EngineError::InvalidArgument(e.to_string()))?;
        let (part, p) = saved_plan(saved, file, batch, precision)?;
        let log = ChoiceLog::replay(part.steps.clone(), part.matmuls.clone(), part.sm_count);
        let probes = p.probes.clone();
        let mut m = match CudaModel::build_logged(p, &self.saved_target(&part), log) {
            Ok((m, _)) => m,
            // Memory this GPU lacks, not a fault of the plan: exit 3 as for any build.
            Err(e @ EngineError::OutOfMemory(_)) => return Err(e),
            // A choice this GPU or partition cannot take (an engine cuDNN does not offer here,
            // a cluster shape a small green context cannot place).
            Err(e) => return Ok(Checked::Unfit(format!("saved plan `{file}`: {e}"))),
        };
        let got = probe(&mut m)?;
        let Some(i) = first_other_bits(&part.outputs, &got) else {
            return Ok(Checked::Same(m));
        };
        let here_sms = model::device_sm_count()?;
        // Only to name the node: a failure here leaves the load as it was, said.
        let named = match probe_values(&mut m, &probes) {
            Ok(values) => crate::check::first_other_value(&part.values, &values, &probes),
            Err(e) => format!("no node could be named: {e}"),
        };
        let why = format!(
            "saved plan `{file}`: output {i} computes other bits here than where the plan was \
             built (bits {} there, {} here; its device reported {} SMs, this one {here_sms}, the \
             libraries were told {}; {}): a library kernel's result depends on where it runs \
             (docs/cuda.md, Saved plans)",
            part.outputs.get(i).map_or("(none)", String::as_str),
            got.get(i).map_or("(none)", String::as_str),
            part.sm_count,
            part.sm_count,
            named
        );
        Ok(Checked::OtherBits(why, m))
    }

    /// The model of a saved plan's graph built here as a compile would (the plan's layout and
    /// build options, every choice timed here), checked against the CPU reference of that
    /// graph.
    fn build_from_saved(
        &self,
        saved: &SavedPlan,
        file: &str,
        batch: usize,
        precision: Precision,
    ) -> Result<CudaModel> {
        let (part, p) = saved_plan(saved, file, batch, precision)?;
        let (mut m, report) = crate::rebuild::build_checked(
            |barred| CudaModel::build(p.clone(), &self.saved_target(&part).barring(barred)),
            |m| crate::check_model(m, &saved.graph, &saved.graph, &p, batch),
            |m, steps| m.conv_paths_in(steps),
            &mut |note| eprintln!("{note}"),
        )?;
        m.set_plan_check(report);
        Ok(m)
    }
}

/// The cuda part of `saved` and the plan made from its graph in the build's layout and
/// attention form (`file` names it in errors).
fn saved_plan(
    saved: &SavedPlan,
    file: &str,
    batch: usize,
    precision: Precision,
) -> Result<(CudaPart, plan::Plan)> {
    let part = read_part(saved, file)?;
    let opts = plan::PlanOptions {
        channels_last: part.channels_last,
        fused_attention: part.fused_attention,
    };
    let p = plan::plan_with(&saved.graph, batch, precision, opts)?;
    Ok((part, p))
}

/// The plan check of a saved plan's model here, against the CPU reference of the plan's graph.
fn plan_check(m: &mut CudaModel, saved: &SavedPlan, p: &plan::Plan, batch: usize) -> Result<()> {
    let report =
        crate::check_model(m, &saved.graph, &saved.graph, p, batch).map_err(|f| f.error)?;
    m.set_plan_check(report);
    Ok(())
}

/// A replayed saved plan: its outputs' bits are the build's, or not, or its choices could not
/// be replayed here (why, naming the file).
enum Checked<M> {
    Same(M),
    OtherBits(String, M),
    Unfit(String),
}

/// The index of the first output whose bits differ from the build's (or that the build did
/// not have, or that is missing here).
fn first_other_bits(built: &[String], here: &[String]) -> Option<usize> {
    (0..built.len().max(here.len())).find(|&i| built.get(i) != here.get(i))
}

/// The loaded model where its bits are the build's, or where they differ but `check` (the
/// plan check against the CPU reference) passes; else the model `build` makes. Each is said
/// once through `note`. A load's error is returned as it is, and nothing is built.
///
/// Why a loaded model with other bits is checked rather than built again: a model built here
/// computes other bits than the build's as well, so building gains no bits, and a load that
/// passes the check starts in the load's time instead of a build's.
fn or_build<M>(
    load: impl FnOnce() -> Result<Checked<M>>,
    check: impl FnOnce(&mut M) -> Result<()>,
    build: impl FnOnce() -> Result<M>,
    note: &mut dyn FnMut(&str),
) -> Result<M> {
    let why = match load()? {
        Checked::Same(m) => return Ok(m),
        Checked::OtherBits(why, mut m) => match check(&mut m) {
            Ok(()) => {
                note(&format!(
                    "note: {why}: used, its plan checked against the CPU reference here"
                ));
                return Ok(m);
            }
            Err(e) => format!("{why}, and its plan check here failed ({e})"),
        },
        Checked::Unfit(why) => why,
    };
    note(&format!(
        "note: {why}: not used; the model is built again here from the plan's graph (its \
         choices timed here, its plan checked against the CPU reference)"
    ));
    build()
}

/// The cuda part of `saved` (`file` names it in errors).
fn read_part(saved: &SavedPlan, file: &str) -> Result<CudaPart> {
    CudaPart::from_bytes(&saved.backend).map_err(|msg| {
        EngineError::InvalidArgument(
            file::SavedPlanError::Corrupt {
                file: file.into(),
                msg: format!("its cuda part: {msg}"),
            }
            .to_string(),
        )
    })
}

/// Reads `cudnnGetConvolutionMathType` of a legacy convolution descriptor.
pub(crate) fn conv_math(conv: dnn::cudnnConvolutionDescriptor_t) -> Option<u32> {
    let mut math = dnn::cudnnMathType_t::CUDNN_DEFAULT_MATH;
    // SAFETY: a live descriptor and a valid out-pointer.
    let r = unsafe { dnn::cudnnGetConvolutionMathType(conv, &mut math) };
    (r == dnn::cudnnStatus_t::CUDNN_STATUS_SUCCESS).then_some(math as u32)
}

/// The workspace a saved cuBLASLt algorithm needs for these descriptors, or an error where
/// cuBLASLt says it cannot run them (`cublasLtMatmulAlgoCheck`).
pub(crate) fn checked_matmul_algo(
    handle: lt::cublasLtHandle_t,
    descs: crate::handles::LtMatmulDescs,
    algo: &lt::cublasLtMatmulAlgo_t,
) -> Result<usize> {
    crate::handles::algo_workspace(handle, descs, algo)
        .map_err(|e| EngineError::Runtime(format!("the saved cuBLASLt algorithm: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part() -> CudaPart {
        CudaPart {
            channels_last: true,
            fused_attention: false,
            depthwise_pairs: true,
            block_rows: false,
            exact_gelu: true,
            steps: vec![
                Choice::ConvLegacy { algo: 1, math: 2 },
                Choice::ConvGraph {
                    json: "{\"engineId\": 48, \"knobs\": {\"SPLIT_K\": 1}}".into(),
                    engine: 48,
                    fused: true,
                    bias: true,
                    residual: false,
                },
                Choice::ConvGemm,
                Choice::Pick(3),
            ],
            matmuls: vec![(
                "MmKey { m: 1, n: 1000 }".into(),
                [1, 2, 3, u64::MAX, 5, 6, 7, 8],
            )],
            sm_count: 132,
            outputs: vec![file::bits_hash(&[1.0, -0.0, f32::NAN])],
            values: vec![
                file::bits_hash(&[2.0]),
                file::bits_hash(&[1.0, -0.0, f32::NAN]),
            ],
        }
    }

    #[test]
    fn the_cuda_part_round_trips_and_refuses_damage() {
        let p = part();
        let b = p.to_bytes();
        assert_eq!(CudaPart::from_bytes(&b).unwrap(), p);
        for cut in [0, 1, 5, b.len() / 2, b.len() - 1] {
            assert!(CudaPart::from_bytes(&b[..cut]).is_err(), "cut at {cut}");
        }
        let mut bad = b.clone();
        bad[2] = 200;
        assert!(CudaPart::from_bytes(&bad).is_err());
        // The SM count target is kept, and none (0) is refused: a load must pin the build's.
        let mut other = part();
        other.sm_count = 38;
        assert_eq!(
            CudaPart::from_bytes(&other.to_bytes()).unwrap().sm_count,
            38
        );
        other.sm_count = 0;
        let e = CudaPart::from_bytes(&other.to_bytes()).unwrap_err();
        assert!(e.contains("SM count"), "{e}");
        // The stem kernel's choice (session 36) round-trips too.
        let mut stem = part();
        stem.steps.push(Choice::ConvStem);
        assert_eq!(CudaPart::from_bytes(&stem.to_bytes()).unwrap(), stem);
    }

    /// A build tells cuBLASLt the SMs its device reports, cuDNN's heuristics nothing (their
    /// candidates unchanged); a load tells both the build's count wherever the device reports
    /// another (an MPS client at 30 % of an H200 reports 40 of 132).
    #[test]
    fn a_load_pins_the_builds_sm_count_where_the_device_reports_another() {
        let build = SmTargets::new(0, 132);
        assert_eq!(build.matmul, 132);
        assert_eq!(build.cudnn_heuristics, None);
        let mps_build = SmTargets::new(0, 40);
        assert_eq!((mps_build.matmul, mps_build.cudnn_heuristics), (40, None));
        let load_at_30 = SmTargets::new(132, 40);
        assert_eq!(load_at_30.matmul, 132);
        assert_eq!(load_at_30.cudnn_heuristics, Some(132));
        let load_whole = SmTargets::new(132, 132);
        assert_eq!(
            (load_whole.matmul, load_whole.cudnn_heuristics),
            (132, None)
        );
        let load_mps_plan_whole = SmTargets::new(40, 132);
        assert_eq!(load_mps_plan_whole.cudnn_heuristics, Some(40));
    }

    /// A load whose bits are the build's is used as it is; one whose bits differ is used when
    /// its plan check passes here, else built again; one whose choices cannot be replayed is
    /// built again; each said once, naming why. A refused load (another GPU's key) builds
    /// nothing and is returned as it was.
    #[test]
    fn a_plan_with_other_bits_is_kept_if_checked_else_built_again_and_a_refusal_is_kept() {
        let mut notes = Vec::new();
        let mut built = 0;
        let mut checked = 0;
        let other = || {
            Ok(Checked::OtherBits(
                "saved plan `r.isoplan`: output 0 computes other bits".into(),
                "loaded",
            ))
        };
        let m = or_build(
            || Ok(Checked::Same("loaded")),
            |_| unreachable!("bits the build's: nothing to check"),
            || {
                built += 1;
                Ok("built")
            },
            &mut |n| notes.push(n.to_string()),
        )
        .unwrap();
        assert_eq!((m, built, notes.len()), ("loaded", 0, 0));
        // Other bits, the check passes: the loaded model, nothing built.
        let m = or_build(
            other,
            |_| {
                checked += 1;
                Ok(())
            },
            || {
                built += 1;
                Ok("built")
            },
            &mut |n| notes.push(n.to_string()),
        )
        .unwrap();
        assert_eq!((m, built, checked), ("loaded", 0, 1));
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(
            notes[0].contains("r.isoplan")
                && notes[0].contains("other bits")
                && notes[0].contains("used, its plan checked"),
            "{}",
            notes[0]
        );
        // Other bits, the check fails: built again, the check's error named.
        let m = or_build(
            other,
            |_| Err(EngineError::Runtime("plan check failed: rel L2 inf".into())),
            || {
                built += 1;
                Ok("built")
            },
            &mut |n| notes.push(n.to_string()),
        )
        .unwrap();
        assert_eq!((m, built, notes.len()), ("built", 1, 2));
        assert!(
            notes[1].contains("other bits")
                && notes[1].contains("rel L2 inf")
                && notes[1].contains("built again"),
            "{}",
            notes[1]
        );
        let m = or_build(
            || {
                Ok(Checked::Unfit(
                    "saved plan `r.isoplan`: the saved plan's cuDNN engine 48 is not offered"
                        .into(),
                ))
            },
            |_| unreachable!("nothing loaded to check"),
            || {
                built += 1;
                Ok("built")
            },
            &mut |n| notes.push(n.to_string()),
        )
        .unwrap();
        assert_eq!((m, built, notes.len()), ("built", 2, 3));
        assert!(notes[2].contains("engine 48") && notes[2].contains("built again"));
        let e = or_build::<&str>(
            || {
                Err(EngineError::InvalidArgument(
                    "saved plan `r.isoplan`: GPU \"H100\"".into(),
                ))
            },
            |_| unreachable!("nothing loaded to check"),
            || {
                built += 1;
                Ok("built")
            },
            &mut |n| notes.push(n.to_string()),
        )
        .unwrap_err();
        assert!(matches!(e, EngineError::InvalidArgument(_)) && built == 2 && notes.len() == 3);
    }

    #[test]
    fn outputs_differ_where_a_bit_an_output_or_its_hash_differs() {
        let h = |v: &[f32]| file::bits_hash(v);
        let built = vec![h(&[1.0, 2.0]), h(&[3.0])];
        assert_eq!(first_other_bits(&built, &built.clone()), None);
        // -0.0 and 0.0 are equal numbers but other bits.
        let other = vec![h(&[1.0, 2.0]), h(&[3.0 + f32::EPSILON * 2.0])];
        assert_eq!(first_other_bits(&built, &other), Some(1));
        assert_ne!(h(&[0.0]), h(&[-0.0]));
        assert_eq!(first_other_bits(&built, &built[..1]), Some(1));
        assert_eq!(first_other_bits(&built[..1], &built), Some(1));
    }

    /// A file of the cuda part's earlier layout (no SM count) is refused by its key, naming
    /// the format field and both values, before its part is read.
    #[test]
    fn a_plan_of_another_cuda_part_format_is_refused_by_its_key() {
        let gpu = vec![("GPU".to_string(), "NVIDIA H200".to_string())];
        let here = expected_key(gpu.clone(), Precision::Fp16, 1);
        let old: Vec<_> = here
            .iter()
            .filter(|(f, _)| f != FIELD_CUDA_FORMAT)
            .cloned()
            .collect();
        let saved = SavedPlan {
            key: old,
            graph: Graph::default(),
            backend: vec![],
        };
        let e = saved.check_key("r.isoplan", &here).unwrap_err().to_string();
        assert!(
            e.contains("r.isoplan")
                && e.contains(FIELD_CUDA_FORMAT)
                && e.contains(&format!("\"{CUDA_PART_FORMAT}\"")),
            "{e}"
        );
    }

    #[test]
    fn a_replay_gives_the_choices_back_in_order_and_checks_their_kind_and_count() {
        let p = part();
        let mut log = ChoiceLog::replay(p.steps.clone(), p.matmuls.clone(), 132);
        assert!(log.replaying());
        assert_eq!(
            log.take("conv a").unwrap(),
            Some(Choice::ConvLegacy { algo: 1, math: 2 })
        );
        assert!(log.finish().is_err(), "choices left over");
        log.take("conv b").unwrap();
        log.take("conv c").unwrap();
        assert_eq!(log.pick(4, "attention").unwrap(), Some(3));
        log.finish().unwrap();
        let e = log.take("one more").unwrap_err().to_string();
        assert!(e.contains("one more") && e.contains("isolane build"), "{e}");
        // A pick out of range, or of the wrong kind, is refused.
        let mut log = ChoiceLog::replay(p.steps[3..].to_vec(), vec![], 132);
        assert!(log.pick(3, "layer norm").is_err());
        let mut log = ChoiceLog::replay(p.steps.clone(), vec![], 132);
        assert!(log.pick(8, "depthwise").is_err());
        assert_eq!(
            ChoiceLog::replay(vec![], p.matmuls.clone(), 132)
                .matmul("MmKey { m: 1, n: 1000 }")
                .map(|a| a.data[3]),
            Some(u64::MAX)
        );
        // A log of a build that is not saved keeps nothing.
        let mut none = ChoiceLog::none();
        assert_eq!(none.note(Choice::Pick(1)), None);
        assert!(none.steps.is_empty() && !none.recording());
        assert_eq!(none.take("x").unwrap(), None);
        // Recording never replays.
        let mut rec = ChoiceLog::record();
        assert_eq!(rec.take("x").unwrap(), None);
        assert_eq!(rec.pick(2, "x").unwrap(), None);
        assert_eq!(rec.note(Choice::Pick(1)), Some(0));
        assert_eq!(rec.note(Choice::Pick(0)), Some(1));
        // A whole-model decision overrides the first step's pick and only it.
        rec.renote(0, Choice::Pick(3));
        rec.renote(7, Choice::Pick(3));
        assert_eq!(rec.steps, vec![Choice::Pick(3), Choice::Pick(0)]);
    }

    /// A load makes its plan from the saved fused graph: it must be the plan the build made
    /// from the model (the choices are replayed step by step onto it), at every precision and
    /// in both layouts.
    #[test]
    fn the_plan_made_from_a_saved_graph_is_the_builds_plan() {
        use isolane_engine::{build_model, Weights};
        for (name, batch) in [("mobilenet_v2", 1), ("vit_b_16", 2), ("vit_b_16", 1)] {
            let g = build_model(name, Weights::Synthetic { seed: 5 }).unwrap();
            let fused = passes::optimize(&g, batch).unwrap();
            let saved = SavedPlan {
                key: vec![],
                graph: fused.clone(),
                backend: vec![],
            };
            let back = SavedPlan::from_bytes("p.isoplan", &saved.to_bytes()).unwrap();
            for precision in [Precision::Fp32, Precision::Fp16] {
                for (channels_last, fused_attention) in
                    [(true, false), (false, false), (true, true)]
                {
                    let opts = plan::PlanOptions {
                        channels_last,
                        fused_attention,
                    };
                    let built = plan::plan_with(&fused, batch, precision, opts).unwrap();
                    let loaded = plan::plan_with(&back.graph, batch, precision, opts).unwrap();
                    let shape = |p: &plan::Plan| {
                        format!(
                            "{:?} {:?} {} {:?} {:?} {:?} {:?} {:?}",
                            p.steps,
                            p.storages,
                            p.arena_bytes,
                            p.filter_nhwc,
                            p.filter_dw_hwc,
                            p.inputs,
                            p.outputs,
                            p.probes
                        )
                    };
                    assert!(
                        shape(&built) == shape(&loaded) && built.consts == loaded.consts,
                        "{name} {precision:?} {opts:?}: another plan from the saved graph"
                    );
                }
            }
        }
    }

    #[test]
    fn saved_enums_map_back_to_cudnn_values_only() {
        for v in 0..8 {
            assert_eq!(conv_algo(v).map(|a| a as u32), Some(v));
        }
        assert!(conv_algo(8).is_none() && conv_algo(u32::MAX).is_none());
        for v in 0..4 {
            assert_eq!(math_type(v).map(|m| m as u32), Some(v));
        }
        assert!(math_type(4).is_none());
    }

    #[test]
    fn the_expected_key_holds_device_precision_batch_and_the_gpu_fields() {
        let gpu = vec![
            ("GPU".to_string(), "NVIDIA H200".to_string()),
            ("compute capability".to_string(), "9.0".to_string()),
        ];
        let k = expected_key(gpu, Precision::Fp16, 8);
        let get = |f: &str| k.iter().find(|(a, _)| a == f).map(|(_, v)| v.as_str());
        assert_eq!(get("device"), Some("cuda"));
        assert_eq!(get("precision"), Some("fp16"));
        assert_eq!(get("batch"), Some("8"));
        assert_eq!(get("compute capability"), Some("9.0"));
        // A plan built on another GPU is refused naming the field and both values.
        let mut other = k.clone();
        other[3].1 = "NVIDIA H100 80GB HBM3".into();
        let saved = SavedPlan {
            key: other,
            graph: Graph::default(),
            backend: vec![],
        };
        let e = saved.check_key("r.isoplan", &k).unwrap_err().to_string();
        assert!(
            e.contains("GPU \"NVIDIA H100 80GB HBM3\"") && e.contains("\"NVIDIA H200\""),
            "{e}"
        );
        assert_eq!(probe_input(0, 5), probe_input(0, 5));
        assert!(probe_input(1, 100).iter().all(|v| (-1.0..1.0).contains(v)));
    }
}
