//! Where a served workload's model runs: on the model thread itself (the CPU, a green
//! context), or, for `host = "process"` (an MPS client, a MIG instance, a time slice), in a
//! worker process of its own that the model thread drives as an executor
//! ([`isolane_runtime::remote_exec`]). Either way the model thread keeps the queue, batching
//! and the guard: only where the job runs differs.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use isolane_core::spec::{Backend, DeviceSpec, Host, WorkloadSpec};
use isolane_runtime::exec::{executor_for, Engine, ExecError, Executor};
use isolane_runtime::partition::Partition;
use isolane_runtime::remote_exec::{region_path, ExecSetup, RemoteExecutor};
use isolane_runtime::worker_client::WorkerCommand;

/// Called with a worker's pid once it runs (an MPS client the partition session adopts).
pub type WorkerStarted = Arc<dyn Fn(u32) + Send + Sync>;

/// How to start the worker processes of `host = "process"` workloads.
#[derive(Clone)]
pub struct ProcessHosts {
    /// `isolane worker` (this executable, or `ISOLANE_WORKER_EXE`).
    pub command: WorkerCommand,
    /// Each workload's partition environment, by workload name (MPS thread share, MIG
    /// device, client priority).
    pub env: BTreeMap<String, Vec<(String, String)>>,
    pub on_start: Option<WorkerStarted>,
}

impl ProcessHosts {
    /// Workers of this executable, with no partition environment (the CPU, time slices
    /// without a session).
    pub fn isolane() -> std::io::Result<ProcessHosts> {
        Ok(ProcessHosts {
            command: WorkerCommand::isolane()?,
            env: BTreeMap::new(),
            on_start: None,
        })
    }
}

/// The variable that gives an MPS client its share of the GPU's threads.
const MPS_THREAD_PCT: &str = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE";

/// How long a worker may take to build its model (a large model on the CPU, a first CUDA
/// context behind an MPS daemon).
const BUILD_TIMEOUT: Duration = Duration::from_secs(600);

/// How long a GPU job's answer is spun for before the model thread sleeps (longer jobs pay
/// one wake-up, a few µs against their milliseconds).
const WAIT_SPIN_GPU: Duration = Duration::from_millis(5);

/// Builds `spec`'s model where its host says: here (in `partition`, a green group) or in a
/// worker process started through `processes`.
pub(crate) fn build_executor(
    engine: &Engine,
    device: &DeviceSpec,
    spec: &WorkloadSpec,
    (seed, index, spin_ns): (u64, usize, i64),
    partition: Option<Partition>,
    processes: Option<&ProcessHosts>,
) -> Result<Box<dyn Executor>, ExecError> {
    if spec.host != Host::Process {
        return executor_for(Some(engine.as_ref()), device, spec, seed, index, partition);
    }
    let local;
    let processes = match processes {
        Some(p) => p,
        None => {
            local = ProcessHosts::isolane().map_err(|e| ExecError::Engine {
                workload: spec.name.clone(),
                message: format!("cannot find the isolane executable for its worker: {e}"),
            })?;
            &local
        }
    };
    let mut env = processes.env.get(&spec.name).cloned().unwrap_or_default();
    // An MPS client's share is its workload's now (`ctl resize NAME thread_pct=P` starts a new
    // client with the new one; the session's environment has the share it started with).
    if let Some(pct) = spec.partition.thread_pct {
        for (key, value) in &mut env {
            if key == MPS_THREAD_PCT {
                *value = pct.to_string();
            }
        }
    }
    let setup = ExecSetup {
        index,
        workload: spec.clone(),
        device: device.clone(),
        seed,
        region: region_path(index),
        spin_us: (spin_ns.max(0) / 1000) as u64,
    };
    // A GPU job ends within milliseconds: its answer is spun for, as a thread host's stream
    // synchronisation would. A CPU job needs the cores this thread would spin on.
    let wait_spin = match device.backend {
        Backend::Cuda => WAIT_SPIN_GPU,
        Backend::Cpu => Duration::ZERO,
    };
    // The workload's name on the worker's command line, as a run's workers have it (`ps`).
    let mut command = processes.command.clone();
    command
        .args
        .extend(["--workload".into(), spec.name.clone()]);
    let remote = RemoteExecutor::start(&command, &env, setup, BUILD_TIMEOUT, wait_spin)?;
    if let Some(started) = &processes.on_start {
        started(remote.pid());
    }
    Ok(Box::new(remote))
}
