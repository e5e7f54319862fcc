use super::*;
use isolane_core::results::{RunStatus, RunSummary};
use isolane_core::spec::KernelWork;

const CPU_JOBS: &str = r#"
[device]
backend = "cpu"

[[workload]]
name = "a"
model = "spin:1ms"
rate_hz = "max"
jobs = 5

[[workload]]
name = "b"
model = "kernel:triad:64KiB"
rate_hz = "max"
jobs = 5

[[workload]]
name = "c"
command = ["sh", "-c", "sleep 0.1"]
"#;

fn scenario(text: &str) -> Scenario {
    let models: Vec<&str> = Vec::new();
    Scenario::from_toml_str(text, "jobs.toml", &models).unwrap()
}

fn config(text: &str) -> StudyConfig {
    let base = scenario(text);
    let n = base.workloads.len();
    StudyConfig {
        jobs_file: "jobs.toml".into(),
        base,
        pairs: vec![(0, 1)],
        ways: ALL_WAYS.to_vec(),
        thread_pct: vec![30; n],
        green_sms: vec![64; n],
    }
}

fn gpu_jobs() -> String {
    CPU_JOBS.replace(
        "backend = \"cpu\"",
        "backend = \"cuda\"\nmechanism = \"timeslice\"",
    )
}

/// A committed run's summary, its workloads renamed and timed as a test needs.
fn summary(walls: &[(&str, f64)], energy_j: Option<f64>) -> RunSummary {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../results/h100/d-partition-sweep/convnext_large-green/sms-128/summary.json"
    );
    let mut s: RunSummary = isolane_core::results::read_json(path.as_ref()).unwrap();
    let w0 = s.workloads[0].clone();
    s.workloads = walls
        .iter()
        .map(|&(name, wall)| {
            let mut w = w0.clone();
            w.name = name.into();
            w.wall_s = wall;
            w.status = RunStatus::Ok;
            w
        })
        .collect();
    if let Some(t) = s.telemetry.as_mut() {
        t.energy_j = energy_j;
    }
    s
}

fn job(name: &str, wall_s: Option<f64>, energy_j: Option<f64>) -> CoexecJob {
    CoexecJob {
        name: name.into(),
        what: "spin:1ms".into(),
        dir: format!("alone/{name}"),
        status: "ok".into(),
        error: None,
        wall_s,
        energy_j,
        dram_bw_util_pct: None,
        work: None,
        bytes_total: None,
        intensity: Intensity::Unknown,
    }
}

#[test]
fn speedup_and_slowdowns_come_from_the_measured_times() {
    // Alone 2 s and 3 s: one after the other 5 s. At once 3 s and 4 s: makespan 4 s.
    let jobs = [
        job("a", Some(2.0), Some(100.0)),
        job("b", Some(3.0), Some(150.0)),
    ];
    let mut c = cell(&jobs, (0, 1), "mps");
    fill_concurrent(
        &mut c,
        &summary(&[("a", 3.0), ("b", 4.0)], Some(200.0)),
        (&jobs[0], &jobs[1]),
    );
    let m = &c.m;
    assert_eq!(m.makespan_s, Some(4.0));
    assert_eq!(m.sequential_s, Some(5.0));
    assert_eq!(m.speedup, Some(1.25));
    assert_eq!(m.slowdown_a, Some(1.5));
    assert!((m.slowdown_b.unwrap() - 4.0 / 3.0).abs() < 1e-12);
    assert_eq!(m.sequential_energy_j, Some(250.0));
    assert_eq!(m.energy_vs_sequential, Some(0.8));
}

#[test]
fn the_sequential_cell_adds_the_alone_runs() {
    let jobs = [job("a", Some(2.0), None), job("b", Some(3.0), None)];
    let c = sequential_cell(&jobs, (0, 1));
    assert_eq!(c.status, "ok");
    assert_eq!(c.m.makespan_s, Some(5.0));
    assert_eq!(c.m.speedup, Some(1.0));
    assert_eq!(c.m.energy_j, None);
    let failed = [job("a", None, None), job("b", Some(3.0), None)];
    let c = sequential_cell(&failed, (0, 1));
    assert_eq!((c.status.as_str(), c.m.speedup), ("failed", None));
}

#[test]
fn a_job_that_did_not_finish_has_no_time_to_compare() {
    let jobs = [job("a", Some(2.0), None), job("b", Some(3.0), None)];
    let mut s = summary(&[("a", 3.0), ("b", 4.0)], None);
    s.workloads[1].status = RunStatus::Failed;
    let mut c = cell(&jobs, (0, 1), "timeslice");
    fill_concurrent(&mut c, &s, (&jobs[0], &jobs[1]));
    assert_eq!(c.m.slowdown_a, Some(1.5));
    assert_eq!(
        (c.m.slowdown_b, c.m.makespan_s, c.m.speedup),
        (None, None, None)
    );
    assert_eq!(c.m.energy_vs_sequential, None);
}

#[test]
fn intensity_thresholds() {
    assert_eq!(intensity(Some(40.0), None), Intensity::Memory);
    assert_eq!(intensity(Some(39.9), None), Intensity::Compute);
    // Measured DRAM use wins over the known work.
    let triad = KernelWork {
        bytes: 24,
        flops: 2,
    };
    assert_eq!(intensity(Some(10.0), Some(&triad)), Intensity::Compute);
    assert_eq!(intensity(None, Some(&triad)), Intensity::Memory);
    // 4096² fp16 GEMM: 2·n³ FLOPs over 3·n²·2 bytes ≈ 1365 FLOP/B.
    let n = 4096u64;
    let gemm = KernelWork {
        bytes: 6 * n * n,
        flops: 2 * n * n * n,
    };
    assert_eq!(intensity(None, Some(&gemm)), Intensity::Compute);
    let edge = KernelWork { bytes: 1, flops: 4 };
    assert_eq!(intensity(None, Some(&edge)), Intensity::Compute);
    assert_eq!(intensity(None, None), Intensity::Unknown);
    use Intensity::*;
    assert_eq!(pair_class(Memory, Memory), PairClass::BothMemory);
    assert_eq!(pair_class(Memory, Compute), PairClass::Mixed);
    assert_eq!(pair_class(Compute, Compute), PairClass::BothCompute);
    assert_eq!(pair_class(Compute, Unknown), PairClass::Unknown);
}

#[test]
fn pairs_are_all_or_the_ones_given() {
    let names = ["a", "b", "c"];
    assert_eq!(pairs(&names, &[]).unwrap(), vec![(0, 1), (0, 2), (1, 2)]);
    assert_eq!(pairs(&names, &["c:a".into()]).unwrap(), vec![(0, 2)]);
    for bad in ["a:a", "a:x", "ab"] {
        let e = pairs(&names, &[bad.into()]).unwrap_err().to_string();
        assert!(e.contains(bad) && e.contains("a, b, c"), "{e}");
    }
}

#[test]
fn splits_default_and_name_their_flag() {
    let names = ["a", "b"];
    let s = split(
        "thread-pct",
        &names,
        &["b=70".into()],
        50,
        1..=100,
        "from 1 to 100",
    );
    assert_eq!(s.unwrap(), vec![50, 70]);
    for bad in ["b=0", "b=101", "x=5", "b"] {
        let e = split(
            "thread-pct",
            &names,
            &[bad.into()],
            50,
            1..=100,
            "from 1 to 100",
        );
        assert!(e.unwrap_err().to_string().contains("--thread-pct"));
    }
}

#[test]
fn jobs_must_be_fixed_work() {
    let s = scenario(CPU_JOBS);
    assert_eq!(check_jobs("f", &s), Ok(()));
    let timed = scenario(&CPU_JOBS.replacen("jobs = 5", "duration_s = 1", 1));
    assert!(matches!(
        check_jobs("f", &timed),
        Err(CoexecError::NotFixedWork { .. })
    ));
    let stopped = scenario(&format!("{CPU_JOBS}duration_s = 2\n"));
    assert!(matches!(
        check_jobs("f", &stopped),
        Err(CoexecError::CommandStopped { .. })
    ));
    let mut one = s.clone();
    one.workloads.truncate(1);
    assert!(matches!(
        check_jobs("f", &one),
        Err(CoexecError::TooFewJobs { found: 1, .. })
    ));
}

#[test]
fn gpu_ways_are_skipped_on_the_cpu_with_the_reason() {
    let c = config(CPU_JOBS);
    let s = c.concurrent_scenario((0, 1), Way::None).unwrap();
    assert_eq!(s.workloads.len(), 2);
    assert_eq!(s.device.mechanism, Mechanism::None);
    for way in [
        Way::Timeslice,
        Way::Mps,
        Way::MpsProvisioned,
        Way::Green,
        Way::Mig,
    ] {
        let e = c.concurrent_scenario((0, 1), way).unwrap_err();
        assert!(e.contains("needs a GPU"), "{e}");
    }
}

#[test]
fn each_way_gets_its_partitions_on_a_gpu() {
    let c = config(&gpu_jobs());
    let s = c.concurrent_scenario((0, 1), Way::MpsProvisioned).unwrap();
    assert_eq!(s.device.mechanism, Mechanism::Mps);
    assert_eq!(s.workloads[0].partition.thread_pct, Some(30));
    assert_eq!(s.workloads[0].host, Host::Process);
    let s = c.concurrent_scenario((0, 1), Way::Mps).unwrap();
    assert_eq!(partition_words(&s, 1).as_deref(), Some("100 %"));
    // Both at 100 %: admission must allow the oversubscription of this cell only.
    assert_eq!(Way::Mps.mps_thread_budget_pct(), 200);
    assert_eq!(Way::MpsProvisioned.mps_thread_budget_pct(), 100);
    let s = c.concurrent_scenario((0, 1), Way::Green).unwrap();
    assert_eq!(
        (s.workloads[1].partition.sms, s.workloads[1].host),
        (Some(64), Host::Thread)
    );
    let s = c.concurrent_scenario((0, 1), Way::Timeslice).unwrap();
    assert_eq!(partition_words(&s, 0), None);
    let e = c.concurrent_scenario((0, 2), Way::Green).unwrap_err();
    assert!(e.contains("c is an external command"), "{e}");
    let e = c.concurrent_scenario((0, 1), Way::Mig).unwrap_err();
    assert!(e.contains("--mig-profiles a="), "{e}");
    let alone = c.alone_scenario(2);
    assert_eq!(alone.device.mechanism, Mechanism::Timeslice);
    assert_eq!(alone.workloads[0].name, "c");
}

#[test]
fn default_ways_depend_on_the_backend_and_repeats_run_once() {
    assert_eq!(ways(Backend::Cpu, &[]), ALL_WAYS.to_vec());
    assert_eq!(ways(Backend::Cuda, &[]), ALL_WAYS[1..].to_vec());
    let given = [Way::Green, Way::Mps, Way::Green];
    assert_eq!(ways(Backend::Cuda, &given), vec![Way::Green, Way::Mps]);
}
