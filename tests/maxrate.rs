//! `isolane maxrate` on a synthetic model whose ideal rate is known (issue 2 acceptance).

mod common;

use common::*;

/// Needs the CPU to itself, as in CI: on a machine saturated by other work no rate near 250 is
/// stable (measured: 83 jobs/s while a 2-thread benchmark ran beside it), and the search walks
/// down for a long time.
#[test]
fn maxrate_of_spin_4ms_is_a_little_under_250() {
    within_tries(3, || {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("m");
        let o = run_ok(
            isolane()
                .args([
                    "maxrate",
                    "--model",
                    "spin:4ms",
                    "--jobs",
                    "200",
                    "--validations",
                    "2",
                    "--relative-step",
                    "0.02",
                    "--out",
                ])
                .arg(&out),
        );
        let stdout = String::from_utf8_lossy(&o.stdout);
        println!("{stdout}");
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("maxrate.json")).unwrap())
                .unwrap();
        let rate = f(&json["max_rate_hz"]);
        let l_max = f(&json["l_max_ms"]);
        // Above the ideal 250 jobs/s nothing is stable, however quiet the machine: never allowed.
        assert!(rate <= 252.0, "max rate {rate}");
        assert!((l_max - 1000.0 / rate).abs() < 1e-6);
        assert!(stdout.contains("max stable rate"));
        let trace = std::fs::read_to_string(out.join("maxrate_trace.csv")).unwrap();
        assert!(trace.starts_with("batch,phase,rate_hz,jobs,violations,accepted\n"));
        assert!(trace.lines().count() >= 4, "{trace}");
        // A VM stall during a batch lowers the rate the search settles on (one retry absorbs it).
        check(rate >= 180.0, || format!("max rate {rate}"))
    });
}

/// A real network (an ONNX file) goes through the engine: the search finishes with a positive
/// rate and the file records what ran.
#[test]
fn maxrate_runs_a_real_model_through_the_engine() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("m");
    let model = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/crates/isolane-engine/tests/fixtures/onnx/conv_basic_op13.onnx"
    );
    run_ok(
        isolane()
            .args([
                "maxrate",
                "--model",
                model,
                "--jobs",
                "30",
                "--validations",
                "1",
            ])
            .args(["--relative-step", "0.5", "--warmup", "2", "--out"])
            .arg(&out),
    );
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("maxrate.json")).unwrap()).unwrap();
    assert!(f(&json["max_rate_hz"]) > 0.0, "{json}");
    let steal = f(&json["cpu_steal_pct"]);
    assert!((0.0..=100.0).contains(&steal), "{json}");
    assert_eq!(json["backend"], "cpu");
    assert_eq!(json["mechanism"], "none");
}

#[test]
fn maxrate_refuses_partitions_and_gpu_precisions_on_the_cpu() {
    for (args, expect) in [
        (
            &["--mechanism", "green", "--sms", "8"][..],
            "nothing to partition",
        ),
        (&["--precision", "fp16"][..], "precision"),
        (&["--backend", "tpu"][..], "tpu"),
    ] {
        let o = isolane()
            .args(["maxrate", "--model", "spin:1ms", "--jobs", "5"])
            .args(args)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(expect), "{args:?}: {err}");
    }
}
