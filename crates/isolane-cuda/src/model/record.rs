//! Lowering plan steps into launches: [`Recorder`], the per-step dispatch and the kernel-only ops
//! (convolutions are in `conv`, matrix products in `matmul`, quantized GEMMs in `quant_gemm`).

use super::*;

pub(super) fn elementwise_grid(n: usize) -> u32 {
    (n.div_ceil(BLOCK as usize)).clamp(1, 8192) as u32
}

/// The channel mean's outputs (`n · c`) below which `chan_mean_rows` splits each channel's
/// rows over 8 threads: there `chan_mean`'s one thread an output makes fewer than ~2 blocks a
/// multiprocessor of the H200 (resnet50: batch 1 2,048 outputs, batch 64 131,072).
const CHAN_MEAN_ROWS_BELOW: usize = 65_536;

/// Fewest rows for which the one-warp-per-row LayerNorm / softmax kernels are chosen.
pub(super) const WARP_ROWS_MIN: usize = 3072;

/// Rows per block of the one-warp-per-row kernels.
pub(super) const WARP_ROWS_PER_BLOCK: usize = 4;

pub(super) fn reduce_block(len: usize) -> u32 {
    if len >= 1024 {
        512
    } else if len >= 256 {
        256
    } else if len > 64 {
        128
    } else {
        64
    }
}

/// What recording a step's launches needs besides the model: where every operand lives on
/// the device, the kernel table, the scratch buffer and events algorithm searches time on,
/// and the row-kernel choice.
pub(super) struct Recorder<'a> {
    pub(super) plan: &'a Plan,
    pub(super) const_offs: &'a [usize],
    /// The model's activation arena and weights on the device.
    pub(super) arena: DeviceSpan,
    pub(super) weights: DeviceSpan,
    pub(super) dtype: DType,
    pub(super) es: usize,
    pub(super) half_names: &'static [&'static str],
    /// The device's compute capability (which of the module's kernels may run).
    pub(super) arch: (i32, i32),
    /// The most shared memory a block may opt in to on the device (bytes).
    pub(super) smem_optin: usize,
    /// Device scratch of `ws_cap` bytes: cuDNN's workspace while candidates are timed.
    pub(super) scratch: u64,
    pub(super) ws_cap: usize,
    /// Zeroed device scratch of `mm_ws_cap` bytes: cuBLASLt's workspace while timing.
    pub(super) mm_scratch: u64,
    pub(super) mm_ws_cap: usize,
    pub(super) events: Events,
    pub(super) options: BuildOptions,
    /// The choices made among timed candidates: recorded, or replayed from a saved plan
    /// (`crate::saved`), in which case nothing is timed.
    pub(super) choices: std::cell::RefCell<crate::saved::ChoiceLog>,
    /// The SM counts the libraries are told to split their work for (a load: the build's).
    pub(super) sm: crate::saved::SmTargets,
    /// Convolution paths not to keep at their steps (`crate::rebuild`).
    pub(super) barred: &'a [crate::rebuild::StepPath],
}

impl Recorder<'_> {
    /// Elements per 16-byte access of the `*_v` kernels (4 f32, 8 f16/bf16).
    pub(super) fn vec_lanes(&self) -> usize {
        kernels::VEC_BYTES / self.es
    }

    /// The device address of an operand.
    pub(super) fn ptr(&self, l: Loc) -> u64 {
        match l {
            Loc::Storage { id, offset } => {
                self.arena.ptr() + self.plan.storages[id].offset as u64 + (offset * self.es) as u64
            }
            Loc::Const { id, offset } => {
                self.weights.ptr() + self.const_offs[id] as u64 + (offset * self.es) as u64
            }
        }
    }

    /// The index in `CudaModel::funcs` of the kernel `name`.
    pub(super) fn func(&self, name: &str) -> usize {
        KERNEL_NAMES
            .iter()
            .chain(self.half_names)
            .position(|k| *k == name)
            .expect("kernel name is in KERNEL_NAMES (or HALF_KERNEL_NAMES for f16/bf16)")
    }

    /// One warp per row pays off with many rows; with few (batch 1) the block-per-row
    /// kernels were faster (measured: vit_b_16 fp16 batch 1, 0.77 ms with the warp kernels
    /// for its 197-row LayerNorms and 2364-row softmaxes, 0.65 ms without).
    pub(super) fn warp_rows(&self, rows: usize) -> bool {
        !self.options.block_rows && rows >= WARP_ROWS_MIN
    }
}

/// The library descriptors made so far, found again by key: one cuDNN convolution or
/// cuBLASLt matmul (with its timed algorithm) per distinct shape.
#[derive(Default)]
pub(super) struct LibraryCaches {
    pub(super) conv: Vec<(ConvKey, usize)>,
    /// The graph-API plan kept for an equal convolution and epilogue (`m.conv_graphs` index).
    pub(super) conv_graph: Vec<(ConvGraphSpec, usize)>,
    pub(super) mm: Vec<(MmKey, usize)>,
    /// The quantized GEMMs' (`quant_gemm`), by type and shape: the matmul, or `None` where
    /// cuBLASLt had no algorithm (the CUDA-core fallback kernel runs instead).
    pub(super) quant: Vec<(String, Option<usize>)>,
    /// cuDNN's fused quantized graphs, by spec: the plan (`m.conv_graphs` index) the layers of
    /// that spec share (their scales are per launch), or why cuDNN made none.
    pub(super) quant_graph: Vec<(ConvGraphSpec, std::result::Result<usize, String>)>,
    /// A build says once that a layer had no fused quantized graph.
    pub(super) quant_graph_noted: bool,
    /// The quantized products whose timed graph lost alone, in step order
    /// (`quant_gemm::keep_faster_whole`).
    pub(super) graph_alts: Vec<quant_gemm::GraphAlt>,
}

#[allow(clippy::too_many_arguments)]
pub(super) fn pointwise_launch(
    rec: &Recorder,
    x: u64,
    y: u64,
    scale: Option<u64>,
    bias: Option<u64>,
    res: Option<u64>,
    n: usize,
    channels: usize,
    inner: usize,
    act: Option<Unary>,
) -> Launch {
    let (a, p0, p1) = act_code(act, rec.dtype);
    let (scale, bias, res) = (scale.unwrap_or(0), bias.unwrap_or(0), res.unwrap_or(0));
    let lanes = rec.vec_lanes();
    // Channels contiguous (inner 1), whole vectors, 16-byte aligned: 16-byte accesses.
    let vector = inner == 1
        && channels.is_multiple_of(lanes)
        && n.is_multiple_of(lanes)
        && n / lanes <= i32::MAX as usize
        && vec_aligned(&[x, y, scale, bias, res]);
    let (func, threads, sizes) = if vector {
        let sizes = [
            Arg::I32((n / lanes) as i32),
            Arg::I32((channels / lanes) as i32),
        ];
        (rec.func("pointwise_v"), n / lanes, sizes.to_vec())
    } else {
        let sizes = [
            Arg::I64(n as i64),
            Arg::I64(channels as i64),
            Arg::I64(inner as i64),
        ];
        (rec.func("pointwise"), n, sizes.to_vec())
    };
    let mut args = vec![
        Arg::Ptr(x),
        Arg::Ptr(y),
        Arg::Ptr(scale),
        Arg::Ptr(bias),
        Arg::Ptr(res),
    ];
    args.extend(sizes);
    args.extend([Arg::I32(a), Arg::F32(p0), Arg::F32(p1)]);
    Launch::Kernel {
        func,
        grid: elementwise_grid(threads),
        block: BLOCK,
        shared: 0,
        args,
    }
}

/// Whether every operand (0 for an absent one) suits the 16-byte accesses of the `*_v` kernels.
pub(super) fn vec_aligned(ptrs: &[u64]) -> bool {
    ptrs.iter()
        .all(|p| p.is_multiple_of(kernels::VEC_BYTES as u64))
}

/// Records the launches of one step (choosing among timed candidates where there are several).
pub(super) fn record_step(
    m: &mut CudaModel,
    rec: &Recorder,
    caches: &mut LibraryCaches,
    step: &Step,
) -> Result<()> {
    let err = |e: EngineError| e.at_node(&step.name);
    let es = rec.es;
    match &step.kind {
        StepKind::CastIn {
            x,
            y,
            n,
            nhwc: None,
            ..
        } => m.launches.push(cast_launch(rec, "cast_in", *x, *y, *n)),
        StepKind::CastIn {
            x,
            y,
            n,
            nhwc: Some((c, hw, padded)),
            quant,
        } => m.launches.push(cast_in_nhwc(
            rec,
            [*x, *y],
            *n,
            [*c, *padded, *hw],
            quant.as_ref(),
        )),
        StepKind::CastOut { x, y, n } => m.launches.push(cast_launch(rec, "cast_out", *x, *y, *n)),
        StepKind::Conv(c) => record_conv(m, rec, caches, &err, c)?,
        StepKind::DwConv(c) => record_dw_conv(m, rec, c)?,
        StepKind::Linear(l) => record_linear(m, rec, caches, &err, l)?,
        StepKind::MatMul(mm_step) => record_matmul(m, rec, caches, &err, mm_step)?,
        StepKind::QuantGemm(q) => {
            quant_gemm::record_quant_gemm(m, rec, caches, (&step.name, &err), q)?
        }
        StepKind::Pointwise {
            x,
            y,
            scale,
            bias,
            residual,
            n,
            channels,
            inner,
            act,
        } => m.launches.push(pointwise_launch(
            rec,
            rec.ptr(*x),
            rec.ptr(*y),
            scale.map(&|l| rec.ptr(l)),
            bias.map(&|l| rec.ptr(l)),
            residual.map(&|l| rec.ptr(l)),
            *n,
            *channels,
            *inner,
            *act,
        )),
        StepKind::Binary { a, b, y, op, space } => {
            let n = space.numel();
            m.launches.push(Launch::Kernel {
                func: rec.func("binary"),
                grid: elementwise_grid(n),
                block: BLOCK,
                shared: 0,
                args: vec![
                    Arg::Ptr(rec.ptr(*a)),
                    Arg::Ptr(rec.ptr(*b)),
                    Arg::Ptr(rec.ptr(*y)),
                    Arg::I64(n as i64),
                    Arg::I32(binary_code(*op)),
                    Arg::Space(Box::new(Space::from(space))),
                ],
            });
        }
        StepKind::Copy { x, y, space } => {
            // The output staging is f32 and so is its source when dtype is f32.
            // Contiguous innermost runs move in 16-, 8- or 4-byte words.
            let (xp, yp) = (rec.ptr(*x), rec.ptr(*y));
            let (name, sp) = [("copy_w16", 16), ("copy_w8", 8), ("copy_w4", 4)]
                .iter()
                .find_map(|&(k, w)| widen_copy(space, es, w, [xp, yp]).map(|sp| (k, sp)))
                .unwrap_or(("copy_strided", space.clone()));
            let n = sp.numel();
            m.launches.push(Launch::Kernel {
                func: rec.func(name),
                grid: elementwise_grid(n),
                block: BLOCK,
                shared: 0,
                args: vec![
                    Arg::Ptr(xp),
                    Arg::Ptr(yp),
                    Arg::I64(n as i64),
                    Arg::Space(Box::new(Space::from(&sp))),
                ],
            });
        }
        StepKind::Attention(at) => record_attention(m, rec, &err, at)?,
        StepKind::LayerNorm(ln) => record_layer_norm(m, rec, ln).map_err(err)?,
        StepKind::Softmax(sm) => record_softmax(m, rec, sm),
        StepKind::Pool(pool) => record_pool(m, rec, pool),
        StepKind::ChanMean { x, y, n, c, hw } => {
            // Few outputs (a batch of one): a block a 32-channel group, its rows split 8 ways
            // (256 threads; the kernels' comments). The choice depends on the shape only, so
            // a plan computes the same bits in every partition.
            let (func, grid) = if n * c < CHAN_MEAN_ROWS_BELOW {
                ("chan_mean_rows", (n * c.div_ceil(32)).clamp(1, 8192) as u32)
            } else {
                ("chan_mean", elementwise_grid(n * c))
            };
            m.launches.push(Launch::Kernel {
                func: rec.func(func),
                grid,
                block: BLOCK,
                shared: 0,
                args: vec![
                    Arg::Ptr(rec.ptr(*x)),
                    Arg::Ptr(rec.ptr(*y)),
                    Arg::I64(*n as i64),
                    Arg::I64(*c as i64),
                    Arg::I64(*hw as i64),
                ],
            })
        }
        StepKind::RowReduce {
            x,
            y,
            rows,
            hw,
            kind,
        } => m.launches.push(Launch::Kernel {
            func: rec.func("row_reduce"),
            grid: (rows * 32).div_ceil(BLOCK as usize) as u32,
            block: BLOCK,
            shared: 0,
            args: vec![
                Arg::Ptr(rec.ptr(*x)),
                Arg::Ptr(rec.ptr(*y)),
                Arg::I64(*rows as i64),
                Arg::I64(*hw as i64),
                Arg::I32(reduce_code(*kind)),
            ],
        }),
        StepKind::Resize(rs) => record_resize(m, rec, rs),
        StepKind::FakeQuant(fq) => {
            let (lo, hi) = fq.qtype.range();
            m.launches.push(Launch::Kernel {
                func: rec.func("fake_quant"),
                grid: elementwise_grid(fq.n),
                block: BLOCK,
                shared: 0,
                args: vec![
                    Arg::Ptr(rec.ptr(fq.x)),
                    Arg::Ptr(rec.ptr(fq.y)),
                    Arg::Ptr(fq.params.map_or(0, |[s, _]| rec.ptr(s))),
                    Arg::Ptr(fq.params.map_or(0, |[_, z]| rec.ptr(z))),
                    Arg::F32(fq.scale),
                    Arg::F32(fq.zero_point),
                    Arg::I64(fq.n as i64),
                    Arg::I64(fq.channels as i64),
                    Arg::I64(fq.inner as i64),
                    Arg::F32(lo),
                    Arg::F32(hi),
                    Arg::I32(fq.qtype.is_float() as i32),
                    Arg::I32(fq.saturate as i32),
                ],
            });
        }
        StepKind::AdaptivePool {
            x,
            y,
            x_shape,
            out_hw,
        } => {
            let n = x_shape[0] * x_shape[1] * out_hw[0] * out_hw[1];
            m.launches.push(Launch::Kernel {
                func: rec.func("adaptive_pool"),
                grid: elementwise_grid(n),
                block: BLOCK,
                shared: 0,
                args: vec![
                    Arg::Ptr(rec.ptr(*x)),
                    Arg::Ptr(rec.ptr(*y)),
                    Arg::I32((x_shape[0] * x_shape[1]) as i32),
                    Arg::I32(x_shape[2] as i32),
                    Arg::I32(x_shape[3] as i32),
                    Arg::I32(out_hw[0] as i32),
                    Arg::I32(out_hw[1] as i32),
                ],
            });
        }
    }
    Ok(())
}

/// The elementwise cast of `n` values from `x` to `y` (into or out of the model's dtype).
pub(super) fn cast_launch(rec: &Recorder, kernel: &str, x: Loc, y: Loc, n: usize) -> Launch {
    Launch::Kernel {
        func: rec.func(kernel),
        grid: elementwise_grid(n),
        block: BLOCK,
        shared: 0,
        args: vec![
            Arg::Ptr(rec.ptr(x)),
            Arg::Ptr(rec.ptr(y)),
            Arg::I64(n as i64),
        ],
    }
}

/// The input cast that writes channels last: one thread a pixel, its `c` values read from
/// `c` planes of `hw` (each coalesced across a warp) and stored side by side, then zeros up
/// to `padded` channels.
fn cast_in_nhwc(
    rec: &Recorder,
    [x, y]: [Loc; 2],
    n: usize,
    [c, padded, hw]: [usize; 3],
    quant: Option<&CastQuant>,
) -> Launch {
    let pixels = n / c;
    let q = match quant {
        Some(q) => {
            let (lo, hi) = q.qtype.range();
            let flags = [1, q.qtype.is_float() as i32, q.saturate as i32];
            CastQ {
                flags,
                v: [q.scale, q.zero_point, lo, hi],
            }
        }
        None => CastQ {
            flags: [0; 3],
            v: [1.0, 0.0, 0.0, 0.0],
        },
    };
    Launch::Kernel {
        func: rec.func("cast_in_nhwc"),
        grid: elementwise_grid(pixels),
        block: BLOCK,
        shared: 0,
        args: vec![
            Arg::Ptr(rec.ptr(x)),
            Arg::Ptr(rec.ptr(y)),
            Arg::I64(pixels as i64),
            Arg::I32(c as i32),
            Arg::I32(padded as i32),
            Arg::I64(hw as i64),
            Arg::CastQ(Box::new(q)),
        ],
    }
}

pub(super) fn record_attention(
    m: &mut CudaModel,
    rec: &Recorder,
    err: &dyn Fn(EngineError) -> EngineError,
    at: &AttentionStep,
) -> Result<()> {
    let AttentionStep {
        q,
        k,
        v,
        y,
        batch,
        heads,
        seq,
        dim,
        alpha,
        out_scale,
        q_strides,
        k_strides,
        v_strides,
        y_strides,
    } = at;
    let dtype = rec.dtype;
    if *dim != kernels::ATTN_HEAD_DIM || dtype == DType::F32 {
        return Err(err(EngineError::Runtime(format!(
            "fused attention needs head dim {} and f16/bf16 (got {dim}, {})",
            kernels::ATTN_HEAD_DIM,
            dtype.name()
        ))));
    }
    let bh = |s: &[usize; 3]| [s[0] as i64, s[1] as i64];
    let (qs, ks, vs, ys) = (bh(q_strides), bh(k_strides), bh(v_strides), bh(y_strides));
    let launch = |(warps, key_groups): (usize, usize)| {
        let qtiles = seq.div_ceil(kernels::ATTN_WARP_ROWS * warps);
        vec![Launch::Kernel {
            func: rec.func("attention"),
            grid: (qtiles * heads * batch) as u32,
            block: (32 * warps * key_groups) as u32,
            shared: kernels::attn_shared_bytes(key_groups) as u32,
            args: vec![
                Arg::Ptr(rec.ptr(*q)),
                Arg::Ptr(rec.ptr(*k)),
                Arg::Ptr(rec.ptr(*v)),
                Arg::Ptr(rec.ptr(*y)),
                Arg::Attn(Box::new(AttnP {
                    v: [*seq as i32, *heads as i32, qtiles as i32, warps as i32],
                    scale_log2: alpha * std::f32::consts::LOG2_E,
                    oscale: *out_scale,
                    bh: [qs[0], qs[1], ks[0], ks[1], vs[0], vs[1], ys[0], ys[1]],
                    rows: [
                        q_strides[2] as i32,
                        k_strides[2] as i32,
                        v_strides[2] as i32,
                        y_strides[2] as i32,
                    ],
                })),
            ],
        }]
    };
    // Blocks of 4 query warps fill the GPU at large batch; at batch 1 (12 heads of ViT-B)
    // smaller blocks give more of them, and key groups more warps per block. Every shape
    // computes the same attention (key groups add their partial sums in another order, within
    // f32 rounding): timed, the fastest kept (the first untimed).
    let mut paths: Vec<TimedPath> = kernels::ATTN_BLOCKS
        .iter()
        .map(|&b| (launch(b), f32::INFINITY))
        .collect();
    let chosen = fastest_of(m, rec, &mut paths).map_err(err)?;
    if rec.options.search_log {
        let times: Vec<String> = kernels::ATTN_BLOCKS
            .iter()
            .zip(&paths)
            .map(|((w, kg), (_, ms))| format!("{w} warps x {kg} key groups {ms:.4} ms"))
            .collect();
        eprintln!(
            "search: attention batch {batch} heads {heads} seq {seq}: {}; kept {chosen}",
            times.join(", ")
        );
    }
    m.launches.extend(paths.swap_remove(chosen).0);
    Ok(())
}

pub(super) fn record_layer_norm(
    m: &mut CudaModel,
    rec: &Recorder,
    ln: &LayerNormStep,
) -> Result<()> {
    let LayerNormStep {
        x,
        scale,
        bias,
        y,
        rows,
        cols,
        eps,
    } = ln;
    let ptrs = [
        rec.ptr(*x),
        rec.ptr(*y),
        rec.ptr(*scale),
        bias.map_or(0, &|l| rec.ptr(l)),
    ];
    let ptr_args = || ptrs.iter().map(|&p| Arg::Ptr(p));
    let warp_kernel = |name: String, rows_per_block: usize| Launch::Kernel {
        func: rec.func(&name),
        grid: rows.div_ceil(rows_per_block) as u32,
        block: 32 * rows_per_block as u32,
        shared: 0,
        args: ptr_args()
            .chain([
                Arg::I32(*rows as i32),
                Arg::I32(*cols as i32),
                Arg::F32(*eps),
            ])
            .collect(),
    };
    // Rows of ≤ 1024: one warp per row in registers; longer: a block per row.
    let first = match WARP_ROW_PER_LANE
        .iter()
        .find(|&&nr| *cols <= 32 * nr && rec.warp_rows(*rows))
    {
        Some(nr) => warp_kernel(format!("layernorm_warp{nr}"), WARP_ROWS_PER_BLOCK),
        None => Launch::Kernel {
            func: rec.func("layernorm"),
            grid: *rows as u32,
            block: reduce_block(*cols),
            shared: 0,
            args: ptr_args()
                .chain([Arg::I64(*cols as i64), Arg::F32(*eps)])
                .collect(),
        },
    };
    let mut paths: Vec<TimedPath> = vec![(vec![first], f32::INFINITY)];
    // Whole 16-byte vectors and aligned rows: one warp per row with wide loads, 8, 2 or 1
    // rows per block (one: the most blocks for the fewest rows, as at batch 1), timed against
    // the kernel above (the fastest kept; untimed, the first).
    let lanes = rec.vec_lanes();
    let vector = cols.is_multiple_of(lanes) && vec_aligned(&ptrs);
    if let Some(nv) = kernels::LN_VEC_PER_LANE
        .iter()
        .find(|&&nv| vector && *cols <= 32 * nv * lanes)
    {
        for rows_per_block in [8, 2, 1] {
            let l = warp_kernel(format!("layernorm_wv{nv}"), rows_per_block);
            paths.push((vec![l], f32::INFINITY));
        }
    }
    let chosen = fastest_of(m, rec, &mut paths)?;
    if rec.options.search_log && paths.len() > 1 {
        let times: Vec<String> = paths
            .iter()
            .map(|(launches, ms)| match launches.first() {
                // `layernorm` is a block per row; the warp kernels a warp per row.
                Some(Launch::Kernel { func, block, .. }) => {
                    let name = kernels::kernel_name(*func).unwrap_or("layernorm");
                    let rows = if name == "layernorm" { 1 } else { block / 32 };
                    format!("{name} ({rows} rows a block) {ms:.4} ms")
                }
                _ => format!("{ms:.4} ms"),
            })
            .collect();
        eprintln!(
            "search: layernorm {rows}x{cols}: {}; kept {chosen}",
            times.join(", ")
        );
    }
    m.launches.extend(paths.swap_remove(chosen).0);
    Ok(())
}

pub(super) fn record_softmax(m: &mut CudaModel, rec: &Recorder, sm: &SoftmaxStep) {
    let SoftmaxStep {
        x,
        y,
        outer,
        len,
        inner,
    } = sm;
    m.launches.push(
        match WARP_ROW_PER_LANE
            .iter()
            .find(|&&nr| *len <= 32 * nr && rec.warp_rows(*outer))
        {
            Some(nr) if *inner == 1 => Launch::Kernel {
                func: rec.func(&format!("softmax_warp{nr}")),
                grid: outer.div_ceil(WARP_ROWS_PER_BLOCK) as u32,
                block: 32 * WARP_ROWS_PER_BLOCK as u32,
                shared: 0,
                args: vec![
                    Arg::Ptr(rec.ptr(*x)),
                    Arg::Ptr(rec.ptr(*y)),
                    Arg::I32(*outer as i32),
                    Arg::I32(*len as i32),
                ],
            },
            _ => Launch::Kernel {
                func: rec.func("softmax"),
                grid: (outer * inner) as u32,
                block: reduce_block(*len),
                shared: 0,
                args: vec![
                    Arg::Ptr(rec.ptr(*x)),
                    Arg::Ptr(rec.ptr(*y)),
                    Arg::I64(*len as i64),
                    Arg::I64(*inner as i64),
                ],
            },
        },
    );
}

pub(super) fn record_pool(m: &mut CudaModel, rec: &Recorder, pool: &PoolStep) {
    let PoolStep {
        x,
        y,
        max,
        x_shape,
        out_hw,
        kernel,
        strides,
        pads,
        dilations,
        count_include_pad,
        nhwc,
        y_quant,
    } = pool;
    let v = [
        x_shape[0],
        x_shape[1],
        x_shape[2],
        x_shape[3],
        out_hw[0],
        out_hw[1],
        kernel[0],
        kernel[1],
        strides[0],
        strides[1],
        pads[0],
        pads[1],
        dilations[0],
        dilations[1],
        *max as usize,
        *count_include_pad as usize,
    ];
    let vi = v.map(|s| s as i32);
    let n = x_shape[0] * x_shape[1] * out_hw[0] * out_hw[1];
    // Channels contiguous and whole vectors: 16-byte loads, 32-bit indices.
    let lanes = rec.vec_lanes();
    let vector = *nhwc
        && x_shape[1].is_multiple_of(lanes)
        && n / lanes <= i32::MAX as usize
        && vec_aligned(&[rec.ptr(*x), rec.ptr(*y)]);
    let (func, threads) = match (vector, y_quant.is_some()) {
        (true, false) => ("pool2d_v", n / lanes),
        (true, true) => ("pool2d_v_q8", n / lanes),
        (false, false) => ("pool2d", n),
        (false, true) => ("pool2d_q8", n),
    };
    let mut args = vec![
        Arg::Ptr(rec.ptr(*x)),
        Arg::Ptr(rec.ptr(*y)),
        Arg::Pool(Box::new(PoolP {
            v: vi,
            xs: strides4(x_shape, *nhwc),
            ys: strides4(&[x_shape[0], x_shape[1], out_hw[0], out_hw[1]], *nhwc),
        })),
    ];
    if let Some((s, qtype)) = y_quant {
        args.push(Arg::F32(*s));
        args.push(Arg::I32(
            (*qtype != isolane_engine::quant::QuantType::Int8) as i32,
        ));
    }
    m.launches.push(Launch::Kernel {
        func: rec.func(func),
        grid: elementwise_grid(threads),
        block: BLOCK,
        shared: 0,
        args,
    });
}

pub(super) fn record_resize(m: &mut CudaModel, rec: &Recorder, rs: &ResizeStep) {
    let ResizeStep {
        x,
        y,
        x_shape,
        out_hw,
        linear,
        coord,
        nearest,
        scales,
        nhwc,
    } = rs;
    let [n, c, h, w] = x_shape.map(|d| d as i32);
    let [oh, ow] = out_hw.map(|d| d as i32);
    let total = x_shape[0] * x_shape[1] * out_hw[0] * out_hw[1];
    m.launches.push(Launch::Kernel {
        func: rec.func("resize2d"),
        grid: elementwise_grid(total),
        block: BLOCK,
        shared: 0,
        args: vec![
            Arg::Ptr(rec.ptr(*x)),
            Arg::Ptr(rec.ptr(*y)),
            Arg::Resize(Box::new(ResizeP {
                v: [n, c, h, w, oh, ow, *linear as i32, *coord, *nearest, 0],
                scales: *scales,
                xs: strides4(x_shape, *nhwc),
                ys: strides4(&[x_shape[0], x_shape[1], out_hw[0], out_hw[1]], *nhwc),
            })),
        ],
    });
}

/// The `row_reduce` kernel's code for a reduction (the `switch` in kernels.rs).
pub(super) fn reduce_code(kind: isolane_engine::ir::ReduceKind) -> i32 {
    use isolane_engine::ir::ReduceKind;
    match kind {
        ReduceKind::Mean => 0,
        ReduceKind::Sum => 1,
        ReduceKind::Max => 2,
        ReduceKind::Min => 3,
        ReduceKind::L1 => 4,
        ReduceKind::SumSquare => 5,
        ReduceKind::L2 => 6,
    }
}
