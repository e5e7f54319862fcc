//! `CompiledModel::run()` of the CPU backend allocates nothing: a counting global allocator
//! (this test binary's own, so other tests are unaffected) sees zero allocations, on any
//! thread (the caller's and the model's rayon pool), across several runs after a warm-up run.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use isolane_engine::cpu::CpuBackend;
use isolane_engine::{build_model, Precision, Weights};

struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCS: AtomicUsize = AtomicUsize::new(0);
/// The tests of this binary share the counter: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: forwarded contract.
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: forwarded contract.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: forwarded contract.
        unsafe { System.realloc(p, l, n) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: forwarded contract.
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations (on any thread) during `runs` calls of `run()` after one warm-up run.
fn allocs_in_runs(name: &str, threads: usize, runs: usize) -> usize {
    let g = build_model(name, Weights::Synthetic { seed: 3 }).unwrap();
    let mut m = CpuBackend::new(threads)
        .compile_cpu(&g, 1, Precision::Fp32)
        .unwrap();
    m.input_mut()
        .iter_mut()
        .enumerate()
        .for_each(|(i, v)| *v = ((i % 89) as f32 - 44.0) / 44.0);
    use isolane_engine::CompiledModel;
    m.run().unwrap();
    let first = m.output().to_vec();
    ALLOCS.store(0, Ordering::SeqCst);
    COUNTING.store(true, Ordering::SeqCst);
    for _ in 0..runs {
        m.run().unwrap();
    }
    COUNTING.store(false, Ordering::SeqCst);
    let n = ALLOCS.load(Ordering::SeqCst);
    assert_eq!(m.output(), first.as_slice(), "{name}: runs disagree");
    n
}

fn check(name: &str) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for threads in [1, 2] {
        // More runs than one block of rayon's injector queue (63 jobs), so that an allocation
        // made only every so many runs would show.
        let n = allocs_in_runs(name, threads, 70);
        assert_eq!(n, 0, "{name} threads {threads}: {n} allocations in 70 runs");
    }
}

#[test]
fn resnet18_run_allocates_nothing() {
    check("resnet18");
}

#[test]
fn mobilenet_v2_run_allocates_nothing() {
    check("mobilenet_v2");
}
