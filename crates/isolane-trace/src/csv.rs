//! The results folder's CSV files (jobs/*.csv, telemetry.csv) read by column name, so that a
//! column added later (`held_ms`) or one this reader does not know is no error. A bad cell is
//! named by file, line and column.

use std::path::{Path, PathBuf};

use isolane_core::files::FileError;

use crate::TraceError;

/// A CSV with a header: rows of cells, found by column name.
pub struct Csv {
    pub path: PathBuf,
    header: Vec<String>,
    /// (line number, cells); blank lines left out.
    pub rows: Vec<(usize, Vec<String>)>,
    /// The file does not end with a newline: its last row may be cut off (a run killed, or
    /// out of disk space, while it wrote the row).
    cut_off: bool,
}

impl Csv {
    /// Reads `path`; every column of `required` must be in its header.
    pub fn read(path: &Path, required: &[&str]) -> Result<Csv, TraceError> {
        let text = isolane_core::files::read_text(path)?;
        let mut lines = text.lines().enumerate();
        let header: Vec<String> = match lines.next() {
            Some((_, h)) => h.split(',').map(|s| s.trim().to_string()).collect(),
            None => Vec::new(),
        };
        let csv = Csv {
            path: path.to_path_buf(),
            header,
            rows: Vec::new(),
            cut_off: !text.is_empty() && !text.ends_with('\n'),
        };
        if let Some(missing) = required.iter().find(|r| csv.col(r).is_none()) {
            return Err(csv.error(1, format!("the header has no `{missing}` column")));
        }
        let rows = lines
            .filter(|(_, l)| !l.trim().is_empty())
            .map(|(i, l)| (i + 1, l.split(',').map(|s| s.trim().to_string()).collect()))
            .collect();
        Ok(Csv { rows, ..csv })
    }

    /// Every row parsed by `parse`, leaving out a last row that a killed run cut off: one that
    /// does not parse in a file that does not end with a newline, as `isolane summarize`
    /// leaves it out when it rebuilds summary.json (isolane-runtime's
    /// `read_jobs_csv_partial`). A bad row anywhere else is `parse`'s error.
    pub fn parse_rows<T>(
        &self,
        mut parse: impl FnMut(usize, &[String]) -> Result<T, TraceError>,
    ) -> Result<Vec<T>, TraceError> {
        let mut out = Vec::with_capacity(self.rows.len());
        for (i, (line, row)) in self.rows.iter().enumerate() {
            match parse(*line, row) {
                Ok(v) => out.push(v),
                Err(_) if self.cut_off && i + 1 == self.rows.len() => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    pub fn header(&self) -> &[String] {
        &self.header
    }

    pub fn col(&self, name: &str) -> Option<usize> {
        self.header.iter().position(|h| h == name)
    }

    pub fn error(&self, line: usize, detail: String) -> TraceError {
        FileError::parse(&self.path, format!("line {line}: {detail}")).into()
    }

    /// The number in column `i` of a row, `None` for an empty (or absent) cell.
    pub fn f64_at(
        &self,
        line: usize,
        row: &[String],
        i: Option<usize>,
    ) -> Result<Option<f64>, TraceError> {
        let Some(i) = i else { return Ok(None) };
        match row.get(i).map(String::as_str) {
            None | Some("") => Ok(None),
            Some(s) => s.parse::<f64>().map(Some).map_err(|_| {
                self.error(
                    line,
                    format!("column `{}`: `{s}` is not a number", self.header[i]),
                )
            }),
        }
    }

    /// Like [`Csv::f64_at`] for a time, which must be finite: the release loop never writes NaN
    /// or an infinity into jobs/*.csv, and such a time would place nothing. (telemetry.csv may
    /// hold NaN, a metric NVML could not compute: a gap, read by [`Csv::f64_at`].)
    pub fn time_at(
        &self,
        line: usize,
        row: &[String],
        i: Option<usize>,
    ) -> Result<Option<f64>, TraceError> {
        match self.f64_at(line, row, i)? {
            Some(v) if !v.is_finite() => Err(self.error(
                line,
                format!(
                    "column `{}`: `{}` is not a finite number",
                    i.map_or("", |i| self.header[i].as_str()),
                    i.and_then(|i| row.get(i)).map_or("", String::as_str)
                ),
            )),
            v => Ok(v),
        }
    }

    /// Like [`Csv::f64_at`] for a column that every row must fill.
    pub fn required_f64(&self, line: usize, row: &[String], i: usize) -> Result<f64, TraceError> {
        self.f64_at(line, row, Some(i))?
            .ok_or_else(|| self.error(line, format!("column `{}` is empty", self.header[i])))
    }
}
