//! Reading results folders back for the HTML report.
//!
//! A folder is recognised by the file that only its kind writes: `sweep.json` (a sweep: one
//! run folder per point), `interference.json` (an interference matrix: one run folder per
//! cell), `maxrate.json` (`isolane maxrate --out`), `summary.json` (`isolane
//! run` / `isolation`). Everything else in it is optional and only adds sections. The files are
//! read through the one results schema (`isolane_core::results`), which also reads the folders
//! of older versions and refuses (by name) one written by a newer schema.

use isolane_core::files::{jobs_file_name, read_text, FileError};
use isolane_core::results::{read_isolation_csv, read_json, ResultsError};
pub use isolane_core::results::{
    InterferenceIndex, IsolationRow, MaxrateReport, RunSummary, SweepIndex, SweepPoint,
    TelemetrySummary, WorkloadSummary,
};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error(
        "{0} is not an isolane results folder and holds none: a results folder has \
         summary.json (isolane run / isolation), maxrate.json (isolane maxrate --out), \
         sweep.json (isolane sweep), interference.json (isolane interference) or coexec.json \
         (isolane coexec)"
    )]
    NotResults(PathBuf),
    /// scenario.toml and jobs/ but no summary.json: a run killed before it ended (SIGKILL, a
    /// full disk), which `isolane summarize` completes.
    #[error(
        "{0} has no summary.json: its run was killed before it wrote one; isolane summarize {0} \
         rebuilds it from jobs/*.csv, then isolane report {0} reads it"
    )]
    CutShort(PathBuf),
    #[error(transparent)]
    File(#[from] FileError),
}

impl From<ResultsError> for DataError {
    fn from(e: ResultsError) -> Self {
        DataError::File(e.into_file_error())
    }
}

/// What the report needs from the resolved scenario.toml: how the device was shared.
#[derive(Debug, Clone, Default)]
pub struct DeviceInfo {
    pub backend: String,
    pub mechanism: String,
    /// The run's criticality protection in words: `off`, `stall model`, `stretch 1.44`
    /// (docs/criticality.md); empty for scenarios from before it existed.
    pub protection: String,
}

/// telemetry.csv as columns: `t_s`, each row's GPU in a run on several GPUs, and every
/// numeric column by name.
#[derive(Debug, Clone, Default)]
pub struct TelemetrySeries {
    pub t_s: Vec<f64>,
    /// Each row's GPU (the `gpu` column of a run on several GPUs); empty for one GPU's file.
    pub gpu: Vec<u32>,
    pub columns: Vec<(String, Vec<Option<f64>>)>,
}

impl TelemetrySeries {
    pub fn column(&self, name: &str) -> Option<&[Option<f64>]> {
        self.columns
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
    }

    /// `(t, value)` pairs of a column, leaving out empty cells (every GPU's rows).
    pub fn points(&self, name: &str) -> Vec<(f64, f64)> {
        self.points_where(name, |_| true)
    }

    /// The GPUs of a file of several GPUs, in increasing order; empty for one GPU's file.
    pub fn gpus(&self) -> Vec<u32> {
        let set: std::collections::BTreeSet<u32> = self.gpu.iter().copied().collect();
        set.into_iter().collect()
    }

    /// [`TelemetrySeries::points`] of GPU `gpu`'s rows only.
    pub fn points_on(&self, name: &str, gpu: u32) -> Vec<(f64, f64)> {
        self.points_where(name, |row| self.gpu.get(row) == Some(&gpu))
    }

    fn points_where(&self, name: &str, keep: impl Fn(usize) -> bool) -> Vec<(f64, f64)> {
        self.column(name)
            .map(|c| {
                self.t_s
                    .iter()
                    .zip(c)
                    .enumerate()
                    .filter(|(row, _)| keep(*row))
                    .filter_map(|(_, (t, v))| v.map(|v| (*t, v)))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// A run or isolation folder.
#[derive(Debug, Clone)]
pub struct RunDir {
    pub path: PathBuf,
    pub label: String,
    pub summary: RunSummary,
    pub device: DeviceInfo,
    /// Per workload (summary order): completed jobs' latencies in ms, sorted.
    pub latencies_ms: Vec<(String, Vec<f64>)>,
    pub isolation: Vec<IsolationRow>,
    pub telemetry: Option<TelemetrySeries>,
    /// A window of the run around its worst job, when jobs/*.csv are there.
    pub timeline: Option<crate::timeline::TimelineWindow>,
    /// Per app (summary order): its measured frames' end-to-end latencies in ms, sorted
    /// (apps/<app>.csv; docs/apps.md).
    pub app_latencies_ms: Vec<(String, Vec<f64>)>,
    /// Why its late jobs were late: explain.json when `isolane explain` wrote one (with the
    /// memory figures it was given), else worked out here; `None` for a folder without what
    /// it needs (no jobs/, a run of apps).
    pub explanation: Option<crate::explain::Explanation>,
}

#[derive(Debug, Clone)]
pub struct MaxrateDir {
    pub path: PathBuf,
    pub result: MaxrateReport,
}

#[derive(Debug, Clone)]
pub struct SweepDir {
    pub path: PathBuf,
    pub label: String,
    pub index: SweepIndex,
    /// Each point with its run, when the point's folder has a summary.json (a point that
    /// failed before it ran has none and is left out of the plots).
    pub points: Vec<(SweepPoint, Option<RunDir>)>,
}

/// An interference matrix: its index (every cell's stretch is in it; the cells' run folders
/// are not read).
#[derive(Debug, Clone)]
pub struct InterferenceDir {
    pub path: PathBuf,
    pub label: String,
    pub index: InterferenceIndex,
}

/// A co-execution study (`isolane coexec`): its index (each cell's times, speedup and
/// slowdowns are in it; the run folders are not read).
#[derive(Debug, Clone)]
pub struct CoexecDir {
    pub path: PathBuf,
    pub label: String,
    pub index: isolane_core::results::CoexecIndex,
}

#[derive(Debug, Clone)]
pub enum ResultsDir {
    Run(Box<RunDir>),
    Maxrate(MaxrateDir),
    Sweep(SweepDir),
    Interference(InterferenceDir),
    Coexec(CoexecDir),
}

fn label_of(path: &Path) -> String {
    let canon = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    canon
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string())
}

/// Whether `path` is one results folder (a run, isolation, maxrate, sweep or interference
/// folder).
pub fn is_results_dir(path: &Path) -> bool {
    [
        "sweep.json",
        "interference.json",
        "coexec.json",
        "maxrate.json",
        "summary.json",
    ]
    .iter()
    // Whatever is there, so that one that is no regular file is read, and refused by name.
    .any(|f| isolane_core::files::is_there(&path.join(f)))
}

/// What [`find_results`] found in the paths it was given.
#[derive(Debug, Default, PartialEq)]
pub struct Found {
    /// Results folders, in the order given (inside a folder: sorted by name).
    pub dirs: Vec<PathBuf>,
    /// Paths given or folders met that hold no results, with why (`logs/`, `COMPLETE.json`).
    pub skipped: Vec<(PathBuf, &'static str)>,
}

/// How deep below a given folder results folders are looked for: a results root
/// (`results/h100`) holds study folders, which hold results folders.
const SEARCH_DEPTH: usize = 3;

/// Resolves the paths of `isolane report` to results folders: a results folder is taken as
/// it is; any other folder (a study folder, a results root) is searched for results folders
/// inside it, which are not searched further (a sweep's points belong to the sweep); files and
/// folders without results are skipped and listed. None found at all is an error.
pub fn find_results(paths: &[PathBuf]) -> Result<Found, DataError> {
    let mut found = Found::default();
    for p in paths {
        if !p.is_dir() {
            found.skipped.push((p.clone(), "not a folder"));
            continue;
        }
        let notes = found.skipped.len();
        if search(p, SEARCH_DEPTH, &mut found)? == 0 {
            found.skipped.truncate(notes);
            found.skipped.push((p.clone(), "no results folder inside"));
        }
    }
    match (found.dirs.is_empty(), paths.first()) {
        (true, Some(first)) => Err(match paths.iter().find(|p| cut_short(p)) {
            Some(run) => DataError::CutShort(run.clone()),
            None => DataError::NotResults(first.clone()),
        }),
        _ => Ok(found),
    }
}

/// A run folder whose run was killed before it wrote summary.json: its resolved scenario and
/// its jobs folder are there (the first files a run writes), summary.json is not.
fn cut_short(dir: &Path) -> bool {
    dir.join("scenario.toml").is_file()
        && dir.join("jobs").is_dir()
        && !dir.join("summary.json").exists()
}

/// Adds the results folders in `dir` (itself, or below it down to `depth` levels) to `found`
/// and returns how many. A subfolder with none is noted once, not its own empty subfolders.
fn search(dir: &Path, depth: usize, found: &mut Found) -> Result<usize, DataError> {
    if is_results_dir(dir) {
        found.dirs.push(dir.to_path_buf());
        return Ok(1);
    }
    if depth == 0 {
        return Ok(0);
    }
    let entries = std::fs::read_dir(dir).map_err(|source| FileError::io(dir, source))?;
    let mut children: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    children.sort();
    let mut total = 0;
    for child in children {
        let notes = found.skipped.len();
        let n = search(&child, depth - 1, found)?;
        if n == 0 {
            found.skipped.truncate(notes);
            found.skipped.push((child, "no results folder inside"));
        }
        total += n;
    }
    Ok(total)
}

/// Loads one results folder.
pub fn load(path: &Path) -> Result<ResultsDir, DataError> {
    if !path.is_dir() {
        return Err(DataError::NotResults(path.to_path_buf()));
    }
    if path.join("sweep.json").is_file() {
        return load_sweep(path).map(ResultsDir::Sweep);
    }
    if path.join("interference.json").is_file() {
        return Ok(ResultsDir::Interference(InterferenceDir {
            path: path.to_path_buf(),
            label: label_of(path),
            index: read_json(&path.join("interference.json"))?,
        }));
    }
    if path.join("coexec.json").is_file() {
        return Ok(ResultsDir::Coexec(CoexecDir {
            path: path.to_path_buf(),
            label: label_of(path),
            index: read_json(&path.join("coexec.json"))?,
        }));
    }
    if path.join("maxrate.json").is_file() {
        let result = read_json(&path.join("maxrate.json"))?;
        return Ok(ResultsDir::Maxrate(MaxrateDir {
            path: path.to_path_buf(),
            result,
        }));
    }
    if isolane_core::files::is_there(&path.join("summary.json")) {
        return load_run(path).map(|r| ResultsDir::Run(Box::new(r)));
    }
    if cut_short(path) {
        return Err(DataError::CutShort(path.to_path_buf()));
    }
    Err(DataError::NotResults(path.to_path_buf()))
}

fn load_sweep(path: &Path) -> Result<SweepDir, DataError> {
    let file = path.join("sweep.json");
    let index: SweepIndex = read_json(&file)?;
    if index.kind != "partition" && index.kind != "concurrency" {
        let detail = format!(
            "kind: `{}` is not a sweep kind (allowed: partition, concurrency)",
            index.kind
        );
        return Err(FileError::parse(&file, detail).into());
    }
    let mut points = Vec::new();
    for p in &index.points {
        let dir = path.join(&p.dir);
        let run = if isolane_core::files::is_there(&dir.join("summary.json")) {
            Some(load_run(&dir)?)
        } else {
            None
        };
        points.push((p.clone(), run));
    }
    Ok(SweepDir {
        path: path.to_path_buf(),
        label: label_of(path),
        index,
        points,
    })
}

pub fn load_run(path: &Path) -> Result<RunDir, DataError> {
    let summary: RunSummary = read_json(&path.join("summary.json"))?;
    let device = read_device(&path.join("scenario.toml"))?;
    let mut latencies_ms = Vec::new();
    let mut lanes = Vec::new();
    for w in &summary.workloads {
        let file = path.join("jobs").join(jobs_file_name(&w.name));
        if isolane_core::files::is_there(&file) {
            let jobs = isolane_trace::read_jobs(&file).map_err(trace_error)?;
            latencies_ms.push((w.name.clone(), latencies(&jobs)));
            lanes.push((w.name.clone(), jobs));
        }
    }
    let steps = summary.isolation.as_ref().map_or_else(Vec::new, |iso| {
        iso.steps
            .iter()
            .map(|s| isolane_trace::Step {
                step: s.step,
                start_ms: s.start_s * 1e3,
                end_ms: (s.start_s + iso.step_s) * 1e3,
                interferer_rate_hz: s.interferer_rate_hz,
            })
            .collect()
    });
    let timeline = crate::timeline::window(lanes, &steps);
    let iso = path.join("isolation.csv");
    let isolation = if isolane_core::files::is_there(&iso) {
        read_isolation_csv(&iso)?
    } else {
        Vec::new()
    };
    let tel = path.join("telemetry.csv");
    let telemetry = if isolane_core::files::is_there(&tel) {
        Some(read_telemetry(&tel)?)
    } else {
        None
    };
    let app_latencies_ms = app_latencies(path, &summary)?;
    let explanation = match crate::explain::read_explanation(path)? {
        Some(e) => Some(e),
        // A folder explain cannot read (older results, apps) just has no such section.
        None => crate::explain::explain_dir(path, None, &[]).ok(),
    };
    Ok(RunDir {
        path: path.to_path_buf(),
        label: label_of(path),
        summary,
        device,
        latencies_ms,
        isolation,
        telemetry,
        timeline,
        app_latencies_ms,
        explanation,
    })
}

/// Each app's measured end-to-end latencies, sorted, where its apps/<app>.csv is there.
fn app_latencies(path: &Path, summary: &RunSummary) -> Result<Vec<(String, Vec<f64>)>, DataError> {
    let mut out = Vec::new();
    for a in &summary.apps {
        let file = path.join("apps").join(format!("{}.csv", a.name));
        if !isolane_core::files::is_there(&file) {
            continue;
        }
        let text = isolane_core::files::read_text(&file)?;
        let mut ms = isolane_core::results::app_latencies_from_csv(&text)
            .map_err(|e| isolane_core::files::FileError::parse(&file, e))?;
        ms.sort_by(f64::total_cmp);
        out.push((a.name.clone(), ms));
    }
    Ok(out)
}

fn read_device(path: &Path) -> Result<DeviceInfo, DataError> {
    if !isolane_core::files::is_there(path) {
        return Ok(DeviceInfo::default());
    }
    let text = read_text(path)?;
    let value: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| FileError::parse(path, e.to_string()))?;
    let field = |k: &str| {
        value
            .get("device")
            .and_then(|d| d.get(k))
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_string()
    };
    let protection = match value.get("protection") {
        None => String::new(),
        Some(p) if p.get("enabled").and_then(|v| v.as_bool()) == Some(false) => "off".into(),
        Some(p) => match p.get("stretch").and_then(|v| v.as_float()) {
            Some(s) => format!("stretch {s:.2}"),
            None => "stall model".into(),
        },
    };
    // A scenario copied as given (an app run's, docs/apps.md) may leave the device to core's
    // defaults: the cpu backend, and no partitions on it or time-slicing on cuda.
    let backend = match field("backend") {
        b if b.is_empty() => "cpu".to_string(),
        b => b,
    };
    let mechanism = match field("mechanism") {
        m if !m.is_empty() => m,
        _ if backend == "cuda" => "timeslice".to_string(),
        _ => "none".to_string(),
    };
    Ok(DeviceInfo {
        backend,
        mechanism,
        protection,
    })
}

fn bad(path: &Path, line: usize, column: &str, value: &str) -> DataError {
    let detail = format!("line {line}, column `{column}`: `{value}` is not a number");
    FileError::parse(path, detail).into()
}

fn cell_f64(
    path: &Path,
    line: usize,
    column: &str,
    row: &[String],
    i: usize,
) -> Result<Option<f64>, DataError> {
    match row.get(i).map(String::as_str) {
        None | Some("") => Ok(None),
        Some(s) => s
            .parse::<f64>()
            .map(Some)
            .map_err(|_| bad(path, line, column, s)),
    }
}

/// Latencies of completed jobs (skipped jobs have none), sorted.
fn latencies(jobs: &[isolane_trace::Job]) -> Vec<f64> {
    let mut out: Vec<f64> = jobs.iter().filter_map(|j| j.latency_ms).collect();
    out.sort_by(f64::total_cmp);
    out
}

/// A jobs file that cannot be read, in the report's terms (it names file, line and column).
fn trace_error(e: isolane_trace::TraceError) -> DataError {
    match e {
        isolane_trace::TraceError::File(f) => DataError::File(f),
        other => FileError::parse(Path::new(""), other.to_string()).into(),
    }
}

fn read_telemetry(path: &Path) -> Result<TelemetrySeries, DataError> {
    use isolane_trace::timeline::{GPU_COLUMN, TEXT_COLUMNS};
    let csv = isolane_trace::csv::Csv::read(path, &["t_s"]).map_err(trace_error)?;
    let t = csv.col("t_s").unwrap_or(0);
    let gpu = csv.col(GPU_COLUMN);
    let numeric: Vec<(usize, String)> = csv
        .header()
        .iter()
        .enumerate()
        .filter(|(i, h)| *i != t && Some(*i) != gpu && !TEXT_COLUMNS.contains(&h.as_str()))
        .map(|(i, h)| (i, h.clone()))
        .collect();
    let mut series = TelemetrySeries {
        t_s: Vec::with_capacity(csv.rows.len()),
        gpu: Vec::new(),
        columns: numeric
            .iter()
            .map(|(_, h)| (h.clone(), Vec::with_capacity(csv.rows.len())))
            .collect(),
    };
    for (line, row) in &csv.rows {
        let Some(ts) = cell_f64(path, *line, "t_s", row, t)? else {
            return Err(bad(path, *line, "t_s", ""));
        };
        series.t_s.push(ts);
        if let Some(i) = gpu {
            let cell = row.get(i).map_or("", String::as_str);
            let g = cell.parse::<u32>().map_err(|_| {
                let detail =
                    format!("line {line}, column `{GPU_COLUMN}`: `{cell}` is not a GPU index");
                DataError::from(FileError::parse(path, detail))
            })?;
            series.gpu.push(g);
        }
        for ((i, name), (_, col)) in numeric.iter().zip(series.columns.iter_mut()) {
            col.push(cell_f64(path, *line, name, row, *i)?);
        }
    }
    Ok(series)
}

#[cfg(test)]
mod tests {
    /// A results root as `reproduce.py` leaves it: a study folder with result folders, logs/
    /// and COMPLETE.json, and a sweep whose points are not taken on their own.
    #[test]
    fn find_results_takes_a_results_root_and_notes_what_it_skips() {
        use super::*;
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        let mk = |dir: &str, file: &str| {
            std::fs::create_dir_all(r.join(dir)).unwrap();
            std::fs::write(r.join(dir).join(file), "{}").unwrap();
        };
        mk("study/a-run", "summary.json");
        mk("study/b-maxrate", "maxrate.json");
        mk("study/logs/old", "x.log");
        mk("study", "COMPLETE.json");
        mk("sweep", "sweep.json");
        mk("sweep/point-1", "summary.json");
        let f = find_results(&[r.to_path_buf()]).unwrap();
        assert_eq!(
            f.dirs,
            vec![
                r.join("study/a-run"),
                r.join("study/b-maxrate"),
                r.join("sweep")
            ]
        );
        assert_eq!(
            f.skipped,
            vec![(r.join("study/logs"), "no results folder inside")]
        );
        // A shell glob of the study folder: the file is skipped with a note, not an error.
        let glob = [
            r.join("study/COMPLETE.json"),
            r.join("study/a-run"),
            r.join("study/logs"),
        ];
        let f = find_results(&glob).unwrap();
        assert_eq!(f.dirs, vec![r.join("study/a-run")]);
        assert_eq!(
            f.skipped,
            vec![
                (r.join("study/COMPLETE.json"), "not a folder"),
                (r.join("study/logs"), "no results folder inside"),
            ]
        );
        // Nothing at all is still the user's mistake.
        assert!(matches!(
            find_results(&[r.join("study/logs")]),
            Err(DataError::NotResults(_))
        ));
    }

    use super::*;

    /// `isolane report` on the folder of a run killed by SIGKILL said it was no results folder
    /// at all, while explain and trace said to run `isolane summarize` on it.
    #[test]
    fn a_killed_run_folder_is_sent_to_summarize() {
        let d = tempfile::tempdir().unwrap();
        let run = d.path().join("run");
        std::fs::create_dir_all(run.join("jobs")).unwrap();
        std::fs::write(run.join("scenario.toml"), "[device]\n").unwrap();
        for e in [
            load(&run).unwrap_err(),
            find_results(std::slice::from_ref(&run)).unwrap_err(),
        ] {
            assert!(matches!(e, DataError::CutShort(_)), "{e}");
            assert!(e.to_string().contains("isolane summarize"), "{e}");
        }
        // The parent of such a folder found nothing else either: the killed run is named.
        let e = find_results(&[d.path().to_path_buf()]).unwrap_err();
        assert!(matches!(e, DataError::NotResults(_)), "{e}");
    }

    #[test]
    fn a_folder_without_results_is_named_in_the_error() {
        let d = tempfile::tempdir().unwrap();
        let e = load(d.path()).unwrap_err();
        assert!(matches!(e, DataError::NotResults(_)));
        assert!(e.to_string().contains("summary.json"), "{e}");
        let e = load(&d.path().join("missing")).unwrap_err();
        assert!(matches!(e, DataError::NotResults(_)));
    }

    #[test]
    fn a_bad_cell_names_file_line_and_column() {
        let d = tempfile::tempdir().unwrap();
        let mut summary = RunSummary::new("run");
        summary
            .workloads
            .push(WorkloadSummary::new("a", "spin:1ms", 1));
        isolane_core::results::write_json(&d.path().join("summary.json"), &summary).unwrap();
        std::fs::create_dir(d.path().join("jobs")).unwrap();
        std::fs::write(
            d.path().join("jobs/a.csv"),
            "job,release_ms,start_ms,end_ms,latency_ms,timeout\n0,0,0,1,x,0\n",
        )
        .unwrap();
        let e = load(d.path()).unwrap_err().to_string();
        assert!(
            e.contains("a.csv") && e.contains("line 2") && e.contains("latency_ms"),
            "{e}"
        );
    }

    #[test]
    fn a_summary_without_workloads_is_a_parse_error() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("summary.json"), "{}").unwrap();
        let e = load(d.path()).unwrap_err().to_string();
        assert!(
            e.contains("summary.json") && e.contains("missing field"),
            "{e}"
        );
    }

    #[test]
    fn telemetry_columns_are_read_by_name_with_empty_cells() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("telemetry.csv");
        std::fs::write(
            &p,
            "t_s,power_w,throttle_reasons,sm_util_pct\n0.0,100.5,,\n0.05,120,sw_power_cap|hw_slowdown,40\n",
        )
        .unwrap();
        let t = read_telemetry(&p).unwrap();
        assert_eq!(t.points("power_w"), vec![(0.0, 100.5), (0.05, 120.0)]);
        assert_eq!(t.points("sm_util_pct"), vec![(0.05, 40.0)]);
        assert!(t.column("throttle_reasons").is_none());
    }

    #[test]
    fn a_telemetry_file_of_two_gpus_is_read_per_gpu() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("telemetry.csv");
        std::fs::write(
            &p,
            "t_s,gpu,power_w,throttle_reasons\n0.0,1,100,\n0.0,0,300,\n0.05,1,110,\n",
        )
        .unwrap();
        let t = read_telemetry(&p).unwrap();
        assert_eq!(t.gpus(), vec![0, 1]);
        assert!(t.column("gpu").is_none(), "the GPU is no quantity to plot");
        assert_eq!(t.points_on("power_w", 0), vec![(0.0, 300.0)]);
        assert_eq!(t.points_on("power_w", 1), vec![(0.0, 100.0), (0.05, 110.0)]);
        assert_eq!(t.points("power_w").len(), 3);
        std::fs::write(&p, "t_s,gpu,power_w\n0.0,,100\n").unwrap();
        let e = read_telemetry(&p).unwrap_err().to_string();
        assert!(e.contains("telemetry.csv") && e.contains("`gpu`"), "{e}");
    }

    /// A summary.json of a newer schema was named twice: "run/summary.json: run/summary.json:
    /// written by a newer isolane".
    #[test]
    fn a_summary_of_a_newer_schema_names_its_file_once() {
        let d = tempfile::tempdir().unwrap();
        let run = d.path().join("run");
        std::fs::create_dir_all(&run).unwrap();
        let summary = run.join("summary.json");
        let sample = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/sweep-partition-green/sms-024/summary.json");
        let mut v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(sample).unwrap()).unwrap();
        v["schema_version"] = 999.into();
        std::fs::write(&summary, v.to_string()).unwrap();
        let e = load(&run).unwrap_err().to_string();
        assert!(e.contains("written by a newer isolane"), "{e}");
        assert_eq!(e.matches(&*summary.to_string_lossy()).count(), 1, "{e}");
        let e = crate::explain::load_records(&run)
            .err()
            .unwrap()
            .to_string();
        assert_eq!(e.matches(&*summary.to_string_lossy()).count(), 1, "{e}");
    }
}
