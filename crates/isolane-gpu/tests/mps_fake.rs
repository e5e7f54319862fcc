//! The MPS daemon's lifecycle against a fake `nvidia-cuda-mps-control` (CI has no GPU).

use std::io::BufRead as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use isolane_gpu::mps::{self, MpsDaemon, MpsOptions};

/// The tests share the process-wide daemon registry (and `shutdown_all` empties it), so they
/// run one at a time.
static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

struct Env {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    control: PathBuf,
    default_dir: PathBuf,
}

fn env() -> Env {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().to_path_buf();
    let bin = root.join("bin");
    std::fs::create_dir(&bin).unwrap();
    let control = mps::write_fake_control(&bin).unwrap();
    let default_dir = root.join("default-mps");
    Env {
        _tmp: tmp,
        root,
        control,
        default_dir,
    }
}

fn options(e: &Env) -> MpsOptions {
    MpsOptions {
        control_binary: Some(e.control.clone()),
        default_pipe_dir: Some(e.default_dir.clone()),
        temp_root: Some(e.root.clone()),
        stop_timeout: Duration::from_secs(5),
        ..Default::default()
    }
}

fn daemon_pid(pipe_dir: &Path) -> i32 {
    let f = pipe_dir.join("fake-daemon.pid");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(s) = std::fs::read_to_string(&f) {
            if let Ok(p) = s.trim().parse() {
                return p;
            }
        }
        assert!(Instant::now() < deadline, "no pid file {}", f.display());
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn alive(pid: i32) -> bool {
    // A zombie counts as gone: it has exited and only waits to be reaped.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !matches!(
            s.rsplit_once(')')
                .and_then(|(_, r)| r.split_whitespace().next()),
            Some("Z") | Some("X")
        ),
        Err(_) => false,
    }
}

fn wait_gone(pid: i32) -> bool {
    let deadline = Instant::now() + Duration::from_secs(20);
    while alive(pid) {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

#[test]
fn start_and_stop_a_private_daemon() {
    let _g = serial();
    let e = env();
    let d = MpsDaemon::start(0, &options(&e)).unwrap();
    assert!(d.owned());
    let pipe = d.pipe_dir().to_path_buf();
    let log = d.log_dir().to_path_buf();
    assert!(pipe.join("control").exists());
    assert_eq!(mode(&pipe), 0o700);
    assert_eq!(mode(&log), 0o700);
    assert_eq!(mode(pipe.parent().unwrap()), 0o700);
    let pid = daemon_pid(&pipe);
    assert!(alive(pid));

    let env = d.client_env(25, Some(4096));
    let get = |k: &str| env.iter().find(|(a, _)| a == k).map(|(_, v)| v.clone());
    assert_eq!(
        get("CUDA_MPS_PIPE_DIRECTORY").unwrap(),
        pipe.display().to_string()
    );
    assert_eq!(
        get("CUDA_MPS_LOG_DIRECTORY").unwrap(),
        log.display().to_string()
    );
    assert_eq!(get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE").unwrap(), "25");
    assert_eq!(get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT").unwrap(), "0=4096M");
    assert_eq!(get_none(&d.client_env(50, None)), None);

    d.stop().unwrap();
    assert!(wait_gone(pid), "daemon {pid} still running");
    assert!(!pipe.exists(), "pipe dir left behind");
    assert!(!pipe.parent().unwrap().exists());
}

fn get_none(env: &[(String, String)]) -> Option<String> {
    env.iter()
        .find(|(k, _)| k == "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")
        .map(|(_, v)| v.clone())
}

#[test]
fn dropping_the_daemon_stops_it() {
    let _g = serial();
    let e = env();
    let (pid, pipe) = {
        let d = MpsDaemon::start(0, &options(&e)).unwrap();
        (daemon_pid(d.pipe_dir()), d.pipe_dir().to_path_buf())
    };
    assert!(wait_gone(pid));
    assert!(!pipe.exists());
}

#[test]
fn a_daemon_that_ignores_quit_is_killed() {
    let _g = serial();
    let e = env();
    // A control program whose `quit` does nothing: the daemon must be killed after the timeout.
    let stubborn = e.root.join("stubborn");
    std::fs::create_dir(&stubborn).unwrap();
    let script = mps::FAKE_CONTROL_SCRIPT.replace(": > \"$dir/quit-request\"", "true");
    let p = stubborn.join("nvidia-cuda-mps-control");
    mps::write_executable(&p, &script).unwrap();
    let mut o = options(&e);
    o.control_binary = Some(p);
    o.stop_timeout = Duration::from_millis(300);
    let d = MpsDaemon::start(0, &o).unwrap();
    let pid = daemon_pid(d.pipe_dir());
    let pipe = d.pipe_dir().to_path_buf();
    let err = d.stop().unwrap_err().to_string();
    assert!(err.contains("killed"), "{err}");
    assert!(wait_gone(pid));
    assert!(!pipe.exists());
}

#[test]
fn refuses_to_run_beside_an_existing_daemon_unless_joining() {
    let _g = serial();
    let e = env();
    // Somebody else's daemon on the "default" pipe directory.
    std::fs::create_dir(&e.default_dir).unwrap();
    let st = Command::new(&e.control)
        .arg("-d")
        .env("CUDA_MPS_PIPE_DIRECTORY", &e.default_dir)
        .status()
        .unwrap();
    assert!(st.success());
    let other = daemon_pid(&e.default_dir);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !e.default_dir.join("control").exists() {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(10));
    }

    let err = MpsDaemon::start(0, &options(&e)).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("already active"), "{msg}");
    assert!(msg.contains(&other.to_string()), "{msg}");

    let mut o = options(&e);
    o.join_existing = true;
    let joined = MpsDaemon::start(0, &o).unwrap();
    assert!(!joined.owned());
    assert_eq!(joined.pipe_dir(), e.default_dir.as_path());
    assert_eq!(
        joined.client_env(30, None)[0].1,
        e.default_dir.display().to_string()
    );
    joined.stop().unwrap();
    // Joining never stops somebody else's daemon.
    assert!(alive(other));
    assert!(e.default_dir.join("control").exists());

    // Clean up the "other" daemon the way its owner would.
    let mut c = Command::new(&e.control)
        .env("CUDA_MPS_PIPE_DIRECTORY", &e.default_dir)
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write as _;
    c.stdin.take().unwrap().write_all(b"quit\n").unwrap();
    c.wait().unwrap();
    assert!(wait_gone(other));

    // A stale control pipe without a live daemon is not an active daemon.
    std::fs::write(e.default_dir.join("control"), b"").unwrap();
    let d = MpsDaemon::start(0, &options(&e)).unwrap();
    d.stop().unwrap();
}

#[test]
fn a_missing_control_binary_is_a_clear_error() {
    let _g = serial();
    let e = env();
    let mut o = options(&e);
    o.control_binary = Some(e.root.join("does-not-exist"));
    // Only meaningful where no real one is installed and ISOLANE_MPS_CONTROL is unset.
    if std::env::var_os(mps::CONTROL_ENV).is_none() && mps::find_control_binary(None).is_err() {
        let msg = MpsDaemon::start(0, &o).unwrap_err().to_string();
        assert!(msg.contains("nvidia-cuda-mps-control not found"), "{msg}");
    }
}

/// Helper run as a child process by the signal tests: starts a daemon with the fake control
/// binary, installs the signal handlers, prints the pipe directory and daemon pid, and waits.
#[test]
fn signal_child_helper() {
    let Some(control) = std::env::var_os("ISOLANE_TEST_MPS_CHILD") else {
        return; // not the child: nothing to do
    };
    let root = PathBuf::from(std::env::var_os("ISOLANE_TEST_MPS_ROOT").unwrap());
    mps::install_signal_handlers().unwrap();
    let o = MpsOptions {
        control_binary: Some(PathBuf::from(control)),
        default_pipe_dir: Some(root.join("default-mps")),
        temp_root: Some(root),
        stop_timeout: Duration::from_secs(5),
        ..Default::default()
    };
    let d = MpsDaemon::start(0, &o).unwrap();
    let pid = daemon_pid(d.pipe_dir());
    {
        use std::io::Write as _;
        let mut out = std::io::stdout().lock();
        writeln!(out, "@child {} {}", d.pipe_dir().display(), pid).unwrap();
        out.flush().unwrap();
    }
    std::thread::sleep(Duration::from_secs(60));
    panic!("the signal never came");
}

/// Starts `signal_child_helper` as a coordinator child with its own daemon; returns the child,
/// the daemon's pipe directory and the fake daemon's pid.
fn spawn_coordinator(e: &Env) -> (std::process::Child, PathBuf, i32) {
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(exe)
        .args([
            "--exact",
            test_name("signal_child_helper").as_str(),
            "--nocapture",
            "--test-threads=1",
        ])
        .env("ISOLANE_TEST_MPS_CHILD", &e.control)
        .env("ISOLANE_TEST_MPS_ROOT", &e.root)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = std::io::BufReader::new(stdout).lines();
    let (pipe, pid) = loop {
        let line = lines.next().expect("child ended early").unwrap();
        // libtest may have written "test signal_child_helper ... " on the same line.
        if let Some(rest) = line.find("@child ").map(|i| &line[i + "@child ".len()..]) {
            let (dir, pid) = rest.rsplit_once(' ').unwrap();
            break (PathBuf::from(dir), pid.parse::<i32>().unwrap());
        }
    };
    (child, pipe, pid)
}

fn signal_kills_daemon(sig: i32) {
    let e = env();
    let (mut child, pipe, pid) = spawn_coordinator(&e);
    assert!(alive(pid));
    // SAFETY: signalling our own child process.
    unsafe {
        libc::kill(child.id() as i32, sig);
    }
    let status = child.wait().unwrap();
    assert!(
        !status.success(),
        "child should die of the signal: {status}"
    );
    assert!(wait_gone(pid), "daemon {pid} survived signal {sig}");
    assert!(!pipe.exists(), "pipe dir {} left behind", pipe.display());
}

/// Polls until `path` is gone (bounded: a loaded machine may take a while, a leak never ends).
fn wait_removed(path: &Path) -> bool {
    let deadline = Instant::now() + Duration::from_secs(20);
    while path.exists() {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

#[test]
fn a_coordinator_killed_with_sigkill_leaves_no_daemon() {
    let _g = serial();
    let e = env();
    let (mut child, pipe, pid) = spawn_coordinator(&e);
    assert!(alive(pid));
    // SIGKILL runs none of the coordinator's code: only its watchdog can stop the daemon.
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        wait_gone(pid),
        "daemon {pid} survived its coordinator's SIGKILL"
    );
    let root = pipe.parent().unwrap();
    assert!(wait_removed(root), "{} left behind", root.display());
}

/// Writes an isolane-style private directory `name` under the temp root, with an owner marker
/// when given, and starts a fake daemon on its pipe directory; returns (root, daemon pid).
fn private_dir_with_daemon(e: &Env, name: &str, owner: Option<String>) -> (PathBuf, i32) {
    let root = e.root.join(name);
    let pipe = root.join("pipe");
    std::fs::create_dir_all(&pipe).unwrap();
    std::fs::create_dir_all(root.join("log")).unwrap();
    if let Some(owner) = owner {
        std::fs::write(root.join(mps::OWNER_FILE), owner).unwrap();
    }
    let st = Command::new(&e.control)
        .arg("-d")
        .env("CUDA_MPS_PIPE_DIRECTORY", &pipe)
        .status()
        .unwrap();
    assert!(st.success());
    let pid = daemon_pid(&pipe);
    assert!(wait_exists(&pipe.join("control")));
    (root, pid)
}

fn wait_exists(path: &Path) -> bool {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !path.exists() {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}

fn quit_fake_daemon(e: &Env, pipe: &Path) {
    use std::io::Write as _;
    let mut c = Command::new(&e.control)
        .env("CUDA_MPS_PIPE_DIRECTORY", pipe)
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(b"quit\n").unwrap();
    c.wait().unwrap();
}

/// This process's start time (field 22 of /proc/self/stat), as the owner marker holds it.
fn own_start_time() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let after = stat.rsplit_once(')').unwrap().1;
    after
        .split_whitespace()
        .nth(22 - 3)
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn the_next_start_stops_daemons_whose_owner_died_and_no_other() {
    let _g = serial();
    let e = env();
    // A dead owner: a child that exited and was reaped (start time 1 never matches a reused pid).
    let mut gone = Command::new("true").spawn().unwrap();
    let gone_pid = gone.id();
    gone.wait().unwrap();
    let (stale, stale_pid) =
        private_dir_with_daemon(&e, "isolane-mps-stale", Some(format!("{gone_pid} 1\n")));
    let me = format!("{} {}\n", std::process::id(), own_start_time());
    let (live, live_pid) = private_dir_with_daemon(&e, "isolane-mps-live", Some(me));
    let (unmarked, unmarked_pid) = private_dir_with_daemon(&e, "isolane-mps-unmarked", None);
    let (other, other_pid) =
        private_dir_with_daemon(&e, "not-isolane", Some(format!("{gone_pid} 1\n")));

    let d = MpsDaemon::start(0, &options(&e)).unwrap();
    assert!(
        wait_gone(stale_pid),
        "the stale daemon {stale_pid} still runs"
    );
    assert!(!stale.exists(), "{} left behind", stale.display());
    // A live owner's daemon, an unmarked directory's and a folder not named isolane's: untouched.
    for (root, pid) in [
        (&live, live_pid),
        (&unmarked, unmarked_pid),
        (&other, other_pid),
    ] {
        assert!(alive(pid), "{} was stopped", root.display());
        assert!(root.join("pipe").join("control").exists());
    }
    d.stop().unwrap();
    for (root, pid) in [
        (live, live_pid),
        (unmarked, unmarked_pid),
        (other, other_pid),
    ] {
        quit_fake_daemon(&e, &root.join("pipe"));
        assert!(wait_gone(pid));
    }
}

#[test]
fn sigterm_stops_the_daemon() {
    let _g = serial();
    signal_kills_daemon(libc::SIGTERM);
}

#[test]
fn sigint_stops_the_daemon() {
    let _g = serial();
    signal_kills_daemon(libc::SIGINT);
}

#[test]
fn shutdown_all_stops_every_registered_daemon() {
    let _g = serial();
    let e = env();
    let a = MpsDaemon::start(0, &options(&e)).unwrap();
    let b = MpsDaemon::start(0, &options(&e)).unwrap();
    let pids = [daemon_pid(a.pipe_dir()), daemon_pid(b.pipe_dir())];
    // A "client" of daemon a: our child, started with its pipe directory.
    let mut client = Command::new("sleep")
        .arg("30")
        .env("CUDA_MPS_PIPE_DIRECTORY", a.pipe_dir())
        .spawn()
        .unwrap();
    a.adopt_client(client.id());
    // Other tests of this binary may have daemons registered too; shutdown_all stops those as
    // well, which their own asserts tolerate (stop of an already stopped daemon is a no-op).
    let _ = mps::shutdown_all();
    for p in pids {
        assert!(wait_gone(p));
    }
    let st = client.wait().unwrap();
    assert!(!st.success(), "the client was killed: {st}");
    // The values are now inert: stop/drop do nothing more.
    a.stop().unwrap();
    drop(b);
}

#[test]
fn a_partition_session_gives_each_worker_its_mps_environment_and_stops_the_daemon() {
    use isolane_core::admission::{AdmittedWorkload, Plan, ResolvedPartition};
    use isolane_core::spec::Mechanism;
    use isolane_gpu::partitions::{PartitionSession, SessionOptions};
    let _g = serial();
    let e = env();
    let plan = Plan {
        device: "h100-sxm".into(),
        mechanism: Mechanism::Mps,
        workloads: [(25, None), (75, Some(2048))]
            .iter()
            .enumerate()
            .map(|(i, &(thread_pct, mem_limit_mib))| AdmittedWorkload {
                workload: format!("w{i}"),
                partition: ResolvedPartition::Mps {
                    thread_pct,
                    mem_limit_mib,
                },
                memory_mib: None,
                gpu: None,
            })
            .collect(),
    };
    // w0 is the critical work of a protected run, w1 its best effort.
    let opts = SessionOptions {
        mps: options(&e),
        allow_mig_reconfigure: false,
        urgency: isolane_gpu::partitions::Urgency {
            urgent: ["w0".to_string()].into(),
            background: ["w1".to_string()].into(),
        },
        ..Default::default()
    };
    let s = PartitionSession::set_up(3, &plan, &opts, None).unwrap();
    let pipe = PathBuf::from(s.records()[0].mps_pipe_dir.clone().unwrap());
    let pid = daemon_pid(&pipe);
    let get = |w: &str, k: &str| {
        s.worker_env()[w]
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(
        get("w0", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE").as_deref(),
        Some("25")
    );
    assert_eq!(
        get("w1", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE").as_deref(),
        Some("75")
    );
    assert_eq!(get("w0", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"), None);
    assert_eq!(
        get("w1", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT").as_deref(),
        Some("0=2048M")
    );
    assert_eq!(
        get("w0", "CUDA_MPS_PIPE_DIRECTORY").map(PathBuf::from),
        Some(pipe.clone())
    );
    // The daemon sees only GPU 3, which it exposes to its clients as their device 0.
    assert_eq!(get("w1", "CUDA_VISIBLE_DEVICES").as_deref(), Some("0"));
    assert_eq!(get("w1", "ISOLANE_WORKER_GPU").as_deref(), Some("0"));
    // Critical work's stream goes first; best effort's client runs below normal priority.
    assert_eq!(
        get("w0", "ISOLANE_WORKER_STREAM_PRIORITY").as_deref(),
        Some("greatest")
    );
    assert_eq!(get("w0", "CUDA_MPS_CLIENT_PRIORITY"), None);
    assert_eq!(get("w1", "ISOLANE_WORKER_STREAM_PRIORITY"), None);
    assert_eq!(get("w1", "CUDA_MPS_CLIENT_PRIORITY").as_deref(), Some("1"));
    assert_eq!(s.records()[0].partition, "mps 25%, urgent stream");
    assert_eq!(
        s.records()[1].partition,
        "mps 75%, 2048 MiB pinned, below-normal MPS client"
    );
    // A worker started through the runtime's hook is killed by shutdown_all.
    let mut client = Command::new("sleep").arg("30").spawn().unwrap();
    (s.client_adopter())(client.id());
    let _ = mps::shutdown_all();
    assert!(!client.wait().unwrap().success());
    assert!(wait_gone(pid));
    assert!(!pipe.exists());
    s.finish().unwrap();
}

#[test]
fn a_session_on_two_gpus_starts_a_daemon_per_gpu_and_binds_each_client_to_its_own() {
    use isolane_core::admission::{AdmittedWorkload, Plan, ResolvedPartition};
    use isolane_core::spec::Mechanism;
    use isolane_gpu::partitions::{PartitionSession, SessionOptions};
    let _g = serial();
    let e = env();
    let client = |name: &str, gpu: u32, thread_pct: u32| AdmittedWorkload {
        workload: name.into(),
        partition: ResolvedPartition::Mps {
            thread_pct,
            mem_limit_mib: Some(1024),
        },
        memory_mib: None,
        gpu: Some(gpu),
    };
    let plan = Plan {
        device: "h100-sxm".into(),
        mechanism: Mechanism::Mps,
        workloads: vec![client("a", 1, 60), client("b", 3, 80), client("c", 1, 40)],
    };
    let opts = SessionOptions {
        mps: options(&e),
        ..Default::default()
    };
    let s = PartitionSession::set_up(1, &plan, &opts, None).unwrap();
    let get = |w: &str, k: &str| {
        s.worker_env()[w]
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    let pipe = |w: &str| PathBuf::from(get(w, "CUDA_MPS_PIPE_DIRECTORY"));
    // a and c share GPU 1's daemon; b has GPU 3's, with its own pipe and log directories.
    assert_eq!(pipe("a"), pipe("c"));
    assert_ne!(pipe("a"), pipe("b"));
    assert_ne!(
        get("a", "CUDA_MPS_LOG_DIRECTORY"),
        get("b", "CUDA_MPS_LOG_DIRECTORY")
    );
    for (w, gpu) in [("a", "1"), ("b", "3"), ("c", "1")] {
        // Behind its daemon a client sees its GPU as device 0, CUDA_VISIBLE_DEVICES included.
        assert_eq!(get(w, "CUDA_VISIBLE_DEVICES"), "0", "{w}");
        assert_eq!(get(w, "ISOLANE_WORKER_GPU"), "0", "{w}");
        assert_eq!(get(w, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"), "0=1024M", "{w}");
        let records = s.records().iter().find(|r| r.workload == w).unwrap();
        assert_eq!(
            records.mps_pipe_dir.as_deref().map(PathBuf::from),
            Some(pipe(w))
        );
        assert!(
            records.partition.ends_with(&format!(" on GPU {gpu}")),
            "{records:?}"
        );
    }
    // Each daemon was started seeing only its GPU.
    for (w, gpu) in [("a", "1"), ("b", "3")] {
        let seen = std::fs::read_to_string(pipe(w).join("fake-daemon.gpu")).unwrap();
        assert_eq!(seen.trim(), gpu);
    }
    assert_eq!(
        s.records()
            .iter()
            .map(|r| r.workload.as_str())
            .collect::<Vec<_>>(),
        ["a", "b", "c"],
        "records in the plan's order"
    );
    let pipes = [pipe("a"), pipe("b")];
    let pids = pipes.clone().map(|p| daemon_pid(&p));
    s.finish().unwrap();
    for p in pids {
        assert!(wait_gone(p));
    }
    assert!(pipes.iter().all(|p| !p.exists()));
}

#[test]
fn joining_an_existing_daemon_is_refused_on_two_gpus() {
    use isolane_core::admission::{AdmittedWorkload, Plan, ResolvedPartition};
    use isolane_core::spec::Mechanism;
    use isolane_gpu::partitions::{PartitionSession, SessionOptions};
    let _g = serial();
    let e = env();
    let client = |name: &str, gpu: u32| AdmittedWorkload {
        workload: name.into(),
        partition: ResolvedPartition::Mps {
            thread_pct: 50,
            mem_limit_mib: None,
        },
        memory_mib: None,
        gpu: Some(gpu),
    };
    let plan = Plan {
        device: "h100-sxm".into(),
        mechanism: Mechanism::Mps,
        workloads: vec![client("a", 0), client("b", 1)],
    };
    let mut mps = options(&e);
    mps.join_existing = true;
    let opts = SessionOptions {
        mps,
        ..Default::default()
    };
    let err = PartitionSession::set_up(0, &plan, &opts, None).unwrap_err();
    assert!(err.to_string().contains("several GPUs"), "{err}");
}

/// The name libtest knows `function` of this file by: its module's path inside the test binary
/// (tests/suite.rs makes each file a module), less the binary's own name, then the function.
fn test_name(function: &str) -> String {
    match module_path!().split_once("::") {
        Some((_, module)) => format!("{module}::{function}"),
        None => function.to_string(),
    }
}
