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
        // The runtime's preflight knows spin models only (the binary registers the engine;
        // built-in names were checked against the engine's catalog above).
        let all_spin = s
            .workloads
            .iter()
            .all(|w| matches!(w.model_source(), Ok(ModelSource::Spin(_))));
        if all_spin {
            isolane_runtime::coordinator::preflight(&plan)
                .unwrap_or_else(|err| panic!("{}: {err}", p.display()));
        }
        n += 1;
    }
    assert!(n >= 5, "only {n} scenarios");
}
