//! What admission's prediction before a run (`[protection] admission`,
//! `isolane_core::admission::foresee`) takes from the profile cache: each workload's p99
//! execution time alone in its partition, as `plan --auto` measured it on this GPU.

use isolane_core::spec::{Mechanism, PartitionSpec, Scenario};

use crate::auto::workload_ids;
use crate::cache::{DeviceRecord, ProfileCache, ProfileKey};

/// The partition as the cache's file names label it (`48` SMs, `25` %, `1g.10gb`); `None`
/// for a mechanism without partitions of its own (time-slicing) or a partition without its
/// size.
fn label(mechanism: Mechanism, p: &PartitionSpec) -> Option<String> {
    match mechanism {
        Mechanism::Green => p.sms.map(|n| n.to_string()),
        Mechanism::Mps => p.thread_pct.map(|n| n.to_string()),
        Mechanism::Mig => p.mig_profile.clone(),
        _ => None,
    }
}

/// Each workload's p99 execution time alone in its partition (ms) from `cache`'s profiles of
/// the GPU and driver `record` names, measured by the engine of `revision` (a profile of
/// another revision ran another engine's kernels, as the planner also judges); `None` where
/// no such profile is kept, for a workload on the CPU and a partition without a size.
pub fn alone_p99_ms(
    cache: &ProfileCache,
    record: &DeviceRecord,
    scenario: &Scenario,
    revision: Option<u32>,
) -> Vec<Option<f64>> {
    let mechanism = scenario.device.mechanism;
    (scenario.workloads.iter().zip(workload_ids(scenario)))
        .map(|(w, id)| {
            if !w.on_gpu() {
                return None;
            }
            let key = ProfileKey {
                gpu: record.gpu.clone(),
                driver: record.driver.clone(),
                model: id.model,
                batch: id.batch,
                precision: id.precision,
                mechanism: mechanism.name().into(),
                partition: label(mechanism, &w.partition)?,
            };
            let t = cache.get(&key)?;
            t.measured_by(revision).then_some(t.exec_p99_ms)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The H100 profiles committed with session 12's planner results.
    #[test]
    fn the_alone_p99_of_each_workload_comes_from_its_partitions_recorded_profile() {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../results/h100-planner/profiles"
        );
        let cache = ProfileCache::new(dir);
        let record = DeviceRecord {
            gpu: "NVIDIA H100 80GB HBM3".into(),
            driver: "580.159.04".into(),
            device_model: "h100-sxm".into(),
        };
        let text = "[device]\nbackend = \"cuda\"\nmechanism = \"green\"\n\
            [[workload]]\nname = \"light\"\nmodel = \"mobilenet_v2\"\nprecision = \"fp16\"\n\
            rate_hz = 100\nduration_s = 1\n[workload.partition]\nsms = 24\n\
            [[workload]]\nname = \"heavy\"\nmodel = \"resnet18\"\nprecision = \"fp16\"\n\
            rate_hz = 100\nduration_s = 1\n[workload.partition]\nsms = 32\n\
            [[workload]]\nname = \"odd\"\nmodel = \"resnet18\"\nprecision = \"fp16\"\n\
            rate_hz = 100\nduration_s = 1\n[workload.partition]\nsms = 40\n";
        let s = Scenario::from_toml_str(
            text,
            std::path::Path::new("trio.toml"),
            &["mobilenet_v2", "resnet18"],
        )
        .unwrap();
        let p99 = alone_p99_ms(&cache, &record, &s, None);
        // mobilenet_v2-b1-fp16-green-24.json says 0.58236; no profile in 40 SMs.
        assert_eq!(p99[0], Some(0.58236));
        assert!(p99[1].is_some_and(|t| t > 0.0), "{p99:?}");
        assert_eq!(p99[2], None);
        // Measured by another engine than this one: not used.
        assert_eq!(
            alone_p99_ms(&cache, &record, &s, Some(7)),
            [None, None, None]
        );
        // Another driver's GPU has no profiles here.
        let other = DeviceRecord {
            driver: "590.1".into(),
            ..record
        };
        assert_eq!(alone_p99_ms(&cache, &other, &s, None), [None, None, None]);
    }
}
