//! What `isolane run` (and the commands that run a scenario the same way) says when a run
//! ends: the results table, the guard's held lines, the failures and notes, and `--json`'s
//! object. The caller prints the lines where they belong.

use std::path::Path;

use isolane_core::results::{AppSummary, RunSummary, StepResult, WorkloadSummary, WORKLOADS_CSV};

use crate::{Layout, ResultRow};

/// The results table of a run's model workloads under `title` (the device and mechanism;
/// command workloads have their own table: [`crate::programs_table`]); only the title when
/// every workload is a program.
pub fn run_results_table(title: &str, summary: &RunSummary, wide: bool) -> String {
    let models: Vec<&WorkloadSummary> = summary
        .workloads
        .iter()
        .filter(|w| w.program.is_none())
        .collect();
    if models.is_empty() {
        return title.to_string();
    }
    let status: Vec<String> = models.iter().map(|w| w.status.word().to_string()).collect();
    let rows: Vec<ResultRow> = models
        .iter()
        .zip(&status)
        .map(|(w, s)| ResultRow {
            workload: &w.name,
            status: s,
            metrics: &w.metrics,
        })
        .collect();
    crate::results_table(title, &rows, Layout { wide })
}

/// One line per best-effort workload the criticality guard held back (docs/criticality.md).
pub fn held_lines(summary: &RunSummary) -> Vec<String> {
    summary
        .workloads
        .iter()
        .filter_map(|w| {
            let h = w.held.as_ref()?;
            Some(format!(
                "{} (best effort): held {:.2} s, {} of {} jobs, max {:.2} ms, {} pieces/job",
                w.name,
                h.total_ms / 1e3,
                h.jobs_held,
                w.metrics.jobs,
                h.max_ms,
                h.pieces
            ))
        })
        .collect()
}

/// What went wrong in a run, for stderr: each workload's failure, an interruption, and a
/// hypervisor that took a visible share of the CPU.
pub fn failure_lines(summary: &RunSummary) -> Vec<String> {
    let mut lines: Vec<String> = summary
        .workloads
        .iter()
        .filter_map(|w| {
            let error = w.error.as_deref()?;
            // A worker's load error names its workload already ("workload `a`: model ...").
            let own = format!("workload `{}`: ", w.name);
            let error = error.strip_prefix(own.as_str()).unwrap_or(error);
            Some(format!("workload `{}` failed: {error}", w.name))
        })
        .collect();
    if summary.interrupted {
        lines.push(
            "interrupted: results cover the jobs released before the stop (Ctrl-C or SIGTERM)"
                .into(),
        );
    }
    // Above 1 % the host's share shows in the tail latencies of a VM (docs/runtime.md).
    if let Some(steal) = summary.cpu_steal_pct.filter(|&p| p > 1.0) {
        lines.push(format!(
            "note: the hypervisor took {steal:.1} % of this machine's CPU during the run\n  \
             (summary.json cpu_steal_pct): late starts and missed deadlines may be the host's"
        ));
    }
    lines
}

/// `run --json`'s stdout: where the results are and summary.json's content, in one object.
pub fn json_result(out: &Path, summary: &RunSummary) -> serde_json::Result<String> {
    let value = serde_json::json!({
        "out": out,
        "workloads_csv": out.join(WORKLOADS_CSV),
        "summary": summary,
    });
    serde_json::to_string(&value)
}

/// The tables of a run of `[[app]]`s under `title` (the device): per app its end to end (paper
/// 004's metrics), then every stage's own time.
pub fn apps_tables(title: &str, apps: &[AppSummary]) -> String {
    use crate::{ms, plain_table};
    let e2e: Vec<Vec<String>> = apps
        .iter()
        .map(|a| {
            let m = &a.end_to_end;
            let l = &m.latency_ms;
            vec![
                a.name.clone(),
                m.jobs.to_string(),
                format!("{:.2}", m.timeout_pct),
                ms(l.mean),
                ms(l.std),
                ms(l.max),
                ms(l.tail),
                ms(l.flatness),
            ]
        })
        .collect();
    let header = [
        "app", "frames", "miss %", "mean ms", "std ms", "max ms", "tail ms", "flat ms",
    ];
    let stages: Vec<Vec<String>> = apps
        .iter()
        .flat_map(|a| {
            a.stages.iter().enumerate().map(move |(j, s)| {
                vec![
                    if j == 0 {
                        a.name.clone()
                    } else {
                        String::new()
                    },
                    s.name.clone(),
                    s.processed.to_string(),
                    s.skipped.to_string(),
                    ms(s.latency_ms.mean),
                    ms(s.latency_ms.p95),
                    ms(s.latency_ms.max),
                ]
            })
        })
        .collect();
    // Each stage's kind is in summary.json; the table keeps to 80 columns.
    let stage_header = [
        "app", "stage", "done", "skip", "mean ms", "p95 ms", "max ms",
    ];
    format!(
        "{}, apps (end to end, first and last frames dropped)\n{}\n{}",
        title,
        plain_table(&header, &e2e, &[0]),
        plain_table(&stage_header, &stages, &[0, 1])
    )
}

/// `isolane isolation`'s table: per step and victim, its jobs, misses and latencies.
pub fn steps_table(steps: &[StepResult]) -> String {
    use crate::ms;
    let rows: Vec<Vec<String>> = steps
        .iter()
        .flat_map(|s| {
            s.victims.iter().map(move |v| {
                let m = &v.metrics;
                vec![
                    s.step.to_string(),
                    format!("{:.1}", s.interferer_rate_hz),
                    v.victim.clone(),
                    m.jobs.to_string(),
                    format!("{:.2}", m.timeout_pct),
                    ms(m.latency_ms.p50),
                    ms(m.latency_ms.p99),
                    ms(m.latency_ms.max),
                ]
            })
        })
        .collect();
    crate::plain_table(
        &[
            "step",
            "interferer Hz",
            "victim",
            "jobs",
            "miss %",
            "p50 ms",
            "p99 ms",
            "max ms",
        ],
        &rows,
        &[2],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_interrupted_run_on_a_busy_host_says_both_and_only_the_title_without_models() {
        let mut s = RunSummary::new("run");
        assert!(failure_lines(&s).is_empty());
        assert_eq!(run_results_table("cpu", &s, false), "cpu");
        s.interrupted = true;
        s.cpu_steal_pct = Some(2.5);
        let lines = failure_lines(&s);
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines[0].starts_with("interrupted:"), "{lines:?}");
        assert!(
            lines[1].contains("took 2.5 % of this machine's CPU"),
            "{lines:?}"
        );
        // A steal of 1 % or less is a VM's usual noise: nothing said.
        s.cpu_steal_pct = Some(1.0);
        assert_eq!(failure_lines(&s).len(), 1);
        assert!(held_lines(&s).is_empty());
    }

    /// A model file replaced by a bad one while a process host's worker started: "workload
    /// `a` failed: workload `a`: model ..." named the workload twice.
    #[test]
    fn a_failed_workload_is_named_once() {
        let mut s = RunSummary::new("run");
        let mut w = WorkloadSummary::new("a", "m.onnx", 1);
        w.error = Some("workload `a`: model `m.onnx`: not a valid ONNX model".into());
        s.workloads.push(w);
        let mut other = WorkloadSummary::new("b", "m.onnx", 1);
        other.error = Some("worker died (signal 9)".into());
        s.workloads.push(other);
        assert_eq!(
            failure_lines(&s),
            vec![
                "workload `a` failed: model `m.onnx`: not a valid ONNX model".to_string(),
                "workload `b` failed: worker died (signal 9)".to_string(),
            ]
        );
    }

    #[test]
    fn json_result_names_the_folder_its_table_and_the_summary() {
        let s = RunSummary::new("run");
        let v: serde_json::Value =
            serde_json::from_str(&json_result(Path::new("runs/x"), &s).unwrap()).unwrap();
        assert_eq!(v["out"], "runs/x");
        assert_eq!(v["workloads_csv"], "runs/x/workloads.csv");
        assert_eq!(v["summary"]["command"], "run");
    }
}
