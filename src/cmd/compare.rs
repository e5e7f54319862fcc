//! `isolane compare RUN_A RUN_B`: two runs side by side, per workload, with a Mann–Whitney U test.

use std::path::{Path, PathBuf};

use clap::Args;
use isolane_core::metrics::latencies_ms;
use isolane_core::results::RunSummary;
use isolane_core::stats::{mann_whitney_u, MwMethod};
use isolane_runtime::output;

use super::user;

#[derive(Args)]
#[command(
    about = "Compare two runs' workloads side by side, with a Mann–Whitney U test",
    long_about = "Reads RUN_A/summary.json and RUN_B/summary.json and the jobs/<workload>.csv \
                  files, and for every workload present in both prints the two runs' metrics \
                  side by side and the two-sided Mann–Whitney U p-value of their response \
                  times (a small p: the latency distributions differ). --json prints the same \
                  as one JSON object on stdout (the tables go to stderr)."
)]
pub struct CompareArgs {
    /// Output directory of the first run.
    run_a: PathBuf,
    /// Output directory of the second run.
    run_b: PathBuf,
    /// Print the comparison as one JSON object on stdout (per workload and app: both runs'
    /// metrics and the U test; the names only in one run; each run's CPU steal); the tables go
    /// to stderr (docs/report.md, Reading results in Python).
    #[arg(long)]
    json: bool,
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

fn read_summary(dir: &Path) -> anyhow::Result<RunSummary> {
    let path = dir.join("summary.json");
    if !path.is_file() {
        return Err(user(format!(
            "{}: no such file (is it an isolane output directory?)",
            path.display()
        )));
    }
    isolane_core::results::read_json(&path)
        .map_err(|e| user(format!("not an isolane summary: {e}")))
}

pub fn run(args: CompareArgs) -> anyhow::Result<u8> {
    let a = read_summary(&args.run_a)?;
    let b = read_summary(&args.run_b)?;
    let label = |p: &Path| {
        p.file_name().map_or_else(
            || p.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        )
    };
    let (la, lb) = (label(&args.run_a), label(&args.run_b));
    let (la, lb) = if la == lb {
        ("A".to_string(), "B".to_string())
    } else {
        (la, lb)
    };
    // With --json, stdout is the JSON object alone: the text goes to stderr.
    let say = |text: &str| {
        if args.json {
            eprintln!("{text}")
        } else {
            println!("{text}")
        }
    };
    let mut c = Comparison {
        run_a: &args.run_a,
        run_b: &args.run_b,
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
        let xa = latencies_ms(&read(&args.run_a, &wa.name)?);
        let xb = latencies_ms(&read(&args.run_b, &wb.name)?);
        say(&isolane_report::compare_table(
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
    compare_apps(&args, &a, &b, &mut c, &say)?;
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
    if args.json {
        println!("{}", serde_json::to_string(&c)?);
    }
    Ok(0)
}

/// The apps of both runs (docs/apps.md): end to end side by side, and the U test of their
/// measured frames' end-to-end latencies (apps/<app>.csv), into `c`.
fn compare_apps<'a>(
    args: &CompareArgs,
    a: &'a RunSummary,
    b: &'a RunSummary,
    c: &mut Comparison<'a>,
    say: &dyn Fn(&str),
) -> anyhow::Result<()> {
    let read = |dir: &Path, name: &str| -> anyhow::Result<Vec<f64>> {
        let p = dir.join("apps").join(format!("{name}.csv"));
        let text = isolane_core::files::read_text(&p).map_err(user)?;
        isolane_app::metrics::latencies_from_csv(&text)
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
        say(&isolane_report::compare_table(
            &title,
            la,
            &aa.end_to_end,
            lb,
            &ab.end_to_end,
        ));
        let (xa, xb) = (read(&args.run_a, &aa.name)?, read(&args.run_b, &ab.name)?);
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
