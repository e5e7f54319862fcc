//! The stretch each workload of a plan is predicted to suffer beside the workloads planned on
//! its GPU ([`isolane_core::predict`]): what `plan --auto`'s first plan holds the deadlines to
//! where no verification run or matrix measured one (docs/planner.md, "Predicted stretch").

use isolane_core::predict::{
    predict, Coefficients, Fitted, MemoryProfile, MemorySystem, Neighbour, Prediction,
};

use crate::{GpusPlan, Outcome};

/// One workload's predicted stretch as the plan takes it.
#[derive(Debug, Clone, PartialEq)]
pub struct Predicted {
    /// The model's prediction, its stretch and worst neighbour raised to admission's floor for
    /// a CNN victim ([`Fitted::admission_stretch`]): the model under-predicts every CNN pair
    /// the matrix measured, and a first plan that admission would then warn of is no plan.
    pub prediction: Prediction,
    /// The model's own stretch, below `prediction.stretch` where the floor raised it.
    pub model: f64,
}

impl Predicted {
    /// The floor admission takes for a CNN victim, where it raised the model's figure.
    pub fn floor(&self) -> Option<f64> {
        (self.prediction.stretch > self.model).then_some(self.prediction.stretch)
    }
}

/// Per workload of `plan` (in its demands' order), the model's predicted stretch beside the
/// others on its GPU, each at its p99 execution time alone in its planned partition. `None`
/// for a workload without a profile (`profiles[i]` missing or `None`), or without a plan. A
/// neighbour without a profile is left out (its share is not known). `plan --auto` takes
/// [`planned_stretches`], which adds admission's floor for CNN victims.
pub fn predicted_stretches(
    plan: &GpusPlan,
    profiles: &[Option<MemoryProfile>],
    c: &Coefficients,
    sys: &MemorySystem,
) -> Vec<Option<Prediction>> {
    each_victim(plan, profiles, |_, exec_ms, neighbours| {
        predict(c, sys, exec_ms, neighbours)
    })
}

/// [`predicted_stretches`] with `f`'s coefficients, each stretch (and worst neighbour's)
/// raised to at least the floor admission takes for a CNN victim beside any neighbour.
pub fn planned_stretches(
    plan: &GpusPlan,
    profiles: &[Option<MemoryProfile>],
    f: &Fitted,
    sys: &MemorySystem,
) -> Vec<Option<Predicted>> {
    each_victim(plan, profiles, |victim, exec_ms, neighbours| {
        let p = predict(&f.coefficients, sys, exec_ms, neighbours);
        // One home for the rule: the floor admission takes, by the same function.
        let floored = |s: f64| f.admission_stretch(victim, neighbours, s);
        Predicted {
            model: p.stretch,
            prediction: Prediction {
                stretch: floored(p.stretch),
                worst: p.worst.map(|(n, s)| (n, floored(s))),
                terms: p.terms,
            },
        }
    })
}

/// `each(victim's profile, its p99 alone, its neighbours)` per planned workload with a profile.
fn each_victim<T: Clone>(
    plan: &GpusPlan,
    profiles: &[Option<MemoryProfile>],
    each: impl Fn(&MemoryProfile, f64, &[Neighbour]) -> T,
) -> Vec<Option<T>> {
    let Outcome::Planned { choices, .. } = &plan.outcome else {
        return vec![None; plan.gpu_of.len()];
    };
    let profile = |i: usize| profiles.get(i).copied().flatten();
    choices
        .iter()
        .enumerate()
        .map(|(i, victim)| {
            let victim_profile = profile(i)?;
            let gpu = plan.gpu_of(&victim.workload);
            let neighbours: Vec<Neighbour> = choices
                .iter()
                .enumerate()
                .filter(|&(j, n)| j != i && plan.gpu_of(&n.workload) == gpu)
                .filter_map(|(j, n)| {
                    Some(Neighbour {
                        name: n.workload.clone(),
                        profile: profile(j)?,
                        exec_ms: n.profile.exec_p99_ms,
                    })
                })
                .collect();
            Some(each(
                &victim_profile,
                victim.profile.exec_p99_ms,
                &neighbours,
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Choice, Point};
    use isolane_core::predict::ProfileSource;

    fn choice(name: &str, p99: f64) -> Choice {
        Choice {
            workload: name.into(),
            size: 8,
            predicted_p99_ms: p99,
            predicted_tail_ms: p99,
            deadline_ms: 10.0,
            util: 0.1,
            profile: Point {
                size: 8,
                exec_p50_ms: p99,
                exec_p99_ms: p99,
                exec_mean_ms: p99,
                exec_p999_ms: None,
            },
            memory_mib: None,
            mig_start: None,
        }
    }

    fn streaming(bytes: f64) -> Option<MemoryProfile> {
        Some(MemoryProfile {
            dram_bytes_per_job: bytes,
            resident: false,
            l2_footprint_bytes: bytes,
            flops_per_job: 0.0,
            source: ProfileSource::Computed,
        })
    }

    #[test]
    fn only_the_workloads_on_the_same_gpu_are_neighbours() {
        let sys = MemorySystem {
            dram_bytes_per_s: 1e12,
            l2_bytes: 50_000_000,
        };
        let c = Coefficients { dram: 1.0, l2: 0.0 };
        let plan = GpusPlan {
            gpus: vec![0, 1],
            gpu_of: vec![
                ("a".into(), Some(0)),
                ("b".into(), Some(0)),
                ("c".into(), Some(1)),
            ],
            used: vec![16, 8],
            outcome: Outcome::Planned {
                choices: vec![choice("a", 1.0), choice("b", 2.0), choice("c", 1.0)],
                used: 24,
                capacity: 264,
            },
        };
        // b streams 400 MB in 2 ms: 200 GB/s, a fifth of the peak, beside a; c is on GPU 1.
        let profiles = [streaming(100e6), streaming(400e6), streaming(1e9)];
        let p = predicted_stretches(&plan, &profiles, &c, &sys);
        let a = p[0].as_ref().unwrap();
        assert!((a.stretch - 1.2).abs() < 1e-9, "{a:?}");
        assert_eq!(a.worst.as_ref().unwrap().0, "b");
        // b beside a: 100 MB in 1 ms, a tenth.
        assert!((p[1].as_ref().unwrap().stretch - 1.1).abs() < 1e-9);
        // c alone on its GPU.
        assert_eq!(p[2].as_ref().unwrap().stretch, 1.0);
        // A workload without a profile has no prediction, and is nobody's neighbour.
        let p = predicted_stretches(&plan, &[streaming(100e6), None], &c, &sys);
        assert!(p[1].is_none() && p[2].is_none());
        assert_eq!(p[0].as_ref().unwrap().stretch, 1.0);
    }

    fn fitted_with(resident_floor: Option<f64>) -> Fitted {
        Fitted {
            device_model: "test",
            coefficients: Coefficients { dram: 1.0, l2: 0.0 },
            points: "",
            models: "",
            data: "",
            resident_floor,
            matrix: "",
        }
    }

    /// Issue 34: a CNN (resident) victim beside any neighbour is planned with at least the
    /// floor admission takes for it, where the model says less; alone on its GPU, or a
    /// streaming victim, keeps the model's figure. The old rule planned `a` with 1.1.
    #[test]
    fn a_cnn_victim_is_planned_with_admissions_floor() {
        let sys = MemorySystem {
            dram_bytes_per_s: 1e12,
            l2_bytes: 50_000_000,
        };
        let plan = GpusPlan {
            gpus: vec![0, 1],
            gpu_of: vec![
                ("a".into(), Some(0)),
                ("b".into(), Some(0)),
                ("c".into(), Some(1)),
            ],
            used: vec![16, 8],
            outcome: Outcome::Planned {
                choices: vec![choice("a", 1.0), choice("b", 1.0), choice("c", 1.0)],
                used: 24,
                capacity: 264,
            },
        };
        let resident = Some(MemoryProfile {
            resident: true,
            ..streaming(100e6).unwrap()
        });
        // a (resident) beside b: the model says 1.1 (100 MB in 1 ms, a tenth of the peak).
        let profiles = [resident, streaming(100e6), resident];
        let p = planned_stretches(&plan, &profiles, &fitted_with(Some(1.3)), &sys);
        let a = p[0].as_ref().unwrap();
        assert!((a.model - 1.1).abs() < 1e-9, "{a:?}");
        assert_eq!(a.prediction.stretch, 1.3);
        assert_eq!(a.prediction.worst, Some(("b".into(), 1.3)));
        assert_eq!(a.floor(), Some(1.3));
        // b streams: the model's own figure.
        let b = p[1].as_ref().unwrap();
        assert!((b.prediction.stretch - 1.1).abs() < 1e-9 && b.floor().is_none());
        // c is resident but alone on GPU 1: no neighbour, no floor.
        assert_eq!(p[2].as_ref().unwrap().prediction.stretch, 1.0);
        // Without a floor for the device, the model's figure.
        let p = planned_stretches(&plan, &profiles, &fitted_with(None), &sys);
        assert!((p[0].as_ref().unwrap().prediction.stretch - 1.1).abs() < 1e-9);
    }
}
