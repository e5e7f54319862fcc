//! `isolane sweep`'s runs: every point's scenario checked before anything is written, then
//! each point run (an ordinary run, by the caller's [`PointRuns`]) into its own folder, with
//! sweep.json rewritten after every point.

use std::path::Path;

use isolane_core::device_model::DeviceModel;
use isolane_core::results::{RunSummary, SweepIndex, SweepPoint, SCHEMA_VERSION};
use isolane_core::spec::{Backend, DeviceSpec, Host, Mechanism, ModelSource, Precision, Scenario};
use isolane_runtime::coordinator::RunPlan;
use isolane_runtime::output;
use isolane_runtime::sweep::{self, PointWorkload};

use super::{Failure, StudyError, EXIT_FAILED, EXIT_INTERRUPTED};

/// A point to run: its index entry and its scenario.
pub struct Point {
    pub entry: SweepPoint,
    pub scenario: Scenario,
}

/// How a sweep runs its points: the caller's `isolane run` path.
pub trait PointRuns {
    /// The built-in model names a scenario may use.
    fn models(&self) -> Vec<&'static str>;
    /// Admits `s` (named `name`) on this machine; the refusal when it does not fit.
    fn admit(&self, s: &Scenario, name: &str) -> Result<(), Failure>;
    /// What a run checks before its output exists (models, memory, cores), named `name`.
    fn preflight(&self, plan: &RunPlan, name: &str) -> Result<(), Failure>;
    /// Runs the point's scenario `s` (its file `name`) into `dir`: the run's exit code.
    fn run(&self, s: Scenario, name: String, dir: &Path) -> Result<u8, Failure>;
    /// A line for the person watching (stderr).
    fn say(&self, line: &str);
}

/// Runs every point into `out` (made after [`check_points`]), in order, rewriting sweep.json
/// after each; returns the exit code (0, 1: a point failed, 130: interrupted) and the table of
/// the points. `started` is called once sweep.json exists, before the first point runs.
pub fn run_points(
    mut index: SweepIndex,
    points: &[Point],
    out: &Path,
    runs: &dyn PointRuns,
    started: &mut dyn FnMut() -> Result<(), Failure>,
) -> Result<(u8, String), StudyError> {
    index.points = points.iter().map(|p| p.entry.clone()).collect();
    write_index(out, &index)?;
    started()?;

    let total = points.len();
    let mut code = 0u8;
    let begun = std::time::Instant::now();
    for (i, p) in points.iter().enumerate() {
        let dir = out.join(&p.entry.dir);
        let scenario = dir.join("scenario.toml");
        // Written first so that a point that fails before its run still shows what it was.
        let toml = p.scenario.to_toml_string().map_err(|e| Failure {
            text: format!("writing a point's scenario: {e}"),
            user: false,
        })?;
        output::write_atomic(&scenario, toml.as_bytes())?;
        runs.say(&format!(
            "sweep point {}/{total}: {}{}",
            i + 1,
            p.entry.dir,
            time_left(begun.elapsed().as_secs_f64(), i, total)
        ));
        let result = runs.run(p.scenario.clone(), scenario.display().to_string(), &dir);
        let entry = &mut index.points[i];
        match result {
            Ok(rc) => {
                entry.exit_code = Some(rc);
                entry.status = match rc {
                    0 => "ok",
                    EXIT_INTERRUPTED => "interrupted",
                    _ => "failed",
                }
                .into();
            }
            Err(e) => {
                runs.say(&format!("sweep point {}: {e}", p.entry.dir));
                entry.status = "error".into();
                entry.error = Some(e.text);
            }
        }
        write_index(out, &index)?;
        match index.points[i].status.as_str() {
            "interrupted" => {
                code = EXIT_INTERRUPTED;
                break;
            }
            "ok" => {}
            _ => code = EXIT_FAILED,
        }
    }
    Ok((code, points_table(out, &index)))
}

/// ` (~3 min 10 s left)` after `done` of `total` points took `elapsed_s`, from their mean time;
/// nothing before the first point has ended.
fn time_left(elapsed_s: f64, done: usize, total: usize) -> String {
    if done == 0 {
        return String::new();
    }
    let left = elapsed_s / done as f64 * (total - done) as f64;
    format!(" (~{} left)", crate::progress::duration_text(left))
}

/// Validates every point's scenario by the rules of a scenario file (a problem names the
/// point and the field), admits it on this machine's GPU, and checks what each point's run
/// would check before its output (`run::preflight`), and the disk all their job records take
/// together.
///
/// Every limit a point's run checks (models, memory for the job records, cores, the disk its
/// jobs/*.csv need) is checked here, so a mistake stops the sweep with nothing run and no
/// folder left (exit 2). `out_dir`: where the sweep's folder will be.
pub fn check_points(
    points: &[Point],
    runs: &dyn PointRuns,
    out_dir: &Path,
) -> Result<(), StudyError> {
    let models = runs.models();
    let mut demands = Vec::new();
    for p in points {
        let name = format!("sweep point {}", p.entry.dir);
        p.scenario
            .validate(&models)
            .map_err(|e| Failure::user(format!("{name}: {e}")))?;
        runs.admit(&p.scenario, &name)?;
        let plan = RunPlan::from_scenario(&p.scenario);
        runs.preflight(&plan, &name)?;
        demands.extend(isolane_runtime::coordinator::record_demands(&plan));
    }
    if let Some(free) = isolane_runtime::limits::disk_free_bytes(out_dir) {
        isolane_runtime::limits::check_disk(&demands, free, out_dir).map_err(Failure::user)?;
    }
    Ok(())
}

fn write_index(out: &Path, index: &SweepIndex) -> Result<(), StudyError> {
    isolane_core::results::write_json(&out.join("sweep.json"), index)?;
    Ok(())
}

/// Per point: its parameters, status, total and per-workload throughput, and mean power when
/// telemetry was sampled.
fn points_table(out: &Path, index: &SweepIndex) -> String {
    let rows: Vec<Vec<String>> = index
        .points
        .iter()
        .map(|p| {
            let summary: Option<RunSummary> =
                isolane_core::results::read_json(&out.join(&p.dir).join("summary.json")).ok();
            let (total, n) = summary.as_ref().map_or((f64::NAN, 0), |s| {
                (s.total_throughput_ips(), s.workloads.len())
            });
            let power = summary
                .as_ref()
                .and_then(|s| s.telemetry.as_ref())
                .and_then(|t| t.power_w)
                .map(|p| p.mean);
            let size = match (p.sms, p.thread_pct, p.workloads, p.batch) {
                (Some(s), _, _, _) => format!("{s} SMs"),
                (_, Some(t), _, _) => format!("{t} %"),
                (_, _, Some(w), Some(b)) => format!("{w} × batch {b}"),
                _ => String::new(),
            };
            vec![
                p.dir.clone(),
                size,
                p.status.clone(),
                isolane_report::num(Some(total), 1),
                isolane_report::num((n > 0).then(|| total / n as f64), 1),
                isolane_report::num(power, 1),
            ]
        })
        .collect();
    isolane_report::plain_table(
        &[
            "point",
            "size",
            "status",
            "images/s",
            "per workload",
            "power W",
        ],
        &rows,
        &[0, 1, 2],
    )
}

/// What every point of a sweep shares (its flags).
#[derive(Debug, Clone)]
pub struct SweepCommon {
    pub backend: Backend,
    pub gpu: u32,
    /// Release rate per workload (`None`: closed loop).
    pub rate_hz: Option<f64>,
    pub duration_s: f64,
    pub warmup: u64,
}

/// `sweep partition`'s flags.
#[derive(Debug, Clone)]
pub struct PartitionSweep {
    pub model: String,
    /// Green contexts by SMs; otherwise MPS by thread percentage.
    pub green: bool,
    /// Empty: every size of the device (green) or 10, 20, …, 100 (mps).
    pub sizes: Vec<u32>,
    pub batch: u32,
    pub precision: String,
}

/// `sweep concurrency`'s flags.
#[derive(Debug, Clone)]
pub struct ConcurrencySweep {
    pub model: String,
    pub workloads: Vec<u32>,
    pub batch: Vec<u32>,
    pub precision: Vec<String>,
    /// MPS with equal thread shares; otherwise separate processes taking turns.
    pub mps: bool,
}

fn backend_name(b: Backend) -> &'static str {
    match b {
        Backend::Cpu => "cpu",
        Backend::Cuda => "cuda",
    }
}

/// Where every workload of a point runs.
fn point_device(c: &SweepCommon, mechanism: Mechanism, host: Host) -> DeviceSpec {
    DeviceSpec {
        backend: c.backend,
        gpu: c.gpu,
        mechanism,
        host,
        gpus: Vec::new(),
    }
}

/// `--precision` as the scenario's type (a mistake names the flag and what is allowed).
/// int8 and fp8 are refused here: they need a calibration folder, which a sweep has no flag for.
fn precision(v: &str) -> Result<Precision, Failure> {
    let refused = |why: &str| {
        Failure::user(format!(
            "--precision {v}: expected one of fp32, tf32, fp16, bf16{why}"
        ))
    };
    match serde_json::from_value::<Precision>(serde_json::Value::String(v.to_string())) {
        Ok(p) if p.quantized() => Err(refused(
            " (int8 and fp8 need a calibration folder: a scenario's `calibration` key)",
        )),
        Ok(p) => Ok(p),
        Err(_) => Err(refused("")),
    }
}

/// `--model` as a point's scenario names it: an `.onnx` path made absolute, since the point's
/// `scenario.toml` lives in the point's folder (as a scenario file's own paths come back
/// absolute from parsing).
fn point_model(model: &str) -> Result<String, Failure> {
    match ModelSource::classify(model) {
        Ok(ModelSource::Onnx(path)) => Ok(std::path::absolute(&path)
            .map_err(|e| Failure {
                text: format!("--model {model}: resolving the path: {e}"),
                user: false,
            })?
            .display()
            .to_string()),
        _ => Ok(model.to_string()),
    }
}

/// `sweep partition`'s points: one model alone at each partition size of `device` (green:
/// SMs by its granularity; mps: thread percentages).
pub fn partition_points(
    c: &SweepCommon,
    a: &PartitionSweep,
    device: &DeviceModel,
    version: &str,
) -> Result<(SweepIndex, Vec<Point>), Failure> {
    let sizes = match (a.green, a.sizes.is_empty()) {
        (true, true) => sweep::green_sizes(device).map_err(Failure::user)?,
        (true, false) => {
            sweep::check_green_sizes(device, &a.sizes).map_err(Failure::user)?;
            a.sizes.clone()
        }
        (false, true) => sweep::mps_sizes(),
        (false, false) => {
            sweep::check_mps_sizes(&a.sizes).map_err(Failure::user)?;
            a.sizes.clone()
        }
    };
    let (mechanism, host, unit) = match (c.backend, a.green) {
        (Backend::Cpu, true) => (Mechanism::None, Host::Thread, "sms"),
        (Backend::Cpu, false) => (Mechanism::None, Host::Thread, "thread_pct"),
        (Backend::Cuda, true) => (Mechanism::Green, Host::Thread, "sms"),
        (Backend::Cuda, false) => (Mechanism::Mps, Host::Process, "thread_pct"),
    };
    let point_precision = precision(&a.precision)?;
    let model = point_model(&a.model)?;
    let on_gpu = c.backend == Backend::Cuda;
    let points = sizes
        .iter()
        .map(|&size| {
            let green = a.green;
            let w = PointWorkload {
                name: sweep::workload_name(&a.model),
                model: model.clone(),
                batch: a.batch,
                precision: point_precision,
                rate_hz: c.rate_hz,
                duration_s: c.duration_s,
                warmup_jobs: c.warmup,
                sms: (on_gpu && green).then_some(size),
                thread_pct: (on_gpu && !green).then_some(size),
            };
            Point {
                entry: SweepPoint {
                    dir: format!("{unit}-{size:03}"),
                    status: "pending".into(),
                    sms: green.then_some(size),
                    thread_pct: (!green).then_some(size),
                    batch: Some(a.batch),
                    precision: Some(a.precision.clone()),
                    ..SweepPoint::default()
                },
                scenario: sweep::point_scenario(point_device(c, mechanism, host), &[w]),
            }
        })
        .collect();
    let index = SweepIndex {
        schema_version: SCHEMA_VERSION,
        isolane_version: version.into(),
        kind: "partition".into(),
        model: a.model.clone(),
        backend: backend_name(c.backend).into(),
        mechanism: if a.green { "green" } else { "mps" }.into(),
        precision: a.precision.clone(),
        device_model: Some(device.name.to_string()),
        unit: Some(unit.into()),
        partition_applied: on_gpu,
        rate_hz: c.rate_hz,
        duration_s: c.duration_s,
        points: Vec::new(),
    };
    Ok((index, points))
}

/// `sweep concurrency`'s points: N copies of one model at once for each N × batch × precision.
pub fn concurrency_points(
    c: &SweepCommon,
    a: &ConcurrencySweep,
    version: &str,
) -> Result<(SweepIndex, Vec<Point>), Failure> {
    for (flag, list) in [("workloads", &a.workloads), ("batch", &a.batch)] {
        if list.is_empty() || list.contains(&0) {
            return Err(Failure::user(format!(
                "--{flag}: expected a comma-separated list of numbers ≥ 1"
            )));
        }
    }
    if a.precision.is_empty() {
        return Err(Failure::user("--precision: the list is empty"));
    }
    let (mechanism, host) = match (c.backend, a.mps) {
        (Backend::Cpu, _) => (Mechanism::None, Host::Thread),
        (Backend::Cuda, false) => (Mechanism::Timeslice, Host::Process),
        (Backend::Cuda, true) => (Mechanism::Mps, Host::Process),
    };
    let model = point_model(&a.model)?;
    let several_precisions = a.precision.len() > 1;
    let mut points = Vec::new();
    for precision_flag in &a.precision {
        let point_precision = precision(precision_flag)?;
        for &n in &a.workloads {
            for &b in &a.batch {
                let ws: Vec<PointWorkload> = (0..n)
                    .map(|i| PointWorkload {
                        name: format!("{}-{i}", sweep::workload_name(&a.model)),
                        model: model.clone(),
                        batch: b,
                        precision: point_precision,
                        rate_hz: c.rate_hz,
                        duration_s: c.duration_s,
                        warmup_jobs: c.warmup,
                        sms: None,
                        // Equal shares that add up to at most 100 % (admission's budget).
                        thread_pct: (mechanism == Mechanism::Mps).then(|| (100 / n).max(1)),
                    })
                    .collect();
                let dir = if several_precisions {
                    format!("{precision_flag}-w{n}-b{b:02}")
                } else {
                    format!("w{n}-b{b:02}")
                };
                points.push(Point {
                    entry: SweepPoint {
                        dir,
                        status: "pending".into(),
                        workloads: Some(n),
                        batch: Some(b),
                        precision: Some(precision_flag.clone()),
                        ..SweepPoint::default()
                    },
                    scenario: sweep::point_scenario(point_device(c, mechanism, host), &ws),
                });
            }
        }
    }
    let index = SweepIndex {
        schema_version: SCHEMA_VERSION,
        isolane_version: version.into(),
        kind: "concurrency".into(),
        model: a.model.clone(),
        backend: backend_name(c.backend).into(),
        mechanism: mechanism.name().into(),
        precision: a.precision.join(","),
        device_model: None,
        unit: None,
        partition_applied: c.backend == Backend::Cuda && mechanism == Mechanism::Mps,
        rate_hz: c.rate_hz,
        duration_s: c.duration_s,
        points: Vec::new(),
    };
    Ok((index, points))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_time_left_is_the_mean_point_time_over_the_points_to_come() {
        assert_eq!(super::time_left(5.0, 0, 4), "");
        assert_eq!(super::time_left(20.0, 2, 8), " (~1 min 0 s left)");
    }
}
