//! `isolane export k8s|mps|mig-parted SCENARIO --out DIR`: a planned scenario handed to machines
//! that do not run isolane's commands (docs/export.md). Flags → configuration; the files are
//! isolane-export's.

use std::path::PathBuf;

use clap::Args;
use isolane_export::capacity::Measurements;
use isolane_export::k8s::{Claim, Kind, Options};
use isolane_export::{ExportError, Format, Planned};

use super::user;

#[derive(Args)]
#[command(
    about = "Export a planned scenario: Kubernetes manifests, MPS client settings or a MIG layout",
    long_about = "Writes what runs a planned scenario (what `isolane plan --auto` writes) without \
                  isolane's own commands, into --out DIR: `k8s` the manifests that run `isolane \
                  serve` with it on each node of its GPU (ConfigMap, DaemonSet or Deployment, \
                  Service, ServiceMonitor, the GPU claim through DRA or the NVIDIA device \
                  plugin); `mps` an MPS daemon script and each client's environment (thread %, \
                  pinned memory limit); `mig-parted` a nvidia-mig-parted layout. Each export \
                  has capacity.yaml (per model and partition: max stable rate, p99.9, slack, the \
                  GPU and driver measured on; from the --capacity measurements, `not measured` \
                  otherwise) and NOTES.txt (what the format cannot express, also printed on \
                  stderr)."
)]
pub struct ExportArgs {
    /// What to write.
    #[arg(value_parser = ["k8s", "mps", "mig-parted"])]
    pub format: String,
    /// The planned scenario (TOML, every GPU workload's partition filled in).
    pub scenario: PathBuf,
    /// The folder to write into (created if missing; a folder that is not empty needs --force).
    #[arg(long, short = 'o', value_name = "DIR")]
    pub out: PathBuf,
    /// Use --out even if it is not empty, replacing the files this format writes.
    #[arg(long)]
    pub force: bool,
    /// A measurement for capacity.yaml (repeatable): a run folder of the plan (`isolane run`,
    /// `plan --auto --verify-out`), a maxrate.json (`isolane maxrate --out`) or a profile folder
    /// (`plan --auto --export-profiles`).
    #[arg(long, value_name = "PATH")]
    pub capacity: Vec<PathBuf>,
    /// k8s: the objects' name; mig-parted: the configuration's name [default: isolane-<the
    /// scenario file's name>].
    #[arg(long)]
    pub name: Option<String>,
    /// k8s: the container image that has the isolane binary (on PATH).
    #[arg(long)]
    pub image: Option<String>,
    /// k8s: `daemonset` (a pod on each node of the plan's GPU) or `deployment` [default:
    /// daemonset].
    #[arg(long, value_parser = ["daemonset", "deployment"])]
    pub kind: Option<String>,
    /// k8s with --kind deployment: pods [default: 1].
    #[arg(long)]
    pub replicas: Option<u32>,
    /// k8s: how the pod claims its GPUs, `dra` (resource.k8s.io/v1, NVIDIA's DRA driver) or
    /// `device-plugin` (NVIDIA's device plugin) [default: dra].
    #[arg(long, value_parser = ["dra", "device-plugin"])]
    pub claim: Option<String>,
    /// k8s: the GPU's name as `isolane devices` prints it (`NVIDIA H100 80GB HBM3`), for the
    /// node selector and the claim [default: the GPU the --capacity measurements name].
    #[arg(long, value_name = "NAME")]
    pub gpu_product: Option<String>,
    /// k8s: the namespace of the objects [default: none; kubectl's -n decides].
    #[arg(long)]
    pub namespace: Option<String>,
}

pub fn run(args: ExportArgs) -> anyhow::Result<u8> {
    let k8s_only = [
        ("--image", args.image.is_some()),
        ("--kind", args.kind.is_some()),
        ("--replicas", args.replicas.is_some()),
        ("--claim", args.claim.is_some()),
        ("--gpu-product", args.gpu_product.is_some()),
        ("--namespace", args.namespace.is_some()),
    ];
    if args.format != "k8s" {
        if let Some((flag, _)) = k8s_only.iter().find(|(_, given)| *given) {
            return Err(user(format!(
                "{flag} applies to `isolane export k8s` only, not to `{}`",
                args.format
            )));
        }
    }
    if args.format == "mps" && args.name.is_some() {
        return Err(user(
            "--name applies to `isolane export k8s` and `mig-parted`, not to `mps`",
        ));
    }
    let file = super::ScenarioFile::read(&args.scenario)?;
    let (scenario, name) = file.scenario()?;
    let models: Vec<&str> = isolane_engine::builtin_models()
        .iter()
        .map(|m| m.name)
        .collect();
    let plan = Planned::new(&scenario, &name).map_err(export_error)?;
    let measurements = Measurements::read(&args.capacity, &models).map_err(export_error)?;
    let stem = args
        .scenario
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let default_name = {
        let base = isolane_export::dns_label(&stem, 44);
        if base.is_empty() {
            "isolane".to_string()
        } else {
            format!("isolane-{base}")
        }
    };
    let object_name = args.name.clone().unwrap_or(default_name);
    let format = match args.format.as_str() {
        "k8s" => Format::K8s(k8s_options(
            &args,
            object_name,
            &isolane_export::capacity::measured_gpus(plan, &measurements),
        )?),
        "mps" => Format::Mps,
        _ => Format::MigParted { name: object_name },
    };
    let export = isolane_export::export(&format, plan, &measurements).map_err(export_error)?;
    isolane_export::write_export(&args.out, args.force, format.files(), &export)
        .map_err(export_error)?;
    for n in &export.notes {
        eprintln!("note: {n}");
    }
    let names: Vec<&str> = export.files.iter().map(|f| f.path.as_str()).collect();
    println!(
        "isolane export {}: wrote {} files to {}: {}",
        format.word(),
        names.len(),
        args.out.display(),
        names.join(", ")
    );
    Ok(0)
}

/// The k8s flags; `measured`: the GPUs the plan's capacity was measured on.
fn k8s_options(args: &ExportArgs, name: String, measured: &[String]) -> anyhow::Result<Options> {
    let image = args.image.clone().ok_or_else(|| {
        user(
            "--image: `isolane export k8s` needs the container image that has the isolane \
             binary on its PATH (e.g. --image registry.example/isolane:0.1.0)",
        )
    })?;
    if image.trim().is_empty() || image.chars().any(char::is_whitespace) {
        return Err(user(format!(
            "--image {image:?}: expected an image reference without spaces (REGISTRY/NAME:TAG)"
        )));
    }
    isolane_export::k8s::check_name(&name).map_err(export_error)?;
    if let Some(ns) = &args.namespace {
        if ns.is_empty() || ns.len() > 63 || isolane_export::dns_label(ns, 63) != *ns {
            return Err(user(format!(
                "--namespace {ns:?}: expected 1 to 63 lowercase letters, digits and `-`, \
                 starting and ending with a letter or digit"
            )));
        }
    }
    let kind = match args.kind.as_deref() {
        Some("deployment") => {
            let replicas = args.replicas.unwrap_or(1);
            if !(1..=10_000).contains(&replicas) {
                return Err(user(format!(
                    "--replicas {replicas}: expected 1 to 10000 pods"
                )));
            }
            Kind::Deployment { replicas }
        }
        _ if args.replicas.is_some() => {
            return Err(user(
                "--replicas applies to --kind deployment only (a DaemonSet runs a pod on each \
                 node of the plan's GPU)",
            ))
        }
        _ => Kind::DaemonSet,
    };
    let claim = match args.claim.as_deref() {
        Some("device-plugin") => Claim::DevicePlugin,
        _ => Claim::Dra,
    };
    let gpu_product = match (&args.gpu_product, measured) {
        (Some(p), _) => {
            if !measured.is_empty() && !measured.contains(p) {
                eprintln!(
                    "warning: --gpu-product {p:?}, but the --capacity measurements were taken \
                     on {}; capacity.yaml's numbers may not hold on it",
                    measured.join(", ")
                );
            }
            Some(p.clone())
        }
        (None, [one]) => Some(one.clone()),
        (None, []) => None,
        (None, several) => {
            return Err(user(format!(
                "--gpu-product: the --capacity measurements were taken on several GPUs ({}); \
                 give the one the pods are for",
                several.join(", ")
            )))
        }
    };
    Ok(Options {
        name,
        image,
        namespace: args.namespace.clone(),
        kind,
        claim,
        gpu_product,
    })
}

fn export_error(e: ExportError) -> anyhow::Error {
    if e.is_user_error() {
        user(e)
    } else {
        anyhow::Error::new(e)
    }
}
