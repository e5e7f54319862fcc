//! `isolane export`: a planned scenario (what `isolane plan --auto` writes) handed to machines
//! that do not run isolane's own commands (docs/export.md):
//!
//! - [`k8s`]: Kubernetes manifests that run `isolane serve` with the plan on each GPU node of
//!   the type it was verified on, with the GPU claim (DRA, or the NVIDIA device plugin);
//! - [`mps`]: the MPS control daemon and each client's settings, for a plan used without
//!   isolane;
//! - [`mig`]: the plan's MIG layout as a nvidia-mig-parted configuration;
//! - [`capacity`]: with each of them, what each model was measured to do in its partition.
//!
//! Every value is a typed struct written with serde; what a format cannot express comes back
//! as a note ([`Export::notes`]), which the CLI prints and NOTES.txt keeps: never dropped.

pub mod capacity;
pub mod command;
pub mod k8s;
pub mod mig;
pub mod mps;

use std::path::{Path, PathBuf};

use isolane_core::spec::{Mechanism, Scenario, WorkloadSpec};

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// The user's to fix (exit code 2): a scenario that is not planned or that the format
    /// cannot take, a flag's value, an occupied output folder, a measurement that cannot be
    /// read. The message names the file, the field and what is allowed.
    #[error("{0}")]
    User(String),
    /// Writing failed (a full disk): a runtime failure (exit code 1).
    #[error("cannot write {}: {error}", path.display())]
    Write {
        path: PathBuf,
        // Not a `#[source]`: the message holds it already.
        error: std::io::Error,
    },
}

impl ExportError {
    pub fn is_user_error(&self) -> bool {
        matches!(self, ExportError::User(_))
    }
}

pub(crate) fn user(msg: impl Into<String>) -> ExportError {
    ExportError::User(msg.into())
}

/// One file of an export, relative to the output folder.
#[derive(Debug, Clone, PartialEq)]
pub struct ExportFile {
    pub path: String,
    pub text: String,
}

/// What an export writes, and what the format could not express or the measurements did not
/// cover (one line each, said on stderr and kept in the folder's NOTES.txt).
#[derive(Debug, Clone, Default)]
pub struct Export {
    pub files: Vec<ExportFile>,
    pub notes: Vec<String>,
}

impl Export {
    /// Adds `NOTES.txt` with every note (also when there is none: the file says so).
    pub(crate) fn with_notes_file(mut self, format: &str, scenario: &str) -> Export {
        let mut text = format!(
            "isolane export {format} of {scenario}: what this format cannot express, and what \
             was not measured (docs/export.md).\n\n"
        );
        if self.notes.is_empty() {
            text.push_str("Nothing: every setting of the plan is in these files.\n");
        }
        for n in &self.notes {
            text.push_str("- ");
            text.push_str(n);
            text.push('\n');
        }
        self.files.push(ExportFile {
            path: NOTES_FILE.into(),
            text,
        });
        self
    }
}

pub const NOTES_FILE: &str = "NOTES.txt";

/// What to export.
#[derive(Debug, Clone)]
pub enum Format {
    K8s(k8s::Options),
    Mps,
    /// `name`: the configuration's key in `mig-configs`.
    MigParted {
        name: String,
    },
}

impl Format {
    /// The word of the command line (`isolane export WORD`).
    pub fn word(&self) -> &'static str {
        match self {
            Format::K8s(_) => "k8s",
            Format::Mps => "mps",
            Format::MigParted { .. } => "mig-parted",
        }
    }

    /// Every file name an export of this format can write (what `--force` replaces).
    pub fn files(&self) -> &'static [&'static str] {
        match self {
            Format::K8s(_) => k8s::FILES,
            Format::Mps => mps::FILES,
            Format::MigParted { .. } => mig::FILES,
        }
    }
}

/// The whole export of `plan` in `format`: its files, capacity.yaml from the measurements, and
/// NOTES.txt with every note.
pub fn export(
    format: &Format,
    plan: Planned<'_>,
    measurements: &capacity::Measurements,
) -> Result<Export, ExportError> {
    let mut e = match format {
        Format::K8s(o) => k8s::export(plan, o)?,
        Format::Mps => mps::export(plan)?,
        Format::MigParted { name } => mig::export(plan, name)?,
    };
    let (c, notes) = capacity::capacity(plan, measurements);
    e.files.push(capacity::file(&c));
    e.notes.extend(notes);
    Ok(e.with_notes_file(format.word(), plan.file))
}

/// A planned scenario: valid, and every GPU workload's partition filled in for its mechanism.
#[derive(Debug, Clone, Copy)]
pub struct Planned<'a> {
    pub scenario: &'a Scenario,
    /// The scenario file as messages name it.
    pub file: &'a str,
}

impl<'a> Planned<'a> {
    /// Checks that `scenario` is planned: a scenario without its partitions would export a
    /// layout nobody verified.
    pub fn new(scenario: &'a Scenario, file: &'a str) -> Result<Planned<'a>, ExportError> {
        let mechanism = scenario.device.mechanism;
        for (i, w) in scenario.workloads.iter().enumerate() {
            if !w.on_gpu() {
                continue;
            }
            let missing = match mechanism {
                Mechanism::Green if w.partition.sms.is_none() => Some("sms"),
                Mechanism::Mps if w.partition.thread_pct.is_none() => Some("thread_pct"),
                Mechanism::Mig if w.partition.mig_profile.is_none() => Some("mig_profile"),
                _ => None,
            };
            if let Some(field) = missing {
                return Err(user(format!(
                    "{file}: workload[{i}] (`{}`): partition.{field} is missing; `isolane export` \
                     takes a planned scenario, every GPU workload's partition filled in for \
                     mechanism = \"{}\" (plan it first: `isolane plan --auto {file} -o \
                     planned.toml`)",
                    w.name,
                    mechanism.name()
                )));
            }
        }
        Ok(Planned { scenario, file })
    }

    /// The workloads on a GPU, with their index in the file.
    pub fn gpu_workloads(&self) -> impl Iterator<Item = (usize, &'a WorkloadSpec)> {
        self.scenario
            .workloads
            .iter()
            .enumerate()
            .filter(|(_, w)| w.on_gpu())
    }
}

/// A workload's partition in words, as the capacity file and the notes name it.
pub fn partition_words(mechanism: Mechanism, w: &WorkloadSpec) -> String {
    if !w.on_gpu() {
        return match w.cpu.len() {
            0 => "CPU, not pinned".into(),
            1 => format!("CPU core {}", w.cpu[0]),
            _ => format!(
                "CPU cores {}",
                w.cpu
                    .iter()
                    .map(usize::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            ),
        };
    }
    let p = &w.partition;
    match mechanism {
        Mechanism::Green => format!("green {} SMs", p.sms.unwrap_or(0)),
        Mechanism::Mps => match p.mem_limit_mib {
            Some(m) => format!("mps {}%, {m} MiB pinned", p.thread_pct.unwrap_or(0)),
            None => format!("mps {}%", p.thread_pct.unwrap_or(0)),
        },
        Mechanism::Mig => format!("mig {}", p.mig_profile.as_deref().unwrap_or("")),
        Mechanism::Timeslice | Mechanism::None => "whole GPU (time-sliced)".into(),
    }
}

/// A name for files and Kubernetes objects: lowercase letters, digits and `-` only (RFC 1123),
/// at most `max` characters, from anything (`Camera A.onnx` → `camera-a-onnx`).
pub fn dns_label(text: &str, max: usize) -> String {
    let mut out = String::new();
    for c in text.chars() {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            out.push(c);
        } else if !out.ends_with('-') {
            out.push('-');
        }
    }
    let mut out: String = out.trim_matches('-').chars().take(max).collect();
    while out.ends_with('-') {
        out.pop();
    }
    out
}

/// Writes an export into `dir`. A folder that exists and is not empty is refused unless
/// `force`, which first removes the files an export of `format` can write (`known`), so that a
/// file of an earlier export never mixes in (`kubectl apply -f DIR` would apply it too), and
/// leaves every other file alone.
pub fn write_export(
    dir: &Path,
    force: bool,
    known: &[&str],
    export: &Export,
) -> Result<(), ExportError> {
    let unusable = |e: std::io::Error| {
        user(format!(
            "--out {}: {e}; choose an --out folder where you can write",
            dir.display()
        ))
    };
    if dir.exists() {
        if !dir.is_dir() {
            return Err(user(format!(
                "--out {}: exists and is not a folder; --out names the folder the export is \
                 written into",
                dir.display()
            )));
        }
        let mut entries = std::fs::read_dir(dir).map_err(unusable)?;
        if entries.next().is_some() {
            if !force {
                return Err(user(format!(
                    "--out {}: exists and is not empty; choose another --out, or pass --force \
                     to replace the export's files in it",
                    dir.display()
                )));
            }
            for name in known {
                remove_known(dir, name)?;
            }
        }
    }
    std::fs::create_dir_all(dir).map_err(unusable)?;
    for f in &export.files {
        let path = dir.join(&f.path);
        isolane_core::files::write_atomic(&path, f.text.as_bytes())
            .map_err(|error| ExportError::Write { path, error })?;
    }
    Ok(())
}

/// Removes `dir/name`, or every `*.env` in `dir/name` when `name` ends in `/` (a folder of
/// per-workload files); a missing one is fine.
fn remove_known(dir: &Path, name: &str) -> Result<(), ExportError> {
    let failed = |path: &Path, error: std::io::Error| ExportError::Write {
        path: path.to_path_buf(),
        error,
    };
    if let Some(folder) = name.strip_suffix('/') {
        let folder = dir.join(folder);
        let Ok(entries) = std::fs::read_dir(&folder) else {
            return Ok(());
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "env") {
                std::fs::remove_file(&p).map_err(|err| failed(&p, err))?;
            }
        }
        return Ok(());
    }
    let p = dir.join(name);
    match std::fs::remove_file(&p) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(failed(&p, e)),
        _ => Ok(()),
    }
}

/// YAML of a typed value, with a comment header.
pub(crate) fn yaml<T: serde::Serialize>(header: &str, value: &T) -> String {
    let body = serde_yaml_ng::to_string(value)
        .unwrap_or_else(|e| format!("# isolane could not write this object: {e}\n"));
    let mut text = String::new();
    for line in header.lines() {
        text.push_str("# ");
        text.push_str(line);
        text.push('\n');
    }
    text.push_str(&body);
    text
}

#[cfg(test)]
mod schema_check;
#[cfg(test)]
pub(crate) mod testing;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_labels_keep_letters_digits_and_single_dashes() {
        assert_eq!(dns_label("Camera A.onnx", 63), "camera-a-onnx");
        assert_eq!(dns_label("--x__y--", 63), "x-y");
        assert_eq!(
            dns_label("inspection-line.planned", 63),
            "inspection-line-planned"
        );
        assert_eq!(dns_label("abc-def", 4), "abc");
        assert_eq!(dns_label("___", 63), "");
    }

    #[test]
    fn an_unplanned_scenario_is_refused_naming_the_workload_and_field() {
        let mut s = testing::green();
        s.workloads[1].partition.sms = None;
        let e = Planned::new(&s, "plan.toml").unwrap_err();
        assert!(e.is_user_error());
        let m = e.to_string();
        assert!(
            m.contains("plan.toml: workload[1] (`cam`): partition.sms is missing"),
            "{m}"
        );
        assert!(m.contains("isolane plan --auto plan.toml"), "{m}");
    }

    #[test]
    fn an_occupied_folder_is_refused_and_force_replaces_only_the_exports_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("mine.txt"), "keep").unwrap();
        std::fs::write(dir.path().join("daemonset.yaml"), "stale").unwrap();
        let export = Export {
            files: vec![ExportFile {
                path: "deployment.yaml".into(),
                text: "new".into(),
            }],
            notes: vec![],
        };
        let e = write_export(dir.path(), false, &["daemonset.yaml"], &export).unwrap_err();
        assert!(e.is_user_error());
        assert!(e.to_string().contains("pass --force"), "{e}");
        assert!(!dir.path().join("deployment.yaml").exists());
        write_export(dir.path(), true, &["daemonset.yaml"], &export).unwrap();
        assert!(!dir.path().join("daemonset.yaml").exists());
        assert_eq!(
            std::fs::read_to_string(dir.path().join("mine.txt")).unwrap(),
            "keep"
        );
        assert_eq!(
            std::fs::read_to_string(dir.path().join("deployment.yaml")).unwrap(),
            "new"
        );
    }

    #[test]
    fn a_file_as_out_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("f");
        std::fs::write(&f, "x").unwrap();
        let e = write_export(&f, true, &[], &Export::default()).unwrap_err();
        assert!(e.to_string().contains("is not a folder"), "{e}");
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "x");
    }
}
