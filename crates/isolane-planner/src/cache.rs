//! Profiles on disk, reusable across plans: one JSON file per (device, model, batch,
//! precision, mechanism, size), so that planning with a warm cache measures nothing.

use std::path::{Path, PathBuf};

use crate::Point;

/// What a profile was measured for. Every field is part of the file name: a profile is reused
/// only for exactly the same device, driver, model (file contents), batch, precision,
/// mechanism and partition size.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ProfileKey {
    /// GPU name and driver (`NVIDIA H100 80GB HBM3 580.159.04`), or the CPU's.
    pub device: String,
    /// Built-in name, or an ONNX file's name and content hash, or the spin/kernel model.
    pub model: String,
    pub batch: u32,
    pub precision: String,
    pub mechanism: String,
    pub size: u32,
}

impl ProfileKey {
    fn file_name(&self) -> String {
        let clean = |s: &str| -> String {
            s.chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '.' {
                        c
                    } else {
                        '_'
                    }
                })
                .collect()
        };
        format!(
            "{}/{}-b{}-{}-{}-{}.json",
            clean(&self.device),
            clean(&self.model),
            self.batch,
            clean(&self.precision),
            clean(&self.mechanism),
            self.size
        )
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
    /// (written by another version, cut off) counts as absent and is measured again.
    pub fn get(&self, key: &ProfileKey) -> Option<Point> {
        let text = std::fs::read_to_string(self.dir.join(key.file_name())).ok()?;
        serde_json::from_str(&text).ok()
    }

    /// Stores a profile (atomically: a plan run beside this one never reads half a file).
    pub fn put(&self, key: &ProfileKey, p: &Point) -> std::io::Result<()> {
        let path = self.dir.join(key.file_name());
        let json = serde_json::to_vec_pretty(p).map_err(std::io::Error::other)?;
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        isolane_core::files::write_atomic(&path, &json)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(size: u32) -> ProfileKey {
        ProfileKey {
            device: "NVIDIA H100 80GB HBM3 580.159.04".into(),
            model: "resnet18".into(),
            batch: 1,
            precision: "fp16".into(),
            mechanism: "green".into(),
            size,
        }
    }

    #[test]
    fn a_profile_is_reused_only_for_the_same_key() {
        let d = tempfile::tempdir().unwrap();
        let c = ProfileCache::new(d.path());
        let p = Point {
            size: 48,
            exec_p50_ms: 0.4,
            exec_p99_ms: 0.45,
            exec_mean_ms: 0.41,
            exec_p999_ms: Some(0.5),
        };
        assert_eq!(c.get(&key(48)), None);
        c.put(&key(48), &p).unwrap();
        assert_eq!(c.get(&key(48)), Some(p));
        assert_eq!(c.get(&key(56)), None);
        let other = ProfileKey {
            precision: "fp32".into(),
            ..key(48)
        };
        assert_eq!(c.get(&other), None);
        // A damaged file is measured again, not trusted.
        std::fs::write(d.path().join(key(48).file_name()), "{").unwrap();
        assert_eq!(c.get(&key(48)), None);
    }
}
