//! `isolane export k8s`: what a Kubernetes cluster needs to run the plan with `isolane serve` on
//! each GPU node of the type it was measured on (docs/export.md):
//!
//! - `configmap.yaml`: the scenario, mounted at `/etc/isolane/scenario.toml`;
//! - `daemonset.yaml` (one pod per node whose `nvidia.com/gpu.product` label is the plan's GPU)
//!   or `deployment.yaml` (`replicas` pods), running `isolane serve` with probes on the KServe
//!   v2 health routes;
//! - `service.yaml` (HTTP 8000, gRPC 8001) and `servicemonitor.yaml` (Prometheus Operator,
//!   `/metrics`);
//! - the GPU claim: `resourceclaimtemplate.yaml` (DRA, `resource.k8s.io/v1`, NVIDIA's DRA
//!   driver) or, with `--claim device-plugin`, extended resources in the pod and
//!   `device-plugin-config.yaml` for NVIDIA's device plugin.
//!
//! One pod holds the whole plan: the partitions between its workloads are isolane's (green
//! contexts, its MPS clients, its guard), which Kubernetes does not see; the notes say so.

use std::collections::BTreeMap;

use isolane_core::spec::{Mechanism, Scenario};
use serde::Serialize;

use crate::{dns_label, user, Export, ExportError, ExportFile, Planned};

pub const CONFIGMAP_FILE: &str = "configmap.yaml";
pub const DAEMONSET_FILE: &str = "daemonset.yaml";
pub const DEPLOYMENT_FILE: &str = "deployment.yaml";
pub const SERVICE_FILE: &str = "service.yaml";
pub const SERVICEMONITOR_FILE: &str = "servicemonitor.yaml";
pub const CLAIM_FILE: &str = "resourceclaimtemplate.yaml";
pub const DEVICE_PLUGIN_FILE: &str = "device-plugin-config.yaml";

/// Every file name a k8s export can write.
pub const FILES: &[&str] = &[
    CONFIGMAP_FILE,
    DAEMONSET_FILE,
    DEPLOYMENT_FILE,
    SERVICE_FILE,
    SERVICEMONITOR_FILE,
    CLAIM_FILE,
    DEVICE_PLUGIN_FILE,
    crate::capacity::FILE,
    crate::NOTES_FILE,
];

/// Where the scenario is mounted in the container.
pub const SCENARIO_PATH: &str = "/etc/isolane/scenario.toml";
pub const HTTP_PORT: u16 = 8000;
pub const GRPC_PORT: u16 = 8001;
/// `isolane serve`'s default `--drain-timeout`, which the pod's grace period must exceed.
pub const DRAIN_S: u32 = 30;
/// NVIDIA's DRA driver.
pub const DRA_DRIVER: &str = "gpu.nvidia.com";
/// The node label NVIDIA's GPU feature discovery sets to the GPU's product name.
pub const PRODUCT_LABEL: &str = "nvidia.com/gpu.product";

/// A pod per GPU node (the default), or a number of pods wherever they fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    DaemonSet,
    Deployment { replicas: u32 },
}

/// How the pod claims its GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// Dynamic resource allocation (`resource.k8s.io/v1`) with NVIDIA's DRA driver.
    Dra,
    /// Extended resources of NVIDIA's device plugin (`nvidia.com/gpu`, `nvidia.com/mig-…`).
    DevicePlugin,
}

#[derive(Debug, Clone)]
pub struct Options {
    /// The objects' name (an RFC 1123 label), and the `mig-configs` / config key.
    pub name: String,
    pub image: String,
    pub namespace: Option<String>,
    pub kind: Kind,
    pub claim: Claim,
    /// The GPU's product name as its driver reports it (`NVIDIA H100 80GB HBM3`), when known.
    pub gpu_product: Option<String>,
}

// ---- The objects, as typed values (only the fields written). ----

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Object<S: Serialize> {
    api_version: &'static str,
    kind: &'static str,
    metadata: Meta,
    #[serde(flatten)]
    body: S,
}

#[derive(Debug, Clone, Serialize)]
struct Meta {
    name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    namespace: Option<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    labels: BTreeMap<String, String>,
}

#[derive(Debug, Serialize)]
struct Data {
    data: BTreeMap<String, String>,
}

#[derive(Debug, Serialize)]
struct Spec<T: Serialize> {
    spec: T,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct ServiceSpec {
    selector: BTreeMap<String, String>,
    ports: Vec<ServicePort>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct ServicePort {
    name: &'static str,
    port: u16,
    target_port: &'static str,
    protocol: &'static str,
    app_protocol: &'static str,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct LabelSelector {
    match_labels: BTreeMap<String, String>,
}

#[derive(Debug, Serialize)]
struct ServiceMonitorSpec {
    selector: LabelSelector,
    endpoints: Vec<MonitorEndpoint>,
}

#[derive(Debug, Serialize)]
struct MonitorEndpoint {
    port: &'static str,
    path: &'static str,
    interval: &'static str,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct WorkloadSpec {
    #[serde(skip_serializing_if = "Option::is_none")]
    replicas: Option<u32>,
    selector: LabelSelector,
    template: PodTemplate,
}

#[derive(Debug, Serialize)]
struct PodTemplate {
    metadata: TemplateMeta,
    spec: PodSpec,
}

#[derive(Debug, Serialize)]
struct TemplateMeta {
    labels: BTreeMap<String, String>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct PodSpec {
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    node_selector: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tolerations: Vec<Toleration>,
    termination_grace_period_seconds: u32,
    containers: Vec<Container>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    resource_claims: Vec<PodResourceClaim>,
    volumes: Vec<Volume>,
}

#[derive(Debug, Serialize)]
struct Toleration {
    key: &'static str,
    operator: &'static str,
    effect: &'static str,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct PodResourceClaim {
    name: &'static str,
    resource_claim_template_name: String,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Volume {
    name: &'static str,
    config_map: ConfigMapVolume,
}

#[derive(Debug, Serialize)]
struct ConfigMapVolume {
    name: String,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Container {
    name: &'static str,
    image: String,
    command: Vec<String>,
    args: Vec<String>,
    ports: Vec<ContainerPort>,
    startup_probe: Probe,
    readiness_probe: Probe,
    liveness_probe: Probe,
    resources: Resources,
    volume_mounts: Vec<VolumeMount>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct ContainerPort {
    name: &'static str,
    container_port: u16,
    protocol: &'static str,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Probe {
    http_get: HttpGet,
    period_seconds: u32,
    failure_threshold: u32,
}

#[derive(Debug, Serialize)]
struct HttpGet {
    path: &'static str,
    port: &'static str,
}

#[derive(Debug, Serialize)]
struct Resources {
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    requests: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    limits: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    claims: Vec<ContainerClaim>,
}

#[derive(Debug, Serialize)]
struct ContainerClaim {
    name: &'static str,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct VolumeMount {
    name: &'static str,
    mount_path: &'static str,
    read_only: bool,
}

#[derive(Debug, Serialize)]
struct ClaimSpec {
    devices: DeviceClaim,
}

#[derive(Debug, Serialize)]
struct DeviceClaim {
    requests: Vec<DeviceRequest>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    config: Vec<DeviceClaimConfig>,
}

#[derive(Debug, Serialize)]
struct DeviceRequest {
    name: String,
    exactly: ExactDeviceRequest,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct ExactDeviceRequest {
    device_class_name: &'static str,
    count: u32,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    selectors: Vec<DeviceSelector>,
}

#[derive(Debug, Serialize)]
struct DeviceSelector {
    cel: CelSelector,
}

#[derive(Debug, Serialize)]
struct CelSelector {
    expression: String,
}

#[derive(Debug, Serialize)]
struct DeviceClaimConfig {
    requests: Vec<String>,
    opaque: OpaqueConfig,
}

#[derive(Debug, Serialize)]
struct OpaqueConfig {
    driver: &'static str,
    parameters: GpuConfig,
}

/// NVIDIA's DRA driver's per-claim GPU configuration.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct GpuConfig {
    api_version: &'static str,
    kind: &'static str,
    sharing: GpuSharing,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct GpuSharing {
    strategy: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    time_slicing_config: Option<TimeSlicingConfig>,
}

#[derive(Debug, Serialize)]
struct TimeSlicingConfig {
    interval: &'static str,
}

/// NVIDIA device plugin's configuration file (the part written).
#[derive(Debug, Serialize)]
struct DevicePluginConfig {
    version: &'static str,
    flags: DevicePluginFlags,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct DevicePluginFlags {
    mig_strategy: &'static str,
}

// ---- The export. ----

/// Checks a name given for the objects: an RFC 1123 label of at most 52 characters, so that
/// with the longest suffix added (`-device-plugin`) a ConfigMap's name stays within 63.
pub fn check_name(name: &str) -> Result<(), ExportError> {
    if name.is_empty() || name.len() > 52 || dns_label(name, 52) != name {
        return Err(user(format!(
            "--name {name:?}: expected 1 to 52 lowercase letters, digits and `-`, starting and \
             ending with a letter or digit (the objects are named NAME, NAME-scenario, NAME-gpu)"
        )));
    }
    Ok(())
}

/// Checks a GPU product name: it goes into a CEL string and a label value.
pub fn check_gpu_product(product: &str) -> Result<(), ExportError> {
    let label = product_label(product);
    if product.trim().is_empty()
        || product.contains(['\'', '"', '\\'])
        || label.is_empty()
        || label.len() > 63
    {
        return Err(user(format!(
            "--gpu-product {product:?}: expected the GPU's name as its driver reports it \
             (`isolane devices` prints it, e.g. \"NVIDIA H100 80GB HBM3\"): at most 63 \
             letters, digits, spaces, `-`, `_` and `.`, no quotes"
        )));
    }
    Ok(())
}

/// The `nvidia.com/gpu.product` label value of a product name (spaces as `-`, as GPU feature
/// discovery writes it).
pub fn product_label(product: &str) -> String {
    let mapped: String = product
        .trim()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '-'
            }
        })
        .collect();
    mapped
        .trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_string()
}

/// The export's files and notes (capacity.yaml and NOTES.txt are added by the caller).
pub fn export(plan: Planned<'_>, o: &Options) -> Result<Export, ExportError> {
    check_name(&o.name)?;
    let s = plan.scenario;
    let file = plan.file;
    let mech = s.device.mechanism;
    let gpus = s.device.all_gpus();
    let on_gpu: Vec<_> = plan.gpu_workloads().collect();
    let uses_gpu = !on_gpu.is_empty();
    let mut notes = Vec::new();
    if let Some(p) = &o.gpu_product {
        check_gpu_product(p)?;
    }
    if o.kind == Kind::DaemonSet && uses_gpu && o.gpu_product.is_none() {
        return Err(user(
            "--gpu-product: a DaemonSet runs a pod on every node its nodeSelector picks, and \
             the GPU the plan was measured on is not known (no --capacity measurement of its \
             workloads names one); give --gpu-product with the GPU's name as `isolane devices` \
             prints it (e.g. \"NVIDIA H100 80GB HBM3\"), or --kind deployment",
        ));
    }

    if !uses_gpu && o.kind == Kind::DaemonSet {
        notes.push(
            "no workload runs on a GPU: the DaemonSet has no node selector and runs a pod on \
             every node; add one, or export with --kind deployment"
                .into(),
        );
    }
    let (scenario_text, renumbered) = scenario_for_pod(s)?;
    if renumbered {
        notes.push(format!(
            "the scenario in {CONFIGMAP_FILE} numbers its GPUs 0..{} (the plan used GPU {}): in \
             the pod, the GPUs it claims are the only ones it sees",
            gpus.len() - 1,
            gpus.iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    for w in &s.workloads {
        if w.model.ends_with(".onnx") || w.weights.is_some() {
            notes.push(format!(
                "`{}` reads {}: the image must have it at that path",
                w.name,
                w.weights.as_deref().unwrap_or(&w.model)
            ));
        }
        if w.kernel().is_some() || w.program.is_some() {
            notes.push(format!(
                "`{}`: isolane serve refuses it at start (`kernel:` models and `command` \
                 programs take no requests; docs/serve.md, Not served yet): the pod will exit \
                 with code 2",
                w.name
            ));
        }
    }
    if mech == Mechanism::Green && uses_gpu {
        let sizes: Vec<String> = on_gpu
            .iter()
            .map(|(_, w)| format!("`{}` {} SMs", w.name, w.partition.sms.unwrap_or(0)))
            .collect();
        notes.push(format!(
            "green contexts have no Kubernetes surface: the pod claims {} whole and isolane \
             serve makes the plan's green contexts inside it ({}); Kubernetes schedules and \
             sees only the whole GPU",
            gpu_count_words(gpus.len()),
            sizes.join(", ")
        ));
    }
    if matches!(mech, Mechanism::Green | Mechanism::Mps) && uses_gpu {
        notes.push(
            "the guard and stream priorities that protect critical models from best-effort \
             ones ([protection]) work inside the pod only: other pods on the same GPU are not \
             held back, so the claim takes the GPU exclusively"
                .into(),
        );
    }

    let labels = BTreeMap::from([
        ("app.kubernetes.io/name".to_string(), "isolane".to_string()),
        ("app.kubernetes.io/instance".to_string(), o.name.clone()),
        (
            "app.kubernetes.io/managed-by".to_string(),
            "isolane-export".to_string(),
        ),
    ]);
    let selector = BTreeMap::from([
        ("app.kubernetes.io/name".to_string(), "isolane".to_string()),
        ("app.kubernetes.io/instance".to_string(), o.name.clone()),
    ]);
    let meta = |name: String| Meta {
        name,
        namespace: o.namespace.clone(),
        labels: labels.clone(),
    };
    let header = |what: &str| {
        format!(
            "{what} of the plan {file} (isolane export k8s; docs/export.md).\n\
             What Kubernetes cannot express of the plan is in NOTES.txt."
        )
    };
    let mut files = Vec::new();

    files.push(ExportFile {
        path: CONFIGMAP_FILE.into(),
        text: crate::yaml(
            &header("The scenario isolane serve runs"),
            &Object {
                api_version: "v1",
                kind: "ConfigMap",
                metadata: meta(format!("{}-scenario", o.name)),
                body: Data {
                    data: BTreeMap::from([("scenario.toml".to_string(), scenario_text)]),
                },
            },
        ),
    });

    // The GPU claim.
    let mut limits = BTreeMap::new();
    let mut claims = Vec::new();
    let mut resource_claims = Vec::new();
    let product_cel = o.gpu_product.as_ref().map(|p| {
        format!(
            "device.attributes['{DRA_DRIVER}'].productName == '{}'",
            p.trim()
        )
    });
    if uses_gpu {
        match o.claim {
            Claim::Dra => {
                let claim = claim_template(s, &on_gpu, product_cel.as_deref(), &mut notes);
                files.push(ExportFile {
                    path: CLAIM_FILE.into(),
                    text: crate::yaml(
                        &header("The GPU claim (DRA, NVIDIA's DRA driver)"),
                        &Object {
                            api_version: "resource.k8s.io/v1",
                            kind: "ResourceClaimTemplate",
                            metadata: meta(format!("{}-gpu", o.name)),
                            body: Spec {
                                spec: Spec { spec: claim },
                            },
                        },
                    ),
                });
                claims.push(ContainerClaim { name: "gpu" });
                resource_claims.push(PodResourceClaim {
                    name: "gpu",
                    resource_claim_template_name: format!("{}-gpu", o.name),
                });
            }
            Claim::DevicePlugin => {
                if mech == Mechanism::Mig {
                    for (_, w) in &on_gpu {
                        let p = w.partition.mig_profile.clone().unwrap_or_default();
                        let n = limits
                            .entry(format!("nvidia.com/mig-{p}"))
                            .or_insert_with(|| "0".to_string());
                        *n = (n.parse::<u32>().unwrap_or(0) + 1).to_string();
                    }
                } else {
                    limits.insert("nvidia.com/gpu".to_string(), gpus.len().to_string());
                }
                let strategy = if mech == Mechanism::Mig {
                    "mixed"
                } else {
                    "none"
                };
                let config = crate::yaml(
                    "",
                    &DevicePluginConfig {
                        version: "v1",
                        flags: DevicePluginFlags {
                            mig_strategy: strategy,
                        },
                    },
                );
                files.push(ExportFile {
                    path: DEVICE_PLUGIN_FILE.into(),
                    text: crate::yaml(
                        &format!(
                            "{}\nNVIDIA's device plugin reads it as the config named {} (helm: \
                             --set config.name={}-device-plugin,config.default={}).",
                            header("The device plugin's configuration"),
                            o.name,
                            o.name,
                            o.name
                        ),
                        &Object {
                            api_version: "v1",
                            kind: "ConfigMap",
                            metadata: meta(format!("{}-device-plugin", o.name)),
                            body: Data {
                                data: BTreeMap::from([(o.name.clone(), config)]),
                            },
                        },
                    ),
                });
                notes.push(device_plugin_note(mech));
            }
        }
    }

    let mut args = vec![
        "serve".to_string(),
        SCENARIO_PATH.to_string(),
        "--http".into(),
        format!("0.0.0.0:{HTTP_PORT}"),
        "--grpc".into(),
        format!("0.0.0.0:{GRPC_PORT}"),
        "--drain-timeout".into(),
        DRAIN_S.to_string(),
    ];
    if mech == Mechanism::Mps && o.claim == Claim::Dra && uses_gpu {
        // The DRA driver runs the claim's MPS daemon; isolane's clients join it.
        args.push("--join-mps".into());
    }
    let cores = s.workloads.len().max(
        s.workloads
            .iter()
            .flat_map(|w| w.cpu.iter())
            .collect::<std::collections::BTreeSet<_>>()
            .len(),
    );
    notes.push(format!(
        "the pod requests {cores} CPU core(s), one per model thread; pinning a workload to \
         the cores its `cpu` names needs the kubelet's static CPU manager policy, and no memory \
         request is set (the plan does not measure host memory)"
    ));
    let probe = |path: &'static str, period: u32, failures: u32| Probe {
        http_get: HttpGet { path, port: "http" },
        period_seconds: period,
        failure_threshold: failures,
    };
    let mut node_selector = BTreeMap::new();
    if let (Some(p), true) = (&o.gpu_product, uses_gpu) {
        node_selector.insert(PRODUCT_LABEL.to_string(), product_label(p));
    }
    let pod = PodSpec {
        node_selector,
        tolerations: if uses_gpu {
            vec![Toleration {
                key: "nvidia.com/gpu",
                operator: "Exists",
                effect: "NoSchedule",
            }]
        } else {
            Vec::new()
        },
        // Past serve's drain: the requests it took are answered before the kubelet kills it.
        termination_grace_period_seconds: DRAIN_S + 15,
        containers: vec![Container {
            name: "isolane",
            image: o.image.clone(),
            command: vec!["isolane".into()],
            args,
            ports: vec![
                ContainerPort {
                    name: "http",
                    container_port: HTTP_PORT,
                    protocol: "TCP",
                },
                ContainerPort {
                    name: "grpc",
                    container_port: GRPC_PORT,
                    protocol: "TCP",
                },
            ],
            // Serve answers once every model is built and warm: up to 10 minutes for that.
            startup_probe: probe("/v2/health/live", 5, 120),
            readiness_probe: probe("/v2/health/ready", 5, 1),
            liveness_probe: probe("/v2/health/live", 10, 3),
            resources: Resources {
                requests: BTreeMap::from([("cpu".to_string(), cores.to_string())]),
                limits,
                claims,
            },
            volume_mounts: vec![VolumeMount {
                name: "scenario",
                mount_path: "/etc/isolane",
                read_only: true,
            }],
        }],
        resource_claims,
        volumes: vec![Volume {
            name: "scenario",
            config_map: ConfigMapVolume {
                name: format!("{}-scenario", o.name),
            },
        }],
    };
    let workload = WorkloadSpec {
        replicas: match o.kind {
            Kind::DaemonSet => None,
            Kind::Deployment { replicas } => Some(replicas),
        },
        selector: LabelSelector {
            match_labels: selector.clone(),
        },
        template: PodTemplate {
            metadata: TemplateMeta {
                labels: labels.clone(),
            },
            spec: pod,
        },
    };
    let (path, kind) = match o.kind {
        Kind::DaemonSet => (DAEMONSET_FILE, "DaemonSet"),
        Kind::Deployment { .. } => (DEPLOYMENT_FILE, "Deployment"),
    };
    files.push(ExportFile {
        path: path.into(),
        text: crate::yaml(
            &header(&format!("isolane serve, as a {kind},")),
            &Object {
                api_version: "apps/v1",
                kind,
                metadata: meta(o.name.clone()),
                body: Spec { spec: workload },
            },
        ),
    });
    files.push(ExportFile {
        path: SERVICE_FILE.into(),
        text: crate::yaml(
            &header("The KServe v2 / Triton endpoints"),
            &Object {
                api_version: "v1",
                kind: "Service",
                metadata: meta(o.name.clone()),
                body: Spec {
                    spec: ServiceSpec {
                        selector: selector.clone(),
                        ports: vec![
                            ServicePort {
                                name: "http",
                                port: HTTP_PORT,
                                target_port: "http",
                                protocol: "TCP",
                                app_protocol: "http",
                            },
                            ServicePort {
                                name: "grpc",
                                port: GRPC_PORT,
                                target_port: "grpc",
                                protocol: "TCP",
                                app_protocol: "kubernetes.io/h2c",
                            },
                        ],
                    },
                },
            },
        ),
    });
    files.push(ExportFile {
        path: SERVICEMONITOR_FILE.into(),
        text: crate::yaml(
            &format!(
                "{}\nNeeds the Prometheus Operator's CRDs (monitoring.coreos.com/v1).",
                header("The Prometheus scrape of /metrics")
            ),
            &Object {
                api_version: "monitoring.coreos.com/v1",
                kind: "ServiceMonitor",
                metadata: meta(o.name.clone()),
                body: Spec {
                    spec: ServiceMonitorSpec {
                        selector: LabelSelector {
                            match_labels: selector,
                        },
                        endpoints: vec![MonitorEndpoint {
                            port: "http",
                            path: "/metrics",
                            interval: "15s",
                        }],
                    },
                },
            },
        ),
    });
    Ok(Export { files, notes })
}

/// The DRA claim: the plan's GPUs whole (green, MPS, time-slicing: isolane partitions them in
/// the pod), or one MIG device of its profile per workload.
fn claim_template(
    s: &Scenario,
    on_gpu: &[(usize, &isolane_core::spec::WorkloadSpec)],
    product_cel: Option<&str>,
    notes: &mut Vec<String>,
) -> ClaimSpec {
    let mech = s.device.mechanism;
    let selector = |extra: Option<String>| -> Vec<DeviceSelector> {
        let parts: Vec<String> = extra
            .into_iter()
            .chain(product_cel.map(str::to_string))
            .collect();
        if parts.is_empty() {
            return Vec::new();
        }
        vec![DeviceSelector {
            cel: CelSelector {
                expression: parts.join(" && "),
            },
        }]
    };
    if mech == Mechanism::Mig {
        let requests = on_gpu
            .iter()
            .map(|(i, w)| DeviceRequest {
                name: request_name(*i, &w.name),
                exactly: ExactDeviceRequest {
                    device_class_name: "mig.nvidia.com",
                    count: 1,
                    selectors: selector(Some(format!(
                        "device.attributes['{DRA_DRIVER}'].profile == '{}'",
                        w.partition.mig_profile.as_deref().unwrap_or("")
                    ))),
                },
            })
            .collect();
        notes.push(
            "the claim asks for one MIG device of each workload's profile; DRA cannot say which \
             GPU each comes from, so a plan on several GPUs may be given instances of one GPU \
             as long as they exist (lay them out first: isolane export mig-parted)"
                .into(),
        );
        return ClaimSpec {
            devices: DeviceClaim {
                requests,
                config: Vec::new(),
            },
        };
    }
    let sharing = match mech {
        Mechanism::Mps => Some(GpuSharing {
            strategy: "MPS",
            time_slicing_config: None,
        }),
        Mechanism::Timeslice => Some(GpuSharing {
            strategy: "TimeSlicing",
            time_slicing_config: Some(TimeSlicingConfig {
                interval: "Default",
            }),
        }),
        _ => None,
    };
    if mech == Mechanism::Mps {
        notes.push(
            "the claim's MPS daemon is the DRA driver's, with no default thread percentage or \
             memory limit: isolane serve joins it (--join-mps) and gives each workload's client \
             its planned thread percentage and pinned memory limit itself"
                .into(),
        );
    }
    ClaimSpec {
        devices: DeviceClaim {
            requests: vec![DeviceRequest {
                name: "gpu".into(),
                exactly: ExactDeviceRequest {
                    device_class_name: "gpu.nvidia.com",
                    count: s.device.all_gpus().len() as u32,
                    selectors: selector(None),
                },
            }],
            config: sharing
                .map(|sharing| DeviceClaimConfig {
                    requests: vec!["gpu".into()],
                    opaque: OpaqueConfig {
                        driver: DRA_DRIVER,
                        parameters: GpuConfig {
                            api_version: "resource.nvidia.com/v1beta1",
                            kind: "GpuConfig",
                            sharing,
                        },
                    },
                })
                .into_iter()
                .collect(),
        },
    }
}

/// A DRA request's name for workload `i`: an RFC 1123 label, unique by the index.
fn request_name(i: usize, name: &str) -> String {
    let base = dns_label(name, 50);
    if base.is_empty() {
        format!("w{i}")
    } else {
        format!("{base}-{i}")
    }
}

fn device_plugin_note(mech: Mechanism) -> String {
    match mech {
        Mechanism::Mig => "the device plugin hands out MIG devices by profile \
                           (nvidia.com/mig-<profile>, migStrategy mixed); lay the instances out \
                           first (isolane export mig-parted)"
            .into(),
        _ => "device-plugin-config.yaml has no `sharing` section: the device plugin's MPS and \
              time-slicing sharing split a GPU into equal replicas among pods, while the plan's \
              shares are unequal and all in one pod, which takes the GPU whole"
            .into(),
    }
}

fn gpu_count_words(n: usize) -> String {
    if n == 1 {
        "its GPU".into()
    } else {
        format!("its {n} GPUs")
    }
}

/// The scenario as the pod runs it: its GPUs numbered from 0 (the pod sees only those it
/// claims); whether that changed the plan's numbers.
fn scenario_for_pod(s: &Scenario) -> Result<(String, bool), ExportError> {
    let gpus = s.device.all_gpus();
    let renumbered = gpus.iter().enumerate().any(|(i, g)| *g != i as u32);
    let mut pod = s.clone();
    if renumbered {
        let index = |g: u32| gpus.iter().position(|x| *x == g).unwrap_or(0) as u32;
        pod.device.gpu = 0;
        if !pod.device.gpus.is_empty() {
            pod.device.gpus = (0..gpus.len() as u32).collect();
        }
        for w in &mut pod.workloads {
            w.gpu = w.gpu.map(index);
        }
    }
    let text = pod
        .to_toml_string()
        .map_err(|e| user(format!("the scenario cannot be written back: {e}")))?;
    Ok((text, renumbered))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing;

    pub(crate) fn options(claim: Claim, kind: Kind) -> Options {
        Options {
            name: "isolane-plan".into(),
            image: "registry.example/isolane:0.1.0".into(),
            namespace: None,
            kind,
            claim,
            gpu_product: Some("NVIDIA H100 80GB HBM3".into()),
        }
    }

    fn file<'a>(e: &'a Export, path: &str) -> &'a str {
        &e.files
            .iter()
            .find(|f| f.path == path)
            .unwrap_or_else(|| panic!("no {path}"))
            .text
    }

    #[test]
    fn a_green_plan_runs_serve_on_each_node_of_its_gpu_with_a_whole_gpu_claim() {
        let s = testing::green();
        let e = export(
            Planned::new(&s, "p.toml").unwrap(),
            &options(Claim::Dra, Kind::DaemonSet),
        )
        .unwrap();
        let ds = file(&e, DAEMONSET_FILE);
        assert!(ds.contains("kind: DaemonSet"), "{ds}");
        assert!(
            ds.contains("nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3"),
            "{ds}"
        );
        assert!(ds.contains("- /etc/isolane/scenario.toml"), "{ds}");
        assert!(ds.contains("path: /v2/health/ready"), "{ds}");
        assert!(ds.contains("path: /v2/health/live"), "{ds}");
        assert!(
            ds.contains("resourceClaimTemplateName: isolane-plan-gpu"),
            "{ds}"
        );
        let claim = file(&e, CLAIM_FILE);
        assert!(
            claim.contains("apiVersion: resource.k8s.io/v1\n"),
            "{claim}"
        );
        assert!(claim.contains("deviceClassName: gpu.nvidia.com"), "{claim}");
        assert!(
            claim.contains("productName == 'NVIDIA H100 80GB HBM3'"),
            "{claim}"
        );
        // Green contexts need no sharing: the claim takes the GPU exclusively.
        assert!(!claim.contains("GpuConfig"), "{claim}");
        assert!(
            e.notes.iter().any(
                |n| n.starts_with("green contexts have no Kubernetes surface")
                    && n.contains("`inspect` 32 SMs")
            ),
            "{:?}",
            e.notes
        );
        let cm = file(&e, CONFIGMAP_FILE);
        assert!(cm.contains("sms = 32"), "{cm}");
        assert!(file(&e, SERVICE_FILE).contains("port: 8001"));
        assert!(file(&e, SERVICEMONITOR_FILE).contains("path: /metrics"));
    }

    #[test]
    fn the_configmaps_scenario_parses_back_to_the_plan() {
        let s = testing::green();
        let e = export(
            Planned::new(&s, "p.toml").unwrap(),
            &options(Claim::Dra, Kind::DaemonSet),
        )
        .unwrap();
        #[derive(serde::Deserialize)]
        struct Cm {
            data: BTreeMap<String, String>,
        }
        let cm: Cm = serde_yaml_ng::from_str(file(&e, CONFIGMAP_FILE)).unwrap();
        let back = testing::parse(&cm.data["scenario.toml"]);
        assert_eq!(back, s);
    }

    #[test]
    fn gpus_are_numbered_from_zero_in_the_pod_and_a_note_says_so() {
        let mut s = testing::green();
        s.device.gpu = 3;
        let e = export(
            Planned::new(&s, "p.toml").unwrap(),
            &options(Claim::Dra, Kind::DaemonSet),
        )
        .unwrap();
        assert!(file(&e, CONFIGMAP_FILE).contains("gpu = 0"));
        assert!(
            e.notes.iter().any(|n| n.contains("the plan used GPU 3")),
            "{:?}",
            e.notes
        );
    }

    #[test]
    fn an_mps_plan_shares_through_the_dra_drivers_mps_daemon_which_serve_joins() {
        let s = testing::mps();
        let e = export(
            Planned::new(&s, "p.toml").unwrap(),
            &options(Claim::Dra, Kind::Deployment { replicas: 2 }),
        )
        .unwrap();
        let claim = file(&e, CLAIM_FILE);
        assert!(claim.contains("kind: GpuConfig"), "{claim}");
        assert!(claim.contains("strategy: MPS"), "{claim}");
        let d = file(&e, DEPLOYMENT_FILE);
        assert!(d.contains("- --join-mps"), "{d}");
        assert!(d.contains("replicas: 2"), "{d}");
        // serve runs each MPS client's model in a worker process of its own.
        assert!(
            !e.notes.iter().any(|n| n.contains("refuses it at start")),
            "{:?}",
            e.notes
        );
    }

    #[test]
    fn a_mig_plan_claims_one_device_of_each_profile() {
        let s = testing::mig();
        let e = export(
            Planned::new(&s, "p.toml").unwrap(),
            &options(Claim::Dra, Kind::DaemonSet),
        )
        .unwrap();
        let claim = file(&e, CLAIM_FILE);
        assert_eq!(claim.matches("deviceClassName: mig.nvidia.com").count(), 3);
        assert!(claim.contains("profile == '1g.10gb'"), "{claim}");
        let e = export(
            Planned::new(&s, "p.toml").unwrap(),
            &options(Claim::DevicePlugin, Kind::DaemonSet),
        )
        .unwrap();
        let ds = file(&e, DAEMONSET_FILE);
        assert!(ds.contains("nvidia.com/mig-1g.10gb: '2'"), "{ds}");
        assert!(ds.contains("nvidia.com/mig-3g.40gb: '1'"), "{ds}");
        assert!(file(&e, DEVICE_PLUGIN_FILE).contains("migStrategy: mixed"));
    }

    #[test]
    fn the_device_plugin_claims_whole_gpus_and_says_why_it_shares_nothing() {
        let s = testing::mps();
        let e = export(
            Planned::new(&s, "p.toml").unwrap(),
            &options(Claim::DevicePlugin, Kind::DaemonSet),
        )
        .unwrap();
        assert!(file(&e, DAEMONSET_FILE).contains("nvidia.com/gpu: '1'"));
        assert!(!file(&e, DAEMONSET_FILE).contains("--join-mps"));
        assert!(e.notes.iter().any(|n| n.contains("no `sharing` section")));
    }

    #[test]
    fn a_daemonset_without_a_known_gpu_is_refused_naming_the_flag() {
        let s = testing::green();
        let mut o = options(Claim::Dra, Kind::DaemonSet);
        o.gpu_product = None;
        let m = export(Planned::new(&s, "p.toml").unwrap(), &o)
            .unwrap_err()
            .to_string();
        assert!(m.starts_with("--gpu-product:"), "{m}");
        assert!(m.contains("--kind deployment"), "{m}");
        // A CPU plan needs no GPU.
        let s = testing::cpu();
        let e = export(Planned::new(&s, "p.toml").unwrap(), &o).unwrap();
        let ds = file(&e, DAEMONSET_FILE);
        assert!(!ds.contains("nvidia.com"), "{ds}");
        assert!(e
            .notes
            .iter()
            .any(|n| n.contains("runs a pod on every node")));
        assert!(!e.files.iter().any(|f| f.path == CLAIM_FILE));
    }

    #[test]
    fn bad_names_and_products_are_refused_with_what_is_allowed() {
        assert!(check_name("Isolane")
            .unwrap_err()
            .to_string()
            .contains("lowercase"));
        assert!(check_name("a-").is_err());
        assert!(check_name(&"a".repeat(53)).is_err());
        check_name("isolane-plan-2").unwrap();
        let m = check_gpu_product("H100' || true").unwrap_err().to_string();
        assert!(m.contains("no quotes"), "{m}");
        check_gpu_product("NVIDIA H200").unwrap();
        assert_eq!(
            product_label(" NVIDIA H100 80GB HBM3 "),
            "NVIDIA-H100-80GB-HBM3"
        );
    }
}
