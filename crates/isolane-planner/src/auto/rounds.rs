//! The plan's rounds: emit, run, and after a miss plan again with the stretch the run measured
//! (after a run that held with predictions off, the same partitions predicted again); what the
//! runs measured is kept for later plans; other mechanisms' plans run once to compare.

use std::path::PathBuf;
use std::time::Instant;

use isolane_core::metrics::LatencyStats;
use isolane_core::results::{RunSummary, WorkloadSummary};
use isolane_core::spec::limits::MAX_SPIN_US;
use isolane_core::spec::{Mechanism, RunLength, Scenario};

use super::events::{host_late_spin, spare_words, Compared};
use super::phases::{overlap_notes, stagger_releases};
use super::profiling::Profiles;
use super::scenario::{annotate, planned_scenario};
use super::{
    AutoError, Bench, Config, Ending, Event, Finish, Observer, Phases, Target, WrittenPlan,
};
use crate::cache::DeviceRecord;
use crate::offline::WorkloadId;
use crate::{
    predicted, Choice, Demand, GpusPlan, Ladder, Learned, LearnedStretch, Options, Outcome,
    StretchKey,
};

/// What the plan's verification rounds share.
#[derive(Clone, Copy)]
pub(crate) struct Rounds<'a> {
    pub scenario: &'a Scenario,
    pub target: &'a Target,
    pub config: &'a Config,
    pub workloads: &'a [WorkloadId],
    pub learned: Option<&'a (DeviceRecord, LearnedStretch)>,
    pub opts: &'a Options,
    pub mech: Mechanism,
    pub ladder: &'a Ladder,
}

/// What a verification round leads to.
enum Step {
    /// The loop's end.
    Done(Ending),
    /// Another round, with these demands and this plan.
    Again(Vec<Demand>, GpusPlan),
    /// Another round of the same partitions with these demands, each release thread spinning
    /// this long (µs) before its releases (`SpinRaised`).
    Spin(Vec<Demand>, GpusPlan, u64),
}

/// Emits the plan and, with verification, runs it, up to `rounds` times: a miss plans again
/// with the measured stretch, a plan that holds with predictions off runs again to check new
/// ones.
pub(crate) fn emit_and_verify<B: Bench>(
    r: &Rounds,
    profiles: &mut Profiles,
    mut demands: Vec<Demand>,
    mut plan: GpusPlan,
    bench: &mut B,
    obs: &mut dyn Observer,
) -> Result<Finish, AutoError<B::Error>> {
    // Raised after a round whose misses started late on the host (`SpinRaised`).
    let mut spin_us: Option<u64> = None;
    for round in 1.. {
        let choices = planned_choices(&plan);
        let planned = planned_for(r, &plan, spin_us, obs);
        if round == 1 && r.config.phases == Phases::Keep {
            for note in overlap_notes(&planned, choices, &plan.gpus_in_order()) {
                obs.event(&Event::ReleasePhases { text: &note });
            }
        }
        bench
            .admit(&planned, r.target.device())
            .map_err(AutoError::Bench)?;
        let text = emit(&planned, &plan, r, bench, obs)?;
        let written = |plan: GpusPlan| WrittenPlan {
            mechanism: r.mech,
            plan,
            text,
        };
        if !r.config.verify {
            return Ok(Finish {
                ending: Ending::Planned,
                written: Some(written(plan)),
                last_run: None,
                spin_us,
            });
        }
        let summary = verify(&planned, r.config, round, bench, obs)?;
        obs.event(&Event::Verification {
            summary: &summary,
            choices,
        });
        let verdict = verdict(&summary, choices, r.config.prediction_tolerance);
        learn(r, choices, &summary, obs);
        let step = if verdict.missed {
            // A longer spin where the misses started late on the host and spinning longer
            // than this round did would start them on time (within the scenario's limit).
            let spin = host_late_spin(&summary, choices)
                .map(|(s, late)| (s.min(MAX_SPIN_US), late))
                .filter(|&(s, _)| s > planned.timing.spin_us);
            plan_again(
                r, profiles, round, &demands, &plan, &summary, spin, bench, obs,
            )?
        } else {
            check_predictions(r, round, &verdict, &demands, &plan, &summary, obs)
        };
        match step {
            Step::Done(ending) => {
                return Ok(Finish {
                    ending,
                    written: Some(written(plan)),
                    last_run: Some(summary),
                    spin_us,
                })
            }
            Step::Again(d, p) => (demands, plan) = (d, p),
            Step::Spin(d, p, s) => (demands, plan, spin_us) = (d, p, Some(s)),
        }
    }
    unreachable!("the rounds end by returning")
}

/// Writes the planned scenario, with its comments, through the bench; returns its text.
fn emit<B: Bench>(
    planned: &Scenario,
    plan: &GpusPlan,
    r: &Rounds,
    bench: &mut B,
    obs: &mut dyn Observer,
) -> Result<String, AutoError<B::Error>> {
    let toml = planned
        .to_toml_string()
        .map_err(|e| AutoError::Failed(e.to_string()))?;
    let text = annotate(&toml, plan, r.ladder, r.opts.margin);
    match bench.write_plan(&text).map_err(AutoError::Bench)? {
        Some(path) => obs.event(&Event::PlanWritten { path: &path }),
        None => obs.event(&Event::PlannedScenario { text: &text }),
    }
    Ok(text)
}

/// After a run that held: done when every prediction was within the tolerance (or no round is
/// left); otherwise the same partitions again, predicted from what the run measured (planning
/// again could trade a plan that holds for one that does not).
fn check_predictions(
    r: &Rounds,
    round: u32,
    verdict: &Verdict,
    demands: &[Demand],
    plan: &GpusPlan,
    summary: &RunSummary,
    obs: &mut dyn Observer,
) -> Step {
    let tolerance = r.config.prediction_tolerance;
    if verdict.off.is_empty() {
        obs.event(&Event::Holds { tolerance });
        return Step::Done(Ending::Holds);
    }
    let off = verdict.off.join(", ");
    if round >= r.config.rounds {
        obs.event(&Event::HoldsPredictionsOff {
            tolerance,
            off: &off,
        });
        return Step::Done(Ending::Holds);
    }
    let demands = calibrated(demands, planned_choices(plan), summary, obs);
    let mut plan = plan.clone();
    repredict(&mut plan, &demands, r.opts);
    obs.event(&Event::Repredicted {
        round: round + 1,
        off: &off,
    });
    Step::Again(demands, plan)
}

/// After a run that missed: the plan made again with the stretch the run measured, if rounds
/// are left and it changes the partitions. Where it gives the same partitions but the misses
/// started late on the host and `spin` (the spin that would start them on time, and their
/// latest late start) is longer than the round's, the same partitions run again with it.
#[allow(clippy::too_many_arguments)]
fn plan_again<B: Bench>(
    r: &Rounds,
    profiles: &mut Profiles,
    round: u32,
    demands: &[Demand],
    plan: &GpusPlan,
    summary: &RunSummary,
    spin: Option<(u64, f64)>,
    bench: &mut B,
    obs: &mut dyn Observer,
) -> Result<Step, AutoError<B::Error>> {
    if round >= r.config.rounds {
        obs.event(&Event::Missed);
        return Ok(Step::Done(Ending::DoesNotHold));
    }
    let choices = planned_choices(plan);
    let demands = calibrated(demands, choices, summary, obs);
    let t = Instant::now();
    let next = profiles.plan(r.target, r.mech, r.ladder, &demands, r.opts, bench, obs)?;
    obs.event(&Event::Outcome {
        mechanism: r.mech,
        ladder: r.ladder,
        plan: &next,
        secs: t.elapsed().as_secs_f64(),
        margin: r.opts.margin,
    });
    Ok(match &next.outcome {
        Outcome::Planned { choices: c, .. }
            if sizes(c) != sizes(choices) || next.gpu_of != plan.gpu_of =>
        {
            obs.event(&Event::Replanned { round: round + 1 });
            Step::Again(demands, next)
        }
        Outcome::Planned { .. } => match spin {
            Some((spin_us, late_ms)) => {
                obs.event(&Event::SpinRaised {
                    round: round + 1,
                    spin_us,
                    late_ms,
                });
                Step::Spin(demands, plan.clone(), spin_us)
            }
            None => {
                obs.event(&Event::MissedSamePartitions);
                Step::Done(Ending::DoesNotHold)
            }
        },
        Outcome::NoPlan { .. } => {
            obs.event(&Event::MissedNoPlan);
            Step::Done(Ending::DoesNotHold)
        }
    })
}

/// With several mechanisms and verification: the other mechanisms' plans run too, once each,
/// and the mechanisms are compared side by side with the written plan's last run (`first`).
pub(crate) fn compare_mechanisms<B: Bench>(
    rounds: &Rounds,
    (plan, summary, spin_us): (&GpusPlan, &RunSummary, Option<u64>),
    others: Vec<(Mechanism, Ladder, Vec<Demand>, GpusPlan)>,
    bench: &mut B,
    obs: &mut dyn Observer,
) {
    let mut compared = vec![Compared {
        mech: rounds.mech,
        spare: spare_words(rounds.ladder, plan),
        plan: plan.clone(),
        summary: summary.clone(),
    }];
    for (mech, ladder, _, plan) in others {
        let other = Rounds {
            mech,
            ladder: &ladder,
            ..*rounds
        };
        // The written plan's verdict stands whatever another mechanism's run does.
        let summary = match verify_other(&other, &plan, spin_us, bench, obs) {
            Ok(summary) => summary,
            Err(e) => {
                obs.event(&Event::OtherPlanNotRun {
                    mechanism: mech,
                    error: &format!("{e:#}"),
                });
                continue;
            }
        };
        compared.push(Compared {
            mech,
            spare: spare_words(&ladder, &plan),
            plan,
            summary,
        });
    }
    obs.event(&Event::Comparison {
        compared: &compared,
    });
}

/// Runs another mechanism's plan once (beside the verification folder, in DIR.<mechanism>),
/// with the written plan's spin where its rounds raised it (`spin_us`), says its verification
/// and keeps what it learned.
fn verify_other<B: Bench>(
    r: &Rounds,
    plan: &GpusPlan,
    spin_us: Option<u64>,
    bench: &mut B,
    obs: &mut dyn Observer,
) -> Result<RunSummary, AutoError<B::Error>> {
    let choices = planned_choices(plan);
    let planned = planned_for(r, plan, spin_us, obs);
    bench
        .admit(&planned, r.target.device())
        .map_err(AutoError::Bench)?;
    let out = r.config.verify_out.as_ref().map(|d| {
        let mut name = d.as_os_str().to_owned();
        name.push(format!(".{}", r.mech.name()));
        PathBuf::from(name)
    });
    let label = format!("{} plan, run once to compare", r.mech.name());
    let summary = run_verification(&planned, r.config, out, &label, bench, obs)?;
    obs.event(&Event::Verification {
        summary: &summary,
        choices,
    });
    learn(r, choices, &summary, obs);
    Ok(summary)
}

/// The choices of a plan that holds (empty for one that does not: never asked for).
pub(crate) fn planned_choices(plan: &GpusPlan) -> &[Choice] {
    match &plan.outcome {
        Outcome::Planned { choices, .. } => choices,
        Outcome::NoPlan { .. } => &[],
    }
}

/// The scenario a round runs and writes: the plan's partitions, with staggered phases its
/// release phases, and at least the spin an earlier round raised (`spin_us`, `SpinRaised`).
fn planned_for(
    r: &Rounds,
    plan: &GpusPlan,
    spin_us: Option<u64>,
    obs: &mut dyn Observer,
) -> Scenario {
    let choices = planned_choices(plan);
    let gpus = plan.gpus_in_order();
    let mut planned = planned_scenario(r.scenario, r.mech, r.ladder, choices, &gpus);
    if let Some(s) = spin_us {
        planned.timing.spin_us = planned.timing.spin_us.max(s);
    }
    if r.config.phases == Phases::Stagger {
        for line in stagger_releases(&mut planned, choices, &gpus) {
            obs.event(&Event::ReleasePhases { text: &line });
        }
    }
    planned
}

/// The plan's predictions made again from `demands` (the delays and stretches a run
/// measured), partitions unchanged.
pub(crate) fn repredict(plan: &mut GpusPlan, demands: &[Demand], opts: &Options) {
    if let Outcome::Planned { choices, .. } = &mut plan.outcome {
        for (c, d) in choices.iter_mut().zip(demands) {
            (c.predicted_p99_ms, c.predicted_tail_ms) = predicted(d, &c.profile, opts);
        }
    }
}

pub(crate) fn sizes(choices: &[Choice]) -> Vec<u32> {
    choices.iter().map(|c| c.size).collect()
}

/// A workload's stretch as its verification run measured it: its p99.9 response time beside
/// the others over its p99.9 execution time alone in the same partition (queueing and the
/// neighbours' interference both count). Where some of its jobs started late on the host
/// ([`host_late_ms`]), its p99 execution time (end − start) over its p99 alone instead: a
/// launch that waited for the host is not the partition's or the neighbours' doing, and a
/// stretch read from it (4.0 for a CNN whose jobs ran as planned, session 28) leaves no plan to
/// find and is learned for later plans. Not the execution time's p99.9: a host that stalls
/// starts also stalls seeing ends (session 29, two H200s: `detector` alone on its GPU ran
/// 1.30 ms at p50 and 1.36 at p99, 3.18 at p99.9), and the stalls are a fraction of a per cent
/// of jobs, which the p99 leaves out.
pub(crate) fn measured_stretch(c: &Choice, summary: &RunSummary) -> Option<f64> {
    let exec = summary
        .workloads
        .iter()
        .find(|w| w.name == c.workload)
        .filter(|w| host_late_ms(w, c.deadline_ms).is_some())
        .and_then(|w| w.exec_ms.and_then(|e| e.p99));
    match exec {
        Some(p99) => Some(p99 / c.profile.exec_p99_ms).filter(|s| s.is_finite() && *s > 0.0),
        None => measured_ratio(c, summary, |l| l.p999, c.profile.tail_ms()),
    }
}

/// Whether a workload's verification had a job start late on the host: by more than a quarter
/// of its deadline after its release or its previous job's end, whichever came later
/// (summary.json's `start_lateness_us`: not its own queueing, which a partition of another
/// size does change). The latest start's lateness, ms.
pub(crate) fn host_late_ms(w: &WorkloadSummary, deadline_ms: f64) -> Option<f64> {
    let max_ms = w.metrics.start_lateness_us.max? / 1e3;
    (max_ms > 0.25 * deadline_ms).then_some(max_ms)
}

/// The delay a verification run added to a workload's p99: its p99 response time beside the
/// others minus its p99 execution time alone in the same partition, never below 0 (less is
/// the noise of two runs, not neighbours that speed a job up). For the predicted p99.
pub(crate) fn measured_added_p99(c: &Choice, summary: &RunSummary) -> Option<f64> {
    measured_response(c, summary, |l| l.p99)
        .map(|v| (v - c.profile.exec_p99_ms).max(0.0))
        .filter(|d| d.is_finite())
}

/// The workload's response-time statistic `of` in the run over `alone`, where it is known.
fn measured_ratio(
    c: &Choice,
    summary: &RunSummary,
    of: impl Fn(&LatencyStats) -> Option<f64>,
    alone: f64,
) -> Option<f64> {
    measured_response(c, summary, of)
        .map(|v| v / alone)
        .filter(|s| s.is_finite() && *s > 0.0)
}

/// The workload's response-time statistic `of` in the run (ms), where it is known.
fn measured_response(
    c: &Choice,
    summary: &RunSummary,
    of: impl Fn(&LatencyStats) -> Option<f64>,
) -> Option<f64> {
    summary
        .workloads
        .iter()
        .find(|w| w.name == c.workload)
        .and_then(|w| of(&w.metrics.latency_ms))
}

/// Each workload's stretch for the next round: the measured one, never below the stretch it
/// was planned with (the p99.9's, which the deadline is held to), and the delay added to its
/// p99 as measured (for the predicted p99 only: it follows the latest run, up or down).
pub(crate) fn calibrated(
    demands: &[Demand],
    choices: &[Choice],
    summary: &RunSummary,
    obs: &mut dyn Observer,
) -> Vec<Demand> {
    demands
        .iter()
        .zip(choices)
        .map(|(d, c)| {
            let measured = measured_stretch(c, summary);
            // What the round planned with: its prediction's, or a stretch an earlier round
            // measured where this round kept the partitions (`Step::Spin`) and the predictions.
            let before = (c.predicted_tail_ms / c.profile.tail_ms()).max(d.stretch.unwrap_or(0.0));
            let stretch = measured.map_or(before, |m| m.max(before));
            obs.event(&Event::Calibrated {
                workload: &d.name,
                planned: before,
                measured,
            });
            Demand {
                stretch: Some(stretch),
                added_p99_ms: measured_added_p99(c, summary).or(d.added_p99_ms),
                ..d.clone()
            }
        })
        .collect()
}

/// Which learned stretch workload `i` has: beside the scenario's other workloads.
fn stretch_key(
    workloads: &[WorkloadId],
    i: usize,
    mech: &str,
    device: &DeviceRecord,
) -> StretchKey {
    let id = |w: &WorkloadId| format!("{}-b{}-{}", w.model, w.batch, w.precision);
    StretchKey {
        gpu: device.gpu.clone(),
        driver: device.driver.clone(),
        mechanism: mech.into(),
        workload: id(&workloads[i]),
        neighbours: (workloads.iter().enumerate())
            .filter(|(j, _)| *j != i)
            .map(|(_, w)| id(w))
            .collect(),
    }
}

/// The mechanism as learned stretches are kept: staggered releases interfere less than
/// releases in phase, so what each measured is kept apart.
pub(crate) fn learned_mechanism(mech: Mechanism, phases: Phases) -> String {
    match phases {
        Phases::Keep => mech.name().into(),
        Phases::Stagger => format!("{}-staggered", mech.name()),
    }
}

/// The stretch an earlier verification run measured beside the same workloads, where there is
/// one: it replaces the matrix's and the stated one, which were measured beside other
/// neighbours.
pub(crate) fn with_learned(
    workloads: &[WorkloadId],
    demands: &[Demand],
    mech: &str,
    device: &DeviceRecord,
    learned: &LearnedStretch,
    obs: &mut dyn Observer,
) -> Vec<Demand> {
    demands
        .iter()
        .enumerate()
        .map(
            |(i, d)| match learned.get(&stretch_key(workloads, i, mech, device)) {
                Some(l) => {
                    // Below 1 is the noise of two runs, not neighbours that speed a job up.
                    let st = l.tail.max(1.0);
                    obs.event(&Event::LearnedStretch {
                        workload: &d.name,
                        stretch: st,
                        added_p99_ms: l.added_p99_ms,
                    });
                    Demand {
                        stretch: Some(st),
                        added_p99_ms: l.added_p99_ms,
                        ..d.clone()
                    }
                }
                None => d.clone(),
            },
        )
        .collect()
}

/// Keeps each workload's measured stretch for later plans of the same workloads (where the
/// target keeps learned stretches).
fn learn(r: &Rounds, choices: &[Choice], summary: &RunSummary, obs: &mut dyn Observer) {
    let Some((device, learned)) = r.learned else {
        return;
    };
    let mech = learned_mechanism(r.mech, r.config.phases);
    for (i, c) in choices.iter().enumerate() {
        let Some(tail) = measured_stretch(c, summary) else {
            continue;
        };
        let l = Learned {
            tail,
            added_p99_ms: measured_added_p99(c, summary),
        };
        if let Err(e) = learned.put(&stretch_key(r.workloads, i, &mech, device), l) {
            obs.event(&Event::CannotKeepStretch {
                workload: &c.workload,
                error: &e.to_string(),
            });
        }
    }
}

/// Runs the planned scenario (verification round `round`) and returns what it measured.
fn verify<B: Bench>(
    s: &Scenario,
    config: &Config,
    round: u32,
    bench: &mut B,
    obs: &mut dyn Observer,
) -> Result<RunSummary, AutoError<B::Error>> {
    // Round 1 runs in the verification folder, later rounds beside it (DIR.round2 …).
    let out = config.verify_out.as_ref().map(|d| match round {
        1 => d.clone(),
        k => {
            let mut name = d.as_os_str().to_owned();
            name.push(format!(".round{k}"));
            PathBuf::from(name)
        }
    });
    let label = format!("verification run {round}");
    run_verification(s, config, out, &label, bench, obs)
}

/// Runs a planned scenario once, in `out` (default: the bench's), each workload for the
/// verification duration if given, and says where (`label: DIR`).
fn run_verification<B: Bench>(
    s: &Scenario,
    config: &Config,
    out: Option<PathBuf>,
    label: &str,
    bench: &mut B,
    obs: &mut dyn Observer,
) -> Result<RunSummary, AutoError<B::Error>> {
    let mut s = s.clone();
    if let Some(d) = config.verify_duration {
        for w in &mut s.workloads {
            w.length = RunLength::DurationS(d);
        }
    }
    let run = bench.verify(&s, out.as_deref()).map_err(AutoError::Bench)?;
    obs.event(&Event::VerificationRun {
        label,
        dir: &run.dir,
    });
    Ok(run.summary)
}

/// What a verification run showed: whether a workload missed its deadline, and the
/// workloads whose predicted p99 was further than the tolerance from the measured one
/// (`name (+23 %)`).
pub(crate) struct Verdict {
    pub missed: bool,
    pub off: Vec<String>,
}

/// A workload missed its deadline: more than 0.1 % timeouts, or a measured p99 above the
/// deadline (or none measured).
pub(crate) fn missed(w: &WorkloadSummary, deadline_ms: f64) -> bool {
    w.metrics.timeout_pct > 0.1 || w.metrics.latency_ms.p99.is_none_or(|p| p > deadline_ms)
}

/// Whether a workload missed its deadline (then the plan does not hold), and which predicted
/// p99s were off by more than `tolerance`.
pub(crate) fn verdict(summary: &RunSummary, choices: &[Choice], tolerance: f64) -> Verdict {
    let mut verdict = Verdict {
        missed: false,
        off: Vec::new(),
    };
    for (w, c) in summary.workloads.iter().zip(choices) {
        let p99 = w.metrics.latency_ms.p99.unwrap_or(f64::INFINITY);
        verdict.missed |= missed(w, c.deadline_ms);
        let error = c.predicted_p99_ms / p99 - 1.0;
        // Not finite (nothing measured) counts as off.
        if !error.is_finite() || error.abs() > tolerance {
            verdict
                .off
                .push(format!("{} ({:+.0} %)", w.name, 100.0 * error));
        }
    }
    verdict
}
