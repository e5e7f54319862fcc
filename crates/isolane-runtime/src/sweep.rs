//! Sweeps (DESIGN.md, "Experiments"): the points of a partition or concurrency sweep, the
//! scenario each point runs, and `sweep.json`, the index of a sweep folder. Each point is an
//! ordinary run in its own sub-folder, so everything that reads a run folder reads a point.

use isolane_core::device_model::DeviceModel;
use isolane_core::spec::{
    Criticality, DeviceSpec, LatePolicy, MaxRate, PartitionSpec, Precision, ProtectionSpec, Rate,
    Role, RunLength, Scenario, TimingSpec, WorkloadSpec,
};

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SweepError {
    #[error("--sizes: {size} SMs is below the minimum of {min} SMs per green context on {device}")]
    BelowMinimum { size: u32, min: u32, device: String },
    #[error(
        "--sizes: {size} SMs is not a multiple of the green-context step of {step} SMs on \
         {device}"
    )]
    OffStep {
        size: u32,
        step: u32,
        device: String,
    },
    #[error("--sizes: {size} SMs is more than the {total} SMs of {device}")]
    TooLarge {
        size: u32,
        total: u32,
        device: String,
    },
    #[error("--sizes: {0} is not an MPS thread percentage (allowed: 1 to 100)")]
    BadPercent(u32),
    #[error("green contexts need compute capability 6.0 or later; {device} is {major}.{minor}")]
    NoGreen {
        device: String,
        major: u32,
        minor: u32,
    },
    #[error("--{flag}: the list is empty")]
    Empty { flag: &'static str },
}

/// The partition sizes of a green sweep: from the device's minimum to the most SMs one group
/// can have, by its step (paper 000, Table I) — 8, 16, … 128 on an H100's 132 SMs.
pub fn green_sizes(device: &DeviceModel) -> Result<Vec<u32>, SweepError> {
    let rules = device.green_rules().ok_or_else(|| SweepError::NoGreen {
        device: device.name.to_string(),
        major: device.compute_capability.0,
        minor: device.compute_capability.1,
    })?;
    Ok((rules.min_sms..=device.sm_count)
        .step_by(rules.step_sms.max(1) as usize)
        .collect())
}

/// Checks sizes a user asked for against the device's green rules (never clamps).
pub fn check_green_sizes(device: &DeviceModel, sizes: &[u32]) -> Result<(), SweepError> {
    let rules = device.green_rules().ok_or_else(|| SweepError::NoGreen {
        device: device.name.to_string(),
        major: device.compute_capability.0,
        minor: device.compute_capability.1,
    })?;
    if sizes.is_empty() {
        return Err(SweepError::Empty { flag: "sizes" });
    }
    for &size in sizes {
        let device = device.name.to_string();
        if size < rules.min_sms {
            return Err(SweepError::BelowMinimum {
                size,
                min: rules.min_sms,
                device,
            });
        }
        if size % rules.step_sms != 0 {
            return Err(SweepError::OffStep {
                size,
                step: rules.step_sms,
                device,
            });
        }
    }
    if let Some(&size) = sizes.iter().find(|&&s| s > device.sm_count) {
        return Err(SweepError::TooLarge {
            size,
            total: device.sm_count,
            device: device.name.to_string(),
        });
    }
    Ok(())
}

/// The thread percentages of an MPS sweep: 10 % to 100 % by 10.
pub fn mps_sizes() -> Vec<u32> {
    (1..=10).map(|i| i * 10).collect()
}

pub fn check_mps_sizes(sizes: &[u32]) -> Result<(), SweepError> {
    if sizes.is_empty() {
        return Err(SweepError::Empty { flag: "sizes" });
    }
    match sizes.iter().find(|&&p| p == 0 || p > 100) {
        Some(&p) => Err(SweepError::BadPercent(p)),
        None => Ok(()),
    }
}

/// One workload of a generated scenario.
#[derive(Debug, Clone)]
pub struct PointWorkload {
    pub name: String,
    /// A built-in name, `spin:…`, or an `.onnx` path (absolute: the point's `scenario.toml` is
    /// read from its own folder later).
    pub model: String,
    pub batch: u32,
    pub precision: Precision,
    /// `None`: closed loop (`rate_hz = "max"`), for throughput.
    pub rate_hz: Option<f64>,
    pub duration_s: f64,
    pub warmup_jobs: u64,
    pub sms: Option<u32>,
    pub thread_pct: Option<u32>,
}

/// A point's scenario, built as a value (validated by the caller with `Scenario::validate`,
/// written into the point's folder as its `scenario.toml`, and run as is). `device` says where
/// every workload runs; each workload is hosted as the device says.
pub fn point_scenario(device: DeviceSpec, workloads: &[PointWorkload]) -> Scenario {
    let workloads = workloads
        .iter()
        .map(|w| WorkloadSpec {
            name: w.name.clone(),
            model: w.model.clone(),
            weights: None,
            batch: w.batch,
            precision: w.precision,
            calibration: None,
            rate: match w.rate_hz {
                Some(h) => Rate::Hz(h),
                None => Rate::Max(MaxRate::Max),
            },
            deadline_ms: None,
            phase_ms: None,
            length: RunLength::DurationS(w.duration_s),
            warmup_jobs: w.warmup_jobs,
            late: LatePolicy::Skip,
            cpu: Vec::new(),
            role: Role::Standalone,
            ramp: None,
            host: device.host,
            partition: PartitionSpec {
                sms: w.sms,
                thread_pct: w.thread_pct,
                ..PartitionSpec::default()
            },
            plan_check: true,
            criticality: Criticality::Critical,
            stretch: None,
            backend: device.backend,
            program: None,
            gpu: None,
            serve: Default::default(),
        })
        .collect();
    Scenario {
        device,
        timing: TimingSpec::default(),
        protection: ProtectionSpec::default(),
        workloads,
    }
}

/// A workload name from a model (`spin:4ms` → `spin_4ms`): names must be usable as file names.
pub fn workload_name(model: &str) -> String {
    let base = std::path::Path::new(model)
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| model.to_string());
    base.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "_-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use isolane_core::device_model::device_model;

    #[test]
    fn green_sizes_follow_the_device_rules() {
        let h100 = device_model("h100-sxm").unwrap();
        let s = green_sizes(&h100).unwrap();
        assert_eq!(s.first(), Some(&8));
        assert_eq!(s.last(), Some(&128));
        assert!(s.windows(2).all(|w| w[1] - w[0] == 8));
        let nano = device_model("orin-nano").unwrap();
        let s = green_sizes(&nano).unwrap();
        assert_eq!(s, vec![4, 6, 8], "8.x: min 4, step 2, 8 SMs");
    }

    #[test]
    fn user_sizes_are_checked_not_clamped() {
        let h100 = device_model("h100-sxm").unwrap();
        assert!(check_green_sizes(&h100, &[8, 64, 128]).is_ok());
        assert!(matches!(
            check_green_sizes(&h100, &[4]),
            Err(SweepError::BelowMinimum { min: 8, .. })
        ));
        assert!(matches!(
            check_green_sizes(&h100, &[12]),
            Err(SweepError::OffStep { step: 8, .. })
        ));
        assert!(matches!(
            check_green_sizes(&h100, &[136]),
            Err(SweepError::TooLarge { total: 132, .. })
        ));
        assert_eq!(check_mps_sizes(&[0]), Err(SweepError::BadPercent(0)));
        assert_eq!(check_mps_sizes(&[101]), Err(SweepError::BadPercent(101)));
        assert_eq!(mps_sizes().len(), 10);
    }

    #[test]
    fn generated_scenarios_validate_and_survive_their_toml() {
        use isolane_core::spec::{Backend, Host, Mechanism, NoBuiltinModels};
        let w = PointWorkload {
            name: workload_name("spin:2ms"),
            model: "spin:2ms".into(),
            batch: 4,
            precision: Precision::Fp16,
            rate_hz: None,
            duration_s: 0.5,
            warmup_jobs: 3,
            sms: Some(16),
            thread_pct: None,
        };
        assert_eq!(w.name, "spin_2ms");
        let green = DeviceSpec {
            backend: Backend::Cuda,
            gpu: 0,
            mechanism: Mechanism::Green,
            host: Host::Thread,
            gpus: Vec::new(),
        };
        let s = point_scenario(green, std::slice::from_ref(&w));
        s.validate(&NoBuiltinModels)
            .unwrap_or_else(|e| panic!("{e}"));
        // What the point's folder keeps reads back as the scenario that ran.
        let text = s.to_toml_string().unwrap();
        let back = Scenario::from_toml_str(&text, "gen.toml", &NoBuiltinModels)
            .unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(back, s);
        assert_eq!(s.workloads[0].partition.sms, Some(16));
        assert_eq!(s.workloads[0].batch, 4);
        let cpu = PointWorkload {
            sms: None,
            precision: Precision::Fp32,
            ..w
        };
        let on_cpu = DeviceSpec {
            backend: Backend::Cpu,
            gpu: 0,
            mechanism: Mechanism::None,
            host: Host::Thread,
            gpus: Vec::new(),
        };
        point_scenario(on_cpu, &[cpu])
            .validate(&NoBuiltinModels)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(workload_name("/models/yolo v8.onnx"), "yolo_v8");
    }
}
