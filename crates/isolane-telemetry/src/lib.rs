//! isolane-telemetry: device telemetry sampled on its own thread while a run goes on.
//!
//! A [`Source`] reads one [`Reading`] of the device (NVML on a real GPU: [`nvml::NvmlSource`];
//! a fake in tests); the [`Sampler`] reads it every period (50 ms by default) on an absolute
//! schedule until stopped, and accounts for its own CPU time. The [`Recording`] it returns
//! becomes `telemetry.csv` ([`Recording::csv`]) and the `telemetry` object of summary.json
//! ([`Recording::summary`]), with DESIGN.md's metric names. See docs/report.md.

// One unsafe operation per block, each with its own SAFETY comment (root Cargo.toml).
#![warn(clippy::multiple_unsafe_ops_per_block)]

pub mod nvml;
mod programs;

pub use programs::attach_programs;

use isolane_core::files::write_atomic;
use isolane_core::results::RunSummary;
pub use isolane_core::results::{EnergySource, Stat, TelemetrySummary};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// The sampling period unless told otherwise.
pub const DEFAULT_PERIOD: Duration = Duration::from_millis(50);

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// NVML could not be loaded or initialised: no driver, or not an NVIDIA machine.
    #[error("NVML is not available ({0}); telemetry needs the NVIDIA driver's libnvidia-ml")]
    NoNvml(String),
    #[error("NVML: {call} failed: {error}")]
    Nvml { call: &'static str, error: String },
    #[error("starting the telemetry thread: {0}")]
    Thread(std::io::Error),
    #[error("the telemetry thread panicked")]
    Panicked,
    #[error("{path}: {source}")]
    Io {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
}

/// One reading of the device. Every field is optional: a GPU or driver that does not support a
/// query leaves it empty rather than failing the sample.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reading {
    pub power_w: Option<f64>,
    /// The driver's total energy counter in mJ (monotonic until the driver reloads or it
    /// wraps); energy comes from its deltas when it is there.
    pub energy_counter_mj: Option<u64>,
    pub sm_clock_mhz: Option<f64>,
    pub mem_clock_mhz: Option<f64>,
    pub temperature_c: Option<f64>,
    /// NVML's clock throttle reason bits (see [`THROTTLE_REASONS`]).
    pub throttle_reasons: Option<u64>,
    pub memory_used_mib: Option<f64>,
    pub gpu_util_pct: Option<f64>,
    pub mem_util_pct: Option<f64>,
    /// NVML GPM (Hopper and later), over the interval since the previous reading.
    pub sm_util_pct: Option<f64>,
    pub sm_occupancy_pct: Option<f64>,
    pub tensor_util_pct: Option<f64>,
    pub dram_bw_util_pct: Option<f64>,
    /// Device memory per process: (pid, MiB).
    pub process_memory_mib: Vec<(u32, f64)>,
    /// SM utilisation per process since the previous reading: (pid, % of the device), from
    /// NVML's per-process samples; `None` when not read (unsupported, or skipped this time),
    /// empty when no process used the SMs.
    pub process_sm_util_pct: Option<Vec<(u32, f64)>>,
}

/// Something that reads the device: NVML, or a fake in tests.
pub trait Source: Send {
    /// The device's name, for the summary.
    fn device(&self) -> String;
    /// `"nvml"`, `"fake"`, …
    fn kind(&self) -> &'static str;
    fn read(&mut self) -> Reading;
    /// Tells the source how often it is read and what share of one core its reads may cost,
    /// so that it can refresh expensive queries less often (see [`refresh_every`]).
    fn set_budget(&mut self, _period: Duration, _cpu_fraction: f64) {}
    /// Per query, every how many readings it is refreshed (1 = every reading), for the summary.
    fn refresh_every(&self) -> Vec<(&'static str, u32)> {
        Vec::new()
    }
}

/// Share of one core the sampler's reads may use; the goal for the whole sampler is under 1 %.
pub const READ_CPU_BUDGET: f64 = 0.004;

/// Every how many readings each query should run so that their summed CPU cost per reading,
/// `Σ cost_i / every_i`, fits `budget_ns`: the query contributing most is halved (its `every`
/// doubled) until it fits or every query is at `max_every`. Queries listed first win ties, so a
/// source lists what matters most (power, energy) first.
pub fn refresh_every(costs_ns: &[u64], budget_ns: u64, max_every: u32) -> Vec<u32> {
    let mut every = vec![1u32; costs_ns.len()];
    let load = |every: &[u32]| -> f64 {
        costs_ns
            .iter()
            .zip(every)
            .map(|(&c, &e)| c as f64 / f64::from(e))
            .sum()
    };
    while load(&every) > budget_ns as f64 {
        let worst = (0..costs_ns.len())
            .filter(|&i| every[i] < max_every)
            .max_by(|&a, &b| {
                let ca = costs_ns[a] as f64 / f64::from(every[a]);
                let cb = costs_ns[b] as f64 / f64::from(every[b]);
                // On a tie the later query (the less important one) is slowed first.
                ca.total_cmp(&cb).then(a.cmp(&b))
            });
        match worst {
            Some(i) => every[i] = (every[i] * 2).min(max_every),
            None => break,
        }
    }
    every
}

/// A reading with the time it was taken.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Absolute CLOCK_MONOTONIC ns: the clock the runtime's t0 is on.
    pub t_ns: i64,
    pub reading: Reading,
}

fn clock_ns(clock: libc::clockid_t) -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; both clocks used here exist on Linux.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

/// CLOCK_MONOTONIC in ns (the runtime's clock).
pub fn now_ns() -> i64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// CPU time the calling thread has used, in ns.
pub fn thread_cpu_ns() -> i64 {
    clock_ns(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// What a finished sampler hands back.
#[derive(Debug, Clone)]
pub struct Recording {
    pub device: String,
    pub source: &'static str,
    pub period: Duration,
    pub samples: Vec<Sample>,
    /// CPU time of the sampling thread from its start to its end (reads, bookkeeping, sleeps'
    /// wake-ups), and the wall time it covers.
    pub cpu_ns: i64,
    pub wall_ns: i64,
    /// Periods in which the reading took so long that the next release had already passed
    /// (the sampler then skips ahead instead of bursting).
    pub overruns: u64,
    /// Per query, every how many readings the source refreshed it (see [`Source::set_budget`]).
    pub refresh_every: Vec<(&'static str, u32)>,
}

/// Called on the sampler's thread with every reading as it is taken (live metrics): it must
/// be quick, since the next reading waits for it.
pub type SampleHook = Arc<dyn Fn(&Reading) + Send + Sync>;

/// The sampling thread; stop it with [`Sampler::stop`] (dropping it also stops and joins it).
pub struct Sampler {
    shared: Arc<(Mutex<bool>, Condvar)>,
    stopped: Arc<AtomicBool>,
    handle: Option<JoinHandle<Recording>>,
}

impl Sampler {
    /// Starts sampling `source` every `period` (first reading at once).
    pub fn start(source: Box<dyn Source>, period: Duration) -> Result<Sampler, TelemetryError> {
        Self::start_observed(source, period, None)
    }

    /// [`Sampler::start`], showing every reading to `hook` as well.
    pub fn start_observed(
        source: Box<dyn Source>,
        period: Duration,
        hook: Option<SampleHook>,
    ) -> Result<Sampler, TelemetryError> {
        Self::start_with_budget(source, period, hook, READ_CPU_BUDGET)
    }

    /// [`Sampler::start_observed`] with the share of one core its reads may use: a run on
    /// several GPUs has a sampler per GPU, and they share [`READ_CPU_BUDGET`] among them so
    /// that the run's sampling costs what one GPU's did.
    pub fn start_with_budget(
        source: Box<dyn Source>,
        period: Duration,
        hook: Option<SampleHook>,
        cpu_fraction: f64,
    ) -> Result<Sampler, TelemetryError> {
        let shared = Arc::new((Mutex::new(false), Condvar::new()));
        let stopped = Arc::new(AtomicBool::new(false));
        let (s2, st2) = (Arc::clone(&shared), Arc::clone(&stopped));
        let handle = std::thread::Builder::new()
            .name("isolane:telemetry".into())
            .spawn(move || sample_loop(source, period, cpu_fraction, hook, &s2, &st2))
            .map_err(TelemetryError::Thread)?;
        Ok(Sampler {
            shared,
            stopped,
            handle: Some(handle),
        })
    }

    /// Stops the thread (waking it from its sleep at once), joins it and returns what it read.
    pub fn stop(mut self) -> Result<Recording, TelemetryError> {
        self.signal();
        self.handle
            .take()
            .map(|h| h.join().map_err(|_| TelemetryError::Panicked))
            .unwrap_or(Err(TelemetryError::Panicked))
    }

    fn signal(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        let (lock, cv) = &*self.shared;
        *lock.lock().unwrap_or_else(|e| e.into_inner()) = true;
        cv.notify_all();
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        if let Some(h) = self.handle.take() {
            self.signal();
            let _ = h.join();
        }
    }
}

fn sample_loop(
    mut source: Box<dyn Source>,
    period: Duration,
    cpu_fraction: f64,
    hook: Option<SampleHook>,
    shared: &(Mutex<bool>, Condvar),
    stopped: &AtomicBool,
) -> Recording {
    source.set_budget(period, cpu_fraction);
    let cpu0 = thread_cpu_ns();
    let start = now_ns();
    let period_ns = (period.as_nanos() as i64).max(1);
    // Reserve for a long run up front so the loop does not reallocate in the middle of it.
    let mut samples = Vec::with_capacity(4096);
    let mut overruns = 0u64;
    let mut k: i64 = 0;
    let (lock, cv) = shared;
    loop {
        let reading = source.read();
        if let Some(h) = &hook {
            h(&reading);
        }
        samples.push(Sample {
            t_ns: now_ns(),
            reading,
        });
        // Absolute schedule (start + k·period), as the release loop does, so the period does
        // not drift by the time each reading takes.
        k += 1;
        let mut next = start + k * period_ns;
        let now = now_ns();
        if next <= now {
            overruns += 1;
            k = (now - start) / period_ns + 1;
            next = start + k * period_ns;
        }
        let mut stop = lock.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if *stop || stopped.load(Ordering::SeqCst) {
                drop(stop);
                let end = now_ns();
                return Recording {
                    device: source.device(),
                    source: source.kind(),
                    period,
                    samples,
                    cpu_ns: thread_cpu_ns() - cpu0,
                    wall_ns: end - start,
                    overruns,
                    refresh_every: source.refresh_every(),
                };
            }
            let left = next - now_ns();
            if left <= 0 {
                break;
            }
            stop = cv
                .wait_timeout(stop, Duration::from_nanos(left as u64))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// NVML's clock throttle reason bits (`nvmlClocksThrottleReason*`) and their names in
/// telemetry.csv and summary.json.
pub const THROTTLE_REASONS: &[(u64, &str)] = &[
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
];

pub fn throttle_names(bits: u64) -> Vec<&'static str> {
    let mut v: Vec<&'static str> = THROTTLE_REASONS
        .iter()
        .filter(|(b, _)| bits & b != 0)
        .map(|(_, n)| *n)
        .collect();
    let known: u64 = THROTTLE_REASONS.iter().map(|(b, _)| b).sum();
    if bits & !known != 0 {
        v.push("other");
    }
    v
}

/// Cumulative energy (J) at each sample since the first, and how it was obtained. An interval
/// uses the counter's delta when both ends have it and it did not go backwards (a wrap, or a
/// driver reload, resets it); otherwise the trapezoid of the power readings (one end's power
/// when only one has it); with neither the interval adds nothing.
pub fn cumulative_energy_j(samples: &[Sample]) -> (Vec<f64>, EnergySource) {
    // Power integrated over every interval (trapezoids; one-sided where a reading lacks it).
    let mut by_power = Vec::with_capacity(samples.len());
    let mut power_intervals = vec![false; samples.len()];
    let mut acc = 0.0;
    for (i, s) in samples.iter().enumerate() {
        if i > 0 {
            let p = &samples[i - 1];
            let dt = (s.t_ns - p.t_ns) as f64 / 1e9;
            let w = match (p.reading.power_w, s.reading.power_w) {
                (Some(a), Some(b)) => Some((a + b) / 2.0),
                (a, b) => a.or(b),
            };
            if let Some(w) = w {
                acc += w * dt;
                power_intervals[i] = true;
            }
        }
        by_power.push(acc);
    }
    // The counter is authoritative between two readings that have it (the sampler may read it
    // only every k-th time, see `Source::refresh_every`): the span gets the counter's delta,
    // shared among its intervals in proportion to their integrated power (or time, at zero
    // power). Spans without two counter readings, or where the counter went backwards (a wrap
    // or a driver reload), keep the integrated power.
    let mut out = Vec::with_capacity(samples.len());
    let mut by_counter = vec![false; samples.len()];
    let mut last: Option<(usize, u64)> = samples
        .first()
        .and_then(|s| s.reading.energy_counter_mj)
        .map(|c| (0, c));
    let mut acc = 0.0;
    if !samples.is_empty() {
        out.push(0.0);
    }
    for i in 1..samples.len() {
        // Default for this interval: integrated power.
        acc += by_power[i] - by_power[i - 1];
        out.push(acc);
        let Some(b) = samples[i].reading.energy_counter_mj else {
            continue;
        };
        if let Some((j, a)) = last {
            if b >= a {
                let delta = (b - a) as f64 / 1000.0;
                let base = out[j];
                let span_p = by_power[i] - by_power[j];
                let span_t = (samples[i].t_ns - samples[j].t_ns).max(1) as f64;
                for k in j + 1..=i {
                    let frac = if span_p > 0.0 {
                        (by_power[k] - by_power[j]) / span_p
                    } else {
                        (samples[k].t_ns - samples[j].t_ns) as f64 / span_t
                    };
                    out[k] = base + delta * frac;
                    by_counter[k] = true;
                }
                acc = out[i];
            }
        }
        last = Some((i, b));
    }
    let counter = by_counter.iter().filter(|&&c| c).count();
    let power = (0..samples.len())
        .filter(|&k| power_intervals[k] && !by_counter[k])
        .count();
    let source = match (counter, power) {
        (0, 0) => EnergySource::None,
        (_, 0) => EnergySource::Counter,
        (0, _) => EnergySource::IntegratedPower,
        _ => EnergySource::Mixed,
    };
    (out, source)
}

/// Energy (J) used between two instants (CLOCK_MONOTONIC ns), interpolating the cumulative
/// energy linearly between samples; the window is clipped to the samples' span.
pub fn energy_between_j(samples: &[Sample], cumulative: &[f64], from_ns: i64, to_ns: i64) -> f64 {
    let at = |t: i64| -> f64 {
        let Some(first) = samples.first() else {
            return 0.0;
        };
        if t <= first.t_ns {
            return cumulative[0];
        }
        let i = samples.partition_point(|s| s.t_ns <= t);
        if i >= samples.len() {
            return cumulative[samples.len() - 1];
        }
        let (a, b) = (&samples[i - 1], &samples[i]);
        let f = (t - a.t_ns) as f64 / (b.t_ns - a.t_ns).max(1) as f64;
        cumulative[i - 1] + f * (cumulative[i] - cumulative[i - 1])
    };
    (at(to_ns) - at(from_ns)).max(0.0)
}

fn stat(values: impl Iterator<Item = f64>) -> Option<Stat> {
    let (mut n, mut sum, mut min, mut max) = (0usize, 0.0, f64::INFINITY, f64::NEG_INFINITY);
    for v in values.filter(|v| v.is_finite()) {
        n += 1;
        sum += v;
        min = min.min(v);
        max = max.max(v);
    }
    (n > 0).then(|| Stat {
        mean: sum / n as f64,
        min,
        max,
    })
}

impl Recording {
    /// The sampler's CPU use as % of one core.
    pub fn cpu_pct(&self) -> f64 {
        if self.wall_ns <= 0 {
            0.0
        } else {
            100.0 * self.cpu_ns as f64 / self.wall_ns as f64
        }
    }

    /// Summary over `[from_ns, to_ns]` (absolute CLOCK_MONOTONIC; the run's t0 and end), or
    /// over every sample with `None`.
    pub fn summary(&self, window: Option<(i64, i64)>) -> TelemetrySummary {
        let (from, to) = window.unwrap_or((
            self.samples.first().map_or(0, |s| s.t_ns),
            self.samples.last().map_or(0, |s| s.t_ns),
        ));
        let inside: Vec<&Reading> = self
            .samples
            .iter()
            .filter(|s| s.t_ns >= from && s.t_ns <= to)
            .map(|s| &s.reading)
            .collect();
        let st = |f: fn(&Reading) -> Option<f64>| stat(inside.iter().filter_map(|r| f(r)));
        let (cumulative, energy_source) = cumulative_energy_j(&self.samples);
        let energy_j = (energy_source != EnergySource::None && self.samples.len() > 1)
            .then(|| energy_between_j(&self.samples, &cumulative, from, to));
        let bits = inside
            .iter()
            .filter_map(|r| r.throttle_reasons)
            .fold(0u64, |a, b| a | b);
        TelemetrySummary {
            source: self.source.to_string(),
            device: self.device.clone(),
            gpu: None,
            period_ms: self.period.as_secs_f64() * 1e3,
            samples: inside.len(),
            duration_s: (to - from).max(0) as f64 / 1e9,
            power_w: st(|r| r.power_w),
            energy_j,
            energy_source,
            sm_clock_mhz: st(|r| r.sm_clock_mhz),
            mem_clock_mhz: st(|r| r.mem_clock_mhz),
            temperature_c: st(|r| r.temperature_c),
            throttle_reasons: throttle_names(bits).into_iter().map(String::from).collect(),
            memory_used_mib: st(|r| r.memory_used_mib),
            gpu_util_pct: st(|r| r.gpu_util_pct),
            sm_util_pct: st(|r| r.sm_util_pct),
            sm_occupancy_pct: st(|r| r.sm_occupancy_pct),
            tensor_util_pct: st(|r| r.tensor_util_pct),
            dram_bw_util_pct: st(|r| r.dram_bw_util_pct),
            sampler_cpu_s: self.cpu_ns as f64 / 1e9,
            sampler_cpu_pct: self.cpu_pct(),
            sampler_overruns: self.overruns,
            refresh_ms: self
                .refresh_every
                .iter()
                .filter(|(_, e)| *e > 1)
                .map(|(q, e)| {
                    (
                        q.to_string(),
                        f64::from(*e) * self.period.as_secs_f64() * 1e3,
                    )
                })
                .collect(),
        }
    }

    /// Peak device memory (MiB) a process held in any sample.
    pub fn process_peak_mib(&self, pid: u32) -> Option<f64> {
        stat(self.samples.iter().flat_map(|s| {
            s.reading
                .process_memory_mib
                .iter()
                .filter(move |(p, _)| *p == pid)
                .map(|(_, m)| *m)
        }))
        .map(|s| s.max)
    }

    /// telemetry.csv: one row per sample, `t_s` in seconds since `origin_ns` (the run's t0:
    /// samples before it are negative), empty cells for what the device did not report.
    pub fn csv(&self, origin_ns: i64) -> String {
        let mut s = String::with_capacity(160 * (self.samples.len() + 1));
        s.push_str(CSV_HEADER);
        s.push('\n');
        for (t_s, cells) in self.csv_rows(origin_ns) {
            s.push_str(&format!("{t_s:.3},{cells}\n"));
        }
        s
    }

    /// Each sample as `(t_s, the cells after t_s joined by commas)`.
    fn csv_rows(&self, origin_ns: i64) -> Vec<(f64, String)> {
        let (cumulative, _) = cumulative_energy_j(&self.samples);
        self.samples
            .iter()
            .zip(&cumulative)
            .map(|(sample, energy)| {
                let t_s = (sample.t_ns - origin_ns) as f64 / 1e9;
                (t_s, csv_cells(&sample.reading, *energy))
            })
            .collect()
    }
}

/// The cells of one reading after `t_s`, in [`CSV_HEADER`]'s order.
fn csv_cells(r: &Reading, energy_j: f64) -> String {
    let f = |v: Option<f64>, d: usize| v.map(|x| format!("{x:.d$}")).unwrap_or_default();
    let procs: Vec<String> = r
        .process_memory_mib
        .iter()
        .map(|(p, m)| format!("{p}:{m:.0}"))
        .collect();
    format!(
        "{},{:.3},{},{},{},{},{},{},{},{},{},{},{},{}",
        f(r.power_w, 2),
        energy_j,
        f(r.sm_clock_mhz, 0),
        f(r.mem_clock_mhz, 0),
        f(r.temperature_c, 0),
        r.throttle_reasons
            .map(|b| throttle_names(b).join("|"))
            .unwrap_or_default(),
        f(r.memory_used_mib, 1),
        f(r.gpu_util_pct, 0),
        f(r.mem_util_pct, 0),
        f(r.sm_util_pct, 1),
        f(r.sm_occupancy_pct, 1),
        f(r.tensor_util_pct, 1),
        f(r.dram_bw_util_pct, 1),
        procs.join("|"),
    )
}

/// telemetry.csv of a run: one GPU's is [`Recording::csv`], unchanged from before several GPUs
/// existed; several GPUs' have a [`CSV_GPU_COLUMN`] after `t_s` (the GPU's device index) and
/// every GPU's samples in time order (a GPU's `energy_j` is cumulative since its own first
/// sample). Readers pick the columns by name, so both shapes read.
pub fn run_csv(gpus: &[GpuTelemetry], origin_ns: i64) -> String {
    if let [one] = gpus {
        return one.recording.csv(origin_ns);
    }
    let mut rows: Vec<(f64, u32, String)> = gpus
        .iter()
        .flat_map(|g| {
            g.recording
                .csv_rows(origin_ns)
                .into_iter()
                .map(move |(t, cells)| (t, g.gpu, cells))
        })
        .collect();
    rows.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let rest = CSV_HEADER.strip_prefix("t_s,").unwrap_or(CSV_HEADER);
    let mut s = String::with_capacity(170 * (rows.len() + 1));
    s.push_str(&format!("t_s,{CSV_GPU_COLUMN},{rest}\n"));
    for (t_s, gpu, cells) in rows {
        s.push_str(&format!("{t_s:.3},{gpu},{cells}\n"));
    }
    s
}

/// The column of telemetry.csv that names each row's GPU, in a run on several GPUs.
pub const CSV_GPU_COLUMN: &str = "gpu";

/// Columns of telemetry.csv (docs/report.md). `energy_j` is cumulative since the first sample;
/// `throttle_reasons` and `process_memory_mib` (`pid:MiB`) are `|`-separated lists.
pub const CSV_HEADER: &str = "t_s,power_w,energy_j,sm_clock_mhz,mem_clock_mhz,temperature_c,\
throttle_reasons,memory_used_mib,gpu_util_pct,mem_util_pct,sm_util_pct,sm_occupancy_pct,\
tensor_util_pct,dram_bw_util_pct,process_memory_mib";

/// Adds a run's telemetry to its summary: the `telemetry` object, and per workload what can
/// be attributed to it. Energy is attributed only when the workload ran alone (the device's
/// energy is then its energy): `energy_j` and `j_per_image`. Device memory is attributed by
/// process: a workload in its own worker process gets its pid's peak; a run of one workload on
/// a thread gets this process's.
pub fn attach(summary: &mut RunSummary, rec: &Recording, t: &TelemetrySummary) {
    summary.telemetry = Some(t.clone());
    attach_on(summary, rec, t, &|_| true);
}

/// [`attach`] for a run on any number of GPUs, `gpu_of` naming each workload's GPU (`None`:
/// a workload on the CPU). One GPU is [`attach`]. Several GPUs fill `telemetry_per_gpu`
/// instead of `telemetry`, and each GPU's recording is attributed among the workloads on that
/// GPU only: a workload alone on its GPU gets that GPU's energy, a pid's memory is its memory
/// on its own GPU, a command workload's SM share is of its GPU's processes.
pub fn attach_gpus(
    summary: &mut RunSummary,
    gpus: &[GpuTelemetry],
    gpu_of: &dyn Fn(&str) -> Option<u32>,
) {
    if let [one] = gpus {
        attach(summary, &one.recording, &one.summary);
        return;
    }
    summary.telemetry = None;
    summary.telemetry_per_gpu = gpus.iter().map(|g| g.summary.clone()).collect();
    for g in gpus {
        attach_on(summary, &g.recording, &g.summary, &|name| {
            gpu_of(name) == Some(g.gpu)
        });
    }
}

/// Attributes one device's recording among the workloads that `on` says ran on it.
fn attach_on(
    summary: &mut RunSummary,
    rec: &Recording,
    t: &TelemetrySummary,
    on: &dyn Fn(&str) -> bool,
) {
    programs::attach_programs_on(summary, rec, on);
    let alone = summary.workloads.iter().filter(|w| on(&w.name)).count() == 1;
    let own_pid = std::process::id();
    for w in summary.workloads.iter_mut().filter(|w| on(&w.name)) {
        if w.program.is_some() {
            // A program's memory is its process tree's and its energy is attributed by its
            // SM share (attach_programs), never the device's as a whole.
            continue;
        }
        let mem = match (w.pid, alone) {
            (Some(p), _) => rec.process_peak_mib(p),
            (None, true) => rec.process_peak_mib(own_pid),
            (None, false) => None,
        };
        if let Some(m) = mem {
            w.metrics.gpu_memory_mib = Some(m);
        }
        if alone {
            if let Some(e) = t.energy_j {
                let images = w.metrics.completed * u64::from(w.batch);
                w.metrics.energy_j = Some(e);
                w.metrics.j_per_image = (images > 0).then(|| e / images as f64);
            }
        }
    }
}

/// One GPU's telemetry over a run: what its sampler read and the summary over the run.
#[derive(Debug, Clone)]
pub struct GpuTelemetry {
    /// The device index sampled.
    pub gpu: u32,
    pub recording: Recording,
    /// Over the run's window; its `gpu` is set in a run on several GPUs.
    pub summary: TelemetrySummary,
}

/// Telemetry for one run, the way `isolane run` uses it: started before t0, finished after
/// the run with its window, written next to the other results. A run on several GPUs has a
/// sampler thread per GPU (each GPU's readings on their own absolute schedule; a slow query
/// on one GPU does not delay the other's).
pub struct RunTelemetry {
    samplers: Vec<(u32, Sampler)>,
}

impl RunTelemetry {
    /// Starts sampling every GPU of `gpus` through NVML, showing each reading of the first to
    /// `hook` too (the live gauges have no GPU label: they follow the first GPU). Without NVML,
    /// or with a GPU NVML cannot open, this is an error the caller turns into a warning: a run
    /// goes on without telemetry.
    pub fn start(
        gpus: &[u32],
        period: Duration,
        hook: Option<SampleHook>,
    ) -> Result<RunTelemetry, TelemetryError> {
        let mut sources: Vec<(u32, Box<dyn Source>)> = Vec::with_capacity(gpus.len());
        for &gpu in gpus {
            sources.push((gpu, Box::new(nvml::NvmlSource::open(gpu)?)));
        }
        Self::start_sources(sources, period, hook)
    }

    /// [`RunTelemetry::start`] on given sources, one per GPU (a fake in tests).
    pub fn start_sources(
        sources: Vec<(u32, Box<dyn Source>)>,
        period: Duration,
        hook: Option<SampleHook>,
    ) -> Result<RunTelemetry, TelemetryError> {
        let share = READ_CPU_BUDGET / sources.len().max(1) as f64;
        let mut hook = hook;
        let mut samplers = Vec::with_capacity(sources.len());
        for (gpu, source) in sources {
            // Dropping the samplers started so far (on an error) stops and joins them.
            let sampler = Sampler::start_with_budget(source, period, hook.take(), share)?;
            samplers.push((gpu, sampler));
        }
        Ok(RunTelemetry { samplers })
    }

    /// Stops sampling; writes `telemetry.csv` into `dir` (times since `t0_ns`, see
    /// [`run_csv`]) and returns each GPU's recording and summary over the run (`t0_ns` to
    /// `t0_ns + wall_s`), in the order the GPUs were given.
    pub fn finish(
        self,
        dir: &std::path::Path,
        t0_ns: Option<i64>,
        wall_s: f64,
    ) -> Result<Vec<GpuTelemetry>, TelemetryError> {
        let several = self.samplers.len() > 1;
        let window = t0_ns.map(|t0| (t0, t0 + (wall_s * 1e9) as i64));
        let mut gpus = Vec::with_capacity(self.samplers.len());
        for (gpu, sampler) in self.samplers {
            let recording = sampler.stop()?;
            let mut summary = recording.summary(window);
            summary.gpu = several.then_some(gpu);
            gpus.push(GpuTelemetry {
                gpu,
                recording,
                summary,
            });
        }
        let origin = t0_ns.unwrap_or_else(|| {
            gpus.iter()
                .filter_map(|g| g.recording.samples.first().map(|s| s.t_ns))
                .min()
                .unwrap_or(0)
        });
        let path = dir.join("telemetry.csv");
        write_atomic(&path, run_csv(&gpus, origin).as_bytes())
            .map_err(|source| TelemetryError::Io { path, source })?;
        Ok(gpus)
    }
}

#[cfg(test)]
mod tests;
