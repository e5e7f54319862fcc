//! A model in a worker process, driven as an [`Executor`]: the `exec` role of `isolane worker`
//! and its client, [`RemoteExecutor`].
//!
//! Serving a workload whose partition is a process (an MPS client, a MIG instance, a time
//! slice) needs the model in that process and its requests in the server's. The server's model
//! thread keeps everything it does for a thread host (queue, admission, batching, the guard's
//! holds between pieces) and only the job itself crosses, through a file both processes map
//! (in `/dev/shm`): a header of commands and answers, then the tensors. The engine's buffers
//! are the worker's own (pinned host memory on a GPU), so a job's tensors are copied once more
//! than on a thread.
//!
//! A command is a sequence number the client bumps in the header, an answer one the worker
//! bumps. Each side spins on the other's number for a while before it sleeps on its pipe, and
//! the other rings it (a `wake` line) only when it says it sleeps: a job asked of a worker that
//! is spinning costs no system call and no wake-up. Through pipe lines alone a job cost about
//! 0.75 ms more than in-process on the H200 (three threads woken per job: the worker's, the
//! client's reader, the model thread). The pipes keep the set-up, the worker's errors and the
//! stop:
//!
//! ```text
//! coord  → {"type":"exec","protocol_version":…,"setup":{"index":…,"workload":{…},"device":{…},"seed":…,"region":"/dev/shm/…","spin_us":…}}
//! worker → {"type":"exec_ready","tensors":{"inputs":[{"name":…,"shape":[…]}],"outputs":[…],"pieces":1,"device_memory_mib":…}}
//!        | {"type":"error","message":"…"}
//! coord  → {"type":"wake"}       (a command is in the header and the worker said it sleeps)
//! worker → {"type":"wake"}       (an answer is in the header and the client said it sleeps)
//! worker → {"type":"error","message":"…"}   (before a failed command's answer)
//! coord  → {"type":"stop"} or EOF           worker → {"type":"done","status":"ok"}
//! ```
//! Commands: split into pieces of about N ns (answer: the pieces), run piece i (0 reads the
//! inputs from the region first; the last writes the outputs there; an unsplit job is piece 0
//! of 1), run pieces i..j back to back, waited for once (the guard's run of fine pieces,
//! `[protection] fine_piece_us`; the range packed in the argument word, i in its low 32 bits,
//! j in its high ones; inputs and outputs as for its first and last piece). The tensors follow the header as little-endian f32 in the executor's order, inputs
//! then outputs, each at an offset aligned to 64 bytes.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use isolane_core::spec::{DeviceSpec, WorkloadSpec};
use memmap2::MmapMut;
use serde::{Deserialize, Serialize};

use crate::clock;
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
    /// How long the worker spins for the next command after an answer before it sleeps
    /// (`[timing] spin_us`).
    pub spin_us: u64,
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

/// The header's words (i64 each): what the client asks, what the worker answers, and who
/// sleeps.
const CMD_SEQ: usize = 0;
const CMD: usize = 1;
const ARG: usize = 2;
const DONE_SEQ: usize = 3;
const STATUS: usize = 4;
const RESULT: usize = 5;
const WORKER_SLEEPS: usize = 6;
const CLIENT_SLEEPS: usize = 7;
/// The header's size in f32 elements (64 bytes: one cache line, eight words).
const HEADER: usize = 16;

const CMD_SPLIT: i64 = 1;
const CMD_RUN_PIECE: i64 = 2;
const CMD_RUN_PIECES: i64 = 3;
const STATUS_OK: i64 = 0;
const STATUS_FAILED: i64 = 1;

/// Where each tensor lies in the region (in f32 elements), inputs first, after the header.
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
        let mut at = HEADER;
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
            bytes: at * 4,
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

/// A mapped region: the header, then f32 tensors.
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
        // SAFETY: the file is this server's and its one worker's (created new under a name
        // unique to them, unlinked once both have mapped it). The header is only touched
        // through atomics; the tensors are handed back and forth by the header's sequence
        // numbers (the client writes inputs before a command and reads outputs after its
        // answer; the worker the other way round), so the two never touch them at once.
        let map = unsafe { MmapMut::map_mut(file)? };
        Ok(Region { map })
    }

    fn word(&self, i: usize) -> &AtomicI64 {
        assert!(i < HEADER / 2, "header word {i}");
        let word = self.map[i * 8..].as_ptr().cast::<i64>().cast_mut();
        // SAFETY: the map is page-aligned, so the header's word i (of eight, checked above) is
        // 8-byte aligned and in bounds; AtomicI64 has i64's layout; the other process touches
        // these words only atomically too, and the reference lives no longer than the map.
        unsafe { AtomicI64::from_ptr(word) }
    }

    fn floats(&mut self, (start, len): (usize, usize)) -> &mut [f32] {
        bytemuck::cast_slice_mut(&mut self.map[start * 4..(start + len) * 4])
    }

    fn floats_ref(&self, (start, len): (usize, usize)) -> &[f32] {
        bytemuck::cast_slice(&self.map[start * 4..(start + len) * 4])
    }
}

/// Spins until `ready()` or `spin_ns` have passed; true when ready.
fn spin_until(spin_ns: i64, ready: impl Fn() -> bool) -> bool {
    if ready() {
        return true;
    }
    let until = clock::now_ns().saturating_add(spin_ns);
    while clock::now_ns() < until {
        if ready() {
            return true;
        }
        std::hint::spin_loop();
    }
    ready()
}

/// A model running in a worker process (see the module's text).
pub struct RemoteExecutor {
    client: WorkerClient,
    tensors: ExecTensors,
    layout: Layout,
    region: Region,
    seq: i64,
    /// How long the model thread spins for an answer before it sleeps.
    wait_spin_ns: i64,
    /// How long a piece may take before the worker is taken for hung.
    piece_timeout: Duration,
    name: String,
}

impl RemoteExecutor {
    /// Starts `command` with `env` (the partition's environment) as the worker that builds
    /// `setup`'s model, and waits until it is built. `wait_spin` is how long a job's answer is
    /// spun for before the model thread sleeps (a GPU job ends within milliseconds; a CPU job
    /// needs the cores this thread would spin on).
    pub fn start(
        command: &WorkerCommand,
        env: &[(String, String)],
        setup: ExecSetup,
        build_timeout: Duration,
        wait_spin: Duration,
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
            seq: 0,
            wait_spin_ns: wait_spin.as_nanos().min(i64::MAX as u128) as i64,
            piece_timeout: Duration::from_secs(600),
            name,
        })
    }

    /// The worker process's id (an MPS client to adopt, a process to name in errors).
    pub fn pid(&self) -> u32 {
        self.client.pid()
    }

    /// Puts a command in the header, rings the worker if it sleeps, and waits for its answer:
    /// the result word, or the worker's error.
    fn command(&mut self, cmd: i64, arg: i64) -> Result<i64, ExecError> {
        let r = &self.region;
        r.word(CMD).store(cmd, Ordering::Relaxed);
        r.word(ARG).store(arg, Ordering::Relaxed);
        self.seq += 1;
        let seq = self.seq;
        r.word(CMD_SEQ).store(seq, Ordering::SeqCst);
        let name = &self.name;
        let failed = |e: WorkerClientError| ExecError::Job(format!("workload `{name}`: {e}"));
        if r.word(WORKER_SLEEPS).load(Ordering::SeqCst) != 0 {
            self.client.send(&ToWorker::Wake).map_err(failed)?;
        }
        let done = || self.region.word(DONE_SEQ).load(Ordering::SeqCst) == seq;
        if !spin_until(self.wait_spin_ns, done) {
            self.region.word(CLIENT_SLEEPS).store(1, Ordering::SeqCst);
            while !done() {
                match self.client.recv(self.piece_timeout) {
                    // A wake for an earlier answer, or for this one: look again.
                    Ok(FromWorker::Wake) => {}
                    Ok(other) => {
                        self.region.word(CLIENT_SLEEPS).store(0, Ordering::SeqCst);
                        return Err(ExecError::Job(format!(
                            "workload `{name}`: {}",
                            self.client.unexpected(&other)
                        )));
                    }
                    Err(e) => {
                        self.region.word(CLIENT_SLEEPS).store(0, Ordering::SeqCst);
                        return Err(failed(e));
                    }
                }
            }
            self.region.word(CLIENT_SLEEPS).store(0, Ordering::SeqCst);
        }
        if self.region.word(STATUS).load(Ordering::Acquire) == STATUS_OK {
            return Ok(self.region.word(RESULT).load(Ordering::Acquire));
        }
        // The worker sent its error line before the answer; wakes may come first.
        loop {
            match self.client.recv(Duration::from_secs(10)) {
                Ok(FromWorker::Wake) => {}
                Ok(other) => {
                    return Err(ExecError::Job(format!(
                        "workload `{name}`: {}",
                        self.client.unexpected(&other)
                    )))
                }
                Err(WorkerClientError::Failed { message, .. }) => {
                    return Err(ExecError::Job(format!("workload `{name}`: {message}")))
                }
                Err(e) => return Err(failed(e)),
            }
        }
    }
}

impl Executor for RemoteExecutor {
    fn run_job(&mut self) -> Result<(), ExecError> {
        (0..self.tensors.pieces).try_for_each(|i| self.run_piece(i))
    }

    fn split(&mut self, piece_ns: i64) {
        // A worker that cannot answer keeps its pieces; its next job reports the failure.
        if let Ok(pieces) = self.command(CMD_SPLIT, piece_ns) {
            self.tensors.pieces = (pieces.max(1)) as usize;
        }
    }

    fn pieces(&self) -> usize {
        self.tensors.pieces
    }

    fn run_piece(&mut self, i: usize) -> Result<(), ExecError> {
        self.command(CMD_RUN_PIECE, i as i64).map(|_| ())
    }

    /// One command for the run: the worker launches its pieces back to back and waits once,
    /// so a run crosses the process boundary once, not once a piece.
    fn run_pieces(&mut self, range: std::ops::Range<usize>) -> Result<(), ExecError> {
        match range.len() {
            0 => Ok(()),
            1 => self.run_piece(range.start),
            _ => {
                let arg = pack_range(&range).ok_or_else(|| {
                    ExecError::Job(format!(
                        "workload `{}`: pieces {range:?} are past what a command carries",
                        self.name
                    ))
                })?;
                self.command(CMD_RUN_PIECES, arg).map(|_| ())
            }
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
/// creates the region, then answers commands until told to stop.
pub(crate) fn serve<R, W>(
    input: R,
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
    let mut exec = exec::executor_for(engine, &setup.device, w, setup.seed, setup.index, None)?;
    let tensors = ExecTensors {
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
    let mut worker = ExecWorker {
        input,
        exec,
        region,
        layout,
        pieces: tensors.pieces,
        spin_ns: (setup.spin_us as i64).saturating_mul(1000),
        seen: 0,
    };
    loop {
        if !worker.next_command()? || stop.load(Ordering::Relaxed) {
            return Ok(DoneStatus::Ok);
        }
        worker.answer(output)?;
    }
}

/// The worker's state between commands.
struct ExecWorker<R> {
    input: R,
    exec: Box<dyn Executor>,
    region: Region,
    layout: Layout,
    pieces: usize,
    spin_ns: i64,
    /// The last command answered.
    seen: i64,
}

impl<R: BufRead> ExecWorker<R> {
    /// Waits for the next command: spins, then sleeps on the pipe until woken. False when
    /// told to stop (a `stop` line, or the client gone).
    fn next_command(&mut self) -> Result<bool, WorkerError> {
        let seen = self.seen;
        let asked = |r: &Region| r.word(CMD_SEQ).load(Ordering::SeqCst) != seen;
        if spin_until(self.spin_ns, || asked(&self.region)) {
            return Ok(true);
        }
        loop {
            self.region.word(WORKER_SLEEPS).store(1, Ordering::SeqCst);
            if asked(&self.region) {
                self.region.word(WORKER_SLEEPS).store(0, Ordering::SeqCst);
                return Ok(true);
            }
            let line = match read_line(&mut self.input, "stopping the worker") {
                Ok(l) => l,
                // The server went away: nothing is left to answer.
                Err(WorkerError::Closed(_)) => return Ok(false),
                Err(e) => return Err(e),
            };
            self.region.word(WORKER_SLEEPS).store(0, Ordering::SeqCst);
            match serde_json::from_str::<ToWorker>(&line) {
                Ok(ToWorker::Wake) => {
                    if asked(&self.region) {
                        return Ok(true);
                    }
                }
                Ok(ToWorker::Stop) => return Ok(false),
                Ok(other) => {
                    return Err(WorkerError::Setup(format!(
                        "unexpected message for the exec role: {}",
                        serde_json::to_string(&other).unwrap_or_default()
                    )))
                }
                Err(e) => {
                    return Err(WorkerError::Setup(format!(
                        "malformed message from the server: {e}"
                    )))
                }
            }
        }
    }

    /// Runs the command in the header and answers it (its error goes on the pipe first).
    fn answer<W: Write>(&mut self, output: &mut W) -> Result<(), WorkerError> {
        let r = &self.region;
        let seq = r.word(CMD_SEQ).load(Ordering::SeqCst);
        let cmd = r.word(CMD).load(Ordering::Relaxed);
        let arg = r.word(ARG).load(Ordering::Relaxed);
        let outcome = match cmd {
            CMD_SPLIT => {
                self.exec.split(arg);
                self.pieces = self.exec.pieces().max(1);
                Ok(self.pieces as i64)
            }
            CMD_RUN_PIECE => {
                let i = usize::try_from(arg).unwrap_or(usize::MAX);
                run_pieces(
                    self.exec.as_mut(),
                    &mut self.region,
                    &self.layout,
                    i..i.saturating_add(1),
                    self.pieces,
                )
                .map(|()| 0)
            }
            CMD_RUN_PIECES => run_pieces(
                self.exec.as_mut(),
                &mut self.region,
                &self.layout,
                unpack_range(arg),
                self.pieces,
            )
            .map(|()| 0),
            other => Err(ExecError::Job(format!("unknown command {other}"))),
        };
        let r = &self.region;
        match outcome {
            Ok(result) => {
                r.word(RESULT).store(result, Ordering::Relaxed);
                r.word(STATUS).store(STATUS_OK, Ordering::Relaxed);
            }
            Err(e) => {
                send(
                    output,
                    &FromWorker::Error {
                        message: e.to_string(),
                    },
                )?;
                r.word(STATUS).store(STATUS_FAILED, Ordering::Relaxed);
            }
        }
        self.seen = seq;
        r.word(DONE_SEQ).store(seq, Ordering::SeqCst);
        if r.word(CLIENT_SLEEPS).load(Ordering::SeqCst) != 0 {
            send(output, &FromWorker::Wake)?;
        }
        Ok(())
    }
}

/// A run of pieces `start..end` in the argument word: `start` in its low 32 bits, `end` in its
/// high ones (`None` past them: a job of over 2^31 pieces).
fn pack_range(r: &std::ops::Range<usize>) -> Option<i64> {
    let start = u32::try_from(r.start).ok()?;
    let end = i32::try_from(r.end).ok()?;
    Some((i64::from(end) << 32) | i64::from(start))
}

fn unpack_range(arg: i64) -> std::ops::Range<usize> {
    let start = (arg & 0xffff_ffff) as usize;
    let end = usize::try_from(arg >> 32).unwrap_or(0);
    start..end
}

/// Runs pieces `range` of a job of `pieces` (a whole job when unsplit): the inputs read from
/// the region before its first piece, the outputs written there after its last.
fn run_pieces(
    exec: &mut dyn Executor,
    region: &mut Region,
    layout: &Layout,
    range: std::ops::Range<usize>,
    pieces: usize,
) -> Result<(), ExecError> {
    if range.is_empty() || range.end > pieces {
        let what = if range.len() == 1 {
            format!("piece {}", range.start)
        } else {
            format!("pieces {range:?}")
        };
        return Err(ExecError::Job(format!(
            "{what} asked of a job of {pieces} pieces"
        )));
    }
    if range.start == 0 {
        for (k, &at) in layout.inputs.iter().enumerate() {
            if let Some(buf) = exec.input_mut(k) {
                let n = at.1.min(buf.len());
                buf[..n].copy_from_slice(&region.floats(at)[..n]);
            }
        }
    }
    match pieces {
        1 => exec.run_job()?,
        _ if range.len() == 1 => exec.run_piece(range.start)?,
        _ => exec.run_pieces(range.clone())?,
    }
    if range.end == pieces {
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
    fn the_layout_keeps_tensors_apart_and_aligned_after_the_header() {
        let t = ExecTensors {
            inputs: vec![info("a", &[1, 3]), info("b", &[2, 16])],
            outputs: vec![info("y", &[1, 1])],
            pieces: 1,
            device_memory_mib: None,
        };
        let l = Layout::of(&t);
        assert_eq!(l.inputs, vec![(16, 3), (32, 32)]);
        assert_eq!(l.outputs, vec![(64, 1)]);
        assert_eq!(l.bytes, 80 * 4);
    }

    /// Records what the worker asks of it; its job has four pieces, one input and one output.
    struct Recording {
        calls: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
        input: Vec<f32>,
        output: Vec<f32>,
    }

    impl Executor for Recording {
        fn run_job(&mut self) -> Result<(), ExecError> {
            self.calls.lock().unwrap().push("job".into());
            Ok(())
        }
        fn pieces(&self) -> usize {
            4
        }
        fn run_piece(&mut self, i: usize) -> Result<(), ExecError> {
            self.calls.lock().unwrap().push(format!("piece {i}"));
            Ok(())
        }
        fn run_pieces(&mut self, range: std::ops::Range<usize>) -> Result<(), ExecError> {
            self.calls.lock().unwrap().push(format!("pieces {range:?}"));
            self.output[0] = self.input.iter().sum();
            Ok(())
        }
        fn input_mut(&mut self, i: usize) -> Option<&mut [f32]> {
            (i == 0).then_some(self.input.as_mut_slice())
        }
        fn output(&self, i: usize) -> Option<&[f32]> {
            (i == 0).then_some(self.output.as_slice())
        }
    }

    #[test]
    fn the_worker_runs_a_run_of_pieces_as_one_command() {
        let calls = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let t = ExecTensors {
            inputs: vec![info("x", &[1, 2])],
            outputs: vec![info("y", &[1, 1])],
            pieces: 4,
            device_memory_mib: None,
        };
        let layout = Layout::of(&t);
        let dir = tempfile::tempdir().unwrap();
        let region = Region::create(&dir.path().join("region"), layout.bytes).unwrap();
        let mut w = ExecWorker {
            input: std::io::empty(),
            exec: Box::new(Recording {
                calls: calls.clone(),
                input: vec![0.0; 2],
                output: vec![0.0],
            }),
            region,
            layout: layout.clone(),
            pieces: 4,
            spin_ns: 0,
            seen: 0,
        };
        let ask = |w: &mut ExecWorker<std::io::Empty>, seq: i64, cmd: i64, arg: i64| {
            w.region.word(CMD).store(cmd, Ordering::Relaxed);
            w.region.word(ARG).store(arg, Ordering::Relaxed);
            w.region.word(CMD_SEQ).store(seq, Ordering::SeqCst);
            let mut out = Vec::new();
            w.answer(&mut out).unwrap();
            assert_eq!(w.region.word(DONE_SEQ).load(Ordering::SeqCst), seq);
            (
                w.region.word(STATUS).load(Ordering::SeqCst),
                String::from_utf8(out).unwrap(),
            )
        };
        w.region
            .floats(layout.inputs[0])
            .copy_from_slice(&[1.5, 2.0]);
        // The first run reads the inputs; the last writes the outputs; a piece alone is a
        // piece.
        assert_eq!(
            ask(&mut w, 1, CMD_RUN_PIECES, pack_range(&(0..3)).unwrap()).0,
            STATUS_OK
        );
        assert_eq!(
            w.region.floats(layout.outputs[0])[0],
            0.0,
            "not the job's end yet"
        );
        assert_eq!(ask(&mut w, 2, CMD_RUN_PIECE, 3).0, STATUS_OK);
        assert_eq!(w.region.floats(layout.outputs[0])[0], 3.5);
        assert_eq!(
            ask(&mut w, 3, CMD_RUN_PIECES, pack_range(&(2..4)).unwrap()).0,
            STATUS_OK
        );
        assert_eq!(
            *calls.lock().unwrap(),
            ["pieces 0..3", "piece 3", "pieces 2..4"]
        );
        // Past the job's pieces: refused with the worker's error, nothing run.
        let (status, said) = ask(&mut w, 4, CMD_RUN_PIECES, pack_range(&(3..5)).unwrap());
        assert_eq!(status, STATUS_FAILED);
        assert!(
            said.contains("pieces 3..5 asked of a job of 4 pieces"),
            "{said}"
        );
        assert_eq!(calls.lock().unwrap().len(), 3);
    }

    #[test]
    fn a_run_of_pieces_crosses_in_one_word_and_back() {
        for r in [0..2, 3..7, 0..1, (u32::MAX as usize)..(i32::MAX as usize)] {
            assert_eq!(unpack_range(pack_range(&r).unwrap()), r);
        }
        assert_eq!(pack_range(&(0..(1usize << 31))), None);
    }
}
