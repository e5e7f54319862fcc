//! The coordinator ⇄ worker protocol (`host = "process"`): JSON lines over the worker's
//! stdin (coordinator → worker) and stdout (worker → coordinator).
//!
//! ```text
//! worker → {"type":"hello","protocol_version":1,"pid":…,"isolane_version":"…"}
//! coord  → {"type":"setup","protocol_version":1,"index":…,"workload":{…},"timing":{…},"schedule":{…}}
//! worker → {"type":"ready","warmup_ns":[…]}            (after pinning, model set-up and warm-up)
//!        | {"type":"error","message":"…"}
//! coord  → {"type":"start","t0_ns":…}                   (absolute CLOCK_MONOTONIC time)
//!        | {"type":"abort"}
//! worker → {"type":"jobs","records":[[k,release,start,end,timeout,held],…]}   (repeated, streamed)
//! coord  → {"type":"stop"}                              (any time after start: Ctrl-C)
//! worker → {"type":"done","status":"ok"|"interrupted"} | {"type":"error","message":"…"}
//! ```
//! Both sides check `protocol_version` before reading anything else from the other side, so a
//! worker executable from another isolane version fails with a clear message, not a parse error.

use isolane_core::spec::{DeviceSpec, TimingSpec, WorkloadSpec};
use isolane_core::JobRecord;
use serde::{Deserialize, Serialize};

use crate::guard::GuardSetup;
use crate::schedule::Schedule;
use crate::thread_cpu::ThreadCpu;

/// Bump on any incompatible change of the messages below.
pub const PROTOCOL_VERSION: u32 = 3;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ToWorker {
    Setup {
        protocol_version: u32,
        index: usize,
        workload: Box<WorkloadSpec>,
        device: DeviceSpec,
        timing: TimingSpec,
        schedule: Schedule,
        /// The workload's part in the run's criticality guard (`None`: unprotected).
        #[serde(default)]
        guard: Option<GuardSetup>,
    },
    Start {
        t0_ns: i64,
    },
    Abort,
    Stop,
}

/// A job record on the wire:
/// `[index, release_ns, start_ns|null, end_ns|null, timeout 0|1, held_ns]`.
pub type WireRecord = (u64, i64, Option<i64>, Option<i64>, u8, i64);

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum FromWorker {
    Hello {
        protocol_version: u32,
        pid: u32,
        isolane_version: String,
    },
    Ready {
        warmup_ns: Vec<i64>,
        /// A best-effort workload under protection: the pieces each job runs as.
        #[serde(default)]
        pieces: Option<usize>,
    },
    Jobs {
        records: Vec<WireRecord>,
    },
    Done {
        status: DoneStatus,
        /// What the worker's release-loop thread cost the CPU from t0 to its end.
        #[serde(default)]
        cpu: Option<ThreadCpu>,
    },
    Error {
        message: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DoneStatus {
    Ok,
    Interrupted,
}

#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    #[error(
        "worker protocol version mismatch: the {peer} speaks version {theirs}, this side {ours} \
         (the worker executable is from another isolane build)"
    )]
    VersionMismatch {
        peer: &'static str,
        theirs: u64,
        ours: u32,
    },
    #[error("malformed {what} from the {peer}: {detail}")]
    Malformed {
        peer: &'static str,
        what: &'static str,
        detail: String,
    },
}

pub fn record_from_wire(w: WireRecord) -> JobRecord {
    JobRecord {
        index: w.0,
        release_ns: w.1,
        start_ns: w.2,
        end_ns: w.3,
        timeout: w.4 != 0,
        held_ns: w.5,
    }
}

/// Checks the `protocol_version` of a first message before it is parsed as a whole.
pub fn check_version(line: &str, peer: &'static str) -> Result<serde_json::Value, ProtocolError> {
    let v: serde_json::Value =
        serde_json::from_str(line).map_err(|e| ProtocolError::Malformed {
            peer,
            what: "first message",
            detail: e.to_string(),
        })?;
    match v.get("protocol_version").and_then(|p| p.as_u64()) {
        Some(p) if p == PROTOCOL_VERSION as u64 => Ok(v),
        Some(p) => Err(ProtocolError::VersionMismatch {
            peer,
            theirs: p,
            ours: PROTOCOL_VERSION,
        }),
        None => Err(ProtocolError::Malformed {
            peer,
            what: "first message",
            detail: format!("no protocol_version in {}", truncate(line, 200)),
        }),
    }
}

pub fn truncate(s: &str, n: usize) -> &str {
    match s.char_indices().nth(n) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_mismatch_is_a_clear_error() {
        let line = r#"{"type":"hello","protocol_version":99,"pid":1,"isolane_version":"9"}"#;
        let err = check_version(line, "worker").unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("version mismatch") && msg.contains("99"),
            "{msg}"
        );
        assert!(check_version(r#"{"type":"hello"}"#, "worker").is_err());
        let ok = format!(
            r#"{{"type":"hello","protocol_version":{PROTOCOL_VERSION},"pid":1,"isolane_version":"x"}}"#
        );
        let v = check_version(&ok, "worker").unwrap();
        let m: FromWorker = serde_json::from_value(v).unwrap();
        assert!(matches!(m, FromWorker::Hello { pid: 1, .. }));
    }

    #[test]
    fn records_round_trip_on_the_wire() {
        let line = r#"{"type":"jobs","records":[[0,0,5,4000005,0,0],[1,3333333,null,null,1,0],[2,9,20,30,0,7]]}"#;
        let FromWorker::Jobs { records } = serde_json::from_str(line).unwrap() else {
            panic!("not jobs")
        };
        let r: Vec<JobRecord> = records.into_iter().map(record_from_wire).collect();
        assert_eq!(r[0].end_ns, Some(4_000_005));
        assert!(r[1].timeout && r[1].start_ns.is_none());
        assert_eq!(r[2].held_ns, 7);
    }
}
