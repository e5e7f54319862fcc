//! One error type for the crate. Every GPU failure names the call that failed and the error's
//! name as the driver spells it (docs/design.md, "Conventions"), e.g.
//! `cuGreenCtxCreate failed: CUDA_ERROR_INVALID_VALUE`.

use std::path::PathBuf;

use isolane_core::admission::Rejection;

pub type Result<T, E = GpuError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// A shared library (libcuda, libnvrtc, libnvidia-ml) is not installed where we looked.
    #[error("{library} not found (searched: {}); {hint}", searched.join(", "))]
    LibraryNotFound {
        library: String,
        searched: Vec<String>,
        hint: String,
    },
    /// The driver is there but lacks a function this build needs (driver too old).
    #[error("{library} has no {symbol}: {hint}")]
    MissingSymbol {
        library: String,
        symbol: String,
        hint: String,
    },
    /// A driver call that failed: its name, the result's name and its number.
    #[error("{call} failed: {code}")]
    Cuda {
        call: &'static str,
        code: String,
        value: i64,
    },
    #[error("NVRTC could not compile the probe kernel: {0}")]
    Nvrtc(String),
    #[error("{call} failed: {error}")]
    Nvml { call: &'static str, error: String },
    #[error("no CUDA device: {0}")]
    NoDevice(String),
    #[error("GPU {index} does not exist ({count} CUDA device(s) visible)")]
    DeviceIndex { index: u32, count: u32 },
    /// A green-context request that cannot be satisfied before any call is made.
    #[error("green contexts: {0}")]
    GreenRequest(String),
    #[error("green group {group}: asked for {requested} SMs, the driver granted {granted}")]
    GrantedFewer {
        group: usize,
        requested: u32,
        granted: u32,
    },
    #[error("the plan was rejected:\n{}", format_rejections(.0))]
    Rejected(Vec<Rejection>),
    #[error(
        "an MPS control daemon is already active (pipe directory {pipe_dir}, pid(s) {pids:?}); \
         isolane will not run beside it. Stop it, or pass --join-mps to use it"
    )]
    MpsExistingDaemon { pipe_dir: PathBuf, pids: Vec<i32> },
    #[error("nvidia-cuda-mps-control not found (searched: {}); install the NVIDIA driver's MPS binaries or set ISOLANE_MPS_CONTROL", searched.join(", "))]
    MpsControlNotFound { searched: Vec<String> },
    #[error("MPS: {0}")]
    Mps(String),
    #[error("MIG: {0}")]
    Mig(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// A mistake in what was asked (bad scenario for this command, bad argument).
    #[error("{0}")]
    Usage(String),
    #[error("probe worker: {0}")]
    Worker(String),
    #[error("{0}")]
    Other(String),
}

fn format_rejections(r: &[Rejection]) -> String {
    r.iter()
        .map(|r| format!("  {}: {}", r.workload, r.message))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A failed call of the checked-call layer ([`crate::call`]) as this crate's error: its call,
/// the status's name and number (a driver call's; this crate calls no other library through
/// that layer).
impl From<crate::call::CudaError> for GpuError {
    fn from(e: crate::call::CudaError) -> Self {
        GpuError::Cuda {
            call: e.call,
            code: e.status,
            value: e.code,
        }
    }
}

impl GpuError {
    /// A failed driver call ([`GpuError::Cuda`]) as the checked-call layer's error, with all
    /// it kept (isolane-cuda's boundary converts it on from there); `None` for anything else.
    pub fn call_error(&self) -> Option<crate::call::CudaError> {
        match self {
            GpuError::Cuda { call, code, value } => Some(crate::call::CudaError::new(
                crate::call::Library::Driver,
                call,
                *value,
                code.clone(),
            )),
            _ => None,
        }
    }

    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        GpuError::Io {
            what: what.into(),
            source,
        }
    }

    /// Whether the error means "no usable GPU here" (no library, no device) rather than a
    /// failure of a GPU that exists. `isolane devices` treats these as informational.
    pub fn is_no_gpu(&self) -> bool {
        matches!(
            self,
            GpuError::LibraryNotFound { .. } | GpuError::NoDevice(_)
        ) || matches!(self, GpuError::Cuda { code, .. } if code == "CUDA_ERROR_NO_DEVICE")
    }

    /// A mistake of the user's (exit code 2 at the CLI) rather than a runtime failure.
    pub fn is_user_error(&self) -> bool {
        matches!(
            self,
            GpuError::Rejected(_)
                | GpuError::GreenRequest(_)
                | GpuError::DeviceIndex { .. }
                | GpuError::Usage(_)
        )
    }
}
