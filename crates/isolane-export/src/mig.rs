//! `isolane export mig-parted`: the plan's MIG instances as a nvidia-mig-parted configuration
//! (`version: v1`, one entry of `mig-configs`), applied with `nvidia-mig-parted apply -f
//! mig-parted.yaml -c NAME` (or by the GPU operator's MIG manager).

use std::collections::BTreeMap;

use isolane_core::spec::Mechanism;
use serde::Serialize;

use crate::{user, Export, ExportError, ExportFile, Planned};

pub const FILE: &str = "mig-parted.yaml";

/// Every file name a mig-parted export can write.
pub const FILES: &[&str] = &[FILE, crate::capacity::FILE, crate::NOTES_FILE];

/// nvidia-mig-parted's configuration file.
#[derive(Debug, Serialize)]
pub struct MigParted {
    pub version: String,
    #[serde(rename = "mig-configs")]
    pub mig_configs: BTreeMap<String, Vec<DeviceConfig>>,
}

/// The layout of some GPUs.
#[derive(Debug, Serialize)]
pub struct DeviceConfig {
    pub devices: Vec<u32>,
    #[serde(rename = "mig-enabled")]
    pub mig_enabled: bool,
    /// Instances per profile.
    #[serde(rename = "mig-devices")]
    pub mig_devices: BTreeMap<String, u32>,
}

/// The export's files and notes; `name` is the configuration's name in `mig-configs`.
pub fn export(plan: Planned<'_>, name: &str) -> Result<Export, ExportError> {
    let s = plan.scenario;
    let file = plan.file;
    if s.device.mechanism != Mechanism::Mig {
        return Err(user(format!(
            "{file}: device.mechanism = \"{}\": `isolane export mig-parted` takes a plan of MIG \
             instances (mechanism = \"mig\"){}",
            s.device.mechanism.name(),
            match s.device.mechanism {
                Mechanism::Mps => "; export MPS settings with `isolane export mps`",
                _ => "; export the plan with `isolane export k8s`",
            }
        )));
    }
    let mut per_gpu: BTreeMap<u32, BTreeMap<String, u32>> = BTreeMap::new();
    let mut placed = Vec::new();
    for (_, w) in plan.gpu_workloads() {
        let profile = w.partition.mig_profile.clone().unwrap_or_default();
        let gpu = w.gpu_on(&s.device);
        *per_gpu
            .entry(gpu)
            .or_default()
            .entry(profile.clone())
            .or_default() += 1;
        placed.push(format!("`{}` {profile} on GPU {gpu}", w.name));
    }
    if per_gpu.is_empty() {
        return Err(user(format!(
            "{file}: no workload runs on the GPU (every workload has backend = \"cpu\"), so \
             there is no MIG instance to export"
        )));
    }
    let config = MigParted {
        version: "v1".into(),
        mig_configs: BTreeMap::from([(
            name.to_string(),
            per_gpu
                .into_iter()
                .map(|(gpu, mig_devices)| DeviceConfig {
                    devices: vec![gpu],
                    mig_enabled: true,
                    mig_devices,
                })
                .collect(),
        )]),
    };
    let notes = vec![
        "mig-parted takes how many instances of each profile a GPU has, not where they start: \
         the driver places them, so an instance may sit in other memory slices than isolane's \
         admission placed it (the layout as a whole was checked to fit)"
            .into(),
        "mig-parted makes each GPU instance one compute instance of the whole instance, as \
         isolane does; the workloads are matched to instances by profile, not by name"
            .into(),
    ];
    let text = crate::yaml(
        &format!(
            "The MIG layout of the plan {file} (isolane export mig-parted; docs/export.md).\n\
             Apply: nvidia-mig-parted apply -f {FILE} -c {name}\nInstances: {}.",
            placed.join(", ")
        ),
        &config,
    );
    Ok(Export {
        files: vec![ExportFile {
            path: FILE.into(),
            text,
        }],
        notes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing;

    #[test]
    fn the_layout_counts_each_profile_per_gpu() {
        let s = testing::mig();
        let e = export(Planned::new(&s, "p.toml").unwrap(), "isolane-p").unwrap();
        let text = &e.files[0].text;
        let body: String = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .collect::<Vec<_>>()
            .join("\n");
        assert_eq!(
            body,
            "version: v1\nmig-configs:\n  isolane-p:\n  - devices:\n    - 0\n    mig-enabled: \
             true\n    mig-devices:\n      1g.10gb: 2\n      3g.40gb: 1"
        );
        assert!(text.contains("nvidia-mig-parted apply -f mig-parted.yaml -c isolane-p"));
        assert!(e.notes.iter().any(|n| n.contains("not where they start")));
    }

    #[test]
    fn a_plan_without_mig_is_refused_naming_the_field() {
        let s = testing::mps();
        let m = export(Planned::new(&s, "p.toml").unwrap(), "x")
            .unwrap_err()
            .to_string();
        assert!(m.contains("p.toml: device.mechanism = \"mps\""), "{m}");
        assert!(m.contains("isolane export mps"), "{m}");
    }
}
