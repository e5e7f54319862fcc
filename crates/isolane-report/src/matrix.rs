//! The interference matrix as a terminal table (`isolane interference`) and as the grid the
//! report's heatmap draws (victim × neighbour, p99 stretch).

use isolane_core::results::{CellKind, InterferenceCell};

use crate::{ms, num, plain_table, wide_table};

/// One row per cell. The short set (80 columns): the victim and its precision, the
/// neighbour and its size, the victim's p50/p99 execution time, their stretch over alone and
/// the timeout %. `wide` adds the status, the rate, the alone reference, the neighbour's
/// jobs/s, achieved GB/s of kernel models and the GPM activity.
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
        header.extend([
            "status",
            "rate Hz",
            "alone p50",
            "alone p99",
            "nb jobs/s",
            "nb GB/s",
            "DRAM %",
            "SM %",
            "tensor %",
        ]);
    }
    let rows: Vec<Vec<String>> = cells.iter().map(|c| row(c, wide)).collect();
    if wide {
        wide_table(&header, &rows, &[0, 1, 7])
    } else {
        plain_table(&header, &rows, &[0, 1])
    }
}

fn row(c: &InterferenceCell, wide: bool) -> Vec<String> {
    let neighbour = match c.kind {
        CellKind::Pair => neighbour_label(c),
        // The victim's own cells: at its rate, and closed loop (its capacity).
        CellKind::Alone => "(alone)".into(),
        CellKind::Capacity => "(alone, max)".into(),
    };
    let mut r = vec![
        format!("{} {}", c.victim, c.precision),
        neighbour,
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
            num(c.neighbour_jobs_per_s, 1),
            num(c.neighbour_gb_per_s, 1),
            num(c.dram_bw_util_pct, 1),
            num(c.sm_util_pct, 1),
            num(c.tensor_util_pct, 1),
        ]);
    }
    r
}

/// `model @size` (the size in the matrix's unit), or the model where nothing is partitioned.
fn neighbour_label(c: &InterferenceCell) -> String {
    let model = c.neighbour.as_deref().unwrap_or("");
    match c.neighbour_size {
        Some(s) => format!("{model} @{s}"),
        None => model.to_string(),
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
    let row_of = |c: &InterferenceCell| format!("{} {}", c.victim, c.precision);
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
