//! A command workload in an MPS partition, through the session as `isolane run` sets it up,
//! against the fake MPS control script (CI has no GPU): the program gets the private daemon's
//! pipe directory, its thread percentage and its pinned memory limit.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use isolane_core::admission::{AdmittedWorkload, Plan, ResolvedPartition};
use isolane_core::spec::{Mechanism, Scenario};
use isolane_runtime::coordinator::{RunOptions, RunPlan};
use isolane_runtime::WorkloadStatus;
use isolane_session::{run_in_partitions, PartitionChoices};

#[test]
fn a_program_in_an_mps_partition_gets_the_private_daemons_client_environment() {
    let tmp = tempfile::tempdir().unwrap();
    let bin = tmp.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let control = isolane_gpu::mps::write_fake_control(&bin).unwrap();
    // The only test of this binary: nothing else reads the environment concurrently.
    std::env::set_var(isolane_gpu::mps::CONTROL_ENV, &control);
    // Where a system-wide daemon would listen: an empty folder of ours, so none is found.
    std::env::set_var("CUDA_MPS_PIPE_DIRECTORY", tmp.path().join("no-daemon"));

    let scenario = Scenario::from_toml_str(
        r#"
[device]
backend = "cuda"
mechanism = "mps"

[timing]
start_delay_ms = 10

[[workload]]
name = "client"
command = ["sh", "-c", "echo $CUDA_MPS_ACTIVE_THREAD_PERCENTAGE $CUDA_MPS_PINNED_DEVICE_MEM_LIMIT $CUDA_MPS_PIPE_DIRECTORY"]
timeout_s = 60
partition = { thread_pct = 25, mem_limit_mib = 1024 }
"#,
        tmp.path().join("s.toml"),
        &Vec::<String>::new(),
    )
    .unwrap();
    let admitted = Plan {
        device: "test".into(),
        mechanism: Mechanism::Mps,
        workloads: vec![AdmittedWorkload {
            workload: "client".into(),
            partition: ResolvedPartition::Mps {
                thread_pct: 25,
                mem_limit_mib: Some(1024),
            },
            memory_mib: None,
            gpu: None,
        }],
    };
    let out = tmp.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let mut opts = RunOptions::new(Arc::new(AtomicBool::new(false)));
    opts.jobs_dir = Some(out.clone());
    let plan = RunPlan::from_scenario(&scenario);
    let (result, records) = run_in_partitions(
        0,
        Some(&admitted),
        PartitionChoices::default(),
        &plan,
        opts,
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(result.workloads[0].status, WorkloadStatus::Ok);
    let pipe_dir = records[0].mps_pipe_dir.clone().expect("an MPS partition");
    let seen = std::fs::read_to_string(out.join("client.stdout")).unwrap();
    assert_eq!(seen, format!("25 0=1024M {pipe_dir}\n"));
}
