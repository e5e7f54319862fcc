//! The exit code of a failed command, from its error and the errors it keeps as sources
//! (docs/runtime.md, Exit codes): an engine's out-of-memory anywhere in the chain 3, a user's
//! mistake 2, anything else 1. The binary calls it on the command's `anyhow` error.

use std::error::Error;

use isolane_core::exit_codes::{
    Interrupted, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OUT_OF_MEMORY, EXIT_USER,
};
use isolane_core::user_error::UserError;
use isolane_engine::{EngineError, OutOfMemory};

/// `e` and its sources, outermost first.
fn chain<'a>(e: &'a (dyn Error + 'static)) -> impl Iterator<Item = &'a (dyn Error + 'static)> {
    std::iter::successors(Some(e), |&e| e.source())
}

/// The exit code of a command that failed with `e`.
pub fn failure_code(e: &(dyn Error + 'static)) -> u8 {
    if out_of_memory(e).is_some() {
        EXIT_OUT_OF_MEMORY
    } else if chain(e).any(|c| c.is::<UserError>()) {
        EXIT_USER
    } else if chain(e).any(|c| c.is::<Interrupted>()) {
        EXIT_INTERRUPTED
    } else {
        EXIT_FAILED
    }
}

/// The engine's out-of-memory in `e`'s chain, if there is one (its hint is printed after the
/// error).
pub fn out_of_memory<'a>(e: &'a (dyn Error + 'static)) -> Option<&'a OutOfMemory> {
    chain(e).find_map(|c| match c.downcast_ref::<EngineError>()? {
        EngineError::OutOfMemory(m) => Some(m.as_ref()),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::BenchError;
    use crate::infer::InferError;
    use isolane_cuda::error::{allocating, engine, from_gpu, CudaError, Library};

    fn failed(library: Library, call: &'static str, code: i64, status: &str) -> CudaError {
        CudaError {
            library,
            call,
            code,
            status: status.into(),
            detail: None,
        }
    }

    /// The cuda backend's failures as `infer` and `bench` wrap them (the engine's error kept
    /// as the source), each to its exit code.
    #[test]
    fn a_cuda_out_of_memory_exits_3_a_library_failure_1() {
        let cases = [
            (
                failed(Library::Driver, "cuMemAlloc", 2, "CUDA_ERROR_OUT_OF_MEMORY"),
                3,
            ),
            (
                failed(
                    Library::Driver,
                    "cuMemHostAlloc",
                    2,
                    "CUDA_ERROR_OUT_OF_MEMORY",
                ),
                3,
            ),
            (
                failed(
                    Library::CublasLt,
                    "cublasLtMatmul",
                    3,
                    "CUBLAS_STATUS_ALLOC_FAILED",
                ),
                3,
            ),
            (
                failed(
                    Library::Cudnn,
                    "cudnnCreate",
                    2,
                    "CUDNN_STATUS_ALLOC_FAILED",
                ),
                3,
            ),
            (
                failed(
                    Library::Cudnn,
                    "cudnnBackendFinalize",
                    4004,
                    "CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED",
                ),
                3,
            ),
            (
                failed(
                    Library::Nvrtc,
                    "nvrtcCompileProgram",
                    1,
                    "NVRTC_ERROR_OUT_OF_MEMORY",
                ),
                3,
            ),
            (
                failed(
                    Library::Driver,
                    "cuLaunchKernel",
                    719,
                    "CUDA_ERROR_LAUNCH_FAILED",
                ),
                1,
            ),
            (
                failed(
                    Library::CublasLt,
                    "cublasLtMatmul",
                    13,
                    "CUBLAS_STATUS_EXECUTION_FAILED",
                ),
                1,
            ),
            (
                failed(
                    Library::Cudnn,
                    "cudnnBackendExecute",
                    3000,
                    "CUDNN_STATUS_NOT_SUPPORTED",
                ),
                1,
            ),
        ];
        for (cuda, code) in cases {
            let name = cuda.status.clone();
            let infer = InferError::Engine {
                model: "resnet50".into(),
                batch: Some(256),
                source: engine(cuda.clone()),
            };
            assert_eq!(failure_code(&infer), code, "infer, {name}");
            assert_eq!(out_of_memory(&infer).is_some(), code == 3, "infer, {name}");
            let bench = BenchError::Engine {
                doing: "compiling resnet50".into(),
                source: allocating(cuda, "the activation arena", 1 << 30, Some(1 << 20)),
            };
            assert_eq!(failure_code(&bench), code, "bench, {name}");
        }
        // isolane-gpu's failed driver calls (the backend's start) keep their kind too.
        let start = from_gpu(isolane_gpu::GpuError::Cuda {
            call: "cuDevicePrimaryCtxRetain",
            code: "CUDA_ERROR_OUT_OF_MEMORY".into(),
            value: 2,
        });
        assert_eq!(failure_code(&start), 3);
    }

    #[test]
    fn a_users_mistake_exits_2_and_anything_else_1() {
        assert_eq!(failure_code(&UserError("--batch 0".into())), 2);
        let runtime = BenchError::Run(EngineError::Runtime("a worker died".into()));
        assert_eq!(failure_code(&runtime), 1);
        assert!(out_of_memory(&runtime).is_none());
    }
}
