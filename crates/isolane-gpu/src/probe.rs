//! The probe: a compute-bound kernel whose throughput measures how much of the GPU a partition
//! really gets.
//!
//! Each thread runs four independent chains of dependent FP32 FMAs on registers (no memory
//! traffic, so the only shared resource is the SMs themselves — and power/clocks). Work is
//! counted in *items*: one item = one block's pass of `iters` FMAs × 4 chains × `block_threads`
//! threads; "blocks per second" below means items per second.
//!
//! The kernel is **time-bounded**, not sized: the first block to start stamps `%globaltimer`
//! into a shared start word, and every block keeps doing items until `start + duration`. So the
//! same launch saturates any partition — 8 SMs or 132, a green context, an MPS client or a
//! time-sliced context — without knowing its size, there is no tail of a half-empty last wave,
//! and a context that is switched out loses wall time (which is what time-slicing costs). The
//! grid is the device's SM count × the blocks that fit on one SM, so the whole GPU is covered;
//! blocks that do not fit in a smaller partition start after the deadline and leave at once.
//!
//! Thread 0 of each block also adds one to `sm_items[%smid]` per item, so the SMs that did the
//! work are known. Inside an MPS client `%smid` is virtualised (measured on the H100: every
//! client sees SMs 0..n−1), so SM ids prove nothing there — throughput does.

use std::ffi::{c_uint, c_void, CString};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use crate::driver::{self, check, sys};
use crate::error::{GpuError, Result};
use crate::loader::{self, NvLib};

pub const KERNEL_NAME: &str = "isolane_probe";

/// CUDA C source of the probe (compiled with NVRTC, no headers needed).
pub const PROBE_SRC: &str = r#"
__device__ __forceinline__ unsigned int isolane_smid() {
    unsigned int r;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(r));
    return r;
}
__device__ __forceinline__ unsigned long long isolane_globaltimer() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
extern "C" __global__ void isolane_probe(
    unsigned long long duration_ns,
    unsigned long long* start_ns,
    unsigned long long* items_done,
    unsigned int* sm_items,
    float* sink,
    unsigned int iters)
{
    __shared__ unsigned long long deadline;
    __shared__ int go;
    if (threadIdx.x == 0) {
        unsigned long long now = isolane_globaltimer();
        unsigned long long old = atomicCAS(start_ns, 0ull, now);
        deadline = (old == 0ull ? now : old) + duration_ns;
    }
    __syncthreads();
    float a0 = 1.0f + threadIdx.x * 1e-4f;
    float a1 = a0 + 0.25f, a2 = a0 + 0.5f, a3 = a0 + 0.75f;
    const float m = 0.9999995f, c = 5e-7f;
    unsigned long long local = 0;
    for (;;) {
        if (threadIdx.x == 0) go = isolane_globaltimer() < deadline;
        __syncthreads();
        if (!go) break;
        #pragma unroll 16
        for (unsigned int i = 0; i < iters; ++i) {
            a0 = __fmaf_rn(a0, m, c);
            a1 = __fmaf_rn(a1, m, c);
            a2 = __fmaf_rn(a2, m, c);
            a3 = __fmaf_rn(a3, m, c);
        }
        if (threadIdx.x == 0) {
            unsigned int s = isolane_smid();
            if (s < 1024u) atomicAdd(&sm_items[s], 1u);
        }
        ++local;
        // Nobody may read `go` of the next round before everyone has read this one.
        __syncthreads();
    }
    if (threadIdx.x == 0 && local != 0ull) atomicAdd(items_done, local);
    float s = a0 + a1 + a2 + a3;
    // Never true (the chains converge to 1.0); keeps the FMAs from being optimised away.
    if (s == -1.0f) sink[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
"#;

const SM_SLOTS: usize = 1024;

// The probe's configuration and result are plain data in isolane-core, so that the worker
// protocol (isolane-runtime) carries them typed without depending on this crate.
pub use isolane_core::probe::{ProbeConfig, ProbeResult};

fn arch_for(cc: (u32, u32)) -> Option<&'static str> {
    // NVRTC 13 supports compute_75 and later; other devices get NVRTC's default target.
    Some(match cc {
        (7, 5) => "compute_75",
        (8, 0) => "compute_80",
        (8, 6) => "compute_86",
        (8, 7) => "compute_87",
        (8, 9) => "compute_89",
        (9, 0) => "compute_90",
        (10, 0) => "compute_100",
        (12, 0) => "compute_120",
        _ => return None,
    })
}

/// PTX of the probe for `cc`, compiled once per process and architecture.
pub fn probe_ptx(cc: (u32, u32)) -> Result<String> {
    type PtxCache = Mutex<Vec<((u32, u32), String)>>;
    static CACHE: OnceLock<PtxCache> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(Vec::new()));
    // Held while compiling: sixteen probe threads starting at once compile once, not 16 times.
    let mut cache = cache.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, p)) = cache.iter().find(|(k, _)| *k == cc) {
        return Ok(p.clone());
    }
    // cudarc's NVRTC loading panics when the library is missing: find it first.
    loader::ensure(NvLib::Nvrtc)?;
    let opts = cudarc::nvrtc::CompileOptions {
        arch: arch_for(cc),
        name: Some("isolane_probe.cu".into()),
        ..Default::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(PROBE_SRC, opts)
        .map_err(|e| GpuError::Nvrtc(format!("{e:?}")))?;
    let src = ptx.to_src();
    cache.push((cc, src.clone()));
    Ok(src)
}

/// The probe loaded in one context, bound to one stream. Not `Send`: it lives on the thread
/// that has its context current (one thread per green context, as the driver requires).
pub struct Probe {
    ctx: sys::CUcontext,
    stream: sys::CUstream,
    module: sys::CUmodule,
    func: sys::CUfunction,
    grid: u32,
    config: ProbeConfig,
    d_start: sys::CUdeviceptr,
    d_items: sys::CUdeviceptr,
    d_sm: sys::CUdeviceptr,
    d_sink: sys::CUdeviceptr,
    ev_start: sys::CUevent,
    ev_end: sys::CUevent,
}

impl Probe {
    /// Makes `ctx` current on this thread, loads the probe into it and allocates its buffers.
    /// `stream` must belong to `ctx` (a green group's stream and context, or a stream of the
    /// primary context).
    pub fn new(
        ctx: sys::CUcontext,
        stream: sys::CUstream,
        device_index: u32,
        config: ProbeConfig,
    ) -> Result<Self> {
        let dev = driver::device(device_index)?;
        // cudarc panics on a symbol the driver lacks; refuse cleanly instead.
        loader::require_cuda_symbols(
            &["cuEventElapsedTime_v2", "cuMemsetD8Async", "cuLaunchKernel"],
            "the probe needs a CUDA 12.8 or later driver",
        )?;
        let cc = driver::compute_capability(dev)?;
        let sms = driver::sm_count(dev)?;
        let ptx = probe_ptx(cc)?;
        let ptx = CString::new(ptx).map_err(|_| GpuError::Nvrtc("PTX contains a NUL".into()))?;
        driver::set_current(ctx)?;
        let mut p = Probe {
            ctx,
            stream,
            module: std::ptr::null_mut(),
            func: std::ptr::null_mut(),
            grid: 0,
            config,
            d_start: 0,
            d_items: 0,
            d_sm: 0,
            d_sink: 0,
            ev_start: std::ptr::null_mut(),
            ev_end: std::ptr::null_mut(),
        };
        // SAFETY: ctx is current; ptx is a NUL-terminated PTX image; out-pointers are valid.
        check("cuModuleLoadData", unsafe {
            sys::cuModuleLoadData(&mut p.module, ptx.as_ptr() as *const c_void)
        })?;
        let name = CString::new(KERNEL_NAME).map_err(|_| GpuError::Other("kernel name".into()))?;
        // SAFETY: module loaded above; name is NUL-terminated.
        check("cuModuleGetFunction", unsafe {
            sys::cuModuleGetFunction(&mut p.func, p.module, name.as_ptr())
        })?;
        let mut per_sm: std::ffi::c_int = 0;
        // SAFETY: func is a live kernel handle; no dynamic shared memory.
        check("cuOccupancyMaxActiveBlocksPerMultiprocessor", unsafe {
            sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(
                &mut per_sm,
                p.func,
                config.block_threads as std::ffi::c_int,
                0,
            )
        })?;
        p.grid = sms.max(1) * (per_sm.max(1) as u32);
        let sink_bytes = p.grid as usize * config.block_threads as usize * 4;
        for (ptr, bytes, call) in [
            (&mut p.d_start, 8usize, "cuMemAlloc_v2 (start)"),
            (&mut p.d_items, 8, "cuMemAlloc_v2 (items)"),
            (&mut p.d_sm, SM_SLOTS * 4, "cuMemAlloc_v2 (sm_items)"),
            (&mut p.d_sink, sink_bytes, "cuMemAlloc_v2 (sink)"),
        ] {
            // SAFETY: ctx is current; valid out-pointer; freed in Drop.
            check(call, unsafe { sys::cuMemAlloc_v2(ptr, bytes) })?;
        }
        // SAFETY: valid out-pointers; the end event blocks instead of spinning so that many
        // waiting probe threads do not eat the host's cores.
        check("cuEventCreate", unsafe {
            sys::cuEventCreate(
                &mut p.ev_start,
                sys::CUevent_flags::CU_EVENT_DEFAULT as c_uint,
            )
        })?;
        // SAFETY: as above, a valid out-pointer.
        check("cuEventCreate", unsafe {
            sys::cuEventCreate(
                &mut p.ev_end,
                sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC as c_uint,
            )
        })?;
        Ok(p)
    }

    pub fn grid_blocks(&self) -> u32 {
        self.grid
    }

    fn reset_counters(&self) -> Result<()> {
        for (ptr, bytes) in [
            (self.d_start, 8usize),
            (self.d_items, 8),
            (self.d_sm, SM_SLOTS * 4),
        ] {
            // SAFETY: ptr is our allocation of at least `bytes`; ordered on our stream before
            // the launch that reads it.
            check("cuMemsetD8Async", unsafe {
                sys::cuMemsetD8Async(ptr, 0, bytes, self.stream)
            })?;
        }
        Ok(())
    }

    fn launch(&self, duration: Duration) -> Result<()> {
        let mut duration_ns: u64 = duration.as_nanos().min(u128::from(u64::MAX)) as u64;
        let mut d_start = self.d_start;
        let mut d_items = self.d_items;
        let mut d_sm = self.d_sm;
        let mut d_sink = self.d_sink;
        let mut iters: c_uint = self.config.iters;
        let mut params: [*mut c_void; 6] = [
            &mut duration_ns as *mut u64 as *mut c_void,
            &mut d_start as *mut sys::CUdeviceptr as *mut c_void,
            &mut d_items as *mut sys::CUdeviceptr as *mut c_void,
            &mut d_sm as *mut sys::CUdeviceptr as *mut c_void,
            &mut d_sink as *mut sys::CUdeviceptr as *mut c_void,
            &mut iters as *mut c_uint as *mut c_void,
        ];
        // SAFETY: the six parameters match the kernel's signature (u64, 4 device pointers,
        // u32), each pointing at a live local; the driver copies them before returning. The
        // buffers are our allocations, sized for `grid` blocks of `block_threads`.
        check("cuLaunchKernel", unsafe {
            sys::cuLaunchKernel(
                self.func,
                self.grid,
                1,
                1,
                self.config.block_threads,
                1,
                1,
                0,
                self.stream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        })
    }

    /// One timed launch of `duration` (wall time on the GPU, measured with events).
    pub fn run_once(&mut self, duration: Duration) -> Result<ProbeResult> {
        driver::set_current(self.ctx)?;
        self.reset_counters()?;
        // SAFETY: events and stream are live and belong to the current context.
        check("cuEventRecord", unsafe {
            sys::cuEventRecord(self.ev_start, self.stream)
        })?;
        self.launch(duration)?;
        // SAFETY: as above.
        check("cuEventRecord", unsafe {
            sys::cuEventRecord(self.ev_end, self.stream)
        })?;
        // SAFETY: ev_end was recorded above.
        check("cuEventSynchronize", unsafe {
            sys::cuEventSynchronize(self.ev_end)
        })?;
        let mut ms: f32 = 0.0;
        // SAFETY: both events recorded on the same stream and completed.
        check("cuEventElapsedTime_v2", unsafe {
            sys::cuEventElapsedTime_v2(&mut ms, self.ev_start, self.ev_end)
        })?;
        let mut items: u64 = 0;
        let mut sm_items = vec![0u32; SM_SLOTS];
        // SAFETY: the kernel finished (event synchronised); destinations are large enough.
        check("cuMemcpyDtoH_v2", unsafe {
            sys::cuMemcpyDtoH_v2(&mut items as *mut u64 as *mut c_void, self.d_items, 8)
        })?;
        // SAFETY: as above; sm_items holds SM_SLOTS u32 values, 4 bytes each.
        check("cuMemcpyDtoH_v2", unsafe {
            sys::cuMemcpyDtoH_v2(
                sm_items.as_mut_ptr() as *mut c_void,
                self.d_sm,
                SM_SLOTS * 4,
            )
        })?;
        Ok(ProbeResult::from_counts(
            items,
            f64::from(ms) / 1e3,
            &sm_items,
            self.grid,
            self.config,
        ))
    }

    /// Throughput over `duration` (at least 0.5 s), after a short warm-up launch (module load,
    /// clocks ramping up).
    pub fn measure_throughput(&mut self, duration: Duration) -> Result<ProbeResult> {
        self.run_once(Duration::from_millis(50))?;
        self.run_once(duration.max(Duration::from_millis(500)))
    }

    /// Keeps the partition busy with back-to-back 100 ms launches until `stop` is raised;
    /// returns the number of launches. Stops within about 100 ms.
    pub fn saturate(&mut self, stop: &AtomicBool) -> Result<u64> {
        driver::set_current(self.ctx)?;
        let mut n = 0u64;
        while !stop.load(Ordering::Relaxed) {
            // SAFETY: d_start is ours; zeroing it re-arms the deadline of the next launch.
            check("cuMemsetD8Async", unsafe {
                sys::cuMemsetD8Async(self.d_start, 0, 8, self.stream)
            })?;
            self.launch(Duration::from_millis(100))?;
            // SAFETY: live event and stream of the current context.
            check("cuEventRecord", unsafe {
                sys::cuEventRecord(self.ev_end, self.stream)
            })?;
            // SAFETY: the event just recorded on our stream.
            check("cuEventSynchronize", unsafe {
                sys::cuEventSynchronize(self.ev_end)
            })?;
            n += 1;
        }
        Ok(n)
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        // Everything below was created by `new` in self.ctx, is destroyed once, and the stream
        // is drained first so no launch still uses the buffers. Errors cannot be reported from
        // Drop.
        // SAFETY: our context, alive while the probe is.
        let _ = unsafe { sys::cuCtxSetCurrent(self.ctx) };
        // SAFETY: our stream, in the context made current above.
        let _ = unsafe { sys::cuStreamSynchronize(self.stream) };
        for ev in [self.ev_start, self.ev_end] {
            if !ev.is_null() {
                // SAFETY: our event, destroyed once, no longer recorded on the drained stream.
                let _ = unsafe { sys::cuEventDestroy_v2(ev) };
            }
        }
        for p in [self.d_start, self.d_items, self.d_sm, self.d_sink] {
            if p != 0 {
                // SAFETY: our allocation, freed once, no launch uses it after the drain.
                let _ = unsafe { sys::cuMemFree_v2(p) };
            }
        }
        if !self.module.is_null() {
            // SAFETY: our module, unloaded once, after its last launch finished.
            let _ = unsafe { sys::cuModuleUnload(self.module) };
        }
    }
}

/// A plain stream of the device's primary context: the "whole GPU" baseline.
pub struct WholeDevice {
    primary: driver::PrimaryContext,
    stream: sys::CUstream,
}

impl WholeDevice {
    pub fn new(device_index: u32) -> Result<Self> {
        let dev = driver::device(device_index)?;
        let primary = driver::PrimaryContext::retain(dev)?;
        driver::set_current(primary.raw())?;
        let mut stream: sys::CUstream = std::ptr::null_mut();
        // SAFETY: the primary context is current; valid out-pointer.
        check("cuStreamCreate", unsafe {
            sys::cuStreamCreate(
                &mut stream,
                sys::CUstream_flags::CU_STREAM_NON_BLOCKING as c_uint,
            )
        })?;
        Ok(WholeDevice { primary, stream })
    }
    pub fn context(&self) -> sys::CUcontext {
        self.primary.raw()
    }
    pub fn stream(&self) -> sys::CUstream {
        self.stream
    }
}

impl Drop for WholeDevice {
    fn drop(&mut self) {
        // SAFETY: our stream, destroyed once, before the primary context is released.
        unsafe {
            let _ = sys::cuStreamDestroy_v2(self.stream);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_are_derived_from_counts() {
        let mut sm = vec![0u32; SM_SLOTS];
        sm[3] = 10;
        sm[7] = 5;
        let cfg = ProbeConfig::default();
        let r = ProbeResult::from_counts(1000, 0.5, &sm, 1056, cfg);
        assert_eq!(r.blocks_per_s, 2000.0);
        assert_eq!(r.sm_ids_seen, vec![3, 7]);
        let expect = 2000.0 * 256.0 * 1024.0 * 8.0 / 1e9;
        assert!((r.gflops - expect).abs() < 1e-9);
        assert_eq!(
            ProbeResult::from_counts(5, 0.0, &sm, 1, cfg).blocks_per_s,
            0.0
        );
    }

    #[test]
    fn the_kernel_source_has_what_the_launch_passes() {
        assert!(PROBE_SRC.contains("extern \"C\" __global__ void isolane_probe("));
        assert!(PROBE_SRC.contains("%%smid"));
        assert!(PROBE_SRC.contains("%%globaltimer"));
        assert_eq!(arch_for((9, 0)), Some("compute_90"));
        assert_eq!(arch_for((6, 1)), None);
    }
}
