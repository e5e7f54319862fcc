//! Result files (DESIGN.md, "Output layout"): the output directory, atomic writes, the per-job
//! CSV and reading results back for `isolane compare`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use isolane_core::JobRecord;

#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    #[error(
        "output directory {0} exists and is not empty; choose another --out, or pass --force to \
         replace isolane's files in it"
    )]
    NotEmpty(PathBuf),
    /// The output folder cannot be made or used: the user's to fix (another --out).
    #[error(
        "cannot use {} as the output folder: {error}; choose an --out where you can write",
        path.display()
    )]
    Unusable {
        path: PathBuf,
        // Not a `#[source]`: the message holds it already, and a chain would print it twice.
        error: std::io::Error,
    },
    #[error("{}: {error}", path.display())]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{path}: {detail}")]
    Parse { path: PathBuf, detail: String },
}

impl OutputError {
    /// A user's mistake (exit code 2): an occupied or unusable directory, or an unreadable
    /// result file.
    pub fn is_user_error(&self) -> bool {
        matches!(
            self,
            OutputError::NotEmpty(_) | OutputError::Parse { .. } | OutputError::Unusable { .. }
        )
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> OutputError + '_ {
    move |error| OutputError::Io {
        path: path.to_path_buf(),
        error,
    }
}

/// For the output folder itself: a failure to make or read it is the user's choice of folder.
fn unusable(path: &Path) -> impl FnOnce(std::io::Error) -> OutputError + '_ {
    move |error| OutputError::Unusable {
        path: path.to_path_buf(),
        error,
    }
}

/// Files (and the `jobs/` folder) that isolane writes into an output directory; `--force`
/// removes exactly these before a run, so stale results of another run never mix in.
pub const OUTPUT_FILES: &[&str] = &[
    "summary.json",
    "scenario.toml",
    "isolation.csv",
    "maxrate.json",
    "maxrate_trace.csv",
    "telemetry.csv",
    "sweep.json",
    "interference.json",
    "interference.csv",
    "coexec.json",
    "coexec.csv",
    "report.html",
    "trace.json",
];

/// Makes the directory a run writes into.
///
/// - `out = Some(dir)`: created if missing; if it exists and is not empty, refused unless
///   `force`, which removes isolane's own files in it (other files are left alone).
/// - `out = None`: a new `runs/<YYYYmmdd-HHMMSS>` (local time) under `base`, with `-2`, `-3`, …
///   appended if that exists; `create_dir` makes the choice race-free, so an existing folder is
///   never reused.
pub fn prepare_out_dir(
    out: Option<&Path>,
    force: bool,
    base: &Path,
) -> Result<PathBuf, OutputError> {
    match out {
        Some(dir) => {
            if dir.exists() {
                let mut entries = std::fs::read_dir(dir).map_err(unusable(dir))?;
                if entries.next().is_some() {
                    if !force {
                        return Err(OutputError::NotEmpty(dir.to_path_buf()));
                    }
                    for f in OUTPUT_FILES {
                        let p = dir.join(f);
                        if p.exists() {
                            std::fs::remove_file(&p).map_err(io(&p))?;
                        }
                    }
                    let jobs = dir.join("jobs");
                    if jobs.is_dir() {
                        for e in std::fs::read_dir(&jobs).map_err(io(&jobs))? {
                            let p = e.map_err(io(&jobs))?.path();
                            if p.extension().is_some_and(|x| x == "csv") {
                                std::fs::remove_file(&p).map_err(io(&p))?;
                            }
                        }
                    }
                }
            }
            std::fs::create_dir_all(dir).map_err(unusable(dir))?;
            check_writable(dir)?;
            Ok(dir.to_path_buf())
        }
        None => {
            let runs = base.join("runs");
            std::fs::create_dir_all(&runs).map_err(unusable(&runs))?;
            let stamp = chrono::Local::now().format("%Y%m%d-%H%M%S").to_string();
            for n in 1..10_000 {
                let name = if n == 1 {
                    stamp.clone()
                } else {
                    format!("{stamp}-{n}")
                };
                let dir = runs.join(name);
                match std::fs::create_dir(&dir) {
                    Ok(()) => return Ok(dir),
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                    Err(e) => {
                        return Err(OutputError::Unusable {
                            path: dir,
                            error: e,
                        })
                    }
                }
            }
            Err(OutputError::Io {
                path: runs,
                error: std::io::Error::other("no free run folder name left for this second"),
            })
        }
    }
}

/// An existing folder may still refuse files (read-only, another owner): find out before a run
/// starts rather than after it measured everything.
fn check_writable(dir: &Path) -> Result<(), OutputError> {
    let probe = dir.join(format!(".isolane-write-test{}", std::process::id()));
    std::fs::File::create(&probe).map_err(unusable(dir))?;
    std::fs::remove_file(&probe).map_err(unusable(dir))
}

/// Writes `bytes` to `path` atomically ([`isolane_core::files::write_atomic`]).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), OutputError> {
    isolane_core::files::write_atomic(path, bytes).map_err(io(path))
}

/// Header of `jobs/<workload>.csv`.
pub const JOBS_CSV_HEADER: &str = "job,release_ms,start_ms,end_ms,latency_ms,timeout,held_ms";

/// The header before `held_ms` existed (results written before criticality): still read.
const JOBS_CSV_HEADER_V1: &str = "job,release_ms,start_ms,end_ms,latency_ms,timeout";

fn ms(ns: i64) -> String {
    format!("{:.6}", ns as f64 / 1e6)
}

/// The per-job CSV: times in ms since t0 (ns precision), empty cells for a skipped job,
/// `timeout` 1 or 0, `held_ms` the time the criticality guard held the job back.
pub fn jobs_csv(records: &[JobRecord]) -> String {
    let mut s = String::with_capacity(64 * (records.len() + 1));
    s.push_str(JOBS_CSV_HEADER);
    s.push('\n');
    push_job_rows(&mut s, records);
    s
}

/// Appends one CSV row per record (each ending in a newline) to `s`.
pub fn push_job_rows(s: &mut String, records: &[JobRecord]) {
    for r in records {
        let _ = write!(s, "{},{},", r.index, ms(r.release_ns));
        match (r.start_ns, r.end_ns) {
            (Some(a), Some(b)) => {
                let _ = write!(s, "{},{},{}", ms(a), ms(b), ms(b - r.release_ns));
            }
            _ => s.push_str(",,"),
        }
        let _ = write!(s, ",{},", r.timeout as u8);
        if r.held_ns == 0 {
            s.push_str("0\n");
        } else {
            let _ = writeln!(s, "{}", ms(r.held_ns));
        }
    }
}

pub use isolane_core::files::jobs_file_name;

pub fn write_jobs_csv(
    dir: &Path,
    workload: &str,
    records: &[JobRecord],
) -> Result<(), OutputError> {
    write_atomic(
        &dir.join("jobs").join(jobs_file_name(workload)),
        jobs_csv(records).as_bytes(),
    )
}

/// Reads `jobs/<workload>.csv` back into records (ms → ns).
pub fn read_jobs_csv(path: &Path) -> Result<Vec<JobRecord>, OutputError> {
    let text = std::fs::read_to_string(path).map_err(io(path))?;
    parse_jobs_csv(path, &text)
}

/// The records of a jobs CSV that a killed run was writing: every complete row. A last row cut
/// off by the kill (no newline at its end, and not a whole record) is left out, and said so in
/// the second value; a malformed row anywhere else is an error as in [`read_jobs_csv`].
pub fn read_jobs_csv_partial(path: &Path) -> Result<(Vec<JobRecord>, Option<String>), OutputError> {
    let text = std::fs::read_to_string(path).map_err(io(path))?;
    let cut = if text.ends_with('\n') {
        None
    } else {
        text.rfind('\n').map(|i| i + 1)
    };
    if let Some(start) = cut {
        let (whole, torn) = text.split_at(start);
        // A torn row that still parses whole (only its newline is missing) is kept.
        if let Ok(records) = parse_jobs_csv(path, &text) {
            return Ok((records, None));
        }
        let note = format!(
            "{}: left out the last row, cut off when the run was killed: {torn:?}",
            path.display()
        );
        return Ok((parse_jobs_csv(path, whole)?, Some(note)));
    }
    Ok((parse_jobs_csv(path, &text)?, None))
}

fn parse_jobs_csv(path: &Path, text: &str) -> Result<Vec<JobRecord>, OutputError> {
    let bad = |line: usize, what: &str| OutputError::Parse {
        path: path.to_path_buf(),
        detail: format!("line {line}: {what}"),
    };
    let mut lines = text.lines().enumerate();
    let fields = match lines.next() {
        Some((_, h)) if h.trim() == JOBS_CSV_HEADER => 7,
        Some((_, h)) if h.trim() == JOBS_CSV_HEADER_V1 => 6,
        _ => return Err(bad(1, &format!("expected the header `{JOBS_CSV_HEADER}`"))),
    };
    let ns = |s: &str| -> Option<Option<i64>> {
        if s.is_empty() {
            Some(None)
        } else {
            s.parse::<f64>()
                .ok()
                .map(|v| Some((v * 1e6).round() as i64))
        }
    };
    let mut out = Vec::new();
    for (i, line) in lines {
        if line.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split(',').collect();
        if f.len() != fields {
            return Err(bad(i + 1, &format!("expected {fields} fields")));
        }
        let parsed = (|| {
            Some(JobRecord {
                index: f[0].parse().ok()?,
                release_ns: ns(f[1])??,
                start_ns: ns(f[2])?,
                end_ns: ns(f[3])?,
                timeout: match f[5].trim() {
                    "1" | "true" => true,
                    "0" | "false" => false,
                    _ => return None,
                },
                held_ns: match f.get(6) {
                    Some(v) => ns(v.trim())?.unwrap_or(0),
                    None => 0,
                },
            })
        })();
        out.push(parsed.ok_or_else(|| bad(i + 1, "malformed field"))?);
    }
    Ok(out)
}

/// This machine's host name, for summary.json.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_round_trips_and_leaves_skipped_cells_empty() {
        let recs = vec![
            JobRecord {
                index: 0,
                release_ns: 0,
                start_ns: Some(1_500),
                end_ns: Some(4_001_500),
                timeout: false,
                held_ns: 0,
            },
            JobRecord {
                index: 1,
                release_ns: 3_333_333,
                start_ns: None,
                end_ns: None,
                timeout: true,
                held_ns: 0,
            },
            JobRecord {
                index: 2,
                release_ns: 6_666_666,
                start_ns: Some(7_000_000),
                end_ns: Some(9_000_000),
                timeout: false,
                held_ns: 250_000,
            },
        ];
        let csv = jobs_csv(&recs);
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines[0], JOBS_CSV_HEADER);
        assert_eq!(lines[1], "0,0.000000,0.001500,4.001500,4.001500,0,0");
        assert_eq!(lines[2], "1,3.333333,,,,1,0");
        assert_eq!(lines[3], "2,6.666666,7.000000,9.000000,2.333334,0,0.250000");
        let dir = tempfile::tempdir().unwrap();
        write_jobs_csv(dir.path(), "a b", &recs).unwrap();
        let back = read_jobs_csv(&dir.path().join("jobs/a_b.csv")).unwrap();
        assert_eq!(back, recs);
    }

    #[test]
    fn a_jobs_csv_from_before_held_ms_still_reads() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.csv");
        std::fs::write(
            &path,
            "job,release_ms,start_ms,end_ms,latency_ms,timeout\n0,0.0,0.1,1.1,1.1,0\n",
        )
        .unwrap();
        let r = read_jobs_csv(&path).unwrap();
        assert_eq!((r[0].end_ns, r[0].held_ns), (Some(1_100_000), 0));
        // A row with the other format's field count is refused, by line.
        std::fs::write(
            &path,
            "job,release_ms,start_ms,end_ms,latency_ms,timeout\n0,0.0,0.1,1.1,1.1,0,0\n",
        )
        .unwrap();
        let e = read_jobs_csv(&path).unwrap_err().to_string();
        assert!(e.contains("line 2") && e.contains("6 fields"), "{e}");
    }

    #[test]
    fn a_row_cut_off_by_a_kill_is_left_out_and_said() {
        let recs: Vec<JobRecord> = (0..3)
            .map(|k| JobRecord {
                index: k,
                release_ns: k as i64 * 1_000_000,
                start_ns: Some(k as i64 * 1_000_000 + 5),
                end_ns: Some(k as i64 * 1_000_000 + 900_000),
                timeout: false,
                held_ns: 0,
            })
            .collect();
        let csv = jobs_csv(&recs);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.csv");
        // Whole file: everything, no note.
        std::fs::write(&path, &csv).unwrap();
        assert_eq!(read_jobs_csv_partial(&path).unwrap(), (recs.clone(), None));
        // Cut in the middle of the last row: the two whole rows, and a note naming the file.
        std::fs::write(&path, &csv[..csv.len() - 8]).unwrap();
        let (got, note) = read_jobs_csv_partial(&path).unwrap();
        assert_eq!(got, recs[..2]);
        let note = note.unwrap();
        assert!(
            note.contains("a.csv") && note.contains("left out the last row"),
            "{note}"
        );
        // Only the newline missing: the row is whole and kept.
        std::fs::write(&path, &csv[..csv.len() - 1]).unwrap();
        assert_eq!(read_jobs_csv_partial(&path).unwrap(), (recs.clone(), None));
        // A malformed row that is not the last is an error, as in read_jobs_csv.
        let broken = csv.replacen(",0\n", ",x\n", 1);
        std::fs::write(&path, &broken).unwrap();
        assert!(read_jobs_csv_partial(&path).is_err());
    }

    #[test]
    fn out_dir_rules() {
        let base = tempfile::tempdir().unwrap();
        let a = prepare_out_dir(None, false, base.path()).unwrap();
        let b = prepare_out_dir(None, false, base.path()).unwrap();
        assert_ne!(a, b);
        assert!(a.starts_with(base.path().join("runs")));
        write_atomic(&a.join("summary.json"), b"{}").unwrap();
        std::fs::write(a.join("notes.txt"), "mine").unwrap();
        let err = prepare_out_dir(Some(&a), false, base.path()).unwrap_err();
        assert!(err.is_user_error() && err.to_string().contains("--force"));
        prepare_out_dir(Some(&a), true, base.path()).unwrap();
        assert!(!a.join("summary.json").exists());
        assert!(a.join("notes.txt").exists());
        // No temporary files left behind by atomic writes.
        write_atomic(&a.join("x.json"), b"1").unwrap();
        let names: Vec<String> = std::fs::read_dir(&a)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(names.iter().all(|n| !n.contains(".tmp")), "{names:?}");
    }
}
