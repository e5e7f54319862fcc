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
    for p in &files {
        let s = Scenario::load(p, &models).unwrap_or_else(|err| panic!("{}: {err}", p.display()));
        let mem = vec![None; s.workloads.len()];
        admit(&s, &h100, &mem, &AdmissionOptions::default())
            .unwrap_or_else(|r| panic!("{}: {r:?}", p.display()));
    }
    assert!(files.len() >= 4, "{files:?}");
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
