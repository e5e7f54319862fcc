//! `isolane plan --auto SCENARIO`: partitions for workloads that have rates and deadlines but
//! none of their own (docs/planner.md). The search is `isolane_planner`'s; this file measures
//! the profiles it asks for (each workload alone, closed loop, in a partition of the size asked,
//! through the same run path as `isolane run`), writes the planned scenario and verifies it.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use isolane_core::device_model::DeviceModel;
use isolane_core::metrics::LatencyStats;
use isolane_core::results::{InterferenceIndex, RunSummary, WorkloadSummary};
use isolane_core::spec::{
    Backend, Criticality, Host, LatePolicy, MaxRate, Mechanism, PartitionSpec, Rate, Role,
    RunLength, Scenario, WorkloadSpec,
};
use isolane_planner::cache::{DeviceRecord, ProfileKey, Times};
use isolane_planner::offline::{OfflineProfiler, OfflineProfiles, WorkloadId};
use isolane_planner::{
    predicted, Choice, Demand, GpusPlan, Ladder, Learned, LearnedStretch, Options, Outcome, Point,
    ProfileBudget, ProfileCache, ProfileError, Profiler, StretchKey, Unit,
};
use isolane_runtime::exec::Engine;
use isolane_runtime::RunPlan;

use super::plan::{Phases, PlanArgs};
use super::plan_phases::{overlap_notes, stagger_releases};
use super::user;

/// Warm-up jobs of each profile run (excluded from its times).
const PROFILE_WARMUP: u64 = 20;

pub fn run(args: &PlanArgs, file: &super::ScenarioFile, engine: &Engine) -> anyhow::Result<u8> {
    let (scenario, name) = file.scenario()?;
    super::refuse_programs(&scenario, &name, "plan --auto")?;
    super::refuse_mixed_backends(&scenario, &name, "plan --auto")?;
    let demands = demands(&scenario, &name)?;
    let spread = Spread::of(&scenario, &file.text);
    let target = Target::resolve(&scenario, args)?;
    let workloads = workload_ids(&scenario);
    let mechanisms = mechanisms(&scenario, args.mechanism.as_deref(), &target, &workloads)?;
    let opts = Options {
        margin: args.margin,
        stretch: args.stretch,
        max_util: args.max_util,
    };
    let matrix = match &args.stretch_from {
        Some(p) => Some(read_matrix(p)?),
        None => None,
    };
    let work = tempfile::tempdir().context("a folder for the profile runs")?;
    let mut profiles = Profiles {
        scenario: &scenario,
        workloads: &workloads,
        args,
        engine,
        work: work.path(),
        budget: args
            .profile_budget
            .map(|s| ProfileBudget::new(Duration::from_secs_f64(s))),
        used: Vec::new(),
        spread: spread.as_ref(),
    };
    let learned = target.learned();
    // Every mechanism with a plan, in the order asked: the first is the one written.
    let mut planned_all: Vec<(Mechanism, Ladder, Vec<Demand>, GpusPlan)> = Vec::new();
    let mut unprofiled = false;
    let mut memory = MemoryEstimates::default();
    for mech in &mechanisms {
        let ladder = ladder(&scenario, *mech, target.device())?;
        let stretched = with_stretch(&scenario, &demands, *mech, matrix.as_ref(), args.stretch);
        let stretched = match &learned {
            Some((device, l)) => {
                let mech = learned_mechanism(*mech, args.phases);
                with_learned(&workloads, &stretched, &mech, device, l)
            }
            None => stretched,
        };
        let demands = with_memory(stretched, memory.under(&scenario, *mech));
        let t = Instant::now();
        let planned = profiles.plan(&target, *mech, &ladder, &demands, &opts)?;
        print_outcome(
            *mech,
            &ladder,
            &planned,
            t.elapsed().as_secs_f64(),
            opts.margin,
        );
        if let Outcome::NoPlan { unprofiled: u, .. } = &planned.outcome {
            unprofiled |= !u.is_empty();
        }
        if matches!(planned.outcome, Outcome::Planned { .. }) {
            planned_all.push((*mech, ladder, demands, planned));
        }
    }
    if unprofiled {
        if let Some(hint) = target.how_to_profile(profiles.budget.is_some()) {
            eprintln!("{}", super::wrap_message(&hint, 80));
        }
    }
    if let Some(dir) = &args.export_profiles {
        export(target.cache(), &profiles.used, dir)?;
    }
    let mut planned_all = planned_all.into_iter();
    let Some((mech, ladder, demands, plan)) = planned_all.next() else {
        return Ok(super::EXIT_USER);
    };
    let rounds = Rounds {
        scenario: &scenario,
        target: &target,
        args,
        engine,
        workloads: &workloads,
        learned: learned.as_ref(),
        opts: &opts,
        mech,
        ladder: &ladder,
    };
    let (code, first) = emit_and_verify(&rounds, &mut profiles, demands, plan)?;
    let others: Vec<_> = planned_all.collect();
    if let (Some(first), false) = (first, others.is_empty()) {
        compare_mechanisms(&rounds, first, others);
    }
    Ok(code)
}

/// --mechanism all --verify: the other mechanisms' plans run too, once each, and the
/// mechanisms are compared side by side with the written plan's last run (`first`).
fn compare_mechanisms(
    rounds: &Rounds,
    (plan, summary): (GpusPlan, RunSummary),
    others: Vec<(Mechanism, Ladder, Vec<Demand>, GpusPlan)>,
) {
    let mut compared = vec![Compared {
        mech: rounds.mech,
        spare: spare_words(rounds.ladder, &plan),
        plan,
        summary,
    }];
    for (mech, ladder, _, plan) in others {
        let other = Rounds {
            mech,
            ladder: &ladder,
            ..*rounds
        };
        // The written plan's verdict stands whatever another mechanism's run does.
        let summary = match verify_other(&other, &plan) {
            Ok(summary) => summary,
            Err(e) => {
                eprintln!("{}: its plan could not be run: {e:#}", mech_name(mech));
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
    print_comparison(&compared);
}

/// One mechanism's plan and what its verification measured.
struct Compared {
    mech: Mechanism,
    /// The capacity it leaves (`44 SMs of 132 SMs (88 SMs spare)`).
    spare: String,
    plan: GpusPlan,
    summary: RunSummary,
}

fn spare_words(ladder: &Ladder, plan: &GpusPlan) -> String {
    match &plan.outcome {
        Outcome::Planned { used, capacity, .. } => usage(ladder, plan, *used, *capacity),
        Outcome::NoPlan { .. } => String::new(),
    }
}

/// Runs another mechanism's plan once (beside --verify-out, in DIR.<mechanism>), prints its
/// verification and keeps what it learned.
fn verify_other(r: &Rounds, plan: &GpusPlan) -> anyhow::Result<RunSummary> {
    let choices = planned_choices(plan);
    let planned = planned_for(r, plan);
    admit_planned(&planned, r.target.device())?;
    let out = r.args.verify_out.as_ref().map(|d| {
        let mut name = d.as_os_str().to_owned();
        name.push(format!(".{}", mech_name(r.mech)));
        PathBuf::from(name)
    });
    let label = format!("{} plan, run once to compare", mech_name(r.mech));
    let summary = run_verification(&planned, r.args, out, &label, r.engine)?;
    print_verification(&summary, choices, r.args.prediction_tolerance);
    learn(r, choices, &summary);
    Ok(summary)
}

/// The mechanisms side by side: the capacity each plan leaves, and per workload the slack its
/// deadline was predicted to leave beyond the p99.9 and the slack measured.
fn print_comparison(compared: &[Compared]) {
    for line in comparison_lines(compared) {
        println!("{line}");
    }
}

fn comparison_lines(compared: &[Compared]) -> Vec<String> {
    let mut lines = vec![
        "mechanisms compared (the first is the plan written; slack = deadline − p99.9, ms):".into(),
        format!(
            "{:<10} {:<14} {:>10} {:>10} {:>9}  verdict",
            "mechanism", "workload", "slack pred", "measured", "timeouts"
        ),
    ];
    for c in compared {
        for (w, ch) in c.summary.workloads.iter().zip(planned_choices(&c.plan)) {
            let lat = &w.metrics.latency_ms;
            let measured = ch.deadline_ms - lat.p999.unwrap_or(f64::INFINITY);
            let miss = missed(w, ch.deadline_ms);
            lines.push(format!(
                "{:<10} {:<14} {:>10.3} {:>10.3} {:>8.2}%  {}",
                mech_name(c.mech),
                w.name,
                ch.slack_ms(),
                measured,
                w.metrics.timeout_pct,
                if miss { "MISSED" } else { "met" }
            ));
        }
        lines.push(format!("{:<10} spare: {}", mech_name(c.mech), c.spare));
    }
    lines
}

/// What the plan's verification rounds share.
#[derive(Clone, Copy)]
struct Rounds<'a> {
    scenario: &'a Scenario,
    target: &'a Target,
    args: &'a PlanArgs,
    engine: &'a Engine,
    workloads: &'a [WorkloadId],
    learned: Option<&'a (DeviceRecord, LearnedStretch)>,
    opts: &'a Options,
    mech: Mechanism,
    ladder: &'a Ladder,
}

/// What a verification round leads to.
enum Step {
    /// The command's exit code.
    Done(u8),
    /// Another round, with these demands and this plan.
    Again(Vec<Demand>, GpusPlan),
}

/// Emits the plan and, with --verify, runs it, up to --rounds times: a miss plans again with
/// the measured stretch, a plan that holds with predictions off runs again to check new ones.
/// Returns the exit code and, when it ran, the last plan run and what it measured.
fn emit_and_verify(
    r: &Rounds,
    profiles: &mut Profiles,
    mut demands: Vec<Demand>,
    mut plan: GpusPlan,
) -> anyhow::Result<(u8, Option<(GpusPlan, RunSummary)>)> {
    for round in 1.. {
        let choices = planned_choices(&plan);
        let planned = planned_for(r, &plan);
        if round == 1 && r.args.phases == Phases::Keep {
            for note in overlap_notes(&planned, choices, &plan.gpus_in_order()) {
                eprintln!("{note}");
            }
        }
        admit_planned(&planned, r.target.device())?;
        emit(
            &planned,
            &plan,
            r.ladder,
            r.opts.margin,
            r.args.out.as_deref(),
        )?;
        if !r.args.verify {
            return Ok((0, None));
        }
        let summary = verify(&planned, r.args, round, r.engine)?;
        let verdict = print_verification(&summary, choices, r.args.prediction_tolerance);
        learn(r, choices, &summary);
        let step = if verdict.missed {
            plan_again(r, profiles, round, &demands, &plan, &summary)?
        } else {
            check_predictions(r, round, &verdict, &demands, &plan, &summary)
        };
        match step {
            Step::Done(code) => return Ok((code, Some((plan, summary)))),
            Step::Again(d, p) => (demands, plan) = (d, p),
        }
    }
    unreachable!("the rounds end by returning")
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
) -> Step {
    let pct = 100.0 * r.args.prediction_tolerance;
    if verdict.off.is_empty() {
        println!("the plan holds, every predicted p99 within {pct:.0} % of the measured");
        return Step::Done(0);
    }
    let off = verdict.off.join(", ");
    if round >= r.args.rounds {
        println!("the plan holds; predicted p99 off by more than {pct:.0} % for {off}");
        return Step::Done(0);
    }
    let demands = calibrated(demands, planned_choices(plan), summary);
    let mut plan = plan.clone();
    repredict(&mut plan, &demands, r.opts);
    println!(
        "round {}: the plan holds but the predicted p99 was off for {off}; the same \
         partitions again, each p99 predicted from the delay this run measured",
        round + 1
    );
    Step::Again(demands, plan)
}

/// After a run that missed: the plan made again with the stretch the run measured, if rounds
/// are left and it changes the partitions.
fn plan_again(
    r: &Rounds,
    profiles: &mut Profiles,
    round: u32,
    demands: &[Demand],
    plan: &GpusPlan,
    summary: &RunSummary,
) -> anyhow::Result<Step> {
    if round >= r.args.rounds {
        println!("the plan does NOT hold: a workload missed its deadline");
        return Ok(Step::Done(super::EXIT_FAILED));
    }
    let choices = planned_choices(plan);
    let demands = calibrated(demands, choices, summary);
    let t = Instant::now();
    let next = profiles.plan(r.target, r.mech, r.ladder, &demands, r.opts)?;
    print_outcome(
        r.mech,
        r.ladder,
        &next,
        t.elapsed().as_secs_f64(),
        r.opts.margin,
    );
    Ok(match &next.outcome {
        Outcome::Planned { choices: c, .. }
            if sizes(c) != sizes(choices) || next.gpu_of != plan.gpu_of =>
        {
            println!(
                "round {}: planned again with the measured stretch",
                round + 1
            );
            Step::Again(demands, next)
        }
        Outcome::Planned { .. } => {
            println!(
                "the plan does NOT hold, and planning with the measured stretch gives the \
                 same partitions"
            );
            Step::Done(super::EXIT_FAILED)
        }
        Outcome::NoPlan { .. } => {
            println!("the plan does NOT hold, and with the measured stretch there is none");
            Step::Done(super::EXIT_FAILED)
        }
    })
}

/// The choices of a plan that holds (empty for one that does not: never asked for).
fn planned_choices(plan: &GpusPlan) -> &[Choice] {
    match &plan.outcome {
        Outcome::Planned { choices, .. } => choices,
        Outcome::NoPlan { .. } => &[],
    }
}

/// A scenario on several GPUs (`[device] gpus`): its GPUs, and per workload the GPU the file
/// pins it to (`gpu = N`); the planner places the others.
struct Spread {
    gpus: Vec<u32>,
    pinned: Vec<Option<u32>>,
}

impl Spread {
    /// `None` for a scenario on one GPU (or the CPU). `text`: the scenario file's.
    fn of(s: &Scenario, text: &str) -> Option<Spread> {
        if !s.device.several_gpus() {
            return None;
        }
        let named = Scenario::workloads_naming_their_gpu(text);
        let pinned = s
            .workloads
            .iter()
            .enumerate()
            .map(|(i, w)| match named.get(i) {
                Some(true) => w.gpu,
                _ => None,
            })
            .collect();
        Some(Spread {
            gpus: s.device.all_gpus(),
            pinned,
        })
    }
}

/// The plan's predictions made again from `demands` (the delays and stretches a run
/// measured), partitions unchanged.
fn repredict(plan: &mut GpusPlan, demands: &[Demand], opts: &Options) {
    if let Outcome::Planned { choices, .. } = &mut plan.outcome {
        for (c, d) in choices.iter_mut().zip(demands) {
            (c.predicted_p99_ms, c.predicted_tail_ms) = predicted(d, &c.profile, opts);
        }
    }
}

fn sizes(choices: &[Choice]) -> Vec<u32> {
    choices.iter().map(|c| c.size).collect()
}

/// A workload's stretch as its verification run measured it: its p99.9 response time beside
/// the others over its p99.9 execution time alone in the same partition (queueing and the
/// neighbours' interference both count).
fn measured_stretch(c: &Choice, summary: &RunSummary) -> Option<f64> {
    measured_ratio(c, summary, |l| l.p999, c.profile.tail_ms())
}

/// The delay a verification run added to a workload's p99: its p99 response time beside the
/// others minus its p99 execution time alone in the same partition, never below 0 (less is
/// the noise of two runs, not neighbours that speed a job up). For the predicted p99.
fn measured_added_p99(c: &Choice, summary: &RunSummary) -> Option<f64> {
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
fn calibrated(demands: &[Demand], choices: &[Choice], summary: &RunSummary) -> Vec<Demand> {
    demands
        .iter()
        .zip(choices)
        .map(|(d, c)| {
            let measured = measured_stretch(c, summary);
            let before = c.predicted_tail_ms / c.profile.tail_ms();
            let stretch = measured.map_or(before, |m| m.max(before));
            eprintln!(
                "{}: stretch {before:.2} planned, {} measured",
                d.name,
                measured.map_or("nothing".into(), |m| format!("{m:.2}"))
            );
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

/// The mechanism as learned stretches are kept: staggered releases (`--phases stagger`)
/// interfere less than releases in phase, so what each measured is kept apart.
fn learned_mechanism(mech: Mechanism, phases: Phases) -> String {
    match phases {
        Phases::Keep => mech_name(mech).into(),
        Phases::Stagger => format!("{}-staggered", mech_name(mech)),
    }
}

/// The stretch an earlier verification run measured beside the same workloads, where there is
/// one: it replaces the matrix's and --stretch, which were measured beside other neighbours.
fn with_learned(
    workloads: &[WorkloadId],
    demands: &[Demand],
    mech: &str,
    device: &DeviceRecord,
    learned: &LearnedStretch,
) -> Vec<Demand> {
    demands
        .iter()
        .enumerate()
        .map(
            |(i, d)| match learned.get(&stretch_key(workloads, i, mech, device)) {
                Some(l) => {
                    // Below 1 is the noise of two runs, not neighbours that speed a job up.
                    let st = l.tail.max(1.0);
                    eprintln!(
                        "{}: stretch {st:.2} (p99: {}) measured by an earlier verification \
                         beside the same workloads",
                        d.name,
                        l.added_p99_ms
                            .map_or("not measured".into(), |a| format!("+{a:.3} ms"))
                    );
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
fn learn(r: &Rounds, choices: &[Choice], summary: &RunSummary) {
    let Some((device, learned)) = r.learned else {
        return;
    };
    let mech = learned_mechanism(r.mech, r.args.phases);
    for (i, c) in choices.iter().enumerate() {
        let Some(tail) = measured_stretch(c, summary) else {
            continue;
        };
        let l = Learned {
            tail,
            added_p99_ms: measured_added_p99(c, summary),
        };
        if let Err(e) = learned.put(&stretch_key(r.workloads, i, &mech, device), l) {
            eprintln!(
                "note: cannot keep the measured stretch of {}: {e}",
                c.workload
            );
        }
    }
}

/// What the plans of one command share to get their profiles: the profile runs' settings, the
/// budget left, and the profiles used so far (for `--export-profiles`).
struct Profiles<'a> {
    scenario: &'a Scenario,
    workloads: &'a [WorkloadId],
    args: &'a PlanArgs,
    engine: &'a Engine,
    work: &'a Path,
    budget: Option<ProfileBudget>,
    used: Vec<ProfileKey>,
    /// The GPUs to place the workloads on, for a scenario on several.
    spread: Option<&'a Spread>,
}

/// The plan of `demands` with `profiler`: on one GPU the one-GPU search (no workload's GPU is
/// named), on several GPUs placed per GPU ([`isolane_planner::plan_gpus`]).
fn plan_with(
    spread: Option<&Spread>,
    demands: &[Demand],
    ladder: &Ladder,
    opts: &Options,
    profiler: &mut dyn Profiler,
) -> Result<GpusPlan, String> {
    match spread {
        Some(sp) => {
            isolane_planner::plan_gpus(demands, &sp.pinned, &sp.gpus, ladder, opts, profiler)
        }
        None => Ok(GpusPlan {
            gpus: Vec::new(),
            gpu_of: demands.iter().map(|d| (d.name.clone(), None)).collect(),
            used: Vec::new(),
            outcome: isolane_planner::plan(demands, ladder, opts, profiler)?,
        }),
    }
}

impl Profiles<'_> {
    /// The plan with `mech` for `target`: from the folder offline, else from the cache and
    /// profile runs.
    fn plan(
        &mut self,
        target: &Target,
        mech: Mechanism,
        ladder: &Ladder,
        demands: &[Demand],
        opts: &Options,
    ) -> anyhow::Result<GpusPlan> {
        let spread = self.spread;
        let outcome = match target {
            Target::Offline { store, .. } => {
                let mut p = OfflineProfiler {
                    store,
                    workloads: self.workloads,
                    mechanism: mech_name(mech),
                    ladder,
                    used: Vec::new(),
                };
                let o = plan_with(spread, demands, ladder, opts, &mut p);
                self.used.extend(p.used);
                o
            }
            Target::Here {
                cache,
                record,
                mig_on,
                ..
            } => {
                let mut p = RunProfiler {
                    scenario: self.scenario,
                    workloads: self.workloads,
                    mechanism: mech,
                    ladder,
                    cache,
                    device: record,
                    mig_on: *mig_on,
                    allow_mig_reconfigure: self.args.allow_mig_reconfigure,
                    budget: self.budget.as_mut(),
                    jobs: self.args.profile_jobs,
                    engine: self.engine,
                    work: self.work,
                    used: Vec::new(),
                    paces: vec![None; self.workloads.len()],
                };
                let o = plan_with(spread, demands, ladder, opts, &mut p);
                self.used.extend(p.used);
                o
            }
        };
        outcome.map_err(|e| anyhow::anyhow!("profiling for the {} plan: {e}", mech_name(mech)))
    }
}

/// Writes the planned scenario, with its comments, to `out` or stdout.
fn emit(
    planned: &Scenario,
    plan: &GpusPlan,
    ladder: &Ladder,
    margin: f64,
    out: Option<&Path>,
) -> anyhow::Result<()> {
    let text = annotate(&planned.to_toml_string()?, plan, ladder, margin);
    match out {
        Some(p) => {
            super::write_output(p, text.as_bytes())?;
            println!("planned scenario: {}", p.display());
        }
        None => print!("{text}"),
    }
    Ok(())
}

/// Where the profiles come from and what the plan is for.
enum Target {
    /// This machine's GPU (or CPU): profiles from the cache, the missing ones measured.
    Here {
        device: DeviceModel,
        record: DeviceRecord,
        cache: ProfileCache,
        /// MIG mode of the scenario's GPUs: on only if on for all (`None`: unknown, or the
        /// CPU).
        mig_on: Option<bool>,
        /// The GPU a MIG message names: the first whose MIG mode is not on, else the first.
        gpu: u32,
    },
    /// A device model (`--device-model`): profiles measured on one from a folder, nothing
    /// measured.
    Offline {
        device: DeviceModel,
        store: OfflineProfiles,
    },
}

impl Target {
    fn resolve(s: &Scenario, args: &PlanArgs) -> anyhow::Result<Target> {
        let cache_dir = || {
            args.profiles
                .clone()
                .or_else(|| args.profile_cache.clone())
                .unwrap_or_else(ProfileCache::default_dir)
        };
        if let Some(name) = &args.device_model {
            if s.device.backend == Backend::Cpu {
                return Err(user(format!(
                    "--device-model plans for a GPU, but {}'s backend is cpu",
                    args.scenario.display()
                )));
            }
            let device = super::plan::resolve_device_model(s, Some(name))?;
            let store = OfflineProfiles::open(&cache_dir(), device.name, args.driver.as_deref())
                .map_err(user)?;
            eprintln!("{}", store.describe());
            return Ok(Target::Offline { device, store });
        }
        let cache = ProfileCache::new(cache_dir());
        if s.device.backend == Backend::Cpu {
            return Ok(Target::Here {
                device: super::plan::cpu_device_model(),
                record: DeviceRecord {
                    gpu: cpu_name(),
                    driver: "none".into(),
                    device_model: "cpu".into(),
                },
                cache,
                mig_on: None,
                gpu: 0,
            });
        }
        let devices = isolane_gpu::devices::list_devices().context(
            "no GPU here to profile on; plan for a GPU that is not here with --device-model \
             NAME --profiles DIR",
        )?;
        let (mig_on, mig_gpu) = mig_mode(&devices, &s.device.all_gpus())?;
        let d = devices
            .into_iter()
            .find(|d| d.index == s.device.gpu)
            .ok_or_else(|| user(format!("device.gpu = {}: no such GPU here", s.device.gpu)))?;
        let device = isolane_gpu::devices::model_for(
            &d.name,
            d.sm_count,
            d.memory_mib,
            d.compute_capability,
        );
        // One profile set serves every GPU of one model: the scenario's GPUs must be alike.
        super::same_model_on_every_gpu(s, &device)?;
        Ok(Target::Here {
            record: DeviceRecord {
                gpu: d.name.clone(),
                driver: d
                    .driver_version
                    .clone()
                    .unwrap_or(d.cuda_driver_version.clone()),
                device_model: device.name.to_string(),
            },
            device,
            cache,
            mig_on,
            gpu: mig_gpu,
        })
    }

    /// Where stretches measured by verification runs are kept, and the device they are for:
    /// the cache of this machine's device (an offline plan verifies nothing).
    fn learned(&self) -> Option<(DeviceRecord, LearnedStretch)> {
        match self {
            Target::Here { cache, record, .. } => {
                Some((record.clone(), LearnedStretch::new(cache.dir())))
            }
            Target::Offline { .. } => None,
        }
    }

    fn device(&self) -> &DeviceModel {
        match self {
            Target::Here { device, .. } | Target::Offline { device, .. } => device,
        }
    }

    fn cache(&self) -> &ProfileCache {
        match self {
            Target::Here { cache, .. } => cache,
            Target::Offline { store, .. } => store.cache(),
        }
    }

    /// Why MIG cannot be planned here, if it cannot.
    fn mig_unavailable(&self, workloads: &[WorkloadId]) -> Option<String> {
        let device = self.device();
        if device.mig.is_none() {
            return Some(format!(
                "{} ({}) has no MIG",
                device.name, device.description
            ));
        }
        match self {
            Target::Offline { store, .. } => workloads.iter().find_map(|w| {
                let key = store.key(&w.model, w.batch, &w.precision, "mig", "");
                store.partitions(&key).is_empty().then(|| {
                    format!(
                        "no MIG profiles of {} in {}",
                        w.describe("mig"),
                        store.dir().display()
                    )
                })
            }),
            Target::Here { mig_on, gpu, .. } if *mig_on != Some(true) => {
                Some(mig_off(*gpu, device.name))
            }
            Target::Here { .. } => None,
        }
    }

    /// What to do about profiles the plan lacked (here, only a budget can be raised: the other
    /// reasons, such as MIG mode, are said with each profile).
    fn how_to_profile(&self, budget: bool) -> Option<String> {
        match self {
            Target::Offline { device, store } => Some(format!(
                "to plan offline, measure the missing profiles on a {} and copy them here: \
                 there, `isolane plan --auto SCENARIO --export-profiles DIR` with the same \
                 flags (the search asks for the same sizes; DIR then holds every profile it \
                 used), or out of a cache that has them: `isolane plan --auto SCENARIO \
                 --device-model {} --profile-cache CACHE --export-profiles DIR`; then plan with \
                 --profiles DIR (now {})",
                device.name,
                device.name,
                store.dir().display()
            )),
            Target::Here { cache, .. } => budget.then(|| {
                format!(
                    "what was measured is kept in {}: plan again (with a larger \
                     --profile-budget) to measure the rest",
                    cache.dir().display()
                )
            }),
        }
    }
}

/// MIG mode over the scenario's GPUs: on only when it is on for every one of them (profile
/// runs use the first, the planned scenario all), with the GPU to name when it is not (the
/// first that is not on; else the first).
fn mig_mode(
    devices: &[isolane_gpu::devices::DeviceInfo],
    gpus: &[u32],
) -> anyhow::Result<(Option<bool>, u32)> {
    let mut modes = Vec::with_capacity(gpus.len());
    for &g in gpus {
        let d = devices
            .iter()
            .find(|d| d.index == g)
            .ok_or_else(|| user(format!("device.gpus: GPU {g}: no such GPU here")))?;
        modes.push((g, d.mig.current));
    }
    Ok(match modes.iter().find(|(_, m)| *m != Some(true)) {
        Some(&(g, m)) => (m, g),
        None => (Some(true), gpus.first().copied().unwrap_or(0)),
    })
}

fn mig_off(gpu: u32, name: &str) -> String {
    format!(
        "MIG mode is off on GPU {gpu} ({name}): MIG instances cannot be profiled here (turning \
         MIG on needs root and a GPU reset); plan MIG offline from profiles measured with MIG on: \
         --device-model NAME --profiles DIR"
    )
}

/// The CPU's model name, as the cache knows this machine's CPU.
fn cpu_name() -> String {
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

/// Copies the profiles the plans used into `dir`, in the cache's layout (to commit them and
/// plan elsewhere with `--device-model --profiles DIR`).
fn export(from: &ProfileCache, keys: &[ProfileKey], dir: &Path) -> anyhow::Result<()> {
    let to = ProfileCache::new(dir);
    let mut done = std::collections::HashSet::new();
    for k in keys {
        if done.insert(k) {
            from.export(k, &to)
                .with_context(|| format!("--export-profiles {}", dir.display()))?;
        }
    }
    eprintln!("exported {} profiles to {}", done.len(), dir.display());
    Ok(())
}

/// Admission control over the planned scenario on the device planned for: the same check
/// `isolane run` makes, so a plan that passes the search but not admission is never written.
fn admit_planned(planned: &Scenario, device: &DeviceModel) -> anyhow::Result<()> {
    let estimates = super::memory_estimates_mib(planned);
    isolane_core::admission::admit(planned, device, &estimates, &Default::default())
        .map(drop)
        .map_err(|r| {
            user(super::plan::rejection_text(
                "the planned scenario",
                device,
                &r,
            ))
        })
}

/// What each workload's profiles are keyed by.
fn workload_ids(s: &Scenario) -> Vec<WorkloadId> {
    s.workloads
        .iter()
        .map(|w| WorkloadId {
            name: w.name.clone(),
            model: model_id(&w.model),
            batch: w.batch,
            precision: format!("{:?}", w.precision).to_lowercase(),
        })
        .collect()
}

/// Each workload's device memory as admission control will count it, per host kind: the
/// estimate builds every model, and only the host (one CUDA context shared by threads, or one
/// per process) changes it between mechanisms.
#[derive(Default)]
struct MemoryEstimates {
    threads: Option<Vec<Option<u64>>>,
    processes: Option<Vec<Option<u64>>>,
}

impl MemoryEstimates {
    fn under(&mut self, s: &Scenario, mech: Mechanism) -> &[Option<u64>] {
        let host = host_for(mech);
        let slot = match host {
            Host::Thread => &mut self.threads,
            Host::Process => &mut self.processes,
        };
        slot.get_or_insert_with(|| {
            if s.device.backend == Backend::Cpu {
                return vec![None; s.workloads.len()];
            }
            let mut t = s.clone();
            t.device.mechanism = mech;
            for w in &mut t.workloads {
                w.host = host;
            }
            super::memory_estimates_mib(&t)
        })
    }
}

fn with_memory(demands: Vec<Demand>, memory: &[Option<u64>]) -> Vec<Demand> {
    demands
        .into_iter()
        .zip(memory)
        .map(|(d, m)| Demand {
            memory_mib: *m,
            ..d
        })
        .collect()
}

fn mech_name(mech: Mechanism) -> &'static str {
    match mech {
        Mechanism::Green => "green",
        Mechanism::Mps => "mps",
        Mechanism::Mig => "mig",
        Mechanism::Timeslice => "timeslice",
        Mechanism::None => "none",
    }
}

/// Each workload's rate and deadline; one without either cannot be planned.
fn demands(s: &Scenario, name: &str) -> anyhow::Result<Vec<Demand>> {
    s.workloads
        .iter()
        .map(|w| {
            let Rate::Hz(hz) = w.rate else {
                return Err(user(format!(
                    "{name}: workload `{}`: rate_hz = \"max\" cannot be planned; give it a rate",
                    w.name
                )));
            };
            Ok(Demand {
                name: w.name.clone(),
                rate_hz: hz,
                deadline_ms: w.deadline_s().unwrap_or(1.0 / hz) * 1e3,
                critical: w.criticality == Criticality::Critical,
                stretch: None,
                added_p99_ms: None,
                memory_mib: None,
            })
        })
        .collect()
}

/// interference.json, or the folder holding it.
fn read_matrix(p: &Path) -> anyhow::Result<InterferenceIndex> {
    let file = if p.is_dir() {
        p.join("interference.json")
    } else {
        p.to_path_buf()
    };
    isolane_core::results::read_json(&file).map_err(|e| user(format!("--stretch-from: {e}")))
}

/// Each workload's stretch from the matrix, beside the scenario's other models, where the
/// matrix measured that mechanism and the workload's model and precision as a victim; a model
/// it never measured takes the worst stretch of any victim at that precision (or --stretch
/// when that is larger): planning it as if alone would be the optimistic guess.
fn with_stretch(
    s: &Scenario,
    demands: &[Demand],
    mech: Mechanism,
    matrix: Option<&InterferenceIndex>,
    stated: f64,
) -> Vec<Demand> {
    let Some(m) = matrix.filter(|m| m.mechanism == format!("{mech:?}").to_lowercase()) else {
        return demands.to_vec();
    };
    demands
        .iter()
        .zip(&s.workloads)
        .map(|(d, w)| {
            let others: Vec<&str> = s
                .workloads
                .iter()
                .filter(|o| o.name != w.name)
                .map(|o| o.model.as_str())
                .collect();
            let precision = format!("{:?}", w.precision).to_lowercase();
            let measured = isolane_planner::stretch_from(m, &w.model, &precision, &others);
            let stand_in = || {
                let st = isolane_planner::worst_stretch(m, &precision)?.max(stated);
                eprintln!(
                    "{}: stretch {st:.2}, the matrix's worst at {precision} (it did not measure \
                     {} as a victim)",
                    w.name, w.model
                );
                Some(st)
            };
            if let Some(st) = measured {
                eprintln!("{}: stretch {st:.2} from the interference matrix", w.name);
            }
            Demand {
                stretch: measured.or_else(stand_in).or(d.stretch),
                ..d.clone()
            }
        })
        .collect()
}

/// The mechanisms to plan with: `--mechanism` (`all`: green, MPS, time-slicing, and MIG where
/// the device has it and it can be profiled), else the scenario's own; on the CPU, cores.
fn mechanisms(
    s: &Scenario,
    flag: Option<&str>,
    target: &Target,
    workloads: &[WorkloadId],
) -> anyhow::Result<Vec<Mechanism>> {
    if s.device.backend == Backend::Cpu {
        return Ok(vec![Mechanism::None]);
    }
    let mig_alone = || match &target.device().mig {
        Some(_) => Ok(vec![Mechanism::Mig]),
        None => Err(user(format!(
            "--mechanism mig: {} has no MIG; allowed: green, mps, timeslice, all",
            target.device().name
        ))),
    };
    Ok(match flag {
        Some("all") => {
            let mut all = vec![Mechanism::Green, Mechanism::Mps, Mechanism::Timeslice];
            match target.mig_unavailable(workloads) {
                Some(why) => eprintln!(
                    "{}",
                    super::wrap_message(&format!("mig: skipped: {why}"), 80)
                ),
                None => all.push(Mechanism::Mig),
            }
            all
        }
        Some("green") => vec![Mechanism::Green],
        Some("mps") => vec![Mechanism::Mps],
        Some("timeslice") => vec![Mechanism::Timeslice],
        Some("mig") => mig_alone()?,
        Some(other) => {
            return Err(user(format!(
                "--mechanism: `{other}` cannot be planned; allowed: green, mps, timeslice, mig, \
                 all"
            )))
        }
        None => match s.device.mechanism {
            m @ (Mechanism::Green | Mechanism::Mps | Mechanism::Timeslice) => vec![m],
            Mechanism::None => vec![Mechanism::Timeslice],
            Mechanism::Mig => mig_alone()?,
        },
    })
}

/// The sizes `mech` offers on `device`, with the device's memory to check.
fn ladder(s: &Scenario, mech: Mechanism, device: &DeviceModel) -> anyhow::Result<Ladder> {
    if s.device.backend == Backend::Cpu {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
        return Ok(Ladder::cores(cores));
    }
    let ladder = match mech {
        Mechanism::Green => {
            let r = device
                .green_rules()
                .ok_or_else(|| user(format!("{} has no green contexts", device.name)))?;
            let mut ladder = Ladder::green(device.sm_count, r.min_sms, r.step_sms);
            // Several green contexts hold only what one split of the device gives in its
            // smallest units (DeviceModel::green_split_limit); planned sizes are multiples of
            // them, so the plan keeps within it even where a larger common unit would not need to.
            if let Some((unit, groups)) = device.green_split_limit() {
                if s.workloads.len() > 1 {
                    ladder.capacity = ladder.capacity.min(unit * groups);
                }
            }
            ladder
        }
        Mechanism::Mps => Ladder::mps(5),
        Mechanism::Mig => Ladder::mig(
            device
                .mig
                .as_ref()
                .ok_or_else(|| user(format!("{} has no MIG", device.name)))?,
        ),
        _ => Ladder::whole(),
    };
    Ok(ladder.with_device_memory(device.memory_mib))
}

/// The model as the cache knows it: an ONNX file by name and content hash (a re-exported
/// file is measured again), anything else by its name.
fn model_id(model: &str) -> String {
    if !model.ends_with(".onnx") {
        return model.to_string();
    }
    let hash = std::fs::read(model).map_or(0, |b| crc32fast::hash(&b));
    let name = Path::new(model)
        .file_name()
        .map_or_else(|| model.to_string(), |n| n.to_string_lossy().into_owned());
    format!("{name}-{hash:08x}")
}

/// Profiles by running the workload alone, closed loop, through `isolane run`'s path; from the
/// cache when it has them.
struct RunProfiler<'a> {
    scenario: &'a Scenario,
    workloads: &'a [WorkloadId],
    mechanism: Mechanism,
    ladder: &'a Ladder,
    cache: &'a ProfileCache,
    device: &'a DeviceRecord,
    mig_on: Option<bool>,
    allow_mig_reconfigure: bool,
    budget: Option<&'a mut ProfileBudget>,
    jobs: u64,
    engine: &'a Engine,
    work: &'a Path,
    /// The keys of the profiles the plan used (for `--export-profiles`).
    used: Vec<ProfileKey>,
    /// Per workload, the mean execution time (ms) of its last profile run: the next one's
    /// estimate.
    paces: Vec<Option<f64>>,
}

impl RunProfiler<'_> {
    fn key(&self, index: usize, size: u32) -> ProfileKey {
        let w = &self.workloads[index];
        ProfileKey {
            gpu: self.device.gpu.clone(),
            driver: self.device.driver.clone(),
            model: w.model.clone(),
            batch: w.batch,
            precision: w.precision.clone(),
            mechanism: mech_name(self.mechanism).into(),
            partition: self.ladder.label(size),
        }
    }

    /// The revision of the engine that measures this scenario's profiles: the cuda backend's
    /// (a profile of another revision is measured again), none for the CPU backend.
    fn engine_revision(&self) -> Option<u32> {
        (self.scenario.device.backend == isolane_core::spec::Backend::Cuda)
            .then_some(isolane_cuda::ENGINE_REVISION)
    }

    /// Why this profile may not be measured now, if it may not.
    fn may_not_measure(&self, index: usize, size: u32) -> Option<String> {
        let what = format!(
            "{} in {}",
            self.workloads[index].describe(mech_name(self.mechanism)),
            self.ladder.describe(size)
        );
        if self.mechanism == Mechanism::Mig {
            if self.mig_on != Some(true) {
                return Some(format!(
                    "{what}: {}",
                    mig_off(self.scenario.device.gpu, &self.device.gpu)
                ));
            }
            if !self.allow_mig_reconfigure {
                return Some(format!(
                    "{what}: profiling in a MIG instance creates it, which changes the GPU for \
                     every user: pass --allow-mig-reconfigure"
                ));
            }
        }
        match &self.budget {
            Some(b) if !b.allows_another() => Some(format!(
                "{what}: the profiling budget is spent ({:.1} s of {:.1} s)",
                b.spent().as_secs_f64(),
                b.limit().as_secs_f64()
            )),
            _ => None,
        }
    }

    fn measure(&self, index: usize, size: u32, expected_s: Option<f64>) -> anyhow::Result<Point> {
        let mut w = self.scenario.workloads[index].clone();
        w.rate = Rate::Max(MaxRate::Max);
        w.deadline_ms = None;
        w.length = RunLength::Jobs(self.jobs);
        w.warmup_jobs = PROFILE_WARMUP;
        w.role = Role::Standalone;
        w.ramp = None;
        w.late = LatePolicy::Queue;
        w.criticality = Criticality::Critical;
        let mut s = self.scenario.clone();
        place(&mut s, &mut w, self.mechanism, self.ladder, size, 0);
        // A profile is of the GPU model, so it is measured on the scenario's first GPU alone
        // (a scenario of one GPU), whichever GPU the workload may be placed on.
        s.device.gpus.clear();
        w.gpu = None;
        s.workloads = vec![w];
        let admitted = super::admit_or_refuse(&s, "the profile run")?;
        let plan = RunPlan::from_scenario(&s);
        let out = self.work.join(format!("w{index}-{size}"));
        let what = format!(
            "{} in {}",
            self.scenario.workloads[index].name,
            describe(self.mechanism, self.ladder, size)
        );
        let mut view = super::progress::ProfileProgress::start(&what, self.jobs, expected_s, false);
        let request = super::run::Request {
            command: "plan",
            scenario: &s,
            scenario_name: "profile".into(),
            admitted: admitted.as_ref(),
            plan: &plan,
            out: Some(&out),
            force: true,
            quiet: true,
            partitions: &super::PartitionFlags {
                allow_mig_reconfigure: self.allow_mig_reconfigure,
                ..Default::default()
            },
            engine: self.engine,
        };
        let m = super::run::measure_with(request, None, &mut view);
        view.finish();
        let m = m?;
        let r = &m.result.workloads[0];
        if let isolane_runtime::WorkloadStatus::Failed(f) = &r.status {
            anyhow::bail!(
                "the profile run of `{}` failed: {}",
                s.workloads[0].name,
                f.message
            );
        }
        if self.scenario.device.backend == Backend::Cpu {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            let name = &s.workloads[0].name;
            if let Some(note) = busy_host_note(name, load_average(), cores, self.cache.dir()) {
                eprintln!("{note}");
            }
        }
        let t = isolane_core::metrics::exec_times(&r.records);
        let (Some(p50), Some(p99), Some(mean)) = (t.p50, t.p99, t.mean) else {
            anyhow::bail!(
                "the profile run of `{}` completed no job",
                s.workloads[0].name
            );
        };
        Ok(Point {
            size,
            exec_p50_ms: p50,
            exec_p99_ms: p99,
            exec_mean_ms: mean,
            exec_p999_ms: t.p999,
        })
    }
}

impl Profiler for RunProfiler<'_> {
    fn profile(&mut self, index: usize, size: u32) -> Result<Point, ProfileError> {
        let key = self.key(index, size);
        let revision = self.engine_revision();
        let cached = self.cache.get(&key);
        if let Some(t) = cached.filter(|t| t.measured_by(revision)) {
            self.used.push(key);
            return Ok(t.at(size));
        }
        let what = || {
            format!(
                "the cached profile of {} in {}",
                self.scenario.workloads[index].name,
                describe(self.mechanism, self.ladder, size)
            )
        };
        let stale = |t: &Times| {
            let by = |r: Option<u32>| match r {
                Some(r) => format!("revision {r} of the cuda engine"),
                None => "an engine without a revision (the CPU's, or a cuda build before \
                         revisions were recorded)"
                    .to_string(),
            };
            format!(
                "{} was measured by {}; this build is {}",
                what(),
                by(t.engine_revision),
                by(revision)
            )
        };
        if let Some(why) = self.may_not_measure(index, size) {
            // A profile of another engine revision beats none, said so.
            if let Some(t) = cached {
                eprintln!("note: {}; using it ({why})", stale(&t));
                self.used.push(key);
                return Ok(t.at(size));
            }
            return Err(ProfileError::NotProfiled(why));
        }
        if let Some(t) = &cached {
            eprintln!("note: {}: measuring it again", stale(t));
        }
        let started = Instant::now();
        // An earlier profile of this workload gives the pace of this one's jobs (a larger
        // partition is never slower, so it is an upper bound on the GPU).
        let expected_s =
            self.paces[index].map(|mean_ms| (self.jobs + PROFILE_WARMUP) as f64 * mean_ms / 1e3);
        let measured = self.measure(index, size, expected_s);
        if let Some(b) = self.budget.as_mut() {
            b.charge(started.elapsed());
        }
        let p = measured.map_err(|e| ProfileError::Failed(format!("{e:#}")))?;
        self.paces[index] = Some(p.exec_mean_ms);
        match self.cache.put(&key, self.device, &Times::of(&p, revision)) {
            Ok(()) => self.used.push(key),
            Err(e) => eprintln!(
                "note: cannot keep the profile in {}: {e}",
                self.cache.dir().display()
            ),
        }
        eprintln!(
            "profiled {} in {}: p50 {:.3} ms, p99 {:.3} ms, p99.9 {:.3} ms",
            self.scenario.workloads[index].name,
            describe(self.mechanism, self.ladder, size),
            p.exec_p50_ms,
            p.exec_p99_ms,
            p.tail_ms()
        );
        Ok(p)
    }
}

/// The machine's load average over the last minute (/proc/loadavg), if it can be read.
fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// On the CPU a profile's times are the host's as much as the workload's: where other
/// processes kept more threads runnable than the machine has cores (the profile's own one
/// counted), the profile says so, since the tail it measured is that busy host's (issue 31: a
/// plan refused beside other builds was made at a load of 3 on 2 cores, refused at 4).
fn busy_host_note(workload: &str, load: Option<f64>, cores: usize, cache: &Path) -> Option<String> {
    let load = load?;
    (load > cores as f64).then(|| {
        super::wrap_message(
            &format!(
                "note: the machine was busy while `{workload}` was profiled (load average \
                 {load:.1} on {cores} cores): its times, tail included, are those of a host \
                 this busy. On a quieter machine they are shorter: the profile is kept in {}, \
                 so plan again then with another --profile-cache to measure it anew.",
                cache.display()
            ),
            80,
        )
    })
}

fn describe(mech: Mechanism, ladder: &Ladder, size: u32) -> String {
    match mech {
        Mechanism::Green | Mechanism::Mig => ladder.describe(size),
        Mechanism::Mps => format!("{size} % of the threads"),
        Mechanism::None => "one core".into(),
        _ => "the whole GPU".into(),
    }
}

fn host_for(mech: Mechanism) -> Host {
    match mech {
        Mechanism::Green => Host::Thread,
        _ => Host::Process,
    }
}

/// Puts workload `w` in a partition of `size` of `ladder` under `mech` (on the CPU: on core
/// `core`).
fn place(
    s: &mut Scenario,
    w: &mut WorkloadSpec,
    mech: Mechanism,
    ladder: &Ladder,
    size: u32,
    core: usize,
) {
    w.partition = PartitionSpec::default();
    if s.device.backend == Backend::Cpu {
        w.cpu = vec![core];
        w.host = Host::Thread;
        return;
    }
    s.device.mechanism = mech;
    match mech {
        Mechanism::Green => w.partition.sms = Some(size),
        Mechanism::Mps => w.partition.thread_pct = Some(size),
        Mechanism::Mig => w.partition.mig_profile = Some(ladder.label(size)),
        _ => {}
    }
    w.host = host_for(mech);
    s.device.host = w.host;
}

/// The scenario with every workload in its planned partition, and on several GPUs on its
/// planned GPU (`gpu_of`, one per workload; `None` keeps the workload's own).
fn planned_scenario(
    s: &Scenario,
    mech: Mechanism,
    ladder: &Ladder,
    choices: &[Choice],
    gpu_of: &[Option<u32>],
) -> Scenario {
    let mut out = s.clone();
    let mut workloads = std::mem::take(&mut out.workloads);
    for (k, (w, c)) in workloads.iter_mut().zip(choices).enumerate() {
        place(&mut out, w, mech, ladder, c.size, k);
        if let Some(g) = gpu_of.get(k).copied().flatten() {
            w.gpu = Some(g);
        }
    }
    out.workloads = workloads;
    out
}

/// The scenario a round runs and writes: the plan's partitions, and with --phases stagger its
/// release phases.
fn planned_for(r: &Rounds, plan: &GpusPlan) -> Scenario {
    let choices = planned_choices(plan);
    let gpus = plan.gpus_in_order();
    let mut planned = planned_scenario(r.scenario, r.mech, r.ladder, choices, &gpus);
    if r.args.phases == Phases::Stagger {
        stagger_releases(&mut planned, choices, &gpus);
    }
    planned
}

/// The resolved scenario with a comment above each workload: its partition, predicted p99 and
/// p99.9, and the slack the deadline leaves beyond the p99.9.
fn annotate(toml: &str, plan: &GpusPlan, ladder: &Ladder, margin: f64) -> String {
    let mut out = String::new();
    let gpus = plan.gpus_in_order();
    let mut next = planned_choices(plan).iter().zip(gpus);
    for line in toml.lines() {
        if line.trim() == "[[workload]]" {
            if let Some((c, gpu)) = next.next() {
                out.push_str(&format!(
                    "# planned: {}{}; predicted p99 {:.3} ms, p99.9 {:.3} ms (deadline {:.3} ms, \
                     slack {:.3} ms); utilisation {:.2}\n",
                    partition_words(ladder, c),
                    gpu.map_or(String::new(), |g| format!(" on GPU {g}")),
                    c.predicted_p99_ms,
                    c.predicted_tail_ms,
                    c.deadline_ms,
                    c.slack_ms(),
                    c.util
                ));
                if c.tail_at_risk(margin) {
                    out.push_str(&format!(
                        "# the p99.9 is over {:.0} % of the deadline: planned on the p99 (a CPU \
                         core is not kept from the host's other processes)\n",
                        margin * 100.0
                    ));
                }
            }
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// A choice's partition in words: `48 SMs`, `3g.40gb at memory slice 4`.
fn partition_words(ladder: &Ladder, c: &Choice) -> String {
    match c.mig_start {
        Some(start) => format!("{} at memory slice {start}", ladder.describe(c.size)),
        None => ladder.describe(c.size),
    }
}

/// `; device memory about 2340 of 81559 MiB` when the workloads' memory is known; on several
/// GPUs each GPU's (`; device memory about 1734 of 81559 MiB on GPU 0, 484 on GPU 1`).
fn memory_words(ladder: &Ladder, plan: &GpusPlan, choices: &[Choice]) -> String {
    let Some(device) = ladder
        .device_memory_mib
        .filter(|_| ladder.unit != Unit::Mig)
    else {
        return String::new();
    };
    let on = |gpu: Option<u32>| -> Option<u64> {
        let known: Vec<u64> = choices
            .iter()
            .filter(|c| gpu.is_none() || plan.gpu_of(&c.workload) == gpu)
            .filter_map(|c| c.memory_mib)
            .collect();
        (!known.is_empty()).then(|| known.iter().sum())
    };
    if plan.gpus.is_empty() {
        return on(None).map_or(String::new(), |m| {
            format!("; device memory about {m} of {device} MiB")
        });
    }
    let each: Vec<String> = plan
        .gpus
        .iter()
        .filter_map(|&g| on(Some(g)).map(|m| (g, m)))
        .enumerate()
        .map(|(k, (g, m))| match k {
            0 => format!("{m} of {device} MiB on GPU {g}"),
            _ => format!("{m} on GPU {g}"),
        })
        .collect();
    if each.is_empty() {
        return String::new();
    }
    format!("; device memory about {}", each.join(", "))
}

fn print_outcome(mech: Mechanism, ladder: &Ladder, plan: &GpusPlan, secs: f64, margin: f64) {
    let title = match ladder.unit {
        Unit::Cores => "cpu cores".to_string(),
        _ => mech_name(mech).to_string(),
    };
    let on = |c: &Choice| gpu_words(plan, c);
    match &plan.outcome {
        Outcome::Planned {
            choices,
            used,
            capacity,
        } => {
            eprintln!(
                "{title}: planned in {secs:.2} s, using {}{}:",
                usage(ladder, plan, *used, *capacity),
                memory_words(ladder, plan, choices)
            );
            for c in choices {
                let memory = match (c.memory_mib, ladder.memory_of(c.size)) {
                    (Some(m), Some(of)) if ladder.unit == Unit::Mig => {
                        format!("  memory {m} of {of} MiB")
                    }
                    _ => String::new(),
                };
                eprintln!(
                    "  {:<14} {}{:>8}  p99 {:>6.3}  p99.9 {:>6.3} of {:>6.3} ms  slack {:>6.3} ms{memory}",
                    c.workload,
                    on(c),
                    partition_words(ladder, c),
                    c.predicted_p99_ms,
                    c.predicted_tail_ms,
                    c.deadline_ms,
                    c.slack_ms()
                );
            }
            for line in tail_notes(choices, margin) {
                eprintln!("{line}");
            }
        }
        Outcome::NoPlan {
            reasons,
            unprofiled,
            partial,
        } => {
            eprintln!("{title}: no plan ({secs:.2} s):");
            for r in reasons {
                eprintln!("{}", indented(r));
            }
            for u in unprofiled {
                eprintln!("{}", indented(&format!("not profiled: {}", u.why)));
            }
            if !partial.is_empty() {
                let parts: Vec<String> = partial
                    .iter()
                    .map(|c| format!("{} {}{}", c.workload, on(c), partition_words(ladder, c)))
                    .collect();
                eprintln!(
                    "{}",
                    indented(&format!("best partial plan: {}", parts.join(", ")))
                );
            }
        }
    }
}

/// A line of the plan's outcome: two spaces in, wrapped to 80 columns (continuations four in).
fn indented(text: &str) -> String {
    super::wrap_message(text, 78)
        .lines()
        .map(|l| format!("  {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A note per workload planned on its p99 with a p99.9 over `margin` × its deadline (a CPU
/// core, `isolane_planner::tail_rule`), wrapped to 80 columns.
fn tail_notes(choices: &[Choice], margin: f64) -> Vec<String> {
    choices
        .iter()
        .filter(|c| c.tail_at_risk(margin))
        .map(|c| {
            super::wrap_message(
                &format!(
                    "note: `{}`: p99.9 {:.3} ms is over {:.0} % of its {:.3} ms deadline; \
                     planned on its p99 ({:.3} ms): a CPU core is not kept from the host's \
                     other processes, whose tail this is. More than 0.1 % of its jobs may miss \
                     while the machine is as busy as during the profile (--verify measures it).",
                    c.workload,
                    c.predicted_tail_ms,
                    margin * 100.0,
                    c.deadline_ms,
                    c.predicted_p99_ms
                ),
                80,
            )
        })
        .collect()
}

/// `GPU 1 ` before a choice's partition on several GPUs; nothing on one.
fn gpu_words(plan: &GpusPlan, c: &Choice) -> String {
    plan.gpu_of(&c.workload)
        .map_or(String::new(), |g| format!("GPU {g} "))
}

/// `96 SMs of 132 SMs (36 SMs spare)`; on several GPUs each GPU's, `GPU 0: … ; GPU 1: …`.
fn usage(ladder: &Ladder, plan: &GpusPlan, used: u32, capacity: u32) -> String {
    if ladder.unit == Unit::Whole {
        return time_usage(plan);
    }
    let one = |used: u32, capacity: u32| {
        format!(
            "{} of {} ({} spare)",
            ladder.describe_amount(used),
            ladder.describe_amount(capacity),
            ladder.describe_amount(capacity.saturating_sub(used))
        )
    };
    if plan.gpus.is_empty() {
        return one(used, capacity);
    }
    plan.gpus
        .iter()
        .zip(&plan.used)
        .map(|(g, &u)| format!("GPU {g}: {}", one(u, ladder.capacity)))
        .collect::<Vec<_>>()
        .join("; ")
}

/// Time-slicing shares time, not space: the share of the GPU's time the jobs keep it busy
/// (rate × mean execution time, summed), per GPU on several.
fn time_usage(plan: &GpusPlan) -> String {
    let choices = planned_choices(plan);
    let busy = |gpu: Option<u32>| -> String {
        let pct: f64 = (choices.iter())
            .filter(|c| gpu.is_none() || plan.gpu_of(&c.workload) == gpu)
            .map(|c| 100.0 * c.util)
            .sum();
        format!(
            "the whole GPU in turns, {pct:.0} % of its time busy ({:.0} % spare)",
            (100.0 - pct).max(0.0)
        )
    };
    if plan.gpus.is_empty() {
        return busy(None);
    }
    (plan.gpus.iter())
        .map(|&g| format!("GPU {g}: {}", busy(Some(g))))
        .collect::<Vec<_>>()
        .join("; ")
}

/// Runs the planned scenario (verification round `round`) and returns what it measured.
fn verify(
    s: &Scenario,
    args: &PlanArgs,
    round: u32,
    engine: &Engine,
) -> anyhow::Result<RunSummary> {
    // Round 1 runs in --verify-out, later rounds beside it (DIR.round2 …).
    let out = args.verify_out.as_ref().map(|d| match round {
        1 => d.clone(),
        k => {
            let mut name = d.as_os_str().to_owned();
            name.push(format!(".round{k}"));
            std::path::PathBuf::from(name)
        }
    });
    run_verification(s, args, out, &format!("verification run {round}"), engine)
}

/// Runs a planned scenario once, in `out` (default: a new runs/ folder), each workload for
/// --verify-duration if given, and says where (`label: DIR`).
fn run_verification(
    s: &Scenario,
    args: &PlanArgs,
    out: Option<PathBuf>,
    label: &str,
    engine: &Engine,
) -> anyhow::Result<RunSummary> {
    let mut s = s.clone();
    if let Some(d) = args.verify_duration {
        for w in &mut s.workloads {
            w.length = RunLength::DurationS(d);
        }
    }
    let s = &s;
    let admitted = super::admit_or_refuse(s, "the planned scenario")?;
    let plan = RunPlan::from_scenario(s);
    let m = super::run::measure(super::run::Request {
        command: "plan",
        scenario: s,
        scenario_name: "planned".into(),
        admitted: admitted.as_ref(),
        plan: &plan,
        out: out.as_deref(),
        force: args.force,
        quiet: true,
        partitions: &super::PartitionFlags::default(),
        engine,
    })?;
    super::run::write_run_files(&m)?;
    println!("{label}: {}", m.out.display());
    Ok(m.summary)
}

/// What a verification run showed: whether a workload missed its deadline, and the
/// workloads whose predicted p99 was further than the tolerance from the measured one
/// (`name (+23 %)`).
struct Verdict {
    missed: bool,
    off: Vec<String>,
}

/// A workload missed its deadline: more than 0.1 % timeouts, or a measured p99 above the
/// deadline (or none measured).
fn missed(w: &WorkloadSummary, deadline_ms: f64) -> bool {
    w.metrics.timeout_pct > 0.1 || w.metrics.latency_ms.p99.is_none_or(|p| p > deadline_ms)
}

/// Predicted against measured p99 and p99.9 (response times, ms) per workload, and its jobs
/// and timeouts; whether one missed its deadline (timeouts above 0.1 %, or a measured p99
/// above it): then the plan does not hold.
fn print_verification(summary: &RunSummary, choices: &[Choice], tolerance: f64) -> Verdict {
    println!(
        "{:<14} {:>8} {:>8} {:>6} {:>8} {:>8} {:>8} {:>6} {:>8}  verdict",
        "workload",
        "p99 pred",
        "measured",
        "error",
        "p999 pre",
        "measured",
        "deadline",
        "jobs",
        "timeouts"
    );
    let mut fewest_jobs = u64::MAX;
    let mut verdict = Verdict {
        missed: false,
        off: Vec::new(),
    };
    for (w, c) in summary.workloads.iter().zip(choices) {
        let lat = &w.metrics.latency_ms;
        let p99 = lat.p99.unwrap_or(f64::INFINITY);
        let p999 = lat.p999.unwrap_or(f64::INFINITY);
        let miss = missed(w, c.deadline_ms);
        verdict.missed |= miss;
        let error = c.predicted_p99_ms / p99 - 1.0;
        // Not finite (nothing measured) counts as off.
        if !error.is_finite() || error.abs() > tolerance {
            verdict
                .off
                .push(format!("{} ({:+.0} %)", w.name, 100.0 * error));
        }
        println!(
            "{:<14} {:>8.3} {:>8.3} {:>5.0}% {:>8.3} {:>8.3} {:>8.3} {:>6} {:>7.2}%  {}",
            w.name,
            c.predicted_p99_ms,
            p99,
            100.0 * error,
            c.predicted_tail_ms,
            p999,
            c.deadline_ms,
            w.metrics.jobs,
            w.metrics.timeout_pct,
            if miss { "MISSED" } else { "met" }
        );
        fewest_jobs = fewest_jobs.min(w.metrics.jobs);
    }
    println!(
        "(response times in ms; p99 predicted from the p99 alone + the delay a run measured, \
         or × the stretch; error = predicted / measured − 1)"
    );
    if let Some(note) = late_start_note(summary, choices) {
        println!("{note}");
    }
    if fewest_jobs < 3000 {
        // Rule of three: no miss in n jobs bounds the miss rate below 3/n at 95 % confidence.
        println!(
            "(with {fewest_jobs} jobs a workload's 0.1 % allows {} miss(es), and none bounds \
             its miss rate only below {:.2} % at 95 % confidence: --verify-duration S runs \
             longer)",
            fewest_jobs / 1000,
            300.0 / fewest_jobs.max(1) as f64
        );
    }
    verdict
}

/// Where a workload that missed had a job start late by more than a quarter of its deadline:
/// its launch waited for the host, or for its previous job, which a partition of the same
/// size does not change. Says so, with the run's CPU steal; the verdict stands.
fn late_start_note(summary: &RunSummary, choices: &[Choice]) -> Option<String> {
    let late: Vec<String> = (summary.workloads.iter().zip(choices))
        .filter(|(w, c)| missed(w, c.deadline_ms))
        .filter_map(|(w, c)| {
            let max_ms = w.metrics.start_lateness_us.max? / 1e3;
            (max_ms > 0.25 * c.deadline_ms).then(|| format!("{} {max_ms:.2} ms", w.name))
        })
        .collect();
    if late.is_empty() {
        return None;
    }
    let steal = summary
        .cpu_steal_pct
        .map_or("not reported".into(), |p| format!("{p:.3} %"));
    Some(format!(
        "(a job of a workload that missed started late: {}, after its release; its launch \
         waited for the host or for its previous job, not for its partition's SMs (the \
         hypervisor's CPU steal in this run: {steal}): run again, or longer, to tell)",
        late.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn here(model: &str, mig_on: Option<bool>) -> Target {
        let device = isolane_core::device_model::device_model(model).unwrap();
        Target::Here {
            record: DeviceRecord {
                gpu: "NVIDIA H100 80GB HBM3".into(),
                driver: "580.159.04".into(),
                device_model: device.name.into(),
            },
            device,
            cache: ProfileCache::new("unused"),
            mig_on,
            gpu: 0,
        }
    }

    /// The committed H100 verification run of three-cameras (session 9).
    fn three_cameras_run() -> RunSummary {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("results/h100-planner");
        isolane_core::results::read_json(&dir.join("verify-three-cameras/summary.json")).unwrap()
    }

    fn measured_p99(summary: &RunSummary, name: &str) -> f64 {
        let w = summary.workloads.iter().find(|w| w.name == name).unwrap();
        w.metrics.latency_ms.p99.unwrap()
    }

    /// A verification's measured stretch is its p99.9 response over the p99.9 alone, and the
    /// next round plans with it, never with less than it planned with: the committed H100
    /// run of three-cameras (front_vit planned ×1.24 in 32 SMs, measured 1.739 ms against
    /// 1.299 ms alone: ×1.34).
    #[test]
    fn a_round_plans_with_the_stretch_its_verification_measured() {
        let summary = three_cameras_run();
        let choice = |name: &str, tail: f64, stretch: f64| {
            let profile = Point {
                size: 32,
                exec_p50_ms: tail,
                exec_p99_ms: tail,
                exec_mean_ms: tail,
                exec_p999_ms: Some(tail),
            };
            Choice {
                workload: name.into(),
                size: 32,
                predicted_p99_ms: tail * stretch,
                predicted_tail_ms: tail * stretch,
                deadline_ms: 2.0,
                util: 0.5,
                profile,
                memory_mib: None,
                mig_start: None,
            }
        };
        let demand = |name: &str| Demand {
            name: name.into(),
            rate_hz: 400.0,
            deadline_ms: 2.0,
            critical: true,
            stretch: None,
            added_p99_ms: None,
            memory_mib: None,
        };
        // front_vit measured more than it was planned with; rear_det (planned ×2.0) less.
        let choices = [
            choice("front_vit", 1.299, 1.24),
            choice("rear_det", 1.0, 2.0),
        ];
        let measured = measured_stretch(&choices[0], &summary).unwrap();
        assert!((measured - 1.738751 / 1.299).abs() < 1e-9, "{measured}");
        let next = calibrated(
            &[demand("front_vit"), demand("rear_det")],
            &choices,
            &summary,
        );
        assert!((next[0].stretch.unwrap() - measured).abs() < 1e-9);
        assert!(
            (next[1].stretch.unwrap() - 2.0).abs() < 1e-9,
            "never below the plan's"
        );
        // The delay added to the p99: its p99 response minus its p99 alone, as the latest run
        // measured it (not held to the plan's), never below 0.
        let p99 = |name: &str| measured_p99(&summary, name);
        let front_added = measured_added_p99(&choices[0], &summary).unwrap();
        assert!(front_added > 0.0);
        assert!(
            (front_added - (p99("front_vit") - 1.299)).abs() < 1e-9,
            "{front_added}"
        );
        assert_eq!(next[0].added_p99_ms, Some(front_added));
        let rear_added = (p99("rear_det") - 1.0).max(0.0);
        assert_eq!(next[1].added_p99_ms, Some(rear_added));
        // A workload the run does not know has nothing measured.
        assert_eq!(
            measured_stretch(&choice("nobody", 1.0, 1.0), &summary),
            None
        );
        assert_eq!(
            measured_added_p99(&choice("nobody", 1.0, 1.0), &summary),
            None
        );
        // Faster than alone (two runs' noise) adds nothing.
        assert_eq!(
            measured_added_p99(&choice("front_vit", 100.0, 1.0), &summary),
            Some(0.0)
        );
    }

    /// A run whose predictions were off (deadlines met) names those workloads; predicted again
    /// from the delays it measured, the same partitions predict its p99s exactly.
    #[test]
    fn predictions_off_by_more_than_the_tolerance_are_named_and_made_again() {
        let summary = three_cameras_run();
        let p99 = |name: &str| measured_p99(&summary, name);
        let choice = |name: &str, alone: f64, predicted: f64| Choice {
            workload: name.into(),
            size: 32,
            predicted_p99_ms: predicted,
            predicted_tail_ms: predicted,
            deadline_ms: 100.0,
            util: 0.1,
            profile: Point {
                size: 32,
                exec_p50_ms: alone,
                exec_p99_ms: alone,
                exec_mean_ms: alone,
                exec_p999_ms: Some(alone),
            },
            memory_mib: None,
            mig_start: None,
        };
        let names: Vec<String> = summary.workloads.iter().map(|w| w.name.clone()).collect();
        // The first predicted 30 % low, the others within 10 %.
        let choices: Vec<Choice> = (names.iter().enumerate())
            .map(|(i, n)| {
                let f = if i == 0 { 0.7 } else { 1.1 };
                choice(n, 0.8 * p99(n), f * p99(n))
            })
            .collect();
        let v = print_verification(&summary, &choices, 0.15);
        assert!(!v.missed);
        assert_eq!(v.off, [format!("{} (-30 %)", names[0])]);
        assert!(print_verification(&summary, &choices, 0.35).off.is_empty());

        let demands: Vec<Demand> = (names.iter())
            .map(|n| Demand {
                name: n.clone(),
                rate_hz: 10.0,
                deadline_ms: 100.0,
                critical: false,
                stretch: None,
                added_p99_ms: None,
                memory_mib: None,
            })
            .collect();
        let demands = calibrated(&demands, &choices, &summary);
        let mut plan = GpusPlan {
            gpus: Vec::new(),
            gpu_of: Vec::new(),
            used: Vec::new(),
            outcome: Outcome::Planned {
                choices: choices.clone(),
                used: 96,
                capacity: 132,
            },
        };
        repredict(&mut plan, &demands, &Options::default());
        let again = planned_choices(&plan);
        assert_eq!(sizes(again), sizes(&choices));
        for (c, d) in again.iter().zip(&demands) {
            assert!((c.predicted_p99_ms - p99(&c.workload)).abs() < 1e-9);
            // The p99.9 with the stretch the run measured (never below the planned one).
            let stretch = d.stretch.unwrap();
            assert!((c.predicted_tail_ms - c.profile.tail_ms() * stretch).abs() < 1e-9);
        }
        assert!(print_verification(&summary, again, 0.15).off.is_empty());
    }

    /// A plan for each workload of `summary`: 32 SMs, every time 1 ms alone, predicted p99
    /// 1 ms and p99.9 1.5 ms against a 2 ms deadline.
    fn one_choice_each(summary: &RunSummary) -> Vec<Choice> {
        (summary.workloads.iter())
            .map(|w| Choice {
                workload: w.name.clone(),
                size: 32,
                predicted_p99_ms: 1.0,
                predicted_tail_ms: 1.5,
                deadline_ms: 2.0,
                util: 0.5,
                profile: Point {
                    size: 32,
                    exec_p50_ms: 1.0,
                    exec_p99_ms: 1.0,
                    exec_mean_ms: 1.0,
                    exec_p999_ms: Some(1.0),
                },
                memory_mib: None,
                mig_start: None,
            })
            .collect()
    }

    /// A workload that missed with a job started late by more than a quarter of its deadline
    /// gets a note naming the host; late starts of workloads that met, or short ones, none.
    #[test]
    fn a_miss_with_late_starts_is_said_to_be_the_hosts() {
        let mut summary = three_cameras_run();
        let choices = one_choice_each(&summary);
        for w in &mut summary.workloads {
            w.metrics.timeout_pct = 0.0;
            w.metrics.latency_ms.p99 = Some(1.0);
            w.metrics.start_lateness_us.max = Some(4_120.0);
        }
        summary.cpu_steal_pct = Some(0.012);
        assert_eq!(
            late_start_note(&summary, &choices),
            None,
            "every workload met"
        );
        summary.workloads[1].metrics.timeout_pct = 0.2;
        let note = late_start_note(&summary, &choices).unwrap();
        let name = &summary.workloads[1].name;
        assert!(
            note.contains(&format!("started late: {name} 4.12 ms")),
            "{note}"
        );
        assert!(note.contains("CPU steal in this run: 0.012 %"), "{note}");
        summary.workloads[1].metrics.start_lateness_us.max = Some(300.0);
        assert_eq!(
            late_start_note(&summary, &choices),
            None,
            "0.3 ms of a 2 ms deadline"
        );
    }

    /// `--mechanism all --verify` compares each mechanism's predicted slack (deadline − p99.9)
    /// with the one its run measured, and says what each plan leaves spare.
    #[test]
    fn mechanisms_are_compared_by_predicted_and_measured_slack() {
        let summary = three_cameras_run();
        let choices = one_choice_each(&summary);
        let plan = GpusPlan {
            gpus: Vec::new(),
            gpu_of: Vec::new(),
            used: Vec::new(),
            outcome: Outcome::Planned {
                choices,
                used: 96,
                capacity: 132,
            },
        };
        let compared = [Mechanism::Green, Mechanism::Mps].map(|mech| Compared {
            mech,
            spare: format!("spare of {}", mech_name(mech)),
            plan: plan.clone(),
            summary: summary.clone(),
        });
        let lines = comparison_lines(&compared);
        let w = &summary.workloads[0];
        let measured = 2.0 - w.metrics.latency_ms.p999.unwrap();
        let row = lines
            .iter()
            .find(|l| l.starts_with("mps") && l.contains(w.name.as_str()))
            .unwrap();
        assert!(row.contains("0.500"), "{row}");
        assert!(row.contains(&format!("{measured:.3}")), "{row}");
        assert!(lines.contains(&format!("{:<10} spare: spare of mps", "mps")));
        // One row per workload and mechanism, a spare line per mechanism, two header lines.
        assert_eq!(lines.len(), 2 + 2 * (summary.workloads.len() + 1));
        // Time-slicing leaves time spare, not SMs: three workloads at utilisation 0.5 each.
        assert_eq!(
            spare_words(&Ladder::whole(), &plan),
            "the whole GPU in turns, 150 % of its time busy (0 % spare)"
        );
        let mut two = plan.clone();
        if let Outcome::Planned { choices, .. } = &mut two.outcome {
            choices.truncate(1);
            choices[0].util = 0.3;
        }
        assert_eq!(
            spare_words(&Ladder::whole(), &two),
            "the whole GPU in turns, 30 % of its time busy (70 % spare)"
        );
    }

    /// Only a `gpu` written in the file pins a workload: the resolved scenario fills one in
    /// for every workload, and the planner may place those the file leaves free.
    #[test]
    fn the_file_says_which_workloads_are_pinned_to_a_gpu() {
        let text = "[device]\nbackend = \"cuda\"\ngpus = [0, 1]\nmechanism = \"green\"\n\
                    [[workload]]\nname = \"free\"\nmodel = \"spin:1ms\"\nrate_hz = 10\njobs = 1\n\
                    [[workload]]\nname = \"pinned\"\nmodel = \"spin:1ms\"\nrate_hz = 10\n\
                    jobs = 1\ngpu = 0\n";
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("s.toml");
        std::fs::write(&file, text).unwrap();
        let s = Scenario::from_toml_str(text, &file, &isolane_core::spec::NoBuiltinModels).unwrap();
        assert_eq!(s.workloads[0].gpu, Some(0), "resolved to the first GPU");
        let spread = Spread::of(&s, text).unwrap();
        assert_eq!(spread.gpus, [0, 1]);
        assert_eq!(spread.pinned, [None, Some(0)]);
        // One GPU: nothing to place.
        let one = Scenario::from_toml_str(
            &text.replace("gpus = [0, 1]", "gpu = 0"),
            &file,
            &isolane_core::spec::NoBuiltinModels,
        )
        .unwrap();
        assert!(Spread::of(&one, text).is_none());
    }

    /// On this machine's GPU MIG can be planned only with MIG mode on (the profile runs need
    /// MIG instances); `--mechanism all` then leaves MIG out with that reason.
    #[test]
    fn a_cpu_profile_on_a_busy_host_says_so() {
        let cache = Path::new("/c");
        let note = busy_host_note("classifier", Some(3.9), 2, cache).unwrap();
        let flat = note.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(
            flat.contains("`classifier` was profiled (load average 3.9 on 2 cores)"),
            "{note}"
        );
        assert!(note.lines().all(|l| l.chars().count() <= 80), "{note}");
        assert!(flat.contains("kept in /c"), "{note}");
        assert!(busy_host_note("classifier", Some(1.2), 2, cache).is_none());
        assert!(busy_host_note("classifier", None, 2, cache).is_none());
    }

    #[test]
    fn mig_is_planned_here_only_with_mig_mode_on() {
        let w = [WorkloadId {
            name: "a".into(),
            model: "resnet18".into(),
            batch: 1,
            precision: "fp16".into(),
        }];
        let off = here("h100-sxm", Some(false)).mig_unavailable(&w).unwrap();
        assert!(
            off.starts_with(
                "MIG mode is off on GPU 0 (h100-sxm): MIG instances cannot be profiled here"
            ),
            "{off}"
        );
        assert!(here("h100-sxm", None).mig_unavailable(&w).is_some());
        assert_eq!(here("h100-sxm", Some(true)).mig_unavailable(&w), None);
        let l40s = here("l40s", Some(false)).mig_unavailable(&w).unwrap();
        assert!(l40s.contains("has no MIG"), "{l40s}");
    }
}
