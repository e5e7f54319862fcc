//! The interference matrix (issue 14): each victim model alone in its partition, then at a
//! fixed rate beside each neighbour model running flat out (closed loop) in its own. Every cell
//! is an ordinary run of a generated two-workload (or one-workload) scenario
//! ([`crate::sweep::point_scenario`]), so partitions, hosts and telemetry are `run`'s; this
//! module plans the cells and reduces each run to the victim's stretch.
//!
//! Cells, in the order they run (the victim's rate comes from its capacity):
//! 1. `capacity` (only with a load fraction): the victim alone, closed loop → jobs/s.
//! 2. `alone`: the victim alone at its rate → the reference execution times.
//! 3. `pair`: the victim at its rate beside one neighbour, closed loop, at each neighbour size.
//!
//! With `neighbour_alone`, each precision starts with a `neighbour` cell per neighbour and size:
//! the neighbour alone, closed loop — its own throughput and device activity.

use isolane_core::metrics::exec_times;
use isolane_core::results::{
    CellKind, InterferenceCell, InterferenceIndex, RunSummary, SCHEMA_VERSION,
};
use isolane_core::spec::{Backend, DeviceSpec, Host, KernelWork, Mechanism, Precision, Scenario};

use crate::coordinator::RunResult;
use crate::sweep::{point_scenario, workload_name, PointWorkload};

/// The two workloads of a cell, by name (their jobs files are `jobs/victim.csv` and
/// `jobs/neighbour.csv`).
pub const VICTIM: &str = "victim";
pub const NEIGHBOUR: &str = "neighbour";

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum InterferenceError {
    #[error("--victims: the list is empty")]
    NoVictims,
    #[error("--mechanism {0} partitions the GPU: give --victim-size and --neighbour-sizes ({1})")]
    SizesNeeded(&'static str, &'static str),
    #[error(
        "--mechanism {0} does not partition anything: leave out --victim-size and \
         --neighbour-sizes"
    )]
    SizesNotAllowed(&'static str),
    #[error("--mechanism {0} needs --backend cuda (on the cpu backend only `none` runs)")]
    NeedsCuda(&'static str),
    #[error("--victim-load {0}: expected a fraction of the capacity, > 0 and <= 1")]
    BadLoad(f64),
    #[error("--mps: {0} is not a thread percentage (allowed: 1 to 100)")]
    BadPercent(u32),
}

/// The victim's rate: a fraction of its capacity alone in its partition, or fixed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum VictimRate {
    Load(f64),
    Hz(f64),
}

/// What to measure.
#[derive(Debug, Clone)]
pub struct MatrixConfig {
    pub backend: Backend,
    pub gpu: u32,
    pub mechanism: Mechanism,
    /// SMs (green) or thread % (mps) of the victim and of each neighbour size.
    pub victim_size: Option<u32>,
    pub neighbour_sizes: Vec<u32>,
    pub victims: Vec<String>,
    pub neighbours: Vec<String>,
    pub precisions: Vec<Precision>,
    pub rate: VictimRate,
    /// The victim's relative deadline; `None`: one period.
    pub deadline_ms: Option<f64>,
    pub duration_s: f64,
    pub warmup_jobs: u64,
    /// Also measure each neighbour alone (a `neighbour` cell per neighbour, size, precision).
    pub neighbour_alone: bool,
}

/// One cell to run: its index entry and its scenario.
#[derive(Debug, Clone)]
pub struct Cell {
    pub entry: InterferenceCell,
    pub scenario: Scenario,
}

pub fn precision_word(p: Precision) -> &'static str {
    match p {
        Precision::Fp32 => "fp32",
        Precision::Tf32 => "tf32",
        Precision::Fp16 => "fp16",
        Precision::Bf16 => "bf16",
        Precision::Int8 => "int8",
        Precision::Fp8 => "fp8",
    }
}

impl MatrixConfig {
    /// Checks the combination of flags (each mistake names its flag).
    pub fn check(&self) -> Result<(), InterferenceError> {
        if self.victims.is_empty() {
            return Err(InterferenceError::NoVictims);
        }
        if let VictimRate::Load(f) = self.rate {
            if !(f > 0.0 && f <= 1.0) {
                return Err(InterferenceError::BadLoad(f));
            }
        }
        let word = self.mechanism.name();
        if self.backend == Backend::Cpu && self.mechanism != Mechanism::None {
            return Err(InterferenceError::NeedsCuda(word));
        }
        let sized = self.victim_size.is_some() || !self.neighbour_sizes.is_empty();
        let partitioned = matches!(self.mechanism, Mechanism::Green | Mechanism::Mps);
        if partitioned && (self.victim_size.is_none() || self.neighbour_sizes.is_empty()) {
            let unit = if self.mechanism == Mechanism::Green {
                "SMs"
            } else {
                "thread %"
            };
            return Err(InterferenceError::SizesNeeded(word, unit));
        }
        if !partitioned && sized {
            return Err(InterferenceError::SizesNotAllowed(word));
        }
        if self.mechanism == Mechanism::Mps {
            let all = self.victim_size.iter().chain(&self.neighbour_sizes);
            if let Some(&p) = all.into_iter().find(|&&p| p == 0 || p > 100) {
                return Err(InterferenceError::BadPercent(p));
            }
        }
        Ok(())
    }

    /// Where the cells run: green workloads are threads of this process (green contexts of
    /// one process run concurrently), MPS clients and time-sliced ones worker processes.
    pub fn device(&self) -> DeviceSpec {
        let host = match self.mechanism {
            Mechanism::Mps | Mechanism::Timeslice | Mechanism::Mig => Host::Process,
            Mechanism::Green | Mechanism::None => Host::Thread,
        };
        DeviceSpec {
            backend: self.backend,
            gpu: self.gpu,
            mechanism: self.mechanism,
            host,
            gpus: Vec::new(),
        }
    }

    /// The matrix's index with no cell yet (`isolane_version`: the binary's).
    pub fn index(&self, isolane_version: &str) -> InterferenceIndex {
        let (victim_load, victim_rate_hz) = match self.rate {
            VictimRate::Load(f) => (Some(f), None),
            VictimRate::Hz(h) => (None, Some(h)),
        };
        InterferenceIndex {
            schema_version: SCHEMA_VERSION,
            isolane_version: isolane_version.to_string(),
            backend: match self.backend {
                Backend::Cpu => "cpu",
                Backend::Cuda => "cuda",
            }
            .into(),
            mechanism: self.mechanism.name().into(),
            unit: self.unit().map(str::to_string),
            victim_size: self.victim_size,
            neighbour_sizes: self.neighbour_sizes.clone(),
            victim_load,
            victim_rate_hz,
            deadline_ms: self.deadline_ms,
            duration_s: self.duration_s,
            warmup_jobs: self.warmup_jobs,
            cells: Vec::new(),
        }
    }

    /// `sms` or `thread_pct`, where the mechanism partitions.
    pub fn unit(&self) -> Option<&'static str> {
        match self.mechanism {
            Mechanism::Green => Some("sms"),
            Mechanism::Mps => Some("thread_pct"),
            _ => None,
        }
    }

    /// The neighbour sizes a pair is measured at (`None` once where nothing is partitioned).
    fn sizes(&self) -> Vec<Option<u32>> {
        if self.neighbour_sizes.is_empty() {
            vec![None]
        } else {
            self.neighbour_sizes.iter().map(|&s| Some(s)).collect()
        }
    }

    fn workload(
        &self,
        name: &str,
        model: &str,
        precision: Precision,
        rate_hz: Option<f64>,
        size: Option<u32>,
    ) -> PointWorkload {
        PointWorkload {
            name: name.to_string(),
            model: model.to_string(),
            batch: 1,
            precision,
            rate_hz,
            duration_s: self.duration_s,
            warmup_jobs: self.warmup_jobs,
            sms: size.filter(|_| self.mechanism == Mechanism::Green),
            thread_pct: size.filter(|_| self.mechanism == Mechanism::Mps),
        }
    }

    /// The scenario of a cell: the victim (at `rate_hz`, or closed loop), and the neighbour
    /// closed loop when there is one. The victim's deadline is the configured one.
    pub fn scenario(
        &self,
        victim: &str,
        precision: Precision,
        rate_hz: Option<f64>,
        neighbour: Option<(&str, Option<u32>)>,
    ) -> Scenario {
        let mut ws = vec![self.workload(VICTIM, victim, precision, rate_hz, self.victim_size)];
        if let Some((model, size)) = neighbour {
            ws.push(self.workload(NEIGHBOUR, model, precision, None, size));
        }
        let mut s = point_scenario(self.device(), &ws);
        if rate_hz.is_some() {
            s.workloads[0].deadline_ms = self.deadline_ms;
        }
        s
    }

    fn cell(
        &self,
        kind: CellKind,
        (vi, victim): (usize, &str),
        precision: Precision,
        rate_hz: Option<f64>,
        neighbour: Option<(usize, &str, Option<u32>)>,
    ) -> Cell {
        let p = precision_word(precision);
        let v = dir_name(&self.victims, vi);
        let dir = match (kind, neighbour) {
            (CellKind::Pair, Some((ni, _, size))) => {
                let n = dir_name(&self.neighbours, ni);
                let size = size.map_or(String::new(), |s| format!("-{s}"));
                format!("pair-{v}-{p}--{n}{size}")
            }
            _ => format!("{}-{v}-{p}", kind.word()),
        };
        let mut entry = InterferenceCell::pending(dir, kind, victim, p);
        entry.victim_rate_hz = rate_hz;
        if let Some((_, model, size)) = neighbour {
            entry.neighbour = Some(model.to_string());
            entry.neighbour_size = size;
        }
        Cell {
            scenario: self.scenario(
                victim,
                precision,
                rate_hz,
                neighbour.map(|(_, m, s)| (m, s)),
            ),
            entry,
        }
    }

    /// The `neighbour` cells of precision `p` (none unless `neighbour_alone`).
    pub fn neighbour_cells(&self, p: Precision) -> Vec<Cell> {
        if !self.neighbour_alone {
            return Vec::new();
        }
        let word = precision_word(p);
        let mut cells = Vec::new();
        for (ni, model) in self.neighbours.iter().enumerate() {
            for size in self.sizes() {
                let n = dir_name(&self.neighbours, ni);
                let sz = size.map_or(String::new(), |s| format!("-{s}"));
                let mut entry = InterferenceCell::pending(
                    format!("neighbour-{n}{sz}-{word}"),
                    CellKind::Neighbour,
                    "",
                    word,
                );
                entry.neighbour = Some(model.clone());
                entry.neighbour_size = size;
                let w = self.workload(NEIGHBOUR, model, p, None, size);
                cells.push(Cell {
                    entry,
                    scenario: point_scenario(self.device(), &[w]),
                });
            }
        }
        cells
    }

    /// The capacity cell of a victim at a precision, when the rate is a load fraction.
    pub fn capacity_cell(&self, v: (usize, &str), p: Precision) -> Option<Cell> {
        matches!(self.rate, VictimRate::Load(_))
            .then(|| self.cell(CellKind::Capacity, v, p, None, None))
    }

    /// The capacity cells (one per victim × precision), when the rate is a load fraction.
    pub fn capacity_cells(&self) -> Vec<Cell> {
        self.each_victim()
            .filter_map(|(v, p)| self.capacity_cell(v, p))
            .collect()
    }

    /// The alone cell and the pair cells of one victim at one precision, at `rate_hz`.
    pub fn rated_cells(
        &self,
        (vi, victim): (usize, &str),
        p: Precision,
        rate_hz: f64,
    ) -> Vec<Cell> {
        let mut cells = vec![self.cell(CellKind::Alone, (vi, victim), p, Some(rate_hz), None)];
        for (ni, n) in self.neighbours.iter().enumerate() {
            for size in self.sizes() {
                let nb = Some((ni, n.as_str(), size));
                cells.push(self.cell(CellKind::Pair, (vi, victim), p, Some(rate_hz), nb));
            }
        }
        cells
    }

    /// (victim index, victim), precision: precision-major, so that a matrix cut short has
    /// every victim at the first precision.
    pub fn each_victim(&self) -> impl Iterator<Item = ((usize, &str), Precision)> + '_ {
        self.precisions.iter().flat_map(move |&p| {
            self.victims
                .iter()
                .enumerate()
                .map(move |(i, v)| ((i, v.as_str()), p))
        })
    }

    /// The victim's rate for a capacity measured as `capacity_jobs_per_s` (ignored for a fixed
    /// rate).
    pub fn victim_rate_hz(&self, capacity_jobs_per_s: Option<f64>) -> Option<f64> {
        match self.rate {
            VictimRate::Hz(h) => Some(h),
            VictimRate::Load(f) => capacity_jobs_per_s
                .filter(|c| c.is_finite() && *c > 0.0)
                .map(|c| c * f),
        }
    }
}

/// A cell folder's name for model `i` of `models`: the model's file-safe name, with its index
/// when another model of the list has the same one (two `model.onnx` in different folders).
fn dir_name(models: &[String], i: usize) -> String {
    let name = workload_name(&models[i]);
    let clash = models
        .iter()
        .enumerate()
        .any(|(j, m)| j != i && workload_name(m) == name);
    if clash {
        format!("{name}_{i}")
    } else {
        name
    }
}

/// The cells a pair is compared with: the victim's alone cell and, when measured, the
/// neighbour's alone cell.
#[derive(Debug, Clone, Copy, Default)]
pub struct References<'a> {
    pub alone: Option<&'a InterferenceCell>,
    pub neighbour_alone: Option<&'a InterferenceCell>,
}

/// The `neighbour` cell among `cells` of `pair`'s neighbour, size and precision.
pub fn neighbour_reference<'a>(
    cells: &'a [InterferenceCell],
    pair: &InterferenceCell,
) -> Option<&'a InterferenceCell> {
    cells.iter().find(|c| {
        c.kind == CellKind::Neighbour
            && c.neighbour == pair.neighbour
            && c.neighbour_size == pair.neighbour_size
            && c.precision == pair.precision
    })
}

/// Fills `cell` from its run: the victim's jobs, timeouts and execution times, the stretch
/// over the victim's alone cell, throughputs (the neighbour's alone one with it), achieved
/// bandwidth of kernel models and the device's telemetry over the run.
pub fn fill_cell(
    cell: &mut InterferenceCell,
    result: &RunResult,
    summary: &RunSummary,
    refs: References<'_>,
) {
    let find = |name: &str| {
        let r = result.workloads.iter().find(|w| w.name == name);
        let s = summary.workloads.iter().find(|w| w.name == name);
        r.zip(s)
    };
    if let Some((r, s)) = find(VICTIM) {
        cell.jobs = s.metrics.jobs;
        cell.timeouts = s.metrics.timeouts;
        cell.timeout_pct = s.metrics.timeout_pct;
        cell.exec_ms = exec_times(&r.records);
        cell.victim_jobs_per_s = Some(s.metrics.throughput_ips / f64::from(s.batch.max(1)));
        cell.victim_work = s.work;
    }
    if let Some((_, s)) = find(NEIGHBOUR) {
        cell.neighbour_jobs_per_s = Some(s.metrics.throughput_ips / f64::from(s.batch.max(1)));
        cell.neighbour_work = s.work;
    }
    let victim_s = cell.exec_ms.p50.map(|ms| ms / 1e3);
    (cell.victim_gb_per_s, cell.victim_tflop_per_s) =
        achieved(cell.victim_work, victim_s.map(|s| 1.0 / s));
    (cell.neighbour_gb_per_s, cell.neighbour_tflop_per_s) =
        achieved(cell.neighbour_work, cell.neighbour_jobs_per_s);
    cell.neighbour_alone_jobs_per_s = refs.neighbour_alone.and_then(|n| n.neighbour_jobs_per_s);
    if let Some(a) = refs.alone {
        cell.alone_p50_ms = a.exec_ms.p50;
        cell.alone_p99_ms = a.exec_ms.p99;
        cell.stretch_p50 = ratio(cell.exec_ms.p50, a.exec_ms.p50);
        cell.stretch_p99 = ratio(cell.exec_ms.p99, a.exec_ms.p99);
    }
    if let Some(t) = &summary.telemetry {
        cell.dram_bw_util_pct = t.dram_bw_util_pct.map(|s| s.mean);
        cell.sm_util_pct = t.sm_util_pct.map(|s| s.mean);
        cell.tensor_util_pct = t.tensor_util_pct.map(|s| s.mean);
    }
}

/// GB/s and TFLOP/s of `work` done `jobs_per_s` times a second.
fn achieved(work: Option<KernelWork>, jobs_per_s: Option<f64>) -> (Option<f64>, Option<f64>) {
    match (work, jobs_per_s.filter(|j| j.is_finite() && *j > 0.0)) {
        (Some(w), Some(j)) => (
            Some(w.bytes as f64 * j / 1e9),
            Some(w.flops as f64 * j / 1e12),
        ),
        _ => (None, None),
    }
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use isolane_core::spec::NoBuiltinModels;

    fn config() -> MatrixConfig {
        MatrixConfig {
            backend: Backend::Cuda,
            gpu: 0,
            mechanism: Mechanism::Green,
            victim_size: Some(48),
            neighbour_sizes: vec![48, 80],
            victims: vec!["spin:1ms".into(), "kernel:gemm:256".into()],
            neighbours: vec!["kernel:triad:64MiB".into()],
            precisions: vec![Precision::Fp16, Precision::Fp32],
            rate: VictimRate::Load(0.5),
            deadline_ms: Some(3.0),
            duration_s: 1.0,
            warmup_jobs: 2,
            neighbour_alone: true,
        }
    }

    #[test]
    fn cells_cover_the_matrix_and_their_scenarios_validate() {
        let c = config();
        c.check().unwrap();
        let caps = c.capacity_cells();
        assert_eq!(caps.len(), 4, "2 victims × 2 precisions");
        assert_eq!(caps[0].entry.dir, "capacity-spin_1ms-fp16");
        assert_eq!(caps[0].scenario.workloads.len(), 1);
        let rated = c.rated_cells((1, "kernel:gemm:256"), Precision::Fp16, 100.0);
        let dirs: Vec<&str> = rated.iter().map(|c| c.entry.dir.as_str()).collect();
        assert_eq!(
            dirs,
            [
                "alone-kernel_gemm_256-fp16",
                "pair-kernel_gemm_256-fp16--kernel_triad_64MiB-48",
                "pair-kernel_gemm_256-fp16--kernel_triad_64MiB-80",
            ]
        );
        let pair = &rated[2].scenario;
        assert_eq!(pair.workloads[0].partition.sms, Some(48));
        assert_eq!(pair.workloads[1].partition.sms, Some(80));
        assert_eq!(pair.workloads[0].deadline_ms, Some(3.0));
        assert_eq!(pair.workloads[1].name, NEIGHBOUR);
        let nbs = c.neighbour_cells(Precision::Fp16);
        let dirs: Vec<&str> = nbs.iter().map(|c| c.entry.dir.as_str()).collect();
        assert_eq!(
            dirs,
            [
                "neighbour-kernel_triad_64MiB-48-fp16",
                "neighbour-kernel_triad_64MiB-80-fp16"
            ]
        );
        assert_eq!(nbs[1].scenario.workloads.len(), 1);
        assert_eq!(nbs[1].scenario.workloads[0].name, NEIGHBOUR);
        assert_eq!(nbs[1].scenario.workloads[0].partition.sms, Some(80));
        let pair = &rated[2].entry;
        let entries: Vec<InterferenceCell> = nbs.iter().map(|c| c.entry.clone()).collect();
        assert_eq!(neighbour_reference(&entries, pair), Some(&entries[1]));
        for cell in caps.iter().chain(&rated).chain(&nbs) {
            cell.scenario
                .validate(&NoBuiltinModels)
                .unwrap_or_else(|e| panic!("{}: {e}", cell.entry.dir));
        }
    }

    #[test]
    fn the_index_records_the_settings() {
        let i = config().index("9.9.9");
        assert_eq!(
            (i.backend.as_str(), i.mechanism.as_str(), i.unit.as_deref()),
            ("cuda", "green", Some("sms"))
        );
        assert_eq!((i.victim_load, i.victim_rate_hz), (Some(0.5), None));
        assert_eq!(i.neighbour_sizes, [48, 80]);
        assert_eq!(i.isolane_version, "9.9.9");
        assert!(i.cells.is_empty());
    }

    #[test]
    fn flag_mistakes_name_the_flag() {
        let mut c = config();
        c.victim_size = None;
        assert!(c.check().unwrap_err().to_string().contains("--victim-size"));
        let mut c = config();
        c.backend = Backend::Cpu;
        assert!(c
            .check()
            .unwrap_err()
            .to_string()
            .contains("--backend cuda"));
        let mut c = config();
        c.mechanism = Mechanism::Timeslice;
        assert_eq!(
            c.check(),
            Err(InterferenceError::SizesNotAllowed("timeslice"))
        );
        let mut c = config();
        c.mechanism = Mechanism::Mps;
        c.victim_size = Some(150);
        assert_eq!(c.check(), Err(InterferenceError::BadPercent(150)));
        let mut c = config();
        c.rate = VictimRate::Load(1.5);
        assert!(c.check().unwrap_err().to_string().contains("--victim-load"));
        let mut c = config();
        c.victims.clear();
        assert_eq!(c.check(), Err(InterferenceError::NoVictims));
    }

    #[test]
    fn the_rate_is_the_load_times_the_capacity() {
        let c = config();
        assert_eq!(c.victim_rate_hz(Some(200.0)), Some(100.0));
        assert_eq!(c.victim_rate_hz(Some(0.0)), None);
        assert_eq!(c.victim_rate_hz(None), None);
        let fixed = MatrixConfig {
            rate: VictimRate::Hz(30.0),
            ..config()
        };
        assert_eq!(fixed.victim_rate_hz(None), Some(30.0));
        assert!(fixed.capacity_cells().is_empty());
    }

    #[test]
    fn a_cell_takes_the_gpm_means_of_its_run() {
        // A committed H100 run (a green partition sweep point), whose telemetry has GPM.
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../results/h100/d-partition-sweep/convnext_large-green/sms-128/summary.json"
        );
        let summary: RunSummary = isolane_core::results::read_json(path.as_ref()).unwrap();
        let t = summary.telemetry.clone().unwrap();
        let result = RunResult {
            t0_ns: None,
            wall_s: 0.0,
            interrupted: false,
            workloads: Vec::new(),
            cpu_steal_pct: None,
            jobs_stream_error: None,
        };
        let mut cell = InterferenceCell::pending("d".into(), CellKind::Pair, "v", "fp16");
        fill_cell(&mut cell, &result, &summary, References::default());
        assert_eq!(cell.dram_bw_util_pct, t.dram_bw_util_pct.map(|s| s.mean));
        assert_eq!(cell.sm_util_pct, t.sm_util_pct.map(|s| s.mean));
        assert_eq!(cell.tensor_util_pct, t.tensor_util_pct.map(|s| s.mean));
        assert!(cell.sm_util_pct.unwrap() > 0.0);
        // Nothing named victim or neighbour ran: no job figures are made up.
        assert_eq!(cell.jobs, 0);
        assert_eq!(cell.stretch_p99, None);
    }

    #[test]
    fn clashing_names_get_their_index() {
        let models = vec!["a/m.onnx".to_string(), "b/m.onnx".to_string(), "x".into()];
        assert_eq!(dir_name(&models, 0), "m_0");
        assert_eq!(dir_name(&models, 1), "m_1");
        assert_eq!(dir_name(&models, 2), "x");
    }

    #[test]
    fn achieved_work_is_per_job_work_times_rate() {
        let w = isolane_core::spec::KernelModel::parse("kernel:triad:12KiB")
            .unwrap()
            .work();
        assert_eq!(w.bytes, 12 * 1024);
        let (gb, tf) = achieved(Some(w), Some(1e6));
        assert!((gb.unwrap() - 12.288).abs() < 1e-9);
        assert!((tf.unwrap() - 2048.0 * 1e6 / 1e12).abs() < 1e-12);
        assert_eq!(achieved(None, Some(1.0)), (None, None));
    }
}
