//! The CPU backend (f32): the reference and correctness oracle, and the "CPU accelerator".
//!
//! Compiling runs the graph passes, infers shapes for the batch, prepares one kernel per node,
//! aliases view ops (reshape, flatten, squeeze...) onto their input's storage, and packs every
//! activation into one arena by liveness (values alive at the same time get disjoint ranges).
//! Running walks the compiled steps on a driver job parked in the model's own rayon pool; for
//! convolutional models nothing is allocated on that path (see `Driver`, `packed` and
//! `tests/no_alloc.rs`).

use std::sync::Arc;
use std::time::Instant;

use rayon::ThreadPool;

use crate::arena::{assign_offsets, ArenaRules, Storage};
use crate::backend::{Backend, CompiledModel, Precision};
use crate::error::{EngineError, Result};
use crate::ir::{Graph, Tensor, ValueKind};
use crate::kernels::{Io, Kernel, RawBuf};
use crate::passes;

/// The CPU backend. `threads` = size of each compiled model's rayon pool; 0 = all cores.
#[derive(Clone, Debug, Default)]
pub struct CpuBackend {
    pub threads: usize,
}

impl CpuBackend {
    /// A CPU backend whose models each use a pool of `threads` threads (0 = all cores).
    pub fn new(threads: usize) -> Self {
        CpuBackend { threads }
    }

    /// Compiles to the concrete CPU model type (gives access to profiling).
    pub fn compile_cpu(
        &self,
        graph: &Graph,
        batch: usize,
        precision: Precision,
    ) -> Result<CpuModel> {
        if precision != Precision::Fp32 {
            return Err(EngineError::Unsupported(format!(
                "the cpu backend runs fp32 only, not {precision}"
            )));
        }
        let g = passes::optimize(graph, batch)?;
        CpuModel::compile(&g, batch, self.threads)
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> &str {
        "cpu"
    }
    fn compile(
        &self,
        graph: &Graph,
        batch: usize,
        precision: Precision,
    ) -> Result<Box<dyn CompiledModel>> {
        Ok(Box::new(self.compile_cpu(graph, batch, precision)?))
    }
}

struct Step {
    name: String,
    kernel: Kernel,
    ins: Vec<RawBuf>,
    outs: Vec<RawBuf>,
}

impl Step {
    /// Runs the step's kernel on its buffers and the model's `scratch`.
    fn run(&self, scratch: RawBuf, threads: usize) {
        let io = Io {
            ins: &self.ins,
            outs: &self.outs,
            scratch,
        };
        self.kernel.run(&io, threads);
    }
}

/// Where a value lives.
#[derive(Clone, Copy, Debug)]
enum Loc {
    /// Storage index (into the arena's storages).
    Storage(usize),
    /// Constant index.
    Const(usize),
}

/// The CPU arena's layout: every storage on a 64-byte cache line (full SIMD alignment).
const ARENA_RULES: ArenaRules = ArenaRules {
    align: 64,
    min_bytes: 0,
};
const F32_BYTES: usize = std::mem::size_of::<f32>();

/// A graph compiled for the CPU at one batch size.
pub struct CpuModel {
    // Field order matters for nothing but clarity: the steps point into `arena`, `scratch`
    // and `consts`, all owned here.
    steps: Vec<Step>,
    arena: Vec<f32>,
    scratch: Vec<f32>,
    #[allow(dead_code)]
    consts: Vec<Arc<Tensor>>,
    inputs: Vec<(usize, usize, Vec<usize>)>,
    outputs: Vec<(usize, usize, Vec<usize>)>,
    /// Runs the steps on one of the pool's threads (declared before `pool`: dropped first).
    driver: Driver,
    #[allow(dead_code)]
    pool: ThreadPool,
    threads: usize,
}

// SAFETY: the raw pointers inside `steps` point only into heap buffers owned by this struct
// (`arena`, `scratch`, and the `Arc<Tensor>`s kept alive in `consts`); moving the struct to
// another thread moves ownership of all of them, and nothing else holds those pointers.
unsafe impl Send for CpuModel {}

/// Where every value lives before the arena is laid out: storages with their lifetimes
/// (inputs and outputs reserved for the whole run), constants, one prepared kernel per node
/// that is not a free view, and the copies that give outputs storage of their own.
struct Placement {
    loc: Vec<Option<Loc>>,
    storages: Vec<Storage>,
    consts: Vec<Arc<Tensor>>,
    kernels: Vec<Option<Kernel>>,
    /// Each graph input's storage and shape.
    input_storages: Vec<(usize, Vec<usize>)>,
    /// Each graph output's source and, where it needs one, the storage it is copied to.
    output_copies: Vec<(Loc, Option<usize>)>,
}

/// Places the values of `g` (shapes at the compiled batch): step t = node index + 1, 0 is
/// "before everything"; views alias their input's storage; kernels are prepared (and their
/// constant weights packed).
fn place_values(g: &Graph, shapes: &[Vec<usize>]) -> Result<Placement> {
    let nv = g.values.len();
    let mut loc: Vec<Option<Loc>> = vec![None; nv];
    let mut storages: Vec<Storage> = Vec::new();
    let mut consts: Vec<Arc<Tensor>> = Vec::new();
    let end = g.nodes.len() + 1;
    let new_storage = |storages: &mut Vec<Storage>, len: usize, first: usize| {
        storages.push(Storage::new(len * F32_BYTES, first));
        storages.len() - 1
    };
    for (i, v) in g.values.iter().enumerate() {
        if let ValueKind::Constant(t) = &v.kind {
            consts.push(t.clone());
            loc[i] = Some(Loc::Const(consts.len() - 1));
        }
    }
    let mut input_storages = Vec::new();
    for &i in &g.inputs {
        let len = shapes[i].iter().product();
        let s = new_storage(&mut storages, len, 0);
        storages[s].last = end;
        loc[i] = Some(Loc::Storage(s));
        input_storages.push((s, shapes[i].clone()));
    }
    // Nodes: step index t = node index + 1 (0 is "before everything").
    let mut kernels: Vec<Option<Kernel>> = Vec::with_capacity(g.nodes.len());
    for (ni, n) in g.nodes.iter().enumerate() {
        let t = ni + 1;
        for &i in &n.inputs {
            match loc[i] {
                Some(Loc::Storage(s)) => storages[s].last = storages[s].last.max(t),
                Some(Loc::Const(_)) => {}
                None => {
                    return Err(EngineError::graph(
                        &n.name,
                        format!("input {i} has no storage"),
                    ))
                }
            }
        }
        let alias = n.op.is_view() && matches!(loc[n.inputs[0]], Some(Loc::Storage(_)));
        if alias {
            loc[n.outputs[0]] = loc[n.inputs[0]];
            kernels.push(None);
            continue;
        }
        for &o in &n.outputs {
            let len = shapes[o].iter().product();
            let s = new_storage(&mut storages, len, t);
            loc[o] = Some(Loc::Storage(s));
        }
        let ins: Vec<&[usize]> = n.inputs.iter().map(|&i| shapes[i].as_slice()).collect();
        let outs: Vec<&[usize]> = n.outputs.iter().map(|&o| shapes[o].as_slice()).collect();
        let mut k = Kernel::prepare(n, &ins, &outs)?;
        if let (Kernel::Conv(_) | Kernel::Linear { .. }, Some(&w)) = (&k, n.inputs.get(1)) {
            if let Some(Loc::Const(ci)) = loc[w] {
                k.prepack(&consts[ci].data);
            }
        }
        kernels.push(Some(k));
    }
    // Outputs need their own storage, alive to the end, not shared with an input or with
    // another output; otherwise add a final copy.
    let mut output_copies: Vec<(Loc, Option<usize>)> = Vec::new();
    let mut claimed: Vec<usize> = input_storages.iter().map(|(s, _)| *s).collect();
    for &o in &g.outputs {
        let src = loc[o].ok_or_else(|| EngineError::graph("<outputs>", "output has no storage"))?;
        match src {
            Loc::Storage(s) if !claimed.contains(&s) => {
                storages[s].last = end;
                claimed.push(s);
                output_copies.push((src, None));
            }
            _ => {
                if let Loc::Storage(s) = src {
                    storages[s].last = end;
                }
                let len = shapes[o].iter().product();
                let s = new_storage(&mut storages, len, end);
                storages[s].last = end + 1;
                claimed.push(s);
                output_copies.push((src, Some(s)));
            }
        }
    }
    Ok(Placement {
        loc,
        storages,
        consts,
        kernels,
        input_storages,
        output_copies,
    })
}

impl CpuModel {
    fn compile(g: &Graph, batch: usize, threads: usize) -> Result<CpuModel> {
        let shapes = g.infer_shapes(batch)?;
        let Placement {
            loc,
            mut storages,
            consts,
            mut kernels,
            input_storages,
            output_copies,
        } = place_values(g, &shapes)?;
        let arena_len = assign_offsets(&mut storages, ARENA_RULES) / F32_BYTES;
        // Fallible: a batch whose arena the process cannot map (an address-space limit) is an
        // out-of-memory the caller reports, not an abort.
        let mut arena = crate::error::try_zeroed_f32(arena_len, "the activation arena")?;
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("isolane-cpu-{i}"))
            .build()
            .map_err(|e| {
                EngineError::Runtime(format!("cannot start a pool of {threads} threads: {e}"))
            })?;
        let threads = pool.current_num_threads();
        for k in kernels.iter_mut().flatten() {
            k.configure(threads);
        }
        let scratch_len = kernels
            .iter()
            .flatten()
            .map(|k| k.scratch_len(threads))
            .max()
            .unwrap_or(0);
        // 16 spare elements so that the scratch can start on a cache line (see `scratch_buf`).
        let scratch = crate::error::try_zeroed_f32(scratch_len + 16, "the kernels' scratch")?;
        let base = arena.as_mut_ptr();
        let buf = |l: Loc, len: usize| -> RawBuf {
            match l {
                Loc::Storage(s) => RawBuf {
                    // SAFETY: offset + len <= arena_len by construction of assign_offsets.
                    ptr: unsafe { base.add(storages[s].offset / F32_BYTES) },
                    len,
                },
                Loc::Const(c) => RawBuf::from_const(&consts[c].data),
            }
        };
        let mut steps = Vec::new();
        for (n, k) in g.nodes.iter().zip(kernels) {
            let Some(kernel) = k else { continue };
            let ins = n
                .inputs
                .iter()
                .map(|&i| buf(loc[i].unwrap_or(Loc::Const(0)), shapes[i].iter().product()))
                .collect();
            let outs = n
                .outputs
                .iter()
                .map(|&o| buf(loc[o].unwrap_or(Loc::Const(0)), shapes[o].iter().product()))
                .collect();
            steps.push(Step {
                name: n.name.clone(),
                kernel,
                ins,
                outs,
            });
        }
        let mut outputs = Vec::new();
        for (&o, (src, copy)) in g.outputs.iter().zip(&output_copies) {
            let len: usize = shapes[o].iter().product();
            let dst = match copy {
                Some(s) => {
                    steps.push(Step {
                        name: format!("copy to output {}", g.values[o].name),
                        kernel: Kernel::Copy,
                        ins: vec![buf(*src, len)],
                        outs: vec![buf(Loc::Storage(*s), len)],
                    });
                    *s
                }
                None => match src {
                    Loc::Storage(s) => *s,
                    Loc::Const(_) => unreachable_storage()?,
                },
            };
            outputs.push((storages[dst].offset / F32_BYTES, len, shapes[o].clone()));
        }
        let inputs = input_storages
            .into_iter()
            .map(|(s, shape)| {
                let st = &storages[s];
                (st.offset / F32_BYTES, st.bytes / F32_BYTES, shape)
            })
            .collect();
        Ok(CpuModel {
            steps,
            arena,
            scratch,
            consts,
            inputs,
            outputs,
            driver: Driver::start(&pool),
            pool,
            threads,
        })
    }

    /// Runs once and returns (step name, milliseconds) for every step, for profiling.
    pub fn profile(&mut self) -> Vec<(String, f64)> {
        let scratch = self.scratch_buf();
        let threads = self.threads;
        let steps = &self.steps;
        let times = std::sync::Mutex::new(Vec::with_capacity(steps.len()));
        let ok = self.driver.run(&|| {
            let mut times = times.lock().unwrap_or_else(|e| e.into_inner());
            for s in steps {
                let t0 = Instant::now();
                s.run(scratch, threads);
                times.push((
                    format!("{} [{}]", s.name, kernel_name(&s.kernel)),
                    t0.elapsed().as_secs_f64() * 1e3,
                ));
            }
        });
        if !ok {
            return Vec::new();
        }
        times.into_inner().unwrap_or_else(|e| e.into_inner())
    }

    /// The scratch buffer from its first 64-byte-aligned element on (im2col blocks then start
    /// on cache lines, so that the GEMM can read them in place).
    fn scratch_buf(&mut self) -> RawBuf {
        let skip = self.scratch.as_ptr().align_offset(64).min(16);
        let end = self.scratch.len() - (16 - skip);
        RawBuf::from_slice(&mut self.scratch[skip..end])
    }

    /// Threads in this model's pool.
    pub fn threads(&self) -> usize {
        self.threads
    }
}

fn unreachable_storage() -> Result<usize> {
    Err(EngineError::Runtime(
        "internal: constant output without a copy".into(),
    ))
}

fn kernel_name(k: &Kernel) -> String {
    match k {
        Kernel::Conv(c) => format!("Conv/{}", c.describe()),
        other => format!("{other:?}")
            .chars()
            .take_while(|c| c.is_alphanumeric())
            .collect(),
    }
}

/// A job that lives in the model's pool for the model's lifetime, parked on a condition
/// variable, and runs whatever `run` hands it on that pool thread.
///
/// This is what keeps `run()` free of allocation: entering a rayon pool from outside
/// (`install`, `spawn`, `join` on a foreign thread) pushes onto the pool's injector queue, a
/// linked list of blocks that allocates a new block every 63 pushes. The driver is injected once,
/// at compile time; afterwards a run is a mutex/condvar hand-off (futexes, no allocation), and
/// every job of the run is pushed by a pool thread onto its own deque.
struct Driver {
    shared: Arc<DriverShared>,
}

struct DriverShared {
    state: std::sync::Mutex<DriverState>,
    cv: std::sync::Condvar,
}

enum DriverState {
    Idle,
    Run(Job),
    Done(bool),
    Exit,
}

/// A borrowed closure with its lifetime erased; `Driver::run` waits until it has run.
#[derive(Clone, Copy)]
struct Job(*const (dyn Fn() + Sync + 'static));
// SAFETY: the closure is `Sync`, and `Driver::run` keeps it alive until the driver is done.
unsafe impl Send for Job {}

impl Driver {
    fn start(pool: &ThreadPool) -> Driver {
        let shared = Arc::new(DriverShared {
            state: std::sync::Mutex::new(DriverState::Idle),
            cv: std::sync::Condvar::new(),
        });
        let sh = shared.clone();
        pool.spawn(move || loop {
            let job = {
                let mut st = sh.state.lock().unwrap_or_else(|e| e.into_inner());
                loop {
                    match *st {
                        DriverState::Run(job) => break job,
                        DriverState::Exit => return,
                        _ => st = sh.cv.wait(st).unwrap_or_else(|e| e.into_inner()),
                    }
                }
            };
            // SAFETY: `run` blocks until `Done`, so the closure is alive.
            let ok =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe { (*job.0)() }))
                    .is_ok();
            *sh.state.lock().unwrap_or_else(|e| e.into_inner()) = DriverState::Done(ok);
            sh.cv.notify_all();
        });
        Driver { shared }
    }

    /// Runs `f` on the driver's pool thread and waits for it; false if it panicked.
    fn run(&self, f: &(dyn Fn() + Sync)) -> bool {
        // SAFETY: only the lifetime is erased; this function does not return before the
        // driver has finished with `f` (state `Done`).
        let job = Job(unsafe {
            std::mem::transmute::<*const (dyn Fn() + Sync + '_), *const (dyn Fn() + Sync + 'static)>(
                f,
            )
        });
        let sh = &self.shared;
        let mut st = sh.state.lock().unwrap_or_else(|e| e.into_inner());
        *st = DriverState::Run(job);
        sh.cv.notify_all();
        loop {
            if let DriverState::Done(ok) = *st {
                *st = DriverState::Idle;
                return ok;
            }
            st = sh.cv.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        *self.shared.state.lock().unwrap_or_else(|e| e.into_inner()) = DriverState::Exit;
        self.shared.cv.notify_all();
    }
}

/// Runs `f` on the current pool thread while the pool's other threads stay awake: each runs a
/// spinner that keeps executing the pool's pending jobs (`rayon::yield_now`) until `f` is done.
/// Without it, the workers fall asleep between the short parallel steps of a forward pass and
/// every step pays a futex wake-up, which costs much of the second core at batch 1.
///
/// The spinners are the stealable halves of nested `rayon::join`s (stack jobs: nothing is
/// allocated, unlike `scope`/`spawn`, which box every job).
///
/// Deadlock freedom: the spinners are pushed onto this thread's deque before any step's jobs;
/// idle threads steal from the bottom (oldest first), so every spinner is stolen before any
/// step job can be, and this thread never pops a spinner while a step below it is unfinished.
/// A spinner this thread pops itself (not stolen before `f` finished) returns at once.
fn with_spinning_workers(threads: usize, f: impl FnOnce() + Send) {
    use std::sync::atomic::{AtomicBool, Ordering};
    if threads <= 1 {
        return f();
    }
    let done = AtomicBool::new(false);
    let spin = || {
        let mut idle = 0u32;
        while !done.load(Ordering::Acquire) {
            if rayon::yield_now() == Some(rayon::Yield::Executed) {
                idle = 0;
            } else {
                idle = idle.wrapping_add(1);
                // Give the core away now and then, in case threads outnumber cores.
                if idle.is_multiple_of(64) {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
        }
    };
    let mut f = Some(f);
    let mut body = || {
        if let Some(f) = f.take() {
            f();
        }
        done.store(true, Ordering::Release);
    };
    nest(threads - 1, &mut body, &spin);
}

/// `body` inside `spinners` nested joins, each with `spin` as its stealable half.
fn nest(spinners: usize, body: &mut (dyn FnMut() + Send), spin: &(dyn Fn() + Sync)) {
    if spinners == 0 {
        body();
    } else {
        rayon::join(|| nest(spinners - 1, body, spin), spin);
    }
}

impl CompiledModel for CpuModel {
    fn num_inputs(&self) -> usize {
        self.inputs.len()
    }
    fn num_outputs(&self) -> usize {
        self.outputs.len()
    }
    fn input_shape_at(&self, i: usize) -> &[usize] {
        self.inputs.get(i).map_or(&[], |x| x.2.as_slice())
    }
    fn output_shape_at(&self, i: usize) -> &[usize] {
        self.outputs.get(i).map_or(&[], |x| x.2.as_slice())
    }
    fn input_mut_at(&mut self, i: usize) -> &mut [f32] {
        match self.inputs.get(i) {
            Some(&(off, len, _)) => &mut self.arena[off..off + len],
            None => &mut [],
        }
    }
    fn output_at(&self, i: usize) -> &[f32] {
        match self.outputs.get(i) {
            Some(&(off, len, _)) => &self.arena[off..off + len],
            None => &[],
        }
    }
    fn run(&mut self) -> Result<()> {
        let scratch = self.scratch_buf();
        let threads = self.threads;
        let steps = &self.steps;
        // The arena is reached only through the steps' pointers while they run; `&mut self`
        // guarantees no slice handed out by input_mut/output is alive meanwhile.
        let ok = self.driver.run(&|| {
            with_spinning_workers(threads, || {
                for s in steps {
                    s.run(scratch, threads);
                }
            })
        });
        if ok {
            Ok(())
        } else {
            Err(EngineError::Runtime("a cpu kernel panicked".into()))
        }
    }
    fn arena_bytes(&self) -> usize {
        self.arena.len() * 4
    }
}
