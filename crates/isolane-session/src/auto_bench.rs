//! What `plan --auto`'s loop ([`isolane_planner::auto`]) measures, through the run path
//! ([`crate::run_path`]): a profile run (the workload alone, closed loop, in a partition) and a
//! verification run of the planned scenario, and its events printed as they come. What only
//! the machine layer above this crate knows (admission, memory estimates) comes through
//! [`Machine`].

use std::path::{Path, PathBuf};

use isolane_core::device_model::DeviceModel;
use isolane_core::exit_codes::{Interrupted, EXIT_FAILED, EXIT_USER};
use isolane_core::predict::MemoryProfile;
use isolane_core::spec::{Backend, Scenario};
use isolane_core::user_error::UserError;
use isolane_planner::auto::{
    AutoError, Bench, Config, Ending, Event, Input, Observer, ProfileRun, Stream, Verified,
};
use isolane_planner::Point;
use isolane_runtime::exec::Engine;
use isolane_runtime::RunPlan;

pub use crate::run_path::Machine;
use crate::run_path::{self, Request};

/// What the loop measures, through `isolane run`'s path.
pub struct RunBench<'a> {
    pub machine: &'a dyn Machine,
    pub engine: &'a Engine,
    /// Where profile runs write (a temporary folder).
    pub work: &'a Path,
    /// The profile cache, named by a busy host's note.
    pub cache_dir: PathBuf,
    /// Let the profile runs create MIG instances.
    pub allow_mig_reconfigure: bool,
    /// Use the verification run's folder even if it is not empty.
    pub force: bool,
    /// Where the planned scenario is written (`None`: the loop prints it on stdout).
    pub plan_file: Option<&'a Path>,
}

/// Runs the loop, printing its events, and gives the command's exit code: 0 planned (and,
/// verified, holding), 1 a verified plan that does not hold, 2 no plan.
pub fn run(input: &Input<'_>, config: &Config, bench: &mut RunBench<'_>) -> anyhow::Result<u8> {
    let finish =
        isolane_planner::auto::run(input, config, bench, &mut Printer).map_err(|e| match e {
            AutoError::User(m) => UserError(m).into(),
            // A stop inside a step the loop reports in its own words (a profile): still 130.
            AutoError::Failed(m) if crate::signals::stop_requested() => Interrupted(m).into(),
            AutoError::Failed(m) => anyhow::anyhow!(m),
            AutoError::Bench(e) => e,
        })?;
    Ok(match finish.ending {
        Ending::Planned | Ending::Holds => 0,
        Ending::DoesNotHold => EXIT_FAILED,
        Ending::NoPlan => EXIT_USER,
    })
}

/// An [`Interrupted`] error saying `kept` once Ctrl-C or SIGTERM asked to stop: the plan ends
/// there (exit 130) instead of going on to its next run with what the stopped one measured.
fn stopped(kept: &str) -> anyhow::Result<()> {
    if crate::signals::stop_requested() {
        return Err(Interrupted(format!("interrupted (Ctrl-C or SIGTERM): {kept}")).into());
    }
    Ok(())
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

impl Bench for RunBench<'_> {
    type Error = anyhow::Error;

    fn memory_estimates(&mut self, scenario: &Scenario) -> Vec<Option<u64>> {
        self.machine.memory_estimates(scenario)
    }

    fn memory_profiles(
        &mut self,
        scenario: &Scenario,
        device: &DeviceModel,
    ) -> Vec<Option<MemoryProfile>> {
        let Some(sys) = isolane_core::predict::memory_system(device.name) else {
            return Vec::new();
        };
        self.machine.memory_profiles(scenario, sys.l2_bytes)
    }

    /// The same check `isolane run` makes, on the device planned for.
    fn admit(&mut self, planned: &Scenario, device: &DeviceModel) -> anyhow::Result<()> {
        let estimates = self.machine.memory_estimates(planned);
        isolane_core::admission::admit(planned, device, &estimates, &Default::default())
            .map(drop)
            .map_err(|r| {
                UserError(isolane_report::admission::rejection_text(
                    "the planned scenario",
                    device,
                    &r,
                ))
                .into()
            })
    }

    fn profile(&mut self, run: &ProfileRun<'_>) -> anyhow::Result<Point> {
        stopped("no profile was measured after the stop")?;
        let s = run.scenario;
        let admitted = self
            .machine
            .admit(s, "the profile run", &Default::default())?;
        let plan = RunPlan::from_scenario(s);
        let out = self.work.join(format!("w{}-{}", run.workload, run.size));
        let mut view =
            crate::progress::ProfileProgress::start(&run.what, run.jobs, run.expected_s, false);
        let request = Request {
            command: "plan",
            scenario: s,
            scenario_name: "profile".into(),
            admitted: admitted.as_ref(),
            plan: &plan,
            out: Some(&out),
            force: true,
            quiet: true,
            choices: crate::PartitionChoices {
                allow_mig_reconfigure: self.allow_mig_reconfigure,
                ..Default::default()
            },
            engine: self.engine,
        };
        let m = run_path::measure_with(request, None, &mut view);
        view.finish();
        let m = m?;
        let r = &m.result.workloads[0];
        let name = &s.workloads[0].name;
        stopped(&format!(
            "the profile run of `{name}` was stopped and is not kept; the profiles measured \
             before it are in the cache"
        ))?;
        if let isolane_runtime::WorkloadStatus::Failed(f) = &r.status {
            anyhow::bail!("the profile run of `{name}` failed: {}", f.message);
        }
        if s.device.backend == Backend::Cpu {
            if let Some(note) = self.machine.busy_host_note(name, &self.cache_dir) {
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
        stopped("no verification run was started after the stop")?;
        let admitted = self
            .machine
            .admit(s, "the planned scenario", &Default::default())?;
        let plan = RunPlan::from_scenario(s);
        let m = run_path::measure(Request {
            command: "plan",
            scenario: s,
            scenario_name: "planned".into(),
            admitted: admitted.as_ref(),
            plan: &plan,
            out,
            force: self.force,
            quiet: true,
            choices: Default::default(),
            engine: self.engine,
        })?;
        run_path::write_run_files(&m)?;
        stopped(&format!(
            "the verification run was stopped; what it measured is in {}",
            m.out.display()
        ))?;
        Ok(Verified {
            summary: m.summary,
            dir: m.out,
        })
    }

    /// `-o FILE`, or nowhere (the loop then has it printed on stdout).
    fn write_plan(&mut self, text: &str) -> anyhow::Result<Option<PathBuf>> {
        let Some(p) = self.plan_file else {
            return Ok(None);
        };
        isolane_core::files::write_output(p, text.as_bytes()).map_err(|e| {
            let is_user = e.is_user_error();
            run_path::blame(e, is_user)
        })?;
        Ok(Some(p.to_path_buf()))
    }
}
