//! The studies' runs (`isolane_session::study_runs`) and `plan --auto`'s, with the machine layer
//! (`isolane_executors::machine`) lent to them.

use std::path::Path;

use isolane_core::admission::AdmissionOptions;
use isolane_core::spec::Scenario;
use isolane_session::run_path::Machine;

pub use isolane_session::study_runs::{failure, failure_error, study_error, StudyRuns};

pub use isolane_executors::machine::builtin_names;

/// This machine, as the session's runs ask about it.
pub struct Executors;

impl Machine for Executors {
    fn admit(
        &self,
        scenario: &Scenario,
        name: &str,
        options: &AdmissionOptions,
    ) -> anyhow::Result<Option<isolane_core::admission::Plan>> {
        super::admit_or_refuse_with(scenario, name, options)
    }

    fn memory_estimates(&self, scenario: &Scenario) -> Vec<Option<u64>> {
        super::memory_estimates_mib(scenario)
    }

    fn memory_profiles(
        &self,
        scenario: &Scenario,
        l2_bytes: u64,
    ) -> Vec<Option<isolane_core::predict::MemoryProfile>> {
        isolane_executors::foresee::memory_profiles(scenario, l2_bytes)
    }

    fn busy_host_note(&self, workload: &str, cache_dir: &Path) -> Option<String> {
        use isolane_executors::machine::{busy_host_note, load_average};
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        busy_host_note(workload, load_average(), cores, cache_dir)
    }

    fn builtin_names(&self) -> Vec<&'static str> {
        builtin_names()
    }

    fn foresee(
        &self,
        scenario: &Scenario,
        name: &str,
        say: &mut dyn FnMut(&str),
    ) -> anyhow::Result<()> {
        Ok(isolane_executors::foresee::foresee_or_refuse(
            scenario, name, say,
        )?)
    }
}
