//! GPU tests of verify's probes in worker processes: run on the H100 with
//! `scripts/gpu-test.sh` (`--ignored --test-threads=1`), which sets `ISOLANE_BIN` to the staged
//! binary whose `isolane worker` plays the probe role. Each prints its measured numbers, then
//! asserts the acceptance bounds of issue 5. None of them passes by finding no GPU: no GPU is a
//! failure.

use std::io::BufRead as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use isolane_core::probe::ProbeResult;
use isolane_core::spec::{NoBuiltinModels, Scenario};
use isolane_gpu::mps::{self, MpsDaemon, MpsOptions};
use isolane_gpu::verify::{format_table, measure_agents, ProbeAgent};
use isolane_runtime::worker_client::WorkerCommand;
use isolane_session::verify::{verify, ProcessAgent, VerifyOptions};

const MEASURE: Duration = Duration::from_secs(1);

/// `isolane worker` of the binary under test (`ISOLANE_BIN`, as the root package's tests).
fn test_worker() -> WorkerCommand {
    let program = std::env::var_os("ISOLANE_BIN")
        .map(PathBuf::from)
        .expect("ISOLANE_BIN: the isolane binary whose `worker` runs the probes");
    WorkerCommand {
        program,
        args: vec!["worker".into()],
        env: Vec::new(),
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
                    &format!("client{i}"),
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
                &format!("client{i}"),
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
            test_name("helper_mps_sigint_child").as_str(),
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
            include_str!("../../isolane-gpu/scenarios/verify-timeslice-4.toml"),
        ),
        (
            "mps",
            include_str!("../../isolane-gpu/scenarios/verify-mps-4x25.toml"),
        ),
        (
            "green",
            include_str!("../../isolane-gpu/scenarios/verify-green-4x32.toml"),
        ),
    ] {
        let r = verify(&scenario(text), &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
        println!("{}", format_table(&r));
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

/// The name libtest knows `function` of this file by: its module's path inside the test binary
/// (tests/suite.rs makes each file a module), less the binary's own name, then the function.
fn test_name(function: &str) -> String {
    match module_path!().split_once("::") {
        Some((_, module)) => format!("{module}::{function}"),
        None => function.to_string(),
    }
}
