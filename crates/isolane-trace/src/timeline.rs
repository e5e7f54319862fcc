//! A results folder read back as a timeline: every workload's jobs, the partitions, the
//! isolation steps and the telemetry columns, all in ms since the run's t0.

use std::path::{Path, PathBuf};

use isolane_core::files::jobs_file_name;
use isolane_core::results::{read_json, AppSummary, PartitionRecord, RunSummary};

use crate::csv::Csv;
use crate::TraceError;

/// One job of a workload, as jobs/<workload>.csv has it (ms since t0).
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    pub index: u64,
    pub release_ms: f64,
    /// `None` for a job skipped under `late = "skip"` (it counts as a timeout).
    pub start_ms: Option<f64>,
    pub end_ms: Option<f64>,
    pub latency_ms: Option<f64>,
    pub timeout: bool,
    /// How long the criticality guard held the job back (the optional `held_ms` column, or
    /// `held_ns` in ns); `None` when the file has neither column or the cell is empty.
    pub held_ms: Option<f64>,
}

/// One workload's track, or an app's or one of its stages'.
#[derive(Debug, Clone, PartialEq)]
pub struct Lane {
    pub name: String,
    /// A workload's model; an app's rate and deadline; a stage's kind and partition.
    pub model: String,
    pub deadline_ms: Option<f64>,
    pub jobs: Vec<Job>,
    /// A command workload's program: one span, no jobs (docs/programs.md).
    pub program: Option<ProgramSpan>,
    pub kind: LaneKind,
}

/// What a lane's jobs are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LaneKind {
    /// A workload's jobs.
    #[default]
    Workload,
    /// An app's frames, end to end: each from its release to the sink's end (`start_ms` is
    /// the release), `timeout` against the app's deadline.
    App,
    /// A stage of an app: each frame it ran from its start to its end, a frame it did not run
    /// (dropped) with no start.
    Stage,
}

/// When a command workload's program ran (ms since t0) and how it ended.
#[derive(Debug, Clone, PartialEq)]
pub struct ProgramSpan {
    pub start_ms: f64,
    pub end_ms: f64,
    /// "exited", "timed out", … (`ProgramEnd::words`).
    pub ended: String,
    pub exit_code: Option<i32>,
}

/// One step of an isolation ramp (ms since t0).
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub step: u32,
    pub start_ms: f64,
    pub end_ms: f64,
    pub interferer_rate_hz: f64,
}

/// One numeric telemetry column: (ms since t0, value), empty and non-finite cells left out.
#[derive(Debug, Clone, PartialEq)]
pub struct Counter {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// Everything of one run that has a time.
#[derive(Debug, Clone, PartialEq)]
pub struct Timeline {
    pub dir: PathBuf,
    /// `run` or `isolation`.
    pub command: String,
    /// t0 to the end of the last workload.
    pub wall_ms: f64,
    pub lanes: Vec<Lane>,
    pub partitions: Vec<PartitionRecord>,
    pub steps: Vec<Step>,
    pub counters: Vec<Counter>,
}

/// Columns of telemetry.csv that hold text, not numbers (docs/report.md).
pub const TEXT_COLUMNS: &[&str] = &["throttle_reasons", "process_memory_mib"];

impl Timeline {
    /// Reads the run or isolation folder `dir`: summary.json (required), jobs/*.csv and
    /// telemetry.csv where present (a workload that failed before it ran has no jobs file).
    pub fn load(dir: &Path) -> Result<Timeline, TraceError> {
        let summary_path = dir.join("summary.json");
        if !isolane_core::files::is_there(&summary_path) {
            return Err(not_a_run(dir));
        }
        let summary: RunSummary = read_json(&summary_path)?;
        let mut lanes = Vec::with_capacity(summary.workloads.len());
        for app in &summary.apps {
            lanes.extend(app_lanes(dir, app)?);
        }
        for w in &summary.workloads {
            let file = dir.join("jobs").join(jobs_file_name(&w.name));
            let jobs = if isolane_core::files::is_there(&file) {
                read_jobs(&file)?
            } else {
                Vec::new()
            };
            lanes.push(Lane {
                name: w.name.clone(),
                model: w.model.clone(),
                deadline_ms: w.deadline_ms,
                jobs,
                program: w.program.as_ref().map(|p| ProgramSpan {
                    start_ms: p.started_s * 1e3,
                    end_ms: p.ended_s * 1e3,
                    ended: p.end.words().to_string(),
                    exit_code: w.exit_code,
                }),
                kind: LaneKind::Workload,
            });
        }
        let tel = dir.join("telemetry.csv");
        let counters = if isolane_core::files::is_there(&tel) {
            read_counters(&tel)?
        } else {
            Vec::new()
        };
        Ok(Timeline {
            dir: dir.to_path_buf(),
            steps: steps_of(&summary),
            command: summary.command,
            wall_ms: summary.wall_s * 1e3,
            lanes,
            partitions: summary.partitions,
            counters,
        })
    }

    /// Only what happened in `[from_ms, to_ms]` (ms since t0): jobs whose release-to-end span
    /// meets it, telemetry samples and steps in it; partitions are kept. For a part of a long
    /// run whose whole trace would be too large to open.
    pub fn window(mut self, from_ms: f64, to_ms: f64) -> Timeline {
        let meets = |a: f64, b: f64| b >= from_ms && a <= to_ms;
        for lane in &mut self.lanes {
            lane.jobs
                .retain(|j| meets(j.release_ms, j.end_ms.unwrap_or(j.release_ms)));
        }
        for c in &mut self.counters {
            c.points.retain(|p| meets(p.0, p.0));
        }
        self.counters.retain(|c| !c.points.is_empty());
        self.steps.retain(|s| meets(s.start_ms, s.end_ms));
        self
    }

    /// The completed job with the longest response time, as (lane index, job).
    pub fn worst_job(&self) -> Option<(usize, &Job)> {
        self.lanes
            .iter()
            .enumerate()
            .flat_map(|(i, l)| l.jobs.iter().map(move |j| (i, j)))
            .filter(|(_, j)| j.latency_ms.is_some())
            .max_by(|a, b| {
                let (la, lb) = (a.1.latency_ms, b.1.latency_ms);
                la.unwrap_or(0.0).total_cmp(&lb.unwrap_or(0.0))
            })
    }
}

/// Why `dir`, which has no summary.json, has no timeline: another command's results folder
/// (named, with the command that reads it, since `isolane summarize` cannot make a run of it),
/// a run killed before it wrote its summary, or neither.
fn not_a_run(dir: &Path) -> TraceError {
    let d = dir.display();
    let kinds: [(&str, &'static str, String); 4] = [
        (
            "maxrate.json",
            "a max-rate search folder (maxrate.json, from isolane maxrate)",
            format!("it keeps the search's batches, not its jobs; isolane report {d} shows it"),
        ),
        (
            "interference.json",
            "an interference matrix folder (interference.json, from isolane interference)",
            format!(
                "isolane report {d} draws the matrix, and each cell's run folder in it can be \
                 traced (isolane trace {d}/<cell>)"
            ),
        ),
        (
            "sweep.json",
            "a sweep folder (sweep.json, from isolane sweep)",
            format!(
                "isolane report {d} draws the sweep, and each point's run folder in it can be \
                 traced (isolane trace {d}/<point>)"
            ),
        ),
        (
            "coexec.json",
            "a co-execution study folder (coexec.json, from isolane coexec)",
            format!(
                "isolane report {d} draws the study, and each run's folder in it can be traced \
                 (isolane trace {d}/alone/<job>)"
            ),
        ),
    ];
    for (file, what, hint) in kinds {
        if dir.join(file).is_file() {
            return TraceError::OtherResults {
                dir: dir.to_path_buf(),
                what,
                hint,
            };
        }
    }
    // `run` and `isolation` write scenario.toml before the first job.
    if dir.join("scenario.toml").is_file() {
        TraceError::CutShort(dir.to_path_buf())
    } else {
        TraceError::NotARun(dir.to_path_buf())
    }
}

/// An app's lane (its frames end to end) and one per stage, from apps/<app>.csv by column
/// name: `frame`, `release_ms`, `end_ms`, `latency_ms`, `timeout`, `held_ms` (optional) and
/// per stage `<stage>_ms` (own time) and `<stage>.start_ms`. A file without the starts was
/// written before they were recorded: its stages have no place on a timeline.
fn app_lanes(dir: &Path, app: &AppSummary) -> Result<Vec<Lane>, TraceError> {
    let path = dir.join("apps").join(format!("{}.csv", app.name));
    let csv = Csv::read(
        &path,
        &["frame", "release_ms", "end_ms", "latency_ms", "timeout"],
    )?;
    let col = |n: &str| csv.col(n).unwrap_or(0);
    let (frame, release, end, latency, timeout) = (
        col("frame"),
        col("release_ms"),
        col("end_ms"),
        col("latency_ms"),
        col("timeout"),
    );
    let held = csv.col("held_ms");
    // Per stage: (own time, start) columns.
    let mut stage_cols = Vec::with_capacity(app.stages.len());
    for s in &app.stages {
        match (
            csv.col(&format!("{}_ms", s.name)),
            csv.col(&format!("{}.start_ms", s.name)),
        ) {
            (Some(own), Some(start)) => stage_cols.push((own, start)),
            _ => {
                return Err(TraceError::Apps {
                    dir: dir.to_path_buf(),
                    file: path,
                    stage: s.name.clone(),
                })
            }
        }
    }
    // Each row: its frame and its job in each stage.
    let rows = csv.parse_rows(|line, row| {
        let index = row
            .get(frame)
            .and_then(|c| c.parse::<u64>().ok())
            .ok_or_else(|| {
                csv.error(
                    line,
                    format!(
                        "column `frame`: `{}` is not a frame index (0, 1, …)",
                        row.get(frame).map_or("", String::as_str)
                    ),
                )
            })?;
        let release_ms = csv
            .time_at(line, row, Some(release))?
            .ok_or_else(|| csv.error(line, "column `release_ms` is empty".to_string()))?;
        let end_ms = csv.time_at(line, row, Some(end))?;
        let timed_out = match row.get(timeout).map(String::as_str) {
            Some("1") => true,
            Some("0") => false,
            other => {
                return Err(csv.error(
                    line,
                    format!(
                        "column `timeout`: `{}` is not 0 or 1",
                        other.unwrap_or_default()
                    ),
                ))
            }
        };
        let frame_job = Job {
            index,
            release_ms,
            start_ms: end_ms.map(|_| release_ms),
            end_ms,
            latency_ms: csv.time_at(line, row, Some(latency))?,
            timeout: timed_out,
            held_ms: csv.time_at(line, row, held)?,
        };
        let mut stage_jobs = Vec::with_capacity(stage_cols.len());
        for &(own, start) in &stage_cols {
            let start_ms = csv.time_at(line, row, Some(start))?;
            let own_ms = csv.time_at(line, row, Some(own))?;
            let ran = start_ms.zip(own_ms);
            stage_jobs.push(Job {
                index,
                release_ms,
                start_ms: ran.map(|r| r.0),
                end_ms: ran.map(|(s, o)| s + o),
                latency_ms: ran.map(|r| r.1),
                timeout: ran.is_none(),
                held_ms: None,
            });
        }
        Ok((frame_job, stage_jobs))
    })?;
    let mut frames = Vec::with_capacity(rows.len());
    let mut stages: Vec<Vec<Job>> = vec![Vec::with_capacity(rows.len()); app.stages.len()];
    for (frame_job, stage_jobs) in rows {
        frames.push(frame_job);
        for (jobs, job) in stages.iter_mut().zip(stage_jobs) {
            jobs.push(job);
        }
    }
    let mut lanes = vec![Lane {
        name: app.name.clone(),
        model: format!("app, {} fps, deadline {} ms", app.rate_hz, app.deadline_ms),
        deadline_ms: Some(app.deadline_ms),
        jobs: frames,
        program: None,
        kind: LaneKind::App,
    }];
    for (s, jobs) in app.stages.iter().zip(stages) {
        lanes.push(Lane {
            name: format!("{}/{}", app.name, s.name),
            model: format!("{}, {}", s.kind, s.partition),
            deadline_ms: None,
            jobs,
            program: None,
            kind: LaneKind::Stage,
        });
    }
    Ok(lanes)
}

fn steps_of(summary: &RunSummary) -> Vec<Step> {
    let Some(iso) = &summary.isolation else {
        return Vec::new();
    };
    iso.steps
        .iter()
        .map(|s| Step {
            step: s.step,
            start_ms: s.start_s * 1e3,
            end_ms: (s.start_s + iso.step_s) * 1e3,
            interferer_rate_hz: s.interferer_rate_hz,
        })
        .collect()
}

/// jobs/<workload>.csv by column name: `job`, `release_ms`, `start_ms`, `end_ms`,
/// `latency_ms`, `timeout` (1/0), and the hold of the criticality guard where the file has it
/// (`held_ms`; `held_ns` in ns is read too). Any other column is ignored.
pub fn read_jobs(path: &Path) -> Result<Vec<Job>, TraceError> {
    let required = [
        "job",
        "release_ms",
        "start_ms",
        "end_ms",
        "latency_ms",
        "timeout",
    ];
    let csv = Csv::read(path, &required)?;
    // Every required column is there: `read` checked.
    let col = |n: &str| csv.col(n).unwrap_or(0);
    let (job, release, start, end) = (
        col("job"),
        col("release_ms"),
        col("start_ms"),
        col("end_ms"),
    );
    let (latency, timeout) = (col("latency_ms"), col("timeout"));
    // The hold's column and its unit (ms per cell unit).
    let held = match (csv.col("held_ms"), csv.col("held_ns")) {
        (Some(i), _) => Some((i, 1.0)),
        (None, Some(i)) => Some((i, 1e-6)),
        (None, None) => None,
    };
    csv.parse_rows(|line, row| {
        // An integer, as the release loop writes it (`1e300` or `-1` made an index by `as`).
        let index = row
            .get(job)
            .and_then(|c| c.parse::<u64>().ok())
            .ok_or_else(|| {
                csv.error(
                    line,
                    format!(
                        "column `job`: `{}` is not a job index (0, 1, …)",
                        row.get(job).map_or("", String::as_str)
                    ),
                )
            })?;
        let timeout = match row.get(timeout).map(String::as_str) {
            Some("1") => true,
            Some("0") => false,
            other => {
                return Err(csv.error(
                    line,
                    format!(
                        "column `timeout`: `{}` is not 0 or 1",
                        other.unwrap_or_default()
                    ),
                ))
            }
        };
        Ok(Job {
            index,
            release_ms: csv
                .time_at(line, row, Some(release))?
                .ok_or_else(|| csv.error(line, "column `release_ms` is empty".to_string()))?,
            start_ms: csv.time_at(line, row, Some(start))?,
            end_ms: csv.time_at(line, row, Some(end))?,
            latency_ms: csv.time_at(line, row, Some(latency))?,
            timeout,
            held_ms: csv
                .time_at(line, row, held.map(|h| h.0))?
                .map(|v| v * held.map_or(1.0, |h| h.1)),
        })
    })
}

/// The column of telemetry.csv naming each row's GPU in a run on several GPUs (absent for one
/// GPU; isolane-telemetry's `CSV_GPU_COLUMN`).
pub const GPU_COLUMN: &str = "gpu";

/// A counter of telemetry.csv: the row's GPU (`None` in a file of one GPU) and the column.
type CounterKey = (Option<u32>, usize);

/// telemetry.csv's numeric columns as counters over `t_s` (converted to ms). A file of several
/// GPUs (a [`GPU_COLUMN`]) has a counter per GPU and column, named `GPU n <column>`, in GPU
/// order; a file without it one per column, named as the column.
fn read_counters(path: &Path) -> Result<Vec<Counter>, TraceError> {
    let csv = Csv::read(path, &["t_s"])?;
    let t = csv.col("t_s").unwrap_or(0);
    let gpu = csv.col(GPU_COLUMN);
    let numeric: Vec<usize> = (0..csv.header().len())
        .filter(|&i| i != t && Some(i) != gpu)
        .filter(|&i| !TEXT_COLUMNS.contains(&csv.header()[i].as_str()))
        .collect();
    // (GPU, column) → points; the GPU is `None` in a file of one GPU.
    let mut by_key: std::collections::BTreeMap<CounterKey, Vec<(f64, f64)>> = Default::default();
    for (line, row) in &csv.rows {
        let t_ms = csv.required_f64(*line, row, t)? * 1e3;
        let g = match gpu {
            Some(i) => Some(gpu_index(&csv, *line, row, i)?),
            None => None,
        };
        for &i in &numeric {
            // NVML reports NaN for a GPM metric it could not compute: a gap, not a value.
            if let Some(v) = csv.f64_at(*line, row, Some(i))?.filter(|v| v.is_finite()) {
                by_key.entry((g, i)).or_default().push((t_ms, v));
            }
        }
    }
    Ok(by_key
        .into_iter()
        .map(|((g, i), points)| Counter {
            name: match g {
                Some(g) => format!("GPU {g} {}", csv.header()[i]),
                None => csv.header()[i].clone(),
            },
            points,
        })
        .collect())
}

/// A row's GPU index: a whole number, every row of a file of several GPUs has one.
fn gpu_index(csv: &Csv, line: usize, row: &[String], i: usize) -> Result<u32, TraceError> {
    let cell = row.get(i).map_or("", String::as_str);
    cell.parse::<u32>().map_err(|_| {
        csv.error(
            line,
            format!("column `{GPU_COLUMN}`: `{cell}` is not a GPU index (0, 1, …)"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn jobs_are_read_by_column_name_with_held_ns_and_unknown_columns() {
        let d = tempfile::tempdir().unwrap();
        let p = write(
            d.path(),
            "a.csv",
            "job,release_ms,start_ms,end_ms,latency_ms,timeout,held_ns,future\n\
             0,0.000000,0.500000,1.500000,1.500000,0,500000,x\n\
             1,2.000000,,,,1,,y\n",
        );
        let jobs = read_jobs(&p).unwrap();
        assert_eq!(jobs.len(), 2);
        assert_eq!(jobs[0].held_ms, Some(0.5));
        assert_eq!(jobs[0].start_ms, Some(0.5));
        assert!(!jobs[0].timeout);
        assert_eq!(jobs[1].start_ms, None);
        assert_eq!(jobs[1].held_ms, None);
        assert!(jobs[1].timeout);
        // The guard's own column is in ms.
        let p = write(
            d.path(),
            "m.csv",
            "job,release_ms,start_ms,end_ms,latency_ms,timeout,held_ms\n0,0,0.25,1,1,0,0.250000\n",
        );
        assert_eq!(read_jobs(&p).unwrap()[0].held_ms, Some(0.25));
        // Without the column, no job has a hold.
        let p = write(
            d.path(),
            "b.csv",
            "job,release_ms,start_ms,end_ms,latency_ms,timeout\n0,0,0.1,1,1,0\n",
        );
        assert_eq!(read_jobs(&p).unwrap()[0].held_ms, None);
    }

    /// A run that ran out of disk space (or was killed) mid-row leaves a last row without its
    /// end; `isolane summarize` leaves it out, and report, explain and trace refused the folder
    /// by that row ("column `timeout`: `` is not 0 or 1") after summarize had rebuilt it.
    #[test]
    fn a_last_row_cut_off_by_a_killed_run_is_left_out_and_only_that_one() {
        let d = tempfile::tempdir().unwrap();
        let head = "job,release_ms,start_ms,end_ms,latency_ms,timeout,held_ms\n";
        let whole = "0,0.000000,0.100000,1.000000,1.000000,0,0\n";
        let p = write(
            d.path(),
            "a.csv",
            &format!("{head}{whole}1,50.000000,50.1,5"),
        );
        let jobs = read_jobs(&p).unwrap();
        assert_eq!(jobs.len(), 1);
        assert_eq!(jobs[0].end_ms, Some(1.0));
        // A last row that parses without its newline is kept.
        let p = write(d.path(), "b.csv", &format!("{head}{whole}1,50,51,52,2,0,0"));
        assert_eq!(read_jobs(&p).unwrap().len(), 2);
        // The same bad row with its newline is damage, not a cut: refused by line.
        let p = write(
            d.path(),
            "c.csv",
            &format!("{head}{whole}1,50.000000,50.1,5\n"),
        );
        let e = read_jobs(&p).unwrap_err().to_string();
        assert!(e.contains("line 3") && e.contains("`timeout`"), "{e}");
        // A bad row before the last one is refused even when the file is cut.
        let p = write(
            d.path(),
            "d.csv",
            &format!("{head}0,0,0,1,1,maybe,0\n{whole}1,5"),
        );
        let e = read_jobs(&p).unwrap_err().to_string();
        assert!(e.contains("line 2") && e.contains("maybe"), "{e}");
    }

    #[test]
    fn a_bad_jobs_file_is_named_with_line_and_column() {
        let d = tempfile::tempdir().unwrap();
        let p = write(
            d.path(),
            "a.csv",
            "job,release_ms,start_ms,end_ms,latency_ms,timeout\n0,0,zero,1,1,0\n",
        );
        let e = read_jobs(&p).unwrap_err().to_string();
        assert!(
            e.contains("a.csv") && e.contains("line 2") && e.contains("`start_ms`"),
            "{e}"
        );
        let p = write(
            d.path(),
            "b.csv",
            "job,release_ms,start_ms,end_ms,latency_ms,timeout\n0,0,0,1,1,yes\n",
        );
        let e = read_jobs(&p).unwrap_err().to_string();
        assert!(e.contains("`timeout`") && e.contains("yes"), "{e}");
        let p = write(d.path(), "c.csv", "job,release_ms\n0,0\n");
        let e = read_jobs(&p).unwrap_err().to_string();
        assert!(e.contains("line 1") && e.contains("`start_ms`"), "{e}");
        // Issue 31: NaN and the infinities were read as times, and any number as an index.
        for (row, column) in [
            (
                "0,nan,0,1,1,0",
                "`release_ms`: `nan` is not a finite number",
            ),
            ("0,0,inf,1,1,0", "`start_ms`: `inf` is not a finite number"),
            ("0,0,0,-inf,1,0", "`end_ms`: `-inf` is not a finite number"),
            (
                "0,0,0,1,NaN,0",
                "`latency_ms`: `NaN` is not a finite number",
            ),
            ("1e300,0,0,1,1,0", "`job`: `1e300` is not a job index"),
            ("-1,0,0,1,1,0", "`job`: `-1` is not a job index"),
        ] {
            let p = write(
                d.path(),
                "d.csv",
                &format!("job,release_ms,start_ms,end_ms,latency_ms,timeout\n{row}\n"),
            );
            let e = read_jobs(&p).unwrap_err().to_string();
            assert!(
                e.contains("d.csv") && e.contains("line 2") && e.contains(column),
                "{row}: {e}"
            );
        }
    }

    /// Property test of the jobs reader of `trace` and `report`: whatever the text, jobs or an
    /// error naming the file, never a panic, and every time it returns is finite. `cargo test`
    /// runs ISOLANE_FUZZ_CASES (default 500) cases; `scripts/fuzz.sh` many more.
    mod fuzz {
        use super::*;
        use proptest::prelude::*;

        const CELLS: &[&str] = &[
            "",
            "0",
            "1",
            "-1",
            "0.5",
            "1e300",
            "-1e300",
            "nan",
            "NaN",
            "inf",
            "-inf",
            "x",
            "18446744073709551616",
            "true",
        ];
        const COLUMNS: &[&str] = &[
            "job",
            "release_ms",
            "start_ms",
            "end_ms",
            "latency_ms",
            "timeout",
            "held_ms",
            "held_ns",
            "other",
        ];

        proptest! {
            #![proptest_config(isolane_core::fuzz::config(500))]

            #[test]
            fn fuzz_jobs_files_are_refused_or_finite(
                header in proptest::sample::subsequence(COLUMNS, 0..COLUMNS.len()),
                rows in proptest::collection::vec(
                    proptest::collection::vec(proptest::sample::select(CELLS), 0..9), 0..6),
            ) {
                let d = tempfile::tempdir().unwrap();
                let rows: Vec<String> = rows.iter().map(|r| r.join(",")).collect();
                let text = format!("{}\n{}\n", header.join(","), rows.join("\n"));
                let p = write(d.path(), "f.csv", &text);
                match read_jobs(&p) {
                    Ok(jobs) => {
                        for j in jobs {
                            let times = [Some(j.release_ms), j.start_ms, j.end_ms, j.latency_ms, j.held_ms];
                            prop_assert!(times.iter().flatten().all(|t| t.is_finite()));
                        }
                    }
                    Err(e) => prop_assert!(e.to_string().contains("f.csv"), "{e}"),
                }
            }
        }
    }

    #[test]
    fn a_window_keeps_what_meets_it() {
        let job = |index: u64, release_ms: f64, end_ms: Option<f64>| Job {
            index,
            release_ms,
            start_ms: end_ms.map(|_| release_ms),
            end_ms,
            latency_ms: end_ms.map(|e| e - release_ms),
            timeout: end_ms.is_none(),
            held_ms: None,
        };
        let t = Timeline {
            dir: PathBuf::new(),
            command: "isolation".into(),
            wall_ms: 100.0,
            lanes: vec![Lane {
                name: "a".into(),
                model: "spin:1ms".into(),
                deadline_ms: None,
                jobs: vec![
                    job(0, 0.0, Some(9.0)),
                    job(1, 5.0, Some(11.0)),
                    job(2, 20.0, None),
                    job(3, 35.0, Some(36.0)),
                ],
                program: None,
                kind: LaneKind::Workload,
            }],
            partitions: Vec::new(),
            steps: vec![
                Step {
                    step: 0,
                    start_ms: 0.0,
                    end_ms: 10.0,
                    interferer_rate_hz: 1.0,
                },
                Step {
                    step: 1,
                    start_ms: 10.0,
                    end_ms: 20.0,
                    interferer_rate_hz: 2.0,
                },
            ],
            counters: vec![
                Counter {
                    name: "power_w".into(),
                    points: vec![(-50.0, 1.0), (15.0, 2.0), (40.0, 3.0)],
                },
                Counter {
                    name: "sm_util_pct".into(),
                    points: vec![(-50.0, 1.0)],
                },
            ],
        };
        let w = t.window(10.0, 30.0);
        let kept: Vec<u64> = w.lanes[0].jobs.iter().map(|j| j.index).collect();
        assert_eq!(
            kept,
            [1, 2],
            "a job running across the start, a skip inside"
        );
        assert_eq!(w.steps.len(), 2, "a step ending at the start meets it");
        assert_eq!(w.counters.len(), 1);
        assert_eq!(w.counters[0].points, vec![(15.0, 2.0)]);
    }

    #[test]
    fn telemetry_counters_skip_text_empty_and_nan_cells() {
        let d = tempfile::tempdir().unwrap();
        let p = write(
            d.path(),
            "telemetry.csv",
            "t_s,power_w,throttle_reasons,dram_bw_util_pct,process_memory_mib\n\
             -0.05,100,,NaN,1:2\n0.05,120,sw_power_cap,40,1:2\n",
        );
        let c = read_counters(&p).unwrap();
        let names: Vec<&str> = c.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["power_w", "dram_bw_util_pct"]);
        assert_eq!(c[0].points, vec![(-50.0, 100.0), (50.0, 120.0)]);
        assert_eq!(c[1].points, vec![(50.0, 40.0)]);
    }

    #[test]
    fn a_telemetry_file_of_two_gpus_has_counters_per_gpu() {
        let d = tempfile::tempdir().unwrap();
        let p = write(
            d.path(),
            "telemetry.csv",
            "t_s,gpu,power_w,throttle_reasons\n0.0,1,100,\n0.0,0,300,\n0.05,1,110,\n",
        );
        let c = read_counters(&p).unwrap();
        let names: Vec<&str> = c.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["GPU 0 power_w", "GPU 1 power_w"]);
        assert_eq!(c[0].points, vec![(0.0, 300.0)]);
        assert_eq!(c[1].points, vec![(0.0, 100.0), (50.0, 110.0)]);
        let bad = write(d.path(), "bad.csv", "t_s,gpu,power_w\n0.0,x,100\n");
        let e = read_counters(&bad).unwrap_err().to_string();
        assert!(
            e.contains("bad.csv") && e.contains("`gpu`") && e.contains("`x`"),
            "{e}"
        );
    }

    #[test]
    fn a_folder_without_summary_is_named_with_what_reads_it() {
        let root = tempfile::tempdir().unwrap();
        let err = |files: &[&str]| {
            let d = root.path().join(files.join("+"));
            std::fs::create_dir_all(&d).unwrap();
            for f in files {
                write(&d, f, "{}");
            }
            Timeline::load(&d).unwrap_err().to_string()
        };
        // Issue 31: these suggested `isolane summarize`, which refuses them.
        for (file, words) in [
            ("maxrate.json", "max-rate search"),
            ("interference.json", "interference matrix"),
            ("sweep.json", "a sweep folder"),
            ("coexec.json", "co-execution study"),
        ] {
            let e = err(&[file, "scenario.toml"]);
            assert!(
                e.contains(words) && e.contains("isolane report") && !e.contains("summarize"),
                "{e}"
            );
        }
        let e = err(&["scenario.toml"]);
        assert!(e.contains("isolane summarize"), "{e}");
        let e = err(&[]);
        assert!(
            e.contains("not a run folder") && !e.contains("summarize"),
            "{e}"
        );
    }
}
