//! interference.json and interference.csv: what `isolane interference` measured. Each cell is
//! an ordinary run folder (summary.json, jobs/*.csv, telemetry.csv); the index says what each
//! cell was and the victim's stretch in it.

use serde::{Deserialize, Serialize};

use super::{csv_field, legacy_version, Versioned};
use crate::metrics::ExecTimes;
use crate::spec::KernelWork;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InterferenceIndex {
    #[serde(default = "legacy_version")]
    pub schema_version: u32,
    pub isolane_version: String,
    pub backend: String,
    /// `green`, `mps`, `timeslice` or `none`.
    pub mechanism: String,
    /// `sms` (green) or `thread_pct` (mps); absent where nothing is partitioned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub victim_size: Option<u32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub neighbour_sizes: Vec<u32>,
    /// The victim's rate as a fraction of its capacity alone in its partition, when the rate
    /// was given that way; else `victim_rate_hz` is the fixed rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub victim_load: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub victim_rate_hz: Option<f64>,
    /// Relative deadline of the victim's jobs (ms); absent: one period.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<f64>,
    pub duration_s: f64,
    pub warmup_jobs: u64,
    pub cells: Vec<InterferenceCell>,
}

impl Versioned for InterferenceIndex {
    fn schema_version(&self) -> u32 {
        self.schema_version
    }
}

/// What a cell measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CellKind {
    /// The victim alone, closed loop: its capacity in its partition.
    Capacity,
    /// The victim alone at its rate: the reference of every stretch.
    Alone,
    /// The victim at its rate beside a flat-out neighbour.
    Pair,
    /// A neighbour alone in its partition, closed loop (`--neighbour-alone`): its own
    /// throughput and device activity, the reference of its throughput in the pairs.
    Neighbour,
}

impl CellKind {
    pub fn word(self) -> &'static str {
        match self {
            CellKind::Capacity => "capacity",
            CellKind::Alone => "alone",
            CellKind::Pair => "pair",
            CellKind::Neighbour => "neighbour",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InterferenceCell {
    /// The cell's run folder, relative to the matrix folder.
    pub dir: String,
    pub kind: CellKind,
    pub victim: String,
    pub precision: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub neighbour: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub neighbour_size: Option<u32>,
    /// `pending`, then the run's: `ok`, `failed`, `interrupted`, or `error` (it did not run).
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The victim's release rate (null: closed loop, the capacity cell).
    pub victim_rate_hz: Option<f64>,
    /// Victim jobs released, and those that missed their deadline (skipped included).
    pub jobs: u64,
    pub timeouts: u64,
    pub timeout_pct: f64,
    /// The victim's execution times (end − start).
    pub exec_ms: ExecTimes,
    /// The alone cell's p50 and p99 of the same victim and precision, and this cell's over them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alone_p50_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alone_p99_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stretch_p50: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stretch_p99: Option<f64>,
    /// Jobs per second: the victim's (capacity) or the neighbour's (pair).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub victim_jobs_per_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub neighbour_jobs_per_s: Option<f64>,
    /// A pair's neighbour throughput alone (its `neighbour` cell at the same size and
    /// precision), when those cells were run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub neighbour_alone_jobs_per_s: Option<f64>,
    /// Per-job work of `kernel:` models, and what it achieved: the victim's bytes over its
    /// median execution time, the neighbour's at its throughput.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub victim_work: Option<KernelWork>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub neighbour_work: Option<KernelWork>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub victim_gb_per_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub victim_tflop_per_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub neighbour_gb_per_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub neighbour_tflop_per_s: Option<f64>,
    /// Device telemetry over the cell (GPM means, Hopper and later; absent on the CPU).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dram_bw_util_pct: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sm_util_pct: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tensor_util_pct: Option<f64>,
}

impl InterferenceCell {
    /// A cell not yet run (`victim` is empty in a `neighbour` cell).
    pub fn pending(dir: String, kind: CellKind, victim: &str, precision: &str) -> Self {
        InterferenceCell {
            dir,
            kind,
            victim: victim.to_string(),
            precision: precision.to_string(),
            neighbour: None,
            neighbour_size: None,
            status: "pending".into(),
            error: None,
            victim_rate_hz: None,
            jobs: 0,
            timeouts: 0,
            timeout_pct: 0.0,
            exec_ms: ExecTimes::default(),
            alone_p50_ms: None,
            alone_p99_ms: None,
            stretch_p50: None,
            stretch_p99: None,
            victim_jobs_per_s: None,
            neighbour_jobs_per_s: None,
            neighbour_alone_jobs_per_s: None,
            victim_work: None,
            neighbour_work: None,
            victim_gb_per_s: None,
            victim_tflop_per_s: None,
            neighbour_gb_per_s: None,
            neighbour_tflop_per_s: None,
            dram_bw_util_pct: None,
            sm_util_pct: None,
            tensor_util_pct: None,
        }
    }
}

pub const INTERFERENCE_CSV_HEADER: &str = "kind,victim,precision,neighbour,neighbour_size,\
victim_rate_hz,jobs,timeouts,timeout_pct,exec_p50_ms,exec_p99_ms,alone_p50_ms,alone_p99_ms,\
stretch_p50,stretch_p99,victim_jobs_per_s,neighbour_jobs_per_s,neighbour_alone_jobs_per_s,\
victim_gb_per_s,\
victim_tflop_per_s,neighbour_gb_per_s,neighbour_tflop_per_s,dram_bw_util_pct,sm_util_pct,\
tensor_util_pct,status,dir";

/// interference.csv: the header, then one row per cell (empty where a value does not apply).
pub fn interference_csv(cells: &[InterferenceCell]) -> String {
    let mut out = String::from(INTERFERENCE_CSV_HEADER);
    out.push('\n');
    for c in cells {
        let f = |v: Option<f64>| v.map_or(String::new(), |x| format!("{x:.6}"));
        let row = [
            c.kind.word().to_string(),
            csv_field(&c.victim),
            c.precision.clone(),
            csv_field(c.neighbour.as_deref().unwrap_or("")),
            c.neighbour_size.map_or(String::new(), |s| s.to_string()),
            f(c.victim_rate_hz),
            c.jobs.to_string(),
            c.timeouts.to_string(),
            format!("{:.4}", c.timeout_pct),
            f(c.exec_ms.p50),
            f(c.exec_ms.p99),
            f(c.alone_p50_ms),
            f(c.alone_p99_ms),
            f(c.stretch_p50),
            f(c.stretch_p99),
            f(c.victim_jobs_per_s),
            f(c.neighbour_jobs_per_s),
            f(c.neighbour_alone_jobs_per_s),
            f(c.victim_gb_per_s),
            f(c.victim_tflop_per_s),
            f(c.neighbour_gb_per_s),
            f(c.neighbour_tflop_per_s),
            f(c.dram_bw_util_pct),
            f(c.sm_util_pct),
            f(c.tensor_util_pct),
            c.status.clone(),
            csv_field(&c.dir),
        ];
        out.push_str(&row.join(","));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_has_one_row_per_cell_and_the_header_columns() {
        let mut c = InterferenceCell::pending("p".into(), CellKind::Pair, "a,b.onnx", "fp16");
        c.neighbour = Some("kernel:triad:256MiB".into());
        c.stretch_p99 = Some(1.5);
        let text = interference_csv(&[c]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(lines[1].starts_with("pair,\"a,b.onnx\",fp16,kernel:triad:256MiB,,"));
        assert!(lines[1].contains(",1.500000,"));
        // Quoted fields aside, every row has the header's columns.
        let unquoted = lines[1].replace("\"a,b.onnx\"", "x");
        assert_eq!(
            unquoted.split(',').count(),
            INTERFERENCE_CSV_HEADER.split(',').count()
        );
    }

    #[test]
    fn json_round_trips() {
        let idx = InterferenceIndex {
            schema_version: super::super::SCHEMA_VERSION,
            isolane_version: "0".into(),
            backend: "cpu".into(),
            mechanism: "none".into(),
            unit: None,
            victim_size: None,
            neighbour_sizes: vec![],
            victim_load: Some(0.5),
            victim_rate_hz: None,
            deadline_ms: None,
            duration_s: 1.0,
            warmup_jobs: 2,
            cells: vec![InterferenceCell::pending(
                "c".into(),
                CellKind::Capacity,
                "spin:1ms",
                "fp32",
            )],
        };
        let text = serde_json::to_string(&idx).unwrap();
        assert!(text.contains("\"kind\":\"capacity\""));
        let back: InterferenceIndex = serde_json::from_str(&text).unwrap();
        assert_eq!(back, idx);
    }
}
