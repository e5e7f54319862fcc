//! Recording of a [`StepKind::QuantGemm`] (`crate::int8`, docs/cuda.md "int8 and fp8"): the
//! im2col of a convolution that is not a direct GEMM, the quantize kernel, the cuBLASLt int8
//! (or fp8) GEMM and the dequantizing epilogue kernel.
//!
//! A child of `model` (declared there) so that it records launches as every other step does.
//!
//! cuBLASLt's layouts: row-major `acc[M, N] = xq[M, K] · w[N, K]ᵀ` is column-major
//! `accᵀ[N, M] = op(A) · B` with A = w (`[K, N]` column-major, ld K, transposed) and B = xq
//! (`[K, M]` column-major, ld K, not transposed): the "TN" format, the only one Hopper's int8
//! IMMA kernels take in plain column order (the COL32 orders are Turing's and Ampere's) and
//! the one the FP8 kernels require. int8: `CUBLAS_COMPUTE_32I`, scale type `CUDA_R_32I`,
//! D `CUDA_R_32I`. fp8: `CUBLAS_COMPUTE_32F`, A and B `CUDA_R_8F_E4M3`, C and D `CUDA_R_32F`
//! (unit scales: the epilogue applies them per channel, which the FP8 kernels' tensor-wide
//! scale pointers cannot).

use super::*;
use crate::plan::{QuantFloat, QuantGemmStep};
use isolane_engine::quant::QuantType;

/// The descriptor (its SM count target `sms`: `set_sm_target`) and layouts of one quantized
/// GEMM shape.
fn quant_descriptors(q: &QuantGemmStep, sms: i32) -> Result<crate::handles::LtMatmulDescs> {
    let int8 = q.qtype == QuantType::Int8;
    let (compute, scale_t, in_t, out_t) = if int8 {
        (
            lt::cublasComputeType_t::CUBLAS_COMPUTE_32I,
            lt::cudaDataType::CUDA_R_32I,
            lt::cudaDataType::CUDA_R_8I,
            lt::cudaDataType::CUDA_R_32I,
        )
    } else {
        (
            lt::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            lt::cudaDataType::CUDA_R_32F,
            lt::cudaDataType::CUDA_R_8F_E4M3,
            lt::cudaDataType::CUDA_R_32F,
        )
    };
    let mut desc: lt::cublasLtMatmulDesc_t = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    lt_check("cublasLtMatmulDescCreate", unsafe {
        lt::cublasLtMatmulDescCreate(&mut desc, compute, scale_t)
    })?;
    set_sm_target(desc, sms);
    let (t, n): (i32, i32) = (1, 0);
    set_attr(
        desc,
        lt::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
        &t,
    )?;
    set_attr(
        desc,
        lt::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSB,
        &n,
    )?;
    let a = layout(in_t, q.k, q.n, q.k, 1, 0)?;
    let b = layout(in_t, q.k, q.m, q.k, 1, 0)?;
    let d = layout(out_t, q.n, q.m, q.n, 1, 0)?;
    Ok((desc, a, b, d))
}

/// The step's launches: the fastest of its int8 GEMM (im2col, quantize, GEMM, epilogue),
/// cuDNN's int8 convolution and the float step ([`QuantAlternatives`]), timed as they will run
/// (captured in a graph, as `record_conv` times a convolution's paths).
pub(super) fn record_quant_gemm(
    m: &mut CudaModel,
    rec: &Recorder,
    caches: &mut LibraryCaches,
    (name, err): (&str, &dyn Fn(EngineError) -> EngineError),
    q: &QuantGemmStep,
) -> Result<()> {
    let start = m.launches.len();
    record_int8_gemm(m, rec, caches, (name, err), q)?;
    let Some(alt) = q.alt.as_deref() else {
        return Ok(());
    };
    let gemm = m.launches.split_off(start);
    // Each candidate is built whatever is chosen, in this order, so that a saved plan's
    // choices (the float convolution's own, then the pick) replay in the order they were made.
    let not_planned = || {
        Err(EngineError::Runtime(
            "not planned (a Linear, or C or N not a multiple of 4)".into(),
        ))
    };
    let mut paths: [Result<Vec<Launch>>; PATHS] = [
        Ok(gemm),
        not_planned(),
        Err(EngineError::Runtime("not built".into())),
        not_planned(),
        Err(EngineError::Runtime(
            "no im2col of floats to replace (a direct 1×1, a Linear, or x already bytes)".into(),
        )),
        Err(EngineError::Runtime("not built".into())),
        Err(EngineError::Runtime("not built".into())),
    ];
    if let Some(dc) = &alt.dnn_conv {
        paths[1] = match q.qtype {
            QuantType::Int8 => dnn_int8_conv(m, rec, q, alt.xb, dc),
            _ => Err(EngineError::Runtime(
                "cuDNN's legacy API has no float8 convolution".into(),
            )),
        };
    }
    // The float path records its convolution's kept path (crate::rebuild); kept only if the
    // float path is.
    let conv_paths_before = m.conv_paths.len();
    paths[FLOAT_PATH] = float_path(m, rec, caches, err, q, &alt.float);
    // An untimed build keeps the int8 GEMM unless the graph is forced, and a forced path is
    // kept untimed: otherwise the graph's plan (and a runtime-fusion engine's compile) would
    // be made for nothing.
    let graph_choosable = match rec.options.quant_paths.forced() {
        Some(forced) => forced == GRAPH_PATH,
        None => !rec.options.first_choice,
    };
    match &alt.dnn_conv {
        Some(dc) if graph_choosable => {
            paths[GRAPH_PATH] = dnn_conv_graph(m, rec, caches, (name, q), alt, dc);
        }
        Some(_) => {
            paths[GRAPH_PATH] = Err(EngineError::Runtime(
                "not built: an untimed build keeps the int8 GEMM, a forced path is kept untimed"
                    .into(),
            ))
        }
        None => {}
    }
    if let (Some(c), Some(xb), Ok(gemm)) = (&q.conv, alt.xb, &paths[0]) {
        if !q.x_quantized {
            paths[4] = quantized_before_im2col(rec, q, c, xb, gemm);
        }
    }
    // The own kernel in place of the GEMM and the epilogue of paths 0 and 4 (their last two
    // launches), before either takes its copy's quantize below. Built where forced, asked to
    // be timed (`fastest-own`), or by default on compute capability 9.0
    // (`QuantPaths::builds_own`: elsewhere its `mma.sync` form lost to cuDNN on every layer).
    if rec.options.quant_paths.builds_own(rec.arch) {
        paths[OWN_PATH] = match &paths[0] {
            Ok(gemm) => own_gemm(rec, q, gemm),
            Err(_) => Err(EngineError::Runtime(
                "no GEMM path to take the rows of".into(),
            )),
        };
        paths[OWN_BYTES_PATH] = match &paths[4] {
            Ok(bytes) => own_gemm(rec, q, bytes),
            Err(_) => Err(EngineError::Runtime(
                "no bytes' im2col to take the rows of".into(),
            )),
        };
    } else {
        for p in [OWN_PATH, OWN_BYTES_PATH] {
            paths[p] = Err(EngineError::Runtime(
                "not built unless asked off compute capability 9.0 (ISOLANE_CUDA_QUANT=own / \
                 own-bytes / fastest-own): its mma.sync form lost to cuDNN on every layer"
                    .into(),
            ));
        }
    }
    // y's bytes for the next GEMMs (after path 4 took the GEMM path's last two launches):
    // a quantize kernel after each path but the graph and the own kernel, which write them
    // themselves (the graph where it can).
    if let Some((yc, s)) = q.y_copy {
        let fp8 = q.qtype != QuantType::Int8;
        for (i, p) in paths.iter_mut().enumerate() {
            if let (false, Ok(l)) = (writes_own_copy(i), p) {
                l.push(quantize_launch(rec, q.y, yc, s, q.m * q.n, fp8));
            }
        }
    }
    let what = format!("the quantized product `{name}`");
    let saved = rec.choices.borrow_mut().pick(paths.len(), &what)?;
    let mut log_at = None;
    let (chosen, times) = match saved {
        Some(i) => (i, [None; PATHS]),
        None => {
            let built = paths.each_ref().map(|p| p.is_ok());
            let forced = rec.options.quant_paths.forced();
            let times = if rec.options.first_choice || forced.is_some() {
                [None; PATHS]
            } else {
                time_paths(m, rec, &paths).map_err(err)?
            };
            let i = match forced {
                Some(f) if built[f] => f,
                _ => choose_path(&built, &times),
            };
            log_at = rec
                .choices
                .borrow_mut()
                .note(crate::saved::Choice::Pick(i as u32));
            (i, times)
        }
    };
    m.quant_choices.push((name.to_string(), chosen));
    if chosen != FLOAT_PATH {
        m.conv_paths.truncate(conv_paths_before);
    }
    let plain = rec.options.quant_float_plain() && !q.x_quantized;
    if plain && chosen == FLOAT_PATH {
        m.plain_float_layers.push(name.to_string());
    }
    if rec.options.search_log {
        eprintln!(
            "{}",
            describe_choice(name, q.qtype, (plain, rec.dtype), &paths, &times, chosen)
        );
    }
    // Timed, the graph lost here alone: kept for the whole-model comparison
    // ([`keep_faster_whole`]), where the conversions around the layer count too.
    if chosen != GRAPH_PATH && times[GRAPH_PATH].is_some() {
        let graph = std::mem::replace(
            &mut paths[GRAPH_PATH],
            Err(EngineError::Runtime("kept aside".into())),
        );
        if let Ok(launches) = graph {
            caches.graph_alts.push(GraphAlt {
                step: m.step_start.len().saturating_sub(1),
                launches,
                log_at,
                choice: m.quant_choices.len() - 1,
            });
        }
    }
    let launches = paths
        .into_iter()
        .nth(chosen)
        .unwrap_or_else(|| Err(EngineError::Runtime("no such candidate".into())))
        .map_err(|e| {
            err(EngineError::Runtime(format!(
                "the saved plan chose path {chosen} of {what}, which cannot be built here: {e}"
            )))
        })?;
    m.launches.extend(launches);
    Ok(())
}

/// A quantized product whose cuDNN graph was timed and lost to another candidate alone.
pub(super) struct GraphAlt {
    /// Its step (`m.step_start` index).
    step: usize,
    /// The graph path's launches.
    launches: Vec<Launch>,
    /// Its pick's place in the choice log, where the build records one.
    log_at: Option<usize>,
    /// Its entry in `m.quant_choices`.
    choice: usize,
}

/// Chooses per chain, not only per layer: the model's steps as each layer chose, timed whole
/// against the same steps with cuDNN's fused quantized graph wherever it planned and was
/// timed; the faster whole is kept. Per layer the graph often wins the 3×3s and loses the
/// 1×1s at batch 1 (resnet50 on the H200: layer1.0.conv1 plain fp16 0.0076 ms, graph 0.0107),
/// but a layer timed alone is timed warm and in isolation; timed whole, what runs between
/// layers and the caches' state count as the job sees them. Called once every step is
/// recorded (`m.step_start` complete) and before the output copies; a replayed build never
/// stashes an alternative (its picks are the saved plan's, which this rewrote when it was
/// recorded).
pub(super) fn keep_faster_whole(
    m: &mut CudaModel,
    rec: &Recorder,
    caches: &mut LibraryCaches,
) -> Result<()> {
    let alts = std::mem::take(&mut caches.graph_alts);
    if m.step_start.len() != m.steps + 1 || m.names.len() != m.launches.len() {
        return Ok(());
    }
    let quantize = rec.func("quantize_q8");
    let chosen = chosen_per_step(rec.plan, &m.quant_choices);
    let recorded = (
        std::mem::take(&mut m.launches),
        std::mem::take(&mut m.names),
        std::mem::take(&mut m.step_start),
    );
    let ptr = |l: Loc| rec.ptr(l);
    let [layer, graph] = wholes(
        rec.plan,
        (&recorded.0, &recorded.1, &recorded.2),
        &alts,
        &chosen,
        (quantize, &ptr),
    );
    let first = recorded.2[0];
    let layer_dropped = layer.3;
    (m.launches, m.names, m.step_start) = (layer.0, layer.1, layer.2);
    if alts.is_empty() {
        if rec.options.search_log && layer_dropped > 0 {
            eprintln!(
                "search: quantized copies no kept path reads: {layer_dropped} quantize kernels \
                 left out"
            );
        }
        return Ok(());
    }
    let end = m.step_start[m.steps];
    let per_layer: Vec<Launch> = m.launches[first..end].to_vec();
    let (full, full_names, starts, graph_dropped) = graph;
    let all_graph = full[first..].to_vec();
    let (n_layer, n_graph) = (per_layer.len(), all_graph.len());
    let mut timed: Vec<TimedPath> = vec![(per_layer, f32::INFINITY), (all_graph, f32::INFINITY)];
    time_candidates(m, rec, &mut timed)?;
    let (t_layer, t_graph) = (timed[0].1, timed[1].1);
    let graph_wins = whole_graph_wins(t_layer, t_graph);
    if rec.options.search_log {
        eprintln!(
            "search: quantized chain, whole model: per-layer choice {} ({n_layer} launches), \
             cudnn graph also for the {} layers it lost alone {} ({n_graph} launches); kept {} \
             (unread quantized copies left out: {layer_dropped} and {})",
            ms_or_failed(t_layer),
            alts.len(),
            ms_or_failed(t_graph),
            if graph_wins {
                "the graph chain"
            } else {
                "the per-layer choice"
            },
            graph_dropped
        );
    }
    if !graph_wins {
        return Ok(());
    }
    (m.launches, m.names, m.step_start) = (full, full_names, starts);
    let mut log = rec.choices.borrow_mut();
    for a in &alts {
        if let Some(at) = a.log_at {
            log.renote(at, crate::saved::Choice::Pick(GRAPH_PATH as u32));
        }
        m.conv_paths.retain(|p| p.step != a.step);
        if let Some(c) = m.quant_choices.get_mut(a.choice) {
            c.1 = GRAPH_PATH;
            let name = c.0.clone();
            m.plain_float_layers.retain(|l| *l != name);
        }
    }
    Ok(())
}

/// A model's launches, their step names, its steps' starts and how many unread copies'
/// quantize kernels were left out.
type Whole = (Vec<Launch>, Vec<String>, Vec<usize>, usize);

/// The two wholes the chain comparison times, from the launches as recorded (`recorded`:
/// launches, names, step starts; every producer's copy written): the per-layer picks
/// `chosen`, and the same with each step of `alts` on its graph path; each without the
/// quantize kernels of copies it leaves unread. The graph chain is spliced from the recorded
/// launches, not the per-layer whole, since a copy no per-layer pick reads may be read by a
/// reader's graph.
fn wholes(
    plan: &Plan,
    recorded: (&[Launch], &[String], &[usize]),
    alts: &[GraphAlt],
    chosen: &[Option<usize>],
    (quantize, ptr): (usize, &dyn Fn(Loc) -> u64),
) -> [Whole; 2] {
    let (launches, names, step_start) = recorded;
    let first = step_start.first().copied().unwrap_or(0);
    let dead = unread_copies(plan, chosen, (launches, step_start), quantize, ptr);
    let (l, n, st) = without_launches(launches, names, step_start, &dead);
    let layer = (l, n, st, dead.len());
    let step_names: Vec<&str> = plan.steps.iter().map(|s| s.name.as_str()).collect();
    let (spliced, starts, spliced_names) = splice_steps(launches, step_start, alts, &step_names);
    let mut full = launches[..first.min(launches.len())].to_vec();
    full.extend(spliced);
    let mut full_names = names[..first.min(names.len())].to_vec();
    full_names.extend(spliced_names);
    let mut graph_chosen = chosen.to_vec();
    for a in alts {
        if let Some(c) = graph_chosen.get_mut(a.step) {
            *c = Some(GRAPH_PATH);
        }
    }
    let dead = unread_copies(plan, &graph_chosen, (&full, &starts), quantize, ptr);
    let (l, n, st) = without_launches(&full, &full_names, &starts, &dead);
    [layer, (l, n, st, dead.len())]
}

/// Per plan step, the quantized product's kept candidate (`None` for any other step; 0, the
/// int8 GEMM, for one without alternatives): `choices` holds one per product with
/// alternatives, in step order (`record_quant_gemm`).
fn chosen_per_step(plan: &Plan, choices: &[(String, usize)]) -> Vec<Option<usize>> {
    let mut it = choices.iter();
    plan.steps
        .iter()
        .map(|s| match &s.kind {
            StepKind::QuantGemm(q) if q.alt.is_some() => it.next().map(|c| c.1),
            StepKind::QuantGemm(_) => Some(0),
            _ => None,
        })
        .collect()
}

/// Whether quantized product `q`, running candidate `chosen`, reads the bytes at `copy` (a
/// producer's `y_copy`): as its ready rows (the int8 GEMM), as cuDNN's x (its convolution
/// and graph), or as its own x bytes (the float step dequantizes them).
fn reads_copy(q: &QuantGemmStep, chosen: usize, copy: Loc) -> bool {
    let dnn_x = q
        .alt
        .as_ref()
        .and_then(|a| a.dnn_conv.as_ref())
        .map(|c| c.x);
    // A residual of bytes is read on every path.
    if q.residual_scale.is_some() && q.residual == Some(copy) {
        return true;
    }
    match chosen {
        0 | OWN_PATH => q.xq_ready && q.xq == copy,
        1 | GRAPH_PATH => dnn_x == Some(copy),
        FLOAT_PATH => q.x_quantized && q.x == copy,
        _ => false,
    }
}

/// The launches (indices into `launches`, whose steps start at `step_start`) of the quantize
/// kernels that write a producer's quantized copy of its output which no step reads with the
/// candidates `chosen`: a copy is made for the next direct GEMM, and where that one keeps the
/// plain float step it would be quantized for nothing. Only a step's last launch is one (the
/// quantize every path but a two-output graph ends with).
fn unread_copies(
    plan: &Plan,
    chosen: &[Option<usize>],
    (launches, step_start): (&[Launch], &[usize]),
    quantize: usize,
    ptr: &dyn Fn(Loc) -> u64,
) -> Vec<usize> {
    let mut dead = Vec::new();
    for (s, step) in plan.steps.iter().enumerate() {
        let StepKind::QuantGemm(q) = &step.kind else {
            continue;
        };
        let Some((copy, _)) = q.y_copy else {
            continue;
        };
        let read = plan
            .steps
            .iter()
            .zip(chosen)
            .any(|(r, c)| match (&r.kind, c) {
                (StepKind::QuantGemm(rq), Some(c)) => reads_copy(rq, *c, copy),
                _ => false,
            });
        let (Some(&a), Some(&b)) = (step_start.get(s), step_start.get(s + 1)) else {
            continue;
        };
        if read || b <= a || b > launches.len() {
            continue;
        }
        if let Launch::Kernel { func, args, .. } = &launches[b - 1] {
            let into_copy = matches!(args.get(1), Some(Arg::Ptr(p)) if *p == ptr(copy));
            if *func == quantize && into_copy {
                dead.push(b - 1);
            }
        }
    }
    dead
}

/// `launches` and their `names` without the launches at `dead` (sorted), and the steps'
/// starts moved back by the launches left out before each.
fn without_launches(
    launches: &[Launch],
    names: &[String],
    step_start: &[usize],
    dead: &[usize],
) -> (Vec<Launch>, Vec<String>, Vec<usize>) {
    let keep = |i: &usize| dead.binary_search(i).is_err();
    let l = (0..launches.len())
        .filter(keep)
        .map(|i| launches[i].clone())
        .collect();
    let n = (0..names.len())
        .filter(keep)
        .map(|i| names[i].clone())
        .collect();
    let starts = step_start
        .iter()
        .map(|&st| st - dead.partition_point(|&d| d < st))
        .collect();
    (l, n, starts)
}

/// The steps' launches (`launches[step_start[0]..step_start[steps]]`) with those of each step
/// in `alts` (in step order) replaced by its graph path's: the launches, each step's new start
/// (from `step_start[0]`, one more entry for the end) and each launch's step name.
fn splice_steps(
    launches: &[Launch],
    step_start: &[usize],
    alts: &[GraphAlt],
    step_names: &[&str],
) -> (Vec<Launch>, Vec<usize>, Vec<String>) {
    let steps = step_start.len().saturating_sub(1);
    let first = step_start.first().copied().unwrap_or(0);
    let mut starts = Vec::with_capacity(steps + 1);
    let mut out = Vec::with_capacity(launches.len());
    let mut names = Vec::with_capacity(launches.len());
    let mut alt_of = alts.iter().peekable();
    for s in 0..steps {
        starts.push(first + out.len());
        let own = &launches[step_start[s]..step_start[s + 1]];
        let these = match alt_of.next_if(|a| a.step == s) {
            Some(a) => &a.launches[..],
            None => own,
        };
        out.extend(these.iter().cloned());
        let name = step_names.get(s).copied().unwrap_or_default();
        names.extend(std::iter::repeat_n(name.to_string(), these.len()));
    }
    starts.push(first + out.len());
    (out, starts, names)
}

/// Whether the all-graph chain is kept: it ran and was faster (a whole that failed to run,
/// NaN, is never kept; the per-layer choice is kept on a tie, and where it failed to run).
pub(crate) fn whole_graph_wins(per_layer_ms: f32, all_graph_ms: f32) -> bool {
    all_graph_ms.is_finite() && (per_layer_ms.is_nan() || all_graph_ms < per_layer_ms)
}

fn ms_or_failed(ms: f32) -> String {
    match ms.is_finite() {
        true => format!("{ms:.4} ms"),
        false => "failed to run".to_string(),
    }
}

/// The candidates of a quantized product ([`crate::plan::QuantAlternatives`], then the own
/// kernel after path 0's and path 4's rows).
const PATHS: usize = 7;
/// The float step's place among them.
const FLOAT_PATH: usize = 2;
/// cuDNN's fused quantized graph's.
const GRAPH_PATH: usize = 3;
/// The own tensor-core GEMM with its epilogue fused (`qgemm_i8` / `qgemm_f8`), on the rows
/// path 0 makes (none made where x is already the rows' bytes).
const OWN_PATH: usize = 5;
/// The same on the rows path 4 makes (x quantized whole, its bytes im2col'ed).
const OWN_BYTES_PATH: usize = 6;

/// Whether candidate `path` writes the producer's copy of y itself (no quantize after it).
fn writes_own_copy(path: usize) -> bool {
    matches!(path, GRAPH_PATH | OWN_PATH | OWN_BYTES_PATH)
}

/// The candidates' best times where they are timed (`None`: not built, or failed to run).
fn time_paths(
    m: &mut CudaModel,
    rec: &Recorder,
    paths: &[Result<Vec<Launch>>; PATHS],
) -> Result<[Option<f32>; PATHS]> {
    let built: Vec<usize> = (0..PATHS).filter(|&i| paths[i].is_ok()).collect();
    let mut timed: Vec<TimedPath> = built
        .iter()
        .map(|&i| match &paths[i] {
            Ok(l) => (l.clone(), f32::INFINITY),
            Err(_) => (Vec::new(), f32::NAN),
        })
        .collect();
    time_candidates(m, rec, &mut timed)?;
    let mut times = [None; PATHS];
    for (&i, (_, ms)) in built.iter().zip(&timed) {
        times[i] = ms.is_finite().then_some(*ms);
    }
    Ok(times)
}

/// Which candidate runs: the fastest timed one; on a tie or where nothing was timed the
/// earliest built (the int8 GEMM first: it is what ran before this choice existed).
pub(crate) fn choose_path(built: &[bool; PATHS], times: &[Option<f32>; PATHS]) -> usize {
    let timed = (0..PATHS)
        .filter_map(|i| times[i].map(|t| (i, t)))
        .min_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
    match timed {
        Some((i, _)) => i,
        None => (0..PATHS).find(|&i| built[i]).unwrap_or(0),
    }
}

/// The per-layer line of the search log: each candidate's time or why it was not built, and
/// the one kept.
fn describe_choice(
    name: &str,
    qtype: QuantType,
    (plain, dtype): (bool, crate::plan::DType),
    paths: &[Result<Vec<Launch>>; PATHS],
    times: &[Option<f32>; PATHS],
    chosen: usize,
) -> String {
    let label = [
        format!("{qtype} gemm"),
        format!("cudnn {qtype} conv"),
        float_label(plain, dtype),
        format!("cudnn {qtype} graph"),
        format!("{qtype} gemm, quantized before its im2col"),
        format!("{qtype} own gemm"),
        format!("{qtype} own gemm, quantized before its im2col"),
    ];
    let each: Vec<String> = (0..PATHS)
        .map(|i| match (&paths[i], times[i]) {
            (Err(e), _) => format!("{}: none ({e})", label[i]),
            (Ok(_), Some(t)) => format!("{} {t:.4} ms", label[i]),
            (Ok(_), None) => format!("{} untimed", label[i]),
        })
        .collect();
    format!(
        "search: quantized `{name}`: {}; kept {}",
        each.join(", "),
        label[chosen]
    )
}

/// The float candidate as the search log names it: "plain fp16" (the activation dtype) where
/// it reads x unquantized, so that the log says which layers kept the float model's arithmetic.
/// Both start "float" (`scripts/int8-h200.sh` counts the kept float steps by it).
fn float_label(plain: bool, dtype: crate::plan::DType) -> String {
    use crate::plan::DType;
    let d = match dtype {
        DType::F32 => "fp32",
        DType::F16 => "fp16",
        DType::Bf16 => "bf16",
    };
    match plain {
        true => format!("float (plain {d})"),
        false => "float (fake-quant)".to_string(),
    }
}

/// The int8 (fp8) GEMM path with x quantized whole first (into `xb`, one byte per element)
/// and its bytes im2col'ed (`im2col_b4`, 4 channels per word) instead of an im2col of floats
/// quantized after: the same bytes (a padding zero quantizes to 0), a ninth of the quantize
/// work for a 3×3 and half the im2col's bytes at fp16. `gemm` is the GEMM path's launches,
/// whose last two (the GEMM, the epilogue) it shares.
fn quantized_before_im2col(
    rec: &Recorder,
    q: &QuantGemmStep,
    c: &ConvStep,
    xb: Loc,
    gemm: &[Launch],
) -> Result<Vec<Launch>> {
    let n: usize = c.x_shape.iter().product();
    let fp8 = q.qtype != QuantType::Int8;
    let im2col = im2col_bytes_launch(rec, &ConvStep { x: xb, ..c.clone() }, q.xq)?;
    let tail = gemm
        .len()
        .checked_sub(2)
        .ok_or_else(|| EngineError::Runtime("a GEMM path without its GEMM".into()))?;
    let mut l = vec![quantize_launch(rec, q.x, xb, q.x_scale, n, fp8), im2col];
    l.extend(gemm[tail..].iter().cloned());
    Ok(l)
}

/// cuDNN's graph API on the quantized bytes: x quantized whole (unless its producer left it
/// in bytes, or an earlier step made them), one fused graph (convolution with int32 sums,
/// per-channel scale, f32 bias, residual, ReLU, and where the step's output is bytes the
/// multiply by the inverse output scale and the conversion to int8 / e4m3) writing the
/// step's output. The heuristics' first plan that finalizes here, one per distinct spec
/// (the layers of one shape share it); where cuDNN makes none, the reason, said once per build.
fn dnn_conv_graph(
    m: &mut CudaModel,
    rec: &Recorder,
    caches: &mut LibraryCaches,
    (name, q): (&str, &QuantGemmStep),
    alt: &crate::plan::QuantAlternatives,
    dc: &ConvStep,
) -> Result<Vec<Launch>> {
    let consts = alt.graph.as_ref().ok_or_else(|| {
        EngineError::Runtime(
            "not planned (an activation other than none, ReLU or ReLU6, or a computed bias)".into(),
        )
    })?;
    let c = ConvStep {
        bias: consts.bias,
        residual: q.residual,
        act: q.act,
        y: q.y,
        ..dc.clone()
    };
    let quant_out = q.y_scale.is_some();
    let residual_quant = q.residual_scale.is_some();
    if (quant_out || residual_quant) != consts.y_inv.is_some()
        || residual_quant != consts.scale.is_some()
    {
        return Err(EngineError::Runtime(
            "the plan's graph constants and the step's output or residual disagree".into(),
        ));
    }
    let mut spec = ConvGraphSpec::quantized(&c, q.qtype, rec.dtype, quant_out)
        .ok_or_else(|| EngineError::Runtime("its activation is not none, ReLU or ReLU6".into()))?;
    if let Some(r) = q.residual_scale {
        // Added as read (the constants divided by r): the clip too.
        spec.residual_quant = true;
        spec.relu_max = spec.relu_max.map(|m| m / r);
    }
    let copy = match (q.y_copy, consts.copy_inv) {
        (Some((l, _)), Some(inv)) => Some((l, inv)),
        (None, None) => None,
        _ => {
            return Err(EngineError::Runtime(
                "the plan's inverse scale of y's quantized copy and the step's copy disagree"
                    .into(),
            ))
        }
    };
    let ptrs = ConvGraphPtrs {
        x: rec.ptr(c.x),
        w: rec.ptr(c.w),
        y: rec.ptr(c.y),
        bias: c.bias.map_or(0, |b| rec.ptr(b)),
        residual: c.residual.map_or(0, |r| rec.ptr(r)),
        workspace: 0,
        scale: rec.ptr(consts.scale.unwrap_or(q.scale)),
        y_scale: consts
            .y_inv
            .or(copy.map(|(_, inv)| inv))
            .map_or(0, |l| rec.ptr(l)),
        y_copy: copy.map_or(0, |(l, _)| rec.ptr(l)),
    };
    // The graph's tensors are declared 16-byte aligned.
    let p = &ptrs;
    if !vec_aligned(&[
        p.x, p.w, p.y, p.bias, p.residual, p.scale, p.y_scale, p.y_copy,
    ]) {
        return Err(EngineError::Runtime(
            "a tensor of it is not 16-byte aligned".into(),
        ));
    }
    // With y's quantized copy: the graph that writes both, else (cuDNN makes no plan of it)
    // the graph writing y and a quantize kernel after it.
    let mut tail = None;
    let made = match copy {
        Some(_) => {
            let both = ConvGraphSpec {
                quant_copy: true,
                ..spec.clone()
            };
            match quant_graph_of(m, rec, caches, (name, q), &both) {
                Ok(g) => Ok(g),
                Err(_) => {
                    let (yc, s) = q.y_copy.unwrap_or((q.y, 1.0));
                    let fp8 = q.qtype != QuantType::Int8;
                    tail = Some(quantize_launch(rec, q.y, yc, s, q.m * q.n, fp8));
                    quant_graph_of(m, rec, caches, (name, q), &spec)
                }
            }
        }
        None => quant_graph_of(m, rec, caches, (name, q), &spec),
    };
    let graph = made?;
    let ptrs = ConvGraphPtrs {
        y_copy: if tail.is_some() { 0 } else { ptrs.y_copy },
        ..ptrs
    };
    let mut l = Vec::new();
    if let Some(xb) = alt.xb {
        let n: usize = c.x_shape.iter().product();
        let fp8 = q.qtype != QuantType::Int8;
        l.push(quantize_launch(rec, q.x, xb, q.x_scale, n, fp8));
    }
    l.push(Launch::ConvGraph {
        graph,
        ptrs: Box::new(ptrs),
    });
    l.extend(tail);
    Ok(l)
}

/// The plan of quantized graph `spec` (an index into `m.conv_graphs`): the one made for an
/// equal spec earlier in this build, else cuDNN's first that finalizes; where cuDNN makes
/// none, why (said once per build).
fn quant_graph_of(
    m: &mut CudaModel,
    rec: &Recorder,
    caches: &mut LibraryCaches,
    (name, q): (&str, &QuantGemmStep),
    spec: &ConvGraphSpec,
) -> Result<usize> {
    let spec = spec.clone();
    let made = match caches.quant_graph.iter().find(|(s, _)| *s == spec) {
        Some((_, made)) => made.clone(),
        None => {
            let t0 = std::time::Instant::now();
            let made = crate::dnn_graph::quant_conv_graphs(
                m.cudnn(),
                &spec,
                rec.ws_cap,
                1,
                (
                    rec.options.quant_graph_runtime_compiled,
                    rec.sm.cudnn_heuristics,
                ),
            )
            .and_then(|graphs| {
                graphs
                    .into_iter()
                    .next()
                    .ok_or_else(|| "cuDNN made no plan of it".to_string())
            })
            .map(|g| {
                if rec.options.search_log {
                    eprintln!(
                        "search: cudnn {} graph{} for `{name}`: engine {}{}, made in {:.1} ms",
                        q.qtype,
                        if spec.quant_copy {
                            " writing y and its bytes"
                        } else {
                            ""
                        },
                        g.engine,
                        if g.runtime_compiled {
                            " (compiled at run time)"
                        } else {
                            ""
                        },
                        t0.elapsed().as_secs_f64() * 1e3
                    );
                }
                m.conv_graphs.push(g);
                m.conv_graphs.len() - 1
            });
            if let (Err(e), true) = (&made, spec.quant_copy && rec.options.search_log) {
                eprintln!(
                    "search: cudnn {} graph writing y and its bytes for `{name}`: none ({e}); \
                     the graph writing y, then a quantize kernel",
                    q.qtype
                );
            }
            if let (Err(e), false) = (&made, spec.quant_copy) {
                if !caches.quant_graph_noted {
                    caches.quant_graph_noted = true;
                    eprintln!(
                        "note: cuDNN's fused {} convolution graph is not used for `{name}` \
                         (the other candidates are): {e}",
                        q.qtype
                    );
                }
            }
            caches.quant_graph.push((spec, made.clone()));
            made
        }
    };
    made.map_err(EngineError::Runtime)
}

/// cuDNN's int8 convolution: x quantized whole (unless its producer left it in bytes), the
/// convolution into the accumulator as f32, the epilogue.
fn dnn_int8_conv(
    m: &mut CudaModel,
    rec: &Recorder,
    q: &QuantGemmStep,
    xb: Option<Loc>,
    c: &ConvStep,
) -> Result<Vec<Launch>> {
    let d = int8_conv_desc(m, rec, c)?;
    m.convs.push(d);
    let mut l = Vec::new();
    if let Some(xb) = xb {
        let n: usize = c.x_shape.iter().product();
        l.push(quantize_launch(rec, q.x, xb, q.x_scale, n, false));
    }
    l.push(Launch::Conv {
        conv: m.convs.len() - 1,
        x: rec.ptr(c.x),
        w: rec.ptr(c.w),
        y: rec.ptr(c.y),
    });
    l.push(epilogue_launch(rec, q, true));
    Ok(l)
}

/// The descriptors of an int8 convolution (NHWC int8 x and KRSC int8 filter, int32 sums, f32
/// y: cuDNN's INT8_EXT_CONFIG) with cuDNN's first algorithm for it that fits the workspace.
fn int8_conv_desc(m: &CudaModel, rec: &Recorder, c: &ConvStep) -> Result<ConvDesc> {
    let (i8t, f32t) = (
        dnn::cudnnDataType_t::CUDNN_DATA_INT8,
        dnn::cudnnDataType_t::CUDNN_DATA_FLOAT,
    );
    let mut d = conv_descriptors(
        c,
        ConvTypes {
            format: dnn::cudnnTensorFormat_t::CUDNN_TENSOR_NHWC,
            x: i8t,
            w: i8t,
            y: f32t,
            sums: dnn::cudnnDataType_t::CUDNN_DATA_INT32,
            math: dnn::cudnnMathType_t::CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION,
        },
    )?;
    let mut perf: [dnn::cudnnConvolutionFwdAlgoPerf_t; 10] =
        // SAFETY: the perf records are plain C structs for which all-zero bytes are valid.
        unsafe { std::mem::zeroed() };
    let mut got = 0;
    // SAFETY: the descriptors are live; cuDNN writes at most `perf.len()` records.
    dnn_check("cudnnGetConvolutionForwardAlgorithm_v7", unsafe {
        dnn::cudnnGetConvolutionForwardAlgorithm_v7(
            m.cudnn(),
            d.x,
            d.w,
            d.conv,
            d.y,
            perf.len() as i32,
            &mut got,
            perf.as_mut_ptr(),
        )
    })?;
    let found = perf[..got.max(0) as usize]
        .iter()
        .find(|p| p.status == dnn::cudnnStatus_t::CUDNN_STATUS_SUCCESS && p.memory <= rec.ws_cap);
    let Some(p) = found else {
        let states: Vec<String> = perf[..got.max(0) as usize]
            .iter()
            .map(|p| format!("{:?} {:?} ws {}", p.algo, p.status, p.memory))
            .collect();
        return Err(EngineError::Runtime(format!(
            "cuDNN offers no int8 algorithm for x {:?} w {:?} within {} bytes: {states:?}",
            c.x_shape, c.w_shape, rec.ws_cap
        )));
    };
    d.algo = p.algo;
    d.workspace = p.memory;
    // SAFETY: `d.conv` is live and owned by `d`.
    dnn_check("cudnnSetConvolutionMathType", unsafe {
        dnn::cudnnSetConvolutionMathType(d.conv, p.mathType)
    })?;
    Ok(d)
}

/// The float step: x's fake-quant values (from its floats, or dequantized from its
/// producer's bytes), the Conv or Linear as any float one records (its own timed paths), the
/// result quantized into the step's output where that holds bytes.
fn float_path(
    m: &mut CudaModel,
    rec: &Recorder,
    caches: &mut LibraryCaches,
    err: &dyn Fn(EngineError) -> EngineError,
    q: &QuantGemmStep,
    f: &QuantFloat,
) -> Result<Vec<Launch>> {
    let start = m.launches.len();
    let built = float_launches(m, rec, caches, err, q, f);
    let launches = m.launches.split_off(start);
    built.map(|()| launches)
}

fn float_launches(
    m: &mut CudaModel,
    rec: &Recorder,
    caches: &mut LibraryCaches,
    err: &dyn Fn(EngineError) -> EngineError,
    q: &QuantGemmStep,
    f: &QuantFloat,
) -> Result<()> {
    let fp8 = q.qtype != QuantType::Int8;
    // Plain: x's floats as they are (only bytes from the producer are dequantized).
    let plain = rec.options.quant_float_plain() && !q.x_quantized;
    if q.x_quantized {
        m.launches
            .push(dequantize_launch(rec, q.x, f.xf, q.x_scale, f.x_n, fp8));
    } else if !plain {
        let (lo, hi) = q.qtype.range();
        m.launches.push(Launch::Kernel {
            func: rec.func("fake_quant"),
            grid: elementwise_grid(f.x_n),
            block: BLOCK,
            shared: 0,
            args: vec![
                Arg::Ptr(rec.ptr(q.x)),
                Arg::Ptr(rec.ptr(f.xf)),
                Arg::Ptr(0),
                Arg::Ptr(0),
                Arg::F32(q.x_scale),
                Arg::F32(0.0),
                Arg::I64(f.x_n as i64),
                Arg::I64(1),
                Arg::I64(1),
                Arg::F32(lo),
                Arg::F32(hi),
                Arg::I32(fp8 as i32),
                Arg::I32(1),
            ],
        });
    }
    if f.fills_xq && !q.x_quantized {
        m.launches
            .push(quantize_launch(rec, q.x, q.xq, q.x_scale, q.m * q.k, fp8));
    }
    // After xq is filled: a skip that is also the operand has its bytes there.
    if let (Some(r), Some(rs), Some(rf)) = (q.residual, q.residual_scale, f.residual) {
        m.launches
            .push(dequantize_launch(rec, r, rf, rs, q.m * q.n, fp8));
    }
    let product = match plain {
        true => f.product_on(q.x),
        false => f.product.clone(),
    };
    match product {
        StepKind::Conv(c) => record_conv(m, rec, caches, err, &c)?,
        StepKind::Linear(l) => record_linear(m, rec, caches, err, &l)?,
        _ => {
            return Err(EngineError::Runtime(
                "a quantized product's float step that is neither Conv nor Linear".into(),
            ))
        }
    }
    if let (Some(yf), Some(ys)) = (f.yf, q.y_scale) {
        m.launches
            .push(quantize_launch(rec, yf, q.y, ys, q.m * q.n, fp8));
    }
    Ok(())
}

/// `dequantize_q8`: `n` bytes at `x` (int8, or e4m3 when `fp8`) times `s`, into `y` in the
/// activation dtype.
fn dequantize_launch(rec: &Recorder, x: Loc, y: Loc, s: f32, n: usize, fp8: bool) -> Launch {
    q8_launch(rec, "dequantize_q8", [x, y], s, n, fp8)
}

/// `quantize_q8`: `n` values at `x` (activation dtype) onto the grid of scale `s`, one byte
/// each at `y`.
fn quantize_launch(rec: &Recorder, x: Loc, y: Loc, s: f32, n: usize, fp8: bool) -> Launch {
    q8_launch(rec, "quantize_q8", [x, y], s, n, fp8)
}

/// One of the two conversions between the activation dtype and bytes (they take the same
/// arguments).
fn q8_launch(
    rec: &Recorder,
    kernel: &str,
    [x, y]: [Loc; 2],
    s: f32,
    n: usize,
    fp8: bool,
) -> Launch {
    Launch::Kernel {
        func: rec.func(kernel),
        grid: elementwise_grid(n),
        block: BLOCK,
        shared: 0,
        args: vec![
            Arg::Ptr(rec.ptr(x)),
            Arg::Ptr(rec.ptr(y)),
            Arg::F32(s),
            Arg::I64(n as i64),
            Arg::I32(fp8 as i32),
        ],
    }
}

/// The dequantizing epilogue of `q`, its accumulator f32 (`f32_acc`: an fp8 GEMM's, cuDNN's
/// int8 convolution's) or int32.
fn epilogue_launch(rec: &Recorder, q: &QuantGemmStep, f32_acc: bool) -> Launch {
    let (k, p0, p1) = act_code(q.act, rec.dtype);
    let total = q.m * q.n;
    let yq = match (q.y_scale, q.qtype) {
        (None, _) => 0,
        (Some(_), QuantType::Int8) => 1,
        (Some(_), _) => 2,
    };
    Launch::Kernel {
        func: rec.func("dequant_epilogue"),
        grid: elementwise_grid(total),
        block: BLOCK,
        shared: 0,
        args: vec![
            Arg::Ptr(rec.ptr(q.acc)),
            Arg::Ptr(rec.ptr(q.y)),
            Arg::Ptr(rec.ptr(q.scale)),
            Arg::Ptr(q.bias.map_or(0, |b| rec.ptr(b))),
            Arg::Ptr(q.residual.map_or(0, |r| rec.ptr(r))),
            Arg::I64(total as i64),
            Arg::I64(q.n as i64),
            Arg::I32(f32_acc as i32),
            Arg::I32(k),
            Arg::F32(p0),
            Arg::F32(p1),
            Arg::F32(q.y_scale.unwrap_or(1.0)),
            Arg::I32(yq),
            Arg::F32(q.residual_scale.unwrap_or(0.0)),
            Arg::I32((q.qtype != QuantType::Int8) as i32),
        ],
    }
}

/// The int8 (fp8) GEMM path: im2col, quantize, GEMM, epilogue.
fn record_int8_gemm(
    m: &mut CudaModel,
    rec: &Recorder,
    caches: &mut LibraryCaches,
    (name, err): (&str, &dyn Fn(EngineError) -> EngineError),
    q: &QuantGemmStep,
) -> Result<()> {
    let fp8 = q.qtype != QuantType::Int8;
    let src = match &q.conv {
        Some(c) => {
            let col = c
                .col
                .ok_or_else(|| err(EngineError::Runtime("an im2col without its matrix".into())))?;
            m.launches.push(if q.x_quantized {
                im2col_bytes_launch(rec, c, col).map_err(err)?
            } else {
                im2col_launch(rec, c, col)
            });
            col
        }
        None => q.x,
    };
    let rows = q.m * q.k;
    if !q.xq_ready && !q.x_quantized {
        m.launches
            .push(quantize_launch(rec, src, q.xq, q.x_scale, rows, fp8));
    }
    let key = format!("{} {}x{}x{}", q.qtype, q.m, q.n, q.k);
    let mm = match caches.quant.iter().find(|(k, _)| *k == key) {
        Some((_, mm)) => *mm,
        None => {
            // Where cuBLASLt has no algorithm for a shape (or fails to make one), the model
            // still runs: that GEMM on the CUDA cores, said once per shape.
            let mm = match quant_matmul(m, rec, q) {
                Ok(i) => Some(i),
                Err(e) => {
                    eprintln!(
                        "note: the {key} GEMM of `{name}` runs on the CUDA cores (slow): {e}"
                    );
                    None
                }
            };
            caches.quant.push((key, mm));
            mm
        }
    };
    m.launches.push(match mm {
        Some(mm) => Launch::Matmul {
            mm,
            a: rec.ptr(q.w),
            b: rec.ptr(q.xq),
            c: 0,
            y: rec.ptr(q.acc),
        },
        None => Launch::Kernel {
            func: rec.func("qgemm_fallback"),
            grid: elementwise_grid(q.m * q.n),
            block: BLOCK,
            shared: 0,
            args: vec![
                Arg::Ptr(rec.ptr(q.xq)),
                Arg::Ptr(rec.ptr(q.w)),
                Arg::Ptr(rec.ptr(q.acc)),
                Arg::I64(q.m as i64),
                Arg::I64(q.n as i64),
                Arg::I64(q.k as i64),
                Arg::I32(fp8 as i32),
            ],
        },
    });
    m.launches.push(epilogue_launch(rec, q, fp8));
    Ok(())
}

/// Bytes of the own kernel's K tile chunks: K must be whole chunks, its rows 16-byte aligned.
const OWN_K_CHUNK: usize = 16;
/// Columns of one epilogue access (16 bytes of a 16-bit y, residual or bias).
const OWN_N_RUN: usize = 8;

/// Why the own tensor-core kernel cannot run `q`, if it cannot: its kernel is in the 16-bit
/// modules only and needs the device's 8-bit `mma.sync` (int8 on sm_80, e4m3 on sm_89 and
/// newer), K in whole 16-byte chunks, N in runs of 8 (its epilogue's 16-byte accesses), sizes
/// within `int`.
pub(crate) fn own_gemm_refusal(
    q: &QuantGemmStep,
    (arch, smem_optin): ((i32, i32), usize),
    half_module: bool,
) -> Option<String> {
    let (name, need) = match q.qtype {
        QuantType::Int8 => ("int8", (8, 0)),
        _ => ("float8", (8, 9)),
    };
    if !half_module {
        return Some(
            "the activations are fp32 (the own kernel is in the fp16/bf16 modules)".into(),
        );
    }
    if arch < need {
        return Some(format!(
            "the device is sm_{}{}: {name} mma.sync needs sm_{}{} or newer",
            arch.0, arch.1, need.0, need.1
        ));
    }
    let kernel = OwnKernel::for_device(q.qtype, arch);
    let need = kernel.max_shared;
    if smem_optin < need {
        return Some(format!(
            "the device lets a block have {smem_optin} bytes of shared memory, the kernel needs {need}"
        ));
    }
    if !q.k.is_multiple_of(OWN_K_CHUNK) || !q.n.is_multiple_of(OWN_N_RUN) {
        return Some(format!(
            "K = {} is not a multiple of {OWN_K_CHUNK} or N = {} not a multiple of {OWN_N_RUN}",
            q.k, q.n
        ));
    }
    if [q.m, q.n, q.k].iter().any(|&d| d > i32::MAX as usize) || kernel.tiles(q) > u32::MAX as usize
    {
        return Some(format!("{}×{}×{} is too large for one grid", q.m, q.n, q.k));
    }
    None
}

/// The own kernel that runs a quantized product on a device: on compute capability 9.0 the
/// int8 sums run on `wgmma` (`qgemm_i8_wg`, its module built for sm_90a wherever the own path
/// is built: model/build.rs), elsewhere on `mma.sync` (`qgemm_i8`, `qgemm_f8`).
struct OwnKernel {
    name: &'static str,
    /// Whether it is `qgemm_i8_wg`, whose shared memory depends on the product.
    wgmma: bool,
    /// The most dynamic shared memory a launch asks for.
    max_shared: usize,
    /// The output tile a block computes: rows, columns.
    tile: (usize, usize),
    /// Threads a block.
    block: u32,
}

impl OwnKernel {
    fn for_device(qtype: QuantType, arch: (i32, i32)) -> OwnKernel {
        match (qtype, arch) {
            (QuantType::Int8, (9, 0)) => OwnKernel {
                name: "qgemm_i8_wg",
                wgmma: true,
                max_shared: kernels::QGEMM_WG_SHARED_BYTES,
                tile: (kernels::QGEMM_WG_ROWS, kernels::QGEMM_WG_COLS),
                block: kernels::QGEMM_WG_THREADS,
            },
            (qtype, _) => OwnKernel {
                name: if qtype == QuantType::Int8 {
                    "qgemm_i8"
                } else {
                    "qgemm_f8"
                },
                wgmma: false,
                max_shared: kernels::QGEMM_SHARED_BYTES,
                tile: (kernels::QGEMM_TILE, kernels::QGEMM_TILE),
                block: BLOCK,
            },
        }
    }

    /// Its blocks for `q`: one per tile of the output.
    fn tiles(&self, q: &QuantGemmStep) -> usize {
        q.m.div_ceil(self.tile.0) * q.n.div_ceil(self.tile.1)
    }

    /// The dynamic shared memory of its launch for `q`: `qgemm_i8_wg`'s stages follow K and
    /// it holds the residual's tile (bytes, or 16-bit floats).
    fn shared(&self, q: &QuantGemmStep) -> usize {
        if !self.wgmma {
            return self.max_shared;
        }
        let residual_bytes = match (q.residual, q.residual_scale) {
            (None, _) => 0,
            (Some(_), Some(_)) => 1,
            (Some(_), None) => 2,
        };
        kernels::qgemm_wg_shared_bytes(q.k, residual_bytes, self.tile.1)
    }
}

/// The own kernel in place of the last two launches (the GEMM, the epilogue) of a GEMM path
/// `rows_path`, which made `xq` (or found it made): one launch that also writes y's copy.
fn own_gemm(rec: &Recorder, q: &QuantGemmStep, rows_path: &[Launch]) -> Result<Vec<Launch>> {
    let int8 = q.qtype == QuantType::Int8;
    let kernel = OwnKernel::for_device(q.qtype, rec.arch);
    let half_module = rec.half_names.contains(&kernel.name);
    if let Some(why) = own_gemm_refusal(q, (rec.arch, rec.smem_optin), half_module) {
        return Err(EngineError::Runtime(why));
    }
    let (xq, w) = (rec.ptr(q.xq), rec.ptr(q.w));
    let sixteen = [
        Some(q.xq),
        Some(q.w),
        Some(q.y),
        Some(q.scale),
        q.bias,
        q.residual,
    ];
    let copy8 = q.y_copy.is_none_or(|(c, _)| rec.ptr(c).is_multiple_of(8));
    if !copy8
        || sixteen
            .iter()
            .flatten()
            .any(|&l| !rec.ptr(l).is_multiple_of(16))
    {
        return Err(EngineError::Runtime(
            "an operand is not 16-byte aligned (or the copy 8-byte)".into(),
        ));
    }
    let tail = rows_path
        .len()
        .checked_sub(2)
        .ok_or_else(|| EngineError::Runtime("a GEMM path without its GEMM".into()))?;
    let (k, p0, p1) = act_code(q.act, rec.dtype);
    let yq = match (q.y_scale, int8) {
        (None, _) => 0,
        (Some(_), true) => 1,
        (Some(_), false) => 2,
    };
    let (copy, cs) = q.y_copy.map_or((0, 1.0), |(c, s)| (rec.ptr(c), s));
    let mut l = rows_path[..tail].to_vec();
    l.push(Launch::Kernel {
        func: rec.func(kernel.name),
        grid: kernel.tiles(q) as u32,
        block: kernel.block,
        shared: kernel.shared(q) as u32,
        args: vec![
            Arg::Ptr(xq),
            Arg::Ptr(w),
            Arg::Ptr(rec.ptr(q.y)),
            Arg::Ptr(rec.ptr(q.scale)),
            Arg::Ptr(q.bias.map_or(0, |b| rec.ptr(b))),
            Arg::Ptr(q.residual.map_or(0, |r| rec.ptr(r))),
            Arg::Ptr(copy),
            Arg::I32(q.m as i32),
            Arg::I32(q.n as i32),
            Arg::I32(q.k as i32),
            Arg::I32(k),
            Arg::F32(p0),
            Arg::F32(p1),
            Arg::F32(q.y_scale.unwrap_or(1.0)),
            Arg::I32(yq),
            Arg::F32(cs),
            Arg::F32(q.residual_scale.unwrap_or(0.0)),
        ],
    });
    Ok(l)
}

/// The im2col of a convolution's quantized NHWC input (one byte per element, as its
/// producer's epilogue left it) into the quantized matrix, 4 channels per 32-bit word.
fn im2col_bytes_launch(rec: &Recorder, c: &ConvStep, col: Loc) -> Result<Launch> {
    let [n, ch, h, w] = c.x_shape;
    let [_, _, oh, ow] = c.y_shape;
    let (kh, kw) = (c.w_shape[2], c.w_shape[3]);
    if !ch.is_multiple_of(4) {
        return Err(EngineError::Runtime(format!(
            "an im2col of quantized bytes with {ch} channels, not whole 4-byte words"
        )));
    }
    let v = [
        n,
        h,
        w,
        ch / 4,
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
    let words = n * oh * ow * kh * kw * ch / 4;
    Ok(Launch::Kernel {
        func: rec.func("im2col_b4"),
        grid: elementwise_grid(words),
        block: BLOCK,
        shared: 0,
        args: vec![
            Arg::Ptr(rec.ptr(c.x)),
            Arg::Ptr(rec.ptr(col)),
            Arg::Im(Box::new(ImP {
                v: v.map(|s| s as i32),
            })),
        ],
    })
}

/// The index in `m.mms` of a new GEMM for `q`'s shape (the caller keeps one per (type, M, N,
/// K) of the model), its algorithm the fastest of cuBLASLt's heuristic candidates (the first
/// when the search is untimed), or a saved plan's: an int32 sum is exact whatever the
/// algorithm, but fp8's f32 sum may round differently per algorithm.
fn quant_matmul(m: &mut CudaModel, rec: &Recorder, q: &QuantGemmStep) -> Result<usize> {
    let descs = quant_descriptors(q, rec.sm.matmul)?;
    let (desc, a, b, d) = descs;
    let int8 = q.qtype == QuantType::Int8;
    // The scale type is CUDA_R_32I for int8: cuBLASLt reads alpha and beta as int32, so the
    // f32 fields hold the bit patterns of the integers 1 and 0 (run_matmul passes them by
    // pointer as they are).
    let (alpha, beta) = if int8 {
        (f32::from_bits(1), f32::from_bits(0))
    } else {
        (1.0, 0.0)
    };
    let mut cand = MatmulDesc {
        desc,
        a,
        b,
        d,
        algo: lt::cublasLtMatmulAlgo_t { data: [0; 8] },
        workspace: 0,
        alpha,
        beta,
    };
    // A saved plan's algorithm for this shape, checked by cuBLASLt (fp8's f32 sums round per
    // algorithm: the heuristic's first here need not be the one the build timed fastest).
    let shape_key = format!("{} {}x{}x{}", q.qtype, q.m, q.n, q.k);
    let saved = {
        let log = rec.choices.borrow();
        log.replaying().then(|| log.matmul(&shape_key))
    };
    if let Some(saved) = saved {
        let Some(algo) = saved else {
            return Err(EngineError::InvalidArgument(format!(
                "the saved plan has no cuBLASLt algorithm for the {shape_key} GEMM of the plan \
                 made from its graph; build it again with `isolane build`"
            )));
        };
        cand.algo = algo;
        cand.workspace = crate::saved::checked_matmul_algo(m.cublaslt(), descs, &algo)?;
        m.mms.push(cand);
        return Ok(m.mms.len() - 1);
    }
    let (results, got) = matmul_heuristics(m.cublaslt(), descs, rec.mm_ws_cap)?;
    let usable: Vec<usize> = (0..got.max(0) as usize)
        .filter(|&i| {
            results[i].state == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS
                && results[i].workspace_size() <= rec.mm_ws_cap
        })
        .collect();
    if usable.is_empty() {
        let states: Vec<String> = results[..got.max(0) as usize]
            .iter()
            .map(|r| format!("{:?} ws {}", r.state, r.workspace_size()))
            .collect();
        return Err(EngineError::Runtime(format!(
            "cuBLASLt offers no {} algorithm for the {}x{}x{} GEMM (TN, column-major, ld K, K, N) \
             within {} bytes of workspace: {got} candidates {states:?}",
            q.qtype, q.m, q.n, q.k, rec.mm_ws_cap
        )));
    }
    let (w, x, y) = (rec.ptr(q.w), rec.ptr(q.xq), rec.ptr(q.acc));
    let (handle, stream) = (m.cublaslt(), m.stream);
    let untimed = rec.options.first_choice;
    let mut times: Vec<(usize, f32)> = Vec::new();
    let mut failed = Vec::new();
    for &i in &usable {
        cand.algo = results[i].algo;
        cand.workspace = results[i].workspace_size();
        let mut run = || run_matmul(handle, &cand, w, x, 0, y, rec.mm_scratch, stream);
        // The first run is the warm-up, and shows whether the candidate runs at all (a
        // cluster shape a small green context cannot place does not).
        match rec.events.time(stream, &mut run) {
            Ok(_) => {
                let mut best = f32::INFINITY;
                for _ in 0..if untimed { 0 } else { TIMING_ROUNDS } {
                    best = best.min(rec.events.time(stream, &mut run)?);
                }
                times.push((i, best));
            }
            Err(e) => failed.push(format!("#{i}: {e}")),
        }
        if untimed && !times.is_empty() {
            break;
        }
    }
    let Some(&(best, ms)) = times.iter().min_by(|a, b| a.1.total_cmp(&b.1)) else {
        return Err(EngineError::Runtime(format!(
            "no {} algorithm of cuBLASLt ran the {}x{}x{} GEMM: {failed:?}",
            q.qtype, q.m, q.n, q.k
        )));
    };
    if rec.options.search_log {
        eprintln!(
            "search: {} gemm {}x{}x{}: {} candidates, timed {:?}, failed {failed:?}; kept #{best} \
             (id {}, ws {}) {ms:.4} ms",
            q.qtype,
            q.m,
            q.n,
            q.k,
            got,
            times,
            algo_config(
                &results[best].algo,
                lt::cublasLtMatmulAlgoConfigAttributes_t::CUBLASLT_ALGO_CONFIG_ID
            ),
            results[best].workspace_size(),
        );
    }
    cand.algo = results[best].algo;
    cand.workspace = results[best].workspace_size();
    // Kept with the float matmuls' algorithms for a saved plan (its key cannot meet theirs).
    m.algo_cache.push((shape_key, cand.algo, cand.workspace));
    m.mms.push(cand);
    Ok(m.mms.len() - 1)
}

#[cfg(test)]
mod tests {
    use super::{
        choose_path, describe_choice, own_gemm_refusal, reads_copy, splice_steps, whole_graph_wins,
        writes_own_copy, GraphAlt, FLOAT_PATH, GRAPH_PATH, OWN_BYTES_PATH, OWN_PATH, PATHS,
    };
    use crate::kernels;
    use crate::model::Launch;
    use crate::plan::QuantGemmStep;

    /// A launch told apart by its byte count (no GPU: never issued).
    fn l(n: usize) -> Launch {
        Launch::HtoD {
            dst: 0,
            src: std::ptr::null(),
            bytes: n,
        }
    }

    fn bytes(ls: &[Launch]) -> Vec<usize> {
        ls.iter()
            .map(|x| match x {
                Launch::HtoD { bytes, .. } => *bytes,
                _ => usize::MAX,
            })
            .collect()
    }

    /// A stem, then `a` (1×1) whose output a residual (`b`'s) reads as floats (the skip not
    /// quantized) and, through
    /// one FakeQuant, the direct 1×1 `b` and the strided 1×1 `c`: `a` writes its bytes too.
    fn block_plan() -> crate::plan::Plan {
        use isolane_engine::calibrate::{quantize_model, CalibMethod, CalibOptions};
        use isolane_engine::ir::{Binary, ConvAttrs, Dim, Graph, Op, Unary};
        use isolane_engine::{Precision, Tensor};
        let mut seed = 7u64;
        let mut rnd = |n: usize| -> Vec<f32> {
            (0..n)
                .map(|_| {
                    seed = seed
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    ((seed >> 33) as f32 / (1u64 << 31) as f32 - 0.5) * 0.6
                })
                .collect()
        };
        let mut g = Graph::new("block");
        let x = g.add_input(
            "x",
            vec![Dim::Batch, Dim::Fixed(3), Dim::Fixed(6), Dim::Fixed(6)],
        );
        let mut w = |g: &mut Graph, name: &str, shape: Vec<usize>| {
            let n = shape.iter().product();
            g.add_constant(name, Tensor::new(shape, rnd(n)).unwrap())
        };
        let ws = w(&mut g, "ws", vec![16, 3, 3, 3]);
        let wa = w(&mut g, "wa", vec![16, 16, 1, 1]);
        let wb = w(&mut g, "wb", vec![16, 16, 1, 1]);
        let wc = w(&mut g, "wc", vec![16, 16, 1, 1]);
        let conv = |pads: [usize; 4], strides: [usize; 2], act| {
            Op::Conv(ConvAttrs {
                pads,
                strides,
                activation: act,
                ..Default::default()
            })
        };
        let relu = Some(Unary::Relu);
        let x = g.add_op("s", conv([1; 4], [1, 1], relu), &[x, ws]).unwrap();
        let h = g.add_op("a", conv([0; 4], [1, 1], relu), &[x, wa]).unwrap();
        let b = g.add_op("b", conv([0; 4], [1, 1], None), &[h, wb]).unwrap();
        let b = g.add_op("add", Op::Binary(Binary::Add), &[b, h]).unwrap();
        let c = g.add_op("c", conv([0; 4], [2, 2], None), &[h, wc]).unwrap();
        let pb = g.add_op("pb", Op::GlobalAveragePool, &[b]).unwrap();
        let pc = g.add_op("pc", Op::GlobalAveragePool, &[c]).unwrap();
        let y = g.add_op("sum", Op::Binary(Binary::Add), &[pb, pc]).unwrap();
        g.add_output(y).unwrap();
        let samples: Vec<Vec<Tensor>> = (0..2)
            .map(|_| vec![Tensor::new(vec![1, 3, 6, 6], rnd(108)).unwrap()])
            .collect();
        // The skip in floats (`a`'s output stored in full and quantized as well).
        let opts = CalibOptions {
            method: CalibMethod::MinMax,
            residual_skips: false,
            ..Default::default()
        };
        let q = quantize_model(&g, 1, &samples, &opts).unwrap().graph;
        crate::plan::plan_with(&q, 1, Precision::Fp16, Default::default()).unwrap()
    }

    /// A copy no per-layer pick reads loses its quantize kernel in the per-layer whole, and
    /// keeps it in the graph chain where a reader's graph reads it (the chain was spliced from
    /// the pruned launches once, and its graph read bytes nobody wrote).
    #[test]
    fn a_copy_unread_per_layer_is_still_written_in_the_graph_chain() {
        use super::{wholes, FLOAT_PATH, GRAPH_PATH};
        use crate::model::Arg;
        use crate::plan::{Loc, StepKind};
        let p = block_plan();
        let idx = |n: &str| p.steps.iter().position(|s| s.name == n).unwrap();
        let (a, b, c) = (idx("a"), idx("b"), idx("c"));
        let StepKind::QuantGemm(qa) = &p.steps[a].kind else {
            panic!("a is no quantized product: {:?}", p.steps[a])
        };
        let (copy, _) = qa.y_copy.expect("a writes its bytes for b");
        let ptr = |l: Loc| match l {
            Loc::Storage { id, .. } => 1000 + id as u64,
            Loc::Const { id, .. } => id as u64,
        };
        let quantize = 7;
        // An input copy, then one launch per step, and a's quantize of its copy last in a's.
        let (mut launches, mut names, mut starts) = (vec![l(1)], vec!["in".to_string()], vec![]);
        for (i, st) in p.steps.iter().enumerate() {
            starts.push(launches.len());
            launches.push(l(10 + i));
            if i == a {
                launches.push(Launch::Kernel {
                    func: quantize,
                    grid: 1,
                    block: 1,
                    shared: 0,
                    args: vec![Arg::Ptr(0), Arg::Ptr(ptr(copy))],
                });
            }
            while names.len() < launches.len() {
                names.push(st.name.clone());
            }
        }
        starts.push(launches.len());
        let kernels = |ls: &[Launch]| {
            ls.iter()
                .filter(|x| matches!(x, Launch::Kernel { .. }))
                .count()
        };
        let mut chosen: Vec<Option<usize>> = p
            .steps
            .iter()
            .map(|s| matches!(s.kind, StepKind::QuantGemm(_)).then_some(0))
            .collect();
        // b keeps plain fp16, c the int8 GEMM of its own im2col: nobody reads a's copy.
        chosen[b] = Some(FLOAT_PATH);
        let alt = GraphAlt {
            step: b,
            launches: vec![l(99)],
            log_at: None,
            choice: 0,
        };
        let rec = (&launches[..], &names[..], &starts[..]);
        let [layer, graph] = wholes(&p, rec, &[alt], &chosen, (quantize, &ptr));
        assert_eq!((layer.3, kernels(&layer.0)), (1, 0));
        assert_eq!(layer.0.len() + 1, launches.len());
        assert_eq!(layer.2[c] + 1, starts[c], "the steps after a move back");
        // b on its graph reads the copy: it stays.
        assert_eq!((graph.3, kernels(&graph.0)), (0, 1));
        assert!(bytes(&graph.0).contains(&99));
        // c on cuDNN's graph reads the copy in place: it stays per layer too.
        chosen[c] = Some(GRAPH_PATH);
        let [layer, _] = wholes(&p, rec, &[], &chosen, (quantize, &ptr));
        assert_eq!((layer.3, kernels(&layer.0)), (0, 1));
    }

    #[test]
    fn an_unread_copys_quantize_is_left_out_and_the_steps_move_back() {
        use super::without_launches;
        let launches = vec![l(100), l(0), l(10), l(11), l(20), l(30), l(31)];
        let names: Vec<String> = ["in", "s0", "s1", "s1", "s2", "s3", "s3"]
            .map(String::from)
            .to_vec();
        // Step 1's last launch (3) and step 3's (6) are quantizes nobody reads.
        let (out, nm, starts) = without_launches(&launches, &names, &[1, 2, 4, 5, 7], &[3, 6]);
        assert_eq!(bytes(&out), [100, 0, 10, 20, 30]);
        assert_eq!(nm, ["in", "s0", "s1", "s2", "s3"]);
        assert_eq!(starts, [1, 2, 3, 4, 5]);
        let (same, _, starts) = without_launches(&launches, &names, &[1, 2, 4, 5, 7], &[]);
        assert_eq!((same.len(), starts), (7, vec![1, 2, 4, 5, 7]));
    }

    #[test]
    fn the_graph_chain_replaces_the_steps_that_lost_and_keeps_the_rest_in_place() {
        // An input copy (launch 0), then steps 0..3: step 1 ran three launches (float conv +
        // quantize + ...), step 2 two; the graph paths of steps 1 and 2 are one launch each.
        let launches = vec![l(100), l(0), l(10), l(11), l(12), l(20), l(21), l(30)];
        let step_start = [1, 2, 5, 7, 8];
        let alt = |step: usize, n: usize| GraphAlt {
            step,
            launches: vec![l(n)],
            log_at: None,
            choice: 0,
        };
        let names = ["s0", "s1", "s2", "s3"];
        let (out, starts, nm) =
            splice_steps(&launches, &step_start, &[alt(1, 19), alt(2, 29)], &names);
        assert_eq!(bytes(&out), [0, 19, 29, 30]);
        assert_eq!(starts, [1, 2, 3, 4, 5]);
        assert_eq!(nm, ["s0", "s1", "s2", "s3"]);
        // No alternative: the same steps.
        let (same, starts, nm) = splice_steps(&launches, &step_start, &[], &names);
        assert_eq!(bytes(&same), bytes(&launches[1..]));
        assert_eq!(starts, step_start);
        assert_eq!(nm, ["s0", "s1", "s1", "s1", "s2", "s2", "s3"]);
        // A graph path longer than the step's own (a quantize of x before it).
        let two = GraphAlt {
            launches: vec![l(1), l(2)],
            ..alt(0, 0)
        };
        let (out, starts, _) = splice_steps(&launches, &step_start, &[two], &names);
        assert_eq!(bytes(&out), [1, 2, 10, 11, 12, 20, 21, 30]);
        assert_eq!(starts, [1, 3, 6, 8, 9]);
    }

    #[test]
    fn the_graph_chain_is_kept_only_where_it_ran_faster_whole() {
        // resnet50 b1 int8 on the H200 ran 0.361 ms per job with the per-layer choice.
        assert!(whole_graph_wins(0.361, 0.300));
        assert!(!whole_graph_wins(0.300, 0.361));
        // A tie keeps the per-layer choice (what ran before the comparison existed).
        assert!(!whole_graph_wins(0.3, 0.3));
        // A whole that failed to run (NaN) or was not timed (∞) is never kept.
        assert!(!whole_graph_wins(0.3, f32::NAN));
        assert!(!whole_graph_wins(0.3, f32::INFINITY));
        assert!(whole_graph_wins(f32::NAN, 0.3));
    }
    use crate::plan::DType;
    use isolane_engine::quant::QuantType;

    #[test]
    fn the_search_log_says_plain_fp16_where_the_float_step_reads_x_unquantized() {
        let built = || Ok(Vec::new());
        let none = || Err(crate::EngineError::Runtime("not planned".into()));
        let paths = [built(), none(), built(), none(), none(), built(), none()];
        let times = [Some(0.5), None, Some(0.3), None, None, Some(0.4), None];
        let line = |plain, dtype| {
            describe_choice("c3", QuantType::Int8, (plain, dtype), &paths, &times, 2)
        };
        let plain = line(true, DType::F16);
        assert!(plain.ends_with("kept float (plain fp16)"), "{plain}");
        assert!(plain.contains("int8 own gemm 0.4000 ms"), "{plain}");
        assert!(plain.contains("float (plain fp16) 0.3000 ms"), "{plain}");
        let fq = line(false, DType::F16);
        assert!(
            fq.ends_with("kept float (fake-quant)") && !fq.contains("plain"),
            "{fq}"
        );
        assert!(line(true, DType::F32).ends_with("kept float (plain fp32)"));
    }

    #[test]
    fn the_fastest_timed_candidate_is_kept_and_the_quantized_path_on_a_tie() {
        // The first five candidates as before the own kernel; it is neither built nor timed.
        let b = |v: [bool; 5]| [v[0], v[1], v[2], v[3], v[4], false, false];
        let o = |v: [Option<f32>; 5]| [v[0], v[1], v[2], v[3], v[4], None, None];
        let all = b([true; 5]);
        let t = |a, b, c, d| o([Some(a), Some(b), Some(c), Some(d), None]);
        // fp16 faster than every quantized path: the float step.
        assert_eq!(choose_path(&all, &t(0.30, 0.25, 0.20, 0.22)), 2);
        // cuDNN's int8 convolution, then its fused graph, fastest.
        assert_eq!(choose_path(&all, &t(0.30, 0.10, 0.20, 0.12)), 1);
        assert_eq!(choose_path(&all, &t(0.30, 0.10, 0.20, 0.05)), 3);
        // A tie goes to the earlier candidate.
        assert_eq!(choose_path(&all, &t(0.2, 0.2, 0.2, 0.2)), 0);
        assert_eq!(choose_path(&all, &t(0.3, 0.2, 0.2, 0.2)), 1);
        // A candidate not built or that failed to run has no time, and is never kept.
        let no_dnn = b([true, false, true, false, false]);
        assert_eq!(
            choose_path(&no_dnn, &o([Some(0.3), None, Some(0.2), None, None])),
            2
        );
        assert_eq!(
            choose_path(&all, &o([None, None, Some(0.9), None, None])),
            2
        );
        // The GEMM with x quantized before its im2col.
        let last = o([Some(0.3), None, Some(0.2), None, Some(0.1)]);
        assert_eq!(choose_path(&all, &last), 4);
        // The own kernel where it is fastest, on either rows; a tie with the GEMM keeps the GEMM.
        let own = [true; PATHS];
        let mut times = [
            Some(0.3),
            None,
            Some(0.2),
            Some(0.15),
            Some(0.2),
            Some(0.1),
            None,
        ];
        assert_eq!(choose_path(&own, &times), OWN_PATH);
        times[OWN_BYTES_PATH] = Some(0.09);
        assert_eq!(choose_path(&own, &times), OWN_BYTES_PATH);
        assert_eq!(
            choose_path(&own, &[Some(0.1), None, None, None, None, Some(0.1), None]),
            0
        );
        // Nothing timed (an MPS client with part of the threads): the int8 GEMM, as before the
        // choice existed; where it is not built, the next one built.
        assert_eq!(choose_path(&all, &[None; PATHS]), 0);
        assert_eq!(
            choose_path(&b([false, false, true, true, true]), &[None; PATHS]),
            2
        );
    }

    /// The own kernel reads a producer's copy as the GEMM does (its rows), so the copy keeps
    /// its writer; it writes its own copy itself, as the graph does, so no quantize follows it.
    #[test]
    fn the_own_kernel_reads_and_writes_copies_as_the_gemm_and_the_graph_do() {
        use crate::plan::StepKind;
        let p = block_plan();
        let readers: Vec<&QuantGemmStep> = p
            .steps
            .iter()
            .filter_map(|s| match &s.kind {
                StepKind::QuantGemm(q) if q.xq_ready => Some(&**q),
                _ => None,
            })
            .collect();
        assert!(
            !readers.is_empty(),
            "the block has a GEMM on its producer's bytes"
        );
        for q in readers {
            assert!(reads_copy(q, 0, q.xq));
            assert!(reads_copy(q, OWN_PATH, q.xq));
            assert!(!reads_copy(q, OWN_BYTES_PATH, q.xq));
        }
        assert!(writes_own_copy(OWN_PATH) && writes_own_copy(OWN_BYTES_PATH));
        assert!(writes_own_copy(GRAPH_PATH));
        assert!(!writes_own_copy(0) && !writes_own_copy(4) && !writes_own_copy(FLOAT_PATH));
    }

    /// Where the own kernel cannot run, the search log says why: fp32 activations, a device
    /// without 8-bit mma.sync (e4m3 from sm_89), K not whole 16-byte chunks, an odd N.
    #[test]
    fn the_own_kernel_is_refused_where_it_cannot_run_and_says_why() {
        /// What a Hopper block may opt in to (227 KiB).
        const H100_SMEM: usize = 232_448;
        use crate::plan::StepKind;
        use isolane_engine::quant::QuantType;
        let p = block_plan();
        let q = p
            .steps
            .iter()
            .find_map(|s| match &s.kind {
                StepKind::QuantGemm(q) => Some((**q).clone()),
                _ => None,
            })
            .expect("a quantized product");
        let k16 = QuantGemmStep {
            k: 64,
            n: 16,
            ..q.clone()
        };
        assert_eq!(own_gemm_refusal(&k16, ((9, 0), H100_SMEM), true), None);
        assert_eq!(own_gemm_refusal(&k16, ((8, 0), H100_SMEM), true), None);
        let why =
            |q: &QuantGemmStep, arch, half| own_gemm_refusal(q, (arch, H100_SMEM), half).unwrap();
        assert!(why(&k16, (9, 0), false).contains("fp32"));
        assert!(why(&k16, (7, 5), true).contains("sm_80"));
        let fp8 = QuantGemmStep {
            qtype: QuantType::Float8E4M3Fn,
            ..k16.clone()
        };
        assert!(why(&fp8, (8, 6), true).contains("sm_89"));
        assert_eq!(own_gemm_refusal(&fp8, ((8, 9), H100_SMEM), true), None);
        let k = QuantGemmStep {
            k: 147,
            ..k16.clone()
        };
        assert!(why(&k, (9, 0), true).contains("K = 147"));
        let n = QuantGemmStep {
            n: 1001,
            ..k16.clone()
        };
        assert!(why(&n, (9, 0), true).contains("N = 1001 not a multiple of 8"));
        let n = QuantGemmStep {
            n: 20,
            ..k16.clone()
        };
        assert!(why(&n, (9, 0), true).contains("N = 20"));
        // An Ada GPU's 99 KiB a block is below the kernel's three stages.
        let ada = own_gemm_refusal(&k16, ((8, 9), 101_376), true).unwrap();
        assert!(ada.contains("101376 bytes of shared memory"), "{ada}");
        // The Hopper int8 kernel needs far less: 99 KiB a block would do, and where K ≤ 128
        // six blocks share an SM's 228 KiB (1 KiB of it reserved a block), a skip of floats
        // included.
        assert_eq!(own_gemm_refusal(&k16, ((9, 0), 101_376), true), None);
        let one_tile = kernels::qgemm_wg_shared_bytes(128, 2, kernels::QGEMM_WG_COLS);
        assert!(6 * (one_tile + 1024) <= 228 * 1024, "{one_tile}");
        assert!(kernels::qgemm_wg_shared_bytes(129, 2, kernels::QGEMM_WG_COLS) > one_tile);
    }
}
