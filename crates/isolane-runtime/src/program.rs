//! External programs as workloads (a `command = [...]` workload, docs/programs.md).
//!
//! A program starts at t0 in its own process group, with its partition's environment (MPS
//! client settings, a MIG binding) and its CPU pinning, its standard output and error going to
//! `<out>/<workload>.stdout` and `.stderr`. It runs to completion, or until its `duration_s`
//! (stopped: a normal end), its `timeout_s` (stopped: timed out) or isolane's stop flag
//! (Ctrl-C, SIGTERM). Stopping is SIGTERM to the whole group and SIGKILL after
//! [`STOP_GRACE`]; processes of the group still alive when the program itself has ended are
//! stopped the same way, so that nothing is left behind. The program dies with isolane
//! (`PR_SET_PDEATHSIG`) even on a `kill -9`; its descendants are reached through the group
//! while isolane lives.
//!
//! Measured here: wall time, how it ended, CPU time (getrusage of the reaped program: it and
//! every descendant it waited for) and every pid of its group seen while it ran (sampled every
//! [`SCAN_EVERY`]), by which telemetry attributes device memory and GPU use to it.

use std::collections::BTreeSet;
use std::fs::File;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use isolane_core::results::ProgramEnd;
use isolane_core::spec::ProgramSpec;

use crate::clock;

/// Between SIGTERM and SIGKILL: time for a program to shut down cleanly (a server closing its
/// CUDA context, flushing its output).
pub const STOP_GRACE: Duration = Duration::from_secs(3);
/// How often the program's end, its deadlines and the stop flag are checked.
const POLL: Duration = Duration::from_millis(10);
/// How often its process group is listed (its pids, for telemetry).
const SCAN_EVERY: Duration = Duration::from_millis(200);

/// One program to run.
pub struct ProgramLaunch<'a> {
    /// The workload's name: names its output files and its errors.
    pub name: &'a str,
    pub spec: &'a ProgramSpec,
    /// CPU cores it is pinned to (empty: not pinned).
    pub cpu: &'a [usize],
    /// Its partition's environment, applied after the program's own `env` (validation refuses
    /// an `env` that sets these).
    pub partition_env: &'a [(String, String)],
    /// Where `<name>.stdout` and `<name>.stderr` are written; `None`: discarded.
    pub out_dir: Option<&'a Path>,
}

/// CPU use of a reaped program and the descendants it waited for.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ProgramUsage {
    pub user_s: f64,
    pub system_s: f64,
    pub max_rss_mib: f64,
}

/// What running a program measured.
#[derive(Debug, Clone, PartialEq)]
pub struct ProgramOutcome {
    pub end: ProgramEnd,
    pub exit_code: Option<i32>,
    /// The signal that ended it (also SIGTERM or SIGKILL when isolane stopped it).
    pub signal: Option<i32>,
    /// Why it could not start, when it did not.
    pub error: Option<String>,
    /// CLOCK_MONOTONIC ns of its start and end (equal when it never started).
    pub started_ns: i64,
    pub ended_ns: i64,
    pub usage: ProgramUsage,
    /// Every process of its group seen while it ran, the program first.
    pub pids: Vec<u32>,
    pub stdout: Option<PathBuf>,
    pub stderr: Option<PathBuf>,
}

impl ProgramOutcome {
    fn not_started(error: String, at_ns: i64) -> ProgramOutcome {
        ProgramOutcome {
            end: ProgramEnd::NotStarted,
            exit_code: None,
            signal: None,
            error: Some(error),
            started_ns: at_ns,
            ended_ns: at_ns,
            usage: ProgramUsage::default(),
            pids: Vec::new(),
            stdout: None,
            stderr: None,
        }
    }

    /// Wall time from its start to its end (s).
    pub fn wall_s(&self) -> f64 {
        (self.ended_ns - self.started_ns).max(0) as f64 / 1e9
    }

    /// The last `max_chars` characters of what it wrote to its standard error, to explain a
    /// failure (`None`: nothing, or no file).
    pub fn stderr_tail(&self, max_chars: usize) -> Option<String> {
        use std::io::{Read as _, Seek as _, SeekFrom};
        let mut file = File::open(self.stderr.as_ref()?).ok()?;
        // Only the end of the file is read (a chatty program's stderr may be large); at most
        // 4 bytes a character in UTF-8.
        let len = file.metadata().ok()?.len();
        let from = len.saturating_sub(4 * max_chars as u64);
        file.seek(SeekFrom::Start(from)).ok()?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).ok()?;
        let text = String::from_utf8_lossy(&bytes);
        let text = text.trim();
        let skip = text.chars().count().saturating_sub(max_chars);
        let tail: String = text.chars().skip(skip).collect();
        (!tail.is_empty()).then_some(tail)
    }

    /// Why the workload failed, or `None` when this end is a success (exit status 0, or
    /// stopped at its duration) or an interruption.
    pub fn failure(&self, spec: &ProgramSpec) -> Option<String> {
        match self.end {
            ProgramEnd::Exited if self.exit_code == Some(0) => None,
            ProgramEnd::StoppedAtDuration | ProgramEnd::Interrupted => None,
            ProgramEnd::Exited => Some(format!(
                "the program exited with status {}",
                self.exit_code.unwrap_or(-1)
            )),
            ProgramEnd::Killed => {
                let sig = self.signal.unwrap_or(0);
                Some(format!(
                    "the program was killed by signal {sig} ({})",
                    crate::coordinator::signal_name(sig)
                ))
            }
            ProgramEnd::TimedOut => Some(format!(
                "timed out: still running {} s after t0 (timeout_s); stopped",
                spec.timeout_s.unwrap_or(0.0)
            )),
            ProgramEnd::NotStarted => Some(
                self.error
                    .clone()
                    .unwrap_or_else(|| "the program did not start".into()),
            ),
        }
    }
}

/// Runs `launch`'s program from now (the caller starts it at t0, `t0_ns`, which its
/// duration and timeout count from) to its end; `on_start` gets its pid as soon as it runs
/// (an MPS daemon's shutdown path adopts it).
pub fn run_program(
    launch: &ProgramLaunch<'_>,
    t0_ns: i64,
    stop: &AtomicBool,
    on_start: &dyn Fn(u32),
) -> ProgramOutcome {
    let (stdout, stderr) = match output_files(launch) {
        Ok(files) => files,
        Err(e) => return ProgramOutcome::not_started(e, clock::now_ns()),
    };
    let mut cmd = match command(launch, &stdout, &stderr) {
        Ok(c) => c,
        Err(e) => return ProgramOutcome::not_started(e, clock::now_ns()),
    };
    let started_ns = clock::now_ns();
    let child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            let program = launch.spec.command.first().map_or("", String::as_str);
            let mut o =
                ProgramOutcome::not_started(format!("cannot start `{program}`: {e}"), started_ns);
            (o.stdout, o.stderr) = (stdout.path, stderr.path);
            return o;
        }
    };
    // Reaped below with wait4 (for its rusage), never through `child`.
    let pid = child.id();
    on_start(pid);
    let watch = Watch::new(launch.spec, t0_ns);
    let watched = watch.until_exit(pid, stop);
    let ended_ns = clock::now_ns();
    let (status, usage) = reap(pid);
    let (end, exit_code, signal) = classify(watched.stopped_for, status);
    ProgramOutcome {
        end,
        exit_code,
        signal,
        error: None,
        started_ns,
        ended_ns,
        usage,
        pids: watched.pids,
        stdout: stdout.path,
        stderr: stderr.path,
    }
}

/// A stream of the program's, and the file behind it.
struct Output {
    stdio: Option<File>,
    path: Option<PathBuf>,
}

fn output_files(launch: &ProgramLaunch<'_>) -> Result<(Output, Output), String> {
    let Some(dir) = launch.out_dir else {
        let none = || Output {
            stdio: None,
            path: None,
        };
        return Ok((none(), none()));
    };
    let open = |ext: &str| -> Result<Output, String> {
        let path = dir.join(format!("{}.{ext}", launch.name));
        let file =
            File::create(&path).map_err(|e| format!("cannot create {}: {e}", path.display()))?;
        Ok(Output {
            stdio: Some(file),
            path: Some(path),
        })
    };
    Ok((open("stdout")?, open("stderr")?))
}

/// The program's command: its own process group, its environment (its `env`, then the
/// partition's), its directory, pinned, dying with the thread that starts it.
fn command(launch: &ProgramLaunch<'_>, out: &Output, err: &Output) -> Result<Command, String> {
    let spec = launch.spec;
    let program = spec
        .command
        .first()
        .ok_or("the command is empty (validation refuses it)")?;
    let mut cmd = Command::new(program);
    cmd.args(&spec.command[1..])
        .envs(&spec.env)
        .envs(launch.partition_env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .process_group(0);
    let stdio = |o: &Output| -> Result<Stdio, String> {
        match &o.stdio {
            Some(f) => f.try_clone().map(Stdio::from).map_err(|e| e.to_string()),
            None => Ok(Stdio::null()),
        }
    };
    cmd.stdout(stdio(out)?).stderr(stdio(err)?);
    if let Some(dir) = &spec.cwd {
        cmd.current_dir(dir);
    }
    isolane_core::process::die_with_parent(&mut cmd);
    if !launch.cpu.is_empty() {
        crate::affinity::check_cores(launch.cpu)
            .map_err(|e| format!("workload `{}`: {e}", launch.name))?;
        pin_child(&mut cmd, launch.cpu);
    }
    Ok(cmd)
}

/// Pins the child to `cores` (checked against this machine) before it execs.
fn pin_child(cmd: &mut Command, cores: &[usize]) {
    // SAFETY: a cpu_set_t is plain data; all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cores {
        // SAFETY: check_cores found every core on this machine, hence < CPU_SETSIZE.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    let pin = move || -> std::io::Result<()> {
        let size = std::mem::size_of::<libc::cpu_set_t>();
        // SAFETY: `set` is a valid cpu_set_t of `size` bytes, copied into the closure;
        // sched_setaffinity is a plain system call, async-signal-safe as the code between
        // fork and exec must be.
        let rc = unsafe { libc::sched_setaffinity(0, size, &set) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    };
    // SAFETY: the closure makes one system call and builds an error from errno: no
    // allocation, no locks.
    unsafe { cmd.pre_exec(pin) };
}

/// Why isolane stopped the program, when it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StopReason {
    Duration,
    Timeout,
    Interrupted,
}

/// The program's deadlines, as absolute CLOCK_MONOTONIC ns.
struct Watch {
    duration_end: Option<i64>,
    timeout_end: Option<i64>,
}

/// What watching a program saw.
struct Watched {
    stopped_for: Option<StopReason>,
    pids: Vec<u32>,
}

impl Watch {
    fn new(spec: &ProgramSpec, t0_ns: i64) -> Watch {
        let at =
            |s: Option<f64>| s.map(|s| t0_ns.saturating_add(isolane_core::schedule::secs_to_ns(s)));
        Watch {
            duration_end: at(spec.duration_s),
            timeout_end: at(spec.timeout_s),
        }
    }

    /// The reason to stop the program now, if there is one.
    fn due(&self, now: i64, stop: &AtomicBool) -> Option<StopReason> {
        if stop.load(Ordering::Relaxed) {
            Some(StopReason::Interrupted)
        } else if self.timeout_end.is_some_and(|t| now >= t) {
            Some(StopReason::Timeout)
        } else if self.duration_end.is_some_and(|t| now >= t) {
            Some(StopReason::Duration)
        } else {
            None
        }
    }

    /// Polls until the program (`pid`, leader of its group) has exited, stopping it when one
    /// of its deadlines or the stop flag says so; then stops what is left of its group. The
    /// program is left unreaped (a zombie), so that its pid, and so its group's id, cannot be
    /// reused while the group is signalled.
    fn until_exit(&self, pid: u32, stop: &AtomicBool) -> Watched {
        let mut pids = BTreeSet::from([pid]);
        let mut stopped_for = None;
        let mut term_sent_at: Option<i64> = None;
        let mut next_scan = clock::now_ns();
        while !exited(pid) {
            let now = clock::now_ns();
            if now >= next_scan {
                pids.extend(group_members(pid).into_iter().map(|(p, _)| p));
                next_scan = now + SCAN_EVERY.as_nanos() as i64;
            }
            match (term_sent_at, self.due(now, stop)) {
                (None, Some(reason)) => {
                    stopped_for = Some(reason);
                    signal_group(pid, libc::SIGTERM);
                    term_sent_at = Some(now);
                }
                (Some(at), _) if now - at >= STOP_GRACE.as_nanos() as i64 => {
                    signal_group(pid, libc::SIGKILL);
                }
                _ => {}
            }
            std::thread::sleep(POLL);
        }
        pids.extend(group_members(pid).into_iter().map(|(p, _)| p));
        stop_leftovers(pid);
        let first = std::iter::once(pid);
        Watched {
            stopped_for,
            pids: first
                .chain(pids.into_iter().filter(|&p| p != pid))
                .collect(),
        }
    }
}

/// The group's processes still running once its leader has exited: SIGTERM, then SIGKILL
/// after the grace.
fn stop_leftovers(pgid: u32) {
    let alive = || {
        group_members(pgid)
            .iter()
            .any(|&(p, state)| p != pgid && state != 'Z')
    };
    if !alive() {
        return;
    }
    signal_group(pgid, libc::SIGTERM);
    let deadline = clock::now_ns() + STOP_GRACE.as_nanos() as i64;
    while alive() {
        if clock::now_ns() >= deadline {
            signal_group(pgid, libc::SIGKILL);
            return;
        }
        std::thread::sleep(POLL);
    }
}

fn signal_group(pgid: u32, sig: libc::c_int) {
    let Ok(pgid) = libc::pid_t::try_from(pgid) else {
        return;
    };
    // SAFETY: kill takes plain integers; a negative pid names the process group, which is the
    // program's own (it is its leader, and still unreaped, so the id is not reused).
    unsafe { libc::kill(-pgid, sig) };
}

/// Whether `pid` (our child) has exited, leaving it unreaped.
fn exited(pid: u32) -> bool {
    // SAFETY: siginfo_t is plain data; all zeroes is a valid value to be overwritten.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    let flags = libc::WEXITED | libc::WNOHANG | libc::WNOWAIT;
    // SAFETY: `info` is a valid, writable siginfo_t; `pid` is our own child.
    let rc = unsafe { libc::waitid(libc::P_PID, pid, &mut info, flags) };
    // SAFETY: waitid filled `info`; si_pid is 0 when the child has not changed state.
    rc != 0 || unsafe { info.si_pid() } != 0
}

/// Reaps the exited `pid`: its wait status and the rusage of it and its waited-for
/// descendants.
fn reap(pid: u32) -> (Option<libc::c_int>, ProgramUsage) {
    let mut status: libc::c_int = 0;
    // SAFETY: rusage is plain data; all zeroes is a valid value to be overwritten.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let Ok(p) = libc::pid_t::try_from(pid) else {
        return (None, ProgramUsage::default());
    };
    // SAFETY: `status` and `ru` are valid and writable; `p` is our exited, unreaped child.
    let rc = unsafe { libc::wait4(p, &mut status, 0, &mut ru) };
    if rc != p {
        return (None, ProgramUsage::default());
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    let usage = ProgramUsage {
        user_s: secs(ru.ru_utime),
        system_s: secs(ru.ru_stime),
        // Linux reports KiB.
        max_rss_mib: ru.ru_maxrss as f64 / 1024.0,
    };
    (Some(status), usage)
}

/// How the program ended, its exit code and its signal.
fn classify(
    stopped_for: Option<StopReason>,
    status: Option<libc::c_int>,
) -> (ProgramEnd, Option<i32>, Option<i32>) {
    let (code, signal) = match status {
        Some(s) if libc::WIFEXITED(s) => (Some(libc::WEXITSTATUS(s)), None),
        Some(s) if libc::WIFSIGNALED(s) => (None, Some(libc::WTERMSIG(s))),
        _ => (None, None),
    };
    let end = match stopped_for {
        Some(StopReason::Duration) => ProgramEnd::StoppedAtDuration,
        Some(StopReason::Timeout) => ProgramEnd::TimedOut,
        Some(StopReason::Interrupted) => ProgramEnd::Interrupted,
        None if signal.is_some() => ProgramEnd::Killed,
        None => ProgramEnd::Exited,
    };
    (end, code, signal)
}

/// The processes of process group `pgid` (pid, state letter), from /proc. A process that
/// leaves the group (`setsid`) is not followed.
fn group_members(pgid: u32) -> Vec<(u32, char)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let (state, group) = stat_state_and_group(&stat)?;
            (group == pgid).then_some((pid, state))
        })
        .collect()
}

/// The state letter and process group of a /proc/PID/stat line (the command name, in
/// parentheses, may hold spaces and parentheses: the fields follow its last `)`).
fn stat_state_and_group(stat: &str) -> Option<(char, u32)> {
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let _ppid = fields.next()?;
    let group = fields.next()?.parse().ok()?;
    Some((state, group))
}

#[cfg(test)]
mod tests;
