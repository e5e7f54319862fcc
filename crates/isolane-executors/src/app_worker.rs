//! An `[[app]]` in an `isolane worker` process (`[device] host = "process"`, and every app
//! under MPS or time-slicing): the worker side of the runtime's app role. The coordinator's
//! side is `isolane_app::workers::run_in_workers`. Under MPS the app's partition is its
//! process's MPS client (thread percentage, pinned memory limit), set by its environment.

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use isolane_app::protection::AppGuard;
use isolane_app::run::{run_apps, AppRecords, RunError, RunSettings};
use isolane_app::spec::{parse_apps, EngineModels};
use isolane_runtime::app_role::AppRunner;
use isolane_runtime::protocol::AppSetup;

/// The worker side: builds the app of the set-up (the scenario text parsed again, as the
/// coordinator did) and runs it alone in this process, released at the coordinator's t0.
pub struct AppWorker;

impl AppRunner for AppWorker {
    fn run(
        &self,
        setup: &AppSetup,
        start: &mut dyn FnMut() -> Result<i64, String>,
        stop: &AtomicBool,
    ) -> Result<AppRecords, String> {
        let apps =
            parse_apps(&setup.text, &setup.scenario, &EngineModels).map_err(|e| e.to_string())?;
        let mut app = apps
            .into_iter()
            .find(|a| a.name == setup.app)
            .ok_or_else(|| format!("the scenario has no app `{}`", setup.app))?;
        // The coordinator looked up the GPU UUIDs (this process may see only its own GPU).
        isolane_app::placement::set_render_devices(&mut app, &setup.render_devices)?;
        if setup.no_plan_check {
            for m in app.models_mut() {
                m.plan_check = false;
            }
        }
        let settings = RunSettings {
            device: &setup.device,
            timing: &setup.timing,
            models: Arc::new(crate::app_models::AppModels),
            // The process is the partition (its environment): nothing to hand to a stage.
            partitions: HashMap::new(),
            stop,
            out: setup.out.as_deref(),
            start: Some(Box::new(start)),
            guard: AppGuard {
                guard: None,
                setups: setup
                    .guard
                    .iter()
                    .map(|g| (app.name.clone(), g.clone()))
                    .collect(),
            },
        };
        // The coordinator names the app (its worker's label): the reason alone goes back.
        let outcome = run_apps(std::slice::from_ref(&app), settings).map_err(|e| match e {
            RunError::Setup { message, .. } => message,
            other => other.to_string(),
        })?;
        outcome
            .apps
            .into_iter()
            .next()
            .ok_or_else(|| "the run returned no records".to_string())
    }
}
