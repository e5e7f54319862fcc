//! capacity.yaml: what each model of the plan was measured to do in its planned partition, from
//! the measurements the user names (`--capacity PATH`, any number):
//!
//! - a run folder of the planned scenario (`isolane run planned.toml -o DIR`, `plan --auto
//!   --verify-out DIR`): its `summary.json` and `scenario.toml` give each workload's p99.9
//!   response time beside the plan's other workloads, its timeouts and its slack;
//! - a `maxrate.json` (`isolane maxrate --out DIR`): the max stable rate of the model in that
//!   partition;
//! - a profile folder (`plan --auto --export-profiles DIR`, or the profile cache): the p99.9
//!   execution time alone in that partition, with the GPU and driver it was measured on.
//!
//! A measurement counts only where it is of the same model, batch, precision and partition; of
//! several, the worst is kept (the largest p99.9, the smallest rate). Nothing is estimated:
//! a field no measurement covers says [`NOT_MEASURED`].

use std::path::{Path, PathBuf};

use isolane_core::results::{MaxrateReport, RunSummary};
use isolane_core::spec::{Backend, Mechanism, ModelCatalog, Scenario, WorkloadSpec};
use isolane_planner::cache::{ProfileCache, ProfileKey};
use serde::Serialize;

use crate::{partition_words, user, ExportError, ExportFile, Planned};

pub const FILE: &str = "capacity.yaml";
pub const NOT_MEASURED: &str = "not measured";

/// A number that was measured, or why there is none.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Measured {
    Value(f64),
    Missing(String),
}

impl Measured {
    fn missing() -> Measured {
        Measured::Missing(NOT_MEASURED.into())
    }

    pub fn value(&self) -> Option<f64> {
        match self {
            Measured::Value(v) => Some(*v),
            Measured::Missing(_) => None,
        }
    }
}

/// Where one number of an entry came from, and the GPU and driver it was measured on.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Source {
    /// `max_stable_rate_hz`, `p999_ms` (in a run of the plan) or `p999_alone_ms`.
    pub measures: String,
    pub file: String,
    pub gpu: String,
    pub driver: String,
}

/// One model × partition of the plan.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Entry {
    pub workload: String,
    pub model: String,
    pub batch: u32,
    pub precision: String,
    pub partition: String,
    /// The plan's rate and deadline, which the numbers below are measured against.
    pub rate_hz: Option<f64>,
    pub deadline_ms: Option<f64>,
    /// The highest rate at which no job missed its deadline of one period (`isolane maxrate`).
    pub max_stable_rate_hz: Measured,
    /// p99.9 response time in a run of the plan, beside its other workloads.
    pub p999_ms: Measured,
    /// The deadline minus that p99.9.
    pub slack_ms: Measured,
    /// Jobs past their deadline in that run, %.
    pub timeout_pct: Measured,
    /// p99.9 execution time alone in the partition (the planner's profile).
    pub p999_alone_ms: Measured,
    pub measured_on: Vec<Source>,
}

/// The whole file.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Capacity {
    pub scenario: String,
    pub models: Vec<Entry>,
}

/// Measurements read from the `--capacity` paths.
#[derive(Debug, Default)]
pub struct Measurements {
    runs: Vec<Run>,
    maxrates: Vec<(PathBuf, MaxrateReport)>,
    profiles: Vec<PathBuf>,
}

#[derive(Debug)]
struct Run {
    summary_file: PathBuf,
    summary: RunSummary,
    scenario: Scenario,
}

const TAKES: &str = "--capacity takes a run folder of the planned scenario (summary.json and \
                     scenario.toml: `isolane run PLANNED -o DIR`, `isolane plan --auto \
                     --verify-out DIR`), a maxrate.json (`isolane maxrate --out DIR`) or a \
                     profile folder (`isolane plan --auto --export-profiles DIR`)";

impl Measurements {
    /// Reads every path; one that is none of the three kinds, or that does not parse, is the
    /// user's to fix (named with what it should be).
    pub fn read(paths: &[PathBuf], models: &dyn ModelCatalog) -> Result<Measurements, ExportError> {
        let mut m = Measurements::default();
        for p in paths {
            m.read_one(p, models)?;
        }
        Ok(m)
    }

    fn read_one(&mut self, path: &Path, models: &dyn ModelCatalog) -> Result<(), ExportError> {
        if path.is_dir() {
            if path.join("summary.json").is_file() {
                return self.read_run(&path.join("summary.json"), models);
            }
            if path.join("maxrate.json").is_file() {
                return self.read_maxrate(&path.join("maxrate.json"));
            }
            if !ProfileCache::new(path).devices().is_empty() {
                self.profiles.push(path.to_path_buf());
                return Ok(());
            }
            return Err(user(format!(
                "--capacity {}: a folder with no summary.json, maxrate.json or <gpu>/<driver>/\
                 device.json; {TAKES}",
                path.display()
            )));
        }
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        match name.as_deref() {
            Some("summary.json") => self.read_run(path, models),
            Some("maxrate.json") => self.read_maxrate(path),
            _ if !path.exists() => Err(user(format!(
                "--capacity {}: no such file or folder; {TAKES}",
                path.display()
            ))),
            _ => Err(user(format!("--capacity {}: {TAKES}", path.display()))),
        }
    }

    fn read_run(
        &mut self,
        summary_file: &Path,
        models: &dyn ModelCatalog,
    ) -> Result<(), ExportError> {
        let summary: RunSummary = isolane_core::results::read_json(summary_file)
            .map_err(|e| user(format!("--capacity: {e}")))?;
        let scenario_file = summary_file.with_file_name("scenario.toml");
        let text = Scenario::read_file(&scenario_file).map_err(|e| {
            user(format!(
                "--capacity {}: the run's scenario.toml is needed to know each workload's \
                 partition: {e}",
                summary_file.display()
            ))
        })?;
        let scenario = Scenario::from_toml_str(&text, &scenario_file, models)
            .map_err(|e| user(format!("--capacity: {e}")))?;
        self.runs.push(Run {
            summary_file: summary_file.to_path_buf(),
            summary,
            scenario,
        });
        Ok(())
    }

    fn read_maxrate(&mut self, file: &Path) -> Result<(), ExportError> {
        let report: MaxrateReport =
            isolane_core::results::read_json(file).map_err(|e| user(format!("--capacity: {e}")))?;
        if !(report.max_rate_hz.is_finite() && report.max_rate_hz > 0.0) {
            return Err(user(format!(
                "--capacity {}: field `max_rate_hz`: found {}; expected a finite rate > 0",
                file.display(),
                report.max_rate_hz
            )));
        }
        self.maxrates.push((file.to_path_buf(), report));
        Ok(())
    }
}

/// The GPUs that measured the plan's own workloads in their planned partitions (the runs'
/// telemetry, the profiles' device.json), deduplicated, in the order found: where the plan's
/// numbers hold.
pub fn measured_gpus(plan: Planned<'_>, m: &Measurements) -> Vec<String> {
    let (c, _) = capacity(plan, m);
    let mut out: Vec<String> = Vec::new();
    for src in c.models.iter().flat_map(|e| &e.measured_on) {
        if src.gpu != CPU && !src.gpu.starts_with("not recorded") && !out.contains(&src.gpu) {
            out.push(src.gpu.clone());
        }
    }
    out
}

const CPU: &str = "CPU";

/// The capacity of every workload of `plan`, and a note per kind of number nothing measured.
pub fn capacity(plan: Planned<'_>, m: &Measurements) -> (Capacity, Vec<String>) {
    let mechanism = plan.scenario.device.mechanism;
    let mut notes = Vec::new();
    let models: Vec<Entry> = plan
        .scenario
        .workloads
        .iter()
        .map(|w| entry(plan.scenario, w, m, &mut notes))
        .collect();
    let missing = |f: fn(&Entry) -> &Measured| -> Vec<String> {
        models
            .iter()
            .filter(|e| f(e).value().is_none())
            .map(|e| format!("`{}`", e.workload))
            .collect()
    };
    for (what, names, source) in [
        (
            "max stable rate",
            missing(|e| &e.max_stable_rate_hz),
            "the maxrate.json of `isolane maxrate --out DIR` in the planned partition",
        ),
        (
            "p99.9 in a run of the plan",
            missing(|e| &e.p999_ms),
            "a run folder of the plan: `isolane run PLANNED -o DIR`",
        ),
        (
            "p99.9 alone",
            missing(|e| &e.p999_alone_ms),
            "a profile folder: `isolane plan --auto --export-profiles DIR`",
        ),
    ] {
        if !names.is_empty() {
            notes.push(format!(
                "capacity.yaml: {what} not measured for {} (--capacity takes {source})",
                names.join(", ")
            ));
        }
    }
    let _ = mechanism;
    (
        Capacity {
            scenario: plan.file.to_string(),
            models,
        },
        notes,
    )
}

fn entry(s: &Scenario, w: &WorkloadSpec, m: &Measurements, notes: &mut Vec<String>) -> Entry {
    let mechanism = s.device.mechanism;
    let mut e = Entry {
        workload: w.name.clone(),
        model: w.model.clone(),
        batch: w.batch,
        precision: w.precision.name().to_string(),
        partition: partition_words(mechanism, w),
        rate_hz: w.rate.hz(),
        deadline_ms: w.deadline_s().map(|d| d * 1e3),
        max_stable_rate_hz: Measured::missing(),
        p999_ms: Measured::missing(),
        slack_ms: Measured::missing(),
        timeout_pct: Measured::missing(),
        p999_alone_ms: Measured::missing(),
        measured_on: Vec::new(),
    };
    for run in &m.runs {
        let Some(ran) = run.scenario.workloads.iter().find(|r| r.name == w.name) else {
            continue;
        };
        if !same_partition(s, w, &run.scenario, ran) {
            notes.push(format!(
                "capacity.yaml: {} measured `{}` as {} in {}, not as planned ({} in {}): not used",
                run.summary_file.display(),
                w.name,
                ran.model,
                partition_words(run.scenario.device.mechanism, ran),
                w.model,
                e.partition
            ));
            continue;
        }
        let Some(summary) = run.summary.workloads.iter().find(|r| r.name == w.name) else {
            continue;
        };
        let Some(p999) = summary.metrics.latency_ms.p999 else {
            continue;
        };
        if e.p999_ms.value().is_some_and(|worst| worst >= p999) {
            continue;
        }
        e.p999_ms = Measured::Value(p999);
        e.slack_ms = match e.deadline_ms {
            // To the ns: the subtraction's float noise is no part of the measurement.
            Some(d) => Measured::Value(((d - p999) * 1e6).round() / 1e6),
            None => Measured::Missing("no deadline".into()),
        };
        e.timeout_pct = Measured::Value(summary.metrics.timeout_pct);
        e.measured_on.retain(|src| src.measures != "p999_ms");
        e.measured_on.push(Source {
            measures: "p999_ms".into(),
            file: run.summary_file.display().to_string(),
            gpu: run_gpu(&run.summary, ran.gpu_on(&run.scenario.device), ran.backend),
            driver: "not recorded (summary.json does not record the driver)".into(),
        });
    }
    for (file, r) in &m.maxrates {
        if !maxrate_matches(mechanism, w, r) {
            continue;
        }
        if e.max_stable_rate_hz
            .value()
            .is_some_and(|least| least <= r.max_rate_hz)
        {
            continue;
        }
        e.max_stable_rate_hz = Measured::Value(r.max_rate_hz);
        e.measured_on
            .retain(|src| src.measures != "max_stable_rate_hz");
        e.measured_on.push(Source {
            measures: "max_stable_rate_hz".into(),
            file: file.display().to_string(),
            gpu: "not recorded (maxrate.json does not record the GPU)".into(),
            driver: "not recorded (maxrate.json does not record the driver)".into(),
        });
    }
    if let Some(label) = profile_label(mechanism, w) {
        for dir in &m.profiles {
            let cache = ProfileCache::new(dir);
            for device in cache.devices() {
                let key = ProfileKey {
                    gpu: device.gpu.clone(),
                    driver: device.driver.clone(),
                    model: isolane_planner::auto::model_id(&w.model),
                    batch: w.batch,
                    precision: w.precision.name().to_string(),
                    mechanism: mechanism.name().to_string(),
                    partition: label.clone(),
                };
                let Some(t) = cache.get(&key) else { continue };
                let p999 = t.exec_p999_ms.unwrap_or(t.exec_p99_ms);
                if e.p999_alone_ms.value().is_some_and(|worst| worst >= p999) {
                    continue;
                }
                e.p999_alone_ms = Measured::Value(p999);
                e.measured_on.retain(|src| src.measures != "p999_alone_ms");
                e.measured_on.push(Source {
                    measures: if t.exec_p999_ms.is_some() {
                        "p999_alone_ms".into()
                    } else {
                        "p999_alone_ms (the profile's p99: it predates the p99.9)".into()
                    },
                    file: dir.display().to_string(),
                    gpu: device.gpu.clone(),
                    driver: device.driver.clone(),
                });
            }
        }
    }
    e
}

/// Whether a run's workload ran what the plan's does, where the plan puts it.
fn same_partition(s: &Scenario, w: &WorkloadSpec, rs: &Scenario, r: &WorkloadSpec) -> bool {
    r.model == w.model
        && r.batch == w.batch
        && r.precision == w.precision
        && r.backend == w.backend
        && (!w.on_gpu()
            || (rs.device.mechanism == s.device.mechanism && r.partition == w.partition))
}

/// The GPU a run's telemetry names for GPU `gpu`.
fn run_gpu(summary: &RunSummary, gpu: u32, backend: Backend) -> String {
    if backend == Backend::Cpu {
        return CPU.into();
    }
    let named = match &summary.telemetry {
        Some(t) => Some(t.device.clone()),
        None => summary
            .telemetry_per_gpu
            .iter()
            .find(|t| t.gpu == Some(gpu))
            .map(|t| t.device.clone()),
    };
    named
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "not recorded (the run has no telemetry)".into())
}

/// Whether a max-rate search was of this model in this partition.
fn maxrate_matches(mechanism: Mechanism, w: &WorkloadSpec, r: &MaxrateReport) -> bool {
    let model = r.model == w.model
        || (w.model.ends_with(".onnx")
            && Path::new(&r.model).file_name() == Path::new(&w.model).file_name());
    if !(model && r.batch == w.batch && r.precision == w.precision && r.backend == w.backend) {
        return false;
    }
    if !w.on_gpu() {
        return true;
    }
    match mechanism {
        Mechanism::Green => r.mechanism == Mechanism::Green && r.sms == w.partition.sms,
        Mechanism::Mps => r.mechanism == Mechanism::Mps && r.thread_pct == w.partition.thread_pct,
        Mechanism::Timeslice | Mechanism::None => {
            matches!(r.mechanism, Mechanism::Timeslice | Mechanism::None)
        }
        Mechanism::Mig => false,
    }
}

/// The partition as the profile cache names it (`isolane_planner::Ladder::label`): SMs,
/// thread %, the MIG profile, `1` for the whole GPU; none on the CPU (its profiles are of the
/// CPU model, not of a GPU).
fn profile_label(mechanism: Mechanism, w: &WorkloadSpec) -> Option<String> {
    if !w.on_gpu() {
        return None;
    }
    let p = &w.partition;
    match mechanism {
        Mechanism::Green => p.sms.map(|s| s.to_string()),
        Mechanism::Mps => p.thread_pct.map(|t| t.to_string()),
        Mechanism::Mig => p.mig_profile.clone(),
        Mechanism::Timeslice | Mechanism::None => Some("1".into()),
    }
}

/// capacity.yaml.
pub fn file(c: &Capacity) -> ExportFile {
    ExportFile {
        path: FILE.into(),
        text: crate::yaml(
            "What each model of the plan was measured to do in its planned partition \
             (isolane export;\ndocs/export.md). Numbers come only from the measurements given \
             with --capacity; of several,\nthe worst is kept. A field none of them covers says \
             \"not measured\".",
            c,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing;

    fn write(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    fn maxrate_json(model: &str, sms: u32, rate: f64) -> String {
        format!(
            r#"{{"schema_version": 4, "isolane_version": "0.1.0", "model": "{model}", "batch": 16,
              "backend": "cuda", "precision": "fp16", "mechanism": "green", "sms": {sms},
              "thread_pct": null,
              "config": {{"acceptance": "zero_violations", "jobs": 1000, "max_batches": 10000,
                          "step": {{"absolute": 1.0}}, "validations": 3}},
              "max_rate_hz": {rate}, "l_max_ms": {l}, "initial_rate_hz": 100.0,
              "start_lateness_us": {{"p50": null, "p99": null, "max": null}}, "trace": []}}"#,
            l = 1e3 / rate
        )
    }

    #[test]
    fn without_measurements_every_number_says_not_measured_and_a_note_says_so() {
        let s = testing::green();
        let plan = Planned::new(&s, "planned.toml").unwrap();
        let (c, notes) = capacity(plan, &Measurements::default());
        assert_eq!(c.models.len(), 2);
        for e in &c.models {
            for m in [
                &e.max_stable_rate_hz,
                &e.p999_ms,
                &e.slack_ms,
                &e.p999_alone_ms,
            ] {
                assert_eq!(*m, Measured::Missing(NOT_MEASURED.into()));
            }
        }
        assert_eq!(notes.len(), 3, "{notes:?}");
        assert!(notes[0].contains("max stable rate not measured for `inspect`, `cam`"));
        assert!(
            notes[0].contains("--capacity takes the maxrate.json"),
            "{}",
            notes[0]
        );
        assert!(
            notes[1].contains("--capacity takes a run folder"),
            "{}",
            notes[1]
        );
        let text = file(&c).text;
        assert!(text.contains("max_stable_rate_hz: not measured"), "{text}");
        assert!(text.contains("partition: green 32 SMs"), "{text}");
    }

    #[test]
    fn profiles_give_the_p999_alone_with_their_gpu_and_driver_and_only_of_the_planned_size() {
        let dir = tempfile::tempdir().unwrap();
        let gpu = dir.path().join("NVIDIA_H100_80GB_HBM3/580.159.04");
        write(
            &gpu.join("device.json"),
            r#"{"gpu": "NVIDIA H100 80GB HBM3", "driver": "580.159.04", "device_model": "h100-sxm"}"#,
        );
        write(
            &gpu.join("resnet50-b16-fp16-green-32.json"),
            r#"{"exec_p50_ms": 2.0, "exec_p99_ms": 2.2, "exec_mean_ms": 2.0, "exec_p999_ms": 2.3}"#,
        );
        // Another size of the same model is not the planned partition's.
        write(
            &gpu.join("resnet50-b16-fp16-green-40.json"),
            r#"{"exec_p50_ms": 1.0, "exec_p99_ms": 1.1, "exec_mean_ms": 1.0, "exec_p999_ms": 1.2}"#,
        );
        let s = testing::green();
        let m = Measurements::read(&[dir.path().to_path_buf()], &testing::MODELS).unwrap();
        let plan = Planned::new(&s, "p.toml").unwrap();
        assert_eq!(measured_gpus(plan, &m), ["NVIDIA H100 80GB HBM3"]);
        let (c, _) = capacity(plan, &m);
        let e = &c.models[0];
        assert_eq!(e.p999_alone_ms, Measured::Value(2.3));
        assert_eq!(e.measured_on[0].driver, "580.159.04");
        assert_eq!(e.measured_on[0].gpu, "NVIDIA H100 80GB HBM3");
        assert_eq!(c.models[1].p999_alone_ms, Measured::missing());
    }

    #[test]
    fn of_several_max_rate_searches_the_lowest_rate_of_the_planned_partition_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a/maxrate.json");
        let b = dir.path().join("b/maxrate.json");
        let other = dir.path().join("c/maxrate.json");
        write(&a, &maxrate_json("resnet50", 32, 420.0));
        write(&b, &maxrate_json("resnet50", 32, 410.0));
        write(&other, &maxrate_json("resnet50", 40, 300.0));
        let s = testing::green();
        let m = Measurements::read(&[a.clone(), dir.path().join("b"), other], &testing::MODELS)
            .unwrap();
        let (c, _) = capacity(Planned::new(&s, "p.toml").unwrap(), &m);
        assert_eq!(c.models[0].max_stable_rate_hz, Measured::Value(410.0));
        assert_eq!(c.models[0].measured_on.len(), 1);
        assert!(c.models[0].measured_on[0].file.ends_with("b/maxrate.json"));
    }

    /// A committed H100 plan and two verification runs of it (results/h100-planner/
    /// session15/a): the first ran `inspect` in 24 SMs, the plan (and the second run) in 32.
    #[test]
    fn runs_of_the_plan_give_the_worst_p999_of_the_planned_partition_with_their_gpu() {
        let dir =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../results/h100-planner/session15/a");
        let text = std::fs::read_to_string(dir.join("inspection-line.2.planned.toml")).unwrap();
        let s = testing::parse(&text);
        let m = Measurements::read(
            &[
                dir.join("verify-inspection-line"),
                dir.join("verify-inspection-line.2/summary.json"),
            ],
            &testing::MODELS,
        )
        .unwrap();
        let plan = Planned::new(&s, "planned.toml").unwrap();
        let (c, notes) = capacity(plan, &m);
        let get = |name: &str| c.models.iter().find(|e| e.workload == name).unwrap();
        // inspect: only the run in its planned 32 SMs counts (2.743 ms in 24 SMs does not).
        let inspect = get("inspect");
        assert_eq!(inspect.p999_ms, Measured::Value(2.244607));
        assert_eq!(inspect.slack_ms, Measured::Value(0.755393));
        assert_eq!(inspect.timeout_pct, Measured::Value(0.0));
        assert_eq!(inspect.measured_on[0].gpu, "NVIDIA H100 80GB HBM3");
        assert!(inspect.measured_on[0].driver.starts_with("not recorded"));
        assert!(
            notes.iter().any(|n| n.contains(
                "verify-inspection-line/summary.json measured \
                                               `inspect` as resnet50 in green 24 SMs"
            )),
            "{notes:?}"
        );
        // cam_b ran in its planned 8 SMs both times: the worse p99.9 is kept, with its run.
        let cam_b = get("cam_b");
        assert_eq!(cam_b.p999_ms, Measured::Value(1.378303));
        assert_eq!(cam_b.timeout_pct, Measured::Value(0.0));
        assert!(cam_b.measured_on[0]
            .file
            .contains("verify-inspection-line/summary.json"));
        assert_eq!(measured_gpus(plan, &m), ["NVIDIA H100 80GB HBM3"]);
    }

    #[test]
    fn a_path_that_is_no_measurement_is_refused_with_what_is_taken() {
        let dir = tempfile::tempdir().unwrap();
        let e = Measurements::read(&[dir.path().to_path_buf()], &testing::MODELS).unwrap_err();
        assert!(e.is_user_error());
        assert!(
            e.to_string().contains("no summary.json, maxrate.json"),
            "{e}"
        );
        let bad = dir.path().join("maxrate.json");
        write(&bad, "{\"model\": 3}");
        let e = Measurements::read(&[bad], &testing::MODELS).unwrap_err();
        assert!(e.to_string().contains("maxrate.json"), "{e}");
        let e = Measurements::read(&[dir.path().join("nope")], &testing::MODELS).unwrap_err();
        assert!(e.to_string().contains("no such file or folder"), "{e}");
    }
}
