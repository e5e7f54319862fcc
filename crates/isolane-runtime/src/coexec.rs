//! The co-execution study (issue 17 item 5, papers 002 and 003): pairs of jobs, each a fixed
//! amount of work, run alone, one after the other (from the alone runs) and at once under each
//! mechanism. Every run is an ordinary run of a generated scenario (`run`'s own code: admission,
//! partitions, hosts, telemetry); this module plans those scenarios and reduces each run to
//! wall times, energy, speedup, slowdowns and the pair's memory/compute class.

use isolane_core::results::{
    CellMetrics, CoexecCell, CoexecIndex, CoexecJob, Intensity, IntensityThresholds, PairClass,
    RunSummary, WorkloadSummary, SCHEMA_VERSION,
};
use isolane_core::spec::{Backend, Host, Mechanism, PartitionSpec, RunLength, Scenario};

/// A job is memory-bound when alone it uses at least this % of the DRAM bandwidth's peak
/// (NVML GPM). 40 %: triad-like kernels sit near 90 %, GEMMs and convolution networks at batch
/// sizes of the papers well below 30 % (docs/coexec.md).
pub const MEMORY_BOUND_DRAM_PCT: f64 = 40.0;
/// Without DRAM telemetry, a `kernel:` job is memory-bound below this many FLOPs per byte of
/// its known work: far under the ridge point of any GPU isolane targets (H100: ~20 at fp32
/// CUDA cores, ~300 at fp16 tensor cores) and of a CPU (~5–10).
pub const MEMORY_BOUND_FLOP_PER_BYTE: f64 = 4.0;

pub const THRESHOLDS: IntensityThresholds = IntensityThresholds {
    dram_bw_util_pct: MEMORY_BOUND_DRAM_PCT,
    flop_per_byte: MEMORY_BOUND_FLOP_PER_BYTE,
};

/// How a pair runs at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Way {
    /// The CPU backend: threads (or processes), nothing partitioned.
    None,
    Timeslice,
    /// MPS, every client at 100 % of the threads.
    Mps,
    /// MPS with each client's thread percentage (default 50/50).
    MpsProvisioned,
    Green,
    Mig,
}

pub const ALL_WAYS: [Way; 6] = [
    Way::None,
    Way::Timeslice,
    Way::Mps,
    Way::MpsProvisioned,
    Way::Green,
    Way::Mig,
];

impl Way {
    pub fn word(self) -> &'static str {
        match self {
            Way::None => "none",
            Way::Timeslice => "timeslice",
            Way::Mps => "mps",
            Way::MpsProvisioned => "mps-provisioned",
            Way::Green => "green",
            Way::Mig => "mig",
        }
    }

    pub fn parse(s: &str) -> Option<Way> {
        ALL_WAYS.into_iter().find(|w| w.word() == s)
    }

    /// The MPS thread budget admission allows: unprovisioned MPS gives each of the two
    /// clients 100 % on purpose (oversubscribed: each may take every SM).
    pub fn mps_thread_budget_pct(self) -> u32 {
        match self {
            Way::Mps => 200,
            _ => 100,
        }
    }

    fn mechanism(self) -> Mechanism {
        match self {
            Way::None => Mechanism::None,
            Way::Timeslice => Mechanism::Timeslice,
            Way::Mps | Way::MpsProvisioned => Mechanism::Mps,
            Way::Green => Mechanism::Green,
            Way::Mig => Mechanism::Mig,
        }
    }
}

/// The ways to run each pair: those given (parsed by the caller; repeats dropped, order kept),
/// else every way on the cpu (the GPU ones are then reported skipped) and every GPU way on cuda.
pub fn ways(backend: Backend, given: &[Way]) -> Vec<Way> {
    let wanted: Vec<Way> = if given.is_empty() {
        ALL_WAYS
            .into_iter()
            .filter(|w| !(backend == Backend::Cuda && *w == Way::None))
            .collect()
    } else {
        given.to_vec()
    };
    let mut out: Vec<Way> = Vec::new();
    for w in wanted {
        if !out.contains(&w) {
            out.push(w);
        }
    }
    out
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum CoexecError {
    #[error("{file}: a co-execution study needs at least 2 [[workload]] jobs (found {found})")]
    TooFewJobs { file: String, found: usize },
    #[error(
        "{file}: workload \"{name}\": a co-execution job is a fixed amount of work; give \
         `jobs = N` instead of `duration_s` (`rate_hz = \"max\"` runs them back to back)"
    )]
    NotFixedWork { file: String, name: String },
    #[error(
        "{file}: workload \"{name}\": a command job must run to completion; remove \
         `duration_s` (a `timeout_s` is allowed)"
    )]
    CommandStopped { file: String, name: String },
    #[error("{file}: workload \"{name}\": role \"victim\"/\"interferer\" and `ramp` are isolation keys, not allowed in a co-execution job")]
    Ramp { file: String, name: String },
    #[error(
        "--pairs {0}: expected NAME:NAME with two different workload names of the jobs file ({1})"
    )]
    BadPair(String, String),
    #[error("--{flag} {given}: expected NAME=N with a workload name of the jobs file ({names}) and N {range}")]
    BadSplit {
        flag: &'static str,
        given: String,
        names: String,
        range: &'static str,
    },
    #[error("--mechanisms: the list is empty")]
    NoMechanisms,
}

/// What to run.
#[derive(Debug, Clone)]
pub struct StudyConfig {
    pub jobs_file: String,
    /// The jobs file as parsed: its device and its workloads (the jobs).
    pub base: Scenario,
    /// Indices into `base.workloads`, a < b.
    pub pairs: Vec<(usize, usize)>,
    pub ways: Vec<Way>,
    /// Per job: its thread % under `mps-provisioned` and its SMs under `green`.
    pub thread_pct: Vec<u32>,
    pub green_sms: Vec<u32>,
}

/// Default split of MPS threads when a job has none given.
pub const DEFAULT_THREAD_PCT: u32 = 50;
/// Default SMs per job under green: two of them fit the 132 SMs of an H100/H200 on the 8-SM
/// step of compute capability 9.0. Smaller GPUs need `--green-sms` (admission says so).
pub const DEFAULT_GREEN_SMS: u32 = 64;

/// Checks that every workload of the jobs file is a fixed amount of work.
pub fn check_jobs(file: &str, s: &Scenario) -> Result<(), CoexecError> {
    if s.workloads.len() < 2 {
        return Err(CoexecError::TooFewJobs {
            file: file.into(),
            found: s.workloads.len(),
        });
    }
    for w in &s.workloads {
        let (file, name) = (file.to_string(), w.name.clone());
        match &w.program {
            Some(p) if p.duration_s.is_some() => {
                return Err(CoexecError::CommandStopped { file, name })
            }
            Some(_) => {}
            None if matches!(w.length, RunLength::DurationS(_)) => {
                return Err(CoexecError::NotFixedWork { file, name })
            }
            None if w.ramp.is_some() || w.role != isolane_core::spec::Role::Standalone => {
                return Err(CoexecError::Ramp { file, name })
            }
            None => {}
        }
    }
    Ok(())
}

/// The pairs given as `a:b` names, or every pair of jobs in file order.
pub fn pairs(names: &[&str], given: &[String]) -> Result<Vec<(usize, usize)>, CoexecError> {
    if given.is_empty() {
        let n = names.len();
        return Ok((0..n)
            .flat_map(|a| (a + 1..n).map(move |b| (a, b)))
            .collect());
    }
    let find = |n: &str| names.iter().position(|x| *x == n);
    given
        .iter()
        .map(|p| {
            let bad = || CoexecError::BadPair(p.clone(), names.join(", "));
            let (a, b) = p.split_once(':').ok_or_else(bad)?;
            match (find(a), find(b)) {
                (Some(a), Some(b)) if a != b => Ok((a.min(b), a.max(b))),
                _ => Err(bad()),
            }
        })
        .collect()
}

/// Per-job values from `NAME=N` entries, `default` for jobs not named; N must be in `range`.
pub fn split(
    flag: &'static str,
    names: &[&str],
    given: &[String],
    default: u32,
    range: std::ops::RangeInclusive<u32>,
    range_text: &'static str,
) -> Result<Vec<u32>, CoexecError> {
    let mut out = vec![default; names.len()];
    for g in given {
        let bad = || CoexecError::BadSplit {
            flag,
            given: g.clone(),
            names: names.join(", "),
            range: range_text,
        };
        let (name, v) = g.split_once('=').ok_or_else(bad)?;
        let i = names.iter().position(|n| *n == name).ok_or_else(bad)?;
        let v: u32 = v.parse().map_err(|_| bad())?;
        if !range.contains(&v) {
            return Err(bad());
        }
        out[i] = v;
    }
    Ok(out)
}

impl StudyConfig {
    pub fn names(&self) -> Vec<&str> {
        self.base
            .workloads
            .iter()
            .map(|w| w.name.as_str())
            .collect()
    }

    /// The index with every job pending and no cell yet.
    pub fn index(&self, isolane_version: &str) -> CoexecIndex {
        let on_gpu = self.base.device.backend == Backend::Cuda;
        CoexecIndex {
            schema_version: SCHEMA_VERSION,
            isolane_version: isolane_version.into(),
            jobs_file: self.jobs_file.clone(),
            backend: if on_gpu { "cuda" } else { "cpu" }.into(),
            mechanisms: self.ways.iter().map(|w| w.word().to_string()).collect(),
            thresholds: THRESHOLDS,
            energy_note: None,
            jobs: Vec::new(),
            cells: Vec::new(),
        }
    }

    /// Job `i` alone on the whole device: time-sliced worker process on a GPU (nothing else
    /// runs), the device's own set-up on the CPU.
    pub fn alone_scenario(&self, i: usize) -> Scenario {
        let mut s = self.base.clone();
        s.workloads = vec![s.workloads[i].clone()];
        let way = match s.device.backend {
            Backend::Cuda => Way::Timeslice,
            Backend::Cpu => Way::None,
        };
        set_way(&mut s, way, &[None]);
        s
    }

    /// The pair at once under `way`, or why that cell cannot run.
    pub fn concurrent_scenario(
        &self,
        (a, b): (usize, usize),
        way: Way,
    ) -> Result<Scenario, String> {
        let on_gpu = self.base.device.backend == Backend::Cuda;
        match (on_gpu, way) {
            (false, Way::None) => {}
            (false, w) => {
                return Err(format!(
                    "{} needs a GPU (device.backend = \"cuda\"); this study runs on the cpu",
                    w.word()
                ))
            }
            (true, Way::None) => {
                return Err("none is the cpu backend's way; on a GPU use timeslice".into())
            }
            (true, _) => {}
        }
        let mut s = self.base.clone();
        s.workloads = vec![s.workloads[a].clone(), s.workloads[b].clone()];
        if way == Way::Green {
            if let Some(w) = s
                .workloads
                .iter()
                .find(|w| w.program.is_some() && w.on_gpu())
            {
                return Err(format!(
                    "{} is an external command: a green context exists only inside the process \
                     that creates it, so a command cannot be given one",
                    w.name
                ));
            }
        }
        let parts = [self.partition(a, way)?, self.partition(b, way)?];
        set_way(&mut s, way, &parts);
        Ok(s)
    }

    /// Job `i`'s partition under `way` (`None`: not partitioned).
    fn partition(&self, i: usize, way: Way) -> Result<Option<PartitionSpec>, String> {
        let w = &self.base.workloads[i];
        let p = PartitionSpec::default();
        Ok(match way {
            Way::None | Way::Timeslice => None,
            Way::Mps => Some(PartitionSpec {
                thread_pct: Some(100),
                ..p
            }),
            Way::MpsProvisioned => Some(PartitionSpec {
                thread_pct: Some(self.thread_pct[i]),
                ..p
            }),
            Way::Green => Some(PartitionSpec {
                sms: Some(self.green_sms[i]),
                ..p
            }),
            Way::Mig => match &w.partition.mig_profile {
                Some(m) => Some(PartitionSpec {
                    mig_profile: Some(m.clone()),
                    ..p
                }),
                None => {
                    return Err(format!(
                        "{} has no MIG profile (give --mig-profiles {}=<profile>, e.g. 3g.40gb; \
                         MIG mode must already be on)",
                        w.name, w.name
                    ))
                }
            },
        })
    }
}

/// Sets the scenario's mechanism, each workload's host and partition (GPU workloads only: a
/// CPU workload of a GPU scenario takes no GPU partition).
fn set_way(s: &mut Scenario, way: Way, parts: &[Option<PartitionSpec>]) {
    let m = way.mechanism();
    let host = match m {
        Mechanism::Mps | Mechanism::Mig | Mechanism::Timeslice => Host::Process,
        Mechanism::Green | Mechanism::None => Host::Thread,
    };
    s.device.mechanism = m;
    s.device.host = host;
    for (w, p) in s.workloads.iter_mut().zip(parts) {
        if w.program.is_none() {
            w.host = host;
        }
        w.partition = match (w.on_gpu(), p) {
            (true, Some(p)) => p.clone(),
            _ => PartitionSpec::default(),
        };
    }
}

/// A partition in words for the table (`50 %`, `64 SMs`, `3g.40gb`).
pub fn partition_words(s: &Scenario, i: usize) -> Option<String> {
    let p = &s.workloads.get(i)?.partition;
    match (p.sms, p.thread_pct, &p.mig_profile) {
        (Some(n), _, _) => Some(format!("{n} SMs")),
        (_, Some(t), _) => Some(format!("{t} %")),
        (_, _, Some(m)) => Some(m.clone()),
        _ => None,
    }
}

/// What a job is, in words: its model or its command.
pub fn job_what(s: &Scenario, i: usize) -> String {
    let w = &s.workloads[i];
    match &w.program {
        Some(p) => p.command.join(" "),
        None => w.model.clone(),
    }
}

/// Fills a job's alone entry from its run.
pub fn fill_job(job: &mut CoexecJob, summary: &RunSummary) {
    let Some(w) = summary.workloads.first() else {
        return;
    };
    job.wall_s = finished_wall(w);
    let t = summary.telemetry.as_ref();
    job.energy_j = t.and_then(|t| t.energy_j);
    job.dram_bw_util_pct = t.and_then(|t| t.dram_bw_util_pct.as_ref().map(|s| s.mean));
    job.work = w.work;
    job.bytes_total = w.work.map(|k| k.bytes * w.metrics.completed);
    job.intensity = intensity(job.dram_bw_util_pct, job.work.as_ref());
}

/// A workload's wall time, only when it ran to its end (a failed or interrupted job did not
/// do its whole work, so its time compares with nothing).
fn finished_wall(w: &WorkloadSummary) -> Option<f64> {
    (w.status == isolane_core::results::RunStatus::Ok && w.wall_s > 0.0).then_some(w.wall_s)
}

/// A job's intensity: from its DRAM bandwidth use where measured, else from a `kernel:` job's
/// FLOPs per byte.
pub fn intensity(
    dram_pct: Option<f64>,
    work: Option<&isolane_core::spec::KernelWork>,
) -> Intensity {
    if let Some(d) = dram_pct {
        return if d >= MEMORY_BOUND_DRAM_PCT {
            Intensity::Memory
        } else {
            Intensity::Compute
        };
    }
    match work {
        Some(k) if k.bytes > 0 => {
            if (k.flops as f64 / k.bytes as f64) < MEMORY_BOUND_FLOP_PER_BYTE {
                Intensity::Memory
            } else {
                Intensity::Compute
            }
        }
        _ => Intensity::Unknown,
    }
}

pub fn pair_class(a: Intensity, b: Intensity) -> PairClass {
    use Intensity::{Compute, Memory, Unknown};
    match (a, b) {
        (Unknown, _) | (_, Unknown) => PairClass::Unknown,
        (Memory, Memory) => PairClass::BothMemory,
        (Compute, Compute) => PairClass::BothCompute,
        _ => PairClass::Mixed,
    }
}

/// `num / den` where both are measured and the denominator is positive.
pub fn ratio(num: Option<f64>, den: Option<f64>) -> Option<f64> {
    match (num, den) {
        (Some(n), Some(d)) if d > 0.0 && n.is_finite() => Some(n / d),
        _ => None,
    }
}

fn sum(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    Some(a? + b?)
}

/// A new cell of the pair (no metrics yet).
pub fn cell(jobs: &[CoexecJob], (a, b): (usize, usize), mechanism: &str) -> CoexecCell {
    CoexecCell {
        a: jobs[a].name.clone(),
        b: jobs[b].name.clone(),
        mechanism: mechanism.into(),
        dir: String::new(),
        status: "pending".into(),
        reason: None,
        class: pair_class(jobs[a].intensity, jobs[b].intensity),
        partition_a: None,
        partition_b: None,
        m: CellMetrics::default(),
    }
}

/// The pair one after the other: both alone runs' times and energies added.
pub fn sequential_cell(jobs: &[CoexecJob], pair: (usize, usize)) -> CoexecCell {
    let (a, b) = (&jobs[pair.0], &jobs[pair.1]);
    let mut c = cell(jobs, pair, "sequential");
    let seq = sum(a.wall_s, b.wall_s);
    let e = sum(a.energy_j, b.energy_j);
    c.m = CellMetrics {
        wall_a_s: a.wall_s,
        wall_b_s: b.wall_s,
        makespan_s: seq,
        sequential_s: seq,
        speedup: ratio(seq, seq),
        slowdown_a: ratio(a.wall_s, a.wall_s),
        slowdown_b: ratio(b.wall_s, b.wall_s),
        energy_j: e,
        sequential_energy_j: e,
        energy_vs_sequential: ratio(e, e),
    };
    c.status = if seq.is_some() { "ok" } else { "failed" }.into();
    if seq.is_none() {
        c.reason = Some("a job did not complete alone".into());
    }
    c
}

/// Fills a concurrent cell from its run (workloads in pair order) and the jobs alone.
pub fn fill_concurrent(c: &mut CoexecCell, summary: &RunSummary, alone: (&CoexecJob, &CoexecJob)) {
    let wall = |name: &str| {
        summary
            .workloads
            .iter()
            .find(|w| w.name == name)
            .and_then(finished_wall)
    };
    let (wa, wb) = (wall(&c.a), wall(&c.b));
    let makespan = match (wa, wb) {
        (Some(x), Some(y)) => Some(x.max(y)),
        _ => None,
    };
    let seq = sum(alone.0.wall_s, alone.1.wall_s);
    let energy = summary.telemetry.as_ref().and_then(|t| t.energy_j);
    let seq_energy = sum(alone.0.energy_j, alone.1.energy_j);
    c.m = CellMetrics {
        wall_a_s: wa,
        wall_b_s: wb,
        makespan_s: makespan,
        sequential_s: seq,
        speedup: ratio(seq, makespan),
        slowdown_a: ratio(wa, alone.0.wall_s),
        slowdown_b: ratio(wb, alone.1.wall_s),
        energy_j: energy,
        sequential_energy_j: seq_energy,
        energy_vs_sequential: ratio(energy, seq_energy),
    };
}

/// Why the energy fields are absent, when no run had an energy reading.
pub fn energy_note(index: &CoexecIndex) -> Option<String> {
    let any = index.jobs.iter().any(|j| j.energy_j.is_some())
        || index.cells.iter().any(|c| c.m.energy_j.is_some());
    (!any).then(|| {
        if index.backend == "cpu" {
            "no energy: the cpu backend has no NVML energy counter".to_string()
        } else {
            "no energy: NVML gave neither an energy counter nor power readings".to_string()
        }
    })
}

#[cfg(test)]
mod tests;
