//! The NVML source: nvml-wrapper's safe layer for every reading, GPM included (Hopper and
//! later; nvml-wrapper 0.13 has `gpm_sample` and `gpm_metrics_get`).
//!
//! NVML is loaded at run time (isolane-gpu finds libnvidia-ml), so the binary builds and runs
//! on machines without it; [`NvmlSource::open`] then fails with [`TelemetryError::NoNvml`].

use std::sync::Mutex;

use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::{Device, GpmSample, Nvml};

use crate::{Reading, Source, TelemetryError};

/// One NVML per process, kept for its life: a `Device` and a `GpmSample` borrow it, and a
/// sampler thread per run (a sweep starts many) must not re-initialise the library each time.
static NVML: Mutex<Option<&'static Nvml>> = Mutex::new(None);

/// NVML's GPM calls are not safe to make from two threads at once, even for two GPUs: on the
/// 2-GPU H100 machine the coordinator of a run on both GPUs died of SIGSEGV inside
/// `nvmlGpmMetricsGet` (GPU 0's sampler) while GPU 1's sampler was in `nvmlGpmSampleGet`, in
/// most runs (a core dump showed both threads there). Every GPM call of the process holds this.
static GPM: Mutex<()> = Mutex::new(());

fn nvml() -> Result<&'static Nvml, TelemetryError> {
    let mut g = NVML.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(n) = *g {
        return Ok(n);
    }
    let n =
        isolane_gpu::mig::nvml::init_nvml().map_err(|e| TelemetryError::NoNvml(e.to_string()))?;
    // Leaked on purpose: one per process (see NVML above).
    let n: &'static Nvml = Box::leak(Box::new(n));
    *g = Some(n);
    Ok(n)
}

const GPM_METRICS: [GpmMetricId; 4] = [
    GpmMetricId::SmUtil,
    GpmMetricId::SmOccupancy,
    GpmMetricId::AnyTensorUtil,
    GpmMetricId::DramBwUtil,
];

/// The queries of one reading.
#[derive(Clone, Copy)]
enum Query {
    Power,
    Energy,
    SmClock,
    Temperature,
    ThrottleReasons,
    MemClock,
    MemoryUsed,
    Utilization,
    Gpm,
    ProcessMemory,
    ProcessUtilization,
}

/// Every query, most important first (see [`crate::refresh_every`]), with its name in
/// summary.json's `refresh_ms`.
const QUERIES: [(Query, &str); 11] = [
    (Query::Power, "power"),
    (Query::Energy, "energy"),
    (Query::SmClock, "sm_clock"),
    (Query::Temperature, "temperature"),
    (Query::ThrottleReasons, "throttle_reasons"),
    (Query::MemClock, "mem_clock"),
    (Query::MemoryUsed, "memory_used"),
    (Query::Utilization, "utilization"),
    (Query::Gpm, "gpm"),
    (Query::ProcessMemory, "process_memory"),
    (Query::ProcessUtilization, "process_utilization"),
];

/// Readings before the query costs are measured and the refresh periods set (every query runs
/// in each of them).
const CALIBRATION_READINGS: u64 = 2;
/// Refresh periods are recomputed from the running costs this often (readings: 1 s at 50 ms).
/// Often, because a query's cost changes with the load: on the H100, with 8 worker processes
/// starting CUDA beside the sampler, the costs measured in the first two readings were a
/// fraction of what they became, and with a 10-s period a 2.5-s run was never recalibrated
/// (the sampler used 3.2 % of a core instead of under 1 %).
const RECALIBRATE_EVERY: u64 = 20;
/// No query is refreshed less often than every this many readings (6.4 s at 50 ms).
const MAX_EVERY: u32 = 128;

pub struct NvmlSource {
    nvml: &'static Nvml,
    device: Device<'static>,
    name: String,
    /// The previous GPM sample: GPM metrics are rates between two samples. `None` on GPUs
    /// without GPM (before Hopper), where the GPM columns stay empty.
    gpm_prev: Option<GpmSample<'static>>,
    gpm: bool,
    /// NVML's CPU timestamp (µs) of the newest per-process utilisation sample read: the next
    /// query asks only for newer ones.
    process_util_seen_us: u64,
    /// Readings taken so far.
    n: u64,
    /// Per query: CPU ns of a run (thread CPU time, so waits inside the driver that do not burn
    /// CPU do not count; a running mean), and every how many readings it runs.
    cost_ns: [u64; QUERIES.len()],
    every: [u32; QUERIES.len()],
    budget_ns: u64,
}

impl Drop for NvmlSource {
    fn drop(&mut self) {
        // Freeing a GPM sample is a GPM call too.
        let _gpm = GPM.lock().unwrap_or_else(|e| e.into_inner());
        self.gpm_prev = None;
    }
}

impl NvmlSource {
    /// Opens GPU `index` (NVML's index; the CUDA index when CUDA_VISIBLE_DEVICES is unset).
    pub fn open(index: u32) -> Result<NvmlSource, TelemetryError> {
        let nvml = nvml()?;
        let device = nvml
            .device_by_index(index)
            .map_err(|e| TelemetryError::Nvml {
                call: "nvmlDeviceGetHandleByIndex_v2",
                error: format!("GPU {index}: {e}"),
            })?;
        let name = device.name().unwrap_or_else(|_| format!("GPU {index}"));
        let gpm = {
            let _gpm = GPM.lock().unwrap_or_else(|e| e.into_inner());
            device.gpm_support().unwrap_or(false)
        };
        Ok(NvmlSource {
            nvml,
            device,
            name,
            gpm_prev: None,
            gpm,
            process_util_seen_us: 0,
            n: 0,
            cost_ns: [0; QUERIES.len()],
            every: [1; QUERIES.len()],
            // Until told the period: 0.4 % of 50 ms.
            budget_ns: 200_000,
        })
    }

    fn read_gpm(&mut self, r: &mut Reading) {
        if !self.gpm {
            return;
        }
        let _gpm = GPM.lock().unwrap_or_else(|e| e.into_inner());
        let Ok(now) = self.device.gpm_sample() else {
            return;
        };
        if let Some(prev) = self.gpm_prev.take() {
            if let Ok(results) =
                nvml_wrapper::gpm::gpm_metrics_get(self.nvml, &prev, &now, &GPM_METRICS)
            {
                for m in results.into_iter().flatten() {
                    let v = Some(m.value);
                    match m.metric_id {
                        GpmMetricId::SmUtil => r.sm_util_pct = v,
                        GpmMetricId::SmOccupancy => r.sm_occupancy_pct = v,
                        GpmMetricId::AnyTensorUtil => r.tensor_util_pct = v,
                        GpmMetricId::DramBwUtil => r.dram_bw_util_pct = v,
                        _ => {}
                    }
                }
            }
        }
        self.gpm_prev = Some(now);
    }

    /// SM utilisation per process since the previous query (the mean of NVML's samples of
    /// each pid). NVML says NotFound when no process has a sample: nobody used the SMs.
    fn read_process_util(&mut self) -> Option<Vec<(u32, f64)>> {
        let since = self.process_util_seen_us;
        let samples = match self.device.process_utilization_stats(since) {
            Ok(s) => s,
            Err(nvml_wrapper::error::NvmlError::NotFound) => return Some(Vec::new()),
            Err(_) => return None,
        };
        let mut per_pid: std::collections::BTreeMap<u32, (f64, u32)> = Default::default();
        for s in &samples {
            self.process_util_seen_us = self.process_util_seen_us.max(s.timestamp);
            let e = per_pid.entry(s.pid).or_insert((0.0, 0));
            *e = (e.0 + f64::from(s.sm_util), e.1 + 1);
        }
        Some(
            per_pid
                .into_iter()
                .map(|(pid, (sum, n))| (pid, sum / f64::from(n)))
                .collect(),
        )
    }

    /// Runs query `q` into `r`.
    fn query(&mut self, q: Query, r: &mut Reading) {
        let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
        let d = &self.device;
        match q {
            Query::Power => r.power_w = d.power_usage().ok().map(|mw| f64::from(mw) / 1000.0),
            Query::Energy => r.energy_counter_mj = d.total_energy_consumption().ok(),
            Query::SmClock => r.sm_clock_mhz = d.clock_info(Clock::SM).ok().map(f64::from),
            Query::MemClock => r.mem_clock_mhz = d.clock_info(Clock::Memory).ok().map(f64::from),
            Query::Temperature => {
                r.temperature_c = d.temperature(TemperatureSensor::Gpu).ok().map(f64::from)
            }
            Query::ThrottleReasons => {
                r.throttle_reasons = d.current_throttle_reasons().ok().map(|t| t.bits())
            }
            Query::MemoryUsed => r.memory_used_mib = d.memory_info().ok().map(|m| mib(m.used)),
            Query::Utilization => {
                let util = d.utilization_rates().ok();
                r.gpu_util_pct = util.as_ref().map(|u| f64::from(u.gpu));
                r.mem_util_pct = util.as_ref().map(|u| f64::from(u.memory));
            }
            Query::Gpm => self.read_gpm(r),
            Query::ProcessUtilization => r.process_sm_util_pct = self.read_process_util(),
            Query::ProcessMemory => {
                r.process_memory_mib = d
                    .running_compute_processes()
                    .map(|ps| {
                        ps.into_iter()
                            .filter_map(|p| match p.used_gpu_memory {
                                UsedGpuMemory::Used(b) => Some((p.pid, mib(b))),
                                UsedGpuMemory::Unavailable => None,
                            })
                            .collect()
                    })
                    .unwrap_or_default()
            }
        }
    }
}

impl Source for NvmlSource {
    fn device(&self) -> String {
        self.name.clone()
    }

    fn kind(&self) -> &'static str {
        "nvml"
    }

    /// Each query on its own: one the GPU does not support (NotSupported) leaves its field
    /// empty and the others still count. Measured on the H100 (driver 580), reading everything
    /// every 50 ms cost 6–10 % of a core, so each query's CPU time is measured and the costly
    /// ones are refreshed less often, within [`crate::READ_CPU_BUDGET`]; their columns are
    /// empty in the readings that skip them (summary.json lists the refresh periods).
    fn read(&mut self) -> Reading {
        let mut r = Reading::default();
        for (q, &(query, _)) in QUERIES.iter().enumerate() {
            if !self.n.is_multiple_of(u64::from(self.every[q])) {
                continue;
            }
            let t = crate::thread_cpu_ns();
            self.query(query, &mut r);
            let cost = (crate::thread_cpu_ns() - t).max(0) as u64;
            // The first reading pays each query's one-time set-up inside NVML (counting it
            // pushed power to one read in 6.4 s on the H100), so the estimate starts at the
            // second; after that it is the mean of this run and the
            // earlier estimate, so that one slow call (a driver lock held elsewhere) does not
            // swing the refresh period by itself.
            self.cost_ns[q] = if self.n < CALIBRATION_READINGS {
                cost
            } else {
                (self.cost_ns[q] + cost) / 2
            };
        }
        self.n += 1;
        if self.n == CALIBRATION_READINGS || self.n.is_multiple_of(RECALIBRATE_EVERY) {
            let every = crate::refresh_every(&self.cost_ns, self.budget_ns, MAX_EVERY);
            self.every.copy_from_slice(&every);
        }
        r
    }

    fn set_budget(&mut self, period: std::time::Duration, cpu_fraction: f64) {
        self.budget_ns = (period.as_nanos() as f64 * cpu_fraction) as u64;
    }

    fn refresh_every(&self) -> Vec<(&'static str, u32)> {
        QUERIES
            .iter()
            .map(|&(_, name)| name)
            .zip(self.every)
            .collect()
    }
}
