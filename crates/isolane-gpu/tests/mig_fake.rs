//! MIG planning and instance management against a fake NVML (MIG is off on our GPU and must
//! stay off).

use isolane_core::admission::{admit, AdmissionOptions, Plan};
use isolane_core::device_model::device_model;
use isolane_core::spec::*;
use isolane_gpu::mig::fake::FakeMig;
use isolane_gpu::mig::{self, MigBackend};

fn plan(profiles: &[&str]) -> Plan {
    let dev = device_model("h100-sxm").unwrap();
    admit(&scenario(profiles), &dev, &[], &AdmissionOptions::default()).expect("admitted")
}

/// The plan of `placed` (GPU, profile) on a device of GPUs 0 and 1.
fn plan_on_two_gpus(placed: &[(u32, &str)]) -> Plan {
    let profiles: Vec<&str> = placed.iter().map(|(_, p)| *p).collect();
    let mut s = scenario(&profiles);
    s.device.gpus = vec![0, 1];
    for (w, (g, _)) in s.workloads.iter_mut().zip(placed) {
        w.gpu = Some(*g);
    }
    let dev = device_model("h100-sxm").unwrap();
    admit(&s, &dev, &[], &AdmissionOptions::default()).expect("admitted")
}

fn scenario(profiles: &[&str]) -> Scenario {
    Scenario {
        device: DeviceSpec {
            backend: Backend::Cuda,
            gpu: 0,
            mechanism: Mechanism::Mig,
            host: Host::Process,
            gpus: Vec::new(),
        },
        timing: TimingSpec::default(),
        protection: ProtectionSpec::default(),
        workloads: profiles
            .iter()
            .enumerate()
            .map(|(i, p)| WorkloadSpec {
                name: format!("w{i}"),
                model: "spin:1ms".into(),
                weights: None,
                batch: 1,
                precision: Precision::Fp32,
                calibration: None,
                rate: Rate::Hz(10.0),
                deadline_ms: None,
                phase_ms: None,
                length: RunLength::Jobs(1),
                warmup_jobs: 0,
                late: LatePolicy::Skip,
                cpu: vec![],
                role: Role::Standalone,
                ramp: None,
                host: Host::Process,
                partition: PartitionSpec {
                    mig_profile: Some(p.to_string()),
                    ..Default::default()
                },
                plan_check: true,
                criticality: Criticality::Critical,
                stretch: None,
                backend: Backend::Cuda,
                program: None,
                gpu: None,
                serve: Default::default(),
            })
            .collect(),
    }
}

fn mutating(calls: &[String]) -> Vec<String> {
    calls
        .iter()
        .filter(|c| c.starts_with("create") || c.starts_with("destroy"))
        .cloned()
        .collect()
}

#[test]
fn refuses_when_mig_mode_is_off() {
    let f = FakeMig::new(false);
    let err = mig::plan_and_create(&f, 0, &plan(&["3g.40gb"]), true).unwrap_err();
    assert!(err.to_string().contains("MIG mode is off"), "{err}");
    assert!(mutating(&f.calls()).is_empty());
    // The mode is what it was: nothing can change it.
    assert!(!f.mig_mode(0).unwrap().current);
}

#[test]
fn refuses_without_the_allow_flag() {
    let f = FakeMig::new(true);
    let err = mig::plan_and_create(&f, 0, &plan(&["3g.40gb"]), false).unwrap_err();
    assert!(err.to_string().contains("--allow-mig-reconfigure"), "{err}");
    assert!(mutating(&f.calls()).is_empty());
}

#[test]
fn creates_and_destroys_exactly_the_planned_instances() {
    let f = FakeMig::new(true);
    let p = plan(&["3g.40gb", "2g.20gb", "1g.10gb"]);
    let inst = mig::plan_and_create(&f, 0, &p, true).unwrap();
    assert_eq!(inst.instances().len(), 3);
    {
        let st = f.state.borrow();
        assert_eq!(st.gis.len(), 3);
        assert_eq!(st.cis.len(), 3);
        // Placements are the planner's (memory slices), sizes the profiles'.
        let mut got: Vec<(u32, u32)> = st.gis.iter().map(|g| (g.start, g.size)).collect();
        got.sort();
        let mut want: Vec<(u32, u32)> = p
            .workloads
            .iter()
            .map(|w| match &w.partition {
                isolane_core::admission::ResolvedPartition::Mig { profile, start, .. } => {
                    let prof = f.profiles.iter().find(|x| &x.name == profile).unwrap();
                    (*start, prof.memory_slices)
                }
                _ => unreachable!(),
            })
            .collect();
        want.sort();
        assert_eq!(got, want);
    }
    for w in ["w0", "w1", "w2"] {
        assert!(inst.visible_devices(w).unwrap().starts_with("MIG-"));
    }
    inst.destroy().unwrap();
    let st = f.state.borrow();
    assert!(st.gis.is_empty() && st.cis.is_empty());
    let m = mutating(&st.calls);
    assert_eq!(
        m.iter()
            .filter(|c| c.as_str() == "create_gpu_instance")
            .count(),
        3
    );
    assert_eq!(
        m.iter()
            .filter(|c| c.as_str() == "destroy_gpu_instance")
            .count(),
        3
    );
    assert_eq!(
        m.iter()
            .filter(|c| c.as_str() == "destroy_compute_instance")
            .count(),
        3
    );
    // Compute instances go before their GPU instance.
    let first_gi_destroy = m.iter().position(|c| c == "destroy_gpu_instance").unwrap();
    assert_eq!(m[first_gi_destroy - 1], "destroy_compute_instance");
}

#[test]
fn dropping_the_guard_destroys_the_instances() {
    let f = FakeMig::new(true);
    {
        let _inst = mig::plan_and_create(&f, 0, &plan(&["4g.40gb", "3g.40gb"]), true).unwrap();
        assert_eq!(f.state.borrow().gis.len(), 2);
    }
    assert!(f.state.borrow().gis.is_empty());
    assert!(f.state.borrow().cis.is_empty());
}

#[test]
fn cleans_up_when_creation_fails_midway() {
    for fail in [
        ("create_gpu_instance", 2),
        ("create_compute_instance", 1),
        ("mig_device_uuid", 2),
    ] {
        let mut f = FakeMig::new(true);
        f.fail = Some(fail);
        let err = mig::plan_and_create(&f, 0, &plan(&["1g.10gb", "1g.10gb", "2g.20gb"]), true)
            .unwrap_err();
        assert!(err.to_string().contains("injected"), "{fail:?}: {err}");
        let st = f.state.borrow();
        assert!(
            st.gis.is_empty(),
            "{fail:?}: GPU instances left: {:?}",
            st.gis
        );
        assert!(
            st.cis.is_empty(),
            "{fail:?}: compute instances left: {:?}",
            st.cis
        );
    }
}

#[test]
fn an_unknown_profile_is_refused_before_anything_is_created() {
    let mut f = FakeMig::new(true);
    f.profiles.retain(|p| p.name != "2g.20gb");
    let err = mig::plan_and_create(&f, 0, &plan(&["1g.10gb", "2g.20gb"]), true).unwrap_err();
    assert!(err.to_string().contains("2g.20gb"), "{err}");
    assert!(mutating(&f.calls()).is_empty());
}

#[test]
fn listing_is_read_only() {
    let f = FakeMig::new(true);
    let l = mig::list(&f, 0).unwrap();
    assert!(l.mode.current);
    assert_eq!(l.profiles.len(), 7);
    assert!(mutating(&f.calls()).is_empty());
    let off = FakeMig::new(false);
    let l = mig::list(&off, 0).unwrap();
    assert!(l.profiles.is_empty());
}

#[test]
fn a_partition_session_binds_each_worker_to_its_instance_and_destroys_them() {
    use isolane_gpu::partitions::{PartitionSession, SessionOptions};
    let f = FakeMig::new(true);
    let opts = SessionOptions {
        allow_mig_reconfigure: true,
        ..Default::default()
    };
    let s = PartitionSession::set_up(0, &plan(&["4g.40gb", "3g.40gb"]), &opts, Some(&f)).unwrap();
    assert_eq!(f.state.borrow().gis.len(), 2);
    for w in ["w0", "w1"] {
        let env = &s.worker_env()[w];
        assert_eq!(env.len(), 2);
        assert_eq!(env[0].0, "CUDA_VISIBLE_DEVICES");
        assert_eq!(env[1], ("ISOLANE_WORKER_GPU".to_string(), "0".to_string()));
        assert!(env[0].1.starts_with("MIG-"), "{env:?}");
    }
    assert_ne!(s.worker_env()["w0"], s.worker_env()["w1"]);
    let r = s.records();
    assert_eq!(r.len(), 2);
    assert!(r[0].partition.starts_with("mig 4g.40gb"), "{r:?}");
    assert!(r
        .iter()
        .all(|r| r.granted_sms.is_some() && r.mig_device.is_some()));
    s.finish().unwrap();
    assert!(f.state.borrow().gis.is_empty());
    assert!(f.state.borrow().cis.is_empty());
}

#[test]
fn a_partition_session_without_the_allow_flag_creates_nothing() {
    use isolane_gpu::partitions::{PartitionSession, SessionOptions};
    let f = FakeMig::new(true);
    let e = PartitionSession::set_up(0, &plan(&["1g.10gb"]), &SessionOptions::default(), Some(&f))
        .unwrap_err();
    assert!(e.to_string().contains("--allow-mig-reconfigure"), "{e}");
    assert!(mutating(&f.calls()).is_empty());
}

#[test]
fn a_partition_session_on_two_gpus_creates_each_gpus_instances_on_it() {
    use isolane_gpu::partitions::{PartitionSession, SessionOptions};
    let f = FakeMig::new(true);
    let opts = SessionOptions {
        allow_mig_reconfigure: true,
        ..Default::default()
    };
    // The same memory slices on each GPU (4g.40gb at slice 0 twice): each GPU has its own.
    let plan = plan_on_two_gpus(&[(0, "4g.40gb"), (1, "4g.40gb"), (0, "3g.40gb")]);
    let s = PartitionSession::set_up(0, &plan, &opts, Some(&f)).unwrap();
    let gpu_of = |id: u32| f.state.borrow().gi_gpu[&id];
    let gis: Vec<u32> = f.state.borrow().gis.iter().map(|g| g.id).collect();
    assert_eq!(
        gis.iter().map(|&id| gpu_of(id)).collect::<Vec<_>>(),
        [0, 0, 1]
    );
    for (w, gpu) in [("w0", 0u32), ("w1", 1), ("w2", 0)] {
        let env = &s.worker_env()[w];
        assert!(env[0].1.starts_with(&format!("MIG-{gpu:08x}-")), "{env:?}");
        assert_eq!(env[1], ("ISOLANE_WORKER_GPU".to_string(), "0".to_string()));
        let r = s.records().iter().find(|r| r.workload == w).unwrap();
        assert!(r.partition.ends_with(&format!(" on GPU {gpu}")), "{r:?}");
    }
    s.finish().unwrap();
    assert!(f.state.borrow().gis.is_empty());
    assert!(f.state.borrow().cis.is_empty());
}
