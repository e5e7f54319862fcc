//! `isolane plan --auto --device-model NAME` (issue 15): planning for a GPU that is not here,
//! from the committed profiles of tests/data/profiles (synthetic, see tests/data/README.md):
//! green, MPS, time-slicing and MIG on an H100, MIG on an A100; the refusals (a missing
//! profile, MIG instances that cannot be placed together, memory). Nothing here touches a GPU.

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

use common::*;

fn data(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(rel)
}

const H100: &str = "NVIDIA_H100_80GB_HBM3/580.159.04";

fn offline(args: &[&str], scenario: &Path, profiles: &Path) -> Output {
    isolane()
        .args(["plan", "--auto"])
        .args(args)
        .arg("--profiles")
        .arg(profiles)
        .arg(scenario)
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// stderr with its lines joined: plan --auto wraps its messages to 80 columns.
fn flat(b: &[u8]) -> String {
    text(b).split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A copy of the committed profiles to change.
fn copy_profiles(to: &Path) -> PathBuf {
    let dst = to.join("profiles");
    for entry in walk(&data("profiles")) {
        let rel = entry.strip_prefix(data("profiles")).unwrap();
        std::fs::create_dir_all(dst.join(rel).parent().unwrap()).unwrap();
        std::fs::copy(&entry, dst.join(rel)).unwrap();
    }
    dst
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            files.extend(walk(&p));
        } else {
            files.push(p);
        }
    }
    files.sort();
    files
}

/// Writes a profile in the cache's format: execution time `floor + work / sms`.
fn write_profile(dir: &Path, file: &str, floor_ms: f64, work_ms: f64, sms: f64) {
    let p50 = floor_ms + work_ms / sms;
    let json = serde_json::json!({
        "exec_p50_ms": p50,
        "exec_p99_ms": 1.1 * p50,
        "exec_mean_ms": p50,
    });
    std::fs::write(dir.join(H100).join(file), json.to_string()).unwrap();
}

#[test]
fn the_planned_scenario_never_replaces_the_scenario_it_is_planned_from() {
    let tmp = tempfile::tempdir().unwrap();
    let sc = tmp.path().join("mine.toml");
    std::fs::copy(data("offline.toml"), &sc).unwrap();
    let before = std::fs::read(&sc).unwrap();
    let o = offline(
        &["--device-model", "h100-sxm", "-o", sc.to_str().unwrap()],
        &sc,
        &data("profiles"),
    );
    let err = flat(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("-o is the same file as the scenario"), "{err}");
    assert_eq!(std::fs::read(&sc).unwrap(), before);
}

/// `-o` naming a folder and `--export-profiles` naming a file were refused only once the plan
/// was made (its profiles measured: minutes on a GPU), the second with exit 1 as a failure of
/// the machine. Both are the user's, said before anything is planned or measured.
#[test]
fn a_bad_output_path_is_refused_before_anything_is_planned() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("a-file");
    std::fs::write(&file, "mine").unwrap();
    let folder = tmp.path().to_str().unwrap();
    let not_a_folder = file.to_str().unwrap();
    for (args, said) in [
        (vec!["-o", folder], "is a folder, not a regular file"),
        (vec!["--export-profiles", not_a_folder], "--export-profiles"),
        (
            vec!["--export-profiles", "/dev/null"],
            "exists and is not a folder",
        ),
    ] {
        let mut all = vec!["--device-model", "h100-sxm"];
        all.extend(&args);
        let o = offline(&all, &data("offline.toml"), &data("profiles"));
        let err = flat(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(said), "{args:?}: {err}");
        // Nothing planned: no plan line and no planned scenario printed.
        assert!(
            !err.contains("SMs"),
            "{args:?}: planned before refusing: {err}"
        );
        assert!(o.stdout.is_empty(), "{args:?}: {}", text(&o.stdout));
    }
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "mine");
}

#[test]
fn an_h100_is_planned_offline_with_every_mechanism_from_committed_profiles() {
    let tmp = tempfile::tempdir().unwrap();
    let o = offline(
        &["--device-model", "h100-sxm", "--mechanism", "all"],
        &data("offline.toml"),
        &data("profiles"),
    );
    let (out, err) = (text(&o.stdout), flat(&o.stderr));
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        err.contains("planning offline for h100-sxm from")
            && err.contains(
                "profiles of NVIDIA H100 80GB HBM3, driver 580.159.04 (the only driver found); \
                 nothing is measured"
            ),
        "{err}"
    );
    // camera: 1.1 (0.1 + 60/s) <= 1.8 ms -> 40 SMs; lidar: 1.1 (0.2 + 150/s) <= 4.5 -> 40.
    // Several green contexts of an H100 hold 120 of its 132 SMs (DeviceModel::green_split_limit).
    assert!(
        err.contains("green: planned") && err.contains("using 80 SMs of 120 SMs (40 SMs spare)"),
        "{err}"
    );
    assert!(
        err.contains("mps: planned") && err.contains("60 % of 100 %"),
        "{err}"
    );
    assert!(
        err.contains("timeslice: no plan") && err.contains("`camera`: taking turns"),
        "{err}"
    );
    assert!(
        err.contains("mig: planned")
            && err.contains("using 6 compute slices of 7 compute slices (1 compute slice spare)")
            && err.contains("3g.40gb at memory slice 0")
            && err.contains("3g.40gb at memory slice 4"),
        "{err}"
    );
    // The first mechanism with a plan is written.
    assert!(
        out.contains("# planned: 40 SMs") && out.contains("sms = 40"),
        "{out}"
    );

    // MIG alone, written to a file that admission control takes as it is.
    let planned = tmp.path().join("mig.toml");
    let o = isolane()
        .args([
            "plan",
            "--auto",
            "--device-model",
            "h100-sxm",
            "--mechanism",
            "mig",
        ])
        .arg("--profiles")
        .arg(data("profiles"))
        .arg("-o")
        .arg(&planned)
        .arg(data("offline.toml"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", flat(&o.stderr));
    let written = std::fs::read_to_string(&planned).unwrap();
    assert!(
        written.contains("# planned: 3g.40gb at memory slice 0; predicted p99 1.485 ms")
            && written.contains("mig_profile = \"3g.40gb\"")
            && written.contains("mechanism = \"mig\""),
        "{written}"
    );
    let o = run_ok(
        isolane()
            .args(["plan", "--device-model", "h100-sxm"])
            .arg(&planned),
    );
    assert!(text(&o.stdout).contains("3g.40gb at memory slice 4"));
}

#[test]
fn an_a100_is_planned_with_mig_and_mechanism_all_takes_what_has_profiles() {
    let o = offline(
        &["--device-model", "a100-80gb", "--mechanism", "all"],
        &data("offline.toml"),
        &data("profiles"),
    );
    let (out, err) = (text(&o.stdout), flat(&o.stderr));
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(err.contains("driver 580.65.06"), "{err}");
    // The A100 profiles hold MIG only: green says what it lacks, MIG plans (14 SMs a slice:
    // camera 1.1 (0.1 + 60/42) = 1.681 ms in 3g.40gb).
    assert!(
        err.contains("green: no plan")
            && err.contains(
                "not profiled: `camera` (kernel:gemm:1024, batch 1, fp32, green): no profile of \
                 108 SMs in"
            ),
        "{err}"
    );
    assert!(
        err.contains("mig: planned") && err.contains("p99 1.681"),
        "{err}"
    );
    assert!(out.contains("mig_profile = \"3g.40gb\""), "{out}");
}

#[test]
fn a_missing_profile_is_named_with_what_there_is_and_how_to_get_it() {
    let tmp = tempfile::tempdir().unwrap();
    let profiles = copy_profiles(tmp.path());
    std::fs::remove_file(
        profiles
            .join(H100)
            .join("kernel_triad_1GiB-b1-fp32-green-40.json"),
    )
    .unwrap();
    let planned = tmp.path().join("planned.toml");
    let o = isolane()
        .args(["plan", "--auto", "--device-model", "h100-sxm", "--profiles"])
        .arg(&profiles)
        .arg("-o")
        .arg(&planned)
        .arg(data("offline.toml"))
        .output()
        .unwrap();
    let err = flat(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains(
            "not profiled: `lidar` (kernel:triad:1GiB, batch 1, fp32, green): no profile of 40 \
             SMs in"
        ) && err.contains(
            "(NVIDIA H100 80GB HBM3, driver 580.159.04); it has 32 SMs, 48 SMs, 64 SMs, 128 SMs"
        ),
        "{err}"
    );
    assert!(err.contains("best partial plan: camera 40 SMs"), "{err}");
    assert!(
        err.contains("measure the missing profiles on a h100-sxm")
            && err.contains("--export-profiles DIR"),
        "{err}"
    );
    assert!(!planned.exists(), "no plan, no file");

    // A folder without the device model, and a driver it does not have: exit 2, by name.
    let o = offline(
        &["--device-model", "a100-40gb"],
        &data("offline.toml"),
        &data("profiles"),
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(
        flat(&o.stderr).contains("has no profiles measured on a100-40gb (found: "),
        "{}",
        flat(&o.stderr)
    );
    let o = offline(
        &["--device-model", "h100-sxm", "--driver", "1.0"],
        &data("offline.toml"),
        &data("profiles"),
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(flat(&o.stderr).contains("drivers found: 580.159.04"));
    let o = offline(
        &["--device-model", "b200"],
        &data("offline.toml"),
        &data("profiles"),
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(flat(&o.stderr).contains("allowed: h100-sxm, h200"));
}

#[test]
fn mig_instances_that_do_not_fit_together_and_mig_without_profiles_are_said() {
    let tmp = tempfile::tempdir().unwrap();
    // Three workloads that each need 3g.40gb (the same model, batch and precision as camera).
    let three = std::fs::read_to_string(data("offline.toml")).unwrap()
        + "\n[[workload]]\nname = \"camera2\"\nmodel = \"kernel:gemm:1024\"\nrate_hz = 100\n\
         deadline_ms = 2\nduration_s = 10\n";
    let s = scenario(tmp.path(), "three.toml", &three);
    let o = offline(
        &["--device-model", "h100-sxm", "--mechanism", "mig"],
        &s,
        &data("profiles"),
    );
    let err = flat(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains(
            "together they need 9 compute slices of 7 compute slices (camera 3g.40gb, lidar \
             3g.40gb, camera2 3g.40gb)"
        ),
        "{err}"
    );
    assert!(
        err.contains(
            "best partial plan: camera 3g.40gb at memory slice 0, lidar 3g.40gb at memory slice 4"
        ),
        "{err}"
    );

    // Without MIG profiles, --mechanism all says why MIG is left out.
    let profiles = copy_profiles(tmp.path());
    for f in walk(&profiles) {
        if f.to_string_lossy().contains("-mig-") {
            std::fs::remove_file(f).unwrap();
        }
    }
    let o = offline(
        &["--device-model", "h100-sxm", "--mechanism", "all"],
        &data("offline.toml"),
        &profiles,
    );
    let err = flat(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        err.contains(
            "mig: skipped: no MIG profiles of `camera` (kernel:gemm:1024, batch 1, fp32, mig) in"
        ) && !err.contains("mig: planned"),
        "{err}"
    );
}

#[test]
fn device_memory_is_checked_together() {
    let tmp = tempfile::tempdir().unwrap();
    let profiles = copy_profiles(tmp.path());
    // Two 40 GiB triads: each fits the H100's 81559 MiB, together they do not.
    for sms in (8..=128).step_by(8) {
        let file = format!("kernel_triad_40GiB-b1-fp32-green-{sms}.json");
        write_profile(&profiles, &file, 0.2, 150.0, sms as f64);
    }
    let big = std::fs::read_to_string(data("offline.toml"))
        .unwrap()
        .replace("kernel:gemm:1024", "kernel:triad:40GiB")
        .replace("kernel:triad:1GiB", "kernel:triad:40GiB");
    let s = scenario(tmp.path(), "big.toml", &big);
    let o = offline(&["--device-model", "h100-sxm"], &s, &profiles);
    let err = flat(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("together they need about")
            && err.contains("MiB of device memory, the device has 81559 MiB (camera"),
        "{err}"
    );
    assert!(err.contains("best partial plan: camera"), "{err}");
}

#[test]
fn the_profiles_a_plan_used_are_exported_and_plan_the_same_elsewhere() {
    let tmp = tempfile::tempdir().unwrap();
    let exported = tmp.path().join("exported");
    let first = isolane()
        .args([
            "plan",
            "--auto",
            "--device-model",
            "h100-sxm",
            "--mechanism",
            "green",
        ])
        .arg("--profiles")
        .arg(data("profiles"))
        .arg("--export-profiles")
        .arg(&exported)
        .arg(data("offline.toml"))
        .output()
        .unwrap();
    assert_eq!(first.status.code(), Some(0), "{}", text(&first.stderr));
    assert!(text(&first.stderr).contains("exported 10 profiles to"));
    let files = walk(&exported);
    assert_eq!(
        files.len(),
        11,
        "10 green profiles and device.json: {files:?}"
    );
    assert!(files.iter().all(|f| {
        let n = f.file_name().unwrap().to_string_lossy();
        n == "device.json" || n.contains("-green-")
    }));
    let again = offline(
        &["--device-model", "h100-sxm", "--mechanism", "green"],
        &data("offline.toml"),
        &exported,
    );
    assert_eq!(again.status.code(), Some(0), "{}", text(&again.stderr));
    assert_eq!(text(&again.stdout), text(&first.stdout));
}

/// `[device] gpus = [0, 1]` of `workloads` (`(name, model, rate_hz, deadline_ms, gpu)`).
fn two_gpus(dir: &Path, workloads: &[(&str, &str, u32, u32, Option<u32>)]) -> PathBuf {
    let mut s =
        String::from("[device]\nbackend = \"cuda\"\ngpus = [0, 1]\nmechanism = \"green\"\n");
    for (name, model, rate, deadline, gpu) in workloads {
        s.push_str(&format!(
            "\n[[workload]]\nname = \"{name}\"\nmodel = \"{model}\"\nrate_hz = {rate}\n\
             deadline_ms = {deadline}\nduration_s = 10\n"
        ));
        if let Some(g) = gpu {
            s.push_str(&format!("gpu = {g}\n"));
        }
    }
    let p = dir.join("two.toml");
    std::fs::write(&p, s).unwrap();
    p
}

const GEMM: &str = "kernel:gemm:1024";
const TRIAD: &str = "kernel:triad:1GiB";

#[test]
fn two_gpus_are_planned_offline_placing_the_workloads_and_keeping_pinned_ones() {
    let tmp = tempfile::tempdir().unwrap();
    // 40 SMs each (as in offline.toml): five need 200 SMs, more than one H100's 132.
    let sc = two_gpus(
        tmp.path(),
        &[
            ("camera", GEMM, 100, 2, None),
            ("camera2", GEMM, 100, 2, None),
            ("camera3", GEMM, 100, 2, None),
            ("lidar", TRIAD, 20, 5, None),
            ("lidar2", TRIAD, 20, 5, Some(1)),
        ],
    );
    let planned = tmp.path().join("planned.toml");
    // Spread (the default): each on the GPU whose workloads need the least of it so far.
    let o = isolane()
        .args(["plan", "--auto", "--device-model", "h100-sxm", "--profiles"])
        .arg(data("profiles"))
        .arg(&sc)
        .output()
        .unwrap();
    let err = flat(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        err.contains("camera3 GPU 1 40 SMs") && err.contains("lidar GPU 0 40 SMs"),
        "{err}"
    );
    let o = isolane()
        .args([
            "plan",
            "--auto",
            "--objective",
            "pack",
            "--device-model",
            "h100-sxm",
        ])
        .arg("--profiles")
        .arg(data("profiles"))
        .arg("-o")
        .arg(&planned)
        .arg(&sc)
        .output()
        .unwrap();
    let err = flat(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    // First-fit decreasing (`--objective pack`): the cameras (busier) fill GPU 0 to 120 SMs,
    // lidar does not fit beside them and goes beside lidar2, pinned to GPU 1.
    assert!(
        err.contains(
            "green: planned in" 
        ) && err.contains(
            "using GPU 0: 120 SMs of 120 SMs (0 SMs spare); GPU 1: 80 SMs of 120 SMs (40 SMs spare)"
        ),
        "{err}"
    );
    assert!(err.contains("lidar GPU 1 40 SMs"), "{err}");
    let written = std::fs::read_to_string(&planned).unwrap();
    let s = isolane_core::spec::Scenario::from_toml_str(
        &written,
        "planned.toml",
        &isolane_core::spec::NoBuiltinModels,
    )
    .unwrap();
    let gpus: Vec<(&str, Option<u32>)> = s
        .workloads
        .iter()
        .map(|w| (w.name.as_str(), w.gpu))
        .collect();
    assert_eq!(
        gpus,
        [
            ("camera", Some(0)),
            ("camera2", Some(0)),
            ("camera3", Some(0)),
            ("lidar", Some(1)),
            ("lidar2", Some(1))
        ],
        "{written}"
    );
    assert!(written.contains("# planned: 40 SMs on GPU 1;"), "{written}");
    // Admission per GPU takes the planned scenario as it is.
    let o = run_ok(
        isolane()
            .args(["plan", "--device-model", "h100-sxm"])
            .arg(&planned),
    );
    assert!(text(&o.stdout).contains("GPU 1"), "{}", text(&o.stdout));
}

#[test]
fn two_gpus_that_cannot_hold_the_workloads_are_refused_naming_the_gpu() {
    let tmp = tempfile::tempdir().unwrap();
    // Four cameras pinned to GPU 1 need 160 of the 120 SMs its green contexts can hold.
    let pinned: Vec<(String, u32)> = (0..4).map(|i| (format!("cam{i}"), 1)).collect();
    let workloads: Vec<(&str, &str, u32, u32, Option<u32>)> = pinned
        .iter()
        .map(|(n, g)| (n.as_str(), GEMM, 100, 2, Some(*g)))
        .collect();
    let sc = two_gpus(tmp.path(), &workloads);
    let o = offline(&["--device-model", "h100-sxm"], &sc, &data("profiles"));
    let err = flat(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("green: no plan")
            && err.contains("on GPU 1: together they need 160 SMs of 120 SMs"),
        "{err}"
    );
    assert!(
        err.contains("best partial plan: cam0 GPU 1 40 SMs"),
        "{err}"
    );
}

/// Plans tests/data/offline.toml offline with `mechanism` into DIR/MECHANISM.toml.
fn planned(dir: &Path, mechanism: &str) -> PathBuf {
    let out = dir.join(format!("{mechanism}.toml"));
    let o = isolane()
        .args([
            "plan",
            "--auto",
            "--device-model",
            "h100-sxm",
            "--mechanism",
            mechanism,
        ])
        .arg("--profiles")
        .arg(data("profiles"))
        .arg("-o")
        .arg(&out)
        .arg(data("offline.toml"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", flat(&o.stderr));
    out
}

fn export(args: &[&str], scenario: &Path, out: &Path) -> Output {
    isolane()
        .arg("export")
        .args(args)
        .arg(scenario)
        .arg("--out")
        .arg(out)
        .output()
        .unwrap()
}

#[test]
fn a_plan_made_offline_is_exported_to_k8s_mps_and_mig_parted_with_its_capacity() {
    let tmp = tempfile::tempdir().unwrap();
    let green = planned(tmp.path(), "green");
    let k8s = tmp.path().join("k8s");
    let profiles = data("profiles");
    let o = export(
        &[
            "k8s",
            "--image",
            "registry.example/isolane:0.1.0",
            "--capacity",
            profiles.to_str().unwrap(),
        ],
        &green,
        &k8s,
    );
    let err = flat(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    // The GPU of the profiles picks the nodes; the green contexts are said not to map.
    let ds = std::fs::read_to_string(k8s.join("daemonset.yaml")).unwrap();
    assert!(
        ds.contains("nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3"),
        "{ds}"
    );
    assert!(
        err.contains("note: green contexts have no Kubernetes surface"),
        "{err}"
    );
    let notes = std::fs::read_to_string(k8s.join("NOTES.txt")).unwrap();
    assert!(
        notes.contains("green contexts have no Kubernetes surface"),
        "{notes}"
    );
    let claim = std::fs::read_to_string(k8s.join("resourceclaimtemplate.yaml")).unwrap();
    assert!(
        claim.contains("productName == 'NVIDIA H100 80GB HBM3'"),
        "{claim}"
    );
    // camera in 40 SMs: the committed profile's p99 (it has no p99.9), on its GPU and driver.
    let cap = std::fs::read_to_string(k8s.join("capacity.yaml")).unwrap();
    assert!(cap.contains("partition: green 40 SMs"), "{cap}");
    assert!(cap.contains("p999_alone_ms: 1.76"), "{cap}");
    assert!(cap.contains("driver: 580.159.04"), "{cap}");
    assert!(cap.contains("max_stable_rate_hz: not measured"), "{cap}");
    assert!(
        err.contains("max stable rate not measured for `camera`, `lidar`"),
        "{err}"
    );

    // An MPS export of the green plan is refused, naming the field.
    let o = export(&["mps"], &green, &tmp.path().join("mps-of-green"));
    assert_eq!(o.status.code(), Some(2));
    assert!(
        flat(&o.stderr).contains("device.mechanism = \"green\""),
        "{}",
        flat(&o.stderr)
    );
    assert!(!tmp.path().join("mps-of-green").exists());

    let mps = planned(tmp.path(), "mps");
    let o = export(&["mps"], &mps, &tmp.path().join("mps"));
    assert_eq!(o.status.code(), Some(0), "{}", flat(&o.stderr));
    let camera = std::fs::read_to_string(tmp.path().join("mps/clients/camera.env")).unwrap();
    assert!(
        camera.contains("export CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30\n"),
        "{camera}"
    );
    assert!(tmp.path().join("mps/mps-daemon.sh").is_file());

    let mig = planned(tmp.path(), "mig");
    let o = export(&["mig-parted"], &mig, &tmp.path().join("mig"));
    assert_eq!(o.status.code(), Some(0), "{}", flat(&o.stderr));
    let layout = std::fs::read_to_string(tmp.path().join("mig/mig-parted.yaml")).unwrap();
    assert!(layout.contains("3g.40gb: 2"), "{layout}");
}

#[test]
fn export_refuses_bad_input_with_exit_2_and_leaves_files_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let green = planned(tmp.path(), "green");
    let refused = |args: &[&str], scenario: &Path, out: &Path, says: &str| {
        let o = export(args, scenario, out);
        let err = flat(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    };
    let fresh = tmp.path().join("fresh");
    // Not planned: the workload and its field are named.
    refused(
        &["k8s", "--image", "i:1"],
        &data("offline.toml"),
        &fresh,
        "workload[0] (`camera`): partition.sms is missing",
    );
    refused(&["k8s"], &green, &fresh, "--image:");
    refused(&["k8s", "--image", "i:1"], &green, &fresh, "--gpu-product:");
    refused(
        &[
            "k8s",
            "--image",
            "i:1",
            "--kind",
            "deployment",
            "--replicas",
            "0",
        ],
        &green,
        &fresh,
        "--replicas 0: expected 1 to 10000",
    );
    refused(
        &[
            "k8s",
            "--image",
            "i:1",
            "--replicas",
            "2",
            "--gpu-product",
            "NVIDIA H100",
        ],
        &green,
        &fresh,
        "--replicas applies to --kind deployment only",
    );
    refused(
        &[
            "k8s",
            "--image",
            "i:1",
            "--name",
            "Big_Name",
            "--kind",
            "deployment",
        ],
        &green,
        &fresh,
        "expected 1 to 52 lowercase letters",
    );
    refused(
        &["mig-parted", "--image", "i:1"],
        &green,
        &fresh,
        "--image applies to",
    );
    refused(
        &["k8s", "--image", "i:1", "--capacity", "/nonexistent/run"],
        &green,
        &fresh,
        "no such file or folder",
    );
    assert!(!fresh.exists());
    // An occupied folder is refused without --force, and its file kept.
    let used = tmp.path().join("used");
    std::fs::create_dir(&used).unwrap();
    std::fs::write(used.join("daemonset.yaml"), "mine").unwrap();
    let args = ["k8s", "--image", "i:1", "--kind", "deployment"];
    refused(&args, &green, &used, "pass --force");
    assert_eq!(
        std::fs::read_to_string(used.join("daemonset.yaml")).unwrap(),
        "mine"
    );
    // With --force the export's own names are replaced: no stale DaemonSet beside the Deployment.
    let mut forced = args.to_vec();
    forced.push("--force");
    let o = export(&forced, &green, &used);
    assert_eq!(o.status.code(), Some(0), "{}", flat(&o.stderr));
    assert!(!used.join("daemonset.yaml").exists());
    assert!(used.join("deployment.yaml").is_file());
}

/// Synthetic H200 profiles of resnet18 and vit_b_16 in green partitions of 8 to 128 SMs
/// (work / SMs + 0.1 ms), in `root`/profiles.
fn h200_profiles(root: &std::path::Path) {
    let dir = root.join("profiles/NVIDIA_H200/580.159.04");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("device.json"),
        r#"{"gpu": "NVIDIA H200", "driver": "580.159.04", "device_model": "h200"}"#,
    )
    .unwrap();
    for sms in (8..=128).step_by(8) {
        for (model, work) in [("resnet18", 10.0), ("vit_b_16", 40.0)] {
            let t = work / f64::from(sms) + 0.1;
            std::fs::write(
                dir.join(format!("{model}-b1-fp16-green-{sms}.json")),
                format!(
                    r#"{{"exec_p50_ms": {t}, "exec_p99_ms": {}, "exec_mean_ms": {t}, "exec_p999_ms": {}, "engine_revision": {rev}}}"#,
                    t * 1.02,
                    t * 1.05,
                    rev = isolane_cuda::ENGINE_REVISION
                ),
            )
            .unwrap();
        }
    }
}

/// The first plan of real models on an H200 (offline, synthetic profiles of `work`/SMs + 0.1
/// ms) holds each deadline to the stretch predicted from the engine's profiles of its
/// neighbours (docs/planner.md, "Predicted stretch"): resnet18 beside vit_b_16, which streams
/// its 173 MB of weights through the L2, ×1.26 by the model (measured ×1.21–1.24 on the
/// H200), raised to admission's floor for a CNN victim (1.36), so 24 SMs where stretch 1 gave
/// 16; `--no-predict` plans as before.
#[test]
fn the_first_plan_on_an_h200_holds_the_deadlines_to_the_predicted_stretch() {
    let tmp = tempfile::tempdir().unwrap();
    h200_profiles(tmp.path());
    let sc = tmp.path().join("s.toml");
    std::fs::write(
        &sc,
        "[device]\nbackend = \"cuda\"\nmechanism = \"green\"\n\
         [[workload]]\nname = \"cam\"\nmodel = \"resnet18\"\nprecision = \"fp16\"\n\
         rate_hz = 500\ndeadline_ms = 1.0\nduration_s = 5\n\
         [[workload]]\nname = \"vit\"\nmodel = \"vit_b_16\"\nprecision = \"fp16\"\n\
         rate_hz = 200\ndeadline_ms = 2.0\nduration_s = 5\n",
    )
    .unwrap();
    let plan = |extra: &[&str]| {
        let o = isolane()
            .args(["plan", "--auto", "--device-model", "h200", "--profiles"])
            .arg(tmp.path().join("profiles"))
            .args(extra)
            .arg(&sc)
            .output()
            .unwrap();
        let err = flat(&o.stderr);
        assert_eq!(o.status.code(), Some(0), "{err}");
        err
    };
    let predicted = plan(&[]);
    assert!(
        predicted.contains(
            "cam: stretch 1.36 predicted beside the workloads planned on its GPU (their DRAM \
             2.6 % of the peak while they run, 100 % of the L2; most from vit, 1.36; the model \
             says 1.26, admission's floor for a CNN victim 1.36); planned with 1.36"
        ) && predicted.contains("cam 24 SMs"),
        "{predicted}"
    );
    let alone = plan(&["--no-predict"]);
    assert!(
        alone.contains("cam 16 SMs") && !alone.contains("predicted beside"),
        "{alone}"
    );
}

/// Issue 34, placement: over two H200s `spread` is the default and the prediction is each
/// GPU's own. Spread, resnet18 and vit_b_16 each get a GPU: no neighbour, stretch 1,
/// resnet18 in 16 SMs. Packed (`--objective pack`), both on GPU 0: resnet18 is planned with
/// the stretch predicted beside vit_b_16 there (the model's 1.26, raised to the CNN floor
/// 1.36), in 24 SMs.
#[test]
fn over_two_h200s_spread_is_the_default_and_the_prediction_is_each_gpus_own() {
    let tmp = tempfile::tempdir().unwrap();
    h200_profiles(tmp.path());
    let sc = tmp.path().join("s.toml");
    std::fs::write(
        &sc,
        "[device]\nbackend = \"cuda\"\nmechanism = \"green\"\ngpus = [0, 1]\n\
         [[workload]]\nname = \"cam\"\nmodel = \"resnet18\"\nprecision = \"fp16\"\n\
         rate_hz = 500\ndeadline_ms = 1.0\nduration_s = 5\n\
         [[workload]]\nname = \"vit\"\nmodel = \"vit_b_16\"\nprecision = \"fp16\"\n\
         rate_hz = 200\ndeadline_ms = 2.0\nduration_s = 5\n",
    )
    .unwrap();
    let plan = |extra: &[&str]| {
        let o = isolane()
            .args(["plan", "--auto", "--device-model", "h200", "--profiles"])
            .arg(tmp.path().join("profiles"))
            .args(extra)
            .arg(&sc)
            .output()
            .unwrap();
        let err = flat(&o.stderr);
        assert_eq!(o.status.code(), Some(0), "{err}");
        err
    };
    let spread = plan(&[]);
    assert!(
        spread.contains(
            "cam: stretch 1.00 predicted beside the workloads planned on its GPU (their DRAM \
             0.0 % of the peak while they run, 0 % of the L2)"
        ) && spread.contains("cam GPU 1 16 SMs")
            && spread.contains("vit GPU 0"),
        "{spread}"
    );
    let packed = plan(&["--objective", "pack"]);
    assert!(
        packed.contains("cam: stretch 1.36 predicted beside the workloads planned on its GPU")
            && packed.contains("cam GPU 0 24 SMs")
            && packed.contains("vit GPU 0"),
        "{packed}"
    );
}

/// SMs, and the execution p50, p99, mean and p99.9 in ms there.
type H200Point = (u32, [f64; 4]);

/// The H200 profiles `scripts/predict-h200.sh plans` measured for the hit-rate run
/// (results/h200-predict/profiles, session 22): per model, per green partition, its p50, p99,
/// mean and p99.9 execution time in ms, written as the current engine revision (they were
/// measured at revision 2; offline, a profile of another revision would be measured again).
const H200_PREDICT_PROFILES: [(&str, [H200Point; 6]); 5] = [
    (
        "resnet18",
        [
            (8, [0.431312, 0.447116, 0.431869, 0.555416]),
            (16, [0.301862, 0.312029, 0.302169, 0.364767]),
            (24, [0.259566, 0.276243, 0.261632, 0.31554]),
            (32, [0.236087, 0.245968, 0.234255, 0.309696]),
            (64, [0.204204, 0.222192, 0.204795, 0.333436]),
            (128, [0.187912, 0.197958, 0.188932, 0.242842]),
        ],
    ),
    (
        "resnet50",
        [
            (8, [1.118306, 1.138897, 1.118621, 1.260546]),
            (16, [0.704088, 0.729097, 0.706484, 0.777534]),
            (24, [0.602933, 0.618499, 0.603453, 0.663519]),
            (32, [0.502873, 0.519288, 0.5042, 0.563321]),
            (64, [0.413996, 0.432961, 0.416081, 0.479699]),
            (128, [0.36083, 0.375788, 0.363281, 0.391947]),
        ],
    ),
    (
        "mobilenet_v2",
        [
            (8, [0.636385, 0.65258, 0.637646, 0.693169]),
            (16, [0.442143, 0.451043, 0.440539, 0.498801]),
            (24, [0.374705, 0.388271, 0.37728, 0.42655]),
            (32, [0.333604, 0.358702, 0.333644, 0.383772]),
            (64, [0.27597, 0.29478, 0.277833, 0.329319]),
            (128, [0.260066, 0.273586, 0.260916, 0.314067]),
        ],
    ),
    (
        "vit_b_16",
        [
            (8, [2.915993, 2.933955, 2.916512, 2.98517]),
            (16, [1.583911, 1.600866, 1.584196, 1.631766]),
            (24, [1.15004, 1.222308, 1.151917, 1.356539]),
            (32, [0.935671, 0.948905, 0.936187, 0.993156]),
            (64, [0.654353, 0.670425, 0.654844, 0.701008]),
            (128, [0.540489, 0.554768, 0.540662, 0.590948]),
        ],
    ),
    (
        "vit_l_32",
        [
            (8, [2.989725, 3.010261, 2.989887, 3.050545]),
            (16, [1.805033, 1.820338, 1.80527, 1.844704]),
            (32, [1.256666, 1.269465, 1.257265, 1.310476]),
            (64, [0.925077, 0.936831, 0.925828, 0.989837]),
            (128, [0.937414, 0.963032, 0.938227, 0.989791]),
            // vit_l_32 was not measured in 24 SMs; its 16 SMs' figures stand in (slower).
            (24, [1.805033, 1.820338, 1.80527, 1.844704]),
        ],
    ),
];

/// Issue 34: the first plans of `scenarios/planner/robot-arm.toml` and `endoscopy.toml` from
/// the profiles the H200 measured for them (offline). On the H200 (results/h200-predict/hits.md)
/// the first plans made with the model's stretch alone missed: robot-arm (servo 24, grasp
/// 32 SMs) grasp late 0.80 %, endoscopy (polyp 24, quality 32) polyp 0.17 % and quality
/// 0.67 %. The CNN victims are now planned with admission's floor (1.36, the H200 matrix's
/// highest CNN-pair stretch) and get larger partitions: PREDICTED, not yet verified on the GPU.
#[test]
fn cnn_victims_first_plans_take_admissions_floor_on_the_recorded_h200_profiles() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("profiles/NVIDIA_H200/580.159.04");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("device.json"),
        r#"{"gpu": "NVIDIA H200", "driver": "580.159.04", "device_model": "h200"}"#,
    )
    .unwrap();
    for (model, points) in H200_PREDICT_PROFILES {
        for (sms, [p50, p99, mean, p999]) in points {
            std::fs::write(
                dir.join(format!("{model}-b1-fp16-green-{sms}.json")),
                format!(
                    r#"{{"exec_p50_ms": {p50}, "exec_p99_ms": {p99}, "exec_mean_ms": {mean}, "exec_p999_ms": {p999}, "engine_revision": {}}}"#,
                    isolane_cuda::ENGINE_REVISION
                ),
            )
            .unwrap();
        }
    }
    let plan = |scenario: &str| {
        let o = isolane()
            .args(["plan", "--auto", "--device-model", "h200", "--profiles"])
            .arg(tmp.path().join("profiles"))
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join(scenario))
            .output()
            .unwrap();
        let err = flat(&o.stderr);
        println!("{scenario}: {err}\n{}", flat(&o.stdout));
        (o.status.code(), err)
    };
    // Endoscopy: polyp (resnet50, missed 0.17 % in 24 SMs) is planned in 32 SMs; quality
    // (mobilenet_v2) stays in 32 SMs, where it missed 0.67 %: there the H200 measured its
    // p99 at 0.558 ms, over the 0.489 ms even the floor predicts.
    let (code, endo) = plan("scenarios/planner/endoscopy.toml");
    assert_eq!(code, Some(0), "{endo}");
    for (victim, model) in [("polyp", "1.28"), ("quality", "1.28")] {
        assert!(
            endo.contains(&format!(
                "{victim}: stretch 1.36 predicted beside the workloads planned on its GPU"
            )) && endo.contains(&format!(
                "the model says {model}, admission's floor for a CNN victim 1.36); planned \
                 with 1.36"
            )),
            "{endo}"
        );
    }
    assert!(
        endo.contains("polyp 32 SMs p99 0.707")
            && endo.contains("quality 32 SMs p99 0.489")
            && endo.contains("report 8 SMs"),
        "{endo}"
    );
    // The best-effort vit_l_32 streams: the model's own figure.
    assert!(
        endo.contains("report: stretch 1.22 predicted") && !endo.contains("says 1.22"),
        "{endo}"
    );
    // Robot arm: grasp (resnet50, 0.80 % late in 32 SMs) no longer fits in 32 SMs (p99.9
    // 0.563 ms × 1.36 is over 90 % of 0.8 ms), nor servo (resnet18) in 64 SMs, whose p99.9
    // there (0.333 ms, above its 24 SMs' 0.316) × 1.36 is over 90 % of 0.5 ms: the search
    // asks for 48 and 96 SMs, which the H200 run never measured, so offline there is no plan.
    let (code, robot) = plan("scenarios/planner/robot-arm.toml");
    assert_eq!(code, Some(2), "{robot}");
    assert!(
        robot.contains(
            "servo: stretch 1.36 predicted beside the workloads planned on its GPU (their \
             DRAM 1.2 % of the peak while they run, 100 % of the L2; most from grasp, 1.36; \
             the model says 1.24, admission's floor for a CNN victim 1.36); planned with 1.36"
        ) && robot.contains("grasp: stretch 1.36 predicted")
            && robot.contains("`grasp` (resnet50, batch 1, fp16, green): no profile of 48 SMs")
            && robot.contains("`servo` (resnet18, batch 1, fp16, green): no profile of 96 SMs"),
        "{robot}"
    );
}
