//! `isolane maxrate` on a synthetic model whose ideal rate is known (issue 2 acceptance).

mod common;

use common::*;

/// The searches of this file run one at a time: the timing test needs a core to itself, and the
/// others' searches (spin and real models, in-process or in a worker) would take it on a 2-core
/// CI machine (measured: 101-178 jobs/s instead of about 245 while they ran beside it).
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Needs the CPU to itself, as in CI: on a machine saturated by other work no rate near 250 is
/// stable (measured: 83 jobs/s while a 2-thread benchmark ran beside it), and the search walks
/// down for a long time.
#[test]
fn maxrate_of_spin_4ms_is_a_little_under_250() {
    let _serial = one_at_a_time();
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
    let _serial = one_at_a_time();
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
    let _serial = one_at_a_time();
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

/// The search as `--mechanism mps` runs it, in an `isolane worker` process whose environment
/// is its partition (`spin:` here, so no GPU): the outcome comes back typed, with progress.
fn worker_search(jobs: u64) -> isolane_runtime::maxrate::SearchRequest {
    use isolane_core::maxrate::{MaxRateConfig, Step};
    let scenario = isolane_core::Scenario::from_toml_str(
        &format!(
            "[device]\nbackend = \"cpu\"\n\n[[workload]]\nname = \"maxrate\"\n\
             model = \"spin:1ms\"\nrate_hz = 1\njobs = {jobs}\nwarmup_jobs = 2\n"
        ),
        "test.toml",
        &Vec::<String>::new(),
    )
    .unwrap();
    isolane_runtime::maxrate::SearchRequest {
        workload: scenario.workloads[0].clone(),
        device: scenario.device.clone(),
        timing: scenario.timing.clone(),
        config: MaxRateConfig {
            jobs,
            validations: 1,
            step: Step::Relative(0.5),
            ..MaxRateConfig::default()
        },
    }
}

fn isolane_worker() -> isolane_runtime::worker_client::WorkerCommand {
    isolane_runtime::worker_client::WorkerCommand {
        program: std::env::var_os("ISOLANE_BIN")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| env!("CARGO_BIN_EXE_isolane").into()),
        args: vec!["worker".into()],
        env: Vec::new(),
    }
}

#[test]
fn the_search_runs_in_an_isolane_worker_and_reports_back() {
    let _serial = one_at_a_time();
    use isolane_session::maxrate::{search_in_worker, Searched};
    let adopted = std::sync::Mutex::new(Vec::new());
    let mut events = Vec::new();
    let searched = search_in_worker(
        &isolane_worker(),
        &[],
        &|pid| adopted.lock().unwrap().push(pid),
        &worker_search(30),
        &std::sync::atomic::AtomicBool::new(false),
        &mut |e| events.push(e.clone()),
    )
    .unwrap();
    let Searched::Done(outcome) = searched else {
        panic!("interrupted")
    };
    // 1 ms jobs: never above 1000 jobs/s, however loaded the machine.
    let rate = outcome.result.max_rate_hz;
    assert!(rate > 0.0 && rate <= 1010.0, "{rate}");
    assert_eq!(
        adopted.lock().unwrap().len(),
        1,
        "the worker is adopted once"
    );
    assert!(
        matches!(
            &events[0],
            isolane_runtime::maxrate::SearchEvent::WarmedUp { job_s } if job_s.len() == 2
        ),
        "{events:?}"
    );
    assert!(events.len() >= 4, "{events:?}");
}

#[test]
fn a_stopped_search_in_a_worker_ends_interrupted() {
    let _serial = one_at_a_time();
    use isolane_session::maxrate::{search_in_worker, Searched};
    // 100 000 jobs of 1 ms back to back: the stop, raised before the start, comes long before
    // the search could end by itself.
    let searched = search_in_worker(
        &isolane_worker(),
        &[],
        &|_| {},
        &worker_search(100_000),
        &std::sync::atomic::AtomicBool::new(true),
        &mut |_| {},
    )
    .unwrap();
    assert!(matches!(searched, Searched::Interrupted), "{searched:?}");
}

/// `maxrate -o RUN --force` deleted the run's summary.json, scenario.toml and jobs/*.csv, none
/// of which maxrate writes: refused now (exit 2, the folder and its maker named), the run's
/// files untouched; over a previous maxrate's folder `--force` still replaces its results.
#[test]
fn maxrate_force_never_removes_a_runs_results() {
    let _serial = one_at_a_time();
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    std::fs::create_dir_all(run.join("jobs")).unwrap();
    let files = ["summary.json", "scenario.toml", "jobs/a.csv"];
    for f in files {
        std::fs::write(run.join(f), format!("run's {f}")).unwrap();
    }
    let maxrate = |out: &std::path::Path| {
        isolane()
            .args(["maxrate", "--model", "spin:1ms", "--jobs", "20"])
            .args([
                "--relative-step",
                "0.5",
                "--validations",
                "1",
                "--force",
                "--out",
            ])
            .arg(out)
            .output()
            .unwrap()
    };
    let o = maxrate(&run);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    for want in [
        run.to_str().unwrap(),
        "`isolane run`",
        "summary.json",
        "another --out",
    ] {
        assert!(err.contains(want), "no {want:?} in {err}");
    }
    for f in files {
        assert_eq!(
            std::fs::read_to_string(run.join(f)).unwrap(),
            format!("run's {f}")
        );
    }
    assert!(!run.join("maxrate.json").exists());

    let m = tmp.path().join("m");
    std::fs::create_dir(&m).unwrap();
    std::fs::write(m.join("maxrate.json"), "old").unwrap();
    std::fs::write(m.join("notes.txt"), "mine").unwrap();
    let o = maxrate(&m);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_ne!(
        std::fs::read_to_string(m.join("maxrate.json")).unwrap(),
        "old"
    );
    assert!(m.join("maxrate_trace.csv").exists() && m.join("notes.txt").exists());
}
