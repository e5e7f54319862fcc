//! `isolane isolation`'s run (docs/isolation.md): the scenario checked, then one continuous run
//! by the run path ([`crate::run_path`]) in which the victims keep their rate while the
//! interferers step through their ramp, each victim job attributed to the step it was released
//! in; isolation.csv, summary.json's `steps` and the run's files written. The binary turns its
//! flags into an [`IsolationRun`] and calls [`check`], then [`run`].

use std::path::Path;
use std::sync::Arc;

use isolane_core::admission::Plan;
use isolane_core::results::IsolationSteps;
use isolane_core::spec::Scenario;
use isolane_core::user_error::UserError;
use isolane_metrics::RunMetrics;
use isolane_runtime::coordinator::RunPlan;
use isolane_runtime::exec::Engine;
use isolane_runtime::isolation::{self, StepGrid};
use isolane_runtime::output;

use crate::run_path::{self, Machine, Measured, Request};
use crate::PartitionChoices;

/// A scenario `isolation` can run: admitted, its victims and interferers planned.
pub struct Checked {
    admitted: Option<Plan>,
    plan: RunPlan,
    grid: StepGrid,
}

/// `isolane isolation`'s flags, as configuration.
pub struct IsolationRun<'a> {
    pub machine: &'a dyn Machine,
    /// The run folder. Default: a new runs/<YYYYmmdd-HHMMSS> under the current directory.
    pub out: Option<&'a Path>,
    pub force: bool,
    /// No progress bar.
    pub quiet: bool,
    pub choices: PartitionChoices,
    pub engine: &'a Engine,
}

/// What the experiment measured, its files written.
pub struct Isolated {
    pub measured: Measured,
    /// The table of each step and victim (isolation.csv's rows), to print.
    pub steps_table: String,
}

/// Everything refused before anything is served or written (the user's, exit 2): a command
/// workload, several GPUs, admission, a scenario without victims or interferers, or whose
/// interferers' ramps differ.
pub fn check(
    scenario: &Scenario,
    scenario_name: &str,
    machine: &dyn Machine,
) -> anyhow::Result<Checked> {
    crate::checks::refuse_programs(scenario, scenario_name, "isolation").map_err(UserError)?;
    crate::checks::refuse_several_gpus(scenario, scenario_name, "isolation").map_err(UserError)?;
    let admitted = machine.admit(scenario, scenario_name, &Default::default())?;
    let (plan, grid) = isolation::plan(scenario).map_err(|e| UserError(e.to_string()))?;
    Ok(Checked {
        admitted,
        plan,
        grid,
    })
}

/// Runs the checked experiment, feeding `metrics` (`--metrics-addr`) while it goes on, and
/// writes isolation.csv, then the run's files with summary.json's `steps` last.
pub fn run(
    scenario: &Scenario,
    scenario_name: String,
    checked: Checked,
    r: &IsolationRun<'_>,
    metrics: Option<&Arc<RunMetrics>>,
) -> anyhow::Result<Isolated> {
    let mut m = run_path::measure_observed(
        Request {
            command: "isolation",
            scenario,
            scenario_name,
            admitted: checked.admitted.as_ref(),
            plan: &checked.plan,
            out: r.out,
            force: r.force,
            quiet: r.quiet,
            choices: r.choices,
            engine: r.engine,
        },
        metrics,
    )?;
    let steps = isolation::per_step(&checked.plan, checked.grid, &m.result);
    output::write_atomic(
        &m.out.join("isolation.csv"),
        isolane_core::results::isolation_csv(&steps).as_bytes(),
    )?;
    let steps_table = isolane_report::run_text::steps_table(&steps);
    m.summary.isolation = Some(IsolationSteps {
        step_s: checked.grid.step_s,
        steps,
    });
    run_path::write_run_files(&m)?;
    Ok(Isolated {
        measured: m,
        steps_table,
    })
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    /// This machine as the checks see it: admission counted, nothing else asked.
    struct Counting(Cell<usize>);

    impl Machine for Counting {
        fn admit(
            &self,
            _: &Scenario,
            _: &str,
            _: &isolane_core::admission::AdmissionOptions,
        ) -> anyhow::Result<Option<Plan>> {
            self.0.set(self.0.get() + 1);
            Ok(None)
        }
        fn memory_estimates(&self, _: &Scenario) -> Vec<Option<u64>> {
            Vec::new()
        }
        fn memory_profiles(
            &self,
            _: &Scenario,
            _: u64,
        ) -> Vec<Option<isolane_core::predict::MemoryProfile>> {
            Vec::new()
        }
        fn busy_host_note(&self, _: &str, _: &Path) -> Option<String> {
            None
        }
        fn builtin_names(&self) -> Vec<&'static str> {
            Vec::new()
        }
        fn foresee(&self, _: &Scenario, _: &str, _: &mut dyn FnMut(&str)) -> anyhow::Result<()> {
            Ok(())
        }
    }

    fn scenario(workloads: &str) -> Scenario {
        Scenario::from_toml_str(
            &format!("[device]\nbackend = \"cpu\"\n\n{workloads}"),
            "iso.toml",
            &Vec::<String>::new(),
        )
        .unwrap_or_else(|e| panic!("{e}"))
    }

    const VICTIM: &str =
        "[[workload]]\nname = \"v\"\nrole = \"victim\"\nmodel = \"spin:1ms\"\nrate_hz = 100\n\
         duration_s = 1\n\n";
    const INTERFERER: &str = "[[workload]]\nname = \"i\"\nrole = \"interferer\"\n\
         model = \"spin:1ms\"\nramp = { from_hz = 10, to_hz = 50, steps = 3, step_s = 0.5 }\n\n";

    fn users(e: anyhow::Error) -> String {
        assert!(
            e.chain().any(|c| c.downcast_ref::<UserError>().is_some()),
            "not the user's: {e:#}"
        );
        e.to_string()
    }

    /// The binary's isolation.rs did these checks itself; now each refusal is the library's,
    /// still the user's (exit 2) and worded as before, and made before admission or a run.
    #[test]
    fn what_isolation_refuses_is_the_users_and_said_before_admission() {
        let machine = Counting(Cell::new(0));
        let program = "[[workload]]\nname = \"p\"\ncommand = [\"true\"]\n\n";
        let said = users(
            check(
                &scenario(&format!("{VICTIM}{INTERFERER}{program}")),
                "iso.toml",
                &machine,
            )
            .err()
            .unwrap(),
        );
        assert!(
            said.starts_with("iso.toml: workload `p` is a command workload"),
            "{said}"
        );
        assert_eq!(machine.0.get(), 0);
        let said = users(
            check(&scenario(VICTIM), "iso.toml", &machine)
                .err()
                .unwrap(),
        );
        assert_eq!(said, isolation::IsolationError::NoInterferer.to_string());
        assert_eq!(machine.0.get(), 1, "admitted, then planned");

        let ok = check(
            &scenario(&format!("{VICTIM}{INTERFERER}")),
            "iso.toml",
            &machine,
        )
        .unwrap();
        assert_eq!(ok.plan.workloads.len(), 2);
        assert_eq!(ok.grid.step_s, 0.5);
        assert!(ok.admitted.is_none());
    }
}
