//! The server's Prometheus families, per served model (`GET /metrics` on the HTTP address;
//! docs/serve.md lists them). Updated by submitters and model threads; the scrape encodes the
//! registry on the HTTP server's runtime, never on a model thread.

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

use crate::request::Stage;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModelLabels {
    pub model: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RejectionLabels {
    pub model: String,
    /// [`crate::Refusal::reason`].
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct InfoLabels {
    pub model: String,
    pub backend: String,
    pub partition: String,
    pub criticality: String,
}

fn latency_histogram() -> Histogram {
    // 20 µs to about 5 s.
    Histogram::new(exponential_buckets(20e-6, 2.0, 19))
}

/// A change's time, from its request to the new instance serving, and its pause (1 µs to
/// about 65 s: a rebuilt model on a busy machine takes seconds).
fn change_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1e-6, 2.0, 27))
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ChangeLabels {
    pub model: String,
    /// `resize`, `reload`, `load`, `unload`, `settings` (deadline or criticality only).
    pub kind: String,
}

fn rows_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1.0, 2.0, 11))
}

/// Every family of the server.
pub struct ServeMetrics {
    registry: Registry,
    requests: Family<ModelLabels, Counter>,
    rejections: Family<RejectionLabels, Counter>,
    queue_length: Family<ModelLabels, Gauge>,
    latency: Family<ModelLabels, Histogram, fn() -> Histogram>,
    queue_time: Family<ModelLabels, Histogram, fn() -> Histogram>,
    late: Family<ModelLabels, Counter>,
    jobs: Family<ModelLabels, Counter>,
    job_rows: Family<ModelLabels, Histogram, fn() -> Histogram>,
    held: Family<ModelLabels, Counter<f64, AtomicU64>>,
    info: Family<InfoLabels, Gauge>,
    partition_sms: Family<ModelLabels, Gauge>,
    ready: Family<ModelLabels, Gauge>,
    changes: Family<ChangeLabels, Counter>,
    change_time: Family<ChangeLabels, Histogram, fn() -> Histogram>,
    change_pause: Family<ChangeLabels, Histogram, fn() -> Histogram>,
    autoplan: Family<AutoplanLabels, Counter>,
    unplannable: Counter,
    /// The jobs of the workloads released beside the models (`serve --release`), in run's
    /// families under `isolane_serve_released_` (released.rs feeds them).
    released: isolane_metrics::JobMeters,
    capped: Family<ModelLabels, Counter>,
    /// The names not served that have a `rejections_total` series of their own (at most
    /// [`UNKNOWN_NAMES`]): a client's every misspelling would otherwise be a series for good.
    unknown_names: std::sync::Mutex<std::collections::HashSet<String>>,
}

/// How many names that are not served get a series of their own in `rejections_total`
/// (`reason="unknown_model"`); requests for any further name are counted under `model=""`.
pub const UNKNOWN_NAMES: usize = 16;

/// A decision of `serve --autoplan` (autoplan.rs).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AutoplanLabels {
    /// What triggered it: `critical_p99`, `load_change`.
    pub reason: String,
    /// `resize`, `keep`, `unplannable`, `failed`.
    pub action: String,
}

impl Default for ServeMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl ServeMetrics {
    pub fn new() -> ServeMetrics {
        let mut registry = Registry::with_prefix("isolane_serve");
        let m = ServeMetrics {
            requests: Family::default(),
            rejections: Family::default(),
            queue_length: Family::default(),
            latency: Family::new_with_constructor(latency_histogram),
            queue_time: Family::new_with_constructor(latency_histogram),
            late: Family::default(),
            jobs: Family::default(),
            job_rows: Family::new_with_constructor(rows_histogram),
            held: Family::default(),
            info: Family::default(),
            partition_sms: Family::default(),
            ready: Family::default(),
            changes: Family::default(),
            change_time: Family::new_with_constructor(change_histogram),
            change_pause: Family::new_with_constructor(change_histogram),
            autoplan: Family::default(),
            unplannable: Counter::default(),
            released: isolane_metrics::JobMeters::new(),
            capped: Family::default(),
            unknown_names: Default::default(),
            registry: Registry::default(),
        };
        registry.register(
            "requests",
            "Inference requests received, taken or not",
            m.requests.clone(),
        );
        registry.register(
            "rejections",
            "Requests refused or not answered, by reason (deadline, queue_full, dropped, unloaded, \
             draining, bad_request, unknown_model, failed)",
            m.rejections.clone(),
        );
        registry.register(
            "queue_length",
            "Requests waiting for a job",
            m.queue_length.clone(),
        );
        registry.register_with_unit(
            "latency",
            "From a request's arrival to its answer",
            Unit::Seconds,
            m.latency.clone(),
        );
        registry.register_with_unit(
            "queue",
            "From a request's arrival to its job taking it from the queue",
            Unit::Seconds,
            m.queue_time.clone(),
        );
        registry.register(
            "late",
            "Requests answered after their deadline (marked late = true)",
            m.late.clone(),
        );
        registry.register(
            "jobs",
            "Jobs run (one or a batch of requests)",
            m.jobs.clone(),
        );
        registry.register(
            "job_rows",
            "Rows per job (the requests' batch dimensions, summed)",
            m.job_rows.clone(),
        );
        registry.register_with_unit(
            "guard_held",
            "Time best-effort jobs were held by the criticality guard",
            Unit::Seconds,
            m.held.clone(),
        );
        registry.register(
            "model_info",
            "A served model and its partition",
            m.info.clone(),
        );
        registry.register(
            "partition_sms",
            "SMs of a model's green partition",
            m.partition_sms.clone(),
        );
        registry.register(
            "model_ready",
            "1 while a model is loaded and takes requests, 0 once unloaded",
            m.ready.clone(),
        );
        registry.register(
            "changes",
            "Changes made to a model while serving, by kind (resize, reload, load, unload, \
             settings)",
            m.changes.clone(),
        );
        registry.register_with_unit(
            "change",
            "From a change's request to the model's new instance serving",
            Unit::Seconds,
            m.change_time.clone(),
        );
        registry.register_with_unit(
            "change_pause",
            "Time a change left its model serving nothing (the old instance's last job to the \
             new instance free to take one)",
            Unit::Seconds,
            m.change_pause.clone(),
        );
        registry.register(
            "autoplan_decisions",
            "Re-plans of serve --autoplan, by what triggered them (critical_p99, load_change) \
             and what was done (resize, keep, unplannable, failed)",
            m.autoplan.clone(),
        );
        registry.register(
            "autoplan_unplannable",
            "Re-plans of serve --autoplan that found no plan (nothing was changed)",
            m.unplannable.clone(),
        );
        registry.register(
            "autoplan_best_effort_capped",
            "Plans of serve --autoplan that gave a best-effort model less than its load needs \
             (what the critical models leave), by model",
            m.capped.clone(),
        );
        m.released
            .register(registry.sub_registry_with_prefix("released"));
        ServeMetrics { registry, ..m }
    }

    /// A re-plan of serve --autoplan: what triggered it and what was done.
    pub fn autoplan_decision(&self, reason: &str, action: &str) {
        self.autoplan
            .get_or_create(&AutoplanLabels {
                reason: reason.to_string(),
                action: action.to_string(),
            })
            .inc();
    }

    /// A re-plan that found no plan.
    pub fn autoplan_unplannable(&self) {
        self.unplannable.inc();
    }

    /// A plan that gave best-effort `model` less than its load needs.
    pub fn autoplan_capped(&self, model: &str) {
        self.capped
            .get_or_create(&ModelLabels {
                model: model.to_string(),
            })
            .inc();
    }

    /// The released workloads' job families.
    pub fn released(&self) -> &isolane_metrics::JobMeters {
        &self.released
    }

    /// The figures of one model, for its submitters and thread.
    pub fn model(
        self: &Arc<Self>,
        name: &str,
        info: (&str, &str, &str),
        sms: Option<u32>,
    ) -> Arc<ModelStats> {
        let labels = ModelLabels {
            model: name.to_string(),
        };
        let (backend, partition, criticality) = info;
        self.info
            .get_or_create(&InfoLabels {
                model: name.to_string(),
                backend: backend.to_string(),
                partition: partition.to_string(),
                criticality: criticality.to_string(),
            })
            .set(1);
        if let Some(sms) = sms {
            self.partition_sms.get_or_create(&labels).set(sms.into());
        }
        self.ready.get_or_create(&labels).set(1);
        // Created now so that a scrape lists every model from the start.
        let _ = self.requests.get_or_create(&labels);
        let _ = self.late.get_or_create(&labels);
        let _ = self.queue_length.get_or_create(&labels);
        Arc::new(ModelStats {
            metrics: Arc::clone(self),
            info: std::sync::Mutex::new(InfoLabels {
                model: name.to_string(),
                backend: backend.to_string(),
                partition: partition.to_string(),
                criticality: criticality.to_string(),
            }),
            labels,
            totals: Totals::default(),
        })
    }

    /// A request for a model that is not served.
    pub fn unknown_model(&self, name: &str) {
        let name: String = name.chars().take(64).collect();
        let model = {
            let mut names = self.unknown_names.lock().unwrap_or_else(|e| e.into_inner());
            if names.contains(&name) || names.len() < UNKNOWN_NAMES {
                names.insert(name.clone());
                name
            } else {
                String::new()
            }
        };
        self.rejections
            .get_or_create(&RejectionLabels {
                model,
                reason: "unknown_model".into(),
            })
            .inc();
    }

    /// The exposition text.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }
}

/// One model's handle on the families, and its counters for the statistics extension.
pub struct ModelStats {
    metrics: Arc<ServeMetrics>,
    labels: ModelLabels,
    /// The labels of its `model_info` now (a change replaces them).
    info: std::sync::Mutex<InfoLabels>,
    pub(crate) totals: Totals,
}

/// A count and the time it took in all (ns), as Triton's statistics extension reports them.
#[derive(Default)]
pub(crate) struct Timed {
    count: AtomicU64,
    ns: AtomicU64,
}

impl Timed {
    fn add(&self, n: u64, ns: i64) {
        self.count.fetch_add(n, Relaxed);
        self.ns.fetch_add(ns.max(0) as u64, Relaxed);
    }

    fn read(&self) -> StatDuration {
        StatDuration {
            count: self.count.load(Relaxed),
            ns: self.ns.load(Relaxed),
        }
    }
}

/// The statistics extension's counters of one model (since the server started).
#[derive(Default)]
pub(crate) struct Totals {
    success: Timed,
    fail: Timed,
    queue: Timed,
    compute_input: Timed,
    compute_infer: Timed,
    compute_output: Timed,
    /// Rows inferred, jobs run, the last answer (ms since the Unix epoch).
    inferences: AtomicU64,
    executions: AtomicU64,
    last_ms: AtomicU64,
    /// Each front end's answered requests, per stage ([`Protocol`], [`Stage`]).
    stages: [[Timed; Stage::ALL.len()]; 3],
    /// Jobs by their batch size (rows): each one's input, infer and output time (`batch_stats`).
    batches: std::sync::Mutex<std::collections::BTreeMap<u64, [StatDuration; 3]>>,
}

/// The front end a request came through, as the stage breakdown names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Grpc,
    Http,
    /// gRPC's `ModelStreamInfer`: a request has no header of its own, so its `receive` is 0.
    GrpcStream,
}

impl Protocol {
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Grpc => "grpc",
            Protocol::Http => "http",
            Protocol::GrpcStream => "grpc-stream",
        }
    }
}

/// One front end's requests in one stage: how many, and their time in it in all.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct StageStatistics {
    pub protocol: &'static str,
    pub stage: &'static str,
    pub count: u64,
    pub ns: u64,
}

/// A count and its total time, in Triton's JSON (`{"count": N, "ns": T}`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct StatDuration {
    pub count: u64,
    pub ns: u64,
}

/// One batch size's jobs (`batch_stats`, Triton's `InferBatchStatistics`): how many ran with
/// `batch_size` rows, and their input, infer and output time in all.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct BatchStatistics {
    pub batch_size: u64,
    pub compute_input: StatDuration,
    pub compute_infer: StatDuration,
    pub compute_output: StatDuration,
}

/// One model's `inference_stats`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct InferenceStats {
    pub success: StatDuration,
    pub fail: StatDuration,
    pub queue: StatDuration,
    pub compute_input: StatDuration,
    pub compute_infer: StatDuration,
    pub compute_output: StatDuration,
    pub cache_hit: StatDuration,
    pub cache_miss: StatDuration,
}

/// One entry of `GET /v2/models[/NAME]/stats` (`model_stats`), Triton's statistics extension.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct ModelStatistics {
    pub name: String,
    pub version: String,
    pub last_inference: u64,
    pub inference_count: u64,
    pub execution_count: u64,
    pub inference_stats: InferenceStats,
    /// By batch size, ascending; what gRPC answers carry too.
    pub batch_stats: Vec<BatchStatistics>,
    /// isolane's own field: where answered requests' time went per front end and stage
    /// (docs/serve.md); clients that do not know it skip it, and the gRPC message has no place
    /// for it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub isolane_stages: Vec<StageStatistics>,
}

impl ModelStats {
    /// The model's partition or criticality changed: `model_info` lists it with its new
    /// labels only, and `partition_sms` has its new size (none: removed).
    pub fn describe(&self, (partition, criticality): (&str, &str), sms: Option<u32>) {
        let mut info = self.info.lock().unwrap_or_else(|p| p.into_inner());
        self.metrics.info.remove(&info);
        info.partition = partition.to_string();
        info.criticality = criticality.to_string();
        self.metrics.info.get_or_create(&info).set(1);
        match sms {
            Some(n) => {
                self.metrics
                    .partition_sms
                    .get_or_create(&self.labels)
                    .set(n.into());
            }
            None => {
                self.metrics.partition_sms.remove(&self.labels);
            }
        }
    }

    pub fn set_ready(&self, ready: bool) {
        self.metrics
            .ready
            .get_or_create(&self.labels)
            .set(i64::from(ready));
    }

    /// A change of `kind` took `took_ns` from its request to the new instance serving, and
    /// left the model serving nothing for `pause_ns` (none when nothing served before).
    pub fn changed(&self, kind: &str, took_ns: i64, pause_ns: Option<i64>) {
        let labels = ChangeLabels {
            model: self.labels.model.clone(),
            kind: kind.to_string(),
        };
        self.metrics.changes.get_or_create(&labels).inc();
        self.metrics
            .change_time
            .get_or_create(&labels)
            .observe(took_ns.max(0) as f64 / 1e9);
        if let Some(p) = pause_ns {
            self.metrics
                .change_pause
                .get_or_create(&labels)
                .observe(p.max(0) as f64 / 1e9);
        }
    }

    pub fn received(&self) {
        self.metrics.requests.get_or_create(&self.labels).inc();
    }

    pub fn rejected(&self, reason: &str) {
        self.metrics
            .rejections
            .get_or_create(&RejectionLabels {
                model: self.labels.model.clone(),
                reason: reason.to_string(),
            })
            .inc();
    }

    pub fn queue_length(&self, n: usize) {
        self.metrics
            .queue_length
            .get_or_create(&self.labels)
            .set(n as i64);
    }

    pub fn job(&self, rows: usize, held_ns: i64) {
        self.totals.executions.fetch_add(1, Relaxed);
        self.metrics.jobs.get_or_create(&self.labels).inc();
        self.metrics
            .job_rows
            .get_or_create(&self.labels)
            .observe(rows as f64);
        if held_ns > 0 {
            self.metrics
                .held
                .get_or_create(&self.labels)
                .inc_by(held_ns as f64 / 1e9);
        }
    }

    /// A job's three phases: its inputs copied in, the model run, the outputs copied out;
    /// `(requests, rows)`: the requests it answered and their rows (its batch size).
    pub fn phases(
        &self,
        (requests, rows): (u64, u64),
        input_ns: i64,
        infer_ns: i64,
        output_ns: i64,
    ) {
        let t = &self.totals;
        t.compute_input.add(requests, input_ns);
        t.compute_infer.add(requests, infer_ns);
        t.compute_output.add(requests, output_ns);
        let mut batches = t.batches.lock().unwrap_or_else(|p| p.into_inner());
        let b = batches.entry(rows).or_default();
        for (d, ns) in b.iter_mut().zip([input_ns, infer_ns, output_ns]) {
            d.count += 1;
            d.ns += ns.max(0) as u64;
        }
    }

    /// A request that got an error after it was taken.
    pub fn failed(&self, latency_ns: i64) {
        self.totals.fail.add(1, latency_ns);
    }

    /// The statistics extension's view of this model.
    pub fn statistics(&self, name: &str) -> ModelStatistics {
        let t = &self.totals;
        ModelStatistics {
            name: name.to_string(),
            version: "1".into(),
            last_inference: t.last_ms.load(Relaxed),
            inference_count: t.inferences.load(Relaxed),
            execution_count: t.executions.load(Relaxed),
            inference_stats: InferenceStats {
                success: t.success.read(),
                fail: t.fail.read(),
                queue: t.queue.read(),
                compute_input: t.compute_input.read(),
                compute_infer: t.compute_infer.read(),
                compute_output: t.compute_output.read(),
                ..Default::default()
            },
            batch_stats: t
                .batches
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .map(|(&batch_size, &[input, infer, output])| BatchStatistics {
                    batch_size,
                    compute_input: input,
                    compute_infer: infer,
                    compute_output: output,
                })
                .collect(),
            isolane_stages: [Protocol::Grpc, Protocol::Http, Protocol::GrpcStream]
                .into_iter()
                .flat_map(|p| {
                    Stage::ALL.iter().map(move |&s| {
                        let d = t.stages[p as usize][s as usize].read();
                        StageStatistics {
                            protocol: p.name(),
                            stage: s.name(),
                            count: d.count,
                            ns: d.ns,
                        }
                    })
                })
                .filter(|s| s.count > 0)
                .collect(),
        }
    }

    /// An answered request's time per stage ([`crate::request::FrontStamps::stages`]), through `protocol`.
    pub fn stages(&self, protocol: Protocol, ns: &[i64; Stage::ALL.len()]) {
        for (timed, &n) in self.totals.stages[protocol as usize].iter().zip(ns) {
            timed.add(1, n);
        }
    }

    pub fn answered(&self, latency_ns: i64, late: bool, queued_ns: i64, rows: usize) {
        let t = &self.totals;
        t.success.add(1, latency_ns);
        t.queue.add(1, queued_ns);
        t.inferences.fetch_add(rows as u64, Relaxed);
        let epoch_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        t.last_ms.store(epoch_ms, Relaxed);
        self.metrics
            .latency
            .get_or_create(&self.labels)
            .observe(latency_ns as f64 / 1e9);
        self.metrics
            .queue_time
            .get_or_create(&self.labels)
            .observe(queued_ns as f64 / 1e9);
        if late {
            self.metrics.late.get_or_create(&self.labels).inc();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client asking for ever new model names adds no series past the first
    /// [`UNKNOWN_NAMES`]: before, each name was a series of its own for good, and 2000
    /// misspellings grew the exposition from 11 KB to 150 KB.
    #[test]
    fn requests_for_unknown_names_add_a_bounded_number_of_series() {
        let m = ServeMetrics::new();
        for i in 0..1000 {
            m.unknown_model(&format!("nope{i}"));
        }
        m.unknown_model("nope3");
        let text = m.encode();
        let series: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("reason=\"unknown_model\""))
            .collect();
        assert_eq!(series.len(), UNKNOWN_NAMES + 1, "{text}");
        let count = |model: &str| {
            let line = series
                .iter()
                .find(|l| l.contains(&format!("model=\"{model}\"")))
                .unwrap_or_else(|| panic!("no series for `{model}` in\n{text}"));
            line.rsplit(' ').next().unwrap().parse::<u64>().unwrap()
        };
        assert_eq!(count("nope3"), 2);
        assert_eq!(count(""), 1000 - UNKNOWN_NAMES as u64);
    }
}
