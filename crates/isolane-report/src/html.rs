//! The HTML report: one self-contained file (inline CSS and SVG, no script, no external
//! resource), with a section for each kind of data found in the folders given.

use isolane_core::results::{ProgramEnergySource, RunSummary, TelemetrySummary};
use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::data::{InterferenceDir, MaxrateDir, ResultsDir, RunDir, SweepDir, TelemetrySeries};
use crate::plot::{self, Chart};

const W: u32 = 640;
const H: u32 = 380;
/// Points per CDF curve (see `plot::cdf_points`).
const CDF_POINTS: usize = 400;

pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(c),
        }
    }
    out
}

fn fmt(v: Option<f64>, digits: usize) -> String {
    crate::num(v, digits)
}

/// The report's body, section by section; each section only when its data exists.
pub(crate) struct Page {
    pub(crate) body: String,
    pub(crate) figures: usize,
}

impl Page {
    pub(crate) fn h2(&mut self, title: &str, intro: &str) {
        let _ = write!(self.body, "<section><h2>{}</h2>", escape(title));
        if !intro.is_empty() {
            let _ = write!(self.body, "<p class=\"intro\">{}</p>", escape(intro));
        }
    }

    pub(crate) fn end(&mut self) {
        self.body.push_str("</section>\n");
    }

    fn figures(&mut self, charts: Vec<Chart>) -> Result<(), String> {
        let charts: Vec<Chart> = charts.into_iter().filter(|c| !c.is_empty()).collect();
        if charts.is_empty() {
            return Ok(());
        }
        self.body.push_str("<div class=\"grid\">");
        for c in charts {
            let svg = plot::svg(&c, W, H)?;
            let _ = write!(
                self.body,
                "<figure class=\"plot\" data-series=\"{}\">{svg}<figcaption>{}</figcaption></figure>",
                c.series.len(),
                escape(&c.caption)
            );
            self.figures += 1;
        }
        self.body.push_str("</div>");
        Ok(())
    }

    pub(crate) fn table(&mut self, header: &[String], rows: &[Vec<String>]) {
        self.body.push_str("<table><thead><tr>");
        for h in header {
            let _ = write!(self.body, "<th>{}</th>", escape(h));
        }
        self.body.push_str("</tr></thead><tbody>");
        for r in rows {
            self.body.push_str("<tr>");
            for (i, c) in r.iter().enumerate() {
                let class = if i == 0 { "" } else { " class=\"n\"" };
                let _ = write!(self.body, "<td{class}>{}</td>", escape(c));
            }
            self.body.push_str("</tr>");
        }
        self.body.push_str("</tbody></table>");
    }
}

/// Renders the report for the folders given (in that order within each section).
pub fn render(dirs: &[ResultsDir], title: &str) -> Result<String, String> {
    let mut page = Page {
        body: String::new(),
        figures: 0,
    };
    // Each kind's folders, in the order given (interference folders are drawn one by one).
    let mut maxrates: Vec<&MaxrateDir> = Vec::new();
    let mut runs: Vec<&RunDir> = Vec::new();
    let mut sweeps: Vec<&SweepDir> = Vec::new();
    for d in dirs {
        match d {
            ResultsDir::Maxrate(m) => maxrates.push(m),
            ResultsDir::Run(r) => runs.push(r),
            ResultsDir::Sweep(s) => sweeps.push(s),
            ResultsDir::Interference(_) | ResultsDir::Coexec(_) => {}
        }
    }

    maxrate_section(&mut page, &maxrates);
    criticality_section(&mut page, &runs);
    isolation_section(&mut page, &runs)?;
    for d in dirs {
        if let ResultsDir::Interference(m) = d {
            interference_section(&mut page, m);
        }
    }
    for d in dirs {
        if let ResultsDir::Coexec(c) = d {
            crate::coexec::section(&mut page, c);
        }
    }
    partition_section(
        &mut page,
        &sweeps
            .iter()
            .copied()
            .filter(|s| s.index.kind == "partition")
            .collect::<Vec<_>>(),
    )?;
    concurrency_section(
        &mut page,
        &sweeps
            .iter()
            .copied()
            .filter(|s| s.index.kind == "concurrency")
            .collect::<Vec<_>>(),
    )?;
    apps_across_runs_section(&mut page, &runs)?;
    for r in &runs {
        run_section(&mut page, r)?;
    }

    let mut inputs = String::new();
    for d in dirs {
        let (kind, path) = match d {
            ResultsDir::Run(r) => (
                if r.summary.command.is_empty() {
                    "run".to_string()
                } else {
                    r.summary.command.clone()
                },
                &r.path,
            ),
            ResultsDir::Maxrate(m) => ("maxrate".to_string(), &m.path),
            ResultsDir::Sweep(s) => (format!("sweep {}", s.index.kind), &s.path),
            ResultsDir::Interference(m) => ("interference".to_string(), &m.path),
            ResultsDir::Coexec(c) => ("coexec".to_string(), &c.path),
        };
        let _ = write!(
            inputs,
            "<li><code>{}</code> ({})</li>",
            escape(&path.display().to_string()),
            escape(&kind)
        );
    }
    Ok(format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"generator\" content=\"isolane {version}\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{title}</title><style>{CSS}</style></head><body>\
         <h1>{title}</h1><p class=\"meta\">isolane {version} · {n} plot(s) from:</p>\
         <ul class=\"inputs\">{inputs}</ul>\n{body}</body></html>\n",
        version = env!("CARGO_PKG_VERSION"),
        title = escape(title),
        n = page.figures,
        body = page.body,
    ))
}

const CSS: &str = "body{font-family:sans-serif;margin:24px auto;max-width:1340px;color:#222;\
padding:0 16px}h1{font-size:24px}h2{font-size:19px;border-bottom:1px solid #ddd;\
padding-bottom:4px;margin-top:36px}h3{font-size:16px}.meta,.intro{color:#555}\
.grid{display:flex;flex-wrap:wrap;gap:12px}figure{margin:0;border:1px solid #e4e4e4;\
padding:4px}figure svg{display:block}figcaption{font-size:12px;color:#555;text-align:center}\
table{border-collapse:collapse;margin:8px 0 16px;font-size:13px}th,td{border:1px solid #ddd;\
padding:3px 8px}th{background:#f4f4f4}td.n{text-align:right;font-variant-numeric:tabular-nums}\
code{font-size:12px}";

/// Runs with best-effort workloads side by side (docs/criticality.md): per run its mechanism
/// and protection, each critical workload's timeouts and max latency, and what best effort got.
fn criticality_section(page: &mut Page, runs: &[&RunDir]) {
    use isolane_core::spec::Criticality;
    let runs: Vec<&&RunDir> = runs
        .iter()
        .filter(|r| {
            let has = |c| r.summary.workloads.iter().any(|w| w.criticality == c);
            has(Criticality::Critical) && has(Criticality::BestEffort)
        })
        .collect();
    if runs.is_empty() {
        return;
    }
    page.h2(
        "Critical and best-effort workloads",
        "Each run with both kinds: how the critical ones kept their deadlines and what best \
         effort got. Protection: off (nobody held), the stall model, or a stated stretch.",
    );
    let header: Vec<String> = [
        "run",
        "mechanism",
        "protection",
        "critical: timeouts % · max ms",
        "best effort: /s · held s",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let rows: Vec<Vec<String>> = runs
        .iter()
        .map(|r| {
            let of = |c| {
                r.summary
                    .workloads
                    .iter()
                    .filter(move |w| w.criticality == c)
            };
            let critical: Vec<String> = of(Criticality::Critical)
                .map(|w| {
                    format!(
                        "{} {:.2} · {}",
                        w.name,
                        w.metrics.timeout_pct,
                        fmt(w.metrics.latency_ms.max, 2)
                    )
                })
                .collect();
            let best: Vec<String> = of(Criticality::BestEffort)
                .map(|w| {
                    let held = w.held.as_ref().map_or(0.0, |h| h.total_ms / 1e3);
                    format!("{} {:.1} · {held:.2}", w.name, w.metrics.throughput_ips)
                })
                .collect();
            vec![
                r.label.clone(),
                mechanism_label(r),
                if r.device.protection.is_empty() {
                    "stall model".into()
                } else {
                    r.device.protection.clone()
                },
                critical.join("; "),
                best.join("; "),
            ]
        })
        .collect();
    page.table(&header, &rows);
    page.end();
}

/// Tables II–III of paper 000: max stable rate per model (rows) and mechanism (columns).
fn maxrate_section(page: &mut Page, dirs: &[&MaxrateDir]) {
    if dirs.is_empty() {
        return;
    }
    let mut columns: Vec<String> = Vec::new();
    // Every search of a model in a partition: two folders of the same cell (a repeat, another
    // machine) are both shown, each named by its folder.
    let mut cells: BTreeMap<String, BTreeMap<String, Vec<&MaxrateDir>>> = BTreeMap::new();
    for d in dirs {
        let col = d.result.column();
        if !columns.contains(&col) {
            columns.push(col.clone());
        }
        cells
            .entry(d.result.row())
            .or_default()
            .entry(col)
            .or_default()
            .push(d);
    }
    let cell_text = |found: &[&MaxrateDir]| -> String {
        let one = |d: &MaxrateDir| {
            format!(
                "{:.1} (L_max {:.2} ms",
                d.result.max_rate_hz, d.result.l_max_ms
            )
        };
        match found {
            [] => "-".into(),
            [d] => format!("{})", one(d)),
            _ => found
                .iter()
                .map(|d| format!("{}, {})", one(d), d.path.display()))
                .collect::<Vec<_>>()
                .join("; "),
        }
    };
    // The papers' order: the whole GPU first, then MPS, then the hard partitions.
    let rank = |c: &String| {
        ["timeslice", "mps", "mig", "green"]
            .iter()
            .position(|m| c.starts_with(m))
            .unwrap_or(4)
    };
    columns.sort_by(|a, b| rank(a).cmp(&rank(b)).then_with(|| a.cmp(b)));
    page.h2(
        "Max stable inference rate",
        "Jobs/s with no deadline miss over the validation batches (Algorithm 1 of paper 000; \
         Tables II–III), per model and mechanism; a model searched more than once in the same \
         partition has each search in its cell, named by its folder.",
    );
    let mut header = vec!["model".to_string()];
    header.extend(columns.iter().cloned());
    let rows: Vec<Vec<String>> = cells
        .iter()
        .map(|(model, by_col)| {
            let mut r = vec![model.clone()];
            r.extend(
                columns
                    .iter()
                    .map(|c| cell_text(by_col.get(c).map_or(&[][..], Vec::as_slice))),
            );
            r
        })
        .collect();
    page.table(&header, &rows);
    page.end();
}

/// One interference matrix: the heatmap of the victims' p99 stretch (victim × neighbour) and
/// every cell in a table.
fn interference_section(page: &mut Page, m: &InterferenceDir) {
    let i = &m.index;
    let size = match (&i.unit, i.victim_size) {
        (Some(u), Some(v)) => format!(", victim partition {v} {}", unit_word(u)),
        _ => String::new(),
    };
    let rate = match (i.victim_load, i.victim_rate_hz) {
        (Some(f), _) => format!("{:.0} % of its capacity alone", f * 100.0),
        (_, Some(h)) => format!("{h} Hz"),
        _ => "a fixed rate".into(),
    };
    page.h2(
        &format!("Interference: {} ({}{size})", m.label, i.mechanism),
        &format!(
            "Each victim at {rate} beside each neighbour running flat out; colour and number: \
             the victim's p99 execution time over its p99 alone (1.00 = undisturbed). \
             Neighbour columns carry their partition size after @. {}s per cell.",
            i.duration_s
        ),
    );
    let grid = crate::matrix::stretch_grid(&i.cells);
    if !grid.rows.is_empty() {
        page.body.push_str(&crate::matrix::heatmap_svg(&grid));
        page.figures += 1;
    }
    let victim = [
        "victim",
        "neighbour",
        "rate Hz",
        "p50 ms",
        "p99 ms",
        "×p50",
        "×p99",
        "miss %",
    ];
    let header: Vec<String> = victim
        .into_iter()
        .chain(crate::matrix::NEIGHBOUR_COLUMNS)
        .chain(["status"])
        .map(str::to_string)
        .collect();
    let rows: Vec<Vec<String>> = i.cells.iter().map(interference_row).collect();
    page.table(&header, &rows);
    page.end();
}

fn unit_word(unit: &str) -> &str {
    match unit {
        "sms" => "SMs",
        "thread_pct" => "% of threads",
        u => u,
    }
}

fn interference_row(c: &isolane_core::results::InterferenceCell) -> Vec<String> {
    let mut r = vec![
        crate::matrix::victim_label(c),
        crate::matrix::neighbour_label(c),
        fmt(c.victim_rate_hz, 1),
        crate::ms(c.exec_ms.p50),
        crate::ms(c.exec_ms.p99),
        fmt(c.stretch_p50, 2),
        fmt(c.stretch_p99, 2),
        format!("{:.2}", c.timeout_pct),
    ];
    r.extend(crate::matrix::neighbour_cells(c));
    r.push(c.status.clone());
    r
}

/// The label of a run's way of sharing: the mechanism, or the folder's name when the scenario
/// does not say (the CPU, where everything is `none`).
fn mechanism_label(r: &RunDir) -> String {
    match r.device.mechanism.as_str() {
        "" | "none" => r.label.clone(),
        m => m.to_string(),
    }
}

/// Paper 000 Figs. 8–11: victims' timeout % against the interferers' rate, one line per
/// mechanism, one chart per victim model (the mean over victims when there are several).
/// One line of an isolation chart.
#[derive(Debug, Clone, PartialEq)]
pub struct IsolationLine {
    pub label: String,
    pub folder: String,
    /// (interferer rate, victims' mean timeout %) per step.
    pub points: Vec<(f64, f64)>,
}

/// Isolation folders grouped by (victim model, number of victims), so that the 2- and
/// 4-workload variants of a model get separate charts as in the paper; one line per folder.
pub fn isolation_lines(runs: &[&RunDir]) -> BTreeMap<(String, usize), Vec<IsolationLine>> {
    let mut groups: BTreeMap<(String, usize), Vec<IsolationLine>> = BTreeMap::new();
    for r in runs.iter().filter(|r| !r.isolation.is_empty()) {
        let mut victims: Vec<&str> = r.isolation.iter().map(|x| x.victim.as_str()).collect();
        victims.sort_unstable();
        victims.dedup();
        let model = victims
            .first()
            .and_then(|v| r.summary.workloads.iter().find(|w| w.name == *v))
            .map(|w| w.model.clone())
            .unwrap_or_else(|| "victim".into());
        let mut by_step: BTreeMap<u32, (f64, f64, usize)> = BTreeMap::new();
        for row in &r.isolation {
            let e = by_step
                .entry(row.step)
                .or_insert((row.interferer_rate_hz, 0.0, 0));
            e.1 += row.timeout_pct;
            e.2 += 1;
        }
        let points = by_step
            .values()
            .map(|(rate, sum, n)| (*rate, sum / *n as f64))
            .collect();
        groups
            .entry((model, victims.len()))
            .or_default()
            .push(IsolationLine {
                label: mechanism_label(r),
                folder: r.label.clone(),
                points,
            });
    }
    // Two folders of one mechanism (e.g. green at two sizes) are told apart by folder name.
    for lines in groups.values_mut() {
        let labels: Vec<String> = lines.iter().map(|l| l.label.clone()).collect();
        for l in lines.iter_mut() {
            if labels.iter().filter(|x| **x == l.label).count() > 1 && l.label != l.folder {
                l.label = format!("{} ({})", l.label, l.folder);
            }
        }
    }
    groups
}

/// Paper 000 Figs. 8–11: victims' timeout % against the interferers' rate, one line per
/// mechanism, one chart per victim model and number of victims (their mean when several).
fn isolation_section(page: &mut Page, runs: &[&RunDir]) -> Result<(), String> {
    let groups = isolation_lines(runs);
    if groups.is_empty() {
        return Ok(());
    }
    page.h2(
        "Isolation: victim timeouts against interferer rate",
        "Victims run at a fixed rate while the interferers ramp theirs; each point is the \
         share of the victims' jobs released in that step that missed their deadline (paper \
         000, Figs. 8–11). With several victims, their mean.",
    );
    let mut charts = Vec::new();
    for ((model, victims), lines) in groups {
        let mut chart = Chart::new(
            if victims > 1 {
                format!("{model}: mean of {victims} victims")
            } else {
                format!("{model}: victim")
            },
            "interferer rate (jobs/s)",
            "victim timeouts (%)",
        );
        chart.y_from_zero = true;
        chart.markers = true;
        chart.caption = format!(
            "isolation.csv of {}",
            lines
                .iter()
                .map(|l| l.folder.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
        for l in lines {
            chart = chart.series(l.label, l.points);
        }
        charts.push(chart);
    }
    page.figures(charts)?;
    page.end();
    Ok(())
}

/// The point's memory: what the workloads report, else the device's peak from telemetry.
fn memory_mib(r: &RunDir) -> Option<f64> {
    let per_workload: Vec<f64> = r
        .summary
        .workloads
        .iter()
        .filter_map(|w| w.metrics.gpu_memory_mib)
        .collect();
    if !per_workload.is_empty() {
        return Some(per_workload.iter().sum());
    }
    r.summary
        .telemetry
        .as_ref()
        .and_then(|t| t.memory_used_mib)
        .map(|m| m.max)
}

fn mean_power_w(r: &RunDir) -> Option<f64> {
    r.summary
        .telemetry
        .as_ref()
        .and_then(|t| t.power_w)
        .map(|p| p.mean)
}

fn sweep_line_label(s: &SweepDir) -> String {
    let mut parts = vec![s.index.mechanism.clone()];
    if !s.index.backend.is_empty() {
        parts.push(s.index.backend.clone());
    }
    if !s.index.precision.is_empty() {
        parts.push(s.index.precision.clone());
    }
    parts.retain(|p| !p.is_empty());
    if parts.is_empty() {
        s.label.clone()
    } else {
        parts.join(" ")
    }
}

/// Paper 000 Figs. 4–5: throughput, memory and mean power against partition size; one chart
/// set per model and unit (SMs or MPS thread %), one line per sweep.
fn partition_section(page: &mut Page, sweeps: &[&SweepDir]) -> Result<(), String> {
    if sweeps.is_empty() {
        return Ok(());
    }
    page.h2(
        "Partition sweeps",
        "One model alone in partitions from the smallest to the whole GPU (paper 000, Figs. \
         4–5): throughput, device memory and mean power at each size.",
    );
    let mut groups: BTreeMap<(String, &str), Vec<&SweepDir>> = BTreeMap::new();
    for s in sweeps {
        let unit = if s.points.iter().any(|(p, _)| p.thread_pct.is_some()) {
            "MPS thread %"
        } else {
            "SMs"
        };
        groups
            .entry((s.index.model.clone(), unit))
            .or_default()
            .push(s);
    }
    for ((model, unit), list) in groups {
        let caption = format!(
            "sweep folders: {}",
            list.iter()
                .map(|s| s.label.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
        let mut thr = Chart::new(
            format!("{model}: throughput"),
            format!("partition ({unit})"),
            "throughput (images/s)",
        );
        let mut mem = Chart::new(
            format!("{model}: memory"),
            format!("partition ({unit})"),
            "device memory (MiB)",
        );
        let mut pow = Chart::new(
            format!("{model}: mean power"),
            format!("partition ({unit})"),
            "power (W)",
        );
        for s in list {
            let label = sweep_line_label(s);
            let mut t = Vec::new();
            let mut m = Vec::new();
            let mut p = Vec::new();
            for (pt, run) in &s.points {
                let (Some(x), Some(run)) = (pt.sms.or(pt.thread_pct), run) else {
                    continue;
                };
                let x = f64::from(x);
                t.push((x, run.summary.total_throughput_ips()));
                if let Some(v) = memory_mib(run) {
                    m.push((x, v));
                }
                if let Some(v) = mean_power_w(run) {
                    p.push((x, v));
                }
            }
            thr = thr.series(label.clone(), t);
            mem = mem.series(label.clone(), m);
            pow = pow.series(label, p);
        }
        for c in [&mut thr, &mut mem, &mut pow] {
            c.markers = true;
            c.y_from_zero = true;
            c.caption = caption.clone();
        }
        page.body
            .push_str(&format!("<h3>{} · {}</h3>", escape(&model), escape(unit)));
        page.figures(vec![thr, mem, pow])?;
    }
    page.end();
    Ok(())
}

/// Paper 001 Figs. 6–7: throughput per workload (T/P) and memory against the number of
/// concurrent workloads, one line per batch size; one chart set per sweep.
fn concurrency_section(page: &mut Page, sweeps: &[&SweepDir]) -> Result<(), String> {
    if sweeps.is_empty() {
        return Ok(());
    }
    page.h2(
        "Concurrency sweeps",
        "N copies of one model at once, closed loop, for each batch size (paper 001, Figs. \
         6–7): throughput per workload (T/P), total throughput and device memory.",
    );
    for s in sweeps {
        // A sweep over several precisions gets one chart set per precision.
        let mut by_precision: BTreeMap<String, ByBatch> = BTreeMap::new();
        for (pt, run) in &s.points {
            if let (Some(n), Some(b), Some(run)) = (pt.workloads, pt.batch, run) {
                let precision = pt.precision.clone().unwrap_or_default();
                by_precision
                    .entry(precision)
                    .or_default()
                    .entry(b)
                    .or_default()
                    .push((f64::from(n), run));
            }
        }
        let several = by_precision.len() > 1;
        for (precision, by_batch) in by_precision {
            concurrency_charts(page, s, several.then_some(precision.as_str()), by_batch)?;
        }
    }
    page.end();
    Ok(())
}

/// Per batch size: (workloads, run) points.
type ByBatch<'a> = BTreeMap<u32, Vec<(f64, &'a RunDir)>>;

fn concurrency_charts(
    page: &mut Page,
    s: &SweepDir,
    precision: Option<&str>,
    by_batch: ByBatch,
) -> Result<(), String> {
    {
        let name = match precision {
            Some(p) => format!("{} {} {p}", s.index.model, s.index.mechanism),
            None => format!("{} {}", s.index.model, sweep_line_label(s)),
        };
        let mut tp = Chart::new(
            format!("{name}: throughput per workload"),
            "concurrent workloads",
            "T/P (images/s per workload)",
        );
        let mut total = Chart::new(
            format!("{name}: total throughput"),
            "concurrent workloads",
            "throughput (images/s)",
        );
        let mut mem = Chart::new(
            format!("{name}: memory"),
            "concurrent workloads",
            "device memory (MiB)",
        );
        let caption = format!("sweep.json and its run folders in {}", s.label);
        for c in [&mut tp, &mut total, &mut mem] {
            c.caption = caption.clone();
        }
        for (batch, mut pts) in by_batch {
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            let label = format!("batch {batch}");
            let per = |r: &RunDir| {
                let n = r.summary.workloads.len().max(1) as f64;
                r.summary.total_throughput_ips() / n
            };
            tp = tp.series(
                label.clone(),
                pts.iter().map(|(n, r)| (*n, per(r))).collect(),
            );
            total = total.series(
                label.clone(),
                pts.iter()
                    .map(|(n, r)| (*n, r.summary.total_throughput_ips()))
                    .collect(),
            );
            mem = mem.series(
                label,
                pts.iter()
                    .filter_map(|(n, r)| memory_mib(r).map(|m| (*n, m)))
                    .collect(),
            );
        }
        for c in [&mut tp, &mut total, &mut mem] {
            c.markers = true;
            c.y_from_zero = true;
        }
        page.body.push_str(&format!(
            "<h3>{} <code>{}</code></h3>",
            escape(&name),
            escape(&s.path.display().to_string())
        ));
        page.figures(vec![tp, total, mem])?;
    }
    Ok(())
}

/// Beyond this many times the slowest response, a deadline is named in the caption instead of
/// drawn: an axis reaching it would squeeze the curves into a sliver at its left.
const DEADLINE_AXIS_LIMIT: f64 = 10.0;

/// Marks the deadlines of a latency chart's series (`deadlines`: series label, deadline ms):
/// a dashed line per distinct deadline, in its series' colour when it is one series' alone.
/// Series without a deadline (closed loop) or without data get none.
fn mark_deadlines(chart: &mut Chart, deadlines: &[(&str, Option<f64>)]) {
    let slowest = chart
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .fold(f64::NEG_INFINITY, f64::max);
    // (deadline, indices of its series in the chart), in the series' order.
    let mut groups: Vec<(f64, Vec<usize>)> = Vec::new();
    for (i, s) in chart.series.iter().enumerate() {
        let Some(d) = deadlines
            .iter()
            .find(|(name, _)| *name == s.label)
            .and_then(|(_, d)| *d)
            .filter(|d| d.is_finite() && *d > 0.0)
        else {
            continue;
        };
        match groups.iter_mut().find(|g| g.0 == d) {
            Some(g) => g.1.push(i),
            None => groups.push((d, vec![i])),
        }
    }
    let all = groups.len() == 1 && groups[0].1.len() == chart.series.len();
    let mut off_axis = Vec::new();
    for (d, members) in groups {
        let names: Vec<&str> = members
            .iter()
            .map(|&i| chart.series[i].label.as_str())
            .collect();
        let label = if all {
            format!("deadline {} ms", crate::ms(Some(d)))
        } else {
            format!("deadline {} ms: {}", crate::ms(Some(d)), names.join(", "))
        };
        if d > slowest * DEADLINE_AXIS_LIMIT {
            off_axis.push(label);
            continue;
        }
        let colour = match members[..] {
            [i] => plot::PALETTE[i % plot::PALETTE.len()],
            _ => (64, 64, 64),
        };
        chart.vlines.push(plot::VLine {
            label,
            x: d,
            colour,
        });
    }
    if !off_axis.is_empty() {
        let _ = write!(
            chart.caption,
            "; {} (off the axis: over {DEADLINE_AXIS_LIMIT}× the slowest response)",
            off_axis.join("; ")
        );
    }
}

/// One run: its workloads' table, latency CDFs and, with telemetry, the device over time
/// (paper 000, Figs. 6–7).
fn run_section(page: &mut Page, r: &RunDir) -> Result<(), String> {
    let command = if r.summary.command.is_empty() {
        "run"
    } else {
        r.summary.command.as_str()
    };
    let mut intro = format!("{command} · status {}", r.summary.status);
    if !r.device.backend.is_empty() {
        let _ = write!(
            intro,
            " · backend {} · mechanism {}",
            r.device.backend, r.device.mechanism
        );
    }
    let _ = write!(intro, " · {:.2} s · {}", r.summary.wall_s, r.path.display());
    if !r.summary.complete {
        intro.push_str(
            " · CUT SHORT: the run was killed; this covers the jobs it recorded before \
             (rebuilt by isolane summarize)",
        );
    }
    // Worth a reader's attention only where it can explain tail latencies (docs/runtime.md).
    if let Some(steal) = r.summary.cpu_steal_pct.filter(|&p| p > 1.0) {
        let _ = write!(
            intro,
            " · the hypervisor took {steal:.1} % of the host's CPU"
        );
    }
    page.h2(&format!("Run {}", r.label), &intro);
    let header: Vec<String> = [
        "workload",
        "model",
        "batch",
        "rate /s",
        "jobs",
        "timeouts %",
        "p50 ms",
        "p99 ms",
        "max ms",
        "throughput /s",
        "CPU %",
        "preempted",
        "energy J",
        "J/image",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let rows: Vec<Vec<String>> = r
        .summary
        .workloads
        .iter()
        .filter(|w| w.program.is_none())
        .map(|w| {
            vec![
                w.name.clone(),
                w.model.clone(),
                w.batch.to_string(),
                w.rate_hz.map_or("max".into(), |h| format!("{h:.1}")),
                w.metrics.jobs.to_string(),
                format!("{:.2}", w.metrics.timeout_pct),
                fmt(w.metrics.latency_ms.p50, 3),
                fmt(w.metrics.latency_ms.p99, 3),
                fmt(w.metrics.latency_ms.max, 3),
                format!("{:.1}", w.metrics.throughput_ips),
                fmt(w.cpu.as_ref().map(|c| c.cpu_pct), 1),
                w.cpu
                    .as_ref()
                    .map_or("-".into(), |c| c.involuntary_switches.to_string()),
                fmt(w.metrics.energy_j, 1),
                fmt(w.metrics.j_per_image, 3),
            ]
        })
        .collect();
    if !rows.is_empty() {
        page.table(&header, &rows);
    }
    programs_table(page, r);
    telemetry_table(page, &r.summary);
    let mut cdf = Chart::new(
        format!("{}: latency CDF", r.label),
        "response time (ms)",
        "fraction of jobs",
    );
    cdf.y_range = Some((0.0, 1.02));
    cdf.legend_lower_right = true;
    cdf.caption = format!("completed jobs in jobs/*.csv of {}", r.label);
    for (name, lat) in &r.latencies_ms {
        cdf = cdf.series(name.clone(), plot::cdf_points(lat, CDF_POINTS));
    }
    let deadlines: Vec<(&str, Option<f64>)> = r
        .summary
        .workloads
        .iter()
        .map(|w| (w.name.as_str(), w.deadline_ms))
        .collect();
    mark_deadlines(&mut cdf, &deadlines);
    let mut charts = vec![cdf];
    if let Some(t) = &r.telemetry {
        charts.extend(telemetry_charts(&r.label, t));
    }
    page.figures(charts)?;
    if let Some(w) = &r.timeline {
        timeline_figure(page, r, w);
    }
    explain_part(page, r)?;
    apps_part(page, r)?;
    page.end();
    Ok(())
}

/// Why the run's late jobs were late (`isolane explain`; docs/criticality.md): per workload
/// with late jobs, each cause's share of its jobs and its time, and the shares as a bar.
fn explain_part(page: &mut Page, r: &RunDir) -> Result<(), String> {
    let Some(e) = &r.explanation else {
        return Ok(());
    };
    let late: Vec<&crate::explain::WorkloadExplanation> =
        e.workloads.iter().filter(|w| w.late > 0).collect();
    if late.is_empty() {
        return Ok(());
    }
    let _ = write!(
        page.body,
        "<h3>Why jobs were late</h3><p class=\"intro\">{}</p>",
        escape(&format!(
            "Each late job counts once, split among its causes by their time: the neighbours \
             that ran beside it, the host (a late start with no neighbour on its cores), the \
             guard's holds, its own service time beyond its typical. Per workload the shares \
             add up to its late %. Copy-engine waits: {}",
            e.copy_engine
        ))
    );
    let header: Vec<String> = ["workload", "late %", "cause", "share of jobs %", "time ms"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let mut rows = Vec::new();
    for w in &late {
        for (i, c) in w.causes.iter().enumerate() {
            let memory = match (&c.cause.neighbour, i) {
                (Some(n), _) => w
                    .neighbours
                    .iter()
                    .find(|x| &x.name == n)
                    .map(|x| match &x.memory {
                        Some(m) => format!(" ({})", m.words()),
                        None => " (memory intensity unknown)".to_string(),
                    })
                    .unwrap_or_default(),
                _ => String::new(),
            };
            rows.push(vec![
                if i == 0 {
                    w.name.clone()
                } else {
                    String::new()
                },
                if i == 0 {
                    format!("{:.2}", w.late_pct)
                } else {
                    String::new()
                },
                format!("{}{memory}", c.cause.words()),
                format!("{:.2}", c.late_pct.unwrap_or(0.0)),
                crate::ms(Some(c.time_ms)),
            ]);
        }
    }
    page.table(&header, &rows);
    let bars: Vec<plot::StackedBar> = late
        .iter()
        .map(|w| plot::StackedBar {
            label: w.name.clone(),
            segments: w
                .causes
                .iter()
                .map(|c| (c.cause.words(), c.late_pct.unwrap_or(0.0)))
                .collect(),
        })
        .collect();
    let svg = plot::stacked_bars_svg(
        &format!("{}: why jobs were late", r.label),
        "late jobs (% of the workload's jobs)",
        &bars,
        W,
        H,
    )?;
    let segments: usize = bars.iter().map(|b| b.segments.len()).sum();
    let _ = write!(
        page.body,
        "<div class=\"grid\"><figure class=\"plot\" data-series=\"{segments}\">{svg}<figcaption>{}</figcaption></figure></div>",
        escape(&format!(
            "jobs/*.csv of {} attributed by isolane explain: each bar is a workload's late %, \
             split by cause",
            r.label
        ))
    );
    page.figures += 1;
    Ok(())
}

/// summary.json's device telemetry: one row for one GPU, a row per GPU (its first column the
/// GPU) for a run on several.
fn telemetry_table(page: &mut Page, summary: &RunSummary) {
    let per_gpu: Vec<&TelemetrySummary> = match &summary.telemetry {
        Some(t) => vec![t],
        None => summary.telemetry_per_gpu.iter().collect(),
    };
    if per_gpu.is_empty() {
        return;
    }
    let several = summary.telemetry.is_none();
    let mut header: Vec<String> = Vec::new();
    if several {
        header.push("GPU".into());
    }
    header.extend(
        [
            "power mean W",
            "power max W",
            "energy J",
            "SM clock mean MHz",
            "temperature max °C",
            "throttle reasons seen",
            "sampler CPU % of a core",
        ]
        .map(String::from),
    );
    let rows: Vec<Vec<String>> = per_gpu
        .iter()
        .map(|t| {
            let reasons = if t.throttle_reasons.is_empty() {
                "none".to_string()
            } else {
                t.throttle_reasons.join(", ")
            };
            let mut row = Vec::with_capacity(header.len());
            if several {
                row.push(t.gpu.map_or("-".into(), |g| g.to_string()));
            }
            row.extend([
                fmt(t.power_w.map(|s| s.mean), 1),
                fmt(t.power_w.map(|s| s.max), 1),
                fmt(t.energy_j, 1),
                fmt(t.sm_clock_mhz.map(|s| s.mean), 0),
                fmt(t.temperature_c.map(|s| s.max), 0),
                reasons,
                fmt(Some(t.sampler_cpu_pct), 3),
            ]);
            row
        })
        .collect();
    page.table(&header, &rows);
}

/// telemetry.csv's plots over time: one series for one GPU's file, a series per GPU
/// ("GPU n") for a run on several.
fn telemetry_charts(label: &str, t: &TelemetrySeries) -> Vec<Chart> {
    let gpus = t.gpus();
    let mut charts = Vec::new();
    for (col, title, unit) in [
        ("power_w", "power", "power (W)"),
        ("sm_clock_mhz", "SM clock", "SM clock (MHz)"),
        ("temperature_c", "temperature", "temperature (°C)"),
        ("sm_util_pct", "SM utilisation (GPM)", "SM utilisation (%)"),
    ] {
        let mut c = Chart::new(format!("{label}: {title}"), "time since t0 (s)", unit);
        if gpus.is_empty() {
            c = c.series(title, t.points(col));
        } else {
            for &g in &gpus {
                c = c.series(format!("GPU {g}"), t.points_on(col, g));
            }
        }
        c.caption = format!("telemetry.csv of {label}");
        charts.push(c);
    }
    charts
}

/// The run's command workloads (external programs, docs/programs.md): how each ended and what
/// it used; an attributed energy says so in its own column.
fn programs_table(page: &mut Page, r: &RunDir) {
    let rows: Vec<Vec<String>> = r
        .summary
        .workloads
        .iter()
        .filter_map(|w| {
            let p = w.program.as_ref()?;
            let source = match p.energy_source {
                Some(ProgramEnergySource::AttributedBySmShare) => "attributed by SM share",
                None => "-",
            };
            Some(vec![
                w.name.clone(),
                p.command.join(" "),
                crate::programs::ended(w),
                format!("{:.2}", w.wall_s),
                format!("{:.2}", p.cpu_user_s + p.cpu_system_s),
                fmt(p.gpu_share_pct, 1),
                fmt(w.metrics.gpu_memory_mib, 0),
                fmt(p.energy_j, 1),
                source.to_string(),
                format!("{} · {}", p.stdout, p.stderr),
            ])
        })
        .collect();
    if rows.is_empty() {
        return;
    }
    let header = [
        "program",
        "command",
        "ended",
        "wall s",
        "CPU s",
        "GPU share %",
        "peak device MiB",
        "energy J",
        "energy is",
        "output",
    ]
    .map(String::from);
    page.table(&header, &rows);
}

/// A run's apps (docs/apps.md): end to end with paper 004's metrics, each app's mean frame
/// split into its stages' own times and the waiting between them, and the end-to-end CDFs.
fn apps_part(page: &mut Page, r: &RunDir) -> Result<(), String> {
    let apps = &r.summary.apps;
    if apps.is_empty() {
        return Ok(());
    }
    let header: Vec<String> = [
        "app",
        "deadline ms",
        "frames",
        "timeouts %",
        "mean ms",
        "std ms",
        "p95 ms",
        "max ms",
        "tail ms",
        "flatness ms",
    ]
    .map(String::from)
    .to_vec();
    let rows: Vec<Vec<String>> = apps
        .iter()
        .map(|a| {
            let m = &a.end_to_end;
            let l = &m.latency_ms;
            vec![
                a.name.clone(),
                format!("{:.1}", a.deadline_ms),
                m.jobs.to_string(),
                format!("{:.2}", m.timeout_pct),
                fmt(l.mean, 3),
                fmt(l.std, 3),
                fmt(l.p95, 3),
                fmt(l.max, 3),
                fmt(l.tail, 3),
                fmt(l.flatness, 3),
            ]
        })
        .collect();
    page.table(&header, &rows);
    page.table(&stage_header(), &stage_rows(apps));
    let bars: Vec<plot::StackedBar> = apps.iter().map(stage_bar).collect();
    let svg = plot::stacked_bars_svg(
        &format!("{}: mean frame by stage", r.label),
        "mean time (ms)",
        &bars,
        W,
        H,
    )?;
    let segments: usize = bars.iter().map(|b| b.segments.len()).sum();
    let _ = write!(
        page.body,
        "<div class=\"grid\"><figure class=\"plot\" data-series=\"{segments}\">{svg}<figcaption>{}</figcaption></figure>",
        escape(&format!(
            "summary.json apps of {}: each stage's mean own time; waiting = mean end to end − their sum (queueing, hand-offs)",
            r.label
        ))
    );
    page.figures += 1;
    let mut cdf = Chart::new(
        format!("{}: end-to-end latency CDF", r.label),
        "end-to-end latency (ms)",
        "fraction of frames",
    );
    cdf.y_range = Some((0.0, 1.02));
    cdf.legend_lower_right = true;
    cdf.caption = format!(
        "measured frames that reached the sink, apps/*.csv of {}",
        r.label
    );
    for (name, lat) in &r.app_latencies_ms {
        cdf = cdf.series(name.clone(), plot::cdf_points(lat, CDF_POINTS));
    }
    let deadlines: Vec<(&str, Option<f64>)> = r
        .summary
        .apps
        .iter()
        .map(|a| (a.name.as_str(), Some(a.deadline_ms)))
        .collect();
    mark_deadlines(&mut cdf, &deadlines);
    if !cdf.is_empty() {
        let _ = write!(
            page.body,
            "<figure class=\"plot\" data-series=\"{}\">{}<figcaption>{}</figcaption></figure>",
            cdf.series.len(),
            plot::svg(&cdf, W, H)?,
            escape(&cdf.caption)
        );
        page.figures += 1;
    }
    page.body.push_str("</div>");
    Ok(())
}

fn stage_header() -> Vec<String> {
    [
        "app",
        "stage",
        "kind",
        "partition",
        "processed",
        "skipped",
        "mean ms",
        "p95 ms",
        "max ms",
        "made the vote late",
    ]
    .map(String::from)
    .to_vec()
}

/// Per app each stage's own time, and under an ensemble each member's.
fn stage_rows(apps: &[isolane_core::results::AppSummary]) -> Vec<Vec<String>> {
    let mut rows = Vec::new();
    for a in apps {
        for s in &a.stages {
            let l = &s.latency_ms;
            rows.push(vec![
                a.name.clone(),
                s.name.clone(),
                s.kind.clone(),
                s.partition.clone(),
                s.processed.to_string(),
                s.skipped.to_string(),
                fmt(l.mean, 3),
                fmt(l.p95, 3),
                fmt(l.max, 3),
                String::new(),
            ]);
            for m in &s.members {
                let l = &m.latency_ms;
                rows.push(vec![
                    a.name.clone(),
                    m.name.clone(),
                    m.model.clone(),
                    m.partition.clone(),
                    String::new(),
                    String::new(),
                    fmt(l.mean, 3),
                    fmt(l.p95, 3),
                    fmt(l.max, 3),
                    m.made_late.to_string(),
                ]);
            }
        }
    }
    rows
}

/// An app (by name) measured in several runs, e.g. alone and beside others: its end-to-end
/// CDF per run, and each run against the first with the two-sided Mann–Whitney U test of
/// their measured frames (paper 004's comparison).
fn apps_across_runs_section(page: &mut Page, runs: &[&RunDir]) -> Result<(), String> {
    let mut names: Vec<&str> = Vec::new();
    for r in runs {
        for (name, _) in &r.app_latencies_ms {
            if !names.contains(&name.as_str()) {
                names.push(name);
            }
        }
    }
    let in_runs = |name: &str| -> Vec<(&str, &Vec<f64>, Option<f64>)> {
        runs.iter()
            .filter_map(|r| {
                let lat = r.app_latencies_ms.iter().find(|(n, _)| n == name)?;
                let deadline = r.summary.apps.iter().find(|a| a.name == name);
                Some((r.label.as_str(), &lat.1, deadline.map(|a| a.deadline_ms)))
            })
            .collect()
    };
    let compared: Vec<&str> = names.into_iter().filter(|n| in_runs(n).len() > 1).collect();
    if compared.is_empty() {
        return Ok(());
    }
    page.h2(
        "Apps across runs",
        "each app measured in more than one run: end to end per run, and the Mann–Whitney U \
         test of each run against the first (a small p: the distributions differ)",
    );
    let header: Vec<String> = [
        "app",
        "run",
        "frames",
        "mean ms",
        "max ms",
        "U",
        "p vs first",
    ]
    .map(String::from)
    .to_vec();
    let mut rows = Vec::new();
    let mut charts = Vec::new();
    for name in compared {
        let runs = in_runs(name);
        let mut cdf = Chart::new(
            format!("{name}: end-to-end latency CDF per run"),
            "end-to-end latency (ms)",
            "fraction of frames",
        );
        cdf.y_range = Some((0.0, 1.02));
        cdf.legend_lower_right = true;
        cdf.caption = "measured frames that reached the sink, apps/*.csv".into();
        let first = runs[0].1;
        for (label, lat, _) in &runs {
            cdf = cdf.series(label.to_string(), plot::cdf_points(lat, CDF_POINTS));
            let n = lat.len() as f64;
            let mean = (n > 0.0).then(|| lat.iter().sum::<f64>() / n);
            let test = (!std::ptr::eq(*lat, first))
                .then(|| {
                    isolane_core::stats::mann_whitney_u(
                        first,
                        lat,
                        isolane_core::stats::MwMethod::Auto,
                    )
                    .ok()
                })
                .flatten();
            rows.push(vec![
                name.to_string(),
                label.to_string(),
                lat.len().to_string(),
                fmt(mean, 3),
                fmt(lat.last().copied(), 3),
                test.map_or("-".into(), |t| format!("{:.1}", t.u)),
                test.map_or("-".into(), |t| format!("{:.3e}", t.p_value)),
            ]);
        }
        let deadlines: Vec<(&str, Option<f64>)> = runs.iter().map(|r| (r.0, r.2)).collect();
        mark_deadlines(&mut cdf, &deadlines);
        charts.push(cdf);
    }
    page.table(&header, &rows);
    page.figures(charts)?;
    page.end();
    Ok(())
}

/// One app's mean frame: its stages' mean own times, then what is left of the mean end to
/// end (never negative: stages of a DAG that overlap can add up to more than it).
fn stage_bar(a: &isolane_core::results::AppSummary) -> plot::StackedBar {
    let mut segments: Vec<(String, f64)> = a
        .stages
        .iter()
        .filter(|s| s.kind != "sink")
        .map(|s| (s.name.clone(), s.latency_ms.mean.unwrap_or(0.0)))
        .collect();
    let busy: f64 = segments.iter().map(|s| s.1).sum();
    if let Some(mean) = a.end_to_end.latency_ms.mean {
        segments.push(("waiting".to_string(), (mean - busy).max(0.0)));
    }
    plot::StackedBar {
        label: a.name.clone(),
        segments,
    }
}

/// The run's timeline around its worst job (`timeline::window`), one lane per workload.
fn timeline_figure(page: &mut Page, r: &RunDir, w: &crate::timeline::TimelineWindow) {
    let title = format!("{}: timeline around the worst job", r.label);
    let _ = write!(
        page.body,
        "<div class=\"grid\"><figure class=\"plot timeline\" data-series=\"{}\">{}         <figcaption>{:.2}–{:.2} ms of jobs/*.csv of {}; the whole run for Perfetto: isolane          trace</figcaption></figure></div>",
        w.lanes.len(),
        crate::timeline::svg(&title, w),
        w.from_ms,
        w.to_ms,
        escape(&r.label)
    );
    page.figures += 1;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{DeviceInfo, IsolationRow, RunSummary, WorkloadSummary};

    fn workload(name: &str, model: &str) -> WorkloadSummary {
        WorkloadSummary::new(name, model, 1)
    }

    fn iso_run(folder: &str, mechanism: &str, victims: &[(&str, [f64; 2])]) -> RunDir {
        let mut isolation = Vec::new();
        for (step, rate) in [(0u32, 10.0), (1, 20.0)] {
            for (v, pct) in victims {
                isolation.push(IsolationRow {
                    step,
                    interferer_rate_hz: rate,
                    victim: v.to_string(),
                    timeout_pct: pct[step as usize],
                });
            }
        }
        RunDir {
            path: folder.into(),
            label: folder.into(),
            summary: RunSummary {
                wall_s: 1.0,
                workloads: victims
                    .iter()
                    .map(|(v, _)| workload(v, "resnet18"))
                    .collect(),
                ..RunSummary::new("isolation")
            },
            device: DeviceInfo {
                backend: "cuda".into(),
                mechanism: mechanism.into(),
                protection: String::new(),
            },
            latencies_ms: Vec::new(),
            isolation,
            telemetry: None,
            timeline: None,
            app_latencies_ms: Vec::new(),
            explanation: None,
        }
    }

    #[test]
    fn isolation_lines_average_victims_and_split_2_and_4_workload_variants() {
        let a = iso_run("r18-mps", "mps", &[("v", [0.0, 10.0])]);
        let b = iso_run("r18-green", "green", &[("v", [0.0, 2.0])]);
        let c = iso_run(
            "r18-4w",
            "green",
            &[("v1", [0.0, 3.0]), ("v2", [0.0, 6.0]), ("v3", [3.0, 9.0])],
        );
        let d = iso_run("r18-green-64", "green", &[("v", [1.0, 1.0])]);
        let g = isolation_lines(&[&a, &b, &c, &d]);
        let two = &g[&("resnet18".to_string(), 1)];
        let labels: Vec<&str> = two.iter().map(|l| l.label.as_str()).collect();
        assert_eq!(labels, ["mps", "green (r18-green)", "green (r18-green-64)"]);
        assert_eq!(two[0].points, vec![(10.0, 0.0), (20.0, 10.0)]);
        let four = &g[&("resnet18".to_string(), 3)];
        assert_eq!(four[0].label, "green");
        assert_eq!(four[0].points, vec![(10.0, 1.0), (20.0, 6.0)]);
    }

    #[test]
    fn runs_with_best_effort_are_compared_side_by_side() {
        use isolane_core::results::HeldSummary;
        use isolane_core::spec::Criticality;
        let mut protected = iso_run("green-protected", "green", &[("cam", [0.0, 0.0])]);
        let mut be = workload("bg", "vit_l_32");
        be.criticality = Criticality::BestEffort;
        be.metrics.throughput_ips = 250.0;
        be.held = Some(HeldSummary {
            pieces: 12,
            total_ms: 1500.0,
            jobs_held: 10,
            max_ms: 3.0,
        });
        protected.summary.workloads.push(be.clone());
        protected.device.protection = "stretch 1.44".into();
        let mut off = iso_run("green-off", "green", &[("cam", [0.0, 0.0])]);
        off.summary.workloads[0].metrics.timeout_pct = 100.0;
        be.held = None;
        off.summary.workloads.push(be);
        off.device.protection = "off".into();
        let plain = iso_run("no-best-effort", "green", &[("cam", [0.0, 0.0])]);
        let mut page = Page {
            body: String::new(),
            figures: 0,
        };
        criticality_section(&mut page, &[&protected, &off, &plain]);
        let b = &page.body;
        assert!(b.contains("Critical and best-effort workloads"), "{b}");
        assert!(b.contains("stretch 1.44") && b.contains(">off<"), "{b}");
        assert!(
            b.contains("cam 100.00") && b.contains("bg 250.0 · 1.50"),
            "{b}"
        );
        assert!(
            !b.contains("no-best-effort"),
            "a run without best effort: {b}"
        );
    }

    /// Two runs of app `a` (the second slower throughout) and one of app `b`: only `a` is
    /// compared, with the exact U test of 3 against 3 separated values (p = 2/20).
    #[test]
    fn apps_across_runs_are_compared_by_name() {
        let run = |label: &str, apps: Vec<(&str, Vec<f64>)>| {
            let mut r = iso_run(label, "green", &[]);
            r.app_latencies_ms = apps.into_iter().map(|(n, l)| (n.to_string(), l)).collect();
            r
        };
        let alone = run("alone", vec![("a", vec![1.0, 2.0, 3.0]), ("b", vec![1.0])]);
        let shared = run("shared", vec![("a", vec![4.0, 5.0, 6.0])]);
        let mut page = Page {
            body: String::new(),
            figures: 0,
        };
        apps_across_runs_section(&mut page, &[&alone, &shared]).unwrap();
        let b = &page.body;
        assert!(b.contains("Apps across runs"), "{b}");
        assert!(b.contains("1.000e-1"), "{b}");
        assert!(!b.contains("b: end-to-end"), "{b}");
        assert_eq!(page.figures, 1);
        let mut empty = Page {
            body: String::new(),
            figures: 0,
        };
        apps_across_runs_section(&mut empty, &[&alone]).unwrap();
        assert!(empty.body.is_empty());
    }

    fn maxrate(folder: &str, model: &str, rate: f64) -> MaxrateDir {
        let result = serde_json::json!({
            "isolane_version": "0.1.0",
            "model": model,
            "batch": 1,
            "config": {
                "jobs": 100,
                "validations": 1,
                "step": {"relative": 0.1},
                "acceptance": "zero_violations",
                "max_batches": 100
            },
            "max_rate_hz": rate,
            "l_max_ms": 1000.0 / rate,
            "initial_rate_hz": rate,
            "start_lateness_us": {"p50": null, "p99": null, "max": null},
            "trace": []
        });
        MaxrateDir {
            path: folder.into(),
            result: serde_json::from_value(result).unwrap(),
        }
    }

    /// Issue 31: a second search of the same model on the same device overwrote the first.
    #[test]
    fn maxrate_table_keeps_every_search_of_a_cell() {
        let a = maxrate("runs/maxrate", "spin:4ms", 41.887);
        let b = maxrate("runs/maxrate-again", "spin:4ms", 40.0);
        let c = maxrate("runs/other", "spin:2ms", 90.0);
        let mut page = Page {
            body: String::new(),
            figures: 0,
        };
        maxrate_section(&mut page, &[&a, &b, &c]);
        let b = &page.body;
        assert!(
            b.contains(
                "41.9 (L_max 23.87 ms, runs/maxrate); 40.0 (L_max 25.00 ms, runs/maxrate-again)"
            ),
            "{b}"
        );
        // A cell with one search needs no folder.
        assert!(b.contains(">90.0 (L_max 11.11 ms)<"), "{b}");
    }

    #[test]
    fn latency_cdfs_mark_each_deadline() {
        let mut r = iso_run(
            "run",
            "green",
            &[("cam", [0.0, 0.0]), ("lidar", [0.0, 0.0])],
        );
        r.summary.workloads[0].deadline_ms = Some(10.0);
        r.summary.workloads[1].deadline_ms = Some(2000.0);
        r.latencies_ms = vec![
            ("cam".into(), vec![3.0, 4.0, 12.0]),
            ("lidar".into(), vec![5.0, 6.0]),
        ];
        let mut page = Page {
            body: String::new(),
            figures: 0,
        };
        run_section(&mut page, &r).unwrap();
        let b = &page.body;
        // cam's in its colour, lidar's (far beyond every response) in the caption.
        assert!(b.contains("deadline 10.00 ms: cam"), "{b}");
        assert!(b.to_uppercase().contains(&plot::palette_hex()[0]));
        assert!(
            b.contains("deadline 2000 ms: lidar (off the axis: over 10× the slowest response)"),
            "{b}"
        );
        // One deadline shared by every workload is named once, without names.
        r.summary.workloads[1].deadline_ms = Some(10.0);
        let mut page = Page {
            body: String::new(),
            figures: 0,
        };
        run_section(&mut page, &r).unwrap();
        assert!(
            page.body.contains("\ndeadline 10.00 ms\n<"),
            "{}",
            page.body
        );
    }

    #[test]
    fn the_run_says_why_its_jobs_were_late() {
        use crate::explain::{Cause, CauseKind, CauseShare, Explanation, Neighbour};
        use crate::explain::{MemoryFigures, WorkloadExplanation};
        let mut r = iso_run("run", "green", &[("cam", [0.0, 0.0]), ("be", [0.0, 0.0])]);
        let share = |cause: Cause, pct: f64, ms: f64| CauseShare {
            cause,
            late_pct: Some(pct),
            time_ms: ms,
        };
        let workload = |name: &str, late: u64, causes: Vec<CauseShare>| WorkloadExplanation {
            name: name.into(),
            model: "resnet18".into(),
            criticality: isolane_core::spec::Criticality::Critical,
            deadline_ms: Some(1.0),
            jobs: 100,
            late,
            late_pct: late as f64,
            typical_service_ms: Some(0.5),
            typical_from: String::new(),
            busy_pct: None,
            neighbours: vec![
                Neighbour {
                    name: "be".into(),
                    model: "vit_l_32".into(),
                    shares: "GPU 0".into(),
                    memory: Some(MemoryFigures {
                        dram_gb_s: Some(812.5),
                        l2_mib: None,
                        source: None,
                    }),
                },
                Neighbour {
                    name: "x<y>".into(),
                    model: "m".into(),
                    shares: "GPU 0".into(),
                    memory: None,
                },
            ],
            causes,
            late_jobs: Vec::new(),
        };
        r.explanation = Some(Explanation {
            schema_version: 1,
            run: "run".into(),
            memory_profiles: None,
            alone: Vec::new(),
            copy_engine: "not recorded".into(),
            workloads: vec![
                workload(
                    "cam",
                    3,
                    vec![
                        share(Cause::neighbour("be"), 2.0, 4.0),
                        share(Cause::neighbour("x<y>"), 0.5, 1.0),
                        share(Cause::of(CauseKind::Host), 0.5, 0.2),
                    ],
                ),
                workload("be", 0, Vec::new()),
            ],
        });
        let mut page = Page {
            body: String::new(),
            figures: 0,
        };
        run_section(&mut page, &r).unwrap();
        let b = &page.body;
        assert!(b.contains("<h3>Why jobs were late</h3>"), "{b}");
        assert!(b.contains("beside be (DRAM 812.5 GB/s)"), "{b}");
        assert!(
            b.contains("beside x&lt;y&gt; (memory intensity unknown)"),
            "{b}"
        );
        assert!(b.contains("host: late start"), "{b}");
        assert!(b.contains("why jobs were late</text>") || b.contains("why jobs were late"));
        assert!(b.contains("Copy-engine waits: not recorded"), "{b}");
        // No late job anywhere: no such part.
        for w in &mut r.explanation.as_mut().unwrap().workloads {
            w.late = 0;
        }
        let mut page = Page {
            body: String::new(),
            figures: 0,
        };
        run_section(&mut page, &r).unwrap();
        assert!(!page.body.contains("Why jobs were late"), "{}", page.body);
    }

    #[test]
    fn html_escapes_names_from_results() {
        assert_eq!(escape("<a&\"b'>"), "&lt;a&amp;&quot;b&#39;&gt;");
    }
}
