//! Finding libcuda, NVRTC, cuDNN 9 and cuBLASLt 13 before cudarc touches them.
//!
//! cudarc's dynamic loading panics when a library is missing and asks the dynamic loader for
//! bare names only. So each library is looked up first, by full path, in `ISOLANE_CUDA_LIB_DIR`,
//! `LD_LIBRARY_PATH`, the usual install directories (isolane-gpu's list) and `ldconfig -p`,
//! and loaded; glibc then hands cudarc's later `dlopen("libcudnn.so.9")` the already loaded
//! object (matched by soname). A library found nowhere is an error that names it and says how
//! to point isolane at it, never a panic.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use isolane_gpu::loader::{self, NvLib, LIB_DIR_ENV};

/// A library the CUDA backend needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lib {
    /// File names tried, in order.
    pub files: &'static [&'static str],
    /// What it is, for messages.
    pub what: &'static str,
}

pub const CUDNN: Lib = Lib {
    files: &["libcudnn.so.9"],
    what: "cuDNN 9",
};
pub const CUBLASLT: Lib = Lib {
    files: &["libcublasLt.so.13"],
    what: "cuBLASLt 13 (CUDA 13 toolkit or the nvidia-cublas wheel)",
};

/// The error text for a library that was not found.
pub fn not_found_message(file: &str, what: &str, searched: &[String]) -> String {
    format!(
        "cannot load {file} ({what}), which the cuda backend needs; searched {}. \
         Install it, or point isolane at the directory that holds it with \
         {LIB_DIR_ENV}=DIR (or LD_LIBRARY_PATH=DIR)",
        searched.join(", ")
    )
}

fn try_load(path: &Path) -> bool {
    // SAFETY: these NVIDIA libraries are made to be dlopen'ed by applications; loading runs
    // their initialisers only. The handle is leaked on purpose: the library must stay loaded
    // for the life of the process, since cudarc resolves its symbols from it later.
    match unsafe { libloading::Library::new(path) } {
        Ok(l) => {
            std::mem::forget(l);
            true
        }
        Err(_) => false,
    }
}

/// Looks for `lib` in `dirs`, then (if `use_system`) in `ldconfig -p` and the loader's own
/// path; loads the first that opens. Returns the path or the error message.
pub fn find_and_load(lib: Lib, dirs: &[PathBuf], use_system: bool) -> Result<PathBuf, String> {
    let mut searched: Vec<String> = Vec::new();
    for dir in dirs {
        for f in lib.files {
            let p = dir.join(f);
            if p.exists() && try_load(&p) {
                return Ok(p);
            }
        }
        searched.push(dir.display().to_string());
    }
    if use_system {
        for f in lib.files {
            for p in isolane_gpu::loader::ldconfig_paths(f) {
                if try_load(&p) {
                    return Ok(p);
                }
            }
        }
        searched.push("ldconfig -p".into());
        for f in lib.files {
            if try_load(Path::new(f)) {
                return Ok(PathBuf::from(f));
            }
        }
        searched.push("the dynamic loader's default path".into());
    }
    Err(not_found_message(lib.files[0], lib.what, &searched))
}

/// Paths of the four libraries, loaded once per process.
#[derive(Clone, Debug)]
pub struct Libraries {
    pub cuda: PathBuf,
    pub nvrtc: PathBuf,
    pub cudnn: PathBuf,
    pub cublaslt: PathBuf,
}

/// Loads libcuda, NVRTC, cuDNN and cuBLASLt (once per process; the outcome is remembered).
pub fn ensure_all() -> Result<Libraries, String> {
    static DONE: OnceLock<Mutex<Option<Result<Libraries, String>>>> = OnceLock::new();
    let m = DONE.get_or_init(|| Mutex::new(None));
    let mut g = m.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(r) = g.as_ref() {
        return r.clone();
    }
    let r = (|| {
        let cuda = loader::ensure(NvLib::Cuda)
            .map_err(|e| format!("{e} (libcuda.so.1 is needed by the cuda backend)"))?
            .path;
        let nvrtc = loader::ensure(NvLib::Nvrtc)
            .map_err(|e| format!("{e} (libnvrtc.so.13 is needed by the cuda backend)"))?
            .path;
        let dirs = loader::search_dirs();
        let cudnn = find_and_load(CUDNN, &dirs, true)?;
        let cublaslt = find_and_load(CUBLASLT, &dirs, true)?;
        Ok(Libraries {
            cuda,
            nvrtc,
            cudnn,
            cublaslt,
        })
    })();
    *g = Some(r.clone());
    r
}
