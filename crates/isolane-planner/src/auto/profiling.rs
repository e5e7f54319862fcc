//! The profiles a plan asks for: offline from a folder, else from the cache, the missing ones
//! measured by the caller's [`Bench`] within the profiling budget and kept in the cache.

use std::path::Path;
use std::time::Instant;

use isolane_core::spec::{
    Criticality, LatePolicy, MaxRate, Mechanism, Rate, Role, RunLength, Scenario,
};

use super::scenario::{describe, mig_off, place, Spread};
use super::{AutoError, Bench, Config, Event, Observer, ProfileRun, Target, PROFILE_WARMUP};
use crate::cache::{DeviceRecord, ProfileKey, Times};
use crate::offline::{OfflineProfiler, WorkloadId};
use crate::{
    Demand, GpusPlan, Ladder, Options, Point, ProfileBudget, ProfileCache, ProfileError, Profiler,
};

/// What the plans of one loop share to get their profiles: the settings, the budget left, and
/// the profiles used so far (for exporting them).
pub(crate) struct Profiles<'a> {
    pub scenario: &'a Scenario,
    pub workloads: &'a [WorkloadId],
    pub config: &'a Config,
    pub budget: Option<ProfileBudget>,
    pub used: Vec<ProfileKey>,
    /// The GPUs to place the workloads on, for a scenario on several.
    pub spread: Option<&'a Spread>,
}

/// The plan of `demands` with `profiler`: on one GPU the one-GPU search (no workload's GPU is
/// named), on several GPUs placed per GPU ([`crate::plan_gpus`]).
fn plan_with(
    spread: Option<&Spread>,
    demands: &[Demand],
    ladder: &Ladder,
    opts: &Options,
    profiler: &mut dyn Profiler,
) -> Result<GpusPlan, String> {
    match spread {
        Some(sp) => crate::plan_gpus(demands, &sp.pinned, &sp.gpus, ladder, opts, profiler),
        None => Ok(GpusPlan {
            gpus: Vec::new(),
            gpu_of: demands.iter().map(|d| (d.name.clone(), None)).collect(),
            used: Vec::new(),
            outcome: crate::plan(demands, ladder, opts, profiler)?,
        }),
    }
}

impl Profiles<'_> {
    /// The plan with `mech` for `target`: from the folder offline, else from the cache and
    /// profile runs.
    #[allow(clippy::too_many_arguments)]
    pub fn plan<B: Bench>(
        &mut self,
        target: &Target,
        mech: Mechanism,
        ladder: &Ladder,
        demands: &[Demand],
        opts: &Options,
        bench: &mut B,
        obs: &mut dyn Observer,
    ) -> Result<GpusPlan, AutoError<B::Error>> {
        let spread = self.spread;
        let outcome = match target {
            Target::Offline { store, .. } => {
                let mut p = OfflineProfiler {
                    store,
                    workloads: self.workloads,
                    mechanism: mech.name(),
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
                let mut p = CachedProfiler {
                    scenario: self.scenario,
                    workloads: self.workloads,
                    mechanism: mech,
                    ladder,
                    cache,
                    device: record,
                    mig_on: *mig_on,
                    config: self.config,
                    budget: self.budget.as_mut(),
                    bench,
                    obs,
                    used: Vec::new(),
                    paces: vec![None; self.workloads.len()],
                };
                let o = plan_with(spread, demands, ladder, opts, &mut p);
                self.used.extend(p.used);
                o
            }
        };
        outcome
            .map_err(|e| AutoError::Failed(format!("profiling for the {} plan: {e}", mech.name())))
    }
}

/// Profiles from the cache when it has them, else measured by the bench (each workload alone,
/// closed loop) and kept in the cache.
struct CachedProfiler<'a, B> {
    scenario: &'a Scenario,
    workloads: &'a [WorkloadId],
    mechanism: Mechanism,
    ladder: &'a Ladder,
    cache: &'a ProfileCache,
    device: &'a DeviceRecord,
    mig_on: Option<bool>,
    config: &'a Config,
    budget: Option<&'a mut ProfileBudget>,
    bench: &'a mut B,
    obs: &'a mut dyn Observer,
    /// The keys of the profiles the plan used (for exporting them).
    used: Vec<ProfileKey>,
    /// Per workload, the mean execution time (ms) of its last profile run: the next one's
    /// estimate.
    paces: Vec<Option<f64>>,
}

impl<B: Bench> CachedProfiler<'_, B> {
    fn key(&self, index: usize, size: u32) -> ProfileKey {
        let w = &self.workloads[index];
        ProfileKey {
            gpu: self.device.gpu.clone(),
            driver: self.device.driver.clone(),
            model: w.model.clone(),
            batch: w.batch,
            precision: w.precision.clone(),
            mechanism: self.mechanism.name().into(),
            partition: self.ladder.label(size),
        }
    }

    /// Why this profile may not be measured now, if it may not.
    fn may_not_measure(&self, index: usize, size: u32) -> Option<String> {
        let what = format!(
            "{} in {}",
            self.workloads[index].describe(self.mechanism.name()),
            self.ladder.describe(size)
        );
        if self.mechanism == Mechanism::Mig {
            if self.mig_on != Some(true) {
                return Some(format!(
                    "{what}: {}",
                    mig_off(self.scenario.device.gpu, &self.device.gpu)
                ));
            }
            if !self.config.allow_mig_reconfigure {
                return Some(format!(
                    "{what}: profiling in a MIG instance creates it, which changes the GPU for \
                     every user: pass --allow-mig-reconfigure"
                ));
            }
        }
        let why = self.budget.as_ref()?.refusal()?;
        Some(format!("{what}: {why}"))
    }

    /// Has the bench measure workload `index` alone in a partition of `size`.
    fn measure(
        &mut self,
        index: usize,
        size: u32,
        expected_s: Option<f64>,
    ) -> Result<Point, String> {
        let mut w = self.scenario.workloads[index].clone();
        w.rate = Rate::Max(MaxRate::Max);
        w.deadline_ms = None;
        w.length = RunLength::Jobs(self.config.profile_jobs);
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
        let run = ProfileRun {
            scenario: &s,
            workload: index,
            size,
            what: format!(
                "{} in {}",
                self.scenario.workloads[index].name,
                describe(self.mechanism, self.ladder, size)
            ),
            jobs: self.config.profile_jobs,
            expected_s,
        };
        self.bench.profile(&run).map_err(|e| format!("{e:#}"))
    }
}

impl<B: Bench> Profiler for CachedProfiler<'_, B> {
    fn profile(&mut self, index: usize, size: u32) -> Result<Point, ProfileError> {
        let key = self.key(index, size);
        let revision = self.config.engine_revision;
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
                self.obs.event(&Event::StaleProfileUsed {
                    stale: &stale(&t),
                    why: &why,
                });
                self.used.push(key);
                return Ok(t.at(size));
            }
            return Err(ProfileError::NotProfiled(why));
        }
        if let Some(t) = &cached {
            let stale = stale(t);
            self.obs
                .event(&Event::StaleProfileMeasured { stale: &stale });
        }
        let started = Instant::now();
        // An earlier profile of this workload gives the pace of this one's jobs (a larger
        // partition is never slower, so it is an upper bound on the GPU).
        let jobs = self.config.profile_jobs;
        let expected_s =
            self.paces[index].map(|mean_ms| (jobs + PROFILE_WARMUP) as f64 * mean_ms / 1e3);
        let measured = self.measure(index, size, expected_s);
        if let Some(b) = self.budget.as_mut() {
            b.charge(started.elapsed());
        }
        let p = measured.map_err(ProfileError::Failed)?;
        self.paces[index] = Some(p.exec_mean_ms);
        match self.cache.put(&key, self.device, &Times::of(&p, revision)) {
            Ok(()) => self.used.push(key),
            Err(e) => self.obs.event(&Event::CannotKeepProfile {
                dir: self.cache.dir(),
                error: &e.to_string(),
            }),
        }
        let partition = describe(self.mechanism, self.ladder, size);
        self.obs.event(&Event::Profiled {
            workload: &self.scenario.workloads[index].name,
            partition: &partition,
            point: &p,
        });
        Ok(p)
    }
}

/// Copies the profiles the plans used into `dir`, in the cache's layout (to commit them and
/// plan elsewhere from them, offline).
pub(crate) fn export<E>(
    from: &ProfileCache,
    keys: &[ProfileKey],
    dir: &Path,
    obs: &mut dyn Observer,
) -> Result<(), AutoError<E>> {
    let to = ProfileCache::new(dir);
    let mut done = std::collections::HashSet::new();
    for k in keys {
        if done.insert(k) {
            from.export(k, &to).map_err(|e| {
                AutoError::Failed(format!("--export-profiles {}: {e}", dir.display()))
            })?;
        }
    }
    obs.event(&Event::Exported {
        count: done.len(),
        dir,
    });
    Ok(())
}
