//! An app's models as workloads, so that partitions and admission are the ones `[[workload]]`s
//! get: each model stage, ensemble member and ONNX voter is a workload named
//! `<app>.<model name>` with its partition, the app's frame rate and deadline. The caller
//! checks them with core's scenario rules and admission control, sets the partitions up
//! (`isolane_session::with_partitions`) and hands each one to [`crate::run::run_apps`] by
//! that name.

use isolane_core::spec::{
    Backend, Criticality, DeviceSpec, Host, LatePolicy, Mechanism, Rate, Role, RunLength,
    WorkloadSpec,
};

use crate::spec::AppSpec;

/// The workload name of `model` (a `ModelSpec::name`) of `app`.
pub fn workload_name(app: &AppSpec, model: &str) -> String {
    format!("{}.{model}", app.name)
}

/// Every model of `apps` as a workload (thread-hosted, batch 1, at the app's frame rate, on
/// the `backend` of the scenario's device).
pub fn as_workloads(apps: &[AppSpec], backend: Backend) -> Vec<WorkloadSpec> {
    apps.iter()
        .flat_map(|app| {
            app.models().into_iter().map(move |m| WorkloadSpec {
                name: workload_name(app, &m.name),
                model: m.model.clone(),
                weights: m.weights.clone(),
                batch: 1,
                precision: m.precision,
                rate: Rate::Hz(app.source.fps),
                deadline_ms: Some(app.deadline_ms),
                length: RunLength::Jobs(app.frames),
                warmup_jobs: 0,
                late: LatePolicy::Skip,
                cpu: Vec::new(),
                role: Role::Standalone,
                ramp: None,
                host: Host::Thread,
                partition: m.partition.clone(),
                plan_check: m.plan_check,
                criticality: Criticality::Critical,
                stretch: None,
                backend,
                program: None,
                gpu: None,
            })
        })
        .collect()
}

/// Apps run their stages on threads of the isolane process: on the CPU, or on a GPU in green
/// contexts. MPS clients, MIG instances and time-slicing need a process per workload, which
/// app stages do not have yet. `Err`: why not, for the `[device]` field.
pub fn check_device(device: &DeviceSpec) -> Result<(), String> {
    match (device.backend, device.mechanism) {
        (Backend::Cpu, _) | (Backend::Cuda, Mechanism::Green) => Ok(()),
        (Backend::Cuda, m) => Err(format!(
            "mechanism \"{}\" with [[app]]s: app stages run on threads of the isolane process, \
             which only green contexts partition; expected mechanism = \"green\" (mps, mig and \
             timeslice need a worker process per stage, not built for apps yet)",
            m.name()
        )),
    }
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
