//! The backend's tuning switches as one typed value. The `ISOLANE_CUDA_*` environment
//! variables (measurement and comparison overrides) are read once, where a backend is made
//! ([`BuildOptions::from_env`]), and the value is passed down to planning and building: nothing
//! below reads the environment.

/// Which convolution paths the builder may time and choose from (`ISOLANE_CUDA_CONV`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ConvPaths {
    /// cuDNN and, where it applies, im2col + cuBLASLt GEMM; the faster is kept.
    #[default]
    Fastest,
    /// `ISOLANE_CUDA_CONV=cudnn`: cuDNN only (GEMM only where cuDNN cannot run the conv).
    Cudnn,
    /// `ISOLANE_CUDA_CONV=gemm`: im2col + GEMM only where it applies (no cuDNN search).
    Gemm,
    /// `ISOLANE_CUDA_CONV=stem`: the direct kernel for inputs of few channels (`conv_stem_*`)
    /// wherever it applies, untimed; the others as [`ConvPaths::Fastest`].
    Stem,
}

impl ConvPaths {
    /// Whether the cuDNN path is tried for a convolution the GEMM path could also run.
    pub fn tries_cudnn(self) -> bool {
        self != ConvPaths::Gemm
    }

    /// Whether the GEMM path is tried.
    pub fn tries_gemm(self) -> bool {
        self != ConvPaths::Cudnn
    }

    /// Whether the direct kernel for inputs of few channels is tried (it is a kernel of ours:
    /// not where only one library's paths are asked for).
    pub fn tries_stem(self) -> bool {
        matches!(self, ConvPaths::Fastest | ConvPaths::Stem)
    }
}

/// Which way a quantized product runs (`ISOLANE_CUDA_QUANT`): its candidates are timed and the
/// fastest kept per layer, or one is forced where it is built (the int8 GEMM otherwise).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum QuantPaths {
    /// The int8 (fp8) GEMM, cuDNN's int8 convolution, the float step and cuDNN's fused
    /// quantized graph, timed.
    #[default]
    Fastest,
    /// `ISOLANE_CUDA_QUANT=gemm`: im2col + quantize + cuBLASLt GEMM + epilogue.
    Gemm,
    /// `ISOLANE_CUDA_QUANT=cudnn`: cuDNN's int8 convolution where planned.
    Cudnn,
    /// `ISOLANE_CUDA_QUANT=float`: the float step with the fake-quant values.
    Float,
    /// `ISOLANE_CUDA_QUANT=graph`: cuDNN's fused quantized graph where it is built.
    Graph,
    /// `ISOLANE_CUDA_QUANT=bytes`: the GEMM with x quantized before its im2col.
    Bytes,
    /// `ISOLANE_CUDA_QUANT=own`: the own tensor-core kernel with the epilogue fused, on the
    /// GEMM path's rows (timed by default on compute capability 9.0 only: [`Self::builds_own`]).
    Own,
    /// `ISOLANE_CUDA_QUANT=own-bytes`: the own kernel on the rows of the bytes' im2col.
    OwnBytes,
    /// `ISOLANE_CUDA_QUANT=fastest-own`: every candidate timed, the own kernel's two among
    /// them on any device (the default times them on compute capability 9.0 only).
    FastestWithOwn,
}

impl QuantPaths {
    /// The candidate index forced (`crate::plan::QuantAlternatives`' order), if any.
    pub fn forced(self) -> Option<usize> {
        match self {
            QuantPaths::Fastest | QuantPaths::FastestWithOwn => None,
            QuantPaths::Gemm => Some(0),
            QuantPaths::Cudnn => Some(1),
            QuantPaths::Float => Some(2),
            QuantPaths::Graph => Some(3),
            QuantPaths::Bytes => Some(4),
            QuantPaths::Own => Some(5),
            QuantPaths::OwnBytes => Some(6),
        }
    }

    /// Whether the own kernel's candidates are built on a device of compute capability `arch`:
    /// where forced or asked to be timed, and by default on 9.0, where its `wgmma` form
    /// (`qgemm_i8_wg`) beat cuDNN's fused graph on resnet50's 1×1 expansions and won the
    /// whole-chain timing (session 33). Elsewhere its `mma.sync` form lost to cuDNN on every
    /// layer (session 31), so timing it would only lengthen the build.
    pub fn builds_own(self, arch: (i32, i32)) -> bool {
        match self {
            QuantPaths::Own | QuantPaths::OwnBytes | QuantPaths::FastestWithOwn => true,
            QuantPaths::Fastest => arch == (9, 0),
            _ => false,
        }
    }
}

/// The `ISOLANE_CUDA_QUANT` value that forces a quantized product's candidate `i` (its index in
/// `crate::plan::QuantAlternatives`' order), "?" past them.
pub fn quant_candidate_name(i: usize) -> &'static str {
    ["gemm", "cudnn", "float", "graph", "bytes"]
        .get(i)
        .copied()
        .unwrap_or("?")
}

/// What a quantized product's float candidate reads (`ISOLANE_CUDA_QUANT_FLOAT`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum QuantFloatInput {
    /// x unquantized for a calibrated model ([`BuildOptions::calibrated`]), x's fake-quant
    /// values otherwise: a QDQ file's author fixed its quantization, so its arithmetic is kept.
    #[default]
    ByModel,
    /// `ISOLANE_CUDA_QUANT_FLOAT=plain`: x unquantized, whatever the model.
    Plain,
    /// `ISOLANE_CUDA_QUANT_FLOAT=fake-quant`: x's fake-quant values, whatever the model.
    FakeQuant,
}

/// How the CUDA backend plans and builds, beyond graph, batch and precision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BuildOptions {
    /// Convolution activations channels-last (NHWC); `ISOLANE_CUDA_LAYOUT=nchw` turns it off.
    pub channels_last: bool,
    /// Fused attention where it applies (f16/bf16, sm_80+);
    /// `ISOLANE_CUDA_ATTENTION=unfused` turns it off.
    pub fused_attention: bool,
    /// Fused attention at batch 1 too (there the unfused plan is copy-free as well);
    /// `ISOLANE_CUDA_ATTENTION=batched` keeps it to batch > 1.
    pub fused_attention_batch1: bool,
    /// Convolution paths timed; `ISOLANE_CUDA_CONV`.
    pub conv_paths: ConvPaths,
    /// Quantized products' paths timed or forced; `ISOLANE_CUDA_QUANT`.
    pub quant_paths: QuantPaths,
    /// What a quantized product's float candidate reads ([`BuildOptions::quant_float_plain`]);
    /// `ISOLANE_CUDA_QUANT_FLOAT=plain` / `fake-quant` force either.
    pub quant_float: QuantFloatInput,
    /// The graph's quantization was chosen by isolane's calibration (`precision = "int8"` or
    /// `"fp8"` with a calibration folder), not written into the file (a QDQ model). Set by the
    /// caller that calibrated ([`BuildOptions::for_calibrated`]), never by a variable: only it
    /// knows, the graph looks the same.
    pub calibrated: bool,
    /// A calibrated model is also built without its quantization and the faster plan, timed
    /// whole, is kept ([`crate::CudaBackend::compile_calibrated`]);
    /// `ISOLANE_CUDA_QUANT_FALLBACK=off` keeps the quantized plan always.
    pub quant_fallback: bool,
    /// cuDNN's graph API (its heuristics' engines, bias/residual/ReLU fused) among the cuDNN
    /// candidates, besides the legacy algorithms; `ISOLANE_CUDA_CUDNN=legacy` leaves it out.
    pub cudnn_graphs: bool,
    /// Graph-API engines whose kernels cuDNN compiles when the plan is made (seconds of NVRTC
    /// per model build); `ISOLANE_CUDA_CUDNN=runtime-compiled` allows them.
    pub cudnn_runtime_compiled: bool,
    /// The fused quantized convolution graph (a quantized product's candidate 3) may use
    /// engines compiled at run time where no precompiled one takes it: cuDNN's int8 and fp8
    /// fusions are runtime-fusion engines. One compile per distinct layer shape, shared by
    /// the layers of that shape; `ISOLANE_CUDA_QUANT_GRAPH=precompiled` leaves them out.
    pub quant_graph_runtime_compiled: bool,
    /// The 8-outputs × 2-channels depthwise 7×7 kernel at large batch;
    /// `ISOLANE_CUDA_DW=window` keeps the 4-output register-window kernels.
    pub depthwise_pairs: bool,
    /// Block-per-row LayerNorm and softmax kernels only; `ISOLANE_CUDA_ROWS=block`.
    pub block_rows: bool,
    /// On sm_90 and newer, isolane's own kernels are launched with programmatic dependent
    /// launch after a kernel or a matrix product, so that each is scheduled while the one
    /// ahead finishes (the same kernels in the same order: the same bits);
    /// `ISOLANE_CUDA_PDL=off` launches them plainly.
    pub programmatic_launch: bool,
    /// The exact erf GELU kernel after every Linear, instead of cuBLASLt's tanh GELU epilogue at
    /// tf32/fp16/bf16; set by `ISOLANE_CUDA_EXACT_GELU` (any value).
    pub exact_gelu: bool,
    /// Raises the algorithm workspace cap (half the arena) to this many MiB;
    /// `ISOLANE_CUDA_WORKSPACE_MB=N`.
    pub workspace_mib: Option<usize>,
    /// Prints every library candidate the build times (convolution paths, cuBLASLt algorithms)
    /// with its time, and the one kept, to stderr; `ISOLANE_CUDA_SEARCH_LOG` (any value).
    pub search_log: bool,
    /// Times nothing: keeps cuDNN's and cuBLASLt's own first choice (cuDNN for a convolution
    /// both could run); `ISOLANE_CUDA_SEARCH=first`. For comparisons, not speed.
    pub first_choice: bool,
    /// The process is an MPS client limited to this share of the GPU's threads
    /// (`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` below 100; `None` otherwise): then convolutions
    /// by im2col + cuBLASLt where that path can run them ([`BuildOptions::from_vars`] says
    /// why).
    pub mps_thread_pct: Option<u32>,
}

impl Default for BuildOptions {
    fn default() -> Self {
        BuildOptions {
            channels_last: true,
            fused_attention: true,
            fused_attention_batch1: true,
            conv_paths: ConvPaths::Fastest,
            quant_paths: QuantPaths::Fastest,
            quant_float: QuantFloatInput::ByModel,
            calibrated: false,
            quant_fallback: true,
            cudnn_graphs: true,
            cudnn_runtime_compiled: false,
            quant_graph_runtime_compiled: true,
            depthwise_pairs: true,
            block_rows: false,
            programmatic_launch: true,
            exact_gelu: false,
            workspace_mib: None,
            search_log: false,
            first_choice: false,
            mps_thread_pct: None,
        }
    }
}

impl BuildOptions {
    /// The options the `ISOLANE_CUDA_*` variables select (defaults where unset). Values the
    /// switches do not name leave the default, as they always have.
    pub fn from_env() -> BuildOptions {
        Self::from_vars(|name| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned()))
    }

    /// [`BuildOptions::from_env`] over any variable lookup (tests pass a map).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> BuildOptions {
        let is = |name: &str, value: &str| var(name).is_some_and(|v| v == value);
        let mps_thread_pct = var("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
            .and_then(|v| v.trim().parse::<f64>().ok())
            .filter(|p| *p < 100.0)
            .map(|p| p.max(0.0) as u32);
        // As an MPS client with part of the threads, library kernels compute wrong results:
        // cuBLASLt algorithms on the H100 (driver 580) at 16-33 % of the threads, and on the
        // H200 (session 30) cuDNN's 1x1 convolutions, by its legacy API (IMPLICIT_PRECOMP_GEMM
        // with tensor ops, even as its own first choice at 18 %) and its graph API (engines 39
        // and 58), in mobilenet_v2 and resnet50, while im2col + a cuBLASLt GEMM whose
        // candidates are each checked against the CPU (mm_check) was right there and 4-6x
        // faster than cuDNN's first choices. So there convolutions go through the GEMM path
        // (cuDNN only for those it cannot run), timed, and the plan is checked
        // (crate::rebuild). `ISOLANE_CUDA_SEARCH=first` keeps the rule of sessions 11-29
        // (cuDNN's and cuBLASLt's first choices, untimed); `ISOLANE_CUDA_CONV` overrides the
        // paths.
        let mps_part = mps_thread_pct.is_some();
        let first = is("ISOLANE_CUDA_SEARCH", "first");
        BuildOptions {
            channels_last: !is("ISOLANE_CUDA_LAYOUT", "nchw"),
            fused_attention: !is("ISOLANE_CUDA_ATTENTION", "unfused"),
            fused_attention_batch1: !is("ISOLANE_CUDA_ATTENTION", "unfused")
                && !is("ISOLANE_CUDA_ATTENTION", "batched"),
            conv_paths: match var("ISOLANE_CUDA_CONV").as_deref() {
                Some("cudnn") => ConvPaths::Cudnn,
                Some("gemm") => ConvPaths::Gemm,
                Some("fastest") => ConvPaths::Fastest,
                Some("stem") => ConvPaths::Stem,
                _ if mps_part && first => ConvPaths::Cudnn,
                _ if mps_part => ConvPaths::Gemm,
                _ => ConvPaths::Fastest,
            },
            quant_paths: match var("ISOLANE_CUDA_QUANT").as_deref() {
                Some("gemm") => QuantPaths::Gemm,
                Some("cudnn") => QuantPaths::Cudnn,
                Some("float") => QuantPaths::Float,
                Some("graph") => QuantPaths::Graph,
                Some("bytes") => QuantPaths::Bytes,
                Some("own") => QuantPaths::Own,
                Some("own-bytes") => QuantPaths::OwnBytes,
                Some("fastest-own") => QuantPaths::FastestWithOwn,
                // As an MPS client with part of the threads a quantized product keeps the int8
                // GEMM, as the untimed rule of sessions 11-29 did: cuDNN's int8 paths are not
                // known to be right there, and a rebuild bars convolution paths only.
                _ if mps_part => QuantPaths::Gemm,
                _ => QuantPaths::Fastest,
            },
            quant_float: match var("ISOLANE_CUDA_QUANT_FLOAT").as_deref() {
                Some("plain") => QuantFloatInput::Plain,
                Some("fake-quant") => QuantFloatInput::FakeQuant,
                _ => QuantFloatInput::ByModel,
            },
            calibrated: false,
            quant_fallback: !is("ISOLANE_CUDA_QUANT_FALLBACK", "off"),
            cudnn_graphs: !is("ISOLANE_CUDA_CUDNN", "legacy"),
            cudnn_runtime_compiled: is("ISOLANE_CUDA_CUDNN", "runtime-compiled"),
            quant_graph_runtime_compiled: !is("ISOLANE_CUDA_QUANT_GRAPH", "precompiled"),
            depthwise_pairs: !is("ISOLANE_CUDA_DW", "window"),
            block_rows: is("ISOLANE_CUDA_ROWS", "block"),
            programmatic_launch: !is("ISOLANE_CUDA_PDL", "off"),
            exact_gelu: var("ISOLANE_CUDA_EXACT_GELU").is_some(),
            workspace_mib: var("ISOLANE_CUDA_WORKSPACE_MB").and_then(|v| v.parse().ok()),
            search_log: var("ISOLANE_CUDA_SEARCH_LOG").is_some(),
            first_choice: first,
            mps_thread_pct,
        }
    }

    /// These options for a model whose quantization isolane's calibration chose.
    pub fn for_calibrated(self, calibrated: bool) -> BuildOptions {
        BuildOptions { calibrated, ..self }
    }

    /// Whether a quantized product's float candidate reads x's floats unquantized (plain
    /// fp16, TensorRT's per-layer fallback) rather than x's fake-quant values. For a
    /// calibrated model the quantization is isolane's own choice, which a layer may decline
    /// where the float product alone is faster; a QDQ file's is its author's, so its
    /// arithmetic is kept unless the variable forces otherwise.
    pub fn quant_float_plain(&self) -> bool {
        match self.quant_float {
            QuantFloatInput::ByModel => self.calibrated,
            QuantFloatInput::Plain => true,
            QuantFloatInput::FakeQuant => false,
        }
    }

    /// The algorithm workspace cap for an arena of `arena_bytes`: half the arena, so that total
    /// memory stays within weights + 1.5 × arena, unless `workspace_mib` raises it.
    pub fn workspace_cap(&self, arena_bytes: usize) -> usize {
        self.workspace_mib
            .map_or(arena_bytes / 2, |mb| (mb << 20).max(arena_bytes / 2))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(pairs: &[(&str, &str)]) -> BuildOptions {
        BuildOptions::from_vars(|name| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn unset_variables_give_the_defaults() {
        assert_eq!(with(&[]), BuildOptions::default());
    }

    #[test]
    fn every_switch_is_read() {
        let o = with(&[
            ("ISOLANE_CUDA_LAYOUT", "nchw"),
            ("ISOLANE_CUDA_ATTENTION", "unfused"),
            ("ISOLANE_CUDA_CONV", "gemm"),
            ("ISOLANE_CUDA_QUANT", "float"),
            ("ISOLANE_CUDA_QUANT_FLOAT", "plain"),
            ("ISOLANE_CUDA_QUANT_FALLBACK", "off"),
            ("ISOLANE_CUDA_CUDNN", "legacy"),
            ("ISOLANE_CUDA_QUANT_GRAPH", "precompiled"),
            ("ISOLANE_CUDA_DW", "window"),
            ("ISOLANE_CUDA_ROWS", "block"),
            ("ISOLANE_CUDA_PDL", "off"),
            ("ISOLANE_CUDA_EXACT_GELU", ""),
            ("ISOLANE_CUDA_WORKSPACE_MB", "64"),
            ("ISOLANE_CUDA_SEARCH_LOG", "1"),
            ("ISOLANE_CUDA_SEARCH", "first"),
            ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "33"),
        ]);
        assert_eq!(
            o,
            BuildOptions {
                channels_last: false,
                fused_attention: false,
                fused_attention_batch1: false,
                conv_paths: ConvPaths::Gemm,
                quant_paths: QuantPaths::Float,
                quant_float: QuantFloatInput::Plain,
                calibrated: false,
                quant_fallback: false,
                cudnn_graphs: false,
                cudnn_runtime_compiled: false,
                quant_graph_runtime_compiled: false,
                depthwise_pairs: false,
                block_rows: true,
                programmatic_launch: false,
                exact_gelu: true,
                workspace_mib: Some(64),
                search_log: true,
                first_choice: true,
                mps_thread_pct: Some(33),
            }
        );
        let all = with(&[("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "100")]);
        assert_eq!(all, BuildOptions::default());
        // An MPS client with part of the threads: timed, convolutions by im2col + cuBLASLt;
        // the rule of sessions 11-29 with ISOLANE_CUDA_SEARCH=first; the paths as named.
        let part = with(&[("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "16")]);
        assert!(!part.first_choice && part.conv_paths == ConvPaths::Gemm);
        assert_eq!(part.quant_paths, QuantPaths::Gemm);
        let first = with(&[
            ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "16"),
            ("ISOLANE_CUDA_SEARCH", "first"),
        ]);
        assert!(first.first_choice && first.conv_paths == ConvPaths::Cudnn);
        let fastest = with(&[
            ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "16"),
            ("ISOLANE_CUDA_CONV", "fastest"),
        ]);
        assert!(!fastest.first_choice && fastest.conv_paths == ConvPaths::Fastest);
        assert!(!o.conv_paths.tries_cudnn() && o.conv_paths.tries_gemm());
        let rtc = with(&[("ISOLANE_CUDA_CUDNN", "runtime-compiled")]);
        assert!(rtc.cudnn_graphs && rtc.cudnn_runtime_compiled);
        let batched = with(&[("ISOLANE_CUDA_ATTENTION", "batched")]);
        assert!(batched.fused_attention && !batched.fused_attention_batch1);
        assert_eq!(o.workspace_cap(10 << 20), 64 << 20);
        assert_eq!(o.workspace_cap(1 << 30), 1 << 29);
    }

    #[test]
    fn values_the_switches_do_not_name_keep_the_defaults() {
        let o = with(&[
            ("ISOLANE_CUDA_LAYOUT", "nhwc"),
            ("ISOLANE_CUDA_CONV", "both"),
            ("ISOLANE_CUDA_ROWS", "warp"),
            ("ISOLANE_CUDA_WORKSPACE_MB", "lots"),
            ("ISOLANE_CUDA_QUANT_GRAPH", "runtime-compiled"),
            ("ISOLANE_CUDA_QUANT_FALLBACK", "on"),
        ]);
        assert_eq!(o, BuildOptions::default());
        let q = |v: &str| with(&[("ISOLANE_CUDA_QUANT", v)]).quant_paths.forced();
        assert_eq!(
            [
                q("gemm"),
                q("cudnn"),
                q("float"),
                q("graph"),
                q("bytes"),
                q("int8")
            ],
            [Some(0), Some(1), Some(2), Some(3), Some(4), None]
        );
        // The own kernel is built forced or asked to be timed on any device, and timed by
        // default on compute capability 9.0 (its wgmma form) only.
        let own = |v: &str| with(&[("ISOLANE_CUDA_QUANT", v)]).quant_paths;
        let (hopper, ampere, ada) = ((9, 0), (8, 0), (8, 9));
        for arch in [hopper, ampere, ada] {
            assert!(own("own").builds_own(arch) && own("own-bytes").builds_own(arch));
            assert!(own("fastest-own").builds_own(arch));
            assert!(!own("graph").builds_own(arch) && !own("gemm").builds_own(arch));
        }
        assert!(own("fastest-own").forced().is_none() && own("").forced().is_none());
        assert!(own("").builds_own(hopper));
        assert!(!own("").builds_own(ampere) && !own("").builds_own(ada));
        // Each candidate's name is the value that forces it.
        for i in 0..5 {
            let name = quant_candidate_name(i);
            assert_eq!(
                with(&[("ISOLANE_CUDA_QUANT", name)]).quant_paths.forced(),
                Some(i)
            );
        }
        assert_eq!(quant_candidate_name(5), "?");
        let f = with(&[("ISOLANE_CUDA_QUANT_FLOAT", "fp16")]);
        assert_eq!(f.quant_float, QuantFloatInput::ByModel);
        let cudnn = with(&[("ISOLANE_CUDA_CONV", "cudnn")]).conv_paths;
        assert!(cudnn.tries_cudnn() && !cudnn.tries_gemm() && !cudnn.tries_stem());
        let stem = with(&[("ISOLANE_CUDA_CONV", "stem")]).conv_paths;
        assert_eq!(stem, ConvPaths::Stem);
        assert!(stem.tries_stem() && stem.tries_cudnn() && stem.tries_gemm());
        assert!(ConvPaths::Fastest.tries_stem() && !ConvPaths::Gemm.tries_stem());
    }

    #[test]
    fn plain_fp16_is_the_calibrated_models_default_and_the_variable_forces_either() {
        let qdq = BuildOptions::default();
        let calibrated = qdq.for_calibrated(true);
        assert!(!qdq.quant_float_plain() && calibrated.quant_float_plain());
        // No variable says a model is calibrated: only the caller that calibrated does.
        assert!(!with(&[("ISOLANE_CUDA_QUANT_FLOAT", "calibrated")]).calibrated);
        let plain = with(&[("ISOLANE_CUDA_QUANT_FLOAT", "plain")]);
        assert!(plain.quant_float_plain() && plain.for_calibrated(true).quant_float_plain());
        let fq = with(&[("ISOLANE_CUDA_QUANT_FLOAT", "fake-quant")]);
        assert!(!fq.quant_float_plain() && !fq.for_calibrated(true).quant_float_plain());
        assert!(!calibrated.for_calibrated(false).quant_float_plain());
    }
}
