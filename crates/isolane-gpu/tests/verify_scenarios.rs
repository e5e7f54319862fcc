//! The example scenarios of `isolane verify` parse and pass admission control on the H100
//! model; one green context more than one split of it holds is rejected.

use isolane_core::admission::{admit, AdmissionOptions, RejectReason};
use isolane_core::device_model::device_model;
use isolane_core::spec::{NoBuiltinModels, Scenario};

fn load(text: &str) -> Scenario {
    Scenario::from_toml_str(text, "<example>", &NoBuiltinModels).expect("example scenario")
}

#[test]
fn the_verify_examples_are_admitted_on_the_h100() {
    let h100 = device_model("h100-sxm").unwrap();
    for (name, text, n) in [
        (
            "green 4x32",
            include_str!("../scenarios/verify-green-4x32.toml"),
            4,
        ),
        (
            "green 15x8",
            include_str!("../scenarios/verify-green-15x8.toml"),
            15,
        ),
        (
            "mps 4x25",
            include_str!("../scenarios/verify-mps-4x25.toml"),
            4,
        ),
        (
            "timeslice 4",
            include_str!("../scenarios/verify-timeslice-4.toml"),
            4,
        ),
    ] {
        let s = load(text);
        let plan = admit(&s, &h100, &[], &AdmissionOptions::default())
            .unwrap_or_else(|r| panic!("{name}: {r:?}"));
        assert_eq!(plan.workloads.len(), n, "{name}");
    }
}

#[test]
fn a_sixteenth_8_sm_green_context_is_rejected() {
    let h100 = device_model("h100-sxm").unwrap();
    let mut text = include_str!("../scenarios/verify-green-15x8.toml").to_string();
    text.push_str(
        "\n[[workload]]\nname = \"p15\"\nmodel = \"spin:1ms\"\nrate_hz = 10\nduration_s = 1\n\
         partition = { sms = 8 }\n",
    );
    let s = load(&text);
    let r = admit(&s, &h100, &[], &AdmissionOptions::default()).expect_err("16 × 8 > 120");
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].workload, "p15");
    assert!(matches!(
        r[0].reason,
        RejectReason::BeyondGreenSplit {
            sms: 8,
            available: 0,
            together: 120,
            device_sms: 132,
            ..
        }
    ));
}
