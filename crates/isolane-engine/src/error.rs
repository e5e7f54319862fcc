//! The engine's error type.

use thiserror::Error;

/// Everything that can go wrong while building, loading, compiling or running a model.
///
/// What a caller must tell apart keeps its structure up to the command line (docs/design.md,
/// "Conventions"): an allocation that did not fit ([`EngineError::OutOfMemory`]), a failed
/// library call ([`EngineError::Library`]) and a model the engine cannot take
/// ([`EngineError::is_bad_model`]) end with different exit codes and messages.
#[derive(Debug, Error)]
pub enum EngineError {
    /// The graph is malformed: wrong input count, an unknown value, a cycle, a bad attribute.
    #[error("invalid graph: node `{node}`: {msg}")]
    InvalidGraph { node: String, msg: String },
    /// Shapes of a node's inputs do not fit the op.
    #[error("shape error: node `{node}` ({op}): {msg}")]
    Shape {
        node: String,
        op: String,
        msg: String,
    },
    /// The backend cannot run something (op, precision, batch...).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// Unknown built-in model name.
    #[error("unknown model `{name}`; built-in models: {known}")]
    UnknownModel { name: String, known: String },
    /// A weights file problem (I/O, format, a tensor with a wrong name/shape/dtype).
    #[error("weights file `{file}`: {msg}")]
    Weights { file: String, msg: String },
    /// Anything the caller passed that does not fit (buffer sizes, batch 0...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// An allocation the memory it was made in could not hold.
    #[error(transparent)]
    OutOfMemory(Box<OutOfMemory>),
    /// A call into a device library (the CUDA driver, cuDNN, cuBLASLt, NVRTC) that failed for
    /// another reason than memory.
    #[error(transparent)]
    Library(Box<LibraryFailure>),
    /// A failure while running a compiled model that has no structure worth keeping (a
    /// panicked kernel, a thread pool that would not start, a plan check's finding).
    #[error("runtime error: {0}")]
    Runtime(String),
}

impl From<OutOfMemory> for EngineError {
    fn from(e: OutOfMemory) -> Self {
        EngineError::OutOfMemory(Box::new(e))
    }
}

impl From<LibraryFailure> for EngineError {
    fn from(e: LibraryFailure) -> Self {
        EngineError::Library(Box::new(e))
    }
}

/// What kind of failure an [`EngineError`] is, for callers that only need to react to it (an
/// exit code, a worker's reply) without the details.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// An allocation did not fit: a smaller batch or more memory may help.
    OutOfMemory,
    /// A device library call failed (driver, cuDNN, cuBLASLt, NVRTC).
    Library,
    /// The model (file, graph, weights, an op or precision the backend lacks) cannot be taken.
    BadModel,
    /// The caller passed something that does not fit.
    InvalidArgument,
    /// Anything else that failed while running.
    Runtime,
}

/// A device library call that did not succeed, kept as data.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error(
    "{}{call}: {status}{}",
    .node.as_ref().map(|n| format!("node `{n}`: ")).unwrap_or_default(),
    .detail.as_ref().map(|d| format!(" ({d})")).unwrap_or_default()
)]
pub struct LibraryFailure {
    /// The library, as its users name it: `CUDA driver`, `cuDNN`, `cuBLASLt`, `NVRTC`.
    pub library: &'static str,
    /// The function called, e.g. `cuModuleLoadData`.
    pub call: &'static str,
    /// The numeric status the call returned.
    pub code: i64,
    /// The status's name in the library's headers, e.g. `CUDA_ERROR_LAUNCH_FAILED`.
    pub status: String,
    /// The library's own description of the status, where it has one (cuDNN).
    pub detail: Option<String>,
    /// The node of a compiled plan whose step made the call, where known.
    pub node: Option<String>,
}

/// An allocation that did not fit.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error(
    "out of memory: {what}{}{} of {memory}{}",
    .requested_bytes.map(|b| format!(" asked for {}", human_bytes(b))).unwrap_or_default(),
    .free_bytes.map(|b| format!(", {} free", human_bytes(b))).unwrap_or_default(),
    .reported_by.as_ref().map(|f| format!(" ({f})")).unwrap_or_default()
)]
pub struct OutOfMemory {
    /// What was being allocated, e.g. `the activation arena`.
    pub what: String,
    /// The memory it was asked of, e.g. `the GPU's memory`, `host memory`.
    pub memory: String,
    /// Bytes asked for, where known.
    pub requested_bytes: Option<u64>,
    /// Bytes free in that memory when it failed, where known.
    pub free_bytes: Option<u64>,
    /// The library call that refused it (none for a host allocation).
    pub reported_by: Option<LibraryFailure>,
}

impl OutOfMemory {
    /// Whether the memory that ran out is the host's rather than a GPU's.
    pub fn on_host(&self) -> bool {
        self.memory == "host memory"
    }

    /// What may make it fit, in the words of the flags and scenario keys that change it.
    pub fn hint(&self) -> &'static str {
        if self.on_host() {
            "a smaller batch (--batch, or `batch` in the scenario) needs less; or give this \
             process more memory (an address-space limit such as `ulimit -v`, a container's \
             memory limit)"
        } else {
            "a smaller batch (--batch, or `batch` in the scenario) needs less; or give the \
             model a partition with more memory (`mem_limit_mib` under mps, a larger \
             `mig_profile`), or leave fewer models on this GPU"
        }
    }
}

/// `b` bytes in the largest binary unit that keeps it at least 1 (`1.5 GiB`).
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

impl EngineError {
    pub(crate) fn graph(node: impl Into<String>, msg: impl Into<String>) -> Self {
        EngineError::InvalidGraph {
            node: node.into(),
            msg: msg.into(),
        }
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        match self {
            EngineError::OutOfMemory(_) => ErrorKind::OutOfMemory,
            EngineError::Library(_) => ErrorKind::Library,
            EngineError::InvalidGraph { .. }
            | EngineError::Shape { .. }
            | EngineError::Unsupported(_)
            | EngineError::UnknownModel { .. }
            | EngineError::Weights { .. } => ErrorKind::BadModel,
            EngineError::InvalidArgument(_) => ErrorKind::InvalidArgument,
            EngineError::Runtime(_) => ErrorKind::Runtime,
        }
    }

    /// Whether the model itself cannot be taken (its file, graph, weights, or an op or
    /// precision this backend lacks): the user's to fix, not a failure of the machine.
    pub fn is_bad_model(&self) -> bool {
        self.kind() == ErrorKind::BadModel
    }

    /// The same error with an out-of-memory's allocation named `what` (a caller that knows
    /// what the buffer was for); other errors unchanged.
    pub fn for_allocation(self, what: &str) -> Self {
        match self {
            EngineError::OutOfMemory(mut m) => {
                m.what = what.to_string();
                EngineError::OutOfMemory(m)
            }
            other => other,
        }
    }

    /// The same error, its node named where it has no node of its own (a step of a compiled
    /// plan that failed); structured errors keep their structure.
    pub fn at_node(self, node: &str) -> Self {
        match self {
            EngineError::Runtime(s) => EngineError::Runtime(format!("node `{node}`: {s}")),
            EngineError::OutOfMemory(mut m) => {
                m.what = format!("{} (node `{node}`)", m.what);
                EngineError::OutOfMemory(m)
            }
            EngineError::Library(mut f) if f.node.is_none() => {
                f.node = Some(node.to_string());
                EngineError::Library(f)
            }
            other => other,
        }
    }
}

/// A zeroed host buffer of `len` f32s, or [`EngineError::OutOfMemory`] naming `what` when the
/// allocator refuses it (an address-space limit, an overcommit policy) instead of aborting the
/// process as `vec![0.0; len]` does.
pub fn try_zeroed_f32(len: usize, what: &str) -> Result<Vec<f32>> {
    let oom = || {
        EngineError::from(OutOfMemory {
            what: what.to_string(),
            memory: "host memory".into(),
            requested_bytes: u64::try_from(len.saturating_mul(4)).ok(),
            free_bytes: None,
            reported_by: None,
        })
    };
    if len == 0 {
        return Ok(Vec::new());
    }
    let layout = std::alloc::Layout::array::<f32>(len).map_err(|_| oom())?;
    // SAFETY: `layout` has a non-zero size (len > 0).
    let p = unsafe { std::alloc::alloc_zeroed(layout) } as *mut f32;
    if p.is_null() {
        return Err(oom());
    }
    // SAFETY: `p` is a live allocation of the global allocator with `layout` (len f32s, f32's
    // alignment), as Vec's own allocation of capacity `len` would be; all-zero bytes are 0.0f32,
    // so its `len` elements are initialised. The Vec takes it over and frees it once.
    Ok(unsafe { Vec::from_raw_parts(p, len, len) })
}

/// Result alias used throughout the engine.
pub type Result<T, E = EngineError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_tell_memory_library_and_model_apart() {
        let oom = EngineError::from(OutOfMemory {
            what: "the activation arena".into(),
            memory: "GPU 0's memory".into(),
            requested_bytes: Some(3 << 30),
            free_bytes: Some(1 << 30),
            reported_by: None,
        });
        assert_eq!(oom.kind(), ErrorKind::OutOfMemory);
        let EngineError::OutOfMemory(m) = &oom else {
            unreachable!()
        };
        assert!(!m.on_host() && m.hint().contains("mem_limit_mib"));
        assert_eq!(
            oom.to_string(),
            "out of memory: the activation arena asked for 3.0 GiB, 1.0 GiB free of GPU 0's memory"
        );
        let launch_failed = LibraryFailure {
            library: "CUDA driver",
            call: "cuLaunchKernel",
            code: 719,
            status: "CUDA_ERROR_LAUNCH_FAILED".into(),
            detail: None,
            node: None,
        };
        let lib = EngineError::from(launch_failed.clone());
        assert_eq!(lib.kind(), ErrorKind::Library);
        assert_eq!(lib.to_string(), "cuLaunchKernel: CUDA_ERROR_LAUNCH_FAILED");
        assert!(EngineError::Unsupported("Tile".into()).is_bad_model());
        assert!(EngineError::graph("n", "cycle").is_bad_model());
        assert!(!EngineError::Runtime("x".into()).is_bad_model());
        assert!(!lib.is_bad_model());
        let at = EngineError::from(launch_failed).at_node("conv1");
        assert_eq!(at.kind(), ErrorKind::Library);
        let named = "node `conv1`: cuLaunchKernel: CUDA_ERROR_LAUNCH_FAILED";
        assert_eq!(at.to_string(), named);
        // A node named once stays the one named.
        assert_eq!(at.at_node("conv2").to_string(), named);
    }

    #[test]
    fn a_node_is_named_without_losing_the_structure() {
        let e = EngineError::from(OutOfMemory {
            what: "cuDNN's workspace".into(),
            memory: "GPU 0's memory".into(),
            requested_bytes: None,
            free_bytes: None,
            reported_by: None,
        })
        .at_node("conv1");
        assert_eq!(e.kind(), ErrorKind::OutOfMemory);
        assert!(e.to_string().contains("(node `conv1`)"), "{e}");
        let e = e.for_allocation("the convolution workspace");
        assert!(
            e.to_string()
                .starts_with("out of memory: the convolution workspace"),
            "{e}"
        );
        assert_eq!(
            EngineError::Runtime("x".into())
                .for_allocation("y")
                .to_string(),
            "runtime error: x"
        );
        let r = EngineError::Runtime("boom".into()).at_node("conv1");
        assert_eq!(r.to_string(), "runtime error: node `conv1`: boom");
    }

    #[test]
    fn a_host_buffer_too_large_for_the_address_space_is_an_error_not_an_abort() {
        let e = try_zeroed_f32(usize::MAX / 2, "the activation arena").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::OutOfMemory);
        assert!(e.to_string().contains("the activation arena"), "{e}");
        // A size the layout takes but no allocator grants (2^61 bytes).
        let e = try_zeroed_f32(1 << 59, "the scratch").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::OutOfMemory);
        let v = try_zeroed_f32(1000, "x").unwrap();
        assert_eq!((v.len(), v.iter().all(|&x| x == 0.0)), (1000, true));
        assert!(try_zeroed_f32(0, "x").unwrap().is_empty());
    }
}
