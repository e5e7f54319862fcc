//! `isolane export k8s|mps|mig-parted SCENARIO --out DIR`: a planned scenario handed to machines
//! that do not run isolane's commands (docs/export.md). Flags → configuration; the files are
//! isolane-export's.

use std::path::PathBuf;

use clap::Args;
use isolane_export::command::{self, ExportFlags};
use isolane_export::ExportError;

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
    let flags = ExportFlags {
        format: args.format,
        scenario: args.scenario,
        out: args.out,
        force: args.force,
        capacity: args.capacity,
        name: args.name,
        image: args.image,
        kind: args.kind,
        replicas: args.replicas,
        claim: args.claim,
        gpu_product: args.gpu_product,
        namespace: args.namespace,
    };
    command::check_flags(&flags).map_err(export_error)?;
    let file = super::ScenarioFile::read(&flags.scenario)?;
    let (scenario, name) = file.scenario()?;
    let models = isolane_executors::machine::builtin_names();
    let warn = &mut |line: String| eprintln!("{line}");
    let (format, export) =
        command::export_planned(&flags, &scenario, &name, &models, warn).map_err(export_error)?;
    for n in &export.notes {
        eprintln!("note: {n}");
    }
    let names: Vec<&str> = export.files.iter().map(|f| f.path.as_str()).collect();
    println!(
        "isolane export {}: wrote {} files to {}: {}",
        format.word(),
        names.len(),
        flags.out.display(),
        names.join(", ")
    );
    Ok(0)
}

fn export_error(e: ExportError) -> anyhow::Error {
    blame!(e)
}
