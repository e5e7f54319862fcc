//! The preprocessing kernel (`isolane_cuda::preprocess`) against the engine's CPU reference.
//!
//! On the CPU (CI): the kernel emulated as tests/emulate.rs emulates plans — a transliteration
//! of its CUDA C, element by element in its grid-stride order, fed the very `KernelArgs` the
//! launch passes — must equal the reference bit for bit. That checks the host side (the
//! arguments derived from a plan) and the kernel's index arithmetic without a GPU.
//! On the GPU (`#[ignore]`, `scripts/gpu-test.sh run isolane-cuda--preprocess`): the kernel
//! itself, f32 and f16, bit for bit, and its time on a 1080p frame.

use isolane_cuda::preprocess::{KernelArgs, SRC};
use isolane_engine::preprocess::{preprocess, FrameLayout, PreprocessPlan, PreprocessSpec};

/// Layouts and specs that cover up- and downscaling by odd factors, crops with even and odd
/// margins, RGB and RGBA, and a 1-pixel side.
fn cases() -> Vec<(FrameLayout, PreprocessSpec)> {
    let layout = |width, height, channels| FrameLayout {
        width,
        height,
        channels,
    };
    vec![
        (layout(37, 23, 3), PreprocessSpec::imagenet([64, 48], None)),
        (
            layout(97, 61, 4),
            PreprocessSpec::imagenet([40, 50], Some([32, 33])),
        ),
        (
            layout(5, 3, 3),
            PreprocessSpec::imagenet([9, 7], Some([8, 4])),
        ),
        (layout(1, 17, 4), PreprocessSpec::imagenet([3, 5], None)),
        (
            layout(320, 180, 4),
            PreprocessSpec {
                resize: [224, 398],
                crop: Some([224, 224]),
                mean: [0.5; 3],
                std: [0.25; 3],
            },
        ),
    ]
}

/// Bytes that differ from pixel to pixel and channel to channel.
fn frame(layout: FrameLayout, seed: u32) -> Vec<u8> {
    (0..layout.bytes() as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed) >> 13) as u8)
        .collect()
}

/// The kernel's `source()`, as written in its CUDA C.
fn source(i: i32, inp: i32, scale: f32) -> (i32, i32, f32) {
    let xo = (i as f32 + 0.5) / scale - 0.5;
    let xc = xo.max(0.0).min((inp - 1) as f32);
    let a = xc.floor() as i32;
    (a, (a + 1).min(inp - 1), xc - a as f32)
}

/// The kernel, element by element in its grid-stride order (one thread's work each).
fn emulate(a: &KernelArgs, src: &[u8]) -> Vec<f32> {
    let n = 3 * i64::from(a.out_h) * i64::from(a.out_w);
    (0..n)
        .map(|i| {
            let ox = (i % i64::from(a.out_w)) as i32;
            let r = i / i64::from(a.out_w);
            let oy = (r % i64::from(a.out_h)) as i32;
            let c = (r / i64::from(a.out_h)) as i32;
            let (y0, y1, wy) = source(a.crop_top + oy, a.in_h, a.scale_y);
            let (x0, x1, wx) = source(a.crop_left + ox, a.in_w, a.scale_x);
            let at = |y: i32, x: i32| f32::from(src[((y * a.in_w + x) * a.channels + c) as usize]);
            let top = (at(y0, x1) - at(y0, x0)).mul_add(wx, at(y0, x0));
            let bottom = (at(y1, x1) - at(y1, x0)).mul_add(wx, at(y1, x0));
            let v = (bottom - top).mul_add(wy, top);
            v.mul_add(a.gain[c as usize], a.bias[c as usize])
        })
        .collect()
}

fn plan_of(layout: FrameLayout, spec: &PreprocessSpec) -> PreprocessPlan {
    spec.plan(layout).expect("the test cases are valid")
}

/// The index and values of the first element where `got` and `want` differ in any bit.
fn first_difference(got: &[f32], want: &[f32]) -> Option<(usize, f32, f32)> {
    assert_eq!(got.len(), want.len());
    got.iter()
        .zip(want)
        .enumerate()
        .find(|(_, (g, w))| g.to_bits() != w.to_bits())
        .map(|(i, (g, w))| (i, *g, *w))
}

#[test]
fn the_emulated_kernel_equals_the_reference_bit_for_bit() {
    for (layout, spec) in cases() {
        let plan = plan_of(layout, &spec);
        let pixels = frame(layout, 7);
        let want = preprocess(&plan, &pixels).unwrap();
        let got = emulate(&KernelArgs::from_plan(&plan).unwrap(), &pixels);
        assert_eq!(first_difference(&got, &want), None, "{layout:?} {spec:?}");
    }
}

#[test]
fn the_emulation_matches_the_kernel_source() {
    // The transliteration above follows these lines of the CUDA C; a change there must be
    // repeated here (and in the engine's reference).
    for line in [
        "float xo = ((float)i + 0.5f) / scale - 0.5f;",
        "float xc = fminf(fmaxf(xo, 0.f), (float)(inp - 1));",
        "*i1 = min(a + 1, inp - 1);",
        "float top = fmaf(p01 - p00, wx, p00);",
        "float bottom = fmaf(p11 - p10, wx, p10);",
        "float v = fmaf(bottom - top, wy, top);",
        "return fmaf(v, a.gain[c], a.bias[c]);",
    ] {
        assert!(SRC.contains(line), "the kernel no longer has `{line}`");
    }
}

#[test]
fn kernel_args_come_from_the_plan() {
    let layout = FrameLayout {
        width: 1920,
        height: 1080,
        channels: 4,
    };
    let plan = plan_of(
        layout,
        &PreprocessSpec::imagenet([256, 455], Some([224, 224])),
    );
    let a = KernelArgs::from_plan(&plan).unwrap();
    assert_eq!(
        (a.in_h, a.in_w, a.channels, a.out_h, a.out_w),
        (1080, 1920, 4, 224, 224)
    );
    // (256 - 224) / 2 = 16; (455 - 224) / 2 = 115.5, ties to even: 116.
    assert_eq!((a.crop_top, a.crop_left), (16, 116));
    assert_eq!((a.scale_y, a.scale_x), (256.0 / 1080.0, 455.0 / 1920.0));
}

#[cfg(test)]
mod gpu {
    use super::*;
    use isolane_cuda::{CudaBackend, InputType};
    use isolane_engine::{CompiledModel, Graph, Precision};

    /// `graph`'s outputs on `backend` for `pixels` preprocessed by the CPU reference, put in
    /// the model's host input: what a device path must give.
    fn host_path(
        backend: &CudaBackend,
        graph: &Graph,
        plan: &PreprocessPlan,
        pixels: &[u8],
    ) -> Vec<f32> {
        let mut on_host = backend.compile_cuda(graph, 1, Precision::Fp32).unwrap();
        on_host
            .input_mut_at(0)
            .copy_from_slice(&preprocess(plan, pixels).unwrap());
        on_host.run().unwrap();
        on_host.output_at(0).to_vec()
    }

    /// `got` is `want` within 1e-4 of `want`'s largest magnitude (at least 1).
    fn assert_close(got: &[f32], want: &[f32], what: &str) {
        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        let worst = got
            .iter()
            .zip(want)
            .fold(0f32, |m, (g, w)| m.max((g - w).abs()));
        assert!(
            worst <= 1e-4 * scale.max(1.0),
            "{what}: max |difference| {worst} (scale {scale})"
        );
    }

    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn the_kernel_equals_the_reference_bit_for_bit_in_f32_and_f16() {
        let backend = CudaBackend::new(0).expect("a CUDA GPU");
        for (layout, spec) in cases() {
            let plan = plan_of(layout, &spec);
            let pixels = frame(layout, 11);
            let want = preprocess(&plan, &pixels).unwrap();
            let mut f32_kernel = backend.preprocessor(&plan, InputType::F32).unwrap();
            let got = f32_kernel.run_host(&pixels).unwrap();
            assert_eq!(
                first_difference(&got, &want),
                None,
                "f32, {layout:?} {spec:?}"
            );
            let want_f16: Vec<f32> = want
                .iter()
                .map(|&v| half::f16::from_f32(v).to_f32())
                .collect();
            let mut f16_kernel = backend.preprocessor(&plan, InputType::F16).unwrap();
            let got = f16_kernel.run_host(&pixels).unwrap();
            assert_eq!(
                first_difference(&got, &want_f16),
                None,
                "f16, {layout:?} {spec:?}"
            );
            let mut widened = backend.preprocessor(&plan, InputType::F16AsF32).unwrap();
            let got = widened.run_host(&pixels).unwrap();
            assert_eq!(
                first_difference(&got, &want_f16),
                None,
                "f16 as f32, {layout:?} {spec:?}"
            );
        }
        println!(
            "{} cases: the kernel equals the CPU reference bit for bit (f32 and f16)",
            cases().len()
        );
    }

    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn preprocessing_feeds_a_model_on_the_device_as_the_host_path_does() {
        use isolane_engine::{build_model, Weights};
        let backend = CudaBackend::new(0).expect("a CUDA GPU");
        let graph = build_model("resnet18", Weights::Synthetic { seed: 5 }).unwrap();
        let layout = FrameLayout {
            width: 640,
            height: 480,
            channels: 4,
        };
        let plan = plan_of(
            layout,
            &PreprocessSpec::imagenet([256, 341], Some([224, 224])),
        );
        let pixels = frame(layout, 9);
        let want = host_path(&backend, &graph, &plan, &pixels);
        // The device path: the kernel writes the model's input staging; the job skips its copy.
        let mut model = backend.compile_cuda(&graph, 1, Precision::Fp32).unwrap();
        let mut kernel = backend.preprocessor(&plan, InputType::F32).unwrap();
        for run in 0..3 {
            // Run 0 captures the copy-free graph, the others replay it.
            kernel.run_into_model(&pixels, &mut model).unwrap();
            model.wait().unwrap();
            assert_close(model.output_at(0), &want, &format!("run {run}"));
        }
        // What cannot feed a model is refused, not written.
        let mut f16 = backend.preprocessor(&plan, InputType::F16).unwrap();
        assert!(f16.run_into_model(&pixels, &mut model).is_err());
        let small = plan_of(layout, &PreprocessSpec::imagenet([100, 100], None));
        let mut wrong_size = backend.preprocessor(&small, InputType::F32).unwrap();
        assert!(wrong_size.run_into_model(&pixels, &mut model).is_err());
        println!("resnet18 fed on the device matches the host path (max difference within 1e-4 of the largest output)");
    }

    /// A preprocess's output left in device memory ([`isolane_cuda::DeviceF32`]) and copied
    /// into a model's input by [`isolane_cuda::InputCopier`]: on GPU 0 device to device, and
    /// — where the machine has a second GPU — into a model on GPU 1 peer to peer and staged
    /// through host memory; every path gives the host path's outputs.
    fn handoff_matches_the_host_path(model_gpu: u32) {
        use isolane_cuda::{CopyPath, InputCopier};
        use isolane_engine::{build_model, Weights};
        let graph = build_model("resnet18", Weights::Synthetic { seed: 5 }).unwrap();
        let layout = FrameLayout {
            width: 1920,
            height: 1080,
            channels: 3,
        };
        let plan = plan_of(
            layout,
            &PreprocessSpec::imagenet([256, 455], Some([224, 224])),
        );
        let pixels = frame(layout, 4);
        let source = CudaBackend::new(0).expect("a CUDA GPU");
        let target = CudaBackend::new(model_gpu).expect("the model's GPU");
        let want = host_path(&target, &graph, &plan, &pixels);
        let mut kernel = source.preprocessor(&plan, InputType::F32).unwrap();
        let values = source.device_f32(plan.output_len()).unwrap();
        kernel.run_to(&pixels, &values).unwrap();
        let mut back = vec![0f32; values.len()];
        values.to_host(&mut back).unwrap();
        assert_eq!(back, preprocess(&plan, &pixels).unwrap(), "to_host");
        let mut model = target.compile_cuda(&graph, 1, Precision::Fp32).unwrap();
        let expected: &[(bool, CopyPath)] = if model_gpu == 0 {
            &[(true, CopyPath::Device)]
        } else {
            &[(true, CopyPath::Peer), (false, CopyPath::Staged)]
        };
        for &(peer, path) in expected {
            let mut copier = InputCopier::default();
            for run in 0..3 {
                let t = std::time::Instant::now();
                let took = copier.copy_into(&mut model, &values, peer).unwrap();
                let copy_ms = t.elapsed().as_secs_f64() * 1e3;
                assert_eq!(took, path, "peer allowed: {peer}");
                model.launch_from_device().unwrap();
                model.wait().unwrap();
                assert_close(model.output_at(0), &want, &format!("{path:?} run {run}"));
                println!("3x224x224 f32 GPU 0 -> GPU {model_gpu}, {path:?}: copy {copy_ms:.3} ms (run {run})");
            }
        }
    }

    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn device_values_feed_a_model_on_the_same_gpu() {
        handoff_matches_the_host_path(0);
    }

    #[test]
    #[ignore = "needs two CUDA GPUs"]
    fn device_values_feed_a_model_on_another_gpu_peer_to_peer_or_staged() {
        handoff_matches_the_host_path(1);
    }

    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn a_1080p_frame_to_a_224_input_timed() {
        let backend = CudaBackend::new(0).expect("a CUDA GPU");
        let layout = FrameLayout {
            width: 1920,
            height: 1080,
            channels: 4,
        };
        let plan = plan_of(
            layout,
            &PreprocessSpec::imagenet([256, 455], Some([224, 224])),
        );
        let pixels = frame(layout, 3);
        let want = preprocess(&plan, &pixels).unwrap();
        for input_type in [InputType::F32, InputType::F16, InputType::F16AsF32] {
            let mut kernel = backend.preprocessor(&plan, input_type).unwrap();
            let got = kernel.run_host(&pixels).unwrap();
            let exact = match input_type {
                InputType::F32 => first_difference(&got, &want).is_none(),
                InputType::F16 | InputType::F16AsF32 => {
                    let want_f16: Vec<f32> = want
                        .iter()
                        .map(|&v| half::f16::from_f32(v).to_f32())
                        .collect();
                    first_difference(&got, &want_f16).is_none()
                }
            };
            assert!(
                exact,
                "{input_type:?}: the kernel differs from the reference at 1080p"
            );
            let mut again = vec![0f32; want.len()];
            kernel.run_host_into(&pixels, &mut again).unwrap();
            assert_eq!(
                again, got,
                "{input_type:?}: run_host_into differs from run_host"
            );
            assert!(kernel.run_host_into(&pixels, &mut again[1..]).is_err());
            let ms = kernel.device_ms(&pixels, 200).unwrap();
            println!("1920x1080 RGBA -> 3x224x224 {input_type:?}: {ms:.4} ms per launch (median of 200, device time)");
        }
    }
}
