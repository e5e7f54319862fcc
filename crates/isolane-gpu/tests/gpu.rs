//! GPU tests: run on the H100 with `scripts/gpu-test.sh` (`--ignored --test-threads=1`).
//! Each prints its measured numbers, then asserts the acceptance bounds of issue 5. None of them
//! passes by finding no GPU: no GPU is a failure.

use std::collections::BTreeSet;
use std::io::BufRead as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use isolane_core::spec::{NoBuiltinModels, Scenario};
use isolane_gpu::green::GreenPartitioning;
use isolane_gpu::mps::{self, MpsDaemon, MpsOptions};
use isolane_gpu::probe::{ProbeConfig, ProbeResult};
use isolane_gpu::verify::{
    self, measure_agents, ProbeAgent, ProcessAgent, ThreadAgent, ThreadTarget, VerifyOptions,
    WorkerCommand, WORKER_GPU_ENV,
};

const MEASURE: Duration = Duration::from_secs(1);

/// Not a test: when this binary is started as a probe worker (by the MPS and verify tests),
/// this runs the worker and exits the process. Otherwise it does nothing.
#[test]
fn helper_probe_worker_entry() {
    if let Some(gpu) = std::env::var_os(WORKER_GPU_ENV) {
        let gpu: u32 = gpu.to_string_lossy().parse().unwrap_or(0);
        std::process::exit(verify::worker_main(gpu));
    }
}

/// This test binary as a probe worker (no dependency on the `isolane` binary's wiring).
fn test_worker() -> WorkerCommand {
    WorkerCommand {
        program: std::env::current_exe().expect("test binary path"),
        args: vec![
            "--exact".into(),
            "helper_probe_worker_entry".into(),
            "--nocapture".into(),
            "--test-threads=1".into(),
        ],
        env: Vec::new(),
        gpu_arg: false,
    }
}

fn print_result(what: &str, r: &ProbeResult) {
    println!(
        "{what}: {:.0} blocks/s, {:.0} GFLOP/s, {} items in {:.3} s, {} SMs seen, grid {}",
        r.blocks_per_s,
        r.gflops,
        r.items,
        r.elapsed_s,
        r.sm_ids_seen.len(),
        r.grid_blocks
    );
}

fn whole_gpu() -> ProbeResult {
    let mut a = ThreadAgent::spawn(
        "whole-gpu",
        ThreadTarget::Whole { device_index: 0 },
        ProbeConfig::default(),
    )
    .expect("probe on the whole GPU");
    let r = a.measure(MEASURE).expect("measure whole GPU");
    print_result("whole GPU", &r);
    r
}

fn green_agents(sizes: &[u32]) -> (Vec<Box<dyn ProbeAgent>>, Vec<u32>) {
    let parts = GreenPartitioning::create(0, sizes).expect("green partitioning");
    println!(
        "split plan: {:?}, driver SM info: {:?}",
        parts.plan(),
        parts.sm_info()
    );
    let mut granted = Vec::new();
    let agents = parts
        .into_groups()
        .into_iter()
        .map(|g| {
            granted.push(g.granted_sms());
            let label = format!("group{}", g.index());
            Box::new(
                ThreadAgent::spawn(
                    label,
                    ThreadTarget::Green {
                        device_index: 0,
                        group: g,
                    },
                    ProbeConfig::default(),
                )
                .expect("probe thread"),
            ) as Box<dyn ProbeAgent>
        })
        .collect();
    (agents, granted)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn discovery_sees_the_h100() {
    let devs = isolane_gpu::list_devices().expect("a CUDA device");
    for d in &devs {
        println!("{}", serde_json::to_string_pretty(d).unwrap());
    }
    let d = &devs[0];
    assert_eq!(d.sm_count, 132, "SM count");
    assert_eq!(d.compute_capability, (9, 0));
    assert!(d.memory_mib > 79_000, "memory {} MiB", d.memory_mib);
    assert!(d.uuid.starts_with("GPU-"));
    assert_eq!(d.device_model, "h100-sxm");
    let g = d.green_rules.expect("green rules");
    assert_eq!((g.min_sms, g.step_sms), (8, 8));
    assert!(d.green_driver.is_some(), "driver supports green contexts");
    // MIG must stay off on this machine.
    assert_eq!(d.mig.current, Some(false));
    println!("MPS: {:?}", mps::status());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn green_16_groups_of_8_sms_are_granted_8_each_on_disjoint_sms() {
    let parts = GreenPartitioning::create(0, &[8; 16]).expect("16 × 8 SMs");
    let infos = parts.infos();
    println!("{infos:?}");
    assert_eq!(infos.len(), 16);
    for i in &infos {
        assert_eq!(i.granted_sms, 8, "group {}", i.group);
    }
    // Each group alone: the SMs it ran on. Disjoint sets prove the split.
    let (mut agents, _) = {
        drop(parts);
        green_agents(&[8; 16])
    };
    let mut seen: Vec<BTreeSet<u32>> = Vec::new();
    for a in agents.iter_mut() {
        let r = a.measure(Duration::from_millis(500)).expect("measure");
        print_result(a.label(), &r);
        println!("  SM ids: {:?}", r.sm_ids_seen);
        seen.push(r.sm_ids_seen.iter().copied().collect());
    }
    for (i, s) in seen.iter().enumerate() {
        assert_eq!(s.len(), 8, "group {i} ran on {s:?}");
        for (j, t) in seen.iter().enumerate().skip(i + 1) {
            assert!(
                s.is_disjoint(t),
                "groups {i} and {j} share SMs: {s:?} {t:?}"
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn green_8_sm_group_gets_its_share_and_loses_little_beside_15_saturating_neighbours() {
    let whole = whole_gpu();
    let (mut agents, granted) = green_agents(&[8; 16]);
    assert!(granted.iter().all(|&g| g == 8), "granted {granted:?}");
    let alone = agents[0].measure(MEASURE).expect("alone");
    print_result("group0 alone", &alone);
    for a in agents.iter_mut().skip(1) {
        a.start_saturate().expect("saturate");
    }
    std::thread::sleep(Duration::from_millis(300));
    let beside = agents[0].measure(MEASURE).expect("beside");
    for a in agents.iter_mut().skip(1) {
        a.stop_saturate().expect("stop");
    }
    print_result("group0 beside 15 saturating", &beside);
    let share = alone.blocks_per_s / whole.blocks_per_s;
    let expected = 8.0 / 132.0;
    let interference = 1.0 - beside.blocks_per_s / alone.blocks_per_s;
    println!(
        "share {:.4} (expected {:.4}, ratio {:.3}); interference {:.2}%",
        share,
        expected,
        share / expected,
        interference * 100.0
    );
    assert!(
        (share / expected - 1.0).abs() < 0.10,
        "an 8-SM group achieved {share:.4} of the GPU, expected {expected:.4} ± 10%"
    );
    assert!(
        interference < 0.05,
        "lost {:.2}% beside 15 saturating neighbours (limit 5%)",
        interference * 100.0
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn green_4_groups_of_32_sms() {
    let whole = whole_gpu();
    let (mut agents, granted) = green_agents(&[32; 4]);
    println!("granted {granted:?}");
    assert!(granted.iter().all(|&g| g == 32), "granted {granted:?}");
    let rows = measure_agents(&mut agents, MEASURE, true).expect("measure");
    let expected = 32.0 / 132.0;
    for (i, (alone, beside)) in rows.iter().enumerate() {
        let beside = beside.as_ref().expect("beside");
        let share = alone.blocks_per_s / whole.blocks_per_s;
        let interference = 1.0 - beside.blocks_per_s / alone.blocks_per_s;
        println!(
            "group{i}: alone {:.0} blocks/s (share {:.4}, expected {:.4}), beside {:.0} \
             (interference {:.2}%), SMs seen {}",
            alone.blocks_per_s,
            share,
            expected,
            beside.blocks_per_s,
            interference * 100.0,
            alone.sm_ids_seen.len()
        );
        assert!(
            (share / expected - 1.0).abs() < 0.10,
            "group{i} share {share:.4}"
        );
        assert!(
            interference < 0.05,
            "group{i} interference {:.2}%",
            interference * 100.0
        );
    }
}

fn our_mps_processes(pipe: &std::path::Path) -> Vec<i32> {
    mps::mps_processes()
        .into_iter()
        .filter(|p| p.pipe_dir.as_deref() == Some(pipe))
        .map(|p| p.pid)
        .collect()
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn mps_4_clients_at_25_percent_run_at_once_and_the_daemon_goes_away() {
    isolane_gpu::list_devices().expect("a CUDA device");
    let whole = {
        let mut a = ProcessAgent::spawn("whole-gpu", &test_worker(), 0, &[]).expect("worker");
        let r = a.measure(MEASURE).expect("whole GPU");
        print_result("whole GPU (no MPS)", &r);
        r
    };
    let daemon = MpsDaemon::start(0, &MpsOptions::default()).expect("private MPS daemon");
    let pipe = daemon.pipe_dir().to_path_buf();
    println!(
        "daemon: pipe {}, log {}",
        pipe.display(),
        daemon.log_dir().display()
    );
    let mut agents: Vec<Box<dyn ProbeAgent>> = (0..4)
        .map(|i| {
            let env = daemon.client_env(25, None);
            Box::new(
                ProcessAgent::spawn(
                    format!("client{i}"),
                    &test_worker(),
                    daemon.client_device_index(),
                    &env,
                )
                .expect("MPS client"),
            ) as Box<dyn ProbeAgent>
        })
        .collect();
    println!("MPS processes: {:?}", mps::mps_processes());
    let rows = measure_agents(&mut agents, MEASURE, true).expect("measure");
    let mut total_beside = 0.0;
    for (i, (alone, beside)) in rows.iter().enumerate() {
        let beside = beside.as_ref().expect("beside");
        total_beside += beside.blocks_per_s;
        println!(
            "client{i}: alone {:.0} blocks/s (share {:.4}), beside 3 saturating {:.0} \
             (interference {:.2}%), %smid values seen {}",
            alone.blocks_per_s,
            alone.blocks_per_s / whole.blocks_per_s,
            beside.blocks_per_s,
            (1.0 - beside.blocks_per_s / alone.blocks_per_s) * 100.0,
            alone.sm_ids_seen.len()
        );
        // Concurrent, not taking turns: time-slicing four ways would leave about 25% of alone.
        assert!(
            beside.blocks_per_s > 0.7 * alone.blocks_per_s,
            "client{i} ran at {:.0} beside vs {:.0} alone: not concurrent",
            beside.blocks_per_s,
            alone.blocks_per_s
        );
    }
    println!(
        "sum of the four clients beside each other: {:.3} of the whole GPU",
        total_beside / whole.blocks_per_s
    );
    drop(agents);
    daemon.stop().expect("stop the daemon");
    let left = our_mps_processes(&pipe);
    assert!(left.is_empty(), "MPS processes left: {left:?}");
    assert!(!pipe.exists(), "pipe directory left: {}", pipe.display());
}

/// Not a test: the child process of `mps_daemon_is_gone_after_sigint_mid_run` (selected by
/// an environment variable). Run any other way it does nothing.
#[test]
fn helper_mps_sigint_child() {
    if std::env::var_os("ISOLANE_TEST_MPS_SIGINT_CHILD").is_none() {
        return;
    }
    mps::install_signal_handlers().expect("signal handlers");
    let daemon = MpsDaemon::start(0, &MpsOptions::default()).expect("daemon");
    let mut agents: Vec<ProcessAgent> = (0..2)
        .map(|i| {
            ProcessAgent::spawn(
                format!("client{i}"),
                &test_worker(),
                daemon.client_device_index(),
                &daemon.client_env(50, None),
            )
            .expect("client")
        })
        .collect();
    for a in agents.iter_mut() {
        a.start_saturate().expect("saturate");
    }
    {
        use std::io::Write as _;
        let mut o = std::io::stdout().lock();
        let _ = writeln!(o, "@child {}", daemon.pipe_dir().display());
        let _ = o.flush();
    }
    std::thread::sleep(Duration::from_secs(120));
    panic!("no SIGINT came");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn mps_daemon_is_gone_after_sigint_mid_run() {
    isolane_gpu::list_devices().expect("a CUDA device");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "helper_mps_sigint_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("ISOLANE_TEST_MPS_SIGINT_CHILD", "1")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let pipe = loop {
        let line = lines
            .next()
            .expect("child ended before starting its daemon")
            .unwrap();
        if let Some(i) = line.find("@child ") {
            break PathBuf::from(&line[i + "@child ".len()..]);
        }
    };
    std::thread::sleep(Duration::from_secs(2)); // mid-run: clients saturating
    let before = our_mps_processes(&pipe);
    println!("MPS processes before SIGINT: {before:?}");
    assert!(!before.is_empty(), "no daemon found for {}", pipe.display());
    let t = Instant::now();
    // SAFETY: signalling our own child.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGINT);
    }
    let status = child.wait().unwrap();
    println!("child exited with {status} after {:?}", t.elapsed());
    let deadline = Instant::now() + Duration::from_secs(10);
    while !our_mps_processes(&pipe).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let left = our_mps_processes(&pipe);
    assert!(left.is_empty(), "MPS processes left after SIGINT: {left:?}");
    assert!(!pipe.exists(), "pipe directory left: {}", pipe.display());
}

fn scenario(text: &str) -> Scenario {
    Scenario::from_toml_str(text, "<test>", &NoBuiltinModels).expect("scenario")
}

/// `isolane verify` on timeslice, MPS (25% × 4) and green (4 × 32 SMs), side by side.
#[test]
#[ignore = "needs a CUDA GPU"]
fn verify_timeslice_mps_and_green_side_by_side() {
    let opts = VerifyOptions {
        duration: MEASURE,
        worker: Some(test_worker()),
        verbose: true,
        ..Default::default()
    };
    let mut reports = Vec::new();
    for (name, text) in [
        (
            "timeslice",
            include_str!("../scenarios/verify-timeslice-4.toml"),
        ),
        ("mps", include_str!("../scenarios/verify-mps-4x25.toml")),
        ("green", include_str!("../scenarios/verify-green-4x32.toml")),
    ] {
        let r = verify::verify(&scenario(text), &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
        println!("{}", verify::format_table(&r));
        println!("{}", serde_json::to_string(&r).unwrap());
        reports.push((name, r));
    }
    println!("interference side by side (mean over partitions):");
    for (name, r) in &reports {
        let v: Vec<f64> = r
            .partitions
            .iter()
            .filter_map(|p| p.interference_pct)
            .collect();
        let mean = v.iter().sum::<f64>() / v.len().max(1) as f64;
        println!("  {name:<10} {mean:6.1}%   per partition {v:.1?}");
    }
    let mean = |name: &str| {
        let r = &reports.iter().find(|(n, _)| *n == name).unwrap().1;
        let v: Vec<f64> = r
            .partitions
            .iter()
            .filter_map(|p| p.interference_pct)
            .collect();
        v.iter().sum::<f64>() / v.len() as f64
    };
    assert!(
        mean("green") < 5.0,
        "green interference {:.1}%",
        mean("green")
    );
    // Four time-sliced contexts take turns: each keeps roughly a quarter.
    assert!(
        mean("timeslice") > 50.0,
        "timeslice interference {:.1}%",
        mean("timeslice")
    );
    assert!(
        mean("mps") < mean("timeslice"),
        "MPS should isolate better than time-slicing"
    );
}
