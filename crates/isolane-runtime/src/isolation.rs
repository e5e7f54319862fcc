//! The isolation experiment (DESIGN.md, "Experiments"): victims at their fixed rate throughout,
//! interferers ramping through their rates step by step, in one continuous run. Victims never
//! stop between steps; their jobs are attributed to the step in which they were released.

use isolane_core::metrics::workload_metrics;
use isolane_core::results::{StepResult, VictimStep};
use isolane_core::spec::{Role, Scenario};
use isolane_core::JobRecord;

use crate::coordinator::{RunPlan, RunResult, WorkloadPlan};
use crate::schedule::{End, Pace, Schedule};

#[derive(Debug, thiserror::Error)]
pub enum IsolationError {
    #[error("the isolation experiment needs at least one workload with role = \"victim\"")]
    NoVictim,
    #[error(
        "the isolation experiment needs at least one workload with role = \"interferer\" (and \
         a ramp)"
    )]
    NoInterferer,
    #[error(
        "interferers `{a}` and `{b}` have different ramp steps or step_s; every interferer must \
         step at the same times"
    )]
    RampMismatch { a: String, b: String },
}

/// The shared step grid of the interferers' ramps.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepGrid {
    pub steps: u32,
    pub step_s: f64,
}

impl StepGrid {
    pub fn step_ns(&self) -> i64 {
        (self.step_s * 1e9).round() as i64
    }
    pub fn total_ns(&self) -> i64 {
        self.step_ns() * i64::from(self.steps)
    }
}

/// The run plan of the experiment: victims run for all steps at their rate (their own length is
/// replaced by the ramp's), interferers follow their ramp, other workloads their own schedule.
pub fn plan(scenario: &Scenario) -> Result<(RunPlan, StepGrid), IsolationError> {
    let mut grid: Option<(StepGrid, &str)> = None;
    for w in scenario
        .workloads
        .iter()
        .filter(|w| w.role == Role::Interferer)
    {
        let Some(r) = w.ramp else { continue };
        let g = StepGrid {
            steps: r.steps,
            step_s: r.step_s,
        };
        match grid {
            None => grid = Some((g, &w.name)),
            Some((g0, name)) if g0 != g => {
                return Err(IsolationError::RampMismatch {
                    a: name.to_string(),
                    b: w.name.clone(),
                })
            }
            _ => {}
        }
    }
    let Some((grid, _)) = grid else {
        return Err(IsolationError::NoInterferer);
    };
    if !scenario.workloads.iter().any(|w| w.role == Role::Victim) {
        return Err(IsolationError::NoVictim);
    }
    let total = grid.total_ns();
    let workloads = scenario
        .workloads
        .iter()
        .enumerate()
        .map(|(index, spec)| {
            let mut schedule = Schedule::from_workload(spec);
            match (spec.role, spec.ramp) {
                (Role::Interferer, Some(r)) => {
                    schedule.pace = Pace::Ramp {
                        step_ns: grid.step_ns(),
                        rates_hz: r.rates(),
                    };
                    // D = deadline_ms if given, else the period of the current step.
                    schedule.deadline_ns = spec.deadline_ms.map(|d| (d * 1e6).round() as i64);
                    schedule.end = End::DurationNs(total);
                }
                (Role::Victim, _) => schedule.end = End::DurationNs(total),
                _ => {}
            }
            WorkloadPlan {
                spec: spec.clone(),
                index,
                schedule,
                partition: Default::default(),
            }
        })
        .collect();
    Ok((
        RunPlan {
            device: scenario.device.clone(),
            workloads,
            timing: scenario.timing.clone(),
            protection: scenario.protection,
            share: None,
        },
        grid,
    ))
}

/// Buckets every victim's jobs by release time into steps and computes their metrics per step.
/// A step that was not reached (Ctrl-C) is left out.
pub fn per_step(plan: &RunPlan, grid: StepGrid, result: &RunResult) -> Vec<StepResult> {
    let step_ns = grid.step_ns();
    let reached = result
        .workloads
        .iter()
        .flat_map(|w| w.records.iter().map(|r| r.release_ns))
        .max()
        .map_or(0, |last| {
            (last / step_ns.max(1) + 1).min(i64::from(grid.steps))
        });
    // Each victim's jobs put in their steps in one pass (filtering all of them for each step
    // took steps × jobs: hours for a long ramp).
    let buckets: Vec<Vec<Vec<JobRecord>>> = plan
        .workloads
        .iter()
        .zip(&result.workloads)
        .filter(|(p, _)| p.spec.role == Role::Victim)
        .map(|(_, r)| {
            let mut by_step = vec![Vec::new(); reached as usize];
            for j in &r.records {
                if j.release_ns >= 0 {
                    if let Some(b) = by_step.get_mut((j.release_ns / step_ns.max(1)) as usize) {
                        b.push(*j);
                    }
                }
            }
            by_step
        })
        .collect();
    (0..reached)
        .map(|i| {
            let lo = i * step_ns;
            let interferer_rates_hz: Vec<(String, f64)> = plan
                .workloads
                .iter()
                .filter_map(|w| match (&w.schedule.pace, w.spec.role) {
                    (Pace::Ramp { rates_hz, .. }, Role::Interferer) => Some((
                        w.spec.name.clone(),
                        rates_hz.get(i as usize).copied().unwrap_or(0.0),
                    )),
                    _ => None,
                })
                .collect();
            let victims = plan
                .workloads
                .iter()
                .filter(|p| p.spec.role == Role::Victim)
                .zip(&buckets)
                .map(|(p, by_step)| {
                    let subset = &by_step[i as usize];
                    VictimStep {
                        victim: p.spec.name.clone(),
                        metrics: workload_metrics(
                            subset,
                            p.spec.batch,
                            grid.step_s,
                            p.schedule.deadline_ns,
                        ),
                    }
                })
                .collect();
            StepResult {
                step: i as u32,
                start_s: lo as f64 / 1e9,
                interferer_rate_hz: interferer_rates_hz.iter().map(|(_, r)| r).sum(),
                interferer_rates_hz,
                victims,
            }
        })
        .collect()
}
