//! isolane-report: tables, CSV/JSON, SVG plots, the HTML report.
//!
//! Tables are plain text (comfy-table) so that they read the same in a terminal, a CI log and a
//! file. The HTML report (`isolane report`, docs/report.md) reads results folders back
//! (`data`), draws SVG charts (`plot`) and assembles one self-contained page (`html`).

pub mod data;
pub mod html;
pub mod plot;

use std::path::PathBuf;

use comfy_table::presets::UTF8_FULL_CONDENSED;
use comfy_table::{Cell, CellAlignment, ContentArrangement, Table};
use isolane_core::metrics::WorkloadMetrics;

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// A folder that is not results, or a results file that cannot be read: the user's.
    #[error(transparent)]
    Data(#[from] data::DataError),
    #[error("drawing a chart: {0}")]
    Draw(String),
}

/// Reads every folder and renders the HTML report.
pub fn render_report(dirs: &[PathBuf], title: &str) -> Result<String, ReportError> {
    let loaded = dirs
        .iter()
        .map(|d| data::load(d))
        .collect::<Result<Vec<_>, _>>()?;
    html::render(&loaded, title).map_err(ReportError::Draw)
}

/// `1.234` with `digits` decimals, or `-` for a statistic that does not exist (no jobs).
pub fn num(v: Option<f64>, digits: usize) -> String {
    match v {
        Some(x) if x.is_finite() => format!("{x:.digits$}"),
        _ => "-".into(),
    }
}

fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED)
        .set_content_arrangement(ContentArrangement::Dynamic)
        .set_header(header.iter().map(Cell::new));
    t
}

fn right_align_from(t: &mut Table, first: usize) {
    let n = t.column_count();
    for i in first..n {
        if let Some(c) = t.column_mut(i) {
            c.set_cell_alignment(CellAlignment::Right);
        }
    }
}

/// One row of the results table.
pub struct ResultRow<'a> {
    pub workload: &'a str,
    pub status: &'a str,
    pub metrics: &'a WorkloadMetrics,
}

/// The end-of-run table: per workload jobs, completed, timeouts %, p50/p99/max latency,
/// throughput and start lateness p99.
pub fn results_table(rows: &[ResultRow]) -> String {
    let mut t = table(&[
        "workload",
        "status",
        "jobs",
        "completed",
        "timeouts %",
        "p50 ms",
        "p99 ms",
        "max ms",
        "throughput /s",
        "lateness p99 µs",
    ]);
    for r in rows {
        let m = r.metrics;
        t.add_row(vec![
            r.workload.to_string(),
            r.status.to_string(),
            m.jobs.to_string(),
            m.completed.to_string(),
            format!("{:.2}", m.timeout_pct),
            num(m.latency_ms.p50, 3),
            num(m.latency_ms.p99, 3),
            num(m.latency_ms.max, 3),
            format!("{:.1}", m.throughput_ips),
            num(m.start_lateness_us.p99, 1),
        ]);
    }
    right_align_from(&mut t, 2);
    t.to_string()
}

/// A generic table: header plus rows of already formatted cells. Columns are right-aligned
/// (numbers) except those listed in `text_columns`.
pub fn plain_table(header: &[&str], rows: &[Vec<String>], text_columns: &[usize]) -> String {
    let mut t = table(header);
    for r in rows {
        t.add_row(r.clone());
    }
    for i in 0..t.column_count() {
        if !text_columns.contains(&i) {
            if let Some(c) = t.column_mut(i) {
                c.set_cell_alignment(CellAlignment::Right);
            }
        }
    }
    t.to_string()
}

/// Side-by-side comparison of one workload in two runs, with the Mann–Whitney p-value.
pub fn compare_table(
    workload: &str,
    a_label: &str,
    a: &WorkloadMetrics,
    b_label: &str,
    b: &WorkloadMetrics,
) -> String {
    fn l(m: &WorkloadMetrics) -> &isolane_core::metrics::LatencyStats {
        &m.latency_ms
    }
    let rows: Vec<(&str, String, String)> = vec![
        ("jobs", a.jobs.to_string(), b.jobs.to_string()),
        (
            "completed",
            a.completed.to_string(),
            b.completed.to_string(),
        ),
        ("timeouts", a.timeouts.to_string(), b.timeouts.to_string()),
        (
            "timeout %",
            format!("{:.2}", a.timeout_pct),
            format!("{:.2}", b.timeout_pct),
        ),
        ("latency mean ms", num(l(a).mean, 3), num(l(b).mean, 3)),
        ("latency std ms", num(l(a).std, 3), num(l(b).std, 3)),
        ("latency min ms", num(l(a).min, 3), num(l(b).min, 3)),
        ("latency p50 ms", num(l(a).p50, 3), num(l(b).p50, 3)),
        ("latency p90 ms", num(l(a).p90, 3), num(l(b).p90, 3)),
        ("latency p99 ms", num(l(a).p99, 3), num(l(b).p99, 3)),
        ("latency max ms", num(l(a).max, 3), num(l(b).max, 3)),
        (
            "throughput /s",
            format!("{:.1}", a.throughput_ips),
            format!("{:.1}", b.throughput_ips),
        ),
        (
            "lateness p99 µs",
            num(a.start_lateness_us.p99, 1),
            num(b.start_lateness_us.p99, 1),
        ),
    ];
    let mut t = table(&[workload, a_label, b_label]);
    for (k, x, y) in rows {
        t.add_row(vec![k.to_string(), x, y]);
    }
    right_align_from(&mut t, 1);
    t.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_table_has_every_column_and_dashes_for_missing_stats() {
        let m = isolane_core::metrics::workload_metrics(&[], 1, 1.0, None);
        let s = results_table(&[ResultRow {
            workload: "cam",
            status: "ok",
            metrics: &m,
        }]);
        for h in [
            "workload",
            "timeouts %",
            "p50 ms",
            "p99 ms",
            "max ms",
            "throughput",
            "lateness p99",
        ] {
            assert!(s.contains(h), "{h} missing in\n{s}");
        }
        assert!(s.contains("cam") && s.contains('-'));
    }
}
