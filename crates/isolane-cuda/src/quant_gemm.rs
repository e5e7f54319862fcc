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
use crate::plan::QuantGemmStep;
use isolane_engine::quant::QuantType;

/// The descriptor and layouts of one quantized GEMM shape.
fn quant_descriptors(
    q: &QuantGemmStep,
) -> Result<(
    lt::cublasLtMatmulDesc_t,
    lt::cublasLtMatrixLayout_t,
    lt::cublasLtMatrixLayout_t,
    lt::cublasLtMatrixLayout_t,
)> {
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

/// The step's launches: im2col, quantize, GEMM, epilogue.
pub(super) fn record_quant_gemm(
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
        m.launches.push(Launch::Kernel {
            func: rec.func("quantize_q8"),
            grid: elementwise_grid(rows),
            block: BLOCK,
            shared: 0,
            args: vec![
                Arg::Ptr(rec.ptr(src)),
                Arg::Ptr(rec.ptr(q.xq)),
                Arg::F32(q.x_scale),
                Arg::I64(rows as i64),
                Arg::I32(fp8 as i32),
            ],
        });
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
    let (k, p0, p1) = act_code(q.act, rec.dtype);
    let total = q.m * q.n;
    let yq = match (q.y_scale, q.qtype) {
        (None, _) => 0,
        (Some(_), QuantType::Int8) => 1,
        (Some(_), _) => 2,
    };
    m.launches.push(Launch::Kernel {
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
            Arg::I32(fp8 as i32),
            Arg::I32(k),
            Arg::F32(p0),
            Arg::F32(p1),
            Arg::F32(q.y_scale.unwrap_or(1.0)),
            Arg::I32(yq),
        ],
    });
    Ok(())
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
/// K) of the model), its algorithm the fastest of cuBLASLt's heuristic candidates (the first when the
/// search is untimed or a saved plan replays: an int32 sum is exact whatever the algorithm,
/// so int8 needs no saved choice; fp8's f32 sum may round differently per algorithm).
fn quant_matmul(m: &mut CudaModel, rec: &Recorder, q: &QuantGemmStep) -> Result<usize> {
    let descs = quant_descriptors(q)?;
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
    let untimed = rec.options.first_choice || rec.choices.borrow().replaying();
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
    m.mms.push(cand);
    Ok(m.mms.len() - 1)
}
