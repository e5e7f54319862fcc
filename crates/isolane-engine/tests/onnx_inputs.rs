//! Input files for `isolane infer`: images preprocessed as torchvision does, and `.npy` files.

use isolane_engine::io::{image, read_npy, write_npy};
use std::path::{Path, PathBuf};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/image")
}

/// PIL's resize + crop + normalise (tools/fixtures/make_fixtures.py) on the same PNG. PIL rounds
/// to 8 bits in fixed point like our port, so values agree to about one 8-bit step at most.
#[test]
fn image_preprocessing_matches_pil_torchvision() {
    let img = image::decode(&dir().join("small.png")).unwrap();
    let ours = image::preprocess(&img, 32, 28).unwrap();
    let want = read_npy(dir().join("small.expected.npy")).unwrap();
    assert_eq!(want.shape, vec![3, 28, 28]);
    let step = 1.0 / 255.0 / 0.224; // one 8-bit level after normalisation (mid std)
    let mut worst = 0f32;
    let mut exact = 0;
    for (a, b) in ours.iter().zip(&want.data) {
        worst = worst.max((a - b).abs());
        exact += ((a - b).abs() < 1e-6) as usize;
    }
    assert!(
        worst <= step * 1.01,
        "max abs diff {worst} (one 8-bit level is {step})"
    );
    assert!(
        exact as f64 >= 0.99 * ours.len() as f64,
        "only {exact}/{} identical",
        ours.len()
    );
}

#[test]
fn undecodable_image_names_the_file() {
    let p = dir().join("broken.jpg");
    let e = image::load_image(&p).unwrap_err().to_string();
    assert!(e.contains("broken.jpg"), "{e}");
    let e = image::load_image(dir().join("missing.png"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("missing.png"), "{e}");
}

#[test]
fn standard_image_input_is_3x224x224() {
    let (shape, data) = image::load_image(dir().join("small.png")).unwrap();
    assert_eq!(shape, vec![3, 224, 224]);
    assert_eq!(data.len(), 3 * 224 * 224);
    assert!(data.iter().all(|v| v.is_finite() && v.abs() < 3.0));
}

#[test]
fn npy_roundtrip_and_numpy_files() {
    let t = tempfile::tempdir().unwrap();
    let p = t.path().join("x.npy");
    write_npy(&p, &[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.5]).unwrap();
    let r = read_npy(&p).unwrap();
    assert_eq!(r.shape, vec![2, 3]);
    assert_eq!(r.data[5], 6.5);
    // A file written by NumPy itself.
    let x = read_npy(dir().join("../onnx/tiny_cnn_op14.input.npy")).unwrap();
    assert_eq!(x.shape, vec![2, 3, 16, 16]);
    let bad = t.path().join("bad.npy");
    std::fs::write(&bad, b"\x93NUMPY\x01\x00\x10\x00{'descr': '<f4'").unwrap();
    let e = read_npy(&bad).unwrap_err().to_string();
    assert!(e.contains("bad.npy"), "{e}");
}
