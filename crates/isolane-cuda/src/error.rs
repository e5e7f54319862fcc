//! A failed CUDA library call, kept as data: which library, which call, and the status code
//! it returned (with the library's name for it), so callers can tell an out-of-memory from a
//! launch failure without parsing text. At the crate boundary it becomes the engine's
//! structured error, never a string: an allocation failure `EngineError::OutOfMemory`, any
//! other status `EngineError::Library` with the same library, call, code and name. The driver
//! calls isolane-gpu makes for this crate (initialising, finding the device, its context)
//! cross the boundary the same way ([`from_gpu`]).

use cudarc::cublaslt::sys as lt;
use cudarc::cudnn::sys as dnn;
use cudarc::driver::sys as cu;
use cudarc::nvrtc::sys as rtc;
use isolane_engine::{EngineError, LibraryFailure, OutOfMemory};
use isolane_gpu::GpuError;
use std::ffi::CStr;

/// The CUDA library a call belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Library {
    Driver,
    Cudnn,
    CublasLt,
    Nvrtc,
}

/// A CUDA library call that did not succeed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{call}: {status}{}", .detail.as_ref().map(|d| format!(" ({d})")).unwrap_or_default())]
pub struct CudaError {
    pub library: Library,
    /// The function called, e.g. `cuMemAlloc`.
    pub call: &'static str,
    /// The numeric status the call returned.
    pub code: i64,
    /// The status's name in the library's headers, e.g. `CUDA_ERROR_OUT_OF_MEMORY`.
    pub status: String,
    /// The library's own description of the status, where it has one (cuDNN).
    pub detail: Option<String>,
}

impl Library {
    /// The library's name as its users write it.
    pub fn name(self) -> &'static str {
        match self {
            Library::Driver => "CUDA driver",
            Library::Cudnn => "cuDNN",
            Library::CublasLt => "cuBLASLt",
            Library::Nvrtc => "NVRTC",
        }
    }
}

/// Statuses that mean an allocation did not fit, by the name each library gives them (cuDNN
/// 9 splits its ALLOC_FAILED into a host and a device one; `cudaErrorMemoryAllocation` is the
/// runtime API's name, for a call that reports it).
const OUT_OF_MEMORY: &[&str] = &[
    "CUDA_ERROR_OUT_OF_MEMORY",
    "cudaErrorMemoryAllocation",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED",
    "CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED",
    "NVRTC_ERROR_OUT_OF_MEMORY",
];

impl CudaError {
    /// Whether the call failed for want of memory.
    pub fn is_out_of_memory(&self) -> bool {
        OUT_OF_MEMORY.contains(&self.status.as_str())
    }

    /// Whether the memory it lacked is the host's (a page-locked or a library's host buffer)
    /// rather than the GPU's.
    fn host_memory(&self) -> bool {
        self.call == "cuMemHostAlloc" || self.status.contains("HOST_ALLOCATION")
    }

    /// The call as the engine's structured failure.
    pub fn failure(&self) -> LibraryFailure {
        LibraryFailure {
            library: self.library.name(),
            call: self.call,
            code: self.code,
            status: self.status.clone(),
            detail: self.detail.clone(),
            node: None,
        }
    }

    /// The engine's error for an allocation of `bytes` (`what`) that this call refused: an
    /// out-of-memory with the bytes asked and free (`free`, where known), or, for another
    /// status, the library failure itself.
    pub fn allocating(self, what: &str, bytes: u64, free: Option<u64>) -> EngineError {
        if !self.is_out_of_memory() {
            return self.into();
        }
        EngineError::from(OutOfMemory {
            what: what.to_string(),
            requested_bytes: Some(bytes),
            free_bytes: free,
            ..oom_of(&self)
        })
    }
}

fn oom_of(e: &CudaError) -> OutOfMemory {
    OutOfMemory {
        what: match e.library {
            Library::Driver => "an allocation".into(),
            l => format!("{}'s allocation", l.name()),
        },
        memory: if e.host_memory() {
            "host memory".into()
        } else {
            "the GPU's memory".into()
        },
        requested_bytes: None,
        free_bytes: None,
        reported_by: Some(e.failure()),
    }
}

impl From<CudaError> for EngineError {
    fn from(e: CudaError) -> Self {
        if e.is_out_of_memory() {
            oom_of(&e).into()
        } else {
            e.failure().into()
        }
    }
}

/// The engine's error for a failure of isolane-gpu's driver layer: a failed call is the same
/// structured error as this crate's own calls ([`CudaError`]'s conversion), a device index
/// that does not exist the caller's mistake, and no usable GPU (no library, no device) a
/// runtime failure with isolane-gpu's message.
pub fn from_gpu(e: GpuError) -> EngineError {
    match e {
        GpuError::Cuda { call, code, value } => failed(Library::Driver, call, value, code).into(),
        e if e.is_user_error() => EngineError::InvalidArgument(e.to_string()),
        e => EngineError::Runtime(e.to_string()),
    }
}

fn failed(library: Library, call: &'static str, code: i64, status: String) -> CudaError {
    CudaError {
        library,
        call,
        code,
        status,
        detail: None,
    }
}

/// Checks a driver API result.
pub fn cu_check(call: &'static str, r: cu::CUresult) -> Result<(), CudaError> {
    if r == cu::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    Err(failed(Library::Driver, call, r as i64, format!("{r:?}")))
}

/// Checks a cuDNN status (with cuDNN's description of it).
pub fn dnn_check(call: &'static str, r: dnn::cudnnStatus_t) -> Result<(), CudaError> {
    if r == dnn::cudnnStatus_t::CUDNN_STATUS_SUCCESS {
        return Ok(());
    }
    // SAFETY: cudnnGetErrorString returns a static NUL-terminated string for any status.
    let msg = unsafe { CStr::from_ptr(dnn::cudnnGetErrorString(r)) }.to_string_lossy();
    Err(CudaError {
        detail: Some(msg.into_owned()),
        ..failed(Library::Cudnn, call, r as i64, format!("{r:?}"))
    })
}

/// Checks a cuBLASLt status.
pub fn lt_check(call: &'static str, r: lt::cublasStatus_t) -> Result<(), CudaError> {
    if r == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        return Ok(());
    }
    Err(failed(Library::CublasLt, call, r as i64, format!("{r:?}")))
}

/// Checks an NVRTC result.
pub fn rtc_check(call: &'static str, r: rtc::nvrtcResult) -> Result<(), CudaError> {
    if r == rtc::nvrtcResult::NVRTC_SUCCESS {
        return Ok(());
    }
    Err(failed(Library::Nvrtc, call, r as i64, format!("{r:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use isolane_engine::ErrorKind;

    #[test]
    fn a_failed_call_keeps_library_call_and_code_and_reads_as_before() {
        let e = cu_check("cuMemAlloc", cu::CUresult::CUDA_ERROR_OUT_OF_MEMORY).unwrap_err();
        assert_eq!(e.library, Library::Driver);
        assert_eq!(e.call, "cuMemAlloc");
        assert_eq!(e.code, 2);
        assert_eq!(e.to_string(), "cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY");
        let engine: EngineError = e.into();
        assert_eq!(engine.kind(), ErrorKind::OutOfMemory);
        assert_eq!(
            engine.to_string(),
            "out of memory: an allocation of the GPU's memory \
             (cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY)"
        );
        assert!(cu_check("cuInit", cu::CUresult::CUDA_SUCCESS).is_ok());
        let lt = lt_check(
            "cublasLtCreate",
            lt::cublasStatus_t::CUBLAS_STATUS_NOT_INITIALIZED,
        )
        .unwrap_err();
        assert_eq!((lt.library, lt.code), (Library::CublasLt, 1));
        assert_eq!(
            lt.to_string(),
            "cublasLtCreate: CUBLAS_STATUS_NOT_INITIALIZED"
        );
        let rtc = rtc_check(
            "nvrtcCompileProgram",
            rtc::nvrtcResult::NVRTC_ERROR_COMPILATION,
        )
        .unwrap_err();
        assert_eq!((rtc.library, rtc.code), (Library::Nvrtc, 6));
    }

    #[test]
    fn isolane_gpus_failed_driver_calls_keep_their_structure_across_the_boundary() {
        let oom = from_gpu(GpuError::Cuda {
            call: "cuDevicePrimaryCtxRetain",
            code: "CUDA_ERROR_OUT_OF_MEMORY".into(),
            value: 2,
        });
        let EngineError::OutOfMemory(m) = &oom else {
            panic!("not an out-of-memory: {oom}");
        };
        let f = m.reported_by.as_ref().expect("the refusing call");
        assert_eq!(
            (f.library, f.call, f.code, f.status.as_str()),
            (
                "CUDA driver",
                "cuDevicePrimaryCtxRetain",
                2,
                "CUDA_ERROR_OUT_OF_MEMORY"
            )
        );
        let failed = from_gpu(GpuError::Cuda {
            call: "cuInit",
            code: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH".into(),
            value: 803,
        });
        assert_eq!(failed.kind(), ErrorKind::Library);
        assert_eq!(
            failed.to_string(),
            "cuInit: CUDA_ERROR_SYSTEM_DRIVER_MISMATCH"
        );
        let index = from_gpu(GpuError::DeviceIndex { index: 3, count: 1 });
        assert_eq!(index.kind(), ErrorKind::InvalidArgument);
        assert!(
            index.to_string().contains("GPU 3 does not exist"),
            "{index}"
        );
        let none = from_gpu(GpuError::NoDevice("no device".into()));
        assert_eq!(none.kind(), ErrorKind::Runtime);
    }

    fn status(library: Library, call: &'static str, code: i64, status: &str) -> CudaError {
        failed(library, call, code, status.to_string())
    }

    #[test]
    fn every_libraries_allocation_failure_becomes_out_of_memory() {
        for (library, call, code, name, memory) in [
            (
                Library::Driver,
                "cuMemAlloc",
                2,
                "CUDA_ERROR_OUT_OF_MEMORY",
                "the GPU's",
            ),
            (
                Library::Driver,
                "cuMemHostAlloc",
                2,
                "CUDA_ERROR_OUT_OF_MEMORY",
                "host",
            ),
            (
                Library::Driver,
                "cudaMalloc",
                2,
                "cudaErrorMemoryAllocation",
                "the GPU's",
            ),
            (
                Library::CublasLt,
                "cublasLtMatmul",
                3,
                "CUBLAS_STATUS_ALLOC_FAILED",
                "the GPU's",
            ),
            (
                Library::Cudnn,
                "cudnnBackendFinalize",
                4004,
                "CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED",
                "the GPU's",
            ),
            (
                Library::Cudnn,
                "cudnnCreate",
                4003,
                "CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED",
                "host",
            ),
            (
                Library::Cudnn,
                "cudnnCreate",
                2,
                "CUDNN_STATUS_ALLOC_FAILED",
                "the GPU's",
            ),
            (
                Library::Nvrtc,
                "nvrtcCompileProgram",
                1,
                "NVRTC_ERROR_OUT_OF_MEMORY",
                "the GPU's",
            ),
        ] {
            let e = status(library, call, code, name);
            assert!(e.is_out_of_memory(), "{name}");
            let EngineError::OutOfMemory(m) = EngineError::from(e.clone()) else {
                panic!("{name} did not become OutOfMemory");
            };
            assert_eq!(m.memory, format!("{memory} memory"), "{name}");
            let f = m.reported_by.expect("the call that refused");
            assert_eq!((f.library, f.call, f.code), (library.name(), call, code));
            assert_eq!(f.status, name);
            // At an allocation site the bytes asked and free are kept.
            let EngineError::OutOfMemory(m) =
                e.allocating("the activation arena", 5 << 30, Some(1 << 30))
            else {
                panic!("{name} at an allocation did not become OutOfMemory");
            };
            assert_eq!(m.what, "the activation arena");
            assert_eq!(
                (m.requested_bytes, m.free_bytes),
                (Some(5 << 30), Some(1 << 30))
            );
        }
    }

    #[test]
    fn any_other_status_stays_a_library_failure_with_its_call() {
        for (library, call, code, name) in [
            (
                Library::Driver,
                "cuLaunchKernel",
                719,
                "CUDA_ERROR_LAUNCH_FAILED",
            ),
            (
                Library::Driver,
                "cuModuleLoadData",
                209,
                "CUDA_ERROR_NO_BINARY_FOR_GPU",
            ),
            (
                Library::CublasLt,
                "cublasLtMatmul",
                13,
                "CUBLAS_STATUS_EXECUTION_FAILED",
            ),
            (
                Library::Cudnn,
                "cudnnBackendExecute",
                3000,
                "CUDNN_STATUS_NOT_SUPPORTED",
            ),
            (
                Library::Nvrtc,
                "nvrtcCompileProgram",
                6,
                "NVRTC_ERROR_COMPILATION",
            ),
        ] {
            let e = CudaError {
                detail: Some("said the library".into()),
                ..status(library, call, code, name)
            };
            assert!(!e.is_out_of_memory(), "{name}");
            let engine = EngineError::from(e.clone());
            assert_eq!(engine.kind(), ErrorKind::Library, "{name}");
            let EngineError::Library(f) = &engine else {
                unreachable!()
            };
            assert_eq!(f.library, library.name());
            assert_eq!((f.call, f.code, f.status.as_str()), (call, code, name));
            assert_eq!(f.detail.as_deref(), Some("said the library"));
            assert_eq!(engine.to_string(), e.to_string());
            // Not an out-of-memory, even at an allocation site.
            assert_eq!(e.allocating("x", 1, None).kind(), ErrorKind::Library);
        }
    }
}
