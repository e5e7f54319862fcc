//! What one run of an app measured, frame by frame: the records `isolane-app` keeps while its
//! stages run and turns into paper 004's metrics. They live here, beside the job records, so
//! that an app run in an `isolane worker` process can send them to the coordinator typed (the
//! worker protocol of `isolane-runtime` carries them; it does not depend on `isolane-app`).

use serde::{Deserialize, Serialize};

/// What a stage did with one frame (times in ns since t0).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageRecord {
    pub frame: u64,
    /// `None` when the stage did not run the frame (dropped late or upstream).
    pub start_ns: Option<i64>,
    pub end_ns: Option<i64>,
    /// An ensemble's members' (start, end), in member order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<(i64, i64)>,
    /// The sink's only: what reached it (`Payload::describe` of each input, `; `-joined),
    /// written after its end time was taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    /// How long the criticality guard held this stage back before it started the frame (a
    /// best-effort app's GPU stage in a protected run, docs/apps.md; 0 otherwise).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub held_ns: i64,
    /// How long its input took to reach the stage's GPU from the device memory another GPU
    /// stage left it in (ns), and by which link; `None` where its input was not on a GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transfer: Option<(i64, Link)>,
}

/// How a stage's input reached the GPU it computes on, when it came from device memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Link {
    /// Device to device, on one GPU.
    Device,
    /// GPU to GPU over the link between them (NVLink or PCIe peer to peer).
    Peer,
    /// GPU to GPU through host memory (the CUDA driver stages it): where the two GPUs cannot
    /// reach each other, or the app says `transfer = "staged"`.
    Staged,
    /// Downloaded into host memory and uploaded again: a reader that takes no device input.
    Host,
}

impl Link {
    pub fn name(self) -> &'static str {
        match self {
            Link::Device => "device",
            Link::Peer => "peer",
            Link::Staged => "staged",
            Link::Host => "host",
        }
    }
}

fn is_zero(v: &i64) -> bool {
    *v == 0
}

impl StageRecord {
    /// A frame the stage did not run.
    pub fn skipped(frame: u64) -> StageRecord {
        StageRecord {
            frame,
            start_ns: None,
            end_ns: None,
            members: Vec::new(),
            output: None,
            held_ns: 0,
            transfer: None,
        }
    }
}

/// Everything measured of one app.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AppRecords {
    /// Scheduled release of each frame (ns since t0).
    pub release_ns: Vec<i64>,
    /// When the source actually sent it.
    pub sent_ns: Vec<i64>,
    /// Per stage (file order), per frame it received.
    pub stages: Vec<Vec<StageRecord>>,
    /// The first error of a stage that failed (its later frames are dropped).
    pub error: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_through_json() {
        let mut sink = StageRecord::skipped(1);
        sink.start_ns = Some(5);
        sink.end_ns = Some(9);
        sink.output = Some("class 3 score 0.500".into());
        let mut ens = StageRecord::skipped(1);
        ens.members = vec![(1, 2), (3, 4)];
        ens.held_ns = 7;
        let r = AppRecords {
            release_ns: vec![0, 100],
            sent_ns: vec![1, 101],
            stages: vec![vec![StageRecord::skipped(0), ens], vec![sink]],
            error: Some("stage `x` failed".into()),
        };
        let text = serde_json::to_string(&r).unwrap();
        assert_eq!(serde_json::from_str::<AppRecords>(&text).unwrap(), r);
    }
}
