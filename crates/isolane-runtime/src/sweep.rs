//! Sweeps (DESIGN.md, "Experiments"): the points of a partition or concurrency sweep, the
//! scenario each point runs, and `sweep.json`, the index of a sweep folder. Each point is an
//! ordinary run in its own sub-folder, so everything that reads a run folder reads a point.

use isolane_core::device_model::DeviceModel;

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
    pub model: String,
    pub batch: u32,
    pub precision: String,
    /// `None`: closed loop (`rate_hz = "max"`), for throughput.
    pub rate_hz: Option<f64>,
    pub duration_s: f64,
    pub warmup_jobs: u64,
    pub sms: Option<u32>,
    pub thread_pct: Option<u32>,
}

/// A point's scenario, as TOML text (written into the point's folder and run as is).
pub fn scenario_toml(
    backend: &str,
    gpu: u32,
    mechanism: &str,
    host: &str,
    workloads: &[PointWorkload],
) -> String {
    use toml::{Table, Value};
    let mut device = Table::new();
    device.insert("backend".into(), backend.into());
    if backend == "cuda" {
        device.insert("gpu".into(), Value::Integer(i64::from(gpu)));
    }
    device.insert("mechanism".into(), mechanism.into());
    device.insert("host".into(), host.into());
    let ws: Vec<Value> = workloads
        .iter()
        .map(|w| {
            let mut t = Table::new();
            t.insert("name".into(), w.name.clone().into());
            t.insert("model".into(), w.model.clone().into());
            t.insert("batch".into(), Value::Integer(i64::from(w.batch)));
            t.insert("precision".into(), w.precision.clone().into());
            t.insert(
                "rate_hz".into(),
                match w.rate_hz {
                    Some(h) => Value::Float(h),
                    None => "max".into(),
                },
            );
            t.insert("duration_s".into(), Value::Float(w.duration_s));
            t.insert(
                "warmup_jobs".into(),
                Value::Integer(w.warmup_jobs.min(i64::MAX as u64) as i64),
            );
            let mut p = Table::new();
            if let Some(s) = w.sms {
                p.insert("sms".into(), Value::Integer(i64::from(s)));
            }
            if let Some(pct) = w.thread_pct {
                p.insert("thread_pct".into(), Value::Integer(i64::from(pct)));
            }
            if !p.is_empty() {
                t.insert("partition".into(), Value::Table(p));
            }
            Value::Table(t)
        })
        .collect();
    let mut root = Table::new();
    root.insert("device".into(), Value::Table(device));
    root.insert("workload".into(), Value::Array(ws));
    let body = toml::to_string(&root).unwrap_or_default();
    format!("# Generated by `isolane sweep` for one point of the sweep.\n{body}")
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
    fn generated_scenarios_parse_and_validate() {
        let w = PointWorkload {
            name: workload_name("spin:2ms"),
            model: "spin:2ms".into(),
            batch: 4,
            precision: "fp16".into(),
            rate_hz: None,
            duration_s: 0.5,
            warmup_jobs: 3,
            sms: Some(16),
            thread_pct: None,
        };
        assert_eq!(w.name, "spin_2ms");
        let text = scenario_toml("cuda", 0, "green", "thread", std::slice::from_ref(&w));
        let s = isolane_core::spec::Scenario::from_toml_str(
            &text,
            "gen.toml",
            &isolane_core::spec::NoBuiltinModels,
        )
        .unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(s.workloads[0].partition.sms, Some(16));
        assert_eq!(s.workloads[0].batch, 4);
        let cpu = PointWorkload {
            sms: None,
            precision: "fp32".into(),
            ..w
        };
        let text = scenario_toml("cpu", 0, "none", "thread", &[cpu]);
        isolane_core::spec::Scenario::from_toml_str(
            &text,
            "gen.toml",
            &isolane_core::spec::NoBuiltinModels,
        )
        .unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(workload_name("/models/yolo v8.onnx"), "yolo_v8");
    }
}
