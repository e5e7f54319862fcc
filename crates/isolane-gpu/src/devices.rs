//! Device discovery (`isolane devices`): what each CUDA device offers to partitioning. Read-only:
//! nothing here changes a GPU setting.

use serde::Serialize;

use isolane_core::device_model::{self, DeviceModel, GreenRules};

use crate::driver;
use crate::error::{GpuError, Result};
use crate::mps::{self, MpsStatus};

/// MIG mode as NVML reports it; `None` fields where NVML is unavailable or the GPU has no MIG.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MigInfo {
    pub supported: bool,
    pub current: Option<bool>,
    pub pending: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceInfo {
    /// CUDA device ordinal.
    pub index: u32,
    pub name: String,
    pub uuid: String,
    pub compute_capability: (u32, u32),
    pub sm_count: u32,
    pub memory_mib: u64,
    /// NVIDIA driver version (NVML), e.g. "580.159.04"; `None` without NVML.
    pub driver_version: Option<String>,
    /// CUDA driver API version, e.g. "13.0".
    pub cuda_driver_version: String,
    pub mig: MigInfo,
    /// Green-context granularity from paper 000's Table I (isolane_core::device_model).
    pub green_rules: Option<GreenRules>,
    /// The driver's own minimum green-context size and alignment (cuDeviceGetDevResource),
    /// when it supports green contexts.
    pub green_driver: Option<crate::green::DriverSmInfo>,
    /// The offline device model admission control uses for this GPU.
    pub device_model: String,
}

/// Formats 13000 as "13.0".
pub fn format_cuda_version(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

/// The built-in device model matching a discovered GPU, or one built from its SM count and
/// memory (name leaked once: device models carry `&'static str`).
pub fn model_for(name: &str, sm_count: u32, memory_mib: u64, cc: (u32, u32)) -> DeviceModel {
    let lower = name.to_ascii_lowercase();
    let builtin = if lower.contains("h100") && sm_count == 132 {
        Some("h100-sxm")
    } else if lower.contains("h200") && sm_count == 132 {
        Some("h200")
    } else if lower.contains("a100") && sm_count == 108 {
        Some(if memory_mib > 50_000 {
            "a100-80gb"
        } else {
            "a100-40gb"
        })
    } else if lower.contains("l40s") {
        Some("l40s")
    } else {
        None
    };
    if let Some(m) = builtin.and_then(device_model::device_model) {
        // The real memory size wins over the model's nominal one.
        return DeviceModel {
            memory_mib: memory_mib.min(m.memory_mib).max(1),
            ..m
        };
    }
    let leaked: &'static str = Box::leak(format!("discovered:{name}").into_boxed_str());
    DeviceModel {
        name: leaked,
        description: leaked,
        sm_count,
        memory_mib,
        compute_capability: cc,
        mig: None,
    }
}

/// Every CUDA device, or an error saying why there is none (no driver, no device).
pub fn list_devices() -> Result<Vec<DeviceInfo>> {
    let count = driver::device_count()?;
    if count == 0 {
        return Err(GpuError::NoDevice(
            "the CUDA driver reports 0 devices".into(),
        ));
    }
    let cuda_ver = format_cuda_version(driver::driver_version()?);
    // NVML is optional: without it the driver version and MIG mode are unknown.
    let nvml = crate::mig::nvml::init_nvml().ok();
    let driver_version = nvml.as_ref().and_then(|n| n.sys_driver_version().ok());
    let mut out = Vec::new();
    for index in 0..count {
        let dev = driver::device(index)?;
        let name = driver::name(dev)?;
        let uuid = driver::uuid(dev)?;
        let cc = driver::compute_capability(dev)?;
        let sm_count = driver::sm_count(dev)?;
        let memory_mib = driver::total_mem(dev)? / (1024 * 1024);
        let mig = match nvml
            .as_ref()
            .and_then(|n| n.device_by_uuid(uuid.as_str()).ok())
        {
            Some(d) => match d.mig_mode() {
                Ok(m) => MigInfo {
                    supported: true,
                    current: Some(m.current == nvml_wrapper_sys::bindings::NVML_DEVICE_MIG_ENABLE),
                    pending: Some(m.pending == nvml_wrapper_sys::bindings::NVML_DEVICE_MIG_ENABLE),
                },
                Err(_) => MigInfo {
                    supported: false,
                    current: None,
                    pending: None,
                },
            },
            None => MigInfo {
                supported: cc.0 >= 8,
                current: None,
                pending: None,
            },
        };
        let green_driver = crate::green::device_sm_info(index).ok();
        let model = model_for(&name, sm_count, memory_mib, cc);
        out.push(DeviceInfo {
            index,
            name,
            uuid,
            compute_capability: cc,
            sm_count,
            memory_mib,
            driver_version: driver_version.clone(),
            cuda_driver_version: cuda_ver.clone(),
            mig,
            green_rules: device_model::green_rules(cc.0),
            green_driver,
            device_model: model.name.to_string(),
        });
    }
    Ok(out)
}

/// Everything `isolane devices` prints.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DevicesReport {
    pub devices: Vec<DeviceInfo>,
    /// Why the list is empty, when it is.
    pub no_device_reason: Option<String>,
    pub mps: MpsStatus,
}

/// Discovery that never fails: no driver or no device gives an empty list and a reason.
pub fn report() -> DevicesReport {
    let (devices, reason) = match list_devices() {
        Ok(d) => (d, None),
        Err(e) => (Vec::new(), Some(e.to_string())),
    };
    DevicesReport {
        devices,
        no_device_reason: reason,
        mps: mps::status(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_versions_are_formatted() {
        assert_eq!(format_cuda_version(13000), "13.0");
        assert_eq!(format_cuda_version(12040), "12.4");
    }

    #[test]
    fn known_gpus_map_to_their_models() {
        let m = model_for("NVIDIA H100 80GB HBM3", 132, 81_559, (9, 0));
        assert_eq!(m.name, "h100-sxm");
        assert_eq!(m.memory_mib, 81_559);
        assert!(m.mig.is_some());
        let m = model_for("NVIDIA RTX 6000 Ada", 142, 48_000, (8, 9));
        assert_eq!(m.sm_count, 142);
        assert_eq!(m.compute_capability, (8, 9));
        assert!(m.name.starts_with("discovered:"));
    }

    #[test]
    fn no_gpu_gives_an_empty_report_with_a_reason() {
        let r = report();
        if r.devices.is_empty() {
            assert!(r.no_device_reason.is_some());
        }
    }
}
