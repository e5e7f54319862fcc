use super::*;
use std::path::Path;

struct Models;
impl ModelNames for Models {
    fn is_builtin(&self, model: &str) -> bool {
        matches!(model, "mobilenet_v2" | "resnet18" | "yolov8n")
    }
    fn builtins(&self) -> Vec<String> {
        vec!["mobilenet_v2".into(), "resnet18".into(), "yolov8n".into()]
    }
}

const PIPELINE: &str = r#"
[device]
backend = "cpu"

[[app]]
name = "endo"
deadline_ms = 50
frames = 40

[app.source]
kind = "synthetic"
width = 64
height = 48
fps = 30

[[app.stage]]
name = "pre"
kind = "preprocess"

[[app.stage]]
name = "net"
kind = "model"
model = "mobilenet_v2"

[[app.stage]]
name = "top"
kind = "classify"

[[app.stage]]
name = "out"
kind = "sink"
"#;

fn parse(text: &str) -> Result<Vec<AppSpec>, SpecError> {
    parse_apps(text, Path::new("/tmp/s.toml"), &Models)
}

fn err(text: &str) -> String {
    parse(text).unwrap_err().to_string()
}

#[test]
fn a_chain_defaults_each_input_to_the_stage_above() {
    let apps = parse(PIPELINE).unwrap();
    let a = &apps[0];
    assert_eq!(a.frames, 40);
    assert_eq!(a.drop_frames, 10);
    assert_eq!(a.late, Late::Skip);
    assert_eq!(a.stages[0].inputs, vec![Input::Source]);
    assert_eq!(a.stages[3].inputs, vec![Input::Stage(2)]);
    assert_eq!(a.period_ns(), 33_333_333);
    assert_eq!(a.models().len(), 1);
    assert_eq!(a.source_words(), "synthetic 64x48");
    let StageKind::Preprocess(p) = &a.stages[0].kind else {
        panic!()
    };
    assert_eq!((p.mean, p.std, p.size), ([0.0; 3], [1.0; 3], None));
}

#[test]
fn no_apps_is_no_apps() {
    assert!(parse("[device]\nbackend = \"cpu\"\n").unwrap().is_empty());
}

#[test]
fn a_dag_with_an_ensemble() {
    let text = r#"
[[app]]
name = "vote"
deadline_ms = 100
duration_s = 2
partition = { sms = 16 }
[app.source]
kind = "synthetic"
width = 8
height = 8
fps = 20
[[app.stage]]
name = "pre"
kind = "preprocess"
size = [224, 224]
[[app.stage]]
name = "ens"
kind = "ensemble"
vote = "mean"
members = [{ name = "a", model = "mobilenet_v2" }, { name = "b", model = "resnet18", partition = { sms = 8 } }]
[[app.stage]]
name = "det"
kind = "model"
model = "yolov8n"
after = ["pre"]
[[app.stage]]
name = "boxes"
kind = "yolov8_decode"
[[app.stage]]
name = "out"
kind = "sink"
after = ["ens", "boxes"]
"#;
    let a = &parse(text).unwrap()[0];
    assert_eq!(a.frames, 40);
    assert_eq!(a.stages[4].inputs, vec![Input::Stage(1), Input::Stage(3)]);
    let StageKind::Ensemble { members, vote } = &a.stages[1].kind else {
        panic!()
    };
    assert_eq!(*vote, Vote::Mean);
    assert_eq!(members[0].name, "ens.a");
    assert_eq!(members[0].partition.sms, Some(16), "the app's partition");
    assert_eq!(members[1].partition.sms, Some(8), "its own");
    let names: Vec<String> = a.models().iter().map(|m| m.name.clone()).collect();
    assert_eq!(names, ["ens.a", "ens.b", "det"]);
    let w = crate::partitions::as_workloads(
        std::slice::from_ref(a),
        &cuda_device(isolane_core::spec::Host::Thread),
    );
    assert_eq!(w[1].name, "vote.ens.b");
    assert_eq!(w[1].rate, isolane_core::spec::Rate::Hz(20.0));
    // In a process, the app is one partition: member b's own is refused by field; without it
    // the app is one workload named as the app, in the app's partition.
    let (field, message) = crate::partitions::check_process_partitions(
        std::slice::from_ref(a),
        isolane_core::spec::Host::Process,
    )
    .unwrap_err();
    assert_eq!(field, "app[0].stage[1].members[1].partition");
    assert!(
        message.contains("`ens.b`") && message.contains("one partition"),
        "{message}"
    );
    let same = parse(&text.replace(", partition = { sms = 8 }", "")).unwrap();
    assert!(
        crate::partitions::check_process_partitions(&same, isolane_core::spec::Host::Process)
            .is_ok()
    );
    let w = crate::partitions::as_workloads(&same, &cuda_device(isolane_core::spec::Host::Process));
    assert_eq!(w.len(), 1);
    assert_eq!(
        (w[0].name.as_str(), w[0].model.as_str()),
        ("vote", "mobilenet_v2")
    );
    assert_eq!(w[0].partition.sms, Some(16));
    assert_eq!(w[0].host, isolane_core::spec::Host::Process);
    assert_eq!(
        crate::partitions::partition_workload(&same[0], "ens.a", isolane_core::spec::Host::Process),
        "vote"
    );
}

/// A graphics stage reads detections or a mask, renders on the device it names, and gives a
/// frame; after a classifier it is refused by name.
#[test]
fn graphics_reads_detections_or_a_mask_and_names_its_device() {
    let detect = PIPELINE
        .replace("model = \"mobilenet_v2\"", "model = \"yolov8n\"")
        .replace(
            "kind = \"classify\"",
            "kind = \"yolov8_decode\"\n\n[[app.stage]]\nname = \"draw\"\nkind = \"graphics\"\n\
             device = \"cpu\"\nalpha = 0.4",
        );
    let apps = parse(&detect).unwrap();
    let draw = apps[0].stages.iter().find(|s| s.name == "draw").unwrap();
    assert_eq!(
        draw.kind,
        StageKind::Graphics {
            device: "cpu".into(),
            alpha: 0.4,
            save_every: None,
            gpu: None,
        }
    );
    let after_classes = PIPELINE.replace(
        "kind = \"classify\"",
        "kind = \"classify\"\n\n[[app.stage]]\nname = \"draw\"\nkind = \"graphics\"",
    );
    let e = err(&after_classes);
    assert!(
        e.contains("stage[3].after") && e.contains("detections or a mask") && e.contains("classes"),
        "{e}"
    );
    let e = err(&detect.replace("device = \"cpu\"", "device = \" \""));
    assert!(
        e.contains("stage[3].device") && e.contains("auto, gpu, cpu"),
        "{e}"
    );
    let e = err(&detect.replace("alpha = 0.4", "alpha = 1.5"));
    assert!(e.contains("alpha"), "{e}");
    let e = err(&detect.replace("alpha = 0.4", "save_every = 0"));
    assert!(
        e.contains("stage[3].save_every") && e.contains("1 to 100000"),
        "{e}"
    );
}

/// A preprocess runs on the CPU unless `device = "gpu"`; any other device is refused with the
/// file, the field and the two allowed values, and the CPU backend refuses a GPU preprocess by
/// stage name.
#[test]
fn a_preprocess_names_its_device_cpu_or_gpu() {
    let apps = parse(PIPELINE).unwrap();
    let StageKind::Preprocess(p) = &apps[0].stages[0].kind else {
        panic!()
    };
    assert_eq!(p.device, PreprocessDevice::Cpu);
    assert!(apps[0].gpu_preprocesses().is_empty());
    let gpu = PIPELINE.replace(
        "kind = \"preprocess\"",
        "kind = \"preprocess\"\ndevice = \"gpu\"",
    );
    let apps = parse(&gpu).unwrap();
    let StageKind::Preprocess(p) = &apps[0].stages[0].kind else {
        panic!()
    };
    assert_eq!(p.device, PreprocessDevice::Gpu);
    assert_eq!(apps[0].gpu_preprocesses(), vec![0]);
    assert_eq!(apps[0].fed_model(0).unwrap().name, "net");
    let e = err(&gpu.replace("device = \"gpu\"", "device = \"tpu\""));
    assert!(
        e.contains("/tmp/s.toml")
            && e.contains("app[0].stage[0].device")
            && e.contains("`tpu`")
            && e.contains("\"cpu\" or \"gpu\""),
        "{e}"
    );
    let device = |backend| isolane_core::spec::DeviceSpec {
        backend,
        gpu: 0,
        gpus: Vec::new(),
        mechanism: isolane_core::spec::Mechanism::None,
        host: isolane_core::spec::Host::Thread,
    };
    let cpu = device(isolane_core::spec::Backend::Cpu);
    let (field, message) = crate::partitions::check_gpu_stages(&cpu, &apps).unwrap_err();
    assert_eq!(field, "app[0].stage[0].device");
    assert!(
        message.contains("`pre`") && message.contains("expected device = \"cpu\""),
        "{message}"
    );
    let cuda = device(isolane_core::spec::Backend::Cuda);
    assert!(crate::partitions::check_gpu_stages(&cuda, &apps).is_ok());
}

#[test]
fn unknown_keys_and_kinds_name_what_is_allowed() {
    let e = err(&PIPELINE.replace("kind = \"classify\"", "kind = \"clasify\""));
    assert!(
        e.contains("/tmp/s.toml") && e.contains("clasify") && e.contains("classify"),
        "{e}"
    );
    let e = err(&PIPELINE.replace("frames = 40", "frames = 40\nfps = 3"));
    assert!(e.contains("fps") && e.contains("deadline_ms"), "{e}");
    // a key of another kind
    let e = err(&PIPELINE.replace("kind = \"classify\"", "kind = \"classify\"\niou = 0.5"));
    assert!(
        e.contains("app[0].stage[2].iou") && e.contains("top_k"),
        "{e}"
    );
}

#[test]
fn graph_rules() {
    let e = err(&PIPELINE.replace(
        "kind = \"classify\"",
        "kind = \"classify\"\nafter = [\"nope\"]",
    ));
    assert!(
        e.contains("unknown stage `nope`") && e.contains("source, net, pre"),
        "{e}"
    );
    let e = err(&PIPELINE.replace(
        "kind = \"classify\"",
        "kind = \"classify\"\nafter = [\"out\"]",
    ));
    assert!(e.contains("comes later"), "{e}");
    // a classify fed by the preprocess gets a tensor it can read? no: it reads a tensor and
    // the preprocess gives one, but then the model leads nowhere
    let e = err(&PIPELINE.replace(
        "kind = \"classify\"",
        "kind = \"classify\"\nafter = [\"pre\"]",
    ));
    assert!(e.contains("`net` does not lead to the sink"), "{e}");
    // a model reading the source gets a frame, not a tensor
    let e = err(&PIPELINE.replace(
        "model = \"mobilenet_v2\"",
        "model = \"mobilenet_v2\"\nafter = [\"source\"]",
    ));
    assert!(
        e.contains("reads a tensor, but `source` gives a frame"),
        "{e}"
    );
    let e = err(&PIPELINE.replace("kind = \"sink\"", "kind = \"classify\""));
    assert!(e.contains("0 sink stages"), "{e}");
}

#[test]
fn value_rules() {
    let e = err(&PIPELINE.replace("frames = 40", "frames = 40\ncpu = [1, 1]"));
    assert!(
        e.contains("app[0].cpu") && e.contains("core 1 is listed twice"),
        "{e}"
    );
    assert_eq!(
        parse(&PIPELINE.replace("frames = 40", "frames = 40\ncpu = [0]")).unwrap()[0].cpu,
        vec![0]
    );
    let e = err(&PIPELINE.replace("frames = 40", "frames = 1000000000000"));
    assert!(
        e.contains("app[0].frames") && e.contains("at most 10000000"),
        "{e}"
    );
    let e = err(&PIPELINE.replace(
        "frames = 40",
        "frames = 40\ndrop_frames = 18446744073709551615",
    ));
    assert!(
        e.contains("app[0].frames") && e.contains("leave none"),
        "{e}"
    );
    let e = err(&PIPELINE.replace("deadline_ms = 50", "deadline_ms = 1e300"));
    assert!(
        e.contains("app[0].deadline_ms") && e.contains("100 days"),
        "{e}"
    );
    let e = err(&PIPELINE.replace("fps = 30", "fps = 1e-9"));
    assert!(e.contains("app[0].frames") && e.contains("100 days"), "{e}");
    let e = err(&PIPELINE.replace("frames = 40", "frames = 20"));
    assert!(
        e.contains("app[0].frames") && e.contains("more than 20"),
        "{e}"
    );
    let e = err(&PIPELINE.replace("deadline_ms = 50", "deadline_ms = 0"));
    assert!(e.contains("app[0].deadline_ms"), "{e}");
    let e = err(&PIPELINE.replace("model = \"mobilenet_v2\"", "model = \"alexnet\""));
    assert!(
        e.contains("app[0].stage[1].model") && e.contains("resnet18"),
        "{e}"
    );
    let e = err(&PIPELINE.replace("model = \"mobilenet_v2\"", "model = \"missing.onnx\""));
    assert!(e.contains("no such file"), "{e}");
    // An .onnx stage runs on its own weights: a weights file beside it would be ignored.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("m.onnx"), b"x").unwrap();
    let text = PIPELINE.replace(
        "model = \"mobilenet_v2\"",
        "model = \"m.onnx\"\nweights = \"w.safetensors\"",
    );
    let e = parse_apps(&text, &dir.path().join("s.toml"), &Models)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("app[0].stage[1].weights") && e.contains("carries its own weights"),
        "{e}"
    );
    let e = err(&PIPELINE
        .replace("kind = \"synthetic\"", "kind = \"video\"\npath = \"a.mp4\"")
        .replace("width = 64\nheight = 48\n", ""));
    assert!(
        e.contains("app[0].source.path") && e.contains(".y4m"),
        "{e}"
    );
    let e = err(&PIPELINE.replace(
        "kind = \"preprocess\"",
        "kind = \"preprocess\"\ncrop = [10, 0, 60, 48]",
    ));
    assert!(
        e.contains("app[0].stage[0].crop") && e.contains("64x48"),
        "{e}"
    );
    let e = err(&PIPELINE.replace("name = \"top\"", "name = \"source\""));
    assert!(e.contains("names the app's source"), "{e}");
    let e = err(&format!(
        "{PIPELINE}\n{}",
        &PIPELINE[PIPELINE.find("[[app]]").unwrap()..]
    ));
    assert!(e.contains("app[1].name") && e.contains("used twice"), "{e}");
}

/// An images source whose `dir` was /dev/zero or a file was told "no such folder".
#[test]
fn an_images_dir_that_is_no_folder_is_said_so() {
    let images = |dir: &str| {
        PIPELINE
            .replace(
                "kind = \"synthetic\"",
                &format!("kind = \"images\"\ndir = \"{dir}\""),
            )
            .replace("width = 64\nheight = 48\n", "")
    };
    let e = err(&images("/dev/zero"));
    assert!(
        e.contains("app[0].source.dir") && e.contains("/dev/zero: not a folder"),
        "{e}"
    );
    let e = err(&images("/no/such/frames"));
    assert!(e.contains("/no/such/frames: no such folder"), "{e}");
}

#[test]
fn ensemble_rules() {
    let base = PIPELINE.replace(
        "kind = \"model\"\nmodel = \"mobilenet_v2\"",
        "kind = \"ensemble\"\nmembers = [{ name = \"a\", model = \"mobilenet_v2\" }]",
    );
    let e = err(&base);
    assert!(e.contains("at least 2 members"), "{e}");
    let two = base.replace("}]", "}, { name = \"a\", model = \"resnet18\" }]");
    assert!(err(&two).contains("used twice"));
    let ok = base.replace("}]", "}, { name = \"b\", model = \"resnet18\" }]");
    // a majority vote gives classes, which a classify (it reads a tensor) cannot take
    assert!(err(&ok).contains("reads a tensor, but `net` gives classes"));
    let ok = ok.replace("[[app.stage]]\nname = \"top\"\nkind = \"classify\"\n\n", "");
    assert!(parse(&ok).is_ok(), "{}", err(&ok));
    let e = err(&ok.replace(
        "kind = \"ensemble\"",
        "kind = \"ensemble\"\nvote = \"onnx\"",
    ));
    assert!(e.contains("voter"), "{e}");
}

/// One CUDA GPU (0), under MPS for processes and green contexts for threads.
fn cuda_device(host: isolane_core::spec::Host) -> isolane_core::spec::DeviceSpec {
    use isolane_core::spec::{Backend, DeviceSpec, Host, Mechanism};
    DeviceSpec {
        backend: Backend::Cuda,
        gpu: 0,
        gpus: Vec::new(),
        mechanism: match host {
            Host::Thread => Mechanism::Green,
            Host::Process => Mechanism::Mps,
        },
        host,
    }
}

#[test]
fn criticality_and_stretch_are_read_and_checked() {
    let with = |keys: &str| PIPELINE.replace("frames = 40\n", &format!("frames = 40\n{keys}\n"));
    let a = &parse(PIPELINE).unwrap()[0];
    assert_eq!((a.criticality, a.stretch), (Criticality::Critical, None));
    let a = &parse(&with("criticality = \"best_effort\"")).unwrap()[0];
    assert_eq!(a.criticality, Criticality::BestEffort);
    let a = &parse(&with("stretch = 1.4")).unwrap()[0];
    assert_eq!(a.stretch, Some(1.4));
    let e = err(&with("criticality = \"urgent\""));
    assert!(e.contains("best_effort") && e.contains("critical"), "{e}");
    let e = err(&with("stretch = 0.5"));
    assert!(e.contains("app[0].stretch") && e.contains("from 1"), "{e}");
    let e = err(&with("criticality = \"best_effort\"\nstretch = 1.5"));
    assert!(
        e.contains("app[0].stretch") && e.contains("critical app only"),
        "{e}"
    );
}
