//! Matrix products through cuBLASLt: descriptors, layouts, the timed algorithm choice (cached per
//! shape) and the calls.

use super::*;

pub(super) struct MatmulDesc {
    pub(super) desc: lt::cublasLtMatmulDesc_t,
    pub(super) a: lt::cublasLtMatrixLayout_t,
    pub(super) b: lt::cublasLtMatrixLayout_t,
    pub(super) d: lt::cublasLtMatrixLayout_t,
    pub(super) algo: lt::cublasLtMatmulAlgo_t,
    pub(super) workspace: usize,
    pub(super) alpha: f32,
    pub(super) beta: f32,
}

impl Drop for MatmulDesc {
    fn drop(&mut self) {
        // SAFETY: the layouts and the matmul descriptor were created by `mm_index` for this
        // value alone and are destroyed once, here; they are host objects, independent of the
        // cuBLASLt handle.
        unsafe {
            lt::cublasLtMatrixLayoutDestroy(self.a);
            lt::cublasLtMatrixLayoutDestroy(self.b);
            lt::cublasLtMatrixLayoutDestroy(self.d);
            lt::cublasLtMatmulDescDestroy(self.desc);
        }
    }
}

pub(super) fn lt_dtype(d: DType) -> lt::cudaDataType {
    match d {
        DType::F32 => lt::cudaDataType::CUDA_R_32F,
        DType::F16 => lt::cudaDataType::CUDA_R_16F,
        DType::Bf16 => lt::cudaDataType::CUDA_R_16BF,
    }
}

#[derive(Clone, Debug, PartialEq)]
pub(super) struct MmKey {
    pub(super) m: usize,
    pub(super) n: usize,
    pub(super) k: usize,
    pub(super) batch: usize,
    pub(super) sa: usize,
    pub(super) sb: usize,
    pub(super) b_trans: bool,
    pub(super) linear: bool,
    pub(super) bias: Option<u64>,
    pub(super) relu: bool,
    pub(super) gelu: bool,
    pub(super) residual: bool,
    pub(super) alpha: u32,
    /// Row strides of our a, b and y, and y's batch stride.
    pub(super) lda: usize,
    pub(super) ldb: usize,
    pub(super) ldy: usize,
    pub(super) sy: usize,
}

impl MmKey {
    /// `y[m, n] = x[m, k] · wᵀ (+ bias)`, dense and unbatched, nothing else fused.
    pub(super) fn linear(m: usize, n: usize, k: usize, bias: Option<u64>) -> MmKey {
        MmKey {
            m,
            n,
            k,
            batch: 1,
            sa: 0,
            sb: 0,
            b_trans: true,
            linear: true,
            bias,
            relu: false,
            gelu: false,
            residual: false,
            alpha: 1.0f32.to_bits(),
            lda: k,
            ldb: k,
            ldy: n,
            sy: m * n,
        }
    }
}

pub(super) fn set_attr<T>(
    desc: lt::cublasLtMatmulDesc_t,
    attr: lt::cublasLtMatmulDescAttributes_t,
    v: &T,
) -> Result<()> {
    // SAFETY: v points to a value of the size the attribute expects (chosen by the caller).
    lt_check("cublasLtMatmulDescSetAttribute", unsafe {
        lt::cublasLtMatmulDescSetAttribute(
            desc,
            attr,
            v as *const T as *const c_void,
            std::mem::size_of::<T>(),
        )
    })
}

pub(super) fn layout(
    dt: lt::cudaDataType,
    rows: usize,
    cols: usize,
    ld: usize,
    batch: usize,
    stride: usize,
) -> Result<lt::cublasLtMatrixLayout_t> {
    let mut l: lt::cublasLtMatrixLayout_t = std::ptr::null_mut();
    // SAFETY: valid out-pointer; attribute values are i32 / i64 as cuBLASLt documents.
    unsafe {
        lt_check(
            "cublasLtMatrixLayoutCreate",
            lt::cublasLtMatrixLayoutCreate(&mut l, dt, rows as u64, cols as u64, ld as i64),
        )?;
        if batch > 1 {
            let b = batch as i32;
            let s = stride as i64;
            lt_check(
                "cublasLtMatrixLayoutSetAttribute",
                lt::cublasLtMatrixLayoutSetAttribute(
                    l,
                    lt::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                    &b as *const i32 as *const c_void,
                    4,
                ),
            )?;
            lt_check(
                "cublasLtMatrixLayoutSetAttribute",
                lt::cublasLtMatrixLayoutSetAttribute(
                    l,
                    lt::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                    &s as *const i64 as *const c_void,
                    8,
                ),
            )?;
        }
    }
    Ok(l)
}

/// Tells a matmul descriptor the SM count to split its work for (`crate::saved::SmTargets`):
/// cuBLASLt's heuristics and the grids of its split-K and stream-K kernels follow it, so a
/// saved plan computes the build's bits where the device reports another count. A cuBLASLt
/// that refuses the value keeps the device's count: a saved plan's check run then refuses
/// bits that differ, and a build is as it was without the attribute.
pub(super) fn set_sm_target(desc: lt::cublasLtMatmulDesc_t, sms: i32) {
    static SAID: std::sync::Once = std::sync::Once::new();
    if let Err(e) = set_attr(
        desc,
        lt::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET,
        &sms,
    ) {
        // Said once a process: which count the matmuls split their work by is what a saved
        // plan's other bits would be explained by.
        SAID.call_once(|| {
            eprintln!(
                "note: cuBLASLt refused the SM count target {sms} ({e}): its matmuls split \
                 their work by the SMs the device reports"
            )
        });
    }
}

/// The compute, scale and data types of a float matmul at `precision` on `dtype` values.
pub(super) fn matmul_types(dtype: DType, precision: Precision) -> lt_algos::AlgoTypes {
    lt_algos::AlgoTypes {
        compute: match precision {
            Precision::Tf32 => lt::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32,
            // Plain COMPUTE_32F never uses TF32: fp32 stays true fp32.
            _ => lt::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        },
        scale: lt::cudaDataType::CUDA_R_32F,
        data: lt_dtype(dtype),
    }
}

/// The cuBLASLt matmul descriptor (compute type, transposes, epilogue, bias, the SM count
/// target `sms`) and the layouts of a (the weight-side operand), b and d for `key`.
pub(super) fn matmul_descriptors(
    key: &MmKey,
    dtype: DType,
    precision: Precision,
    sms: i32,
) -> Result<crate::handles::LtMatmulDescs> {
    let types = matmul_types(dtype, precision);
    let dt = types.data;
    let mut desc: lt::cublasLtMatmulDesc_t = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    lt_check("cublasLtMatmulDescCreate", unsafe {
        lt::cublasLtMatmulDescCreate(&mut desc, types.compute, types.scale)
    })?;
    set_sm_target(desc, sms);
    let (mm, n, k) = (key.m, key.n, key.k);
    let op_n: i32 = 0;
    // cuBLASLt's A is our B operand (see `mm_index`), transposed when `b_trans`.
    let (op_a, a_rows, a_cols): (i32, _, _) = if key.b_trans { (1, k, n) } else { (0, n, k) };
    set_attr(
        desc,
        lt::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
        &op_a,
    )?;
    let a = layout(dt, a_rows, a_cols, key.ldb, key.batch, key.sb)?;
    set_attr(
        desc,
        lt::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSB,
        &op_n,
    )?;
    let b = layout(dt, k, mm, key.lda, key.batch, key.sa)?;
    let d = layout(dt, n, mm, key.ldy, key.batch, key.sy)?;
    if key.linear {
        let epi = match (key.bias.is_some(), key.relu) {
            _ if key.gelu => lt::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_GELU_BIAS,
            (true, true) => lt::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_RELU_BIAS,
            (true, false) => lt::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS,
            (false, true) => lt::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_RELU,
            (false, false) => lt::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_DEFAULT,
        };
        set_attr(
            desc,
            lt::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_EPILOGUE,
            &epi,
        )?;
        if let Some(bp) = key.bias {
            set_attr(
                desc,
                lt::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                &bp,
            )?;
        }
    }
    Ok((desc, a, b, d))
}

/// Up to 16 algorithms cuBLASLt's heuristic proposes for the descriptors within the workspace
/// cap, and how many it returned.
pub(super) fn matmul_heuristics(
    handle: lt::cublasLtHandle_t,
    (desc, a, b, d): crate::handles::LtMatmulDescs,
    ws_cap: usize,
) -> Result<([lt::cublasLtMatmulHeuristicResult_t; 16], i32)> {
    let mut pref: lt::cublasLtMatmulPreference_t = std::ptr::null_mut();
    let mut results: [lt::cublasLtMatmulHeuristicResult_t; 16];
    let mut got = 0i32;
    let cap = ws_cap as u64;
    // SAFETY: valid out-pointers; the descriptors above are complete.
    unsafe {
        results = std::mem::zeroed();
        lt_check(
            "cublasLtMatmulPreferenceCreate",
            lt::cublasLtMatmulPreferenceCreate(&mut pref),
        )?;
        lt_check(
            "cublasLtMatmulPreferenceSetAttribute",
            lt::cublasLtMatmulPreferenceSetAttribute(
                pref,
                lt::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                &cap as *const u64 as *const c_void,
                8,
            ),
        )?;
        let r = lt::cublasLtMatmulAlgoGetHeuristic(
            handle,
            desc,
            a,
            b,
            d,
            d,
            pref,
            results.len() as i32,
            results.as_mut_ptr(),
            &mut got,
        );
        lt::cublasLtMatmulPreferenceDestroy(pref);
        lt_check("cublasLtMatmulAlgoGetHeuristic", r)?;
    }
    Ok((results, got))
}

/// A matmul descriptor for `key` (reused when an identical one exists), its algorithm chosen
/// by timing cuBLASLt's candidates on the real buffers.
///
/// Row-major `Y[M,N] = X[M,K] · op(B)` is computed as column-major `Yᵀ = op(B)ᵀ · Xᵀ`:
/// cuBLASLt's A is our B operand (`a_ptr`), its B is our X (`b_ptr`).
pub(super) fn mm_index(
    m: &mut CudaModel,
    rec: &Recorder,
    cache: &mut Vec<(MmKey, usize)>,
    key: MmKey,
    [a_ptr, b_ptr, c_ptr, y_ptr]: [u64; 4],
) -> Result<usize> {
    let (dtype, precision) = (rec.dtype, rec.plan.precision);
    let (scratch, ws_cap, events) = (rec.mm_scratch, rec.mm_ws_cap, &rec.events);
    if let Some((_, i)) = cache.iter().find(|(k, _)| *k == key) {
        return Ok(*i);
    }
    let (desc, a, b, d) = matmul_descriptors(&key, dtype, precision, rec.sm.matmul)?;
    let shape_key = format!(
        "{:?}",
        MmKey {
            bias: key.bias.map(|_| 1),
            ..key.clone()
        }
    );
    // A saved plan's algorithm for this shape: checked by cuBLASLt for these descriptors
    // (which also says its workspace), never searched or timed.
    let saved = rec
        .choices
        .borrow()
        .replaying()
        .then(|| rec.choices.borrow().matmul(&shape_key));
    if let Some(saved) = saved {
        let mut cand = MatmulDesc {
            desc,
            a,
            b,
            d,
            algo: saved.unwrap_or(lt::cublasLtMatmulAlgo_t { data: [0; 8] }),
            workspace: 0,
            alpha: f32::from_bits(key.alpha),
            beta: if key.residual { 1.0 } else { 0.0 },
        };
        let Some(algo) = saved else {
            return Err(EngineError::InvalidArgument(format!(
                "the saved plan has no cuBLASLt algorithm for the {}×{}×{} matmul (batch {}) \
                 of the plan made from its graph; build it again with `isolane build`",
                key.m, key.n, key.k, key.batch
            )));
        };
        // Set in place: `MatmulDesc { workspace, ..cand }` would copy the descriptor handles
        // (all `Copy`) and leave `cand` to destroy them when dropped, a double free at the
        // model's end (the H200 aborted so, session 20).
        cand.workspace = crate::saved::checked_matmul_algo(m.cublaslt(), (desc, a, b, d), &algo)?;
        m.mms.push(cand);
        cache.push((key, m.mms.len() - 1));
        return Ok(m.mms.len() - 1);
    }
    let (results, got) = matmul_heuristics(m.cublaslt(), (desc, a, b, d), ws_cap)?;
    let (mm, n, k) = (key.m, key.n, key.k);
    let mut cand = MatmulDesc {
        desc,
        a,
        b,
        d,
        algo: results[0].algo,
        workspace: results[0].workspace_size(),
        alpha: f32::from_bits(key.alpha),
        beta: if key.residual { 1.0 } else { 0.0 },
    };
    if got == 0 {
        return Err(EngineError::Runtime(format!(
            "cuBLASLt offers no algorithm for {mm}×{n}×{k} (batch {})",
            key.batch
        )));
    }
    if let Some((_, algo, ws)) = m.algo_cache.iter().find(|(k, _, _)| *k == shape_key) {
        cand.algo = *algo;
        cand.workspace = *ws;
        m.mms.push(cand);
        cache.push((key, m.mms.len() - 1));
        return Ok(m.mms.len() - 1);
    }
    // Time each candidate that runs (after a warm-up call) in alternating rounds, each keeping
    // its best, and keep the fastest: timed one after the other, the first ones ran while the
    // clocks were still rising after idle (time_candidates says more).
    let (handle, stream) = (m.cublaslt(), m.stream);
    /// At most this many of cuBLASLt's listed algorithms are checked against the CPU, and the
    /// first this many right ones timed.
    const LISTED_ALGOS: usize = 48;
    const LISTED_RIGHT: usize = 3;
    let run =
        |cand: &MatmulDesc| run_matmul(handle, cand, a_ptr, b_ptr, c_ptr, y_ptr, scratch, stream);
    // Every candidate is checked against the CPU first (mm_check: some computed garbage as an
    // MPS client with part of the threads); the check's run is also the warm-up call.
    let probe = MatmulProbe::new(
        &matmul_shape(&key),
        &MatmulOperands {
            x: b_ptr,
            w: a_ptr,
            c: c_ptr,
            y: y_ptr,
        },
        dtype,
        precision,
        rec.arena.ptr()..rec.arena.ptr() + rec.arena.bytes() as u64,
    )?;
    // The heuristic's candidates that it says run within the workspace, as (algorithm,
    // workspace); cuBLASLt's listed algorithms join them when all of these are wrong.
    let mut cands: Vec<(lt::cublasLtMatmulAlgo_t, usize)> = results[..got as usize]
        .iter()
        .filter(|r| {
            r.state == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS && r.workspace_size() <= ws_cap
        })
        .map(|r| (r.algo, r.workspace_size()))
        .collect();
    let heuristic = cands.len();
    let mut runs: Vec<(usize, f32)> = Vec::new();
    let mut wrong = Vec::new();
    let mut failed = None;
    let mut listed: Option<std::result::Result<lt_algos::Listed, EngineError>> = None;
    // Untimed, the first right candidate is kept; in the fallback, the fastest of the first
    // few right ones (cuBLASLt's list holds slow kernels too).
    let enough = |runs: &[(usize, f32)], listing: bool| match (rec.options.first_choice, listing) {
        (true, _) => !runs.is_empty(),
        (false, true) => runs.len() >= LISTED_RIGHT,
        (false, false) => false,
    };
    let mut next = 0;
    loop {
        while next < cands.len() && !enough(&runs, listed.is_some()) {
            let i = next;
            next += 1;
            (cand.algo, cand.workspace) = cands[i];
            // A candidate that cannot run here (a cluster shape a small green context cannot
            // place: time_candidates) is left out like a wrong one.
            match probe.matches(stream, &mut || run(&cand)) {
                Ok(true) => runs.push((i, f32::INFINITY)),
                Ok(false) => wrong.push(i),
                Err(e) => {
                    failed.get_or_insert(e);
                    wrong.push(i);
                }
            }
        }
        if !runs.is_empty() || listed.is_some() {
            break;
        }
        // Every candidate of the heuristic was wrong (seen as an MPS client, session 28): try
        // cuBLASLt's other algorithms.
        let more = lt_algos::listed_algos(
            handle,
            (desc, a, b, d),
            &matmul_types(dtype, precision),
            ws_cap,
            LISTED_ALGOS,
        );
        listed = Some(more.map(|mut more| {
            cands.append(&mut more.algos);
            more
        }));
    }
    // The listed algorithms that cuBLASLt accepted: the candidates after the heuristic's.
    let listed_count = cands.len() - heuristic;
    if rec.options.search_log {
        if let Some(l) = &listed {
            eprintln!(
                "search: matmul {mm}x{n}x{k} batch {}: the heuristic's {heuristic} candidates \
                 all wrong; cuBLASLt's listed algorithms: {}",
                key.batch,
                match l {
                    Ok(l) => format!(
                        "{} ids, {listed_count} accepted for these descriptors, {} checked, \
                         {} right",
                        l.ids,
                        next - heuristic,
                        runs.len()
                    ),
                    Err(e) => format!("not listed ({e})"),
                }
            );
        }
    }
    if runs.is_empty() {
        let failed = failed.map_or(String::new(), |e| {
            format!(" (one candidate failed to run: {e})")
        });
        let listed = match listed {
            Some(Ok(l)) if listed_count == 0 => format!(
                "; cuBLASLt accepted none of its {} other listed algorithms for these \
                 descriptors",
                l.ids
            ),
            Some(Ok(_)) => {
                format!("; nor did {listed_count} of cuBLASLt's other listed algorithms")
            }
            Some(Err(e)) => format!("; cuBLASLt's other algorithms could not be listed: {e}"),
            None => String::new(),
        };
        // Seen on the H200 (session 28): at fp16 and bf16 every candidate of vit_b_16's Linears
        // wrote inf or wrong tiles at 30 and 40 % of the threads, none at 25 or 50 %, nor at tf32.
        let half = matches!(precision, Precision::Fp16 | Precision::Bf16);
        let mps = rec
            .options
            .mps_thread_pct
            .filter(|_| half)
            .map_or(String::new(), |p| {
                format!(
                    ". This process is an MPS client with {p} % of the GPU's threads, where \
                 cuBLASLt's half-precision kernels have computed wrong results (docs/cuda.md, \
                 \"As an MPS client with part of the threads\"): another thread share or \
                 precision (tf32) may run it"
                )
            });
        return Err(EngineError::Runtime(format!(
            "cuBLASLt offers no algorithm that computes the {mm}×{n}×{k} matmul (batch {}) right \
             on this GPU: its heuristic's candidates {:?} all disagreed with the CPU on seeded \
             inputs or failed to run{failed}{listed}{mps}",
            key.batch,
            wrong.iter().filter(|&&i| i < heuristic).collect::<Vec<_>>()
        )));
    }
    // One candidate (untimed search, or the only one that passed) is kept without timing.
    // Each is timed as COPIES_PER_GRAPH calls back to back in a graph of its own, as it runs
    // in the job (timing.rs says why); one that cannot be captured is left out.
    let mut graphs: Vec<(usize, CapturedGraph)> = Vec::new();
    if runs.len() > 1 {
        for &(i, _) in &runs {
            (cand.algo, cand.workspace) = cands[i];
            let copies =
                m.capture_calls(&mut || (0..COPIES_PER_GRAPH).try_for_each(|_| run(&cand)));
            match copies {
                Ok(g) => graphs.push((i, g)),
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        if !graphs.is_empty() {
            runs.retain(|(i, _)| graphs.iter().any(|(g, _)| g == i));
        }
    }
    for _ in 0..if graphs.len() > 1 { TIMING_ROUNDS } else { 0 } {
        for ((_, t), (_, graph)) in runs.iter_mut().zip(&graphs) {
            let ms = events.time(stream, &mut || {
                // SAFETY: the graph's instance and the stream are live; its buffers (the
                // model's arena and the search scratch) outlive the timing.
                cu_check("cuGraphLaunch", unsafe {
                    cu::cuGraphLaunch(graph.exec(), stream)
                })
            })?;
            *t = t.min(ms / COPIES_PER_GRAPH as f32);
        }
    }
    drop(graphs);
    // The fastest; on a tie (untimed), the first.
    let (best, _) = *runs
        .iter()
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .expect("at least one candidate passed (checked above)");
    probe.poison_again()?;
    if rec.options.search_log {
        let times: Vec<String> = runs
            .iter()
            .map(|(i, t)| {
                let (algo, ws) = &cands[*i];
                format!(
                    "#{i} (id {}, cluster {}, ws {}) {t:.4} ms",
                    algo_config(algo, lt::cublasLtMatmulAlgoConfigAttributes_t::CUBLASLT_ALGO_CONFIG_ID),
                    algo_config(
                        algo,
                        lt::cublasLtMatmulAlgoConfigAttributes_t::CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID
                    ),
                    ws
                )
            })
            .collect();
        eprintln!(
            "search: matmul {mm}x{n}x{k} batch {}: {}; wrong {wrong:?}; kept #{best}",
            key.batch,
            times.join(", "),
        );
    }
    (cand.algo, cand.workspace) = cands[best];
    m.algo_cache.push((shape_key, cand.algo, cand.workspace));
    m.mms.push(cand);
    cache.push((key, m.mms.len() - 1));
    Ok(m.mms.len() - 1)
}

/// One attribute of a cuBLASLt algorithm's configuration, for the search log (`u32::MAX` where
/// it cannot be read). CLUSTER_SHAPE_ID is a `uint16_t` in cublasLt.h and ID an `int32_t`; a
/// buffer of another size is refused (the logs before session 29 printed every cluster as
/// 4294967295).
pub(super) fn algo_config(
    algo: &lt::cublasLtMatmulAlgo_t,
    attr: lt::cublasLtMatmulAlgoConfigAttributes_t,
) -> u32 {
    let mut v32: u32 = u32::MAX;
    let mut v16: u16 = u16::MAX;
    let cluster =
        attr == lt::cublasLtMatmulAlgoConfigAttributes_t::CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID;
    let (buf, size) = if cluster {
        (
            &mut v16 as *mut u16 as *mut c_void,
            std::mem::size_of::<u16>(),
        )
    } else {
        (
            &mut v32 as *mut u32 as *mut c_void,
            std::mem::size_of::<u32>(),
        )
    };
    let mut written = 0usize;
    // SAFETY: `algo` is an initialised algorithm; `buf` points to a live local of `size` bytes,
    // the attribute's size in cublasLt.h.
    let r =
        unsafe { lt::cublasLtMatmulAlgoConfigGetAttribute(algo, attr, buf, size, &mut written) };
    match (r == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS, cluster) {
        (true, true) => u32::from(v16),
        (true, false) => v32,
        (false, _) => u32::MAX,
    }
}

/// What the CPU check of a matmul's candidates needs to know of its key.
pub(super) fn matmul_shape(key: &MmKey) -> MatmulShape {
    MatmulShape {
        m: key.m,
        n: key.n,
        k: key.k,
        batch: key.batch,
        sx: key.sa,
        sw: key.sb,
        sy: key.sy,
        ldx: key.lda,
        ldw: key.ldb,
        ldy: key.ldy,
        w_trans: key.b_trans,
        alpha: f32::from_bits(key.alpha),
        // cuBLASLt's epilogue is set for linear keys only (matmul_descriptors).
        bias: key.bias.filter(|_| key.linear),
        relu: key.relu && key.linear,
        gelu: key.gelu && key.linear,
        residual: key.residual,
    }
}

pub(super) trait WorkspaceSize {
    fn workspace_size(&self) -> usize;
}
impl WorkspaceSize for lt::cublasLtMatmulHeuristicResult_t {
    fn workspace_size(&self) -> usize {
        self.workspaceSize
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn run_matmul(
    h: lt::cublasLtHandle_t,
    d: &MatmulDesc,
    a: u64,
    b: u64,
    c: u64,
    y: u64,
    workspace: u64,
    stream: cu::CUstream,
) -> Result<()> {
    let c = if c != 0 { c } else { y };
    // SAFETY: descriptors and layouts were built for exactly these buffers; the workspace
    // holds at least d.workspace bytes; scale type is f32.
    lt_check("cublasLtMatmul", unsafe {
        lt::cublasLtMatmul(
            h,
            d.desc,
            &d.alpha as *const f32 as *const c_void,
            a as *const c_void,
            d.a,
            b as *const c_void,
            d.b,
            &d.beta as *const f32 as *const c_void,
            c as *const c_void,
            d.d,
            y as *mut c_void,
            d.d,
            &d.algo,
            workspace as *mut c_void,
            d.workspace,
            stream as lt::cudaStream_t,
        )
    })
}

/// The most workspace a cuBLASLt algorithm may use (PyTorch gives cuBLAS 32 MiB on Hopper).
///
/// cuBLASLt's workspace is its own, apart from cuDNN's, and zeroed when placed, as PyTorch keeps
/// it: some of its algorithms (split-K kernels with a workspace of a few bytes) keep semaphores
/// there, and cuDNN's convolutions write their scratch over whatever they share. (Suspected, and
/// ruled out, as the cause of the wrong matmuls under MPS thread limits: `mm_check`.)
pub(crate) const MM_WORKSPACE_CAP: usize = 32 << 20;

pub(super) fn record_linear(
    m: &mut CudaModel,
    rec: &Recorder,
    caches: &mut LibraryCaches,
    err: &dyn Fn(EngineError) -> EngineError,
    l: &LinearStep,
) -> Result<()> {
    let LinearStep {
        x,
        w,
        bias,
        y,
        m: mm,
        n,
        k,
        act,
        residual,
    } = l;
    let relu = matches!(act, Some(Unary::Relu));
    // tf32/fp16/bf16: cuBLASLt's GELU epilogue (tanh form; it differs from
    // the exact erf GELU by < 1e-3, below those precisions' rounding here;
    // fp32 keeps the exact GELU kernel).
    let gelu = matches!(act, Some(Unary::Gelu) | Some(Unary::GeluTanh))
        && rec.plan.precision != Precision::Fp32
        && bias.is_some()
        && !rec.options.exact_gelu;
    let key = MmKey {
        relu,
        gelu,
        residual: residual.is_some(),
        ..MmKey::linear(*mm, *n, *k, bias.map(&|l| rec.ptr(l)))
    };
    let res_ptr = residual.map_or(0, &|l| rec.ptr(l));
    let ptrs = [rec.ptr(*w), rec.ptr(*x), res_ptr, rec.ptr(*y)];
    let launch = matmul_launch(m, rec, &mut caches.mm, key, ptrs).map_err(err)?;
    m.launches.push(launch);
    if act.is_some() && !relu && !gelu {
        m.launches.push(pointwise_launch(
            rec,
            rec.ptr(*y),
            rec.ptr(*y),
            None,
            None,
            None,
            mm * n,
            1,
            1,
            *act,
        ));
    }
    Ok(())
}

pub(super) fn record_matmul(
    m: &mut CudaModel,
    rec: &Recorder,
    caches: &mut LibraryCaches,
    err: &dyn Fn(EngineError) -> EngineError,
    mm_step: &MatMulStep,
) -> Result<()> {
    let MatMulStep {
        a,
        b,
        y,
        batch,
        m: mm,
        n,
        k,
        a_batch_stride,
        b_batch_stride,
        b_trans,
        alpha,
        lda,
        ldb,
        ldy,
        y_batch_stride,
    } = mm_step;
    let key = MmKey {
        m: *mm,
        n: *n,
        k: *k,
        batch: *batch,
        sa: *a_batch_stride,
        sb: *b_batch_stride,
        lda: *lda,
        ldb: *ldb,
        ldy: *ldy,
        sy: *y_batch_stride,
        b_trans: *b_trans,
        linear: false,
        bias: None,
        relu: false,
        gelu: false,
        residual: false,
        alpha: alpha.to_bits(),
    };
    // cuBLASLt's A is our B operand (see `mm_index`).
    let ptrs = [rec.ptr(*b), rec.ptr(*a), 0, rec.ptr(*y)];
    let launch = matmul_launch(m, rec, &mut caches.mm, key, ptrs).map_err(err)?;
    m.launches.push(launch);
    Ok(())
}

/// The launch of the cuBLASLt matmul `key` on `[a, b, c, y]` (cuBLASLt's operands, see
/// `mm_index`; `c` is 0 without a residual), its descriptor made and timed unless cached.
pub(super) fn matmul_launch(
    m: &mut CudaModel,
    rec: &Recorder,
    mm_cache: &mut Vec<(MmKey, usize)>,
    key: MmKey,
    [a, b, c, y]: [u64; 4],
) -> Result<Launch> {
    let mm = mm_index(m, rec, mm_cache, key, [a, b, c, y])?;
    Ok(Launch::Matmul { mm, a, b, c, y })
}
