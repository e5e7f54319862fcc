//! Admission's prediction before a run (`[protection] admission`, docs/criticality.md): the
//! stretch each critical workload is predicted to suffer beside the workloads on its GPU
//! (`isolane_core::admission::foresee`), from each model's memory-system demand (the
//! engine's traffic) and its p99 alone in its partition (the profile cache `plan --auto`
//! fills). A predicted miss is said before anything runs, or refuses the run (exit 2). The
//! CLI's `run`, `serve` and `isolation` call it after admission; a server asks
//! [`live_admission`] about each change while it serves.

use isolane_core::admission::{foresee, Foresight};
use isolane_core::spec::{AdmissionMode, Backend, Scenario};
use std::sync::Arc;

use isolane_planner::cache::{DeviceRecord, ProfileCache};
use isolane_planner::foresee::LiveForesight;
use isolane_runtime::handle::{AdmitChange, Proposed};

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
    let Some((device, record)) = this_gpu(scenario) else {
        return Ok(());
    };
    let Some(sys) = isolane_core::predict::memory_system(device.name) else {
        return Ok(());
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

/// The scenario's GPU here: its device model and the record the profile cache files its
/// profiles under; `None` without one.
fn this_gpu(
    scenario: &Scenario,
) -> Option<(isolane_core::device_model::DeviceModel, DeviceRecord)> {
    let devices = isolane_gpu::devices::list_devices().ok()?;
    let d = devices.iter().find(|d| d.index == scenario.device.gpu)?;
    let device =
        isolane_gpu::devices::model_for(&d.name, d.sm_count, d.memory_mib, d.compute_capability);
    let record = DeviceRecord {
        gpu: d.name.clone(),
        driver: (d.driver_version.clone()).unwrap_or(d.cuda_driver_version.clone()),
        device_model: device.name.to_string(),
    };
    Some((device, record))
}

/// Admission of a change while serving (`isolane ctl resize/load`, `serve --autoplan`'s
/// re-plans; `isolane_serve::Server::set_admission`): the change is predicted as `run` is
/// before it starts, from each served model's traffic and the profiles `profile_cache` (the
/// planner's by default) keeps of the partition each would have, and one that would push a
/// critical model's predicted p99 past its deadline is refused (409, naming the pair and the
/// stretch) or, under `[protection] admission = "warn"`, made with a warning on stderr. Each
/// workload of `scenario` is known by name, so the server may put its released workloads
/// (`serve --release`) among a change's neighbours, as it does while they are released.
/// `None` where nothing would be predicted: `admission = "off"`, the CPU, no GPU here, or no
/// fitted model for the GPU and mechanism.
pub fn live_admission(
    scenario: &Scenario,
    profile_cache: Option<&std::path::Path>,
) -> Option<Arc<dyn AdmitChange>> {
    if scenario.protection.admission == AdmissionMode::Off
        || scenario.device.backend != Backend::Cuda
    {
        return None;
    }
    let (device, record) = this_gpu(scenario)?;
    let cache = ProfileCache::new(profile_cache.map_or_else(ProfileCache::default_dir, Into::into));
    let memory = |w: &isolane_core::spec::WorkloadSpec, l2: u64| {
        crate::engine::memory_profile(&w.device(&scenario.device), w, l2)
    };
    let live = LiveForesight::new(
        scenario,
        device,
        cache,
        record,
        Some(isolane_cuda::ENGINE_REVISION),
        &memory,
    )?;
    Some(Arc::new(LiveAdmission(live)))
}

struct LiveAdmission(LiveForesight);

impl AdmitChange for LiveAdmission {
    fn admit(&self, c: &Proposed<'_>) -> Result<(), String> {
        let f = self.0.change(c.from, c.to, c.sms, c.others);
        answer(&f, &c.to.name, c.kind, &mut |l| eprintln!("{l}"))
    }
}

/// A change's foresight as the server's admission answers it: a refusal's words (the server
/// names the model), or a warning said through `say` and the change made.
fn answer(f: &Foresight, model: &str, kind: &str, say: &mut dyn FnMut(&str)) -> Result<(), String> {
    let what = match kind {
        "add" => "loading it",
        "resize" => "this resize",
        "settings" => "this change of its settings",
        _ => "this change",
    };
    match f {
        Foresight::Clear => Ok(()),
        Foresight::Warn(_) => {
            say(&format!(
                "warning: model `{model}`: {}",
                f.change_text(what)
            ));
            Ok(())
        }
        Foresight::Refuse(_) => Err(f.change_text(what)),
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

#[cfg(test)]
mod tests {
    use super::*;
    use isolane_core::admission::PredictedMiss;

    /// What the server answers for each foresight of a change: a refusal names the change, the
    /// pair and the stretch on one line (the server puts the model's name before it); a
    /// warning is said, naming the model, and the change is made.
    #[test]
    fn a_changes_foresight_is_refused_or_said_as_admission_asks() {
        // vit_b_16 beside vit_l_32 as the recorded H200 trio predicts it (admission.rs).
        let miss = PredictedMiss {
            workload: "v0_vit_b_16".into(),
            alone_p99_ms: 0.99946,
            stretch: 1.37,
            predicted_p99_ms: 0.99946 * 1.37,
            deadline_ms: 1.3232,
            worst_neighbour: Some(("be_vit_l_32".into(), 1.37)),
            busy: None,
        };
        let mut said = Vec::new();
        let refused = answer(
            &Foresight::Refuse(vec![miss.clone()]),
            "be_vit_l_32",
            "add",
            &mut |l| said.push(l.to_string()),
        )
        .unwrap_err();
        assert!(
            refused.starts_with("loading it: 1 critical workload is predicted to miss"),
            "{refused}"
        );
        assert!(
            refused.contains("'v0_vit_b_16'")
                && refused.contains("'be_vit_l_32' (stretch 1.37")
                && refused.contains("refused by [protection] admission = \"refuse\""),
            "{refused}"
        );
        assert!(said.is_empty() && !refused.contains('\n'), "{said:?}");
        let warned = answer(&Foresight::Warn(vec![miss]), "cam", "resize", &mut |l| {
            said.push(l.to_string())
        });
        assert_eq!(warned, Ok(()));
        assert_eq!(said.len(), 1);
        assert!(
            said[0].starts_with("warning: model `cam`: this resize: 1 critical workload")
                && said[0].contains("made anyway"),
            "{said:?}"
        );
        assert_eq!(
            answer(&Foresight::Clear, "cam", "settings", &mut |_| panic!()),
            Ok(())
        );
    }
}
