//! The co-execution study (`isolane coexec`, docs/coexec.md) as a terminal table and as a
//! report section: a heatmap of each pair's speedup per mechanism and bars of each job's
//! slowdown.

use std::fmt::Write as _;

use isolane_core::results::{CoexecCell, CoexecIndex, CoexecJob};

use crate::data::CoexecDir;
use crate::html::{escape, Page};
use crate::matrix::{heatmap_svg_captioned, StretchGrid};
use crate::num;

const SHORT: [&str; 6] = ["pair", "mechanism", "speedup", "slow a", "slow b", "status"];
const WIDE: [&str; 7] = [
    "class",
    "makespan ms",
    "seq ms",
    "a ms",
    "b ms",
    "energy J",
    "E/seq",
];

/// A pair in words: `a + b`.
pub fn pair_label(c: &CoexecCell) -> String {
    format!("{} + {}", c.a, c.b)
}

/// One row per cell; `--wide` adds the pair's class, the makespans, each job's time and the
/// energy.
pub fn coexec_table(cells: &[CoexecCell], wide: bool) -> String {
    let mut header: Vec<&str> = SHORT.to_vec();
    if wide {
        header.extend(WIDE);
    }
    let rows: Vec<Vec<String>> = cells.iter().map(|c| row(c, wide)).collect();
    if wide {
        crate::wide_table(&header, &rows, &[0, 1, 5, 6])
    } else {
        crate::plain_table(&header, &rows, &[0, 1, 5])
    }
}

fn row(c: &CoexecCell, wide: bool) -> Vec<String> {
    let m = &c.m;
    let mut r = vec![
        pair_label(c),
        c.mechanism.clone(),
        num(m.speedup, 2),
        num(m.slowdown_a, 2),
        num(m.slowdown_b, 2),
        c.status.clone(),
    ];
    if wide {
        r.extend([
            c.class.word().into(),
            in_ms(m.makespan_s),
            in_ms(m.sequential_s),
            in_ms(m.wall_a_s),
            in_ms(m.wall_b_s),
            num(m.energy_j, 1),
            num(m.energy_vs_sequential, 2),
        ]);
    }
    r
}

const JOB_COLUMNS: [&str; 6] = [
    "job",
    "alone ms",
    "energy J",
    "DRAM %",
    "intensity",
    "status",
];

fn job_row(j: &CoexecJob) -> Vec<String> {
    vec![
        j.name.clone(),
        in_ms(j.wall_s),
        num(j.energy_j, 1),
        num(j.dram_bw_util_pct, 1),
        j.intensity.word().into(),
        j.status.clone(),
    ]
}

/// Each job alone: its wall time, energy, DRAM use and the intensity it was classed with.
pub fn coexec_jobs_table(jobs: &[CoexecJob]) -> String {
    let rows: Vec<Vec<String>> = jobs.iter().map(job_row).collect();
    crate::plain_table(&JOB_COLUMNS, &rows, &[0, 4, 5])
}

/// Seconds shown as ms with three significant decimals at most (a CPU job may take 0.3 ms).
fn in_ms(s: Option<f64>) -> String {
    crate::ms(s.map(|s| s * 1e3))
}

/// Rows: pairs; columns: the mechanisms that ran; values: the speedup over sequential.
pub fn speedup_grid(cells: &[CoexecCell]) -> StretchGrid {
    let concurrent: Vec<&CoexecCell> = cells
        .iter()
        .filter(|c| c.mechanism != "sequential" && c.status != "skipped")
        .collect();
    let mut rows: Vec<String> = Vec::new();
    let mut columns: Vec<String> = Vec::new();
    for c in &concurrent {
        for (list, key) in [
            (&mut rows, pair_label(c)),
            (&mut columns, c.mechanism.clone()),
        ] {
            if !list.contains(&key) {
                list.push(key);
            }
        }
    }
    let mut values = vec![vec![None; columns.len()]; rows.len()];
    for c in concurrent {
        let i = rows.iter().position(|r| *r == pair_label(c));
        let j = columns.iter().position(|k| *k == c.mechanism);
        if let (Some(i), Some(j)) = (i, j) {
            values[i][j] = c.m.speedup;
        }
    }
    StretchGrid {
        rows,
        columns,
        values,
    }
}

/// Largest slowdown the bars' axis shows; longer bars are cut there, their value written.
const BARS_MAX: f64 = 4.0;

/// Horizontal bars of each job's slowdown in each concurrent cell that has one, with a line
/// at 1.0 (as fast as alone).
pub fn slowdown_bars_svg(cells: &[CoexecCell]) -> String {
    let bars: Vec<(String, f64)> = cells
        .iter()
        .filter(|c| c.mechanism != "sequential")
        .flat_map(|c| {
            [(&c.a, c.m.slowdown_a), (&c.b, c.m.slowdown_b)]
                .into_iter()
                .filter_map(move |(job, s)| {
                    s.map(|s| {
                        (
                            format!("{job} ({} beside, {})", other(c, job), c.mechanism),
                            s,
                        )
                    })
                })
        })
        .collect();
    if bars.is_empty() {
        return String::new();
    }
    const BAR_H: usize = 18;
    const PLOT_W: f64 = 360.0;
    let label_w = 7 * bars.iter().map(|b| b.0.chars().count()).max().unwrap_or(0) + 12;
    let top = 20;
    let (w, h) = (
        label_w + PLOT_W as usize + 60,
        top + BAR_H * bars.len() + 10,
    );
    let x_of = |s: f64| label_w as f64 + PLOT_W * s.clamp(0.0, BARS_MAX) / BARS_MAX;
    let mut out = format!(
        "<figure class=\"plot bars\"><svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" \
         height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">"
    );
    for (i, (label, s)) in bars.iter().enumerate() {
        let y = top + BAR_H * i;
        let _ = write!(
            out,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text><rect x=\"{label_w}\" \
             y=\"{}\" width=\"{:.1}\" height=\"{}\" fill=\"#4878a8\"/><text x=\"{:.1}\" \
             y=\"{}\">{s:.2}</text>",
            label_w - 6,
            y + 13,
            escape(label),
            y + 2,
            x_of(*s) - label_w as f64,
            BAR_H - 4,
            x_of(*s) + 4.0,
            y + 13
        );
    }
    let one = x_of(1.0);
    let _ = write!(
        out,
        "<line x1=\"{one:.1}\" y1=\"{}\" x2=\"{one:.1}\" y2=\"{}\" stroke=\"#c00\"/>\
         <text x=\"{one:.1}\" y=\"12\" text-anchor=\"middle\">1.0</text></svg><figcaption>each \
         job's wall time at once over its wall time alone (red line: as fast as alone; the \
         axis ends at {BARS_MAX:.0}×)</figcaption></figure>",
        top - 4,
        h - 6
    );
    out
}

fn other<'a>(c: &'a CoexecCell, job: &str) -> &'a str {
    if c.a == job {
        &c.b
    } else {
        &c.a
    }
}

/// The report's section of one study.
pub(crate) fn section(page: &mut Page, d: &CoexecDir) {
    let i: &CoexecIndex = &d.index;
    let energy = i.energy_note.clone().unwrap_or_default();
    page.h2(
        &format!("Co-execution: {} ({})", d.label, i.backend),
        &format!(
            "Each pair of jobs (fixed work) alone, one after the other and at once under each \
             mechanism. Speedup = sequential makespan / concurrent makespan (2.00: the two \
             overlap completely; below 1.00: worse than one after the other). Slowdown = a \
             job's wall time at once over alone. Classes: memory-bound at >= {} % DRAM \
             bandwidth alone or < {} FLOP/byte. {energy}",
            i.thresholds.dram_bw_util_pct, i.thresholds.flop_per_byte
        ),
    );
    let grid = speedup_grid(&i.cells);
    if !grid.rows.is_empty() {
        page.body.push_str(&heatmap_svg_captioned(
            &grid,
            "speedup of running the pair at once over one after the other (white 1.00 or \
             less: no gain; red 2.00: full overlap)",
        ));
        page.figures += 1;
    }
    let bars = slowdown_bars_svg(&i.cells);
    if !bars.is_empty() {
        page.body.push_str(&bars);
        page.figures += 1;
    }
    let job_header: Vec<String> = JOB_COLUMNS.iter().map(|s| s.to_string()).collect();
    let job_rows: Vec<Vec<String>> = i.jobs.iter().map(job_row).collect();
    page.table(&job_header, &job_rows);
    let header: Vec<String> = SHORT
        .iter()
        .chain(WIDE.iter())
        .chain(["reason"].iter())
        .map(|s| s.to_string())
        .collect();
    let rows: Vec<Vec<String>> = i
        .cells
        .iter()
        .map(|c| {
            let mut r = row(c, true);
            r.push(c.reason.clone().unwrap_or_default());
            r
        })
        .collect();
    page.table(&header, &rows);
    page.end();
}

#[cfg(test)]
mod tests {
    use super::*;
    use isolane_core::results::{CellMetrics, PairClass};

    fn cell(mechanism: &str, speedup: Option<f64>, status: &str) -> CoexecCell {
        CoexecCell {
            a: "triad".into(),
            b: "gemm".into(),
            mechanism: mechanism.into(),
            dir: String::new(),
            status: status.into(),
            reason: None,
            class: PairClass::Mixed,
            partition_a: None,
            partition_b: None,
            m: CellMetrics {
                speedup,
                slowdown_a: speedup.map(|_| 1.5),
                slowdown_b: speedup.map(|_| 1.2),
                ..CellMetrics::default()
            },
        }
    }

    #[test]
    fn the_grid_has_a_column_per_mechanism_that_ran() {
        let cells = [
            cell("sequential", Some(1.0), "ok"),
            cell("mps", Some(1.6), "ok"),
            cell("green", None, "skipped"),
        ];
        let g = speedup_grid(&cells);
        assert_eq!(g.rows, vec!["triad + gemm"]);
        assert_eq!(g.columns, vec!["mps"]);
        assert_eq!(g.values, vec![vec![Some(1.6)]]);
        let svg = slowdown_bars_svg(&cells);
        assert!(svg.contains("triad (gemm beside, mps)") && svg.contains("1.50"));
        assert!(!svg.contains("sequential"));
        let t = coexec_table(&cells, false);
        assert!(t.contains("skipped") && t.contains("1.60"));
        assert!(t.lines().all(|l| l.chars().count() <= 80), "{t}");
        assert!(!t.contains("mixed") && coexec_table(&cells, true).contains("mixed"));
    }

    #[test]
    fn the_jobs_table_says_what_is_not_measured_with_a_dash() {
        let job = CoexecJob {
            name: "triad".into(),
            what: "kernel:triad:1MiB".into(),
            dir: "alone/triad".into(),
            status: "ok".into(),
            error: None,
            wall_s: Some(0.25),
            energy_j: None,
            dram_bw_util_pct: None,
            work: None,
            bytes_total: None,
            intensity: isolane_core::results::Intensity::Memory,
        };
        let t = coexec_jobs_table(&[job]);
        let row = t.lines().find(|l| l.contains("triad")).unwrap();
        assert!(
            row.contains("250.0") && row.contains("memory") && row.contains(" - "),
            "{t}"
        );
    }
}
