//! Live metrics of a run (`--metrics-addr`): the run's workloads and partitions announced to
//! the caller's [`RunMetrics`], its records and telemetry readings passed on from the
//! threads that already have them (the jobs writer, the sampler), never a release loop.

use std::sync::Arc;

use isolane_core::admission::{Plan, ResolvedPartition};
use isolane_core::spec::{Backend, Host, Scenario};
use isolane_core::JobRecord;
use isolane_metrics::{RunMetrics, WorkloadInfo};
use isolane_runtime::jobs_stream::RecordObserver;
use isolane_telemetry::SampleHook;

/// The live metrics of a command's runs and the endpoint serving them (`--metrics-addr`);
/// the endpoint stops when this is dropped, at the command's end.
pub struct LiveMetrics {
    pub metrics: Arc<RunMetrics>,
    server: isolane_metrics::MetricsServer,
}

impl LiveMetrics {
    /// Starts serving at `addr` (HOST:PORT; port 0 picks a free one) before anything runs.
    pub fn serve(addr: &str) -> Result<LiveMetrics, isolane_metrics::ServeError> {
        let metrics = Arc::new(RunMetrics::new());
        let server = isolane_metrics::serve(addr, Arc::clone(&metrics))?;
        Ok(LiveMetrics { metrics, server })
    }

    /// Where it serves (the port picked when 0 was asked for).
    pub fn addr(&self) -> std::net::SocketAddr {
        self.server.addr()
    }
}

/// The runtime's observer, feeding the metrics.
struct Observer(Arc<RunMetrics>);

impl RecordObserver for Observer {
    fn records(&self, slot: usize, records: &[JobRecord]) {
        self.0.observe(slot, records);
    }
}

/// Announces the run to `metrics` and returns the record observer and telemetry hook that
/// feed it.
pub fn begin(
    metrics: &Arc<RunMetrics>,
    command: &str,
    scenario_name: &str,
    scenario: &Scenario,
    admitted: Option<&Plan>,
    workload_names: &[String],
) -> (Arc<dyn RecordObserver>, SampleHook) {
    let infos: Vec<WorkloadInfo> = workload_names
        .iter()
        .map(|name| {
            let spec = scenario.workloads.iter().find(|w| &w.name == name);
            let resolved = admitted
                .and_then(|p| p.workloads.iter().find(|a| &a.workload == name))
                .map(|a| &a.partition);
            WorkloadInfo {
                name: name.clone(),
                mechanism: scenario.device.mechanism.name().into(),
                partition: partition_words(scenario.device.backend, resolved),
                host: match spec.map(|s| s.host) {
                    Some(Host::Process) => "process".into(),
                    _ => "thread".into(),
                },
            }
        })
        .collect();
    metrics.begin_run(command, scenario_name, &infos);
    let m = Arc::clone(metrics);
    let hook: SampleHook = Arc::new(move |r| m.observe_device(r));
    (Arc::new(Observer(Arc::clone(metrics))), hook)
}

/// A partition in the words summary.json's `partitions` uses.
pub fn partition_words(backend: Backend, p: Option<&ResolvedPartition>) -> String {
    match (backend, p) {
        (Backend::Cpu, _) | (_, Some(ResolvedPartition::Cpu)) => "cpu".into(),
        (_, None | Some(ResolvedPartition::Whole)) => "whole GPU".into(),
        (_, Some(ResolvedPartition::Green { sms, .. })) => format!("green {sms} SMs"),
        (_, Some(ResolvedPartition::Mps { thread_pct, .. })) => format!("mps {thread_pct}%"),
        (_, Some(ResolvedPartition::Mig { profile, .. })) => format!("mig {profile}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_are_named_as_summary_json_names_them() {
        let g = ResolvedPartition::Green {
            group: 0,
            sms: 64,
            first_sm: 0,
        };
        assert_eq!(partition_words(Backend::Cuda, Some(&g)), "green 64 SMs");
        let m = ResolvedPartition::Mps {
            thread_pct: 50,
            mem_limit_mib: None,
        };
        assert_eq!(partition_words(Backend::Cuda, Some(&m)), "mps 50%");
        assert_eq!(partition_words(Backend::Cuda, None), "whole GPU");
        assert_eq!(partition_words(Backend::Cpu, None), "cpu");
    }
}
