//! Finding the NVIDIA shared libraries before cudarc or nvml-wrapper touch them.
//!
//! cudarc's dynamic loading **panics** when it cannot find a library ("Unable to dynamically
//! load the "cuda" shared library ...") or a symbol ("Missing symbol ..."), and it only asks the
//! dynamic loader for bare names, so a library outside `LD_LIBRARY_PATH` and the ldconfig cache
//! (e.g. `/usr/local/cuda/lib64/libnvrtc.so.13` on our H100 machine) is not found at all. So we
//! look first: in `ISOLANE_CUDA_LIB_DIR`, `LD_LIBRARY_PATH`, the usual install directories and
//! `ldconfig -p`, and load what we find by its full path. The handle is kept for the life of the
//! process: glibc's `dlopen` of a bare name matches an already loaded object by its soname, so
//! cudarc's later `dlopen("libcuda.so.1")` gets the very library we found instead of failing.
//! A library that is nowhere to be found becomes [`GpuError::LibraryNotFound`], never a panic.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use crate::error::{GpuError, Result};

/// Environment variable: extra directories (`:`-separated) searched first for libcuda,
/// libnvrtc and libnvidia-ml.
pub const LIB_DIR_ENV: &str = "ISOLANE_CUDA_LIB_DIR";

/// Where NVIDIA libraries usually live on Linux (containers mount the driver's under
/// /usr/local/nvidia; toolkits install under /usr/local/cuda).
const DEFAULT_DIRS: &[&str] = &[
    "/usr/local/nvidia/lib64",
    "/usr/local/nvidia/lib",
    "/usr/local/cuda/lib64",
    "/usr/local/cuda/targets/x86_64-linux/lib",
    "/usr/local/cuda/targets/sbsa-linux/lib",
    "/usr/lib/x86_64-linux-gnu",
    "/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/lib64",
    "/usr/lib",
    "/lib",
    "/usr/lib/wsl/lib",
];

/// The libraries this crate loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NvLib {
    Cuda,
    Nvrtc,
    Nvml,
}

impl NvLib {
    fn file_names(self) -> &'static [&'static str] {
        match self {
            NvLib::Cuda => &["libcuda.so.1", "libcuda.so"],
            // The cuda-13000 build asks for libnvrtc.so.13 (see cudarc's candidate list).
            NvLib::Nvrtc => &["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"],
            NvLib::Nvml => &["libnvidia-ml.so.1", "libnvidia-ml.so"],
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            NvLib::Cuda => "libcuda (the CUDA driver)",
            NvLib::Nvrtc => "libnvrtc (CUDA runtime compiler)",
            NvLib::Nvml => "libnvidia-ml (NVML)",
        }
    }

    fn hint(self) -> String {
        let what = match self {
            NvLib::Cuda | NvLib::Nvml => {
                "the NVIDIA driver is not installed or not mounted into this container"
            }
            NvLib::Nvrtc => "the CUDA toolkit's NVRTC (libnvrtc.so.13) is not installed",
        };
        format!("{what}; set {LIB_DIR_ENV}=DIR if the library is elsewhere")
    }
}

/// A library found and loaded (kept loaded for the life of the process).
#[derive(Debug, Clone)]
pub struct Loaded {
    pub path: PathBuf,
}

struct Slot {
    lib: &'static libloading::Library,
    path: PathBuf,
}

/// Each library's outcome, found or not, so that the search runs once per process.
type Slots = Mutex<Vec<(NvLib, Result<Slot, GpuError>)>>;

fn slots() -> &'static Slots {
    static S: OnceLock<Slots> = OnceLock::new();
    S.get_or_init(|| Mutex::new(Vec::new()))
}

/// Directories searched, in order (without the ldconfig cache, which is read separately).
pub fn search_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    for var in [LIB_DIR_ENV, "LD_LIBRARY_PATH"] {
        if let Some(v) = std::env::var_os(var) {
            dirs.extend(std::env::split_paths(&v).filter(|p| !p.as_os_str().is_empty()));
        }
    }
    for cuda_home in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(v) = std::env::var_os(cuda_home) {
            dirs.push(Path::new(&v).join("lib64"));
        }
    }
    dirs.extend(DEFAULT_DIRS.iter().map(PathBuf::from));
    let mut seen = std::collections::HashSet::new();
    dirs.retain(|d| seen.insert(d.clone()));
    dirs
}

/// `ldconfig -p` lines such as `libcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1`.
pub fn ldconfig_paths(file_name: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for ldconfig in ["/sbin/ldconfig", "/usr/sbin/ldconfig", "ldconfig"] {
        let Ok(o) = std::process::Command::new(ldconfig)
            .arg("-p")
            .stdin(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .output()
        else {
            continue;
        };
        for line in String::from_utf8_lossy(&o.stdout).lines() {
            let line = line.trim();
            if line.split_whitespace().next() == Some(file_name) {
                if let Some((_, p)) = line.split_once("=>") {
                    out.push(PathBuf::from(p.trim()));
                }
            }
        }
        break;
    }
    out
}

fn try_load(path: &Path) -> Option<libloading::Library> {
    // SAFETY: loading an NVIDIA library runs its initialisers; these libraries are designed to
    // be dlopen'ed by applications (that is how the CUDA runtime itself loads libcuda).
    unsafe { libloading::Library::new(path) }.ok()
}

fn find_and_load(lib: NvLib) -> Result<Slot> {
    let mut searched: Vec<String> = Vec::new();
    // Explicit directories first: an override must win over whatever the loader would pick.
    for dir in search_dirs() {
        for name in lib.file_names() {
            let p = dir.join(name);
            if p.exists() {
                if let Some(l) = try_load(&p) {
                    return Ok(Slot {
                        lib: Box::leak(Box::new(l)),
                        path: p,
                    });
                }
            }
        }
        searched.push(dir.display().to_string());
    }
    for name in lib.file_names() {
        for p in ldconfig_paths(name) {
            if let Some(l) = try_load(&p) {
                return Ok(Slot {
                    lib: Box::leak(Box::new(l)),
                    path: p,
                });
            }
        }
    }
    searched.push("ldconfig -p".into());
    // Last, the bare name as the dynamic loader resolves it (RUNPATH, /etc/ld.so.conf ...).
    for name in lib.file_names() {
        if let Some(l) = try_load(Path::new(name)) {
            return Ok(Slot {
                lib: Box::leak(Box::new(l)),
                path: PathBuf::from(name),
            });
        }
    }
    searched.push("the dynamic loader's default path".into());
    Err(GpuError::LibraryNotFound {
        library: lib.name().to_string(),
        searched,
        hint: lib.hint(),
    })
}

fn clone_err(e: &GpuError) -> GpuError {
    match e {
        GpuError::LibraryNotFound {
            library,
            searched,
            hint,
        } => GpuError::LibraryNotFound {
            library: library.clone(),
            searched: searched.clone(),
            hint: hint.clone(),
        },
        other => GpuError::Other(other.to_string()),
    }
}

/// Finds and loads `lib` once per process; later calls return the cached outcome.
pub fn ensure(lib: NvLib) -> Result<Loaded> {
    let mut g = slots().lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, r)) = g.iter().find(|(l, _)| *l == lib) {
        return match r {
            Ok(s) => Ok(Loaded {
                path: s.path.clone(),
            }),
            Err(e) => Err(clone_err(e)),
        };
    }
    let r = find_and_load(lib);
    if let (NvLib::Nvrtc, Ok(slot)) = (lib, &r) {
        preload_nvrtc_builtins(&slot.path);
    }
    let out = match &r {
        Ok(s) => Ok(Loaded {
            path: s.path.clone(),
        }),
        Err(e) => Err(clone_err(e)),
    };
    g.push((lib, r));
    out
}

/// NVRTC dlopens `libnvrtc-builtins.so.<major>.<minor>` by bare name when it compiles; outside
/// the loader's path that fails with NVRTC_ERROR_BUILTIN_OPERATION_FAILURE. Loading it from
/// NVRTC's own directory first makes the bare-name lookup succeed (soname match).
fn preload_nvrtc_builtins(nvrtc: &Path) {
    let Some(dir) = nvrtc.parent().filter(|d| !d.as_os_str().is_empty()) else {
        return;
    };
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let mut cands: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libnvrtc-builtins.so."))
        })
        .collect();
    // The most specific name (libnvrtc-builtins.so.13.0.88 < .so.13.0) is the soname target.
    cands.sort_by_key(|p| p.as_os_str().len());
    for p in cands {
        if let Some(l) = try_load(&p) {
            let _: &'static libloading::Library = Box::leak(Box::new(l));
            return;
        }
    }
}

/// Whether the loaded `lib` exports `symbol` (to refuse cleanly on a driver too old for green
/// contexts instead of letting cudarc panic with "Missing symbol").
pub fn has_symbol(lib: NvLib, symbol: &str) -> Result<bool> {
    ensure(lib)?;
    let g = slots().lock().unwrap_or_else(|p| p.into_inner());
    let Some((_, Ok(slot))) = g.iter().find(|(l, _)| *l == lib) else {
        return Ok(false);
    };
    // SAFETY: we only check for the symbol's presence; the pointer is never called or read.
    let found = unsafe { slot.lib.get::<*const std::ffi::c_void>(symbol) }.is_ok();
    Ok(found)
}

/// Fails with [`GpuError::MissingSymbol`] unless libcuda exports every one of `symbols`.
pub fn require_cuda_symbols(symbols: &[&str], hint: &str) -> Result<()> {
    for s in symbols {
        if !has_symbol(NvLib::Cuda, s)? {
            return Err(GpuError::MissingSymbol {
                library: "libcuda".into(),
                symbol: (*s).to_string(),
                hint: hint.to_string(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn search_dirs_are_unique_and_include_the_defaults() {
        let d = search_dirs();
        assert!(d.contains(&PathBuf::from("/usr/local/nvidia/lib64")));
        assert!(d.contains(&PathBuf::from("/usr/local/cuda/lib64")));
        let mut u = d.clone();
        u.sort();
        u.dedup();
        assert_eq!(u.len(), d.len());
    }

    #[test]
    fn a_missing_library_is_an_error_not_a_panic() {
        // This machine has no NVIDIA driver; where it has one, the library is found.
        match ensure(NvLib::Cuda) {
            Ok(l) => assert!(!l.path.as_os_str().is_empty()),
            Err(e) => {
                let msg = e.to_string();
                assert!(msg.contains("libcuda"), "{msg}");
                assert!(msg.contains(LIB_DIR_ENV), "{msg}");
                assert!(e.is_no_gpu());
            }
        }
        // Cached: the second call answers the same way.
        assert_eq!(ensure(NvLib::Cuda).is_ok(), ensure(NvLib::Cuda).is_ok());
    }
}
