//! summary.json's `apps`: one entry per `[[app]]` of a run (pipelines and ensembles with an
//! end-to-end deadline, docs/apps.md). The metrics are paper 004's (Holoscan): per frame from
//! the source's release to the sink, the first and last frames dropped as warm-up and
//! cool-down; computed by `crate::metrics`, so every latency statistic has one definition.

use serde::{Deserialize, Serialize};

use crate::metrics::{LatencyStats, WorkloadMetrics};

/// One app's results.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AppSummary {
    pub name: String,
    /// The end-to-end deadline (ms): a frame whose sink completes later is a timeout.
    pub deadline_ms: f64,
    /// The source's frame rate (Hz).
    pub rate_hz: f64,
    /// What the source was, in words ("synthetic 1920x1080", "images DIR", "video FILE").
    pub source: String,
    /// Frames the source released, all of them.
    pub frames: u64,
    /// Frames left out at the start (warm-up) and at the end (cool-down) of the metrics.
    pub dropped_first: u64,
    pub dropped_last: u64,
    /// End to end over the measured frames: `jobs` = frames, `completed` = frames that reached
    /// the sink, `timeouts` against `deadline_ms` (a frame dropped on the way is one),
    /// `latency_ms` from each frame's scheduled release to the sink's end.
    pub end_to_end: WorkloadMetrics,
    /// How late the source handed each measured frame over (its hand-over minus its scheduled
    /// release, ms). A source that cannot make frames at its rate shows here first; its wait
    /// is part of every end-to-end latency. Absent in summaries written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_late_ms: Option<LatencyStats>,
    /// Per stage, in the order of the file.
    pub stages: Vec<StageSummary>,
    /// `critical` (the default) or `best_effort` (docs/criticality.md, Apps).
    #[serde(default)]
    pub criticality: crate::spec::Criticality,
    /// A best-effort app the criticality guard acted on: how its frames were held back
    /// (`pieces`: the stages that ask the guard before each frame; a frame's hold is the sum of
    /// its stages').
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<super::HeldSummary>,
}

/// One stage's own latency (its start to its end for each frame it processed), over the
/// measured frames.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageSummary {
    pub name: String,
    /// The stage kind (`preprocess`, `model`, `ensemble`, …).
    pub kind: String,
    /// Where it ran: the partition in words, `cpu` for CPU operators and the CPU backend.
    pub partition: String,
    /// Frames it processed.
    pub processed: u64,
    /// Frames it did not process because their deadline had passed (`late = "skip"`) or an
    /// input was dropped before it.
    pub skipped: u64,
    pub latency_ms: LatencyStats,
    /// An ensemble's members.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<MemberSummary>,
    /// How its input reached its GPU from the device memory another GPU stage left it in
    /// (a model fed by a GPU preprocess); absent where its input came through the host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transfer: Option<TransferSummary>,
}

/// A stage's input copies from device memory over its measured frames.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TransferSummary {
    /// The links the copies took (`device`, `peer`, `staged`, `host`), each once, in the
    /// order first seen.
    pub links: Vec<crate::app_records::Link>,
    /// Each copy's time, waited for (ms): part of the stage's own time and of the frame's end
    /// to end.
    pub latency_ms: LatencyStats,
}

/// One member of an ensemble.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemberSummary {
    pub name: String,
    pub model: String,
    pub partition: String,
    /// Its own inference time per frame.
    pub latency_ms: LatencyStats,
    /// Frames whose vote missed the deadline with this member the last to arrive: the member
    /// that made the vote late.
    pub made_late: u64,
}

/// The first columns of `apps/<app>.csv` (one row per frame released; `sent_ms`: when the
/// source actually sent it), followed by each stage's own time `<stage>_ms` and `output` (what
/// reached the sink, in words); times in ms since t0, empty where there is none. `held_ms`:
/// how long the criticality guard held the frame's stages back; `transfer_ms`: how long its
/// values took to move between GPU stages through device memory (both summed over stages).
pub const APP_CSV_COLUMNS: &str =
    "frame,release_ms,sent_ms,end_ms,latency_ms,timeout,measured,held_ms,transfer_ms";

/// The end-to-end latencies (ms) of the measured frames that reached the sink, from an
/// `apps/<app>.csv`.
pub fn app_latencies_from_csv(text: &str) -> Result<Vec<f64>, String> {
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().ok_or("empty file")?.split(',').collect();
    let col = |name: &str| {
        header
            .iter()
            .position(|h| *h == name)
            .ok_or(format!("no `{name}` column"))
    };
    let (lat, measured) = (col("latency_ms")?, col("measured")?);
    let mut out = Vec::new();
    for (n, line) in lines.enumerate() {
        let cells: Vec<&str> = line.split(',').collect();
        let cell = |c: usize| cells.get(c).copied().unwrap_or("");
        if cell(measured) != "1" || cell(lat).is_empty() {
            continue;
        }
        out.push(
            cell(lat)
                .parse::<f64>()
                .map_err(|e| format!("row {}: latency_ms: {e}", n + 2))?,
        );
    }
    Ok(out)
}
