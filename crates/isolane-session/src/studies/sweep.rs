//! `isolane sweep`'s runs: every point's scenario checked before anything is written, then
//! each point run (an ordinary run, by the caller's [`PointRuns`]) into its own folder, with
//! sweep.json rewritten after every point.

use std::path::Path;

use isolane_core::results::{RunSummary, SweepIndex, SweepPoint};
use isolane_core::spec::Scenario;
use isolane_runtime::coordinator::RunPlan;
use isolane_runtime::output;

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

#[cfg(test)]
mod tests {
    #[test]
    fn the_time_left_is_the_mean_point_time_over_the_points_to_come() {
        assert_eq!(super::time_left(5.0, 0, 4), "");
        assert_eq!(super::time_left(20.0, 2, 8), " (~1 min 0 s left)");
    }
}
