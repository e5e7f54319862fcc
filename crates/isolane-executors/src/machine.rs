//! What this machine offers the commands, found out once per command: its GPU's device model
//! (and why CUDA cannot run here), the built-in quickstart scenario that fits it, the device
//! memory each workload will take, and admission of a scenario against it.

use std::path::{Path, PathBuf};

use isolane_core::admission::{AdmissionOptions, Plan};
use isolane_core::device_model::DeviceModel;
use isolane_core::spec::{Backend, Host, Scenario, SpecError};
use isolane_gpu::GpuError;
use isolane_planner::auto::Target;
use isolane_planner::cache::DeviceRecord;
use isolane_planner::offline::OfflineProfiles;
use isolane_planner::ProfileCache;

#[derive(Debug, thiserror::Error)]
pub enum MachineError {
    /// A scenario or flag that does not fit this machine (exit code 2 at the CLI).
    #[error("{0}")]
    User(String),
    /// The driver could not be asked.
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error("the built-in quickstart scenario is invalid: {0}")]
    Quickstart(SpecError),
    #[error(
        "no GPU to plan for here; pass --device-model NAME to plan for a GPU that is not here"
    )]
    NoGpuHere(#[source] Box<MachineError>),
    #[error(
        "no GPU here to profile on; plan for a GPU that is not here with --device-model NAME \
         --profiles DIR"
    )]
    NoGpuToProfile(#[source] GpuError),
}

impl MachineError {
    /// Whether this is the user's mistake (exit code 2) rather than a runtime failure.
    pub fn is_user_error(&self) -> bool {
        match self {
            MachineError::User(_) => true,
            MachineError::NoGpuHere(e) => e.is_user_error(),
            _ => false,
        }
    }
}

fn user(msg: impl std::fmt::Display) -> MachineError {
    MachineError::User(msg.to_string())
}

/// The names of the engine's built-in models, as scenario validation takes them.
pub fn builtin_names() -> Vec<&'static str> {
    isolane_engine::builtin_models()
        .iter()
        .map(|m| m.name)
        .collect()
}

/// The scenario `isolane run` uses without a file (`scenarios/quickstart.toml`, built in).
pub const QUICKSTART: &str = include_str!("../../../scenarios/quickstart.toml");
pub const QUICKSTART_NAME: &str = "<built-in quickstart>";
/// The same on a machine with a CUDA GPU (`scenarios/quickstart-gpu.toml`).
pub const QUICKSTART_GPU: &str = include_str!("../../../scenarios/quickstart-gpu.toml");
pub const QUICKSTART_GPU_NAME: &str = "<built-in GPU quickstart>";

/// Whether the GPU quickstart can run here (a CUDA device, and the CUDA backend's libraries),
/// or why not, in the words of discovery: no driver, no device, a library missing.
pub fn gpu_unusable_reason() -> Option<String> {
    gpu_missing_reason().or_else(|| {
        isolane_cuda::libs::ensure_all()
            .err()
            .map(|e| format!("a CUDA library is missing: {e}"))
    })
}

/// Why this machine has no CUDA device to run on, if it has none: no driver, no device.
pub fn gpu_missing_reason() -> Option<String> {
    match isolane_gpu::devices::list_devices() {
        // One line: the folders searched are in `isolane devices`.
        Err(GpuError::LibraryNotFound { library, .. }) => Some(format!(
            "no CUDA driver: {library} not found; `isolane devices` says where it was looked for"
        )),
        Err(GpuError::NoDevice(why)) => Some(format!("no CUDA device: {why}")),
        Err(e) => Some(format!("the CUDA driver failed: {e}")),
        Ok(d) if d.is_empty() => Some("no CUDA device".into()),
        Ok(_) => None,
    }
}

/// The built-in quickstart: on the GPU when one is ready (unless `cpu_only`), else on the CPU.
/// Returns the scenario, its name, and why the GPU was not used when it could have been asked
/// for (`None` with `cpu_only` or on the GPU).
pub fn quickstart(cpu_only: bool) -> Result<(Scenario, String, Option<String>), MachineError> {
    let models = builtin_names();
    let no_gpu = if cpu_only {
        None
    } else {
        gpu_unusable_reason()
    };
    let (text, name) = if cpu_only || no_gpu.is_some() {
        (QUICKSTART, QUICKSTART_NAME)
    } else {
        (QUICKSTART_GPU, QUICKSTART_GPU_NAME)
    };
    let s = Scenario::from_toml_str(text, name, &models).map_err(MachineError::Quickstart)?;
    Ok((s, name.to_string(), no_gpu))
}

/// The title of a results table: where the workloads ran and how the device was shared, e.g.
/// `cuda GPU 0 (NVIDIA H100 80GB HBM3), green contexts` or `cpu, no partitions`.
pub fn device_title(scenario: &Scenario) -> String {
    use isolane_core::spec::Mechanism;
    let d = &scenario.device;
    let mechanism = match d.mechanism {
        Mechanism::None => "no partitions",
        Mechanism::Timeslice => "time-slicing",
        Mechanism::Mps => "MPS",
        Mechanism::Mig => "MIG",
        Mechanism::Green => "green contexts",
    };
    match d.backend {
        Backend::Cpu => format!("cpu, {mechanism}"),
        Backend::Cuda => {
            let name = isolane_gpu::devices::list_devices()
                .ok()
                .and_then(|list| list.into_iter().find(|g| g.index == d.gpu))
                .map(|g| format!(" ({})", g.name))
                .unwrap_or_default();
            if d.several_gpus() {
                let list: Vec<String> = d.gpus.iter().map(u32::to_string).collect();
                return format!("cuda GPUs {}{name}, {mechanism}", list.join(", "));
            }
            format!("cuda GPU {}{name}, {mechanism}", d.gpu)
        }
    }
}

/// Device-memory estimate per workload (MiB) for admission control: its model's plan, plus
/// the CUDA context of its process — each worker process has its own; thread-hosted workloads
/// share this process's context on their GPU, counted once per GPU, with the first of them.
/// `None` on the CPU and for `spin:` models (they allocate nothing on the device).
pub fn memory_estimates_mib(scenario: &Scenario) -> Vec<Option<u64>> {
    use crate::engine::{planned_model_mib, CUDA_PROCESS_MIB};
    let mut own_context_counted = std::collections::BTreeSet::new();
    scenario
        .workloads
        .iter()
        .map(|w| {
            let model = planned_model_mib(&w.device(&scenario.device), w)?;
            let context = match w.host {
                Host::Process => CUDA_PROCESS_MIB,
                Host::Thread if own_context_counted.insert(w.gpu_on(&scenario.device)) => {
                    CUDA_PROCESS_MIB
                }
                Host::Thread => 0,
            };
            Some(model + context)
        })
        .collect()
}

/// The device model of GPU `index` of this machine, as discovered through the CUDA driver.
pub fn detected_device_model(index: u32) -> Result<DeviceModel, MachineError> {
    let devices = isolane_gpu::devices::list_devices()?;
    let d = devices.iter().find(|d| d.index == index).ok_or_else(|| {
        user(format!(
            "device.gpu = {index}, but this machine has {} CUDA device(s) (device.gpus: every \
             index must be one of them)",
            devices.len()
        ))
    })?;
    Ok(isolane_gpu::devices::model_for(
        &d.name,
        d.sm_count,
        d.memory_mib,
        d.compute_capability,
    ))
}

/// Admission takes one device model for every GPU of the scenario (each GPU's budget is its
/// own, the rules are the first GPU's): the GPUs of a scenario on several GPUs must be alike.
pub fn same_model_on_every_gpu(
    scenario: &Scenario,
    first: &DeviceModel,
) -> Result<(), MachineError> {
    for &g in scenario.device.gpus.iter().skip(1) {
        let other = detected_device_model(g)?;
        if other != *first {
            return Err(user(format!(
                "device.gpus: GPU {} is {} ({} SMs, {} MiB) but GPU {g} is {} ({} SMs, {} MiB); \
                 the GPUs of one scenario must be of one model",
                scenario.device.gpu,
                first.name,
                first.sm_count,
                first.memory_mib,
                other.name,
                other.sm_count,
                other.memory_mib
            )));
        }
    }
    Ok(())
}

/// Admission control before a run starts anything (the same check as `isolane plan`): on the
/// CPU there is nothing to partition; on a GPU every workload's partition must fit the device
/// of this machine, or the scenario (named `file`) is refused with one reason per workload.
///
/// Returns the admitted plan (`None` on the CPU).
pub fn admit(
    scenario: &Scenario,
    file: &str,
    options: &AdmissionOptions,
) -> Result<Option<Plan>, MachineError> {
    // A scenario whose workloads all run on the CPU (`backend = "cpu"` each) needs no GPU.
    if scenario.device.backend != Backend::Cuda || !scenario.workloads.iter().any(|w| w.on_gpu()) {
        return Ok(None);
    }
    let device = detected_device_model(scenario.device.gpu)?;
    same_model_on_every_gpu(scenario, &device)?;
    isolane_core::admission::admit(scenario, &device, &memory_estimates_mib(scenario), options)
        .map(Some)
        .map_err(|rejections| {
            user(isolane_report::admission::rejection_text(
                file,
                &device,
                &rejections,
            ))
        })
}

/// The device a scenario is planned against: the named offline model, the CPU (no partitions),
/// or the GPU of this machine.
pub fn resolve_device_model(
    scenario: &Scenario,
    name: Option<&str>,
) -> Result<DeviceModel, MachineError> {
    if let Some(name) = name {
        return named_device_model(name);
    }
    match scenario.device.backend {
        Backend::Cpu => Ok(cpu_device_model()),
        Backend::Cuda => {
            let device = detected_device_model(scenario.device.gpu)
                .map_err(|e| MachineError::NoGpuHere(Box::new(e)))?;
            same_model_on_every_gpu(scenario, &device)?;
            Ok(device)
        }
    }
}

/// `--device-model NAME`: one of the offline device models.
pub fn named_device_model(name: &str) -> Result<DeviceModel, MachineError> {
    isolane_core::device_model::device_model(name).ok_or_else(|| {
        user(format!(
            "--device-model: unknown device model '{name}'; allowed: {}",
            isolane_core::device_model::device_model_names().join(", ")
        ))
    })
}

/// The device whose green rules size `sweep partition`'s points: `--device-model`, else this
/// machine's GPU `gpu` on cuda, else (on the CPU, where the points run without partitions)
/// h100-sxm's.
pub fn sweep_device_model(
    name: Option<&str>,
    on_gpu: bool,
    gpu: u32,
) -> Result<DeviceModel, MachineError> {
    match (name, on_gpu) {
        (Some(name), _) => named_device_model(name),
        (None, true) => detected_device_model(gpu),
        (None, false) => named_device_model("h100-sxm"),
    }
}

/// The CPU of this machine as a device to plan for: nothing to partition.
pub fn cpu_device_model() -> DeviceModel {
    DeviceModel {
        name: "cpu",
        description: "the CPU of this machine (no partitions)",
        sm_count: 0,
        memory_mib: 0,
        compute_capability: (0, 0),
        mig: None,
    }
}

/// Where the profiles come from: `--device-model` plans offline from a folder of profiles;
/// otherwise this machine's GPU (or CPU), with its profile cache.
/// `file` names the scenario, `cache_dir` is the profiles' folder, `driver` the driver whose
/// offline profiles to take; `note` gets what the offline store holds.
pub fn plan_target(
    s: &Scenario,
    file: &Path,
    device_model: Option<&str>,
    cache_dir: PathBuf,
    driver: Option<&str>,
    note: &mut dyn FnMut(String),
) -> Result<Target, MachineError> {
    if let Some(name) = device_model {
        if s.device.backend == Backend::Cpu {
            return Err(user(format!(
                "--device-model plans for a GPU, but {}'s backend is cpu",
                file.display()
            )));
        }
        let device = resolve_device_model(s, Some(name))?;
        let store = OfflineProfiles::open(&cache_dir, device.name, driver).map_err(user)?;
        note(store.describe());
        return Ok(Target::Offline { device, store });
    }
    let cache = ProfileCache::new(cache_dir);
    if s.device.backend == Backend::Cpu {
        return Ok(Target::Here {
            device: cpu_device_model(),
            record: DeviceRecord {
                gpu: isolane_planner::cache::cpu_name(),
                driver: "none".into(),
                device_model: "cpu".into(),
            },
            cache,
            mig_on: None,
            gpu: 0,
        });
    }
    let devices = isolane_gpu::devices::list_devices().map_err(MachineError::NoGpuToProfile)?;
    let (mig_on, mig_gpu) = mig_mode(&devices, &s.device.all_gpus())?;
    let d = devices
        .into_iter()
        .find(|d| d.index == s.device.gpu)
        .ok_or_else(|| user(format!("device.gpu = {}: no such GPU here", s.device.gpu)))?;
    let device =
        isolane_gpu::devices::model_for(&d.name, d.sm_count, d.memory_mib, d.compute_capability);
    // One profile set serves every GPU of one model: the scenario's GPUs must be alike.
    same_model_on_every_gpu(s, &device)?;
    Ok(Target::Here {
        record: DeviceRecord {
            gpu: d.name.clone(),
            driver: d
                .driver_version
                .clone()
                .unwrap_or(d.cuda_driver_version.clone()),
            device_model: device.name.to_string(),
        },
        device,
        cache,
        mig_on,
        gpu: mig_gpu,
    })
}

/// MIG mode over the scenario's GPUs: on only when it is on for every one of them (profile
/// runs use the first, the planned scenario all), with the GPU to name when it is not (the
/// first that is not on; else the first).
fn mig_mode(
    devices: &[isolane_gpu::devices::DeviceInfo],
    gpus: &[u32],
) -> Result<(Option<bool>, u32), MachineError> {
    let mut modes = Vec::with_capacity(gpus.len());
    for &g in gpus {
        let d = devices
            .iter()
            .find(|d| d.index == g)
            .ok_or_else(|| user(format!("device.gpus: GPU {g}: no such GPU here")))?;
        modes.push((g, d.mig.current));
    }
    Ok(match modes.iter().find(|(_, m)| *m != Some(true)) {
        Some(&(g, m)) => (m, g),
        None => (Some(true), gpus.first().copied().unwrap_or(0)),
    })
}

/// The machine's load average over the last minute (/proc/loadavg), if it can be read.
pub fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// On the CPU a profile's times are the host's as much as the workload's: where other
/// processes kept more threads runnable than the machine has cores (the profile's own one
/// counted), the profile says so, since the tail it measured is that busy host's (issue 31: a
/// plan refused beside other builds was made at a load of 3 on 2 cores, refused at 4).
pub fn busy_host_note(
    workload: &str,
    load: Option<f64>,
    cores: usize,
    cache: &Path,
) -> Option<String> {
    let load = load?;
    (load > cores as f64).then(|| {
        isolane_core::text::wrap_message(
            &format!(
                "note: the machine was busy while `{workload}` was profiled (load average \
                 {load:.1} on {cores} cores): its times, tail included, are those of a host \
                 this busy. On a quieter machine they are shorter: the profile is kept in {}, \
                 so plan again then with another --profile-cache to measure it anew.",
                cache.display()
            ),
            80,
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CPU profile measured while other processes kept more threads runnable than the
    /// machine has cores says so, wrapped to 80 columns, naming where it is kept.
    #[test]
    fn a_cpu_profile_on_a_busy_host_says_so() {
        let cache = Path::new("/c");
        let note = busy_host_note("classifier", Some(3.9), 2, cache).unwrap();
        let flat = note.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(
            flat.contains("`classifier` was profiled (load average 3.9 on 2 cores)"),
            "{note}"
        );
        assert!(note.lines().all(|l| l.chars().count() <= 80), "{note}");
        assert!(flat.contains("kept in /c"), "{note}");
        assert!(busy_host_note("classifier", Some(1.2), 2, cache).is_none());
        assert!(busy_host_note("classifier", None, 2, cache).is_none());
    }
}
