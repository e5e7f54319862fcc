//! `isolane export`'s flags turned into an export: which flags a format takes, the objects'
//! default name, the k8s options, and the files written to the output folder.

use std::path::PathBuf;

use isolane_core::spec::{ModelCatalog, Scenario};

use crate::capacity::Measurements;
use crate::k8s::{Claim, Kind, Options};
use crate::{user, Export, ExportError, Format, Planned};

/// The flags of `isolane export` (docs/export.md).
#[derive(Debug, Clone)]
pub struct ExportFlags {
    /// `k8s`, `mps` or `mig-parted`.
    pub format: String,
    /// The planned scenario's file.
    pub scenario: PathBuf,
    pub out: PathBuf,
    pub force: bool,
    /// Measurements for capacity.yaml.
    pub capacity: Vec<PathBuf>,
    pub name: Option<String>,
    pub image: Option<String>,
    pub kind: Option<String>,
    pub replicas: Option<u32>,
    pub claim: Option<String>,
    pub gpu_product: Option<String>,
    pub namespace: Option<String>,
}

/// The flags that only some formats take, refused for the others (before anything is read).
pub fn check_flags(args: &ExportFlags) -> Result<(), ExportError> {
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
    Ok(())
}

/// Exports the planned `scenario` (named `name`) as the flags say, into `args.out`; returns
/// the format and what was written. `warn` gets what the user should know before the files.
pub fn export_planned(
    args: &ExportFlags,
    scenario: &Scenario,
    name: &str,
    models: &dyn ModelCatalog,
    warn: &mut dyn FnMut(String),
) -> Result<(Format, Export), ExportError> {
    let plan = Planned::new(scenario, name)?;
    let measurements = Measurements::read(&args.capacity, models)?;
    let stem = args
        .scenario
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let default_name = {
        let base = crate::dns_label(&stem, 44);
        if base.is_empty() {
            "isolane".to_string()
        } else {
            format!("isolane-{base}")
        }
    };
    let object_name = args.name.clone().unwrap_or(default_name);
    let format = match args.format.as_str() {
        "k8s" => Format::K8s(k8s_options(
            args,
            object_name,
            &crate::capacity::measured_gpus(plan, &measurements),
            warn,
        )?),
        "mps" => Format::Mps,
        _ => Format::MigParted { name: object_name },
    };
    let export = crate::export(&format, plan, &measurements)?;
    crate::write_export(&args.out, args.force, format.files(), &export)?;
    Ok((format, export))
}

/// The k8s flags; `measured`: the GPUs the plan's capacity was measured on.
fn k8s_options(
    args: &ExportFlags,
    name: String,
    measured: &[String],
    warn: &mut dyn FnMut(String),
) -> Result<Options, ExportError> {
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
    crate::k8s::check_name(&name)?;
    if let Some(ns) = &args.namespace {
        if ns.is_empty() || ns.len() > 63 || crate::dns_label(ns, 63) != *ns {
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
                warn(format!(
                    "warning: --gpu-product {p:?}, but the --capacity measurements were taken \
                     on {}; capacity.yaml's numbers may not hold on it",
                    measured.join(", ")
                ));
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
