//! The interference matrix as a terminal table (`isolane interference`) and as the grid the
//! report's heatmap draws (victim × neighbour, p99 stretch).

use isolane_core::results::{CellKind, InterferenceCell};

use crate::{ms, num, plain_table, wide_table};

/// One row per cell. The short set (80 columns): the victim and its precision, the
/// neighbour and its size, the victim's p50/p99 execution time, their stretch over alone and
/// the timeout %. `wide` adds the status, the rate, the alone reference, the neighbour's
/// jobs/s (and alone, with `--neighbour-alone`), achieved GB/s of kernel models and the GPM
/// activity.
pub fn interference_table(cells: &[InterferenceCell], wide: bool) -> String {
    let mut header = vec![
        "victim",
        "neighbour",
        "p50 ms",
        "p99 ms",
        "×p50",
        "×p99",
        "miss %",
    ];
    if wide {
        header.extend(["status", "rate Hz", "alone p50", "alone p99"]);
        header.extend(NEIGHBOUR_COLUMNS);
    }
    let rows: Vec<Vec<String>> = cells.iter().map(|c| row(c, wide)).collect();
    if wide {
        wide_table(&header, &rows, &[0, 1, 7])
    } else {
        plain_table(&header, &rows, &[0, 1])
    }
}

fn row(c: &InterferenceCell, wide: bool) -> Vec<String> {
    let mut r = vec![
        victim_label(c),
        neighbour_label(c),
        ms(c.exec_ms.p50),
        ms(c.exec_ms.p99),
        num(c.stretch_p50, 2),
        num(c.stretch_p99, 2),
        format!("{:.2}", c.timeout_pct),
    ];
    if wide {
        r.extend([
            c.status.clone(),
            num(c.victim_rate_hz, 1),
            ms(c.alone_p50_ms),
            ms(c.alone_p99_ms),
        ]);
        r.extend(neighbour_cells(c));
    }
    r
}

/// The headers of [`neighbour_cells`].
pub const NEIGHBOUR_COLUMNS: [&str; 6] = [
    "nb jobs/s",
    "nb alone/s",
    "nb GB/s",
    "DRAM %",
    "SM %",
    "tensor %",
];

/// The neighbour's side of a cell, in the wide table and the report alike: its jobs/s with
/// the victim and alone, its achieved GB/s, and the GPM activity.
pub fn neighbour_cells(c: &InterferenceCell) -> [String; 6] {
    [
        num(c.neighbour_jobs_per_s, 1),
        num(c.neighbour_alone_jobs_per_s, 1),
        num(c.neighbour_gb_per_s, 1),
        num(c.dram_bw_util_pct, 1),
        num(c.sm_util_pct, 1),
        num(c.tensor_util_pct, 1),
    ]
}

/// `model precision` (`- precision` in a neighbour's own cell, which has no victim).
pub fn victim_label(c: &InterferenceCell) -> String {
    match c.kind {
        CellKind::Neighbour => format!("- {}", c.precision),
        _ => format!("{} {}", c.victim, c.precision),
    }
}

/// A pair's `model @size` (the size in the matrix's unit; the model alone where nothing is
/// partitioned); the victim's own cells say what they are: at its rate, and closed loop.
pub fn neighbour_label(c: &InterferenceCell) -> String {
    let model = c.neighbour.as_deref().unwrap_or("");
    match (c.kind, c.neighbour_size) {
        (CellKind::Pair, Some(s)) => format!("{model} @{s}"),
        (CellKind::Pair, None) => model.to_string(),
        (CellKind::Neighbour, Some(s)) => format!("{model} @{s} (alone, max)"),
        (CellKind::Neighbour, None) => format!("{model} (alone, max)"),
        (CellKind::Alone, _) => "(alone)".into(),
        (CellKind::Capacity, _) => "(alone, max)".into(),
    }
}

/// A heatmap's grid: rows are victims (with precision), columns neighbours (with size), each
/// value the p99 stretch of that pair (`None` where it did not run or has no alone reference).
#[derive(Debug, Clone, PartialEq)]
pub struct StretchGrid {
    pub rows: Vec<String>,
    pub columns: Vec<String>,
    pub values: Vec<Vec<Option<f64>>>,
}

/// The pairs of `cells` as a [`StretchGrid`], in the order they first appear.
pub fn stretch_grid(cells: &[InterferenceCell]) -> StretchGrid {
    let pairs: Vec<&InterferenceCell> = cells.iter().filter(|c| c.kind == CellKind::Pair).collect();
    let row_of = victim_label;
    let col_of = neighbour_label;
    let mut rows: Vec<String> = Vec::new();
    let mut columns: Vec<String> = Vec::new();
    for c in &pairs {
        for (list, key) in [(&mut rows, row_of(c)), (&mut columns, col_of(c))] {
            if !list.contains(&key) {
                list.push(key);
            }
        }
    }
    let mut values = vec![vec![None; columns.len()]; rows.len()];
    for c in pairs {
        let (Some(i), Some(j)) = (
            rows.iter().position(|r| *r == row_of(c)),
            columns.iter().position(|k| *k == col_of(c)),
        ) else {
            continue;
        };
        values[i][j] = c.stretch_p99;
    }
    StretchGrid {
        rows,
        columns,
        values,
    }
}

/// Stretch at which a cell is full red: the colour scale spans 1.0 (white) to this.
const RED_AT: f64 = 2.0;

/// The heatmap as inline SVG: one square per (victim, neighbour) coloured by its p99 stretch
/// from white (1.0, undisturbed) to red ([`RED_AT`] × or more), the value written in it; grey
/// with `-` where the pair has no value.
pub fn heatmap_svg(g: &StretchGrid) -> String {
    heatmap_svg_captioned(
        g,
        "victim p99 execution time beside the neighbour over alone (white 1.00, red 2.00 or \
         more)",
    )
}

/// [`heatmap_svg`] of any grid of ratios on the same scale (white 1.0, red 2.0), with its own
/// caption (`isolane coexec` draws its speedups with it).
pub fn heatmap_svg_captioned(g: &StretchGrid, caption: &str) -> String {
    use std::fmt::Write as _;
    const CELL_W: usize = 96;
    const CELL_H: usize = 34;
    let label_w = 8 * g.rows.iter().map(|r| r.chars().count()).max().unwrap_or(0) + 12;
    // Column labels are rotated 35°: about 0.6 of their length rises above the cells and 0.8
    // reaches right of their column.
    let longest = 7 * g
        .columns
        .iter()
        .map(|c| c.chars().count())
        .max()
        .unwrap_or(0);
    let head_h = longest * 6 / 10 + 20;
    let (w, h) = (
        label_w + CELL_W * g.columns.len() + longest * 8 / 10 + 10,
        head_h + CELL_H * g.rows.len() + 10,
    );
    let mut out = format!(
        "<figure class=\"plot heatmap\"><svg xmlns=\"http://www.w3.org/2000/svg\" \
         width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">"
    );
    for (j, c) in g.columns.iter().enumerate() {
        let x = label_w + CELL_W * j + CELL_W / 2;
        let _ = write!(
            out,
            "<text transform=\"translate({x},{}) rotate(-35)\">{}</text>",
            head_h - 6,
            crate::html::escape(c)
        );
    }
    for (i, r) in g.rows.iter().enumerate() {
        let y = head_h + CELL_H * i;
        let _ = write!(
            out,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>",
            label_w - 8,
            y + CELL_H / 2 + 4,
            crate::html::escape(r)
        );
        for (j, v) in g.values[i].iter().enumerate() {
            let x = label_w + CELL_W * j;
            let (fill, text) = match v {
                Some(s) if s.is_finite() => (stretch_colour(*s), format!("{s:.2}")),
                _ => ("#e8e8e8".to_string(), "-".to_string()),
            };
            // White figures where the red is dark enough to hide black ones.
            let ink = match v {
                Some(s) if *s >= 1.0 + 0.6 * (RED_AT - 1.0) => "#fff",
                _ => "#000",
            };
            let _ = write!(
                out,
                "<rect x=\"{x}\" y=\"{y}\" width=\"{CELL_W}\" height=\"{CELL_H}\" \
                 fill=\"{fill}\" stroke=\"#fff\"/><text x=\"{}\" y=\"{}\" \
                 text-anchor=\"middle\" fill=\"{ink}\">{text}</text>",
                x + CELL_W / 2,
                y + CELL_H / 2 + 4
            );
        }
    }
    let _ = write!(
        out,
        "</svg><figcaption>{}</figcaption></figure>",
        crate::html::escape(caption)
    );
    out
}

/// White at 1.0 (or below: a victim that got faster) to red at [`RED_AT`].
fn stretch_colour(s: f64) -> String {
    let t = ((s - 1.0) / (RED_AT - 1.0)).clamp(0.0, 1.0);
    let lerp = |a: f64, b: f64| (a + (b - a) * t).round() as u8;
    format!(
        "#{:02x}{:02x}{:02x}",
        lerp(255.0, 215.0),
        lerp(255.0, 25.0),
        lerp(255.0, 28.0)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(v: &str, n: &str, size: Option<u32>, s: f64) -> InterferenceCell {
        let mut c = InterferenceCell::pending("d".into(), CellKind::Pair, v, "fp16");
        c.neighbour = Some(n.into());
        c.neighbour_size = size;
        c.stretch_p99 = Some(s);
        c
    }

    #[test]
    fn the_grid_is_victim_by_neighbour() {
        let cells = vec![
            InterferenceCell::pending("a".into(), CellKind::Alone, "a", "fp16"),
            pair("a", "x", Some(48), 1.1),
            pair("a", "x", Some(80), 1.4),
            pair("b", "x", Some(80), 2.0),
        ];
        let g = stretch_grid(&cells);
        assert_eq!(g.rows, ["a fp16", "b fp16"]);
        assert_eq!(g.columns, ["x @48", "x @80"]);
        assert_eq!(g.values, [[Some(1.1), Some(1.4)], [None, Some(2.0)]]);
    }

    #[test]
    fn the_heatmap_colours_by_stretch_and_marks_missing_pairs() {
        assert_eq!(stretch_colour(1.0), "#ffffff");
        assert_eq!(stretch_colour(0.9), "#ffffff");
        assert_eq!(stretch_colour(3.0), "#d7191c");
        let g = StretchGrid {
            rows: vec!["a <fp16>".into()],
            columns: vec!["x @48".into(), "y".into()],
            values: vec![vec![Some(1.5), None]],
        };
        let svg = heatmap_svg(&g);
        assert_eq!(svg.matches("<rect").count(), 2);
        assert!(svg.contains(">1.50<"));
        assert!(svg.contains(&stretch_colour(1.5)));
        assert!(svg.contains("#e8e8e8"));
        assert!(svg.contains("a &lt;fp16&gt;"), "labels are escaped");
    }

    #[test]
    fn the_short_table_fits_80_columns() {
        let mut cells = vec![pair("vit_b_16", "kernel:triad:256MiB", Some(80), 1.37)];
        cells[0].exec_ms.p50 = Some(1.341);
        cells[0].exec_ms.p99 = Some(1.9);
        let t = interference_table(&cells, false);
        assert!(t.lines().all(|l| l.chars().count() <= 80), "{t}");
        assert!(t.contains("1.37"));
        assert!(interference_table(&cells, true).contains("tensor %"));
    }
}
