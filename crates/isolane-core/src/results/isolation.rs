//! `isolane isolation`'s results: the ramp's steps in summary.json and isolation.csv (one row
//! per step and victim).

use std::fmt::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::ResultsError;
use crate::files::{read_text, FileError};
use crate::metrics::WorkloadMetrics;

/// One victim in one step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VictimStep {
    pub victim: String,
    #[serde(flatten)]
    pub metrics: WorkloadMetrics,
}

/// One step of the ramp.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepResult {
    pub step: u32,
    pub start_s: f64,
    /// Each interferer's rate in this step.
    pub interferer_rates_hz: Vec<(String, f64)>,
    /// Sum of the interferers' rates (the one number of isolation.csv).
    pub interferer_rate_hz: f64,
    pub victims: Vec<VictimStep>,
}

/// The part of summary.json only `isolane isolation` writes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IsolationSteps {
    /// Length of one ramp step, s.
    pub step_s: f64,
    pub steps: Vec<StepResult>,
}

/// One row of isolation.csv.
#[derive(Debug, Clone, PartialEq)]
pub struct IsolationRow {
    pub step: u32,
    pub interferer_rate_hz: f64,
    pub victim: String,
    pub timeout_pct: f64,
}

pub const ISOLATION_CSV_HEADER: &str = "step,interferer_rate_hz,victim,jobs,completed,timeouts,\
timeout_pct,mean_ms,p50_ms,p90_ms,p99_ms,max_ms,throughput_ips";

pub fn isolation_csv(steps: &[StepResult]) -> String {
    let f = |v: Option<f64>| v.map(|x| format!("{x:.6}")).unwrap_or_default();
    let mut s = String::new();
    s.push_str(ISOLATION_CSV_HEADER);
    s.push('\n');
    for st in steps {
        for v in &st.victims {
            let m = &v.metrics;
            let _ = writeln!(
                s,
                "{},{},{},{},{},{},{:.4},{},{},{},{},{},{:.3}",
                st.step,
                st.interferer_rate_hz,
                v.victim,
                m.jobs,
                m.completed,
                m.timeouts,
                m.timeout_pct,
                f(m.latency_ms.mean),
                f(m.latency_ms.p50),
                f(m.latency_ms.p90),
                f(m.latency_ms.p99),
                f(m.latency_ms.max),
                m.throughput_ips,
            );
        }
    }
    s
}

/// Reads isolation.csv back (the columns the report draws), naming file, line and column of
/// a bad cell.
pub fn read_isolation_csv(path: &Path) -> Result<Vec<IsolationRow>, ResultsError> {
    let text = read_text(path)?;
    let bad = |line: usize, detail: String| -> ResultsError {
        FileError::parse(path, format!("line {line}: {detail}")).into()
    };
    let mut lines = text.lines().enumerate();
    let header: Vec<&str> = lines
        .next()
        .map(|(_, h)| h.split(',').map(str::trim).collect())
        .unwrap_or_default();
    let need = ["step", "interferer_rate_hz", "victim", "timeout_pct"];
    let mut at = [0usize; 4];
    for (slot, name) in at.iter_mut().zip(need) {
        *slot = header
            .iter()
            .position(|h| *h == name)
            .ok_or_else(|| bad(1, format!("the header has no `{name}` column")))?;
    }
    let mut rows = Vec::new();
    for (i, line) in lines.filter(|(_, l)| !l.trim().is_empty()) {
        let cells: Vec<&str> = line.split(',').map(str::trim).collect();
        let cell = |k: usize| cells.get(at[k]).copied().unwrap_or("");
        let num = |k: usize| {
            cell(k).parse::<f64>().map_err(|_| {
                bad(
                    i + 1,
                    format!("column `{}`: `{}` is not a number", need[k], cell(k)),
                )
            })
        };
        rows.push(IsolationRow {
            step: num(0)? as u32,
            interferer_rate_hz: num(1)?,
            victim: cell(2).to_string(),
            timeout_pct: num(3)?,
        });
    }
    Ok(rows)
}
