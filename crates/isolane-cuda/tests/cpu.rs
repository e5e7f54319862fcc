//! CPU-only tests of the cuda backend (they run in CI, which has no GPU and no CUDA toolkit):
//! planning, arena liveness, fusions, kernel source generation, the kernel cache, and the
//! errors for missing libraries.

mod common;

use common::{random, rel_l2};
use isolane_cuda::kernels::{self, KERNEL_NAMES};
use isolane_cuda::libs;
use isolane_cuda::plan::{
    self, check_no_overlap, AttentionStep, DType, LinearStep, Loc, MatMulStep, Plan, PlanOptions,
    ResizeStep, SoftmaxStep, StepKind, Storage, Strided,
};
use isolane_engine::{build_model, builtin_models, passes, Precision, Weights};

fn planned(model: &str, batch: usize, p: Precision, channels_last: bool) -> Plan {
    let g = build_model(model, Weights::Zeros).unwrap();
    let g = passes::optimize(&g, batch).unwrap();
    plan::plan_with(
        &g,
        batch,
        p,
        PlanOptions {
            channels_last,
            ..Default::default()
        },
    )
    .unwrap()
}

/// Every storage operand of every step lies inside the arena, and storages alive at the same
/// step never share bytes.
fn check_plan(p: &Plan) {
    check_no_overlap(&p.storages).unwrap();
    for s in &p.storages {
        assert!(
            s.offset + s.bytes <= p.arena_bytes,
            "{s:?} beyond the arena"
        );
        assert_eq!(s.offset % plan::ALIGN, 0);
        assert!(s.first <= s.last);
    }
}

#[test]
fn seven_models_plan_at_every_precision_without_overlap() {
    let classifiers = builtin_models().iter().filter(|m| m.output_shape == [1000]);
    assert_eq!(classifiers.clone().count(), 7);
    for m in classifiers.map(|m| m.name) {
        for p in Precision::ALL {
            let pl = planned(m, 2, p, true);
            check_plan(&pl);
            assert_eq!(pl.dtype, DType::of(p));
            assert_eq!(pl.inputs.len(), 1);
            assert_eq!(pl.outputs[0].shape, vec![2, 1000]);
            // Output staging is f32 and the cast (or copy) to it is the last step.
            assert!(matches!(
                pl.steps.last().unwrap().kind,
                StepKind::CastOut { .. } | StepKind::Copy { .. }
            ));
        }
    }
}

#[test]
fn liveness_lets_storages_share_memory() {
    // resnet50: the arena is far smaller than the sum of all activations.
    let pl = planned("resnet50", 1, Precision::Fp16, true);
    let sum: usize = pl.storages.iter().map(|s| plan::align(s.bytes)).sum();
    assert!(
        pl.arena_bytes * 3 < sum,
        "arena {} vs sum {}",
        pl.arena_bytes,
        sum
    );
}

#[test]
fn assign_offsets_packs_by_lifetime() {
    let mut st = vec![
        Storage {
            bytes: 1000,
            first: 0,
            last: 1,
            offset: 0,
        },
        Storage {
            bytes: 1000,
            first: 2,
            last: 3,
            offset: 0,
        },
        Storage {
            bytes: 500,
            first: 1,
            last: 2,
            offset: 0,
        },
    ];
    let total = plan::assign_offsets(&mut st, plan::ARENA_RULES);
    check_no_overlap(&st).unwrap();
    // The first two never live together: they share bytes; the third sits beside them.
    assert_eq!(st[0].offset, st[1].offset);
    assert_eq!(total, plan::align(1000) + plan::align(500));
}

#[test]
fn channels_last_makes_convnext_permutes_free() {
    let nhwc = planned("convnext_base", 1, Precision::Fp16, true);
    let nchw = planned("convnext_base", 1, Precision::Fp16, false);
    let copies = |p: &Plan| {
        p.steps
            .iter()
            .filter(|s| matches!(s.kind, StepKind::Copy { .. }))
            .count()
    };
    // NCHW needs two transposes per block (36 blocks) and around every LayerNorm2d; NHWC only
    // converts the input image once.
    assert!(copies(&nchw) >= 72, "{}", copies(&nchw));
    assert!(copies(&nhwc) <= 2, "{}", copies(&nhwc));
    // The layer-scale multiply and the residual add are one pointwise pass.
    let scaled = nhwc
        .steps
        .iter()
        .filter(|s| {
            matches!(
                s.kind,
                StepKind::Pointwise {
                    scale: Some(_),
                    residual: Some(_),
                    ..
                }
            )
        })
        .count();
    assert_eq!(scaled, 36);
    // Dense convolutions upload KRSC filters; depthwise ones [kh, kw, M].
    assert!(!nhwc.filter_nhwc.is_empty());
    assert_eq!(nhwc.filter_dw_hwc.len(), 36);
}

#[test]
fn vit_attention_folds_transpose_scale_and_residuals() {
    let pl = planned("vit_b_16", 1, Precision::Fp16, true);
    let mut trans = 0;
    let mut scaled = 0;
    for s in &pl.steps {
        if let StepKind::MatMul(MatMulStep { b_trans, alpha, .. }) = s.kind {
            trans += b_trans as usize;
            if (alpha - 0.125).abs() < 1e-6 {
                scaled += 1;
            }
        }
    }
    // QKᵀ in each of 12 layers: kᵀ read transposed, q's 1/√64 applied as alpha.
    assert_eq!(trans, 12);
    assert_eq!(scaled, 12);
    // Both residual adds of every layer ride on a Linear (cuBLASLt's C).
    let fused = pl
        .steps
        .iter()
        .filter(|s| {
            matches!(
                s.kind,
                StepKind::Linear(LinearStep {
                    residual: Some(_),
                    ..
                })
            )
        })
        .count();
    assert_eq!(fused, 24);
    // No separate elementwise add, no separate scaling left.
    assert!(!pl
        .steps
        .iter()
        .any(|s| matches!(s.kind, StepKind::Binary { .. })));
}

#[test]
fn resnet_convolutions_have_im2col_buffers_when_not_1x1() {
    let pl = planned("resnet50", 1, Precision::Fp16, true);
    for s in &pl.steps {
        if let StepKind::Conv(c) = &s.kind {
            assert!(c.gemm_capable());
            assert_eq!(c.col.is_none(), c.direct_gemm(), "{}", s.name);
            if let Some(Loc::Storage { id, .. }) = c.col {
                let [n, _, oh, ow] = c.y_shape;
                let k = c.w_shape[1] * c.w_shape[2] * c.w_shape[3];
                assert_eq!(pl.storages[id].bytes, n * oh * ow * k * 2);
            }
        }
    }
}

#[test]
fn strided_spaces_merge_contiguous_dims() {
    // A plain copy of a [2, 3, 4] tensor is one run of 24.
    let s = Strided::coalesce(&[2, 3, 4], vec![vec![12, 4, 1], vec![12, 4, 1]], "t").unwrap();
    assert_eq!(s.dims, vec![24]);
    // A transpose of the last two dims keeps two dims after merging the leading one.
    let s = Strided::coalesce(&[2, 4, 3], vec![vec![12, 3, 1], vec![12, 1, 4]], "t").unwrap();
    assert_eq!(s.dims, vec![2, 4, 3]);
    // Size-1 dims vanish.
    let s = Strided::coalesce(&[1, 5, 1], vec![vec![5, 1, 1], vec![0, 1, 0]], "t").unwrap();
    assert_eq!(s.dims, vec![5]);
    // Too many dims that cannot merge are a clear error.
    let dims = [2usize; 8];
    let st: Vec<usize> = (0..8).map(|d| 1usize << (2 * d)).collect();
    let e = Strided::coalesce(&dims, vec![st.clone(), st], "node7")
        .unwrap_err()
        .to_string();
    assert!(e.contains("node7") && e.contains("rank"), "{e}");
}

#[test]
fn every_kernel_waits_for_the_one_ahead_before_touching_memory() {
    // A kernel launched with programmatic dependent launch may start while the kernel ahead
    // of it still runs: its first statement must be the wait, or it reads unfinished data.
    for d in [DType::F32, DType::F16, DType::Bf16] {
        let src = kernels::source(d);
        let half: &[&str] = if d == DType::F32 {
            &[]
        } else {
            kernels::HALF_KERNEL_NAMES
        };
        let names: Vec<&str> = KERNEL_NAMES.iter().chain(half).copied().collect();
        // Each entry point's name (the identifier before its parameter list) and body.
        let decl = "extern \"C\" __global__";
        let mut defined = Vec::new();
        for (at, _) in src.match_indices(decl) {
            let body = at + src[at..].find('{').expect("a body");
            let mut head = src[at..body].to_string();
            // `__launch_bounds__(N)` comes before the name (the attention kernel).
            if let Some(lb) = head.find("__launch_bounds__(") {
                let close = lb + head[lb..].find(')').expect("closed") + 1;
                head.replace_range(lb..close, "");
            }
            let open = head.find('(').expect("a parameter list");
            let name = head[..open].split_whitespace().last().expect("a name");
            assert!(
                src[body + 1..]
                    .trim_start()
                    .starts_with(kernels::GRID_DEP_WAIT),
                "{name} ({d:?}) does not begin with the wait: {}",
                &src[body..body + 80]
            );
            defined.push(name.to_string());
        }
        for k in &names {
            assert!(defined.iter().any(|n| n == k), "{k} missing for {d:?}");
        }
        // Every entry point of the module is one the launches know (none escapes the wait).
        assert_eq!(
            src.matches("extern \"C\" __global__").count(),
            names.len(),
            "{d:?}"
        );
        assert_eq!(src.matches(kernels::GRID_DEP_WAIT).count(), names.len());
    }
    // The kernels launched plainly are kernels of the module (a renamed one would silently be
    // launched early again).
    for k in kernels::PLAIN_LAUNCH {
        assert!(
            KERNEL_NAMES.contains(k) || kernels::HALF_KERNEL_NAMES.contains(k),
            "{k}"
        );
    }
}

#[test]
fn kernel_source_has_every_kernel_for_every_dtype() {
    for d in [DType::F32, DType::F16, DType::Bf16] {
        let src = kernels::source(d);
        for k in KERNEL_NAMES {
            assert!(src.contains(&format!("void {k}(")), "{k} missing for {d:?}");
        }
        // No CUDA headers: NVRTC compiles it without an include path.
        assert!(!src.contains("#include"));
    }
    // The tensor-core kernels (attention, the quantized GEMMs) exist for the 16-bit types only.
    for (d, has) in [(DType::F32, false), (DType::F16, true), (DType::Bf16, true)] {
        for k in kernels::HALF_KERNEL_NAMES {
            assert_eq!(
                kernels::source(d).contains(&format!(" {k}(const ")),
                has,
                "{k} {d:?}"
            );
        }
    }
    assert!(kernels::source(DType::F16).contains("m16n8k16.row.col.f32.f16.f16.f32"));
    assert!(kernels::source(DType::Bf16).contains("m16n8k16.row.col.f32.bf16.bf16.f32"));
    assert!(kernels::source(DType::F16).contains("cvt.rn.f16.f32"));
    assert!(kernels::source(DType::Bf16).contains("cvt.rn.bf16.f32"));
    // The Hopper int8 GEMM's wgmma on a 64 × 64 tile, with its 32 accumulator operands written
    // out, and its byte in one saturating conversion.
    let f16 = kernels::source(DType::F16);
    assert!(f16.contains("wgmma.mma_async.sync.aligned.m64n64k32.s32.s8.s8 {%0, %1,"));
    assert!(f16.contains("%31}, %32, %33, 1;") && f16.contains("\"+r\"(d[31])"));
    assert!(!f16.contains("\"+r\"(d[32])") && f16.contains("cvt.rni.sat.s8.f32"));
    assert_eq!(kernels::QGEMM_WG_COLS, 64);
    assert!(
        !f16.contains("__WG_"),
        "a placeholder of the wgmma source was left in"
    );
}

#[test]
fn cache_keys_change_with_source_arch_version_and_options() {
    let o = vec!["--gpu-architecture=sm_90".to_string()];
    let k = kernels::cache_key("src", "sm_90", (13, 0), &o);
    assert_eq!(k, kernels::cache_key("src", "sm_90", (13, 0), &o));
    assert_ne!(k, kernels::cache_key("src2", "sm_90", (13, 0), &o));
    assert_ne!(k, kernels::cache_key("src", "sm_80", (13, 0), &o));
    assert_ne!(k, kernels::cache_key("src", "sm_90", (13, 1), &o));
    assert_ne!(k, kernels::cache_key("src", "sm_90", (13, 0), &[]));
    assert!(k.starts_with("sm_90-"));
    // FNV-1a reference value (stable across platforms and Rust versions).
    assert_eq!(kernels::fnv1a(&[]), 0xcbf2_9ce4_8422_2325);
}

#[test]
fn cache_dir_and_round_trip() {
    use std::path::PathBuf;
    assert_eq!(
        kernels::cache_dir_from(Some("/x".into()), Some("/home/u".into())),
        Some(PathBuf::from("/x/isolane/kernels"))
    );
    assert_eq!(
        kernels::cache_dir_from(None, Some("/home/u".into())),
        Some(PathBuf::from("/home/u/.cache/isolane/kernels"))
    );
    // A relative XDG_CACHE_HOME is ignored, as the XDG spec says.
    assert_eq!(
        kernels::cache_dir_from(Some("rel".into()), Some("/h".into())),
        Some(PathBuf::from("/h/.cache/isolane/kernels"))
    );
    assert_eq!(kernels::cache_dir_from(None, None), None);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("k");
    kernels::cache_write(&d, "key", b"\x7fELF-cubin");
    assert_eq!(
        kernels::cache_read(&d, "key").as_deref(),
        Some(&b"\x7fELF-cubin"[..])
    );
    // Not an ELF image (torn or foreign file): ignored.
    kernels::cache_write(&d, "bad", b"garbage");
    assert_eq!(kernels::cache_read(&d, "bad"), None);
    assert_eq!(kernels::cache_read(&d, "absent"), None);
}

#[test]
fn a_missing_library_is_named_with_how_to_point_at_it() {
    let dir = tempfile::tempdir().unwrap();
    let e = libs::find_and_load(libs::CUDNN, &[dir.path().to_path_buf()], false).unwrap_err();
    assert!(e.contains("libcudnn.so.9"), "{e}");
    assert!(e.contains("cuDNN 9"), "{e}");
    assert!(e.contains("ISOLANE_CUDA_LIB_DIR"), "{e}");
    assert!(e.contains("LD_LIBRARY_PATH"), "{e}");
    assert!(e.contains(&dir.path().display().to_string()), "{e}");
    let e = libs::find_and_load(libs::CUBLASLT, &[], false).unwrap_err();
    assert!(e.contains("libcublasLt.so.13"), "{e}");
}

#[test]
fn no_gpu_is_an_error_not_a_panic() {
    // On a machine without the libraries (CI), building a backend fails with the loader's
    // message; on the GPU machine it succeeds. Either way nothing panics.
    if let Err(msg) = libs::ensure_all() {
        let e = isolane_cuda::CudaBackend::new(0)
            .err()
            .expect("no libraries, no backend");
        assert!(e.to_string().contains(&msg), "{e}");
        assert!(msg.contains("ISOLANE_CUDA_LIB_DIR"), "{msg}");
    }
}

#[test]
fn vit_attention_reads_heads_in_place_at_batch_1() {
    let copies = |p: &Plan| {
        p.steps
            .iter()
            .filter(|s| matches!(s.kind, StepKind::Copy { .. }))
            .map(|s| s.name.clone())
            .collect::<Vec<_>>()
    };
    let b1 = planned("vit_b_16", 1, Precision::Fp16, true);
    let c1 = copies(&b1);
    // Batch 1: q, k, v are read from the QKV projection in place and the context is written
    // straight into the merged-heads layout: no per-layer copies remain.
    assert!(c1.len() <= 5, "{c1:?}");
    check_plan(&b1);
    // Batch 2: the heads of two images do not form one strided batch; copies come back, and
    // the plan stays valid.
    let b2 = planned("vit_b_16", 2, Precision::Fp16, true);
    assert!(copies(&b2).len() > c1.len());
    check_plan(&b2);
}

#[test]
fn vit_fused_attention_has_no_per_layer_copies_at_batch_64() {
    let g = build_model("vit_b_16", Weights::Zeros).unwrap();
    let g = passes::optimize(&g, 64).unwrap();
    let opts = PlanOptions {
        channels_last: true,
        fused_attention: true,
    };
    let pl = plan::plan_with(&g, 64, Precision::Fp16, opts).unwrap();
    check_plan(&pl);
    let mut attn = 0;
    for s in &pl.steps {
        assert!(!matches!(
            s.kind,
            StepKind::Softmax(SoftmaxStep { .. }) | StepKind::MatMul(MatMulStep { .. })
        ));
        if let StepKind::Attention(AttentionStep {
            batch,
            heads,
            seq,
            dim,
            alpha,
            q_strides,
            k,
            q,
            y_strides,
            ..
        }) = s.kind
        {
            attn += 1;
            assert_eq!((batch, heads, seq, dim), (64, 12, 197, 64));
            assert!((alpha - 0.125).abs() < 1e-6);
            // q and k read in place from the QKV projection [B, S, 3, H, d]; the context
            // written as [B, S, H, d].
            assert_eq!(q_strides, [197 * 2304, 64, 2304]);
            assert_eq!(y_strides, [197 * 768, 64, 768]);
            let (Loc::Storage { id: qi, offset: qo }, Loc::Storage { id: ki, offset: ko }) = (q, k)
            else {
                panic!("q, k not in the arena");
            };
            assert_eq!((qi, ko - qo), (ki, 768));
        }
    }
    assert_eq!(attn, 12);
    // Copies remain only around the patch embedding and the class token, none per layer.
    let copies: Vec<&str> = pl
        .steps
        .iter()
        .filter(|s| matches!(s.kind, StepKind::Copy { .. }))
        .map(|s| s.name.as_str())
        .collect();
    assert!(copies.len() <= 6, "{copies:?}");
    assert!(
        !copies.iter().any(|n| n.contains("encoder_layer")),
        "{copies:?}"
    );
}

#[test]
fn detection_and_segmentation_models_plan_with_their_resize() {
    // yolov8n upsamples twice (nearest ×2), fcn_resnet50 once (bilinear to the input size):
    // both plan at every precision, channels-last or not, with the Resize steps kept in the
    // layout of their input.
    for (m, resizes, linear) in [("yolov8n", 2, false), ("fcn_resnet50", 1, true)] {
        for p in Precision::ALL {
            for cl in [true, false] {
                let pl = planned(m, 1, p, cl);
                check_plan(&pl);
                let r: Vec<_> = pl
                    .steps
                    .iter()
                    .filter_map(|s| match s.kind {
                        StepKind::Resize(ResizeStep { linear, nhwc, .. }) => Some((linear, nhwc)),
                        _ => None,
                    })
                    .collect();
                assert_eq!(r.len(), resizes, "{m} {p:?} channels_last {cl}: {r:?}");
                assert!(r.iter().all(|&(l, _)| l == linear));
                if !cl {
                    assert!(r.iter().all(|&(_, nhwc)| !nhwc));
                }
            }
        }
    }
}

/// A depthwise convolution's sizes (NHWC, one filter per channel, horizontal dilation 1).
#[derive(Clone, Copy, Debug)]
struct Dw {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    kh: usize,
    kw: usize,
    sh: usize,
    sw: usize,
    ph: usize,
    pw: usize,
    dh: usize,
}

impl Dw {
    fn out(&self) -> (usize, usize) {
        let oh = (self.h + 2 * self.ph - self.dh * (self.kh - 1) - 1) / self.sh + 1;
        let ow = (self.w + 2 * self.pw - (self.kw - 1) - 1) / self.sw + 1;
        (oh, ow)
    }
}

/// `dw_v<KW, SW, OUTS>` of kernels.rs transliterated (one loop iteration per thread, `vw`
/// channels a thread), writing `y` (NHWC, bias and residual added) and counting the writes
/// of every output.
fn dw_v_emulated(
    d: Dw,
    outs: usize,
    vw: usize,
    x: &[f32],
    wt: &[f32],
    bias: &[f32],
    res: &[f32],
) -> (Vec<f32>, Vec<u32>) {
    let (oh, ow) = d.out();
    let mut y = vec![0f32; d.n * oh * ow * d.c];
    let mut writes = vec![0u32; y.len()];
    let l = (outs - 1) * d.sw + d.kw;
    let cv = d.c / vw;
    let tiles = ow.div_ceil(outs);
    let total = d.n * oh * tiles * cv;
    for i in 0..total {
        let (c, mut r) = ((i % cv) * vw, i / cv);
        let tw = r % tiles;
        r /= tiles;
        let (ohh, n) = (r % oh, r / oh);
        let ow0 = tw * outs;
        let mut acc = vec![vec![0f32; vw]; outs];
        let h0 = (ohh * d.sh) as isize - d.ph as isize;
        let w0 = (ow0 * d.sw) as isize - d.pw as isize;
        for a in 0..d.kh {
            let hh = h0 + (a * d.dh) as isize;
            if hh < 0 || hh >= d.h as isize {
                continue;
            }
            let xin: Vec<Vec<f32>> = (0..l)
                .map(|s| {
                    let ww = w0 + s as isize;
                    (0..vw)
                        .map(|j| {
                            if ww >= 0 && ww < d.w as isize {
                                x[((n * d.h + hh as usize) * d.w + ww as usize) * d.c + c + j]
                            } else {
                                0.0
                            }
                        })
                        .collect()
                })
                .collect();
            for b in 0..d.kw {
                for (o, acc_o) in acc.iter_mut().enumerate() {
                    for (j, a_j) in acc_o.iter_mut().enumerate() {
                        *a_j += xin[o * d.sw + b][j] * wt[(a * d.kw + b) * d.c + c + j];
                    }
                }
            }
        }
        for (o, acc_o) in acc.iter().enumerate() {
            let owo = ow0 + o;
            if owo >= ow {
                break;
            }
            let yo = ((n * oh + ohh) * ow + owo) * d.c + c;
            for j in 0..vw {
                y[yo + j] = acc_o[j] + bias[c + j] + res[yo + j];
                writes[yo + j] += 1;
            }
        }
    }
    (y, writes)
}

/// The same convolution written out directly.
fn dw_reference(d: Dw, x: &[f32], wt: &[f32], bias: &[f32], res: &[f32]) -> Vec<f32> {
    let (oh, ow) = d.out();
    let mut y = vec![0f32; d.n * oh * ow * d.c];
    for n in 0..d.n {
        for i in 0..oh {
            for j in 0..ow {
                for m in 0..d.c {
                    let mut s = 0f32;
                    for a in 0..d.kh {
                        for b in 0..d.kw {
                            let hh = (i * d.sh + a * d.dh) as isize - d.ph as isize;
                            let ww = (j * d.sw + b) as isize - d.pw as isize;
                            if hh >= 0 && hh < d.h as isize && ww >= 0 && ww < d.w as isize {
                                let xi = ((n * d.h + hh as usize) * d.w + ww as usize) * d.c + m;
                                s += x[xi] * wt[(a * d.kw + b) * d.c + m];
                            }
                        }
                    }
                    let yo = ((n * oh + i) * ow + j) * d.c + m;
                    y[yo] = s + bias[m] + res[yo];
                }
            }
        }
    }
    y
}

/// Every vectorised depthwise kernel shape (`DW_VEC_SHAPES`), at 8 (f16/bf16) and 4 (f32)
/// channels a thread, on sizes with tails (output widths not a multiple of the outputs a
/// thread computes), padding, vertical stride and dilation: each output written once, and
/// equal to the convolution written out.
#[test]
fn the_vector_depthwise_kernels_write_every_output_once_and_right() {
    let mut seed = 30;
    for &(kw, sw, outs) in kernels::DW_VEC_SHAPES {
        for vw in [8, 4] {
            for (h, w, sh, ph, dh) in [(9, 11, 1, 1, 1), (10, 13, 2, 2, 1), (7, 6, 1, 0, 2)] {
                let d = Dw {
                    n: 2,
                    c: 2 * vw,
                    // At least one window fits (a 7×7 with dilation 2 spans 13 rows).
                    h: h.max(dh * (kw - 1) + 1),
                    w: w.max(kw),
                    kh: kw,
                    kw,
                    sh,
                    sw,
                    ph: ph.min(kw / 2),
                    pw: kw / 2,
                    dh,
                };
                let (oh, ow) = d.out();
                seed += 4;
                let x = random(d.n * d.h * d.w * d.c, seed);
                let wt = random(d.kh * d.kw * d.c, seed + 1);
                let bias = random(d.c, seed + 2);
                let res = random(d.n * oh * ow * d.c, seed + 3);
                let (got, writes) = dw_v_emulated(d, outs, vw, &x, &wt, &bias, &res);
                assert!(writes.iter().all(|&k| k == 1), "{d:?} outs {outs} vw {vw}");
                let want = dw_reference(d, &x, &wt, &bias, &res);
                let err = rel_l2(&got, &want);
                assert!(err < 1e-6, "{d:?} outs {outs} vw {vw}: rel L2 {err:e}");
            }
        }
    }
    // The transliteration above follows these lines of the CUDA C (a change there must be
    // repeated here).
    let src = kernels::source(DType::F16);
    for line in [
        "const int L = (OUTS - 1) * SW + KW;",
        "int total = p.n * p.oh * tiles * cv;",
        "int c = (i % cv) * VW, r = i / cv;",
        "int tw = r % tiles; r /= tiles;",
        "int oh = r % p.oh, n = r / p.oh;",
        "int h0 = oh * p.sh - p.ph, w0 = ow0 * SW - p.pw;",
        "int hh = h0 + a * p.dh;",
        "ldv(wt, (long long)(a * KW + b) * p.m + c, wv);",
        "for (int j = 0; j < VW; ++j) acc[o][j] += xin[o * SW + b][j] * wv[j];",
        "long long yo = n * p.ys[0] + c + oh * p.ys[2] + ow * p.ys[3];",
    ] {
        assert!(src.contains(line), "dw_v no longer has `{line}`");
    }
}

#[test]
fn every_attention_block_shape_fits_the_kernel() {
    let source = kernels::source(DType::F16);
    assert!(source.contains("__launch_bounds__(256) attention("));
    for &(warps, key_groups) in kernels::ATTN_BLOCKS {
        assert!(
            warps * key_groups <= 8,
            "{warps}×{key_groups} warps > 256 threads"
        );
        let shared = kernels::attn_shared_bytes(key_groups);
        assert!(
            shared <= kernels::ATTN_MAX_SHARED_BYTES,
            "{key_groups} groups"
        );
        // 99 KiB: the least dynamic shared memory an sm_80+ GPU lets a block opt in to.
        assert!(
            shared <= 99 * 1024,
            "{key_groups} groups need {shared} bytes"
        );
        // The key groups' merge passes 36 floats a thread of a group through the tiles.
        assert!(key_groups == 1 || warps * 32 * 36 * 4 <= shared);
    }
}
