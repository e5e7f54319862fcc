//! `isolane plan --auto SCENARIO`: partitions for workloads that have rates and deadlines but
//! none of their own (docs/planner.md). The loop (profile, plan, verify, plan again) is
//! `isolane_planner::auto`'s; this file turns the flags into its configuration, resolves the
//! device, measures what the loop asks for through `isolane run`'s path (a profile run: the
//! workload alone, closed loop, in a partition; a verification run of the planned scenario),
//! writes the planned file and prints the loop's events as they come.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use isolane_core::device_model::DeviceModel;
use isolane_core::spec::{Backend, Scenario};
use isolane_executors::machine;
use isolane_planner::auto::{
    AutoError, Bench, Config, Ending, Event, Observer, ProfileRun, Stream, Verified,
};
use isolane_planner::{Options, Point, ProfileCache};
use isolane_runtime::exec::Engine;
use isolane_runtime::RunPlan;

use super::plan::{Phases, PlanArgs};
use super::user;

pub fn run(args: &PlanArgs, file: &super::ScenarioFile, engine: &Engine) -> anyhow::Result<u8> {
    let (scenario, name) = file.scenario()?;
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
        args,
        engine,
        work: work.path(),
        cache_dir: target.cache().dir().to_path_buf(),
    };
    let input = isolane_planner::auto::Input {
        scenario: &scenario,
        name: &name,
        text: &file.text,
        target: &target,
    };
    let finish = isolane_planner::auto::run(&input, &config, &mut bench, &mut Printer).map_err(
        |e| match e {
            AutoError::User(m) => user(m),
            AutoError::Failed(m) => anyhow::anyhow!(m),
            AutoError::Bench(e) => e,
        },
    )?;
    Ok(match finish.ending {
        Ending::Planned | Ending::Holds => 0,
        Ending::DoesNotHold => super::EXIT_FAILED,
        Ending::NoPlan => super::EXIT_USER,
    })
}

/// Prints each event of the loop where and as `plan --auto` always has: the plan and what it
/// measures on stderr (stdout may be the planned scenario), the rest on stdout.
struct Printer;

impl Observer for Printer {
    fn event(&mut self, event: &Event<'_>) {
        match event.stream() {
            Stream::Stdout => print!("{}", event.text()),
            Stream::Stderr => eprint!("{}", event.text()),
        }
    }
}

/// What the loop measures, through `isolane run`'s path.
struct RunBench<'a> {
    args: &'a PlanArgs,
    engine: &'a Engine,
    /// Where profile runs write (a temporary folder).
    work: &'a Path,
    /// The profile cache, named by a busy host's note.
    cache_dir: PathBuf,
}

impl Bench for RunBench<'_> {
    type Error = anyhow::Error;

    fn memory_estimates(&mut self, scenario: &Scenario) -> Vec<Option<u64>> {
        super::memory_estimates_mib(scenario)
    }

    fn memory_profiles(
        &mut self,
        scenario: &Scenario,
        device: &DeviceModel,
    ) -> Vec<Option<isolane_core::predict::MemoryProfile>> {
        let Some(sys) = isolane_core::predict::memory_system(device.name) else {
            return Vec::new();
        };
        isolane_executors::foresee::memory_profiles(scenario, sys.l2_bytes)
    }

    /// The same check `isolane run` makes, on the device planned for.
    fn admit(&mut self, planned: &Scenario, device: &DeviceModel) -> anyhow::Result<()> {
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

    fn profile(&mut self, run: &ProfileRun<'_>) -> anyhow::Result<Point> {
        let s = run.scenario;
        let admitted = super::admit_or_refuse(s, "the profile run")?;
        let plan = RunPlan::from_scenario(s);
        let out = self.work.join(format!("w{}-{}", run.workload, run.size));
        let mut view = isolane_session::progress::ProfileProgress::start(
            &run.what,
            run.jobs,
            run.expected_s,
            false,
        );
        let request = super::run::Request {
            command: "plan",
            scenario: s,
            scenario_name: "profile".into(),
            admitted: admitted.as_ref(),
            plan: &plan,
            out: Some(&out),
            force: true,
            quiet: true,
            partitions: &super::PartitionFlags {
                allow_mig_reconfigure: self.args.allow_mig_reconfigure,
                ..Default::default()
            },
            engine: self.engine,
        };
        let m = super::run::measure_with(request, None, &mut view);
        view.finish();
        let m = m?;
        let r = &m.result.workloads[0];
        let name = &s.workloads[0].name;
        if let isolane_runtime::WorkloadStatus::Failed(f) = &r.status {
            anyhow::bail!("the profile run of `{name}` failed: {}", f.message);
        }
        if s.device.backend == Backend::Cpu {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            if let Some(note) =
                machine::busy_host_note(name, machine::load_average(), cores, &self.cache_dir)
            {
                eprintln!("{note}");
            }
        }
        let t = isolane_core::metrics::exec_times(&r.records);
        let (Some(p50), Some(p99), Some(mean)) = (t.p50, t.p99, t.mean) else {
            anyhow::bail!("the profile run of `{name}` completed no job");
        };
        Ok(Point {
            size: run.size,
            exec_p50_ms: p50,
            exec_p99_ms: p99,
            exec_mean_ms: mean,
            exec_p999_ms: t.p999,
        })
    }

    /// Runs the planned scenario once in `out` (default: a new runs/ folder) and keeps its
    /// files there.
    fn verify(&mut self, s: &Scenario, out: Option<&Path>) -> anyhow::Result<Verified> {
        let admitted = super::admit_or_refuse(s, "the planned scenario")?;
        let plan = RunPlan::from_scenario(s);
        let m = super::run::measure(super::run::Request {
            command: "plan",
            scenario: s,
            scenario_name: "planned".into(),
            admitted: admitted.as_ref(),
            plan: &plan,
            out,
            force: self.args.force,
            quiet: true,
            partitions: &super::PartitionFlags::default(),
            engine: self.engine,
        })?;
        super::run::write_run_files(&m)?;
        Ok(Verified {
            summary: m.summary,
            dir: m.out,
        })
    }

    /// `-o FILE`, or nowhere (the loop then has it printed on stdout).
    fn write_plan(&mut self, text: &str) -> anyhow::Result<Option<PathBuf>> {
        let Some(p) = self.args.out.as_deref() else {
            return Ok(None);
        };
        super::write_output(p, text.as_bytes())?;
        Ok(Some(p.to_path_buf()))
    }
}
