//! Models' memory-system figures, given to `isolane explain --memory FILE` so that a neighbour
//! is named with its memory intensity. Nothing here is estimated: a model the file does not
//! list is "unknown".
//!
//! ```toml
//! [[model]]
//! model = "vit_l_32"      # as the scenario names it
//! dram_gb_s = 812.5       # DRAM traffic while one of its jobs runs, GB/s
//! l2_mib = 38             # its L2 working set, MiB
//! source = "NVML GPM, H200, fp16 batch 1, alone in 48 SMs"   # where the figures come from
//! ```

use std::path::Path;

use isolane_core::files::FileError;
use serde::{Deserialize, Serialize};

/// A model's memory-system figures; either may be missing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryFigures {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dram_gb_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub l2_mib: Option<f64>,
    /// Where the figures come from (a measurement, a computed profile).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
}

impl MemoryFigures {
    /// `DRAM 812.5 GB/s, L2 38 MiB`.
    pub fn words(&self) -> String {
        let mut parts = Vec::new();
        if let Some(d) = self.dram_gb_s {
            parts.push(format!("DRAM {d} GB/s"));
        }
        if let Some(l) = self.l2_mib {
            parts.push(format!("L2 {l} MiB"));
        }
        parts.join(", ")
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    model: Vec<Entry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    model: String,
    dram_gb_s: Option<f64>,
    l2_mib: Option<f64>,
    source: Option<String>,
}

/// The memory figures of the models a file lists.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MemoryProfiles {
    models: Vec<(String, MemoryFigures)>,
}

impl MemoryProfiles {
    /// Reads `path` (the format above). A mistake is named by file, entry and field.
    pub fn load(path: &Path) -> Result<MemoryProfiles, FileError> {
        let text = isolane_core::files::read_config(path)?;
        Self::parse(&text).map_err(|e| FileError::parse(path, e))
    }

    pub fn parse(text: &str) -> Result<MemoryProfiles, String> {
        let file: File = toml::from_str(text).map_err(|e| {
            format!(
                "{}; expected [[model]] entries with model (its name), dram_gb_s, l2_mib and \
                 source",
                e.message()
            )
        })?;
        let mut models: Vec<(String, MemoryFigures)> = Vec::new();
        for (i, e) in file.model.into_iter().enumerate() {
            let at = format!("[[model]] {} (`{}`)", i + 1, e.model);
            if e.model.trim().is_empty() {
                return Err(format!(
                    "[[model]] {}: `model` is empty; expected a model's name",
                    i + 1
                ));
            }
            for (field, v) in [("dram_gb_s", e.dram_gb_s), ("l2_mib", e.l2_mib)] {
                if let Some(v) = v.filter(|v| !v.is_finite() || *v < 0.0) {
                    return Err(format!(
                        "{at}: `{field}` = {v}; expected a finite number ≥ 0"
                    ));
                }
            }
            if e.dram_gb_s.is_none() && e.l2_mib.is_none() {
                return Err(format!(
                    "{at}: neither `dram_gb_s` nor `l2_mib`; an entry gives at least one"
                ));
            }
            if models.iter().any(|(m, _)| *m == e.model) {
                return Err(format!("{at}: `{}` is listed twice", e.model));
            }
            models.push((
                e.model,
                MemoryFigures {
                    dram_gb_s: e.dram_gb_s,
                    l2_mib: e.l2_mib,
                    source: e.source,
                },
            ));
        }
        Ok(MemoryProfiles { models })
    }

    /// The figures of `model`, when the file lists it.
    pub fn of(&self, model: &str) -> Option<MemoryFigures> {
        self.models
            .iter()
            .find(|(m, _)| m == model)
            .map(|(_, f)| f.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_profile_file_gives_figures_by_model() {
        let p = MemoryProfiles::parse(
            "[[model]]\nmodel = \"vit_l_32\"\ndram_gb_s = 812.5\nl2_mib = 38\n\
             [[model]]\nmodel = \"resnet18\"\nl2_mib = 12\nsource = \"computed\"\n",
        )
        .unwrap();
        let v = p.of("vit_l_32").unwrap();
        assert_eq!((v.dram_gb_s, v.l2_mib), (Some(812.5), Some(38.0)));
        assert_eq!(v.words(), "DRAM 812.5 GB/s, L2 38 MiB");
        assert_eq!(
            p.of("resnet18").unwrap().source.as_deref(),
            Some("computed")
        );
        assert!(p.of("mobilenet_v2").is_none());
    }

    #[test]
    fn mistakes_are_named_by_entry_and_field() {
        for (text, words) in [
            (
                "[[model]]\nmodel = \"a\"\ndram = 1\n",
                "unknown field `dram`",
            ),
            (
                "[[model]]\nmodel = \"a\"\ndram_gb_s = -1\n",
                "`dram_gb_s` = -1",
            ),
            ("[[model]]\nmodel = \"a\"\nl2_mib = nan\n", "`l2_mib` = NaN"),
            (
                "[[model]]\nmodel = \"a\"\n",
                "neither `dram_gb_s` nor `l2_mib`",
            ),
            ("[[model]]\nmodel = \"\"\nl2_mib = 1\n", "`model` is empty"),
            (
                "[[model]]\nmodel = \"a\"\nl2_mib = 1\n[[model]]\nmodel = \"a\"\nl2_mib = 2\n",
                "[[model]] 2 (`a`): `a` is listed twice",
            ),
            ("model = 3\n", "expected [[model]] entries"),
        ] {
            let e = MemoryProfiles::parse(text).unwrap_err();
            assert!(e.contains(words), "{text}: {e}");
        }
    }

    #[test]
    fn the_file_is_named_in_its_errors() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("mem.toml");
        std::fs::write(&p, "[[model]]\nmodel = 1\n").unwrap();
        let e = MemoryProfiles::load(&p).unwrap_err().to_string();
        assert!(e.contains("mem.toml"), "{e}");
        let e = MemoryProfiles::load(&d.path().join("none.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("none.toml"), "{e}");
    }
}
