//! `isolane compare RUN_A RUN_B`'s work: two runs side by side, per workload and app, with a
//! Mann–Whitney U test of their latencies. The tables go to the caller's `say`; the
//! comparison comes back as JSON for `--json`.

use std::path::Path;

use isolane_core::metrics::latencies_ms;
use isolane_core::results::RunSummary;
use isolane_core::stats::{mann_whitney_u, MwMethod};
use isolane_runtime::output;

#[derive(Debug, thiserror::Error)]
pub enum CompareError {
    /// A folder that is not a run, a file that cannot be read, no name in common (exit 2).
    #[error("{0}")]
    User(String),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
}

impl CompareError {
    /// Whether this is the user's mistake (exit code 2) rather than a runtime failure.
    pub fn is_user_error(&self) -> bool {
        matches!(self, CompareError::User(_))
    }
}

fn user(msg: impl std::fmt::Display) -> CompareError {
    CompareError::User(msg.to_string())
}

/// One workload or app of both runs, as `--json` prints it.
#[derive(serde::Serialize)]
struct Pair<'a> {
    name: &'a str,
    a: &'a isolane_core::metrics::WorkloadMetrics,
    b: &'a isolane_core::metrics::WorkloadMetrics,
    mann_whitney: Test,
}

/// The U test of two latency samples, or why there is none.
#[derive(serde::Serialize)]
struct Test {
    u: Option<f64>,
    p_value: Option<f64>,
    method: Option<String>,
    n_a: usize,
    n_b: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

impl Test {
    fn of(xa: &[f64], xb: &[f64]) -> Test {
        let (n_a, n_b) = (xa.len(), xb.len());
        match mann_whitney_u(xa, xb, MwMethod::Auto) {
            Ok(mw) => Test {
                u: Some(mw.u),
                p_value: Some(mw.p_value),
                method: Some(format!("{:?}", mw.method).to_lowercase()),
                n_a,
                n_b,
                error: None,
            },
            Err(e) => Test {
                u: None,
                p_value: None,
                method: None,
                n_a,
                n_b,
                error: Some(e.to_string()),
            },
        }
    }

    /// The line the text output prints (and a blank line after it).
    fn line(&self) -> String {
        match (&self.error, self.u, self.p_value, &self.method) {
            (None, Some(u), Some(p), Some(method)) => format!(
                "Mann–Whitney U = {u:.1}, two-sided p = {p:.3e} ({method}, n = {} vs {})\n",
                self.n_a, self.n_b
            ),
            (e, ..) => format!(
                "Mann–Whitney U test not possible: {}\n",
                e.as_deref().unwrap_or("no result")
            ),
        }
    }
}

/// What `--json` prints.
#[derive(serde::Serialize)]
struct Comparison<'a> {
    run_a: &'a Path,
    run_b: &'a Path,
    label_a: &'a str,
    label_b: &'a str,
    workloads: Vec<Pair<'a>>,
    apps: Vec<Pair<'a>>,
    only_in_a: Vec<&'a str>,
    only_in_b: Vec<&'a str>,
    cpu_steal_pct_a: Option<f64>,
    cpu_steal_pct_b: Option<f64>,
}

fn read_summary(dir: &Path) -> Result<RunSummary, CompareError> {
    let path = dir.join("summary.json");
    if !isolane_core::files::is_there(&path) {
        return Err(user(format!(
            "{}: no such file (is it an isolane output directory?)",
            path.display()
        )));
    }
    isolane_core::results::read_json(&path)
        .map_err(|e| user(format!("not an isolane summary: {e}")))
}

/// Compares the runs in `run_a` and `run_b`, saying each table through `say`; returns the
/// comparison as one JSON object.
pub fn compare(run_a: &Path, run_b: &Path, say: &dyn Fn(&str)) -> Result<String, CompareError> {
    let a = read_summary(run_a)?;
    let b = read_summary(run_b)?;
    let label = |p: &Path| {
        p.file_name().map_or_else(
            || p.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        )
    };
    let (la, lb) = (label(run_a), label(run_b));
    let (la, lb) = if la == lb {
        ("A".to_string(), "B".to_string())
    } else {
        (la, lb)
    };
    let mut c = Comparison {
        run_a,
        run_b,
        label_a: &la,
        label_b: &lb,
        workloads: Vec::new(),
        apps: Vec::new(),
        only_in_a: Vec::new(),
        only_in_b: Vec::new(),
        cpu_steal_pct_a: a.cpu_steal_pct,
        cpu_steal_pct_b: b.cpu_steal_pct,
    };
    for wa in &a.workloads {
        let Some(wb) = b.workloads.iter().find(|w| w.name == wa.name) else {
            say(&format!("workload `{}` is only in {}", wa.name, la));
            c.only_in_a.push(&wa.name);
            continue;
        };
        let read = |dir: &Path, name: &str| {
            let p = dir.join("jobs").join(output::jobs_file_name(name));
            output::read_jobs_csv(&p).map_err(user)
        };
        let xa = latencies_ms(&read(run_a, &wa.name)?);
        let xb = latencies_ms(&read(run_b, &wb.name)?);
        say(&crate::compare_table(
            &wa.name,
            &la,
            &wa.metrics,
            &lb,
            &wb.metrics,
        ));
        let test = Test::of(&xa, &xb);
        say(&test.line());
        c.workloads.push(Pair {
            name: &wa.name,
            a: &wa.metrics,
            b: &wb.metrics,
            mann_whitney: test,
        });
    }
    compare_apps((run_a, run_b), &a, &b, &mut c, say)?;
    for wb in &b.workloads {
        if !a.workloads.iter().any(|w| w.name == wb.name) {
            say(&format!("workload `{}` is only in {}", wb.name, lb));
            c.only_in_b.push(&wb.name);
        }
    }
    // A difference in the host's steal can explain a difference in the tails (docs/runtime.md).
    let steal = |s: &RunSummary| {
        s.cpu_steal_pct
            .map_or("not recorded".into(), |p| format!("{p:.1} %"))
    };
    say(&format!(
        "CPU taken by the hypervisor during the run: {la} {}, {lb} {}",
        steal(&a),
        steal(&b)
    ));
    if c.workloads.is_empty() && c.apps.is_empty() {
        return Err(user("the two runs have no workload or app name in common"));
    }
    Ok(serde_json::to_string(&c)?)
}

/// The apps of both runs (docs/apps.md): end to end side by side, and the U test of their
/// measured frames' end-to-end latencies (apps/<app>.csv), into `c`.
fn compare_apps<'a>(
    (run_a, run_b): (&Path, &Path),
    a: &'a RunSummary,
    b: &'a RunSummary,
    c: &mut Comparison<'a>,
    say: &dyn Fn(&str),
) -> Result<(), CompareError> {
    let read = |dir: &Path, name: &str| -> Result<Vec<f64>, CompareError> {
        let p = dir.join("apps").join(format!("{name}.csv"));
        let text = isolane_core::files::read_text(&p).map_err(user)?;
        isolane_core::results::app_latencies_from_csv(&text)
            .map_err(|e| user(format!("{}: {e}", p.display())))
    };
    let (la, lb) = (c.label_a, c.label_b);
    for aa in &a.apps {
        let Some(ab) = b.apps.iter().find(|x| x.name == aa.name) else {
            say(&format!("app `{}` is only in {la}", aa.name));
            c.only_in_a.push(&aa.name);
            continue;
        };
        let title = format!("app {} (end to end)", aa.name);
        say(&crate::compare_table(
            &title,
            la,
            &aa.end_to_end,
            lb,
            &ab.end_to_end,
        ));
        let (xa, xb) = (read(run_a, &aa.name)?, read(run_b, &ab.name)?);
        let test = Test::of(&xa, &xb);
        say(&test.line());
        c.apps.push(Pair {
            name: &aa.name,
            a: &aa.end_to_end,
            b: &ab.end_to_end,
            mann_whitney: test,
        });
    }
    for ab in &b.apps {
        if !a.apps.iter().any(|x| x.name == ab.name) {
            say(&format!("app `{}` is only in {lb}", ab.name));
            c.only_in_b.push(&ab.name);
        }
    }
    Ok(())
}
