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

pub struct NvmlSource {
    nvml: &'static Nvml,
    device: Device<'static>,
    name: String,
    /// The previous GPM sample: GPM metrics are rates between two samples. `None` on GPUs
    /// without GPM (before Hopper), where the GPM columns stay empty.
    gpm_prev: Option<GpmSample<'static>>,
    gpm: bool,
}

impl NvmlSource {
    /// Opens GPU `index` (NVML's index; the CUDA index when CUDA_VISIBLE_DEVICES is unset).
    pub fn open(index: u32) -> Result<NvmlSource, TelemetryError> {
        let nvml = nvml()?;
        let device = nvml
            .device_by_index(index)
            .map_err(|e| TelemetryError::Nvml {
                call: "nvmlDeviceGetHandleByIndex_v2",
                error: e.to_string(),
            })?;
        let name = device.name().unwrap_or_else(|_| format!("GPU {index}"));
        let gpm = device.gpm_support().unwrap_or(false);
        Ok(NvmlSource {
            nvml,
            device,
            name,
            gpm_prev: None,
            gpm,
        })
    }

    fn read_gpm(&mut self, r: &mut Reading) {
        if !self.gpm {
            return;
        }
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
}

impl Source for NvmlSource {
    fn device(&self) -> String {
        self.name.clone()
    }

    fn kind(&self) -> &'static str {
        "nvml"
    }

    /// Each query on its own: one the GPU does not support (NotSupported) leaves its field
    /// empty and the others still count.
    fn read(&mut self) -> Reading {
        let d = &self.device;
        let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
        let util = d.utilization_rates().ok();
        let mut r = Reading {
            power_w: d.power_usage().ok().map(|mw| f64::from(mw) / 1000.0),
            energy_counter_mj: d.total_energy_consumption().ok(),
            sm_clock_mhz: d.clock_info(Clock::SM).ok().map(f64::from),
            mem_clock_mhz: d.clock_info(Clock::Memory).ok().map(f64::from),
            temperature_c: d.temperature(TemperatureSensor::Gpu).ok().map(f64::from),
            throttle_reasons: d.current_throttle_reasons().ok().map(|t| t.bits()),
            memory_used_mib: d.memory_info().ok().map(|m| mib(m.used)),
            gpu_util_pct: util.as_ref().map(|u| f64::from(u.gpu)),
            mem_util_pct: util.as_ref().map(|u| f64::from(u.memory)),
            process_memory_mib: d
                .running_compute_processes()
                .map(|ps| {
                    ps.into_iter()
                        .filter_map(|p| match p.used_gpu_memory {
                            UsedGpuMemory::Used(b) => Some((p.pid, mib(b))),
                            UsedGpuMemory::Unavailable => None,
                        })
                        .collect()
                })
                .unwrap_or_default(),
            ..Reading::default()
        };
        self.read_gpm(&mut r);
        r
    }
}
