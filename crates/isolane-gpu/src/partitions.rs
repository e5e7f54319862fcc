//! Setting up an admitted plan's partitions for a run, and taking them down afterwards.
//!
//! `isolane run`, `maxrate` and `isolation` share this: after admission control has accepted a
//! plan ([`isolane_core::admission::admit`]), a [`PartitionSession`] creates what the mechanism
//! needs and tells the runtime how each workload reaches its partition:
//!
//! - green: one split of the device into disjoint SM groups, one green context and stream each;
//!   a thread-hosted workload takes its [`GreenGroup`] and runs every kernel on its stream.
//! - mps: our own control daemon (private pipe and log directories), and per worker process the
//!   client environment (pipe directory, active thread percentage, pinned memory limit).
//! - mig: the planned GPU and compute instances (only with `--allow-mig-reconfigure`, only when
//!   MIG mode is already on), and per worker `CUDA_VISIBLE_DEVICES=MIG-<uuid>`.
//! - timeslice / none: nothing to create; workers see the whole GPU.
//!
//! With several GPUs (the plan names each workload's GPU, `AdmittedWorkload::gpu`), each GPU
//! is set up as above on its own: a split of its SMs, a private MPS daemon of its own (own pipe
//! and log directories, `CUDA_VISIBLE_DEVICES` of that GPU), its own MIG instances; a worker of
//! a timeslice run is told its GPU through [`WORKER_GPU_ENV`].
//!
//! [`PartitionSession::finish`] (or drop) stops the daemons and destroys the instances, after the
//! workers are gone. Ctrl-C paths that cannot unwind call [`crate::mps::shutdown_all`].

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use isolane_core::admission::{AdmittedWorkload, Plan, ResolvedPartition};
pub use isolane_core::results::PartitionRecord;
use isolane_core::spec::Mechanism;

use crate::error::{GpuError, Result};
use crate::green::{GreenGroup, GreenPartitioning};
use crate::green_pool::GreenPool;
use crate::mig::{MigBackend, MigInstances};
use crate::mps::{MpsDaemon, MpsOptions};

/// Environment variable a worker process reads for the CUDA device index it should use, as
/// that process sees the devices: 0 behind our MPS daemon or a MIG binding (both narrow
/// `CUDA_VISIBLE_DEVICES` to one device), the workload's GPU otherwise (given for timeslice
/// workers of a scenario on several GPUs; else the worker's `device.gpu`).
pub const WORKER_GPU_ENV: &str = "ISOLANE_WORKER_GPU";

/// Environment variable that tells a worker process to create its CUDA stream at the device's
/// greatest priority (value `greatest`): the process-hosted side of [`Urgency::urgent`].
pub const WORKER_STREAM_PRIORITY_ENV: &str = "ISOLANE_WORKER_STREAM_PRIORITY";

/// Whose GPU work goes first where the hardware arbitrates between workloads: the critical and
/// best-effort workloads of a protected run (docs/criticality.md). Empty: everyone equal.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Urgency {
    /// Streams at the device's greatest priority: green groups' streams, and worker processes'
    /// own streams (through [`WORKER_STREAM_PRIORITY_ENV`]).
    pub urgent: BTreeSet<String>,
    /// MPS clients at below-normal priority (`CUDA_MPS_CLIENT_PRIORITY=1`).
    pub background: BTreeSet<String>,
}

impl Urgency {
    /// What `workload`'s urgency adds to its partition's description (empty: nothing).
    pub fn describe(&self, workload: &str, mechanism: Mechanism) -> &'static str {
        if self.urgent.contains(workload) {
            ", urgent stream"
        } else if self.background.contains(workload) && mechanism == Mechanism::Mps {
            ", below-normal MPS client"
        } else {
            ""
        }
    }

    /// The environment a worker process of `workload` is given for its urgency.
    pub fn worker_env(&self, workload: &str) -> Vec<(String, String)> {
        let mut env = Vec::new();
        if self.urgent.contains(workload) {
            env.push((WORKER_STREAM_PRIORITY_ENV.into(), "greatest".into()));
        }
        if self.background.contains(workload) {
            env.push(("CUDA_MPS_CLIENT_PRIORITY".into(), "1".into()));
        }
        env
    }
}

/// How to set partitions up.
#[derive(Debug, Clone, Default)]
pub struct SessionOptions {
    pub mps: MpsOptions,
    /// `--allow-mig-reconfigure`: creating MIG instances changes the GPU for every user.
    pub allow_mig_reconfigure: bool,
    pub urgency: Urgency,
    /// Green partitions made so that they can be resized while serving: one split of the
    /// device at its finest unit, each group a combination of units (`GreenPool`). Off for
    /// `run`, whose groups come from the split that fits their sizes best.
    pub resizable_green: bool,
}

/// The partitions of one run; see the module docs.
pub struct PartitionSession<'b> {
    // Field order is drop order: green groups, then the daemons, then the MIG instances.
    green: BTreeMap<String, GreenGroup>,
    /// The split the green groups were made from, when they may be resized while serving.
    green_pool: Option<Arc<GreenPool>>,
    /// One private daemon per GPU of an MPS run.
    daemons: Vec<MpsDaemon>,
    /// One set of instances per GPU of a MIG run.
    mig: Vec<MigInstances<'b>>,
    worker_env: BTreeMap<String, Vec<(String, String)>>,
    records: Vec<PartitionRecord>,
    notes: Vec<String>,
}

impl std::fmt::Debug for PartitionSession<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartitionSession")
            .field("records", &self.records)
            .finish()
    }
}

impl<'b> PartitionSession<'b> {
    /// Creates the partitions of an admitted `plan`: each workload's on the GPU the plan names
    /// for it, GPU `gpu` (the scenario's `device.gpu`) where it names none. `mig_backend` is
    /// needed only for mechanism mig (NVML on a real machine, a fake in tests). On error,
    /// whatever was created is taken down again before returning.
    pub fn set_up(
        gpu: u32,
        plan: &Plan,
        options: &SessionOptions,
        mig_backend: Option<&'b dyn MigBackend>,
    ) -> Result<Self> {
        let mut s = PartitionSession {
            green: BTreeMap::new(),
            green_pool: None,
            daemons: Vec::new(),
            mig: Vec::new(),
            worker_env: BTreeMap::new(),
            records: Vec::new(),
            notes: Vec::new(),
        };
        let per_gpu = plans_per_gpu(gpu, plan);
        let several = per_gpu.len() > 1;
        if several && plan.mechanism == Mechanism::Mps && options.mps.join_existing {
            return Err(GpuError::Usage(
                "joining an existing MPS daemon is for one GPU; a scenario on several GPUs \
                 starts a private daemon per GPU"
                    .into(),
            ));
        }
        // A plan of a scenario on several GPUs names each workload's GPU even when all of them
        // landed on one (as admission's plan does): its workers are told that GPU (all on GPU
        // 1, a timeslice worker would otherwise take the scenario's first), and every record
        // says "on GPU n".
        let named = several || plan.workloads.iter().any(|w| w.gpu.is_some());
        for (g, sub) in &per_gpu {
            s.set_up_gpu(*g, sub, options, mig_backend)?;
            if named {
                s.tell_workers_their_gpu(*g, sub);
            }
        }
        s.finish_records(plan, options, named.then_some(&per_gpu));
        Ok(s)
    }

    /// The partitions of one GPU's share of the plan.
    fn set_up_gpu(
        &mut self,
        gpu: u32,
        plan: &Plan,
        options: &SessionOptions,
        mig_backend: Option<&'b dyn MigBackend>,
    ) -> Result<()> {
        match plan.mechanism {
            Mechanism::Green => self.set_up_green(gpu, plan, options),
            Mechanism::Mps => self.set_up_mps(gpu, plan, &options.mps, &options.urgency),
            Mechanism::Mig => {
                let backend = mig_backend.ok_or_else(|| {
                    GpuError::Usage("mechanism mig needs NVML's MIG interface".into())
                })?;
                self.set_up_mig(gpu, plan, backend, options.allow_mig_reconfigure)
            }
            Mechanism::Timeslice | Mechanism::None => {
                self.set_up_whole(plan, &options.urgency);
                Ok(())
            }
        }
    }

    /// timeslice / none: nothing to create; the urgency's environment only.
    fn set_up_whole(&mut self, plan: &Plan, urgency: &Urgency) {
        for w in &plan.workloads {
            let env = urgency.worker_env(&w.workload);
            if !env.is_empty() {
                self.worker_env.insert(w.workload.clone(), env);
            }
            self.records.push(PartitionRecord {
                workload: w.workload.clone(),
                mechanism: plan.mechanism,
                partition: match w.partition {
                    ResolvedPartition::Cpu => "CPU (no GPU partition)".into(),
                    _ => "whole GPU".into(),
                },
                granted_sms: None,
                mig_device: None,
                mps_pipe_dir: None,
            });
        }
    }

    /// With several GPUs, a worker not bound to one device by MPS or MIG is told its GPU
    /// (the index as the whole machine numbers them).
    fn tell_workers_their_gpu(&mut self, gpu: u32, plan: &Plan) {
        for w in &plan.workloads {
            if matches!(w.partition, ResolvedPartition::Whole) {
                let env = self.worker_env.entry(w.workload.clone()).or_default();
                env.push((WORKER_GPU_ENV.into(), gpu.to_string()));
            }
        }
    }

    /// Records in the plan's order, each with its urgency and, with several GPUs, its GPU.
    fn finish_records(
        &mut self,
        plan: &Plan,
        options: &SessionOptions,
        per_gpu: Option<&Vec<(u32, Plan)>>,
    ) {
        if per_gpu.is_some() {
            // GPU by GPU above; one GPU keeps the order its mechanism made (MIG: placements).
            let position = |name: &str| plan.workloads.iter().position(|w| w.workload == name);
            self.records.sort_by_key(|r| position(&r.workload));
        }
        for r in &mut self.records {
            r.partition
                .push_str(options.urgency.describe(&r.workload, plan.mechanism));
            let gpu = per_gpu.and_then(|p| {
                p.iter()
                    .find(|(_, sub)| sub.workloads.iter().any(|w| w.workload == r.workload))
            });
            if let (Some((g, _)), false) = (gpu, r.partition.starts_with("CPU")) {
                r.partition.push_str(&format!(" on GPU {g}"));
            }
        }
    }

    fn set_up_green(&mut self, gpu: u32, plan: &Plan, options: &SessionOptions) -> Result<()> {
        let urgency = &options.urgency;
        let mut names = Vec::new();
        let mut sizes = Vec::new();
        for w in &plan.workloads {
            if let ResolvedPartition::Green { sms, .. } = w.partition {
                names.push(w.workload.clone());
                sizes.push(sms);
            }
        }
        let urgent: Vec<bool> = names.iter().map(|n| urgency.urgent.contains(n)).collect();
        // One split is resized from: with green partitions on a second GPU, none is (a resize
        // must never take another GPU's units), and this GPU is split as `run` splits it.
        let second_gpu = !self.green.is_empty();
        if second_gpu {
            self.green_pool = None;
            self.notes.push(
                "green: not resizable while serving (green partitions on more than one GPU)".into(),
            );
        }
        let groups = match options.resizable_green && !second_gpu {
            true => self.set_up_green_pool(gpu, &names, &sizes, &urgent)?,
            false => None,
        };
        let groups = match groups {
            Some(groups) => groups,
            None => {
                let parts = GreenPartitioning::create_with_urgency(gpu, &sizes, &urgent)?;
                let driver = parts.sm_info();
                self.notes.push(format!(
                    "green: split {:?}; the driver's minimum group is {} SMs, alignment {}",
                    parts.plan(),
                    driver.min_partition_sms,
                    driver.coscheduled_alignment
                ));
                parts.into_groups()
            }
        };
        for (name, group) in names.into_iter().zip(groups) {
            self.records.push(PartitionRecord {
                workload: name.clone(),
                mechanism: Mechanism::Green,
                partition: format!("green {} SMs", group.requested_sms()),
                granted_sms: Some(group.granted_sms()),
                mig_device: None,
                mps_pipe_dir: None,
            });
            self.green.insert(name, group);
        }
        Ok(())
    }

    fn set_up_mps(
        &mut self,
        gpu: u32,
        plan: &Plan,
        options: &MpsOptions,
        urgency: &Urgency,
    ) -> Result<()> {
        let daemon = MpsDaemon::start(gpu, options)?;
        if !daemon.owned() {
            self.notes.push(format!(
                "joined the existing MPS daemon at {}",
                daemon.pipe_dir().display()
            ));
        }
        for w in &plan.workloads {
            if let ResolvedPartition::Mps {
                thread_pct,
                mem_limit_mib,
            } = w.partition
            {
                let mut env = daemon.client_env(thread_pct, mem_limit_mib);
                // A client's CUDA_VISIBLE_DEVICES counts the devices its daemon exposes, not
                // the machine's (NVIDIA's MPS guide: a client must not keep the daemon's value):
                // ours exposes one GPU, device 0 for its clients. "0" also overrides a value the
                // client would otherwise inherit from us; GPU 1's index there found no device.
                if daemon.owned() {
                    env.push(("CUDA_VISIBLE_DEVICES".into(), "0".into()));
                }
                env.push((
                    WORKER_GPU_ENV.into(),
                    daemon.client_device_index().to_string(),
                ));
                env.extend(urgency.worker_env(&w.workload));
                self.worker_env.insert(w.workload.clone(), env);
                self.records.push(PartitionRecord {
                    workload: w.workload.clone(),
                    mechanism: Mechanism::Mps,
                    partition: match mem_limit_mib {
                        Some(m) => format!("mps {thread_pct}%, {m} MiB pinned"),
                        None => format!("mps {thread_pct}%"),
                    },
                    granted_sms: None,
                    mig_device: None,
                    mps_pipe_dir: Some(daemon.pipe_dir().display().to_string()),
                });
            }
        }
        self.daemons.push(daemon);
        Ok(())
    }

    fn set_up_mig(
        &mut self,
        gpu: u32,
        plan: &Plan,
        backend: &'b dyn MigBackend,
        allow_reconfigure: bool,
    ) -> Result<()> {
        let inst = crate::mig::plan_and_create(backend, gpu, plan, allow_reconfigure)?;
        for c in inst.instances() {
            let sms = plan.workloads.iter().find_map(|w| match &w.partition {
                ResolvedPartition::Mig { sms, .. } if w.workload == c.workload => Some(*sms),
                _ => None,
            });
            self.worker_env.insert(
                c.workload.clone(),
                vec![
                    ("CUDA_VISIBLE_DEVICES".into(), c.uuid.clone()),
                    (WORKER_GPU_ENV.into(), "0".into()),
                ],
            );
            self.records.push(PartitionRecord {
                workload: c.workload.clone(),
                mechanism: Mechanism::Mig,
                partition: format!("mig {} at slice {}", c.profile, c.start),
                granted_sms: sms,
                mig_device: Some(c.uuid.clone()),
                mps_pipe_dir: None,
            });
        }
        self.mig.push(inst);
        Ok(())
    }

    /// Extra environment per worker process, by workload name.
    pub fn worker_env(&self) -> &BTreeMap<String, Vec<(String, String)>> {
        &self.worker_env
    }

    /// The groups of a resizable split (`None`, with a note, where the sizes are not
    /// multiples of the driver's unit: the groups are then made as `run` makes them, and a
    /// resize is refused).
    fn set_up_green_pool(
        &mut self,
        gpu: u32,
        names: &[String],
        sizes: &[u32],
        urgent: &[bool],
    ) -> Result<Option<Vec<GreenGroup>>> {
        let wanted: Vec<(String, u32, bool)> = names
            .iter()
            .zip(sizes)
            .zip(urgent)
            .map(|((n, s), u)| (n.clone(), *s, *u))
            .collect();
        match GreenPool::create(gpu, &wanted) {
            Ok((pool, groups)) => {
                let driver = pool.sm_info();
                self.notes.push(format!(
                    "green: split into units of {} SMs, resizable while serving ({} SMs free); \
                     alignment {}",
                    pool.unit_sms(),
                    pool.free_sms(),
                    driver.coscheduled_alignment
                ));
                self.green_pool = Some(pool);
                Ok(Some(groups))
            }
            Err(GpuError::GreenRequest(why)) => {
                self.notes.push(format!(
                    "green: not resizable while serving ({why}); split to fit the sizes"
                ));
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// The split green partitions are resized from while serving (`None`: not resizable).
    pub fn green_pool(&self) -> Option<Arc<GreenPool>> {
        self.green_pool.clone()
    }

    /// Takes `workload`'s green group (its stream confines the workload's kernels).
    pub fn take_green_group(&mut self, workload: &str) -> Option<GreenGroup> {
        self.green.remove(workload)
    }

    pub fn records(&self) -> &[PartitionRecord] {
        &self.records
    }

    /// What a person may want to know about how the partitions were made (the green split,
    /// a joined MPS daemon).
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// Something the runtime calls with each worker's pid, so that [`crate::mps::shutdown_all`]
    /// ends our MPS clients before it stops the daemon (a no-op without our own daemon). It
    /// knows only the pid, so with a daemon per GPU it adopts the client into each: shutdown
    /// stops every daemon at once, and each client is ended before any of them.
    pub fn client_adopter(&self) -> impl Fn(u32) + Send + Sync + 'static {
        let ids: Vec<u64> = self
            .daemons
            .iter()
            .filter_map(MpsDaemon::registration_id)
            .collect();
        move |pid| {
            for &id in &ids {
                crate::mps::adopt_client_by_id(id, pid);
            }
        }
    }

    /// Stops the daemon and destroys the MIG instances (call after every worker has exited);
    /// reports every failure.
    pub fn finish(mut self) -> Result<()> {
        self.green.clear();
        self.green_pool = None;
        let mut problems = Vec::new();
        for d in std::mem::take(&mut self.daemons) {
            if let Err(e) = d.stop() {
                problems.push(e.to_string());
            }
        }
        for m in std::mem::take(&mut self.mig) {
            if let Err(e) = m.destroy() {
                problems.push(e.to_string());
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(GpuError::Usage(format!(
                "taking the partitions down: {}",
                problems.join("; ")
            )))
        }
    }
}

/// The plan split by GPU, in the order GPUs first appear: each GPU's workloads. CPU workloads
/// go with the first GPU's (nothing is set up for them; a GPU of CPU workloads alone would
/// start an MPS daemon for nobody). One GPU: the plan itself.
fn plans_per_gpu(default_gpu: u32, plan: &Plan) -> Vec<(u32, Plan)> {
    let mut out: Vec<(u32, Plan)> = Vec::new();
    let on_cpu = |w: &&AdmittedWorkload| matches!(w.partition, ResolvedPartition::Cpu);
    for w in plan.workloads.iter().filter(|w| !on_cpu(w)) {
        let g = w.gpu_or(default_gpu);
        let at = match out.iter().position(|(og, _)| *og == g) {
            Some(at) => at,
            None => {
                let empty = Plan {
                    workloads: Vec::new(),
                    ..plan.clone()
                };
                out.push((g, empty));
                out.len() - 1
            }
        };
        out[at].1.workloads.push(w.clone());
    }
    if out.len() <= 1 {
        // One GPU: the whole plan, in its own order, CPU workloads among the GPU ones.
        let gpu = out.first().map_or(default_gpu, |(g, _)| *g);
        return vec![(gpu, plan.clone())];
    }
    let cpu = plan.workloads.iter().filter(on_cpu).cloned();
    out[0].1.workloads.extend(cpu);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn whole(name: &str, gpu: Option<u32>) -> AdmittedWorkload {
        AdmittedWorkload {
            workload: name.into(),
            partition: ResolvedPartition::Whole,
            memory_mib: None,
            gpu,
        }
    }

    fn on_cpu(name: &str) -> AdmittedWorkload {
        AdmittedWorkload {
            partition: ResolvedPartition::Cpu,
            ..whole(name, None)
        }
    }

    fn timeslice(workloads: Vec<AdmittedWorkload>) -> Plan {
        Plan {
            device: "h100-sxm".into(),
            mechanism: Mechanism::Timeslice,
            workloads,
        }
    }

    fn names(p: &Plan) -> Vec<&str> {
        p.workloads.iter().map(|w| w.workload.as_str()).collect()
    }

    #[test]
    fn one_gpu_is_the_plan_itself_and_several_split_it_cpu_work_going_with_the_first() {
        let one = timeslice(vec![on_cpu("c"), whole("a", None)]);
        let split = plans_per_gpu(2, &one);
        assert_eq!(split.len(), 1);
        assert_eq!((split[0].0, names(&split[0].1)), (2, vec!["c", "a"]));
        let two = timeslice(vec![
            on_cpu("c"),
            whole("a", Some(1)),
            whole("b", Some(0)),
            whole("d", Some(1)),
        ]);
        let split = plans_per_gpu(0, &two);
        let got: Vec<_> = split.iter().map(|(g, p)| (*g, names(p))).collect();
        assert_eq!(got, [(1, vec!["a", "d", "c"]), (0, vec!["b"])]);
    }

    #[test]
    fn timeslice_workers_on_several_gpus_are_told_their_gpu() {
        let plan = timeslice(vec![whole("a", Some(0)), whole("b", Some(1)), on_cpu("c")]);
        let s = PartitionSession::set_up(0, &plan, &SessionOptions::default(), None).unwrap();
        let gpu = |w: &str| s.worker_env().get(w).cloned();
        let told = |g: &str| Some(vec![(WORKER_GPU_ENV.to_string(), g.to_string())]);
        assert_eq!((gpu("a"), gpu("b"), gpu("c")), (told("0"), told("1"), None));
        let described: Vec<_> = s.records().iter().map(|r| r.partition.as_str()).collect();
        assert_eq!(
            described,
            [
                "whole GPU on GPU 0",
                "whole GPU on GPU 1",
                "CPU (no GPU partition)"
            ]
        );
        s.finish().unwrap();
    }

    #[test]
    fn a_scenario_on_several_gpus_names_and_tells_the_gpu_even_when_one_is_used() {
        let plan = timeslice(vec![whole("a", Some(1)), whole("b", Some(1))]);
        let s = PartitionSession::set_up(0, &plan, &SessionOptions::default(), None).unwrap();
        let told = Some(vec![(WORKER_GPU_ENV.to_string(), "1".to_string())]);
        assert_eq!(s.worker_env().get("a").cloned(), told);
        let described: Vec<_> = s.records().iter().map(|r| r.partition.as_str()).collect();
        assert_eq!(described, ["whole GPU on GPU 1", "whole GPU on GPU 1"]);
        s.finish().unwrap();
    }

    #[test]
    fn timeslice_on_one_gpu_sets_nothing_and_says_no_gpu() {
        let plan = timeslice(vec![whole("a", None), on_cpu("c")]);
        let s = PartitionSession::set_up(3, &plan, &SessionOptions::default(), None).unwrap();
        assert!(s.worker_env().is_empty());
        assert_eq!(s.records()[0].partition, "whole GPU");
        s.finish().unwrap();
    }
}
