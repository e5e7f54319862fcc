//! `isolane coexec` end to end on the cpu backend: spin and kernel: jobs and a small external
//! command, every GPU mechanism reported skipped with its reason, the speedup and slowdowns
//! recomputed here from the measured times in each run's summary.json, the CSV against the
//! JSON, the report's section, and the refusals (exit 2). No timing is asserted: the 2-core
//! CI machine only has to show that every cell ran and was reduced from its own measurements.

mod common;

use common::*;
use isolane_core::results::{read_json, CoexecIndex, Intensity, COEXEC_CSV_HEADER};

const JOBS: &str = r#"
[device]
backend = "cpu"

[[workload]]
name = "spin"
model = "spin:2ms"
rate_hz = "max"
jobs = 10
warmup_jobs = 1

[[workload]]
name = "triad"
model = "kernel:triad:256KiB"
rate_hz = "max"
jobs = 10
warmup_jobs = 1

[[workload]]
name = "sleep"
command = ["sh", "-c", "sleep 0.1"]
"#;

const GPU_WAYS: [&str; 5] = ["timeslice", "mps", "mps-provisioned", "green", "mig"];

fn study(dir: &std::path::Path, jobs: &str) -> std::process::Command {
    let file = scenario(dir, "jobs.toml", jobs);
    let mut c = isolane();
    c.arg("coexec")
        .arg(file)
        .args(["-q", "--out"])
        .arg(dir.join("out"));
    c
}

/// A workload's wall time in a run folder's summary.json.
fn wall(run: &std::path::Path, name: &str) -> f64 {
    f(&workload(&summary(run), name)["wall_s"])
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * b.abs().max(1.0)
}

#[test]
fn a_cpu_study_runs_every_pair_and_skips_the_gpu_mechanisms() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let o = run_ok(&mut study(tmp.path(), JOBS));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.lines().all(|l| l.chars().count() <= 80), "{stdout}");
    assert!(stdout.contains("no energy: the cpu backend"), "{stdout}");
    let index: CoexecIndex = read_json(&out.join("coexec.json")).unwrap();
    assert_eq!(index.backend, "cpu");
    assert_eq!(index.thresholds.dram_bw_util_pct, 40.0);
    assert!(index.energy_note.is_some());

    // Each job alone, its time the one its run measured.
    let names: Vec<&str> = index.jobs.iter().map(|j| j.name.as_str()).collect();
    assert_eq!(names, ["spin", "triad", "sleep"]);
    for j in &index.jobs {
        assert_eq!(j.status, "ok", "{j:?}");
        assert_eq!(j.wall_s, Some(wall(&out.join(&j.dir), &j.name)));
        assert_eq!(j.energy_j, None);
    }
    let sleep = &index.jobs[2];
    assert!(sleep.wall_s.unwrap() >= 0.1, "{sleep:?}");
    let triad = &index.jobs[1];
    assert_eq!(triad.intensity, Intensity::Memory);
    assert_eq!(triad.bytes_total, Some(triad.work.unwrap().bytes * 10));
    assert_eq!(index.jobs[0].intensity, Intensity::Unknown);

    // 3 pairs × (sequential + none + the 5 GPU ways).
    assert_eq!(index.cells.len(), 3 * 7);
    for pair in index.cells.chunks(7) {
        let alone = |n: &str| {
            index
                .jobs
                .iter()
                .find(|j| j.name == n)
                .unwrap()
                .wall_s
                .unwrap()
        };
        let (a, b) = (alone(&pair[0].a), alone(&pair[0].b));
        assert_eq!(pair[0].mechanism, "sequential");
        assert!(close(pair[0].m.makespan_s.unwrap(), a + b));
        let none = &pair[1];
        assert_eq!(
            (none.mechanism.as_str(), none.status.as_str()),
            ("none", "ok")
        );
        let run = out.join(&none.dir);
        let (wa, wb) = (wall(&run, &none.a), wall(&run, &none.b));
        let m = &none.m;
        assert_eq!((m.wall_a_s, m.wall_b_s), (Some(wa), Some(wb)));
        assert_eq!(m.makespan_s, Some(wa.max(wb)));
        assert!(close(m.sequential_s.unwrap(), a + b));
        assert!(close(m.speedup.unwrap(), (a + b) / wa.max(wb)));
        assert!(close(m.slowdown_a.unwrap(), wa / a));
        assert!(close(m.slowdown_b.unwrap(), wb / b));
        assert_eq!(m.energy_j, None);
        for (c, way) in pair[2..].iter().zip(GPU_WAYS) {
            assert_eq!((c.mechanism.as_str(), c.status.as_str()), (way, "skipped"));
            assert!(
                c.reason.as_deref().unwrap().contains("needs a GPU"),
                "{c:?}"
            );
            assert_eq!(c.m.speedup, None);
        }
    }
    let triad_sleep = &index.cells[14];
    assert_eq!(
        (triad_sleep.a.as_str(), triad_sleep.b.as_str()),
        ("triad", "sleep")
    );

    // The CSV has the JSON's cells, its numbers to 6 decimals.
    let csv = std::fs::read_to_string(out.join("coexec.csv")).unwrap();
    let mut lines = csv.lines();
    assert_eq!(lines.next(), Some(COEXEC_CSV_HEADER));
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), index.cells.len());
    let col = |name: &str| {
        COEXEC_CSV_HEADER
            .split(',')
            .position(|h| h == name)
            .unwrap()
    };
    let none = &rows[1];
    assert_eq!(none[col("mechanism")], "none");
    let speedup: f64 = none[col("speedup")].parse().unwrap();
    assert!((speedup - index.cells[1].m.speedup.unwrap()).abs() < 1e-6);
    assert_eq!(none[col("energy_j")], "");

    let html = tmp.path().join("r.html");
    run_ok(isolane().arg("report").arg(&out).arg("-o").arg(&html));
    let page = std::fs::read_to_string(html).unwrap();
    assert!(page.contains("Co-execution: out (cpu)"));
    assert!(page.contains("speedup of running the pair at once"));
    assert!(page.contains("wall time at once over its wall time alone"));
}

#[test]
fn only_the_pairs_and_mechanisms_given_run() {
    let tmp = tempfile::tempdir().unwrap();
    run_ok(study(tmp.path(), JOBS).args(["--pairs", "sleep:spin", "--mechanisms", "none,green"]));
    let index: CoexecIndex = read_json(&tmp.path().join("out/coexec.json")).unwrap();
    let cells: Vec<(&str, &str, &str)> = index
        .cells
        .iter()
        .map(|c| (c.a.as_str(), c.b.as_str(), c.mechanism.as_str()))
        .collect();
    assert_eq!(
        cells,
        [
            ("spin", "sleep", "sequential"),
            ("spin", "sleep", "none"),
            ("spin", "sleep", "green")
        ]
    );
    // Only the jobs of a pair ran alone.
    let names: Vec<&str> = index.jobs.iter().map(|j| j.name.as_str()).collect();
    assert_eq!(names, ["spin", "sleep"]);
    assert!(!tmp.path().join("out/alone/triad").exists());
}

#[test]
fn mistakes_are_refused_with_exit_2_and_run_nothing() {
    // A corrupt model file failed its job's runs one by one (exit 1): found before any run now.
    let bad = tempfile::tempdir().unwrap();
    let bad_model = bad.path().join("bad.onnx");
    std::fs::write(&bad_model, [0xffu8; 64]).unwrap();
    let cases: [(String, &[&str], &str); 7] = [
        (
            JOBS.replacen("\"spin:2ms\"", &format!("{:?}", bad_model), 1),
            &[],
            "is not a valid ONNX model",
        ),
        (
            JOBS.replacen("jobs = 10", "duration_s = 1", 1),
            &[],
            "workload \"spin\": a co-execution job is a fixed amount of work",
        ),
        (
            format!("{JOBS}duration_s = 1\n"),
            &[],
            "workload \"sleep\": a command job must run to completion",
        ),
        (JOBS.into(), &["--pairs", "spin:nope"], "--pairs spin:nope"),
        (
            JOBS.into(),
            &["--thread-pct", "spin=0"],
            "--thread-pct spin=0",
        ),
        (
            JOBS.into(),
            &["--mig-profiles", "x=1g.10gb"],
            "--mig-profiles x=1g.10gb",
        ),
        (
            JOBS.into(),
            &["--mechanisms", "nvlink"],
            "expected one of none, timeslice",
        ),
    ];
    for (jobs, args, want) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let o = study(tmp.path(), &jobs).args(args).output().unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(want), "{args:?}: {stderr}");
        assert!(!tmp.path().join("out").exists(), "{args:?}");
    }
}

#[test]
fn a_failing_job_fails_its_cells_with_the_reason_and_exit_1() {
    let tmp = tempfile::tempdir().unwrap();
    let jobs = JOBS.replace("sleep 0.1", "exit 3");
    let o = study(tmp.path(), &jobs)
        .args(["--pairs", "spin:sleep", "--mechanisms", "none"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let index: CoexecIndex = read_json(&tmp.path().join("out/coexec.json")).unwrap();
    assert_eq!(index.jobs[1].status, "failed");
    assert_eq!(index.jobs[1].wall_s, None);
    for c in &index.cells {
        assert_eq!(c.status, "failed", "{c:?}");
        assert_eq!((c.m.speedup, c.m.slowdown_b), (None, None));
    }
    let none = &index.cells[1];
    assert!(
        none.reason.as_deref().unwrap().contains("status 3"),
        "{none:?}"
    );
    // The job that finished keeps its own measured slowdown.
    assert!(none.m.slowdown_a.is_some());
}

/// On the GPU machine (`scripts/gpu-test.sh run coexec_cli`): a triad, a GEMM and a command,
/// every mechanism. Each concurrent cell of the kernels runs and has its speedup and energy
/// against sequential; green with the command and mig (no profiles) are skipped by reason.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_gpu_study_runs_each_mechanism_and_measures_energy() {
    let jobs = r#"
[device]
backend = "cuda"
mechanism = "timeslice"

[[workload]]
name = "triad"
model = "kernel:triad:256MiB"
rate_hz = "max"
jobs = 2000
warmup_jobs = 10

[[workload]]
name = "gemm"
model = "kernel:gemm:4096:fp16"
rate_hz = "max"
jobs = 1000
warmup_jobs = 10

[[workload]]
name = "sleep"
command = ["sh", "-c", "sleep 0.2"]
"#;
    let tmp = tempfile::tempdir().unwrap();
    run_ok(&mut study(tmp.path(), jobs));
    let index: CoexecIndex = read_json(&tmp.path().join("out/coexec.json")).unwrap();
    assert_eq!(index.backend, "cuda");
    for j in &index.jobs {
        assert_eq!(j.status, "ok", "{j:?}");
        assert!(j.energy_j.unwrap() > 0.0, "{j:?}");
    }
    let cell = |a: &str, b: &str, m: &str| {
        index
            .cells
            .iter()
            .find(|c| c.a == a && c.b == b && c.mechanism == m)
            .unwrap_or_else(|| panic!("no cell {a} + {b} {m}"))
    };
    for m in ["timeslice", "mps", "mps-provisioned", "green"] {
        let c = cell("triad", "gemm", m);
        assert_eq!(c.status, "ok", "{c:?}");
        assert!(c.m.speedup.unwrap() > 0.0, "{c:?}");
        assert!(c.m.energy_vs_sequential.unwrap() > 0.0, "{c:?}");
    }
    let green = cell("triad", "sleep", "green");
    assert_eq!(green.status, "skipped");
    assert!(green
        .reason
        .as_deref()
        .unwrap()
        .contains("external command"));
    assert_eq!(cell("triad", "sleep", "mps").status, "ok");
    let mig = cell("triad", "gemm", "mig");
    assert_eq!(mig.status, "skipped");
    assert!(mig.reason.as_deref().unwrap().contains("MIG"), "{mig:?}");
}
