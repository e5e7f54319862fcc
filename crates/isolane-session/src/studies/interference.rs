//! `isolane interference`'s runs (docs/interference.md): precision by precision, the
//! neighbours alone, then victim by victim its capacity, alone and beside each neighbour, each
//! cell an ordinary run into its own folder (`isolane_runtime::interference` builds the cells
//! and fills their entries); interference.json and interference.csv are rewritten after every
//! cell.

use std::path::Path;

use isolane_core::admission::AdmissionOptions;
use isolane_core::results::{interference_csv, CellKind, InterferenceCell, InterferenceIndex};
use isolane_core::spec::Precision;
use isolane_runtime::interference::{self as matrix, Cell, MatrixConfig, References};
use isolane_runtime::output;

use super::{status_word, Failure, RunError, Runs, StudyError, EXIT_FAILED, EXIT_INTERRUPTED};

/// Runs the matrix into `out` (checked by [`check`] before `out` was made); returns the exit
/// code (0, 1: a cell failed, 130: interrupted) and the index as written.
pub fn run(
    c: &MatrixConfig,
    out: &Path,
    runs: &dyn Runs,
    version: &str,
) -> Result<(u8, InterferenceIndex), StudyError> {
    let mut index = c.index(version);
    let runner = Runner { out, runs };
    let code = run_matrix(c, &runner, &mut index)?;
    write_index(out, &index)?;
    Ok((code, index))
}

/// Every cell's scenario is validated and, on a GPU, admitted before anything runs (the
/// rates are not known yet; admission does not depend on them), so a mistake runs nothing.
pub fn check(c: &MatrixConfig, runs: &dyn Runs) -> Result<(), StudyError> {
    let models = runs.models();
    let mut cells = c.capacity_cells();
    for (v, p) in c.each_victim() {
        cells.extend(c.rated_cells(v, p, 1.0));
    }
    for &p in &c.precisions {
        cells.extend(c.neighbour_cells(p));
    }
    // Each model is read once, however many cells it is in: a file's validity does not
    // depend on its neighbour or partition size.
    let mut read = std::collections::HashSet::new();
    for cell in &cells {
        let name = format!("interference cell {}", cell.entry.dir);
        cell.scenario
            .validate(&models)
            .map_err(|e| Failure::user(format!("{name}: {e}")))?;
        runs.admit(&cell.scenario, &name, &AdmissionOptions::default())?;
        let keys: Vec<String> = (cell.scenario.workloads.iter())
            .map(|w| format!("{}|{:?}|{}", w.model, w.precision, w.batch))
            .collect();
        if keys.into_iter().filter(|k| read.insert(k.clone())).count() > 0 {
            runs.preflight(&cell.scenario, &name)?;
        }
    }
    Ok(())
}

/// What every cell's run needs.
struct Runner<'a> {
    out: &'a Path,
    runs: &'a dyn Runs,
}

/// Runs precision by precision: the neighbours alone (if asked for), then victim by victim its
/// capacity, alone and pair cells. Returns the exit code.
fn run_matrix(
    c: &MatrixConfig,
    runner: &Runner<'_>,
    index: &mut InterferenceIndex,
) -> Result<u8, StudyError> {
    let mut code = 0u8;
    for &p in &c.precisions {
        for cell in c.neighbour_cells(p) {
            let entry = runner.run_cell(&cell, References::default(), index)?;
            code = code.max(cell_code(&entry));
            if code == EXIT_INTERRUPTED {
                return Ok(code);
            }
        }
        for (vi, victim) in c.victims.iter().enumerate() {
            code = code.max(run_victim(c, runner, index, (vi, victim), p)?);
            if code == EXIT_INTERRUPTED {
                return Ok(code);
            }
        }
    }
    Ok(code)
}

/// A cell's contribution to the exit code: 0 ok, 130 interrupted, 1 otherwise.
fn cell_code(entry: &InterferenceCell) -> u8 {
    match entry.status.as_str() {
        "ok" => 0,
        "interrupted" => EXIT_INTERRUPTED,
        _ => EXIT_FAILED,
    }
}

/// One victim at one precision: its capacity (for a load fraction), then alone and beside each
/// neighbour at the rate that gives.
fn run_victim(
    c: &MatrixConfig,
    runner: &Runner<'_>,
    index: &mut InterferenceIndex,
    v: (usize, &str),
    p: Precision,
) -> Result<u8, StudyError> {
    let mut jobs_per_s = None;
    if let Some(cell) = c.capacity_cell(v, p) {
        let entry = runner.run_cell(&cell, References::default(), index)?;
        if entry.status == "interrupted" {
            return Ok(EXIT_INTERRUPTED);
        }
        jobs_per_s = entry.victim_jobs_per_s;
    }
    let Some(rate_hz) = c.victim_rate_hz(jobs_per_s) else {
        runner.runs.say(&format!(
            "interference: no capacity measured for {}; its cells are skipped",
            v.1
        ));
        return Ok(EXIT_FAILED);
    };
    let mut code = 0u8;
    let mut alone: Option<InterferenceCell> = None;
    for cell in c.rated_cells(v, p, rate_hz) {
        let neighbour = matrix::neighbour_reference(&index.cells, &cell.entry).cloned();
        let refs = References {
            alone: alone.as_ref(),
            neighbour_alone: neighbour.as_ref(),
        };
        let entry = runner.run_cell(&cell, refs, index)?;
        code = code.max(cell_code(&entry));
        if code == EXIT_INTERRUPTED {
            break;
        }
        if entry.kind == CellKind::Alone {
            alone = Some(entry);
        }
    }
    Ok(code)
}

impl Runner<'_> {
    /// Runs one cell into its folder, fills its entry, appends it to the index and rewrites
    /// the index files (a matrix cut short keeps every cell that ran).
    fn run_cell(
        &self,
        cell: &Cell,
        refs: References<'_>,
        index: &mut InterferenceIndex,
    ) -> Result<InterferenceCell, StudyError> {
        let mut entry = cell.entry.clone();
        self.runs.say(&format!(
            "interference cell {}: {}",
            index.cells.len() + 1,
            entry.dir
        ));
        let name = format!("interference cell {}", cell.entry.dir);
        let dir = self.out.join(&cell.entry.dir);
        let options = AdmissionOptions::default();
        match self
            .runs
            .measure("interference", &cell.scenario, &name, &dir, &options)
        {
            Ok(m) => {
                entry.status = status_word(m.summary.status).into();
                matrix::fill_cell(&mut entry, &m.result, &m.summary, refs);
            }
            // The cell was measured but its folder could not be written: the matrix stops.
            Err(RunError::Writing(e)) => return Err(e.into()),
            Err(RunError::Measuring(e)) => {
                self.runs
                    .say(&format!("interference cell {}: {e}", entry.dir));
                entry.status = "error".into();
                entry.error = Some(e.text);
            }
        }
        index.cells.push(entry.clone());
        write_index(self.out, index)?;
        Ok(entry)
    }
}

fn write_index(out: &Path, index: &InterferenceIndex) -> Result<(), StudyError> {
    isolane_core::results::write_json(&out.join("interference.json"), index)?;
    output::write_atomic(
        &out.join("interference.csv"),
        interference_csv(&index.cells).as_bytes(),
    )?;
    Ok(())
}
