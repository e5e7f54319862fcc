//! `isolane verify` as a library: the proof of isolation is a measurement. The partitions of a
//! scenario are set up through the one path of every run ([`crate::with_partitions`] →
//! `isolane_gpu::PartitionSession`); each gets a probe agent — a thread in its green context,
//! or an `isolane worker` process in the protocol's probe role for timeslice, MPS and MIG
//! (separate contexts) — and `isolane_gpu::verify` measures them: the probe on the whole GPU,
//! each partition alone, each beside all the others saturating.

use std::sync::atomic::AtomicBool;
use std::time::Duration;

use isolane_core::admission::{admit, AdmissionOptions, Plan, ResolvedPartition};
use isolane_core::probe::{ProbeConfig, ProbeResult};
use isolane_core::spec::{Backend, Mechanism, Scenario};
use isolane_gpu::partitions::WORKER_GPU_ENV;
use isolane_gpu::probe::WholeDevice;
use isolane_gpu::verify::{
    measure_agents, share_and_interference, PartitionRow, ProbeAgent, ThreadAgent, ThreadTarget,
    VerifyReport, AGENT_SLACK as SLACK,
};
use isolane_gpu::{DeviceInfo, GpuError, PartitionSession, Probe};
use isolane_runtime::probe_role::{ProbeFactory, ProbeTarget};
use isolane_runtime::protocol::{FromWorker, ToWorker, PROTOCOL_VERSION};
use isolane_runtime::worker_client::{WorkerClient, WorkerClientError, WorkerCommand};

use crate::{with_partitions, PartitionChoices, SessionError};

#[derive(Debug, Clone)]
pub struct VerifyOptions {
    /// Length of each measurement (at least 0.5 s is used).
    pub duration: Duration,
    /// `--allow-mig-reconfigure`, `--join-mps`.
    pub choices: PartitionChoices,
    /// How probe workers are started (default: `isolane worker` of this executable).
    pub worker: Option<WorkerCommand>,
    /// Progress lines on stderr.
    pub verbose: bool,
}

impl Default for VerifyOptions {
    fn default() -> Self {
        VerifyOptions {
            duration: Duration::from_secs(1),
            choices: PartitionChoices::default(),
            worker: None,
            verbose: false,
        }
    }
}

/// Runs the verification of `scenario` on its GPU.
pub fn verify(scenario: &Scenario, opts: &VerifyOptions) -> Result<VerifyReport, GpuError> {
    if scenario.device.backend != Backend::Cuda {
        return Err(GpuError::Usage(
            "verify needs a scenario with device.backend = \"cuda\"".into(),
        ));
    }
    if scenario.device.several_gpus() {
        return Err(GpuError::Usage(
            "verify probes the partitions of one GPU; device.gpus lists several (verify_each_gpu \
             verifies them one GPU at a time)"
                .into(),
        ));
    }
    let gpu = scenario.device.gpu;
    let info = device_info(gpu)?;
    let model = model_of(&info);
    // Admission control first: nothing is created for a plan that does not fit.
    let plan =
        admit(scenario, &model, &[], &AdmissionOptions::default()).map_err(GpuError::Rejected)?;
    if plan.mechanism == Mechanism::None {
        return Err(GpuError::Usage(
            "verify needs a mechanism other than none".into(),
        ));
    }
    let duration = opts.duration.max(Duration::from_millis(500));
    let worker = match &opts.worker {
        Some(w) => w.clone(),
        None => WorkerCommand::isolane()
            .map_err(|e| GpuError::Worker(format!("finding the current executable: {e}")))?,
    };
    let run = Measurement {
        gpu,
        sm_count: info.sm_count.max(1),
        duration,
        worker,
        verbose: opts.verbose,
    };
    // The baseline runs before any partition exists (under MPS: before the daemon starts).
    let whole_gpu = run.whole_gpu(plan.mechanism)?;
    let (rows, notes) = with_partitions(gpu, &plan, opts.choices, |session| {
        run.partitions(&plan, session, whole_gpu.as_ref())
    })
    .map_err(|e| match e {
        SessionError::Partitions(e) => e,
        SessionError::Run(e) => GpuError::Other(e.to_string()),
    })??;
    Ok(VerifyReport {
        device: info.name.clone(),
        gpu,
        sm_count: info.sm_count,
        mechanism: plan.mechanism,
        duration_s: duration.as_secs_f64(),
        whole_gpu,
        partitions: rows,
        notes,
    })
}

/// Runs the verification of every GPU of `scenario`, one GPU after the other: each GPU's
/// partitions are set up, probed alone and beside each other, and taken down before the next
/// GPU's (so the other GPUs are idle meanwhile: what one GPU's neighbours on another GPU cost
/// it is not measured). A scenario on one GPU is [`verify`]. Admission runs first over every
/// GPU (a refusal names its GPU), against the first GPU's model; the GPUs must be alike.
pub fn verify_each_gpu(
    scenario: &Scenario,
    opts: &VerifyOptions,
) -> Result<Vec<VerifyReport>, GpuError> {
    if !scenario.device.several_gpus() {
        return verify(scenario, opts).map(|r| vec![r]);
    }
    if scenario.device.backend != Backend::Cuda {
        return Err(GpuError::Usage(
            "verify needs a scenario with device.backend = \"cuda\"".into(),
        ));
    }
    let model = alike_model(&scenario.device.all_gpus())?;
    admit(scenario, &model, &[], &AdmissionOptions::default()).map_err(GpuError::Rejected)?;
    let mut reports = Vec::new();
    for gpu in scenario.device.all_gpus() {
        let one = scenario.on_one_gpu(gpu);
        if one.workloads.is_empty() {
            continue;
        }
        if opts.verbose {
            eprintln!("verify: GPU {gpu} ({} partition(s))", one.workloads.len());
        }
        reports.push(verify(&one, opts)?);
    }
    Ok(reports)
}

/// The device model of GPUs `gpus`, which must all be of it (one set of admission rules).
fn alike_model(gpus: &[u32]) -> Result<isolane_core::device_model::DeviceModel, GpuError> {
    let mut first: Option<(u32, isolane_core::device_model::DeviceModel)> = None;
    for &g in gpus {
        let model = model_of(&device_info(g)?);
        match &first {
            None => first = Some((g, model)),
            Some((f, m)) if *m != model => {
                return Err(GpuError::Usage(format!(
                    "device.gpus: GPU {f} is {} but GPU {g} is {}; the GPUs of one scenario \
                     must be of one model",
                    m.name, model.name
                )))
            }
            Some(_) => {}
        }
    }
    first
        .map(|(_, m)| m)
        .ok_or_else(|| GpuError::Usage("device.gpus lists no GPU".into()))
}

/// The device model (admission rules) of a listed GPU.
fn model_of(info: &DeviceInfo) -> isolane_core::device_model::DeviceModel {
    isolane_gpu::devices::model_for(
        &info.name,
        info.sm_count,
        info.memory_mib,
        info.compute_capability,
    )
}

fn device_info(gpu: u32) -> Result<DeviceInfo, GpuError> {
    let devices = isolane_gpu::list_devices()?;
    let count = devices.len() as u32;
    devices
        .into_iter()
        .find(|d| d.index == gpu)
        .ok_or(GpuError::DeviceIndex { index: gpu, count })
}

/// What every measurement of one verification shares.
struct Measurement {
    gpu: u32,
    sm_count: u32,
    duration: Duration,
    worker: WorkerCommand,
    verbose: bool,
}

impl Measurement {
    /// The probe alone on the whole GPU: in a thread for green (whose partitions are threads
    /// too), in a worker process for timeslice and MPS; none under MIG, where no process sees
    /// the whole GPU.
    fn whole_gpu(&self, mechanism: Mechanism) -> Result<Option<ProbeResult>, GpuError> {
        if mechanism == Mechanism::Mig {
            return Ok(None);
        }
        if self.verbose {
            eprintln!("verify: the probe on the whole GPU");
        }
        let target = ThreadTarget::Whole {
            device_index: self.gpu,
        };
        let mut agent: Box<dyn ProbeAgent> = match mechanism {
            Mechanism::Green => Box::new(ThreadAgent::spawn(
                "whole-gpu",
                target,
                ProbeConfig::default(),
            )?),
            _ => Box::new(ProcessAgent::spawn(
                "whole-gpu",
                &self.worker,
                self.gpu,
                &[],
            )?),
        };
        agent.measure(self.duration).map(Some)
    }

    /// Each partition's agent, measured alone and beside the others; the rows of the report
    /// and its notes. The agents (threads, worker processes) end before the partitions go.
    fn partitions(
        &self,
        plan: &Plan,
        session: &mut PartitionSession<'_>,
        whole_gpu: Option<&ProbeResult>,
    ) -> Result<(Vec<PartitionRow>, Vec<String>), GpuError> {
        let mut notes = session.notes().to_vec();
        let mut agents = Vec::with_capacity(plan.workloads.len());
        for w in &plan.workloads {
            agents.push(self.agent(&w.workload, session)?);
        }
        let measured = measure_agents(&mut agents, self.duration, self.verbose)?;
        drop(agents);
        let base = whole_gpu.map(|b| b.blocks_per_s);
        let rows = plan
            .workloads
            .iter()
            .zip(measured)
            .map(|(w, (alone, beside))| {
                let record = session.records().iter().find(|r| r.workload == w.workload);
                let (share_of_gpu, interference_pct) = share_and_interference(
                    base,
                    alone.blocks_per_s,
                    beside.as_ref().map(|b| b.blocks_per_s),
                );
                let granted_sms = record.and_then(|r| r.granted_sms);
                PartitionRow {
                    workload: w.workload.clone(),
                    partition: record.map(|r| r.partition.clone()).unwrap_or_default(),
                    granted_sms,
                    nominal_share: self.nominal_share(&w.partition, granted_sms),
                    alone,
                    beside,
                    share_of_gpu,
                    interference_pct,
                }
            })
            .collect();
        match plan.mechanism {
            Mechanism::Mps => notes.push(
                "inside MPS clients %smid is virtualised: SM ids prove nothing, throughput does"
                    .into(),
            ),
            Mechanism::Mig => notes.push(
                "MIG: no process sees the whole GPU, so there is no whole-GPU baseline".into(),
            ),
            _ => {}
        }
        Ok((rows, notes))
    }

    /// The probe agent of `workload`'s partition: a thread in its green group, else a worker
    /// process with its partition's environment (an MPS client is adopted by the daemon).
    fn agent(
        &self,
        workload: &str,
        session: &mut PartitionSession<'_>,
    ) -> Result<Box<dyn ProbeAgent>, GpuError> {
        if let Some(group) = session.take_green_group(workload) {
            let target = ThreadTarget::Green {
                device_index: self.gpu,
                group,
            };
            return Ok(Box::new(ThreadAgent::spawn(
                workload,
                target,
                ProbeConfig::default(),
            )?));
        }
        let env = session
            .worker_env()
            .get(workload)
            .cloned()
            .unwrap_or_default();
        let agent = ProcessAgent::spawn(workload, &self.worker, self.gpu, &env)?;
        (session.client_adopter())(agent.pid());
        Ok(Box::new(agent))
    }

    /// The share of the GPU the partition is meant to get: SMs ÷ the device's, or the MPS
    /// thread percentage; none for timeslice.
    fn nominal_share(
        &self,
        partition: &ResolvedPartition,
        granted_sms: Option<u32>,
    ) -> Option<f64> {
        match partition {
            ResolvedPartition::Mps { thread_pct, .. } => Some(f64::from(*thread_pct) / 100.0),
            _ => granted_sms.map(|sms| f64::from(sms) / f64::from(self.sm_count)),
        }
    }
}

// ------------------------------------------------------------------ the probe in a worker

/// A probe in an `isolane worker` process (the probe role of the worker protocol): an MPS
/// client, a MIG instance or a time-sliced context.
pub struct ProcessAgent {
    client: WorkerClient,
}

impl ProcessAgent {
    /// Starts a worker from `worker` with extra `env` and sets its probe up on CUDA device
    /// `gpu` (as this process numbers the devices; the worker's environment may renumber).
    pub fn spawn(
        label: &str,
        worker: &WorkerCommand,
        gpu: u32,
        env: &[(String, String)],
    ) -> Result<Self, GpuError> {
        let role = ToWorker::Probe {
            protocol_version: PROTOCOL_VERSION,
            gpu,
        };
        let mut agent = ProcessAgent {
            client: WorkerClient::start(label, worker, env, &role).map_err(worker_error)?,
        };
        match agent.recv(SLACK)? {
            FromWorker::ProbeReady => Ok(agent),
            other => Err(agent.unexpected(&other)),
        }
    }

    pub fn pid(&self) -> u32 {
        self.client.pid()
    }

    fn ask(&mut self, request: &ToWorker, timeout: Duration) -> Result<FromWorker, GpuError> {
        self.client.send(request).map_err(worker_error)?;
        self.recv(timeout)
    }

    fn recv(&mut self, timeout: Duration) -> Result<FromWorker, GpuError> {
        self.client.recv(timeout).map_err(worker_error)
    }

    fn unexpected(&self, msg: &FromWorker) -> GpuError {
        worker_error(self.client.unexpected(msg))
    }
}

fn worker_error(e: WorkerClientError) -> GpuError {
    GpuError::Worker(e.to_string())
}

impl ProbeAgent for ProcessAgent {
    fn label(&self) -> &str {
        self.client.label()
    }

    fn measure(&mut self, duration: Duration) -> Result<ProbeResult, GpuError> {
        let request = ToWorker::Measure {
            duration_s: duration.as_secs_f64(),
        };
        match self.ask(&request, duration + SLACK)? {
            FromWorker::Measured { result } => Ok(result),
            other => Err(self.unexpected(&other)),
        }
    }

    fn start_saturate(&mut self) -> Result<(), GpuError> {
        match self.ask(&ToWorker::StartSaturate, SLACK)? {
            FromWorker::Saturating => Ok(()),
            other => Err(self.unexpected(&other)),
        }
    }

    fn stop_saturate(&mut self) -> Result<u64, GpuError> {
        match self.ask(&ToWorker::StopSaturate, SLACK)? {
            FromWorker::SaturateStopped { launches } => Ok(launches),
            other => Err(self.unexpected(&other)),
        }
    }
}

// ------------------------------------------------------------------ the worker's side

/// The probe role's factory for `isolane worker`: the probe kernel in the primary context of
/// the device, which is the partition the worker's environment gives it (an MPS client's share,
/// a MIG instance, or a time-sliced context of the whole GPU).
pub struct GpuProbes;

impl ProbeFactory for GpuProbes {
    fn open(&self, gpu: u32) -> Result<Box<dyn ProbeTarget>, String> {
        // Behind our MPS daemon or a MIG binding the worker sees one device, renumbered.
        let gpu = std::env::var(WORKER_GPU_ENV)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(gpu);
        let whole = WholeDevice::new(gpu).map_err(|e| e.to_string())?;
        let probe = Probe::new(whole.context(), whole.stream(), gpu, ProbeConfig::default())
            .map_err(|e| e.to_string())?;
        Ok(Box::new(WholeGpuProbe {
            probe,
            _whole: whole,
        }))
    }
}

/// Field order is drop order: the probe (its module and buffers) before its context.
struct WholeGpuProbe {
    probe: Probe,
    _whole: WholeDevice,
}

impl ProbeTarget for WholeGpuProbe {
    fn measure(&mut self, duration: Duration) -> Result<ProbeResult, String> {
        self.probe
            .measure_throughput(duration)
            .map_err(|e| e.to_string())
    }

    fn saturate(&mut self, stop: &AtomicBool) -> Result<u64, String> {
        self.probe.saturate(stop).map_err(|e| e.to_string())
    }
}

/// How many partitions each GPU of the scenario verifies (GPUs without workloads left out).
pub fn partitions_per_gpu(s: &isolane_core::spec::Scenario) -> Vec<usize> {
    s.device
        .all_gpus()
        .into_iter()
        .map(|g| s.on_one_gpu(g).workloads.len())
        .filter(|&n| n > 0)
        .collect()
}

/// What verify says before it starts: per GPU, the probe on the whole GPU, each partition alone
/// and, with two or more, each beside the others saturating; each measurement at least 0.5 s.
pub fn time_needed(per_gpu: &[usize], duration_s: f64) -> String {
    let measurements: usize = per_gpu
        .iter()
        .map(|&n| 1 + n + if n >= 2 { n } else { 0 })
        .sum();
    let partitions: usize = per_gpu.iter().sum();
    let gpus = match per_gpu.len() {
        1 => String::new(),
        n => format!(" on {n} GPUs, one after the other"),
    };
    format!(
        "verify: {partitions} partition(s){gpus}, {measurements} measurements of {:.1} s: at \
         least ~{}\n  (plus setting the partitions up)",
        duration_s.max(0.5),
        crate::progress::duration_text(measurements as f64 * duration_s.max(0.5))
    )
}

/// What `isolane verify` prints and writes of its reports: the JSON and the table of one GPU's
/// report as always; of several, one report per GPU (each names its `gpu`).
pub fn report_texts(reports: &[VerifyReport]) -> serde_json::Result<(String, String)> {
    use isolane_gpu::verify::format_table;
    Ok(match reports {
        [one] => (serde_json::to_string_pretty(one)?, format_table(one)),
        all => (
            serde_json::to_string_pretty(all)?,
            all.iter().map(format_table).collect::<Vec<_>>().join("\n"),
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cpu_scenario_is_refused_as_the_users_mistake_before_any_gpu_call() {
        let scenario = Scenario::from_toml_str(
            "[device]\nbackend = \"cpu\"\n\n[[workload]]\nname = \"a\"\nmodel = \"spin:1ms\"\n\
             rate_hz = 100\njobs = 3\n",
            "test.toml",
            &Vec::<String>::new(),
        )
        .unwrap();
        let err = verify(&scenario, &VerifyOptions::default()).unwrap_err();
        assert!(err.is_user_error(), "{err}");
        assert!(err.to_string().contains("backend = \"cuda\""), "{err}");
    }

    #[test]
    fn the_nominal_share_is_the_thread_percentage_or_the_sms() {
        let m = Measurement {
            gpu: 0,
            sm_count: 132,
            duration: Duration::from_secs(1),
            worker: WorkerCommand {
                program: "/bin/false".into(),
                args: Vec::new(),
                env: Vec::new(),
            },
            verbose: false,
        };
        let mps = ResolvedPartition::Mps {
            thread_pct: 25,
            mem_limit_mib: None,
        };
        assert_eq!(m.nominal_share(&mps, None), Some(0.25));
        assert_eq!(
            m.nominal_share(&ResolvedPartition::Whole, Some(33)),
            Some(0.25)
        );
        assert_eq!(m.nominal_share(&ResolvedPartition::Whole, None), None);
    }
}

#[cfg(test)]
mod time_tests {
    #[test]
    fn the_time_needed_counts_every_measurement() {
        // 4 partitions: whole GPU, 4 alone, 4 beside = 9 measurements of 2 s.
        let t = super::time_needed(&[4], 2.0);
        assert!(t.contains("9 measurements of 2.0 s: at least ~18 s"), "{t}");
        assert!(!t.contains("GPUs"), "{t}");
        // One partition has no neighbours; short measurements last 0.5 s.
        let t = super::time_needed(&[1], 0.1);
        assert!(t.contains("2 measurements of 0.5 s: at least ~1 s"), "{t}");
        // Two GPUs, each measured on its own: (1 + 2 + 2) + (1 + 1).
        let t = super::time_needed(&[2, 1], 1.0);
        assert!(
            t.contains("3 partition(s) on 2 GPUs, one after the other, 7 measurements"),
            "{t}"
        );
    }

    #[test]
    fn each_gpu_with_workloads_is_verified() {
        use isolane_core::spec::{NoBuiltinModels, Scenario};
        let text = "[device]\nbackend = \"cuda\"\ngpus = [0, 1, 2]\nmechanism = \"green\"\n\
                    [[workload]]\nname = \"a\"\nmodel = \"spin:1ms\"\nrate_hz = 10\njobs = 1\n\
                    [workload.partition]\nsms = 8\n\
                    [[workload]]\nname = \"b\"\nmodel = \"spin:1ms\"\nrate_hz = 10\njobs = 1\n\
                    gpu = 2\n[workload.partition]\nsms = 8\n\
                    [[workload]]\nname = \"c\"\nmodel = \"spin:1ms\"\nrate_hz = 10\njobs = 1\n\
                    gpu = 2\n[workload.partition]\nsms = 8\n";
        let s = Scenario::from_toml_str(text, "s.toml", &NoBuiltinModels).unwrap();
        assert_eq!(super::partitions_per_gpu(&s), [1, 2], "GPU 1 has none");
    }
}
