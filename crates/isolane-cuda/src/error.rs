//! A failed CUDA library call, kept as data: which library, which call, and the status code
//! it returned (with the library's name for it), so callers can tell an out-of-memory from a
//! launch failure without parsing text. It becomes the engine's `EngineError::Runtime` at the
//! crate boundary with the same text as before.

use cudarc::cublaslt::sys as lt;
use cudarc::cudnn::sys as dnn;
use cudarc::driver::sys as cu;
use cudarc::nvrtc::sys as rtc;
use isolane_engine::EngineError;
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

impl From<CudaError> for EngineError {
    fn from(e: CudaError) -> Self {
        EngineError::Runtime(e.to_string())
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

    #[test]
    fn a_failed_call_keeps_library_call_and_code_and_reads_as_before() {
        let e = cu_check("cuMemAlloc", cu::CUresult::CUDA_ERROR_OUT_OF_MEMORY).unwrap_err();
        assert_eq!(e.library, Library::Driver);
        assert_eq!(e.call, "cuMemAlloc");
        assert_eq!(e.code, 2);
        assert_eq!(e.to_string(), "cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY");
        let engine: EngineError = e.into();
        assert_eq!(
            engine.to_string(),
            "runtime error: cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY"
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
}
