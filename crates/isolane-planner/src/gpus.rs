//! Planning on several GPUs of one model (`[device] gpus`, docs/planner.md): which GPU each
//! workload goes on, then one plan per GPU among the workloads placed there.
//!
//! A workload the scenario pins (`gpu = N`) stays on its GPU. The others are placed first-fit
//! decreasing: critical workloads first, then by the partition each needs alone (its smallest
//! adequate size in [`Ladder::cost`] units, then its utilisation: what binds under
//! time-slicing), each on the first GPU whose plan with it still holds. "Holds" is the
//! one-GPU [`plan`] of that GPU's workloads, so every rule of the mechanism (SMs, thread %,
//! a MIG layout, the time-slicing queue, device memory) is checked per GPU exactly as on one
//! GPU. The GPUs are alike, so one [`Ladder`] and one set of profiles serve them all.

use crate::search::plan;
use crate::{
    Choice, Demand, Ladder, Objective, Options, Outcome, Point, ProfileError, Profiler, Unprofiled,
};

/// A plan over several GPUs.
#[derive(Debug, Clone, PartialEq)]
pub struct GpusPlan {
    /// The GPUs planned (device indices), in the order given; empty for a plan of one GPU
    /// (the caller's, when it wraps [`plan`]'s outcome in this type).
    pub gpus: Vec<u32>,
    /// Each workload's name and GPU (device index), in the demands' order; `None`: placed on
    /// none (or one GPU).
    pub gpu_of: Vec<(String, Option<u32>)>,
    /// Per GPU of `gpus`: how much of its capacity its workloads take, in [`Ladder::cost`]
    /// units (of [`Ladder::capacity`] each).
    pub used: Vec<u32>,
    /// Every GPU's plan together. `Planned`: the choices in the demands' order, `used` and
    /// `capacity` summed over the GPUs. `NoPlan`: the reasons (a GPU's own start "on GPU n:"),
    /// what was not profiled, and every GPU's (partial) plan together.
    pub outcome: Outcome,
}

impl GpusPlan {
    /// The GPU workload `name` was placed on.
    pub fn gpu_of(&self, name: &str) -> Option<u32> {
        self.gpu_of.iter().find(|(n, _)| n == name)?.1
    }

    /// Each workload's GPU, in the demands' order.
    pub fn gpus_in_order(&self) -> Vec<Option<u32>> {
        self.gpu_of.iter().map(|(_, g)| *g).collect()
    }
}

/// The workloads `members` (indices into the demands) of one GPU, to the profiler of all.
struct Subset<'a> {
    inner: &'a mut dyn Profiler,
    members: &'a [usize],
}

impl Profiler for Subset<'_> {
    fn profile(&mut self, workload: usize, size: u32) -> Result<Point, ProfileError> {
        self.inner.profile(self.members[workload], size)
    }
}

/// What every step of the placement plans with.
struct Planning<'a> {
    demands: &'a [Demand],
    gpus: &'a [u32],
    ladder: &'a Ladder,
    opts: &'a Options,
    profiler: &'a mut dyn Profiler,
}

impl Planning<'_> {
    /// The one-GPU plan of the workloads `members` (in the demands' order).
    fn plan_of(&mut self, members: &[usize]) -> Result<Outcome, String> {
        let subset: Vec<Demand> = members.iter().map(|&i| self.demands[i].clone()).collect();
        let mut p = Subset {
            inner: &mut *self.profiler,
            members,
        };
        plan(&subset, self.ladder, self.opts, &mut p)
    }

    /// What workload `i` needs alone; the reasons and missing profiles when it cannot be
    /// planned even alone (then it is placed nowhere).
    fn need(&mut self, i: usize) -> Result<Result<Need, Unplannable>, String> {
        Ok(match self.plan_of(&[i])? {
            Outcome::Planned { choices, used, .. } => Ok(Need {
                workload: i,
                critical: self.demands[i].critical,
                cost: used,
                util: choices.first().map_or(0.0, |c| c.util),
            }),
            Outcome::NoPlan {
                reasons,
                unprofiled,
                ..
            } => Err((reasons, unprofiled)),
        })
    }

    /// Puts workload `w` on a GPU whose plan holds with it (packing: the first; spreading: the
    /// one whose workloads need the least of it alone, `cost` per workload, then the first);
    /// the reason when none does.
    fn place(
        &mut self,
        w: usize,
        members: &mut [Vec<usize>],
        cost: &[u32],
        unprofiled: &mut Vec<Unprofiled>,
    ) -> Result<Option<String>, String> {
        let mut order: Vec<usize> = (0..self.gpus.len()).collect();
        if self.opts.objective == Objective::Spread {
            let load = |slot: usize| -> u32 { members[slot].iter().map(|&i| cost[i]).sum() };
            order.sort_by_key(|&slot| (load(slot), slot));
        }
        let mut why = Vec::new();
        for slot in order {
            let gpu = &self.gpus[slot];
            let mut with = members[slot].clone();
            with.push(w);
            with.sort_unstable();
            match self.plan_of(&with)? {
                Outcome::Planned { .. } => {
                    members[slot] = with;
                    return Ok(None);
                }
                Outcome::NoPlan {
                    reasons,
                    unprofiled: u,
                    ..
                } => {
                    let first = reasons
                        .into_iter()
                        .next()
                        .or_else(|| u.first().map(|x| format!("not profiled: {}", x.why)))
                        .unwrap_or_default();
                    why.push((slot, format!("on GPU {gpu}: {first}")));
                    unprofiled.extend(u);
                }
            }
        }
        why.sort();
        let why: Vec<String> = why.into_iter().map(|(_, w)| w).collect();
        Ok(Some(format!(
            "`{}` fits on none of GPUs {} beside the workloads placed there before it ({})",
            self.demands[w].name,
            list(self.gpus),
            why.join("; ")
        )))
    }

    /// Every GPU's plan of the workloads placed on it, together.
    fn finish(
        &mut self,
        members: &[Vec<usize>],
        mut reasons: Vec<String>,
        mut unprofiled: Vec<Unprofiled>,
    ) -> Result<GpusPlan, String> {
        let mut gpu_of = vec![None; self.demands.len()];
        let mut used = Vec::with_capacity(self.gpus.len());
        let mut chosen: Vec<Choice> = Vec::new();
        for (slot, &gpu) in self.gpus.iter().enumerate() {
            for &i in &members[slot] {
                gpu_of[i] = Some(gpu);
            }
            match self.plan_of(&members[slot])? {
                Outcome::Planned {
                    choices, used: u, ..
                } => {
                    used.push(u);
                    chosen.extend(choices);
                }
                Outcome::NoPlan {
                    reasons: r,
                    unprofiled: u,
                    partial,
                } => {
                    used.push(partial.iter().map(|c| self.ladder.cost(c.size)).sum());
                    reasons.extend(r.into_iter().map(|r| format!("on GPU {gpu}: {r}")));
                    unprofiled.extend(u);
                    chosen.extend(partial);
                }
            }
        }
        let demands = self.demands;
        chosen.sort_by_key(|c| demands.iter().position(|d| d.name == c.workload));
        unprofiled.dedup();
        let outcome = if reasons.is_empty() && unprofiled.is_empty() {
            Outcome::Planned {
                used: used.iter().sum(),
                capacity: self.ladder.capacity * self.gpus.len() as u32,
                choices: chosen,
            }
        } else {
            Outcome::NoPlan {
                reasons,
                unprofiled,
                partial: chosen,
            }
        };
        Ok(GpusPlan {
            gpus: self.gpus.to_vec(),
            gpu_of: demands.iter().map(|d| d.name.clone()).zip(gpu_of).collect(),
            used,
            outcome,
        })
    }
}

/// Why a workload cannot be planned even alone: the reasons and the profiles missing.
type Unplannable = (Vec<String>, Vec<Unprofiled>);

/// How much a workload needs alone, to order the placement: critical first, then the larger.
#[derive(Debug, Clone, Copy)]
struct Need {
    workload: usize,
    critical: bool,
    cost: u32,
    util: f64,
}

/// Places `demands` on `gpus` (device indices of alike GPUs) and plans each GPU. `pinned`
/// (one per demand) names the GPU a workload must stay on. `Err` only when measuring failed,
/// or a pinned GPU is not one of `gpus`.
pub fn plan_gpus(
    demands: &[Demand],
    pinned: &[Option<u32>],
    gpus: &[u32],
    ladder: &Ladder,
    opts: &Options,
    profiler: &mut dyn Profiler,
) -> Result<GpusPlan, String> {
    let mut members = pinned_members(demands, pinned, gpus)?;
    let mut planning = Planning {
        demands,
        gpus,
        ladder,
        opts,
        profiler,
    };
    let mut reasons = Vec::new();
    let mut unprofiled = Vec::new();
    let mut needs = Vec::new();
    // What each workload needs alone: the load a spread placement balances (a pinned one's
    // too; one that cannot be planned alone counts nothing).
    let mut cost = vec![0u32; demands.len()];
    for i in 0..demands.len() {
        let pinned_here = pinned[i].is_some();
        if pinned_here && planning.opts.objective == Objective::Pack {
            continue;
        }
        match planning.need(i)? {
            Ok(n) => {
                cost[i] = n.cost;
                if !pinned_here {
                    needs.push(n);
                }
            }
            Err(_) if pinned_here => {}
            Err((r, u)) => {
                reasons.extend(r);
                unprofiled.extend(u);
            }
        }
    }
    needs.sort_by(|a, b| {
        (b.critical.cmp(&a.critical))
            .then(b.cost.cmp(&a.cost))
            .then(b.util.total_cmp(&a.util))
            .then(a.workload.cmp(&b.workload))
    });
    for need in needs {
        if let Some(why) = planning.place(need.workload, &mut members, &cost, &mut unprofiled)? {
            reasons.push(why);
        }
    }
    planning.finish(&members, reasons, unprofiled)
}

/// Each GPU's pinned workloads (indices into the demands).
fn pinned_members(
    demands: &[Demand],
    pinned: &[Option<u32>],
    gpus: &[u32],
) -> Result<Vec<Vec<usize>>, String> {
    if pinned.len() != demands.len() {
        return Err(format!(
            "{} pinned GPUs for {} workloads",
            pinned.len(),
            demands.len()
        ));
    }
    let mut members: Vec<Vec<usize>> = vec![Vec::new(); gpus.len()];
    for (i, p) in pinned.iter().enumerate() {
        if let Some(g) = p {
            let slot = gpus.iter().position(|x| x == g).ok_or_else(|| {
                format!(
                    "workload `{}` is on GPU {g}, which is not one of the GPUs planned ({})",
                    demands[i].name,
                    list(gpus)
                )
            })?;
            members[slot].push(i);
        }
    }
    Ok(members)
}

fn list(gpus: &[u32]) -> String {
    gpus.iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Execution time inversely proportional to the SMs: `work` ms on one SM.
    struct Table(Vec<f64>);

    impl Profiler for Table {
        fn profile(&mut self, w: usize, size: u32) -> Result<Point, ProfileError> {
            let t = self.0[w] / f64::from(size);
            Ok(Point {
                size,
                exec_p50_ms: t,
                exec_p99_ms: t,
                exec_mean_ms: t,
                exec_p999_ms: Some(t),
            })
        }
    }

    fn demand(name: &str, deadline_ms: f64, critical: bool) -> Demand {
        Demand {
            name: name.into(),
            rate_hz: 10.0,
            deadline_ms,
            critical,
            stretch: None,
            added_p99_ms: None,
            memory_mib: None,
        }
    }

    /// First-fit decreasing, what these tests were written for.
    fn pack() -> Options {
        Options {
            objective: Objective::Pack,
            ..Options::default()
        }
    }

    /// 132 SMs from 8 in steps of 8 (an H100's green ladder).
    fn green() -> Ladder {
        Ladder::green(132, 8, 8)
    }

    #[test]
    fn first_fit_decreasing_packs_the_largest_first_and_keeps_pinned_workloads() {
        // Work 720 ms·SM with a 10 ms deadline at 90 %: 80 SMs (720/80 = 9 ms); 72 ms·SM: 8
        // SMs. Two GPUs of 132 SMs; `pinned` must stay on GPU 1.
        let demands = vec![
            demand("small", 10.0, true),
            demand("big1", 10.0, true),
            demand("big2", 10.0, true),
            demand("pinned", 10.0, true),
        ];
        let mut p = Table(vec![72.0, 720.0, 720.0, 72.0]);
        let pinned = [None, None, None, Some(1)];
        let plan = plan_gpus(&demands, &pinned, &[0, 1], &green(), &pack(), &mut p).unwrap();
        // big1 (80 SMs) on GPU 0; big2 does not fit beside it (160 > 132): GPU 1 beside the
        // pinned one (8 SMs); small on the first GPU with room: GPU 0.
        assert_eq!(plan.gpus_in_order(), [Some(0), Some(0), Some(1), Some(1)]);
        assert_eq!(plan.gpu_of("big2"), Some(1));
        let Outcome::Planned {
            choices,
            used,
            capacity,
        } = &plan.outcome
        else {
            panic!("{:?}", plan.outcome);
        };
        let names: Vec<&str> = choices.iter().map(|c| c.workload.as_str()).collect();
        assert_eq!(names, ["small", "big1", "big2", "pinned"], "demand order");
        assert_eq!(plan.used, [88, 88]);
        assert_eq!((*used, *capacity), (176, 264));
    }

    #[test]
    fn a_workload_that_fits_no_gpu_is_refused_naming_each_gpu() {
        let demands = vec![
            demand("a", 10.0, true),
            demand("b", 10.0, true),
            demand("c", 10.0, false),
        ];
        // 80 SMs each: two fit on two GPUs, the third on neither.
        let mut p = Table(vec![720.0, 720.0, 720.0]);
        let plan = plan_gpus(
            &demands,
            &[None, None, None],
            &[2, 3],
            &green(),
            &pack(),
            &mut p,
        )
        .unwrap();
        let Outcome::NoPlan {
            reasons, partial, ..
        } = &plan.outcome
        else {
            panic!("{:?}", plan.outcome);
        };
        assert_eq!(reasons.len(), 1, "{reasons:?}");
        let r = &reasons[0];
        assert!(r.starts_with("`c` fits on none of GPUs 2, 3"), "{r}");
        assert!(
            r.contains("on GPU 2: together they need 160 SMs of 132 SMs"),
            "{r}"
        );
        assert!(r.contains("on GPU 3: "), "{r}");
        assert_eq!(plan.gpus_in_order(), [Some(2), Some(3), None]);
        assert_eq!(partial.len(), 2, "the critical ones are kept");
    }

    #[test]
    fn pinned_workloads_that_do_not_fit_their_gpu_are_refused_on_that_gpu() {
        let demands = vec![demand("a", 10.0, true), demand("b", 10.0, true)];
        let mut p = Table(vec![720.0, 720.0]);
        let plan = plan_gpus(
            &demands,
            &[Some(1), Some(1)],
            &[0, 1],
            &green(),
            &pack(),
            &mut p,
        )
        .unwrap();
        let Outcome::NoPlan { reasons, .. } = &plan.outcome else {
            panic!("{:?}", plan.outcome);
        };
        assert!(
            reasons[0].starts_with("on GPU 1: together they need"),
            "{reasons:?}"
        );
        let bad = plan_gpus(
            &demands,
            &[Some(5), None],
            &[0, 1],
            &green(),
            &pack(),
            &mut p,
        );
        assert!(bad.unwrap_err().contains("GPU 5"));
    }

    #[test]
    fn time_slicing_places_by_utilisation() {
        // Time-slicing: every workload in the whole GPU; utilisation 0.5 each (rate 10 Hz,
        // 50 ms): two per GPU would be 1.0 > 0.8, so one per GPU.
        let demands = vec![
            Demand {
                rate_hz: 10.0,
                ..demand("a", 100.0, true)
            },
            Demand {
                rate_hz: 10.0,
                ..demand("b", 100.0, true)
            },
        ];
        let mut p = Table(vec![50.0, 50.0]);
        let plan = plan_gpus(
            &demands,
            &[None, None],
            &[0, 1],
            &Ladder::whole(),
            &pack(),
            &mut p,
        )
        .unwrap();
        assert_eq!(plan.gpus_in_order(), [Some(0), Some(1)]);
        assert!(
            matches!(plan.outcome, Outcome::Planned { .. }),
            "{:?}",
            plan.outcome
        );
    }

    /// Three light workloads that one GPU holds: packed, all on GPU 0 (GPU 1 idle); spread
    /// (the default), each on the GPU whose workloads need the least of it so far: 0, 1, 0.
    #[test]
    fn spreading_puts_each_workload_beside_the_fewest_neighbours() {
        let demands = vec![
            demand("a", 10.0, true),
            demand("b", 10.0, true),
            demand("c", 10.0, false),
        ];
        let place = |opts: &Options| {
            let mut p = Table(vec![72.0, 72.0, 72.0]);
            plan_gpus(&demands, &[None; 3], &[0, 1], &green(), opts, &mut p)
                .unwrap()
                .gpus_in_order()
        };
        assert_eq!(place(&pack()), [Some(0), Some(0), Some(0)]);
        assert_eq!(place(&Options::default()), [Some(0), Some(1), Some(0)]);
        // A GPU that would not hold it is passed over, however idle: a pinned workload of
        // 128 SMs leaves 4 of GPU 1's 132, so spreading puts every other one on GPU 0.
        let mut p = Table(vec![72.0, 72.0, 72.0, 1152.0]);
        let mut with_big = demands.clone();
        with_big.push(demand("big", 10.0, true));
        let plan = plan_gpus(
            &with_big,
            &[None, None, None, Some(1)],
            &[0, 1],
            &green(),
            &Options::default(),
            &mut p,
        )
        .unwrap();
        assert_eq!(plan.gpus_in_order(), [Some(0), Some(0), Some(0), Some(1)]);
    }
}
