//! `isolane plan --auto SCENARIO`: partitions for workloads that have rates and deadlines but
//! none of their own (docs/planner.md). The loop (profile, plan, verify, plan again) is
//! `isolane_planner::auto`'s, what it measures `isolane_session::auto_bench`'s; this file turns
//! the flags into their configuration, resolves the device and lends the machine layer
//! (admission, memory estimates).

use std::time::Duration;

use anyhow::Context as _;
use isolane_core::spec::Backend;
use isolane_planner::auto::Config;
use isolane_planner::{Options, ProfileCache};
use isolane_runtime::exec::Engine;
use isolane_session::auto_bench::RunBench;

use super::plan::{Phases, PlanArgs};
use super::user;

pub fn run(args: &PlanArgs, file: &super::ScenarioFile, engine: &Engine) -> anyhow::Result<u8> {
    let (scenario, name) = file.scenario()?;
    if let Some(out) = &args.out {
        let input = [("the scenario", args.scenario.as_path())];
        isolane_core::files::refuse_input_as_output("-o", out, &input).map_err(|e| blame!(e))?;
        // Before the profiles are measured (minutes on a GPU), not after.
        isolane_core::files::check_output(out).map_err(|e| blame!(e))?;
    }
    if let Some(dir) = &args.export_profiles {
        isolane_planner::auto::check_export_dir(dir).map_err(user)?;
    }
    super::refuse_programs(&scenario, &name, "plan --auto")?;
    super::refuse_mixed_backends(&scenario, &name, "plan --auto")?;
    // A workload that cannot be planned is said before the device is looked for.
    isolane_planner::auto::demands(&scenario, &name).map_err(user)?;
    let cache_dir = (args.profiles.clone())
        .or_else(|| args.profile_cache.clone())
        .unwrap_or_else(ProfileCache::default_dir);
    let target = isolane_executors::machine::plan_target(
        &scenario,
        &args.scenario,
        args.device_model.as_deref(),
        cache_dir,
        args.driver.as_deref(),
        &mut |line| eprintln!("{line}"),
    )
    .map_err(super::machine_error)?;
    let config = Config {
        options: Options {
            margin: args.margin,
            stretch: args.stretch,
            max_util: args.max_util,
            objective: match args.objective {
                super::plan::Objective::Spread => isolane_planner::Objective::Spread,
                super::plan::Objective::Pack => isolane_planner::Objective::Pack,
            },
        },
        mechanism: args.mechanism.clone(),
        stretch_from: args.stretch_from.clone(),
        profile_jobs: args.profile_jobs,
        profile_budget: args.profile_budget.map(Duration::from_secs_f64),
        allow_mig_reconfigure: args.allow_mig_reconfigure,
        phases: match args.phases {
            Phases::Keep => isolane_planner::auto::Phases::Keep,
            Phases::Stagger => isolane_planner::auto::Phases::Stagger,
        },
        export_profiles: args.export_profiles.clone(),
        verify: args.verify,
        verify_out: args.verify_out.clone(),
        verify_duration: args.verify_duration,
        rounds: args.rounds,
        prediction_tolerance: args.prediction_tolerance,
        // A profile of another revision of the cuda engine is measured again.
        engine_revision: (scenario.device.backend == Backend::Cuda)
            .then_some(isolane_cuda::ENGINE_REVISION),
        predict: !args.no_predict,
    };
    let work = tempfile::tempdir().context("a folder for the profile runs")?;
    let mut bench = RunBench {
        machine: &super::studies::Executors,
        engine,
        work: work.path(),
        cache_dir: target.cache().dir().to_path_buf(),
        allow_mig_reconfigure: args.allow_mig_reconfigure,
        force: args.force,
        plan_file: args.out.as_deref(),
    };
    let input = isolane_planner::auto::Input {
        scenario: &scenario,
        name: &name,
        text: &file.text,
        target: &target,
    };
    isolane_session::auto_bench::run(&input, &config, &mut bench)
}
