//! Admission's prediction before a run (`[protection] admission`, docs/criticality.md): the
//! stretch each critical workload is predicted to suffer beside the workloads on its GPU
//! (`isolane_core::admission::foresee`), from each model's memory-system demand (the
//! engine's traffic) and its p99 alone in its partition (the profile cache `plan --auto`
//! fills). A predicted miss is said before anything runs, or refuses the run (exit 2). The
//! CLI's `run`, `serve` and `isolation` call it after admission.

use isolane_core::admission::{foresee, Foresight};
use isolane_core::spec::{AdmissionMode, Backend, Scenario};
use isolane_planner::cache::{DeviceRecord, ProfileCache};

use isolane_core::user_error::{user, UserError};

/// Warns of (or, with `admission = "refuse"`, refuses) a scenario whose critical deadlines are
/// predicted to miss beside their neighbours on this machine's GPU; the warning and notes go
/// to `say` (the CLI's stderr). Quiet on the CPU, with `admission = "off"`, and where nothing
/// can be predicted (no fitted model for this GPU, no profiles); under `"refuse"` it says which
/// workloads it could not predict.
pub fn foresee_or_refuse(
    scenario: &Scenario,
    file: &str,
    say: &mut dyn FnMut(&str),
) -> Result<(), UserError> {
    let mode = scenario.protection.admission;
    if mode == AdmissionMode::Off
        || scenario.device.backend != Backend::Cuda
        || !scenario.workloads.iter().any(|w| w.on_gpu())
    {
        return Ok(());
    }
    // No GPU here: admission proper (`admit_or_refuse`) says so.
    let Ok(devices) = isolane_gpu::devices::list_devices() else {
        return Ok(());
    };
    let Some(d) = devices.iter().find(|d| d.index == scenario.device.gpu) else {
        return Ok(());
    };
    let device =
        isolane_gpu::devices::model_for(&d.name, d.sm_count, d.memory_mib, d.compute_capability);
    let Some(sys) = isolane_core::predict::memory_system(device.name) else {
        return Ok(());
    };
    let record = DeviceRecord {
        gpu: d.name.clone(),
        driver: (d.driver_version.clone()).unwrap_or(d.cuda_driver_version.clone()),
        device_model: device.name.to_string(),
    };
    let cache = ProfileCache::new(ProfileCache::default_dir());
    let alone = isolane_planner::foresee::alone_p99_ms(
        &cache,
        &record,
        scenario,
        Some(isolane_cuda::ENGINE_REVISION),
    );
    let profiles = memory_profiles(scenario, sys.l2_bytes);
    if mode == AdmissionMode::Refuse {
        let unknown: Vec<&str> = (scenario.workloads.iter().enumerate())
            .filter(|(i, w)| w.on_gpu() && (alone[*i].is_none() || profiles[*i].is_none()))
            .map(|(_, w)| w.name.as_str())
            .collect();
        if !unknown.is_empty() {
            say(&format!(
                "note: {file}: admission predicts nothing for {} (no profile alone in its \
                 partition in {}, or no memory-system figures for its model; `isolane plan \
                 --auto` measures them)",
                unknown.join(", "),
                cache.dir().display()
            ));
        }
    }
    match foresee(scenario, &device, &profiles, &alone) {
        Foresight::Clear => Ok(()),
        f @ Foresight::Warn(_) => {
            say(&format!("warning: {}", f.text(file)));
            Ok(())
        }
        f @ Foresight::Refuse(_) => Err(user(f.text(file))),
    }
}

/// Each workload's memory-system demand on a GPU with `l2_bytes` of L2 (`None` where the
/// engine cannot say: a CPU workload, a kernel, a model it cannot read).
pub fn memory_profiles(
    scenario: &Scenario,
    l2_bytes: u64,
) -> Vec<Option<isolane_core::predict::MemoryProfile>> {
    (scenario.workloads.iter())
        .map(|w| crate::engine::memory_profile(&w.device(&scenario.device), w, l2_bytes))
        .collect()
}
