//! `isolane interference` end to end on the cpu backend (spin and kernel: models), its files,
//! the report's heatmap, and its refusals. No timing is asserted: the 2-core CI machine only
//! has to show that every cell ran and was reduced.

mod common;

use common::*;
use isolane_core::results::{read_json, CellKind, InterferenceIndex};

fn matrix(out: &std::path::Path) -> std::process::Command {
    let mut c = isolane();
    c.args([
        "interference",
        "--backend",
        "cpu",
        "--duration-s",
        "0.3",
        "--warmup",
        "2",
        "-q",
        "--out",
    ])
    .arg(out);
    c
}

#[test]
fn a_cpu_matrix_runs_every_cell_and_the_report_draws_it() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("m");
    let o = run_ok(matrix(&out).args([
        "--victims",
        "spin:1ms,kernel:triad:1MiB",
        "--neighbours",
        "kernel:gemm:64",
        "--victim-load",
        "0.5",
        "--neighbour-alone",
    ]));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.lines().all(|l| l.chars().count() <= 80), "{stdout}");
    let mut index: InterferenceIndex = read_json(&out.join("interference.json")).unwrap();
    assert_eq!(index.mechanism, "none");
    assert_eq!(index.victim_load, Some(0.5));
    // The neighbour alone, then per victim: capacity, alone, one pair.
    let kinds: Vec<CellKind> = index.cells.iter().map(|c| c.kind).collect();
    use CellKind::*;
    assert_eq!(
        kinds,
        [Neighbour, Capacity, Alone, Pair, Capacity, Alone, Pair]
    );
    let neighbour = index.cells.remove(0);
    assert!(neighbour.neighbour_jobs_per_s.unwrap() > 0.0);
    for c in &index.cells {
        assert_eq!(c.status, "ok", "{c:?}");
        assert!(c.exec_ms.jobs > 0, "{c:?}");
        assert!(out.join(&c.dir).join("summary.json").is_file());
    }
    for v in index.cells.chunks(3) {
        let (cap, alone, pair) = (&v[0], &v[1], &v[2]);
        // The rate is half the measured capacity, and the pair is measured at the same rate.
        let capacity = cap.victim_jobs_per_s.unwrap();
        let rate = alone.victim_rate_hz.unwrap();
        assert!((rate - 0.5 * capacity).abs() < 1e-9 * capacity);
        assert_eq!(pair.victim_rate_hz, Some(rate));
        assert_eq!(pair.neighbour.as_deref(), Some("kernel:gemm:64"));
        assert_eq!(pair.alone_p99_ms, alone.exec_ms.p99);
        assert!(pair.stretch_p50.unwrap() > 0.0 && pair.stretch_p99.unwrap() > 0.0);
        assert!(pair.neighbour_jobs_per_s.unwrap() > 0.0);
        assert_eq!(
            pair.neighbour_alone_jobs_per_s,
            neighbour.neighbour_jobs_per_s
        );
        assert!(
            pair.neighbour_tflop_per_s.unwrap() > 0.0,
            "a gemm neighbour"
        );
        assert!(out.join(&pair.dir).join("jobs/neighbour.csv").is_file());
        // A kernel: workload's summary states its work per job.
        let s = summary(&out.join(&pair.dir));
        let work = &workload(&s, "neighbour")["work"];
        assert_eq!(work["flops"], 2 * 64 * 64 * 64, "{s}");
    }
    let triad_alone = &index.cells[4];
    assert!(triad_alone.victim_gb_per_s.unwrap() > 0.0);
    let csv = std::fs::read_to_string(out.join("interference.csv")).unwrap();
    assert_eq!(
        csv.lines().count(),
        2 + index.cells.len(),
        "header + the 7 cells"
    );

    let report = tmp.path().join("r.html");
    run_ok(isolane().arg("report").arg(&out).arg("--out").arg(&report));
    let html = std::fs::read_to_string(&report).unwrap();
    assert!(html.contains("Interference: m (none)"));
    assert_eq!(html.matches("<rect").count(), 2, "2 victims × 1 neighbour");
}

#[test]
fn a_fixed_rate_needs_no_capacity_cell() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("m");
    run_ok(matrix(&out).args(["--victims", "spin:1ms", "--victim-rate-hz", "100"]));
    let index: InterferenceIndex = read_json(&out.join("interference.json")).unwrap();
    let kinds: Vec<CellKind> = index.cells.iter().map(|c| c.kind).collect();
    assert_eq!(kinds, [CellKind::Alone, CellKind::Pair]);
    assert_eq!(index.cells[1].neighbour.as_deref(), Some("spin:1ms"));
    assert_eq!(index.cells[1].victim_rate_hz, Some(100.0));
}

/// A corrupt model among the victims failed its cells while the matrix ran (exit 1, the
/// folder written): the user's file is found before any cell now, exit 2 and no output.
#[test]
fn a_corrupt_victim_model_is_refused_before_any_cell() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("m");
    let bad = tmp.path().join("bad.onnx");
    std::fs::write(&bad, [0xffu8; 64]).unwrap();
    let victims = format!("spin:1ms,{}", bad.display());
    let o = matrix(&out)
        .args(["--victims", &victims, "--neighbours", "spin:1ms"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&bad.display().to_string()) && stderr.contains("not a valid ONNX model"),
        "{stderr}"
    );
    assert!(!out.exists(), "a refused matrix created its output folder");
}

#[test]
fn mistakes_name_the_flag_run_nothing_and_exit_2() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("m");
    for (args, needles) in [
        (
            vec!["--victims", "spin:1ms", "--mechanism", "green"],
            vec!["--mechanism green", "--backend cuda"],
        ),
        (
            vec!["--victims", "kernel:triad:5MB"],
            vec!["kernel:triad:5MB", "size", "KiB, MiB or GiB"],
        ),
        (
            vec!["--victims", "kernel:gemm:64:int8"],
            vec!["precision", "fp16, bf16, tf32, fp32"],
        ),
        (
            vec!["--victims", "spin:1ms", "--victim-load", "0"],
            vec!["--victim-load 0", "<= 1"],
        ),
        (
            vec!["--victims", "spin:1ms", "--neighbour-sizes", "8"],
            vec!["--mechanism none", "--neighbour-sizes"],
        ),
        // Took as any number > 0: the cell then failed on 1024 EiB of job records, exit 1.
        (
            vec!["--victims", "spin:1ms", "--victim-rate-hz", "1e300"],
            vec!["--victim-rate-hz", "one job per ns"],
        ),
    ] {
        let o = matrix(&out).args(&args).output().unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {stderr}");
        for n in needles {
            assert!(stderr.contains(n), "{args:?}: expected {n:?} in {stderr}");
        }
        assert!(!out.exists(), "{args:?} created the output folder");
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_green_matrix_on_the_gpu_reports_stretch_and_gpm_metrics() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("m");
    run_ok(
        isolane()
            .args([
                "interference",
                "--backend",
                "cuda",
                "--mechanism",
                "green",
                "--victim-size",
                "16",
                "--neighbour-sizes",
                "16",
                "--victims",
                "kernel:gemm:1024:fp16",
                "--neighbours",
                "kernel:triad:256MiB,kernel:l2:8MiB",
                "--duration-s",
                "1",
                "-q",
                "--out",
            ])
            .arg(&out),
    );
    let index: InterferenceIndex = read_json(&out.join("interference.json")).unwrap();
    assert_eq!(index.cells.len(), 4, "capacity, alone, 2 pairs");
    for c in &index.cells {
        assert_eq!(c.status, "ok", "{c:?}");
    }
    let pair = &index.cells[2];
    assert!(pair.stretch_p99.is_some());
    assert!(pair.neighbour_gb_per_s.unwrap() > 10.0, "{pair:?}");
    // GPM metrics exist on Hopper and later (the H100 this test is run on).
    assert!(pair.dram_bw_util_pct.is_some(), "{pair:?}");
}
