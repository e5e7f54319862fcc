//! Which GPU renders each graphics stage. An app's compute goes to its GPU through its
//! workloads' `gpu` ([`crate::partitions::as_workloads`]); a graphics stage renders through
//! Vulkan, which numbers the devices its own way, so a stage pinned to CUDA GPU `N`
//! ([`AppSpec::render_gpu`]) gets the Vulkan device whose `deviceUUID` is GPU `N`'s CUDA UUID
//! (the same UUID for NVIDIA's drivers): its `device` becomes `GPU-<uuid>`. The lookup is the
//! coordinator's, where every GPU is visible; app workers are sent the result
//! ([`render_devices`], [`set_render_devices`]).

use std::collections::BTreeMap;

use isolane_core::spec::DeviceSpec;

use crate::spec::{AppSpec, PreprocessDevice, StageKind, Vote};

/// Pins every graphics stage of `apps` that [`AppSpec::render_gpu`] places on a GPU to that
/// GPU's Vulkan device: its `device` becomes the GPU's UUID, which `uuid_of` gives for a CUDA
/// index (`GPU-xxxxxxxx-…`). `Err((field, message))`: a GPU without a UUID here, by the field
/// that placed the stage (`app[i].stage[j].gpu`, or `app[i].gpu` / `device.gpus` where the
/// stage took its app's or the device's).
pub fn pin_render_devices(
    apps: &mut [AppSpec],
    device: &DeviceSpec,
    uuid_of: &dyn Fn(u32) -> Result<String, String>,
) -> Result<(), (String, String)> {
    for (i, app) in apps.iter_mut().enumerate() {
        let pins: Vec<(usize, u32)> = app
            .stages
            .iter()
            .enumerate()
            .filter_map(|(j, s)| app.render_gpu(s, device).map(|g| (j, g)))
            .collect();
        for (j, g) in pins {
            let uuid = uuid_of(g).map_err(|m| (placing_field(app, i, j), m))?;
            if let StageKind::Graphics { device, .. } = &mut app.stages[j].kind {
                *device = uuid;
            }
        }
    }
    Ok(())
}

/// Writes every model's and every GPU preprocess's GPU into its spec ([`AppSpec::model_gpu`],
/// [`AppSpec::stage_gpu`]): what a key left to its app or to the device is then named, so
/// that the run and its summary read one answer.
pub fn resolve_compute_gpus(apps: &mut [AppSpec], device: &DeviceSpec) {
    for app in apps.iter_mut() {
        let gpus: Vec<Option<u32>> = (0..app.stages.len())
            .map(|j| app.stage_gpu(j, device))
            .collect();
        for (stage, gpu) in app.stages.iter_mut().zip(gpus) {
            match &mut stage.kind {
                StageKind::Model(m) => m.gpu = gpu,
                StageKind::Ensemble { members, vote } => {
                    let voter = match vote {
                        Vote::Onnx(v) => Some(v),
                        _ => None,
                    };
                    for m in members.iter_mut().chain(voter) {
                        m.gpu = gpu;
                    }
                }
                StageKind::Preprocess(p) if p.device == PreprocessDevice::Gpu => p.gpu = gpu,
                _ => {}
            }
        }
    }
}

/// The key that put stage `j` of app `i` on its GPU, for a message.
fn placing_field(app: &AppSpec, i: usize, j: usize) -> String {
    match (&app.stages[j].kind, app.gpu) {
        (StageKind::Graphics { gpu: Some(_), .. }, _) => format!("app[{i}].stage[{j}].gpu"),
        (_, Some(_)) => format!("app[{i}].gpu"),
        _ => "device.gpus".to_string(),
    }
}

/// The `device` of every graphics stage of `app` that was pinned to a GPU (stage name →
/// `GPU-<uuid>`): what an app worker is sent, since it parses the file again.
pub fn render_devices(app: &AppSpec) -> BTreeMap<String, String> {
    app.stages
        .iter()
        .filter_map(|s| match &s.kind {
            StageKind::Graphics { device, .. }
                if isolane_graphics::parse_gpu_uuid(device).is_some() =>
            {
                Some((s.name.clone(), device.clone()))
            }
            _ => None,
        })
        .collect()
}

/// Gives the graphics stages of `app` named in `devices` that device (an app worker, with
/// what the coordinator resolved). A name that is not a graphics stage of the app is an
/// error: the two sides would not be running the same app.
pub fn set_render_devices(
    app: &mut AppSpec,
    devices: &BTreeMap<String, String>,
) -> Result<(), String> {
    for (name, text) in devices {
        let stage = app.stages.iter_mut().find(|s| &s.name == name);
        match stage.map(|s| &mut s.kind) {
            Some(StageKind::Graphics { device, .. }) => *device = text.clone(),
            _ => {
                return Err(format!(
                    "app `{}` has no graphics stage `{name}` to render on {text}",
                    app.name
                ))
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
