//! The closed planning loop of `isolane plan --auto` (docs/planner.md): for each mechanism
//! asked, profile → plan; then the first plan is emitted and, with verification, run, planned
//! again with the stretch the run measured (or predicted again where only its predictions were
//! off), up to the rounds allowed; with several mechanisms their plans run once each and are
//! compared.
//!
//! The loop measures nothing and prints nothing. What needs a model run or the engine (a
//! profile run, a verification run, memory estimates, admission control, writing the planned
//! file) is the caller's [`Bench`]; what the loop has to say goes to an [`Observer`] as
//! [`Event`]s, each carrying its data and the text and stream the CLI prints; and it returns a
//! [`Finish`] (the plan written, its text, the last run, how it ended) from which the caller
//! decides its exit code.

mod events;
mod phases;
mod predicted;
mod profiling;
mod rounds;
mod scenario;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use isolane_core::device_model::DeviceModel;
use isolane_core::results::RunSummary;
use isolane_core::spec::{Mechanism, Scenario};

use crate::cache::DeviceRecord;
use crate::offline::{OfflineProfiles, WorkloadId};
use crate::{Demand, GpusPlan, Ladder, LearnedStretch, Options, Outcome, Point, ProfileCache};

pub use events::{Compared, Event, Stream};
pub use scenario::{demands, mig_off, model_id, workload_ids};

use profiling::Profiles;
use rounds::Rounds;
use scenario::{MemoryEstimates, Spread};

/// Warm-up jobs of each profile run (excluded from its times).
pub const PROFILE_WARMUP: u64 = 20;

/// Release phases of the planned scenario (`--phases`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Phases {
    /// The scenario's own (a note says where staggering would keep jobs apart).
    #[default]
    Keep,
    /// Chosen per GPU so that jobs overlap least ([`crate::stagger`]).
    Stagger,
}

/// How to plan: the command's flags, as the loop needs them.
#[derive(Debug, Clone)]
pub struct Config {
    /// Margin, stretch and utilisation bound of the search.
    pub options: Options,
    /// `--mechanism` (`green`, `mps`, `timeslice`, `mig`, `all`); `None`: the scenario's.
    pub mechanism: Option<String>,
    /// An interference matrix (`interference.json`, or its folder) to take each workload's
    /// stretch from (`--stretch-from`).
    pub stretch_from: Option<PathBuf>,
    /// Jobs of each profile run (after [`PROFILE_WARMUP`] warm-up jobs).
    pub profile_jobs: u64,
    /// The time profile runs may take in all (`--profile-budget`).
    pub profile_budget: Option<Duration>,
    /// Profile runs may create MIG instances.
    pub allow_mig_reconfigure: bool,
    pub phases: Phases,
    /// A folder to copy the profiles the plans used into (`--export-profiles`).
    pub export_profiles: Option<PathBuf>,
    /// Run the plan (`--verify`).
    pub verify: bool,
    /// Where the first verification run writes (later rounds beside it); `None`: the caller's
    /// default.
    pub verify_out: Option<PathBuf>,
    /// Each workload of a verification run runs this long (s) instead of its own length.
    pub verify_duration: Option<f64>,
    /// Verification runs at most.
    pub rounds: u32,
    /// A predicted p99 further than this (a fraction) from the measured one is off.
    pub prediction_tolerance: f64,
    /// The revision of the engine that measures profiles here (a cached profile of another
    /// revision is measured again); `None` for an engine without one (the CPU's).
    pub engine_revision: Option<u32>,
    /// Predict each workload's stretch beside its neighbours where nothing measured it
    /// (`isolane_core::predict`; `--no-predict` turns it off).
    pub predict: bool,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            options: Options::default(),
            mechanism: None,
            stretch_from: None,
            profile_jobs: 1000,
            profile_budget: None,
            allow_mig_reconfigure: false,
            phases: Phases::Keep,
            export_profiles: None,
            verify: false,
            verify_out: None,
            verify_duration: None,
            rounds: 3,
            prediction_tolerance: 0.15,
            engine_revision: None,
            predict: true,
        }
    }
}

/// Where the profiles come from and what the plan is for.
pub enum Target {
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
    /// Where stretches measured by verification runs are kept, and the device they are for:
    /// the cache of this machine's device (an offline plan verifies nothing).
    pub fn learned(&self) -> Option<(DeviceRecord, LearnedStretch)> {
        match self {
            Target::Here { cache, record, .. } => {
                Some((record.clone(), LearnedStretch::new(cache.dir())))
            }
            Target::Offline { .. } => None,
        }
    }

    pub fn device(&self) -> &DeviceModel {
        match self {
            Target::Here { device, .. } | Target::Offline { device, .. } => device,
        }
    }

    pub fn cache(&self) -> &ProfileCache {
        match self {
            Target::Here { cache, .. } => cache,
            Target::Offline { store, .. } => store.cache(),
        }
    }

    /// Why MIG cannot be planned here, if it cannot.
    pub fn mig_unavailable(&self, workloads: &[WorkloadId]) -> Option<String> {
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
    pub fn how_to_profile(&self, budget: bool) -> Option<String> {
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

/// One profile run the loop asks for: a workload alone, closed loop, in a partition.
#[derive(Debug)]
pub struct ProfileRun<'a> {
    /// A scenario of the workload alone, placed in its partition, each job released when the
    /// last ended: [`PROFILE_WARMUP`] warm-up jobs, then `jobs`.
    pub scenario: &'a Scenario,
    /// The workload's index in the planned scenario.
    pub workload: usize,
    /// The partition's size on the ladder.
    pub size: u32,
    /// `camera in 32 SMs`: what the run measures, to say.
    pub what: String,
    pub jobs: u64,
    /// How long it should take (s), from an earlier profile of the same workload.
    pub expected_s: Option<f64>,
}

/// What a verification run gave.
#[derive(Debug, Clone)]
pub struct Verified {
    pub summary: RunSummary,
    /// Where its files are.
    pub dir: PathBuf,
}

/// The caller's side of the loop: everything that runs a model or needs the engine.
pub trait Bench {
    type Error: std::fmt::Display;

    /// Each workload's device memory (MiB) as admission control counts it, for a scenario
    /// whose mechanism and hosts are the ones to plan with (`None`: not known).
    fn memory_estimates(&mut self, scenario: &Scenario) -> Vec<Option<u64>>;

    /// Admission control of a planned scenario on the device planned for: a plan that does
    /// not pass is never written.
    fn admit(&mut self, planned: &Scenario, device: &DeviceModel) -> Result<(), Self::Error>;

    /// Each workload's memory-system demand per job (`isolane_core::predict`), from its
    /// model, for the device planned for: from it the first plan predicts each workload's
    /// stretch beside its neighbours. `None` (or a shorter list): not known, that workload's
    /// stretch is not predicted (nor its share of a neighbour's).
    fn memory_profiles(
        &mut self,
        _scenario: &Scenario,
        _device: &DeviceModel,
    ) -> Vec<Option<isolane_core::predict::MemoryProfile>> {
        Vec::new()
    }

    /// Measures a profile: the workload's execution times over the run's jobs (ms).
    fn profile(&mut self, run: &ProfileRun<'_>) -> Result<Point, Self::Error>;

    /// Runs a planned scenario once, in `out` (`None`: a folder of the caller's choosing).
    fn verify(&mut self, planned: &Scenario, out: Option<&Path>) -> Result<Verified, Self::Error>;

    /// Writes the planned scenario (once per round): where it went, or `None` when the caller
    /// writes nothing and the text comes as [`Event::PlannedScenario`] instead.
    fn write_plan(&mut self, text: &str) -> Result<Option<PathBuf>, Self::Error>;
}

/// Receives what the loop has to say, in order.
pub trait Observer {
    fn event(&mut self, event: &Event<'_>);
}

/// How the loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// A plan was written and not run.
    Planned,
    /// A plan was written, and its last verification run met every deadline.
    Holds,
    /// A plan was written, and its last verification run missed a deadline.
    DoesNotHold,
    /// No mechanism gave a plan (or profiles were missing for one): nothing written.
    NoPlan,
}

/// The written plan of a loop that found one.
#[derive(Debug, Clone)]
pub struct WrittenPlan {
    pub mechanism: Mechanism,
    /// The last round's plan.
    pub plan: GpusPlan,
    /// The planned scenario, as written (with the plan's comments).
    pub text: String,
}

/// What the loop returns.
#[derive(Debug, Clone)]
pub struct Finish {
    pub ending: Ending,
    pub written: Option<WrittenPlan>,
    /// What the last verification run of the written plan measured.
    pub last_run: Option<RunSummary>,
    /// The `[timing] spin_us` the rounds raised the written plan's to, where they did
    /// (misses that started late on the host).
    pub spin_us: Option<u64>,
}

/// Why the loop stopped before its end.
#[derive(Debug)]
pub enum AutoError<E> {
    /// The user's mistake (a flag, a scenario that cannot be planned): exit code 2.
    User(String),
    /// A failure (a profile that could not be measured, a file that could not be written).
    Failed(String),
    /// The caller's [`Bench`] failed.
    Bench(E),
}

impl<E: std::fmt::Display> std::fmt::Display for AutoError<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AutoError::User(m) | AutoError::Failed(m) => f.write_str(m),
            // `{:#}` passes on (an error chain's whole text).
            AutoError::Bench(e) if f.alternate() => write!(f, "{e:#}"),
            AutoError::Bench(e) => write!(f, "{e}"),
        }
    }
}

/// The scenario to plan.
pub struct Input<'a> {
    pub scenario: &'a Scenario,
    /// Its file's name, for messages.
    pub name: &'a str,
    /// Its file's text: a `gpu` written there pins a workload on several GPUs.
    pub text: &'a str,
    pub target: &'a Target,
}

/// Refuses, before anything is measured, an `--export-profiles` path that is there but is no
/// folder (a file, /dev/null): the copy at the end of the plan would fail after the profile
/// runs, and exit 1 as if the machine had failed. A missing folder is made then.
pub fn check_export_dir(dir: &Path) -> Result<(), String> {
    match std::fs::metadata(dir) {
        Ok(m) if !m.is_dir() => Err(format!(
            "--export-profiles {}: exists and is not a folder; it names the folder the profiles \
             the plan used are copied into (made if missing)",
            dir.display()
        )),
        _ => Ok(()),
    }
}

/// Plans `input` as `config` says (see the module's documentation).
pub fn run<B: Bench>(
    input: &Input<'_>,
    config: &Config,
    bench: &mut B,
    observer: &mut dyn Observer,
) -> Result<Finish, AutoError<B::Error>> {
    let scenario = input.scenario;
    let target = input.target;
    let demands = scenario::demands(scenario, input.name).map_err(AutoError::User)?;
    let spread = Spread::of(scenario, input.text);
    let workloads = workload_ids(scenario);
    let mechanisms = scenario::mechanisms(
        scenario,
        config.mechanism.as_deref(),
        target,
        &workloads,
        observer,
    )?;
    let matrix = match &config.stretch_from {
        Some(p) => Some(scenario::read_matrix(p)?),
        None => None,
    };
    let opts = &config.options;
    let mut profiles = Profiles {
        scenario,
        workloads: &workloads,
        config,
        budget: config.profile_budget.map(crate::ProfileBudget::new),
        used: Vec::new(),
        spread: spread.as_ref(),
    };
    let learned = target.learned();
    // Every mechanism with a plan, in the order asked: the first is the one written.
    let mut planned_all: Vec<(Mechanism, Ladder, Vec<Demand>, GpusPlan)> = Vec::new();
    let mut unprofiled = false;
    let mut memory = MemoryEstimates::default();
    let traffic = match config.predict {
        true => bench.memory_profiles(scenario, target.device()),
        false => Vec::new(),
    };
    for mech in &mechanisms {
        let ladder = scenario::ladder(scenario, *mech, target.device())?;
        let stretched = scenario::with_stretch(
            scenario,
            &demands,
            *mech,
            matrix.as_ref(),
            opts.stretch,
            observer,
        );
        let stretched = match &learned {
            Some((device, l)) => {
                let mech = rounds::learned_mechanism(*mech, config.phases);
                rounds::with_learned(&workloads, &stretched, &mech, device, l, observer)
            }
            None => stretched,
        };
        let demands = scenario::with_memory(stretched, memory.under(scenario, *mech, &mut *bench));
        let t = Instant::now();
        let planned = profiles.plan(target, *mech, &ladder, &demands, opts, bench, observer)?;
        let (demands, planned) = predicted::with_predicted(
            &mut profiles,
            target,
            *mech,
            &ladder,
            demands,
            planned,
            &traffic,
            opts,
            bench,
            observer,
        )?;
        observer.event(&Event::Outcome {
            mechanism: *mech,
            ladder: &ladder,
            plan: &planned,
            secs: t.elapsed().as_secs_f64(),
            margin: opts.margin,
        });
        if let Outcome::NoPlan { unprofiled: u, .. } = &planned.outcome {
            unprofiled |= !u.is_empty();
        }
        if matches!(planned.outcome, Outcome::Planned { .. }) {
            planned_all.push((*mech, ladder, demands, planned));
        }
    }
    if unprofiled {
        if let Some(hint) = target.how_to_profile(profiles.budget.is_some()) {
            observer.event(&Event::MissingProfiles { hint: &hint });
        }
    }
    if let Some(dir) = &config.export_profiles {
        profiling::export(target.cache(), &profiles.used, dir, observer)?;
    }
    let mut planned_all = planned_all.into_iter();
    let Some((mech, ladder, demands, plan)) = planned_all.next() else {
        return Ok(Finish {
            ending: Ending::NoPlan,
            written: None,
            last_run: None,
            spin_us: None,
        });
    };
    let rounds = Rounds {
        scenario,
        target,
        config,
        workloads: &workloads,
        learned: learned.as_ref(),
        opts,
        mech,
        ladder: &ladder,
    };
    let finish = rounds::emit_and_verify(&rounds, &mut profiles, demands, plan, bench, observer)?;
    let others: Vec<_> = planned_all.collect();
    if let (Some(written), Some(run), false) =
        (&finish.written, &finish.last_run, others.is_empty())
    {
        rounds::compare_mechanisms(
            &rounds,
            (&written.plan, run, finish.spin_us),
            others,
            bench,
            observer,
        );
    }
    Ok(finish)
}

#[cfg(test)]
mod tests;
