//! Every file an export writes, checked against its schema by
//! `validate/check_exports.py` (kubernetes-validate, strict, for the Kubernetes objects; the
//! schemas in the script for the rest). Skips without the package, fails without it under
//! ISOLANE_STRICT=1 (CI installs it: .ci/run).

use std::path::{Path, PathBuf};
use std::process::Command;

use isolane_core::system_packages::{skip_without, KUBERNETES_VALIDATE};

use crate::capacity::Measurements;
use crate::k8s::{Claim, Kind, Options};
use crate::{export, testing, Format, Planned};

fn python() -> PathBuf {
    std::env::var_os("ISOLANE_PYTHON")
        .unwrap_or_else(|| "python3".into())
        .into()
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("validate/check_exports.py")
}

/// Why the check cannot run here, if it cannot.
fn missing() -> Option<String> {
    let py = python();
    match Command::new(&py)
        .args(["-c", "import kubernetes_validate, jsonschema, yaml"])
        .output()
    {
        Err(e) => Some(format!("`{}`: {e}", py.display())),
        Ok(o) if !o.status.success() => Some(format!(
            "`{}` cannot import kubernetes_validate: {}",
            py.display(),
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Ok(_) => None,
    }
}

/// Runs the checker on `files`: its exit status and output.
fn check(files: &[PathBuf]) -> (bool, String) {
    let out = Command::new(python())
        .arg(script())
        .args(files)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn options(claim: Claim, kind: Kind) -> Options {
    Options {
        name: "isolane-plan".into(),
        image: "registry.example/isolane:0.1.0".into(),
        namespace: Some("inference".into()),
        kind,
        claim,
        gpu_product: Some("NVIDIA H100 80GB HBM3".into()),
    }
}

/// Writes the export into `dir` and returns its YAML files other than capacity.yaml.
fn write(dir: &Path, format: &Format, s: &isolane_core::spec::Scenario) -> Vec<PathBuf> {
    let e = export(
        format,
        Planned::new(s, "planned.toml").unwrap(),
        &Measurements::default(),
    )
    .unwrap();
    std::fs::create_dir_all(dir).unwrap();
    let mut yaml = Vec::new();
    for f in &e.files {
        let p = dir.join(&f.path);
        std::fs::write(&p, &f.text).unwrap();
        if f.path.ends_with(".yaml") && f.path != crate::capacity::FILE {
            yaml.push(p);
        }
    }
    yaml
}

#[test]
fn every_manifest_and_config_of_every_mechanism_and_claim_validates() {
    if let Some(why) = missing() {
        skip_without(&KUBERNETES_VALIDATE, &why);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    let scenarios = [
        ("green", testing::green()),
        ("mps", testing::mps()),
        ("mig", testing::mig()),
        ("timeslice", testing::timeslice()),
        ("cpu", testing::cpu()),
    ];
    for (name, s) in &scenarios {
        for (claim, kind, tag) in [
            (Claim::Dra, Kind::DaemonSet, "dra-ds"),
            (
                Claim::DevicePlugin,
                Kind::Deployment { replicas: 3 },
                "dp-deploy",
            ),
        ] {
            let format = Format::K8s(options(claim, kind));
            files.extend(write(&dir.path().join(format!("{name}-{tag}")), &format, s));
        }
    }
    let mig = Format::MigParted {
        name: "isolane-plan".into(),
    };
    files.extend(write(&dir.path().join("mig-parted"), &mig, &testing::mig()));
    let (ok, out) = check(&files);
    assert!(ok, "{out}");
    // Each kind of object was checked, not skipped.
    for what in [
        "DaemonSet/isolane-plan (Kubernetes 1.34.0, strict)",
        "Deployment/isolane-plan (Kubernetes",
        "ResourceClaimTemplate/isolane-plan-gpu (Kubernetes 1.34.0, strict)",
        "opaque GpuConfig",
        "Service/isolane-plan (Kubernetes",
        "ConfigMap/isolane-plan-scenario (Kubernetes",
        "config isolane-plan",
        "ServiceMonitor/isolane-plan (Prometheus Operator CRD fields)",
        "mig-parted config",
    ] {
        assert!(out.contains(what), "{what} not checked:\n{out}");
    }
}

#[test]
fn the_check_fails_on_an_unknown_field_of_each_kind_of_file() {
    if let Some(why) = missing() {
        skip_without(&KUBERNETES_VALIDATE, &why);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let files = write(
        &dir.path().join("k8s"),
        &Format::K8s(options(Claim::Dra, Kind::DaemonSet)),
        &testing::mps(),
    );
    let mut mig = write(
        &dir.path().join("mig"),
        &Format::MigParted { name: "p".into() },
        &testing::mig(),
    );
    let mut all = files.clone();
    all.append(&mut mig);
    for (file, from, to) in [
        (
            "daemonset.yaml",
            "terminationGracePeriodSeconds",
            "terminationGracePeriod",
        ),
        ("resourceclaimtemplate.yaml", "exactly:", "exact:"),
        (
            "resourceclaimtemplate.yaml",
            "strategy: MPS",
            "strategy: Mps",
        ),
        (
            "servicemonitor.yaml",
            "interval: 15s",
            "interval: 15 seconds",
        ),
        ("mig-parted.yaml", "mig-enabled", "mig-enable"),
    ] {
        let path = all.iter().find(|p| p.ends_with(file)).unwrap();
        let good = std::fs::read_to_string(path).unwrap();
        assert!(good.contains(from), "{file} has no {from}");
        std::fs::write(path, good.replace(from, to)).unwrap();
        let (ok, out) = check(std::slice::from_ref(path));
        assert!(!ok, "{file} with `{to}` passed:\n{out}");
        assert!(out.contains("ERROR"), "{out}");
        std::fs::write(path, good).unwrap();
    }
}
