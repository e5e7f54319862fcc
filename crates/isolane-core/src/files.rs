//! The rules every crate that writes or reads a results folder shares: how a file is written
//! (atomically), how a file a user named for output is written ([`write_output`]), how much of
//! a text file is read ([`read_text`], [`read_config`]), how a binary file is read whole
//! ([`read_file_capped`]) and what a workload's per-job CSV is called.

use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};

/// The most bytes isolane reads of a file a person or isolane wrote by hand or as settings (a
/// scenario, a profile, a device description): such files are kilobytes, and a path such as
/// `/dev/zero` must end in an error, not in all of memory.
pub const MAX_CONFIG_BYTES: u64 = 16 << 20;

/// The most bytes isolane reads of one results file (summary.json, a jobs CSV: about 60 bytes a
/// job, so some 70 million jobs).
pub const MAX_RESULTS_BYTES: u64 = 4 << 30;

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

/// `bytes` in the largest binary unit that divides it (`16 MiB`, `4 GiB`), for caps.
fn cap_text(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["bytes", "KiB", "MiB", "GiB"];
    let (mut v, mut unit) = (bytes, 0);
    while v >= 1024 && v % 1024 == 0 && unit + 1 < UNITS.len() {
        v /= 1024;
        unit += 1;
    }
    format!("{v} {}", UNITS[unit])
}

/// The text of `path`, read with one open and one pass (so a pipe, a process substitution or a
/// FIFO works), and at most `cap` bytes of it: a larger file (or an endless one such as
/// `/dev/zero`) is an error that says the cap. The error does not name the path: callers do.
pub fn read_text_capped(path: &Path, cap: u64) -> std::io::Result<String> {
    let file = std::fs::File::open(path)?;
    let mut bytes = Vec::new();
    file.take(cap.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > cap {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "larger than {}, the most isolane reads of such a file (is it the file you \
                 meant?)",
                cap_text(cap)
            ),
        ));
    }
    utf8(bytes)
}

fn utf8(bytes: Vec<u8>) -> std::io::Result<String> {
    String::from_utf8(bytes).map_err(|e| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "not UTF-8 text (an invalid byte at offset {})",
                e.utf8_error().valid_up_to()
            ),
        )
    })
}

/// The text of the regular file `path` (or of the regular file a link names), at most `cap`
/// bytes: [`read_file_capped`] for text. For the files of a results folder, which isolane
/// always writes as regular files: a FIFO there (made by hand) would block the reader forever
/// waiting for a writer, and a device never ends, so both are refused by what they are.
pub fn read_regular_text_capped(path: &Path, cap: u64) -> std::io::Result<String> {
    read_file_capped(path, cap).and_then(utf8)
}

/// Whether `path` names anything at all: a file, a folder, a FIFO, a device, a symbolic link
/// even to nothing. A results reader that skips what is absent asks this rather than
/// `is_file()`, so that a record that is there but is not a regular file (a FIFO, a folder, a
/// link to /dev/zero) is an error naming what it is instead of silently taken as missing.
pub fn is_there(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok()
}

/// What every reader of whole files is tested on (`test-support`): in `dir`, `zero{ext}`, a
/// link to /dev/zero, and `fifo{ext}`, a FIFO (made by `mkfifo`), each with the words
/// [`read_file_capped`]'s refusal uses for it.
#[cfg(feature = "test-support")]
pub fn a_device_and_a_fifo(dir: &Path, ext: &str) -> [(PathBuf, &'static str); 2] {
    let zero = dir.join(format!("zero{ext}"));
    std::os::unix::fs::symlink("/dev/zero", &zero).expect("a link to /dev/zero");
    let fifo = dir.join(format!("fifo{ext}"));
    let made = std::process::Command::new("mkfifo").arg(&fifo).status();
    assert!(made.is_ok_and(|s| s.success()), "mkfifo {}", fifo.display());
    [(zero, "a character device"), (fifo, "a FIFO")]
}

/// The bytes of the regular file `path` (or of the regular file a link names), read whole with
/// one open, and at most `cap` bytes of them: the one way isolane reads a binary file whole (a
/// model, a saved plan, a tensor, an image). Anything but a regular file (a device such as
/// `/dev/zero`, a FIFO, a folder) is refused before a byte is read: a device or a pipe may
/// never end. A file larger than `cap` is refused by its size, and one that grows while it is
/// read is refused when it passes the size it had, so no file takes more memory than its size
/// when opened. The error does not name the path: callers do.
pub fn read_file_capped(path: &Path, cap: u64) -> std::io::Result<Vec<u8>> {
    use std::os::unix::fs::OpenOptionsExt;
    let not_regular = |t: std::fs::FileType| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "is {}, not a regular file; isolane reads such a file whole, and only from a \
                 regular file (a device or a pipe may never end)",
                kind_of(t)
            ),
        )
    };
    // Checked before opening too: opening a device can have effects of its own (a tape rewinds).
    let before = std::fs::metadata(path)?;
    if !before.is_file() {
        return Err(not_regular(before.file_type()));
    }
    // O_NONBLOCK: should a FIFO take the file's place after the check above, the open returns at
    // once instead of waiting for a writer (and the check below refuses it). Reads of a regular
    // file ignore the flag.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(not_regular(meta.file_type()));
    }
    let size = meta.len();
    if size > cap {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "is {size} bytes, larger than {}, the most isolane reads of such a file (is it \
                 the file you meant?)",
                cap_text(cap)
            ),
        ));
    }
    let mut bytes = Vec::with_capacity(size as usize);
    file.take(size + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > size {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "grew past its size of {size} bytes while it was read (is another program \
                 writing it?)"
            ),
        ));
    }
    Ok(bytes)
}

/// The text of the results file `path` (a regular file of at most [`MAX_RESULTS_BYTES`]:
/// [`read_regular_text_capped`]), or an error that names it.
pub fn read_text(path: &Path) -> Result<String, FileError> {
    read_regular_text_capped(path, MAX_RESULTS_BYTES).map_err(|source| FileError::io(path, source))
}

/// The text of the settings file `path` (a profile, a device description; at most
/// [`MAX_CONFIG_BYTES`]), or an error that names it.
pub fn read_config(path: &Path) -> Result<String, FileError> {
    read_text_capped(path, MAX_CONFIG_BYTES).map_err(|source| FileError::io(path, source))
}

/// The temporary file of an atomic write: in the target's folder (a rename across file systems
/// is not atomic), hidden, and new (`create_new`), so two writers never share one.
fn temporary_beside(dir: &Path, path: &Path) -> std::io::Result<(PathBuf, std::fs::File)> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let tmp = dir.join(format!(".{name}.tmp{}-{n}", std::process::id()));
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
        {
            Ok(f) => return Ok((tmp, f)),
            // Left behind by a killed process of the same id: take the next name.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 1_000_000 => continue,
            // The OS says only "No such file or directory" for /proc: say what was tried.
            Err(e) => {
                return Err(std::io::Error::new(
                    e.kind(),
                    format!("cannot create a file in {}: {e}", dir.display()),
                ))
            }
        }
    }
}

/// `bytes` into a temporary file in `dir`, synced, then renamed over `path` (with `mode`, the
/// permissions of the file it replaces, when there is one).
fn replace_atomically(
    dir: &Path,
    path: &Path,
    bytes: &[u8],
    mode: Option<std::fs::Permissions>,
) -> std::io::Result<()> {
    let (tmp, mut f) = temporary_beside(dir, path)?;
    let result = (|| {
        f.write_all(bytes)?;
        if let Some(mode) = mode {
            f.set_permissions(mode)?;
        }
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Writes `bytes` to `path` atomically: a temporary file in the same directory (created if
/// missing), synced, then renamed over `path`, so a reader (or a crash) never sees a
/// half-written file. For the files of a results folder isolane made; a file the user named
/// goes through [`write_output`].
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = parent_dir(path);
    std::fs::create_dir_all(dir)?;
    replace_atomically(dir, path, bytes, None)
}

/// The folder `path` is in (`.` for a bare file name).
fn parent_dir(path: &Path) -> &Path {
    path.parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// Why a file the user named for output (`--out`, `--save-output`) was not written.
#[derive(Debug, thiserror::Error)]
pub enum OutputFileError {
    /// The path names something other than a regular file or a new file in an existing
    /// folder (a folder, a FIFO, a block device, a missing folder): never replaced or created.
    #[error("{}: {why}", path.display())]
    Refused { path: PathBuf, why: String },
    /// Writing failed.
    #[error("cannot write {}: {error}", path.display())]
    Write {
        path: PathBuf,
        // Not a `#[source]`: the message holds it already, and a chain would print it twice.
        error: std::io::Error,
    },
}

impl OutputFileError {
    /// The user's to fix (exit code 2): a path that cannot be an output file, or one where
    /// this user cannot create files (permissions, a read-only or pseudo file system such as
    /// /proc). A full disk or an I/O error is a failure (exit code 1).
    pub fn is_user_error(&self) -> bool {
        use std::io::ErrorKind::*;
        match self {
            OutputFileError::Refused { .. } => true,
            OutputFileError::Write { error, .. } => matches!(
                error.kind(),
                PermissionDenied | ReadOnlyFilesystem | NotFound | IsADirectory | NotADirectory
            ),
        }
    }
}

/// What a file type is, in words.
fn kind_of(t: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if t.is_dir() {
        "a folder"
    } else if t.is_fifo() {
        "a FIFO (named pipe)"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_symlink() {
        "a symbolic link"
    } else {
        "a regular file"
    }
}

/// The names of a stream this process already has open (`/dev/stdout`, `/dev/fd/3`, ...): a
/// user who names one means "write it there", whatever it is (a pipe, a terminal, a file).
fn names_open_stream(path: &Path) -> bool {
    let p = path.as_os_str().to_string_lossy();
    p == "/dev/stdout"
        || p == "/dev/stderr"
        || p.starts_with("/dev/fd/")
        || p.starts_with("/proc/self/fd/")
        || p.starts_with("/proc/thread-self/fd/")
}

/// Writes `bytes` to the file the user named `path` (`report --out`, `trace --out`, `infer
/// --save-output`, `plan --auto -o`), the one way isolane writes such a file:
///
/// - a regular file (or a symbolic link to one, which stays a link) is replaced atomically,
///   keeping its permissions; a new path in an existing folder is created atomically;
/// - a character device (`/dev/null`, a terminal) or an open stream's name (`/dev/stdout`,
///   `/dev/fd/N`) is written through, never replaced;
/// - anything else (a folder, a FIFO, a socket, a block device, a link to a missing file) is
///   refused, and so is a path whose folder does not exist: it is never created.
pub fn write_output(path: &Path, bytes: &[u8]) -> Result<(), OutputFileError> {
    let failed = |error: std::io::Error| OutputFileError::Write {
        path: path.to_path_buf(),
        error,
    };
    match output_target(path)? {
        OutputTarget::Through => {
            // Appending: a file behind /dev/stdout is written where the shell's `>` or `>>`
            // left it.
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .open(path)
                .map_err(failed)?;
            f.write_all(bytes).and_then(|()| f.flush()).map_err(failed)
        }
        OutputTarget::New { dir } => replace_atomically(&dir, path, bytes, None).map_err(failed),
        OutputTarget::Replace { file, mode } => {
            replace_atomically(parent_dir(&file), &file, bytes, Some(mode)).map_err(failed)
        }
    }
}

/// Refuses, before any work, an output path that [`write_output`] would refuse once the work
/// is done (a folder, a FIFO, a missing folder, a link to nothing, a run's record): a build,
/// an inference or a plan that takes minutes is not thrown away at its end for a typo in
/// `-o`. Nothing is created or written.
pub fn check_output(path: &Path) -> Result<(), OutputFileError> {
    output_target(path).map(|_| ())
}

/// How [`write_output`] writes a path.
enum OutputTarget {
    /// An open stream's name or a character device: written through.
    Through,
    /// A new file in the existing folder `dir`.
    New { dir: PathBuf },
    /// The existing regular file `file` (a link's target), replaced keeping `mode`.
    Replace {
        file: PathBuf,
        mode: std::fs::Permissions,
    },
}

fn output_target(path: &Path) -> Result<OutputTarget, OutputFileError> {
    let refuse = |why: String| OutputFileError::Refused {
        path: path.to_path_buf(),
        why,
    };
    let failed = |error: std::io::Error| OutputFileError::Write {
        path: path.to_path_buf(),
        error,
    };
    if names_open_stream(path) {
        return Ok(OutputTarget::Through);
    }
    let own = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
            ) =>
        {
            let dir = parent_dir(path);
            return match std::fs::metadata(dir) {
                Ok(m) if m.is_dir() => Ok(OutputTarget::New {
                    dir: dir.to_path_buf(),
                }),
                Ok(m) => Err(refuse(format!(
                    "{} is {}, not a folder",
                    dir.display(),
                    kind_of(m.file_type())
                ))),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(refuse(format!(
                    "the folder {} does not exist; isolane does not create it (make it first, \
                     or name a file in an existing folder)",
                    dir.display()
                ))),
                Err(e) => Err(failed(e)),
            };
        }
        Err(e) => return Err(failed(e)),
    };
    let (target, meta) = if own.file_type().is_symlink() {
        match std::fs::canonicalize(path).and_then(|t| std::fs::metadata(&t).map(|m| (t, m))) {
            Ok(found) => found,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let to = std::fs::read_link(path)
                    .map(|t| format!(" {}", t.display()))
                    .unwrap_or_default();
                return Err(refuse(format!(
                    "a symbolic link to{to}, which does not exist; name the file itself"
                )));
            }
            Err(e) => return Err(failed(e)),
        }
    } else {
        (path.to_path_buf(), own.clone())
    };
    let t = meta.file_type();
    if t.is_file() {
        if let Some(why) = results_record(&target) {
            return Err(refuse(why));
        }
        return Ok(OutputTarget::Replace {
            file: target,
            mode: meta.permissions(),
        });
    }
    if std::os::unix::fs::FileTypeExt::is_char_device(&t) {
        return Ok(OutputTarget::Through);
    }
    let what = if own.file_type().is_symlink() {
        format!("a symbolic link to {}, {}", target.display(), kind_of(t))
    } else {
        kind_of(t).to_string()
    };
    Err(refuse(format!(
        "is {what}, not a regular file; isolane writes its output only to a regular file, a \
         new path or a character device (/dev/null, /dev/stdout)"
    )))
}

/// Refuses a file isolane reads whole (a model, its weights, an input tensor, an image,
/// labels) that is a device: /dev/zero or /dev/urandom never ends, and reading one would take
/// all of memory before any error. A missing path (or any other kind) is left to the reader,
/// which names what is wrong with it.
pub fn refuse_device(what: &str, path: &Path) -> Result<(), String> {
    use std::os::unix::fs::FileTypeExt;
    let Ok(m) = std::fs::metadata(path) else {
        return Ok(());
    };
    let t = m.file_type();
    if t.is_char_device() || t.is_block_device() {
        return Err(format!(
            "{what} {}: is {}, not a file; isolane reads it whole, and a device (/dev/zero) \
             never ends: give a regular file",
            path.display(),
            kind_of(t)
        ));
    }
    Ok(())
}

/// The files that make a folder a results folder: a run's, a search's or a study's index.
const RESULTS_INDEXES: [&str; 6] = [
    "summary.json",
    "maxrate.json",
    "sweep.json",
    "interference.json",
    "coexec.json",
    "isolation.csv",
];

/// A results folder's records, which no later command can make again: a run's measurements and
/// the scenario it ran (a trace, a report or an explanation is derived from them, and may be
/// written over).
const RESULTS_RECORDS: [&str; 13] = [
    "summary.json",
    "scenario.toml",
    "workloads.csv",
    "telemetry.csv",
    "isolation.csv",
    "maxrate.json",
    "maxrate_trace.csv",
    "sweep.json",
    "interference.json",
    "interference.csv",
    "coexec.json",
    "coexec.csv",
    "autoplan.csv",
];

fn is_results_folder(dir: &Path) -> bool {
    RESULTS_INDEXES.iter().any(|f| dir.join(f).is_file())
        // A killed run's folder: its scenario and streamed jobs, before `summarize`.
        || (dir.join("scenario.toml").is_file() && dir.join("jobs").is_dir())
}

/// Why the existing regular file `file` is one of a results folder's records (its index
/// files, its scenario, a workload's jobs, an app's frames or a program's output), or none.
fn results_record(file: &Path) -> Option<String> {
    let name = file.file_name()?.to_string_lossy().into_owned();
    let dir = parent_dir(file);
    let record = if is_results_folder(dir) {
        RESULTS_RECORDS.contains(&name.as_str())
            || name.ends_with(".stdout")
            || name.ends_with(".stderr")
    } else {
        let sub = dir.file_name().map(|n| n.to_string_lossy().into_owned());
        matches!(sub.as_deref(), Some("jobs" | "apps"))
            && name.ends_with(".csv")
            && is_results_folder(parent_dir(dir))
    };
    record.then(|| {
        format!(
            "is {name}, a record of the results folder {}; isolane never writes over a run's \
             records (name a new file, or one outside the folder)",
            if is_results_folder(dir) {
                dir
            } else {
                parent_dir(dir)
            }
            .display()
        )
    })
}

/// Refuses an output path that is one of the command's own inputs under any name (the same
/// path, a symbolic or a hard link to it): writing it would destroy what the output is made
/// from. `inputs` pairs what each input is (`--model`, `--input`) with its path; a path that
/// does not exist, or one of them being a character device (`/dev/stdout`), is no clash.
pub fn refuse_input_as_output(
    flag: &str,
    out: &Path,
    inputs: &[(&str, &Path)],
) -> Result<(), OutputFileError> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let Ok(o) = std::fs::metadata(out) else {
        return Ok(());
    };
    if o.file_type().is_char_device() {
        return Ok(());
    }
    for (what, input) in inputs {
        let Ok(i) = std::fs::metadata(input) else {
            continue;
        };
        if (i.dev(), i.ino()) == (o.dev(), o.ino()) {
            return Err(OutputFileError::Refused {
                path: out.to_path_buf(),
                why: format!(
                    "{flag} is the same file as {what} {}; isolane never writes its output over \
                     one of its inputs (name another file)",
                    input.display()
                ),
            });
        }
    }
    Ok(())
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
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};

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

    fn mkfifo(path: &Path) {
        use std::os::unix::ffi::OsStrExt;
        let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
        // SAFETY: `c` is a NUL-terminated path, as mkfifo(3) requires.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    }

    /// The machine's own devices must come out of every test as they went in.
    fn devices_intact() {
        for d in ["/dev/null", "/dev/full"] {
            let t = std::fs::symlink_metadata(d).unwrap().file_type();
            assert!(t.is_char_device(), "{d} is no longer a character device");
        }
    }

    fn refusal(path: &Path) -> String {
        let e = write_output(path, b"x").unwrap_err();
        assert!(e.is_user_error(), "{e}");
        e.to_string()
    }

    #[test]
    fn a_results_folders_records_are_never_written_over() {
        let d = tempfile::tempdir().unwrap();
        let run = d.path();
        std::fs::create_dir(run.join("jobs")).unwrap();
        let records = [
            "summary.json",
            "workloads.csv",
            "scenario.toml",
            "jobs/echo.csv",
        ];
        for f in records.iter().chain(&["cam.stdout"]) {
            std::fs::write(run.join(f), "measured").unwrap();
        }
        for f in records.iter().chain(&["cam.stdout"]) {
            let e = refusal(&run.join(f));
            assert!(e.contains("a record of the results folder"), "{e}");
            assert_eq!(std::fs::read_to_string(run.join(f)).unwrap(), "measured");
        }
        // Through a link too: the file behind it is what counts.
        let link = d.path().join("link.json");
        std::os::unix::fs::symlink(run.join("summary.json"), &link).unwrap();
        refusal(&link);
        assert_eq!(
            std::fs::read_to_string(run.join("summary.json")).unwrap(),
            "measured"
        );
        // What commands derive from the records may be written, again and again.
        for f in ["trace.json", "report.html", "explain.json"] {
            write_output(&run.join(f), b"one").unwrap();
            write_output(&run.join(f), b"two").unwrap();
        }
        // A killed run's folder has no summary.json yet; its records are kept all the same.
        let killed = tempfile::tempdir().unwrap();
        std::fs::create_dir(killed.path().join("jobs")).unwrap();
        for f in ["scenario.toml", "jobs/a.csv"] {
            std::fs::write(killed.path().join(f), "measured").unwrap();
        }
        for f in ["scenario.toml", "jobs/a.csv"] {
            refusal(&killed.path().join(f));
        }
        // The same names outside a results folder are ordinary files.
        let other = tempfile::tempdir().unwrap();
        std::fs::write(other.path().join("scenario.toml"), "old").unwrap();
        write_output(&other.path().join("scenario.toml"), b"new").unwrap();
    }

    #[test]
    fn a_device_is_no_file_to_read_whole() {
        let e = refuse_device("--input", Path::new("/dev/zero")).unwrap_err();
        assert!(
            e.contains("--input /dev/zero: is a character device"),
            "{e}"
        );
        let d = tempfile::tempdir().unwrap();
        let link = d.path().join("x.npy");
        std::os::unix::fs::symlink("/dev/urandom", &link).unwrap();
        refuse_device("--input", &link).unwrap_err();
        let file = d.path().join("y.npy");
        std::fs::write(&file, "x").unwrap();
        refuse_device("--input", &file).unwrap();
        refuse_device("--input", &d.path().join("missing.npy")).unwrap();
    }

    #[test]
    fn an_input_under_any_name_is_never_an_output() {
        let d = tempfile::tempdir().unwrap();
        let model = d.path().join("m.onnx");
        std::fs::write(&model, "weights").unwrap();
        let soft = d.path().join("soft.isoplan");
        std::os::unix::fs::symlink(&model, &soft).unwrap();
        let hard = d.path().join("hard.isoplan");
        std::fs::hard_link(&model, &hard).unwrap();
        let inputs = [("the model", model.as_path())];
        for out in [&model, &soft, &hard] {
            let e = refuse_input_as_output("-o", out, &inputs).unwrap_err();
            assert!(e.is_user_error());
            assert!(e.to_string().contains("same file as the model"), "{e}");
        }
        let new = d.path().join("new.isoplan");
        refuse_input_as_output("-o", &new, &inputs).unwrap();
        std::fs::write(&new, "other").unwrap();
        refuse_input_as_output("-o", &new, &inputs).unwrap();
        refuse_input_as_output(
            "-o",
            Path::new("/dev/null"),
            &[("x", Path::new("/dev/null"))],
        )
        .unwrap();
        assert_eq!(std::fs::read_to_string(&model).unwrap(), "weights");
    }

    #[test]
    fn an_output_file_is_new_or_regular_and_its_folder_is_never_made() {
        let d = tempfile::tempdir().unwrap();
        let new = d.path().join("report.html");
        write_output(&new, b"one").unwrap();
        std::fs::set_permissions(&new, std::fs::Permissions::from_mode(0o640)).unwrap();
        write_output(&new, b"two").unwrap();
        assert_eq!(std::fs::read(&new).unwrap(), b"two");
        // Replaced, with the permissions of the file it replaced, and no temporary left.
        let mode = std::fs::metadata(&new).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o640);
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 1);

        let missing = d.path().join("no-such").join("deeper").join("x.html");
        let e = refusal(&missing);
        assert!(e.contains("no-such/deeper does not exist"), "{e}");
        assert!(!d.path().join("no-such").exists());

        let e = refusal(d.path());
        assert!(e.contains("is a folder, not a regular file"), "{e}");
        let e = refusal(&new.join("x"));
        assert!(e.contains("is a regular file, not a folder"), "{e}");
        // /proc holds no files: said once, as the user's (another path).
        let e = refusal(Path::new("/proc/x.json"));
        assert!(
            e.starts_with("cannot write /proc/x.json: cannot create a file in /proc: ")
                && e.matches("os error").count() == 1,
            "{e}"
        );
        devices_intact();
    }

    #[test]
    fn a_link_is_written_through_to_its_file_and_a_fifo_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let target = d.path().join("target.json");
        std::fs::write(&target, "old").unwrap();
        let link = d.path().join("link.json");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        write_output(&link, b"new").unwrap();
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(std::fs::read(&target).unwrap(), b"new");

        let fifo = d.path().join("fifo");
        mkfifo(&fifo);
        let e = refusal(&fifo);
        assert!(e.contains("FIFO"), "{e}");
        let to_fifo = d.path().join("to-fifo");
        std::os::unix::fs::symlink(&fifo, &to_fifo).unwrap();
        let e = refusal(&to_fifo);
        assert!(
            e.contains("a symbolic link to") && e.contains("FIFO"),
            "{e}"
        );
        assert!(std::fs::symlink_metadata(&fifo)
            .unwrap()
            .file_type()
            .is_fifo());

        let dangling = d.path().join("dangling");
        std::os::unix::fs::symlink(d.path().join("gone"), &dangling).unwrap();
        let e = refusal(&dangling);
        assert!(e.contains("does not exist"), "{e}");
        assert!(!d.path().join("gone").exists());
        devices_intact();
    }

    #[test]
    fn a_character_device_is_written_through_not_replaced() {
        devices_intact();
        write_output(Path::new("/dev/null"), b"discarded").unwrap();
        devices_intact();
        // A link in a folder of ours to /dev/null: written through the link, which stays.
        let d = tempfile::tempdir().unwrap();
        let link = d.path().join("null");
        std::os::unix::fs::symlink("/dev/null", &link).unwrap();
        write_output(&link, b"discarded").unwrap();
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        devices_intact();
    }

    #[test]
    fn binary_files_are_read_from_regular_files_only_and_capped() {
        let d = tempfile::tempdir().unwrap();
        let file = d.path().join("m.onnx");
        std::fs::write(&file, vec![7u8; 2048]).unwrap();
        assert_eq!(read_file_capped(&file, 2048).unwrap(), vec![7u8; 2048]);
        let e = read_file_capped(&file, 1024).unwrap_err().to_string();
        assert!(e.contains("is 2048 bytes, larger than 1 KiB"), "{e}");
        // Devices, FIFOs and folders are refused before a byte is read, through a link too:
        // none of these calls may block or grow without bound.
        let zero = d.path().join("zero.npy");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        for (p, what) in [
            (Path::new("/dev/zero"), "a character device"),
            (zero.as_path(), "a character device"),
            (d.path(), "a folder"),
        ] {
            let e = read_file_capped(p, u64::MAX).unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
            assert!(
                e.to_string()
                    .starts_with(&format!("is {what}, not a regular file")),
                "{e}"
            );
        }
        let fifo = d.path().join("x.npy");
        mkfifo(&fifo);
        let e = read_file_capped(&fifo, u64::MAX).unwrap_err().to_string();
        assert!(
            e.starts_with("is a FIFO (named pipe), not a regular file"),
            "{e}"
        );
        let e = read_file_capped(&d.path().join("missing"), 10).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
    }

    #[test]
    fn reads_are_capped_and_happen_once() {
        let d = tempfile::tempdir().unwrap();
        let big = d.path().join("big.toml");
        std::fs::write(&big, vec![b'#'; 2048]).unwrap();
        assert_eq!(read_text_capped(&big, 2048).unwrap().len(), 2048);
        let e = read_text_capped(&big, 1024).unwrap_err().to_string();
        assert!(e.contains("larger than 1 KiB"), "{e}");
        // An endless file ends in the same error.
        let e = read_text_capped(Path::new("/dev/zero"), 4096)
            .unwrap_err()
            .to_string();
        assert!(e.contains("larger than 4 KiB"), "{e}");
        let e = read_config(Path::new("/dev/zero")).unwrap_err().to_string();
        assert!(e.contains("/dev/zero") && e.contains("16 MiB"), "{e}");
        std::fs::write(&big, b"ok\xff").unwrap();
        let e = read_text_capped(&big, 1024).unwrap_err().to_string();
        assert!(e.contains("not UTF-8") && e.contains("offset 2"), "{e}");
        // A FIFO gives its text once: read in one open and one pass, it is all there.
        let fifo = d.path().join("fifo");
        mkfifo(&fifo);
        let writer = {
            let fifo = fifo.clone();
            std::thread::spawn(move || std::fs::write(&fifo, "[device]\n").unwrap())
        };
        assert_eq!(read_text_capped(&fifo, 1024).unwrap(), "[device]\n");
        writer.join().unwrap();
    }

    /// A results file made a FIFO by hand blocked `isolane compare` forever (it opened the
    /// FIFO and waited for a writer), and one that is a folder or /dev/zero was taken as
    /// missing: a results file is read from a regular file only, and refused by what it is.
    #[test]
    fn a_results_file_is_read_from_a_regular_file_only() {
        let d = tempfile::tempdir().unwrap();
        let ok = d.path().join("summary.json");
        std::fs::write(&ok, "{}").unwrap();
        assert_eq!(read_text(&ok).unwrap(), "{}");
        let [(zero, zero_is), (fifo, fifo_is)] = a_device_and_a_fifo(d.path(), ".csv");
        for (p, what) in [
            (zero.as_path(), zero_is),
            (fifo.as_path(), fifo_is),
            (d.path(), "a folder"),
        ] {
            assert!(is_there(p));
            let e = read_text(p).unwrap_err().to_string();
            assert!(e.starts_with(&format!("{}: is {what}", p.display())), "{e}");
        }
        let dangling = d.path().join("dangling.csv");
        std::os::unix::fs::symlink(d.path().join("gone"), &dangling).unwrap();
        assert!(is_there(&dangling) && !is_there(&d.path().join("gone")));
        let e = read_text(&dangling).unwrap_err().to_string();
        assert!(e.contains("No such file"), "{e}");
    }

    /// `check_output` refuses what `write_output` refuses, and creates nothing.
    #[test]
    fn an_output_path_is_checked_before_the_work_as_it_is_written() {
        let d = tempfile::tempdir().unwrap();
        let run = d.path().join("run");
        std::fs::create_dir(&run).unwrap();
        std::fs::write(run.join("summary.json"), "{}").unwrap();
        let fifo = d.path().join("fifo");
        mkfifo(&fifo);
        let dangling = d.path().join("dangling");
        std::os::unix::fs::symlink(d.path().join("gone"), &dangling).unwrap();
        for bad in [
            d.path().to_path_buf(),
            d.path().join("no-such").join("x.json"),
            fifo,
            dangling,
            run.join("summary.json"),
        ] {
            let checked = check_output(&bad).unwrap_err();
            assert!(checked.is_user_error(), "{checked}");
            assert_eq!(checked.to_string(), refusal(&bad));
        }
        let new = d.path().join("new.toml");
        check_output(&new).unwrap();
        assert!(!new.exists());
        check_output(&run.join("report.html")).unwrap();
        check_output(Path::new("/dev/null")).unwrap();
        assert!(!d.path().join("gone").exists() && !d.path().join("no-such").exists());
        devices_intact();
    }
}
