//! From the scenario to what the search needs (demands, mechanisms, ladders, stretches,
//! memory), and from a plan back to a scenario (partitions placed, the planned file's
//! comments).

use std::path::Path;

use isolane_core::device_model::DeviceModel;
use isolane_core::results::InterferenceIndex;
use isolane_core::spec::{
    Backend, CalibrationSkips, Criticality, Host, Mechanism, PartitionSpec, Rate, Scenario,
    WorkloadSpec,
};

use super::events::partition_words;
use super::{AutoError, Bench, Event, Observer, Target};
use crate::offline::WorkloadId;
use crate::{Choice, Demand, GpusPlan, Ladder};

/// A scenario on several GPUs (`[device] gpus`): its GPUs, and per workload the GPU the file
/// pins it to (`gpu = N`); the planner places the others.
pub(crate) struct Spread {
    pub gpus: Vec<u32>,
    pub pinned: Vec<Option<u32>>,
}

impl Spread {
    /// `None` for a scenario on one GPU (or the CPU). `text`: the scenario file's.
    pub fn of(s: &Scenario, text: &str) -> Option<Spread> {
        if !s.device.several_gpus() {
            return None;
        }
        let named = Scenario::workloads_naming_their_gpu(text);
        let pinned = s
            .workloads
            .iter()
            .enumerate()
            .map(|(i, w)| match named.get(i) {
                Some(true) => w.gpu,
                _ => None,
            })
            .collect();
        Some(Spread {
            gpus: s.device.all_gpus(),
            pinned,
        })
    }
}

pub fn mig_off(gpu: u32, name: &str) -> String {
    format!(
        "MIG mode is off on GPU {gpu} ({name}): MIG instances cannot be profiled here (turning \
         MIG on needs root and a GPU reset); plan MIG offline from profiles measured with MIG on: \
         --device-model NAME --profiles DIR"
    )
}

/// What each workload's profiles are keyed by.
pub fn workload_ids(s: &Scenario) -> Vec<WorkloadId> {
    s.workloads
        .iter()
        .map(|w| WorkloadId {
            name: w.name.clone(),
            model: model_id(&w.model),
            batch: w.batch,
            precision: profile_precision(w),
        })
        .collect()
}

/// The precision as profiles key it: a calibrated model whose skips stay in floats
/// (`calibration_skips = "float"`) runs another plan (a block's output stored in floats as
/// well as bytes) than the default's, so it is measured apart.
fn profile_precision(w: &WorkloadSpec) -> String {
    let p = format!("{:?}", w.precision).to_lowercase();
    match &w.calibration {
        Some(c) if c.skips == CalibrationSkips::Float => format!("{p} float skips"),
        _ => p,
    }
}

/// The model as the cache knows it: an ONNX file by name and content hash (a re-exported
/// file is measured again), anything else by its name.
pub fn model_id(model: &str) -> String {
    if !model.ends_with(".onnx") {
        return model.to_string();
    }
    let hash = std::fs::read(model).map_or(0, |b| crc32fast::hash(&b));
    let name = Path::new(model)
        .file_name()
        .map_or_else(|| model.to_string(), |n| n.to_string_lossy().into_owned());
    format!("{name}-{hash:08x}")
}

/// Each workload's device memory as admission control will count it, per host kind: the
/// estimate builds every model, and only the host (one CUDA context shared by threads, or one
/// per process) changes it between mechanisms.
#[derive(Default)]
pub(crate) struct MemoryEstimates {
    threads: Option<Vec<Option<u64>>>,
    processes: Option<Vec<Option<u64>>>,
}

impl MemoryEstimates {
    pub fn under<B: Bench>(
        &mut self,
        s: &Scenario,
        mech: Mechanism,
        bench: &mut B,
    ) -> &[Option<u64>] {
        let host = host_for(mech);
        let slot = match host {
            Host::Thread => &mut self.threads,
            Host::Process => &mut self.processes,
        };
        slot.get_or_insert_with(|| {
            if s.device.backend == Backend::Cpu {
                return vec![None; s.workloads.len()];
            }
            let mut t = s.clone();
            t.device.mechanism = mech;
            for w in &mut t.workloads {
                w.host = host;
            }
            bench.memory_estimates(&t)
        })
    }
}

pub(crate) fn with_memory(demands: Vec<Demand>, memory: &[Option<u64>]) -> Vec<Demand> {
    demands
        .into_iter()
        .zip(memory)
        .map(|(d, m)| Demand {
            memory_mib: *m,
            ..d
        })
        .collect()
}

/// Each workload's rate and deadline; one without either cannot be planned (the error is the
/// user's: `name` is the scenario file's).
pub fn demands(s: &Scenario, name: &str) -> Result<Vec<Demand>, String> {
    s.workloads
        .iter()
        .map(|w| {
            let Rate::Hz(hz) = w.rate else {
                return Err(format!(
                    "{name}: workload `{}`: rate_hz = \"max\" cannot be planned; give it a rate",
                    w.name
                ));
            };
            Ok(Demand {
                name: w.name.clone(),
                rate_hz: hz,
                deadline_ms: w.deadline_s().unwrap_or(1.0 / hz) * 1e3,
                critical: w.criticality == Criticality::Critical,
                stretch: None,
                added_p99_ms: None,
                memory_mib: None,
            })
        })
        .collect()
}

/// interference.json, or the folder holding it (`--stretch-from`).
pub(crate) fn read_matrix<E>(p: &Path) -> Result<InterferenceIndex, AutoError<E>> {
    let file = if p.is_dir() {
        p.join("interference.json")
    } else {
        p.to_path_buf()
    };
    isolane_core::results::read_json(&file)
        .map_err(|e| AutoError::User(format!("--stretch-from: {e}")))
}

/// Each workload's stretch from the matrix, beside the scenario's other models, where the
/// matrix measured that mechanism and the workload's model and precision as a victim; a model
/// it never measured takes the worst stretch of any victim at that precision (or --stretch
/// when that is larger): planning it as if alone would be the optimistic guess.
pub(crate) fn with_stretch(
    s: &Scenario,
    demands: &[Demand],
    mech: Mechanism,
    matrix: Option<&InterferenceIndex>,
    stated: f64,
    observer: &mut dyn Observer,
) -> Vec<Demand> {
    let Some(m) = matrix.filter(|m| m.mechanism == format!("{mech:?}").to_lowercase()) else {
        return demands.to_vec();
    };
    demands
        .iter()
        .zip(&s.workloads)
        .map(|(d, w)| {
            let others: Vec<&str> = s
                .workloads
                .iter()
                .filter(|o| o.name != w.name)
                .map(|o| o.model.as_str())
                .collect();
            let precision = format!("{:?}", w.precision).to_lowercase();
            let measured = crate::stretch_from(m, &w.model, &precision, &others);
            if let Some(st) = measured {
                observer.event(&Event::MatrixStretch {
                    workload: &w.name,
                    stretch: st,
                });
            }
            let stretch = measured.or_else(|| {
                let st = crate::worst_stretch(m, &precision)?.max(stated);
                observer.event(&Event::MatrixWorstStretch {
                    workload: &w.name,
                    model: &w.model,
                    precision: &precision,
                    stretch: st,
                });
                Some(st)
            });
            Demand {
                stretch: stretch.or(d.stretch),
                ..d.clone()
            }
        })
        .collect()
}

/// The mechanisms to plan with: `--mechanism` (`all`: green, MPS, time-slicing, and MIG where
/// the device has it and it can be profiled), else the scenario's own; on the CPU, cores.
pub(crate) fn mechanisms<E>(
    s: &Scenario,
    flag: Option<&str>,
    target: &Target,
    workloads: &[WorkloadId],
    observer: &mut dyn Observer,
) -> Result<Vec<Mechanism>, AutoError<E>> {
    if s.device.backend == Backend::Cpu {
        return Ok(vec![Mechanism::None]);
    }
    let mig_alone = || match &target.device().mig {
        Some(_) => Ok(vec![Mechanism::Mig]),
        None => Err(AutoError::User(format!(
            "--mechanism mig: {} has no MIG; allowed: green, mps, timeslice, all",
            target.device().name
        ))),
    };
    Ok(match flag {
        Some("all") => {
            let mut all = vec![Mechanism::Green, Mechanism::Mps, Mechanism::Timeslice];
            match target.mig_unavailable(workloads) {
                Some(why) => observer.event(&Event::MigSkipped { why: &why }),
                None => all.push(Mechanism::Mig),
            }
            all
        }
        Some("green") => vec![Mechanism::Green],
        Some("mps") => vec![Mechanism::Mps],
        Some("timeslice") => vec![Mechanism::Timeslice],
        Some("mig") => mig_alone()?,
        Some(other) => {
            return Err(AutoError::User(format!(
                "--mechanism: `{other}` cannot be planned; allowed: green, mps, timeslice, mig, \
                 all"
            )))
        }
        None => match s.device.mechanism {
            m @ (Mechanism::Green | Mechanism::Mps | Mechanism::Timeslice) => vec![m],
            Mechanism::None => vec![Mechanism::Timeslice],
            Mechanism::Mig => mig_alone()?,
        },
    })
}

/// The sizes `mech` offers on `device`, with the device's memory to check.
pub(crate) fn ladder<E>(
    s: &Scenario,
    mech: Mechanism,
    device: &DeviceModel,
) -> Result<Ladder, AutoError<E>> {
    if s.device.backend == Backend::Cpu {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
        return Ok(Ladder::cores(cores));
    }
    let ladder = match mech {
        Mechanism::Green => {
            let r = device
                .green_rules()
                .ok_or_else(|| AutoError::User(format!("{} has no green contexts", device.name)))?;
            let mut ladder = Ladder::green(device.sm_count, r.min_sms, r.step_sms);
            // Several green contexts hold only what one split of the device gives in its
            // smallest units (DeviceModel::green_split_limit); planned sizes are multiples of
            // them, so the plan keeps within it even where a larger common unit would not need to.
            if let Some((unit, groups)) = device.green_split_limit() {
                if s.workloads.len() > 1 {
                    ladder.capacity = ladder.capacity.min(unit * groups);
                }
            }
            ladder
        }
        Mechanism::Mps => Ladder::mps(5),
        Mechanism::Mig => Ladder::mig(
            device
                .mig
                .as_ref()
                .ok_or_else(|| AutoError::User(format!("{} has no MIG", device.name)))?,
        ),
        _ => Ladder::whole(),
    };
    Ok(ladder.with_device_memory(device.memory_mib))
}

/// A partition in words: `48 SMs`, `25 % of the threads`, `one core`, `the whole GPU`.
pub(crate) fn describe(mech: Mechanism, ladder: &Ladder, size: u32) -> String {
    match mech {
        Mechanism::Green | Mechanism::Mig => ladder.describe(size),
        Mechanism::Mps => format!("{size} % of the threads"),
        Mechanism::None => "one core".into(),
        _ => "the whole GPU".into(),
    }
}

pub(crate) fn host_for(mech: Mechanism) -> Host {
    match mech {
        Mechanism::Green => Host::Thread,
        _ => Host::Process,
    }
}

/// Puts workload `w` in a partition of `size` of `ladder` under `mech` (on the CPU: on core
/// `core`).
pub(crate) fn place(
    s: &mut Scenario,
    w: &mut WorkloadSpec,
    mech: Mechanism,
    ladder: &Ladder,
    size: u32,
    core: usize,
) {
    w.partition = PartitionSpec::default();
    if s.device.backend == Backend::Cpu {
        w.cpu = vec![core];
        w.host = Host::Thread;
        return;
    }
    s.device.mechanism = mech;
    match mech {
        Mechanism::Green => w.partition.sms = Some(size),
        Mechanism::Mps => w.partition.thread_pct = Some(size),
        Mechanism::Mig => w.partition.mig_profile = Some(ladder.label(size)),
        _ => {}
    }
    w.host = host_for(mech);
    s.device.host = w.host;
}

/// The scenario with every workload in its planned partition, and on several GPUs on its
/// planned GPU (`gpu_of`, one per workload; `None` keeps the workload's own).
pub(crate) fn planned_scenario(
    s: &Scenario,
    mech: Mechanism,
    ladder: &Ladder,
    choices: &[Choice],
    gpu_of: &[Option<u32>],
) -> Scenario {
    let mut out = s.clone();
    let mut workloads = std::mem::take(&mut out.workloads);
    for (k, (w, c)) in workloads.iter_mut().zip(choices).enumerate() {
        place(&mut out, w, mech, ladder, c.size, k);
        if let Some(g) = gpu_of.get(k).copied().flatten() {
            w.gpu = Some(g);
        }
    }
    out.workloads = workloads;
    out
}

/// The resolved scenario with a comment above each workload: its partition, predicted p99 and
/// p99.9, and the slack the deadline leaves beyond the p99.9.
pub(crate) fn annotate(toml: &str, plan: &GpusPlan, ladder: &Ladder, margin: f64) -> String {
    let mut out = String::new();
    let gpus = plan.gpus_in_order();
    let mut next = super::rounds::planned_choices(plan).iter().zip(gpus);
    for line in toml.lines() {
        if line.trim() == "[[workload]]" {
            if let Some((c, gpu)) = next.next() {
                out.push_str(&format!(
                    "# planned: {}{}; predicted p99 {:.3} ms, p99.9 {:.3} ms (deadline {:.3} ms, \
                     slack {:.3} ms); utilisation {:.2}\n",
                    partition_words(ladder, c),
                    gpu.map_or(String::new(), |g| format!(" on GPU {g}")),
                    c.predicted_p99_ms,
                    c.predicted_tail_ms,
                    c.deadline_ms,
                    c.slack_ms(),
                    c.util
                ));
                if c.tail_at_risk(margin) {
                    out.push_str(&format!(
                        "# the p99.9 is over {:.0} % of the deadline: planned on the p99 (a CPU \
                         core is not kept from the host's other processes)\n",
                        margin * 100.0
                    ));
                }
            }
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}
