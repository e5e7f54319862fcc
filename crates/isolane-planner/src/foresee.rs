//! What admission's prediction (`isolane_core::admission::foresee` before a run,
//! `foresee_change` for a change while serving; `[protection] admission`) takes from the
//! profile cache: each workload's p99 execution time alone in its partition, as `plan --auto`
//! measured it on this GPU.

use std::collections::HashMap;

use isolane_core::admission::{foresee_change, Foresight, Live};
use isolane_core::device_model::DeviceModel;
use isolane_core::predict::{fitted, memory_system, MemoryProfile};
use isolane_core::spec::{
    AdmissionMode, Backend, Mechanism, PartitionSpec, Scenario, WorkloadSpec,
};

use crate::auto::workload_ids;
use crate::cache::{DeviceRecord, ProfileCache, ProfileKey};
use crate::offline::WorkloadId;

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

/// One workload's p99 execution time alone in `partition` (ms), from `cache`'s profile of
/// the GPU and driver `record` names measured by the engine of `revision` (a profile of
/// another revision ran another engine's kernels, as the planner also judges).
fn alone_in(
    cache: &ProfileCache,
    record: &DeviceRecord,
    mechanism: Mechanism,
    id: &WorkloadId,
    partition: &PartitionSpec,
    revision: Option<u32>,
) -> Option<f64> {
    let key = ProfileKey {
        gpu: record.gpu.clone(),
        driver: record.driver.clone(),
        model: id.model.clone(),
        batch: id.batch,
        precision: id.precision.clone(),
        mechanism: mechanism.name().into(),
        partition: label(mechanism, partition)?,
    };
    let t = cache.get(&key)?;
    t.measured_by(revision).then_some(t.exec_p99_ms)
}

/// Each workload's p99 execution time alone in its partition (ms) from `cache`'s profiles of
/// the GPU and driver `record` names, measured by the engine of `revision`; `None` where no
/// such profile is kept, for a workload on the CPU and a partition without a size.
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
            alone_in(cache, record, mechanism, &id, &w.partition, revision)
        })
        .collect()
}

/// Admission of a change while serving, from what the server was started with: each served
/// workload's memory-system demand (its model's, which no change alters) and the cache's
/// profiles of this GPU, read again for each change (a partition's new size has its own).
pub struct LiveForesight {
    scenario: Scenario,
    device: DeviceModel,
    cache: ProfileCache,
    record: DeviceRecord,
    revision: Option<u32>,
    /// Per served workload, by name: its model as the cache keys it, and its demand.
    served: HashMap<String, (WorkloadId, Option<MemoryProfile>)>,
}

impl LiveForesight {
    /// The foresight of `scenario`'s changes on `device`; `memory` gives a workload's
    /// memory-system demand on a GPU with this L2 (bytes). `None` where nothing would ever be
    /// predicted: `[protection] admission = "off"`, no GPU workload, or no fitted model for
    /// the device and mechanism (then no demand is computed).
    pub fn new(
        scenario: &Scenario,
        device: DeviceModel,
        cache: ProfileCache,
        record: DeviceRecord,
        revision: Option<u32>,
        memory: &dyn Fn(&WorkloadSpec, u64) -> Option<MemoryProfile>,
    ) -> Option<LiveForesight> {
        let on_gpu = scenario.device.backend == Backend::Cuda
            && scenario.workloads.iter().any(|w| w.on_gpu());
        if scenario.protection.admission == AdmissionMode::Off || !on_gpu {
            return None;
        }
        fitted(device.name, scenario.device.mechanism)?;
        let sys = memory_system(device.name)?;
        let served = (scenario.workloads.iter().zip(workload_ids(scenario)))
            .map(|(w, id)| (w.name.clone(), (id, memory(w, sys.l2_bytes))))
            .collect();
        Some(LiveForesight {
            scenario: scenario.clone(),
            device,
            cache,
            record,
            revision,
            served,
        })
    }

    /// What `[protection] admission` says of the served set becoming `after` from `before`
    /// (each the loaded workloads, the changed one as it is and as it would be).
    pub fn foresee(&self, before: &[WorkloadSpec], after: &[WorkloadSpec]) -> Foresight {
        let live =
            |set: &[WorkloadSpec]| -> Vec<Live> { set.iter().map(|w| self.live(w)).collect() };
        foresee_change(
            &self.scenario.device,
            &self.device,
            self.scenario.protection.admission,
            &live(before),
            &live(after),
        )
    }

    /// What `[protection] admission` says of one served workload changed from `from` (`None`:
    /// unloaded) to `to`, of `sms` SMs afterwards in a green partition (its spec's own
    /// otherwise), beside `others`, the other loaded workloads as they are.
    pub fn change(
        &self,
        from: Option<&WorkloadSpec>,
        to: &WorkloadSpec,
        sms: Option<u32>,
        others: &[WorkloadSpec],
    ) -> Foresight {
        let mut to = to.clone();
        if let (Some(n), Mechanism::Green) = (sms, self.scenario.device.mechanism) {
            to.partition.sms = Some(n);
        }
        let before: Vec<WorkloadSpec> = others.iter().chain(from).cloned().collect();
        let after: Vec<WorkloadSpec> = others.iter().chain([&to]).cloned().collect();
        self.foresee(&before, &after)
    }

    /// The served workloads that a prediction cannot include as they are in `set` (no profile
    /// alone in their partition, or no demand for their model), by name.
    pub fn unknown(&self, set: &[WorkloadSpec]) -> Vec<String> {
        (set.iter())
            .filter(|w| w.on_gpu())
            .map(|w| (w, self.live(w)))
            .filter(|(_, l)| l.profile.is_none() || l.alone_p99_ms.is_none())
            .map(|(w, _)| w.name.clone())
            .collect()
    }

    fn live(&self, w: &WorkloadSpec) -> Live {
        let (profile, alone) = match self.served.get(&w.name) {
            Some((id, profile)) => (
                *profile,
                alone_in(
                    &self.cache,
                    &self.record,
                    self.scenario.device.mechanism,
                    id,
                    &w.partition,
                    self.revision,
                ),
            ),
            None => (None, None),
        };
        Live {
            spec: w.clone(),
            profile,
            alone_p99_ms: alone,
        }
    }
}

/// The recorded H200 trio (results/h200-protection/final/compare, green-load75: vit_b_16 and
/// resnet18 critical, vit_l_32 best effort; `admission = "refuse"`) with the admission that a
/// server of it would ask: each model's p99 alone in its partition as profiles in a cache under
/// `cache_dir`, each model's traffic from h200-models.csv. What the tests of live admission, here
/// and in isolane-serve, predict from (`test-support`).
#[cfg(any(test, feature = "test-support"))]
pub fn recorded_h200_trio(cache_dir: &std::path::Path) -> (Scenario, LiveForesight) {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../results/h200-protection/final/compare/green-load75-none/r0/scenario-in.toml"
    );
    let text = std::fs::read_to_string(path).unwrap().replacen(
        "[protection]\n",
        "[protection]\nadmission = \"refuse\"\n",
        1,
    );
    let models = ["vit_b_16", "resnet18", "vit_l_32"];
    let s = Scenario::from_toml_str(&text, std::path::Path::new(path), &models)
        .unwrap_or_else(|e| panic!("{e}"));
    let cache = ProfileCache::new(cache_dir);
    let record = DeviceRecord {
        gpu: "NVIDIA H200".into(),
        driver: "580.159.04".into(),
        device_model: "h200".into(),
    };
    // The trio's p99s alone in 48, 32 and 48 SMs (its runs' alone cells).
    for (w, p99) in s.workloads.iter().zip([0.99946, 0.345151, 1.076108]) {
        let key = ProfileKey {
            gpu: record.gpu.clone(),
            driver: record.driver.clone(),
            model: w.model.clone(),
            batch: 1,
            precision: "fp16".into(),
            mechanism: "green".into(),
            partition: w.partition.sms.unwrap().to_string(),
        };
        let t = crate::cache::Times {
            exec_p50_ms: p99,
            exec_p99_ms: p99,
            exec_mean_ms: p99,
            exec_p999_ms: Some(p99),
            engine_revision: Some(4),
        };
        cache.put(&key, &record, &t).unwrap();
    }
    let h200 = isolane_core::device_model::device_model("h200").unwrap();
    let live = LiveForesight::new(&s, h200, cache, record, Some(4), &recorded_h200_traffic)
        .expect("a fitted model of the H200's green partitions");
    (s, live)
}

/// A model's traffic per job at batch 1 as the engine computes it for the H200
/// (h200-models.csv), for [`recorded_h200_trio`]'s admission (`test-support`).
#[cfg(any(test, feature = "test-support"))]
pub fn recorded_h200_traffic(w: &WorkloadSpec, _l2: u64) -> Option<MemoryProfile> {
    let csv = include_str!("../../isolane-core/src/predict/h200-models.csv");
    let row: Vec<&str> = csv
        .lines()
        .map(|l| l.split(',').collect::<Vec<_>>())
        .find(|r| r[0] == w.model && r[2] == "1")?;
    Some(MemoryProfile {
        dram_bytes_per_job: row[7].parse().ok()?,
        l2_footprint_bytes: row[8].parse().ok()?,
        resident: row[9] == "true",
        flops_per_job: row[6].parse::<f64>().ok()? * 1e9,
        source: isolane_core::predict::ProfileSource::Computed,
    })
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

    /// `ctl load` of the best-effort vit_l_32 beside the two critical models of the recorded
    /// H200 trio (results/h200-protection/final/compare, green-load75: each model's p99 alone
    /// in its partition as profiles in a cache, the engine's traffic of each model from
    /// h200-models.csv): refused under "refuse", naming the pair; its load in a partition the
    /// cache has no profile of is not predicted, and the workload is named as unknown.
    #[test]
    fn a_live_load_is_refused_from_the_caches_profiles_and_the_models_traffic() {
        let tmp = tempfile::tempdir().unwrap();
        let (s, live) = recorded_h200_trio(tmp.path());
        let (victims, trio) = (&s.workloads[..2], &s.workloads[..]);
        let f = live.foresee(victims, trio);
        let Foresight::Refuse(m) = &f else {
            panic!("{f:?}")
        };
        assert_eq!(m[0].workload, "v0_vit_b_16");
        assert_eq!(m[0].worst_neighbour.as_ref().unwrap().0, "be_vit_l_32");
        assert!((1.35..1.40).contains(&m[0].stretch), "{m:?}");
        assert_eq!(live.unknown(trio), Vec::<String>::new());
        // The same change as the server asks it: vit_l_32 loaded (from unloaded) beside the
        // two; unloaded again it is not asked about (an unload frees, never refused).
        assert_eq!(live.change(None, &trio[2], Some(48), victims), f);
        // Resized from 24 SMs (no profile: not predicted) to 48, where the cache has one.
        let mut from = trio[2].clone();
        from.partition.sms = Some(24);
        assert_eq!(live.change(Some(&from), &from, Some(48), victims), f);
        // A deadline change of vit_b_16 beside resnet18 alone: cut below its prediction.
        let mut cut = trio[0].clone();
        cut.deadline_ms = Some(1.0);
        assert!(matches!(
            live.change(Some(&trio[0]), &cut, Some(48), &trio[1..2]),
            Foresight::Refuse(m) if m[0].workload == "v0_vit_b_16"
        ));
        // In 24 SMs vit_l_32 has no profile here: nothing predicted, and it is named.
        let mut small = trio.to_vec();
        small[2].partition.sms = Some(24);
        assert_eq!(live.foresee(victims, &small), Foresight::Clear);
        assert_eq!(live.unknown(&small), ["be_vit_l_32"]);
        // Profiles of another engine revision are not this engine's times.
        let (c2, r2) = (ProfileCache::new(tmp.path()), live.record.clone());
        let h200 = isolane_core::device_model::device_model("h200").unwrap();
        let memory = recorded_h200_traffic;
        let other = LiveForesight::new(&s, h200, c2, r2, Some(5), &memory).unwrap();
        assert_eq!(other.foresee(victims, trio), Foresight::Clear);
        // Nothing to predict with admission off, or on a GPU without a fitted model.
        let mut off = s.clone();
        off.protection.admission = AdmissionMode::Off;
        let none = |s: &Scenario, model: &str| {
            let d = isolane_core::device_model::device_model(model).unwrap();
            let c = ProfileCache::new(tmp.path());
            LiveForesight::new(s, d, c, live.record.clone(), Some(4), &memory).is_none()
        };
        assert!(none(&off, "h200"));
        assert!(none(&s, "h100-sxm"));
    }
}
