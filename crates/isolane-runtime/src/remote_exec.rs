//! A model in a worker process, driven as an [`Executor`]: the `exec` role of `isolane worker`
//! and its client, [`RemoteExecutor`].
//!
//! Serving a workload whose partition is a process (an MPS client, a MIG instance, a time
//! slice) needs the model in that process and its requests in the server's. The server's model
//! thread keeps everything it does for a thread host (queue, admission, batching, the guard's
//! holds between pieces) and only the job itself crosses: the tensors through a shared file
//! both processes map, the commands as protocol lines. A job costs one pipe round trip and a
//! copy of its tensors on the worker's side (the engine's buffers are its own: pinned host
//! memory on a GPU).
//!
//! ```text
//! coord  → {"type":"exec","protocol_version":…,"setup":{"index":…,"workload":{…},"device":{…},"seed":…,"region":"/dev/shm/…"}}
//! worker → {"type":"exec_ready","inputs":[{"name":…,"shape":[…]}],"outputs":[…],"pieces":1,"device_memory_mib":…}
//!        | {"type":"error","message":"…"}
//! coord  → {"type":"split","piece_ns":…}    worker → {"type":"split_into","pieces":…}
//! coord  → {"type":"run_piece","i":…}       worker → {"type":"ran"} | {"type":"error",…}
//! coord  → {"type":"stop"} or EOF           worker → {"type":"done","status":"ok"}
//! ```
//! `run_piece` 0 reads the inputs from the region first; the last piece writes the outputs
//! there (an unsplit job is piece 0 of 1). The region holds every input, then every output,
//! as little-endian f32 in the executor's order, each at an offset aligned to 64 bytes.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use isolane_core::spec::{DeviceSpec, WorkloadSpec};
use memmap2::MmapMut;
use serde::{Deserialize, Serialize};

use crate::exec::{self, EngineExecutors, ExecError, Executor, TensorInfo};
use crate::protocol::{DoneStatus, FromWorker, ToWorker, PROTOCOL_VERSION};
use crate::worker::{read_line, send, WorkerError};
use crate::worker_client::{WorkerClient, WorkerClientError, WorkerCommand};

/// What the worker builds, and where the tensors go.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecSetup {
    pub index: usize,
    pub workload: WorkloadSpec,
    pub device: DeviceSpec,
    /// The scenario's seed (a built-in model's synthetic weights).
    pub seed: u64,
    /// The file the worker creates and sizes for the tensors; the client maps it after
    /// `exec_ready`. It must not exist yet.
    pub region: PathBuf,
}

/// The executor's tensors as the worker reports them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecTensors {
    pub inputs: Vec<TensorInfo>,
    pub outputs: Vec<TensorInfo>,
    pub pieces: usize,
    #[serde(default)]
    pub device_memory_mib: Option<f64>,
}

/// Where each tensor lies in the region (in f32 elements), inputs first.
#[derive(Debug, Clone)]
struct Layout {
    inputs: Vec<(usize, usize)>,
    outputs: Vec<(usize, usize)>,
    bytes: usize,
}

impl Layout {
    fn of(t: &ExecTensors) -> Layout {
        // 64 bytes: a cache line, so that no tensor shares one with its neighbour.
        const ALIGN: usize = 16;
        let mut at = 0;
        let mut place = |infos: &[TensorInfo]| -> Vec<(usize, usize)> {
            infos
                .iter()
                .map(|i| {
                    let start = at;
                    at = (start + i.elements()).div_ceil(ALIGN) * ALIGN;
                    (start, i.elements())
                })
                .collect()
        };
        let inputs = place(&t.inputs);
        let outputs = place(&t.outputs);
        Layout {
            inputs,
            outputs,
            bytes: at.max(1) * 4,
        }
    }
}

/// A new name for a worker's tensor region: in `/dev/shm` (memory, never a disk) where the
/// system has it, else the temporary directory; unique to this process, `index` and the time.
pub fn region_path(index: usize) -> PathBuf {
    let shm = Path::new("/dev/shm");
    let dir = if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    dir.join(format!(
        "isolane-exec-{}-{index}-{nanos}",
        std::process::id()
    ))
}

/// A mapped region of f32 tensors.
struct Region {
    map: MmapMut,
}

impl Region {
    fn create(path: &Path, bytes: usize) -> std::io::Result<Region> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)?;
        file.set_len(bytes as u64)?;
        Region::map(&file)
    }

    fn open(path: &Path, bytes: usize) -> std::io::Result<Region> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)?;
        if (file.metadata()?.len() as usize) < bytes {
            return Err(std::io::Error::other(format!(
                "{}: the worker's tensor region is smaller than its tensors ({bytes} bytes)",
                path.display()
            )));
        }
        Region::map(&file)
    }

    fn map(file: &std::fs::File) -> std::io::Result<Region> {
        // SAFETY: the file is private to this server and its one worker (created new in the
        // server's own directory), and the two never touch it at the same time: the protocol
        // hands it back and forth (the client writes inputs before `run_piece` and reads
        // outputs after `ran`; the worker the other way round).
        let map = unsafe { MmapMut::map_mut(file)? };
        Ok(Region { map })
    }

    fn floats(&mut self, (start, len): (usize, usize)) -> &mut [f32] {
        let bytes: &mut [u8] = &mut self.map[start * 4..(start + len) * 4];
        // The map is page-aligned and every offset a multiple of 4 bytes, so the cast holds.
        bytemuck::cast_slice_mut(bytes)
    }

    fn floats_ref(&self, (start, len): (usize, usize)) -> &[f32] {
        bytemuck::cast_slice(&self.map[start * 4..(start + len) * 4])
    }
}

/// A model running in a worker process (see the module's text).
pub struct RemoteExecutor {
    client: WorkerClient,
    tensors: ExecTensors,
    layout: Layout,
    region: Region,
    /// How long a piece may take before the worker is taken for hung.
    piece_timeout: Duration,
    name: String,
}

impl RemoteExecutor {
    /// Starts `command` with `env` (the partition's environment) as the worker that builds
    /// `setup`'s model, and waits until it is built.
    pub fn start(
        command: &WorkerCommand,
        env: &[(String, String)],
        setup: ExecSetup,
        build_timeout: Duration,
    ) -> Result<RemoteExecutor, ExecError> {
        let name = setup.workload.name.clone();
        let region_path = setup.region.clone();
        let failed = |e: WorkerClientError| ExecError::Engine {
            workload: name.clone(),
            message: format!("its worker process: {e}"),
        };
        let role = ToWorker::Exec {
            protocol_version: PROTOCOL_VERSION,
            setup: Box::new(setup),
        };
        let label = format!("workload `{name}`");
        let mut client = WorkerClient::start(&label, command, env, &role).map_err(failed)?;
        let tensors = match client.recv(build_timeout).map_err(failed)? {
            FromWorker::ExecReady { tensors } => *tensors,
            other => return Err(failed(client.unexpected(&other))),
        };
        let layout = Layout::of(&tensors);
        let region = Region::open(&region_path, layout.bytes);
        // Both sides hold their mapping now; the name is not needed any more, and unlinked
        // now it cannot outlive a crash.
        let _ = std::fs::remove_file(&region_path);
        let region = region.map_err(|e| ExecError::Engine {
            workload: name.clone(),
            message: format!("mapping its worker's tensors: {e}"),
        })?;
        Ok(RemoteExecutor {
            client,
            tensors,
            layout,
            region,
            piece_timeout: Duration::from_secs(600),
            name,
        })
    }

    /// The worker process's id (an MPS client to adopt, a process to name in errors).
    pub fn pid(&self) -> u32 {
        self.client.pid()
    }

    fn ask(&mut self, msg: &ToWorker) -> Result<FromWorker, ExecError> {
        let name = &self.name;
        let failed = |e: WorkerClientError| ExecError::Job(format!("workload `{name}`: {e}"));
        self.client.send(msg).map_err(failed)?;
        self.client.recv(self.piece_timeout).map_err(failed)
    }
}

impl Executor for RemoteExecutor {
    fn run_job(&mut self) -> Result<(), ExecError> {
        match self.tensors.pieces {
            1 => self.run_piece(0),
            n => (0..n).try_for_each(|i| self.run_piece(i)),
        }
    }

    fn split(&mut self, piece_ns: i64) {
        // A worker that cannot answer keeps its pieces; its next job reports the failure.
        if let Ok(FromWorker::SplitInto { pieces }) = self.ask(&ToWorker::Split { piece_ns }) {
            self.tensors.pieces = pieces.max(1);
        }
    }

    fn pieces(&self) -> usize {
        self.tensors.pieces
    }

    fn run_piece(&mut self, i: usize) -> Result<(), ExecError> {
        match self.ask(&ToWorker::RunPiece { i })? {
            FromWorker::Ran => Ok(()),
            other => Err(ExecError::Job(format!(
                "workload `{}`: {}",
                self.name,
                self.client.unexpected(&other)
            ))),
        }
    }

    fn device_memory_mib(&self) -> Option<f64> {
        self.tensors.device_memory_mib
    }

    fn inputs(&self) -> Vec<TensorInfo> {
        self.tensors.inputs.clone()
    }

    fn outputs(&self) -> Vec<TensorInfo> {
        self.tensors.outputs.clone()
    }

    fn input_mut(&mut self, i: usize) -> Option<&mut [f32]> {
        let at = *self.layout.inputs.get(i)?;
        Some(self.region.floats(at))
    }

    fn output(&self, i: usize) -> Option<&[f32]> {
        let at = *self.layout.outputs.get(i)?;
        Some(self.region.floats_ref(at))
    }
}

/// The worker's side: builds the model in this process (whose environment is its partition),
/// creates the region, then runs pieces until told to stop.
pub(crate) fn serve<R, W>(
    mut input: R,
    output: &mut W,
    setup: &ExecSetup,
    engine: Option<&dyn EngineExecutors>,
    stop: &Arc<AtomicBool>,
) -> Result<DoneStatus, WorkerError>
where
    R: BufRead,
    W: Write,
{
    let w = &setup.workload;
    crate::affinity::pin_current_thread(&w.cpu)
        .map_err(|e| WorkerError::Setup(format!("workload `{}`: {e}", w.name)))?;
    let mut exec =
        exec::executor_for(engine, &setup.device, w, setup.seed, setup.index, None)?;
    let mut tensors = ExecTensors {
        inputs: exec.inputs(),
        outputs: exec.outputs(),
        pieces: exec.pieces(),
        device_memory_mib: exec.device_memory_mib(),
    };
    let layout = Layout::of(&tensors);
    let mut region = Region::create(&setup.region, layout.bytes).map_err(|e| {
        WorkerError::Setup(format!(
            "workload `{}`: creating its tensor region {}: {e}",
            w.name,
            setup.region.display()
        ))
    })?;
    // Seeded like the engine's own inputs, so that a warm-up before any request computes
    // on what a thread host would.
    for (i, &at) in layout.inputs.iter().enumerate() {
        if let Some(buf) = exec.input_mut(i) {
            let n = at.1.min(buf.len());
            region.floats(at)[..n].copy_from_slice(&buf[..n]);
        }
    }
    send(
        output,
        &FromWorker::ExecReady {
            tensors: Box::new(tensors.clone()),
        },
    )?;
    loop {
        let line = match read_line(&mut input, "stopping the worker") {
            Ok(l) => l,
            // The server went away: nothing is left to answer.
            Err(WorkerError::Closed(_)) => return Ok(DoneStatus::Ok),
            Err(e) => return Err(e),
        };
        if stop.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(DoneStatus::Interrupted);
        }
        let msg: ToWorker = serde_json::from_str(&line)
            .map_err(|e| WorkerError::Setup(format!("malformed message from the server: {e}")))?;
        let reply = match msg {
            ToWorker::Stop => return Ok(DoneStatus::Ok),
            ToWorker::Split { piece_ns } => {
                exec.split(piece_ns);
                tensors.pieces = exec.pieces().max(1);
                FromWorker::SplitInto {
                    pieces: tensors.pieces,
                }
            }
            ToWorker::RunPiece { i } => {
                match run_piece(exec.as_mut(), &mut region, &layout, i, tensors.pieces) {
                    Ok(()) => FromWorker::Ran,
                    Err(e) => FromWorker::Error {
                        message: e.to_string(),
                    },
                }
            }
            other => {
                return Err(WorkerError::Setup(format!(
                    "unexpected message for the exec role: {}",
                    serde_json::to_string(&other).unwrap_or_default()
                )))
            }
        };
        send(output, &reply)?;
    }
}

fn run_piece(
    exec: &mut dyn Executor,
    region: &mut Region,
    layout: &Layout,
    i: usize,
    pieces: usize,
) -> Result<(), ExecError> {
    if i >= pieces {
        return Err(ExecError::Job(format!(
            "piece {i} asked of a job of {pieces} pieces"
        )));
    }
    if i == 0 {
        for (k, &at) in layout.inputs.iter().enumerate() {
            if let Some(buf) = exec.input_mut(k) {
                let n = at.1.min(buf.len());
                buf[..n].copy_from_slice(&region.floats(at)[..n]);
            }
        }
    }
    match pieces {
        1 => exec.run_job()?,
        _ => exec.run_piece(i)?,
    }
    if i + 1 == pieces {
        for (k, &at) in layout.outputs.iter().enumerate() {
            if let Some(buf) = exec.output(k) {
                let n = at.1.min(buf.len());
                region.floats(at)[..n].copy_from_slice(&buf[..n]);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(name: &str, shape: &[usize]) -> TensorInfo {
        TensorInfo {
            name: name.into(),
            shape: shape.to_vec(),
        }
    }

    #[test]
    fn the_layout_keeps_tensors_apart_and_aligned() {
        let t = ExecTensors {
            inputs: vec![info("a", &[1, 3]), info("b", &[2, 16])],
            outputs: vec![info("y", &[1, 1])],
            pieces: 1,
            device_memory_mib: None,
        };
        let l = Layout::of(&t);
        assert_eq!(l.inputs, vec![(0, 3), (16, 32)]);
        assert_eq!(l.outputs, vec![(48, 1)]);
        assert_eq!(l.bytes, 64 * 4);
    }
}
