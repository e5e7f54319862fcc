//! The synthetic `kernel:` workloads on the GPU (issue 17): a memory-bound STREAM triad and an
//! L2-resident read loop (NVRTC kernels, compiled like the backend's own), and a compute-bound
//! GEMM through cuBLASLt (tensor cores at fp16/bf16/tf32). Each runs on the backend's stream,
//! so a green-context backend confines it to that group's SMs, exactly like a model.
//!
//! A job is one launch and the wait for it (`cuStreamSynchronize`), as a model's job is.

use std::ffi::{c_void, CString};

use cudarc::cublaslt::sys as lt;
use cudarc::driver::sys as cu;
use isolane_engine::{EngineError, Precision, Result};

use crate::error::{cu_check, lt_check};
use crate::handles::{CublasLt, Module};
use crate::model::{cubin_for, device_arch, make_current};
use crate::CudaBackend;

/// What to run; the sizes come from core's `KernelModel`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Synthetic {
    /// `a = b + s·c` over `elems` f32 per array.
    Triad { elems: u64 },
    /// `C = A·B`, all `n`×`n`, at `precision`.
    Gemm { n: usize, precision: Precision },
    /// `passes` reads of `elems` f32 (a multiple of 4), bypassing L1 so that L2 serves them.
    L2 { elems: u64, passes: u32 },
}

const SRC: &str = r#"
extern "C" __global__ void triad(float* __restrict__ a, const float* __restrict__ b,
                                 const float* __restrict__ c, float s, unsigned long long n) {
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
         i < n; i += stride)
        a[i] = b[i] + s * c[i];
}

extern "C" __global__ void l2_read(const float4* __restrict__ buf, unsigned long long n4,
                                   unsigned int passes, float* sink) {
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    float acc = 0.f;
    for (unsigned int p = 0; p < passes; ++p) {
        for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
             i < n4; i += stride) {
            float x, y, z, w;
            // .cg: cached in L2 only, so repeated passes are served by L2, not by L1.
            asm volatile("ld.global.cg.v4.f32 {%0,%1,%2,%3}, [%4];"
                         : "=f"(x), "=f"(y), "=f"(z), "=f"(w) : "l"(buf + i));
            acc += x + y + z + w;
        }
    }
    // Never true for the buffer's contents (ones), but the compiler cannot know that.
    if (acc == -1.f) sink[0] = acc;
}
"#;

/// Threads per block of the NVRTC kernels.
const BLOCK: u32 = 256;
/// The triad's scalar (STREAM's 3.0).
const TRIAD_SCALAR: f32 = 3.0;
/// Largest cuBLASLt workspace the GEMM may use.
pub const GEMM_WORKSPACE: usize = 32 << 20;

/// One synthetic kernel with its buffers, ready to run jobs.
pub struct SyntheticKernel {
    backend: CudaBackend,
    module: Option<Module>,
    buffers: Vec<cu::CUdeviceptr>,
    bytes: usize,
    launch: Launch,
}

// SAFETY: driver handles may be used from any thread; `run` makes the context current first.
unsafe impl Send for SyntheticKernel {}

enum Launch {
    Triad {
        func: cu::CUfunction,
        grid: u32,
        elems: u64,
    },
    L2 {
        func: cu::CUfunction,
        grid: u32,
        n4: u64,
        passes: u32,
    },
    Gemm(Box<Gemm>),
}

/// cuBLASLt's handle, descriptors and chosen algorithm for one `n`×`n`×`n` product.
struct Gemm {
    handle: CublasLt,
    desc: lt::cublasLtMatmulDesc_t,
    layout: lt::cublasLtMatrixLayout_t,
    algo: lt::cublasLtMatmulAlgo_t,
    workspace: usize,
}

impl CudaBackend {
    /// Allocates and prepares `kernel` on this backend's stream (in its context).
    pub fn synthetic(&self, kernel: Synthetic) -> Result<SyntheticKernel> {
        make_current(self.context())?;
        let mut k = SyntheticKernel {
            backend: self.clone(),
            module: None,
            buffers: Vec::new(),
            bytes: 0,
            launch: Launch::Triad {
                func: std::ptr::null_mut(),
                grid: 0,
                elems: 0,
            },
        };
        k.launch = match kernel {
            Synthetic::Triad { elems } => k.prepare_triad(elems)?,
            Synthetic::L2 { elems, passes } => k.prepare_l2(elems, passes)?,
            Synthetic::Gemm { n, precision } => k.prepare_gemm(n, precision)?,
        };
        cu_check("cuStreamSynchronize", stream_sync(self.stream()))?;
        Ok(k)
    }
}

/// Waits for everything queued on `stream`.
fn stream_sync(stream: cu::CUstream) -> cu::CUresult {
    // SAFETY: the stream belongs to a backend the caller holds.
    unsafe { cu::cuStreamSynchronize(stream) }
}

impl SyntheticKernel {
    /// Device memory the kernel's buffers take (bytes).
    pub fn device_bytes(&self) -> usize {
        self.bytes
    }

    /// One job: one launch, then the wait for it.
    pub fn run(&mut self) -> Result<()> {
        make_current(self.backend.context())?;
        let stream = self.backend.stream();
        match &self.launch {
            Launch::Triad { func, grid, elems } => {
                let (mut a, mut b, mut c) = (self.buffers[0], self.buffers[1], self.buffers[2]);
                let (mut s, mut n) = (TRIAD_SCALAR, *elems);
                let mut params: [*mut c_void; 5] = [
                    &mut a as *mut _ as *mut c_void,
                    &mut b as *mut _ as *mut c_void,
                    &mut c as *mut _ as *mut c_void,
                    &mut s as *mut f32 as *mut c_void,
                    &mut n as *mut u64 as *mut c_void,
                ];
                launch(*func, *grid, stream, &mut params)?;
            }
            Launch::L2 {
                func,
                grid,
                n4,
                passes,
            } => {
                let (mut buf, mut sink) = (self.buffers[0], self.buffers[1]);
                let (mut n4, mut passes) = (*n4, *passes);
                let mut params: [*mut c_void; 4] = [
                    &mut buf as *mut _ as *mut c_void,
                    &mut n4 as *mut u64 as *mut c_void,
                    &mut passes as *mut u32 as *mut c_void,
                    &mut sink as *mut _ as *mut c_void,
                ];
                launch(*func, *grid, stream, &mut params)?;
            }
            Launch::Gemm(g) => run_gemm(g, &self.buffers, stream)?,
        }
        cu_check("cuStreamSynchronize", stream_sync(stream))
    }

    fn alloc(&mut self, bytes: usize) -> Result<cu::CUdeviceptr> {
        let mut p: cu::CUdeviceptr = 0;
        // SAFETY: the backend's context is current; valid out-pointer; freed in Drop.
        cu_check("cuMemAlloc_v2", unsafe { cu::cuMemAlloc_v2(&mut p, bytes) })?;
        self.buffers.push(p);
        self.bytes += bytes;
        Ok(p)
    }

    /// Fills `count` 32-bit words at `p` with `bits` (on the stream, before any job).
    fn fill32(&self, p: cu::CUdeviceptr, bits: u32, count: usize) -> Result<()> {
        // SAFETY: p is our allocation of at least count 4-byte words.
        cu_check("cuMemsetD32Async", unsafe {
            cu::cuMemsetD32Async(p, bits, count, self.backend.stream())
        })
    }

    fn fill16(&self, p: cu::CUdeviceptr, bits: u16, count: usize) -> Result<()> {
        // SAFETY: p is our allocation of at least count 2-byte words.
        cu_check("cuMemsetD16Async", unsafe {
            cu::cuMemsetD16Async(p, bits, count, self.backend.stream())
        })
    }

    /// Loads the NVRTC module and returns `name` with a grid that fills the device.
    fn function(&mut self, name: &str) -> Result<(cu::CUfunction, u32)> {
        let module = match self.module.take() {
            Some(m) => m,
            None => {
                let arch = device_arch()?;
                Module::load(&cubin_for(SRC.to_string(), "isolane_synthetic.cu", arch)?)?
            }
        };
        let module = self.module.insert(module).raw();
        let cname = CString::new(name).map_err(|e| EngineError::Runtime(e.to_string()))?;
        let mut func: cu::CUfunction = std::ptr::null_mut();
        // SAFETY: the module is loaded (and kept by self); the name is NUL-terminated.
        cu_check("cuModuleGetFunction", unsafe {
            cu::cuModuleGetFunction(&mut func, module, cname.as_ptr())
        })?;
        let mut per_sm: std::ffi::c_int = 0;
        // SAFETY: func is a live kernel; no dynamic shared memory.
        cu_check("cuOccupancyMaxActiveBlocksPerMultiprocessor", unsafe {
            cu::cuOccupancyMaxActiveBlocksPerMultiprocessor(&mut per_sm, func, BLOCK as i32, 0)
        })?;
        // A grid for the whole device: in a green context the extra blocks wait for its SMs,
        // and the grid-stride loops cover every element whatever runs.
        Ok((func, device_sms()? * per_sm.max(1) as u32))
    }

    fn prepare_triad(&mut self, elems: u64) -> Result<Launch> {
        let (func, grid) = self.function("triad")?;
        let bytes = usize::try_from(elems * 4).map_err(|e| EngineError::Runtime(e.to_string()))?;
        let _a = self.alloc(bytes)?;
        let b = self.alloc(bytes)?;
        let c = self.alloc(bytes)?;
        self.fill32(b, 1.0f32.to_bits(), elems as usize)?;
        self.fill32(c, 2.0f32.to_bits(), elems as usize)?;
        Ok(Launch::Triad { func, grid, elems })
    }

    fn prepare_l2(&mut self, elems: u64, passes: u32) -> Result<Launch> {
        let (func, grid) = self.function("l2_read")?;
        let bytes = usize::try_from(elems * 4).map_err(|e| EngineError::Runtime(e.to_string()))?;
        let buf = self.alloc(bytes)?;
        let _sink = self.alloc(4)?;
        self.fill32(buf, 1.0f32.to_bits(), elems as usize)?;
        Ok(Launch::L2 {
            func,
            grid,
            n4: elems / 4,
            passes,
        })
    }

    fn prepare_gemm(&mut self, n: usize, precision: Precision) -> Result<Launch> {
        let (dt, compute, elem) = match precision {
            Precision::Fp16 => (
                lt::cudaDataType::CUDA_R_16F,
                lt::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                2,
            ),
            Precision::Bf16 => (
                lt::cudaDataType::CUDA_R_16BF,
                lt::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                2,
            ),
            Precision::Tf32 => (
                lt::cudaDataType::CUDA_R_32F,
                lt::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32,
                4,
            ),
            Precision::Fp32 => (
                lt::cudaDataType::CUDA_R_32F,
                lt::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                4,
            ),
        };
        for _ in 0..3 {
            let p = self.alloc(n * n * elem)?;
            // 0.1 in each format: sums of n of them stay finite in fp16.
            match precision {
                Precision::Fp16 => self.fill16(p, 0x2E66, n * n)?,
                Precision::Bf16 => self.fill16(p, 0x3DCD, n * n)?,
                _ => self.fill32(p, 0.1f32.to_bits(), n * n)?,
            }
        }
        // buffers[3], after A, B and C: `run_gemm` reads them in this order.
        self.alloc(GEMM_WORKSPACE)?;
        let g = gemm_plan(n, dt, compute)?;
        Ok(Launch::Gemm(Box::new(g)))
    }
}

/// The SMs of the device of the current context.
fn device_sms() -> Result<u32> {
    let mut dev: cu::CUdevice = 0;
    // SAFETY: valid out-pointer; a context is current.
    cu_check("cuCtxGetDevice", unsafe { cu::cuCtxGetDevice(&mut dev) })?;
    let mut sms = 0;
    // SAFETY: valid out-pointer and device.
    cu_check("cuDeviceGetAttribute", unsafe {
        cu::cuDeviceGetAttribute(
            &mut sms,
            cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            dev,
        )
    })?;
    Ok(sms.max(1) as u32)
}

fn launch(
    func: cu::CUfunction,
    grid: u32,
    stream: cu::CUstream,
    params: &mut [*mut c_void],
) -> Result<()> {
    // SAFETY: `params` match the kernel's signature (built next to each call from live
    // locals; the driver copies them before returning); buffers are this kernel's.
    cu_check("cuLaunchKernel", unsafe {
        cu::cuLaunchKernel(
            func,
            grid,
            1,
            1,
            BLOCK,
            1,
            1,
            0,
            stream,
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    })
}

/// cuBLASLt's handle, descriptor, one square column-major layout shared by A, B and C, and the
/// heuristic's first algorithm within [`GEMM_WORKSPACE`].
fn gemm_plan(n: usize, dt: lt::cudaDataType, compute: lt::cublasComputeType_t) -> Result<Gemm> {
    let mut g = Gemm {
        handle: CublasLt::new()?,
        desc: std::ptr::null_mut(),
        layout: std::ptr::null_mut(),
        // SAFETY: a plain C struct of integers; all zeros is a valid (unset) value.
        algo: unsafe { std::mem::zeroed() },
        workspace: 0,
    };
    // SAFETY: valid out-pointer; cuBLASLt is loaded (libs::ensure_all ran for the backend).
    lt_check("cublasLtMatmulDescCreate", unsafe {
        lt::cublasLtMatmulDescCreate(&mut g.desc, compute, lt::cudaDataType::CUDA_R_32F)
    })?;
    // SAFETY: as above; n fits i64 and u64.
    lt_check("cublasLtMatrixLayoutCreate", unsafe {
        lt::cublasLtMatrixLayoutCreate(&mut g.layout, dt, n as u64, n as u64, n as i64)
    })?;
    let (algo, workspace) = gemm_algo(&g, n)?;
    g.algo = algo;
    g.workspace = workspace;
    Ok(g)
}

fn gemm_algo(g: &Gemm, n: usize) -> Result<(lt::cublasLtMatmulAlgo_t, usize)> {
    let mut pref: lt::cublasLtMatmulPreference_t = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    lt_check("cublasLtMatmulPreferenceCreate", unsafe {
        lt::cublasLtMatmulPreferenceCreate(&mut pref)
    })?;
    let cap = GEMM_WORKSPACE as u64;
    // SAFETY: a u64, as the attribute expects.
    let set = unsafe {
        lt::cublasLtMatmulPreferenceSetAttribute(
            pref,
            lt::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
            &cap as *const u64 as *const c_void,
            8,
        )
    };
    // SAFETY: a zeroed C struct is a valid out-value.
    let mut result: lt::cublasLtMatmulHeuristicResult_t = unsafe { std::mem::zeroed() };
    let mut got = 0i32;
    // SAFETY: the descriptor and layout are complete; one result slot.
    let r = unsafe {
        lt::cublasLtMatmulAlgoGetHeuristic(
            g.handle.raw(),
            g.desc,
            g.layout,
            g.layout,
            g.layout,
            g.layout,
            pref,
            1,
            &mut result,
            &mut got,
        )
    };
    // SAFETY: created above, destroyed once.
    unsafe { lt::cublasLtMatmulPreferenceDestroy(pref) };
    lt_check("cublasLtMatmulPreferenceSetAttribute", set)?;
    lt_check("cublasLtMatmulAlgoGetHeuristic", r)?;
    if got == 0 {
        return Err(EngineError::Runtime(format!(
            "cuBLASLt offers no algorithm for {n}×{n}×{n}"
        )));
    }
    Ok((result.algo, result.workspaceSize))
}

fn run_gemm(g: &Gemm, buffers: &[cu::CUdeviceptr], stream: cu::CUstream) -> Result<()> {
    let (alpha, beta) = (1.0f32, 0.0f32);
    let [a, b, c, ws] = [buffers[0], buffers[1], buffers[2], buffers[3]];
    // SAFETY: A, B, C hold n×n elements of the layout's type, the workspace GEMM_WORKSPACE
    // ≥ g.workspace bytes; scale type f32; all on our stream.
    lt_check("cublasLtMatmul", unsafe {
        lt::cublasLtMatmul(
            g.handle.raw(),
            g.desc,
            &alpha as *const f32 as *const c_void,
            a as *const c_void,
            g.layout,
            b as *const c_void,
            g.layout,
            &beta as *const f32 as *const c_void,
            c as *const c_void,
            g.layout,
            c as *mut c_void,
            g.layout,
            &g.algo,
            ws as *mut c_void,
            g.workspace,
            stream as lt::cudaStream_t,
        )
    })
}

impl Drop for Gemm {
    fn drop(&mut self) {
        // SAFETY: each was created by gemm_plan (or is null) and is destroyed once, after the
        // owning kernel drained its stream; the handle (a field) is destroyed after them.
        unsafe {
            if !self.layout.is_null() {
                lt::cublasLtMatrixLayoutDestroy(self.layout);
            }
            if !self.desc.is_null() {
                lt::cublasLtMatmulDescDestroy(self.desc);
            }
        }
    }
}

impl Drop for SyntheticKernel {
    fn drop(&mut self) {
        if make_current(self.backend.context()).is_err() {
            return;
        }
        let _ = stream_sync(self.backend.stream());
        // The cuBLASLt objects go before the buffers they were used with.
        self.launch = Launch::Triad {
            func: std::ptr::null_mut(),
            grid: 0,
            elems: 0,
        };
        for &p in &self.buffers {
            // SAFETY: our allocation, freed once, after the stream drained.
            let _ = unsafe { cu::cuMemFree_v2(p) };
        }
        // The module (a field) unloads itself after this, with the context still current.
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backend() -> CudaBackend {
        CudaBackend::new(0).expect("needs a CUDA GPU")
    }

    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn triad_moves_its_bytes_at_a_plausible_bandwidth() {
        let elems = 64 << 20; // 3 × 256 MiB
        let mut k = backend().synthetic(Synthetic::Triad { elems }).unwrap();
        k.run().unwrap();
        let t = std::time::Instant::now();
        for _ in 0..10 {
            k.run().unwrap();
        }
        let s = t.elapsed().as_secs_f64() / 10.0;
        let gbps = (elems * 12) as f64 / s / 1e9;
        // Any GPU of this project moves between 100 GB/s and 10 TB/s.
        assert!((100.0..10_000.0).contains(&gbps), "{gbps} GB/s");
        assert_eq!(k.device_bytes(), (elems * 12) as usize);
    }

    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn gemm_and_l2_run_at_every_precision() {
        let b = backend();
        for precision in [
            Precision::Fp16,
            Precision::Bf16,
            Precision::Tf32,
            Precision::Fp32,
        ] {
            let mut k = b.synthetic(Synthetic::Gemm { n: 1024, precision }).unwrap();
            k.run().unwrap();
        }
        let mut l2 = b
            .synthetic(Synthetic::L2 {
                elems: 1 << 20,
                passes: 8,
            })
            .unwrap();
        l2.run().unwrap();
    }
}
