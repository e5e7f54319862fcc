//! `isolane plan SCENARIO [--device-model NAME]`: admission control over all workloads at once.

use std::path::PathBuf;

use clap::Args;
use isolane_core::admission::{self, AdmissionOptions};
use isolane_core::device_model::DeviceModel;
use isolane_core::flag_values::{
    at_least_one, factor, fraction, seconds_or_none, seconds_within_a_day,
};
use isolane_core::spec::Scenario;

use super::user;

#[derive(Args)]
#[command(
    about = "Check that a scenario's partitions fit a device, and show what each workload gets",
    long_about = "Admission control over all workloads of SCENARIO at once: every workload's \
                  partition is checked against the device (green-context minimum and step, SMs \
                  left, MIG profiles and placements, MPS thread percentages and pinned memory, \
                  device memory). Prints the resolved partitions (green group and SM range, MIG \
                  placement, MPS settings) or one reason per rejected workload. Nothing is ever \
                  clamped. `run`, `maxrate` and `isolation` apply the same check before they \
                  start anything. A rejected plan exits 2 (a mistake in the scenario)."
)]
pub struct PlanArgs {
    /// Scenario file (TOML).
    pub scenario: PathBuf,
    /// Check against an offline device model instead of the GPU of this machine: h100-sxm,
    /// h200, a100-40gb, a100-80gb, l40s, orin-agx, orin-nano. With --auto: plan for it
    /// offline, from profiles measured on one (--profiles, else the profile cache); nothing
    /// is measured.
    #[arg(long, value_name = "NAME")]
    pub device_model: Option<String>,
    /// Sum of MPS thread percentages allowed (over 100 allows oversubscription).
    #[arg(long, default_value_t = 100, value_name = "PCT")]
    pub mps_thread_budget: u32,
    /// Print the plan (or the rejections) as JSON.
    #[arg(long, conflicts_with = "auto")]
    pub json: bool,
    /// Choose the partitions: profile each workload alone in partitions of growing size (cached
    /// on disk), pick the smallest that meets its deadline at its rate with --margin, check
    /// they fit together, and print (or --out) the scenario with them filled in
    /// (docs/planner.md).
    #[arg(long)]
    pub auto: bool,
    /// --auto: plan with this mechanism: green, mps, timeslice, mig, or `all` (green, mps,
    /// timeslice and, where the device has MIG and it can be profiled, mig, side by side; the
    /// first that has a plan is written). Default: the scenario's.
    #[arg(long, requires = "auto", value_name = "M")]
    pub mechanism: Option<String>,
    /// --auto: a predicted p99 may use at most this fraction of the deadline.
    #[arg(long, default_value_t = 0.9, requires = "auto", value_parser = fraction)]
    pub margin: f64,
    /// --auto: multiply alone execution times by this for the neighbours (e.g. the worst p99
    /// stretch `isolane interference` measured for the mechanism).
    #[arg(long, default_value_t = 1.0, requires = "auto", value_parser = factor)]
    pub stretch: f64,
    /// --auto: take each workload's stretch from an interference matrix (interference.json or
    /// its folder, measured with the same mechanism): its worst p99 stretch beside the
    /// scenario's other models; workloads it did not measure keep --stretch.
    #[arg(long, requires = "auto", value_name = "PATH")]
    pub stretch_from: Option<PathBuf>,
    /// --auto: the largest utilisation (rate × mean execution time) of one partition (all of
    /// them together under timeslice).
    #[arg(long, default_value_t = 0.8, requires = "auto", value_parser = fraction)]
    pub max_util: f64,
    /// --auto: jobs of each profile run (1000 by default, so that its p99.9, the tail a 0.1 %
    /// timeout budget must fit, is measured rather than guessed).
    #[arg(long, default_value_t = 1000, requires = "auto", value_parser = at_least_one)]
    pub profile_jobs: u64,
    /// --auto: where profiles are kept (default ~/.cache/isolane/profiles).
    #[arg(long, requires = "auto", value_name = "DIR")]
    pub profile_cache: Option<PathBuf>,
    /// --auto --device-model: plan from this folder of profiles (the cache's layout, e.g.
    /// committed from --export-profiles) instead of the cache.
    #[arg(
        long,
        requires = "auto",
        requires = "device_model",
        conflicts_with = "profile_cache",
        value_name = "DIR"
    )]
    pub profiles: Option<PathBuf>,
    /// --auto --device-model: use the profiles measured with this driver version (default: the
    /// newest the profiles have for the device model).
    #[arg(
        long,
        requires = "auto",
        requires = "device_model",
        value_name = "VERSION"
    )]
    pub driver: Option<String>,
    /// --auto: copy every profile the plan used into DIR (the cache's layout), to commit and
    /// plan from elsewhere with --device-model NAME --profiles DIR.
    #[arg(long, requires = "auto", value_name = "DIR")]
    pub export_profiles: Option<PathBuf>,
    /// --auto: spend at most this many seconds measuring profiles; what is left unmeasured is
    /// named (0: plan from the cache alone).
    #[arg(long, requires = "auto", conflicts_with = "device_model", value_name = "S", value_parser = seconds_or_none)]
    pub profile_budget: Option<f64>,
    /// --auto --mechanism mig: let the profile runs create MIG instances (MIG mode must be on;
    /// changes the GPU's layout for every user while they last).
    #[arg(long, requires = "auto", conflicts_with = "device_model")]
    pub allow_mig_reconfigure: bool,
    /// --auto: when each workload is released. `keep`: at its phase_ms (0 where it has none);
    /// `stagger`: a workload without a phase_ms is released where its jobs overlap the other
    /// workloads' least over the rates' common period (its p99 alone in its partition is the
    /// busy time), as cameras triggered with offsets are. Partitions keep SMs apart, not the
    /// copy engine or memory bandwidth (docs/planner.md, "Release phases").
    #[arg(long, value_enum, default_value_t = Phases::Keep, requires = "auto")]
    pub phases: Phases,
    /// --auto, on several GPUs: `spread` puts each workload on the GPU whose workloads need
    /// the least of it so far (fewer neighbours in each GPU's memory system, more slack);
    /// `pack`, on the first where the plan holds (the fewest GPUs). docs/planner.md.
    #[arg(long, value_enum, default_value_t = Objective::Spread, requires = "auto")]
    pub objective: Objective,
    /// --auto: where no verification or matrix measured a workload's stretch, plan it with
    /// --stretch instead of the stretch predicted from the neighbours' memory-system demand
    /// (docs/planner.md, "Predicted stretch").
    #[arg(long, requires = "auto")]
    pub no_predict: bool,
    /// --auto: write the planned scenario here instead of printing it.
    #[arg(long, short = 'o', requires = "auto", value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// --auto: run the planned scenario and compare predicted with measured p99 (exit 1 when
    /// a workload misses its deadline).
    #[arg(long, requires = "auto", conflicts_with = "device_model")]
    pub verify: bool,
    /// --verify: the run folder (default: a new runs/<time>).
    #[arg(long, requires = "verify", value_name = "DIR")]
    pub verify_out: Option<PathBuf>,
    /// --verify: use --verify-out even if it is not empty.
    #[arg(long, requires = "verify")]
    pub force: bool,
    /// --verify: verification runs at most. When a workload misses, each workload's stretch
    /// becomes what its run measured (its p99.9 response beside the others over its p99.9
    /// alone, never less than before), the plan is made again with it and run again, in
    /// DIR.round2, DIR.round3 ... The verdict is the last run's.
    #[arg(long, default_value_t = 3, requires = "verify", value_parser = clap::value_parser!(u32).range(1..=10))]
    pub rounds: u32,
    /// --verify: how far (a fraction) a predicted p99 may be from the measured one. When every
    /// deadline holds but a prediction is further off, the same partitions run again (rounds
    /// permitting) with each p99 predicted from the delay the run measured, to check it.
    #[arg(long, default_value_t = 0.15, requires = "verify", value_parser = fraction)]
    pub prediction_tolerance: f64,
    /// --verify: run every workload this many seconds in each verification run instead of its
    /// own duration_s or jobs (the planned file keeps its own). A p99.9 and a 0.1 % timeout
    /// rate rest on one job in a thousand: at 100 Hz, 10 s gives 1000 jobs, 60 s 6000.
    #[arg(long, requires = "verify", value_name = "S", value_parser = seconds_within_a_day)]
    pub verify_duration: Option<f64>,
}

/// `plan --auto --objective`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Objective {
    Spread,
    Pack,
}

/// `plan --auto --phases`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Phases {
    Keep,
    Stagger,
}

pub fn run(args: PlanArgs, engine: &isolane_runtime::exec::Engine) -> anyhow::Result<u8> {
    let file = super::ScenarioFile::read(&args.scenario)?;
    if args.auto {
        if !file.apps()?.is_empty() {
            return Err(user(format!(
                "{}: plan --auto does not plan [[app]]s yet; give their models partitions \
                 and check them with `isolane plan` (docs/apps.md)",
                args.scenario.display()
            )));
        }
        return super::plan_auto::run(&args, &file, engine);
    }
    let (scenario, name) = file.scenario()?;
    // An app's models are admitted as workloads named <app>.<stage>[.<member>] (docs/apps.md).
    let apps = file.apps()?;
    let scenario = if apps.is_empty() {
        scenario
    } else {
        super::app::model_workloads(&scenario, &apps, &name)?
    };
    let device = resolve_device_model(&scenario, args.device_model.as_deref())?;
    let options = AdmissionOptions {
        mps_thread_budget_pct: args.mps_thread_budget,
    };
    let estimates = super::memory_estimates_mib(&scenario);
    let admitted = admission::admit(&scenario, &device, &estimates, &options);
    let file = args.scenario.display().to_string();
    match isolane_report::admission::answer(&file, &device, &admitted, args.json)? {
        (true, text) => println!("{text}"),
        (false, text) if args.json => {
            println!("{text}");
            return Ok(super::EXIT_USER);
        }
        (false, text) => return Err(user(text)),
    }
    Ok(0)
}

/// [`isolane_executors::machine::resolve_device_model`].
pub fn resolve_device_model(
    scenario: &Scenario,
    name: Option<&str>,
) -> anyhow::Result<DeviceModel> {
    isolane_executors::machine::resolve_device_model(scenario, name).map_err(super::machine_error)
}
