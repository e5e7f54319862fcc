//! Planning for a GPU that is not here (`--device-model NAME`): the profiles come from a cache
//! or a committed folder of them, found by the device model the GPU they were measured on was
//! recognised as; nothing is measured.

use std::cmp::Ordering;
use std::path::{Path, PathBuf};

use crate::cache::{DeviceRecord, ProfileCache, ProfileKey, Times};
use crate::{Ladder, Point, ProfileError, Profiler};

/// Why a folder cannot give the profiles of a device model.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum OfflineError {
    #[error("{dir}: no such folder of profiles")]
    NoFolder { dir: PathBuf },
    #[error(
        "{dir} has no profiles measured on {device_model}{found}; measure them on that GPU with \
         `isolane plan --auto SCENARIO --export-profiles DIR` and plan from DIR"
    )]
    NoDevice {
        dir: PathBuf,
        device_model: String,
        /// `` (found: h100-sxm (NVIDIA H100 80GB HBM3, driver 580.159.04))`` or nothing.
        found: String,
    },
    #[error(
        "{dir} has no profiles of {device_model} with driver {driver}; drivers found: {found}"
    )]
    NoDriver {
        dir: PathBuf,
        device_model: String,
        driver: String,
        found: String,
    },
}

/// The profiles of one device model, from one GPU and driver of a folder.
#[derive(Debug, Clone)]
pub struct OfflineProfiles {
    cache: ProfileCache,
    device_model: String,
    chosen: DeviceRecord,
    /// Every GPU and driver of the device model the folder holds, newest driver first.
    records: Vec<DeviceRecord>,
    /// Their drivers, in that order.
    drivers: Vec<String>,
}

/// Driver versions compared number by number (`580.159.04` > `580.65.06`); a part that is not
/// a number compares as text.
pub fn compare_drivers(a: &str, b: &str) -> Ordering {
    let parts = |s: &str| -> Vec<(u64, String)> {
        s.split('.')
            .map(|p| (p.parse::<u64>().unwrap_or(0), p.to_string()))
            .collect()
    };
    parts(a).cmp(&parts(b))
}

impl OfflineProfiles {
    /// The profiles of `device_model` in `dir`: of driver `driver` when given, else of the
    /// newest driver the folder has for it (so that a re-measured GPU wins over old numbers).
    pub fn open(
        dir: &Path,
        device_model: &str,
        driver: Option<&str>,
    ) -> Result<OfflineProfiles, OfflineError> {
        if !dir.is_dir() {
            return Err(OfflineError::NoFolder {
                dir: dir.to_path_buf(),
            });
        }
        let cache = ProfileCache::new(dir);
        let all = cache.devices();
        let mut mine: Vec<DeviceRecord> = all
            .iter()
            .filter(|d| d.device_model == device_model)
            .cloned()
            .collect();
        if mine.is_empty() {
            let found: Vec<String> = all
                .iter()
                .map(|d| format!("{} ({}, driver {})", d.device_model, d.gpu, d.driver))
                .collect();
            return Err(OfflineError::NoDevice {
                dir: dir.to_path_buf(),
                device_model: device_model.to_string(),
                found: if found.is_empty() {
                    String::new()
                } else {
                    format!(" (found: {})", found.join(", "))
                },
            });
        }
        mine.sort_by(|a, b| compare_drivers(&b.driver, &a.driver).then(a.gpu.cmp(&b.gpu)));
        let drivers: Vec<String> = mine.iter().map(|d| d.driver.clone()).collect();
        let chosen = match driver {
            None => mine[0].clone(),
            Some(v) => mine
                .iter()
                .find(|d| d.driver == v)
                .cloned()
                .ok_or_else(|| OfflineError::NoDriver {
                    dir: dir.to_path_buf(),
                    device_model: device_model.to_string(),
                    driver: v.to_string(),
                    found: drivers.join(", "),
                })?,
        };
        Ok(OfflineProfiles {
            cache,
            device_model: device_model.to_string(),
            chosen,
            records: mine,
            drivers,
        })
    }

    pub fn dir(&self) -> &Path {
        self.cache.dir()
    }

    pub fn cache(&self) -> &ProfileCache {
        &self.cache
    }

    /// The GPU and driver whose profiles are used.
    pub fn device(&self) -> &DeviceRecord {
        &self.chosen
    }

    /// Which profiles are used and why, for the output.
    pub fn describe(&self) -> String {
        let why = if self.drivers.len() == 1 {
            "the only driver found".to_string()
        } else if self.drivers[0] == self.chosen.driver {
            format!(
                "the newest of the drivers found ({}; --driver picks another)",
                self.drivers.join(", ")
            )
        } else {
            format!("as --driver asked (found: {})", self.drivers.join(", "))
        };
        format!(
            "planning offline for {} from {}: profiles of {}, driver {} ({why}); nothing is \
             measured",
            self.device_model,
            self.cache.dir().display(),
            self.chosen.gpu,
            self.chosen.driver
        )
    }

    /// The key of a profile of this GPU and driver.
    pub fn key(
        &self,
        model: &str,
        batch: u32,
        precision: &str,
        mechanism: &str,
        partition: &str,
    ) -> ProfileKey {
        ProfileKey {
            gpu: self.chosen.gpu.clone(),
            driver: self.chosen.driver.clone(),
            model: model.to_string(),
            batch,
            precision: precision.to_string(),
            mechanism: mechanism.to_string(),
            partition: partition.to_string(),
        }
    }

    pub fn get(&self, key: &ProfileKey) -> Option<Times> {
        self.cache.get(key)
    }

    /// As [`ProfileCache::read`]: a damaged file is an error naming it.
    pub fn read(&self, key: &ProfileKey) -> Result<Option<Times>, String> {
        self.cache.read(key)
    }

    /// The other drivers of the device model that have the profile of `key` (which is of the
    /// chosen one): a profile measured again with a new driver only in part leaves the rest
    /// with the old one.
    pub fn other_drivers_with(&self, key: &ProfileKey) -> Vec<String> {
        self.records
            .iter()
            .filter(|d| **d != self.chosen)
            .filter(|d| {
                let theirs = ProfileKey {
                    gpu: d.gpu.clone(),
                    driver: d.driver.clone(),
                    ..key.clone()
                };
                self.cache.get(&theirs).is_some()
            })
            .map(|d| d.driver.clone())
            .collect()
    }

    /// The partitions it has of `key`'s model, batch, precision and mechanism.
    pub fn partitions(&self, key: &ProfileKey) -> Vec<String> {
        self.cache.partitions(key)
    }
}

/// What a workload's profiles are keyed by, besides the GPU, mechanism and partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadId {
    /// The scenario's name for it.
    pub name: String,
    /// As [`ProfileKey::model`].
    pub model: String,
    pub batch: u32,
    pub precision: String,
}

impl WorkloadId {
    /// `` `camera` (resnet18, batch 1, fp16, green) ``.
    pub fn describe(&self, mechanism: &str) -> String {
        format!(
            "`{}` ({}, batch {}, {}, {mechanism})",
            self.name, self.model, self.batch, self.precision
        )
    }
}

/// Profiles from a folder, never measured: a size that is not there is
/// [`ProfileError::NotProfiled`], in words that name the workload, its model, batch,
/// precision and mechanism, the missing partition, the folder and what it has instead.
pub struct OfflineProfiler<'a> {
    pub store: &'a OfflineProfiles,
    pub workloads: &'a [WorkloadId],
    pub mechanism: &'a str,
    pub ladder: &'a Ladder,
    /// The keys of the profiles the plan used (for `--export-profiles`).
    pub used: Vec<ProfileKey>,
}

impl OfflineProfiler<'_> {
    fn key(&self, w: &WorkloadId, partition: &str) -> ProfileKey {
        self.store
            .key(&w.model, w.batch, &w.precision, self.mechanism, partition)
    }

    /// What the folder has of workload `w` under this mechanism, in the ladder's words.
    pub fn available(&self, w: &WorkloadId) -> Vec<String> {
        self.store
            .partitions(&self.key(w, ""))
            .into_iter()
            .map(|label| {
                self.ladder
                    .sizes
                    .iter()
                    .find(|&&s| self.ladder.label(s) == label)
                    .map_or(label, |&s| self.ladder.describe(s))
            })
            .collect()
    }
}

impl Profiler for OfflineProfiler<'_> {
    fn profile(&mut self, workload: usize, size: u32) -> Result<Point, ProfileError> {
        let w = &self.workloads[workload];
        let key = self.key(w, &self.ladder.label(size));
        // A damaged file is named (file and field), not taken for a missing one: nothing here
        // measures it again.
        match self.store.read(&key) {
            Ok(Some(t)) => {
                self.used.push(key);
                return Ok(t.at(size));
            }
            Ok(None) => {}
            Err(e) => {
                return Err(ProfileError::NotProfiled(format!(
                    "{}: the profile of {} cannot be used: {e}",
                    w.describe(self.mechanism),
                    self.ladder.describe(size)
                )))
            }
        }
        let have = self.available(w);
        let elsewhere = match self.store.other_drivers_with(&key).first() {
            Some(d) => format!("; driver {d} has it (--driver {d})"),
            None => String::new(),
        };
        Err(ProfileError::NotProfiled(format!(
            "{}: no profile of {} in {} ({}, driver {}); it has {}{elsewhere}",
            w.describe(self.mechanism),
            self.ladder.describe(size),
            self.store.dir().display(),
            self.store.device().gpu,
            self.store.device().driver,
            if have.is_empty() {
                "none of this workload and mechanism".to_string()
            } else {
                have.join(", ")
            }
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(gpu: &str, driver: &str, model: &str) -> DeviceRecord {
        DeviceRecord {
            gpu: gpu.into(),
            driver: driver.into(),
            device_model: model.into(),
        }
    }

    fn put(c: &ProfileCache, d: &DeviceRecord, p99: f64) {
        let key = ProfileKey {
            gpu: d.gpu.clone(),
            driver: d.driver.clone(),
            model: "resnet18".into(),
            batch: 1,
            precision: "fp16".into(),
            mechanism: "mig".into(),
            partition: "1g.10gb".into(),
        };
        let t = Times {
            exec_p50_ms: p99,
            exec_p99_ms: p99,
            exec_mean_ms: p99,
            exec_p999_ms: None,
            engine_revision: None,
        };
        c.put(&key, d, &t).unwrap();
    }

    #[test]
    fn the_newest_driver_of_the_device_model_is_used_unless_one_is_named() {
        let d = tempfile::tempdir().unwrap();
        let c = ProfileCache::new(d.path());
        let gpu = "NVIDIA A100-SXM4-80GB";
        put(&c, &record(gpu, "580.65.06", "a100-80gb"), 1.0);
        put(&c, &record(gpu, "580.159.04", "a100-80gb"), 2.0);
        put(
            &c,
            &record("NVIDIA H100 80GB HBM3", "590.1", "h100-sxm"),
            3.0,
        );

        let o = OfflineProfiles::open(d.path(), "a100-80gb", None).unwrap();
        assert_eq!(
            o.device().driver,
            "580.159.04",
            "580.159 is newer than 580.65"
        );
        let k = o.key("resnet18", 1, "fp16", "mig", "1g.10gb");
        assert_eq!(o.get(&k).unwrap().exec_p99_ms, 2.0);
        assert!(o.describe().contains("the newest of the drivers found"));

        // A profile only the older driver has is pointed at.
        let only_old = ProfileKey {
            partition: "2g.20gb".into(),
            ..k.clone()
        };
        assert!(o.other_drivers_with(&only_old).is_empty());
        let older = ProfileKey {
            driver: "580.65.06".into(),
            ..only_old.clone()
        };
        let t = o.get(&k).unwrap();
        o.cache()
            .put(&older, &record(gpu, "580.65.06", "a100-80gb"), &t)
            .unwrap();
        assert_eq!(o.other_drivers_with(&only_old), ["580.65.06"]);

        let old = OfflineProfiles::open(d.path(), "a100-80gb", Some("580.65.06")).unwrap();
        let k = old.key("resnet18", 1, "fp16", "mig", "1g.10gb");
        assert_eq!(old.get(&k).unwrap().exec_p99_ms, 1.0);

        let e = OfflineProfiles::open(d.path(), "a100-80gb", Some("1.0")).unwrap_err();
        assert!(
            e.to_string()
                .contains("drivers found: 580.159.04, 580.65.06"),
            "{e}"
        );
        let e = OfflineProfiles::open(d.path(), "a100-40gb", None).unwrap_err();
        assert!(
            e.to_string().contains("no profiles measured on a100-40gb")
                && e.to_string()
                    .contains("h100-sxm (NVIDIA H100 80GB HBM3, driver 590.1)"),
            "{e}"
        );
        let e = OfflineProfiles::open(&d.path().join("nope"), "a100-40gb", None).unwrap_err();
        assert!(matches!(e, OfflineError::NoFolder { .. }));
    }

    #[test]
    fn a_missing_profile_names_the_workload_the_size_and_what_there_is() {
        let d = tempfile::tempdir().unwrap();
        let c = ProfileCache::new(d.path());
        let a100 = record("NVIDIA A100-SXM4-80GB", "580.65.06", "a100-80gb");
        put(&c, &a100, 1.5);
        let store = OfflineProfiles::open(d.path(), "a100-80gb", None).unwrap();
        let model = isolane_core::device_model::device_model("a100-80gb").unwrap();
        let ladder = Ladder::mig(model.mig.as_ref().unwrap());
        let workloads = [WorkloadId {
            name: "cam".into(),
            model: "resnet18".into(),
            batch: 1,
            precision: "fp16".into(),
        }];
        let mut p = OfflineProfiler {
            store: &store,
            workloads: &workloads,
            mechanism: "mig",
            ladder: &ladder,
            used: Vec::new(),
        };
        // Size 0 is 1g.10gb, which is there; 6 is 7g.80gb, which is not.
        assert_eq!(p.profile(0, 0).unwrap().exec_p99_ms, 1.5);
        assert_eq!(p.used.len(), 1);
        let e = p.profile(0, 6).unwrap_err().to_string();
        assert!(
            e.contains("`cam` (resnet18, batch 1, fp16, mig): no profile of 7g.80gb in")
                && e.contains("(NVIDIA A100-SXM4-80GB, driver 580.65.06); it has 1g.10gb"),
            "{e}"
        );
        // A damaged profile is named with its file and field, not planned with (a negative
        // p99 used to be taken as it read) nor called missing.
        let key = store.key("resnet18", 1, "fp16", "mig", "1g.10gb");
        let file = d.path().join(key.path());
        std::fs::write(
            &file,
            r#"{"exec_p50_ms": 1.0, "exec_p99_ms": -1.5, "exec_mean_ms": 1.0}"#,
        )
        .unwrap();
        let e = p.profile(0, 0).unwrap_err();
        assert!(matches!(e, ProfileError::NotProfiled(_)));
        let e = e.to_string();
        assert!(
            e.contains(
                "`cam` (resnet18, batch 1, fp16, mig): the profile of 1g.10gb cannot be used"
            ) && e.contains(&file.display().to_string())
                && e.contains("field `exec_p99_ms`: found -1.5"),
            "{e}"
        );
    }
}
