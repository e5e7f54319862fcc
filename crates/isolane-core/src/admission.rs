//! Admission control: checks every workload's partition of a scenario at once against a device
//! and either resolves each one (green group, MIG placement, MPS settings) or rejects the plan
//! with a reason per workload. Nothing is ever clamped: a request that does not fit is refused.

use serde::Serialize;

use crate::device_model::{green_unit, place_mig_instances, DeviceModel, GreenRules, MigPlacement};
use crate::spec::{Backend, Criticality, DeviceSpec, Mechanism, Rate, Scenario, WorkloadSpec};

/// What a workload gets once admitted.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum ResolvedPartition {
    /// The CPU backend: no device partition.
    Cpu,
    /// timeslice: the whole GPU, shared in turns.
    Whole,
    /// green: the `group`-th group of SMs, `first_sm .. first_sm + sms` in split order.
    Green { group: u32, sms: u32, first_sm: u32 },
    /// mps: the client's environment.
    Mps {
        thread_pct: u32,
        mem_limit_mib: Option<u64>,
    },
    /// mig: a GPU instance of `profile` at memory slice `start`.
    Mig {
        profile: String,
        start: u32,
        sms: u32,
        memory_mib: u64,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AdmittedWorkload {
    pub workload: String,
    pub partition: ResolvedPartition,
    /// Estimated device memory of the workload, when known.
    pub memory_mib: Option<u64>,
    /// The GPU index it runs on, given only when the scenario has several GPUs (one GPU: the
    /// device's `gpu`; CPU workloads: none). Read it through [`AdmittedWorkload::gpu_or`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu: Option<u32>,
}

impl AdmittedWorkload {
    /// The GPU index this workload runs on, `default` (the device's `gpu`) unless the plan
    /// names one.
    pub fn gpu_or(&self, default: u32) -> u32 {
        self.gpu.unwrap_or(default)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Plan {
    pub device: String,
    pub mechanism: Mechanism,
    pub workloads: Vec<AdmittedWorkload>,
}

/// The SMs a layout of these green workloads may hold together where the device's split falls
/// short of its SM count (`DeviceModel::green_split_limit`): only when the sizes' greatest
/// common divisor is the unit that falls short (they are split in units of it).
fn green_split_limit(
    device: &DeviceModel,
    rules: &GreenRules,
    workloads: &[(usize, &WorkloadSpec)],
) -> Option<u32> {
    let (unit, groups) = device.green_split_limit()?;
    let sizes = (workloads.iter())
        .filter_map(|(_, w)| w.partition.sms)
        .filter(|&s| s >= rules.min_sms && s % rules.step_sms == 0);
    (green_unit(sizes) == unit).then_some(unit * groups)
}

/// Why one workload cannot be admitted.
#[derive(Debug, Clone, PartialEq, Serialize, thiserror::Error)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum RejectReason {
    #[error("partition.{field} is required with mechanism {mechanism}")]
    MissingPartition {
        field: &'static str,
        mechanism: &'static str,
    },
    #[error("{sms} SMs is below the minimum of {min} SMs per green context on {device}")]
    BelowMinimum { sms: u32, min: u32, device: String },
    #[error("{sms} SMs is not a multiple of the step of {step} SMs on {device} (try {lower} or {upper})")]
    OffStep {
        sms: u32,
        step: u32,
        lower: u32,
        upper: u32,
        device: String,
    },
    #[error(
        "asks for {sms} SMs but only {available} of {total} are left after the workloads before it"
    )]
    TooManySms {
        sms: u32,
        available: u32,
        total: u32,
    },
    #[error(
        "asks for {sms} SMs but only {available} of the {together} SMs that green contexts of \
         {device} can hold together are left after the workloads before it ({device_sms} SMs \
         in all: the driver keeps each group within SMs scheduled together, docs/partitions.md)"
    )]
    BeyondGreenSplit {
        sms: u32,
        available: u32,
        together: u32,
        device_sms: u32,
        device: String,
    },
    #[error("green contexts need compute capability 6.0 or later; {device} is {major}.{minor}")]
    GreenUnsupported {
        device: String,
        major: u32,
        minor: u32,
    },
    #[error("{device} has no MIG")]
    MigUnsupported { device: String },
    #[error("unknown MIG profile '{profile}' on {device}; allowed: {allowed}")]
    UnknownMigProfile {
        profile: String,
        device: String,
        allowed: String,
    },
    #[error("no MIG placement holds all requested instances ({requested}) on {device}")]
    NoMigPlacement { requested: String, device: String },
    #[error("thread percentages add up to {total}% (budget {budget}%); this workload's {thread_pct}% is over it")]
    ThreadPctOverBudget {
        thread_pct: u32,
        total: u32,
        budget: u32,
    },
    #[error(
        "pinned memory limits add up to {total_mib} MiB, more than the device's {device_mib} MiB"
    )]
    PinnedMemoryOverBudget { total_mib: u64, device_mib: u64 },
    #[error("needs about {need_mib} MiB but its partition has {have_mib} MiB")]
    MemoryOverPartition { need_mib: u64, have_mib: u64 },
    #[error("the workloads need about {total_mib} MiB together, more than the device's {device_mib} MiB")]
    MemoryOverDevice { total_mib: u64, device_mib: u64 },
    #[error("backend cuda cannot be planned with mechanism none")]
    NoMechanism,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Rejection {
    pub workload: String,
    #[serde(flatten)]
    pub reason: RejectReason,
    pub message: String,
    /// The GPU whose budget refused it, given only when the scenario has several GPUs (the
    /// message then starts "on GPU n: ").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu: Option<u32>,
}

fn reject(rejections: &mut Vec<Rejection>, workload: &str, reason: RejectReason) {
    rejections.push(Rejection {
        workload: workload.to_string(),
        message: reason.to_string(),
        reason,
        gpu: None,
    })
}

/// Options of admission control.
#[derive(Debug, Clone)]
pub struct AdmissionOptions {
    /// Sum of MPS thread percentages allowed. 100 means no oversubscription: each client's share
    /// is then a guaranteed upper bound that the others cannot eat into.
    pub mps_thread_budget_pct: u32,
}

impl Default for AdmissionOptions {
    fn default() -> Self {
        AdmissionOptions {
            mps_thread_budget_pct: 100,
        }
    }
}

/// Admits every workload of `scenario` on `device`, or returns one rejection per workload that
/// does not fit. `memory_estimate_mib[i]` is workload i's device-memory estimate, if known.
///
/// With several GPUs (`device.gpus`), every GPU is a `device` of its own: each one's SMs,
/// thread percentages, memory and MIG placements are admitted separately, among the workloads
/// on it; the plan then says each GPU workload's GPU and every rejection names its GPU.
pub fn admit(
    scenario: &Scenario,
    device: &DeviceModel,
    memory_estimate_mib: &[Option<u64>],
    options: &AdmissionOptions,
) -> Result<Plan, Vec<Rejection>> {
    let mechanism = scenario.device.mechanism;
    let mut rejections = Vec::new();
    let mut admitted: Vec<AdmittedWorkload> = Vec::new();
    let estimate = |i: usize| memory_estimate_mib.get(i).copied().flatten();

    // A workload on the CPU (the device's backend, or its own `backend = "cpu"`) takes no GPU
    // partition: it is admitted as it is, and the mechanism's rules see only the GPU ones.
    let (gpu_workloads, cpu_workloads): (Vec<_>, Vec<_>) = scenario
        .workloads
        .iter()
        .enumerate()
        .partition(|(_, w)| scenario.device.backend == Backend::Cuda && w.on_gpu());
    for (i, w) in cpu_workloads {
        admitted.push(AdmittedWorkload {
            workload: w.name.clone(),
            partition: ResolvedPartition::Cpu,
            memory_mib: estimate(i),
            gpu: None,
        });
    }
    let several = scenario.device.several_gpus();
    for gpu in scenario.device.all_gpus() {
        let on_gpu: Vec<(usize, &WorkloadSpec)> = gpu_workloads
            .iter()
            .copied()
            .filter(|(_, w)| w.gpu_on(&scenario.device) == gpu)
            .collect();
        let one = OneGpu {
            backend: scenario.device.backend,
            mechanism,
            device,
            options,
            estimate: &estimate,
        };
        let (ok, refused) = one.admit(&on_gpu);
        // One GPU: the plan and the messages are exactly those of a single-GPU scenario.
        let tag = several.then_some(gpu);
        admitted.extend(ok.into_iter().map(|a| AdmittedWorkload { gpu: tag, ..a }));
        rejections.extend(refused.into_iter().map(|r| r.on_gpu(tag)));
    }

    if rejections.is_empty() {
        // In the scenario's order, CPU workloads among the GPU ones. One map of the names
        // (unique, by validation): a search of the list per comparison made a plan of 64k
        // workloads take half a minute.
        let position: std::collections::HashMap<&str, usize> = scenario
            .workloads
            .iter()
            .enumerate()
            .map(|(i, w)| (w.name.as_str(), i))
            .collect();
        admitted.sort_by_key(|a| position.get(a.workload.as_str()).copied());
        Ok(Plan {
            device: device.name.to_string(),
            mechanism,
            workloads: admitted,
        })
    } else {
        Err(rejections)
    }
}

impl Rejection {
    /// The rejection as one of GPU `gpu`'s (`None`: the scenario has one GPU, left unsaid).
    fn on_gpu(self, gpu: Option<u32>) -> Rejection {
        match gpu {
            None => self,
            Some(g) => Rejection {
                message: format!("on GPU {g}: {}", self.message),
                gpu: Some(g),
                ..self
            },
        }
    }
}

/// Admission on one GPU: the mechanism's rules among the workloads placed on it.
struct OneGpu<'a> {
    backend: Backend,
    mechanism: Mechanism,
    device: &'a DeviceModel,
    options: &'a AdmissionOptions,
    estimate: &'a dyn Fn(usize) -> Option<u64>,
}

impl OneGpu<'_> {
    /// The admitted workloads of `gpu_workloads` (each with its index in the scenario), or
    /// the rejections.
    fn admit(
        &self,
        gpu_workloads: &[(usize, &WorkloadSpec)],
    ) -> (Vec<AdmittedWorkload>, Vec<Rejection>) {
        let (mechanism, estimate) = (self.mechanism, self.estimate);
        let mut rejections = Vec::new();
        let mut admitted: Vec<AdmittedWorkload> = Vec::new();
        match (self.backend, mechanism) {
            // Every workload was admitted to the CPU above.
            (Backend::Cpu, _) => {}
            (Backend::Cuda, Mechanism::None) => {
                for (_, w) in gpu_workloads {
                    reject(&mut rejections, &w.name, RejectReason::NoMechanism);
                }
            }
            (Backend::Cuda, Mechanism::Timeslice) => {
                for &(i, w) in gpu_workloads {
                    admitted.push(AdmittedWorkload {
                        workload: w.name.clone(),
                        partition: ResolvedPartition::Whole,
                        memory_mib: estimate(i),
                        gpu: None,
                    });
                }
            }
            (Backend::Cuda, Mechanism::Green) => {
                self.green(gpu_workloads, &mut admitted, &mut rejections)
            }
            (Backend::Cuda, Mechanism::Mps) => {
                self.mps(gpu_workloads, &mut admitted, &mut rejections)
            }
            (Backend::Cuda, Mechanism::Mig) => {
                self.mig(gpu_workloads, &mut admitted, &mut rejections)
            }
        }
        if self.backend == Backend::Cuda && rejections.is_empty() {
            self.memory_over_device(gpu_workloads, &mut rejections);
        }
        (admitted, rejections)
    }

    /// green: each group on the minimum and the step, the groups within the GPU's SMs.
    fn green(
        &self,
        gpu_workloads: &[(usize, &WorkloadSpec)],
        admitted: &mut Vec<AdmittedWorkload>,
        rejections: &mut Vec<Rejection>,
    ) {
        let (device, estimate) = (self.device, self.estimate);
        let Some(rules) = device.green_rules() else {
            let (major, minor) = device.compute_capability;
            for (_, w) in gpu_workloads {
                reject(
                    rejections,
                    &w.name,
                    RejectReason::GreenUnsupported {
                        device: device.name.to_string(),
                        major,
                        minor,
                    },
                );
            }
            return;
        };
        let mut next_sm = 0u32;
        let mut group = 0u32;
        let limit = green_split_limit(device, &rules, gpu_workloads);
        for &(i, w) in gpu_workloads {
            let Some(sms) = w.partition.sms else {
                reject(
                    rejections,
                    &w.name,
                    RejectReason::MissingPartition {
                        field: "sms",
                        mechanism: "green",
                    },
                );
                continue;
            };
            if sms < rules.min_sms {
                reject(
                    rejections,
                    &w.name,
                    RejectReason::BelowMinimum {
                        sms,
                        min: rules.min_sms,
                        device: device.name.to_string(),
                    },
                );
                continue;
            }
            if sms % rules.step_sms != 0 {
                let lower = (sms / rules.step_sms * rules.step_sms).max(rules.min_sms);
                reject(
                    rejections,
                    &w.name,
                    RejectReason::OffStep {
                        sms,
                        step: rules.step_sms,
                        lower,
                        upper: lower + rules.step_sms,
                        device: device.name.to_string(),
                    },
                );
                continue;
            }
            let available = device.sm_count - next_sm;
            if sms > available {
                reject(
                    rejections,
                    &w.name,
                    RejectReason::TooManySms {
                        sms,
                        available,
                        total: device.sm_count,
                    },
                );
                continue;
            }
            // A layout in the smallest units holds only what one split gives of them
            // (DeviceModel::green_split_limit).
            if let Some(together) = limit.filter(|&t| next_sm + sms > t) {
                reject(
                    rejections,
                    &w.name,
                    RejectReason::BeyondGreenSplit {
                        sms,
                        available: together.saturating_sub(next_sm),
                        together,
                        device_sms: device.sm_count,
                        device: device.name.to_string(),
                    },
                );
                continue;
            }
            admitted.push(AdmittedWorkload {
                workload: w.name.clone(),
                partition: ResolvedPartition::Green {
                    group,
                    sms,
                    first_sm: next_sm,
                },
                memory_mib: estimate(i),
                gpu: None,
            });
            next_sm += sms;
            group += 1;
        }
    }
    /// mps: thread percentages within the budget, pinned limits within the memory.
    fn mps(
        &self,
        gpu_workloads: &[(usize, &WorkloadSpec)],
        admitted: &mut Vec<AdmittedWorkload>,
        rejections: &mut Vec<Rejection>,
    ) {
        let (device, options, estimate) = (self.device, self.options, self.estimate);
        let mut total_pct = 0u32;
        let mut total_pinned = 0u64;
        for &(i, w) in gpu_workloads {
            let Some(pct) = w.partition.thread_pct else {
                reject(
                    rejections,
                    &w.name,
                    RejectReason::MissingPartition {
                        field: "thread_pct",
                        mechanism: "mps",
                    },
                );
                continue;
            };
            // Saturating: a file may hold any number of workloads (an overflow would panic).
            total_pct = total_pct.saturating_add(pct);
            if total_pct > options.mps_thread_budget_pct {
                reject(
                    rejections,
                    &w.name,
                    RejectReason::ThreadPctOverBudget {
                        thread_pct: pct,
                        total: total_pct,
                        budget: options.mps_thread_budget_pct,
                    },
                );
                continue;
            }
            if let Some(limit) = w.partition.mem_limit_mib {
                // Each limit may be up to i64::MAX MiB: three of them overflow a u64.
                total_pinned = total_pinned.saturating_add(limit);
                if total_pinned > device.memory_mib {
                    reject(
                        rejections,
                        &w.name,
                        RejectReason::PinnedMemoryOverBudget {
                            total_mib: total_pinned,
                            device_mib: device.memory_mib,
                        },
                    );
                    continue;
                }
                if let Some(need) = estimate(i) {
                    if need > limit {
                        reject(
                            rejections,
                            &w.name,
                            RejectReason::MemoryOverPartition {
                                need_mib: need,
                                have_mib: limit,
                            },
                        );
                        continue;
                    }
                }
            }
            admitted.push(AdmittedWorkload {
                workload: w.name.clone(),
                partition: ResolvedPartition::Mps {
                    thread_pct: pct,
                    mem_limit_mib: w.partition.mem_limit_mib,
                },
                memory_mib: estimate(i),
                gpu: None,
            });
        }
    }
    /// mig: known profiles, placed all at once on the GPU's memory slices.
    fn mig(
        &self,
        gpu_workloads: &[(usize, &WorkloadSpec)],
        admitted: &mut Vec<AdmittedWorkload>,
        rejections: &mut Vec<Rejection>,
    ) {
        let (device, estimate) = (self.device, self.estimate);
        let Some(mig) = device.mig.as_ref() else {
            for (_, w) in gpu_workloads {
                reject(
                    rejections,
                    &w.name,
                    RejectReason::MigUnsupported {
                        device: device.name.to_string(),
                    },
                );
            }
            return;
        };
        let mut requested: Vec<(usize, &WorkloadSpec, &str)> = Vec::new();
        for &(i, w) in gpu_workloads {
            match w.partition.mig_profile.as_deref() {
                None => reject(
                    rejections,
                    &w.name,
                    RejectReason::MissingPartition {
                        field: "mig_profile",
                        mechanism: "mig",
                    },
                ),
                Some(p) if mig.profile(p).is_none() => reject(
                    rejections,
                    &w.name,
                    RejectReason::UnknownMigProfile {
                        profile: p.to_string(),
                        device: device.name.to_string(),
                        allowed: mig.profile_names().join(", "),
                    },
                ),
                Some(p) => requested.push((i, w, p)),
            }
        }
        let names: Vec<&str> = requested.iter().map(|(_, _, p)| *p).collect();
        match place_mig_instances(mig, &names) {
            Some(placements) => {
                for (&(i, w, _), MigPlacement { profile, start, .. }) in
                    requested.iter().zip(placements)
                {
                    // The profile exists: it was looked up above.
                    let Some(p) = mig.profile(profile) else {
                        continue;
                    };
                    if let Some(need) = estimate(i) {
                        if need > p.memory_mib {
                            reject(
                                rejections,
                                &w.name,
                                RejectReason::MemoryOverPartition {
                                    need_mib: need,
                                    have_mib: p.memory_mib,
                                },
                            );
                            continue;
                        }
                    }
                    admitted.push(AdmittedWorkload {
                        workload: w.name.clone(),
                        partition: ResolvedPartition::Mig {
                            profile: profile.to_string(),
                            start,
                            sms: p.sms,
                            memory_mib: p.memory_mib,
                        },
                        memory_mib: estimate(i),
                        gpu: None,
                    });
                }
            }
            None => {
                let all = names.join(" + ");
                for (_, w, _) in &requested {
                    reject(
                        rejections,
                        &w.name,
                        RejectReason::NoMigPlacement {
                            requested: all.clone(),
                            device: device.name.to_string(),
                        },
                    );
                }
            }
        }
    }

    /// Memory over the whole GPU: MIG and pinned MPS limits were checked per partition, but
    /// workloads without a limit still share the GPU's memory.
    fn memory_over_device(
        &self,
        gpu_workloads: &[(usize, &WorkloadSpec)],
        rejections: &mut Vec<Rejection>,
    ) {
        let (device, estimate) = (self.device, self.estimate);
        let total: u64 = gpu_workloads.iter().filter_map(|(i, _)| estimate(*i)).sum();
        if total > device.memory_mib {
            for &(i, w) in gpu_workloads {
                if estimate(i).is_some() {
                    reject(
                        rejections,
                        &w.name,
                        RejectReason::MemoryOverDevice {
                            total_mib: total,
                            device_mib: device.memory_mib,
                        },
                    );
                }
            }
        }
    }
}

/// A critical workload whose deadline is predicted to be missed beside its neighbours
/// (`crate::predict`): its p99 execution time alone in its partition × the stretch the
/// workloads on its GPU are predicted to cause is over its deadline, or its jobs, released at
/// its rate, would keep it busy all the time at that time each, so that they queue without
/// bound (session 29: trio c's light CNN missed 99.9 % with every job's own time inside its
/// deadline). For a resident victim (a CNN) the stretch is at least the fitted model's floor
/// (`Fitted::admission_stretch`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PredictedMiss {
    pub workload: String,
    pub alone_p99_ms: f64,
    pub stretch: f64,
    pub predicted_p99_ms: f64,
    pub deadline_ms: f64,
    /// The neighbour that alone would stretch it most, and by how much.
    pub worst_neighbour: Option<(String, f64)>,
    /// The share of the time its jobs would keep it busy at the predicted p99 (its rate ×
    /// that time), for a workload released at a rate; a miss by queueing from 1 on.
    pub busy: Option<f64>,
}

impl PredictedMiss {
    /// Whether its jobs are predicted to queue without bound (busy all the time or more).
    pub fn saturated(&self) -> bool {
        self.busy.is_some_and(|b| b >= 1.0)
    }
}

impl std::fmt::Display for PredictedMiss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.busy {
            Some(busy) if self.saturated() && self.predicted_p99_ms <= self.deadline_ms => {
                write!(
                    f,
                    "workload '{}': predicted busy {:.0} % of the time beside its neighbours \
                     (its rate × its p99 alone of {:.3} ms × the memory system's stretch), so \
                     its jobs queue without bound and miss its deadline of {:.3} ms",
                    self.workload,
                    busy * 100.0,
                    self.alone_p99_ms,
                    self.deadline_ms
                )?;
            }
            _ => write!(
                f,
                "workload '{}': predicted p99 {:.3} ms beside its neighbours (alone {:.3} ms × \
                 stretch {:.2}), over its deadline of {:.3} ms",
                self.workload,
                self.predicted_p99_ms,
                self.alone_p99_ms,
                self.stretch,
                self.deadline_ms
            )?,
        }
        if let Some((n, s)) = &self.worst_neighbour {
            write!(f, "; most from '{n}' (stretch {s:.2} beside it alone)")?;
        }
        Ok(())
    }
}

/// The critical workloads of `scenario` predicted to miss their deadlines beside the workloads
/// on their GPU, with the fitted coefficients of `device` under the scenario's mechanism
/// (none: nothing is predicted). `profiles[i]` is workload i's memory-system demand and
/// `alone_p99_ms[i]` its p99 execution time alone in its partition (a profile or an earlier
/// run); a workload without either is neither predicted nor counted as a neighbour.
pub fn predicted_misses(
    scenario: &Scenario,
    device: &DeviceModel,
    profiles: &[Option<crate::predict::MemoryProfile>],
    alone_p99_ms: &[Option<f64>],
) -> Vec<PredictedMiss> {
    misses_among(
        &scenario.device,
        &scenario.workloads,
        device,
        profiles,
        alone_p99_ms,
    )
}

/// [`predicted_misses`] of `workloads` on the device `spec` describes.
fn misses_among(
    spec: &DeviceSpec,
    workloads: &[WorkloadSpec],
    device: &DeviceModel,
    profiles: &[Option<crate::predict::MemoryProfile>],
    alone_p99_ms: &[Option<f64>],
) -> Vec<PredictedMiss> {
    use crate::predict::{fitted, memory_system, predict, Neighbour};
    let (Some(f), Some(sys)) = (
        fitted(device.name, spec.mechanism),
        memory_system(device.name),
    ) else {
        return Vec::new();
    };
    let known = |i: usize| {
        let p = profiles.get(i).copied().flatten()?;
        let t = alone_p99_ms.get(i).copied().flatten()?;
        (t.is_finite() && t > 0.0).then_some((p, t))
    };
    let on_gpu = |w: &WorkloadSpec| spec.backend == Backend::Cuda && w.on_gpu();
    let mut misses = Vec::new();
    for (i, w) in workloads.iter().enumerate() {
        let (Some((victim, alone)), true) = (known(i), on_gpu(w)) else {
            continue;
        };
        let (Some(deadline_s), Criticality::Critical) = (w.deadline_s(), w.criticality) else {
            continue;
        };
        let gpu = w.gpu_on(spec);
        let neighbours: Vec<Neighbour> = (workloads.iter().enumerate())
            .filter(|&(j, o)| j != i && on_gpu(o) && o.gpu_on(spec) == gpu)
            .filter_map(|(j, o)| {
                let (profile, exec_ms) = known(j)?;
                Some(Neighbour {
                    name: o.name.clone(),
                    profile,
                    exec_ms,
                })
            })
            .collect();
        let p = predict(&f.coefficients, &sys, alone, &neighbours);
        // Where the model is known to under-predict (a CNN victim), admission takes the
        // matrix's floor instead, beside all of them and beside the worst one alone alike.
        let stretch = f.admission_stretch(&victim, &neighbours, p.stretch);
        let worst = (p.worst).map(|(n, s)| (n, f.admission_stretch(&victim, &neighbours, s)));
        let deadline_ms = deadline_s * 1e3;
        // Busy by the model's own stretch, not the floor: the floor is a bound on a p99, and
        // with a p99 for each job's time the share is already an upper estimate.
        let busy = match w.rate {
            Rate::Hz(hz) if hz > 0.0 => Some(hz * alone * p.stretch / 1e3),
            _ => None,
        };
        let miss = PredictedMiss {
            workload: w.name.clone(),
            alone_p99_ms: alone,
            stretch,
            predicted_p99_ms: alone * stretch,
            deadline_ms,
            worst_neighbour: worst,
            busy,
        };
        if miss.predicted_p99_ms > deadline_ms || miss.saturated() {
            misses.push(miss);
        }
    }
    misses
}

/// One served workload as a change would leave it (or as it is), with what the prediction
/// needs: its memory-system demand and its p99 alone in the partition it would have.
#[derive(Debug, Clone, PartialEq)]
pub struct Live {
    pub spec: WorkloadSpec,
    pub profile: Option<crate::predict::MemoryProfile>,
    pub alone_p99_ms: Option<f64>,
}

/// Admission of a change while serving (`isolane ctl resize/load`, `serve --autoplan`'s
/// re-plans), beyond SMs and memory: the critical workloads that the served set `after` the
/// change is predicted to push past their deadlines beside their neighbours, where `before`
/// it they were predicted to meet them or to miss by less. A workload already predicted to
/// miss by as much is not the change's doing (a change that relieves it is never refused).
/// Warns or refuses as `[protection] admission` (`mode`) says; nothing is predicted where
/// [`predicted_misses`] predicts nothing.
pub fn foresee_change(
    spec: &DeviceSpec,
    device: &DeviceModel,
    mode: crate::spec::AdmissionMode,
    before: &[Live],
    after: &[Live],
) -> Foresight {
    use crate::spec::AdmissionMode;
    if mode == AdmissionMode::Off {
        return Foresight::Clear;
    }
    let misses = |set: &[Live]| {
        let workloads: Vec<WorkloadSpec> = set.iter().map(|l| l.spec.clone()).collect();
        let profiles: Vec<_> = set.iter().map(|l| l.profile).collect();
        let alone: Vec<_> = set.iter().map(|l| l.alone_p99_ms).collect();
        misses_among(spec, &workloads, device, &profiles, &alone)
    };
    let was = misses(before);
    // A prediction within a nanosecond of the one before is the same one.
    let pushed: Vec<PredictedMiss> = (misses(after).into_iter())
        .filter(|m| {
            !was.iter().any(|b| {
                b.workload == m.workload
                    && b.predicted_p99_ms >= m.predicted_p99_ms - 1e-6
                    && b.busy.unwrap_or(0.0) >= m.busy.unwrap_or(0.0) - 1e-9
            })
        })
        .collect();
    match (pushed.is_empty(), mode) {
        (true, _) | (_, AdmissionMode::Off) => Foresight::Clear,
        (false, AdmissionMode::Warn) => Foresight::Warn(pushed),
        (false, AdmissionMode::Refuse) => Foresight::Refuse(pushed),
    }
}

/// What a run does before it starts about the critical deadlines predicted to miss
/// (`[protection] admission`).
#[derive(Debug, Clone, PartialEq)]
pub enum Foresight {
    /// Nothing is predicted to miss (or nothing could be predicted, or `admission = "off"`).
    Clear,
    /// The run goes ahead; these are said first.
    Warn(Vec<PredictedMiss>),
    /// The run is refused (exit 2).
    Refuse(Vec<PredictedMiss>),
}

impl Foresight {
    /// The text a person reads: one line per predicted miss, naming the workload, the
    /// neighbour that stretches it most and the predicted stretch, and the key that decides.
    /// `file` names the scenario. Empty when clear.
    pub fn text(&self, file: &str) -> String {
        let (misses, what) = match self {
            Foresight::Clear => return String::new(),
            Foresight::Warn(m) => (
                m,
                "the run goes ahead ([protection] admission = \"refuse\" refuses it, \"off\" \
                 predicts nothing)",
            ),
            Foresight::Refuse(m) => (
                m,
                "refused by [protection] admission = \"refuse\" (\"warn\" runs it anyway)",
            ),
        };
        let mut out = format!(
            "{file}: {} critical deadline{} predicted to miss beside {} neighbours (the memory \
             system's stretch, docs/interference.md); {what}:",
            misses.len(),
            if misses.len() == 1 { " is" } else { "s are" },
            if misses.len() == 1 { "its" } else { "their" },
        );
        for m in misses {
            out.push_str("\n  ");
            out.push_str(&m.to_string());
        }
        out
    }
}

impl Foresight {
    /// The text of a change's foresight ([`foresee_change`]) on one line, for a refusal's
    /// answer or the log: `what` names the change (`model `cam`: sms 48 → 16`). Empty when
    /// clear.
    pub fn change_text(&self, what: &str) -> String {
        let (misses, verdict) = match self {
            Foresight::Clear => return String::new(),
            Foresight::Warn(m) => (
                m,
                "made anyway ([protection] admission = \"refuse\" refuses it, \"off\" predicts \
                 nothing)",
            ),
            Foresight::Refuse(m) => (
                m,
                "refused by [protection] admission = \"refuse\" (\"warn\" makes it with a \
                 warning); nothing was changed",
            ),
        };
        let each: Vec<String> = misses.iter().map(|m| m.to_string()).collect();
        let one = misses.len() == 1;
        format!(
            "{what}: {} critical workload{} predicted to miss {} deadline{} beside {} \
             neighbours after it (the memory system's stretch, docs/interference.md): {}; \
             {verdict}",
            misses.len(),
            if one { " is" } else { "s are" },
            if one { "its" } else { "their" },
            if one { "" } else { "s" },
            if one { "its" } else { "their" },
            each.join("; ")
        )
    }
}

/// [`predicted_misses`] as `[protection] admission` of `scenario` asks: warn, refuse or not
/// predict at all.
pub fn foresee(
    scenario: &Scenario,
    device: &DeviceModel,
    profiles: &[Option<crate::predict::MemoryProfile>],
    alone_p99_ms: &[Option<f64>],
) -> Foresight {
    use crate::spec::AdmissionMode;
    let mode = scenario.protection.admission;
    if mode == AdmissionMode::Off {
        return Foresight::Clear;
    }
    let misses = predicted_misses(scenario, device, profiles, alone_p99_ms);
    match (misses.is_empty(), mode) {
        (true, _) | (_, AdmissionMode::Off) => Foresight::Clear,
        (false, AdmissionMode::Warn) => Foresight::Warn(misses),
        (false, AdmissionMode::Refuse) => Foresight::Refuse(misses),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device_model::device_model;
    use crate::spec::*;

    fn workload(name: &str, partition: PartitionSpec) -> WorkloadSpec {
        WorkloadSpec {
            name: name.to_string(),
            model: "spin:1ms".to_string(),
            weights: None,
            batch: 1,
            precision: Precision::Fp32,
            calibration: None,
            rate: Rate::Hz(100.0),
            deadline_ms: None,
            phase_ms: None,
            length: RunLength::Jobs(10),
            warmup_jobs: 0,
            late: LatePolicy::Skip,
            cpu: vec![],
            role: Role::Standalone,
            ramp: None,
            host: Host::Thread,
            partition,
            plan_check: true,
            criticality: Criticality::Critical,
            stretch: None,
            backend: Backend::Cuda,
            program: None,
            gpu: None,
            serve: Default::default(),
        }
    }

    fn scenario(mechanism: Mechanism, parts: Vec<PartitionSpec>) -> Scenario {
        Scenario {
            device: DeviceSpec {
                backend: Backend::Cuda,
                gpu: 0,
                mechanism,
                host: Host::Thread,
                gpus: Vec::new(),
            },
            timing: TimingSpec::default(),
            protection: ProtectionSpec::default(),
            workloads: parts
                .into_iter()
                .enumerate()
                .map(|(i, p)| workload(&format!("w{i}"), p))
                .collect(),
        }
    }

    fn sms(n: u32) -> PartitionSpec {
        PartitionSpec {
            sms: Some(n),
            ..Default::default()
        }
    }

    fn mps(pct: u32, mem: Option<u64>) -> PartitionSpec {
        PartitionSpec {
            thread_pct: Some(pct),
            mem_limit_mib: mem,
            ..Default::default()
        }
    }

    fn mig(p: &str) -> PartitionSpec {
        PartitionSpec {
            mig_profile: Some(p.to_string()),
            ..Default::default()
        }
    }

    fn reasons(r: Result<Plan, Vec<Rejection>>) -> Vec<(String, RejectReason)> {
        r.expect_err("expected a rejection")
            .into_iter()
            .map(|r| (r.workload, r.reason))
            .collect()
    }

    fn opts() -> AdmissionOptions {
        AdmissionOptions::default()
    }

    /// Issue 31: `plan` of 64k workloads took 36 s, validation 0.35 s: the plan was put back
    /// in the scenario's order by a search of the workload list per comparison of the sort
    /// (n² log n). 100k workloads, a third of them on the CPU (admitted first, then sorted
    /// among the GPU ones), take well under a second now; the quadratic sort took hours, so a
    /// 30 s bound cannot be missed by a loaded machine and cannot be met by a regression.
    #[test]
    fn a_plan_of_100k_workloads_is_put_in_order_in_n_log_n() {
        let n = 100_000;
        let mut s = scenario(Mechanism::Timeslice, vec![PartitionSpec::default(); n]);
        for w in s.workloads.iter_mut().step_by(3) {
            w.backend = Backend::Cpu;
        }
        let h100 = device_model("h100-sxm").unwrap();
        let t = std::time::Instant::now();
        let plan = admit(&s, &h100, &[], &opts()).unwrap();
        let took = t.elapsed();
        assert!(took < std::time::Duration::from_secs(30), "{took:?}");
        assert_eq!(plan.workloads.len(), n);
        assert!(plan
            .workloads
            .iter()
            .zip(&s.workloads)
            .all(|(a, w)| a.workload == w.name));
        assert!(matches!(
            plan.workloads[0].partition,
            ResolvedPartition::Cpu
        ));
        assert!(matches!(
            plan.workloads[1].partition,
            ResolvedPartition::Whole
        ));
    }

    /// Pinned MPS limits of up to i64::MAX MiB each: three of them overflowed the running
    /// total (a panic); they are refused as over the device's memory.
    #[test]
    fn pinned_limits_beyond_u64_are_refused_not_overflowed() {
        let h100 = device_model("h100-sxm").unwrap();
        let limit = Some(i64::MAX as u64);
        let r = admit(
            &scenario(Mechanism::Mps, vec![mps(10, limit); 3]),
            &h100,
            &[],
            &opts(),
        );
        let r = reasons(r);
        assert_eq!(r.len(), 3);
        assert!(r
            .iter()
            .all(|(_, why)| matches!(why, RejectReason::PinnedMemoryOverBudget { .. })));
    }

    #[test]
    fn fifteen_green_groups_of_eight_fit_an_h100_and_a_sixteenth_does_not() {
        let h100 = device_model("h100-sxm").unwrap();
        let plan = admit(
            &scenario(Mechanism::Green, vec![sms(8); 15]),
            &h100,
            &[],
            &opts(),
        )
        .unwrap();
        assert_eq!(plan.workloads.len(), 15);
        match &plan.workloads[14].partition {
            ResolvedPartition::Green {
                group,
                sms,
                first_sm,
            } => assert_eq!((*group, *sms, *first_sm), (14, 8, 112)),
            other => panic!("{other:?}"),
        }
        let r = reasons(admit(
            &scenario(Mechanism::Green, vec![sms(8); 17]),
            &h100,
            &[],
            &opts(),
        ));
        // 15 groups of 8 are what one split of the H100 gives (DeviceModel::green_split_limit).
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].0, "w15");
        assert_eq!(
            r[0].1,
            RejectReason::BeyondGreenSplit {
                sms: 8,
                available: 0,
                together: 120,
                device_sms: 132,
                device: "h100-sxm".into(),
            }
        );
        assert!(
            r[0].1.to_string().contains("only 0 of the 120 SMs"),
            "{}",
            r[0].1
        );
        // One green context may have 128 of the 132 SMs, and two of 64 SMs are units of 64.
        for layout in [vec![sms(128)], vec![sms(64), sms(64)]] {
            assert!(admit(&scenario(Mechanism::Green, layout), &h100, &[], &opts()).is_ok());
        }
    }

    #[test]
    fn green_below_minimum_and_off_step_are_rejected_not_clamped() {
        let h100 = device_model("h100-sxm").unwrap();
        let r = reasons(admit(
            &scenario(Mechanism::Green, vec![sms(4), sms(12), sms(16)]),
            &h100,
            &[],
            &opts(),
        ));
        assert_eq!(r.len(), 2);
        assert!(matches!(
            r[0].1,
            RejectReason::BelowMinimum { sms: 4, min: 8, .. }
        ));
        assert!(matches!(
            r[1].1,
            RejectReason::OffStep {
                sms: 12,
                step: 8,
                lower: 8,
                upper: 16,
                ..
            }
        ));
        // Ampere: minimum 4, step 2 (Table I).
        let orin = device_model("orin-nano").unwrap();
        assert!(admit(
            &scenario(Mechanism::Green, vec![sms(4), sms(4)]),
            &orin,
            &[],
            &opts()
        )
        .is_ok());
        let r = reasons(admit(
            &scenario(Mechanism::Green, vec![sms(4), sms(6)]),
            &orin,
            &[],
            &opts(),
        ));
        assert!(matches!(
            r[0].1,
            RejectReason::TooManySms {
                sms: 6,
                available: 4,
                total: 8
            }
        ));
    }

    #[test]
    fn missing_partition_fields_are_named() {
        let h100 = device_model("h100-sxm").unwrap();
        let r = reasons(admit(
            &scenario(Mechanism::Green, vec![PartitionSpec::default()]),
            &h100,
            &[],
            &opts(),
        ));
        assert_eq!(
            r[0].1,
            RejectReason::MissingPartition {
                field: "sms",
                mechanism: "green"
            }
        );
        let r = reasons(admit(
            &scenario(Mechanism::Mps, vec![PartitionSpec::default()]),
            &h100,
            &[],
            &opts(),
        ));
        assert_eq!(
            r[0].1,
            RejectReason::MissingPartition {
                field: "thread_pct",
                mechanism: "mps"
            }
        );
        let r = reasons(admit(
            &scenario(Mechanism::Mig, vec![PartitionSpec::default()]),
            &h100,
            &[],
            &opts(),
        ));
        assert_eq!(
            r[0].1,
            RejectReason::MissingPartition {
                field: "mig_profile",
                mechanism: "mig"
            }
        );
    }

    #[test]
    fn a_cpu_workload_takes_no_gpu_partition_and_keeps_its_place() {
        let h100 = device_model("h100-sxm").unwrap();
        // w1 runs on the CPU: no thread percentage needed, none counted against the budget.
        let mut s = scenario(
            Mechanism::Mps,
            vec![mps(60, None), PartitionSpec::default(), mps(40, None)],
        );
        s.workloads[1].backend = Backend::Cpu;
        let plan = admit(&s, &h100, &[Some(800), Some(100), Some(900)], &opts()).unwrap();
        let names: Vec<&str> = plan.workloads.iter().map(|w| w.workload.as_str()).collect();
        assert_eq!(names, ["w0", "w1", "w2"]);
        assert_eq!(plan.workloads[1].partition, ResolvedPartition::Cpu);
        assert!(matches!(
            plan.workloads[2].partition,
            ResolvedPartition::Mps { thread_pct: 40, .. }
        ));
        // On green, the CPU workload takes no SMs.
        let mut s = scenario(Mechanism::Green, vec![sms(128), PartitionSpec::default()]);
        s.workloads[1].backend = Backend::Cpu;
        assert!(admit(&s, &h100, &[], &opts()).is_ok());
    }

    #[test]
    fn mps_thread_and_pinned_memory_budgets() {
        let h100 = device_model("h100-sxm").unwrap();
        assert!(admit(
            &scenario(Mechanism::Mps, vec![mps(25, None); 4]),
            &h100,
            &[],
            &opts()
        )
        .is_ok());
        let r = reasons(admit(
            &scenario(Mechanism::Mps, vec![mps(25, None); 5]),
            &h100,
            &[],
            &opts(),
        ));
        assert_eq!(
            r[0].1,
            RejectReason::ThreadPctOverBudget {
                thread_pct: 25,
                total: 125,
                budget: 100
            }
        );
        let over = AdmissionOptions {
            mps_thread_budget_pct: 200,
        };
        assert!(admit(
            &scenario(Mechanism::Mps, vec![mps(25, None); 5]),
            &h100,
            &[],
            &over
        )
        .is_ok());
        let r = reasons(admit(
            &scenario(Mechanism::Mps, vec![mps(50, Some(50_000)); 2]),
            &h100,
            &[],
            &opts(),
        ));
        assert!(matches!(
            r[0].1,
            RejectReason::PinnedMemoryOverBudget {
                total_mib: 100_000,
                ..
            }
        ));
        let r = reasons(admit(
            &scenario(Mechanism::Mps, vec![mps(50, Some(1_000))]),
            &h100,
            &[Some(2_000)],
            &opts(),
        ));
        assert_eq!(
            r[0].1,
            RejectReason::MemoryOverPartition {
                need_mib: 2_000,
                have_mib: 1_000
            }
        );
    }

    #[test]
    fn mig_placements_and_rejections() {
        let a100 = device_model("a100-40gb").unwrap();
        let plan = admit(
            &scenario(Mechanism::Mig, vec![mig("3g.20gb"), mig("4g.20gb")]),
            &a100,
            &[],
            &opts(),
        )
        .unwrap();
        let starts: Vec<u32> = plan
            .workloads
            .iter()
            .map(|w| match w.partition {
                ResolvedPartition::Mig { start, .. } => start,
                _ => 99,
            })
            .collect();
        assert_eq!(starts, vec![4, 0]);
        let r = reasons(admit(
            &scenario(Mechanism::Mig, vec![mig("4g.20gb"), mig("4g.20gb")]),
            &a100,
            &[],
            &opts(),
        ));
        assert_eq!(r.len(), 2);
        assert!(matches!(r[0].1, RejectReason::NoMigPlacement { .. }));
        let r = reasons(admit(
            &scenario(Mechanism::Mig, vec![mig("5g.25gb")]),
            &a100,
            &[],
            &opts(),
        ));
        assert!(
            matches!(&r[0].1, RejectReason::UnknownMigProfile { allowed, .. } if allowed.contains("3g.20gb"))
        );
        let r = reasons(admit(
            &scenario(Mechanism::Mig, vec![mig("1g.5gb")]),
            &a100,
            &[Some(6_000)],
            &opts(),
        ));
        assert_eq!(
            r[0].1,
            RejectReason::MemoryOverPartition {
                need_mib: 6_000,
                have_mib: 5_120
            }
        );
        let l40s = device_model("l40s").unwrap();
        let r = reasons(admit(
            &scenario(Mechanism::Mig, vec![mig("1g.5gb")]),
            &l40s,
            &[],
            &opts(),
        ));
        assert!(matches!(r[0].1, RejectReason::MigUnsupported { .. }));
    }

    #[test]
    fn memory_over_the_whole_device() {
        let orin = device_model("orin-nano").unwrap();
        let r = reasons(admit(
            &scenario(Mechanism::Timeslice, vec![PartitionSpec::default(); 2]),
            &orin,
            &[Some(5_000), Some(5_000)],
            &opts(),
        ));
        assert_eq!(r.len(), 2);
        assert!(matches!(
            r[0].1,
            RejectReason::MemoryOverDevice {
                total_mib: 10_000,
                ..
            }
        ));
    }

    #[test]
    fn messages_say_what_is_allowed() {
        let h100 = device_model("h100-sxm").unwrap();
        let r = admit(
            &scenario(Mechanism::Green, vec![sms(12)]),
            &h100,
            &[],
            &opts(),
        )
        .unwrap_err();
        assert!(
            r[0].message.contains("multiple of the step of 8"),
            "{}",
            r[0].message
        );
        assert!(r[0].message.contains("try 8 or 16"), "{}", r[0].message);
    }

    #[test]
    fn green_before_pascal_and_cuda_without_a_mechanism_are_refused() {
        let mut old = device_model("orin-nano").unwrap();
        old.compute_capability = (5, 2);
        let r = reasons(admit(
            &scenario(Mechanism::Green, vec![sms(4)]),
            &old,
            &[],
            &opts(),
        ));
        assert!(matches!(
            r[0].1,
            RejectReason::GreenUnsupported {
                major: 5,
                minor: 2,
                ..
            }
        ));
        let h100 = device_model("h100-sxm").unwrap();
        let r = reasons(admit(
            &scenario(Mechanism::None, vec![PartitionSpec::default()]),
            &h100,
            &[],
            &opts(),
        ));
        assert_eq!(r[0].1, RejectReason::NoMechanism);
    }

    /// `parts` as (GPU, partition) on a device of GPUs 0 and 1.
    fn two_gpus(mechanism: Mechanism, parts: Vec<(u32, PartitionSpec)>) -> Scenario {
        let gpus: Vec<u32> = parts.iter().map(|(g, _)| *g).collect();
        let mut s = scenario(mechanism, parts.into_iter().map(|(_, p)| p).collect());
        s.device.gpus = vec![0, 1];
        for (w, g) in s.workloads.iter_mut().zip(gpus) {
            w.gpu = Some(g);
        }
        s
    }

    fn green_of(a: &AdmittedWorkload) -> (Option<u32>, u32, u32, u32) {
        match a.partition {
            ResolvedPartition::Green {
                group,
                sms,
                first_sm,
            } => (a.gpu, group, sms, first_sm),
            ref other => panic!("{other:?}"),
        }
    }

    #[test]
    fn each_gpu_has_its_own_sms_and_the_plan_says_each_workloads_gpu() {
        let h100 = device_model("h100-sxm").unwrap();
        let s = two_gpus(
            Mechanism::Green,
            vec![(0, sms(96)), (1, sms(96)), (1, sms(32))],
        );
        let plan = admit(&s, &h100, &[], &opts()).expect("96 SMs on each of two 132-SM GPUs");
        let groups: Vec<_> = plan.workloads.iter().map(green_of).collect();
        // Each GPU's groups are numbered and laid out from its own SM 0.
        assert_eq!(
            groups,
            [
                (Some(0), 0, 96, 0),
                (Some(1), 0, 96, 0),
                (Some(1), 1, 32, 96)
            ]
        );
        let json = serde_json::to_string(&plan).unwrap();
        assert!(json.contains("\"gpu\":1"), "{json}");
    }

    #[test]
    fn sms_over_one_gpu_are_refused_naming_that_gpu() {
        let h100 = device_model("h100-sxm").unwrap();
        let s = two_gpus(
            Mechanism::Green,
            vec![(0, sms(96)), (0, sms(96)), (1, sms(8))],
        );
        let r = admit(&s, &h100, &[], &opts()).expect_err("192 SMs on GPU 0");
        assert_eq!(r.len(), 1);
        assert_eq!((r[0].workload.as_str(), r[0].gpu), ("w1", Some(0)));
        assert!(
            r[0].message.starts_with("on GPU 0: asks for 96 SMs"),
            "{}",
            r[0].message
        );
        let json = serde_json::to_string(&r[0]).unwrap();
        assert!(json.contains("\"gpu\":0"), "{json}");
    }

    #[test]
    fn thread_percentages_and_memory_are_budgets_per_gpu() {
        let h100 = device_model("h100-sxm").unwrap();
        let s = two_gpus(Mechanism::Mps, vec![(0, mps(80, None)), (1, mps(80, None))]);
        let plan = admit(&s, &h100, &[Some(60_000), Some(60_000)], &opts()).expect("80% each");
        assert_eq!(plan.workloads[1].gpu, Some(1));
        let s = two_gpus(Mechanism::Mps, vec![(1, mps(50, None)), (1, mps(50, None))]);
        let r = admit(&s, &h100, &[Some(60_000), Some(60_000)], &opts()).unwrap_err();
        assert!(r.iter().all(|r| r.gpu == Some(1)), "{r:?}");
        assert!(
            r[0].message.contains("on GPU 1: the workloads need"),
            "{}",
            r[0].message
        );
    }

    #[test]
    fn mig_placements_are_made_per_gpu() {
        let h100 = device_model("h100-sxm").unwrap();
        let big = || mig("7g.80gb");
        let s = two_gpus(Mechanism::Mig, vec![(0, big()), (1, big())]);
        let plan = admit(&s, &h100, &[], &opts()).expect("one 7g instance on each GPU");
        assert_eq!(
            plan.workloads.iter().map(|a| a.gpu).collect::<Vec<_>>(),
            [Some(0), Some(1)]
        );
        let s = two_gpus(Mechanism::Mig, vec![(0, big()), (0, big())]);
        let r = admit(&s, &h100, &[], &opts()).unwrap_err();
        assert!(
            r[0].message.starts_with("on GPU 0: no MIG placement"),
            "{}",
            r[0].message
        );
    }

    #[test]
    fn one_gpu_plans_and_rejections_name_no_gpu() {
        let h100 = device_model("h100-sxm").unwrap();
        let plan = admit(
            &scenario(Mechanism::Green, vec![sms(8)]),
            &h100,
            &[],
            &opts(),
        )
        .unwrap();
        assert_eq!(plan.workloads[0].gpu, None);
        assert_eq!(plan.workloads[0].gpu_or(3), 3);
        assert!(!serde_json::to_string(&plan).unwrap().contains("gpu"));
        let r = admit(
            &scenario(Mechanism::Green, vec![sms(200)]),
            &h100,
            &[],
            &opts(),
        );
        let r = r.unwrap_err();
        assert_eq!(r[0].gpu, None);
        assert!(
            r[0].message.starts_with("asks for 200 SMs"),
            "{}",
            r[0].message
        );
    }

    /// The recorded H200 protection study (results/h200-protection/final): unprotected, the
    /// trio missed vit_b_16's deadline on 99.98 % of its jobs and none of resnet18's; the two
    /// critical models alone together held both (0.09 %, 0.03 %). Predicted from the engine's
    /// profiles of the three models (predict/h200-models.csv) and each one's p99 alone in its
    /// partition, measured in the same study: vit_b_16 ×1.37 beside resnet18 and vit_l_32,
    /// 1.369 ms of a 1.323 ms deadline, most from vit_l_32; nothing else.
    /// vit_b_16, resnet18 and vit_l_32 at fp16, batch 1, in the H200's 60 MB of L2: each
    /// one's memory profile and its p99 alone (ms), as recorded.
    fn h200_trio() -> ([Option<crate::predict::MemoryProfile>; 3], [Option<f64>; 3]) {
        use crate::predict::{MemoryProfile, ProfileSource};
        let profile = |dram: f64, resident: bool, l2: f64| {
            Some(MemoryProfile {
                dram_bytes_per_job: dram,
                resident,
                l2_footprint_bytes: l2,
                flops_per_job: 0.0,
                source: ProfileSource::Computed,
            })
        };
        let profiles = [
            profile(173_135_336.0, false, 173_135_336.0),
            profile(0.0, true, 25_376_464.0),
            profile(613_070_848.0, false, 613_070_848.0),
        ];
        (profiles, [Some(0.99946), Some(0.345151), Some(1.076108)])
    }

    /// A model's memory-system demand at batch 1 fp16 as the H200 fit recorded it
    /// (`src/predict/h200-models.csv`).
    fn h200_profile(model: &str) -> crate::predict::MemoryProfile {
        let csv = include_str!("predict/h200-models.csv");
        let r: Vec<&str> = (csv.lines().map(|l| l.split(',').collect::<Vec<_>>()))
            .find(|r| r[0] == model && r[2] == "1")
            .unwrap();
        crate::predict::MemoryProfile {
            dram_bytes_per_job: r[7].parse().unwrap(),
            l2_footprint_bytes: r[8].parse().unwrap(),
            resident: r[9] == "true",
            flops_per_job: r[6].parse::<f64>().unwrap() * 1e9,
            source: crate::predict::ProfileSource::Computed,
        }
    }

    #[test]
    fn a_critical_deadline_predicted_to_miss_beside_its_neighbours_is_named() {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../results/h200-protection/final/compare"
        );
        let load = |variant: &str| {
            let path = format!("{dir}/green-load75-{variant}/r0/scenario-in.toml");
            let text = std::fs::read_to_string(&path).unwrap();
            Scenario::from_toml_str(
                &text,
                std::path::Path::new(&path),
                &["vit_b_16", "resnet18", "vit_l_32"],
            )
            .unwrap()
        };
        let (profiles, alone) = h200_trio();
        let h200 = device_model("h200").unwrap();
        let trio = load("none");
        let misses = predicted_misses(&trio, &h200, &profiles, &alone);
        assert_eq!(misses.len(), 1, "{misses:?}");
        let m = &misses[0];
        assert_eq!(m.workload, "v0_vit_b_16");
        assert!((1.35..1.40).contains(&m.stretch), "{m:?}");
        assert_eq!(m.worst_neighbour.as_ref().unwrap().0, "be_vit_l_32");
        assert!(
            m.to_string().starts_with(
                "workload 'v0_vit_b_16': predicted p99 1.369 ms beside its neighbours (alone \
                 0.999 ms × stretch 1.37), over its deadline of 1.323 ms; most from \
                 'be_vit_l_32'"
            ),
            "{m}"
        );
        // The critical models alone together: predicted to hold, as they did.
        let victims = load("victims-only");
        assert_eq!(
            predicted_misses(&victims, &h200, &profiles[..2], &alone[..2]),
            []
        );
        // Without vit_l_32's alone time its share is not known: not counted.
        assert_eq!(
            predicted_misses(&trio, &h200, &profiles, &[alone[0], alone[1], None]),
            []
        );
        // Time-slicing: not the memory system's stretch, nothing predicted.
        let mut ts = trio.clone();
        ts.device.mechanism = Mechanism::Timeslice;
        assert_eq!(predicted_misses(&ts, &h200, &profiles, &alone), []);
    }

    /// A change while serving, on the recorded H200 trio: loading the best-effort vit_l_32
    /// beside the two critical models (which alone together hold) is predicted to push
    /// vit_b_16 past its deadline, and is refused or warned of, naming the pair and the
    /// stretch; unloading it again is never refused, nor a change that leaves a predicted
    /// miss no worse; a deadline cut below the prediction is the change's doing.
    #[test]
    fn a_live_change_that_pushes_a_critical_deadline_past_the_prediction_is_refused() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../results/h200-protection/final/compare/green-load75-none/r0/scenario-in.toml"
        );
        let text = std::fs::read_to_string(path).unwrap();
        let s = Scenario::from_toml_str(
            &text,
            std::path::Path::new(path),
            &["vit_b_16", "resnet18", "vit_l_32"],
        )
        .unwrap();
        let (profiles, alone) = h200_trio();
        let live: Vec<Live> = (0..3)
            .map(|i| Live {
                spec: s.workloads[i].clone(),
                profile: profiles[i],
                alone_p99_ms: alone[i],
            })
            .collect();
        let h200 = device_model("h200").unwrap();
        let (victims, trio) = (&live[..2], &live[..]);
        let load = foresee_change(&s.device, &h200, AdmissionMode::Refuse, victims, trio);
        let Foresight::Refuse(m) = &load else {
            panic!("{load:?}")
        };
        assert_eq!(m.len(), 1, "{m:?}");
        assert_eq!(m[0].workload, "v0_vit_b_16");
        assert_eq!(m[0].worst_neighbour.as_ref().unwrap().0, "be_vit_l_32");
        let t = load.change_text("model `be_vit_l_32`: load");
        assert!(
            t.starts_with(
                "model `be_vit_l_32`: load: 1 critical workload is predicted to miss its \
                 deadline beside its neighbours after it"
            ),
            "{t}"
        );
        assert!(
            t.contains("'v0_vit_b_16'") && t.contains("stretch 1.37") && t.contains("refused"),
            "{t}"
        );
        assert!(!t.contains('\n'), "{t}");
        // Warned of and made under "warn"; nothing predicted under "off".
        assert!(matches!(
            foresee_change(&s.device, &h200, AdmissionMode::Warn, victims, trio),
            Foresight::Warn(w) if w == *m
        ));
        assert_eq!(
            foresee_change(&s.device, &h200, AdmissionMode::Off, victims, trio),
            Foresight::Clear
        );
        // Unloading it relieves vit_b_16; the same set again changes nothing.
        for (before, after) in [(trio, victims), (trio, trio)] {
            assert_eq!(
                foresee_change(&s.device, &h200, AdmissionMode::Refuse, before, after),
                Foresight::Clear
            );
        }
        // A deadline cut from 1.3232 to 1.0 ms, below vit_b_16's predicted p99 beside
        // resnet18 alone (0.999 ms × its stretch), is refused; 1.2 ms is not.
        let cut = |ms: f64| {
            let mut after = victims.to_vec();
            after[0].spec.deadline_ms = Some(ms);
            foresee_change(&s.device, &h200, AdmissionMode::Refuse, victims, &after)
        };
        assert!(matches!(cut(1.0), Foresight::Refuse(m) if m[0].workload == "v0_vit_b_16"));
        assert_eq!(cut(1.2), Foresight::Clear);
        // A neighbour with no profile in its partition is not predicted: the change is made.
        let mut unknown = trio.to_vec();
        unknown[2].alone_p99_ms = None;
        assert_eq!(
            foresee_change(&s.device, &h200, AdmissionMode::Refuse, victims, &unknown),
            Foresight::Clear
        );
    }

    /// `[protection] admission` on the same recorded trio: warn by default (the pair and the
    /// stretch said), refuse when asked, nothing when off or when the prediction holds.
    #[test]
    fn admission_warns_or_refuses_a_predicted_miss_as_the_scenario_asks() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../results/h200-protection/final/compare/green-load75-none/r0/scenario-in.toml"
        );
        let text = std::fs::read_to_string(path).unwrap();
        let models = ["vit_b_16", "resnet18", "vit_l_32"];
        let with = |extra: &str| {
            let t = text.replacen("[protection]\n", &format!("[protection]\n{extra}\n"), 1);
            Scenario::from_toml_str(&t, std::path::Path::new(path), &models).unwrap()
        };
        let (profiles, alone) = h200_trio();
        let h200 = device_model("h200").unwrap();
        let warned = foresee(&with(""), &h200, &profiles, &alone);
        let Foresight::Warn(m) = &warned else {
            panic!("{warned:?}")
        };
        assert_eq!(m.len(), 1);
        let t = warned.text("trio.toml");
        assert!(
            t.starts_with(
                "trio.toml: 1 critical deadline is predicted to miss beside its neighbours"
            ),
            "{t}"
        );
        assert!(t.contains("the run goes ahead"), "{t}");
        assert!(
            t.contains("'v0_vit_b_16'") && t.contains("'be_vit_l_32'") && t.contains("1.37"),
            "{t}"
        );
        let refused = foresee(&with("admission = \"refuse\""), &h200, &profiles, &alone);
        assert!(
            matches!(&refused, Foresight::Refuse(r) if r == m),
            "{refused:?}"
        );
        assert!(refused
            .text("trio.toml")
            .contains("refused by [protection] admission"));
        assert_eq!(
            foresee(&with("admission = \"off\""), &h200, &profiles, &alone),
            Foresight::Clear
        );
        assert_eq!(Foresight::Clear.text("trio.toml"), "");
        // A deadline the prediction says holds: clear, whatever the mode.
        let ok_alone = [Some(0.9), Some(0.345151), Some(1.076108)];
        assert_eq!(
            foresee(&with("admission = \"refuse\""), &h200, &profiles, &ok_alone),
            Foresight::Clear
        );
    }

    /// Issue 34's trios on the H200 (session 22, scripts/levers-h200.sh at 481f621): two
    /// critical CNNs, no best effort, each at 75 % of its capacity alone in its partition
    /// with a deadline of 1.3 × its p99 alone there. Figures as recorded (levers.md: each
    /// one's p99 and execution p99 alone; protection.csv: the victims-only run's execution
    /// p99 over that alone, the median over trio a's three repeats; the missed share too).
    /// The model predicted what the footprints say (mobilenet_v2
    /// beside convnext_base 1.26, resnet50 beside mobilenet_v2 1.04) and admission said
    /// nothing, while mobilenet_v2 missed 19.9 % (b) and resnet50 2.66 % (c). With the
    /// matrix's floor for CNN victims both are named, before the run.
    #[test]
    fn critical_cnns_that_missed_alone_together_on_the_h200_are_named() {
        use crate::predict::{fitted, memory_system, predict, Neighbour};
        let profile = h200_profile;
        // (model, SMs, p99 alone, execution p99 alone, measured stretch beside the other,
        // missed % at the deadline), per trio.
        type Victim = (&'static str, u32, f64, f64, f64, f64);
        let trios: [(&str, [Victim; 2]); 3] = [
            (
                "a",
                [
                    ("resnet18", 24, 0.271, 0.269, 1.2749, 0.74),
                    ("resnet50", 48, 0.428, 0.426, 1.2192, 0.0),
                ],
            ),
            (
                "b",
                [
                    ("mobilenet_v2", 24, 0.397, 0.396, 1.3457, 19.92),
                    ("convnext_base", 48, 1.188, 1.184, 1.2220, 0.0),
                ],
            ),
            (
                "c",
                [
                    ("mobilenet_v2", 24, 0.396, 0.395, 1.2736, 0.31),
                    ("resnet50", 48, 0.419, 0.418, 1.3148, 2.66),
                ],
            ),
        ];
        let h200 = device_model("h200").unwrap();
        let f = fitted("h200", Mechanism::Green).unwrap();
        let sys = memory_system("h200").unwrap();
        let floor = f.resident_floor.unwrap();
        let mut named = Vec::new();
        for (trio, vs) in trios {
            let mut toml = String::from(
                "[device]\nbackend = \"cuda\"\nmechanism = \"green\"\nhost = \"thread\"\n",
            );
            for (i, (model, sms, p99, ..)) in vs.iter().enumerate() {
                toml += &format!(
                    "\n[[workload]]\nname = \"v{i}_{model}\"\nmodel = \"{model}\"\n\
                     precision = \"fp16\"\nrate_hz = {:.3}\ndeadline_ms = {:.4}\n\
                     duration_s = 2.0\ncriticality = \"critical\"\npartition = {{ sms = {sms} }}\n",
                    750.0 / vs[i].3,
                    1.3 * p99
                );
            }
            let s =
                Scenario::from_toml_str(&toml, "victims-only.toml", &[vs[0].0, vs[1].0]).unwrap();
            let profiles: Vec<_> = vs.iter().map(|v| Some(profile(v.0))).collect();
            let alone: Vec<_> = vs.iter().map(|v| Some(v.3)).collect();
            let misses = predicted_misses(&s, &h200, &profiles, &alone);
            for (i, (model, _, p99, exec, measured, missed)) in vs.iter().enumerate() {
                let other = vs[1 - i];
                let beside = [Neighbour {
                    name: other.0.into(),
                    profile: profile(other.0),
                    exec_ms: other.3,
                }];
                let model_only = predict(&f.coefficients, &sys, *exec, &beside).stretch;
                let m = misses
                    .iter()
                    .find(|m| m.workload == format!("v{i}_{model}"));
                println!(
                    "trio {trio}: {model} beside {}: measured ×{measured:.3} ({missed} % \
                     missed), model ×{model_only:.3}, admission {:?}",
                    other.0,
                    m.map(|m| m.stretch)
                );
                // Silent before: the model alone put each under its deadline.
                assert!(exec * model_only < 1.3 * p99, "{trio} {model}");
                // A CNN's measured stretch is within the floor admission takes for it.
                if profile(model).resident {
                    assert!(*measured <= floor, "{trio} {model}");
                }
                if let Some(m) = m {
                    named.push(format!("{trio} {model}"));
                    assert_eq!(m.stretch, floor);
                    assert_eq!(
                        m.worst_neighbour,
                        Some((format!("v{}_{}", 1 - i, other.0), floor))
                    );
                    assert!(m.to_string().contains("stretch 1.36"), "{m}");
                }
            }
        }
        // Every victim that missed its deadline at p99 (over 1 %) is named; the CNNs that
        // held at p99 with a 1.3 × deadline are warned of too (a: 0.74 % and 0 % missed, c's
        // mobilenet_v2 0.31 %): within the spread the matrix measured, admission says so.
        // convnext_base, a streaming victim the model predicts 1.04 for, is not (0 % missed).
        assert_eq!(
            named,
            [
                "a resnet18",
                "a resnet50",
                "b mobilenet_v2",
                "c mobilenet_v2",
                "c resnet50"
            ]
        );
    }

    /// Session 29's trio c at the load (each critical CNN at 75 % of its capacity alone),
    /// its deadlines at 1.3 × the victims-only p99 (each job's own time fits them), beside
    /// vit_l_32 flat out as best effort: unprotected, mobilenet_v2 missed 99.99 % because its
    /// jobs queued, not because one was slow. Admission names it by its busy share; without
    /// the best effort, and at 60 % of its capacity, it does not; a workload without a rate
    /// has no share.
    #[test]
    fn a_critical_model_predicted_busy_all_the_time_is_named_as_a_queue() {
        let profile = h200_profile;
        // (name, model, SMs, execution p99 alone ms, rate, deadline ms): session 29's figures.
        let trio = |load: f64, best_effort: bool| {
            let mut toml = String::from(
                "[device]\nbackend = \"cuda\"\nmechanism = \"green\"\nhost = \"thread\"\n",
            );
            let mut ws = vec![
                ("v0_mobilenet_v2", "mobilenet_v2", 24, 0.377, 0.634),
                ("v1_resnet50", "resnet50", 48, 0.421, 0.68),
            ];
            if best_effort {
                ws.push(("be_vit_l_32", "vit_l_32", 48, 0.960, 0.0));
            }
            for (name, model, sms, exec, deadline) in &ws {
                let be = name.starts_with("be_");
                let rate = if be {
                    "\"max\"".to_string()
                } else {
                    format!("{:.3}", load * 1e3 / exec)
                };
                toml += &format!(
                    "\n[[workload]]\nname = \"{name}\"\nmodel = \"{model}\"\n\
                     precision = \"fp16\"\nrate_hz = {rate}\n{}duration_s = 2.0\n\
                     criticality = \"{}\"\npartition = {{ sms = {sms} }}\n",
                    if be {
                        String::new()
                    } else {
                        format!("deadline_ms = {deadline}\n")
                    },
                    if be { "best_effort" } else { "critical" },
                );
            }
            let models: Vec<&str> = ws.iter().map(|w| w.1).collect();
            let s = Scenario::from_toml_str(&toml, "trio-c.toml", &models).unwrap();
            let profiles: Vec<_> = ws.iter().map(|w| Some(profile(w.1))).collect();
            let alone: Vec<_> = ws.iter().map(|w| Some(w.3)).collect();
            (s, profiles, alone)
        };
        let h200 = device_model("h200").unwrap();
        let named = |load: f64, best_effort: bool| {
            let (s, profiles, alone) = trio(load, best_effort);
            predicted_misses(&s, &h200, &profiles, &alone)
        };
        let beside_be = named(0.75, true);
        let light = beside_be
            .iter()
            .find(|m| m.workload == "v0_mobilenet_v2")
            .expect("mobilenet_v2 named beside vit_l_32");
        println!("{light}");
        assert!(light.saturated(), "{light:?}");
        assert!(
            light.to_string().contains("jobs queue without bound")
                && light
                    .to_string()
                    .starts_with("workload 'v0_mobilenet_v2': predicted busy 1"),
            "{light}"
        );
        // The critical pair alone (0.00 % missed there) and a lighter load: nothing by queueing.
        for (load, be) in [(0.75, false), (0.6, true)] {
            let misses = named(load, be);
            assert!(
                misses.iter().all(|m| !m.saturated()),
                "load {load}, best effort {be}: {misses:?}"
            );
        }
        let (mut s, profiles, alone) = trio(0.75, true);
        s.workloads[0].rate = Rate::Max(crate::spec::MaxRate::Max);
        let misses = predicted_misses(&s, &h200, &profiles, &alone);
        assert!(misses
            .iter()
            .all(|m| m.busy.is_none() || m.workload != "v0_mobilenet_v2"));
    }
}
