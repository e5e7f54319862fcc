//! Built-in architectures: parameter counts equal torchvision's, shapes, FLOPs, and forward
//! passes that stay in range with synthetic weights.

use isolane_engine::arch::{build_model_counted, graph_flops};
use isolane_engine::cpu::CpuBackend;
use isolane_engine::reference::interpret;
use isolane_engine::weights::synthesize;
use isolane_engine::weights::Init;
use isolane_engine::{builtin_models, model_info, Backend, Precision, Tensor, Weights};

#[test]
fn parameter_counts_match_torchvision() {
    for m in builtin_models() {
        let (g, params) = build_model_counted(m.name, &Weights::Zeros).unwrap();
        assert_eq!(params as u64, m.params, "{}: parameter count", m.name);
        let shapes = g.infer_shapes(2).unwrap();
        let out = &shapes[g.outputs[0]];
        assert_eq!(out[0], 2, "{}", m.name);
        assert_eq!(&out[1..], m.output_shape, "{}: output shape", m.name);
        let inp = &shapes[g.inputs[0]];
        assert_eq!(&inp[1..], &m.input_shape, "{}: input shape", m.name);
        let gf = graph_flops(&g).unwrap() / 1e9;
        println!("{}: {} params, {:.2} GFLOPs", m.name, params, gf);
        assert!(
            (gf - m.gflops_per_image).abs() / m.gflops_per_image < 0.01,
            "{}: {gf} GFLOPs vs table {}",
            m.name,
            m.gflops_per_image
        );
    }
}

#[test]
fn unknown_model_is_an_error() {
    let e = isolane_engine::build_model("resnet19", Weights::Zeros).unwrap_err();
    assert!(e.to_string().contains("resnet19"), "{e}");
    assert!(e.to_string().contains("resnet18"), "{e}");
}

fn input_for(name: &str, batch: usize) -> Tensor {
    let info = model_info(name).unwrap();
    let mut shape = vec![batch];
    shape.extend(info.input_shape);
    synthesize(7, "input", &shape, Init::Normal(1.0))
}

fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}

fn std_of(v: &[f32]) -> f64 {
    let n = v.len() as f64;
    let m = v.iter().map(|&x| x as f64).sum::<f64>() / n;
    (v.iter().map(|&x| (x as f64 - m).powi(2)).sum::<f64>() / n).sqrt()
}

/// Compiled (optimised, planned) output equals the unoptimised node-by-node interpreter,
/// and the output is finite with a sane spread.
fn check_model(name: &str, batch: usize) {
    let (g, _) = build_model_counted(name, &Weights::Synthetic { seed: 1 }).unwrap();
    let x = input_for(name, batch);
    let reference = interpret(&g, batch, std::slice::from_ref(&x)).unwrap();
    let mut m = CpuBackend::new(0)
        .compile(&g, batch, Precision::Fp32)
        .unwrap();
    assert_eq!(m.input_shape(), x.shape.as_slice());
    m.input_mut().copy_from_slice(&x.data);
    m.run().unwrap();
    let out = m.output().to_vec();
    assert_eq!(m.output_shape(), reference[0].shape.as_slice());
    assert!(
        out.iter().all(|v| v.is_finite()),
        "{name}: non-finite output"
    );
    let err = rel_l2(&out, &reference[0].data);
    let sd = std_of(&out);
    println!("{name}: rel L2 vs interpreter {err:.2e}, output std {sd:.3}");
    assert!(err < 1e-5, "{name}: compiled vs interpreted rel L2 {err}");
    assert!(sd > 1e-3 && sd < 1e3, "{name}: output std {sd}");
    // Running again gives the same answer (no state leaks between runs).
    m.input_mut().copy_from_slice(&x.data);
    m.run().unwrap();
    assert_eq!(m.output(), out.as_slice());
}

#[test]
fn resnet18_forward() {
    check_model("resnet18", 1);
}

#[test]
fn mobilenet_v2_forward() {
    check_model("mobilenet_v2", 2);
}

#[test]
fn yolov8n_forward() {
    check_model("yolov8n", 1);
}

#[test]
#[ignore = "slow in debug builds; run with --release --ignored"]
fn resnet50_forward() {
    check_model("resnet50", 1);
}

#[test]
#[ignore = "slow in debug builds; run with --release --ignored"]
fn fcn_resnet50_forward() {
    check_model("fcn_resnet50", 1);
}

#[test]
#[ignore = "slow in debug builds; run with --release --ignored"]
fn vit_b_16_forward() {
    check_model("vit_b_16", 2);
}

#[test]
#[ignore = "slow in debug builds; run with --release --ignored"]
fn vit_l_32_forward() {
    check_model("vit_l_32", 1);
}

#[test]
#[ignore = "slow in debug builds; run with --release --ignored"]
fn convnext_base_forward() {
    check_model("convnext_base", 1);
}

#[test]
#[ignore = "slow in debug builds; run with --release --ignored"]
fn convnext_large_forward() {
    check_model("convnext_large", 1);
}
