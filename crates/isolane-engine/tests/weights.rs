//! safetensors loading: by name, with shape/dtype/missing/extra checks, and synthetic weights.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use isolane_engine::arch::{build_model_counted, state_dict};
use isolane_engine::reference::interpret;
use isolane_engine::weights::{synthesize, write_safetensors, Init, ParamStore};
use isolane_engine::{Tensor, Weights};
use safetensors::tensor::TensorView;
use safetensors::Dtype;

fn write_raw(path: &Path, tensors: &[(&str, Dtype, Vec<usize>, Vec<u8>)]) {
    let views: Vec<(&str, TensorView)> = tensors
        .iter()
        .map(|(n, d, s, b)| (*n, TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None::<HashMap<String, String>>, path).unwrap();
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn loads_by_name_and_checks_everything() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("w.safetensors");
    let half: Vec<u8> = [1.5f32, -2.0]
        .iter()
        .flat_map(|&v| half_bits(v).to_le_bytes())
        .collect();
    let bf: Vec<u8> = [0.25f32, 3.0]
        .iter()
        .flat_map(|&v| ((v.to_bits() >> 16) as u16).to_le_bytes())
        .collect();
    write_raw(
        &p,
        &[
            (
                "a.weight",
                Dtype::F32,
                vec![2, 3],
                f32_bytes(&[1., 2., 3., 4., 5., 6.]),
            ),
            ("a.half", Dtype::F16, vec![2], half),
            ("a.bf16", Dtype::BF16, vec![2], bf),
            ("a.int", Dtype::I64, vec![1], 7i64.to_le_bytes().to_vec()),
            (
                "bn.num_batches_tracked",
                Dtype::I64,
                vec![],
                0i64.to_le_bytes().to_vec(),
            ),
            ("aux.extra", Dtype::F32, vec![1], f32_bytes(&[0.0])),
        ],
    );
    let file = p.display().to_string();
    let mut st = ParamStore::new(&Weights::Safetensors(p.clone())).unwrap();
    let t = st.param("a.weight", &[2, 3], Init::Const(0.0)).unwrap();
    assert_eq!(t.data, [1., 2., 3., 4., 5., 6.]);
    assert_eq!(
        st.param("a.half", &[2], Init::Const(0.0)).unwrap().data,
        [1.5, -2.0]
    );
    assert_eq!(
        st.param("a.bf16", &[2], Init::Const(0.0)).unwrap().data,
        [0.25, 3.0]
    );
    assert_eq!(st.params, 10);
    // Wrong dtype.
    let e = st
        .param("a.int", &[1], Init::Const(0.0))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&file) && e.contains("a.int") && e.contains("I64"),
        "{e}"
    );
    // Missing tensor.
    let e = st
        .param("b.weight", &[4], Init::Const(0.0))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&file) && e.contains("missing tensor `b.weight`") && e.contains("[4]"),
        "{e}"
    );
    // Extra tensors are an error (num_batches_tracked excepted) ...
    let e = st.finish().unwrap_err().to_string();
    assert!(
        e.contains("aux.extra") && !e.contains("num_batches_tracked"),
        "{e}"
    );
    // ... unless the model declares them ignorable.
    st.ignore_prefix("aux.");
    st.finish().unwrap();
    // Wrong shape names expected and found.
    let mut st = ParamStore::new(&Weights::Safetensors(p.clone())).unwrap();
    let e = st
        .param("a.weight", &[3, 2], Init::Const(0.0))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("a.weight") && e.contains("[2, 3]") && e.contains("[3, 2]"),
        "{e}"
    );
}

#[test]
fn corrupt_or_missing_files_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.safetensors");
    std::fs::write(&p, b"\x10\x00\x00\x00\x00\x00\x00\x00{not json").unwrap();
    let e = ParamStore::new(&Weights::Safetensors(p.clone()))
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("bad.safetensors") && e.contains("not a valid safetensors"),
        "{e}"
    );
    let e = ParamStore::new(&Weights::Safetensors(dir.path().join("nope.safetensors")))
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("nope.safetensors") && e.contains("cannot read"),
        "{e}"
    );
    // A FIFO (or a device) given as weights is refused by what it is, not read until memory
    // runs out or blocked on until a writer comes.
    let fifo = dir.path().join("pipe.safetensors");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .is_ok_and(|s| s.success());
    if made {
        let e = ParamStore::new(&Weights::Safetensors(fifo.clone()))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("pipe.safetensors") && e.contains("FIFO"), "{e}");
    }
    let e = isolane_engine::weights::read_safetensors(Path::new("/dev/zero"))
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("/dev/zero") && e.contains("not a regular file"),
        "{e}"
    );
}

fn half_bits(v: f32) -> u16 {
    // Exact for the test values (representable in f16).
    let b = v.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32 - 127 + 15;
    let mant = ((b >> 13) & 0x3ff) as u16;
    sign | ((exp as u16) << 10) | mant
}

/// A built-in's synthetic state dict written to safetensors and loaded back by name gives the
/// same graph output, and a tampered file is rejected naming the tensor.
#[test]
fn model_state_dict_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("mobilenet_v2.safetensors");
    let sd = state_dict("mobilenet_v2", &Weights::Synthetic { seed: 3 }).unwrap();
    assert!(sd.iter().any(|(n, _)| n == "features.1.conv.0.0.weight"));
    assert!(sd.iter().any(|(n, _)| n == "classifier.1.bias"));
    assert!(sd.iter().any(|(n, _)| n == "features.18.1.running_var"));
    write_safetensors(&p, &sd).unwrap();
    let (g1, _) = build_model_counted("mobilenet_v2", &Weights::Synthetic { seed: 3 }).unwrap();
    let (g2, params) =
        build_model_counted("mobilenet_v2", &Weights::Safetensors(p.clone())).unwrap();
    assert_eq!(params, 3_504_872);
    let x = synthesize(1, "x", &[1, 3, 224, 224], Init::Normal(1.0));
    let a = interpret(&g1, 1, std::slice::from_ref(&x)).unwrap();
    let b = interpret(&g2, 1, std::slice::from_ref(&x)).unwrap();
    assert_eq!(a[0].data, b[0].data);

    // One tensor with a wrong shape.
    let mut bad = sd.clone();
    let i = bad
        .iter()
        .position(|(n, _)| n == "features.2.conv.1.0.weight")
        .unwrap();
    bad[i].1 = Arc::new(Tensor::zeros(vec![96, 1, 5, 5]));
    write_safetensors(&p, &bad).unwrap();
    let e = build_model_counted("mobilenet_v2", &Weights::Safetensors(p.clone()))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("features.2.conv.1.0.weight")
            && e.contains("[96, 1, 5, 5]")
            && e.contains("[96, 1, 3, 3]"),
        "{e}"
    );
    // One missing.
    let mut bad = sd.clone();
    bad.retain(|(n, _)| n != "features.5.conv.3.running_mean");
    write_safetensors(&p, &bad).unwrap();
    let e = build_model_counted("mobilenet_v2", &Weights::Safetensors(p.clone()))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("missing tensor `features.5.conv.3.running_mean`"),
        "{e}"
    );
    // A file for another model.
    let e = build_model_counted("resnet18", &Weights::Safetensors(p))
        .unwrap_err()
        .to_string();
    assert!(e.contains("missing tensor `conv1.weight`"), "{e}");
}

#[test]
fn synthetic_weights_are_deterministic_and_nonzero() {
    let a = synthesize(5, "layer.weight", &[1000], Init::kaiming(100));
    let b = synthesize(5, "layer.weight", &[1000], Init::kaiming(100));
    let c = synthesize(6, "layer.weight", &[1000], Init::kaiming(100));
    assert_eq!(a, b);
    assert_ne!(a, c);
    assert!(a.data.iter().all(|v| *v != 0.0 && v.is_finite()));
    let std = (a.data.iter().map(|v| v * v).sum::<f32>() / 1000.0).sqrt();
    assert!((std - (2.0f32 / 100.0).sqrt()).abs() < 0.02, "std {std}");
}
