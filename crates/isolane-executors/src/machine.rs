//! What this machine offers the commands, found out once per command: its GPU's device model
//! (and why CUDA cannot run here), the built-in quickstart scenario that fits it, the device
//! memory each workload will take, and admission of a scenario against it.

use isolane_core::admission::{AdmissionOptions, Plan};
use isolane_core::device_model::DeviceModel;
use isolane_core::spec::{Backend, Host, Scenario, SpecError};
use isolane_gpu::GpuError;

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
}

impl MachineError {
    /// Whether this is the user's mistake (exit code 2) rather than a runtime failure.
    pub fn is_user_error(&self) -> bool {
        matches!(self, MachineError::User(_))
    }
}

fn user(msg: impl std::fmt::Display) -> MachineError {
    MachineError::User(msg.to_string())
}

fn builtin_names() -> Vec<&'static str> {
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
