//! GPU test of a scenario on two GPUs (docs/partitions.md, Several GPUs): run on a machine with
//! two GPUs (`nvidia-h100-x2`) with `scripts/gpu-test.sh run two_gpus`. Without a GPU it fails,
//! as every GPU test does; with one GPU it prints SKIPPED and returns, so that a plain
//! `scripts/gpu-test.sh run` on the one-GPU machine stays green.

use std::time::Duration;

use isolane_gpu::probe::{ProbeConfig, ProbeResult};
use isolane_gpu::verify::{ProbeAgent, ThreadAgent, ThreadTarget};

const MEASURE: Duration = Duration::from_secs(1);

fn print_result(what: &str, r: &ProbeResult) {
    println!(
        "{what}: {:.0} blocks/s, {} SMs seen, grid {}",
        r.blocks_per_s,
        r.sm_ids_seen.len(),
        r.grid_blocks
    );
}

/// Several GPUs (docs/partitions.md): a session on GPUs 0 and 1 makes each GPU's green groups
/// on that GPU. 104 + 104 SMs cannot be one H100's split, so creating both proves the split per
/// GPU; a group then runs on 104 SMs of its own GPU and loses nothing to the other GPU's
/// saturated group.
#[test]
#[ignore = "needs two CUDA GPUs (nvidia-h100-x2)"]
fn a_session_on_two_gpus_makes_each_gpus_green_groups_on_that_gpu() {
    use isolane_core::admission::{AdmittedWorkload, Plan, ResolvedPartition};
    use isolane_core::spec::Mechanism;
    use isolane_gpu::partitions::{PartitionSession, SessionOptions};
    let group = |name: &str, gpu: u32| AdmittedWorkload {
        workload: name.into(),
        partition: ResolvedPartition::Green {
            group: 0,
            sms: 104,
            first_sm: 0,
        },
        memory_mib: None,
        gpu: Some(gpu),
    };
    let plan = Plan {
        device: "h100-sxm".into(),
        mechanism: Mechanism::Green,
        workloads: vec![group("a", 0), group("b", 1)],
    };
    let gpus = isolane_gpu::list_devices().expect("a CUDA device").len();
    if gpus < 2 {
        // Not a pass by finding no GPU: one GPU is a machine this test is not for.
        println!("SKIPPED: needs two GPUs, this machine has {gpus}");
        return;
    }
    let mut s = PartitionSession::set_up(0, &plan, &SessionOptions::default(), None)
        .expect("104 SMs on each of GPUs 0 and 1");
    println!("{:?}\n{:?}", s.records(), s.notes());
    let mut agents = Vec::new();
    for (w, gpu) in [("a", 0), ("b", 1)] {
        let g = s.take_green_group(w).expect("a group per workload");
        assert_eq!(g.granted_sms(), 104, "{w}");
        let r = s.records().iter().find(|r| r.workload == w).unwrap();
        assert!(r.partition.ends_with(&format!(" on GPU {gpu}")), "{r:?}");
        let target = ThreadTarget::Green {
            device_index: gpu,
            group: g,
        };
        agents.push(ThreadAgent::spawn(w, target, ProbeConfig::default()).expect("probe"));
    }
    let alone = agents[0].measure(MEASURE).expect("a alone");
    print_result("GPU 0 group alone", &alone);
    assert_eq!(alone.sm_ids_seen.len(), 104, "{:?}", alone.sm_ids_seen);
    agents[1].start_saturate().expect("saturate GPU 1");
    std::thread::sleep(Duration::from_millis(300));
    let beside = agents[0].measure(MEASURE).expect("a beside");
    agents[1].stop_saturate().expect("stop");
    print_result("GPU 0 group beside GPU 1 saturated", &beside);
    let lost = 1.0 - beside.blocks_per_s / alone.blocks_per_s;
    println!("lost {:.2}% to the other GPU", lost * 100.0);
    assert!(
        lost < 0.05,
        "lost {:.2}% to another GPU's work",
        lost * 100.0
    );
    drop(agents);
    s.finish().expect("taken down");
}
