//! CPU pinning of the calling thread (a thread host's workload thread, or a worker process's
//! main thread before it starts any other).

#[derive(Debug, thiserror::Error)]
pub enum AffinityError {
    #[error(
        "cpu core {core} does not exist or is not available to this process (available: {available})"
    )]
    NoSuchCore { core: usize, available: String },
    #[error("sched_setaffinity failed: {0}")]
    Os(std::io::Error),
}

/// The cores this process may run on.
pub fn available_cores() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data; zeroed is a valid (empty) set, and sched_getaffinity
    // writes at most size_of::<cpu_set_t>() bytes into it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: pid 0 = the calling thread; the pointer and size describe `set`.
    let rc =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return Vec::new();
    }
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: i < CPU_SETSIZE, the bound CPU_ISSET requires.
        .filter(|&i| unsafe { libc::CPU_ISSET(i, &set) })
        .collect()
}

/// Checks that every core in `cores` exists and is available, without pinning anything.
pub fn check_cores(cores: &[usize]) -> Result<(), AffinityError> {
    let available = available_cores();
    for &c in cores {
        if !available.contains(&c) {
            return Err(AffinityError::NoSuchCore {
                core: c,
                available: format_cores(&available),
            });
        }
    }
    Ok(())
}

/// Pins the calling thread to `cores`. An empty list leaves it unpinned.
pub fn pin_current_thread(cores: &[usize]) -> Result<(), AffinityError> {
    if cores.is_empty() {
        return Ok(());
    }
    check_cores(cores)?;
    // SAFETY: as in available_cores: zeroed cpu_set_t is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cores {
        // SAFETY: check_cores guaranteed c is a listed core, hence < CPU_SETSIZE.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: pid 0 = the calling thread; pointer and size describe `set`.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if rc != 0 {
        return Err(AffinityError::Os(std::io::Error::last_os_error()));
    }
    Ok(())
}

fn format_cores(cores: &[usize]) -> String {
    if cores.is_empty() {
        return "none".into();
    }
    cores
        .iter()
        .map(|c| c.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_to_an_available_core_and_rejects_a_missing_one() {
        let cores = available_cores();
        assert!(!cores.is_empty());
        let c = cores[0];
        std::thread::spawn(move || pin_current_thread(&[c]).unwrap())
            .join()
            .unwrap();
        let err = check_cores(&[100_000]).unwrap_err();
        assert!(
            err.to_string().contains("cpu core 100000 does not exist"),
            "{err}"
        );
    }
}
