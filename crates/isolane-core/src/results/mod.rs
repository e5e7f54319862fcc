//! The results schema: every file isolane writes about a measurement, as typed structs, owned
//! here and nowhere else. Writers (`run`, `isolation`, `maxrate`, `sweep`, telemetry) fill these
//! structs; readers (`report`, `compare`, `summarize`) load them through [`read_json`]. Each
//! JSON file carries `schema_version`; folders written before it existed read as version 1
//! (every field added since has a default), and the committed results/ folders are loaded by a
//! test.
//!
//! | file | type |
//! | --- | --- |
//! | `summary.json` | [`RunSummary`] (run, isolation) |
//! | `maxrate.json` | [`MaxrateReport`] |
//! | `sweep.json` | [`SweepIndex`] |
//! | `interference.json`, `interference.csv` | [`InterferenceIndex`], [`interference_csv`] |
//! | `coexec.json`, `coexec.csv` | [`CoexecIndex`], [`coexec_csv`] |
//! | `isolation.csv` | [`IsolationRow`] rows |
//! | `summary.json`'s `telemetry` and `telemetry_per_gpu` | [`TelemetrySummary`] |
//! | `summary.json`'s `apps` | [`AppSummary`] (docs/apps.md) |

mod app;
mod coexec;
mod interference;
mod isolation;
mod maxrate;
mod program;
mod run;
mod sweep;
mod telemetry;
mod workloads_csv;

pub use app::{
    app_latencies_from_csv, AppSummary, MemberSummary, StageSummary, TransferSummary,
    APP_CSV_COLUMNS,
};
pub use coexec::{
    coexec_csv, CellMetrics, CoexecCell, CoexecIndex, CoexecJob, Intensity, IntensityThresholds,
    PairClass, COEXEC_CSV_HEADER,
};
pub use interference::{
    interference_csv, CellKind, InterferenceCell, InterferenceIndex, INTERFERENCE_CSV_HEADER,
};
pub use isolation::{
    isolation_csv, read_isolation_csv, IsolationRow, IsolationSteps, StepResult, VictimStep,
    ISOLATION_CSV_HEADER,
};
pub use maxrate::{LatenessSummary, MaxrateReport};
pub use program::{ProgramEnd, ProgramEnergySource, ProgramSummary};
pub use run::{CpuSummary, HeldSummary, PartitionRecord, RunStatus, RunSummary, WorkloadSummary};
pub use sweep::{SweepIndex, SweepPoint};
pub use telemetry::{EnergySource, Stat, TelemetrySummary};
pub use workloads_csv::{workloads_csv, WORKLOADS_COLUMNS, WORKLOADS_CSV};

/// A CSV field as RFC 4180 says: quoted where it holds a comma, a quote or a line break (a model
/// may be a path with any of them), its quotes doubled. The one quoting of every CSV isolane
/// writes.
pub fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

use std::path::{Path, PathBuf};

use crate::files::{read_text, FileError};

/// The version of the schema this build writes. 1: the files before `schema_version`
/// existed; 2: `schema_version`, typed `partitions`/`isolation`, per-workload
/// `memory_estimate_mib`; 3: per-workload `backend` and `program` (command workloads,
/// docs/programs.md); 4: `telemetry_per_gpu` (a run on several GPUs: one `telemetry` object
/// per GPU, each with its `gpu`).
pub const SCHEMA_VERSION: u32 = 4;

/// What a file without `schema_version` is.
pub(crate) fn legacy_version() -> u32 {
    1
}

#[derive(Debug, thiserror::Error)]
pub enum ResultsError {
    /// Unreadable, or not the JSON/CSV expected ([`from_json`] names the field, serde_json the
    /// line/column).
    #[error(transparent)]
    File(#[from] FileError),
    #[error(
        "{path}: written by a newer isolane (schema_version {found}; this build reads up to {SCHEMA_VERSION})"
    )]
    Newer { path: PathBuf, found: u32 },
}

impl ResultsError {
    /// As a [`FileError`] that names the file once (a reader that reports file errors wrapped
    /// the whole message, path included, and named it twice).
    pub fn into_file_error(self) -> FileError {
        match self {
            ResultsError::File(f) => f,
            ResultsError::Newer { path, found } => FileError::parse(
                &path,
                format!(
                    "written by a newer isolane (schema_version {found}; this build reads up to \
                     {SCHEMA_VERSION})"
                ),
            ),
        }
    }
}

/// A results file of any kind: it says which schema version wrote it.
pub trait Versioned {
    fn schema_version(&self) -> u32;
}

/// Reads one results file, refusing one written by a newer schema rather than misreading it.
pub fn read_json<T: serde::de::DeserializeOwned + Versioned>(
    path: &Path,
) -> Result<T, ResultsError> {
    let text = read_text(path)?;
    let value: T = from_json(&text).map_err(|e| FileError::parse(path, e))?;
    if value.schema_version() > SCHEMA_VERSION {
        return Err(ResultsError::Newer {
            path: path.to_path_buf(),
            found: value.schema_version(),
        });
    }
    Ok(value)
}

/// `text` parsed as a `T`, or why not, starting with the field where it went wrong
/// (`workloads[0].jobs: invalid value: integer `-5`, expected u64 at line 1 column 876`):
/// serde_json alone says only the line and column, and a summary is often one line.
pub fn from_json<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, String> {
    let mut de = serde_json::Deserializer::from_str(text);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let field = e.path().to_string();
        if field == "." {
            e.into_inner().to_string()
        } else {
            format!("{field}: {}", e.into_inner())
        }
    })?;
    // Trailing characters after the value are an error, as serde_json::from_str has it.
    de.end().map_err(|e| e.to_string())?;
    Ok(value)
}

/// Writes a results file atomically (temp + rename), pretty-printed with a final newline.
pub fn write_json<T: serde::Serialize>(path: &Path, value: &T) -> Result<(), ResultsError> {
    let mut bytes = serde_json::to_vec_pretty(value).map_err(|e| FileError::io(path, e.into()))?;
    bytes.push(b'\n');
    crate::files::write_atomic(path, &bytes).map_err(|source| FileError::io(path, source).into())
}

#[cfg(test)]
mod tests;
