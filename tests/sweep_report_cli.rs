//! `isolane sweep` end to end on the CPU backend with spin models (tiny durations), and
//! `isolane report` over what it wrote; their argument errors (exit 2, nothing written).

mod common;

use common::{isolane, run_ok};

fn json(path: &std::path::Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn partition_and_concurrency_sweeps_write_run_folders_that_report_draws() {
    let dir = tempfile::tempdir().unwrap();
    let part = dir.path().join("part");
    run_ok(
        isolane()
            .args([
                "sweep",
                "partition",
                "--model",
                "spin:1ms",
                "--mechanism",
                "green",
                "--backend",
                "cpu",
                "--sizes",
                "8,16",
                "--duration-s",
                "0.15",
                "--warmup",
                "1",
                "-q",
                "--out",
            ])
            .arg(&part),
    );
    let idx = json(&part.join("sweep.json"));
    assert_eq!(idx["kind"], "partition");
    assert_eq!(
        idx["partition_applied"], false,
        "nothing is partitioned on the CPU"
    );
    let points = idx["points"].as_array().unwrap();
    assert_eq!(points.len(), 2);
    for (p, sms) in points.iter().zip([8, 16]) {
        assert_eq!(p["sms"], sms);
        assert_eq!(p["status"], "ok", "{p}");
        let run = part.join(p["dir"].as_str().unwrap());
        let s = json(&run.join("summary.json"));
        assert!(s["workloads"][0]["throughput_ips"].as_f64().unwrap() > 0.0);
        assert!(run.join("scenario.toml").is_file() && run.join("jobs").is_dir());
    }

    let conc = dir.path().join("conc");
    run_ok(
        isolane()
            .args([
                "sweep",
                "concurrency",
                "--model",
                "spin:1ms",
                "--workloads",
                "1,2",
                "--batch",
                "1,2",
                "--backend",
                "cpu",
                "--duration-s",
                "0.15",
                "--warmup",
                "1",
                "-q",
                "--out",
            ])
            .arg(&conc),
    );
    let idx = json(&conc.join("sweep.json"));
    let points = idx["points"].as_array().unwrap();
    assert_eq!(points.len(), 4);
    let w2b2 = points
        .iter()
        .find(|p| p["workloads"] == 2 && p["batch"] == 2)
        .unwrap();
    let s = json(
        &conc
            .join(w2b2["dir"].as_str().unwrap())
            .join("summary.json"),
    );
    assert_eq!(s["workloads"].as_array().unwrap().len(), 2);
    assert_eq!(s["workloads"][1]["batch"], 2);

    let html = dir.path().join("r.html");
    run_ok(
        isolane()
            .arg("report")
            .arg(&part)
            .arg(&conc)
            .arg("--out")
            .arg(&html),
    );
    let text = std::fs::read_to_string(&html).unwrap();
    assert!(text.contains("Partition sweeps") && text.contains("Concurrency sweeps"));
    // Throughput (partition), T/P and total (concurrency); no memory or power on the CPU.
    assert_eq!(text.matches("<svg").count(), 3);
}

#[test]
fn sweep_and_report_mistakes_exit_2_and_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("never");
    for (args, needle) in [
        (
            vec!["--mechanism", "green", "--sizes", "12"],
            "not a multiple of the green-context step of 8",
        ),
        (
            vec!["--mechanism", "green", "--sizes", "4"],
            "below the minimum",
        ),
        (
            vec!["--mechanism", "mps", "--sizes", "120"],
            "thread percentage",
        ),
    ] {
        let o = isolane()
            .args([
                "sweep",
                "partition",
                "--model",
                "spin:1ms",
                "--backend",
                "cpu",
            ])
            .args(&args)
            .arg("--out")
            .arg(&out)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(!out.exists());
    }
    let o = isolane()
        .args([
            "sweep",
            "concurrency",
            "--model",
            "nosuch",
            "--backend",
            "cpu",
            "--out",
        ])
        .arg(&out)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("sweep point w1-b01: workload[0].model") && err.contains("nosuch"),
        "{err}"
    );
    assert!(!out.exists());

    // A point's scenario is built as a value: a relative model path is the user's, relative
    // to where the sweep was started (not to a staging copy of the scenario).
    let o = isolane()
        .current_dir(dir.path())
        .args([
            "sweep",
            "concurrency",
            "--model",
            "missing.onnx",
            "--backend",
            "cpu",
            "--out",
        ])
        .arg(&out)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    let expected = dir.path().join("missing.onnx");
    assert!(
        err.contains("sweep point w1-b01: workload[0].model")
            && err.contains(&expected.display().to_string()),
        "{err}"
    );
    assert!(!out.exists());

    let o = isolane()
        .args([
            "sweep",
            "concurrency",
            "--model",
            "spin:1ms",
            "--precision",
            "fp8",
            "--backend",
            "cpu",
            "--out",
        ])
        .arg(&out)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--precision fp8: expected one of fp32, tf32, fp16, bf16"),
        "{err}"
    );
    assert!(!out.exists());

    let o = isolane()
        .arg("report")
        .arg(dir.path())
        .arg("--out")
        .arg(dir.path().join("r.html"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("not an isolane results folder"), "{err}");
    assert!(!dir.path().join("r.html").exists());
}

/// What the sampler writes (telemetry.csv, summary.json `telemetry`) is what the report reads.
#[test]
fn the_report_reads_what_the_telemetry_sampler_writes() {
    use isolane_telemetry::{Reading, Recording, Sample};
    let samples: Vec<Sample> = (0..20)
        .map(|k| Sample {
            t_ns: 1_000_000_000 + k * 50_000_000,
            reading: Reading {
                power_w: Some(200.0 + k as f64),
                energy_counter_mj: Some(10_000 * k as u64),
                sm_clock_mhz: Some(1980.0),
                temperature_c: Some(40.0),
                throttle_reasons: Some(4),
                memory_used_mib: Some(1000.0),
                sm_util_pct: Some(50.0),
                ..Reading::default()
            },
        })
        .collect();
    let rec = Recording {
        device: "Fake GPU".into(),
        source: "fake",
        period: std::time::Duration::from_millis(50),
        samples,
        cpu_ns: 1_000_000,
        wall_ns: 1_000_000_000,
        overruns: 0,
        refresh_every: Vec::new(),
    };
    let t = rec.summary(Some((1_000_000_000, 1_950_000_000)));
    let mut summary = isolane_core::results::RunSummary::new("run");
    summary.wall_s = 0.95;
    let mut w = isolane_core::results::WorkloadSummary::new("w", "m", 1);
    w.metrics.completed = 19;
    summary.workloads.push(w);
    isolane_telemetry::attach(&mut summary, &rec, &t);
    let dir = tempfile::tempdir().unwrap();
    isolane_core::results::write_json(&dir.path().join("summary.json"), &summary).unwrap();
    std::fs::write(dir.path().join("telemetry.csv"), rec.csv(1_000_000_000)).unwrap();
    let html = isolane_report::render_report(&[dir.path().to_path_buf()], "t").unwrap();
    for chart in ["power", "SM clock", "temperature", "SM utilisation (GPM)"] {
        assert!(
            html.contains(&format!(": {chart}</text>"))
                || html.contains(&format!(": {chart}\n</text>")),
            "{chart} chart missing"
        );
    }
    assert!(
        html.contains("sw_power_cap"),
        "throttle reasons in the summary table"
    );
    assert!(html.contains(">209.5<"), "mean power of the window");
    assert_eq!(summary.workloads[0].metrics.energy_j, Some(190.0));
}

/// A run on two GPUs: telemetry.csv's `gpu` column and summary.json's `telemetry_per_gpu`, as
/// the sampler writes them, read back by the report as a series and a table row per GPU.
#[test]
fn the_report_shows_each_gpu_of_a_run_on_two_gpus() {
    use isolane_telemetry::{GpuTelemetry, Reading, Recording, Sample};
    let gpu = |gpu: u32, watts: f64| {
        let samples: Vec<Sample> = (0..10)
            .map(|k| Sample {
                t_ns: 1_000_000_000 + k * 50_000_000,
                reading: Reading {
                    power_w: Some(watts),
                    sm_clock_mhz: Some(1980.0),
                    temperature_c: Some(40.0),
                    sm_util_pct: Some(50.0),
                    ..Reading::default()
                },
            })
            .collect();
        let recording = Recording {
            device: "Fake GPU".into(),
            source: "fake",
            period: std::time::Duration::from_millis(50),
            samples,
            cpu_ns: 1_000_000,
            wall_ns: 1_000_000_000,
            overruns: 0,
            refresh_every: Vec::new(),
        };
        let mut summary = recording.summary(None);
        summary.gpu = Some(gpu);
        GpuTelemetry {
            gpu,
            recording,
            summary,
        }
    };
    let gpus = [gpu(1, 120.0), gpu(0, 340.0)];
    let mut summary = isolane_core::results::RunSummary::new("run");
    summary.wall_s = 0.45;
    for name in ["a", "b"] {
        summary
            .workloads
            .push(isolane_core::results::WorkloadSummary::new(name, "m", 1));
    }
    let gpu_of = |name: &str| Some(if name == "a" { 1 } else { 0 });
    isolane_telemetry::attach_gpus(&mut summary, &gpus, &gpu_of);
    let dir = tempfile::tempdir().unwrap();
    isolane_core::results::write_json(&dir.path().join("summary.json"), &summary).unwrap();
    let csv = isolane_telemetry::run_csv(&gpus, 1_000_000_000);
    std::fs::write(dir.path().join("telemetry.csv"), csv).unwrap();
    let html = isolane_report::render_report(&[dir.path().to_path_buf()], "t").unwrap();
    assert!(html.contains(">GPU<"), "the summary table's GPU column");
    assert!(
        html.contains(">120.0<") && html.contains(">340.0<"),
        "each GPU's mean power"
    );
    for g in ["GPU 0", "GPU 1"] {
        assert!(html.contains(g), "a series of {g}");
    }
    let back: isolane_core::results::RunSummary =
        isolane_core::results::read_json(&dir.path().join("summary.json")).unwrap();
    assert_eq!(back.telemetry_per_gpu.len(), 2);
    assert_eq!(back.telemetry, None);
}
