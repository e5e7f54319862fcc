//! Result files (DESIGN.md, "Output layout"): the output directory, atomic writes, the per-job
//! CSV and reading results back for `isolane compare`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use isolane_core::results::RunSummary;
use isolane_core::JobRecord;

#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    #[error(
        "output directory {0} exists and is not empty; choose another --out, or pass --force to \
         replace this command's own results in it"
    )]
    NotEmpty(PathBuf),
    /// Another process writes into the folder now (it holds the folder's lock): two runs into
    /// one `--out` at once left a folder mixing their files (one's scenario.toml, the other's
    /// summary.json and jobs/).
    #[error(
        "output directory {0} is in use by another isolane process writing results into it \
         now; wait for it to end, or choose another --out"
    )]
    Busy(PathBuf),
    /// `--force` in a folder holding another command's results: they are not the asking
    /// command's to replace.
    #[error(
        "output directory {} holds the results of `{maker}` ({holds}); `{command} --force` \
         replaces only {command}'s own results, never another command's: choose another --out \
         for this {command}",
        dir.display()
    )]
    Foreign {
        dir: PathBuf,
        holds: String,
        maker: &'static str,
        command: &'static str,
    },
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
    /// A run's files could not all be written (a full disk): what is missing, what was written
    /// instead and how to rebuild ([`write_run_files`]).
    #[error("{0}")]
    RunFiles(String),
}

impl OutputError {
    /// A user's mistake (exit code 2): an occupied or unusable directory, or an unreadable
    /// result file.
    pub fn is_user_error(&self) -> bool {
        matches!(
            self,
            OutputError::NotEmpty(_)
                | OutputError::Busy(_)
                | OutputError::Foreign { .. }
                | OutputError::Parse { .. }
                | OutputError::Unusable { .. }
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

/// The command whose results an output folder holds. `--force` removes only the files of the
/// command that asked ([`Maker::files`]): `maxrate -o RUN --force` deleted a run's summary.json,
/// scenario.toml and jobs/*.csv, none of which maxrate writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Maker {
    /// A run folder: `isolane run` (apps included), and the commands that write one (plan's
    /// verification run, serve's recording, each point of a study).
    Run,
    /// A run folder with its isolation.csv.
    Isolation,
    Maxrate,
    Sweep,
    Interference,
    Coexec,
}

impl Maker {
    /// The makers whose results are told apart by files of their own (a run's and isolation's
    /// by isolation.csv, [`holders`]).
    const STUDIES: [Maker; 4] = [
        Maker::Maxrate,
        Maker::Sweep,
        Maker::Interference,
        Maker::Coexec,
    ];

    /// The command, as the user types it.
    pub fn command(self) -> &'static str {
        match self {
            Maker::Run => "isolane run",
            Maker::Isolation => "isolane isolation",
            Maker::Maxrate => "isolane maxrate",
            Maker::Sweep => "isolane sweep",
            Maker::Interference => "isolane interference",
            Maker::Coexec => "isolane coexec",
        }
    }

    /// The files it writes at the folder's top; a run also writes jobs/*.csv, apps/*.csv and
    /// its programs' `<workload>.stdout`/`.stderr` ([`Maker::writes_jobs`]). A study's point
    /// folders are runs of their own, replaced point by point.
    pub fn files(self) -> &'static [&'static str] {
        match self {
            // autoplan.csv: `serve --out --autoplan`'s decisions, made anew by a serve with
            // --autoplan; one without it left an older serve's beside its own results.
            Maker::Run => &[
                "summary.json",
                "scenario.toml",
                "workloads.csv",
                "telemetry.csv",
                "autoplan.csv",
            ],
            Maker::Isolation => &[
                "summary.json",
                "scenario.toml",
                "workloads.csv",
                "telemetry.csv",
                "isolation.csv",
            ],
            Maker::Maxrate => &["maxrate.json", "maxrate_trace.csv"],
            Maker::Sweep => &["sweep.json"],
            Maker::Interference => &["interference.json", "interference.csv"],
            Maker::Coexec => &["coexec.json", "coexec.csv"],
        }
    }

    /// Its results present in `dir` (telemetry.csv aside: a GPU's trace beside results, not
    /// results of its own).
    fn found_in(self, dir: &Path) -> Vec<String> {
        let mut found: Vec<String> = self
            .files()
            .iter()
            .filter(|f| **f != "telemetry.csv" && dir.join(f).exists())
            .map(|f| f.to_string())
            .collect();
        if self.writes_jobs() {
            for sub in RUN_CSV_FOLDERS {
                if !job_csvs(&dir.join(sub)).is_empty() {
                    found.push(format!("{sub}/*.csv"));
                }
            }
        }
        found
    }

    fn writes_jobs(self) -> bool {
        matches!(self, Maker::Run | Maker::Isolation)
    }
}

/// The commands whose results `dir` holds, each with the files that show it.
fn holders(dir: &Path) -> Vec<(Maker, Vec<String>)> {
    let mut held: Vec<(Maker, Vec<String>)> = Maker::STUDIES
        .into_iter()
        .map(|m| (m, m.found_in(dir)))
        .collect();
    // A run's files beside an isolation.csv are isolation's run.
    let run = if dir.join("isolation.csv").exists() {
        Maker::Isolation
    } else {
        Maker::Run
    };
    held.push((run, run.found_in(dir)));
    held.retain(|(_, found)| !found.is_empty());
    held
}

/// Made from a folder's results by `isolane report`, `isolane trace` and `isolane explain`:
/// stale once the results they show are replaced, so `--force` removes them too (an
/// explain.json left over said why an older run's jobs were late, and the report drew it
/// beside the new run's).
const DERIVED_FILES: &[&str] = &["report.html", "trace.json", "explain.json"];

/// A run's folders of per-workload and per-app records (jobs/<workload>.csv, apps/<app>.csv).
const RUN_CSV_FOLDERS: [&str; 2] = ["jobs", "apps"];

/// A run's programs' output files at the folder's top (`<workload>.stdout`, `.stderr`), which
/// isolane-core's results-folder rules count among a run's records too.
fn program_outputs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .map(|e| e.path())
        .filter(|p| {
            p.extension()
                .is_some_and(|x| x == "stdout" || x == "stderr")
        })
        .collect()
}

fn job_csvs(jobs: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(jobs) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "csv"))
        .collect()
}

/// `--force` in a folder that is not empty: refused if it holds another command's results,
/// otherwise `maker`'s own files (and the report or trace made from them) are removed.
fn clear_own_files(dir: &Path, maker: Maker) -> Result<(), OutputError> {
    if let Some((other, found)) = holders(dir).into_iter().find(|(m, _)| *m != maker) {
        return Err(OutputError::Foreign {
            dir: dir.to_path_buf(),
            holds: found.join(", "),
            maker: other.command(),
            command: maker.command(),
        });
    }
    for f in maker.files().iter().chain(DERIVED_FILES) {
        let p = dir.join(f);
        if p.exists() {
            std::fs::remove_file(&p).map_err(io(&p))?;
        }
    }
    if maker.writes_jobs() {
        let csvs = RUN_CSV_FOLDERS
            .iter()
            .flat_map(|sub| job_csvs(&dir.join(sub)));
        for p in csvs.chain(program_outputs(dir)) {
            std::fs::remove_file(&p).map_err(io(&p))?;
        }
    }
    Ok(())
}

/// Makes the directory a run writes into: [`prepare_out_dir_for`] of a run.
pub fn prepare_out_dir(
    out: Option<&Path>,
    force: bool,
    base: &Path,
) -> Result<PathBuf, OutputError> {
    prepare_out_dir_for(out, force, base, Maker::Run)
}

/// Makes the directory `maker` writes into.
///
/// - `out = Some(dir)`: created if missing; if it exists and is not empty, refused unless
///   `force`, which removes `maker`'s own files in it (other files are left alone) and refuses
///   a folder holding another command's results ([`OutputError::Foreign`]).
/// - `out = None`: a new `runs/<YYYYmmdd-HHMMSS>` (local time) under `base`, with `-2`, `-3`, …
///   appended if that exists; `create_dir` makes the choice race-free, so an existing folder is
///   never reused.
pub fn prepare_out_dir_for(
    out: Option<&Path>,
    force: bool,
    base: &Path,
    maker: Maker,
) -> Result<PathBuf, OutputError> {
    match out {
        Some(dir) => {
            if dir.exists() {
                let mut entries = std::fs::read_dir(dir).map_err(unusable(dir))?;
                // Locked before `--force` removes anything: another run's files stay whole.
                lock_out_dir(dir)?;
                if entries.next().is_some() {
                    if !force {
                        return Err(OutputError::NotEmpty(dir.to_path_buf()));
                    }
                    clear_own_files(dir, maker)?;
                }
            }
            std::fs::create_dir_all(dir).map_err(unusable(dir))?;
            lock_out_dir(dir)?;
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

/// The output folders this process writes into, each with an open handle that holds its
/// lock (flock(2) on the folder) until the process ends, however it ends: the kernel drops the
/// lock of a killed process, so a folder is never left locked.
static LOCKED: std::sync::Mutex<Vec<(PathBuf, std::fs::File)>> = std::sync::Mutex::new(Vec::new());

/// Takes `dir`'s lock for this process, or refuses the folder if another process holds it
/// ([`OutputError::Busy`]). A folder this process locked already is taken again (a command's
/// steps may each prepare it). Where the file system has no such locks the run goes on
/// unlocked, as before locks existed.
fn lock_out_dir(dir: &Path) -> Result<(), OutputError> {
    let key = dir.canonicalize().map_err(unusable(dir))?;
    let mut locked = LOCKED.lock().unwrap_or_else(|e| e.into_inner());
    if locked.iter().any(|(p, _)| *p == key) {
        return Ok(());
    }
    let handle = std::fs::File::open(&key).map_err(unusable(dir))?;
    match handle.try_lock() {
        Ok(()) => {
            locked.push((key, handle));
            Ok(())
        }
        Err(std::fs::TryLockError::WouldBlock) => Err(OutputError::Busy(dir.to_path_buf())),
        Err(std::fs::TryLockError::Error(_)) => Ok(()),
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
    let text =
        isolane_core::files::read_regular_text_capped(path, isolane_core::files::MAX_RESULTS_BYTES)
            .map_err(io(path))?;
    parse_jobs_csv(path, &text)
}

/// The records of a jobs CSV that a killed run was writing: every complete row. A last row cut
/// off by the kill (no newline at its end, and not a whole record) is left out, and said so in
/// the second value; a malformed row anywhere else is an error as in [`read_jobs_csv`].
pub fn read_jobs_csv_partial(path: &Path) -> Result<(Vec<JobRecord>, Option<String>), OutputError> {
    let text =
        isolane_core::files::read_regular_text_capped(path, isolane_core::files::MAX_RESULTS_BYTES)
            .map_err(io(path))?;
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

/// The largest time a jobs CSV may hold, in ms: 1e12 ms (about 31 years, far beyond any run
/// of at most 200 days: 100 of phase and 100 of duration) keeps every time, and the difference
/// of two, within i64 nanoseconds.
pub const MAX_JOB_TIME_MS: f64 = 1e12;

/// The columns of a jobs CSV, in order ([`JOBS_CSV_HEADER`]).
const JOBS_CSV_FIELDS: [&str; 7] = [
    "job",
    "release_ms",
    "start_ms",
    "end_ms",
    "latency_ms",
    "timeout",
    "held_ms",
];

/// Parses a jobs CSV. Every value is checked as the release loop writes it, so that a damaged or
/// hand-edited file is refused by line and field instead of summarised into nonsense (negative
/// latencies, NaN, a time that wraps i64): job indices below [`isolane_core::spec::limits::MAX_JOBS`]
/// and rising (each once, in the order the metrics need), times finite from 0 to
/// [`MAX_JOB_TIME_MS`], a start and an end together or neither, release <= start <= end, the
/// latency the end minus the release.
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
    let mut out = Vec::new();
    let mut prev: Option<(u64, usize)> = None;
    for (i, line) in lines {
        if line.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        if f.len() != fields {
            return Err(bad(
                i + 1,
                &format!(
                    "found {} fields; expected {fields} fields ({})",
                    f.len(),
                    JOBS_CSV_FIELDS[..fields].join(",")
                ),
            ));
        }
        let r = parse_job_row(&f, prev).map_err(|e| bad(i + 1, &e))?;
        prev = Some((r.index, i + 1));
        out.push(r);
    }
    Ok(out)
}

/// One row's record, or what is wrong with it: "field `NAME`: found ...; expected ...".
/// `prev` is the previous row's job index and line.
fn parse_job_row(f: &[&str], prev: Option<(u64, usize)>) -> Result<JobRecord, String> {
    let wrong = |k: usize, expected: &str| {
        format!(
            "field `{}`: found {:?}; expected {expected}",
            JOBS_CSV_FIELDS[k], f[k]
        )
    };
    let max_index = isolane_core::spec::limits::MAX_JOBS - 1;
    let index: u64 = match f[0].parse() {
        Ok(n) if n <= max_index => n,
        _ => {
            return Err(wrong(
                0,
                &format!("a job index, an integer from 0 to {max_index}"),
            ))
        }
    };
    if let Some((p, line)) = prev.filter(|&(p, _)| index <= p) {
        return Err(wrong(
            0,
            &format!(
                "a job index above {p}, the previous row's (line {line}): each job once, in \
                 order"
            ),
        ));
    }
    let time_expected = format!("a finite number of milliseconds from 0 to {MAX_JOB_TIME_MS:e}");
    // ms -> ns, or None for an empty cell.
    let time = |k: usize| -> Result<Option<i64>, String> {
        if f[k].is_empty() {
            return Ok(None);
        }
        match f[k].parse::<f64>() {
            Ok(v) if (0.0..=MAX_JOB_TIME_MS).contains(&v) => Ok(Some((v * 1e6).round() as i64)),
            _ => Err(wrong(k, &time_expected)),
        }
    };
    let release_ns =
        time(1)?.ok_or_else(|| wrong(1, &format!("{time_expected} (every job has one)")))?;
    let (start_ns, end_ns) = match (time(2)?, time(3)?) {
        (Some(s), Some(e)) => (Some(s), Some(e)),
        (None, None) => (None, None),
        (None, Some(_)) => {
            return Err(wrong(
                2,
                "a start, since end_ms has one (both are empty only for a skipped job)",
            ))
        }
        (Some(_), None) => {
            return Err(wrong(
                3,
                "an end, since start_ms has one (both are empty only for a skipped job)",
            ))
        }
    };
    if let (Some(s), Some(e)) = (start_ns, end_ns) {
        if s < release_ns {
            return Err(wrong(
                2,
                &format!("a start at or after the release, release_ms = {}", f[1]),
            ));
        }
        if e < s {
            return Err(wrong(
                3,
                &format!("an end at or after the start, start_ms = {}", f[2]),
            ));
        }
        // Written as end - release, each rounded to the ns: a µs of slack is ample.
        let latency_ms = (e - release_ns) as f64 / 1e6;
        match f[4].parse::<f64>() {
            Ok(v) if (v - latency_ms).abs() <= 1e-3 => {}
            _ => return Err(wrong(4, &format!("end_ms - release_ms = {latency_ms:.6}"))),
        }
    } else if !f[4].is_empty() {
        return Err(wrong(
            4,
            "an empty cell, as start_ms and end_ms (a skipped job has no latency)",
        ));
    }
    let timeout = match f[5] {
        "1" | "true" => true,
        "0" | "false" => false,
        _ => return Err(wrong(5, "1 or 0 (true or false)")),
    };
    let held_ns = match f.get(6) {
        Some(_) => time(6)?.unwrap_or(0),
        None => 0,
    };
    Ok(JobRecord {
        index,
        release_ns,
        start_ns,
        end_ns,
        timeout,
        held_ns,
    })
}

/// How [`write_run_files`] puts a run's files on the disk; a test injects failures (a full
/// disk) without filling one.
pub trait RunFileSink {
    /// Writes `bytes` as the whole of `path`, atomically.
    fn replace(&mut self, path: &Path, bytes: &[u8]) -> std::io::Result<()>;
    /// Cuts `path` (created if missing) to its first `keep` bytes, then appends `bytes`.
    fn append(&mut self, path: &Path, keep: u64, bytes: &[u8]) -> std::io::Result<()>;
}

/// The disk itself.
pub struct Disk;

impl RunFileSink for Disk {
    fn replace(&mut self, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
        isolane_core::files::write_atomic(path, bytes)
    }

    fn append(&mut self, path: &Path, keep: u64, bytes: &[u8]) -> std::io::Result<()> {
        use std::io::Write as _;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        f.set_len(keep)?;
        f.write_all(bytes)?;
        f.sync_data()
    }
}

/// Writes a run's `jobs/<workload>.csv` (each with every record the run measured, from
/// `workloads`: name and records), then `others` (name in `dir`, bytes) and summary.json, the
/// last file (its presence says the run ended), to `dir`.
///
/// A jobs file that cannot be rewritten whole (a full disk: the rewrite needs room for a
/// second copy) keeps the rows the run streamed to it and gets the records it still lacks
/// appended, which needs room only for those. A file still short after that is named in
/// summary.json's `files_incomplete` (its metrics stay those of every record measured), and
/// the error says so and how to rebuild the summary (`isolane summarize`). Returns a note when
/// a rewrite failed but the appends made every file whole.
pub fn write_run_files(
    dir: &Path,
    workloads: &[(&str, &[JobRecord])],
    others: &[(&str, &[u8])],
    summary: &RunSummary,
) -> Result<Option<String>, OutputError> {
    write_run_files_to(&mut Disk, dir, workloads, others, summary)
}

/// [`write_run_files`] through `sink`.
pub fn write_run_files_to(
    sink: &mut dyn RunFileSink,
    dir: &Path,
    workloads: &[(&str, &[JobRecord])],
    others: &[(&str, &[u8])],
    summary: &RunSummary,
) -> Result<Option<String>, OutputError> {
    let mut failure: Option<String> = None;
    let mut short = Vec::new();
    for &(name, records) in workloads {
        let path = dir.join("jobs").join(jobs_file_name(name));
        let Err(e) = sink.replace(&path, jobs_csv(records).as_bytes()) else {
            continue;
        };
        failure.get_or_insert_with(|| format!("writing {}: {e}", path.display()));
        if let Err(held) = append_missing(sink, &path, records) {
            short.push(format!(
                "jobs/{} holds {held} of the {} records measured",
                jobs_file_name(name),
                records.len()
            ));
        }
    }
    for &(name, bytes) in others {
        let path = dir.join(name);
        if let Err(e) = sink.replace(&path, bytes) {
            failure.get_or_insert_with(|| format!("writing {}: {e}", path.display()));
            short.push(format!("{name} is missing"));
        }
    }
    let Some(failure) = failure else {
        return write_summary(sink, dir, summary).map(|()| None);
    };
    if short.is_empty() {
        write_summary(sink, dir, summary)?;
        return Ok(Some(format!(
            "{failure}; the records each file lacked were appended to the rows streamed during \
             the run instead, so jobs/*.csv and summary.json are whole"
        )));
    }
    let files = short.join(", ");
    let mut marked = summary.clone();
    marked.files_incomplete = Some(format!("{files} ({failure})"));
    let rebuild = format!(
        "`isolane summarize --force {}` rebuilds summary.json from the records on disk",
        dir.display()
    );
    let message = match write_summary(sink, dir, &marked) {
        Ok(()) => format!(
            "{failure}: {files}; summary.json holds the metrics of every job measured and names \
             the short files (\"files_incomplete\"); {rebuild} alone"
        ),
        Err(e) => format!(
            "{failure}: {files}, and summary.json could not be written ({e}); free space on \
             that disk, then {}",
            rebuild.replace(" --force", "")
        ),
    };
    Err(OutputError::RunFiles(message))
}

fn write_summary(
    sink: &mut dyn RunFileSink,
    dir: &Path,
    summary: &RunSummary,
) -> Result<(), OutputError> {
    let path = dir.join("summary.json");
    let mut bytes = serde_json::to_vec_pretty(summary).map_err(|e| OutputError::Io {
        path: path.clone(),
        error: e.into(),
    })?;
    bytes.push(b'\n');
    sink.replace(&path, &bytes).map_err(io(&path))
}

/// Appends to the jobs file `path`, streamed during the run, the records of `records` it lacks
/// (a row cut off by the full disk is cut away first). `Err` holds how many records the file
/// keeps when that fails, or when its rows are not the first of `records`.
fn append_missing(
    sink: &mut dyn RunFileSink,
    path: &Path,
    records: &[JobRecord],
) -> Result<(), usize> {
    let text = match isolane_core::files::read_text(path) {
        Ok(t) => t,
        Err(isolane_core::files::FileError::Io { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            String::new()
        }
        Err(_) => return Err(0),
    };
    let whole = text.rfind('\n').map_or(0, |i| i + 1);
    let (keep, held) = if whole == 0 {
        // Not even the header: the file starts over.
        (0, 0)
    } else {
        let rows = parse_jobs_csv(path, &text[..whole]).map_err(|_| 0usize)?;
        let n = rows.len();
        // The stream wrote each workload's records in order: its rows are the first `n`.
        if n > records.len() || (n > 0 && rows[n - 1].index != records[n - 1].index) {
            return Err(n);
        }
        (whole as u64, n)
    };
    let mut bytes = String::new();
    if keep == 0 {
        bytes.push_str(JOBS_CSV_HEADER);
        bytes.push('\n');
    }
    push_job_rows(&mut bytes, &records[held..]);
    sink.append(path, keep, bytes.as_bytes()).map_err(|_| held)
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

    /// Two runs into one --out at once, the second with --force, both ended with exit 0 and
    /// left one's scenario.toml beside the other's summary.json and jobs/. The second is
    /// refused now, before it removes or writes anything.
    #[test]
    fn a_folder_another_process_writes_into_is_refused_and_left_alone() {
        let base = tempfile::tempdir().unwrap();
        let dir = base.path().join("out");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("summary.json"), "{}").unwrap();
        // Another process's lock: one on another open handle conflicts the same way.
        let other = std::fs::File::open(&dir).unwrap();
        other.try_lock().unwrap();
        for force in [false, true] {
            let e = prepare_out_dir(Some(&dir), force, base.path()).unwrap_err();
            assert!(
                matches!(e, OutputError::Busy(_)) && e.is_user_error(),
                "{e}"
            );
            assert!(e.to_string().contains("another isolane process"), "{e}");
        }
        assert!(
            dir.join("summary.json").exists(),
            "--force removed a busy folder's files"
        );
        // Free again once the other process ends (its handle closed).
        drop(other);
        prepare_out_dir(Some(&dir), true, base.path()).unwrap();
        assert!(!dir.join("summary.json").exists());
        // This process holds it now: its own next step may prepare it again.
        prepare_out_dir(Some(&dir), true, base.path()).unwrap();
        let second = std::fs::File::open(&dir).unwrap();
        assert!(
            second.try_lock().is_err(),
            "the folder is not locked while in use"
        );
    }

    fn write_run(dir: &Path) {
        std::fs::create_dir_all(dir.join("jobs")).unwrap();
        for f in ["summary.json", "scenario.toml", "jobs/a.csv", "report.html"] {
            std::fs::write(dir.join(f), format!("run's {f}")).unwrap();
        }
    }

    /// `maxrate -o RUN --force` deleted the run's summary.json, scenario.toml and jobs/*.csv,
    /// none of which maxrate writes. Each study command is refused in a run's folder now, and
    /// the run's files stay byte for byte.
    #[test]
    fn force_refuses_another_commands_results_and_keeps_them() {
        let base = tempfile::tempdir().unwrap();
        let run = base.path().join("run");
        write_run(&run);
        for maker in [
            Maker::Maxrate,
            Maker::Sweep,
            Maker::Interference,
            Maker::Coexec,
        ] {
            let e = prepare_out_dir_for(Some(&run), true, base.path(), maker).unwrap_err();
            assert!(e.is_user_error(), "{e}");
            let m = e.to_string();
            for want in [
                run.display().to_string().as_str(),
                "`isolane run`",
                "summary.json",
                "jobs/*.csv",
                maker.command(),
                "another --out",
            ] {
                assert!(m.contains(want), "{maker:?}: no {want:?} in {m}");
            }
        }
        for f in ["summary.json", "scenario.toml", "jobs/a.csv", "report.html"] {
            assert_eq!(
                std::fs::read_to_string(run.join(f)).unwrap(),
                format!("run's {f}"),
                "{f} changed"
            );
        }
        // A maxrate folder is not a run's to replace either.
        let m = base.path().join("m");
        std::fs::create_dir(&m).unwrap();
        std::fs::write(m.join("maxrate_trace.csv"), "trace").unwrap();
        let e = prepare_out_dir(Some(&m), true, base.path()).unwrap_err();
        assert!(e.to_string().contains("`isolane maxrate`"), "{e}");
        assert!(m.join("maxrate_trace.csv").exists());
    }

    /// `--force` over a folder of the same command replaces its results (run over run, as
    /// documented; maxrate over maxrate) and leaves every other file alone.
    #[test]
    fn force_replaces_only_the_commands_own_files() {
        let base = tempfile::tempdir().unwrap();
        let run = base.path().join("run");
        write_run(&run);
        std::fs::write(run.join("notes.txt"), "mine").unwrap();
        std::fs::write(run.join("jobs/readme.md"), "mine").unwrap();
        prepare_out_dir(Some(&run), true, base.path()).unwrap();
        for f in ["summary.json", "scenario.toml", "jobs/a.csv", "report.html"] {
            assert!(!run.join(f).exists(), "{f} of the replaced run stayed");
        }
        assert!(run.join("notes.txt").exists() && run.join("jobs/readme.md").exists());

        let m = base.path().join("m");
        std::fs::create_dir(&m).unwrap();
        for f in ["maxrate.json", "maxrate_trace.csv", "notes.txt"] {
            std::fs::write(m.join(f), "old").unwrap();
        }
        prepare_out_dir_for(Some(&m), true, base.path(), Maker::Maxrate).unwrap();
        assert!(!m.join("maxrate.json").exists() && !m.join("maxrate_trace.csv").exists());
        assert!(m.join("notes.txt").exists());
    }

    /// `--force` left files that describe the replaced run beside the new one's results:
    /// serve's autoplan.csv (a serve without --autoplan writes none), explain.json (the report
    /// drew the old run's explanation beside the new run), apps/*.csv of apps the new run no
    /// longer has, and programs' `.stdout`/`.stderr`. A user's own files, folders under apps/
    /// (saved frames) and other commands' results stay.
    #[test]
    fn force_removes_every_file_that_describes_the_replaced_run() {
        let base = tempfile::tempdir().unwrap();
        let run = base.path().join("run");
        write_run(&run);
        std::fs::create_dir_all(run.join("apps/cam")).unwrap();
        for f in [
            "autoplan.csv",
            "explain.json",
            "trace.json",
            "apps/cam.csv",
            "gemm.stdout",
            "gemm.stderr",
            "notes.txt",
            "apps/cam/frame-0.ppm",
        ] {
            std::fs::write(run.join(f), "old").unwrap();
        }
        prepare_out_dir(Some(&run), true, base.path()).unwrap();
        for f in [
            "autoplan.csv",
            "explain.json",
            "trace.json",
            "apps/cam.csv",
            "gemm.stdout",
            "gemm.stderr",
        ] {
            assert!(!run.join(f).exists(), "{f} of the replaced run stayed");
        }
        assert!(run.join("notes.txt").exists() && run.join("apps/cam/frame-0.ppm").exists());

        // A serve's folder with only its autoplan.csv and apps' records is still a run's: no
        // study replaces it.
        let served = base.path().join("served");
        std::fs::create_dir_all(served.join("apps")).unwrap();
        std::fs::write(served.join("autoplan.csv"), "t_ms").unwrap();
        std::fs::write(served.join("apps/cam.csv"), "frame").unwrap();
        let e = prepare_out_dir_for(Some(&served), true, base.path(), Maker::Maxrate).unwrap_err();
        let m = e.to_string();
        assert!(
            m.contains("`isolane run`") && m.contains("autoplan.csv") && m.contains("apps/*.csv"),
            "{m}"
        );
        assert!(served.join("autoplan.csv").exists() && served.join("apps/cam.csv").exists());

        // A study replacing its own results removes an explanation beside them too, and
        // leaves a program's output alone (not a study's).
        let m = base.path().join("m");
        std::fs::create_dir(&m).unwrap();
        for f in ["maxrate.json", "explain.json", "x.stdout"] {
            std::fs::write(m.join(f), "old").unwrap();
        }
        prepare_out_dir_for(Some(&m), true, base.path(), Maker::Maxrate).unwrap();
        assert!(!m.join("maxrate.json").exists() && !m.join("explain.json").exists());
        assert!(m.join("x.stdout").exists());
    }

    /// isolation's folder is a run's plus isolation.csv: each replaces its own, neither the
    /// other's.
    #[test]
    fn run_and_isolation_replace_only_their_own_folders() {
        let base = tempfile::tempdir().unwrap();
        let run = base.path().join("run");
        write_run(&run);
        let e = prepare_out_dir_for(Some(&run), true, base.path(), Maker::Isolation).unwrap_err();
        assert!(e.to_string().contains("`isolane run`"), "{e}");
        assert!(run.join("summary.json").exists());

        let iso = base.path().join("iso");
        write_run(&iso);
        std::fs::write(iso.join("isolation.csv"), "steps").unwrap();
        let e = prepare_out_dir(Some(&iso), true, base.path()).unwrap_err();
        let m = e.to_string();
        assert!(
            m.contains("`isolane isolation`") && m.contains("isolation.csv"),
            "{m}"
        );
        assert!(iso.join("summary.json").exists() && iso.join("isolation.csv").exists());
        prepare_out_dir_for(Some(&iso), true, base.path(), Maker::Isolation).unwrap();
        for f in [
            "summary.json",
            "scenario.toml",
            "jobs/a.csv",
            "isolation.csv",
        ] {
            assert!(
                !iso.join(f).exists(),
                "{f} of the replaced isolation run stayed"
            );
        }
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

    /// Issue 31: summarize took NaN, negative and overflowing times, duplicate indices and
    /// index 2^63-1, and printed negative latencies with exit 0. Each is refused by line and
    /// field.
    #[test]
    fn malformed_values_are_refused_by_line_and_field() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.csv");
        let ok = "0,0.000000,0.001500,4.001500,4.001500,0,0";
        for (row, field, expected) in [
            (
                "0,nan,0.1,1.1,1.1,0,0",
                "release_ms",
                "finite number of milliseconds",
            ),
            ("0,inf,0.1,1.1,1.1,0,0", "release_ms", "finite"),
            ("0,-5.0,0.1,1.1,6.1,0,0", "release_ms", "from 0 to 1e12"),
            ("0,1e300,,,,1,0", "release_ms", "from 0 to 1e12"),
            ("0,0.0,NaN,1.1,1.1,0,0", "start_ms", "finite"),
            ("0,0.0,0.1,-1e300,1.1,0,0", "end_ms", "from 0 to 1e12"),
            ("0,0.0,0.1,1.1,1.1,0,-3", "held_ms", "from 0 to 1e12"),
            ("0,,,,,1,0", "release_ms", "every job has one"),
            (
                "9223372036854775807,0.0,0.1,1.1,1.1,0,0",
                "job",
                "from 0 to 999999999999",
            ),
            ("-1,0.0,0.1,1.1,1.1,0,0", "job", "an integer"),
            // Negative latency: an end before the release.
            ("0,5.0,5.1,1.0,-4.0,0,0", "end_ms", "at or after the start"),
            (
                "0,5.0,1.0,6.0,1.0,0,0",
                "start_ms",
                "at or after the release",
            ),
            (
                "0,0.0,0.1,1.1,7.0,0,0",
                "latency_ms",
                "end_ms - release_ms = 1.100000",
            ),
            ("0,0.0,,1.1,1.1,0,0", "start_ms", "a start"),
            ("0,0.0,0.1,,1.1,0,0", "end_ms", "an end"),
            ("0,0.0,,,1.1,1,0", "latency_ms", "empty"),
            ("0,0.0,0.1,1.1,1.1,2,0", "timeout", "1 or 0"),
        ] {
            std::fs::write(&path, format!("{JOBS_CSV_HEADER}\n{row}\n")).unwrap();
            let e = read_jobs_csv(&path).unwrap_err();
            assert!(e.is_user_error());
            let e = e.to_string();
            assert!(
                e.contains("a.csv: line 2: ")
                    && e.contains(&format!("field `{field}`"))
                    && e.contains(expected),
                "{row}: {e}"
            );
        }
        // The same index twice, or going back: the metrics need each job once, in order.
        for second in ["0,1.0,1.1,2.0,1.0,0,0", "1,2.0,2.1,3.0,1.0,0,0"] {
            let text = format!("{JOBS_CSV_HEADER}\n{ok}\n1,1.0,1.1,2.0,1.0,0,0\n{second}\n");
            std::fs::write(&path, text).unwrap();
            let e = read_jobs_csv(&path).unwrap_err().to_string();
            assert!(
                e.contains("line 4: field `job`")
                    && e.contains("above 1, the previous row's (line 3)"),
                "{e}"
            );
        }
        // What the loop writes still reads: a skipped job, gaps in the indices, -0.
        let text = format!("{JOBS_CSV_HEADER}\n{ok}\n3,-0.0,,,,1,0\n7,9.5,9.5,9.5,0.000000,0,\n");
        std::fs::write(&path, text).unwrap();
        let r = read_jobs_csv(&path).unwrap();
        assert_eq!(r.iter().map(|r| r.index).collect::<Vec<_>>(), [0, 3, 7]);
        assert_eq!((r[1].start_ns, r[2].latency_ns()), (None, Some(0)));
    }

    /// Property tests of the jobs CSV reader (`summarize`, `compare`): whatever the text, it
    /// returns records or an error naming a line, never panics, and what it accepts is sound.
    /// `cargo test` runs ISOLANE_FUZZ_CASES (default 500) cases per target; `scripts/fuzz.sh`
    /// many more.
    mod fuzz {
        use super::super::*;
        use proptest::prelude::*;

        /// Cells at or past the edges of what a field allows.
        const CELLS: &[&str] = &[
            "",
            "0",
            "1",
            "-1",
            "0.5",
            "-0.0",
            "1e12",
            "1e13",
            "1e300",
            "-1e300",
            "nan",
            "NaN",
            "inf",
            "-inf",
            "true",
            "false",
            "2",
            "9223372036854775807",
            "18446744073709551616",
            "999999999999",
            "1000000000000",
            "4.001500",
            "x",
            " 1 ",
        ];

        fn cell() -> impl Strategy<Value = String> {
            prop_oneof![
                proptest::sample::select(CELLS).prop_map(str::to_string),
                any::<f64>().prop_map(|v| format!("{v}")),
                (0u64..1000).prop_map(|v| v.to_string()),
                "[-0-9.,e ]{0,12}",
            ]
        }

        fn row() -> impl Strategy<Value = String> {
            proptest::collection::vec(cell(), 5..9).prop_map(|c| c.join(","))
        }

        /// A run's records as the release loop makes them.
        fn records() -> impl Strategy<Value = Vec<JobRecord>> {
            proptest::collection::vec(
                (
                    1u64..5,
                    0i64..10_000_000_000,
                    0i64..1_000_000,
                    0i64..1_000_000_000,
                    any::<bool>(),
                    0i64..1_000_000,
                ),
                0..40,
            )
            .prop_map(|rows| {
                let mut index = 0;
                rows.into_iter()
                    .map(|(gap, release, wait, service, ran, held)| {
                        index += gap;
                        JobRecord {
                            index,
                            release_ns: release,
                            start_ns: ran.then_some(release + wait),
                            end_ns: ran.then_some(release + wait + service),
                            timeout: !ran,
                            held_ns: held,
                        }
                    })
                    .collect()
            })
        }

        fn parse(text: &str) -> Result<Vec<JobRecord>, OutputError> {
            parse_jobs_csv(Path::new("fuzz.csv"), text)
        }

        proptest! {
            #![proptest_config(isolane_core::fuzz::config(500))]

            #[test]
            fn fuzz_jobs_csv_rows_are_refused_or_sound(
                rows in proptest::collection::vec(row(), 0..8),
                old in any::<bool>(),
            ) {
                let header = if old { JOBS_CSV_HEADER_V1 } else { JOBS_CSV_HEADER };
                let text = format!("{header}\n{}\n", rows.join("\n"));
                match parse(&text) {
                    Ok(records) => {
                        let mut prev = None;
                        for r in &records {
                            prop_assert!(prev.is_none_or(|p| r.index > p));
                            prev = Some(r.index);
                            prop_assert!(r.release_ns >= 0 && r.held_ns >= 0);
                            prop_assert!(r.latency_ns().is_none_or(|l| l >= 0));
                            prop_assert!(r.start_ns.is_some() == r.end_ns.is_some());
                        }
                    }
                    Err(e) => prop_assert!(e.to_string().contains("fuzz.csv: line "), "{e}"),
                }
            }

            #[test]
            fn fuzz_jobs_csv_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
                let text = format!("{JOBS_CSV_HEADER}\n{}", String::from_utf8_lossy(&bytes));
                let _ = parse(&text);
            }

            #[test]
            fn fuzz_jobs_csv_round_trips(records in records()) {
                prop_assert_eq!(parse(&jobs_csv(&records)).unwrap(), records);
            }
        }
    }
}

/// A run's files on a disk that fills up (issue 31: a full disk at a run's end wrote no
/// summary and lost the records not yet streamed), by injection rather than a full disk.
#[cfg(test)]
mod full_disk {
    use super::*;

    /// The disk, except that whole-file writes of the names in `full` fail as a full disk does,
    /// and so do appends when `appends_fail`.
    struct FillingDisk {
        full: Vec<&'static str>,
        appends_fail: bool,
    }

    fn no_space() -> std::io::Error {
        std::io::Error::from_raw_os_error(libc::ENOSPC)
    }

    impl RunFileSink for FillingDisk {
        fn replace(&mut self, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
            let name = path.file_name().unwrap().to_str().unwrap();
            if self.full.contains(&name) {
                return Err(no_space());
            }
            Disk.replace(path, bytes)
        }

        fn append(&mut self, path: &Path, keep: u64, bytes: &[u8]) -> std::io::Result<()> {
            if self.appends_fail {
                return Err(no_space());
            }
            Disk.append(path, keep, bytes)
        }
    }

    fn records(n: u64) -> Vec<JobRecord> {
        (0..n)
            .map(|k| JobRecord {
                index: k,
                release_ns: k as i64 * 1_000_000,
                start_ns: Some(k as i64 * 1_000_000 + 7),
                end_ns: Some(k as i64 * 1_000_000 + 400_000),
                timeout: false,
                held_ns: 0,
            })
            .collect()
    }

    /// A run folder whose `a.csv` stream stopped after 222 of 280 records, in the middle of a
    /// row, as a full disk leaves it.
    fn cut_short_run() -> (tempfile::TempDir, Vec<JobRecord>) {
        let dir = tempfile::tempdir().unwrap();
        let all = records(280);
        let mut streamed = jobs_csv(&all[..223]);
        streamed.truncate(streamed.len() - 10);
        std::fs::create_dir_all(dir.path().join("jobs")).unwrap();
        std::fs::write(dir.path().join("jobs/a.csv"), streamed).unwrap();
        (dir, all)
    }

    fn summary() -> RunSummary {
        RunSummary::new("run")
    }

    #[test]
    fn the_records_held_in_memory_are_appended_when_a_rewrite_does_not_fit() {
        let (dir, all) = cut_short_run();
        let mut disk = FillingDisk {
            full: vec!["a.csv"],
            appends_fail: false,
        };
        let note = write_run_files_to(&mut disk, dir.path(), &[("a", &all)], &[], &summary())
            .unwrap()
            .unwrap();
        assert!(
            note.contains("appended") && note.contains("a.csv"),
            "{note}"
        );
        assert_eq!(read_jobs_csv(&dir.path().join("jobs/a.csv")).unwrap(), all);
        let s: RunSummary =
            isolane_core::results::read_json(&dir.path().join("summary.json")).unwrap();
        assert_eq!(s.files_incomplete, None);
    }

    #[test]
    fn a_summary_marked_incomplete_is_written_when_the_records_do_not_fit() {
        let (dir, all) = cut_short_run();
        let mut disk = FillingDisk {
            full: vec!["a.csv", "workloads.csv"],
            appends_fail: true,
        };
        let e = write_run_files_to(
            &mut disk,
            dir.path(),
            &[("a", &all)],
            &[("workloads.csv", b"x\n")],
            &summary(),
        )
        .unwrap_err();
        assert!(!e.is_user_error());
        let e = e.to_string();
        assert!(
            e.contains("jobs/a.csv holds 222 of the 280 records measured")
                && e.contains("workloads.csv is missing")
                && e.contains("No space left on device")
                && e.contains("\"files_incomplete\"")
                && e.contains("isolane summarize --force"),
            "{e}"
        );
        let s: RunSummary =
            isolane_core::results::read_json(&dir.path().join("summary.json")).unwrap();
        let why = s.files_incomplete.unwrap();
        assert!(why.contains("holds 222 of the 280"), "{why}");
        // The streamed rows are still there for `isolane summarize`.
        let (kept, _) = read_jobs_csv_partial(&dir.path().join("jobs/a.csv")).unwrap();
        assert_eq!(kept, all[..222]);
    }

    #[test]
    fn without_room_for_the_summary_the_message_says_how_to_rebuild_it() {
        let (dir, all) = cut_short_run();
        let mut disk = FillingDisk {
            full: vec!["a.csv", "summary.json"],
            appends_fail: true,
        };
        let e = write_run_files_to(&mut disk, dir.path(), &[("a", &all)], &[], &summary())
            .unwrap_err()
            .to_string();
        let rebuild = format!("then `isolane summarize {}`", dir.path().display());
        assert!(
            e.contains("summary.json could not be written") && e.contains(&rebuild),
            "{e}"
        );
        assert!(!dir.path().join("summary.json").exists());
    }
}
