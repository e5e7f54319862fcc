//! `plan --auto --phases` (docs/planner.md, "Release phases"): the release phases of a planned
//! scenario, chosen per GPU by [`crate::stagger`], and the note a plan with the scenario's own
//! phases gets where staggering would keep its jobs apart.

use crate::{stagger, Choice, Periodic, StaggerError, Staggered};
use isolane_core::spec::Scenario;

/// The phase search on one GPU's workloads.
struct GpuPhases {
    /// `None` on one GPU.
    gpu: Option<u32>,
    /// The workloads' indices in the scenario.
    members: Vec<usize>,
    /// What [`crate::stagger`] chose for them, in `members`' order.
    staggered: Result<Staggered, StaggerError>,
}

/// The phase search on each GPU's workloads.
fn stagger_per_gpu(
    planned: &Scenario,
    choices: &[Choice],
    gpu_of: &[Option<u32>],
) -> Vec<GpuPhases> {
    let mut groups: Vec<Option<u32>> = gpu_of.to_vec();
    groups.sort();
    groups.dedup();
    groups
        .into_iter()
        .map(|gpu| {
            let members: Vec<usize> = (0..choices.len())
                .filter(|&i| gpu_of.get(i).copied().flatten() == gpu)
                .collect();
            let jobs: Vec<Periodic> = (members.iter())
                .map(|&i| Periodic {
                    rate_hz: planned.workloads[i].rate.hz().unwrap_or(0.0),
                    busy_ms: choices[i].profile.exec_p99_ms,
                    fixed_ms: planned.workloads[i].phase_ms,
                })
                .collect();
            GpuPhases {
                staggered: stagger(&jobs),
                gpu,
                members,
            }
        })
        .collect()
}

fn on_gpu(gpu: Option<u32>) -> String {
    gpu.map_or(String::new(), |g| format!(" on GPU {g}"))
}

/// Releases each workload without a phase of its own where its jobs overlap least those of the
/// workloads on its GPU; returns, per GPU, where and how much they still overlap.
pub(super) fn stagger_releases(
    planned: &mut Scenario,
    choices: &[Choice],
    gpu_of: &[Option<u32>],
) -> Vec<String> {
    let mut lines = Vec::new();
    for GpuPhases {
        gpu,
        members,
        staggered,
    } in stagger_per_gpu(planned, choices, gpu_of)
    {
        let on = on_gpu(gpu);
        match staggered {
            Ok(s) if !s.moved => lines.push(format!(
                "release phases{on} left as they are: staggered, a workload's jobs would overlap \
                 the others' more than in phase (together they need more time than there is)"
            )),
            Ok(s) => {
                let mut words = Vec::new();
                for (k, &i) in members.iter().enumerate() {
                    let w = &mut planned.workloads[i];
                    // 10 µs steps: the search's resolution, and a short line in the file.
                    let phase = (s.phases_ms[k] * 100.0).round() / 100.0;
                    w.phase_ms = Some(phase);
                    words.push(format!(
                        "{} +{phase:.2} ms ({:.0} % overlapped, {:.0} % in phase)",
                        w.name,
                        100.0 * s.overlap[k],
                        100.0 * s.overlap_in_phase[k]
                    ));
                }
                lines.push(format!(
                    "release phases{on} (--phases stagger, over {:.1} ms): {}",
                    s.hyperperiod_ms,
                    words.join(", ")
                ));
            }
            Err(e) => lines.push(format!("release phases{on} left as they are: {e}")),
        }
    }
    lines
}

/// With the scenario's phases (--phases keep): where jobs released together overlap most of
/// their busy time and staggering would keep them apart, says so. The neighbours' interference
/// then comes mostly from the copy engine and memory, which partitions do not separate.
pub(super) fn overlap_notes(
    planned: &Scenario,
    choices: &[Choice],
    gpu_of: &[Option<u32>],
) -> Vec<String> {
    let mut notes = Vec::new();
    for GpuPhases {
        gpu,
        members,
        staggered,
    } in stagger_per_gpu(planned, choices, gpu_of)
    {
        let Ok(s) = staggered else { continue };
        let sum = |v: &[f64]| v.iter().sum::<f64>();
        let most = s.overlap_in_phase.iter().copied().fold(0.0, f64::max);
        if !s.moved || most < 0.5 || sum(&s.overlap) > 0.5 * sum(&s.overlap_in_phase) {
            continue;
        }
        let pct = |v: &[f64]| {
            (members.iter().zip(v))
                .map(|(&i, o)| format!("{} {:.0} %", planned.workloads[i].name, 100.0 * o))
                .collect::<Vec<_>>()
                .join(", ")
        };
        notes.push(format!(
            "note{}: released as the scenario says, the jobs overlap the others' for part of \
             their busy time ({}); released by --phases stagger: {} (docs/planner.md, \
             \"Release phases\")",
            on_gpu(gpu),
            pct(&s.overlap_in_phase),
            pct(&s.overlap)
        ));
    }
    notes
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::Point;

    use super::*;

    /// A planned workload whose every statistic is `p99` ms, at utilisation p99 / 10 ms.
    fn spin_choice(name: &str, p99: f64) -> Choice {
        Choice {
            workload: name.into(),
            size: 8,
            predicted_p99_ms: p99,
            predicted_tail_ms: p99,
            deadline_ms: 10.0,
            util: p99 / 10.0,
            profile: Point {
                size: 8,
                exec_p50_ms: p99,
                exec_p99_ms: p99,
                exec_mean_ms: p99,
                exec_p999_ms: Some(p99),
            },
            memory_mib: None,
            mig_start: None,
        }
    }

    /// `--phases stagger` on several GPUs staggers each GPU's workloads among themselves: a
    /// workload alone on its GPU stays at 0, and a phase the file gives is kept.
    #[test]
    fn releases_are_staggered_per_gpu() {
        let w = |name: &str, extra: &str| {
            format!("[[workload]]\nname = \"{name}\"\nmodel = \"spin:1ms\"\nrate_hz = 100\njobs = 1\n{extra}")
        };
        let text = format!(
            "[device]\nbackend = \"cuda\"\ngpus = [0, 1]\nmechanism = \"green\"\n{}{}{}{}",
            w("big", ""),
            w("alone", ""),
            w("small", ""),
            w("fixed", "phase_ms = 9.0\n")
        );
        let file = Path::new("s.toml");
        let mut s =
            Scenario::from_toml_str(&text, file, &isolane_core::spec::NoBuiltinModels).unwrap();
        let choices = [
            spin_choice("big", 4.0),
            spin_choice("alone", 4.0),
            spin_choice("small", 1.0),
            spin_choice("fixed", 0.5),
        ];
        let lines = stagger_releases(&mut s, &choices, &[Some(0), Some(1), Some(0), Some(0)]);
        assert_eq!(lines.len(), 2, "one line per GPU: {lines:?}");
        let phase = |i: usize| s.workloads[i].phase_ms.unwrap();
        assert_eq!(phase(1), 0.0, "alone on GPU 1");
        assert_eq!(phase(3), 9.0, "the file's phase");
        // On GPU 0 big's 4 ms (and guard) and small's 1 ms miss each other and fixed's 0.5 ms
        // at 9 ms.
        let (big, small) = (phase(0), phase(2));
        let apart = |a: f64, la: f64, b: f64, lb: f64| a + la <= b || b + lb <= a;
        assert!(apart(big, 4.4, small, 1.1), "big {big} small {small}");
        assert!(
            apart(big, 4.4, 9.0, 0.55) && apart(small, 1.1, 9.0, 0.55),
            "{big} {small}"
        );
    }

    /// Planned with the scenario's phases, jobs released together that staggering would keep
    /// apart get a note naming the overlaps both ways; jobs already apart, none.
    #[test]
    fn releases_in_phase_that_stagger_would_keep_apart_are_noted() {
        let text = |camera_phase: &str| {
            format!(
                "[device]\nbackend = \"cuda\"\nmechanism = \"green\"\n\
                 [[workload]]\nname = \"batch\"\nmodel = \"spin:1ms\"\nrate_hz = 100\njobs = 1\n\
                 [[workload]]\nname = \"camera\"\nmodel = \"spin:1ms\"\nrate_hz = 100\njobs = 1\n\
                 {camera_phase}"
            )
        };
        let scenario = |t: &str| {
            Scenario::from_toml_str(t, Path::new("s.toml"), &isolane_core::spec::NoBuiltinModels)
                .unwrap()
        };
        let choices = [spin_choice("batch", 3.6), spin_choice("camera", 0.5)];
        let notes = overlap_notes(&scenario(&text("")), &choices, &[None, None]);
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(
            notes[0].contains(
                "(batch 15 %, camera 100 %); released by --phases stagger: batch 0 %, camera 0 %"
            ),
            "{}",
            notes[0]
        );
        let apart = scenario(&text("phase_ms = 5.0\n"));
        assert!(overlap_notes(&apart, &choices, &[None, None]).is_empty());
    }
}
