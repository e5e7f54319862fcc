use super::*;
use crate::spec::{parse_apps, ModelNames};
use isolane_core::spec::{Backend, Host, Mechanism};

struct Models;
impl ModelNames for Models {
    fn is_builtin(&self, model: &str) -> bool {
        model == "yolov8n"
    }
    fn builtins(&self) -> Vec<String> {
        vec!["yolov8n".into()]
    }
}

/// An app `name` (compute `gpu`, if any) detecting and drawing; `draw` is extra keys of its
/// graphics stage.
fn app(name: &str, gpu: Option<u32>, draw: &str) -> String {
    let gpu = gpu.map_or_else(String::new, |g| format!("gpu = {g}\n"));
    format!(
        r#"
[[app]]
name = "{name}"
deadline_ms = 50
frames = 40
{gpu}[app.source]
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
model = "yolov8n"
[[app.stage]]
name = "boxes"
kind = "yolov8_decode"
[[app.stage]]
name = "draw"
kind = "graphics"
{draw}
[[app.stage]]
name = "out"
kind = "sink"
"#
    )
}

fn parse(text: &str) -> Result<Vec<AppSpec>, String> {
    parse_apps(text, std::path::Path::new("s.toml"), &Models).map_err(|e| e.to_string())
}

fn device(backend: Backend, gpus: &[u32]) -> DeviceSpec {
    DeviceSpec {
        backend,
        gpu: gpus.first().copied().unwrap_or(0),
        gpus: if gpus.len() > 1 {
            gpus.to_vec()
        } else {
            Vec::new()
        },
        mechanism: match backend {
            Backend::Cuda => Mechanism::Green,
            Backend::Cpu => Mechanism::None,
        },
        host: Host::Thread,
    }
}

/// GPU `g`'s UUID as a fake CUDA would give it (GPU 7 has none here).
fn uuid_of(g: u32) -> Result<String, String> {
    if g == 7 {
        return Err("GPU 7: no such CUDA GPU here".into());
    }
    Ok(isolane_graphics::format_gpu_uuid(&[g as u8; 16]))
}

fn draw_device(app: &AppSpec) -> &str {
    match &app.stages[3].kind {
        StageKind::Graphics { device, .. } => device,
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_graphics_stage_renders_on_its_gpu_else_its_apps_else_the_first_with_several() {
    let text = [
        app("own", Some(0), "gpu = 1"),
        app("apps", Some(1), ""),
        app("first", None, ""),
        app("vulkan", Some(1), "device = \"cpu\""),
    ]
    .concat();
    let mut apps = parse(&text).unwrap();
    let two = device(Backend::Cuda, &[0, 1]);
    pin_render_devices(&mut apps, &two, &uuid_of).unwrap();
    let uuid = |g: u8| isolane_graphics::format_gpu_uuid(&[g; 16]);
    assert_eq!(draw_device(&apps[0]), uuid(1), "the stage's own gpu");
    assert_eq!(draw_device(&apps[1]), uuid(1), "its app's gpu");
    assert_eq!(draw_device(&apps[2]), uuid(0), "the device's first GPU");
    assert_eq!(
        draw_device(&apps[3]),
        "cpu",
        "a Vulkan preference of its own is kept"
    );
    assert_eq!(
        render_devices(&apps[0]),
        [("draw".to_string(), uuid(1))].into()
    );
    assert!(render_devices(&apps[3]).is_empty());
    // Compute follows the app's gpu, the device's first by default.
    assert_eq!(
        apps.iter().map(|a| a.gpu_on(&two)).collect::<Vec<_>>(),
        [0, 1, 0, 1]
    );
}

#[test]
fn one_gpu_without_gpu_keys_keeps_the_vulkan_preference_as_before() {
    let mut apps = parse(&app("a", None, "")).unwrap();
    pin_render_devices(&mut apps, &device(Backend::Cuda, &[0]), &uuid_of).unwrap();
    assert_eq!(draw_device(&apps[0]), "auto");
    // An app's gpu on one GPU pins its rendering to that GPU's device all the same.
    let mut apps = parse(&app("a", Some(0), "")).unwrap();
    pin_render_devices(&mut apps, &device(Backend::Cuda, &[0]), &uuid_of).unwrap();
    assert_eq!(
        draw_device(&apps[0]),
        isolane_graphics::format_gpu_uuid(&[0; 16])
    );
}

#[test]
fn a_gpu_without_a_uuid_is_refused_by_the_key_that_placed_the_stage() {
    let two = device(Backend::Cuda, &[0, 7]);
    for (text, field) in [
        (app("a", Some(0), "gpu = 7"), "app[0].stage[3].gpu"),
        (app("a", Some(7), ""), "app[0].gpu"),
    ] {
        let mut apps = parse(&text).unwrap();
        let (f, message) = pin_render_devices(&mut apps, &two, &uuid_of).unwrap_err();
        assert_eq!(f, field);
        assert!(message.contains("GPU 7"), "{message}");
    }
}

#[test]
fn gpu_keys_are_checked_against_the_device() {
    use crate::partitions::check_gpus;
    let two = device(Backend::Cuda, &[0, 1]);
    let ok = parse(&[app("a", Some(1), "gpu = 0"), app("b", None, "")].concat()).unwrap();
    check_gpus(&two, &ok).unwrap();
    let (field, message) = check_gpus(&two, &parse(&app("a", Some(2), "")).unwrap()).unwrap_err();
    assert_eq!(field, "app[0].gpu");
    assert!(
        message.contains("found GPU 2") && message.contains("0 | 1"),
        "{message}"
    );
    let on_stage = parse(&[app("a", None, ""), app("b", Some(1), "gpu = 3")].concat()).unwrap();
    let (field, message) = check_gpus(&two, &on_stage).unwrap_err();
    assert_eq!(field, "app[1].stage[3].gpu");
    assert!(message.contains("found GPU 3"), "{message}");
    // On one GPU only it is allowed.
    let (_, message) = check_gpus(&device(Backend::Cuda, &[0]), &ok).unwrap_err();
    assert!(
        message.contains("expected one of the device's GPUs: 0 ("),
        "{message}"
    );
    // The cpu backend has no CUDA GPU, to compute on or to find a Vulkan device by.
    let cpu = device(Backend::Cpu, &[]);
    let (field, message) =
        check_gpus(&cpu, &parse(&app("a", None, "gpu = 0")).unwrap()).unwrap_err();
    assert_eq!(field, "app[0].stage[3].gpu");
    assert!(message.contains("backend \"cpu\""), "{message}");
    let (field, _) = check_gpus(&cpu, &parse(&app("a", Some(0), "")).unwrap()).unwrap_err();
    assert_eq!(field, "app[0].gpu");
}

#[test]
fn gpu_beside_a_vulkan_preference_and_on_other_stages_is_refused() {
    let e = parse(&app("a", None, "device = \"cpu\"\ngpu = 1")).unwrap_err();
    assert!(
        e.contains("app[0].stage[3].gpu") && e.contains("not both"),
        "{e}"
    );
    // device = "auto" is the default: gpu beside it is fine.
    parse(&app("a", None, "device = \"auto\"\ngpu = 1")).unwrap();
    let e = parse(&app("a", None, "").replace(
        "kind = \"yolov8_decode\"",
        "kind = \"yolov8_decode\"\ngpu = 1",
    ))
    .unwrap_err();
    assert!(
        e.contains("app[0].stage[2].gpu") && e.contains("not a key"),
        "{e}"
    );
}

#[test]
fn workers_get_the_pinned_devices_and_refuse_a_stage_they_do_not_have() {
    let mut apps = parse(&app("a", Some(1), "")).unwrap();
    let pinned = [("draw".to_string(), "GPU-x".to_string())].into();
    set_render_devices(&mut apps[0], &pinned).unwrap();
    assert_eq!(draw_device(&apps[0]), "GPU-x");
    let wrong = [("net".to_string(), "GPU-x".to_string())].into();
    let e = set_render_devices(&mut apps[0], &wrong).unwrap_err();
    assert!(e.contains("no graphics stage `net`"), "{e}");
}

#[test]
fn several_gpus_give_each_apps_workloads_its_gpu() {
    let apps = parse(&[app("a", Some(1), ""), app("b", None, "")].concat()).unwrap();
    let gpus = |d: &DeviceSpec| -> Vec<Option<u32>> {
        crate::partitions::as_workloads(&apps, d)
            .iter()
            .map(|w| w.gpu)
            .collect()
    };
    assert_eq!(gpus(&device(Backend::Cuda, &[0, 1])), [Some(1), Some(0)]);
    // One GPU resolves as before: no workload names one.
    assert_eq!(gpus(&device(Backend::Cuda, &[0])), [None, None]);
    let mut process = device(Backend::Cuda, &[0, 1]);
    process.host = Host::Process;
    process.mechanism = Mechanism::Mps;
    assert_eq!(gpus(&process), [Some(1), Some(0)]);
}

/// Admission counts each app's green groups on its own GPU: two apps of 104 SMs fit an H100
/// (132 SMs) each, not one; the refusal names the GPU.
#[test]
fn admission_counts_each_apps_partitions_on_its_gpu() {
    use isolane_core::admission::{admit, AdmissionOptions};
    let h100 = isolane_core::device_model::device_model("h100-sxm").unwrap();
    let two = device(Backend::Cuda, &[0, 1]);
    let admitted = |gpus: [Option<u32>; 2]| {
        let text: String = gpus
            .iter()
            .enumerate()
            .map(|(i, g)| {
                app(&format!("a{i}"), *g, "").replace(
                    "kind = \"model\"",
                    "kind = \"model\"\npartition = { sms = 104 }",
                )
            })
            .collect();
        let apps = parse(&text).unwrap();
        let scenario = isolane_core::spec::Scenario {
            device: two.clone(),
            timing: Default::default(),
            protection: Default::default(),
            workloads: crate::partitions::as_workloads(&apps, &two),
        };
        let memory = vec![None; scenario.workloads.len()];
        admit(&scenario, &h100, &memory, &AdmissionOptions::default())
    };
    let plan = admitted([Some(0), Some(1)]).unwrap();
    let placed: Vec<(String, Option<u32>)> = plan
        .workloads
        .iter()
        .map(|w| (w.workload.clone(), w.gpu))
        .collect();
    assert_eq!(
        placed,
        [
            ("a0.net".to_string(), Some(0)),
            ("a1.net".to_string(), Some(1))
        ]
    );
    // Both on the first GPU (one by default): 208 SMs of its 132.
    let refused = admitted([None, Some(0)]).unwrap_err();
    assert!(refused.iter().all(|r| r.gpu == Some(0)), "{refused:?}");
}

/// A model stage's `gpu` places its model (and its workload, so its partition) there; a GPU
/// preprocess follows the model it feeds unless it names its own GPU; with host = "process"
/// an app is one process on one GPU, and a compute stage elsewhere is refused by field.
#[test]
fn compute_stages_name_their_gpu() {
    use crate::partitions::{as_workloads, check_gpus};
    let text = app("a", Some(0), "")
        .replace(
            "kind = \"preprocess\"",
            "kind = \"preprocess\"\ndevice = \"gpu\"",
        )
        .replace("model = \"yolov8n\"", "model = \"yolov8n\"\ngpu = 1");
    let apps = parse(&text).unwrap();
    let two = device(Backend::Cuda, &[0, 1]);
    check_gpus(&two, &apps).unwrap();
    assert_eq!(apps[0].stage_gpu(1, &two), Some(1), "the model's own");
    assert_eq!(
        apps[0].stage_gpu(0, &two),
        Some(1),
        "the preprocess follows it"
    );
    assert_eq!(apps[0].stage_gpu(2, &two), None, "decoding is on the CPU");
    let w = as_workloads(&apps, &two);
    assert_eq!((w[0].name.as_str(), w[0].gpu), ("a.net", Some(1)));
    let own = parse(&text.replace("device = \"gpu\"", "device = \"gpu\"\ngpu = 0")).unwrap();
    assert_eq!(own[0].stage_gpu(0, &two), Some(0));

    let process = DeviceSpec {
        mechanism: Mechanism::Mps,
        host: Host::Process,
        ..two.clone()
    };
    let (field, message) = check_gpus(&process, &apps).unwrap_err();
    assert_eq!(field, "app[0].stage[1].gpu");
    assert!(
        message.contains("one process on one GPU, GPU 0") && message.contains("\"green\""),
        "{message}"
    );
    assert_eq!(as_workloads(&apps, &process)[0].gpu, Some(0));
    // A stage on the app's GPU is fine in a process, and a graphics stage renders anywhere.
    let same = parse(
        &app("a", Some(1), "gpu = 0")
            .replace("model = \"yolov8n\"", "model = \"yolov8n\"\ngpu = 1"),
    )
    .unwrap();
    check_gpus(&process, &same).unwrap();
    let (field, message) =
        check_gpus(&two, &parse(&text.replace("gpu = 1", "gpu = 5")).unwrap()).unwrap_err();
    assert_eq!(field, "app[0].stage[1].gpu");
    assert!(message.contains("found GPU 5"), "{message}");
}

/// `gpu` on a preprocess that runs on the CPU is refused; `transfer` takes auto, staged or
/// host.
#[test]
fn a_cpu_preprocess_has_no_gpu_and_transfer_names_its_values() {
    let e = parse(
        &app("a", None, "").replace("kind = \"preprocess\"", "kind = \"preprocess\"\ngpu = 1"),
    )
    .unwrap_err();
    assert!(
        e.contains("app[0].stage[0].gpu") && e.contains("runs on the CPU"),
        "{e}"
    );
    let apps = parse(&app("a", None, "")).unwrap();
    assert_eq!(apps[0].transfer, crate::spec::Transfer::Auto);
    let staged = app("a", None, "").replace("frames = 40", "frames = 40\ntransfer = \"staged\"");
    assert_eq!(
        parse(&staged).unwrap()[0].transfer,
        crate::spec::Transfer::Staged
    );
    let e = parse(&staged.replace("\"staged\"", "\"nvlink\"")).unwrap_err();
    assert!(
        e.contains("transfer") && e.contains("auto") && e.contains("staged") && e.contains("host"),
        "{e}"
    );
}

/// Resolving names every model's and GPU preprocess's GPU, from its own key, its model's, its
/// app's or the device's.
#[test]
fn resolving_names_each_compute_stage_its_gpu() {
    let text = app("a", Some(1), "").replace(
        "kind = \"preprocess\"",
        "kind = \"preprocess\"\ndevice = \"gpu\"",
    ) + &app("b", None, "");
    let mut apps = parse(&text).unwrap();
    let two = device(Backend::Cuda, &[0, 1]);
    super::resolve_compute_gpus(&mut apps, &two);
    let gpu_of = |a: &AppSpec, j: usize| match &a.stages[j].kind {
        StageKind::Model(m) => m.gpu,
        StageKind::Preprocess(p) => p.gpu,
        _ => None,
    };
    assert_eq!(
        (gpu_of(&apps[0], 0), gpu_of(&apps[0], 1)),
        (Some(1), Some(1))
    );
    assert_eq!(
        (gpu_of(&apps[1], 0), gpu_of(&apps[1], 1)),
        (None, Some(0)),
        "a CPU preprocess has none"
    );
}
