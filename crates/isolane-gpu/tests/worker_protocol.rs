//! The parent side of the probe-worker protocol, against shell-script workers (no GPU needed).

use std::path::{Path, PathBuf};
use std::time::Duration;

use isolane_gpu::verify::{measure_agents, ProbeAgent, ProcessAgent, WorkerCommand};

/// A worker that answers like `isolane verify --probe-worker`: items = 1000 alone, 250 while
/// its saturate flag file says others are busy; its GPU index is echoed in grid_blocks.
const FAKE_WORKER: &str = r#"#!/bin/sh
busy="$1"
echo "some unrelated output"
printf 'test helper ... @isolane READY\n'
while read -r cmd arg; do
    case "$cmd" in
        measure)
            n=$(ls "$busy" | wc -l)
            if [ "$n" -gt 0 ]; then items=250; else items=1000; fi
            echo "@isolane RESULT {\"blocks_per_s\":$items.0,\"gflops\":1.0,\"items\":$items,\"elapsed_s\":1.0,\"sm_ids_seen\":[0,1],\"grid_blocks\":$ISOLANE_PROBE_WORKER_GPU,\"config\":{\"block_threads\":256,\"iters\":1024}}" ;;
        saturate)
            touch "$busy/$$"
            echo "@isolane SATURATING"
            read -r s
            rm -f "$busy/$$"
            echo "@isolane STOPPED 7" ;;
        exit) exit 0 ;;
        *) echo "@isolane ERROR unknown command $cmd" ;;
    esac
done
"#;

/// A worker command that runs `text` as `sh <script> args...`. The script is read by sh, never
/// executed itself: exec'ing a file this process has just written fails with `Text file busy`
/// when another test of this binary forks while the file is still open for writing here (the
/// forked child holds the descriptor until its own exec).
fn script(dir: &Path, name: &str, text: &str, args: Vec<String>, gpu_arg: bool) -> WorkerCommand {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    WorkerCommand {
        program: PathBuf::from("/bin/sh"),
        args: std::iter::once(p.display().to_string())
            .chain(args)
            .collect(),
        env: vec![],
        gpu_arg,
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
        FAKE_WORKER,
        vec![busy.display().to_string()],
        false,
    );
    let mut agents: Vec<Box<dyn ProbeAgent>> = (0..3)
        .map(|i| {
            Box::new(ProcessAgent::spawn(format!("w{i}"), &cmd, 5, &[]).unwrap())
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
fn a_worker_that_fails_to_start_reports_why() {
    let tmp = tempfile::tempdir().unwrap();
    let cmd = script(
        tmp.path(),
        "bad",
        "echo '@isolane ERROR cuInit failed: CUDA_ERROR_NO_DEVICE'\nexit 1\n",
        vec![],
        true,
    );
    let err = ProcessAgent::spawn("w", &cmd, 0, &[]).err().expect("error");
    assert!(err.to_string().contains("CUDA_ERROR_NO_DEVICE"), "{err}");

    let cmd = script(tmp.path(), "dies", "exit 3\n", vec![], true);
    let err = ProcessAgent::spawn("w", &cmd, 0, &[]).err().expect("error");
    assert!(err.to_string().contains("exited"), "{err}");
}
