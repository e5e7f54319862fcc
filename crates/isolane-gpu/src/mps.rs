//! A private MPS control daemon per run, always shut down.
//!
//! Safety rules (docs/partitions.md):
//! - isolane starts its **own** daemon with private `CUDA_MPS_PIPE_DIRECTORY` and
//!   `CUDA_MPS_LOG_DIRECTORY` (fresh temporary directories, mode 0700), never the system-wide one.
//! - It refuses to start beside an already active daemon (the default pipe directory's `control`
//!   exists and an `nvidia-cuda-mps-control` process is alive) unless told to join it; a joined
//!   daemon is never stopped by isolane.
//! - It always stops the daemon: `stop()`, `Drop`, and [`shutdown_all`] for signal handlers
//!   ([`install_signal_handlers`] wires SIGINT and SIGTERM to it). Stopping sends `quit` to the
//!   control program, waits, then kills the daemon's process group if it is still there, and
//!   removes the directories.
//! - Nothing outlives isolane, even a `kill -9` that runs none of the above: a watchdog process
//!   ([`WATCHDOG_SCRIPT`]) holds a pipe from isolane and stops the daemon when the pipe closes
//!   without being disarmed; the private directory carries an `owner` marker (pid and start
//!   time), and the next start stops the daemons of isolane's own directories whose owner is gone
//!   ([`clean_stale_daemons`]). Worker processes end with isolane through PDEATHSIG
//!   ([`isolane_core::process::die_with_parent`]).
//! - The control binary can be replaced with `ISOLANE_MPS_CONTROL` (CI uses a fake script).

use std::io::Write as _;
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::error::{GpuError, Result};

/// Environment variable naming the `nvidia-cuda-mps-control` binary to use.
pub const CONTROL_ENV: &str = "ISOLANE_MPS_CONTROL";
pub const CONTROL_NAME: &str = "nvidia-cuda-mps-control";
/// Where a daemon started without CUDA_MPS_PIPE_DIRECTORY listens.
pub const DEFAULT_PIPE_DIR: &str = "/tmp/nvidia-mps";

/// How to start the daemon.
#[derive(Debug, Clone)]
pub struct MpsOptions {
    /// Use an already running daemon instead of refusing (it is then never stopped by us).
    pub join_existing: bool,
    /// The control binary; default: `$ISOLANE_MPS_CONTROL`, else found on PATH or in the
    /// driver's usual directories.
    pub control_binary: Option<PathBuf>,
    /// Where an existing daemon would listen: default `$CUDA_MPS_PIPE_DIRECTORY` if set, else
    /// /tmp/nvidia-mps. (Tests point this at a temporary directory.)
    pub default_pipe_dir: Option<PathBuf>,
    /// How long to wait for the control pipe to appear after `-d`.
    pub start_timeout: Duration,
    /// How long `quit` may take before the daemon's process group is killed.
    pub stop_timeout: Duration,
    /// Parent of the private directories (default: the system temp dir).
    pub temp_root: Option<PathBuf>,
}

impl Default for MpsOptions {
    fn default() -> Self {
        MpsOptions {
            join_existing: false,
            control_binary: None,
            default_pipe_dir: None,
            start_timeout: Duration::from_secs(10),
            stop_timeout: Duration::from_secs(10),
            temp_root: None,
        }
    }
}

/// The default pipe directory as CUDA clients would resolve it.
pub fn default_pipe_dir() -> PathBuf {
    std::env::var_os("CUDA_MPS_PIPE_DIRECTORY")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_PIPE_DIR))
}

/// Finds the control binary: explicit path, `$ISOLANE_MPS_CONTROL`, PATH, driver directories.
pub fn find_control_binary(explicit: Option<&Path>) -> Result<PathBuf> {
    let mut searched = Vec::new();
    if let Some(p) = explicit {
        if p.is_file() {
            return Ok(p.to_path_buf());
        }
        searched.push(p.display().to_string());
    }
    if let Some(p) = std::env::var_os(CONTROL_ENV).filter(|v| !v.is_empty()) {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Ok(p);
        }
        searched.push(format!("{CONTROL_ENV}={}", p.display()));
    }
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    dirs.extend(
        [
            "/usr/local/nvidia/bin",
            "/usr/bin",
            "/usr/local/cuda/bin",
            "/usr/sbin",
        ]
        .iter()
        .map(PathBuf::from),
    );
    for d in dirs {
        let p = d.join(CONTROL_NAME);
        if p.is_file() {
            return Ok(p);
        }
        searched.push(d.display().to_string());
    }
    Err(GpuError::MpsControlNotFound { searched })
}

// ---------------------------------------------------------------- /proc scanning

/// A process seen in /proc.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcInfo {
    pub pid: i32,
    pub ppid: i32,
    pub pgid: i32,
    pub argv: Vec<String>,
    /// CUDA_MPS_PIPE_DIRECTORY from its environment, when readable (our own user's processes).
    pub pipe_dir: Option<PathBuf>,
}

fn read_proc(pid: i32) -> Option<ProcInfo> {
    let base = PathBuf::from(format!("/proc/{pid}"));
    let cmdline = std::fs::read(base.join("cmdline")).ok()?;
    if cmdline.is_empty() {
        return None; // kernel thread or zombie
    }
    let argv: Vec<String> = cmdline
        .split(|&b| b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect();
    let stat = std::fs::read_to_string(base.join("stat")).ok()?;
    // Fields after the parenthesised command name: state ppid pgrp ...
    let after = stat.rsplit_once(')')?.1;
    let mut f = after.split_whitespace();
    let state = f.next()?;
    if state == "Z" || state == "X" {
        return None;
    }
    let ppid: i32 = f.next()?.parse().ok()?;
    let pgid: i32 = f.next()?.parse().ok()?;
    let pipe_dir = std::fs::read(base.join("environ")).ok().and_then(|env| {
        env.split(|&b| b == 0).find_map(|kv| {
            let kv = String::from_utf8_lossy(kv);
            kv.strip_prefix("CUDA_MPS_PIPE_DIRECTORY=")
                .map(PathBuf::from)
        })
    });
    Some(ProcInfo {
        pid,
        ppid,
        pgid,
        argv,
        pipe_dir,
    })
}

/// Whether `argv` is an MPS control daemon or server: the program, or the script a shell runs
/// (the fake daemon of the tests is `sh .../nvidia-cuda-mps-control -d`).
pub fn is_mps_process(argv: &[String]) -> bool {
    argv.iter().take(2).any(|a| {
        Path::new(a)
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("nvidia-cuda-mps-"))
    })
}

/// Every live MPS control/server process visible in /proc.
pub fn mps_processes() -> Vec<ProcInfo> {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    rd.filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(read_proc)
        .filter(|p| is_mps_process(&p.argv))
        .collect()
}

fn pid_alive(pid: i32) -> bool {
    read_proc(pid).is_some()
}

// ---------------------------------------------------------------- registry

/// What a signal handler needs to stop a daemon without the `MpsDaemon` value.
#[derive(Debug, Clone)]
struct Registration {
    id: u64,
    control: PathBuf,
    pipe_dir: PathBuf,
    log_dir: PathBuf,
    root: PathBuf,
    stop_timeout: Duration,
}

fn registry() -> &'static Mutex<Vec<Registration>> {
    static R: OnceLock<Mutex<Vec<Registration>>> = OnceLock::new();
    R.get_or_init(|| Mutex::new(Vec::new()))
}

fn next_id() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(1);
    N.fetch_add(1, Ordering::Relaxed)
}

/// Client processes handed to [`MpsDaemon::adopt_client`], by registration id. Explicit
/// because finding clients through /proc/<pid>/environ is not possible everywhere (sandboxes
/// and hardened kernels hide other processes' environments).
fn adopted_clients() -> &'static Mutex<Vec<(u64, u32)>> {
    static C: OnceLock<Mutex<Vec<(u64, u32)>>> = OnceLock::new();
    C.get_or_init(|| Mutex::new(Vec::new()))
}

/// [`MpsDaemon::adopt_client`] for callers that hold only the daemon's registration id (e.g. a
/// hook called from another thread when a worker starts).
pub fn adopt_client_by_id(id: u64, pid: u32) {
    adopted_clients()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push((id, pid));
}

fn our_pipe_dirs() -> Vec<PathBuf> {
    registry()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .map(|r| r.pipe_dir.clone())
        .collect()
}

/// Stops every daemon this process started and has not stopped yet. For Ctrl-C / SIGTERM
/// handlers (the runtime's or [`install_signal_handlers`]'s); safe to call more than once and
/// from any thread (not from inside a raw signal handler: it spawns processes and waits).
///
/// Our own client processes of those daemons (children of this process started with the
/// daemon's pipe directory, e.g. probe workers) are killed first: the real daemon's `quit`
/// waits for its clients to finish, and on this path nobody else will end them.
pub fn shutdown_all() -> Vec<GpuError> {
    let regs: Vec<Registration> =
        std::mem::take(&mut *registry().lock().unwrap_or_else(|p| p.into_inner()));
    if regs.is_empty() {
        return Vec::new();
    }
    kill_adopted_clients(&regs);
    kill_our_clients(&regs);
    regs.iter()
        .filter_map(|r| stop_registered(r).err())
        .collect()
}

fn kill_adopted_clients(regs: &[Registration]) {
    let me = std::process::id() as i32;
    let pids: Vec<u32> = {
        let mut adopted = adopted_clients().lock().unwrap_or_else(|p| p.into_inner());
        let (ours, rest): (Vec<_>, Vec<_>) = adopted
            .drain(..)
            .partition(|(id, _)| regs.iter().any(|r| r.id == *id));
        *adopted = rest;
        ours.into_iter().map(|(_, pid)| pid).collect()
    };
    for pid in pids {
        // A child's pid cannot be reused before its parent reaps it; where /proc shows the
        // process, its parent is checked as well, in case the caller reaped it already.
        if read_proc(pid as i32).is_some_and(|p| p.ppid != me) {
            continue;
        }
        // SAFETY: kill(2) of a process the caller declared as our client child.
        unsafe {
            libc::kill(pid as i32, libc::SIGKILL);
        }
    }
}

/// Processes of `regs`' daemons that are our own children and not MPS processes, found through
/// /proc (for clients nobody adopted explicitly).
fn kill_our_clients(regs: &[Registration]) {
    let me = std::process::id() as i32;
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return;
    };
    let clients: Vec<i32> = rd
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(read_proc)
        .filter(|p| p.ppid == me && !is_mps_process(&p.argv))
        .filter(|p| {
            p.pipe_dir
                .as_ref()
                .is_some_and(|d| regs.iter().any(|r| &r.pipe_dir == d))
        })
        .map(|p| p.pid)
        .collect();
    for pid in clients {
        // SAFETY: kill(2) of our own child process (checked by its parent pid just now).
        unsafe {
            libc::kill(pid, libc::SIGKILL);
        }
    }
}

/// Installs SIGINT and SIGTERM handling that stops every daemon ([`shutdown_all`]) and then
/// lets the signal take its default effect (the process dies of it, exit status 128+n), so
/// nothing is left behind. Call once, early; a program with its own Ctrl-C handling should call
/// [`shutdown_all`] from it instead.
pub fn install_signal_handlers() -> Result<()> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    static ONCE: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    let r = ONCE.get_or_init(|| {
        let mut signals =
            signal_hook::iterator::Signals::new([SIGINT, SIGTERM]).map_err(|e| e.to_string())?;
        std::thread::Builder::new()
            .name("isolane-mps-signals".into())
            .spawn(move || {
                if let Some(sig) = signals.forever().next() {
                    for e in shutdown_all() {
                        eprintln!("isolane: stopping the MPS daemon: {e}");
                    }
                    // Die of the signal as if no handler had been installed.
                    let _ = signal_hook::low_level::emulate_default_handler(sig);
                    std::process::exit(128 + sig);
                }
            })
            .map(|_| ())
            .map_err(|e| e.to_string())
    });
    r.clone()
        .map_err(|e| GpuError::Mps(format!("installing the signal handlers: {e}")))
}

// ---------------------------------------------------------------- daemon

/// A running MPS control daemon (ours, or an existing one we joined).
#[derive(Debug)]
pub struct MpsDaemon {
    gpu_index: u32,
    pipe_dir: PathBuf,
    log_dir: PathBuf,
    /// Our registration (None when joined: a joined daemon is never stopped by us).
    reg: Option<Registration>,
    /// Stops the daemon if this process dies without doing so (None when joined).
    watchdog: Option<Watchdog>,
}

/// An active daemon found before starting ours.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExistingDaemon {
    pub pipe_dir: PathBuf,
    pub pids: Vec<i32>,
}

/// An MPS daemon other than ours that clients using `pipe_dir` would reach: its control pipe
/// exists and a control process (not one of ours) is alive.
pub fn detect_existing(pipe_dir: &Path) -> Option<ExistingDaemon> {
    if !pipe_dir.join("control").exists() {
        return None;
    }
    let ours = our_pipe_dirs();
    let pids: Vec<i32> = mps_processes()
        .into_iter()
        .filter(|p| match &p.pipe_dir {
            Some(d) => !ours.contains(d),
            None => true, // another user's (e.g. root's) daemon: environment unreadable
        })
        .map(|p| p.pid)
        .collect();
    if pids.is_empty() {
        None // a stale pipe left by a daemon that died
    } else {
        Some(ExistingDaemon {
            pipe_dir: pipe_dir.to_path_buf(),
            pids,
        })
    }
}

fn private_dir(root: &Path, name: &str) -> Result<PathBuf> {
    let d = root.join(name);
    std::fs::create_dir(&d).map_err(|e| GpuError::io(format!("creating {}", d.display()), e))?;
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| GpuError::io(format!("chmod 0700 {}", d.display()), e))?;
    Ok(d)
}

impl MpsDaemon {
    /// Starts a private daemon for GPU `gpu_index` (it only sees that GPU: CUDA_VISIBLE_DEVICES
    /// is set for it, so its clients use device 0), or joins an existing one if
    /// `options.join_existing`.
    pub fn start(gpu_index: u32, options: &MpsOptions) -> Result<Self> {
        let default_dir = options
            .default_pipe_dir
            .clone()
            .unwrap_or_else(default_pipe_dir);
        if let Some(existing) = detect_existing(&default_dir) {
            if options.join_existing {
                return Ok(MpsDaemon {
                    gpu_index,
                    pipe_dir: existing.pipe_dir,
                    log_dir: PathBuf::new(),
                    reg: None,
                    watchdog: None,
                });
            }
            return Err(GpuError::MpsExistingDaemon {
                pipe_dir: existing.pipe_dir,
                pids: existing.pids,
            });
        }
        let control = find_control_binary(options.control_binary.as_deref())?;
        let temp_root = options.temp_root.clone().unwrap_or_else(std::env::temp_dir);
        for stale in clean_stale_daemons(&temp_root, &control, options.stop_timeout) {
            eprintln!(
                "isolane: stopped the MPS daemon of {} left by process {} (it ended without stopping it)",
                stale.root.display(),
                stale.owner_pid
            );
        }
        let root = tempfile::Builder::new()
            .prefix("isolane-mps-")
            .tempdir_in(&temp_root)
            .map_err(|e| {
                GpuError::io(
                    format!("creating a directory in {}", temp_root.display()),
                    e,
                )
            })?
            .keep();
        let marked = std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| GpuError::io(format!("chmod 0700 {}", root.display()), e))
            .and_then(|()| write_owner_marker(&root));
        if let Err(e) = marked {
            let _ = std::fs::remove_dir_all(&root);
            return Err(e);
        }
        let reg = Registration {
            id: next_id(),
            control,
            pipe_dir: root.join("pipe"),
            log_dir: root.join("log"),
            root: root.clone(),
            stop_timeout: options.stop_timeout,
        };
        let cleanup_root = |e: GpuError| {
            let _ = std::fs::remove_dir_all(&root);
            e
        };
        private_dir(&root, "pipe").map_err(cleanup_root)?;
        private_dir(&root, "log").map_err(cleanup_root)?;
        // Registered before the daemon exists, so that a signal arriving while it starts
        // still stops it, and so that our own daemon is never taken for an existing one.
        registry()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(reg.clone());
        let mut daemon = MpsDaemon {
            gpu_index,
            pipe_dir: reg.pipe_dir.clone(),
            log_dir: reg.log_dir.clone(),
            reg: Some(reg.clone()),
            watchdog: None,
        };
        // From here on, dropping `daemon` stops whatever was started and removes the dirs. The
        // watchdog comes first: if we are killed while the daemon starts, it still stops it.
        daemon.watchdog = Some(Watchdog::spawn(&reg)?);
        let status = Command::new(&reg.control)
            .arg("-d")
            .env("CUDA_MPS_PIPE_DIRECTORY", &reg.pipe_dir)
            .env("CUDA_MPS_LOG_DIRECTORY", &reg.log_dir)
            .env("CUDA_VISIBLE_DEVICES", daemon_visible_device(gpu_index))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // Its own process group: a Ctrl-C at the terminal reaches us, not the daemon, and
            // we stop it in order (quit, then kill the group if it hangs).
            .process_group(0)
            .status()
            .map_err(|e| GpuError::io(format!("running {} -d", reg.control.display()), e))?;
        if !status.success() {
            return Err(GpuError::Mps(format!(
                "{} -d exited with {status}",
                reg.control.display()
            )));
        }
        let deadline = Instant::now() + options.start_timeout;
        while !reg.pipe_dir.join("control").exists() {
            if Instant::now() > deadline {
                return Err(GpuError::Mps(format!(
                    "the daemon's control pipe {} did not appear within {:?} (log: {})",
                    reg.pipe_dir.join("control").display(),
                    options.start_timeout,
                    reg.log_dir.display()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(daemon)
    }

    pub fn gpu_index(&self) -> u32 {
        self.gpu_index
    }
    pub fn pipe_dir(&self) -> &Path {
        &self.pipe_dir
    }
    pub fn log_dir(&self) -> &Path {
        &self.log_dir
    }
    /// Whether this is our daemon (false when an existing one was joined).
    pub fn owned(&self) -> bool {
        self.reg.is_some()
    }
    /// The CUDA device index clients use: 0 on our daemon (it sees only its GPU).
    pub fn client_device_index(&self) -> u32 {
        if self.owned() {
            0
        } else {
            self.gpu_index
        }
    }

    /// Environment for one client (worker process): the daemon's directories, its active
    /// thread percentage and, if given, its pinned device memory limit (`0=<N>M`: device 0 as
    /// the client sees it).
    pub fn client_env(&self, thread_pct: u32, mem_limit_mib: Option<u64>) -> Vec<(String, String)> {
        let mut env = vec![(
            "CUDA_MPS_PIPE_DIRECTORY".to_string(),
            self.pipe_dir.display().to_string(),
        )];
        if self.owned() {
            env.push((
                "CUDA_MPS_LOG_DIRECTORY".to_string(),
                self.log_dir.display().to_string(),
            ));
        }
        env.push((
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".to_string(),
            thread_pct.to_string(),
        ));
        if let Some(m) = mem_limit_mib {
            env.push((
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".to_string(),
                format!("{}={m}M", self.client_device_index()),
            ));
        }
        env
    }

    /// Declares `pid` (a child process of ours that uses this daemon, e.g. a worker) as a client
    /// that [`shutdown_all`] kills before stopping the daemon: on that path nobody else ends
    /// it, and the real daemon's `quit` waits for its clients.
    pub fn adopt_client(&self, pid: u32) {
        if let Some(id) = self.registration_id() {
            adopt_client_by_id(id, pid);
        }
    }

    /// Identifies our daemon for [`adopt_client_by_id`] (`None` for a joined daemon, which we
    /// never stop).
    pub fn registration_id(&self) -> Option<u64> {
        self.reg.as_ref().map(|r| r.id)
    }

    /// Stops the daemon (quit, wait, kill if needed) and removes its directories. A joined
    /// daemon is left running.
    pub fn stop(mut self) -> Result<()> {
        self.stop_inner()
    }

    fn stop_inner(&mut self) -> Result<()> {
        let Some(reg) = self.reg.take() else {
            return Ok(());
        };
        registry()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|r| r.id != reg.id);
        adopted_clients()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|(id, _)| *id != reg.id);
        let stopped = stop_registered(&reg);
        // Disarmed only now: had we died while stopping, the watchdog would have finished it.
        if let Some(w) = self.watchdog.take() {
            w.disarm();
        }
        stopped
    }
}

impl Drop for MpsDaemon {
    fn drop(&mut self) {
        if let Err(e) = self.stop_inner() {
            eprintln!("isolane: stopping the MPS daemon: {e}");
        }
    }
}

/// Daemon processes started for `pipe_dir` (found by their environment).
fn daemon_processes(pipe_dir: &Path) -> Vec<ProcInfo> {
    mps_processes()
        .into_iter()
        .filter(|p| p.pipe_dir.as_deref() == Some(pipe_dir))
        .collect()
}

fn stop_registered(reg: &Registration) -> Result<()> {
    let mut problems: Vec<String> = Vec::new();
    if reg.pipe_dir.join("control").exists() {
        match Command::new(&reg.control)
            .env("CUDA_MPS_PIPE_DIRECTORY", &reg.pipe_dir)
            .env("CUDA_MPS_LOG_DIRECTORY", &reg.log_dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
        {
            Ok(mut child) => {
                if let Some(mut stdin) = child.stdin.take() {
                    let _ = stdin.write_all(b"quit\n");
                } // stdin closed here: the control program sees EOF after `quit`.
                let deadline = Instant::now() + reg.stop_timeout;
                loop {
                    match child.try_wait() {
                        Ok(Some(_)) => break,
                        Ok(None) if Instant::now() < deadline => {
                            std::thread::sleep(Duration::from_millis(20))
                        }
                        _ => {
                            let _ = child.kill();
                            let _ = child.wait();
                            problems.push("the control program did not return after quit".into());
                            break;
                        }
                    }
                }
            }
            Err(e) => problems.push(format!("running {}: {e}", reg.control.display())),
        }
    }
    // Wait for the daemon (and its server) to leave; kill them if they do not.
    let deadline = Instant::now() + reg.stop_timeout;
    let mut left = daemon_processes(&reg.pipe_dir);
    while !left.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        left = daemon_processes(&reg.pipe_dir);
    }
    if !left.is_empty() {
        problems.push(format!(
            "daemon still running after quit (pids {:?}); killed",
            left.iter().map(|p| p.pid).collect::<Vec<_>>()
        ));
        // Never signal our own process group.
        // SAFETY: getpgrp has no preconditions.
        let own_pgid = unsafe { libc::getpgrp() };
        for p in &left {
            if p.pgid > 1 && p.pgid != own_pgid {
                // SAFETY: kill(2) of a process group found by its environment to belong to this
                // daemon; our own process group is excluded.
                unsafe { libc::killpg(p.pgid, libc::SIGKILL) };
            }
            // SAFETY: kill(2) of a pid found by its environment to belong to this daemon.
            unsafe { libc::kill(p.pid, libc::SIGKILL) };
        }
        let until = Instant::now() + Duration::from_secs(2);
        while left.iter().any(|p| pid_alive(p.pid)) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    if let Err(e) = std::fs::remove_dir_all(&reg.root) {
        if e.kind() != std::io::ErrorKind::NotFound {
            problems.push(format!("removing {}: {e}", reg.root.display()));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(GpuError::Mps(problems.join("; ")))
    }
}

// ---------------------------------------------------------------- nothing outlives isolane

/// The file in a private directory that names the isolane process owning it: `<pid>
/// <start time>` (the start time in clock ticks since boot, field 22 of /proc/<pid>/stat, so that
/// a reused pid is not taken for the owner).
pub const OWNER_FILE: &str = "owner";

/// Prefix of the private directories under the temp root.
const ROOT_PREFIX: &str = "isolane-mps-";

/// The start time of process `pid` (clock ticks since boot), if it is alive.
fn process_start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name start with field 3 (state); start time is field 22.
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
    let state = fields.next()?;
    if state == "Z" || state == "X" {
        return None;
    }
    fields.nth(22 - 4)?.parse().ok()
}

/// Who owns a private directory, as its [`OWNER_FILE`] says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Owner {
    pid: i32,
    start_time: u64,
}

impl Owner {
    fn parse(text: &str) -> Option<Owner> {
        let mut f = text.split_whitespace();
        let owner = Owner {
            pid: f.next()?.parse().ok()?,
            start_time: f.next()?.parse().ok()?,
        };
        f.next().is_none().then_some(owner)
    }

    fn is_alive(&self) -> bool {
        process_start_time(self.pid) == Some(self.start_time)
    }
}

fn write_owner_marker(root: &Path) -> Result<()> {
    let pid = std::process::id() as i32;
    let start_time = process_start_time(pid)
        .ok_or_else(|| GpuError::Mps("cannot read this process's start time in /proc".into()))?;
    let path = root.join(OWNER_FILE);
    std::fs::write(&path, format!("{pid} {start_time}\n"))
        .map_err(|e| GpuError::io(format!("writing {}", path.display()), e))
}

/// A private directory whose owner had died, found and cleaned by [`clean_stale_daemons`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaleDaemon {
    pub root: PathBuf,
    pub owner_pid: i32,
}

/// Stops the daemons of isolane's own private directories under `temp_root` whose owner process
/// is gone, and removes those directories. Only directories named `isolane-mps-*`, owned by
/// this user and holding an [`OWNER_FILE`] that names a dead process are touched: never a
/// daemon that is not isolane's, nor one of a live isolane process.
pub fn clean_stale_daemons(
    temp_root: &Path,
    control: &Path,
    stop_timeout: Duration,
) -> Vec<StaleDaemon> {
    let Ok(entries) = std::fs::read_dir(temp_root) else {
        return Vec::new();
    };
    let stale: Vec<StaleDaemon> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(ROOT_PREFIX))
        .filter_map(|e| stale_owner(&e.path()))
        .collect();
    for s in &stale {
        let reg = Registration {
            id: 0,
            control: control.to_path_buf(),
            pipe_dir: s.root.join("pipe"),
            log_dir: s.root.join("log"),
            root: s.root.clone(),
            stop_timeout,
        };
        if let Err(e) = stop_registered(&reg) {
            eprintln!("isolane: stopping a stale MPS daemon: {e}");
        }
    }
    stale
}

/// `root` as a [`StaleDaemon`] if it is one of ours whose owner has died.
fn stale_owner(root: &Path) -> Option<StaleDaemon> {
    use std::os::unix::fs::MetadataExt as _;
    let meta = std::fs::symlink_metadata(root).ok()?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if !meta.is_dir() || meta.uid() != me {
        return None;
    }
    let owner = Owner::parse(&std::fs::read_to_string(root.join(OWNER_FILE)).ok()?)?;
    (!owner.is_alive()).then(|| StaleDaemon {
        root: root.to_path_buf(),
        owner_pid: owner.pid,
    })
}

/// The watchdog, run by `/bin/sh -c` with the control program, the private root and the stop
/// timeout in 50 ms ticks as `$1 $2 $3`. Its stdin is a pipe whose only writer is the isolane
/// process: a line `disarm` ends it quietly; the pipe's end without one means isolane died
/// without stopping its daemon. Then it sends `quit` to the daemon, waits for every process
/// started with the private pipe directory (the daemon, its server, clients) to leave, kills
/// those still there after the timeout, and removes the directory (only if it carries the owner
/// marker). It ignores SIGHUP and SIGINT (a closing terminal or a Ctrl-C reach isolane, which
/// stops the daemon itself) and runs in its own process group.
pub const WATCHDOG_SCRIPT: &str = r#"trap '' HUP INT
IFS= read -r word
[ "$word" = disarm ] && exit 0
control=$1 root=$2 ticks=$3 pipe=$2/pipe
members() {
    grep -lzxF "CUDA_MPS_PIPE_DIRECTORY=$pipe" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3
}
if [ -e "$pipe/control" ]; then
    echo quit | CUDA_MPS_PIPE_DIRECTORY="$pipe" CUDA_MPS_LOG_DIRECTORY="$root/log" \
        "$control" >/dev/null 2>&1 &
fi
n=0
while [ "$n" -lt "$ticks" ] && [ -n "$(members)" ]; do sleep 0.05; n=$((n + 1)); done
for p in $(members); do kill -9 "$p" 2>/dev/null; done
wait
[ -f "$root/owner" ] && rm -rf "$root"
exit 0
"#;

/// What the daemon of GPU `gpu_index` (as this process numbers the GPUs) is told to see: the
/// GPU's UUID where CUDA can give it, as NVIDIA's MPS guide recommends (an index would be
/// counted among all the machine's GPUs, not among those our own CUDA_VISIBLE_DEVICES
/// leaves), else the index.
fn daemon_visible_device(gpu_index: u32) -> String {
    crate::driver::device(gpu_index)
        .and_then(crate::driver::uuid)
        .unwrap_or_else(|_| gpu_index.to_string())
}

/// The watchdog process of one daemon of ours; see [`WATCHDOG_SCRIPT`].
#[derive(Debug)]
struct Watchdog {
    child: Child,
    /// The pipe's write end. Rust opens it close-on-exec, so no other child holds it open.
    stdin: Option<ChildStdin>,
}

impl Watchdog {
    fn spawn(reg: &Registration) -> Result<Self> {
        let ticks = (reg.stop_timeout.as_millis() / 50).max(1);
        let mut child = Command::new("/bin/sh")
            .arg("-c")
            .arg(WATCHDOG_SCRIPT)
            .arg("isolane-mps-watchdog")
            .arg(&reg.control)
            .arg(&reg.root)
            .arg(ticks.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // Not in our process group: a signal to the group (Ctrl-C, kill -9 -pgid) must
            // leave the watchdog to do its work.
            .process_group(0)
            .spawn()
            .map_err(|e| GpuError::io("starting the MPS watchdog (/bin/sh)", e))?;
        let stdin = child.stdin.take();
        Ok(Watchdog { child, stdin })
    }

    /// Tells the watchdog that the daemon was stopped, and reaps it.
    fn disarm(mut self) {
        if let Some(mut stdin) = self.stdin.take() {
            let _ = stdin.write_all(b"disarm\n");
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while matches!(self.child.try_wait(), Ok(None)) {
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// What `isolane devices` reports about MPS.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MpsStatus {
    /// A daemon is reachable through the default pipe directory.
    pub daemon_running: bool,
    pub daemon_pids: Vec<i32>,
    pub pipe_dir: String,
    /// The control binary, if found (then isolane can start its own daemon).
    pub control_binary: Option<String>,
    pub can_start: bool,
}

pub fn status() -> MpsStatus {
    let dir = default_pipe_dir();
    let existing = detect_existing(&dir);
    let control = find_control_binary(None).ok();
    MpsStatus {
        daemon_running: existing.is_some(),
        daemon_pids: existing.map(|e| e.pids).unwrap_or_default(),
        pipe_dir: dir.display().to_string(),
        can_start: control.is_some(),
        control_binary: control.map(|p| p.display().to_string()),
    }
}

/// A shell script that behaves enough like `nvidia-cuda-mps-control` for tests (built for tests
/// only: `cfg(test)` or the `test-support` feature, which only dev-dependencies enable): `-d` starts a
/// background daemon that creates `$CUDA_MPS_PIPE_DIRECTORY/control` and waits; `quit` on the
/// control program's stdin makes the daemon remove the pipe and exit. The daemon writes its pid
/// to `$CUDA_MPS_PIPE_DIRECTORY/fake-daemon.pid`.
#[cfg(any(test, feature = "test-support"))]
pub const FAKE_CONTROL_SCRIPT: &str = r#"#!/bin/sh
# Fake nvidia-cuda-mps-control for isolane's tests.
dir="${CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps}"
if [ "$1" = "-d" ]; then
    sh "$0" --daemon-loop </dev/null >/dev/null 2>&1 &
    exit 0
fi
if [ "$1" = "--daemon-loop" ]; then
    mkdir -p "$dir"
    echo $$ > "$dir/fake-daemon.pid"
    echo "${CUDA_VISIBLE_DEVICES:-}" > "$dir/fake-daemon.gpu"
    : > "$dir/control"
    trap 'rm -f "$dir/control"; exit 0' TERM INT
    while [ ! -e "$dir/quit-request" ]; do sleep 0.05; done
    rm -f "$dir/control" "$dir/quit-request"
    exit 0
fi
while read -r line; do
    case "$line" in
        quit*)
            : > "$dir/quit-request"
            n=0
            while [ -e "$dir/control" ] && [ $n -lt 100 ]; do sleep 0.05; n=$((n+1)); done
            exit 0 ;;
        *) echo "unknown command: $line" ;;
    esac
done
exit 0
"#;

/// Writes [`FAKE_CONTROL_SCRIPT`] as an executable `nvidia-cuda-mps-control` in `dir`.
#[cfg(any(test, feature = "test-support"))]
pub fn write_fake_control(dir: &Path) -> Result<PathBuf> {
    let p = dir.join(CONTROL_NAME);
    write_executable(&p, FAKE_CONTROL_SCRIPT)?;
    Ok(p)
}

/// Writes `text` to `path` as an executable (mode 0755) through a separate `sh` process, so that
/// this process never holds a file descriptor to it: a test binary forks children from other
/// threads at any time, and a child forked while we held the file open for writing would keep
/// it open until its exec, making our own exec of the script fail with `Text file busy`.
#[cfg(any(test, feature = "test-support"))]
pub fn write_executable(path: &Path, text: &str) -> Result<()> {
    let what = || format!("writing {}", path.display());
    let mut writer = Command::new("/bin/sh")
        .args(["-c", r#"cat > "$1" && chmod 755 "$1""#, "sh"])
        .arg(path)
        .stdin(Stdio::piped())
        .spawn()
        .map_err(|e| GpuError::io(what(), e))?;
    let written = writer
        .stdin
        .take()
        .map(|mut stdin| stdin.write_all(text.as_bytes()))
        .unwrap_or(Ok(()));
    let status = writer.wait().map_err(|e| GpuError::io(what(), e))?;
    written.map_err(|e| GpuError::io(what(), e))?;
    if status.success() {
        Ok(())
    } else {
        Err(GpuError::Mps(format!(
            "{}: sh exited with {status}",
            what()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mps_processes_are_recognised_by_program_or_script() {
        let v = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert!(is_mps_process(&v(&["nvidia-cuda-mps-control", "-d"])));
        assert!(is_mps_process(&v(&[
            "/usr/local/nvidia/bin/nvidia-cuda-mps-server"
        ])));
        assert!(is_mps_process(&v(&[
            "sh",
            "/tmp/x/nvidia-cuda-mps-control",
            "--daemon-loop"
        ])));
        assert!(!is_mps_process(&v(&[
            "sh",
            "-c",
            "echo nvidia-cuda-mps-control"
        ])));
        assert!(!is_mps_process(&v(&["bash"])));
    }

    #[test]
    fn our_own_process_is_read_from_proc() {
        let me = read_proc(std::process::id() as i32).expect("own /proc entry");
        assert!(!me.argv.is_empty());
        assert!(me.pgid > 0);
    }
}
