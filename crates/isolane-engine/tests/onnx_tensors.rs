//! Tensor storage forms built in memory: external data confined to the model's folder (as the
//! ONNX spec and `onnx.checker` require), and float16 / bfloat16 initializers and inputs.

mod common;

use common::{model, value_info};
use isolane_engine::backend::{Backend, Precision};
use isolane_engine::onnx::proto::{
    tensor_proto::DataLocation, tensor_proto::DataType, GraphProto, ModelProto, NodeProto,
    StringStringEntryProto, TensorProto,
};
use isolane_engine::onnx::{import_file, OnnxError, OnnxModel};
use isolane_engine::CpuBackend;
use prost::Message;
use std::path::{Path, PathBuf};

const W: [f32; 3] = [0.5, -1.25, 3.0];

/// `y = x + w`, x of `input_type` `[2, 3]`, the initializer `w` `[3]` as given.
fn add_model(w: TensorProto, input_type: DataType) -> ModelProto {
    model(GraphProto {
        name: Some("add".into()),
        node: vec![NodeProto {
            input: vec!["x".into(), "w".into()],
            output: vec!["y".into()],
            name: Some("the_add".into()),
            op_type: Some("Add".into()),
            ..Default::default()
        }],
        initializer: vec![w],
        input: vec![value_info("x", input_type, &[2, 3])],
        output: vec![value_info("y", input_type, &[2, 3])],
        ..Default::default()
    })
}

fn external_w(location: &str) -> TensorProto {
    TensorProto {
        name: Some("w".into()),
        dims: vec![3],
        data_type: Some(DataType::Float as i32),
        data_location: Some(DataLocation::External as i32),
        external_data: vec![StringStringEntryProto {
            key: Some("location".into()),
            value: Some(location.into()),
        }],
        ..Default::default()
    }
}

fn w_bytes() -> Vec<u8> {
    W.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Writes the model into `dir/model/model.onnx` (so that `dir` is outside the model's folder).
fn write_model(dir: &Path, m: &ModelProto) -> PathBuf {
    let folder = dir.join("model");
    std::fs::create_dir_all(&folder).unwrap();
    let path = folder.join("model.onnx");
    std::fs::write(&path, m.encode_to_vec()).unwrap();
    path
}

/// Loads a model whose external data `location` must be refused; returns the message.
fn refused(location: &str, setup: impl FnOnce(&Path)) -> String {
    let tmp = tempfile::tempdir().unwrap();
    setup(tmp.path());
    let path = write_model(
        tmp.path(),
        &add_model(external_w(location), DataType::Float),
    );
    let e = OnnxModel::load(&path).expect_err("the location must be refused");
    assert!(matches!(e, OnnxError::ExternalData { .. }), "{e:?}");
    let msg = e.to_string();
    for needle in ["model.onnx", "\"w\"", location] {
        assert!(msg.contains(needle), "message lacks {needle:?}: {msg}");
    }
    msg
}

#[test]
fn external_data_inside_the_folder_is_read() {
    let tmp = tempfile::tempdir().unwrap();
    let path = write_model(
        tmp.path(),
        &add_model(external_w("sub/w.bin"), DataType::Float),
    );
    let sub = path.parent().unwrap().join("sub");
    std::fs::create_dir_all(&sub).unwrap();
    std::fs::write(sub.join("w.bin"), w_bytes()).unwrap();
    let m = OnnxModel::load(&path).unwrap();
    assert_eq!(m.initializers["w"].to_f32(), W.to_vec());
}

#[test]
fn external_data_with_dot_dot_is_refused() {
    let msg = refused("../secret.bin", |dir| {
        // The file exists: the refusal is about the path, not a missing file.
        std::fs::write(dir.join("secret.bin"), w_bytes()).unwrap();
    });
    assert!(msg.contains("`..`"), "{msg}");
    let msg = refused("sub/../../secret.bin", |dir| {
        std::fs::write(dir.join("secret.bin"), w_bytes()).unwrap();
    });
    assert!(msg.contains("`..`"), "{msg}");
    // A Windows-style separator does not get around the check.
    let msg = refused("..\\secret.bin", |_| {});
    assert!(msg.contains("`..`"), "{msg}");
}

#[test]
fn external_data_with_an_absolute_path_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let outside = tmp.path().join("abs.bin");
    std::fs::write(&outside, w_bytes()).unwrap();
    let msg = refused(outside.to_str().unwrap(), |_| {});
    assert!(msg.contains("absolute path"), "{msg}");
    let msg = refused("C:\\weights\\w.bin", |_| {});
    assert!(msg.contains("absolute path"), "{msg}");
}

#[cfg(unix)]
#[test]
fn external_data_through_a_symlink_out_of_the_folder_is_refused() {
    let msg = refused("link.bin", |dir| {
        std::fs::write(dir.join("secret.bin"), w_bytes()).unwrap();
        std::fs::create_dir_all(dir.join("model")).unwrap();
        std::os::unix::fs::symlink(dir.join("secret.bin"), dir.join("model/link.bin")).unwrap();
    });
    assert!(msg.contains("outside the model's folder"), "{msg}");
}

#[cfg(unix)]
#[test]
fn external_data_through_a_symlink_inside_the_folder_is_read() {
    let tmp = tempfile::tempdir().unwrap();
    let path = write_model(
        tmp.path(),
        &add_model(external_w("link.bin"), DataType::Float),
    );
    let folder = path.parent().unwrap();
    std::fs::write(folder.join("real.bin"), w_bytes()).unwrap();
    std::os::unix::fs::symlink(folder.join("real.bin"), folder.join("link.bin")).unwrap();
    let m = OnnxModel::load(&path).unwrap();
    assert_eq!(m.initializers["w"].to_f32(), W.to_vec());
}

#[test]
fn missing_external_file_names_tensor_and_location() {
    let msg = refused("absent.bin", |_| {});
    assert!(msg.contains("cannot open"), "{msg}");
}

/// Bit patterns of `W` (exactly representable in both formats).
fn half_bits(bf16: bool) -> Vec<u16> {
    W.iter()
        .map(|&v| {
            if bf16 {
                half::bf16::from_f32(v).to_bits()
            } else {
                half::f16::from_f32(v).to_bits()
            }
        })
        .collect()
}

fn half_w(dt: DataType, raw: bool) -> TensorProto {
    let bits = half_bits(dt == DataType::Bfloat16);
    let mut t = TensorProto {
        name: Some("w".into()),
        dims: vec![3],
        data_type: Some(dt as i32),
        ..Default::default()
    };
    if raw {
        t.raw_data = Some(bits.iter().flat_map(|b| b.to_le_bytes()).collect());
    } else {
        // The typed form keeps each 16-bit pattern in an int32 (onnx.proto).
        t.int32_data = bits.iter().map(|&b| b as i32).collect();
    }
    t
}

/// float16 and bfloat16 initializers (raw and typed), with inputs of the same type, import and
/// compute `x + w` (in f32, the IR's storage).
#[test]
fn half_precision_initializers_and_inputs_load_and_run() {
    let backend = CpuBackend::new(1);
    for dt in [DataType::Float16, DataType::Bfloat16] {
        for raw in [true, false] {
            let tmp = tempfile::tempdir().unwrap();
            let path = write_model(tmp.path(), &add_model(half_w(dt, raw), dt));
            let m = OnnxModel::load(&path).unwrap();
            assert_eq!(m.initializers["w"].to_f32(), W.to_vec(), "{dt:?} raw={raw}");
            let g = import_file(&path).unwrap();
            let mut cm = backend.compile(&g, 2, Precision::Fp32).unwrap();
            let x = [1.0f32, 2.0, 3.0, -1.0, -2.0, -3.0];
            cm.input_mut().copy_from_slice(&x);
            cm.run().unwrap();
            let want: Vec<f32> = x.iter().enumerate().map(|(i, v)| v + W[i % 3]).collect();
            assert_eq!(cm.output(), want.as_slice(), "{dt:?} raw={raw}");
        }
    }
}

#[test]
fn half_initializer_with_wrong_byte_count_names_the_tensor() {
    let mut t = half_w(DataType::Float16, true);
    t.raw_data.as_mut().unwrap().pop();
    let tmp = tempfile::tempdir().unwrap();
    let path = write_model(tmp.path(), &add_model(t, DataType::Float16));
    let msg = OnnxModel::load(&path).unwrap_err().to_string();
    assert!(msg.contains("\"w\"") && msg.contains("FLOAT16"), "{msg}");
}

#[test]
fn unsupported_element_type_names_it() {
    let t = TensorProto {
        name: Some("w".into()),
        dims: vec![3],
        data_type: Some(DataType::Float8e5m2 as i32),
        raw_data: Some(vec![0; 3]),
        ..Default::default()
    };
    let tmp = tempfile::tempdir().unwrap();
    let path = write_model(tmp.path(), &add_model(t, DataType::Float));
    let msg = OnnxModel::load(&path).unwrap_err().to_string();
    assert!(msg.contains("\"w\"") && msg.contains("FLOAT8E5M2"), "{msg}");
}
