//! Every ONNX fixture (tools/fixtures/make_fixtures.py) imports, runs on the CPU backend and
//! matches onnxruntime's output within 1e-5 relative L2; every file under `bad/` fails with a
//! message naming the culprit.

use isolane_engine::backend::{Backend, Precision};
use isolane_engine::io::read_npy;
use isolane_engine::onnx::{import_file, OnnxError, OnnxModel};
use isolane_engine::CpuBackend;
use std::path::{Path, PathBuf};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/onnx")
}

fn fixtures() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir())
        .expect("fixture dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "onnx"))
        .collect();
    v.sort();
    assert!(v.len() >= 40, "fixtures missing: {}", v.len());
    v
}

fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    let (mut num, mut den) = (0f64, 0f64);
    for (x, y) in a.iter().zip(b) {
        num += (*x as f64 - *y as f64).powi(2);
        den += (*y as f64).powi(2);
    }
    (num / den.max(1e-30)).sqrt()
}

/// Imports, compiles at the batch of the fixture's input and runs; returns the relative L2 error.
fn run_fixture(onnx: &Path, backend: &CpuBackend) -> Result<f64, String> {
    let stem = onnx.file_stem().unwrap().to_string_lossy().into_owned();
    let x =
        read_npy(onnx.with_file_name(format!("{stem}.input.npy"))).map_err(|e| e.to_string())?;
    let y =
        read_npy(onnx.with_file_name(format!("{stem}.output.npy"))).map_err(|e| e.to_string())?;
    let g = import_file(onnx).map_err(|e| e.to_string())?;
    let batch = x.shape[0];
    let mut m = backend
        .compile(&g, batch, Precision::Fp32)
        .map_err(|e| format!("compile: {e}"))?;
    if m.input_shape() != x.shape.as_slice() {
        return Err(format!(
            "input shape {:?}, fixture {:?}",
            m.input_shape(),
            x.shape
        ));
    }
    m.input_mut().copy_from_slice(&x.data);
    m.run().map_err(|e| format!("run: {e}"))?;
    if m.output_shape() != y.shape.as_slice() {
        return Err(format!(
            "output shape {:?}, onnxruntime {:?}",
            m.output_shape(),
            y.shape
        ));
    }
    Ok(rel_l2(m.output(), &y.data))
}

#[test]
fn fixtures_match_onnxruntime() {
    let backend = CpuBackend::new(2);
    let mut failures = Vec::new();
    let mut table = String::new();
    for f in fixtures() {
        let name = f.file_stem().unwrap().to_string_lossy().into_owned();
        match run_fixture(&f, &backend) {
            Ok(err) if err <= 1e-5 => table.push_str(&format!("{name:45} {err:.2e}\n")),
            Ok(err) => failures.push(format!("{name}: relative L2 {err:.3e} > 1e-5")),
            Err(e) => failures.push(format!("{name}: {e}")),
        }
    }
    println!("{table}");
    assert!(
        failures.is_empty(),
        "{} fixture(s) failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// A fixture with a dynamic batch compiles at other batch sizes too (the graph is batch-agnostic).
#[test]
fn dynamic_batch_fixtures_run_at_other_batches() {
    let backend = CpuBackend::new(1);
    for name in [
        "tiny_cnn_op14",
        "tiny_transformer_op17",
        "shape_chain_heads_op17",
        "shape_chain_expand_where_op15",
        "torch_vit_tiny_op17",
        "torch_convnext_tiny_op17",
    ] {
        let g = import_file(dir().join(format!("{name}.onnx"))).unwrap();
        let x = read_npy(dir().join(format!("{name}.input.npy"))).unwrap();
        let y = read_npy(dir().join(format!("{name}.output.npy"))).unwrap();
        // The fixture input's first sample alone, at batch 1, must give the first output sample.
        let per_in = x.data.len() / x.shape[0];
        let per_out = y.data.len() / y.shape[0];
        let mut m = backend.compile(&g, 1, Precision::Fp32).unwrap();
        m.input_mut().copy_from_slice(&x.data[..per_in]);
        m.run().unwrap();
        let err = rel_l2(m.output(), &y.data[..per_out]);
        assert!(err < 1e-5, "{name} at batch 1: {err}");
        let m4 = backend.compile(&g, 4, Precision::Fp32).unwrap();
        assert_eq!(m4.input_shape()[0], 4, "{name}");
        assert_eq!(m4.output_shape()[0], 4, "{name}");
    }
}

#[test]
fn bad_files_fail_naming_the_culprit() {
    let bad = dir().join("bad");
    let expect = std::fs::read_to_string(bad.join("EXPECT")).unwrap();
    let mut n = 0;
    for line in expect
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let mut parts = line.split('\t');
        let file = parts.next().unwrap();
        let err = match import_file(bad.join(file)) {
            Ok(_) => panic!("{file} imported, but it must fail"),
            Err(e) => e.to_string(),
        };
        assert!(
            err.contains(file),
            "{file}: the message does not name the file: {err}"
        );
        for needle in parts {
            assert!(
                err.contains(needle),
                "{file}: message lacks {needle:?}: {err}"
            );
        }
        n += 1;
    }
    assert!(n >= 9);
}

#[test]
fn missing_file_is_an_io_error_naming_it() {
    let p = dir().join("does_not_exist.onnx");
    let e = OnnxModel::load(&p).unwrap_err();
    assert!(matches!(e, OnnxError::Io { .. }));
    assert!(e.to_string().contains("does_not_exist.onnx"));
}

/// Cutting a valid model anywhere never panics: it is an error naming the file (or, cut on a
/// field boundary that leaves a complete model behind, a valid import).
#[test]
fn truncation_at_every_length_never_panics() {
    let path = dir().join("tiny_transformer_op17.onnx");
    let bytes = std::fs::read(&path).unwrap();
    let step = (bytes.len() / 200).max(1);
    for len in (0..bytes.len()).step_by(step) {
        match OnnxModel::from_bytes(&bytes[..len], &path) {
            Err(e) => assert!(e.to_string().contains("tiny_transformer_op17.onnx")),
            Ok(m) => {
                if let Err(e) = isolane_engine::onnx::import(&m) {
                    assert!(e.to_string().contains("tiny_transformer_op17.onnx"));
                }
            }
        }
    }
}

#[test]
fn external_data_is_read() {
    let m = OnnxModel::load(dir().join("external_data_op13.onnx")).unwrap();
    assert_eq!(m.initializers["W"].shape, vec![4, 6]);
}

/// Random byte corruption of real models (structure, attributes, shapes) never panics the
/// loader or the importer: every outcome is a model or an error.
#[test]
fn corrupted_bytes_never_panic() {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for name in [
        "tiny_transformer_op17",
        "tiny_cnn_op14",
        "shape_chain_expand_where_op15",
        "resize_linear_sizes_axes_op18",
        "torch_vit_tiny_op17",
    ] {
        let path = dir().join(format!("{name}.onnx"));
        let good = std::fs::read(&path).unwrap();
        for _ in 0..300 {
            let mut b = good.clone();
            for _ in 0..1 + next() % 4 {
                let i = (next() as usize) % b.len();
                b[i] = next() as u8;
            }
            if let Ok(m) = OnnxModel::from_bytes(&b, &path) {
                let _ = isolane_engine::onnx::import(&m);
            }
        }
    }
}
