//! isolane-report: tables, CSV/JSON, SVG plots, the HTML report.
//!
//! Tables are plain text (comfy-table) so that they read the same in a terminal, a CI log and a
//! file. The HTML report (`isolane report`, docs/report.md) reads results folders back
//! (`data`), draws SVG charts (`plot`) and assembles one self-contained page (`html`).

pub mod admission;
pub mod coexec;
pub mod compare;
pub mod data;
pub mod explain;
pub mod html;
pub mod matrix;
pub mod plot;
pub mod programs;
pub mod run_text;
pub mod timeline;

use std::path::PathBuf;

pub use coexec::{coexec_jobs_table, coexec_table};
use comfy_table::presets::UTF8_FULL_CONDENSED;
use comfy_table::{Cell, CellAlignment, ContentArrangement, Table};
use isolane_core::metrics::WorkloadMetrics;
pub use matrix::{interference_table, stretch_grid, StretchGrid};
pub use programs::programs_table;

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

/// Terminal width the tables are laid out for unless `wide` is asked for.
pub const TERMINAL_COLUMNS: u16 = 80;

/// How a table is laid out.
#[derive(Debug, Clone, Copy, Default)]
pub struct Layout {
    /// Every column, at its natural width; else the short set, fitted to 80 columns.
    pub wide: bool,
}

/// The end-of-run table under a title line (device and mechanism). By default per workload:
/// jobs, timeout %, p50/p99/max latency and throughput (and the status, when a workload did not
/// end `ok`), which fits 80 columns for workload names up to about 16 characters (longer names
/// wrap inside their cell). `wide` adds the status always, completed jobs, mean, p90 and p99.9
/// latency and start lateness p99.
pub fn results_table(title: &str, rows: &[ResultRow], layout: Layout) -> String {
    let with_status = layout.wide || rows.iter().any(|r| r.status != "ok");
    let mut header = vec!["workload"];
    if with_status {
        header.push("status");
    }
    header.push("jobs");
    if layout.wide {
        header.push("done");
    }
    header.extend(["miss %", "p50 ms", "p99 ms", "max ms"]);
    if layout.wide {
        header.extend(["mean ms", "p90 ms", "p99.9 ms", "late p99 µs"]);
    }
    header.push("img/s");
    let mut t = table(&header);
    for r in rows {
        let m = r.metrics;
        let l = &m.latency_ms;
        let mut row = vec![r.workload.to_string()];
        if with_status {
            row.push(r.status.to_string());
        }
        row.push(m.jobs.to_string());
        if layout.wide {
            row.push(m.completed.to_string());
        }
        row.extend([
            format!("{:.2}", m.timeout_pct),
            ms(l.p50),
            ms(l.p99),
            ms(l.max),
        ]);
        if layout.wide {
            row.extend([
                ms(l.mean),
                ms(l.p90),
                ms(l.p999),
                num(m.start_lateness_us.p99, 1),
            ]);
        }
        row.push(rate(m.throughput_ips));
        t.add_row(row);
    }
    right_align_from(&mut t, if with_status { 2 } else { 1 });
    fit(&mut t, layout);
    format!("{title}\n{t}")
}

/// A latency in ms with three significant decimals at most: 0.123, 12.35, 123.5, 1234.
pub fn ms(v: Option<f64>) -> String {
    match v {
        Some(x) if x.is_finite() => {
            let digits = match x.abs() {
                a if a < 10.0 => 3,
                a if a < 100.0 => 2,
                a if a < 1000.0 => 1,
                _ => 0,
            };
            format!("{x:.digits$}")
        }
        _ => "-".into(),
    }
}

/// A rate per second: one decimal below 1000, whole numbers above.
pub fn rate(x: f64) -> String {
    if x.abs() < 1000.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.0}")
    }
}

/// Limits `t` to the terminal's 80 columns unless the layout is wide.
pub fn fit(t: &mut Table, layout: Layout) {
    if layout.wide {
        t.set_content_arrangement(ContentArrangement::Disabled);
    } else {
        t.set_content_arrangement(ContentArrangement::Dynamic)
            .set_width(TERMINAL_COLUMNS);
    }
}

/// A generic table: header plus rows of already formatted cells. Columns are right-aligned
/// (numbers) except those listed in `text_columns`. Fitted to 80 columns.
pub fn plain_table(header: &[&str], rows: &[Vec<String>], text_columns: &[usize]) -> String {
    laid_out_table(header, rows, text_columns, Layout::default())
}

/// [`plain_table`] at every column's natural width (`--wide`).
pub fn wide_table(header: &[&str], rows: &[Vec<String>], text_columns: &[usize]) -> String {
    laid_out_table(header, rows, text_columns, Layout { wide: true })
}

fn laid_out_table(
    header: &[&str],
    rows: &[Vec<String>],
    text_columns: &[usize],
    layout: Layout,
) -> String {
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
    fit(&mut t, layout);
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
        // paper 004's determinism metrics: max − p95 and p90 − p10
        ("latency tail ms", num(l(a).tail, 3), num(l(b).tail, 3)),
        (
            "latency flatness ms",
            num(l(a).flatness, 3),
            num(l(b).flatness, 3),
        ),
        (
            "throughput img/s",
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
    fit(&mut t, Layout::default());
    t.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn widest_line(s: &str) -> usize {
        s.lines().map(|l| l.chars().count()).max().unwrap_or(0)
    }

    fn metrics_of_a_busy_run() -> isolane_core::metrics::WorkloadMetrics {
        let mut m = isolane_core::metrics::workload_metrics(&[], 1, 1.0, None);
        m.jobs = 123_456;
        m.completed = 123_000;
        m.timeout_pct = 100.0;
        m.latency_ms.p50 = Some(1234.5678);
        m.latency_ms.p99 = Some(98765.4321);
        m.latency_ms.max = Some(123456.789);
        m.latency_ms.mean = Some(1234.5);
        m.latency_ms.p90 = Some(2345.6);
        m.latency_ms.p999 = Some(99999.9);
        m.start_lateness_us.p99 = Some(123456.7);
        m.throughput_ips = 12345.678;
        m
    }

    #[test]
    fn results_table_fits_80_columns_and_has_its_short_headers() {
        let m = metrics_of_a_busy_run();
        let rows = [
            ResultRow {
                workload: "camera-front-0",
                status: "FAILED",
                metrics: &m,
            },
            ResultRow {
                workload: "lidar",
                status: "ok",
                metrics: &m,
            },
        ];
        let s = results_table("cpu, no partitions", &rows, Layout::default());
        assert!(widest_line(&s) <= 80, "{} columns:\n{s}", widest_line(&s));
        assert!(s.starts_with("cpu, no partitions\n"), "{s}");
        for h in [
            "workload", "status", "jobs", "miss %", "p50 ms", "p99 ms", "max ms", "img/s",
        ] {
            assert!(s.contains(h), "{h} missing in\n{s}");
        }
        assert!(!s.contains("late p99"), "{s}");
        // No cell broken inside a word: every value appears whole.
        for v in [
            "camera-front-0",
            "FAILED",
            "123456",
            "1235",
            "98765",
            "123457",
            "12346",
        ] {
            assert!(s.contains(v), "{v} missing or broken in\n{s}");
        }
    }

    #[test]
    fn wide_results_table_has_every_column() {
        let m = metrics_of_a_busy_run();
        let rows = [ResultRow {
            workload: "cam",
            status: "ok",
            metrics: &m,
        }];
        let s = results_table("t", &rows, Layout { wide: true });
        for h in [
            "done",
            "mean ms",
            "p90 ms",
            "p99.9 ms",
            "late p99 µs",
            "img/s",
        ] {
            assert!(s.contains(h), "{h} missing in\n{s}");
        }
        assert!(s.contains("123456.7"), "{s}");
    }

    #[test]
    fn results_table_shows_dashes_for_missing_stats() {
        let m = isolane_core::metrics::workload_metrics(&[], 1, 1.0, None);
        let s = results_table(
            "t",
            &[ResultRow {
                workload: "cam",
                status: "ok",
                metrics: &m,
            }],
            Layout::default(),
        );
        assert!(s.contains("cam") && s.contains(" - "), "{s}");
        assert!(!s.contains("status"), "all ok: no status column\n{s}");
    }

    #[test]
    fn latencies_keep_three_significant_decimals_at_most() {
        assert_eq!(ms(Some(0.12345)), "0.123");
        assert_eq!(ms(Some(12.345)), "12.35");
        assert_eq!(ms(Some(123.45)), "123.5");
        assert_eq!(ms(Some(1234.5)), "1234");
        assert_eq!(ms(None), "-");
        assert_eq!(rate(5.04), "5.0");
        assert_eq!(rate(12345.6), "12346");
    }
}
