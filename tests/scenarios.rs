//! Every example under scenarios/ is a valid scenario (and the isolation ones a valid
//! experiment), so the examples cannot rot.

use isolane_core::spec::{ModelSource, Scenario};

#[test]
fn every_example_scenario_validates() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_none_or(|x| x != "toml") {
            continue;
        }
        let models: Vec<&str> = isolane_engine::builtin_models()
            .iter()
            .map(|m| m.name)
            .collect();
        let s = Scenario::load(&p, &models).unwrap_or_else(|err| panic!("{}: {err}", p.display()));
        let plan = if p
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("isolation")
        {
            isolane_runtime::isolation::plan(&s)
                .unwrap_or_else(|err| panic!("{}: {err}", p.display()))
                .0
        } else {
            isolane_runtime::RunPlan::from_scenario(&s)
        };
        // Without an engine the runtime's preflight knows spin models only (the binary passes it
        // the engine; built-in names were checked against the engine's catalog above).
        let all_spin = s
            .workloads
            .iter()
            .all(|w| matches!(w.model_source(), Ok(ModelSource::Spin(_))));
        if all_spin {
            isolane_runtime::coordinator::preflight(&plan, None)
                .unwrap_or_else(|err| panic!("{}: {err}", p.display()));
        }
        n += 1;
    }
    assert!(n >= 5, "only {n} scenarios");
}

/// The GPU examples (the GPU quickstart and scenarios/gpu/) are admitted on an H100, the
/// machine they were measured on.
#[test]
fn gpu_examples_are_admitted_on_an_h100() {
    use isolane_core::admission::{admit, AdmissionOptions};
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let mut files = vec![root.join("quickstart-gpu.toml")];
    // Scenario files only: a command workload's program (torch_gemm.py) lives beside them.
    for e in std::fs::read_dir(root.join("gpu")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "toml") {
            files.push(p);
        }
    }
    let models: Vec<&str> = isolane_engine::builtin_models()
        .iter()
        .map(|m| m.name)
        .collect();
    let h100 = isolane_core::device_model::device_model("h100-sxm").unwrap();
    let mut with_apps = 0;
    for p in &files {
        let mut s =
            Scenario::load(p, &models).unwrap_or_else(|err| panic!("{}: {err}", p.display()));
        with_apps += usize::from(add_app_workloads(p, &mut s));
        let mem = vec![None; s.workloads.len()];
        let plan = admit(&s, &h100, &mem, &AdmissionOptions::default())
            .unwrap_or_else(|r| panic!("{}: {r:?}", p.display()));
        let name = p.file_name().unwrap().to_string_lossy();
        if name.starts_with("two-gpus-apps-") {
            two_gpu_apps_placed(&name, &plan);
        }
    }
    assert!(files.len() >= 4, "{files:?}");
    assert!(with_apps >= 3, "the two-GPU app examples");
}

/// A file with `[[app]]`s: its apps' models become its workloads (as `isolane run` checks
/// them: each on its app's GPU), checked by the apps' own rules. Returns whether it had any.
fn add_app_workloads(p: &std::path::Path, s: &mut Scenario) -> bool {
    let text = std::fs::read_to_string(p).unwrap();
    let apps = isolane_app::spec::parse_apps(&text, p, &isolane_app::spec::EngineModels)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    if apps.is_empty() {
        return false;
    }
    isolane_app::partitions::check_device(&s.device).unwrap();
    isolane_app::partitions::check_gpus(&s.device, &apps)
        .unwrap_or_else(|e| panic!("{}: {e:?}", p.display()));
    s.workloads = isolane_app::partitions::as_workloads(&apps, &s.device);
    true
}

/// Issue 18's set-ups: (a) every app's MPS client on GPU 0, (b) spread over both GPUs, (c)
/// compute on GPU 0 (the graphics stages render on GPU 1, which admission does not count).
fn two_gpu_apps_placed(name: &str, plan: &isolane_core::admission::Plan) {
    let gpus: Vec<Option<u32>> = plan.workloads.iter().map(|w| w.gpu).collect();
    let expected = match name {
        "two-gpus-apps-a-one-gpu.toml" | "two-gpus-apps-c-split.toml" => [Some(0); 3],
        "two-gpus-apps-b-spread.toml" => [Some(0), Some(1), Some(0)],
        other => panic!("{other}: a two-GPU app example this test does not know"),
    };
    assert_eq!(gpus, expected, "{name}");
}

/// The co-execution examples (docs/coexec.md) are valid jobs files, and every cell the H100
/// script runs from them validates and is admitted on an H100 (unprovisioned MPS with its
/// 200 % budget), so the study does not find a mistake on the GPU machine.
#[test]
fn coexec_examples_validate_and_every_h100_cell_is_admitted() {
    use isolane_core::admission::{admit, AdmissionOptions};
    use isolane_runtime::coexec::{self as study, StudyConfig, Way};
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let models: Vec<&str> = isolane_engine::builtin_models()
        .iter()
        .map(|m| m.name)
        .collect();
    let h100 = isolane_core::device_model::device_model("h100-sxm").unwrap();
    for name in [
        "gpu/coexec-kernels.toml",
        "gpu/coexec-resnet50-cpu-gpu.toml",
    ] {
        let p = root.join(name);
        let base = Scenario::load(&p, &models).unwrap_or_else(|e| panic!("{name}: {e}"));
        study::check_jobs(name, &base).unwrap();
        let names: Vec<&str> = base.workloads.iter().map(|w| w.name.as_str()).collect();
        let n = names.len();
        let c = StudyConfig {
            jobs_file: name.into(),
            pairs: study::pairs(&names, &[]).unwrap(),
            base: base.clone(),
            ways: Vec::new(),
            thread_pct: vec![study::DEFAULT_THREAD_PCT; n],
            green_sms: vec![study::DEFAULT_GREEN_SMS; n],
        };
        let mem = |s: &Scenario| vec![None; s.workloads.len()];
        for i in 0..n {
            let s = c.alone_scenario(i);
            s.validate(&models).unwrap();
            admit(&s, &h100, &mem(&s), &AdmissionOptions::default()).unwrap();
        }
        for &pair in &c.pairs {
            for way in [Way::Timeslice, Way::Mps, Way::MpsProvisioned, Way::Green] {
                let s = c.concurrent_scenario(pair, way).unwrap();
                s.validate(&models)
                    .unwrap_or_else(|e| panic!("{name} {pair:?} {}: {e}", way.word()));
                let options = AdmissionOptions {
                    mps_thread_budget_pct: way.mps_thread_budget_pct(),
                };
                admit(&s, &h100, &mem(&s), &options)
                    .unwrap_or_else(|r| panic!("{name} {pair:?} {}: {r:?}", way.word()));
            }
        }
    }
}
