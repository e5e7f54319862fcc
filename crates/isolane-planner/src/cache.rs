//! Profiles on disk, reusable across plans and machines: one JSON file per (GPU, driver, model,
//! batch, precision, mechanism, partition), so that planning with a warm cache measures nothing,
//! and a folder of them measured on one GPU can be committed and planned from elsewhere
//! (`--device-model NAME --profiles DIR`).
//!
//! Layout: `<gpu>/<driver>/<model>-b<batch>-<precision>-<mechanism>-<partition>.json`, and in
//! each `<gpu>/<driver>/` a `device.json` ([`DeviceRecord`]) saying which device model the GPU
//! is, so that an offline plan finds the profiles of an `a100-80gb` whatever the GPU's name.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::Point;

/// The name of the file that describes the GPU of a `<gpu>/<driver>/` folder.
pub const DEVICE_FILE: &str = "device.json";

/// What a profile was measured for. Every field is part of the file's path: a profile is reused
/// only for exactly the same GPU, driver, model (file contents), batch, precision, mechanism and
/// partition.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ProfileKey {
    /// GPU name as the driver reports it (`NVIDIA H100 80GB HBM3`), or `cpu <model name>`.
    pub gpu: String,
    /// Driver version (`580.159.04`); `none` on the CPU.
    pub driver: String,
    /// Built-in name, or an ONNX file's name and content hash, or the spin/kernel model.
    pub model: String,
    pub batch: u32,
    pub precision: String,
    pub mechanism: String,
    /// The partition as [`crate::Ladder::label`] names it: `48` (SMs), `25` (%), `1g.10gb`.
    pub partition: String,
}

/// This machine's CPU as [`ProfileKey::gpu`] names it for CPU profiles: `cpu <model name>`
/// (/proc/cpuinfo's), `cpu cpu` where it cannot be read.
pub fn cpu_name() -> String {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "cpu".into());
    format!("cpu {model}")
}

/// A name made safe for a path: anything but ASCII letters, digits and dots becomes `_`.
pub(crate) fn clean(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

impl ProfileKey {
    /// `<gpu>/<driver>`, relative to the cache.
    fn device_dir(&self) -> PathBuf {
        Path::new(&clean(&self.gpu)).join(clean(&self.driver))
    }

    /// The file name of the workload's profiles without the partition: `resnet18-b1-fp16-green-`.
    fn stem(&self) -> String {
        format!(
            "{}-b{}-{}-{}-",
            clean(&self.model),
            self.batch,
            clean(&self.precision),
            clean(&self.mechanism)
        )
    }

    pub(crate) fn path(&self) -> PathBuf {
        self.device_dir()
            .join(format!("{}{}.json", self.stem(), clean(&self.partition)))
    }
}

/// The GPU a `<gpu>/<driver>/` folder's profiles were measured on (its `device.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceRecord {
    pub gpu: String,
    pub driver: String,
    /// The offline device model the GPU was recognised as (`h100-sxm`, `a100-80gb`, …;
    /// `discovered:<name>` for a GPU without one, `cpu` for the CPU).
    pub device_model: String,
}

/// The longest execution time a profile may hold, in ms: 100 days, a deadline's bound.
pub const MAX_PROFILE_MS: f64 = 8.64e9;

/// One profile file: execution times alone in one partition (ms).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Times {
    pub exec_p50_ms: f64,
    pub exec_p99_ms: f64,
    pub exec_mean_ms: f64,
    /// See [`Point::exec_p999_ms`]; absent in profiles kept before it was measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec_p999_ms: Option<f64>,
    /// The revision of the engine that measured it (`isolane_cuda::ENGINE_REVISION` for the
    /// cuda backend); absent for the CPU backend and in profiles kept before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_revision: Option<u32>,
}

impl Times {
    /// A profile measured by the engine of `engine_revision`.
    pub fn of(p: &Point, engine_revision: Option<u32>) -> Times {
        Times {
            exec_p50_ms: p.exec_p50_ms,
            exec_p99_ms: p.exec_p99_ms,
            exec_mean_ms: p.exec_mean_ms,
            exec_p999_ms: p.exec_p999_ms,
            engine_revision,
        }
    }

    /// Whether the engine of `revision` measured it: a profile of another revision (the same
    /// model then runs at another speed) is to be measured again.
    pub fn measured_by(&self, revision: Option<u32>) -> bool {
        self.engine_revision == revision
    }

    /// What is wrong with the numbers of a profile file, naming the field: every time finite,
    /// more than 0 and at most [`MAX_PROFILE_MS`] (serde reads a negative or absurd time as
    /// readily as a good one, and the search would plan with it).
    pub fn check(&self) -> Result<(), String> {
        let times = [
            ("exec_p50_ms", Some(self.exec_p50_ms)),
            ("exec_p99_ms", Some(self.exec_p99_ms)),
            ("exec_mean_ms", Some(self.exec_mean_ms)),
            ("exec_p999_ms", self.exec_p999_ms),
        ];
        for (field, v) in times {
            let Some(v) = v else { continue };
            if !(v.is_finite() && v > 0.0 && v <= MAX_PROFILE_MS) {
                return Err(format!(
                    "field `{field}`: found {v}; expected a finite number of milliseconds > 0, at \
                     most {MAX_PROFILE_MS:e} (100 days)"
                ));
            }
        }
        Ok(())
    }

    /// The profile as the search knows it, at ladder size `size`.
    pub fn at(&self, size: u32) -> Point {
        Point {
            size,
            exec_p50_ms: self.exec_p50_ms,
            exec_p99_ms: self.exec_p99_ms,
            exec_mean_ms: self.exec_mean_ms,
            exec_p999_ms: self.exec_p999_ms,
        }
    }
}

/// A folder of profiles.
#[derive(Debug, Clone)]
pub struct ProfileCache {
    dir: PathBuf,
}

impl ProfileCache {
    pub fn new(dir: impl Into<PathBuf>) -> ProfileCache {
        ProfileCache { dir: dir.into() }
    }

    /// `$XDG_CACHE_HOME/isolane/profiles`, else `~/.cache/isolane/profiles`, else
    /// `.isolane-profiles` here.
    pub fn default_dir() -> PathBuf {
        let base = std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")));
        match base {
            Some(b) => b.join("isolane").join("profiles"),
            None => PathBuf::from(".isolane-profiles"),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The profile for `key`, if one was stored and reads back. A file that does not parse
    /// (written by another version, cut off) or holds a time that cannot be (NaN, negative,
    /// absurd: [`Times::check`]) counts as absent and is measured again.
    pub fn get(&self, key: &ProfileKey) -> Option<Times> {
        self.read(key).ok().flatten()
    }

    /// The profile for `key`: `Ok(None)` when there is no file, an error naming the file (and
    /// the field) when it does not parse or holds a time that cannot be. For a folder that is
    /// never measured again (an offline plan's `--profiles`), where a damaged file is the
    /// user's to fix.
    pub fn read(&self, key: &ProfileKey) -> Result<Option<Times>, String> {
        let path = self.dir.join(key.path());
        let text = match isolane_core::files::read_text_capped(
            &path,
            isolane_core::files::MAX_CONFIG_BYTES,
        ) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("{}: {e}", path.display())),
        };
        parse_times(&text)
            .map(Some)
            .map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Stores a profile, and the description of its GPU if the folder has none yet (both
    /// atomically: a plan run beside this one never reads half a file).
    pub fn put(&self, key: &ProfileKey, device: &DeviceRecord, t: &Times) -> std::io::Result<()> {
        let path = self.dir.join(key.path());
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
            let record = parent.join(DEVICE_FILE);
            if !record.exists() {
                write_json(&record, device)?;
            }
        }
        write_json(&path, t)
    }

    /// Copies the profile of `key` and its GPU's description into `to` (same layout), e.g. to
    /// commit the profiles a plan used.
    pub fn export(&self, key: &ProfileKey, to: &ProfileCache) -> std::io::Result<()> {
        let record: DeviceRecord = read_json(&self.dir.join(key.device_dir()).join(DEVICE_FILE))?;
        let times = self.get(key).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("{} is missing", self.dir.join(key.path()).display()),
            )
        })?;
        to.put(key, &record, &times)
    }

    /// Every GPU and driver the cache holds profiles of (its `device.json` files), in no order.
    pub fn devices(&self) -> Vec<DeviceRecord> {
        let Ok(gpus) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        gpus.flatten()
            .filter_map(|g| std::fs::read_dir(g.path()).ok())
            .flat_map(|drivers| drivers.flatten())
            .filter_map(|d| read_json(&d.path().join(DEVICE_FILE)).ok())
            .collect()
    }

    /// The partitions (`48`, `1g.10gb`) the cache has profiles of for `key`'s GPU, driver,
    /// model, batch, precision and mechanism (`key.partition` is ignored), sorted.
    pub fn partitions(&self, key: &ProfileKey) -> Vec<String> {
        let stem = key.stem();
        let Ok(files) = std::fs::read_dir(self.dir.join(key.device_dir())) else {
            return Vec::new();
        };
        let mut found: Vec<String> = files
            .flatten()
            .filter_map(|f| {
                let name = f.file_name().to_string_lossy().into_owned();
                let rest = name.strip_prefix(&stem)?.strip_suffix(".json")?;
                Some(rest.to_string())
            })
            .collect();
        // Numbers in numeric order, names (MIG profiles) after them.
        found.sort_by_key(|p| (p.parse::<u64>().unwrap_or(u64::MAX), p.clone()));
        found
    }
}

/// A profile file's text as [`Times`], checked ([`Times::check`]).
pub fn parse_times(text: &str) -> Result<Times, String> {
    let t: Times = serde_json::from_str(text).map_err(|e| e.to_string())?;
    t.check()?;
    Ok(t)
}

pub(crate) fn write_json(path: &Path, value: &impl Serialize) -> std::io::Result<()> {
    let json = serde_json::to_vec_pretty(value).map_err(std::io::Error::other)?;
    isolane_core::files::write_atomic(path, &json)
}

pub(crate) fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> std::io::Result<T> {
    let text = isolane_core::files::read_text_capped(path, isolane_core::files::MAX_CONFIG_BYTES)?;
    serde_json::from_str(&text).map_err(|e| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{}: {e}", path.display()),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(partition: &str) -> ProfileKey {
        ProfileKey {
            gpu: "NVIDIA H100 80GB HBM3".into(),
            driver: "580.159.04".into(),
            model: "resnet18".into(),
            batch: 1,
            precision: "fp16".into(),
            mechanism: "green".into(),
            partition: partition.into(),
        }
    }

    fn h100() -> DeviceRecord {
        DeviceRecord {
            gpu: "NVIDIA H100 80GB HBM3".into(),
            driver: "580.159.04".into(),
            device_model: "h100-sxm".into(),
        }
    }

    const T: Times = Times {
        exec_p50_ms: 0.4,
        exec_p99_ms: 0.45,
        exec_mean_ms: 0.41,
        exec_p999_ms: Some(0.5),
        engine_revision: Some(1),
    };

    #[test]
    fn a_profile_knows_the_engine_revision_that_measured_it() {
        let d = tempfile::tempdir().unwrap();
        let c = ProfileCache::new(d.path());
        c.put(&key("48"), &h100(), &T).unwrap();
        let back = c.get(&key("48")).unwrap();
        assert!(back.measured_by(Some(1)));
        assert!(!back.measured_by(Some(2)) && !back.measured_by(None));
        // A profile kept before revisions were recorded reads back without one: measured again
        // by a cuda build, still used by the CPU backend's.
        let old = r#"{"exec_p50_ms": 0.4, "exec_p99_ms": 0.45, "exec_mean_ms": 0.41}"#;
        let path = d.path().join(key("64").path());
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, old).unwrap();
        let back = c.get(&key("64")).unwrap();
        assert!(back.measured_by(None) && !back.measured_by(Some(1)));
    }

    #[test]
    fn a_profile_is_reused_only_for_the_same_key() {
        let d = tempfile::tempdir().unwrap();
        let c = ProfileCache::new(d.path());
        assert_eq!(c.get(&key("48")), None);
        c.put(&key("48"), &h100(), &T).unwrap();
        assert_eq!(c.get(&key("48")), Some(T));
        assert_eq!(c.get(&key("56")), None);
        let other = ProfileKey {
            precision: "fp32".into(),
            ..key("48")
        };
        assert_eq!(c.get(&other), None);
        let other_driver = ProfileKey {
            driver: "570.86.15".into(),
            ..key("48")
        };
        assert_eq!(c.get(&other_driver), None);
        // A damaged file is measured again, not trusted.
        std::fs::write(d.path().join(key("48").path()), "{").unwrap();
        assert_eq!(c.get(&key("48")), None);
    }

    #[test]
    fn a_folder_says_which_device_it_was_measured_on_and_what_it_has() {
        let d = tempfile::tempdir().unwrap();
        let c = ProfileCache::new(d.path());
        for p in ["64", "8", "1g.10gb", "16"] {
            c.put(&key(p), &h100(), &T).unwrap();
        }
        assert_eq!(c.devices(), vec![h100()]);
        assert_eq!(c.partitions(&key("")), ["8", "16", "64", "1g.10gb"]);
        let fp32 = ProfileKey {
            precision: "fp32".into(),
            ..key("")
        };
        assert!(c.partitions(&fp32).is_empty());

        // Exported: the same layout, with the device's description, elsewhere.
        let e = tempfile::tempdir().unwrap();
        let to = ProfileCache::new(e.path());
        c.export(&key("16"), &to).unwrap();
        assert_eq!(to.get(&key("16")), Some(T));
        assert_eq!(to.devices(), vec![h100()]);
        assert_eq!(to.partitions(&key("")), ["16"]);
        assert!(c.export(&key("24"), &to).is_err(), "nothing to export");
    }

    /// Issue 31: a profile file is read at most to a cap, so a link to an endless file (or a
    /// huge one) is an error naming the cap, not all of memory.
    #[test]
    fn an_endless_profile_file_is_refused_at_the_cap() {
        let d = tempfile::tempdir().unwrap();
        let c = ProfileCache::new(d.path());
        c.put(&key("48"), &h100(), &T).unwrap();
        let path = d.path().join(key("48").path());
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink("/dev/zero", &path).unwrap();
        let e = c.read(&key("48")).unwrap_err();
        assert!(e.contains("larger than 16 MiB"), "{e}");
        assert_eq!(c.get(&key("48")), None);
    }

    /// Issue 31: a profile's times were taken as they read (negative, zero, 1e308), and the
    /// search planned with them. Such a file is refused by field; the cache measures it again.
    #[test]
    fn a_profile_with_impossible_times_is_refused_by_field() {
        let d = tempfile::tempdir().unwrap();
        let c = ProfileCache::new(d.path());
        c.put(&key("48"), &h100(), &T).unwrap();
        let path = d.path().join(key("48").path());
        for (text, field) in [
            (
                r#"{"exec_p50_ms": -0.4, "exec_p99_ms": 0.45, "exec_mean_ms": 0.41}"#,
                "exec_p50_ms",
            ),
            (
                r#"{"exec_p50_ms": 0.4, "exec_p99_ms": 0, "exec_mean_ms": 0.41}"#,
                "exec_p99_ms",
            ),
            (
                r#"{"exec_p50_ms": 0.4, "exec_p99_ms": 0.45, "exec_mean_ms": 1e308}"#,
                "exec_mean_ms",
            ),
            (
                r#"{"exec_p50_ms": 0.4, "exec_p99_ms": 0.45, "exec_mean_ms": 0.41, "exec_p999_ms": -1}"#,
                "exec_p999_ms",
            ),
        ] {
            std::fs::write(&path, text).unwrap();
            let e = c.read(&key("48")).unwrap_err();
            assert!(
                e.contains(&path.display().to_string()) && e.contains(&format!("field `{field}`")),
                "{e}"
            );
            assert_eq!(c.get(&key("48")), None);
        }
        // Out of f64's range, or not a number at all: serde refuses it, named by the file.
        std::fs::write(
            &path,
            r#"{"exec_p50_ms": 1e999, "exec_p99_ms": 1, "exec_mean_ms": 1}"#,
        )
        .unwrap();
        assert!(c
            .read(&key("48"))
            .unwrap_err()
            .contains(&path.display().to_string()));
        assert_eq!(c.read(&key("56")), Ok(None));
    }

    /// Property test of the profile reader: whatever the text, a checked profile or an error,
    /// never a panic; a profile it accepts has usable times. `cargo test` runs
    /// ISOLANE_FUZZ_CASES (default 500) cases; `scripts/fuzz.sh` many more.
    mod fuzz {
        use super::super::*;
        use proptest::prelude::*;

        const NUMBERS: &[&str] = &[
            "0", "-0.0", "1", "-1", "0.45", "1e308", "1e999", "-1e999", "8.64e9", "8.64e10", "NaN",
            "Infinity", "null", "\"1\"", "true", "1e-320",
        ];

        fn number() -> impl Strategy<Value = String> {
            prop_oneof![
                proptest::sample::select(NUMBERS).prop_map(str::to_string),
                any::<f64>().prop_map(|v| format!("{v:e}")),
            ]
        }

        proptest! {
            #![proptest_config(isolane_core::fuzz::config(500))]

            #[test]
            fn fuzz_profile_files_are_refused_or_usable(
                values in proptest::collection::vec(number(), 5),
                keys in proptest::collection::vec(0usize..6, 0..6),
                cut in any::<prop::sample::Index>(),
            ) {
                const KEYS: [&str; 6] = [
                    "exec_p50_ms", "exec_p99_ms", "exec_mean_ms", "exec_p999_ms",
                    "engine_revision", "other",
                ];
                let fields: Vec<String> = keys
                    .iter()
                    .zip(&values)
                    .map(|(&k, v)| format!("\"{}\": {v}", KEYS[k]))
                    .collect();
                let text = format!("{{{}}}", fields.join(", "));
                // Whole, and cut anywhere (a file half written by another version).
                let cut_at = cut.index(text.len() + 1);
                for t in [&text[..], &text[..cut_at]] {
                    if let Ok(p) = parse_times(t) {
                        for v in [p.exec_p50_ms, p.exec_p99_ms, p.exec_mean_ms]
                            .into_iter()
                            .chain(p.exec_p999_ms)
                        {
                            prop_assert!(v.is_finite() && v > 0.0 && v <= MAX_PROFILE_MS);
                        }
                    }
                }
            }
        }
    }
}
