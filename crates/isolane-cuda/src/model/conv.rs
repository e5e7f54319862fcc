//! Convolutions: cuDNN descriptors and graph-API plans, the im2col + GEMM path, depthwise kernels,
//! and the timed choice among them.

use super::*;

pub(super) struct ConvDesc {
    pub(super) x: dnn::cudnnTensorDescriptor_t,
    pub(super) w: dnn::cudnnFilterDescriptor_t,
    pub(super) conv: dnn::cudnnConvolutionDescriptor_t,
    pub(super) y: dnn::cudnnTensorDescriptor_t,
    pub(super) algo: dnn::cudnnConvolutionFwdAlgo_t,
    pub(super) workspace: usize,
}

impl Drop for ConvDesc {
    fn drop(&mut self) {
        // SAFETY: each descriptor was created by `conv_desc` for this value alone (null where
        // creation had not happened yet) and is destroyed once, here. Descriptors are host
        // objects, independent of the cuDNN handle.
        unsafe {
            if !self.x.is_null() {
                dnn::cudnnDestroyTensorDescriptor(self.x);
            }
            if !self.y.is_null() {
                dnn::cudnnDestroyTensorDescriptor(self.y);
            }
            if !self.w.is_null() {
                dnn::cudnnDestroyFilterDescriptor(self.w);
            }
            if !self.conv.is_null() {
                dnn::cudnnDestroyConvolutionDescriptor(self.conv);
            }
        }
    }
}

pub(super) fn dnn_dtype(d: DType) -> dnn::cudnnDataType_t {
    match d {
        DType::F32 => dnn::cudnnDataType_t::CUDNN_DATA_FLOAT,
        DType::F16 => dnn::cudnnDataType_t::CUDNN_DATA_HALF,
        DType::Bf16 => dnn::cudnnDataType_t::CUDNN_DATA_BFLOAT16,
    }
}

/// Fewest threads for which the depthwise pair kernel (`dwconv_c2_*`) is chosen.
pub(super) const DWC2_MIN_THREADS: usize = 1 << 17;

#[derive(Clone, Debug, PartialEq)]
pub(super) struct ConvKey {
    pub(super) x: [usize; 4],
    pub(super) w: [usize; 4],
    pub(super) pads: [usize; 2],
    pub(super) strides: [usize; 2],
    pub(super) dil: [usize; 2],
    pub(super) groups: usize,
}

impl ConvKey {
    pub(super) fn of(c: &ConvStep) -> ConvKey {
        ConvKey {
            x: c.x_shape,
            w: c.w_shape,
            pads: c.pads,
            strides: c.strides,
            dil: c.dilations,
            groups: c.groups,
        }
    }
}

/// cuDNN algorithms per convolution that the build times itself (see [`conv_descs`]).
pub(super) const CUDNN_CANDIDATES: usize = 3;

/// Descriptors for the fastest few algorithms cuDNN finds for `c`, fastest first by cuDNN's
/// own timing.
///
/// cuDNN's search times each algorithm once, eagerly, often as the GPU's first work after idle,
/// so its ranking of near-equal algorithms changes from build to build (resnet18 fp16 built at
/// 0.35 ms in most builds and 0.59 ms in one: docs/interference.md). Its top
/// [`CUDNN_CANDIDATES`] are therefore kept and timed again by [`time_candidates`], as graphs
/// in alternating rounds, with the GEMM path.
///
/// Untimed (`ISOLANE_CUDA_SEARCH=first`, or an MPS client with part of the threads:
/// [`BuildOptions::from_vars`]), cuDNN's own first choice only, unless `more` (a path was
/// barred at this step, `crate::rebuild`): then its first few, in its order.
pub(super) fn conv_descs(
    m: &CudaModel,
    c: &ConvStep,
    rec: &Recorder,
    more: bool,
) -> Result<Vec<ConvDesc>> {
    let (dtype, precision) = (rec.dtype, rec.plan.precision);
    let (scratch, ws_cap) = (rec.scratch, rec.ws_cap);
    let ptr = |l: Loc| rec.ptr(l);
    let keep = if rec.options.first_choice && !more {
        1
    } else {
        CUDNN_CANDIDATES
    };
    let search = conv_desc(c, dtype, precision)?;
    let mut perf: [dnn::cudnnConvolutionFwdAlgoPerf_t; 10] =
        // SAFETY: the perf records are plain C structs for which all-zero bytes are valid.
        unsafe { std::mem::zeroed() };
    let mut got = 0;
    // SAFETY: the descriptors are live; the buffers passed to the algorithm search are the
    // step's own (planned together with these shapes) and the scratch holds ws_cap bytes.
    dnn_check("cudnnFindConvolutionForwardAlgorithmEx", unsafe {
        dnn::cudnnFindConvolutionForwardAlgorithmEx(
            m.cudnn(),
            search.x,
            ptr(c.x) as *const c_void,
            search.w,
            ptr(c.w) as *const c_void,
            search.conv,
            search.y,
            ptr(c.y) as *mut c_void,
            perf.len() as i32,
            &mut got,
            perf.as_mut_ptr(),
            scratch as *mut c_void,
            ws_cap,
        )
    })?;
    let usable = perf[..got.max(0) as usize].iter().filter(|p| {
        p.status == dnn::cudnnStatus_t::CUDNN_STATUS_SUCCESS
            && p.memory <= ws_cap
            && (precision != Precision::Fp32
                || p.mathType != dnn::cudnnMathType_t::CUDNN_TENSOR_OP_MATH)
    });
    let mut descs = Vec::with_capacity(keep);
    let mut search = Some(search);
    for p in usable.take(keep) {
        let mut d = match search.take() {
            Some(d) => d,
            None => conv_desc(c, dtype, precision)?,
        };
        d.algo = p.algo;
        d.workspace = p.memory;
        if precision != Precision::Fp32 {
            // SAFETY: `d.conv` is live and owned by `d`.
            dnn_check("cudnnSetConvolutionMathType", unsafe {
                dnn::cudnnSetConvolutionMathType(d.conv, p.mathType)
            })?;
        }
        descs.push(d);
    }
    if descs.is_empty() {
        return Err(EngineError::Runtime(format!(
            "cuDNN offers no convolution algorithm for x {:?} w {:?} within a {} byte workspace",
            c.x_shape, c.w_shape, ws_cap
        )));
    }
    Ok(descs)
}

/// The descriptors of convolution `c` (algorithm not yet chosen).
pub(super) fn conv_desc(c: &ConvStep, dtype: DType, precision: Precision) -> Result<ConvDesc> {
    let dt = dnn_dtype(dtype);
    let fmt = if c.nhwc {
        dnn::cudnnTensorFormat_t::CUDNN_TENSOR_NHWC
    } else {
        dnn::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW
    };
    let math = match precision {
        Precision::Fp32 => dnn::cudnnMathType_t::CUDNN_FMA_MATH,
        Precision::Tf32 => dnn::cudnnMathType_t::CUDNN_DEFAULT_MATH,
        Precision::Fp16 | Precision::Bf16 => dnn::cudnnMathType_t::CUDNN_TENSOR_OP_MATH,
    };
    conv_descriptors(
        c,
        ConvTypes {
            format: fmt,
            x: dt,
            w: dt,
            y: dt,
            sums: dnn::cudnnDataType_t::CUDNN_DATA_FLOAT,
            math,
        },
    )
}

/// The layout and data types of a convolution's cuDNN descriptors.
pub(super) struct ConvTypes {
    pub format: dnn::cudnnTensorFormat_t,
    pub x: dnn::cudnnDataType_t,
    pub w: dnn::cudnnDataType_t,
    pub y: dnn::cudnnDataType_t,
    /// What the products are summed in.
    pub sums: dnn::cudnnDataType_t,
    pub math: dnn::cudnnMathType_t,
}

/// The descriptors of convolution `c` with types `t` (algorithm not yet chosen): one home
/// for the float convolutions and the int8 one of the quantized products.
pub(super) fn conv_descriptors(c: &ConvStep, t: ConvTypes) -> Result<ConvDesc> {
    let i = |v: usize| v as i32;
    let mut d = ConvDesc {
        x: std::ptr::null_mut(),
        w: std::ptr::null_mut(),
        conv: std::ptr::null_mut(),
        y: std::ptr::null_mut(),
        algo: dnn::cudnnConvolutionFwdAlgo_t::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM,
        workspace: 0,
    };
    // SAFETY: out-pointers are valid. The descriptors destroy themselves when `d` is dropped
    // (here on an error, else with the model).
    unsafe {
        dnn_check(
            "cudnnCreateTensorDescriptor",
            dnn::cudnnCreateTensorDescriptor(&mut d.x),
        )?;
        dnn_check(
            "cudnnCreateTensorDescriptor",
            dnn::cudnnCreateTensorDescriptor(&mut d.y),
        )?;
        dnn_check(
            "cudnnCreateFilterDescriptor",
            dnn::cudnnCreateFilterDescriptor(&mut d.w),
        )?;
        dnn_check(
            "cudnnCreateConvolutionDescriptor",
            dnn::cudnnCreateConvolutionDescriptor(&mut d.conv),
        )?;
        let [n, ch, h, w] = c.x_shape;
        dnn_check(
            "cudnnSetTensor4dDescriptor",
            dnn::cudnnSetTensor4dDescriptor(d.x, t.format, t.x, i(n), i(ch), i(h), i(w)),
        )?;
        let [n, ch, h, w] = c.y_shape;
        dnn_check(
            "cudnnSetTensor4dDescriptor",
            dnn::cudnnSetTensor4dDescriptor(d.y, t.format, t.y, i(n), i(ch), i(h), i(w)),
        )?;
        let [k, cg, kh, kw] = c.w_shape;
        dnn_check(
            "cudnnSetFilter4dDescriptor",
            dnn::cudnnSetFilter4dDescriptor(d.w, t.w, t.format, i(k), i(cg), i(kh), i(kw)),
        )?;
        dnn_check(
            "cudnnSetConvolution2dDescriptor",
            dnn::cudnnSetConvolution2dDescriptor(
                d.conv,
                i(c.pads[0]),
                i(c.pads[1]),
                i(c.strides[0]),
                i(c.strides[1]),
                i(c.dilations[0]),
                i(c.dilations[1]),
                dnn::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
                t.sums,
            ),
        )?;
        dnn_check(
            "cudnnSetConvolutionGroupCount",
            dnn::cudnnSetConvolutionGroupCount(d.conv, i(c.groups)),
        )?;
        dnn_check(
            "cudnnSetConvolutionMathType",
            dnn::cudnnSetConvolutionMathType(d.conv, t.math),
        )?;
    }
    Ok(d)
}

pub(super) fn record_conv(
    m: &mut CudaModel,
    rec: &Recorder,
    caches: &mut LibraryCaches,
    err: &dyn Fn(EngineError) -> EngineError,
    c: &ConvStep,
) -> Result<()> {
    let saved = rec.choices.borrow_mut().take("a convolution")?;
    if let Some(choice) = saved {
        return replay_conv(m, rec, caches, c, choice).map_err(err);
    }
    let conv_cache = &mut caches.conv;
    // Two ways, each timed on the real buffers; the faster one is kept:
    // cuDNN (one of its best algorithms) + our epilogue kernel, or (NHWC, one group)
    // im2col + a cuBLASLt GEMM with bias, ReLU and the residual fused.
    let paths = rec.options.conv_paths;
    let key = ConvKey::of(c);
    // Paths a check found wrong at this step (crate::rebuild): the others are tried, cuDNN's
    // next few and the GEMM path even where the build would try only cuDNN's first.
    // A path barred at a convolution is barred at every convolution of its shape: an equal
    // convolution runs the same kernel, and it would take the barred one from the cache.
    let step = m.step_start.len().saturating_sub(1);
    let shape = format!("{key:?}");
    let barred: Vec<&str> = rec
        .barred
        .iter()
        .filter(|b| b.step == step || b.shape == shape)
        .map(|b| b.path.as_str())
        .collect();
    // The direct kernel for inputs of few channels: forced (ISOLANE_CUDA_CONV=stem), before
    // any library candidate is made, or timed last and kept where it beats their fastest.
    let stem = paths.tries_stem()
        && !rec.options.first_choice
        && !barred.contains(&STEM_PATH)
        && stem_refusal(rec.dtype, rec.arch, c).is_none();
    if stem && paths == crate::options::ConvPaths::Stem {
        return keep_stem(m, rec, c, step, shape);
    }
    // The cuDNN candidates: the algorithm chosen for an equal convolution earlier in this
    // build, else cuDNN's top few.
    let cached = conv_cache
        .iter()
        .find(|(k, _)| *k == key && barred.is_empty())
        .map(|&(_, i)| i);
    let mut dnn_descs: Vec<usize> = Vec::new();
    if paths.tries_cudnn() || !c.gemm_capable() || !barred.is_empty() {
        // (The descriptors of the algorithms that lose stay in `m.convs`, unused: a few host
        // objects per distinct convolution, and the launches hold indices into it.)
        let found = match cached {
            Some(i) => Ok(vec![i]),
            None => conv_descs(m, c, rec, !barred.is_empty()).map(|descs| {
                descs
                    .into_iter()
                    .map(|d| {
                        m.convs.push(d);
                        m.convs.len() - 1
                    })
                    .collect()
            }),
        };
        match found {
            Ok(idxs) => dnn_descs = idxs,
            Err(e) if !c.gemm_capable() => return Err(err(e)),
            Err(_) => {}
        }
    }
    let mut candidates = legacy_candidates(rec, c, &dnn_descs);
    // cuDNN's graph API: its heuristics' first engines, the epilogue fused where it can be.
    let mut graph_first = candidates.len();
    let graph_ptrs = ConvGraphPtrs {
        x: rec.ptr(c.x),
        w: rec.ptr(c.w),
        y: rec.ptr(c.y),
        bias: c.bias.map_or(0, &|l| rec.ptr(l)),
        residual: c.residual.map_or(0, &|l| rec.ptr(l)),
        workspace: 0,
        scale: 0,
        y_scale: 0,
        y_copy: 0,
    };
    // (Its tensors are declared 16-byte aligned.)
    let p = &graph_ptrs;
    let aligned = vec_aligned(&[p.x, p.w, p.y, p.bias, p.residual]);
    let graph_spec =
        (paths.tries_cudnn() && rec.options.cudnn_graphs && !rec.options.first_choice && aligned)
            .then(|| ConvGraphSpec::of(c, rec.dtype, rec.plan.precision))
            .flatten();
    let graph_idxs = match &graph_spec {
        Some(spec) => conv_graph_candidates(m, rec, &mut caches.conv_graph, spec),
        None => Vec::new(),
    };
    for &gi in &graph_idxs {
        let g = &m.conv_graphs[gi];
        let mut l = vec![Launch::ConvGraph {
            graph: gi,
            ptrs: Box::new(graph_ptrs),
        }];
        if !g.fused && (c.bias.is_some() || c.residual.is_some() || c.act.is_some()) {
            l.push(conv_epilogue(rec, c, true, true));
        }
        candidates.push((l, f32::INFINITY));
    }
    let mut n_dnn_all = candidates.len();
    // The GEMM path where it is tried and could be kept (an untimed search keeps cuDNN's first
    // choice), where cuDNN found nothing (ISOLANE_CUDA_CONV=cudnn), and where a path was barred
    // at this step (then cuDNN is tried too, whatever the paths: crate::rebuild).
    let gemm_may_win = paths.tries_gemm() && !rec.options.first_choice;
    if c.gemm_capable() && (gemm_may_win || dnn_descs.is_empty() || !barred.is_empty()) {
        let mut l = Vec::new();
        let b_ptr = match c.col {
            Some(col) => {
                l.push(im2col_launch(rec, c, col));
                rec.ptr(col)
            }
            None => rec.ptr(c.x),
        };
        let relu = matches!(c.act, Some(Unary::Relu));
        let mm_key = conv_gemm_key(rec, c, relu);
        let res_ptr = c.residual.map_or(0, &|l| rec.ptr(l));
        let ptrs = [rec.ptr(c.w), b_ptr, res_ptr, rec.ptr(c.y)];
        match matmul_launch(m, rec, &mut caches.mm, mm_key, ptrs) {
            Ok(launch) => {
                l.push(launch);
                if c.act.is_some() && !relu {
                    l.push(conv_epilogue(rec, c, false, false));
                }
                candidates.push((l, f32::INFINITY));
            }
            // Where cuDNN was not asked (an MPS client's GEMM-only paths) and the GEMM path
            // cannot run (no cuBLASLt algorithm computes it right), cuDNN's algorithms.
            Err(e) if dnn_descs.is_empty() && candidates.is_empty() => {
                let descs = conv_descs(m, c, rec, true).map_err(|_| err(e))?;
                for d in descs {
                    m.convs.push(d);
                    dnn_descs.push(m.convs.len() - 1);
                }
                candidates = legacy_candidates(rec, c, &dnn_descs);
                (graph_first, n_dnn_all) = (candidates.len(), candidates.len());
            }
            Err(_) => {}
        }
    }
    if stem {
        candidates.push((vec![stem_launch(rec, c)], f32::INFINITY));
    }
    if !rec.options.first_choice {
        time_candidates(m, rec, &mut candidates).map_err(err)?;
    }
    let stem_time = match stem {
        true => candidates.pop().map(|(_, t)| t),
        false => None,
    };
    let n_dnn = dnn_descs.len();
    let bounds = [n_dnn, graph_first, n_dnn_all];
    let name = |i: usize| conv_path_name(m, &dnn_descs, &graph_idxs, bounds, i);
    // A barred path counts as one that failed to run.
    for (i, cand) in candidates.iter_mut().enumerate() {
        if barred.contains(&name(i).as_str()) {
            cand.1 = f32::NAN;
        }
    }
    // A path that failed to run has a NaN time, which total_cmp puts after every other.
    let fastest =
        |r: std::ops::Range<usize>| r.min_by(|&a, &b| candidates[a].1.total_cmp(&candidates[b].1));
    let best_legacy = fastest(0..n_dnn);
    if let (Some(i), None) = (best_legacy, cached) {
        if !candidates[i].1.is_nan() {
            conv_cache.push((key, dnn_descs[i]));
        }
    }
    if let (Some(i), Some(spec)) = (fastest(graph_first..n_dnn_all), graph_spec) {
        if !candidates[i].1.is_nan() && !caches.conv_graph.iter().any(|(s, _)| *s == spec) {
            caches.conv_graph.push((spec, graph_idxs[i - graph_first]));
        }
    }
    let best_dnn = fastest(0..n_dnn_all);
    // The GEMM path on a tie (cuDNN's first choice when nothing was timed, unless barred).
    let chosen = match (best_dnn, candidates.len() > n_dnn_all) {
        (Some(d), gemm) if rec.options.first_choice && !(gemm && candidates[d].1.is_nan()) => d,
        (Some(d), true) if candidates[d].1.total_cmp(&candidates[n_dnn_all].1).is_lt() => d,
        (_, true) => n_dnn_all,
        (Some(d), false) => d,
        (None, false) => return Err(err(EngineError::Runtime("no convolution path".into()))),
    };
    // A failed run (NaN) never wins; a tie keeps the library's path.
    let stem_wins = stem_time.is_some_and(|t| t.total_cmp(&candidates[chosen].1).is_lt());
    if rec.options.search_log {
        let mut times: Vec<String> = candidates
            .iter()
            .enumerate()
            .map(|(i, (_, ms))| format!("{} {:.4} ms", name(i), ms))
            .collect();
        if let Some(t) = stem_time {
            times.push(format!("{STEM_PATH} {t:.4} ms"));
        }
        log_conv_search(
            "conv",
            c,
            &times,
            if stem_wins { times.len() - 1 } else { chosen },
        );
    }
    if stem_wins {
        return keep_stem(m, rec, c, step, shape);
    }
    if rec.choices.borrow().recording() {
        rec.choices
            .borrow_mut()
            .note(conv_choice(m, &dnn_descs, &graph_idxs, bounds, chosen));
    }
    let kept = crate::rebuild::StepPath {
        step,
        path: name(chosen),
        shape,
    };
    m.conv_paths.push(kept);
    m.launches.extend(candidates.swap_remove(chosen).0);
    Ok(())
}

/// The name of the direct kernel's path, as the search log writes it and a check bars it.
const STEM_PATH: &str = "stem kernel";

/// Keeps the direct kernel for inputs of few channels at convolution `c` (step `step`).
fn keep_stem(
    m: &mut CudaModel,
    rec: &Recorder,
    c: &ConvStep,
    step: usize,
    shape: String,
) -> Result<()> {
    if rec.choices.borrow().recording() {
        rec.choices
            .borrow_mut()
            .note(crate::saved::Choice::ConvStem);
    }
    m.conv_paths.push(crate::rebuild::StepPath {
        step,
        path: STEM_PATH.to_string(),
        shape,
    });
    m.launches.push(stem_launch(rec, c));
    Ok(())
}

/// cuDNN's legacy algorithms `dnn_descs` (indices into `m.convs`) as candidate paths of
/// convolution `c`, each with our epilogue where the convolution has one.
fn legacy_candidates(rec: &Recorder, c: &ConvStep, dnn_descs: &[usize]) -> Vec<TimedPath> {
    dnn_descs
        .iter()
        .map(|&idx| {
            let mut l = vec![Launch::Conv {
                conv: idx,
                x: rec.ptr(c.x),
                w: rec.ptr(c.w),
                y: rec.ptr(c.y),
            }];
            if c.bias.is_some() || c.residual.is_some() || c.act.is_some() {
                l.push(conv_epilogue(rec, c, true, true));
            }
            (l, f32::INFINITY)
        })
        .collect()
}

/// The name of convolution path `i` among the candidates of [`record_conv`] (ordered as
/// [`conv_choice`] says), as the search log writes it and a check bars it (`crate::rebuild`).
fn conv_path_name(
    m: &CudaModel,
    dnn_descs: &[usize],
    graph_idxs: &[usize],
    [n_dnn, graph_first, n_dnn_all]: [usize; 3],
    i: usize,
) -> String {
    if i < n_dnn {
        let d = &m.convs[dnn_descs[i]];
        match crate::saved::conv_math(d.conv) {
            Some(math) => format!("cudnn algo {:?} math {math}", d.algo),
            None => format!("cudnn algo {:?}", d.algo),
        }
    } else if i < n_dnn_all {
        let g = &m.conv_graphs[graph_idxs[i - graph_first]];
        let fused = if g.fused { " fused" } else { "" };
        let rtc = if g.runtime_compiled {
            " runtime-compiled"
        } else {
            ""
        };
        format!("cudnn engine {}{fused}{rtc}", g.engine)
    } else {
        "gemm".to_string()
    }
}

/// The saved form of convolution path `chosen` among the candidates of [`record_conv`]: the
/// legacy descriptors `dnn_descs` first, then the graph-API plans `graph_idxs` (from
/// `graph_first` to `n_dnn_all`), then the GEMM path.
pub(super) fn conv_choice(
    m: &CudaModel,
    dnn_descs: &[usize],
    graph_idxs: &[usize],
    [n_dnn, graph_first, n_dnn_all]: [usize; 3],
    chosen: usize,
) -> crate::saved::Choice {
    if chosen < n_dnn {
        let d = &m.convs[dnn_descs[chosen]];
        match crate::saved::conv_math(d.conv) {
            Some(math) => crate::saved::Choice::ConvLegacy {
                algo: d.algo as u32,
                math,
            },
            None => crate::saved::Choice::Unsaveable("cuDNN did not say a math type".into()),
        }
    } else if chosen < n_dnn_all {
        let g = &m.conv_graphs[graph_idxs[chosen - graph_first]];
        let (bias, residual) = g.reads();
        match g.to_json() {
            Ok(json) => crate::saved::Choice::ConvGraph {
                json,
                engine: g.engine,
                fused: g.fused,
                bias,
                residual,
            },
            Err(e) => crate::saved::Choice::Unsaveable(format!(
                "cuDNN did not serialise a graph-API plan: {e}"
            )),
        }
    } else {
        crate::saved::Choice::ConvGemm
    }
}

/// A convolution's launches from a saved plan's choice: the one path, nothing timed.
pub(super) fn replay_conv(
    m: &mut CudaModel,
    rec: &Recorder,
    caches: &mut LibraryCaches,
    c: &ConvStep,
    choice: crate::saved::Choice,
) -> Result<()> {
    use crate::saved::Choice;
    let has_epilogue = c.bias.is_some() || c.residual.is_some() || c.act.is_some();
    match choice {
        Choice::ConvLegacy { algo, math } => {
            let (Some(algo), Some(math)) =
                (crate::saved::conv_algo(algo), crate::saved::math_type(math))
            else {
                return Err(EngineError::InvalidArgument(format!(
                    "the saved plan holds cuDNN algorithm {algo} with math type {math}, which \
                     cuDNN does not have"
                )));
            };
            let mut d = conv_desc(c, rec.dtype, rec.plan.precision)?;
            d.algo = algo;
            if rec.plan.precision != Precision::Fp32 {
                // SAFETY: `d.conv` is live and owned by `d`.
                dnn_check("cudnnSetConvolutionMathType", unsafe {
                    dnn::cudnnSetConvolutionMathType(d.conv, math)
                })?;
            }
            let mut ws = 0usize;
            // SAFETY: the descriptors are live; a valid out-pointer.
            dnn_check("cudnnGetConvolutionForwardWorkspaceSize", unsafe {
                dnn::cudnnGetConvolutionForwardWorkspaceSize(
                    m.cudnn(),
                    d.x,
                    d.w,
                    d.conv,
                    d.y,
                    d.algo,
                    &mut ws,
                )
            })?;
            d.workspace = ws;
            m.convs.push(d);
            m.launches.push(Launch::Conv {
                conv: m.convs.len() - 1,
                x: rec.ptr(c.x),
                w: rec.ptr(c.w),
                y: rec.ptr(c.y),
            });
            if has_epilogue {
                m.launches.push(conv_epilogue(rec, c, true, true));
            }
        }
        Choice::ConvGraph {
            json,
            engine,
            fused,
            bias,
            residual,
        } => {
            // The JSON is kept in the file (it names the engine and knobs the build timed),
            // but the plan is made again from the engine's configuration.
            let _ = (json, bias, residual);
            let spec = ConvGraphSpec::of(c, rec.dtype, rec.plan.precision).ok_or_else(|| {
                EngineError::InvalidArgument(
                    "the saved plan holds a cuDNN graph for a convolution the graph API does \
                     not take here; build it again with `isolane build`"
                        .into(),
                )
            })?;
            let g = crate::dnn_graph::conv_graph_of_engine(
                m.cudnn(),
                &spec,
                (fused, engine),
                rec.ws_cap,
                rec.sm.cudnn_heuristics,
            )
            .map_err(crate::error::engine)?
            .ok_or_else(|| {
                EngineError::InvalidArgument(format!(
                    "the saved plan's cuDNN engine {engine} is not offered for this \
                     convolution here; build it again with `isolane build`"
                ))
            })?;
            m.conv_graphs.push(g);
            m.launches.push(Launch::ConvGraph {
                graph: m.conv_graphs.len() - 1,
                ptrs: Box::new(ConvGraphPtrs {
                    x: rec.ptr(c.x),
                    w: rec.ptr(c.w),
                    y: rec.ptr(c.y),
                    bias: c.bias.map_or(0, &|l| rec.ptr(l)),
                    residual: c.residual.map_or(0, &|l| rec.ptr(l)),
                    workspace: 0,
                    scale: 0,
                    y_scale: 0,
                    y_copy: 0,
                }),
            });
            if !fused && has_epilogue {
                m.launches.push(conv_epilogue(rec, c, true, true));
            }
        }
        Choice::ConvGemm if c.gemm_capable() => {
            let b_ptr = match c.col {
                Some(col) => {
                    m.launches.push(im2col_launch(rec, c, col));
                    rec.ptr(col)
                }
                None => rec.ptr(c.x),
            };
            let relu = matches!(c.act, Some(Unary::Relu));
            let mm_key = conv_gemm_key(rec, c, relu);
            let res_ptr = c.residual.map_or(0, &|l| rec.ptr(l));
            let ptrs = [rec.ptr(c.w), b_ptr, res_ptr, rec.ptr(c.y)];
            let launch = matmul_launch(m, rec, &mut caches.mm, mm_key, ptrs)?;
            m.launches.push(launch);
            if c.act.is_some() && !relu {
                m.launches.push(conv_epilogue(rec, c, false, false));
            }
        }
        Choice::ConvStem => match stem_refusal(rec.dtype, rec.arch, c) {
            None => m.launches.push(stem_launch(rec, c)),
            Some(why) => {
                return Err(EngineError::InvalidArgument(format!(
                    "the saved plan runs a convolution by isolane's direct kernel for few \
                     channels, which cannot run it here ({why}); build it again with \
                     `isolane build`"
                )))
            }
        },
        other => {
            return Err(EngineError::InvalidArgument(format!(
                "the saved plan holds {other:?} for a convolution it cannot run so; build it \
                 again with `isolane build`"
            )))
        }
    }
    Ok(())
}

/// The search log's line for a convolution (`ISOLANE_CUDA_SEARCH_LOG`): its shapes, each
/// candidate's time and the one kept.
pub(super) fn log_conv_search(what: &str, c: &ConvStep, times: &[String], chosen: usize) {
    eprintln!(
        "search: {what} {:?} -> {:?} k{:?} s{:?}: {}; kept {chosen}",
        c.x_shape,
        c.y_shape,
        &c.w_shape[2..],
        c.strides,
        times.join(", ")
    );
}

/// Indices into `m.conv_graphs` of the graph-API plans to time for `spec`: the one kept for an
/// equal convolution earlier in this build, else cuDNN's first few (none where the graph API
/// offers none: the legacy algorithms and the GEMM path remain).
pub(super) fn conv_graph_candidates(
    m: &mut CudaModel,
    rec: &Recorder,
    cache: &mut [(ConvGraphSpec, usize)],
    spec: &ConvGraphSpec,
) -> Vec<usize> {
    if let Some(&(_, i)) = cache.iter().find(|(s, _)| s == spec) {
        return vec![i];
    }
    let t0 = Instant::now();
    let graphs = crate::dnn_graph::conv_graphs(
        m.cudnn(),
        spec,
        rec.ws_cap,
        CUDNN_CANDIDATES,
        (rec.options.cudnn_runtime_compiled, rec.sm.cudnn_heuristics),
    )
    .unwrap_or_else(|e| {
        if rec.options.search_log {
            eprintln!("search: cudnn graph for {spec:?}: {e}");
        }
        Vec::new()
    });
    if rec.options.search_log {
        eprintln!(
            "search: {} cudnn graph plans made in {:.1} ms",
            graphs.len(),
            t0.elapsed().as_secs_f64() * 1e3
        );
    }
    let first = m.conv_graphs.len();
    m.conv_graphs.extend(graphs);
    (first..m.conv_graphs.len()).collect()
}

/// The pointwise pass after a cuDNN convolution (bias, residual, activation) or after its GEMM
/// (the activation cuBLASLt's epilogue does not fuse).
pub(super) fn conv_epilogue(
    rec: &Recorder,
    c: &ConvStep,
    with_bias: bool,
    with_res: bool,
) -> Launch {
    let n_out: usize = c.y_shape.iter().product();
    pointwise_launch(
        rec,
        rec.ptr(c.y),
        rec.ptr(c.y),
        None,
        if with_bias {
            c.bias.map(&|l| rec.ptr(l))
        } else {
            None
        },
        if with_res {
            c.residual.map(&|l| rec.ptr(l))
        } else {
            None
        },
        n_out,
        c.y_shape[1],
        if c.nhwc {
            1
        } else {
            c.y_shape[2] * c.y_shape[3]
        },
        c.act,
    )
}

/// Output rows and columns of a `conv_stem_*` tile (`STEM_TR`, `STEM_TC` in the kernel).
const STEM_TILE: (usize, usize) = (4, 16);
/// The most blocks of a `conv_stem_*` launch (they loop over the tiles, each loading the
/// weights once): eight an SM of an H200, as a constant so that a plan's launches are the same
/// in every partition.
const STEM_MAX_BLOCKS: usize = 8 * 132;
/// The longest input row (W·C elements) a `conv_stem_*` kernel takes: it divides an offset
/// in the row by C as a multiply and a shift, exact below 2^15.
const STEM_ROW_LIMIT: usize = 1 << 15;

/// Why the direct kernel for inputs of few channels (`conv_stem_*`) cannot run `c`, if it
/// cannot: it is a 16-bit tensor-core kernel (sm_80+) for NHWC convolutions of one group and
/// C ≤ 4 input channels, M ≤ 128 output channels in runs of 16, K = kh·kw·C ≤ 256, no
/// residual, its weights, table and input patch within 48 KiB of shared memory.
pub(super) fn stem_refusal(dtype: DType, arch: (i32, i32), c: &ConvStep) -> Option<String> {
    let [_, ch, _, w] = c.x_shape;
    let [m, _, kh, kw] = c.w_shape;
    let k = kh * kw * ch;
    let why = if dtype == DType::F32 || arch.0 < 8 {
        "it is a 16-bit tensor-core kernel (sm_80 and newer)".to_string()
    } else if !c.gemm_capable() || c.residual.is_some() {
        "it runs NHWC convolutions of one group without a residual".to_string()
    } else if ch > 4 || m > 128 || !m.is_multiple_of(16) || k > 256 {
        format!("C = {ch} > 4, M = {m} not a multiple of 16 up to 128, or K = {k} > 256")
    } else if w * ch >= STEM_ROW_LIMIT || stem_shared(c) > 48 * 1024 {
        format!(
            "an input row of {w} × {ch} elements (the kernel takes fewer than {STEM_ROW_LIMIT}) \
             or its weights and patch (past 48 KiB of shared memory) are too large"
        )
    } else {
        return None;
    };
    Some(why)
}

/// K padded to whole k16 steps.
fn stem_kp(c: &ConvStep) -> usize {
    (c.w_shape[2] * c.w_shape[3] * c.x_shape[1]).div_ceil(16) * 16
}

/// The dynamic shared memory of a `conv_stem_*` launch: the weights `[M][kp + 8]`, the
/// offset table (kp ints) and the tile's input patch.
fn stem_shared(c: &ConvStep) -> usize {
    let (tr, tc) = STEM_TILE;
    let kp = stem_kp(c);
    let ph = (tr - 1) * c.strides[0] + (c.w_shape[2] - 1) * c.dilations[0] + 1;
    let pw = (tc - 1) * c.strides[1] + (c.w_shape[3] - 1) * c.dilations[1] + 1;
    (c.w_shape[0] * (kp + 8) * 2 + kp * 4 + ph * pw * c.x_shape[1] * 2).div_ceil(16) * 16
}

/// The direct kernel for inputs of few channels on `c` (the caller checked
/// [`stem_refusal`]): bias and activation fused, y written NHWC.
pub(super) fn stem_launch(rec: &Recorder, c: &ConvStep) -> Launch {
    let [n, ch, h, w] = c.x_shape;
    let [m, _, kh, kw] = c.w_shape;
    let [_, _, oh, ow] = c.y_shape;
    let (tr, tc) = STEM_TILE;
    let (tiles_y, tiles_x) = (oh.div_ceil(tr), ow.div_ceil(tc));
    let (act, p0, p1) = crate::plan::act_code(c.act, rec.dtype);
    let i = |v: usize| v as i32;
    let v = [
        i(n),
        i(h),
        i(w),
        i(ch),
        i(oh),
        i(ow),
        i(m),
        i(kh),
        i(kw),
        i(c.strides[0]),
        i(c.strides[1]),
        i(c.pads[0]),
        i(c.pads[1]),
        i(c.dilations[0]),
        i(c.dilations[1]),
        i(stem_kp(c)),
        act,
        i(tiles_x),
        i(tiles_y),
        i(65536usize.div_ceil(ch)),
    ];
    let tiles = n * tiles_y * tiles_x;
    Launch::Kernel {
        func: rec.func(if m > 64 {
            "conv_stem_n128"
        } else {
            "conv_stem_n64"
        }),
        grid: tiles.min(STEM_MAX_BLOCKS) as u32,
        block: 128,
        shared: stem_shared(c) as u32,
        args: vec![
            Arg::Ptr(rec.ptr(c.x)),
            Arg::Ptr(rec.ptr(c.w)),
            Arg::Ptr(c.bias.map_or(0, |b| rec.ptr(b))),
            Arg::Ptr(rec.ptr(c.y)),
            Arg::Stem(Box::new(StemP { v, p0, p1 })),
        ],
    }
}

/// The im2col kernel that lowers a convolution's input into `col` for the GEMM path.
pub(super) fn im2col_launch(rec: &Recorder, c: &ConvStep, col: Loc) -> Launch {
    let [n, ch, h, w] = c.x_shape;
    let [_, _, oh, ow] = c.y_shape;
    let (kh, kw) = (c.w_shape[2], c.w_shape[3]);
    let v = [
        n,
        h,
        w,
        ch,
        oh,
        ow,
        kh,
        kw,
        c.strides[0],
        c.strides[1],
        c.pads[0],
        c.pads[1],
        c.dilations[0],
        c.dilations[1],
    ];
    let vi = v.map(|s| s as i32);
    let total = n * oh * ow * kh * kw * ch;
    // Whole 16-byte vectors of channels: copied as they are, 32-bit indices.
    let lanes = rec.vec_lanes();
    let vector = ch.is_multiple_of(lanes)
        && total / lanes <= i32::MAX as usize
        && vec_aligned(&[rec.ptr(c.x), rec.ptr(col)]);
    let (func, threads) = if vector {
        ("im2col_v", total / lanes)
    } else {
        ("im2col", total)
    };
    Launch::Kernel {
        func: rec.func(func),
        grid: elementwise_grid(threads),
        block: BLOCK,
        shared: 0,
        args: vec![
            Arg::Ptr(rec.ptr(c.x)),
            Arg::Ptr(rec.ptr(col)),
            Arg::Im(Box::new(ImP { v: vi })),
        ],
    }
}

/// The cuBLASLt GEMM of a convolution's GEMM path: `y[n·oh·ow, M] = col · wᵀ` with the bias,
/// ReLU and residual fused.
pub(super) fn conv_gemm_key(rec: &Recorder, c: &ConvStep, relu: bool) -> MmKey {
    let [n, ch, _, _] = c.x_shape;
    let [_, _, oh, ow] = c.y_shape;
    let (kh, kw) = (c.w_shape[2], c.w_shape[3]);
    MmKey {
        relu,
        residual: c.residual.is_some(),
        ..MmKey::linear(
            n * oh * ow,
            c.w_shape[0],
            kh * kw * ch,
            c.bias.map(&|l| rec.ptr(l)),
        )
    }
}

pub(super) fn record_dw_conv(m: &mut CudaModel, rec: &Recorder, c: &ConvStep) -> Result<()> {
    let es = rec.es;
    let (a, p0, p1) = act_code(c.act, rec.dtype);
    let v = [
        c.x_shape[0],
        c.x_shape[1],
        c.x_shape[2],
        c.x_shape[3],
        c.y_shape[1],
        c.y_shape[2],
        c.y_shape[3],
        c.w_shape[2],
        c.w_shape[3],
        c.strides[0],
        c.strides[1],
        c.pads[0],
        c.pads[1],
        c.dilations[0],
        c.dilations[1],
        0,
    ];
    let mut vi = v.map(|s| s as i32);
    vi[15] = a;
    let n: usize = c.y_shape.iter().product();
    // The register-window kernels: NHWC, horizontal stride and dilation 1.
    let fast = c.nhwc && c.strides[1] == 1 && c.dilations[1] == 1;
    // Channel pairs, 8 outputs per thread: also one filter per channel, M
    // even and every operand 2-element aligned.
    // `BuildOptions::depthwise_pairs` off (ISOLANE_CUDA_DW=window) keeps the 4-output kernels.
    let pair_ok = fast
        && rec.options.depthwise_pairs
        && c.y_shape[1] == c.x_shape[1]
        && c.y_shape[1].is_multiple_of(2)
        && [Some(c.x), Some(c.w), c.bias, c.residual, Some(c.y)]
            .iter()
            .flatten()
            .all(|l| rec.ptr(*l).is_multiple_of(2 * es as u64));
    let pairs = n.div_ceil(c.y_shape[3]) / 2 * c.y_shape[3].div_ceil(kernels::DWC2_OUT);
    // With few threads (batch 1) the 4-output kernel fills the GPU better
    // (measured: convnext_base fp16 batch 1 1.04 ms with it, 1.21 with the
    // pair kernel; batch 64 13.1 ms vs 10.2 ms).
    let pair_ok = pair_ok && pairs >= DWC2_MIN_THREADS;
    // (7×7 only: the 3×3 pair kernel, MobileNetV2's, was not measured.)
    // The register-window kernels: 4 outputs of a row per thread.
    let quads = n.div_ceil(c.y_shape[3]) * c.y_shape[3].div_ceil(4);
    let (kernel, threads_older) = match (fast, c.w_shape[3]) {
        (true, 7) if pair_ok => ("dwconv_c2_k7", pairs),
        (true, 3) => ("dwconv_s1_k3", quads),
        (true, 7) => ("dwconv_s1_k7", quads),
        _ => ("dwconv", n),
    };
    let params = DwP {
        v: vi,
        p0,
        p1,
        whwc: c.nhwc as i32,
        pad: 0,
        xs: strides4(&c.x_shape, c.nhwc),
        ys: strides4(&c.y_shape, c.nhwc),
    };
    let ptrs = [
        rec.ptr(c.x),
        rec.ptr(c.w),
        c.bias.map_or(0, &|l| rec.ptr(l)),
        c.residual.map_or(0, &|l| rec.ptr(l)),
        rec.ptr(c.y),
    ];
    let launch = |name: &str, threads: usize| {
        let mut args: Vec<Arg> = ptrs.iter().map(|&p| Arg::Ptr(p)).collect();
        args.push(Arg::Dw(Box::new(params)));
        vec![Launch::Kernel {
            func: rec.func(name),
            grid: elementwise_grid(threads),
            block: BLOCK,
            shared: 0,
            args,
        }]
    };
    // The vector kernels first: where nothing is timed (an MPS client with part of the
    // threads) the first of them is kept.
    let (mut names, threads): (Vec<String>, Vec<usize>) =
        dw_vec_kernels(rec, c, &ptrs).into_iter().unzip();
    names.push(kernel.to_string());
    let mut paths: Vec<TimedPath> = names
        .iter()
        .zip(threads.into_iter().chain([threads_older]))
        .map(|(name, t)| (launch(name, t), f32::INFINITY))
        .collect();
    let chosen = fastest_of(m, rec, &mut paths)?;
    if rec.options.search_log && paths.len() > 1 {
        let times: Vec<String> = names
            .iter()
            .zip(&paths)
            .map(|(name, (_, ms))| format!("{name} {ms:.4} ms"))
            .collect();
        log_conv_search("depthwise", c, &times, chosen);
    }
    m.launches.extend(paths.swap_remove(chosen).0);
    Ok(())
}

/// The vectorised depthwise kernels (`kernels::DW_VEC_SHAPES`) that can run `c`, with their
/// thread counts: NHWC, one filter per channel, whole 16-byte vectors of channels, horizontal
/// dilation 1, the kernel width and horizontal stride of a compiled shape, aligned operands
/// (`ptrs`) and 32-bit indices.
pub(super) fn dw_vec_kernels(rec: &Recorder, c: &ConvStep, ptrs: &[u64]) -> Vec<(String, usize)> {
    let lanes = rec.vec_lanes();
    let [n, ch, _, _] = c.x_shape;
    let [_, m_out, oh, ow] = c.y_shape;
    if !c.nhwc
        || m_out != ch
        || !ch.is_multiple_of(lanes)
        || c.dilations[1] != 1
        || !vec_aligned(ptrs)
    {
        return Vec::new();
    }
    kernels::DW_VEC_SHAPES
        .iter()
        .filter(|&&(kw, sw, _)| kw == c.w_shape[3] && sw == c.strides[1])
        .map(|&(kw, sw, outs)| {
            let threads = n * oh * ow.div_ceil(outs) * (ch / lanes);
            (kernels::dw_vec_name(kw, sw, outs), threads)
        })
        .filter(|&(_, threads)| threads <= i32::MAX as usize)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{stem_refusal, stem_shared, ConvStep};
    use crate::plan::{DType, Loc};

    fn conv(x: [usize; 4], w: [usize; 4], s: usize, p: usize) -> ConvStep {
        let at = |id| Loc::Storage { id, offset: 0 };
        let o = |i: usize| (x[2 + i] + 2 * p - w[2 + i]) / s + 1;
        ConvStep {
            x: at(0),
            w: Loc::Const { id: 0, offset: 0 },
            bias: None,
            residual: None,
            y: at(1),
            x_shape: x,
            w_shape: w,
            y_shape: [x[0], w[0], o(0), o(1)],
            pads: [p, p],
            strides: [s, s],
            dilations: [1, 1],
            groups: 1,
            act: None,
            nhwc: true,
            col: Some(at(2)),
        }
    }

    /// The launch's `StemP` is the kernel's: 20 ints, then two floats, no padding.
    #[test]
    fn the_stem_parameters_match_the_kernels_struct() {
        let src = crate::kernels::source(DType::F16);
        let at = src.find("struct StemP {").expect("the kernel's struct") + "struct StemP {".len();
        let body = &src[at..at + src[at..].find("};").expect("closed")];
        let count = |ty: &str| {
            body.split(';')
                .filter_map(|f| f.trim().strip_prefix(ty))
                .map(|names| names.split(',').count())
                .sum::<usize>()
        };
        assert_eq!((count("int "), count("float ")), (20, 2), "{body}");
        assert_eq!(std::mem::size_of::<super::StemP>(), 22 * 4);
    }

    /// The direct kernel takes the stems of resnet, mobilenet and ConvNeXt at 16-bit
    /// precisions on sm_80 and newer, and says why it refuses the rest.
    #[test]
    fn the_stem_kernel_takes_few_channel_stems_and_says_why_not_others() {
        let resnet = conv([64, 3, 224, 224], [64, 3, 7, 7], 2, 3);
        let mobilenet = conv([1, 3, 224, 224], [32, 3, 3, 3], 2, 1);
        let convnext = conv([8, 3, 224, 224], [128, 3, 4, 4], 4, 0);
        for c in [&resnet, &mobilenet, &convnext] {
            for d in [DType::F16, DType::Bf16] {
                assert_eq!(stem_refusal(d, (9, 0), c), None, "{c:?}");
                assert_eq!(stem_refusal(d, (8, 0), c), None);
            }
            assert!(stem_shared(c) <= 48 * 1024);
        }
        // resnet's: weights 64 × (160 + 8) halves, 160 offsets, a patch of 13 × 37 × 3.
        assert_eq!(
            stem_shared(&resnet),
            (64 * 168 * 2 + 160 * 4 + 13 * 37 * 3 * 2usize).div_ceil(16) * 16
        );
        let why = |d, arch, c: &ConvStep| stem_refusal(d, arch, c).expect("refused");
        assert!(why(DType::F32, (9, 0), &resnet).contains("16-bit"));
        assert!(why(DType::F16, (7, 5), &resnet).contains("sm_80"));
        let wide = conv([1, 16, 56, 56], [64, 16, 3, 3], 1, 1);
        assert!(why(DType::F16, (9, 0), &wide).contains("C = 16 > 4"));
        let odd = conv([1, 3, 56, 56], [24, 3, 3, 3], 1, 1);
        assert!(why(DType::F16, (9, 0), &odd).contains("M = 24"));
        let vit = conv([1, 3, 224, 224], [768, 3, 16, 16], 16, 0);
        assert!(why(DType::F16, (9, 0), &vit).contains("M = 768"));
        let skip = ConvStep {
            residual: Some(Loc::Storage { id: 3, offset: 0 }),
            ..resnet.clone()
        };
        assert!(why(DType::F16, (9, 0), &skip).contains("residual"));
        let nchw = ConvStep {
            nhwc: false,
            ..resnet.clone()
        };
        assert!(why(DType::F16, (9, 0), &nchw).contains("NHWC"));
        let huge = conv([1, 3, 224, 12000], [64, 3, 7, 7], 2, 3);
        assert!(why(DType::F16, (9, 0), &huge).contains("too large"));
    }
}
