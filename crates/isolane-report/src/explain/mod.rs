//! Why a run's jobs were late (`isolane explain RUN_DIR`, the report's "Why jobs were late";
//! docs/criticality.md). A module of the report crate rather than a crate of its own: it
//! reads a run folder as the report does (through isolane-trace) and the report draws it
//! (docs/design.md).
//!
//! Each late job's time beyond what it needs by itself is attributed to its causes, as time:
//! the neighbour workloads that ran beside it (named, with their memory intensity when a
//! profile gives it), the host (a start later than the job could start, with no neighbour on
//! its cores), the criticality guard's holds (`held_ms`), and its own service time beyond its
//! typical. A job queued behind its own earlier job inherits that job's causes. Per workload
//! the causes' shares add up to its late %.
//!
//! [`explain_dir`] reads a run folder (summary.json, scenario.toml, jobs/*.csv);
//! [`attribute::explain_run`] is the arithmetic on records in memory.

pub mod attribute;
pub mod memory;
pub mod render;

use std::path::{Path, PathBuf};

use isolane_core::files::{jobs_file_name, FileError};
use isolane_core::results::{read_json, RunStatus, RunSummary};
use isolane_core::spec::Criticality;
use serde::{Deserialize, Serialize};

pub use attribute::{
    explain_run, explain_run_against, typical_times, Placement, WorkloadRecords, MIN_CLEAN_JOBS,
};
pub use memory::{MemoryFigures, MemoryProfiles};

/// explain.json's schema; a file of a newer one is refused by name.
pub const SCHEMA_VERSION: u32 = 1;

/// The file `isolane explain` writes into the run folder.
pub const FILE_NAME: &str = "explain.json";

/// What a run's late jobs came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Explanation {
    pub schema_version: u32,
    /// The run folder explained.
    pub run: String,
    /// The memory profile file given (`--memory`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_profiles: Option<String>,
    /// The run folders (`--alone`) the typical service times were taken from.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub alone: Vec<String>,
    /// Why copy-engine waits are not among the causes.
    pub copy_engine: String,
    pub workloads: Vec<WorkloadExplanation>,
}

/// One workload: its late jobs and their causes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkloadExplanation {
    pub name: String,
    pub model: String,
    pub criticality: Criticality,
    pub deadline_ms: Option<f64>,
    /// Its recorded jobs (jobs/<workload>.csv), skipped ones included.
    pub jobs: u64,
    /// Those that missed their deadline (timeouts, skipped ones included).
    pub late: u64,
    pub late_pct: f64,
    /// What one job needs by itself: the median of its running times (start to end, less the
    /// guard's holds), of the jobs no neighbour ran beside when there are enough of them.
    pub typical_service_ms: Option<f64>,
    /// Which jobs that median is of, in words.
    pub typical_from: String,
    /// The share of its run its jobs spent running (first release to last end, the guard's
    /// holds left out), %: near 100, a little stretch on every job builds a queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub busy_pct: Option<f64>,
    /// Every workload that shares its GPU or its cores.
    pub neighbours: Vec<Neighbour>,
    /// Over its late jobs: each cause's time and its share of them, largest first; the
    /// shares add up to `late_pct`.
    pub causes: Vec<CauseShare>,
    pub late_jobs: Vec<LateJob>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Neighbour {
    pub name: String,
    pub model: String,
    /// What it shares with the workload, in words (`GPU 0`, `core 0`).
    pub shares: String,
    /// Its model's memory-system figures; `None`: unknown (no profile lists its model).
    pub memory: Option<MemoryFigures>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CauseKind {
    /// A neighbour workload ran beside it (`neighbour` names it).
    Neighbour,
    /// It started later than it could, with no neighbour on its cores: the host (other
    /// processes, a late wake-up).
    Host,
    /// The criticality guard held it.
    Guard,
    /// Its own running time beyond its typical while no neighbour ran beside it.
    OwnService,
    /// Nothing beyond its typical service: its deadline is below what it needs by itself, as
    /// measured in this run (`typical_from` says whether neighbours ran beside those jobs).
    DeadlineBelowTypical,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cause {
    pub cause: CauseKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub neighbour: Option<String>,
}

impl Cause {
    pub fn of(kind: CauseKind) -> Cause {
        Cause {
            cause: kind,
            neighbour: None,
        }
    }

    pub fn neighbour(name: &str) -> Cause {
        Cause {
            cause: CauseKind::Neighbour,
            neighbour: Some(name.to_string()),
        }
    }

    /// `beside besteffort`, `host: late start`, `guard holds`, `own service time`, `deadline
    /// below typical service`.
    pub fn words(&self) -> String {
        match (self.cause, &self.neighbour) {
            (CauseKind::Neighbour, Some(n)) => format!("beside {n}"),
            (CauseKind::Neighbour, None) => "beside a neighbour".into(),
            (CauseKind::Host, _) => "host: late start".into(),
            (CauseKind::Guard, _) => "guard holds".into(),
            (CauseKind::OwnService, _) => "own service time".into(),
            (CauseKind::DeadlineBelowTypical, _) => "deadline below typical service".into(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CauseShare {
    #[serde(flatten)]
    pub cause: Cause,
    /// Its share of the workload's jobs, in % (a late job counts once, split among its causes
    /// by their time); absent for one job's parts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub late_pct: Option<f64>,
    /// Its time over the late jobs, ms.
    pub time_ms: f64,
}

/// One late job and its causes' time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LateJob {
    pub job: u64,
    pub release_ms: f64,
    pub latency_ms: Option<f64>,
    /// How far past its deadline it ended.
    pub over_ms: Option<f64>,
    /// It never ran (`late = "skip"`): it could start only after its deadline.
    pub skipped: bool,
    pub parts: Vec<CauseShare>,
}

#[derive(Debug, thiserror::Error)]
pub enum ExplainError {
    /// The folder lacks something the attribution needs, or is not a run's: said with what
    /// is missing and what writes it.
    #[error("{0}")]
    Missing(String),
    #[error(transparent)]
    File(#[from] FileError),
}

/// Reads the run folder `dir` and explains its late jobs; `memory` names neighbours' memory
/// figures by model; a workload of the same name in one of the `alone` run folders (the first
/// that has a completed job of it) gives its typical service time, and a workload none of them
/// has keeps its own (its `typical_from` says which).
pub fn explain_dir(
    dir: &Path,
    memory: Option<(&Path, &MemoryProfiles)>,
    alone: &[PathBuf],
) -> Result<Explanation, ExplainError> {
    let records = load_records(dir)?;
    let mut baselines: Vec<(String, attribute::Baseline)> = Vec::new();
    for a in alone {
        let theirs = load_records(a)?;
        // A folder of other workloads gives no typical time: most likely the wrong folder.
        if !theirs
            .iter()
            .any(|t| records.iter().any(|r| r.name == t.name))
        {
            let names = |w: &[attribute::WorkloadRecords]| {
                w.iter()
                    .map(|w| w.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            return Err(ExplainError::Missing(format!(
                "--alone {}: none of its workloads ({}) is one of {}'s ({}); --alone takes a \
                 run folder of the same workloads run alone",
                a.display(),
                names(&theirs),
                dir.display(),
                names(&records)
            )));
        }
        for (name, ms, from) in attribute::typical_times(&theirs) {
            if let Some(ms) = ms.filter(|_| !baselines.iter().any(|(n, _)| *n == name)) {
                let from = format!("from {}: {from}", a.display());
                baselines.push((name, (ms, from)));
            }
        }
    }
    let of = |model: &str| memory.and_then(|(_, m)| m.of(model));
    let base = |name: &str| {
        baselines
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, b)| b.clone())
    };
    let workloads = attribute::explain_run_against(&records, &of, &base);
    let gpu = records.iter().any(|r| r.placement.gpu.is_some());
    Ok(Explanation {
        schema_version: SCHEMA_VERSION,
        run: dir.display().to_string(),
        memory_profiles: memory.map(|(p, _)| p.display().to_string()),
        alone: alone.iter().map(|a| a.display().to_string()).collect(),
        copy_engine: if gpu {
            "not recorded: jobs/*.csv times each job from start to end, not its copies, so a \
             copy's wait for the copy engine is inside its service time (under a neighbour or \
             its own service time)"
                .into()
        } else {
            "none: a CPU run has no copy engine".into()
        },
        workloads,
    })
}

/// Every workload's records and placement in the run folder `dir`.
pub fn load_records(dir: &Path) -> Result<Vec<WorkloadRecords>, ExplainError> {
    let d = dir.display();
    let summary_path = dir.join("summary.json");
    if !isolane_core::files::is_there(&summary_path) {
        return Err(ExplainError::Missing(not_a_run(dir)));
    }
    let summary: RunSummary =
        read_json(&summary_path).map_err(isolane_core::results::ResultsError::into_file_error)?;
    if !summary.apps.is_empty() {
        return Err(ExplainError::Missing(format!(
            "{d} is a run of [[app]]s: apps/<app>.csv keeps each frame's release and end but \
             not when its stages ran, so isolane explain cannot place them beside each other \
             (it explains runs of [[workload]]s)"
        )));
    }
    let scenario_path = dir.join("scenario.toml");
    if !isolane_core::files::is_there(&scenario_path) {
        return Err(ExplainError::Missing(format!(
            "{}: missing; isolane explain needs the resolved scenario that isolane run writes \
             into its folder, for each workload's cores and GPU (who ran beside whom)",
            scenario_path.display()
        )));
    }
    let places = placements(&scenario_path)?;
    let mut records = Vec::with_capacity(summary.workloads.len());
    for w in &summary.workloads {
        let placement = places
            .iter()
            .find(|(n, _)| *n == w.name)
            .map(|(_, p)| p.clone())
            .ok_or_else(|| {
                ExplainError::Missing(format!(
                    "{}: has no [[workload]] named `{}`, which summary.json lists; the two \
                     files are not of the same run",
                    scenario_path.display(),
                    w.name
                ))
            })?;
        let program = w
            .program
            .as_ref()
            .map(|p| (p.started_s * 1e3, p.ended_s * 1e3));
        let jobs = if program.is_some() {
            Vec::new()
        } else {
            let file = dir.join("jobs").join(jobs_file_name(&w.name));
            if isolane_core::files::is_there(&file) {
                isolane_trace::read_jobs(&file).map_err(|e| match e {
                    isolane_trace::TraceError::File(f) => ExplainError::File(f),
                    other => ExplainError::Missing(other.to_string()),
                })?
            } else if w.status == RunStatus::Failed {
                // It failed before it ran: it neither missed nor disturbed anything.
                continue;
            } else {
                return Err(ExplainError::Missing(format!(
                    "{}: missing; isolane explain attributes each job from the per-job \
                     records (release, start, end, timeout, held_ms) that isolane run writes \
                     in jobs/",
                    file.display()
                )));
            }
        };
        records.push(WorkloadRecords {
            name: w.name.clone(),
            model: w.model.clone(),
            criticality: w.criticality,
            deadline_ms: w
                .deadline_ms
                .or_else(|| w.rate_hz.filter(|r| *r > 0.0).map(|r| 1e3 / r)),
            placement,
            jobs,
            program,
        });
    }
    Ok(records)
}

/// explain.json of a run folder, when there is one.
pub fn read_explanation(dir: &Path) -> Result<Option<Explanation>, FileError> {
    let path = dir.join(FILE_NAME);
    if !isolane_core::files::is_there(&path) {
        return Ok(None);
    }
    let text = isolane_core::files::read_text(&path)?;
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| FileError::parse(&path, e.to_string()))?;
    let version = value.get("schema_version").and_then(|v| v.as_u64());
    if version.is_some_and(|v| v > u64::from(SCHEMA_VERSION)) {
        return Err(FileError::parse(
            &path,
            format!(
                "written by a newer isolane (schema_version {}; this build reads up to \
                 {SCHEMA_VERSION})",
                version.unwrap_or_default()
            ),
        ));
    }
    serde_json::from_value(value)
        .map(Some)
        .map_err(|e| FileError::parse(&path, e.to_string()))
}

/// Writes `e` to `dir`/explain.json (atomically: nothing else in the folder is touched).
pub fn write_explanation(dir: &Path, e: &Explanation) -> Result<PathBuf, FileError> {
    let path = dir.join(FILE_NAME);
    isolane_core::results::write_json(&path, e).map_err(|e| match e {
        isolane_core::results::ResultsError::File(f) => f,
        other => FileError::parse(&path, other.to_string()),
    })?;
    Ok(path)
}

/// Why `dir`, which has no summary.json, cannot be explained.
fn not_a_run(dir: &Path) -> String {
    let d = dir.display();
    for (file, what) in [
        ("maxrate.json", "a max-rate search folder"),
        (
            "interference.json",
            "an interference matrix folder (explain one of its cells)",
        ),
        ("sweep.json", "a sweep folder (explain one of its points)"),
        ("coexec.json", "a co-execution study folder"),
    ] {
        if dir.join(file).is_file() {
            return format!(
                "{d} is {what}, not a run folder: isolane explain reads the summary.json and \
                 jobs/*.csv of isolane run and isolation"
            );
        }
    }
    if dir.join("scenario.toml").is_file() {
        format!(
            "{d}/summary.json: missing; its run was killed before it wrote one: isolane \
             summarize {d} rebuilds it from jobs/*.csv, then isolane explain {d} reads it"
        )
    } else {
        format!(
            "{d} is not a run folder: isolane explain needs the summary.json, scenario.toml \
             and jobs/*.csv that isolane run and isolation write"
        )
    }
}

/// Each workload's placement from the resolved scenario: its GPU on the cuda backend (its
/// own `gpu`, else the device's), nothing on the CPU, and its pinned cores.
fn placements(path: &Path) -> Result<Vec<(String, Placement)>, FileError> {
    // A run folder's own copy: a regular file, never a FIFO to wait on.
    let text =
        isolane_core::files::read_regular_text_capped(path, isolane_core::files::MAX_CONFIG_BYTES)
            .map_err(|e| FileError::io(path, e))?;
    let value: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| FileError::parse(path, e.message().to_string()))?;
    let device = value.get("device");
    let device_str = |k: &str| device.and_then(|d| d.get(k)).and_then(|v| v.as_str());
    let device_backend = device_str("backend").unwrap_or("cpu").to_string();
    let device_gpu = device
        .and_then(|d| d.get("gpu"))
        .and_then(|v| v.as_integer())
        .unwrap_or(0);
    let bad =
        |field: String, what: &str| FileError::parse(path, format!("`{field}`: expected {what}"));
    let mut out = Vec::new();
    let Some(list) = value.get("workload") else {
        return Ok(out);
    };
    let list = list
        .as_array()
        .ok_or_else(|| bad("workload".into(), "[[workload]] tables"))?;
    for (i, w) in list.iter().enumerate() {
        let at = |k: &str| format!("workload[{i}].{k}");
        let name = w
            .get("name")
            .and_then(|v| v.as_str())
            .ok_or_else(|| bad(at("name"), "a workload's name"))?;
        let backend = w
            .get("backend")
            .and_then(|v| v.as_str())
            .unwrap_or(&device_backend);
        let gpu = match backend {
            "cuda" => {
                let g = w
                    .get("gpu")
                    .and_then(|v| v.as_integer())
                    .unwrap_or(device_gpu);
                Some(u32::try_from(g).map_err(|_| bad(at("gpu"), "a GPU index (0, 1, …)"))?)
            }
            _ => None,
        };
        let cores = match w.get("cpu") {
            None => Vec::new(),
            Some(v) => v
                .as_array()
                .and_then(|a| {
                    a.iter()
                        .map(|c| c.as_integer().and_then(|c| usize::try_from(c).ok()))
                        .collect::<Option<Vec<usize>>>()
                })
                .ok_or_else(|| bad(at("cpu"), "a list of core numbers"))?,
        };
        out.push((name.to_string(), Placement { gpu, cores }));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCENARIO: &str = "[device]\nbackend = \"cpu\"\n\n[[workload]]\nname = \"crit\"\n\
        cpu = [0]\n\n[[workload]]\nname = \"be\"\ncpu = [0]\n";

    fn folder() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        let mut crit = isolane_core::results::WorkloadSummary::new("crit", "spin:1ms", 1);
        crit.rate_hz = Some(100.0);
        crit.deadline_ms = Some(1.5);
        let mut be = isolane_core::results::WorkloadSummary::new("be", "spin:5ms", 1);
        be.criticality = Criticality::BestEffort;
        let summary = RunSummary {
            wall_s: 1.0,
            workloads: vec![crit, be],
            ..RunSummary::new("run")
        };
        isolane_core::results::write_json(&d.path().join("summary.json"), &summary).unwrap();
        std::fs::write(d.path().join("scenario.toml"), SCENARIO).unwrap();
        std::fs::create_dir(d.path().join("jobs")).unwrap();
        let mut crit = String::from("job,release_ms,start_ms,end_ms,latency_ms,timeout,held_ms\n");
        for k in 0..20 {
            let r = 10.0 * k as f64;
            let run = if k == 7 { 3.0 } else { 1.0 };
            let late = u8::from(run > 1.5);
            crit.push_str(&format!("{k},{r},{r},{},{run},{late},0\n", r + run));
        }
        std::fs::write(d.path().join("jobs/crit.csv"), crit).unwrap();
        std::fs::write(
            d.path().join("jobs/be.csv"),
            "job,release_ms,start_ms,end_ms,latency_ms,timeout,held_ms\n0,70,70,75,5,0,0\n",
        )
        .unwrap();
        d
    }

    #[test]
    fn a_run_folder_is_explained_and_written_back_next_to_its_files() {
        let d = folder();
        let mem = MemoryProfiles::parse("[[model]]\nmodel = \"spin:5ms\"\nl2_mib = 1\n").unwrap();
        let e = explain_dir(d.path(), Some((Path::new("mem.toml"), &mem)), &[]).unwrap();
        let crit = &e.workloads[0];
        assert_eq!((crit.name.as_str(), crit.late), ("crit", 1));
        assert_eq!(crit.causes[0].cause, Cause::neighbour("be"));
        assert_eq!(
            crit.neighbours[0].memory.as_ref().unwrap().l2_mib,
            Some(1.0)
        );
        assert_eq!(e.copy_engine, "none: a CPU run has no copy engine");
        // Best effort: closed loop, no deadline, nothing late.
        assert_eq!(e.workloads[1].late, 0);
        let before: Vec<_> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        let path = write_explanation(d.path(), &e).unwrap();
        assert_eq!(path, d.path().join("explain.json"));
        let after: Vec<_> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(
            after.len(),
            before.len() + 1,
            "only explain.json added: {after:?}"
        );
        assert_eq!(read_explanation(d.path()).unwrap(), Some(e.clone()));
        // Rewriting it is fine.
        write_explanation(d.path(), &e).unwrap();
    }

    #[test]
    fn what_is_missing_is_named() {
        let d = folder();
        std::fs::remove_file(d.path().join("jobs/crit.csv")).unwrap();
        let e = explain_dir(d.path(), None, &[]).unwrap_err().to_string();
        assert!(
            e.contains("jobs/crit.csv: missing") && e.contains("per-job records"),
            "{e}"
        );

        let d = folder();
        std::fs::remove_file(d.path().join("scenario.toml")).unwrap();
        let e = explain_dir(d.path(), None, &[]).unwrap_err().to_string();
        assert!(e.contains("scenario.toml: missing"), "{e}");

        let d = folder();
        std::fs::remove_file(d.path().join("summary.json")).unwrap();
        let e = explain_dir(d.path(), None, &[]).unwrap_err().to_string();
        assert!(e.contains("isolane summarize"), "{e}");

        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("sweep.json"), "{}").unwrap();
        let e = explain_dir(d.path(), None, &[]).unwrap_err().to_string();
        assert!(e.contains("a sweep folder"), "{e}");

        let d = folder();
        std::fs::write(
            d.path().join("scenario.toml"),
            "[[workload]]\nname = \"crit\"\n",
        )
        .unwrap();
        let e = explain_dir(d.path(), None, &[]).unwrap_err().to_string();
        assert!(e.contains("no [[workload]] named `be`"), "{e}");

        let d = folder();
        std::fs::write(
            d.path().join("scenario.toml"),
            SCENARIO.replace("cpu = [0]\n\n", "cpu = [\"zero\"]\n\n"),
        )
        .unwrap();
        let e = explain_dir(d.path(), None, &[]).unwrap_err().to_string();
        assert!(
            e.contains("workload[0].cpu") && e.contains("core numbers"),
            "{e}"
        );

        let d = folder();
        std::fs::write(d.path().join("jobs/be.csv"), "job,release_ms\n0,0\n").unwrap();
        let e = explain_dir(d.path(), None, &[]).unwrap_err().to_string();
        assert!(e.contains("be.csv") && e.contains("`start_ms`"), "{e}");
    }

    #[test]
    fn a_run_alone_gives_the_typical_service_time() {
        let d = folder();
        // `crit` alone: its jobs take 0.5 ms, so job 7's 3 ms is 2.5 ms beyond.
        let alone = folder();
        let mut crit = String::from("job,release_ms,start_ms,end_ms,latency_ms,timeout\n");
        for k in 0..12 {
            let r = 10.0 * k as f64;
            crit.push_str(&format!("{k},{r},{r},{},0.5,0\n", r + 0.5));
        }
        std::fs::write(alone.path().join("jobs/crit.csv"), crit).unwrap();
        let e = explain_dir(d.path(), None, &[alone.path().to_path_buf()]).unwrap();
        let crit = &e.workloads[0];
        assert_eq!(crit.typical_service_ms, Some(0.5));
        assert!(
            crit.typical_from.starts_with("from "),
            "{}",
            crit.typical_from
        );
        assert!(
            (crit.causes[0].time_ms - 2.5).abs() < 1e-9,
            "{:?}",
            crit.causes
        );
        assert_eq!(e.alone, [alone.path().display().to_string()]);
        // A workload no run alone completed a job of keeps its own typical time.
        std::fs::write(
            alone.path().join("jobs/be.csv"),
            "job,release_ms,start_ms,end_ms,latency_ms,timeout\n0,0,,,,1\n",
        )
        .unwrap();
        let e = explain_dir(d.path(), None, &[alone.path().to_path_buf()]).unwrap();
        assert!(e.workloads[0].typical_from.starts_with("from "));
        assert_eq!(e.workloads[1].typical_service_ms, Some(5.0));
        assert!(
            e.workloads[1].typical_from.starts_with("the median"),
            "{:?}",
            e.workloads[1]
        );
    }

    /// A folder that shares no workload with the run was once taken silently, and no typical
    /// time came from it.
    #[test]
    fn an_alone_folder_of_other_workloads_is_refused() {
        let d = folder();
        let other = folder();
        for f in ["summary.json", "scenario.toml"] {
            let p = other.path().join(f);
            let text = std::fs::read_to_string(&p).unwrap();
            std::fs::write(
                &p,
                text.replace("\"crit\"", "\"x\"").replace("\"be\"", "\"y\""),
            )
            .unwrap();
        }
        for (from, to) in [("crit", "x"), ("be", "y")] {
            let jobs = other.path().join("jobs");
            std::fs::rename(
                jobs.join(format!("{from}.csv")),
                jobs.join(format!("{to}.csv")),
            )
            .unwrap();
        }
        let e = explain_dir(d.path(), None, &[other.path().to_path_buf()])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("none of its workloads (x, y) is one of") && e.contains("(crit, be)"),
            "{e}"
        );
    }

    #[test]
    fn a_newer_or_broken_explain_json_is_refused_by_name() {
        let d = folder();
        std::fs::write(d.path().join("explain.json"), "{\"schema_version\": 99}").unwrap();
        let e = read_explanation(d.path()).unwrap_err().to_string();
        assert!(e.contains("explain.json") && e.contains("newer"), "{e}");
        std::fs::write(d.path().join("explain.json"), "{").unwrap();
        let e = read_explanation(d.path()).unwrap_err().to_string();
        assert!(e.contains("explain.json"), "{e}");
    }
}
