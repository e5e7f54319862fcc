//! `isolane models` and `isolane infer` end to end: outputs, files written, exit codes.

use std::path::{Path, PathBuf};
use std::process::Command;

fn isolane() -> Command {
    Command::new(env!("CARGO_BIN_EXE_isolane"))
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/isolane-engine/tests/fixtures")
}

fn run(args: &[&str]) -> (i32, String, String) {
    let o = isolane().args(args).output().expect("run isolane");
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// Each file infer, build and bench read whole, named as a device that never ends. The address
/// space is capped so that a regression ends in an allocation failure, not in all of memory.
#[test]
fn a_device_is_refused_where_a_file_is_read_whole() {
    let t = tempfile::tempdir().unwrap();
    let onnx = t.path().join("z.onnx");
    std::os::unix::fs::symlink("/dev/zero", &onnx).unwrap();
    let plan = t.path().join("z.isoplan");
    std::os::unix::fs::symlink("/dev/zero", &plan).unwrap();
    let (onnx, plan) = (onnx.to_str().unwrap(), plan.to_str().unwrap());
    let model = fixtures().join("onnx/tiny_cnn_op14.onnx");
    let model = model.to_str().unwrap();
    let out = t.path().join("o.isoplan");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["infer", "--model", model, "--input", "/dev/zero"],
            "--input /dev/zero",
        ),
        (
            vec!["infer", "--model", "mobilenet_v2", "--image", "/dev/zero"],
            "--image",
        ),
        (
            vec![
                "infer",
                "--model",
                model,
                "--random",
                "--labels",
                "/dev/zero",
            ],
            "--labels",
        ),
        (vec!["infer", "--model", onnx, "--random"], "--model"),
        (vec!["infer", "--model", plan, "--random"], "--model"),
        (
            vec![
                "infer",
                "--model",
                "resnet18",
                "--weights",
                "/dev/zero",
                "--random",
            ],
            "--weights",
        ),
        (
            vec![
                "build",
                "--device",
                "cpu",
                onnx,
                "-o",
                out.to_str().unwrap(),
            ],
            "the model",
        ),
        (
            vec!["bench", "--backend", "cpu", "--model", plan],
            "the model",
        ),
    ];
    for (args, needle) in cases {
        let o = std::process::Command::new("sh")
            .arg("-c")
            .arg("ulimit -v 4000000; exec \"$0\" \"$@\"")
            .arg(env!("CARGO_BIN_EXE_isolane"))
            .args(&args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(needle) && err.contains("is a character device, not a file"),
            "{args:?}: {err}"
        );
    }
}

/// A saved plan runs on the weights it was built with: --weights beside it was once ignored.
#[test]
fn weights_beside_a_saved_plan_are_refused() {
    let t = tempfile::tempdir().unwrap();
    let plan = t.path().join("m.isoplan");
    let model = fixtures().join("onnx/tiny_cnn_op14.onnx");
    let (code, _, err) = run(&[
        "build",
        "--device",
        "cpu",
        model.to_str().unwrap(),
        "-o",
        plan.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let weights = t.path().join("w.safetensors");
    std::fs::write(&weights, b"x").unwrap();
    let (code, _, err) = run(&[
        "infer",
        "--model",
        plan.to_str().unwrap(),
        "--weights",
        weights.to_str().unwrap(),
        "--random",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("is a saved plan, which carries its own weights"),
        "{err}"
    );
}

/// An input of no items named its file and flag; it once said only "batch size must be at
/// least 1".
#[test]
fn an_input_of_no_items_is_named() {
    let t = tempfile::tempdir().unwrap();
    let empty = t.path().join("empty.npy");
    std::fs::write(
        &empty,
        isolane_engine::io::npy::encode_npy(&[0, 3, 224, 224], &[]),
    )
    .unwrap();
    let (code, _, err) = run(&[
        "infer",
        "--model",
        "mobilenet_v2",
        "--input",
        empty.to_str().unwrap(),
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("empty.npy: shape [0, 3, 224, 224] holds no item"),
        "{err}"
    );
}

/// A 60000x1 strip is a few kilobytes as a PNG, but resized to 256 on its shorter side it
/// would be 15360000x256 pixels: once an abort (or the OOM killer), now a refusal naming it.
#[test]
fn an_image_too_long_for_its_resize_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let strip = t.path().join("strip.png");
    image::RgbImage::new(60_000, 1).save(&strip).unwrap();
    let o = std::process::Command::new("sh")
        .arg("-c")
        .arg("ulimit -v 4000000; exec \"$0\" \"$@\"")
        .arg(env!("CARGO_BIN_EXE_isolane"))
        .args(["infer", "--model", "mobilenet_v2", "--image"])
        .arg(&strip)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("strip.png: 60000x1 pixels") && err.contains("at most 2730 times"),
        "{err}"
    );
}

#[test]
fn models_lists_builtins_as_table_and_json() {
    let (code, out, _) = run(&["models"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("resnet18") && out.contains("11,689,512"),
        "{out}"
    );
    let widest = out.lines().map(|l| l.chars().count()).max().unwrap_or(0);
    assert!(widest <= 80, "{widest} columns:\n{out}");
    let (code, out, _) = run(&["models", "--json"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let r18 = v
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "resnet18")
        .unwrap();
    assert_eq!(r18["params"], 11_689_512);
    assert_eq!(r18["input_shape"], serde_json::json!([3, 224, 224]));
}

#[test]
fn infer_onnx_with_npy_input_writes_onnxruntime_output() {
    let d = fixtures().join("onnx");
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("y.npy");
    let model = d.join("tiny_cnn_op14.onnx");
    let input = d.join("tiny_cnn_op14.input.npy");
    let (code, stdout, stderr) = run(&[
        "infer",
        "--model",
        model.to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
        "--save-output",
        out.to_str().unwrap(),
        "--threads",
        "1",
    ]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains("[2, 10]"), "{stdout}");
    assert!(
        stdout.contains("sample 1:"),
        "top-5 for each sample: {stdout}"
    );
    let got = isolane_engine::io::read_npy(&out).unwrap();
    let want = isolane_engine::io::read_npy(d.join("tiny_cnn_op14.output.npy")).unwrap();
    assert_eq!(got.shape, want.shape);
    let err: f32 = got
        .data
        .iter()
        .zip(&want.data)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    assert!(err < 1e-5, "max abs diff {err}");
}

#[test]
fn user_mistakes_exit_2_naming_the_culprit() {
    let (code, _, err) = run(&["infer", "--model", "no_such_model", "--random"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("no_such_model") && err.contains("resnet18"),
        "{err}"
    );

    let bad = fixtures().join("onnx/bad/truncated.onnx");
    let (code, _, err) = run(&["infer", "--model", bad.to_str().unwrap(), "--random"]);
    assert_eq!(code, 2);
    assert!(err.contains("truncated.onnx"), "{err}");

    let bad = fixtures().join("onnx/bad/unsupported_op.onnx");
    let (code, _, err) = run(&["infer", "--model", bad.to_str().unwrap(), "--random"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("NonZero") && err.contains("the_nonzero") && err.contains("opset 13"),
        "{err}"
    );

    let img = fixtures().join("image/broken.jpg");
    let model = fixtures().join("onnx/conv_basic_op13.onnx");
    let (code, _, err) = run(&[
        "infer",
        "--model",
        model.to_str().unwrap(),
        "--image",
        img.to_str().unwrap(),
        "--batch",
        "2",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("broken.jpg"), "{err}");

    let missing = fixtures().join("onnx/missing.npy");
    let (code, _, err) = run(&[
        "infer",
        "--model",
        model.to_str().unwrap(),
        "--input",
        missing.to_str().unwrap(),
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("missing.npy"), "{err}");

    let fixed = fixtures().join("onnx/fixed_batch_reshape_op13.onnx");
    let (code, _, err) = run(&[
        "infer",
        "--model",
        fixed.to_str().unwrap(),
        "--random",
        "--batch",
        "2",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("fixed batch of 1"), "{err}");
}

#[test]
fn random_input_is_seeded() {
    let model = fixtures().join("onnx/global_pools_flatten_op13.onnx");
    let m = model.to_str().unwrap();
    let a = run(&[
        "infer",
        "--model",
        m,
        "--random",
        "--seed",
        "5",
        "--threads",
        "1",
    ])
    .1;
    let b = run(&[
        "infer",
        "--model",
        m,
        "--random",
        "--seed",
        "5",
        "--threads",
        "1",
    ])
    .1;
    let c = run(&[
        "infer",
        "--model",
        m,
        "--random",
        "--seed",
        "6",
        "--threads",
        "1",
    ])
    .1;
    let tail = |s: &str| {
        s.lines()
            .filter(|l| l.trim_start().starts_with(char::is_numeric))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(tail(&a), tail(&b));
    assert_ne!(tail(&a), tail(&c));
}

#[test]
fn cuda_and_precisions_are_checked_before_anything_runs() {
    // The CPU backend runs fp32 only: a user mistake (exit 2), named.
    let (code, _, err) = run(&[
        "infer",
        "--model",
        "resnet18",
        "--random",
        "--precision",
        "fp16",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--precision fp16") && err.contains("fp32 only"),
        "{err}"
    );
    // Without a GPU driver (CI) the cuda backend says which library is missing and how to point
    // isolane at it; on a machine with a GPU this test is about the CPU check above only.
    if !std::path::Path::new("/dev/nvidiactl").exists() {
        let (code, _, err) = run(&[
            "infer",
            "--model",
            "resnet18",
            "--random",
            "--backend",
            "cuda",
        ]);
        assert_eq!(code, 1, "{err}");
        assert!(
            err.contains("libcuda") && err.contains("ISOLANE_CUDA_LIB_DIR"),
            "{err}"
        );
    }
}

#[test]
fn nan_or_infinite_input_values_are_refused_naming_the_file() {
    let model = fixtures().join("onnx/conv_basic_op13.onnx");
    let good = isolane_engine::io::read_npy(fixtures().join("onnx/conv_basic_op13.input.npy"))
        .expect("fixture");
    let tmp = tempfile::tempdir().unwrap();
    let nan = tmp.path().join("nan.npy");
    let all_nan = vec![f32::NAN; good.data.len()];
    isolane_engine::io::write_npy(&nan, &good.shape, &all_nan).unwrap();
    let (code, out, err) = run(&[
        "infer",
        "--model",
        model.to_str().unwrap(),
        "--input",
        nan.to_str().unwrap(),
    ]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(
        err.contains("nan.npy")
            && err.contains(&format!(
                "{} of the {} input values are NaN or infinite",
                good.data.len(),
                good.data.len()
            )),
        "{err}"
    );
    assert!(!out.contains("top"), "no top-5 from a NaN input:\n{out}");
}

#[test]
fn a_negative_batch_is_refused_as_a_value_not_as_an_unknown_flag() {
    let (code, _, err) = run(&["infer", "--model", "resnet18", "--random", "--batch", "-1"]);
    assert_eq!(code, 2);
    assert!(!err.contains("unexpected argument"), "{err}");
    assert!(
        err.contains("--batch") && err.contains("-1 is not allowed: a whole number >= 1 is"),
        "{err}"
    );
}

/// Issue 31: `--save-output /dev/full` as root turned the device into a regular file (a
/// temporary renamed over it). Only a regular file or a new path is replaced; a FIFO and a
/// missing folder are refused; a link to a character device is written through. Tested on
/// paths of a temporary folder, never on the machine's own devices, which are checked after.
#[test]
fn save_output_replaces_only_regular_files() {
    use std::os::unix::fs::FileTypeExt;
    let d = fixtures().join("onnx");
    let model = d.join("tiny_cnn_op14.onnx");
    let input = d.join("tiny_cnn_op14.input.npy");
    let t = tempfile::tempdir().unwrap();
    let infer = |out: &std::path::Path| {
        run(&[
            "infer",
            "--model",
            model.to_str().unwrap(),
            "--input",
            input.to_str().unwrap(),
            "--save-output",
            out.to_str().unwrap(),
            "--threads",
            "1",
        ])
    };
    let fifo = t.path().join("fifo.npy");
    assert!(std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let (code, _, err) = infer(&fifo);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("FIFO") && err.contains("not a regular file"),
        "{err}"
    );
    assert!(std::fs::symlink_metadata(&fifo)
        .unwrap()
        .file_type()
        .is_fifo());
    let (code, _, err) = infer(&t.path().join("missing/y.npy"));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("missing does not exist"), "{err}");
    assert!(!t.path().join("missing").exists());
    let null = t.path().join("null.npy");
    std::os::unix::fs::symlink("/dev/null", &null).unwrap();
    let (code, _, err) = infer(&null);
    assert_eq!(code, 0, "{err}");
    assert!(std::fs::symlink_metadata(&null)
        .unwrap()
        .file_type()
        .is_symlink());
    for dev in ["/dev/null", "/dev/full"] {
        let t = std::fs::symlink_metadata(dev).unwrap().file_type();
        assert!(t.is_char_device(), "{dev} is no longer a character device");
    }
}

/// A one-node ONNX model of `op` on a `side`×`side` input `x`, its second input a constant
/// (`scales` as floats for Resize, `pads` as int64 for Pad), written to `path`.
fn write_one_node(path: &Path, op: &str, side: i64, floats: Vec<f32>, ints: Vec<i64>) {
    use isolane_engine::onnx::proto::{
        tensor_proto::DataType, tensor_shape_proto, type_proto, GraphProto, ModelProto, NodeProto,
        OperatorSetIdProto, TensorProto, TensorShapeProto, TypeProto, ValueInfoProto,
    };
    use prost::Message;
    // No shape: the output's is left to the import to work out.
    let info = |name: &str, dims: Option<&[i64]>| ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(DataType::Float as i32),
                shape: dims.map(|dims| TensorShapeProto {
                    dim: dims
                        .iter()
                        .map(|&d| tensor_shape_proto::Dimension {
                            value: Some(tensor_shape_proto::dimension::Value::DimValue(d)),
                            ..Default::default()
                        })
                        .collect(),
                }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    };
    let (inputs, arg) = if op == "Resize" {
        let arg = TensorProto {
            name: Some("scales".into()),
            dims: vec![floats.len() as i64],
            data_type: Some(DataType::Float as i32),
            float_data: floats,
            ..Default::default()
        };
        (vec!["x".to_string(), String::new(), "scales".into()], arg)
    } else {
        let arg = TensorProto {
            name: Some("pads".into()),
            dims: vec![ints.len() as i64],
            data_type: Some(DataType::Int64 as i32),
            int64_data: ints,
            ..Default::default()
        };
        (vec!["x".to_string(), "pads".into()], arg)
    };
    let graph = GraphProto {
        name: Some("crafted".into()),
        node: vec![NodeProto {
            name: Some("big".into()),
            op_type: Some(op.into()),
            input: inputs,
            output: vec!["y".into()],
            ..Default::default()
        }],
        initializer: vec![arg],
        input: vec![info("x", Some(&[1, 3, side, side]))],
        output: vec![info("y", None)],
        ..Default::default()
    };
    let model = ModelProto {
        ir_version: Some(8),
        opset_import: vec![OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(17),
        }],
        graph: Some(graph),
        ..Default::default()
    };
    std::fs::write(path, model.encode_to_vec()).unwrap();
}

/// Issue 31's crafted models: a Pad of 1e5 and of 3e4 and a Resize by 5000 of an 8×8 input are
/// refused by `infer` with exit 2, naming the node, before anything of their size exists. The
/// process runs under a 6 GiB address-space cap, so a check that evaluated the tensors it
/// checks (the Pad's 240 GB) or a run that went ahead (the Resize's 19 GB) would abort instead.
/// The Resize by 5000 of 8×8 (19.2 GB) is refused because a CPU run's activations may take at
/// most half of the machine's memory: on a machine with more than 38 GiB it may run, and only
/// the same Resize of a 64×64 input is asked.
#[test]
fn crafted_pads_and_resizes_are_refused_before_they_allocate() {
    let dir = tempfile::tempdir().unwrap();
    let memory = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            let line = m.lines().find(|l| l.starts_with("MemTotal:"))?.to_string();
            line.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .map(|kb| kb * 1024);
    let resize_fits_half = memory.is_some_and(|m| 3 * 40_000u64 * 40_000 * 4 <= m / 2);
    let mut cases = vec![
        (
            "pad-1e5",
            "Pad",
            8,
            vec![],
            vec![0, 0, 100_000, 100_000, 0, 0, 100_000, 100_000],
        ),
        (
            "pad-3e4",
            "Pad",
            8,
            vec![],
            vec![0, 0, 30_000, 30_000, 0, 0, 30_000, 30_000],
        ),
        // 320000 × 320000: more than any machine's half.
        (
            "resize-5000-of-64",
            "Resize",
            64,
            vec![1.0, 1.0, 5000.0, 5000.0],
            vec![],
        ),
    ];
    if !resize_fits_half {
        cases.push((
            "resize-5000",
            "Resize",
            8,
            vec![1.0, 1.0, 5000.0, 5000.0],
            vec![],
        ));
    }
    for (name, op, side, floats, ints) in cases {
        let model = dir.path().join(format!("{name}.onnx"));
        write_one_node(&model, op, side, floats, ints);
        let o = Command::new("sh")
            .arg("-c")
            .arg("ulimit -v 6291456 && exec \"$@\"")
            .arg("sh")
            .arg(env!("CARGO_BIN_EXE_isolane"))
            .args(["infer", "--model"])
            .arg(&model)
            .args(["--random", "--threads", "1"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{name}: {err}");
        assert!(err.contains("needs at least"), "{name}: {err}");
        assert!(
            err.contains("half of this machine's memory"),
            "{name}: {err}"
        );
        assert!(err.contains("node \"big\""), "{name}: {err}");
    }
}

/// An allocation the process cannot make is an out-of-memory, exit code 3, with the model, its
/// batch, the bytes asked and a hint, not an abort (`vec!` aborts the process on a failed
/// allocation) nor a runtime failure (1). The address-space limit makes it deterministic:
/// resnet18's CPU arena at batch 256 is about 1.1 GiB, more than the 1 GiB the process gets,
/// while the up-front check (against half of this machine's memory) lets it through and batch
/// 1 runs within the same limit.
#[test]
fn an_arena_beyond_the_address_space_exits_3_naming_model_batch_and_bytes() {
    let limited = |batch: &str| {
        Command::new("sh")
            .arg("-c")
            .arg("ulimit -v 1048576 && exec \"$@\"")
            .arg("sh")
            .arg(env!("CARGO_BIN_EXE_isolane"))
            .args(["infer", "--model", "resnet18", "--random", "--threads", "1"])
            .args(["--batch", batch])
            .output()
            .unwrap()
    };
    let o = limited("1");
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = limited("256");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{err}");
    for needle in [
        "running resnet18 at batch 256: out of memory: the activation arena asked for",
        "GiB of host memory",
        "hint: a smaller batch",
    ] {
        assert!(err.contains(needle), "expected {needle:?} in:\n{err}");
    }
    assert!(!err.contains("panicked"), "{err}");
    // bench keeps the engine's error as its source too.
    let o = Command::new("sh")
        .arg("-c")
        .arg("ulimit -v 1048576 && exec \"$@\"")
        .arg("sh")
        .arg(env!("CARGO_BIN_EXE_isolane"))
        .args(["bench", "--backend", "cpu", "--model", "resnet18"])
        .args(["--threads", "1", "--batch", "256"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(
        err.contains("compiling resnet18 batch 256 for cpu: out of memory"),
        "{err}"
    );
    // So does build, which writes no plan.
    let dir = tempfile::tempdir().unwrap();
    let plan = dir.path().join("r.isoplan");
    let o = Command::new("sh")
        .arg("-c")
        .arg("ulimit -v 1048576 && exec \"$@\"")
        .arg("sh")
        .arg(env!("CARGO_BIN_EXE_isolane"))
        .args([
            "build", "resnet18", "--device", "cpu", "--batch", "256", "-o",
        ])
        .arg(&plan)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(
        err.contains("building resnet18 for batch 256 on cpu: out of memory"),
        "{err}"
    );
    assert!(!plan.exists());
}

/// `--precision int8` / `fp8` quantize the model from `--calibration` first (then run it: at
/// fp32 on the CPU, at fp16 on cuda with its products on the tensor cores) and say how the
/// quantized model agrees with the float one; the calibration flags are checked by name.
#[test]
fn int8_and_fp8_quantize_from_a_calibration_folder() {
    let d = fixtures().join("onnx");
    let model = d.join("tiny_cnn_op14.onnx");
    let input = d.join("tiny_cnn_op14.input.npy");
    let cal = tempfile::tempdir().unwrap();
    std::fs::copy(&input, cal.path().join("items.npy")).unwrap();
    let (m, i, c) = (
        model.to_str().unwrap(),
        input.to_str().unwrap(),
        cal.path().to_str().unwrap(),
    );
    for (precision, method, skips) in [("int8", "entropy", "float"), ("fp8", "minmax", "quantized")]
    {
        let (code, out, err) = run(&[
            "infer",
            "--model",
            m,
            "--input",
            i,
            "--precision",
            precision,
            "--calibration",
            c,
            "--calibration-method",
            method,
            "--calibration-skips",
            skips,
            "--threads",
            "1",
        ]);
        assert_eq!(code, 0, "{precision}: {out}{err}");
        let q = if precision == "int8" {
            "int8"
        } else {
            "float8e4m3fn"
        };
        assert!(
            out.contains(&format!("calibration: {q} from 2 calibration items"))
                && out.contains("top-1 agreement")
                && out.contains(&format!("; residual skips {skips}\n")),
            "{out}"
        );
        assert!(out.contains("sample 1:"), "{out}");
    }
    let cases: [(&[&str], &str); 5] = [
        (&["--precision", "int8"], "--calibration DIR"),
        (
            &[
                "--precision",
                "fp8",
                "--calibration",
                c,
                "--calibration-method",
                "entropy",
            ],
            "entropy",
        ),
        (&["--calibration", c], "are for --precision int8 or fp8"),
        (
            &["--calibration-skips", "float"],
            "--calibration-skips are for --precision int8 or fp8, not fp32",
        ),
        (
            &[
                "--precision",
                "int8",
                "--calibration",
                c,
                "--calibration-skips",
                "bytes",
            ],
            "--calibration-skips",
        ),
    ];
    for (extra, want) in cases {
        let mut args = vec!["infer", "--model", m, "--input", i];
        args.extend_from_slice(extra);
        let (code, _, err) = run(&args);
        assert_eq!(code, 2, "{extra:?}: {err}");
        assert!(err.contains(want), "{extra:?}: {err}");
    }
}

/// `--labels FILE` scores the output on the trained digits model's held-out items: the top-1
/// accuracy and the agreement with the model's fp32 answers on the CPU (its own output at
/// fp32; the unquantized model's for int8 / fp8), figures the fixture's README gives; a
/// labels file that does not fit the input is refused by name, exit 2.
#[test]
fn labels_score_accuracy_and_agreement_per_precision() {
    let d = fixtures().join("digits");
    let (m, x, l, c) = (
        d.join("digits.onnx"),
        d.join("heldout.npy"),
        d.join("heldout_labels.npy"),
        d.join("calibration"),
    );
    let (m, x, l, c) = (
        m.to_str().unwrap(),
        x.to_str().unwrap(),
        l.to_str().unwrap(),
        c.to_str().unwrap(),
    );
    let base = ["infer", "--model", m, "--input", x, "--labels", l];
    let (code, out, err) = run(&base);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains(
            "labels   top-1 accuracy 358/360 (99.44 %), agreement with fp32 360/360 (100.00 %) \
             (cpu fp32"
        ),
        "{out}"
    );
    let mut args = base.to_vec();
    args.extend(["--precision", "int8", "--calibration", c]);
    let (code, out, err) = run(&args);
    assert_eq!(code, 0, "{out}{err}");
    let line = out.lines().find(|l| l.starts_with("labels ")).unwrap_or("");
    assert!(line.contains("(cpu int8;"), "{out}");
    // The fixture's test bounds isolane's int8 at >= 98 % agreement.
    let agree: usize = line
        .split("agreement with fp32 ")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(agree >= 353, "{out}");

    let dir = tempfile::tempdir().unwrap();
    let short = dir.path().join("short.npy");
    isolane_engine::io::write_npy(&short, &[3], &[1.0, 2.0, 3.0]).unwrap();
    let many = dir.path().join("many.npy");
    isolane_engine::io::write_npy(&many, &[360], &[12.0; 360]).unwrap();
    let ints = dir.path().join("bad.npy");
    std::fs::write(&ints, b"not an npy").unwrap();
    for (file, want) in [
        (&short, "3 labels, but the input holds 360 items"),
        (
            &many,
            "label 0 is class 12, but the model's output has 10 classes",
        ),
        (&ints, "bad.npy"),
    ] {
        let mut args = base.to_vec();
        let f = file.to_str().unwrap();
        args[6] = f;
        let (code, _, err) = run(&args);
        assert_eq!(code, 2, "{f}: {err}");
        assert!(err.contains(want) && err.contains(f), "{f}: {err}");
    }
}

/// `bench --precision int8,fp8 --calibration DIR`: each row quantized from the folder first
/// (its agreement line noted), labelled by the quantized precision; the calibration flags are
/// checked by name before anything is compiled.
#[test]
fn bench_measures_int8_and_fp8_rows_from_a_calibration_folder() {
    let cal = tempfile::tempdir().unwrap();
    // One item of seeded values in [-1, 1).
    let mut state = 7u64;
    let item: Vec<f32> = (0..3 * 224 * 224)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1);
            (state >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect();
    isolane_engine::io::write_npy(cal.path().join("0.npy"), &[3, 224, 224], &item).unwrap();
    let c = cal.path().to_str().unwrap();
    let base = [
        "bench",
        "--model",
        "mobilenet_v2",
        "--backend",
        "cpu",
        "--replays",
        "1",
        "--warmup",
        "0",
        "--json",
    ];
    let mut args = base.to_vec();
    args.extend_from_slice(&["--precision", "int8,fp8", "--calibration", c]);
    args.extend_from_slice(&["--calibration-method", "minmax"]);
    args.extend_from_slice(&["--calibration-skips", "float"]);
    let (code, out, err) = run(&args);
    assert_eq!(code, 0, "{out}{err}");
    for p in ["int8", "fp8"] {
        assert!(out.contains(&format!(r#""precision":"{p}""#)), "{out}");
    }
    assert!(
        err.contains("mobilenet_v2 batch 1 int8: int8 from 1 calibration items")
            && err.contains("; residual skips float\n"),
        "{err}"
    );
    let cases: [(&[&str], &str); 5] = [
        (&["--precision", "int8"], "--calibration DIR"),
        (
            &["--precision", "fp16", "--calibration", c],
            "are for --precision int8 or fp8",
        ),
        (
            &[
                "--precision",
                "int8",
                "--calibration",
                c,
                "--calibration-method",
                "mean",
            ],
            "--calibration-method",
        ),
        (
            &["--precision", "fp16", "--calibration-skips", "float"],
            "--calibration-skips are for --precision int8 or fp8",
        ),
        (
            &[
                "--precision",
                "int8",
                "--calibration",
                c,
                "--calibration-skips",
                "bytes",
            ],
            "--calibration-skips",
        ),
    ];
    for (extra, want) in cases {
        let mut args = base.to_vec();
        args.extend_from_slice(extra);
        let (code, _, err) = run(&args);
        assert_eq!(code, 2, "{extra:?}: {err}");
        assert!(err.contains(want), "{extra:?}: {err}");
    }
}
