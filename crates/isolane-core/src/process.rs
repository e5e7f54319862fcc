//! Child processes that end with the isolane process that started them.
//!
//! Every child isolane starts for a run (worker processes, probe workers) is set up with
//! [`die_with_parent`], so that even a `kill -9` of the coordinator, which runs no clean-up code,
//! leaves none of them behind. (The MPS daemon is not such a child: it daemonizes itself; its
//! watchdog in `isolane_gpu::mps` covers it.)

use std::os::unix::process::CommandExt as _;
use std::process::Command;

/// Makes the child that `cmd` starts receive SIGKILL when the thread that spawns it exits
/// (Linux `PR_SET_PDEATHSIG`), which includes the whole process being killed.
///
/// The kernel ties the signal to the **thread** that forked, not to the process (prctl(2)): the
/// thread that calls `cmd.spawn()` must outlive the child, e.g. by waiting for it, as the
/// runtime's per-worker threads and the probe agents do. A child whose parent died between the
/// fork and the prctl call would never get the signal; it checks its parent's pid after the call
/// and fails to start instead (the spawn then returns an error).
pub fn die_with_parent(cmd: &mut Command) -> &mut Command {
    // Read before the fork: in the child, getppid() must name this process.
    // SAFETY: getpid has no preconditions.
    let parent = unsafe { libc::getpid() };
    let arm = move || -> std::io::Result<()> {
        // SAFETY: prctl(PR_SET_PDEATHSIG) takes a signal number and no pointers; it is a plain
        // system call, async-signal-safe as the code between fork and exec must be.
        let rc = unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: getppid has no preconditions and is async-signal-safe.
        if unsafe { libc::getppid() } != parent {
            // ESRCH: the process to follow is gone.
            return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
        }
        Ok(())
    };
    // SAFETY: the closure only makes the system calls above and builds errors from an errno
    // (no allocation, no locks), as the code between fork and exec of a threaded process must.
    unsafe { cmd.pre_exec(arm) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn alive(pid: i32) -> bool {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Ok(s) => !matches!(
                s.rsplit_once(')')
                    .and_then(|(_, r)| r.split_whitespace().next()),
                Some("Z") | Some("X")
            ),
            Err(_) => false,
        }
    }

    /// A spawning thread that exits takes its child along (the thread, not the process, is the
    /// parent PDEATHSIG watches).
    #[test]
    fn the_child_dies_with_the_thread_that_spawned_it() {
        let pid = std::thread::spawn(|| {
            // Not waited for on purpose: the thread ends while its child runs.
            #[allow(clippy::zombie_processes)]
            let child = die_with_parent(Command::new("sleep").arg("60"))
                .spawn()
                .expect("spawning sleep");
            child.id() as i32
        })
        .join()
        .expect("the spawning thread");
        let deadline = Instant::now() + Duration::from_secs(20);
        while alive(pid) {
            assert!(
                Instant::now() < deadline,
                "sleep {pid} outlived its parent thread"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
