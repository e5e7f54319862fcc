//! `isolane verify`: the proof of isolation is a measurement. For each partition of a
//! scenario, the probe's throughput is measured (a) alone in its partition and (b) while every
//! other partition runs the probe flat out; the report gives the share of the whole GPU each
//! partition achieved (alone ÷ the probe on the whole GPU) and the interference
//! (1 − beside ÷ alone).
//!
//! Partitions are driven by *agents* ([`ProbeAgent`]): a thread per green context
//! ([`ThreadAgent`]; green contexts of one process run concurrently), or a worker process per
//! partition for timeslice, MPS and MIG (separate contexts): `isolane worker` in the probe role
//! of the one worker protocol, driven by `isolane_session::verify::ProcessAgent`. This module
//! measures agents ([`measure_agents`]) and reports ([`format_table`]); setting the partitions
//! up and starting the agents is `isolane_session::verify::verify`'s (isolane-session sits
//! above this crate and isolane-runtime, whose protocol the workers speak).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use isolane_core::spec::Mechanism;

use crate::error::{GpuError, Result};
use crate::green::GreenGroup;
use crate::probe::{Probe, ProbeConfig, ProbeResult, WholeDevice};

/// How long an agent may take beyond the measurement itself before it counts as hung
/// (context creation, NVRTC, PTX JIT).
pub const AGENT_SLACK: Duration = Duration::from_secs(120);

/// One partition's probe, wherever it runs.
pub trait ProbeAgent: Send {
    fn label(&self) -> &str;
    /// The probe's throughput over `duration`, alone or beside whatever else runs.
    fn measure(&mut self, duration: Duration) -> Result<ProbeResult>;
    /// Starts running the probe flat out; returns once it runs.
    fn start_saturate(&mut self) -> Result<()>;
    /// Stops [`ProbeAgent::start_saturate`]'s work; returns the number of launches.
    fn stop_saturate(&mut self) -> Result<u64>;
}

// ------------------------------------------------------------------ in-process agent

enum Cmd {
    Measure(Duration),
    Saturate,
    Exit,
}

enum Reply {
    Ready,
    Measured(ProbeResult),
    Saturating,
    Stopped(u64),
    Failed(String),
}

/// A probe on its own thread, in a green context or the primary context.
pub struct ThreadAgent {
    label: String,
    tx: Sender<Cmd>,
    rx: Receiver<Reply>,
    stop: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<()>>,
}

/// Where a thread agent's probe runs.
pub enum ThreadTarget {
    /// A stream of the device's primary context: the whole GPU.
    Whole { device_index: u32 },
    /// A green context's stream.
    Green {
        device_index: u32,
        group: GreenGroup,
    },
}

impl ThreadAgent {
    pub fn spawn(
        label: impl Into<String>,
        target: ThreadTarget,
        config: ProbeConfig,
    ) -> Result<Self> {
        let label = label.into();
        let (tx, cmd_rx) = mpsc::channel::<Cmd>();
        let (reply_tx, rx) = mpsc::channel::<Reply>();
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = Arc::clone(&stop);
        let handle = std::thread::Builder::new()
            .name(format!("probe-{label}"))
            .spawn(move || agent_thread(target, config, cmd_rx, reply_tx, stop2))
            .map_err(|e| GpuError::io("spawning a probe thread", e))?;
        let agent = ThreadAgent {
            label,
            tx,
            rx,
            stop,
            handle: Some(handle),
        };
        match agent.rx.recv_timeout(AGENT_SLACK) {
            Ok(Reply::Ready) => Ok(agent),
            Ok(Reply::Failed(e)) => Err(GpuError::Worker(format!("{}: {e}", agent.label))),
            Ok(_) => Err(GpuError::Worker(format!(
                "{}: unexpected reply",
                agent.label
            ))),
            Err(_) => Err(GpuError::Worker(format!("{}: did not start", agent.label))),
        }
    }

    fn ask(&self, cmd: Cmd, timeout: Duration) -> Result<Reply> {
        self.tx
            .send(cmd)
            .map_err(|_| GpuError::Worker(format!("{}: thread is gone", self.label)))?;
        match self.rx.recv_timeout(timeout) {
            Ok(Reply::Failed(e)) => Err(GpuError::Worker(format!("{}: {e}", self.label))),
            Ok(r) => Ok(r),
            Err(_) => Err(GpuError::Worker(format!("{}: no answer", self.label))),
        }
    }
}

fn agent_thread(
    target: ThreadTarget,
    config: ProbeConfig,
    rx: Receiver<Cmd>,
    tx: Sender<Reply>,
    stop: Arc<AtomicBool>,
) {
    // Declared before the probe so that it is dropped after it.
    let (whole, group, device_index);
    match target {
        ThreadTarget::Whole { device_index: d } => {
            device_index = d;
            whole = match WholeDevice::new(d) {
                Ok(w) => Some(w),
                Err(e) => {
                    let _ = tx.send(Reply::Failed(e.to_string()));
                    return;
                }
            };
            group = None;
        }
        ThreadTarget::Green {
            device_index: d,
            group: g,
        } => {
            device_index = d;
            whole = None;
            group = Some(g);
        }
    }
    let made = match (&whole, &group) {
        (Some(w), _) => Probe::new(w.context(), w.stream(), device_index, config),
        (None, Some(g)) => g
            .make_current()
            .and_then(|_| Probe::new(g.context(), g.stream(), device_index, config)),
        (None, None) => Err(GpuError::Other("no target".into())),
    };
    let mut probe = match made {
        Ok(p) => p,
        Err(e) => {
            let _ = tx.send(Reply::Failed(e.to_string()));
            return;
        }
    };
    let _ = tx.send(Reply::Ready);
    while let Ok(cmd) = rx.recv() {
        let reply = match cmd {
            Cmd::Measure(d) => match probe.measure_throughput(d) {
                Ok(r) => Reply::Measured(r),
                Err(e) => Reply::Failed(e.to_string()),
            },
            Cmd::Saturate => {
                stop.store(false, Ordering::SeqCst);
                let _ = tx.send(Reply::Saturating);
                match probe.saturate(&stop) {
                    Ok(n) => Reply::Stopped(n),
                    Err(e) => Reply::Failed(e.to_string()),
                }
            }
            Cmd::Exit => break,
        };
        if tx.send(reply).is_err() {
            break;
        }
    }
    drop(probe);
    drop(group);
    drop(whole);
}

impl ProbeAgent for ThreadAgent {
    fn label(&self) -> &str {
        &self.label
    }
    fn measure(&mut self, duration: Duration) -> Result<ProbeResult> {
        match self.ask(Cmd::Measure(duration), duration + AGENT_SLACK)? {
            Reply::Measured(r) => Ok(r),
            _ => Err(GpuError::Worker(format!(
                "{}: unexpected reply",
                self.label
            ))),
        }
    }
    fn start_saturate(&mut self) -> Result<()> {
        match self.ask(Cmd::Saturate, AGENT_SLACK)? {
            Reply::Saturating => Ok(()),
            _ => Err(GpuError::Worker(format!(
                "{}: unexpected reply",
                self.label
            ))),
        }
    }
    fn stop_saturate(&mut self) -> Result<u64> {
        self.stop.store(true, Ordering::SeqCst);
        match self.rx.recv_timeout(AGENT_SLACK) {
            Ok(Reply::Stopped(n)) => Ok(n),
            Ok(Reply::Failed(e)) => Err(GpuError::Worker(format!("{}: {e}", self.label))),
            _ => Err(GpuError::Worker(format!("{}: did not stop", self.label))),
        }
    }
}

impl Drop for ThreadAgent {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.tx.send(Cmd::Exit);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

// ------------------------------------------------------------------ the measurement

/// One partition's line of the report.
#[derive(Debug, Clone, Serialize)]
pub struct PartitionRow {
    pub workload: String,
    /// e.g. "green 8 SMs", "mps 25%", "timeslice", "mig 1g.10gb".
    pub partition: String,
    /// SMs granted (green) or of the MIG instance.
    pub granted_sms: Option<u32>,
    /// The share of the GPU the partition is meant to get (SMs ÷ total, or thread %).
    pub nominal_share: Option<f64>,
    pub alone: ProbeResult,
    pub beside: Option<ProbeResult>,
    /// alone ÷ the probe on the whole GPU.
    pub share_of_gpu: Option<f64>,
    /// (1 − beside ÷ alone) × 100.
    pub interference_pct: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct VerifyReport {
    pub device: String,
    pub gpu: u32,
    pub sm_count: u32,
    pub mechanism: Mechanism,
    pub duration_s: f64,
    /// The probe alone on the whole GPU (`None` under MIG, where no process sees the whole GPU).
    pub whole_gpu: Option<ProbeResult>,
    pub partitions: Vec<PartitionRow>,
    pub notes: Vec<String>,
}

/// share = alone ÷ whole; interference = (1 − beside ÷ alone) × 100 (pure; tested on CPU).
pub fn share_and_interference(
    whole: Option<f64>,
    alone: f64,
    beside: Option<f64>,
) -> (Option<f64>, Option<f64>) {
    let share = whole.filter(|w| *w > 0.0).map(|w| alone / w);
    let interference = beside
        .filter(|_| alone > 0.0)
        .map(|b| (1.0 - b / alone) * 100.0);
    (share, interference)
}

/// Measures every agent alone, then each beside all the others saturating.
pub fn measure_agents(
    agents: &mut [Box<dyn ProbeAgent>],
    duration: Duration,
    verbose: bool,
) -> Result<Vec<(ProbeResult, Option<ProbeResult>)>> {
    let mut alone = Vec::with_capacity(agents.len());
    for a in agents.iter_mut() {
        if verbose {
            eprintln!("verify: {} alone", a.label());
        }
        alone.push(a.measure(duration)?);
    }
    let mut beside = Vec::with_capacity(agents.len());
    for i in 0..agents.len() {
        if agents.len() < 2 {
            beside.push(None);
            continue;
        }
        if verbose {
            eprintln!(
                "verify: {} beside {} saturating neighbours",
                agents[i].label(),
                agents.len() - 1
            );
        }
        let mut started = Vec::new();
        let mut result = Ok(None);
        for j in (0..agents.len()).filter(|&j| j != i) {
            match agents[j].start_saturate() {
                Ok(()) => started.push(j),
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        if result.is_ok() {
            // Let the neighbours' first launches get going before the clock starts.
            std::thread::sleep(Duration::from_millis(200));
            result = agents[i].measure(duration).map(Some);
        }
        for j in started {
            let stopped = agents[j].stop_saturate();
            if let (Ok(_), Err(e)) = (&result, stopped) {
                result = Err(e);
            }
        }
        beside.push(result?);
    }
    Ok(alone.into_iter().zip(beside).collect())
}

/// The report as a text table.
pub fn format_table(r: &VerifyReport) -> String {
    let mut s = format!(
        "{} (GPU {}, {} SMs), mechanism {:?}, {:.1} s per measurement\n",
        r.device, r.gpu, r.sm_count, r.mechanism, r.duration_s
    );
    if let Some(w) = &r.whole_gpu {
        s += &format!(
            "whole GPU: {:.0} blocks/s, {:.0} GFLOP/s, {} SMs seen\n",
            w.blocks_per_s,
            w.gflops,
            w.sm_ids_seen.len()
        );
    }
    s += &format!(
        "{:<16} {:<18} {:>8} {:>8} {:>12} {:>8} {:>12} {:>13} {:>9}\n",
        "workload",
        "partition",
        "granted",
        "nominal",
        "alone blk/s",
        "share",
        "beside blk/s",
        "interference",
        "SMs seen"
    );
    let pct = |v: Option<f64>| {
        v.map(|x| format!("{:.1}%", x * 100.0))
            .unwrap_or_else(|| "-".into())
    };
    for p in &r.partitions {
        s += &format!(
            "{:<16} {:<18} {:>8} {:>8} {:>12.0} {:>8} {:>12} {:>13} {:>9}\n",
            p.workload,
            p.partition,
            p.granted_sms
                .map(|g| g.to_string())
                .unwrap_or_else(|| "-".into()),
            pct(p.nominal_share),
            p.alone.blocks_per_s,
            pct(p.share_of_gpu),
            p.beside
                .as_ref()
                .map(|b| format!("{:.0}", b.blocks_per_s))
                .unwrap_or_else(|| "-".into()),
            p.interference_pct
                .map(|x| format!("{x:.1}%"))
                .unwrap_or_else(|| "-".into()),
            p.alone.sm_ids_seen.len(),
        );
    }
    for n in &r.notes {
        s += &format!("note: {n}\n");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn share_and_interference_follow_their_definitions() {
        let (s, i) = share_and_interference(Some(1320.0), 80.0, Some(76.0));
        assert!((s.unwrap() - 80.0 / 1320.0).abs() < 1e-12);
        assert!((i.unwrap() - 5.0).abs() < 1e-9);
        assert_eq!(share_and_interference(None, 80.0, None), (None, None));
        assert_eq!(share_and_interference(Some(0.0), 80.0, Some(0.0)).0, None);
    }

    #[test]
    fn the_table_has_a_row_per_partition() {
        let r = |items| ProbeResult::from_counts(items, 1.0, &[1, 1], 8, ProbeConfig::default());
        let report = VerifyReport {
            device: "NVIDIA H100 80GB HBM3".into(),
            gpu: 0,
            sm_count: 132,
            mechanism: Mechanism::Green,
            duration_s: 1.0,
            whole_gpu: Some(r(1320)),
            partitions: (0..2)
                .map(|i| PartitionRow {
                    workload: format!("p{i}"),
                    partition: "green 8 SMs".into(),
                    granted_sms: Some(8),
                    nominal_share: Some(8.0 / 132.0),
                    alone: r(80),
                    beside: Some(r(79)),
                    share_of_gpu: Some(80.0 / 1320.0),
                    interference_pct: Some(1.25),
                })
                .collect(),
            notes: vec!["a note".into()],
        };
        let t = format_table(&report);
        assert_eq!(t.lines().filter(|l| l.starts_with('p')).count(), 2, "{t}");
        assert!(
            t.contains("6.1%") && t.contains("1.2%") && t.contains("note: a note"),
            "{t}"
        );
        let j = serde_json::to_value(&report).unwrap();
        assert_eq!(j["partitions"][0]["interference_pct"], 1.25);
        assert_eq!(j["mechanism"], "green");
    }

    /// A fake agent: a fixed rate alone, divided by (1 + k·saturating neighbours).
    struct Fake {
        label: String,
        rate: f64,
        k: f64,
        busy: Arc<std::sync::atomic::AtomicUsize>,
        saturating: bool,
    }

    impl ProbeAgent for Fake {
        fn label(&self) -> &str {
            &self.label
        }
        fn measure(&mut self, _d: Duration) -> Result<ProbeResult> {
            let n = self.busy.load(Ordering::SeqCst) as f64;
            let r = self.rate / (1.0 + self.k * n);
            Ok(ProbeResult::from_counts(
                r as u64,
                1.0,
                &[1],
                1,
                ProbeConfig::default(),
            ))
        }
        fn start_saturate(&mut self) -> Result<()> {
            assert!(!self.saturating);
            self.saturating = true;
            self.busy.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
        fn stop_saturate(&mut self) -> Result<u64> {
            assert!(self.saturating);
            self.saturating = false;
            self.busy.fetch_sub(1, Ordering::SeqCst);
            Ok(1)
        }
    }

    #[test]
    fn each_agent_is_measured_alone_and_beside_all_the_others() {
        let busy = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut agents: Vec<Box<dyn ProbeAgent>> = (0..4)
            .map(|i| {
                Box::new(Fake {
                    label: format!("w{i}"),
                    rate: 1000.0,
                    k: 1.0,
                    busy: Arc::clone(&busy),
                    saturating: false,
                }) as Box<dyn ProbeAgent>
            })
            .collect();
        let r = measure_agents(&mut agents, Duration::from_millis(1), false).unwrap();
        assert_eq!(r.len(), 4);
        for (alone, beside) in &r {
            assert_eq!(alone.items, 1000);
            // Three neighbours saturating: time-sliced four ways.
            assert_eq!(beside.as_ref().unwrap().items, 250);
        }
        assert_eq!(
            busy.load(Ordering::SeqCst),
            0,
            "every neighbour was stopped"
        );
    }
}
