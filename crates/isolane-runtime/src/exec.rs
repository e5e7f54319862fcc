//! What runs one job: the [`Executor`] trait, the synthetic spin workload, and the factory that
//! picks an executor for a workload.

use isolane_core::spec::{DeviceSpec, WorkloadSpec};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::clock;
use crate::partition::Partition;

#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("workload `{workload}`: model `{model}`: {reason}")]
    BadModel {
        workload: String,
        model: String,
        reason: String,
    },
    #[error(
        "workload `{workload}`: model `{model}` needs the inference engine, which is not \
         available yet in this build (only `spin:` models run for now)"
    )]
    EngineUnavailable { workload: String, model: String },
    #[error("workload `{workload}`: {message}")]
    Engine { workload: String, message: String },
    /// The engine's out-of-memory (an allocation of the model at its batch did not fit), told
    /// apart so that a worker and `isolane run` exit 3 for it as `infer` does.
    #[error("workload `{workload}`: {message}")]
    OutOfMemory { workload: String, message: String },
    #[error("job failed: {0}")]
    Job(String),
}

impl ExecError {
    /// Whether the engine ran out of memory (exit code 3).
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, ExecError::OutOfMemory { .. })
    }
}

/// How real models plug in without this crate depending on the engine: the binary builds one
/// [`Engine`] value at start-up and passes it down (to the coordinator through
/// [`crate::coordinator::RunOptions::engine`], to `isolane worker` through
/// [`crate::worker::run_worker`]), and [`executor_for`] hands it every non-`spin:` workload.
/// There is no process-wide registry: whatever state an engine keeps (e.g. graphs read by
/// `check`, reused by `build`) lives in the value.
pub trait EngineExecutors: Send + Sync {
    /// A cheap check that `spec`'s model can be built (known architecture, readable file),
    /// run before a run creates any output.
    fn check(&self, device: &DeviceSpec, spec: &WorkloadSpec) -> Result<(), ExecError>;
    /// Builds the executor (loads the model, allocates its buffers) on the calling thread, in
    /// `partition` when the run set one up for this workload (the engine knows its type and
    /// keeps it alive as long as the executor).
    fn build(
        &self,
        device: &DeviceSpec,
        spec: &WorkloadSpec,
        seed: u64,
        index: usize,
        partition: Option<Partition>,
    ) -> Result<Box<dyn Executor>, ExecError>;
}

/// The engine as a value the runtime is given (shared by the coordinator's workload threads).
pub type Engine = std::sync::Arc<dyn EngineExecutors>;

/// One input or output tensor of an executor, as a server describes it: its name and the shape
/// it was compiled for, batch first. Elements are row-major f32.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TensorInfo {
    pub name: String,
    pub shape: Vec<usize>,
}

impl TensorInfo {
    /// Elements of the whole compiled tensor.
    pub fn elements(&self) -> usize {
        self.shape.iter().product()
    }

    /// Elements of one row of the batch (the shape after its first dimension).
    pub fn row_elements(&self) -> usize {
        self.shape.iter().skip(1).product()
    }
}

/// Runs one job of a workload, synchronously, on the calling thread.
///
/// `Send` because a thread host builds the executor on the coordinator side of a spawn in tests
/// and moves it; implementations keep all per-job state inside so that `run_job` does not
/// allocate.
pub trait Executor: Send {
    fn run_job(&mut self) -> Result<(), ExecError>;
    /// Splits each job into pieces of about `piece_ns`, where the executor can (a best-effort
    /// workload under protection: the criticality guard may hold it between pieces). Default:
    /// cannot; jobs stay whole.
    fn split(&mut self, _piece_ns: i64) {}
    /// The pieces a job runs as (1: whole).
    fn pieces(&self) -> usize {
        1
    }
    /// Runs piece `i` (in order, `0..pieces()`) of the current job.
    fn run_piece(&mut self, i: usize) -> Result<(), ExecError> {
        debug_assert_eq!(i, 0, "an executor that does not split has one piece");
        self.run_job()
    }
    /// Runs the consecutive pieces `range` of the current job (in order, as
    /// [`Executor::run_piece`] would one by one) back to back, and returns when the last has
    /// ended: the guard's run of fine pieces (`[protection] fine_piece_us`). An executor that
    /// launches asynchronously issues them all and waits once, not once a piece. Default: one
    /// after the other.
    fn run_pieces(&mut self, range: std::ops::Range<usize>) -> Result<(), ExecError> {
        range.into_iter().try_for_each(|i| self.run_piece(i))
    }
    /// Device memory this executor holds (MiB), where its engine knows it.
    fn device_memory_mib(&self) -> Option<f64> {
        None
    }
    /// Sets `mib` of the GPU's L2 aside for this model's weights (`[protection]
    /// l2_persist_mib`, a critical model of a protected run), before it is split. Default: an
    /// executor with no weights on a GPU (CPU, `spin:`, `kernel:`) has nothing to keep there.
    fn persist_weights_in_l2(&mut self, _mib: u64) -> Result<(), ExecError> {
        Ok(())
    }
    /// What one job asks of the GPU's memory system (`isolane_core::predict`), for a sharing
    /// guard (`[protection] share`) to charge its pieces by; `None` where not known.
    fn memory_profile(&self) -> Option<isolane_core::predict::MemoryProfile> {
        None
    }
    /// The tensors a job reads, in order (empty: it takes no input, e.g. a `kernel:`). A
    /// server writes a request's rows into [`Executor::input_mut`] before [`Executor::run_job`].
    fn inputs(&self) -> Vec<TensorInfo> {
        Vec::new()
    }
    /// The tensors a job writes, in order, read through [`Executor::output`] after it.
    fn outputs(&self) -> Vec<TensorInfo> {
        Vec::new()
    }
    /// The buffer of input `i` (the whole compiled batch), `None` out of range.
    fn input_mut(&mut self, _i: usize) -> Option<&mut [f32]> {
        None
    }
    /// The buffer of output `i` after the last job, `None` out of range.
    fn output(&self, _i: usize) -> Option<&[f32]> {
        None
    }
    /// Makes up to `n` input/output slots, each a set of buffers a job can be launched from
    /// without waiting ([`Executor::launch_slot`]), so that a server writes the next job's input
    /// while the one before runs; returns how many it has. Default: 1, which is
    /// [`Executor::input_mut`], [`Executor::run_job`] and [`Executor::output`] (the job runs at
    /// its launch). Only for a whole-job executor outside the guard: pieces are not slotted.
    fn prepare_slots(&mut self, _n: usize) -> usize {
        1
    }
    /// Input `i` of `slot`; `None` out of range or while `slot`'s job is in flight (launched
    /// and not seen done), so that nothing writes an input a job may still read.
    fn slot_input_mut(&mut self, slot: usize, i: usize) -> Option<&mut [f32]> {
        if slot == 0 {
            self.input_mut(i)
        } else {
            None
        }
    }
    /// Has `slot`'s next launch copy input `i` (the whole compiled batch, `len` bytes) to the
    /// device straight from `src` instead of from the slot's own buffer: host memory
    /// page-locked for the device (a client's shared memory region, `isolane serve`), so that
    /// it is not first copied into the slot. `false` where the executor cannot (the default,
    /// and a `len` that is not the input's size): the caller then writes
    /// [`Executor::slot_input_mut`], which also takes back the slot's own buffer for input `i`.
    ///
    /// # Safety
    /// `src..src + len` must stay mapped until `slot`'s job is seen done
    /// ([`Executor::slot_done`], [`Executor::wait_slot`]), or until the slot has been waited
    /// for after a failed launch. What is written there meanwhile is what the job may read.
    unsafe fn slot_input_from(
        &mut self,
        _slot: usize,
        _i: usize,
        _src: *const u8,
        _len: usize,
    ) -> bool {
        false
    }
    /// Starts `slot`'s job behind those already launched and returns without waiting where the
    /// executor can (the default runs it to its end).
    fn launch_slot(&mut self, slot: usize) -> Result<(), ExecError> {
        if slot == 0 {
            self.run_job()
        } else {
            Err(ExecError::Job(format!("input slot {slot} of 1")))
        }
    }
    /// Whether `slot`'s job has ended, without blocking; once it says so the slot is free.
    fn slot_done(&mut self, _slot: usize) -> Result<bool, ExecError> {
        Ok(true)
    }
    /// Waits for `slot`'s job to end; the slot is then free.
    fn wait_slot(&mut self, _slot: usize) -> Result<(), ExecError> {
        Ok(())
    }
    /// Output `i` of `slot` after its job; `None` out of range or while it is in flight.
    fn slot_output(&self, slot: usize, i: usize) -> Option<&[f32]> {
        if slot == 0 {
            self.output(i)
        } else {
            None
        }
    }
}

/// A synthetic model: busy-waits on the monotonic clock for its service time. Spinning (not
/// sleeping) keeps a core as busy as a real CPU inference would, so contention is real too.
pub struct SpinExecutor {
    service_ns: i64,
    jitter_ns: i64,
    rng: ChaCha8Rng,
    /// Pieces per job once split (1: whole), and the current job's piece length.
    pieces: usize,
    piece_ns: i64,
    /// A served spin model echoes its input (one value per row of the batch): what a client
    /// sends comes back, after the service time.
    echo: Vec<f32>,
}

impl SpinExecutor {
    /// `seed` should differ per workload (see [`workload_seed`]) so that two workloads with the
    /// same jitter do not draw the same sequence.
    pub fn new(service_ns: i64, jitter_ns: i64, seed: u64) -> Self {
        SpinExecutor {
            service_ns,
            jitter_ns,
            rng: ChaCha8Rng::seed_from_u64(seed),
            pieces: 1,
            piece_ns: 0,
            echo: vec![0.0],
        }
    }

    /// Serves batches of `batch` rows (one value each), echoed back.
    pub fn with_batch(mut self, batch: usize) -> Self {
        self.echo = vec![0.0; batch.max(1)];
        self
    }

    fn next_service_ns(&mut self) -> i64 {
        if self.jitter_ns == 0 {
            return self.service_ns;
        }
        let j = self.rng.random_range(-self.jitter_ns..=self.jitter_ns);
        (self.service_ns + j).max(0)
    }
}

impl Executor for SpinExecutor {
    fn run_job(&mut self) -> Result<(), ExecError> {
        let service = self.next_service_ns();
        clock::spin_until_ns(clock::now_ns() + service);
        Ok(())
    }

    /// A spin job splits anywhere: into equal pieces of at most `piece_ns` (of its longest
    /// service time, so that the count is the same for every job).
    fn split(&mut self, piece_ns: i64) {
        let longest = self.service_ns + self.jitter_ns;
        self.pieces = ((longest + piece_ns - 1) / piece_ns.max(1)).max(1) as usize;
    }

    fn pieces(&self) -> usize {
        self.pieces
    }

    fn run_piece(&mut self, i: usize) -> Result<(), ExecError> {
        if i == 0 {
            self.piece_ns = self.next_service_ns() / self.pieces as i64;
        }
        clock::spin_until_ns(clock::now_ns() + self.piece_ns);
        Ok(())
    }

    fn inputs(&self) -> Vec<TensorInfo> {
        vec![TensorInfo {
            name: SPIN_INPUT.to_string(),
            shape: vec![self.echo.len(), 1],
        }]
    }

    fn outputs(&self) -> Vec<TensorInfo> {
        vec![TensorInfo {
            name: SPIN_OUTPUT.to_string(),
            shape: vec![self.echo.len(), 1],
        }]
    }

    fn input_mut(&mut self, i: usize) -> Option<&mut [f32]> {
        (i == 0).then_some(self.echo.as_mut_slice())
    }

    fn output(&self, i: usize) -> Option<&[f32]> {
        (i == 0).then_some(self.echo.as_slice())
    }
}

/// The tensor names of a served `spin:` model (one value per row, echoed).
pub const SPIN_INPUT: &str = "input";
pub const SPIN_OUTPUT: &str = "output";

/// The seed of workload `index` of a run seeded with `seed`: one seed per scenario, distinct
/// streams per workload.
pub fn workload_seed(seed: u64, index: usize) -> u64 {
    seed ^ (index as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// A parsed `spin:` model: service time and jitter half-width in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpinParams {
    pub service_ns: i64,
    pub jitter_ns: i64,
}

/// `Some` for a `spin:` model (parsed, or the parse error), `None` for any other model. The
/// syntax is core's (`SpinModel::parse`), so the runtime accepts exactly what validation does.
pub fn parse_spin_model(model: &str) -> Option<Result<SpinParams, String>> {
    if !model.starts_with("spin:") {
        return None;
    }
    Some(
        isolane_core::spec::SpinModel::parse(model)
            .map(|m| SpinParams {
                service_ns: m.service.as_nanos().min(i64::MAX as u128) as i64,
                jitter_ns: m.jitter.as_nanos().min(i64::MAX as u128) as i64,
            })
            .map_err(|e| e.to_string()),
    )
}

/// Builds the executor for workload `index` of a run: `spin:` models here, every other model
/// through `engine` (a clear error when there is none), in `partition` if it has one.
pub fn executor_for(
    engine: Option<&dyn EngineExecutors>,
    device: &DeviceSpec,
    spec: &WorkloadSpec,
    seed: u64,
    index: usize,
    partition: Option<Partition>,
) -> Result<Box<dyn Executor>, ExecError> {
    match parse_spin_model(&spec.model) {
        Some(Ok(p)) => Ok(Box::new(
            SpinExecutor::new(p.service_ns, p.jitter_ns, workload_seed(seed, index))
                .with_batch(spec.batch as usize),
        )),
        Some(Err(reason)) => Err(ExecError::BadModel {
            workload: spec.name.clone(),
            model: spec.model.clone(),
            reason,
        }),
        None => match engine {
            Some(engine) => engine.build(device, spec, seed, index, partition),
            None => Err(ExecError::EngineUnavailable {
                workload: spec.name.clone(),
                model: spec.model.clone(),
            }),
        },
    }
}

/// Checks that an executor can be built for `spec`, without building it: used before a run
/// creates any output.
pub fn check_model(
    engine: Option<&dyn EngineExecutors>,
    device: &DeviceSpec,
    spec: &WorkloadSpec,
) -> Result<(), ExecError> {
    match parse_spin_model(&spec.model) {
        Some(_) => executor_for(None, device, spec, 0, 0, None).map(|_| ()),
        None => match engine {
            Some(engine) => engine.check(device, spec),
            None => Err(ExecError::EngineUnavailable {
                workload: spec.name.clone(),
                model: spec.model.clone(),
            }),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_spin_models() {
        assert_eq!(
            parse_spin_model("spin:4ms"),
            Some(Ok(SpinParams {
                service_ns: 4_000_000,
                jitter_ns: 0
            }))
        );
        assert_eq!(
            parse_spin_model("spin:4ms~0.5ms"),
            Some(Ok(SpinParams {
                service_ns: 4_000_000,
                jitter_ns: 500_000
            }))
        );
        assert_eq!(
            parse_spin_model("spin:250us"),
            Some(Ok(SpinParams {
                service_ns: 250_000,
                jitter_ns: 0
            }))
        );
        assert!(parse_spin_model("resnet50").is_none());
        assert!(matches!(parse_spin_model("spin:4"), Some(Err(_))));
        assert!(matches!(parse_spin_model("spin:0ms"), Some(Err(_))));
        assert!(matches!(parse_spin_model("spin:1ms~2ms"), Some(Err(_))));
    }

    #[test]
    fn spin_takes_its_service_time() {
        let _serial = crate::serial_test_lock();
        let mut e = SpinExecutor::new(2_000_000, 0, 1);
        let a = clock::now_ns();
        e.run_job().unwrap();
        let took = clock::now_ns() - a;
        assert!(took >= 2_000_000, "spin took {took} ns");
    }

    #[test]
    fn jitter_is_seeded_and_bounded() {
        let mut a = SpinExecutor::new(1_000_000, 100_000, 7);
        let mut b = SpinExecutor::new(1_000_000, 100_000, 7);
        let xs: Vec<i64> = (0..200).map(|_| a.next_service_ns()).collect();
        let ys: Vec<i64> = (0..200).map(|_| b.next_service_ns()).collect();
        assert_eq!(xs, ys);
        assert!(xs.iter().all(|&x| (900_000..=1_100_000).contains(&x)));
        assert!(xs.iter().any(|&x| x != 1_000_000));
        assert_ne!(workload_seed(1, 0), workload_seed(1, 1));
    }

    #[test]
    fn a_served_spin_model_echoes_its_rows() {
        let mut e = SpinExecutor::new(1_000, 0, 1).with_batch(3);
        assert_eq!(e.inputs()[0].shape, vec![3, 1]);
        assert_eq!(e.outputs()[0].name, SPIN_OUTPUT);
        e.input_mut(0).unwrap().copy_from_slice(&[1.0, 2.0, 3.0]);
        e.run_job().unwrap();
        assert_eq!(e.output(0).unwrap(), &[1.0, 2.0, 3.0]);
        assert!(e.input_mut(1).is_none() && e.output(1).is_none());
    }
}
