//! Owned CUDA handles (in the style of cudarc's `result` layer): each destroys its handle once,
//! in `Drop`, so that a model cannot leak or double-free one on any path, failed builds
//! included. Drops need the handle's context current; [`crate::CudaModel`] makes it so before
//! its fields drop.

use std::ffi::c_void;

use cudarc::cublaslt::sys as lt;
use cudarc::cudnn::sys as dnn;
use cudarc::driver::sys as cu;
use isolane_engine::Result;

use crate::error::{allocating, cu_check, dnn_check, lt_check};

/// A cuBLASLt matmul's descriptor and its A, B and D layouts (C shares D's), as the library's
/// calls take them.
pub(crate) type LtMatmulDescs = (
    lt::cublasLtMatmulDesc_t,
    lt::cublasLtMatrixLayout_t,
    lt::cublasLtMatrixLayout_t,
    lt::cublasLtMatrixLayout_t,
);

/// The workspace cuBLASLt's `algo` needs for `descs`, or cuBLASLt's error where it cannot run
/// them (`cublasLtMatmulAlgoCheck`).
pub(crate) fn algo_workspace(
    handle: lt::cublasLtHandle_t,
    (desc, a, b, d): LtMatmulDescs,
    algo: &lt::cublasLtMatmulAlgo_t,
) -> Result<usize> {
    // SAFETY: an all-zero heuristic result is a valid plain C struct for cuBLASLt to fill.
    let mut result: lt::cublasLtMatmulHeuristicResult_t = unsafe { std::mem::zeroed() };
    // SAFETY: the descriptors are complete and live; `algo` and `result` are valid pointers.
    lt_check("cublasLtMatmulAlgoCheck", unsafe {
        lt::cublasLtMatmulAlgoCheck(handle, desc, a, b, d, d, algo, &mut result)
    })?;
    Ok(result.workspaceSize)
}

/// Free bytes of the current context's device, for an out-of-memory's message (`None` when
/// the driver cannot say).
pub(crate) fn device_free_bytes() -> Option<u64> {
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: valid out-pointers, a context is current.
    let r = unsafe { cu::cuMemGetInfo_v2(&mut free, &mut total) };
    (r == cu::CUresult::CUDA_SUCCESS).then_some(free as u64)
}

/// A span of device memory: its address and its size in bytes. It owns nothing: a view of a
/// [`DeviceBuffer`] or of part of one (a model's weights and arena share one allocation).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct DeviceSpan {
    ptr: u64,
    bytes: usize,
}

impl DeviceSpan {
    /// No memory (a workspace no algorithm needs, a model before its upload).
    pub(crate) const EMPTY: DeviceSpan = DeviceSpan { ptr: 0, bytes: 0 };

    /// `bytes` of device memory at `ptr`, which the caller knows to be allocated.
    pub(crate) fn new(ptr: u64, bytes: usize) -> DeviceSpan {
        DeviceSpan { ptr, bytes }
    }

    pub(crate) fn ptr(self) -> u64 {
        self.ptr
    }

    pub(crate) fn bytes(self) -> usize {
        self.bytes
    }

    /// The `bytes` at `offset` in this span, or `None` where they would reach past its end.
    pub(crate) fn slice(self, offset: usize, bytes: usize) -> Option<DeviceSpan> {
        let end = offset.checked_add(bytes)?;
        (end <= self.bytes).then_some(DeviceSpan {
            ptr: self.ptr + offset as u64,
            bytes,
        })
    }
}

/// A device allocation of `bytes` (256 at least, as the driver is asked for), freed when
/// dropped (with its context current, as while building).
pub(crate) struct DeviceBuffer {
    pub(crate) ptr: u64,
    bytes: usize,
}

impl DeviceBuffer {
    /// An allocation in the current context; the driver's refusal is an out-of-memory with
    /// the bytes asked and free.
    pub(crate) fn new(bytes: usize) -> Result<DeviceBuffer> {
        let mut p: cu::CUdeviceptr = 0;
        // SAFETY: valid out-pointer, a context is current (set by the caller).
        isolane_gpu::call::cu_check("cuMemAlloc", unsafe {
            cu::cuMemAlloc_v2(&mut p, bytes.max(256))
        })
        .map_err(|e| allocating(e, "a device buffer", bytes as u64, device_free_bytes()))?;
        Ok(DeviceBuffer { ptr: p, bytes })
    }

    /// An allocation of `bytes` set to zero.
    pub(crate) fn zeroed(bytes: usize) -> Result<DeviceBuffer> {
        let b = DeviceBuffer::new(bytes)?;
        dev_zero(b.span())?;
        Ok(b)
    }

    /// The whole allocation, as asked for.
    pub(crate) fn span(&self) -> DeviceSpan {
        DeviceSpan::new(self.ptr, self.bytes)
    }
}

/// Sets the span's device memory to zero and waits for it.
pub(crate) fn dev_zero(span: DeviceSpan) -> Result<()> {
    if span.bytes == 0 {
        return Ok(());
    }
    // SAFETY: the span is allocated device memory of the current context (the caller's
    // allocation); the synchronisation below ends the memset before anything else reads it.
    cu_check("cuMemsetD8", unsafe {
        cu::cuMemsetD8_v2(span.ptr, 0, span.bytes)
    })?;
    // SAFETY: a context is current.
    cu_check("cuCtxSynchronize", unsafe { cu::cuCtxSynchronize() })?;
    Ok(())
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemAlloc in `new`, freed once, here; nothing reads it after
        // its owner drops it.
        unsafe { cu::cuMemFree_v2(self.ptr) };
    }
}

/// A captured CUDA graph and its executable instance.
pub(crate) struct CapturedGraph {
    graph: cu::CUgraph,
    exec: cu::CUgraphExec,
}

impl CapturedGraph {
    /// Takes ownership of a graph and its instance (both live, created by the caller).
    pub(crate) fn new(graph: cu::CUgraph, exec: cu::CUgraphExec) -> CapturedGraph {
        CapturedGraph { graph, exec }
    }

    pub(crate) fn exec(&self) -> cu::CUgraphExec {
        self.exec
    }
}

impl Drop for CapturedGraph {
    fn drop(&mut self) {
        // SAFETY: owned, destroyed once; the instance before the graph it was made from.
        unsafe {
            cu::cuGraphExecDestroy(self.exec);
        }
        // SAFETY: as above.
        unsafe {
            cu::cuGraphDestroy(self.graph);
        }
    }
}

/// A loaded module (the NVRTC kernels).
pub(crate) struct Module(cu::CUmodule);

impl Module {
    /// Loads a cubin image for the current context.
    pub(crate) fn load(cubin: &[u8]) -> Result<Module> {
        let mut m: cu::CUmodule = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the caller passes a complete ELF image produced by NVRTC
        // for this device's arch.
        cu_check("cuModuleLoadData", unsafe {
            cu::cuModuleLoadData(&mut m, cubin.as_ptr() as *const c_void)
        })?;
        Ok(Module(m))
    }

    pub(crate) fn raw(&self) -> cu::CUmodule {
        self.0
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        // SAFETY: loaded in `load`, unloaded once.
        unsafe {
            cu::cuModuleUnload(self.0);
        }
    }
}

/// A cuDNN handle bound to a stream.
pub(crate) struct Cudnn(dnn::cudnnHandle_t);

impl Cudnn {
    pub(crate) fn new(stream: cu::CUstream) -> Result<Cudnn> {
        let mut h: dnn::cudnnHandle_t = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the context is current.
        dnn_check("cudnnCreate", unsafe { dnn::cudnnCreate(&mut h) })?;
        let owned = Cudnn(h);
        // SAFETY: h is live; every cuDNN launch then goes to the caller's stream (and so into
        // its green context).
        dnn_check("cudnnSetStream", unsafe {
            dnn::cudnnSetStream(h, stream as dnn::cudaStream_t)
        })?;
        Ok(owned)
    }

    pub(crate) fn raw(&self) -> dnn::cudnnHandle_t {
        self.0
    }
}

impl Drop for Cudnn {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once.
        unsafe {
            dnn::cudnnDestroy(self.0);
        }
    }
}

/// A cuBLASLt handle.
pub(crate) struct CublasLt(lt::cublasLtHandle_t);

impl CublasLt {
    pub(crate) fn new() -> Result<CublasLt> {
        let mut h: lt::cublasLtHandle_t = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the context is current.
        lt_check("cublasLtCreate", unsafe { lt::cublasLtCreate(&mut h) })?;
        Ok(CublasLt(h))
    }

    pub(crate) fn raw(&self) -> lt::cublasLtHandle_t {
        self.0
    }
}

impl Drop for CublasLt {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once.
        unsafe {
            lt::cublasLtDestroy(self.0);
        }
    }
}

/// Page-locked host memory for `len` f32s, zeroed, usable from any context (a model may run
/// from a thread whose current context is a green context).
pub(crate) struct PinnedF32 {
    ptr: *mut f32,
    len: usize,
}

impl PinnedF32 {
    pub(crate) fn new(len: usize) -> Result<PinnedF32> {
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid out-pointer; a context is current.
        isolane_gpu::call::cu_check("cuMemHostAlloc", unsafe {
            cu::cuMemHostAlloc(&mut p, (len * 4).max(4), cu::CU_MEMHOSTALLOC_PORTABLE)
        })
        .map_err(|e| {
            allocating(
                e,
                "a page-locked input or output buffer",
                len as u64 * 4,
                None,
            )
        })?;
        // SAFETY: freshly allocated, at least len f32s long; zeroed so the first read is
        // defined.
        unsafe { std::ptr::write_bytes(p as *mut f32, 0, len) };
        Ok(PinnedF32 {
            ptr: p as *mut f32,
            len,
        })
    }

    pub(crate) fn ptr(&self) -> *mut f32 {
        self.ptr
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn as_slice(&self) -> &[f32] {
        // SAFETY: len f32s owned by self. The GPU writes an output buffer only inside a job,
        // which needs `&mut` of the model that owns it, so no write overlaps this borrow.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [f32] {
        // SAFETY: len f32s owned by self; `&mut self` makes the borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for PinnedF32 {
    fn drop(&mut self) {
        // SAFETY: allocated in `new`, freed once.
        unsafe {
            cu::cuMemFreeHost(self.ptr as *mut c_void);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use isolane_engine::EngineError;

    #[test]
    fn a_span_slices_only_inside_itself() {
        let s = DeviceSpan::new(0x1000, 512);
        assert_eq!(s.slice(0, 512), Some(s));
        assert_eq!(s.slice(256, 256), Some(DeviceSpan::new(0x1100, 256)));
        assert_eq!(s.slice(512, 0), Some(DeviceSpan::new(0x1200, 0)));
        assert_eq!(s.slice(256, 257), None);
        assert_eq!(s.slice(513, 0), None);
        assert_eq!(s.slice(usize::MAX, 2), None);
        assert_eq!(DeviceSpan::EMPTY.slice(0, 1), None);
    }

    /// What the driver answers a device allocation no GPU holds: an out-of-memory with the
    /// bytes asked and the device's free bytes, and the call that refused it.
    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn an_allocation_beyond_the_gpu_is_out_of_memory_with_bytes_asked_and_free() {
        let backend = crate::CudaBackend::new(0).expect("needs a CUDA GPU");
        crate::model::make_current(backend.context()).unwrap();
        let asked = 1usize << 50; // 1 PiB
        let e = DeviceBuffer::new(asked).err().expect("1 PiB allocated");
        let EngineError::OutOfMemory(m) = &e else {
            panic!("not an out-of-memory: {e}");
        };
        assert_eq!(m.requested_bytes, Some(1 << 50));
        assert!(m.free_bytes.is_some_and(|f| f > 0), "{e}");
        assert_eq!(m.memory, "the GPU's memory");
        let by = m.reported_by.as_ref().expect("the refusing call");
        assert_eq!(
            (by.call, by.status.as_str()),
            ("cuMemAlloc", "CUDA_ERROR_OUT_OF_MEMORY")
        );
        // A later allocation still works: the failure left the context usable.
        let ok = DeviceBuffer::new(1 << 20).expect("1 MiB after the failure");
        drop(ok);
    }
}
