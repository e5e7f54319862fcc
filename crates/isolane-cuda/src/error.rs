//! A failed CUDA library call at the crate boundary. The calls are checked by isolane-gpu's
//! checked-call layer (`isolane_gpu::call`), whose one structured failure, [`CudaError`]
//! (which library, which call, the status code and its name), this crate also uses; here it
//! becomes the engine's structured error, never a string ([`engine`]): an allocation failure
//! `EngineError::OutOfMemory`, any other status `EngineError::Library` with the same library,
//! call, code and name. The conversion is a function rather than a `From`: neither the error
//! type nor `EngineError` is this crate's (docs/cuda.md, "Errors"). The checks below are the
//! layer's, returning the engine's error, for code that returns the engine's `Result`; code
//! that keeps the call's error (the cuDNN graph builder, the matmul check) calls
//! `isolane_gpu::call`'s directly. The driver calls isolane-gpu makes for this crate
//! (initialising, finding the device, its context) cross the boundary the same way
//! ([`from_gpu`]).

use cudarc::cublaslt::sys as lt;
use cudarc::cudnn::sys as dnn;
use cudarc::driver::sys as cu;
use cudarc::nvrtc::sys as rtc;
use isolane_engine::{EngineError, LibraryFailure, OutOfMemory};
use isolane_gpu::call;
pub use isolane_gpu::call::{CudaError, Library};
use isolane_gpu::GpuError;

/// The call as the engine's structured failure.
pub fn failure(e: &CudaError) -> LibraryFailure {
    LibraryFailure {
        library: e.library.name(),
        call: e.call,
        code: e.code,
        status: e.status.clone(),
        detail: e.detail.clone(),
        node: None,
    }
}

/// The engine's error for a failed call: an out-of-memory where the status says the
/// allocation did not fit, the library failure itself otherwise.
pub fn engine(e: CudaError) -> EngineError {
    if e.is_out_of_memory() {
        oom_of(&e).into()
    } else {
        failure(&e).into()
    }
}

/// The engine's error for an allocation of `bytes` (`what`) that the call `e` refused: an
/// out-of-memory with the bytes asked and free (`free`, where known), or, for another
/// status, the library failure itself.
pub fn allocating(e: CudaError, what: &str, bytes: u64, free: Option<u64>) -> EngineError {
    if !e.is_out_of_memory() {
        return engine(e);
    }
    EngineError::from(OutOfMemory {
        what: what.to_string(),
        requested_bytes: Some(bytes),
        free_bytes: free,
        ..oom_of(&e)
    })
}

fn oom_of(e: &CudaError) -> OutOfMemory {
    OutOfMemory {
        what: match e.library {
            Library::Driver => "an allocation".into(),
            l => format!("{}'s allocation", l.name()),
        },
        memory: if e.on_host() {
            "host memory".into()
        } else {
            "the GPU's memory".into()
        },
        requested_bytes: None,
        free_bytes: None,
        reported_by: Some(failure(e)),
    }
}

/// The engine's error for a failure of isolane-gpu's driver layer: a failed call is the same
/// structured error as this crate's own calls ([`engine`]), a device index that does not
/// exist the caller's mistake, and no usable GPU (no library, no device) a runtime failure
/// with isolane-gpu's message.
pub fn from_gpu(e: GpuError) -> EngineError {
    if let Some(c) = e.call_error() {
        return engine(c);
    }
    if e.is_user_error() {
        return EngineError::InvalidArgument(e.to_string());
    }
    EngineError::Runtime(e.to_string())
}

/// Checks a driver API result ([`call::cu_check`], failing with the engine's error).
pub fn cu_check(name: &'static str, r: cu::CUresult) -> Result<(), EngineError> {
    call::cu_check(name, r).map_err(engine)
}

/// Checks a cuDNN status ([`call::dnn_check`], failing with the engine's error).
pub fn dnn_check(name: &'static str, r: dnn::cudnnStatus_t) -> Result<(), EngineError> {
    call::dnn_check(name, r).map_err(engine)
}

/// Checks a cuBLASLt status ([`call::lt_check`], failing with the engine's error).
pub fn lt_check(name: &'static str, r: lt::cublasStatus_t) -> Result<(), EngineError> {
    call::lt_check(name, r).map_err(engine)
}

/// Checks an NVRTC result ([`call::rtc_check`], failing with the engine's error).
pub fn rtc_check(name: &'static str, r: rtc::nvrtcResult) -> Result<(), EngineError> {
    call::rtc_check(name, r).map_err(engine)
}

#[cfg(test)]
mod tests {
    use super::*;
    use isolane_engine::ErrorKind;

    #[test]
    fn a_failed_call_keeps_library_call_and_code_and_reads_as_before() {
        let e = call::cu_check("cuMemAlloc", cu::CUresult::CUDA_ERROR_OUT_OF_MEMORY).unwrap_err();
        assert_eq!(e.library, Library::Driver);
        assert_eq!(e.call, "cuMemAlloc");
        assert_eq!(e.code, 2);
        assert_eq!(e.to_string(), "cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY");
        // This crate's check fails with the engine's error for the same call.
        let checked = cu_check("cuMemAlloc", cu::CUresult::CUDA_ERROR_OUT_OF_MEMORY).unwrap_err();
        assert_eq!(checked.to_string(), engine(e.clone()).to_string());
        let engine = engine(e);
        assert_eq!(engine.kind(), ErrorKind::OutOfMemory);
        assert_eq!(
            engine.to_string(),
            "out of memory: an allocation of the GPU's memory \
             (cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY)"
        );
        assert!(cu_check("cuInit", cu::CUresult::CUDA_SUCCESS).is_ok());
        let lt = call::lt_check(
            "cublasLtCreate",
            lt::cublasStatus_t::CUBLAS_STATUS_NOT_INITIALIZED,
        )
        .unwrap_err();
        assert_eq!((lt.library, lt.code), (Library::CublasLt, 1));
        assert_eq!(
            lt.to_string(),
            "cublasLtCreate: CUBLAS_STATUS_NOT_INITIALIZED"
        );
        let rtc = call::rtc_check(
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
        CudaError::new(library, call, code, status.to_string())
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
            let EngineError::OutOfMemory(m) = engine(e.clone()) else {
                panic!("{name} did not become OutOfMemory");
            };
            assert_eq!(m.memory, format!("{memory} memory"), "{name}");
            let f = m.reported_by.expect("the call that refused");
            assert_eq!((f.library, f.call, f.code), (library.name(), call, code));
            assert_eq!(f.status, name);
            // At an allocation site the bytes asked and free are kept.
            let EngineError::OutOfMemory(m) =
                allocating(e.clone(), "the activation arena", 5 << 30, Some(1 << 30))
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
            let engine = engine(e.clone());
            assert_eq!(engine.kind(), ErrorKind::Library, "{name}");
            let EngineError::Library(f) = &engine else {
                unreachable!()
            };
            assert_eq!(f.library, library.name());
            assert_eq!((f.call, f.code, f.status.as_str()), (call, code, name));
            assert_eq!(f.detail.as_deref(), Some("said the library"));
            assert_eq!(engine.to_string(), e.to_string());
            // Not an out-of-memory, even at an allocation site.
            assert_eq!(
                allocating(e.clone(), "x", 1, None).kind(),
                ErrorKind::Library
            );
        }
    }
}
