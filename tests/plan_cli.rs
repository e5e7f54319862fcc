//! `isolane plan`: admission control through the CLI, against offline device models.

mod common;

use common::{isolane, scenario};

fn green(n: usize, sms: u32) -> String {
    let mut s = String::from("[device]\nbackend = \"cuda\"\nmechanism = \"green\"\n");
    for i in 0..n {
        s.push_str(&format!(
            "[[workload]]\nname = \"w{i}\"\nmodel = \"spin:1ms\"\nrate_hz = 10\njobs = 5\n\
             [workload.partition]\nsms = {sms}\n"
        ));
    }
    s
}

#[test]
fn fifteen_green_groups_of_eight_fit_an_h100_and_a_sixteenth_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let ok = scenario(tmp.path(), "ok.toml", &green(15, 8));
    let o = isolane()
        .args(["plan", "--device-model", "h100-sxm"])
        .arg(&ok)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("group 14: 8 SMs"), "{stdout}");

    // One split of the H100 keeping co-scheduled SMs together gives 15 groups of 8; a 16th
    // would be split off ignoring that, where cuDNN's kernels crash (docs/partitions.md).
    let over = scenario(tmp.path(), "over.toml", &green(16, 8));
    let o = isolane()
        .args(["plan", "--device-model", "h100-sxm"])
        .arg(&over)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("over.toml"), "{stderr}");
    assert!(stderr.contains("workload 'w15'"), "{stderr}");
    assert!(
        stderr.contains("only 0 of the 120 SMs that green contexts of h100-sxm can hold together"),
        "{stderr}"
    );
}

#[test]
fn json_lists_one_reason_per_rejected_workload() {
    let tmp = tempfile::tempdir().unwrap();
    let sc = scenario(tmp.path(), "s.toml", &green(2, 12));
    let o = isolane()
        .args(["plan", "--json", "--device-model", "orin-nano"])
        .arg(&sc)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["admitted"], false);
    let r = v["rejections"].as_array().unwrap();
    // Ampere: 12 SMs is on the step of 2, but the device has only 8 SMs.
    assert_eq!(r.len(), 2);
    assert_eq!(r[0]["reason"], "too_many_sms");
    assert_eq!(r[0]["workload"], "w0");
}

#[test]
fn unknown_device_model_names_the_allowed_ones() {
    let tmp = tempfile::tempdir().unwrap();
    let sc = scenario(tmp.path(), "s.toml", &green(1, 8));
    let o = isolane()
        .args(["plan", "--device-model", "h300"])
        .arg(&sc)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("h100-sxm") && stderr.contains("orin-nano"),
        "{stderr}"
    );
}

#[test]
fn an_a100_refuses_two_4g_instances() {
    let tmp = tempfile::tempdir().unwrap();
    let mut s = String::from("[device]\nbackend = \"cuda\"\nmechanism = \"mig\"\n");
    for i in 0..2 {
        s.push_str(&format!(
            "[[workload]]\nname = \"m{i}\"\nmodel = \"spin:1ms\"\nrate_hz = 10\njobs = 5\n\
             [workload.partition]\nmig_profile = \"4g.20gb\"\n"
        ));
    }
    let sc = scenario(tmp.path(), "mig.toml", &s);
    let o = isolane()
        .args(["plan", "--device-model", "a100-40gb"])
        .arg(&sc)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("no MIG placement"), "{stderr}");
}

fn cuda_model(mechanism: &str, workloads: &[(&str, &str, u32, &str)]) -> String {
    let mut s = format!("[device]\nbackend = \"cuda\"\nmechanism = \"{mechanism}\"\n");
    for (name, model, batch, partition) in workloads {
        s.push_str(&format!(
            "[[workload]]\nname = \"{name}\"\nmodel = \"{model}\"\nprecision = \"fp16\"\n\
             batch = {batch}\nrate_hz = 10\njobs = 5\n{partition}\n"
        ));
    }
    s
}

fn planned_mib(o: &std::process::Output) -> Vec<Option<u64>> {
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    v["plan"]["workloads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["memory_mib"].as_u64())
        .collect()
}

#[test]
fn memory_estimates_come_from_the_models_plan_and_each_process_context() {
    let tmp = tempfile::tempdir().unwrap();
    let sc = scenario(
        tmp.path(),
        "m.toml",
        &cuda_model(
            "timeslice",
            &[
                ("b1", "resnet18", 1, ""),
                ("b16", "resnet18", 16, ""),
                ("spin", "spin:1ms", 1, ""),
            ],
        ),
    );
    let o = isolane()
        .args(["plan", "--json", "--device-model", "h100-sxm"])
        .arg(&sc)
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let m = planned_mib(&o);
    let (b1, b16) = (m[0].unwrap(), m[1].unwrap());
    // Timeslice workers are processes: each pays a CUDA context (540 MiB) besides its model;
    // resnet18 fp16's weights are 22 MiB, and batch 16 needs a larger arena than batch 1.
    assert!((560..700).contains(&b1), "{m:?}");
    assert!(b16 > b1 + 20, "{m:?}");
    assert_eq!(m[2], None, "spin: workloads use no device memory");
}

#[test]
fn a_model_larger_than_its_mps_memory_limit_is_refused_before_anything_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let sc = scenario(
        tmp.path(),
        "mps.toml",
        &cuda_model(
            "mps",
            &[(
                "r18",
                "resnet18",
                1,
                "partition = { thread_pct = 50, mem_limit_mib = 100 }",
            )],
        ),
    );
    let o = isolane()
        .args(["plan", "--device-model", "h100-sxm"])
        .arg(&sc)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("workload 'r18'"), "{stderr}");
    assert!(stderr.contains("its partition has 100 MiB"), "{stderr}");
}

#[test]
fn workloads_that_need_more_than_the_device_holds_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let sc = scenario(
        tmp.path(),
        "big.toml",
        &cuda_model("timeslice", &[("huge", "resnet18", 2048, "")]),
    );
    let o = isolane()
        .args(["plan", "--device-model", "orin-nano"])
        .arg(&sc)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("workload 'huge'") && stderr.contains("more than the device's 7620 MiB"),
        "{stderr}"
    );
}

/// Green workloads of `sms` SMs, each on its GPU, on a device of GPUs 0 and 1.
fn green_on_two_gpus(placed: &[(u32, u32)]) -> String {
    let mut s =
        String::from("[device]\nbackend = \"cuda\"\ngpus = [0, 1]\nmechanism = \"green\"\n");
    for (i, (gpu, sms)) in placed.iter().enumerate() {
        s.push_str(&format!(
            "[[workload]]\nname = \"w{i}\"\nmodel = \"spin:1ms\"\nrate_hz = 10\njobs = 5\n\
             gpu = {gpu}\n[workload.partition]\nsms = {sms}\n"
        ));
    }
    s
}

#[test]
fn each_gpu_of_two_is_admitted_on_its_own_and_a_refusal_names_its_gpu() {
    let tmp = tempfile::tempdir().unwrap();
    let ok = scenario(
        tmp.path(),
        "ok.toml",
        &green_on_two_gpus(&[(0, 96), (1, 96)]),
    );
    let o = isolane()
        .args(["plan", "--json", "--device-model", "h100-sxm"])
        .arg(&ok)
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let w = v["plan"]["workloads"].as_array().unwrap();
    assert_eq!(
        (w[0]["gpu"].as_u64(), w[1]["gpu"].as_u64()),
        (Some(0), Some(1))
    );
    assert_eq!(w[1]["partition"]["first_sm"], 0, "GPU 1's SMs are its own");

    let over = scenario(
        tmp.path(),
        "over.toml",
        &green_on_two_gpus(&[(0, 96), (0, 96), (1, 8)]),
    );
    let o = isolane()
        .args(["plan", "--device-model", "h100-sxm"])
        .arg(&over)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("workload 'w1': on GPU 0: asks for 96 SMs"),
        "{stderr}"
    );
    assert!(!stderr.contains("'w2'"), "GPU 1 fits: {stderr}");
}

#[test]
fn a_workload_on_a_gpu_the_device_does_not_list_is_refused_with_the_allowed_ones() {
    let tmp = tempfile::tempdir().unwrap();
    let bad = green_on_two_gpus(&[(0, 8), (2, 8)]);
    let sc = scenario(tmp.path(), "s.toml", &bad);
    let o = isolane()
        .args(["plan", "--device-model", "h100-sxm"])
        .arg(&sc)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("workload[1].gpu") && stderr.contains("0 | 1"),
        "{stderr}"
    );
}

#[test]
fn commands_built_for_one_gpu_refuse_several_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let sc = scenario(tmp.path(), "s.toml", &green_on_two_gpus(&[(0, 8), (1, 8)]));
    let o = isolane().arg("isolation").arg(&sc).output().unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("device.gpus = [0, 1]"), "{stderr}");
    assert!(stderr.contains("works on one GPU"), "{stderr}");
}

/// `isolane plan --auto` and `isolane verify` work per GPU now: neither refuses `device.gpus`
/// by name (without a GPU here each fails on the missing GPU or its profiles instead).
#[test]
fn plan_auto_and_verify_take_several_gpus() {
    let tmp = tempfile::tempdir().unwrap();
    let sc = scenario(tmp.path(), "s.toml", &green_on_two_gpus(&[(0, 8), (1, 8)]));
    for args in [&["plan", "--auto"][..], &["verify", "--duration-s", "0.5"]] {
        let o = isolane().args(args).arg(&sc).output().unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(!stderr.contains("works on one GPU"), "{args:?}: {stderr}");
    }
}
