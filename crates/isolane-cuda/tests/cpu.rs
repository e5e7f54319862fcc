//! CPU-only tests of the cuda backend (they run in CI, which has no GPU and no CUDA toolkit):
//! planning, arena liveness, fusions, kernel source generation, the kernel cache, and the
//! errors for missing libraries.

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
fn kernel_source_has_every_kernel_for_every_dtype() {
    for d in [DType::F32, DType::F16, DType::Bf16] {
        let src = kernels::source(d);
        for k in KERNEL_NAMES {
            assert!(src.contains(&format!("void {k}(")), "{k} missing for {d:?}");
        }
        // No CUDA headers: NVRTC compiles it without an include path.
        assert!(!src.contains("#include"));
    }
    // The tensor-core attention kernel exists for the 16-bit types only.
    for (d, has) in [(DType::F32, false), (DType::F16, true), (DType::Bf16, true)] {
        for k in kernels::HALF_KERNEL_NAMES {
            assert_eq!(
                kernels::source(d).contains(&format!(" {k}(const T*")),
                has,
                "{k} {d:?}"
            );
        }
    }
    assert!(kernels::source(DType::F16).contains("m16n8k16.row.col.f32.f16.f16.f32"));
    assert!(kernels::source(DType::Bf16).contains("m16n8k16.row.col.f32.bf16.bf16.f32"));
    assert!(kernels::source(DType::F16).contains("cvt.rn.f16.f32"));
    assert!(kernels::source(DType::Bf16).contains("cvt.rn.bf16.f32"));
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
