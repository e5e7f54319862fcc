//! The one protocol between isolane and every child process it starts (`isolane worker`):
//! JSON lines over the worker's stdin (coordinator → worker) and stdout (worker → coordinator).
//! The coordinator's first message says which role the worker plays.
//!
//! ```text
//! worker → {"type":"hello","protocol_version":6,"pid":…,"isolane_version":"…"}
//!
//! role workload (a `host = "process"` workload of run/isolation/sweep/interference):
//! coord  → {"type":"setup","protocol_version":6,"index":…,"workload":{…},"device":{…},"timing":{…},"schedule":{…},"guard":…}
//! worker → {"type":"ready","warmup_ns":[…],"pieces":…}  (after pinning, model set-up and warm-up)
//!        | {"type":"error","message":"…"}
//! coord  → {"type":"start","t0_ns":…}                   (absolute CLOCK_MONOTONIC time)
//!        | {"type":"abort"}
//! worker → {"type":"jobs","records":[[k,release,start,end,timeout,held],…]}   (repeated, streamed)
//! coord  → {"type":"stop"}                              (any time after start: Ctrl-C)
//! worker → {"type":"done","status":"ok"|"interrupted","cpu":…} | {"type":"error","message":"…"}
//!
//! role probe (`isolane verify`'s agent of one partition):
//! coord  → {"type":"probe","protocol_version":6,"gpu":N}
//! worker → {"type":"probe_ready"}                       (the probe kernel is compiled and loaded)
//! coord  → {"type":"measure","duration_s":…}   worker → {"type":"measured","result":{…}}
//! coord  → {"type":"start_saturate"}           worker → {"type":"saturating"}
//! coord  → {"type":"stop_saturate"}            worker → {"type":"saturate_stopped","launches":…}
//! coord  → {"type":"stop"} or EOF              worker → {"type":"done","status":"ok"}
//!
//! role app (one `[[app]]` of `isolane run` in its own process: an MPS client, a time slice):
//! coord  → {"type":"app","protocol_version":6,"setup":{"scenario":…,"text":…,"app":…,"device":{…},"timing":{…},"out":…,"no_plan_check":…}}
//! worker → {"type":"app_ready"}                         (every stage built and warmed up)
//!        | {"type":"error","message":"…"}
//! coord  → {"type":"start","t0_ns":…} | {"type":"abort"}
//! coord  → {"type":"stop"}                              (any time after start: Ctrl-C)
//! worker → {"type":"app_done","records":{…}}            (isolane_core::app_records::AppRecords)
//! worker → {"type":"done","status":"ok"|"interrupted"} | {"type":"error","message":"…"}
//!
//! role exec (a served workload in its own process: [`crate::remote_exec`] has its messages).
//!
//! role maxrate (`isolane maxrate`'s search in an MPS client):
//! coord  → {"type":"maxrate","protocol_version":6,"search":{…}}
//! worker → {"type":"progress","event":{"event":"warmed_up"|"back_to_back"|"at_rate"|"batch_done",…}}  (repeated)
//! coord  → {"type":"stop"}                              (any time: Ctrl-C)
//! worker → {"type":"maxrate_done","outcome":{…}} then {"type":"done","status":"ok"}
//!        | {"type":"done","status":"interrupted"} | {"type":"error","message":"…"}
//! ```
//! Both sides check `protocol_version` before reading anything else from the other side, so a
//! worker executable from another isolane version fails with a clear message, not a parse error.

use isolane_core::app_records::AppRecords;
use isolane_core::probe::ProbeResult;
use isolane_core::spec::{DeviceSpec, TimingSpec, WorkloadSpec};
use isolane_core::JobRecord;
use serde::{Deserialize, Serialize};

use crate::guard::GuardSetup;
use crate::maxrate::{SearchEvent, SearchOutcome, SearchRequest};
use crate::schedule::Schedule;
use crate::thread_cpu::ThreadCpu;

/// Bump on any incompatible change of the messages below.
/// 4: the first coordinator message names the role (`setup`, `probe`, `maxrate`); the probe
/// and maxrate roles' messages. 5: the app role. 6: the exec role.
pub const PROTOCOL_VERSION: u32 = 6;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ToWorker {
    /// First message, role workload: run this workload of a run.
    Setup {
        protocol_version: u32,
        index: usize,
        workload: Box<WorkloadSpec>,
        /// Boxed as the workload is: the set-up message is sent once, the other variants often.
        device: Box<DeviceSpec>,
        timing: TimingSpec,
        schedule: Box<Schedule>,
        /// The workload's part in the run's criticality guard (`None`: unprotected).
        #[serde(default)]
        guard: Option<GuardSetup>,
    },
    /// First message, role probe: set the probe up on CUDA device `gpu` as the coordinator
    /// numbers the devices (a worker behind an MPS daemon or bound to a MIG instance uses the
    /// index its environment gives instead).
    Probe {
        protocol_version: u32,
        gpu: u32,
    },
    /// First message, role maxrate: run this max-rate search and return its outcome.
    Maxrate {
        protocol_version: u32,
        search: Box<SearchRequest>,
    },
    /// First message, role app: build this app of a scenario, report ready, run it from the
    /// t0 of `start`, and send its records back.
    App {
        protocol_version: u32,
        setup: Box<AppSetup>,
    },
    /// First message, role exec: build this model and run its jobs on request
    /// ([`crate::remote_exec`]: a served workload in a process of its own).
    Exec {
        protocol_version: u32,
        setup: Box<crate::remote_exec::ExecSetup>,
    },
    /// Exec role: a command waits in the shared header ([`crate::remote_exec`]).
    Wake,
    Start {
        t0_ns: i64,
    },
    Abort,
    /// Stop: the run (Ctrl-C), the search, or the probe role's work (the worker then ends).
    Stop,
    /// Probe role: measure the probe's throughput for this long.
    Measure {
        duration_s: f64,
    },
    /// Probe role: run the probe flat out until `stop_saturate`.
    StartSaturate,
    StopSaturate,
}

/// What an app worker runs: the app named `app` of the scenario `text` (the file at
/// `scenario`, read once by the coordinator and sent whole, so that both sides read the same
/// text; relative paths in it are relative to the file's folder).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AppSetup {
    pub scenario: std::path::PathBuf,
    pub text: String,
    pub app: String,
    pub device: DeviceSpec,
    pub timing: TimingSpec,
    /// The run's output folder (stages that save what they make write under it).
    pub out: Option<std::path::PathBuf>,
    /// `isolane run --no-plan-check`.
    pub no_plan_check: bool,
    /// The Vulkan device of each graphics stage the coordinator pinned to a CUDA GPU (stage
    /// name → device preference, a `GPU-<uuid>`): resolved where every GPU is visible, since
    /// a worker bound to its compute GPU (`CUDA_VISIBLE_DEVICES`) cannot look up another's
    /// UUID. Empty: every stage keeps the file's `device`.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub render_devices: std::collections::BTreeMap<String, String>,
    /// The app's part in the run's criticality guard (a protected run with critical and
    /// best-effort apps); `None`: not protected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guard: Option<crate::guard::GuardSetup>,
}

/// A job record on the wire:
/// `[index, release_ns, start_ns|null, end_ns|null, timeout 0|1, held_ns]`.
pub type WireRecord = (u64, i64, Option<i64>, Option<i64>, u8, i64);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    /// Probe role: the probe is set up; measurements may be asked for.
    ProbeReady,
    /// Probe role: the answer to `measure`.
    Measured {
        result: ProbeResult,
    },
    /// Probe role: the probe runs flat out now.
    Saturating,
    /// Probe role: saturation stopped after this many launches.
    SaturateStopped {
        launches: u64,
    },
    /// Maxrate role: what the search does now.
    Progress {
        event: SearchEvent,
    },
    /// Exec role: the model is built and its tensor region exists.
    ExecReady {
        tensors: Box<crate::remote_exec::ExecTensors>,
    },
    /// Exec role: an answer waits in the shared header.
    Wake,
    /// App role: every stage is built and warmed up; the worker waits for `start`.
    AppReady,
    /// App role: what the app measured (a `done` follows).
    AppDone {
        records: Box<AppRecords>,
    },
    /// Maxrate role: the search's outcome (a `done` follows).
    MaxrateDone {
        outcome: Box<SearchOutcome>,
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

    fn search_request() -> SearchRequest {
        let scenario = isolane_core::Scenario::from_toml_str(
            "[device]\nbackend = \"cpu\"\n\n[[workload]]\nname = \"maxrate\"\n\
             model = \"spin:1ms\"\nrate_hz = 1\njobs = 10\n",
            "test.toml",
            &Vec::<String>::new(),
        )
        .unwrap();
        SearchRequest {
            workload: scenario.workloads[0].clone(),
            device: scenario.device.clone(),
            timing: scenario.timing.clone(),
            config: isolane_core::maxrate::MaxRateConfig::default(),
        }
    }

    /// Every message of the probe and maxrate roles reads back as written, under the tag the
    /// protocol's listing gives it.
    #[test]
    fn the_role_messages_round_trip() {
        use isolane_core::maxrate::{BatchOutcome, MaxRateResult};
        use isolane_core::probe::{ProbeConfig, ProbeResult};
        use isolane_core::results::LatenessSummary;
        let to_worker = [
            (
                ToWorker::Probe {
                    protocol_version: PROTOCOL_VERSION,
                    gpu: 2,
                },
                "probe",
            ),
            (
                ToWorker::Maxrate {
                    protocol_version: PROTOCOL_VERSION,
                    search: Box::new(search_request()),
                },
                "maxrate",
            ),
            (
                ToWorker::App {
                    protocol_version: PROTOCOL_VERSION,
                    setup: Box::new(AppSetup {
                        scenario: "s.toml".into(),
                        text: "[[app]]\n".into(),
                        app: "a".into(),
                        device: search_request().device,
                        timing: search_request().timing,
                        out: Some("runs/x".into()),
                        no_plan_check: true,
                        render_devices: [("draw".to_string(), "GPU-0".to_string())].into(),
                        guard: Some(crate::guard::GuardSetup {
                            path: "/dev/shm/isolane-guard-x".into(),
                            policy: crate::guard::Policy::new(100_000, Some(1.5)),
                            piece_ns: 250_000,
                            critical_slot: None,
                            wait: crate::guard::HoldWait::Sleep,
                            stretch: None,
                        }),
                    }),
                },
                "app",
            ),
            (ToWorker::Measure { duration_s: 1.5 }, "measure"),
            (ToWorker::StartSaturate, "start_saturate"),
            (ToWorker::StopSaturate, "stop_saturate"),
            (ToWorker::Stop, "stop"),
        ];
        for (msg, tag) in to_worker {
            let line = serde_json::to_string(&msg).unwrap();
            assert!(line.starts_with(&format!(r#"{{"type":"{tag}""#)), "{line}");
            assert_eq!(serde_json::from_str::<ToWorker>(&line).unwrap(), msg);
        }
        let outcome = SearchOutcome {
            result: MaxRateResult {
                max_rate_hz: 240.0,
                l_max_ms: 1000.0 / 240.0,
                initial_rate_hz: 249.0,
                trace: Vec::new(),
            },
            start_lateness_us: LatenessSummary {
                p50: Some(0.5),
                p99: None,
                max: Some(40.0),
            },
            cpu_steal_pct: Some(0.3),
        };
        let from_worker = [
            (FromWorker::ProbeReady, "probe_ready"),
            (
                FromWorker::Measured {
                    result: ProbeResult::from_counts(80, 1.0, &[0, 3], 8, ProbeConfig::default()),
                },
                "measured",
            ),
            (FromWorker::Saturating, "saturating"),
            (FromWorker::AppReady, "app_ready"),
            (
                FromWorker::AppDone {
                    records: Box::new(AppRecords {
                        release_ns: vec![0, 10],
                        sent_ns: vec![1, 11],
                        stages: vec![vec![isolane_core::app_records::StageRecord::skipped(0)]],
                        error: None,
                    }),
                },
                "app_done",
            ),
            (
                FromWorker::SaturateStopped { launches: 7 },
                "saturate_stopped",
            ),
            (
                FromWorker::Progress {
                    event: SearchEvent::WarmedUp {
                        job_s: vec![0.001, 0.002],
                    },
                },
                "progress",
            ),
            (
                FromWorker::Progress {
                    event: SearchEvent::BatchDone {
                        outcome: BatchOutcome {
                            jobs: 10,
                            violations: 1,
                        },
                    },
                },
                "progress",
            ),
            (
                FromWorker::MaxrateDone {
                    outcome: Box::new(outcome),
                },
                "maxrate_done",
            ),
        ];
        for (msg, tag) in from_worker {
            let line = serde_json::to_string(&msg).unwrap();
            assert!(line.starts_with(&format!(r#"{{"type":"{tag}""#)), "{line}");
            assert_eq!(serde_json::from_str::<FromWorker>(&line).unwrap(), msg);
        }
    }

    #[test]
    fn a_role_of_another_version_is_refused_before_it_is_read() {
        let line = serde_json::to_string(&ToWorker::Maxrate {
            protocol_version: PROTOCOL_VERSION + 1,
            search: Box::new(search_request()),
        })
        .unwrap();
        let err = check_version(&line, "coordinator").unwrap_err().to_string();
        assert!(
            err.contains(&format!("version {}", PROTOCOL_VERSION + 1)) && err.contains("mismatch"),
            "{err}"
        );
    }
}
