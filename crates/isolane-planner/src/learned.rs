//! Stretch learned from verification runs: what a workload's p99.9 response time beside the
//! other workloads of a plan measured, over its p99.9 execution time alone in the same
//! partition (and, for the predicted p99, the delay its p99 response time had over its p99
//! alone). An interference matrix gives the stretch of model pairs in one partition size; a
//! verification run measures it for the very set of neighbours, so a later plan of the same
//! workloads predicts from it (docs/planner.md, "Verification rounds").

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::cache::{clean, read_json, write_json};

/// Which stretch: one workload beside a set of others, on one device and mechanism.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StretchKey {
    /// As in [`crate::cache::ProfileKey`]: the GPU's name and its driver.
    pub gpu: String,
    pub driver: String,
    pub mechanism: String,
    /// The workload: model id, batch and precision (`resnet50-b16-fp16`).
    pub workload: String,
    /// The other workloads of the plan, the same way; their order does not matter.
    pub neighbours: Vec<String>,
}

/// What is stored: the key in words (so a user can read the folder) and the stretches.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Entry {
    #[serde(flatten)]
    key: StretchKey,
    stretch: f64,
    /// Absent in files kept before it was measured (session 14's files have a `stretch_p99`
    /// ratio instead, which is not read: a ratio does not carry over to other partitions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    added_p99_ms: Option<f64>,
}

/// What a verification run learned of a workload beside its neighbours: the stretch of its
/// p99.9 (what the search holds to the deadline) and, where it was measured, the delay added
/// to its p99 (what the predicted p99 uses; [`crate::Demand::added_p99_ms`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Learned {
    pub tail: f64,
    pub added_p99_ms: Option<f64>,
}

impl StretchKey {
    /// The same key with its neighbours in one order, as stored.
    fn normalized(&self) -> StretchKey {
        let mut k = self.clone();
        k.neighbours.sort();
        k
    }

    fn file_name(&self) -> String {
        // The neighbour set goes into the name as a CRC-32: six ONNX names would not fit.
        let set = crc32fast::hash(self.normalized().neighbours.join("\n").as_bytes());
        format!(
            "{}/{}/stretch/{}/{}--beside-{set:08x}.json",
            clean(&self.gpu),
            clean(&self.driver),
            clean(&self.mechanism),
            clean(&self.workload)
        )
    }
}

/// Learned stretches, kept in the profile cache's folder beside the profiles of the same GPU
/// and driver (`<gpu>/<driver>/stretch/<mechanism>/`).
#[derive(Debug, Clone)]
pub struct LearnedStretch {
    dir: PathBuf,
}

impl LearnedStretch {
    pub fn new(dir: impl Into<PathBuf>) -> LearnedStretch {
        LearnedStretch { dir: dir.into() }
    }

    /// The stretch a verification run measured for exactly this workload and neighbours. A
    /// file that does not read back, or that belongs to another key (a CRC collision), is
    /// absent.
    pub fn get(&self, key: &StretchKey) -> Option<Learned> {
        let e: Entry = read_json(&self.dir.join(key.file_name())).ok()?;
        let same = e.key == key.normalized();
        let usable = |s: f64| s.is_finite() && s > 0.0;
        (same && usable(e.stretch)).then_some(Learned {
            tail: e.stretch,
            added_p99_ms: e.added_p99_ms.filter(|d| d.is_finite() && *d >= 0.0),
        })
    }

    /// Keeps the latest measurement (atomically).
    pub fn put(&self, key: &StretchKey, learned: Learned) -> std::io::Result<()> {
        let path = self.dir.join(key.file_name());
        let e = Entry {
            key: key.normalized(),
            stretch: learned.tail,
            added_p99_ms: learned.added_p99_ms,
        };
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        write_json(&path, &e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(neighbours: &[&str]) -> StretchKey {
        StretchKey {
            gpu: "NVIDIA H100 80GB HBM3".into(),
            driver: "580.159.04".into(),
            mechanism: "green".into(),
            workload: "resnet50-b16-fp16".into(),
            neighbours: neighbours.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn a_stretch_is_found_for_the_same_neighbours_in_any_order_only() {
        let d = tempfile::tempdir().unwrap();
        let l = LearnedStretch::new(d.path());
        let k = key(&["resnet18-b1-fp16", "mobilenet_v2-b1-fp16"]);
        assert_eq!(l.get(&k), None);
        let learned = |tail, added_p99_ms| Learned { tail, added_p99_ms };
        l.put(&k, learned(1.17, Some(0.05))).unwrap();
        assert_eq!(l.get(&k), Some(learned(1.17, Some(0.05))));
        assert_eq!(
            l.get(&key(&["mobilenet_v2-b1-fp16", "resnet18-b1-fp16"])),
            Some(learned(1.17, Some(0.05)))
        );
        assert_eq!(l.get(&key(&["resnet18-b1-fp16"])), None);
        let other = StretchKey {
            mechanism: "mps".into(),
            ..k.clone()
        };
        assert_eq!(l.get(&other), None);
        // The latest measurement wins.
        l.put(&k, learned(1.30, None)).unwrap();
        assert_eq!(l.get(&k), Some(learned(1.30, None)));
        let path = d.path().join(k.file_name());
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains("added_p99_ms"), "{text}");
        // Session 14's files kept the p99 as a ratio: read back with the tail's stretch only.
        let old = text.replace("\"stretch\":", "\"stretch_p99\": 1.05, \"stretch\":");
        assert!(old.contains("stretch_p99"), "{old}");
        std::fs::write(&path, old).unwrap();
        assert_eq!(l.get(&k), Some(learned(1.30, None)));
    }

    #[test]
    fn an_unreadable_file_is_absent() {
        let d = tempfile::tempdir().unwrap();
        let l = LearnedStretch::new(d.path());
        let k = key(&["x"]);
        let path = d.path().join(k.file_name());
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, "{ cut off").unwrap();
        assert_eq!(l.get(&k), None);
    }
}
