//! CPU latency of a built-in model: `cargo run --release -p isolane-engine --example cpu_bench --
//! resnet18 [batch] [threads] [iters] [--profile]`. Prints the median and p90 of `run()` in ms,
//! and the median process CPU time per run (at 1 thread, a measure that a loaded machine
//! disturbs much less than wall time: time spent preempted is not counted).

use std::time::Instant;

use isolane_engine::cpu::CpuBackend;
use isolane_engine::{build_model, CompiledModel, Precision, Weights};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let name = args.get(1).map_or("resnet18", |s| s.as_str());
    let batch: usize = args.get(2).map_or(Ok(1), |s| s.parse())?;
    let threads: usize = args.get(3).map_or(Ok(0), |s| s.parse())?;
    let iters: usize = args.get(4).map_or(Ok(50), |s| s.parse())?;
    let profile = args.iter().any(|a| a == "--profile");
    let g = build_model(name, Weights::Synthetic { seed: 0 })?;
    let t0 = Instant::now();
    let mut m = CpuBackend::new(threads).compile_cpu(&g, batch, Precision::Fp32)?;
    let compile_ms = t0.elapsed().as_secs_f64() * 1e3;
    m.input_mut()
        .iter_mut()
        .enumerate()
        .for_each(|(i, v)| *v = ((i % 97) as f32 - 48.0) / 48.0);
    for _ in 0..3 {
        m.run()?;
    }
    let mut times = Vec::with_capacity(iters);
    let mut cpu = Vec::with_capacity(iters);
    for _ in 0..iters {
        let (t, c) = (Instant::now(), process_cpu_ms());
        m.run()?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
        cpu.push(process_cpu_ms() - c);
    }
    times.sort_by(|a, b| a.total_cmp(b));
    cpu.sort_by(|a, b| a.total_cmp(b));
    println!(
        "{name} batch {batch} threads {}: median {:.2} ms, p90 {:.2} ms, cpu {:.2} ms (compile {compile_ms:.0} ms, arena {:.1} MiB)",
        m.threads(),
        times[iters / 2],
        times[iters * 9 / 10],
        cpu[iters / 2],
        m.arena_bytes() as f64 / (1 << 20) as f64
    );
    if profile {
        let mut acc: std::collections::BTreeMap<String, f64> = Default::default();
        let runs = 10;
        for _ in 0..runs {
            for (n, ms) in m.profile() {
                *acc.entry(n).or_default() += ms / runs as f64;
            }
        }
        let mut v: Vec<_> = acc.into_iter().collect();
        v.sort_by(|a, b| b.1.total_cmp(&a.1));
        let total: f64 = v.iter().map(|x| x.1).sum();
        println!("profile total {total:.2} ms");
        for (n, ms) in v.iter().take(25) {
            println!("{ms:8.3} ms  {n}");
        }
    }
    Ok(())
}

/// CPU time of this process (all threads) in ms.
fn process_cpu_ms() -> f64 {
    #[repr(C)]
    struct Timespec {
        sec: i64,
        nsec: i64,
    }
    extern "C" {
        fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
    }
    const CLOCK_PROCESS_CPUTIME_ID: i32 = 2;
    let mut ts = Timespec { sec: 0, nsec: 0 };
    // SAFETY: clock_gettime writes one timespec (two 64-bit fields on x86_64/aarch64 Linux).
    let rc = unsafe { clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return f64::NAN;
    }
    ts.sec as f64 * 1e3 + ts.nsec as f64 * 1e-6
}
