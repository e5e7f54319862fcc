//! Reading results folders back for the HTML report.
//!
//! A folder is recognised by the file that only its kind writes: `sweep.json` (a sweep: one
//! run folder per point), `maxrate.json` (`isolane maxrate --out`), `summary.json` (`isolane
//! run` / `isolation`). Everything else in it is optional and only adds sections. The structs
//! here name only the fields the report draws and tolerate the rest, so a summary written by a
//! newer isolane still renders.

use isolane_core::files::jobs_file_name;
use std::path::{Path, PathBuf};

use serde::Deserialize;

#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error(
        "{0} is not an isolane results folder: it has none of summary.json (isolane run / \
         isolation), maxrate.json (isolane maxrate --out) or sweep.json (isolane sweep)"
    )]
    NotResults(PathBuf),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {detail}")]
    Parse { path: PathBuf, detail: String },
}

fn read(path: &Path) -> Result<String, DataError> {
    std::fs::read_to_string(path).map_err(|source| DataError::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn parse_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, DataError> {
    let text = read(path)?;
    // serde_path_to_error is not a dependency; serde_json's message already names the field
    // and the line/column, which is what a user needs to find the problem.
    serde_json::from_str(&text).map_err(|e| DataError::Parse {
        path: path.to_path_buf(),
        detail: e.to_string(),
    })
}

/// Latency statistics the report shows (ms).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Latency {
    pub mean: Option<f64>,
    pub p50: Option<f64>,
    pub p99: Option<f64>,
    pub max: Option<f64>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct WorkloadSummary {
    pub name: String,
    #[serde(default)]
    pub model: String,
    #[serde(default = "one")]
    pub batch: u32,
    #[serde(default)]
    pub rate_hz: Option<f64>,
    #[serde(default)]
    pub status: String,
    #[serde(default)]
    pub jobs: u64,
    #[serde(default)]
    pub timeouts: u64,
    #[serde(default)]
    pub timeout_pct: f64,
    #[serde(default)]
    pub latency_ms: Latency,
    #[serde(default)]
    pub throughput_ips: f64,
    #[serde(default)]
    pub gpu_memory_mib: Option<f64>,
    #[serde(default)]
    pub energy_j: Option<f64>,
    #[serde(default)]
    pub j_per_image: Option<f64>,
}

fn one() -> u32 {
    1
}

/// `{mean, min, max}` of one telemetry quantity in summary.json's `telemetry` object.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(default)]
pub struct Stat {
    pub mean: Option<f64>,
    pub min: Option<f64>,
    pub max: Option<f64>,
}

/// A quantity the device did not report is `null` in summary.json: read as all-empty.
fn nullable<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Stat, D::Error> {
    Ok(Option::<Stat>::deserialize(d)?.unwrap_or_default())
}

/// The part of summary.json's `telemetry` object the report uses.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct TelemetrySummary {
    #[serde(deserialize_with = "nullable")]
    pub power_w: Stat,
    pub energy_j: Option<f64>,
    #[serde(deserialize_with = "nullable")]
    pub sm_clock_mhz: Stat,
    #[serde(deserialize_with = "nullable")]
    pub temperature_c: Stat,
    #[serde(deserialize_with = "nullable")]
    pub memory_used_mib: Stat,
    pub throttle_reasons: Vec<String>,
    pub sampler_cpu_pct: Option<f64>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct RunSummary {
    #[serde(default)]
    pub command: String,
    #[serde(default)]
    pub status: String,
    /// `false`: rebuilt by `isolane summarize` from a run that was cut short (killed).
    #[serde(default = "complete_by_default")]
    pub complete: bool,
    #[serde(default)]
    pub wall_s: f64,
    /// Share of the machine's CPU a hypervisor took during the run (%), where recorded.
    #[serde(default)]
    pub cpu_steal_pct: Option<f64>,
    pub workloads: Vec<WorkloadSummary>,
    #[serde(default)]
    pub telemetry: Option<TelemetrySummary>,
}

fn complete_by_default() -> bool {
    true
}

impl RunSummary {
    pub fn total_throughput_ips(&self) -> f64 {
        self.workloads.iter().map(|w| w.throughput_ips).sum()
    }
}

/// What the report needs from the resolved scenario.toml: how the device was shared.
#[derive(Debug, Clone, Default)]
pub struct DeviceInfo {
    pub backend: String,
    pub mechanism: String,
}

/// One row of isolation.csv.
#[derive(Debug, Clone, PartialEq)]
pub struct IsolationRow {
    pub step: u32,
    pub interferer_rate_hz: f64,
    pub victim: String,
    pub timeout_pct: f64,
}

/// telemetry.csv as columns: `t_s` and every numeric column by name.
#[derive(Debug, Clone, Default)]
pub struct TelemetrySeries {
    pub t_s: Vec<f64>,
    pub columns: Vec<(String, Vec<Option<f64>>)>,
}

impl TelemetrySeries {
    pub fn column(&self, name: &str) -> Option<&[Option<f64>]> {
        self.columns
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
    }

    /// `(t, value)` pairs of a column, leaving out empty cells.
    pub fn points(&self, name: &str) -> Vec<(f64, f64)> {
        self.column(name)
            .map(|c| {
                self.t_s
                    .iter()
                    .zip(c)
                    .filter_map(|(t, v)| v.map(|v| (*t, v)))
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
}

#[derive(Debug, Clone, Deserialize)]
pub struct Maxrate {
    pub model: String,
    #[serde(default = "one")]
    pub batch: u32,
    pub max_rate_hz: f64,
    #[serde(default)]
    pub l_max_ms: Option<f64>,
    /// Written by runs on a GPU; absent for the CPU.
    #[serde(default)]
    pub mechanism: Option<String>,
    #[serde(default)]
    pub backend: Option<String>,
    /// The partition the search ran in: green SMs or MPS thread %.
    #[serde(default)]
    pub sms: Option<u32>,
    #[serde(default)]
    pub thread_pct: Option<u32>,
    #[serde(default)]
    pub precision: Option<String>,
}

impl Maxrate {
    /// The column of Tables II–III this result belongs to.
    pub fn column(&self) -> String {
        let base = match (&self.mechanism, &self.backend) {
            (Some(m), _) if m != "none" => m.clone(),
            (_, Some(b)) => b.clone(),
            _ => "cpu".to_string(),
        };
        match (self.sms, self.thread_pct) {
            (Some(s), _) => format!("{base} ({s} SMs)"),
            (None, Some(p)) => format!("{base} ({p}%)"),
            _ => base,
        }
    }

    pub fn row(&self) -> String {
        let mut r = self.model.clone();
        if let Some(p) = self.precision.as_deref().filter(|p| *p != "fp32") {
            r = format!("{r} {p}");
        }
        if self.batch != 1 {
            r = format!("{r} (batch {})", self.batch);
        }
        r
    }
}

#[derive(Debug, Clone)]
pub struct MaxrateDir {
    pub path: PathBuf,
    pub result: Maxrate,
}

/// sweep.json, written by `isolane sweep`.
#[derive(Debug, Clone, Deserialize)]
pub struct SweepIndex {
    /// `partition` or `concurrency`.
    pub kind: String,
    pub model: String,
    #[serde(default)]
    pub backend: String,
    #[serde(default)]
    pub mechanism: String,
    #[serde(default)]
    pub precision: String,
    pub points: Vec<SweepPoint>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct SweepPoint {
    /// The point's run folder, relative to the sweep folder.
    pub dir: String,
    #[serde(default)]
    pub status: String,
    /// partition: SMs (green) or thread % (mps).
    #[serde(default)]
    pub sms: Option<u32>,
    #[serde(default)]
    pub thread_pct: Option<u32>,
    /// concurrency
    #[serde(default)]
    pub workloads: Option<u32>,
    #[serde(default)]
    pub batch: Option<u32>,
    #[serde(default)]
    pub precision: Option<String>,
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

#[derive(Debug, Clone)]
pub enum ResultsDir {
    Run(Box<RunDir>),
    Maxrate(MaxrateDir),
    Sweep(SweepDir),
}

fn label_of(path: &Path) -> String {
    let canon = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    canon
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string())
}

/// Loads one folder given on the command line.
pub fn load(path: &Path) -> Result<ResultsDir, DataError> {
    if !path.is_dir() {
        return Err(DataError::NotResults(path.to_path_buf()));
    }
    if path.join("sweep.json").is_file() {
        return load_sweep(path).map(ResultsDir::Sweep);
    }
    if path.join("maxrate.json").is_file() {
        let result = parse_json(&path.join("maxrate.json"))?;
        return Ok(ResultsDir::Maxrate(MaxrateDir {
            path: path.to_path_buf(),
            result,
        }));
    }
    if path.join("summary.json").is_file() {
        return load_run(path).map(|r| ResultsDir::Run(Box::new(r)));
    }
    Err(DataError::NotResults(path.to_path_buf()))
}

fn load_sweep(path: &Path) -> Result<SweepDir, DataError> {
    let file = path.join("sweep.json");
    let index: SweepIndex = parse_json(&file)?;
    if index.kind != "partition" && index.kind != "concurrency" {
        return Err(DataError::Parse {
            path: file,
            detail: format!(
                "kind: `{}` is not a sweep kind (allowed: partition, concurrency)",
                index.kind
            ),
        });
    }
    let mut points = Vec::new();
    for p in &index.points {
        let dir = path.join(&p.dir);
        let run = if dir.join("summary.json").is_file() {
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
    let summary: RunSummary = parse_json(&path.join("summary.json"))?;
    let device = read_device(&path.join("scenario.toml"))?;
    let mut latencies_ms = Vec::new();
    for w in &summary.workloads {
        let file = path.join("jobs").join(jobs_file_name(&w.name));
        if file.is_file() {
            latencies_ms.push((w.name.clone(), read_latencies(&file)?));
        }
    }
    let iso = path.join("isolation.csv");
    let isolation = if iso.is_file() {
        read_isolation(&iso)?
    } else {
        Vec::new()
    };
    let tel = path.join("telemetry.csv");
    let telemetry = if tel.is_file() {
        Some(read_telemetry(&tel)?)
    } else {
        None
    };
    Ok(RunDir {
        path: path.to_path_buf(),
        label: label_of(path),
        summary,
        device,
        latencies_ms,
        isolation,
        telemetry,
    })
}

fn read_device(path: &Path) -> Result<DeviceInfo, DataError> {
    if !path.is_file() {
        return Ok(DeviceInfo::default());
    }
    let text = read(path)?;
    let value: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| DataError::Parse {
            path: path.to_path_buf(),
            detail: e.to_string(),
        })?;
    let field = |k: &str| {
        value
            .get("device")
            .and_then(|d| d.get(k))
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_string()
    };
    Ok(DeviceInfo {
        backend: field("backend"),
        mechanism: field("mechanism"),
    })
}

/// A CSV with a header, read as rows of cells; `required` columns must be in the header.
struct Csv {
    header: Vec<String>,
    rows: Vec<(usize, Vec<String>)>,
}

impl Csv {
    fn read(path: &Path, required: &[&str]) -> Result<Csv, DataError> {
        let text = read(path)?;
        let mut lines = text.lines().enumerate();
        let header: Vec<String> = match lines.next() {
            Some((_, h)) => h.split(',').map(|s| s.trim().to_string()).collect(),
            None => Vec::new(),
        };
        for r in required {
            if !header.iter().any(|h| h == r) {
                return Err(DataError::Parse {
                    path: path.to_path_buf(),
                    detail: format!("line 1: the header has no `{r}` column"),
                });
            }
        }
        let rows = lines
            .filter(|(_, l)| !l.trim().is_empty())
            .map(|(i, l)| (i + 1, l.split(',').map(|s| s.trim().to_string()).collect()))
            .collect();
        Ok(Csv { header, rows })
    }

    fn col(&self, name: &str) -> Option<usize> {
        self.header.iter().position(|h| h == name)
    }
}

fn bad(path: &Path, line: usize, column: &str, value: &str) -> DataError {
    DataError::Parse {
        path: path.to_path_buf(),
        detail: format!("line {line}, column `{column}`: `{value}` is not a number"),
    }
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

/// Latencies of completed jobs (skipped jobs have an empty cell), sorted.
fn read_latencies(path: &Path) -> Result<Vec<f64>, DataError> {
    let csv = Csv::read(path, &["latency_ms"])?;
    let i = csv.col("latency_ms").unwrap_or(0);
    let mut out = Vec::with_capacity(csv.rows.len());
    for (line, row) in &csv.rows {
        if let Some(v) = cell_f64(path, *line, "latency_ms", row, i)? {
            out.push(v);
        }
    }
    out.sort_by(f64::total_cmp);
    Ok(out)
}

fn read_isolation(path: &Path) -> Result<Vec<IsolationRow>, DataError> {
    let need = ["step", "interferer_rate_hz", "victim", "timeout_pct"];
    let csv = Csv::read(path, &need)?;
    let [step, rate, victim, pct] = need.map(|n| csv.col(n).unwrap_or(0));
    let mut out = Vec::new();
    for (line, row) in &csv.rows {
        let num = |i: usize, name: &str| -> Result<f64, DataError> {
            cell_f64(path, *line, name, row, i)?.ok_or_else(|| bad(path, *line, name, ""))
        };
        out.push(IsolationRow {
            step: num(step, "step")? as u32,
            interferer_rate_hz: num(rate, "interferer_rate_hz")?,
            victim: row.get(victim).cloned().unwrap_or_default(),
            timeout_pct: num(pct, "timeout_pct")?,
        });
    }
    Ok(out)
}

/// Columns of telemetry.csv that are not numbers.
const TEXT_COLUMNS: &[&str] = &["throttle_reasons", "process_memory_mib"];

fn read_telemetry(path: &Path) -> Result<TelemetrySeries, DataError> {
    let csv = Csv::read(path, &["t_s"])?;
    let t = csv.col("t_s").unwrap_or(0);
    let numeric: Vec<(usize, String)> = csv
        .header
        .iter()
        .enumerate()
        .filter(|(i, h)| *i != t && !TEXT_COLUMNS.contains(&h.as_str()))
        .map(|(i, h)| (i, h.clone()))
        .collect();
    let mut series = TelemetrySeries {
        t_s: Vec::with_capacity(csv.rows.len()),
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
        for ((i, name), (_, col)) in numeric.iter().zip(series.columns.iter_mut()) {
            col.push(cell_f64(path, *line, name, row, *i)?);
        }
    }
    Ok(series)
}

#[cfg(test)]
mod tests {
    use super::*;

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
        std::fs::write(
            d.path().join("summary.json"),
            r#"{"workloads":[{"name":"a"}]}"#,
        )
        .unwrap();
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
        assert!(e.contains("summary.json") && e.contains("workloads"), "{e}");
    }

    #[test]
    fn a_telemetry_summary_with_null_quantities_reads() {
        let t: TelemetrySummary = serde_json::from_str(
            r#"{"power_w": null, "sm_clock_mhz": {"mean": 1980, "min": 1755, "max": 1980},
                "energy_j": null, "sm_util_pct": null, "throttle_reasons": []}"#,
        )
        .unwrap();
        assert_eq!(t.power_w.mean, None);
        assert_eq!(t.sm_clock_mhz.min, Some(1755.0));
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
}
