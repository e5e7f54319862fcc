//! The one checked-call layer for the CUDA libraries (the driver, cuDNN, cuBLASLt, NVRTC):
//! every call's status goes through one of [`cu_check`], [`dnn_check`], [`lt_check`],
//! [`rtc_check`], and a failure is one structured type, [`CudaError`]: which library, which
//! call, the numeric status and its name (and cuDNN's description), so a caller tells an
//! out-of-memory from a launch failure without parsing text. This crate's driver layer
//! (`driver::check`) and isolane-cuda both check through it; isolane-cuda turns a
//! `CudaError` into the engine's structured error (`isolane_cuda::error::engine`), since
//! neither this crate nor the engine depends on the other (docs/cuda.md, "Errors").

use cudarc::cublaslt::sys as lt;
use cudarc::cudnn::sys as dnn;
use cudarc::driver::sys as cu;
use cudarc::nvrtc::sys as rtc;
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
    /// A failed call without a description.
    pub fn new(library: Library, call: &'static str, code: i64, status: String) -> CudaError {
        CudaError {
            library,
            call,
            code,
            status,
            detail: None,
        }
    }

    /// Whether the call failed for want of memory.
    pub fn is_out_of_memory(&self) -> bool {
        OUT_OF_MEMORY.contains(&self.status.as_str())
    }

    /// Whether the memory it lacked is the host's (a page-locked or a library's host buffer)
    /// rather than the GPU's.
    pub fn on_host(&self) -> bool {
        self.call == "cuMemHostAlloc" || self.status.contains("HOST_ALLOCATION")
    }
}

/// Checks a driver API result.
pub fn cu_check(call: &'static str, r: cu::CUresult) -> Result<(), CudaError> {
    if r == cu::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    Err(CudaError::new(
        Library::Driver,
        call,
        r as i64,
        format!("{r:?}"),
    ))
}

/// Checks a cuDNN status (with cuDNN's description of it).
pub fn dnn_check(call: &'static str, r: dnn::cudnnStatus_t) -> Result<(), CudaError> {
    if r == dnn::cudnnStatus_t::CUDNN_STATUS_SUCCESS {
        return Ok(());
    }
    // SAFETY: cudnnGetErrorString takes any status; cuDNN is loaded (it returned `r`).
    let name = unsafe { dnn::cudnnGetErrorString(r) };
    // SAFETY: it returns a static NUL-terminated string for any status.
    let msg = unsafe { CStr::from_ptr(name) }.to_string_lossy();
    Err(CudaError {
        detail: Some(msg.into_owned()),
        ..CudaError::new(Library::Cudnn, call, r as i64, format!("{r:?}"))
    })
}

/// Checks a cuBLASLt status.
pub fn lt_check(call: &'static str, r: lt::cublasStatus_t) -> Result<(), CudaError> {
    if r == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        return Ok(());
    }
    Err(CudaError::new(
        Library::CublasLt,
        call,
        r as i64,
        format!("{r:?}"),
    ))
}

/// Checks an NVRTC result.
pub fn rtc_check(call: &'static str, r: rtc::nvrtcResult) -> Result<(), CudaError> {
    if r == rtc::nvrtcResult::NVRTC_SUCCESS {
        return Ok(());
    }
    Err(CudaError::new(
        Library::Nvrtc,
        call,
        r as i64,
        format!("{r:?}"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_call_keeps_library_call_code_and_name() {
        let e = cu_check("cuMemAlloc", cu::CUresult::CUDA_ERROR_OUT_OF_MEMORY).unwrap_err();
        assert_eq!(
            (e.library, e.call, e.code),
            (Library::Driver, "cuMemAlloc", 2)
        );
        assert_eq!(e.to_string(), "cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY");
        assert!(e.is_out_of_memory() && !e.on_host());
        assert!(cu_check("cuInit", cu::CUresult::CUDA_SUCCESS).is_ok());
        let host = cu_check("cuMemHostAlloc", cu::CUresult::CUDA_ERROR_OUT_OF_MEMORY);
        assert!(host.unwrap_err().on_host());
        let launch = cu_check("cuLaunchKernel", cu::CUresult::CUDA_ERROR_LAUNCH_FAILED);
        assert!(!launch.unwrap_err().is_out_of_memory());
        let lt = lt_check(
            "cublasLtCreate",
            lt::cublasStatus_t::CUBLAS_STATUS_ALLOC_FAILED,
        );
        let lt = lt.unwrap_err();
        assert_eq!((lt.library, lt.code), (Library::CublasLt, 3));
        assert!(lt.is_out_of_memory());
        let rtc = rtc_check(
            "nvrtcCompileProgram",
            rtc::nvrtcResult::NVRTC_ERROR_COMPILATION,
        );
        let rtc = rtc.unwrap_err();
        assert_eq!((rtc.library, rtc.code), (Library::Nvrtc, 6));
        assert_eq!(
            rtc.to_string(),
            "nvrtcCompileProgram: NVRTC_ERROR_COMPILATION"
        );
    }

    #[test]
    fn the_driver_layers_error_is_the_same_call_error() {
        let r = cu::CUresult::CUDA_ERROR_INVALID_VALUE;
        let g = crate::driver::check("cuGreenCtxCreate", r).unwrap_err();
        assert_eq!(
            g.to_string(),
            "cuGreenCtxCreate failed: CUDA_ERROR_INVALID_VALUE"
        );
        assert_eq!(
            g.call_error(),
            Some(cu_check("cuGreenCtxCreate", r).unwrap_err())
        );
        assert_eq!(crate::GpuError::NoDevice("none".into()).call_error(), None);
    }
}
