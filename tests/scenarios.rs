//! Every example under scenarios/ is a valid scenario (and the isolation ones a valid
//! experiment), so the examples cannot rot.

use isolane_core::spec::{NoBuiltinModels, Scenario};

#[test]
fn every_example_scenario_validates() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_none_or(|x| x != "toml") {
            continue;
        }
        let s = Scenario::load(&p, &NoBuiltinModels)
            .unwrap_or_else(|err| panic!("{}: {err}", p.display()));
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
        isolane_runtime::coordinator::preflight(&plan)
            .unwrap_or_else(|err| panic!("{}: {err}", p.display()));
        n += 1;
    }
    assert!(n >= 5, "only {n} scenarios");
}
