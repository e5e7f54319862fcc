//! verify's process agents over the worker protocol's probe role, against shell-script workers
//! that answer as `isolane worker` does (no GPU needed).

use std::path::{Path, PathBuf};
use std::time::Duration;

use isolane_gpu::verify::{measure_agents, ProbeAgent};
use isolane_runtime::protocol::PROTOCOL_VERSION;
use isolane_runtime::worker_client::WorkerCommand;
use isolane_session::verify::ProcessAgent;

/// A worker in the probe role: items = 1000 alone, 250 while its busy folder says others
/// saturate; the GPU index of its `probe` message is echoed in grid_blocks.
fn fake_worker(version: u32) -> String {
    format!(
        r#"#!/bin/sh
busy="$1"
echo '{{"type":"hello","protocol_version":{version},"pid":'$$',"isolane_version":"test"}}'
read -r role
gpu=$(echo "$role" | sed 's/.*"gpu":\([0-9]*\).*/\1/')
echo '{{"type":"probe_ready"}}'
while read -r line; do
    case "$line" in
        *'"type":"measure"'*)
            n=$(ls "$busy" | wc -l)
            if [ "$n" -gt 0 ]; then items=250; else items=1000; fi
            echo "{{\"type\":\"measured\",\"result\":{{\"blocks_per_s\":$items.0,\"gflops\":1.0,\"items\":$items,\"elapsed_s\":1.0,\"sm_ids_seen\":[0,1],\"grid_blocks\":$gpu,\"config\":{{\"block_threads\":256,\"iters\":1024}}}}}}" ;;
        *'"type":"start_saturate"'*)
            touch "$busy/$$"
            echo '{{"type":"saturating"}}'
            read -r s
            rm -f "$busy/$$"
            echo '{{"type":"saturate_stopped","launches":7}}' ;;
        *'"type":"stop"'*)
            echo '{{"type":"done","status":"ok","cpu":null}}'
            exit 0 ;;
        *) echo '{{"type":"error","message":"unexpected message"}}' ;;
    esac
done
"#
    )
}

/// A worker command that runs `text` as `sh <script> args...`. The script is read by sh, never
/// executed itself: exec'ing a file this process has just written fails with `Text file busy`
/// when another test of this binary forks while the file is still open for writing here (the
/// forked child holds the descriptor until its own exec).
fn script(dir: &Path, name: &str, text: &str, args: Vec<String>) -> WorkerCommand {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    WorkerCommand {
        program: PathBuf::from("/bin/sh"),
        args: std::iter::once(p.display().to_string())
            .chain(args)
            .collect(),
        env: vec![],
    }
}

#[test]
fn process_agents_are_measured_alone_and_beside_each_other() {
    let tmp = tempfile::tempdir().unwrap();
    let busy = tmp.path().join("busy");
    std::fs::create_dir(&busy).unwrap();
    let cmd = script(
        tmp.path(),
        "worker",
        &fake_worker(PROTOCOL_VERSION),
        vec![busy.display().to_string()],
    );
    let mut agents: Vec<Box<dyn ProbeAgent>> = (0..3)
        .map(|i| {
            Box::new(ProcessAgent::spawn(&format!("w{i}"), &cmd, 5, &[]).unwrap())
                as Box<dyn ProbeAgent>
        })
        .collect();
    let rows = measure_agents(&mut agents, Duration::from_millis(1), false).unwrap();
    assert_eq!(rows.len(), 3);
    for (alone, beside) in rows {
        assert_eq!(alone.items, 1000);
        assert_eq!(alone.grid_blocks, 5, "the GPU index reaches the worker");
        assert_eq!(beside.unwrap().items, 250);
    }
    assert_eq!(std::fs::read_dir(&busy).unwrap().count(), 0, "all stopped");
}

#[test]
fn a_worker_of_another_protocol_version_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let busy = tmp.path().join("busy");
    std::fs::create_dir(&busy).unwrap();
    let cmd = script(
        tmp.path(),
        "old",
        &fake_worker(PROTOCOL_VERSION - 1),
        vec![busy.display().to_string()],
    );
    let err = ProcessAgent::spawn("w", &cmd, 0, &[]).err().expect("error");
    let msg = err.to_string();
    assert!(
        msg.contains("version mismatch")
            && msg.contains(&format!("version {}", PROTOCOL_VERSION - 1)),
        "{msg}"
    );
}

#[test]
fn a_worker_that_fails_to_start_reports_why() {
    let tmp = tempfile::tempdir().unwrap();
    let hello = format!(
        r#"echo '{{"type":"hello","protocol_version":{PROTOCOL_VERSION},"pid":1,"isolane_version":"t"}}'"#
    );
    let fails = format!(
        "{hello}\nread -r role\necho '{{\"type\":\"error\",\"message\":\"cuInit failed: CUDA_ERROR_NO_DEVICE\"}}'\nexit 1\n"
    );
    let cmd = script(tmp.path(), "bad", &fails, vec![]);
    let err = ProcessAgent::spawn("w", &cmd, 0, &[]).err().expect("error");
    assert!(err.to_string().contains("CUDA_ERROR_NO_DEVICE"), "{err}");

    let cmd = script(tmp.path(), "dies", &format!("{hello}\nexit 3\n"), vec![]);
    let err = ProcessAgent::spawn("w", &cmd, 0, &[]).err().expect("error");
    assert!(err.to_string().contains("exited"), "{err}");
}
