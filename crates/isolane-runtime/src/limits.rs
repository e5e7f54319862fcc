//! What this machine can hold, checked before a run starts anything: the job records every
//! workload keeps in memory (docs/runtime.md, "Limits"). Scenario validation bounds each count
//! on its own (`isolane_core::spec::limits`); this module checks their sum against the memory
//! of the machine the run is on.

use std::path::Path;

use isolane_core::JobRecord;

/// Share of this machine's memory that the job records of one run may take: the rest is for the
/// models, their activations and the system.
pub const RECORDS_MEMORY_SHARE: f64 = 0.5;

/// Bytes one warm-up job keeps (its service time, an `i64`).
const WARMUP_BYTES: u128 = std::mem::size_of::<i64>() as u128;

/// The memory of this machine as a run can use it, in bytes: `MemTotal` of /proc/meminfo, or the
/// cgroup's `memory.max` when that is lower (a container). `None` where neither can be read.
pub fn host_memory_bytes() -> Option<u64> {
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| mem_total_bytes(&text));
    let cgroup = std::fs::read_to_string(Path::new("/sys/fs/cgroup/memory.max"))
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok());
    match (total, cgroup) {
        (Some(t), Some(c)) => Some(t.min(c)),
        (t, c) => t.or(c),
    }
}

/// `MemTotal` of a /proc/meminfo text, in bytes.
fn mem_total_bytes(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// What one workload will keep in memory while it runs.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordDemand {
    /// The workload's name.
    pub workload: String,
    /// Jobs it releases, when known ahead (closed loop with a duration: unknown).
    pub jobs: Option<u64>,
    pub warmup_jobs: u64,
    /// Which setting makes the count, in the user's terms (`rate_hz × duration_s`, `jobs`,
    /// `--jobs`): named in the message.
    pub source: String,
}

impl RecordDemand {
    /// Bytes of its records and warm-up times.
    pub fn bytes(&self) -> u128 {
        let record = std::mem::size_of::<JobRecord>() as u128;
        u128::from(self.jobs.unwrap_or(0)) * record + u128::from(self.warmup_jobs) * WARMUP_BYTES
    }
}

/// A run that cannot fit this machine.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error(
    "the job records of this run need {need}, more than the {share:.0} % of this machine's \
     memory ({total}) they may take, at most {limit}: {detail}; lower the rate, the duration or \
     the job count"
)]
pub struct RecordsTooLarge {
    need: String,
    total: String,
    limit: String,
    share: f64,
    detail: String,
}

/// Checks that every workload's records together fit [`RECORDS_MEMORY_SHARE`] of
/// `memory_bytes`.
pub fn check_records(demands: &[RecordDemand], memory_bytes: u64) -> Result<(), RecordsTooLarge> {
    let need: u128 = demands.iter().map(RecordDemand::bytes).sum();
    let limit = (memory_bytes as f64 * RECORDS_MEMORY_SHARE) as u128;
    if need <= limit {
        return Ok(());
    }
    let mut by_size: Vec<&RecordDemand> = demands.iter().filter(|d| d.bytes() > 0).collect();
    by_size.sort_by_key(|d| std::cmp::Reverse(d.bytes()));
    let detail = by_size
        .iter()
        .take(3)
        .map(|d| {
            let mut s = format!("workload `{}`: ", d.workload);
            if let Some(j) = d.jobs {
                s += &format!("{j} jobs ({})", d.source);
            }
            if d.warmup_jobs > 0 {
                if d.jobs.is_some() {
                    s += " and ";
                }
                s += &format!("{} warm-up jobs", d.warmup_jobs);
            }
            s + &format!(", {}", human_bytes(d.bytes()))
        })
        .collect::<Vec<_>>()
        .join("; ");
    Err(RecordsTooLarge {
        need: human_bytes(need),
        total: human_bytes(u128::from(memory_bytes)),
        limit: human_bytes(limit),
        share: RECORDS_MEMORY_SHARE * 100.0,
        detail,
    })
}

/// Bytes one job's row of `jobs/<workload>.csv` takes at most: a job index and four times in ms
/// with 6 decimals (17 characters for 100 days), a timeout flag and the separators.
pub const JOB_ROW_BYTES: u128 = 80;

/// A run whose streamed job records would not fit the disk of its output folder.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error(
    "the per-job records of this run (jobs/*.csv) need up to {need} on the disk of {dir}, which \
     has {free} free ({jobs} jobs; the files are streamed, then rewritten once at the end, so \
     twice their size must fit); lower the rate, the duration or the job count, or choose another \
     --out"
)]
pub struct DiskTooSmall {
    need: String,
    free: String,
    dir: String,
    jobs: u128,
}

/// Free bytes (for an unprivileged user) on the file system of `dir`, or of its nearest existing
/// ancestor when it does not exist yet. `None` where it cannot be read.
pub fn disk_free_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let existing = dir.ancestors().find(|p| p.exists())?;
    let existing = if existing.as_os_str().is_empty() {
        Path::new(".")
    } else {
        existing
    };
    let c = std::ffi::CString::new(existing.as_os_str().as_bytes()).ok()?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: `c` is a NUL-terminated path and `st` a writable statvfs, as statvfs(3) requires.
    let rc = unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: statvfs returned 0, so it filled `st`.
    let st = unsafe { st.assume_init() };
    // A file system of no blocks (/proc, /sys) holds no files at all: whether the folder can be
    // made there is for the output folder's own check to say, not a count of free bytes (issue
    // 31: `--out /proc/x` was told the disk was too small).
    if st.f_blocks == 0 {
        return None;
    }
    u64::try_from(u128::from(st.f_bavail) * u128::from(st.f_frsize)).ok()
}

/// Checks that the job records of `demands`, streamed to CSV, fit twice into `free_bytes`.
pub fn check_disk(
    demands: &[RecordDemand],
    free_bytes: u64,
    dir: &Path,
) -> Result<(), DiskTooSmall> {
    let jobs: u128 = demands
        .iter()
        .map(|d| u128::from(d.jobs.unwrap_or(0)))
        .sum();
    let need = jobs * JOB_ROW_BYTES * 2;
    if need <= u128::from(free_bytes) {
        return Ok(());
    }
    Err(DiskTooSmall {
        need: human_bytes(need),
        free: human_bytes(u128::from(free_bytes)),
        dir: dir.display().to_string(),
        jobs,
    })
}

/// Bytes in the largest binary unit that keeps the number ≥ 1 (`1.5 GiB`).
pub fn human_bytes(b: u128) -> String {
    const UNITS: [&str; 7] = ["bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut v = b as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{b} bytes")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn demand(jobs: Option<u64>, warmup_jobs: u64) -> RecordDemand {
        RecordDemand {
            workload: "a".into(),
            jobs,
            warmup_jobs,
            source: "rate_hz × duration_s".into(),
        }
    }

    #[test]
    fn reads_mem_total() {
        let text = "MemTotal:       16318412 kB\nMemFree:         1234 kB\n";
        assert_eq!(mem_total_bytes(text), Some(16318412 * 1024));
        assert_eq!(mem_total_bytes("MemFree: 1 kB\n"), None);
        assert!(host_memory_bytes().is_some_and(|b| b > 0));
    }

    #[test]
    fn records_within_half_the_memory_pass_and_beyond_it_are_refused() {
        let record = std::mem::size_of::<JobRecord>() as u64;
        let memory = 1 << 30;
        let fits = memory / 2 / record;
        assert!(check_records(&[demand(Some(fits), 0)], memory).is_ok());
        let e = check_records(&[demand(Some(fits + 1), 0)], memory).unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("workload `a`")
                && text.contains(&format!("{} jobs (rate_hz × duration_s)", fits + 1))
                && text.contains("1.0 GiB")
                && text.contains("512.0 MiB"),
            "{text}"
        );
        // Warm-up jobs count too, and a count that no machine holds does not overflow.
        assert!(check_records(&[demand(None, u64::MAX)], memory).is_err());
        assert!(check_records(&[demand(Some(u64::MAX), u64::MAX)], u64::MAX).is_err());
        assert!(check_records(&[demand(None, 0)], memory).is_ok());
    }

    #[test]
    fn streamed_records_must_fit_the_disk_twice() {
        let dir = Path::new("/out");
        let d = [demand(Some(1_000_000), 0)];
        assert!(check_disk(&d, 160_000_000, dir).is_ok());
        let e = check_disk(&d, 159_999_999, dir).unwrap_err().to_string();
        assert!(e.contains("/out") && e.contains("1000000 jobs"), "{e}");
        assert!(e.contains("152.6 MiB"), "{e}");
    }

    #[test]
    fn free_disk_is_read_from_the_nearest_existing_folder() {
        let tmp = tempfile::tempdir().unwrap();
        let missing = disk_free_bytes(&tmp.path().join("no-such/deeper")).unwrap();
        let there = disk_free_bytes(tmp.path()).unwrap();
        assert!(missing > 0);
        // The same file system, read twice while other processes may write to it.
        assert!(
            missing.abs_diff(there) < there / 10 + (64 << 20),
            "{missing} vs {there}"
        );
    }

    #[test]
    fn the_disk_message_has_no_runs_of_spaces_and_proc_has_no_free_space_to_count() {
        let e = check_disk(&[demand(Some(1_000_000), 0)], 1, Path::new("/out"))
            .unwrap_err()
            .to_string();
        assert!(!e.contains("  "), "{e}");
        assert_eq!(disk_free_bytes(Path::new("/proc/x")), None);
    }

    #[test]
    fn human_bytes_picks_a_unit() {
        assert_eq!(human_bytes(512), "512 bytes");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(3 << 30), "3.0 GiB");
    }
}
