//! isolane-metrics: live metrics of a run in the OpenMetrics / Prometheus text format
//! (`--metrics-addr`; docs/observability.md).
//!
//! [`RunMetrics`] holds the families (per-workload job, timeout and skip counters, latency and
//! start-lateness histograms, partition info, device telemetry gauges) in a
//! `prometheus-client` registry; [`serve`] answers `GET /metrics` from a thread of its own,
//! through the bounded HTTP server of [`http`] (concurrent connections, a connection cap,
//! whole-request deadlines), which `isolane serve` is to reuse.
//!
//! Nothing here runs on a release loop's thread: job records reach [`RunMetrics::observe`]
//! from the run's jobs writer thread, in the batches the release loops hand off anyway (a
//! thread host's sink, or a worker process's pipe read by the coordinator), and telemetry
//! readings from the sampler's thread. The release loops' timing is therefore untouched
//! (measured in docs/observability.md).

mod apps;
pub mod http;
mod server;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use isolane_core::JobRecord;
use isolane_telemetry::Reading;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

pub use apps::{AppInfo, AppMeters};
pub use server::{serve, MetricsServer, ServeError};

/// The label set of every per-workload family.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WorkloadLabels {
    pub workload: String,
}

/// `isolane_partition_info`: what partition a workload runs in.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PartitionLabels {
    pub workload: String,
    /// `none` (cpu), `timeslice`, `mps`, `mig`, `green`.
    pub mechanism: String,
    /// In words: `cpu`, `whole GPU`, `green 64 SMs`, `mps 50%`, `mig 1g.10gb`.
    pub partition: String,
    /// `thread` or `process`.
    pub host: String,
}

/// `isolane_run_info`: the run going on (a sweep has one per point, the last one current).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RunLabels {
    pub command: String,
    pub scenario: String,
}

/// One workload of a run as the metrics see it.
#[derive(Clone, Debug)]
pub struct WorkloadInfo {
    pub name: String,
    pub mechanism: String,
    pub partition: String,
    pub host: String,
}

type HistogramFamily = Family<WorkloadLabels, Histogram, fn() -> Histogram>;

/// Job latency buckets (s): 50 µs to 6.6 s, doubling — from a spin job to a large model's
/// batch.
fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(50e-6, 2.0, 18))
}

/// Start lateness buckets (s): 1 µs to 1 s, ×4 — the release loop's spin keeps it at a few µs,
/// a sleeping or descheduled loop shows as ms.
fn lateness_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1e-6, 4.0, 11))
}

/// A telemetry gauge: its name (with its unit), help, and how it is read from a reading.
struct DeviceGauge {
    name: &'static str,
    help: &'static str,
    read: fn(&Reading) -> Option<f64>,
}

const MIB: f64 = 1024.0 * 1024.0;

/// telemetry.csv's columns as gauges, in Prometheus' base units (W, Hz, °C, bytes, ratios),
/// the unit in the name.
const DEVICE_GAUGES: &[DeviceGauge] = &[
    DeviceGauge {
        name: "isolane_gpu_power_watts",
        help: "GPU power draw (NVML)",
        read: |r| r.power_w,
    },
    DeviceGauge {
        name: "isolane_gpu_sm_clock_hertz",
        help: "GPU SM clock",
        read: |r| r.sm_clock_mhz.map(|m| m * 1e6),
    },
    DeviceGauge {
        name: "isolane_gpu_memory_clock_hertz",
        help: "GPU memory clock",
        read: |r| r.mem_clock_mhz.map(|m| m * 1e6),
    },
    DeviceGauge {
        name: "isolane_gpu_temperature_celsius",
        help: "GPU temperature",
        read: |r| r.temperature_c,
    },
    DeviceGauge {
        name: "isolane_gpu_memory_used_bytes",
        help: "GPU memory in use (all processes)",
        read: |r| r.memory_used_mib.map(|m| m * MIB),
    },
    DeviceGauge {
        name: "isolane_gpu_utilization_ratio",
        help: "share of the last interval in which a kernel ran (NVML utilization.gpu)",
        read: |r| r.gpu_util_pct.map(|p| p / 100.0),
    },
    DeviceGauge {
        name: "isolane_gpu_memory_utilization_ratio",
        help: "share of the last interval in which device memory was read or written",
        read: |r| r.mem_util_pct.map(|p| p / 100.0),
    },
    DeviceGauge {
        name: "isolane_gpu_sm_utilization_ratio",
        help: "SM activity (NVML GPM, Hopper and later)",
        read: |r| r.sm_util_pct.map(|p| p / 100.0),
    },
    DeviceGauge {
        name: "isolane_gpu_sm_occupancy_ratio",
        help: "SM occupancy (NVML GPM)",
        read: |r| r.sm_occupancy_pct.map(|p| p / 100.0),
    },
    DeviceGauge {
        name: "isolane_gpu_tensor_utilization_ratio",
        help: "tensor core activity (NVML GPM)",
        read: |r| r.tensor_util_pct.map(|p| p / 100.0),
    },
    DeviceGauge {
        name: "isolane_gpu_dram_bandwidth_utilization_ratio",
        help: "DRAM bandwidth in use (NVML GPM)",
        read: |r| r.dram_bw_util_pct.map(|p| p / 100.0),
    },
];

/// The device gauges' latest values, each shown only once a reading has had it: a CPU run
/// (no telemetry) or a GPU without GPM has no such gauge at all rather than one stuck at 0,
/// which would read as 0 W and 0 °C.
#[derive(Debug)]
struct DeviceValues {
    /// f64 bits per [`DEVICE_GAUGES`] entry; NaN: never read.
    values: Vec<AtomicU64>,
}

impl DeviceValues {
    fn new() -> DeviceValues {
        DeviceValues {
            values: DEVICE_GAUGES
                .iter()
                .map(|_| AtomicU64::new(f64::NAN.to_bits()))
                .collect(),
        }
    }
}

impl Collector for DeviceValues {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for (g, value) in DEVICE_GAUGES.iter().zip(&self.values) {
            let v = f64::from_bits(value.load(Ordering::Relaxed));
            if v.is_nan() {
                continue;
            }
            let gauge = ConstGauge::new(v);
            // The registry ends registered metrics' help with a full stop; these match.
            let help = format!("{}.", g.help);
            let metric = encoder.encode_descriptor(g.name, &help, None, gauge.metric_type())?;
            gauge.encode(metric)?;
        }
        Ok(())
    }
}

/// Per slot (the coordinator's workload index): its labels and the end of its previous
/// completed job, which the start lateness of the next one is measured from.
struct Slot {
    labels: WorkloadLabels,
    prev_end_ns: Option<i64>,
}

/// The per-workload families of fixed-rate jobs (jobs, completed, timeouts, skipped, held,
/// latency, start lateness), fed from job records by the releasing session's slot: `run`'s
/// (in [`RunMetrics`]) and the workloads `isolane serve --release` releases beside its
/// models (in its own registry, under `isolane_serve_released_`; docs/metrics.md). One
/// implementation of what a released job counts as, whoever releases it.
pub struct JobMeters {
    pub(crate) jobs: Family<WorkloadLabels, Counter>,
    pub(crate) completed: Family<WorkloadLabels, Counter>,
    pub(crate) timeouts: Family<WorkloadLabels, Counter>,
    pub(crate) skipped: Family<WorkloadLabels, Counter>,
    held_jobs: Family<WorkloadLabels, Counter>,
    pub(crate) held_seconds: Family<WorkloadLabels, Counter<f64, AtomicU64>>,
    pub(crate) latency: HistogramFamily,
    lateness: HistogramFamily,
    /// By slot; `None`: not a released workload (a served model's slot in a server).
    slots: Mutex<Vec<Option<Slot>>>,
}

impl Default for JobMeters {
    fn default() -> Self {
        Self::new()
    }
}

impl JobMeters {
    pub fn new() -> JobMeters {
        JobMeters {
            jobs: Family::default(),
            completed: Family::default(),
            timeouts: Family::default(),
            skipped: Family::default(),
            held_jobs: Family::default(),
            held_seconds: Family::default(),
            latency: Family::new_with_constructor(latency_histogram),
            lateness: Family::new_with_constructor(lateness_histogram),
            slots: Mutex::new(Vec::new()),
        }
    }

    /// Registers the families in `registry`, named `jobs`, `timeouts`, `latency` … after its
    /// prefix: `isolane_` in a run's, `isolane_serve_released_` in a server's.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "jobs",
            "jobs released (completed or skipped)",
            self.jobs.clone(),
        );
        registry.register(
            "jobs_completed",
            "jobs that ran to their end",
            self.completed.clone(),
        );
        registry.register(
            "timeouts",
            "jobs that missed their deadline (skipped ones included)",
            self.timeouts.clone(),
        );
        registry.register(
            "jobs_skipped",
            "jobs not run because their deadline had passed before they could start (late = skip)",
            self.skipped.clone(),
        );
        registry.register(
            "jobs_held",
            "best-effort jobs the criticality guard held back (docs/criticality.md)",
            self.held_jobs.clone(),
        );
        registry.register_with_unit(
            "held",
            "time the criticality guard held jobs back, before their start and between pieces",
            Unit::Seconds,
            self.held_seconds.clone(),
        );
        registry.register_with_unit(
            "latency",
            "response time of completed jobs, from the scheduled release to the end",
            Unit::Seconds,
            self.latency.clone(),
        );
        registry.register_with_unit(
            "start_lateness",
            "actual start - max(release, end of the previous job)",
            Unit::Seconds,
            self.lateness.clone(),
        );
    }

    /// Releasing starts: `workloads[slot]` names slot `slot`'s workload (`None`: a slot that
    /// releases nothing). Its series show from now on, at 0; earlier ones keep their counts
    /// (Prometheus counters only grow).
    pub fn begin(&self, workloads: &[Option<&str>]) {
        for w in workloads.iter().flatten() {
            self.show(w, true);
        }
        *self.slots.lock().unwrap_or_else(|e| e.into_inner()) = workloads
            .iter()
            .map(|w| {
                w.map(|w| Slot {
                    labels: WorkloadLabels {
                        workload: w.to_string(),
                    },
                    prev_end_ns: None,
                })
            })
            .collect();
    }

    /// No slot is releasing: a stray [`JobMeters::observe`] finds none.
    pub(crate) fn clear(&self) {
        self.slots.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    /// Every family shows `workload` from the start, at 0 (`held`: the guard's count of held
    /// jobs too).
    pub(crate) fn show(&self, workload: &str, held: bool) {
        let labels = WorkloadLabels {
            workload: workload.into(),
        };
        drop(self.jobs.get_or_create(&labels));
        drop(self.completed.get_or_create(&labels));
        drop(self.timeouts.get_or_create(&labels));
        drop(self.skipped.get_or_create(&labels));
        if held {
            drop(self.held_jobs.get_or_create(&labels));
        }
        drop(self.held_seconds.get_or_create(&labels));
    }

    /// Records of slot `slot`, in the order its loop produced them (a slot that releases
    /// nothing is ignored). Called on the jobs writer thread (never a release loop's).
    pub fn observe(&self, slot: usize, records: &[JobRecord]) {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let Some(Some(s)) = slots.get_mut(slot) else {
            return;
        };
        let jobs = self.jobs.get_or_create_owned(&s.labels);
        let completed = self.completed.get_or_create_owned(&s.labels);
        let timeouts = self.timeouts.get_or_create_owned(&s.labels);
        let skipped = self.skipped.get_or_create_owned(&s.labels);
        let held_jobs = self.held_jobs.get_or_create_owned(&s.labels);
        let held_seconds = self.held_seconds.get_or_create_owned(&s.labels);
        let latency = self.latency.get_or_create_owned(&s.labels);
        let lateness = self.lateness.get_or_create_owned(&s.labels);
        for r in records {
            jobs.inc();
            if r.timeout {
                timeouts.inc();
            }
            if r.held_ns > 0 {
                held_jobs.inc();
                held_seconds.inc_by(r.held_ns as f64 / 1e9);
            }
            let (Some(start), Some(end)) = (r.start_ns, r.end_ns) else {
                skipped.inc();
                continue;
            };
            completed.inc();
            latency.observe((end - r.release_ns) as f64 / 1e9);
            // As core's metrics compute it: from the later of the release and the previous end.
            let scheduled = s.prev_end_ns.map_or(r.release_ns, |p| p.max(r.release_ns));
            lateness.observe((start - scheduled).max(0) as f64 / 1e9);
            s.prev_end_ns = Some(end);
        }
    }
}

/// Every metric of a command's runs (a sweep's points add to the same counters).
pub struct RunMetrics {
    registry: Registry,
    /// The per-workload job families.
    pub(crate) job: JobMeters,
    partition: Family<PartitionLabels, Gauge>,
    run: Family<RunLabels, Gauge>,
    device: Arc<DeviceValues>,
    /// The apps' per-stage families (`isolane_stage_*`).
    stages: apps::StageFamilies,
    /// Every run begun so far and its partitions, so that the earlier ones' info can drop
    /// to 0 (a family cannot list its label sets).
    runs: Mutex<Vec<(RunLabels, Vec<PartitionLabels>)>>,
}

impl Default for RunMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl RunMetrics {
    pub fn new() -> RunMetrics {
        let mut registry = Registry::default();
        let job = JobMeters::new();
        job.register(registry.sub_registry_with_prefix("isolane"));
        let partition = Family::<PartitionLabels, Gauge>::default();
        let run = Family::<RunLabels, Gauge>::default();
        registry.register(
            "isolane_partition",
            "the partition each workload runs in (value 1)",
            partition.clone(),
        );
        registry.register(
            "isolane_run",
            "the run in progress (value 1) and the runs before it (0)",
            run.clone(),
        );
        let device = Arc::new(DeviceValues::new());
        registry.register_collector(Box::new(Arc::clone(&device)));
        let stages = apps::StageFamilies::register(&mut registry);
        RunMetrics {
            registry,
            job,
            partition,
            run,
            device,
            stages,
            runs: Mutex::new(Vec::new()),
        }
    }

    /// A run starts: `workloads[slot]` is the coordinator's workload `slot`. Earlier runs'
    /// counters stay (Prometheus counters only grow); their run and partition info drop to 0.
    pub fn begin_run(&self, command: &str, scenario: &str, workloads: &[WorkloadInfo]) {
        self.announce(command, scenario, workloads);
        let names: Vec<Option<&str>> = workloads.iter().map(|w| Some(w.name.as_str())).collect();
        self.job.begin(&names);
    }

    /// The run and its partitions, now current; the earlier runs' info drops to 0.
    fn announce(&self, command: &str, scenario: &str, partitions: &[WorkloadInfo]) {
        let mut runs = self.runs.lock().unwrap_or_else(|e| e.into_inner());
        for (run, partitions) in runs.iter() {
            self.run.get_or_create(run).set(0);
            for p in partitions {
                self.partition.get_or_create(p).set(0);
            }
        }
        let partitions: Vec<PartitionLabels> = partitions
            .iter()
            .map(|w| PartitionLabels {
                workload: w.name.clone(),
                mechanism: w.mechanism.clone(),
                partition: w.partition.clone(),
                host: w.host.clone(),
            })
            .collect();
        for p in &partitions {
            self.partition.get_or_create(p).set(1);
        }
        let current = RunLabels {
            command: command.into(),
            scenario: scenario.into(),
        };
        self.run.get_or_create(&current).set(1);
        runs.push((current, partitions));
    }

    /// Records of workload `slot`, in the order its loop produced them. Called on the jobs
    /// writer thread (never a release loop's).
    pub fn observe(&self, slot: usize, records: &[JobRecord]) {
        self.job.observe(slot, records);
    }

    /// A telemetry reading: every gauge the device reported is set; the others keep their
    /// last value, or stay out of the exposition if they never had one. Called on the
    /// telemetry sampler's thread.
    pub fn observe_device(&self, reading: &Reading) {
        for (g, value) in DEVICE_GAUGES.iter().zip(&self.device.values) {
            if let Some(v) = (g.read)(reading).filter(|v| v.is_finite()) {
                value.store(v.to_bits(), Ordering::Relaxed);
            }
        }
    }

    /// The exposition text (OpenMetrics, ending in `# EOF`).
    pub fn encode(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }
}

#[cfg(test)]
mod tests;
