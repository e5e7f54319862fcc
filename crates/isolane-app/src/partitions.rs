//! An app's models as workloads, so that partitions and admission are the ones `[[workload]]`s
//! get: each model stage, ensemble member and ONNX voter is a workload named
//! `<app>.<model name>` with its partition, the app's frame rate and deadline. The caller
//! checks them with core's scenario rules and admission control, sets the partitions up
//! (`isolane_session::with_partitions`) and hands each one to [`crate::run::run_apps`] by
//! that name. With `host = "process"` (MPS, time-slicing) an app runs in a worker process of its
//! own and is one workload, named as the app: its partition is its process's environment.

use isolane_core::spec::{
    Backend, Criticality, DeviceSpec, Host, LatePolicy, Mechanism, Rate, Role, RunLength,
    WorkloadSpec,
};

use crate::spec::{AppSpec, ModelSpec, StageKind};

/// The workload name of `model` (a `ModelSpec::name`) of `app`.
pub fn workload_name(app: &AppSpec, model: &str) -> String {
    format!("{}.{model}", app.name)
}

/// Every model of `apps` as a workload (batch 1, at the app's frame rate, on the backend of
/// the scenario's `device`, on the app's GPU). With `host = "process"` an app is one process,
/// i.e. one partition (one MPS client): one workload per app, named as the app, with the app's
/// partition and its first model (admission counts that model's memory); an app without a
/// model has none.
/// With several GPUs every workload names its app's GPU, as core's resolved scenario does for
/// a `[[workload]]`: admission then counts it on that GPU, and the partition session sets its
/// partition up there (a green group on that GPU, its GPU's MPS daemon, or a worker told its
/// GPU).
pub fn as_workloads(apps: &[AppSpec], device: &DeviceSpec) -> Vec<WorkloadSpec> {
    let (backend, host) = (device.backend, device.host);
    // A model's own GPU (its stage's `gpu`) when its app's stages are threads; an app in a
    // worker process is on its app's GPU (check_gpus refuses a stage elsewhere).
    let gpu = |app: &AppSpec, m: &ModelSpec| {
        (backend == Backend::Cuda && device.several_gpus()).then(|| match host {
            Host::Thread => app.model_gpu(m, device),
            Host::Process => app.gpu_on(device),
        })
    };
    let workload = |app: &AppSpec, name: String, m: &ModelSpec| WorkloadSpec {
        name,
        model: m.model.clone(),
        weights: m.weights.clone(),
        batch: 1,
        precision: m.precision,
        calibration: None,
        rate: Rate::Hz(app.source.fps),
        deadline_ms: Some(app.deadline_ms),
        phase_ms: None,
        length: RunLength::Jobs(app.frames),
        warmup_jobs: 0,
        late: LatePolicy::Skip,
        cpu: Vec::new(),
        role: Role::Standalone,
        ramp: None,
        host,
        partition: m.partition.clone(),
        plan_check: m.plan_check,
        criticality: Criticality::Critical,
        stretch: None,
        backend,
        program: None,
        gpu: gpu(app, m),
        serve: Default::default(),
    };
    match host {
        Host::Thread => apps
            .iter()
            .flat_map(|app| {
                app.models()
                    .into_iter()
                    .map(move |m| workload(app, workload_name(app, &m.name), m))
            })
            .collect(),
        Host::Process => apps
            .iter()
            .filter_map(|app| {
                let first = *app.models().first()?;
                let mut w = workload(app, app.name.clone(), first);
                w.partition = app.partition.clone();
                Some(w)
            })
            .collect(),
    }
}

/// The workload whose partition `model` of `app` runs in: its own (`<app>.<model>`) when the
/// app's stages are threads, the app's (named as the app) when the app is a process.
pub fn partition_workload(app: &AppSpec, model: &str, host: Host) -> String {
    match host {
        Host::Thread => workload_name(app, model),
        Host::Process => app.name.clone(),
    }
}

/// Where an app's stages can run: threads of the isolane process (the CPU, or a GPU in green
/// contexts) or, with `host = "process"` (the default of mps and timeslice), a worker process
/// per app (the CPU, an MPS client, a time slice). `Err`: why not, for the `[device]` field.
pub fn check_device(device: &DeviceSpec) -> Result<(), String> {
    match (device.backend, device.mechanism, device.host) {
        (Backend::Cpu, _, _)
        | (Backend::Cuda, Mechanism::Green, Host::Thread)
        | (Backend::Cuda, Mechanism::Mps | Mechanism::Timeslice, Host::Process) => Ok(()),
        (Backend::Cuda, Mechanism::Green, Host::Process) => Err(
            "mechanism \"green\" with [[app]]s in processes: green contexts partition the \
             threads of one process; expected host = \"thread\""
                .into(),
        ),
        (Backend::Cuda, m, _) => Err(format!(
            "mechanism \"{}\" with [[app]]s is not built yet; expected mechanism = \"green\", \
             \"mps\" or \"timeslice\"",
            m.name()
        )),
    }
}

/// With `host = "process"` an app is one partition (its process): a model that names a
/// partition of its own, other than the app's, is refused. `Err((field, message))`.
pub fn check_process_partitions(apps: &[AppSpec], host: Host) -> Result<(), (String, String)> {
    if host == Host::Thread {
        return Ok(());
    }
    for (i, app) in apps.iter().enumerate() {
        for (j, s) in app.stages.iter().enumerate() {
            let own: Vec<(String, &ModelSpec)> = match &s.kind {
                StageKind::Model(m) => vec![(format!("app[{i}].stage[{j}].partition"), m)],
                StageKind::Ensemble { members, .. } => members
                    .iter()
                    .enumerate()
                    .map(|(k, m)| (format!("app[{i}].stage[{j}].members[{k}].partition"), m))
                    .collect(),
                _ => Vec::new(),
            };
            if let Some((field, m)) = own.into_iter().find(|(_, m)| m.partition != app.partition) {
                return Err((
                    field,
                    format!(
                        "model `{}` names a partition of its own; with host = \"process\" (the \
                         default of mps and timeslice) an app is one process, one partition: \
                         give the app's partition instead",
                        m.name
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// A `device = "gpu"` preprocess needs the CUDA backend: on the CPU one it is refused by name.
/// `Err((field, message))`, the field as `app[i].stage[j].device`.
pub fn check_gpu_stages(device: &DeviceSpec, apps: &[AppSpec]) -> Result<(), (String, String)> {
    if device.backend == Backend::Cuda {
        return Ok(());
    }
    for (i, app) in apps.iter().enumerate() {
        if let Some(&j) = app.gpu_preprocesses().first() {
            return Err((
                format!("app[{i}].stage[{j}].device"),
                format!(
                    "\"gpu\": stage `{}` runs its preprocess on the GPU, which the cpu backend \
                     has not; expected device = \"cpu\", or [device] backend = \"cuda\"",
                    app.stages[j].name
                ),
            ));
        }
    }
    Ok(())
}

/// Every app's `gpu` and every graphics stage's `gpu` name one of the device's GPUs (as a
/// `[[workload]]`'s `gpu` must), and only with the CUDA backend: on the CPU there is no CUDA
/// GPU to compute on, nor one whose UUID would find the Vulkan device that renders.
/// `Err((field, message))`, the field as `app[i].gpu` or `app[i].stage[j].gpu`.
pub fn check_gpus(device: &DeviceSpec, apps: &[AppSpec]) -> Result<(), (String, String)> {
    for (i, app) in apps.iter().enumerate() {
        let stages = app
            .stages
            .iter()
            .enumerate()
            .filter_map(|(j, s)| stage_gpu_key(s).map(|g| (j, g)));
        let named = app.gpu.map(|g| (format!("app[{i}].gpu"), g));
        let staged = stages
            .clone()
            .map(|(j, g)| (format!("app[{i}].stage[{j}].gpu"), g));
        for (field, g) in named.into_iter().chain(staged) {
            check_gpu(device, g).map_err(|m| (field, m))?;
        }
        // An app in a worker process is one MPS client or one time slice: of one GPU.
        if device.host == Host::Process {
            let own = app.gpu_on(device);
            let elsewhere =
                stages.filter(|(j, _)| !matches!(app.stages[*j].kind, StageKind::Graphics { .. }));
            if let Some((j, g)) = elsewhere.into_iter().find(|&(_, g)| g != own) {
                return Err((
                    format!("app[{i}].stage[{j}].gpu"),
                    format!(
                        "{g}: with host = \"process\" (the default of mps and timeslice) an app \
                         is one process on one GPU, GPU {own}; expected its compute stages on \
                         GPU {own}, or mechanism = \"green\" (host = \"thread\") to spread an \
                         app over GPUs"
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// The `gpu` a stage names itself: a graphics stage's render GPU, a model's, an ensemble's
/// or a GPU preprocess's.
fn stage_gpu_key(s: &crate::spec::StageSpec) -> Option<u32> {
    match &s.kind {
        StageKind::Graphics { gpu, .. } => *gpu,
        StageKind::Model(m) => m.gpu,
        StageKind::Ensemble { members, .. } => members.first().and_then(|m| m.gpu),
        StageKind::Preprocess(p) => p.gpu,
        _ => None,
    }
}

/// One `gpu` value against the device: the messages of core's check of a workload's `gpu`.
fn check_gpu(device: &DeviceSpec, g: u32) -> Result<(), String> {
    if device.backend != Backend::Cuda {
        return Err(format!(
            "{g}: not allowed with backend \"cpu\": there is no CUDA GPU to compute or render \
             on (a graphics stage chooses its Vulkan device with device = ... instead); remove \
             it, or set [device] backend = \"cuda\""
        ));
    }
    let allowed = device.all_gpus();
    if allowed.contains(&g) {
        return Ok(());
    }
    let list: Vec<String> = allowed.iter().map(u32::to_string).collect();
    Err(format!(
        "found GPU {g}; expected one of the device's GPUs: {} (device.gpu or device.gpus)",
        list.join(" | ")
    ))
}
