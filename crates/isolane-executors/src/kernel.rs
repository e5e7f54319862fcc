//! The synthetic `kernel:` workloads as executors (core's `spec::kernel` says what they are):
//! on `backend = "cuda"` the GPU kernels of `isolane_cuda::synthetic`, in the workload's green
//! context when its plan carried one (as a model is, `engine::build_cuda`); on the CPU
//! the equivalents of `isolane_engine::synthetic`, on the workload's own (pinned) thread.

use isolane_core::spec::{Backend as SpecBackend, DeviceSpec, KernelModel, WorkloadSpec};
use isolane_runtime::exec::{ExecError, Executor};

use crate::engine::{engine_err, gpu_index, precision, worker_is_urgent};

/// `Some` for a `kernel:` model; a malformed one is the user's mistake (validation catches it
/// first in a scenario file, this covers specs built in code).
pub(crate) fn parse(spec: &WorkloadSpec) -> Result<Option<KernelModel>, ExecError> {
    if !spec.model.starts_with("kernel:") {
        return Ok(None);
    }
    KernelModel::parse(&spec.model)
        .map(Some)
        .map_err(|e| ExecError::BadModel {
            workload: spec.name.clone(),
            model: spec.model.clone(),
            reason: e.to_string(),
        })
}

/// Device memory a kernel workload allocates: its buffers, and cuBLASLt's workspace for a GEMM.
pub(crate) fn device_bytes(kernel: KernelModel) -> u64 {
    let workspace = match kernel {
        KernelModel::Gemm { .. } => isolane_cuda::synthetic::GEMM_WORKSPACE as u64,
        _ => 0,
    };
    kernel.buffer_bytes() + workspace
}

/// On the CPU the buffers must fit this machine's memory (a GPU's is admission control's).
pub(crate) fn check(
    device: &DeviceSpec,
    spec: &WorkloadSpec,
    kernel: KernelModel,
) -> Result<(), ExecError> {
    if device.backend == SpecBackend::Cuda {
        return Ok(());
    }
    let need = kernel.buffer_bytes();
    match isolane_runtime::limits::host_memory_bytes() {
        Some(have) if need > have => Err(ExecError::BadModel {
            workload: spec.name.clone(),
            model: spec.model.clone(),
            reason: format!(
                "its buffers need {}, more than this machine's memory ({})",
                isolane_runtime::limits::human_bytes(u128::from(need)),
                isolane_runtime::limits::human_bytes(u128::from(have))
            ),
        }),
        _ => Ok(()),
    }
}

/// Builds the executor on the calling thread: on the GPU in `group` when given, else on a
/// stream of its own in the device's primary context.
pub(crate) fn build(
    device: &DeviceSpec,
    spec: &WorkloadSpec,
    kernel: KernelModel,
    group: Option<isolane_gpu::GreenGroup>,
) -> Result<Box<dyn Executor>, ExecError> {
    if device.backend == SpecBackend::Cpu {
        return Ok(Box::new(CpuKernelExecutor(cpu_kernel(spec, kernel)?)));
    }
    let backend = match &group {
        Some(g) => {
            g.make_current().map_err(|e| engine_err(spec, e))?;
            // SAFETY: the group (its context and stream) is moved into the executor below and
            // outlives the kernel, which is dropped first.
            unsafe { isolane_cuda::CudaBackend::with_stream(g.context(), g.stream()) }
        }
        None => isolane_cuda::CudaBackend::with_own_stream(gpu_index(device), worker_is_urgent()),
    }
    .map_err(|e| engine_err(spec, e))?;
    let kernel = backend
        .synthetic(gpu_kernel(spec, kernel)?)
        .map_err(|e| engine_err(spec, e))?;
    Ok(Box::new(GpuKernelExecutor {
        kernel,
        _group: group,
    }))
}

fn usize_of(spec: &WorkloadSpec, v: u64) -> Result<usize, ExecError> {
    usize::try_from(v).map_err(|_| engine_err(spec, "too large for this machine's address space"))
}

fn cpu_kernel(
    spec: &WorkloadSpec,
    kernel: KernelModel,
) -> Result<isolane_engine::synthetic::CpuKernel, ExecError> {
    use isolane_engine::synthetic::CpuKernel;
    Ok(match kernel {
        KernelModel::Triad { elems } => CpuKernel::triad(usize_of(spec, elems)?),
        KernelModel::Gemm { n, .. } => CpuKernel::gemm(n as usize),
        KernelModel::L2 { elems, passes } => CpuKernel::l2(usize_of(spec, elems)?, passes),
    })
}

fn gpu_kernel(
    spec: &WorkloadSpec,
    kernel: KernelModel,
) -> Result<isolane_cuda::Synthetic, ExecError> {
    use isolane_cuda::Synthetic;
    Ok(match kernel {
        KernelModel::Triad { elems } => Synthetic::Triad { elems },
        KernelModel::Gemm { n, precision: p } => Synthetic::Gemm {
            n: usize_of(spec, u64::from(n))?,
            precision: precision(p),
        },
        KernelModel::L2 { elems, passes } => Synthetic::L2 { elems, passes },
    })
}

/// A kernel on the CPU; a job is one pass of its work.
struct CpuKernelExecutor(isolane_engine::synthetic::CpuKernel);

impl Executor for CpuKernelExecutor {
    fn run_job(&mut self) -> Result<(), ExecError> {
        self.0.run();
        Ok(())
    }
}

/// A kernel on the GPU; a job is one launch and the wait for it.
struct GpuKernelExecutor {
    kernel: isolane_cuda::SyntheticKernel,
    // Declared after the kernel so that it is dropped after it: the kernel runs on its stream.
    _group: Option<isolane_gpu::GreenGroup>,
}

impl Executor for GpuKernelExecutor {
    fn run_job(&mut self) -> Result<(), ExecError> {
        self.kernel.run().map_err(|e| ExecError::Job(e.to_string()))
    }

    fn device_memory_mib(&self) -> Option<f64> {
        Some(self.kernel.device_bytes() as f64 / crate::engine::MIB as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use isolane_core::spec::{Host, Mechanism};

    fn spec(model: &str) -> WorkloadSpec {
        let text =
            format!("[[workload]]\nname = \"k\"\nmodel = \"{model}\"\nrate_hz = 10\njobs = 1\n");
        let s = isolane_core::spec::Scenario::from_toml_str(
            &text,
            "t.toml",
            &isolane_core::spec::NoBuiltinModels,
        )
        .unwrap();
        s.workloads[0].clone()
    }

    fn cpu() -> DeviceSpec {
        DeviceSpec {
            backend: SpecBackend::Cpu,
            gpu: 0,
            mechanism: Mechanism::None,
            host: Host::Thread,
            gpus: Vec::new(),
        }
    }

    #[test]
    fn each_kernel_runs_a_job_on_the_cpu() {
        for m in [
            "kernel:triad:1MiB",
            "kernel:gemm:32:fp16",
            "kernel:l2:64KiB:2",
        ] {
            let s = spec(m);
            let k = parse(&s).unwrap().unwrap();
            check(&cpu(), &s, k).unwrap();
            build(&cpu(), &s, k, None).unwrap().run_job().unwrap();
        }
        assert!(parse(&spec("spin:1ms")).unwrap().is_none());
    }

    #[test]
    fn a_gemm_reserves_the_cublaslt_workspace() {
        let k = KernelModel::parse("kernel:gemm:1024:fp16").unwrap();
        assert_eq!(
            device_bytes(k),
            3 * 1024 * 1024 * 2 + isolane_cuda::synthetic::GEMM_WORKSPACE as u64
        );
    }

    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn each_kernel_runs_a_job_on_the_gpu() {
        let device = DeviceSpec {
            backend: SpecBackend::Cuda,
            ..cpu()
        };
        for m in [
            "kernel:triad:64MiB",
            "kernel:gemm:1024:fp16",
            "kernel:l2:8MiB",
        ] {
            let s = spec(m);
            let k = parse(&s).unwrap().unwrap();
            let mut e = build(&device, &s, k, None).unwrap();
            e.run_job().unwrap();
            assert!(e.device_memory_mib().unwrap() > 1.0);
        }
    }
}
