//! Apps as MPS clients, through the partition session as `isolane run` sets them up, against
//! the fake MPS control script and a shell-script worker that answers in the worker protocol's
//! app role as `isolane worker` does (CI has no GPU): each app's process gets the private
//! daemon's pipe directory, its app's thread percentage and pinned memory limit; every app is
//! ready before the one t0, which each is sent, and the records come back typed.

mod common;

use common::Names;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use isolane_app::spec::parse_apps;
use isolane_app::workers::{run_in_workers, WorkerRun};
use isolane_core::admission::{AdmittedWorkload, Plan, ResolvedPartition};
use isolane_core::spec::{Backend, DeviceSpec, Host, Mechanism, TimingSpec};
use isolane_runtime::protocol::PROTOCOL_VERSION;
use isolane_runtime::worker_client::WorkerCommand;

const APPS: &str = r#"
[[app]]
name = "endo1"
deadline_ms = 50
frames = 30
partition = { thread_pct = 30, mem_limit_mib = 2048 }
[app.source]
kind = "synthetic"
width = 32
height = 32
fps = 60
[[app.stage]]
name = "pre"
kind = "preprocess"
[[app.stage]]
name = "net"
kind = "model"
model = "yolov8n"
[[app.stage]]
name = "out"
kind = "sink"

[[app]]
name = "endo2"
deadline_ms = 50
frames = 30
partition = { thread_pct = 60 }
[app.source]
kind = "synthetic"
width = 32
height = 32
fps = 60
[[app.stage]]
name = "pre"
kind = "preprocess"
[[app.stage]]
name = "net"
kind = "model"
model = "yolov8n"
[[app.stage]]
name = "out"
kind = "sink"
"#;

/// A worker in the app role: logs its app, its MPS settings and the t0 it was sent, then
/// answers with one frame's records.
fn fake_worker(log: &Path) -> String {
    format!(
        r#"#!/bin/sh
echo '{{"type":"hello","protocol_version":{PROTOCOL_VERSION},"pid":'$$',"isolane_version":"test"}}'
read -r role
app=$(printf '%s' "$role" | sed 's/.*"app":"\([^"]*\)".*/\1/')
echo '{{"type":"app_ready"}}'
read -r start
t0=$(printf '%s' "$start" | sed 's/.*"t0_ns":\([0-9]*\).*/\1/')
render=$(printf '%s' "$role" | grep -o '"render_devices":{{[^}}]*}}' || echo none)
echo "$app $CUDA_MPS_ACTIVE_THREAD_PERCENTAGE ${{CUDA_MPS_PINNED_DEVICE_MEM_LIMIT:-none}} $CUDA_MPS_PIPE_DIRECTORY $t0 $CUDA_VISIBLE_DEVICES $ISOLANE_WORKER_GPU $render" >> '{}'
echo '{{"type":"app_done","records":{{"release_ns":[0],"sent_ns":[7],"stages":[[{{"frame":0,"start_ns":8,"end_ns":9}}],[],[{{"frame":0,"start_ns":20,"end_ns":21,"output":"done"}}]],"error":null}}}}'
echo '{{"type":"done","status":"ok","cpu":null}}'
read -r rest
"#,
        log.display()
    )
}

/// The one test of this binary (it sets the process's environment): apps on one GPU, then on
/// two.
#[test]
fn apps_are_mps_clients_of_their_gpus_daemon() {
    each_app_is_an_mps_client_with_its_apps_partition();
    apps_on_two_gpus_are_clients_of_their_gpus_daemons();
    time_sliced_apps_on_two_gpus_are_told_their_gpu();
}

fn each_app_is_an_mps_client_with_its_apps_partition() {
    let tmp = tempfile::tempdir().unwrap();
    fake_mps(tmp.path());

    let file = tmp.path().join("s.toml");
    let apps = parse_apps(APPS, &file, &Names).unwrap();
    let device = DeviceSpec {
        backend: Backend::Cuda,
        gpu: 0,
        gpus: Vec::new(),
        mechanism: Mechanism::Mps,
        host: Host::Process,
    };
    let workloads = isolane_app::partitions::as_workloads(&apps, &device);
    assert_eq!(workloads.len(), 2, "one MPS client per app");
    let admitted = Plan {
        device: "test".into(),
        mechanism: Mechanism::Mps,
        workloads: workloads
            .iter()
            .map(|w| AdmittedWorkload {
                workload: w.name.clone(),
                partition: ResolvedPartition::Mps {
                    thread_pct: w.partition.thread_pct.unwrap(),
                    mem_limit_mib: w.partition.mem_limit_mib,
                },
                memory_mib: None,
                gpu: None,
            })
            .collect(),
    };
    let log = tmp.path().join("workers.log");
    let script = tmp.path().join("worker.sh");
    // Read by sh, never exec'd itself (a file this process just wrote may be "busy").
    std::fs::write(&script, fake_worker(&log)).unwrap();
    let command = WorkerCommand {
        program: PathBuf::from("/bin/sh"),
        args: vec![script.display().to_string()],
        env: Vec::new(),
    };
    let timing = TimingSpec::default();
    let stop = AtomicBool::new(false);
    let (outcome, records) = isolane_session::with_partitions(
        0,
        &admitted,
        isolane_session::PartitionChoices::default(),
        |session| {
            let env: BTreeMap<String, Vec<(String, String)>> = session.worker_env().clone();
            let adopt = session.client_adopter();
            let run = WorkerRun {
                command: &command,
                scenario: &file,
                text: APPS,
                device: &device,
                timing: &timing,
                out: None,
                no_plan_check: false,
                env: &env,
                on_start: &adopt,
                stop: &stop,
                guard: &Default::default(),
            };
            Ok::<_, std::convert::Infallible>((
                run_in_workers(&apps, &run),
                session.records().to_vec(),
            ))
        },
    )
    .unwrap()
    .unwrap();
    let outcome = outcome.unwrap();
    let pipe_dir = records[0].mps_pipe_dir.clone().expect("an MPS partition");
    assert_eq!(records[0].workload, "endo1");
    assert_eq!(records[0].partition, "mps 30%, 2048 MiB pinned");
    // The two workers write in either order.
    let seen = std::fs::read_to_string(&log).unwrap();
    let mut lines: Vec<&str> = seen.lines().collect();
    lines.sort_unstable();
    let t0 = outcome.t0_ns;
    assert_eq!(
        lines,
        [
            format!("endo1 30 0=2048M {pipe_dir} {t0} 0 0 none"),
            format!("endo2 60 none {pipe_dir} {t0} 0 0 none")
        ]
    );
    for rec in &outcome.apps {
        assert_eq!(rec.error, None);
        assert_eq!(rec.sent_ns, vec![7]);
        assert_eq!(rec.stages.len(), 3);
        assert_eq!(rec.stages[2][0].output.as_deref(), Some("done"));
    }
}

/// The fake MPS control script in `dir`/bin, and no system-wide daemon to be found.
fn fake_mps(dir: &Path) {
    let bin = dir.join("bin");
    std::fs::create_dir(&bin).unwrap();
    let control = isolane_gpu::mps::write_fake_control(&bin).unwrap();
    // The only test of this binary: nothing else reads the environment concurrently.
    std::env::set_var(isolane_gpu::mps::CONTROL_ENV, &control);
    // Where a system-wide daemon would listen: an empty folder of ours, so none is found.
    std::env::set_var("CUDA_MPS_PIPE_DIRECTORY", dir.join("no-daemon"));
}

/// Two apps with a graphics stage each, on `[device] gpus = [0, 1]`: `left` computes on GPU 0
/// and renders on GPU 1, `right` does both on GPU 1.
const TWO_GPUS: &str = r#"
[[app]]
name = "left"
deadline_ms = 50
frames = 30
gpu = 0
partition = { thread_pct = 50 }
[app.source]
kind = "synthetic"
width = 32
height = 32
fps = 60
[[app.stage]]
name = "pre"
kind = "preprocess"
[[app.stage]]
name = "net"
kind = "model"
model = "yolov8n"
[[app.stage]]
name = "boxes"
kind = "yolov8_decode"
[[app.stage]]
name = "draw"
kind = "graphics"
gpu = 1
[[app.stage]]
name = "out"
kind = "sink"

[[app]]
name = "right"
deadline_ms = 50
frames = 30
gpu = 1
partition = { thread_pct = 70 }
[app.source]
kind = "synthetic"
width = 32
height = 32
fps = 60
[[app.stage]]
name = "pre"
kind = "preprocess"
[[app.stage]]
name = "net"
kind = "model"
model = "yolov8n"
[[app.stage]]
name = "boxes"
kind = "yolov8_decode"
[[app.stage]]
name = "draw"
kind = "graphics"
[[app.stage]]
name = "out"
kind = "sink"
"#;

/// Each app's process is a client of its GPU's daemon (a daemon per GPU, each seeing only its
/// GPU, the client its GPU as device 0), and is sent the Vulkan device its graphics stage
/// renders on: the UUID of the GPU the stage was placed on, looked up by the coordinator.
fn apps_on_two_gpus_are_clients_of_their_gpus_daemons() {
    let tmp = tempfile::tempdir().unwrap();
    fake_mps(tmp.path());
    let file = tmp.path().join("s.toml");
    let device = DeviceSpec {
        backend: Backend::Cuda,
        gpu: 0,
        gpus: vec![0, 1],
        mechanism: Mechanism::Mps,
        host: Host::Process,
    };
    let mut apps = parse_apps(TWO_GPUS, &file, &Names).unwrap();
    isolane_app::partitions::check_gpus(&device, &apps).unwrap();
    let uuid = |g: u32| format!("GPU-{g}{g}{g}{g}{g}{g}{g}{g}-0000-0000-0000-000000000000");
    isolane_app::placement::pin_render_devices(&mut apps, &device, &|g| Ok(uuid(g))).unwrap();
    let workloads = isolane_app::partitions::as_workloads(&apps, &device);
    // 50 % + 70 % would not fit one GPU: each GPU admits its own.
    let h100 = isolane_core::device_model::device_model("h100-sxm").unwrap();
    let scenario = isolane_core::spec::Scenario {
        device: device.clone(),
        timing: TimingSpec::default(),
        protection: Default::default(),
        workloads,
    };
    let admitted = isolane_core::admission::admit(
        &scenario,
        &h100,
        &vec![None; scenario.workloads.len()],
        &Default::default(),
    )
    .unwrap();
    let gpus: Vec<Option<u32>> = admitted.workloads.iter().map(|w| w.gpu).collect();
    assert_eq!(gpus, [Some(0), Some(1)]);
    let log = tmp.path().join("workers.log");
    let script = tmp.path().join("worker.sh");
    std::fs::write(&script, fake_worker(&log)).unwrap();
    let command = WorkerCommand {
        program: PathBuf::from("/bin/sh"),
        args: vec![script.display().to_string()],
        env: Vec::new(),
    };
    let timing = TimingSpec::default();
    let stop = AtomicBool::new(false);
    let (outcome, records) = isolane_session::with_partitions(
        0,
        &admitted,
        isolane_session::PartitionChoices::default(),
        |session| {
            let env = session.worker_env().clone();
            let adopt = session.client_adopter();
            let run = WorkerRun {
                command: &command,
                scenario: &file,
                text: TWO_GPUS,
                device: &device,
                timing: &timing,
                out: None,
                no_plan_check: false,
                env: &env,
                on_start: &adopt,
                stop: &stop,
                guard: &Default::default(),
            };
            Ok::<_, std::convert::Infallible>((
                run_in_workers(&apps, &run),
                session.records().to_vec(),
            ))
        },
    )
    .unwrap()
    .unwrap();
    let outcome = outcome.unwrap();
    assert!(outcome.apps.iter().all(|r| r.error.is_none()));
    let pipe = |w: &str, gpu: u32| {
        let r = records.iter().find(|r| r.workload == w).unwrap();
        assert!(r.partition.ends_with(&format!(" on GPU {gpu}")), "{r:?}");
        r.mps_pipe_dir.clone().expect("an MPS partition")
    };
    let (left, right) = (pipe("left", 0), pipe("right", 1));
    assert_ne!(left, right, "a daemon per GPU");
    let seen = std::fs::read_to_string(&log).unwrap();
    let mut lines: Vec<&str> = seen.lines().collect();
    lines.sort_unstable();
    let t0 = outcome.t0_ns;
    let render = |g: u32| format!("\"render_devices\":{{\"draw\":\"{}\"}}", uuid(g));
    assert_eq!(
        lines,
        [
            format!("left 50 none {left} {t0} 0 0 {}", render(1)),
            format!("right 70 none {right} {t0} 0 0 {}", render(1)),
        ]
    );
}

/// Time-sliced, each app's process is told its GPU by index (`ISOLANE_WORKER_GPU`), sees every
/// GPU (no `CUDA_VISIBLE_DEVICES`), and is sent its graphics stage's UUID as under MPS.
fn time_sliced_apps_on_two_gpus_are_told_their_gpu() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("s.toml");
    let text = TWO_GPUS
        .replace("partition = { thread_pct = 50 }\n", "")
        .replace("partition = { thread_pct = 70 }\n", "");
    let device = DeviceSpec {
        backend: Backend::Cuda,
        gpu: 0,
        gpus: vec![0, 1],
        mechanism: Mechanism::Timeslice,
        host: Host::Process,
    };
    let mut apps = parse_apps(&text, &file, &Names).unwrap();
    let uuid = |g: u32| format!("GPU-{g}{g}{g}{g}{g}{g}{g}{g}-0000-0000-0000-000000000000");
    isolane_app::placement::pin_render_devices(&mut apps, &device, &|g| Ok(uuid(g))).unwrap();
    let admitted = Plan {
        device: "test".into(),
        mechanism: Mechanism::Timeslice,
        workloads: isolane_app::partitions::as_workloads(&apps, &device)
            .iter()
            .map(|w| AdmittedWorkload {
                workload: w.name.clone(),
                partition: ResolvedPartition::Whole,
                memory_mib: None,
                gpu: w.gpu,
            })
            .collect(),
    };
    let log = tmp.path().join("workers.log");
    let script = tmp.path().join("worker.sh");
    std::fs::write(&script, fake_worker(&log)).unwrap();
    let command = WorkerCommand {
        program: PathBuf::from("/bin/sh"),
        args: vec![script.display().to_string()],
        env: Vec::new(),
    };
    let timing = TimingSpec::default();
    let stop = AtomicBool::new(false);
    let outcome = isolane_session::with_partitions(
        0,
        &admitted,
        isolane_session::PartitionChoices::default(),
        |session| {
            let env = session.worker_env().clone();
            let run = WorkerRun {
                command: &command,
                scenario: &file,
                text: &text,
                device: &device,
                timing: &timing,
                out: None,
                no_plan_check: false,
                env: &env,
                on_start: &|_| {},
                stop: &stop,
                guard: &Default::default(),
            };
            Ok::<_, std::convert::Infallible>(run_in_workers(&apps, &run))
        },
    )
    .unwrap()
    .unwrap()
    .unwrap();
    let seen = std::fs::read_to_string(&log).unwrap();
    let mut lines: Vec<&str> = seen.lines().collect();
    lines.sort_unstable();
    let t0 = outcome.t0_ns;
    let render = format!("\"render_devices\":{{\"draw\":\"{}\"}}", uuid(1));
    // No MPS: no thread percentage, no limit, the test's own (unused) pipe directory.
    let pipe = std::env::var("CUDA_MPS_PIPE_DIRECTORY").unwrap();
    assert_eq!(
        lines,
        [
            format!("left  none {pipe} {t0}  0 {render}"),
            format!("right  none {pipe} {t0}  1 {render}"),
        ]
    );
}
