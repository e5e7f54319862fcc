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
                  times (a small p: the latency distributions differ)."
)]
pub struct CompareArgs {
    /// Output directory of the first run.
    run_a: PathBuf,
    /// Output directory of the second run.
    run_b: PathBuf,
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
    let mut matched = 0;
    for wa in &a.workloads {
        let Some(wb) = b.workloads.iter().find(|w| w.name == wa.name) else {
            println!("workload `{}` is only in {}", wa.name, la);
            continue;
        };
        matched += 1;
        let read = |dir: &Path, name: &str| {
            let p = dir.join("jobs").join(output::jobs_file_name(name));
            output::read_jobs_csv(&p).map_err(user)
        };
        let xa = latencies_ms(&read(&args.run_a, &wa.name)?);
        let xb = latencies_ms(&read(&args.run_b, &wb.name)?);
        println!(
            "{}",
            isolane_report::compare_table(&wa.name, &la, &wa.metrics, &lb, &wb.metrics)
        );
        println!("{}", mann_whitney_line(&xa, &xb));
    }
    matched += compare_apps(&args, &a, &b, &la, &lb)?;
    for wb in &b.workloads {
        if !a.workloads.iter().any(|w| w.name == wb.name) {
            println!("workload `{}` is only in {}", wb.name, lb);
        }
    }
    // A difference in the host's steal can explain a difference in the tails (docs/runtime.md).
    let steal = |s: &RunSummary| {
        s.cpu_steal_pct
            .map_or("not recorded".into(), |p| format!("{p:.1} %"))
    };
    println!(
        "CPU taken by the hypervisor during the run: {la} {}, {lb} {}",
        steal(&a),
        steal(&b)
    );
    if matched == 0 {
        return Err(user("the two runs have no workload or app name in common"));
    }
    Ok(0)
}

/// The U test's line (and a blank line after it).
fn mann_whitney_line(xa: &[f64], xb: &[f64]) -> String {
    match mann_whitney_u(xa, xb, MwMethod::Auto) {
        Ok(mw) => format!(
            "Mann–Whitney U = {:.1}, two-sided p = {:.3e} ({}, n = {} vs {})\n",
            mw.u,
            mw.p_value,
            format!("{:?}", mw.method).to_lowercase(),
            xa.len(),
            xb.len()
        ),
        Err(e) => format!("Mann–Whitney U test not possible: {e}\n"),
    }
}

/// The apps of both runs (docs/apps.md): end to end side by side, and the U test of their
/// measured frames' end-to-end latencies (apps/<app>.csv). Returns how many matched.
fn compare_apps(
    args: &CompareArgs,
    a: &RunSummary,
    b: &RunSummary,
    la: &str,
    lb: &str,
) -> anyhow::Result<usize> {
    let read = |dir: &Path, name: &str| -> anyhow::Result<Vec<f64>> {
        let p = dir.join("apps").join(format!("{name}.csv"));
        let text =
            std::fs::read_to_string(&p).map_err(|e| user(format!("{}: {e}", p.display())))?;
        isolane_app::metrics::latencies_from_csv(&text)
            .map_err(|e| user(format!("{}: {e}", p.display())))
    };
    let mut matched = 0;
    for aa in &a.apps {
        let Some(ab) = b.apps.iter().find(|x| x.name == aa.name) else {
            println!("app `{}` is only in {la}", aa.name);
            continue;
        };
        matched += 1;
        let title = format!("app {} (end to end)", aa.name);
        println!(
            "{}",
            isolane_report::compare_table(&title, la, &aa.end_to_end, lb, &ab.end_to_end)
        );
        let (xa, xb) = (read(&args.run_a, &aa.name)?, read(&args.run_b, &ab.name)?);
        println!("{}", mann_whitney_line(&xa, &xb));
    }
    for ab in &b.apps {
        if !a.apps.iter().any(|x| x.name == ab.name) {
            println!("app `{}` is only in {lb}", ab.name);
        }
    }
    Ok(matched)
}
