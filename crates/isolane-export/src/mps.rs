//! `isolane export mps`: a plan of MPS partitions for use without isolane. `mps-daemon.sh`
//! starts (and stops) one MPS control daemon per GPU of the plan, and `clients/<workload>.env`
//! holds what each client process must have in its environment: the daemon's pipe folder, its
//! thread percentage (`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`), its pinned device memory limit
//! (`CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`) and, for best effort beside critical work, the
//! below-normal client priority isolane gives it (docs/criticality.md).

use std::collections::BTreeMap;

use isolane_core::spec::{Criticality, Mechanism};

use crate::{user, Export, ExportError, ExportFile, Planned};

pub const DAEMON_FILE: &str = "mps-daemon.sh";
pub const CLIENTS_DIR: &str = "clients";

/// Every file name an MPS export can write (`clients/` holds one `.env` per workload).
pub const FILES: &[&str] = &[
    DAEMON_FILE,
    "clients/",
    crate::capacity::FILE,
    crate::NOTES_FILE,
];

/// The export's files and notes (capacity.yaml and NOTES.txt are added by the caller).
pub fn export(plan: Planned<'_>) -> Result<Export, ExportError> {
    let s = plan.scenario;
    let file = plan.file;
    if s.device.mechanism != Mechanism::Mps {
        return Err(user(format!(
            "{file}: device.mechanism = \"{}\": `isolane export mps` takes a plan of MPS \
             partitions (mechanism = \"mps\"); {}",
            s.device.mechanism.name(),
            what_maps(s.device.mechanism)
        )));
    }
    let clients: Vec<_> = plan.gpu_workloads().collect();
    if clients.is_empty() {
        return Err(user(format!(
            "{file}: no workload runs on the GPU (every workload has backend = \"cpu\"), so \
             there is no MPS client to export"
        )));
    }
    let mut notes = Vec::new();
    for w in s.workloads.iter().filter(|w| !w.on_gpu()) {
        notes.push(format!(
            "`{}` runs on the CPU (backend = \"cpu\"): it is no MPS client and has no file here",
            w.name
        ));
    }
    let protected = s.protection.enabled
        && s.workloads
            .iter()
            .any(|w| w.criticality == Criticality::Critical)
        && s.workloads
            .iter()
            .any(|w| w.criticality == Criticality::BestEffort);
    if protected && s.protection.guard {
        notes.push(
            "the guard that holds best-effort work back while a critical job needs the GPU \
             ([protection] guard) is isolane's own: MPS has no setting for it, so best-effort \
             clients started from these files are not held back"
                .into(),
        );
    }
    let mut files = Vec::new();
    let mut names: BTreeMap<String, &str> = BTreeMap::new();
    let gpus = s.device.all_gpus();
    for (_, w) in &clients {
        let env_name = format!("{}.env", env_file_stem(&w.name));
        if let Some(other) = names.insert(env_name.clone(), &w.name) {
            return Err(user(format!(
                "{file}: workloads `{other}` and `{}` would both be written to {CLIENTS_DIR}/\
                 {env_name}; give them names that differ in letters, digits, `.`, `_` or `-`",
                w.name
            )));
        }
        let gpu = w.gpu_on(&s.device);
        let p = &w.partition;
        let pct = p.thread_pct.unwrap_or(100);
        let mut text = format!(
            "# MPS client settings of workload `{}` ({}, batch {}, {}) on GPU {gpu}, planned in \
             {file}\n# (isolane export mps; docs/export.md). Source it in the client's shell \
             before it starts CUDA:\n#   . {CLIENTS_DIR}/{env_name}\n\
             MPS_ROOT=\"${{MPS_ROOT:-/tmp/isolane-mps}}\"\n\
             export CUDA_MPS_PIPE_DIRECTORY=\"$MPS_ROOT/gpu{gpu}/pipe\"\n\
             export CUDA_MPS_LOG_DIRECTORY=\"$MPS_ROOT/gpu{gpu}/log\"\n\
             export CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={pct}\n",
            w.name,
            w.model,
            w.batch,
            w.precision.name()
        );
        match p.mem_limit_mib {
            // The daemon of this GPU sees only it: the client's device ordinal is 0.
            Some(m) => text.push_str(&format!("export CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0={m}M\n")),
            None => {
                text.push_str(
                    "# No pinned device memory limit: the plan sets none (partition.mem_limit_mib).\n\
                     unset CUDA_MPS_PINNED_DEVICE_MEM_LIMIT\n",
                );
                notes.push(format!(
                    "`{}` has no pinned device memory limit in the plan (partition.mem_limit_mib \
                     unset): its client may pin all of GPU {gpu}'s memory",
                    w.name
                ));
            }
        }
        if protected && s.protection.priorities && w.criticality == Criticality::BestEffort {
            text.push_str(
                "# Best effort beside critical work: below-normal priority, as isolane runs it.\n\
                 export CUDA_MPS_CLIENT_PRIORITY=1\n",
            );
        } else {
            text.push_str("unset CUDA_MPS_CLIENT_PRIORITY\n");
        }
        files.push(ExportFile {
            path: format!("{CLIENTS_DIR}/{env_name}"),
            text,
        });
    }
    files.insert(0, daemon_script(file, &gpus));
    Ok(Export { files, notes })
}

/// What the other formats take, for a refusal.
pub(crate) fn what_maps(m: Mechanism) -> &'static str {
    match m {
        Mechanism::Green => {
            "green contexts are made inside one process and have no daemon setting: export the \
             plan with `isolane export k8s`"
        }
        Mechanism::Mig => "export its MIG layout with `isolane export mig-parted`",
        Mechanism::Timeslice | Mechanism::None => {
            "time-slicing needs no MPS settings: export the plan with `isolane export k8s`"
        }
        Mechanism::Mps => "",
    }
}

/// A workload's name made safe for a file name (as its jobs CSV's).
fn env_file_stem(name: &str) -> String {
    let csv = isolane_core::files::jobs_file_name(name);
    csv.trim_end_matches(".csv").to_string()
}

fn daemon_script(file: &str, gpus: &[u32]) -> ExportFile {
    let list: Vec<String> = gpus.iter().map(u32::to_string).collect();
    let text = format!(
        r#"#!/bin/sh
# The MPS control daemons of the plan {file}, one per GPU (isolane export mps; docs/export.md).
#   sh {DAEMON_FILE} start    before the clients (each sources its {CLIENTS_DIR}/<workload>.env)
#   sh {DAEMON_FILE} stop     after them
# MPS_ROOT (default /tmp/isolane-mps) holds each GPU's pipe and log folder; the clients' files
# read the same variable. Each daemon sees only its GPU, as NVIDIA's MPS guide advises.
set -eu
MPS_ROOT="${{MPS_ROOT:-/tmp/isolane-mps}}"
GPUS="{gpus}"
case "${{1:-start}}" in
start)
  for g in $GPUS; do
    mkdir -p "$MPS_ROOT/gpu$g/pipe" "$MPS_ROOT/gpu$g/log"
    CUDA_VISIBLE_DEVICES="$g" CUDA_MPS_PIPE_DIRECTORY="$MPS_ROOT/gpu$g/pipe" \
      CUDA_MPS_LOG_DIRECTORY="$MPS_ROOT/gpu$g/log" nvidia-cuda-mps-control -d
  done
  ;;
stop)
  for g in $GPUS; do
    echo quit | CUDA_MPS_PIPE_DIRECTORY="$MPS_ROOT/gpu$g/pipe" nvidia-cuda-mps-control
  done
  ;;
*)
  echo "usage: $0 start|stop" >&2
  exit 2
  ;;
esac
"#,
        gpus = list.join(" ")
    );
    ExportFile {
        path: DAEMON_FILE.into(),
        text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing;

    fn file<'a>(e: &'a Export, path: &str) -> &'a str {
        &e.files.iter().find(|f| f.path == path).unwrap().text
    }

    #[test]
    fn each_client_gets_its_thread_percentage_and_pinned_memory_limit() {
        let s = testing::mps();
        let e = export(Planned::new(&s, "p.toml").unwrap()).unwrap();
        let inspect = file(&e, "clients/inspect.env");
        assert!(
            inspect.contains("export CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=60\n"),
            "{inspect}"
        );
        assert!(inspect.contains("export CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4096M\n"));
        assert!(inspect.contains("export CUDA_MPS_PIPE_DIRECTORY=\"$MPS_ROOT/gpu0/pipe\""));
        let cam = file(&e, "clients/cam.env");
        assert!(
            cam.contains("export CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30\n"),
            "{cam}"
        );
        assert!(
            cam.contains("unset CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"),
            "{cam}"
        );
        assert!(
            e.notes
                .iter()
                .any(|n| n.contains("`cam` has no pinned device memory limit")),
            "{:?}",
            e.notes
        );
        assert!(file(&e, DAEMON_FILE).contains("GPUS=\"0\""));
    }

    #[test]
    fn the_env_files_set_what_a_shell_reads_back() {
        let s = testing::mps();
        let e = export(Planned::new(&s, "p.toml").unwrap()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let env = dir.path().join("inspect.env");
        std::fs::write(&env, file(&e, "clients/inspect.env")).unwrap();
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!(
                ". '{}' && echo \"$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE|$CUDA_MPS_PINNED_DEVICE_MEM_LIMIT|$CUDA_MPS_PIPE_DIRECTORY\"",
                env.display()
            ))
            .env("MPS_ROOT", "/run/m")
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "60|0=4096M|/run/m/gpu0/pipe"
        );
    }

    #[test]
    fn best_effort_beside_critical_gets_below_normal_priority_and_the_guard_is_a_note() {
        let mut s = testing::mps();
        s.workloads[1].criticality = Criticality::BestEffort;
        let e = export(Planned::new(&s, "p.toml").unwrap()).unwrap();
        assert!(file(&e, "clients/cam.env").contains("export CUDA_MPS_CLIENT_PRIORITY=1"));
        assert!(file(&e, "clients/inspect.env").contains("unset CUDA_MPS_CLIENT_PRIORITY"));
        assert!(e.notes.iter().any(|n| n.contains("guard")), "{:?}", e.notes);
    }

    #[test]
    fn a_plan_of_another_mechanism_is_refused_naming_the_field_and_what_maps() {
        let s = testing::green();
        let e = export(Planned::new(&s, "p.toml").unwrap()).unwrap_err();
        assert!(e.is_user_error());
        let m = e.to_string();
        assert!(m.contains("p.toml: device.mechanism = \"green\""), "{m}");
        assert!(m.contains("isolane export k8s"), "{m}");
        let s = testing::mig();
        let m = export(Planned::new(&s, "p.toml").unwrap())
            .unwrap_err()
            .to_string();
        assert!(m.contains("isolane export mig-parted"), "{m}");
    }
}
