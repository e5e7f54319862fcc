//! Offline device models: what a GPU offers to partitioning, so that a plan can be checked on a
//! machine without that GPU (`isolane plan --device-model NAME`).
//!
//! Green-context granularity follows paper 000, Table I. MIG profiles and placements follow
//! NVIDIA's MIG user guide: placements are expressed in memory slices (8 per GPU), which is how
//! `nvidia-smi mig -lgipp` reports them, and every GPU instance also takes compute slices (7 per
//! GPU).

use serde::Serialize;

/// Minimum SM count of one green-context group and the step between allowed sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct GreenRules {
    pub min_sms: u32,
    pub step_sms: u32,
}

/// Table I of paper 000, keyed by compute-capability major version.
pub fn green_rules(cc_major: u32) -> Option<GreenRules> {
    match cc_major {
        0..=5 => None,
        6 | 7 => Some(GreenRules {
            min_sms: 2,
            step_sms: 2,
        }),
        8 => Some(GreenRules {
            min_sms: 4,
            step_sms: 2,
        }),
        _ => Some(GreenRules {
            min_sms: 8,
            step_sms: 8,
        }),
    }
}

/// One MIG GPU-instance profile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MigProfile {
    /// As nvidia-smi names it, e.g. "3g.40gb".
    pub name: &'static str,
    /// Compute slices (the "Ng" in the name).
    pub compute_slices: u32,
    /// Memory slices the instance spans, out of `MigModel::memory_slices`.
    pub memory_slices: u32,
    /// First memory slice of each allowed placement.
    pub placements: &'static [u32],
    /// At most this many instances of the profile on one GPU (media-extension profiles: 1).
    pub max_instances: u32,
    /// Memory of one instance in MiB (as the profile name rounds it).
    pub memory_mib: u64,
    /// SMs of one instance.
    pub sms: u32,
    /// Profiles with media extensions are alternatives of a base profile and are left out when
    /// enumerating layouts, as NVIDIA's layout tables do.
    pub media_extensions: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MigModel {
    pub memory_slices: u32,
    pub compute_slices: u32,
    pub profiles: Vec<MigProfile>,
}

impl MigModel {
    pub fn profile(&self, name: &str) -> Option<&MigProfile> {
        self.profiles.iter().find(|p| p.name == name)
    }

    pub fn profile_names(&self) -> Vec<&'static str> {
        self.profiles.iter().map(|p| p.name).collect()
    }
}

/// The SMs of one unit when green contexts of these sizes come from one split: their greatest
/// common divisor (0 for none). Admission and the split itself (isolane-gpu) use it.
pub fn green_unit(sizes: impl IntoIterator<Item = u32>) -> u32 {
    fn gcd(a: u32, b: u32) -> u32 {
        if b == 0 {
            a
        } else {
            gcd(b, a % b)
        }
    }
    sizes.into_iter().fold(0, gcd)
}

/// A device as admission control sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceModel {
    pub name: &'static str,
    pub description: &'static str,
    pub sm_count: u32,
    pub memory_mib: u64,
    pub compute_capability: (u32, u32),
    pub mig: Option<MigModel>,
}

impl DeviceModel {
    pub fn green_rules(&self) -> Option<GreenRules> {
        green_rules(self.compute_capability.0)
    }

    /// How many groups of the smallest green size one split of the device gives while keeping
    /// each group within SMs that are scheduled together (a GPC): `(SMs a group, groups)`. On
    /// the 132-SM GH100 (H100 SXM, H200) the GPCs are uneven and the driver gives 15 groups of
    /// 8 (measured, driver 580). The rest can be split off only by ignoring co-scheduling, and
    /// in such a group cuDNN's runtime-compiled kernels die of a divide error (SIGFPE,
    /// measured), so isolane never does: a layout in units of 8 SMs holds at most 120 SMs there.
    /// Larger units were not measured to fall short (2 × 64 SMs runs); other models: `None`.
    pub fn green_split_limit(&self) -> Option<(u32, u32)> {
        match self.name {
            "h100-sxm" | "h200" => Some((8, 15)),
            _ => None,
        }
    }
}

/// The 7-compute/8-memory-slice MIG layout shared by A100, H100 and H200; only the memory per
/// slice and the SMs per GPC differ. `names` are the profile names in the order
/// 1g, 1g+me, 1g (two memory slices), 2g, 3g, 4g, 7g.
fn mig_7_slice(
    names: [&'static str; 7],
    mib_per_slice: u64,
    sms_per_slice: u32,
    sm_count: u32,
) -> MigModel {
    let p = |i: usize, c: u32, m: u32, placements: &'static [u32], max: u32, me: bool, sms: u32| {
        MigProfile {
            name: names[i],
            compute_slices: c,
            memory_slices: m,
            placements,
            max_instances: max,
            memory_mib: mib_per_slice * m as u64,
            sms,
            media_extensions: me,
        }
    };
    MigModel {
        memory_slices: 8,
        compute_slices: 7,
        profiles: vec![
            p(0, 1, 1, &[0, 1, 2, 3, 4, 5, 6], 7, false, sms_per_slice),
            p(1, 1, 1, &[0, 1, 2, 3, 4, 5, 6], 1, true, sms_per_slice),
            p(2, 1, 2, &[0, 2, 4, 6], 4, false, sms_per_slice),
            p(3, 2, 2, &[0, 2, 4], 3, false, 2 * sms_per_slice),
            p(4, 3, 4, &[0, 4], 2, false, 3 * sms_per_slice),
            p(5, 4, 4, &[0], 1, false, 4 * sms_per_slice),
            // The whole-GPU instance gets every SM, not 7 × the per-slice share.
            p(6, 7, 8, &[0], 1, false, sm_count),
        ],
    }
}

/// All built-in offline device models.
pub fn device_models() -> Vec<DeviceModel> {
    vec![
        DeviceModel {
            name: "h100-sxm",
            description: "NVIDIA H100 SXM5 80GB (Hopper, 132 SMs)",
            sm_count: 132,
            memory_mib: 81_559,
            compute_capability: (9, 0),
            mig: Some(mig_7_slice(
                [
                    "1g.10gb",
                    "1g.10gb+me",
                    "1g.20gb",
                    "2g.20gb",
                    "3g.40gb",
                    "4g.40gb",
                    "7g.80gb",
                ],
                10_240,
                16,
                132,
            )),
        },
        DeviceModel {
            name: "h200",
            description: "NVIDIA H200 SXM 141GB (Hopper, 132 SMs)",
            sm_count: 132,
            memory_mib: 143_771,
            compute_capability: (9, 0),
            mig: Some(mig_7_slice(
                [
                    "1g.18gb",
                    "1g.18gb+me",
                    "1g.35gb",
                    "2g.35gb",
                    "3g.71gb",
                    "4g.71gb",
                    "7g.141gb",
                ],
                17_920,
                16,
                132,
            )),
        },
        DeviceModel {
            name: "a100-40gb",
            description: "NVIDIA A100 SXM4 40GB (Ampere, 108 SMs, 7 compute slices)",
            sm_count: 108,
            memory_mib: 40_960,
            compute_capability: (8, 0),
            mig: Some(mig_7_slice(
                [
                    "1g.5gb",
                    "1g.5gb+me",
                    "1g.10gb",
                    "2g.10gb",
                    "3g.20gb",
                    "4g.20gb",
                    "7g.40gb",
                ],
                5_120,
                14,
                98,
            )),
        },
        DeviceModel {
            name: "a100-80gb",
            description: "NVIDIA A100 SXM4 80GB (Ampere, 108 SMs, 7 compute slices)",
            sm_count: 108,
            memory_mib: 81_920,
            compute_capability: (8, 0),
            mig: Some(mig_7_slice(
                [
                    "1g.10gb",
                    "1g.10gb+me",
                    "1g.20gb",
                    "2g.20gb",
                    "3g.40gb",
                    "4g.40gb",
                    "7g.80gb",
                ],
                10_240,
                14,
                98,
            )),
        },
        DeviceModel {
            name: "l40s",
            description: "NVIDIA L40S 48GB (Ada, 142 SMs, no MIG)",
            sm_count: 142,
            memory_mib: 46_068,
            compute_capability: (8, 9),
            mig: None,
        },
        DeviceModel {
            name: "orin-agx",
            description: "NVIDIA Jetson AGX Orin 64GB (Ampere iGPU, 16 SMs, shared memory)",
            sm_count: 16,
            memory_mib: 62_800,
            compute_capability: (8, 7),
            mig: None,
        },
        DeviceModel {
            name: "orin-nano",
            description: "NVIDIA Jetson Orin Nano 8GB (Ampere iGPU, 8 SMs, shared memory)",
            sm_count: 8,
            memory_mib: 7_620,
            compute_capability: (8, 7),
            mig: None,
        },
    ]
}

pub fn device_model(name: &str) -> Option<DeviceModel> {
    device_models().into_iter().find(|d| d.name == name)
}

pub fn device_model_names() -> Vec<&'static str> {
    device_models().iter().map(|d| d.name).collect()
}

/// One GPU instance placed on the GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MigPlacement {
    pub profile: &'static str,
    /// First memory slice.
    pub start: u32,
    pub memory_slices: u32,
    pub compute_slices: u32,
}

/// Every maximal layout of base profiles (no media extensions): sets of non-overlapping
/// placements within the compute budget to which no further instance can be added. For the A100
/// this yields the 19 layouts of NVIDIA's table (paper 000, Fig. 2), ordered by start slice.
pub fn enumerate_mig_layouts(mig: &MigModel) -> Vec<Vec<MigPlacement>> {
    let base: Vec<&MigProfile> = mig
        .profiles
        .iter()
        .filter(|p| !p.media_extensions)
        .collect();
    let mut layouts = Vec::new();
    let mut current = Vec::new();
    extend_layouts(mig, &base, 0, &mut current, &mut layouts);
    layouts
}

/// Depth-first over memory slices: at `slice`, either leave it empty or start an instance there.
fn extend_layouts(
    mig: &MigModel,
    profiles: &[&MigProfile],
    slice: u32,
    current: &mut Vec<MigPlacement>,
    out: &mut Vec<Vec<MigPlacement>>,
) {
    if slice >= mig.memory_slices {
        if is_maximal(mig, profiles, current) {
            out.push(current.clone());
        }
        return;
    }
    let used_compute: u32 = current.iter().map(|p| p.compute_slices).sum();
    for p in profiles {
        if p.placements.contains(&slice)
            && slice + p.memory_slices <= mig.memory_slices
            && used_compute + p.compute_slices <= mig.compute_slices
            && current.iter().filter(|c| c.profile == p.name).count() < p.max_instances as usize
        {
            current.push(MigPlacement {
                profile: p.name,
                start: slice,
                memory_slices: p.memory_slices,
                compute_slices: p.compute_slices,
            });
            extend_layouts(mig, profiles, slice + p.memory_slices, current, out);
            current.pop();
        }
    }
    extend_layouts(mig, profiles, slice + 1, current, out);
}

fn overlaps(a_start: u32, a_len: u32, b_start: u32, b_len: u32) -> bool {
    a_start < b_start + b_len && b_start < a_start + a_len
}

/// Whether `placement` of profile `p` can join `current`.
fn fits(mig: &MigModel, p: &MigProfile, start: u32, current: &[MigPlacement]) -> bool {
    let used_compute: u32 = current.iter().map(|c| c.compute_slices).sum();
    p.placements.contains(&start)
        && start + p.memory_slices <= mig.memory_slices
        && used_compute + p.compute_slices <= mig.compute_slices
        && current.iter().filter(|c| c.profile == p.name).count() < p.max_instances as usize
        && current
            .iter()
            .all(|c| !overlaps(c.start, c.memory_slices, start, p.memory_slices))
}

fn is_maximal(mig: &MigModel, profiles: &[&MigProfile], current: &[MigPlacement]) -> bool {
    !profiles
        .iter()
        .any(|p| p.placements.iter().any(|&s| fits(mig, p, s, current)))
}

/// Places the requested profiles (in request order) on one GPU, or says none exists. Backtracks
/// over placements, so a request that fits in some order is always found.
pub fn place_mig_instances(mig: &MigModel, requested: &[&str]) -> Option<Vec<MigPlacement>> {
    let profiles: Option<Vec<&MigProfile>> = requested.iter().map(|n| mig.profile(n)).collect();
    let profiles = profiles?;
    // Largest first prunes the search; the result is returned in request order.
    let mut order: Vec<usize> = (0..profiles.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(profiles[i].memory_slices));
    let mut placed: Vec<MigPlacement> = Vec::new();
    let mut starts = vec![0u32; profiles.len()];
    if place_from(mig, &profiles, &order, 0, &mut placed, &mut starts) {
        Some(
            (0..profiles.len())
                .map(|i| MigPlacement {
                    profile: profiles[i].name,
                    start: starts[i],
                    memory_slices: profiles[i].memory_slices,
                    compute_slices: profiles[i].compute_slices,
                })
                .collect(),
        )
    } else {
        None
    }
}

fn place_from(
    mig: &MigModel,
    profiles: &[&MigProfile],
    order: &[usize],
    k: usize,
    placed: &mut Vec<MigPlacement>,
    starts: &mut [u32],
) -> bool {
    let Some(&i) = order.get(k) else { return true };
    let p = profiles[i];
    for &s in p.placements {
        if fits(mig, p, s, placed) {
            placed.push(MigPlacement {
                profile: p.name,
                start: s,
                memory_slices: p.memory_slices,
                compute_slices: p.compute_slices,
            });
            starts[i] = s;
            if place_from(mig, profiles, order, k + 1, placed, starts) {
                return true;
            }
            placed.pop();
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn short(layout: &[MigPlacement]) -> String {
        layout
            .iter()
            .map(|p| p.profile.split('.').next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join("+")
    }

    #[test]
    fn green_rules_follow_table_one() {
        assert_eq!(
            green_rules(6),
            Some(GreenRules {
                min_sms: 2,
                step_sms: 2
            })
        );
        assert_eq!(
            green_rules(7),
            Some(GreenRules {
                min_sms: 2,
                step_sms: 2
            })
        );
        assert_eq!(
            green_rules(8),
            Some(GreenRules {
                min_sms: 4,
                step_sms: 2
            })
        );
        assert_eq!(
            green_rules(9),
            Some(GreenRules {
                min_sms: 8,
                step_sms: 8
            })
        );
        assert_eq!(
            green_rules(10),
            Some(GreenRules {
                min_sms: 8,
                step_sms: 8
            })
        );
        assert_eq!(green_rules(5), None);
    }

    #[test]
    fn a100_has_exactly_the_19_layouts_of_the_mig_guide() {
        let a100 = device_model("a100-40gb").unwrap();
        let layouts = enumerate_mig_layouts(a100.mig.as_ref().unwrap());
        // The base profiles only: the 1g.10gb (two memory slices) variant is a later addition
        // to the A100 and not part of the 19-layout table.
        let classic: Vec<String> = layouts
            .iter()
            .filter(|l| l.iter().all(|p| p.profile != "1g.10gb"))
            .map(|l| short(l))
            .collect();
        let expected = [
            "1g+1g+1g+1g+1g+1g+1g",
            "1g+1g+1g+1g+2g+1g",
            "1g+1g+1g+1g+3g",
            "1g+1g+2g+1g+1g+1g",
            "1g+1g+2g+2g+1g",
            "1g+1g+2g+3g",
            "2g+1g+1g+1g+1g+1g",
            "2g+1g+1g+2g+1g",
            "2g+1g+1g+3g",
            "2g+2g+1g+1g+1g",
            "2g+2g+2g+1g",
            "2g+2g+3g",
            "3g+1g+1g+1g",
            "3g+2g+1g",
            "3g+3g",
            "4g+1g+1g+1g",
            "4g+2g+1g",
            "4g+3g",
            "7g",
        ];
        let mut got = classic.clone();
        got.sort();
        let mut want: Vec<String> = expected.iter().map(|s| s.to_string()).collect();
        want.sort();
        assert_eq!(got, want);
        assert_eq!(classic.len(), 19);
    }

    #[test]
    fn every_layout_respects_the_compute_budget_and_is_disjoint() {
        for d in device_models() {
            let Some(mig) = d.mig.as_ref() else { continue };
            for layout in enumerate_mig_layouts(mig) {
                let compute: u32 = layout.iter().map(|p| p.compute_slices).sum();
                assert!(compute <= 7, "{}: {:?}", d.name, layout);
                for (i, a) in layout.iter().enumerate() {
                    for b in &layout[i + 1..] {
                        assert!(!overlaps(
                            a.start,
                            a.memory_slices,
                            b.start,
                            b.memory_slices
                        ));
                    }
                }
            }
        }
    }

    #[test]
    fn placement_finds_valid_requests_and_refuses_invalid_ones() {
        let h100 = device_model("h100-sxm").unwrap();
        let mig = h100.mig.as_ref().unwrap();
        let p = place_mig_instances(mig, &["3g.40gb", "3g.40gb"]).unwrap();
        assert_eq!(p.iter().map(|x| x.start).collect::<Vec<_>>(), vec![0, 4]);
        // Request order is kept while the largest is placed first.
        let p = place_mig_instances(mig, &["1g.10gb", "4g.40gb", "2g.20gb"]).unwrap();
        assert_eq!(p[1].start, 0);
        assert!(p[2].start >= 4 && p[0].start >= 4);
        assert!(place_mig_instances(mig, &["4g.40gb", "4g.40gb"]).is_none());
        assert!(place_mig_instances(mig, &["7g.80gb", "1g.10gb"]).is_none());
        assert!(place_mig_instances(mig, &["1g.10gb"; 8]).is_none());
        assert!(place_mig_instances(mig, &["1g.10gb"; 7]).is_some());
        assert!(place_mig_instances(mig, &["1g.10gb+me", "1g.10gb+me"]).is_none());
        assert!(place_mig_instances(mig, &["9g.1tb"]).is_none());
    }

    #[test]
    fn models_have_the_documented_sizes() {
        let names = device_model_names();
        for n in [
            "h100-sxm",
            "h200",
            "a100-40gb",
            "a100-80gb",
            "l40s",
            "orin-agx",
            "orin-nano",
        ] {
            assert!(names.contains(&n), "{n}");
        }
        assert_eq!(device_model("h100-sxm").unwrap().sm_count, 132);
        assert_eq!(device_model("h200").unwrap().sm_count, 132);
        assert_eq!(device_model("a100-40gb").unwrap().sm_count, 108);
        assert_eq!(device_model("orin-agx").unwrap().sm_count, 16);
        assert_eq!(device_model("orin-nano").unwrap().sm_count, 8);
    }
}
