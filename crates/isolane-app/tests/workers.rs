//! The coordinator's side of apps in worker processes, against shell-script workers of the
//! worker protocol's app role (no GPU, no isolane binary): a worker that dies after the start
//! leaves its app's error in its records while the other app's come back; one that cannot be
//! built stops the run before the start, naming its app.

mod common;

use common::Names;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use isolane_app::spec::{parse_apps, AppSpec};
use isolane_app::workers::{run_in_workers, WorkerRun};
use isolane_core::spec::{Backend, DeviceSpec, Host, Mechanism, TimingSpec};
use isolane_runtime::protocol::PROTOCOL_VERSION;
use isolane_runtime::worker_client::WorkerCommand;

fn app(name: &str) -> String {
    format!(
        "[[app]]\nname = \"{name}\"\ndeadline_ms = 50\nframes = 30\n[app.source]\n\
         kind = \"synthetic\"\nwidth = 8\nheight = 8\nfps = 60\n[[app.stage]]\nname = \"pre\"\n\
         kind = \"preprocess\"\nsize = [4, 4]\n[[app.stage]]\nname = \"out\"\nkind = \"sink\"\n"
    )
}

/// An app-role worker: the app named `dies` exits after the start without its records, the one
/// named `broken` answers its set-up with an error, the others send one frame's records.
const WORKER: &str = r#"#!/bin/sh
echo '{"type":"hello","protocol_version":VERSION,"pid":'$$',"isolane_version":"test"}'
read -r role
app=$(printf '%s' "$role" | sed 's/.*"app":"\([^"]*\)".*/\1/')
if [ "$app" = broken ]; then
    echo '{"type":"error","message":"stage `pre`: cannot be built"}'
    exit 1
fi
echo '{"type":"app_ready"}'
read -r start
if [ "$app" = dies ]; then exit 3; fi
echo '{"type":"app_done","records":{"release_ns":[0],"sent_ns":[1],"stages":[[{"frame":0,"start_ns":2,"end_ns":3}],[{"frame":0,"start_ns":4,"end_ns":5,"output":"done"}]],"error":null}}'
echo '{"type":"done","status":"ok","cpu":null}'
read -r rest
"#;

fn run(dir: &Path, apps: &[AppSpec]) -> Result<isolane_app::run::RunOutcome, String> {
    let script = dir.join("worker.sh");
    // Read by sh, never exec'd itself (a file this process just wrote may be "busy").
    std::fs::write(
        &script,
        WORKER.replace("VERSION", &PROTOCOL_VERSION.to_string()),
    )
    .unwrap();
    let command = WorkerCommand {
        program: PathBuf::from("/bin/sh"),
        args: vec![script.display().to_string()],
        env: Vec::new(),
    };
    let device = DeviceSpec {
        backend: Backend::Cpu,
        gpu: 0,
        gpus: Vec::new(),
        mechanism: Mechanism::None,
        host: Host::Process,
    };
    let timing = TimingSpec::default();
    let env = BTreeMap::new();
    let stop = AtomicBool::new(false);
    let file = dir.join("s.toml");
    let w = WorkerRun {
        command: &command,
        scenario: &file,
        text: "",
        device: &device,
        timing: &timing,
        out: None,
        no_plan_check: false,
        env: &env,
        on_start: &|_| {},
        stop: &stop,
        guard: &Default::default(),
    };
    run_in_workers(apps, &w).map_err(|e| e.to_string())
}

fn apps(names: &[&str]) -> Vec<AppSpec> {
    let text: String = names.iter().map(|n| app(n)).collect();
    parse_apps(&text, Path::new("s.toml"), &Names).unwrap()
}

#[test]
fn a_worker_that_dies_after_the_start_fails_only_its_app() {
    let dir = tempfile::tempdir().unwrap();
    let specs = apps(&["fine", "dies"]);
    let out = run(dir.path(), &specs).unwrap();
    assert_eq!(out.apps[0].error, None);
    assert_eq!(out.apps[0].stages[1][0].output.as_deref(), Some("done"));
    let e = out.apps[1].error.as_deref().unwrap();
    assert!(e.contains("app `dies`") && e.contains("exited"), "{e}");
    // Shaped as the app: one (empty) record list per stage, for the metrics.
    assert_eq!(out.apps[1].stages.len(), 2);
    assert!(out.apps[1].release_ns.is_empty());
    // Its metrics and frames file are made as for any app (no frame measured).
    let s = isolane_app::metrics::summarize(&specs[1], &out.apps[1], &|_| "cpu".into());
    assert_eq!(s.end_to_end.jobs, 0);
    let csv = isolane_app::metrics::frames_csv(&specs[1], &out.apps[1]);
    assert_eq!(csv.lines().count(), 1, "{csv}");
}

#[test]
fn a_worker_that_cannot_build_stops_the_run_before_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let e = run(dir.path(), &apps(&["fine", "broken"])).err().unwrap();
    assert!(
        e.contains("app `broken`") && e.contains("cannot be built"),
        "{e}"
    );
}
