//! The rules every crate that writes or reads a results folder shares: how a file is written
//! (atomically) and what a workload's per-job CSV is called.

use std::io::Write as _;
use std::path::{Path, PathBuf};

/// A file of a results folder that could not be read, or not understood: either names the
/// file (the report, the trace and the results readers all say it the same way).
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// `detail` says where in the file (a line and column, or serde_json's field and
    /// line/column) and what is wrong.
    #[error("{path}: {detail}")]
    Parse { path: PathBuf, detail: String },
}

impl FileError {
    pub fn io(path: &Path, source: std::io::Error) -> Self {
        FileError::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    pub fn parse(path: &Path, detail: impl Into<String>) -> Self {
        FileError::Parse {
            path: path.to_path_buf(),
            detail: detail.into(),
        }
    }
}

/// The text of `path`, or an error that names it.
pub fn read_text(path: &Path) -> Result<String, FileError> {
    std::fs::read_to_string(path).map_err(|source| FileError::io(path, source))
}

/// Writes `bytes` to `path` atomically: a temporary file in the same directory (created if
/// missing), synced, then renamed over `path`, so a reader (or a crash) never sees a
/// half-written file.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp{}", std::process::id()));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// A file name for a workload's CSV: the name with anything outside `[A-Za-z0-9._-]` replaced.
pub fn jobs_file_name(workload: &str) -> String {
    let clean: String = workload
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{clean}.csv")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_whole_files_and_leaves_no_temporary_behind() {
        let dir = std::env::temp_dir().join(format!("isolane-files-{}", std::process::id()));
        let path = dir.join("sub").join("a.json");
        write_atomic(&path, b"one").unwrap();
        write_atomic(&path, b"two").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        let names: Vec<_> = std::fs::read_dir(dir.join("sub"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("a.json")]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn job_file_names_are_safe() {
        assert_eq!(jobs_file_name("cam-0.front"), "cam-0.front.csv");
        assert_eq!(jobs_file_name("a b/c"), "a_b_c.csv");
    }
}
