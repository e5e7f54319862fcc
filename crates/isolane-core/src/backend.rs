//! A scenario moved to the CPU backend (`run`/`serve --backend cpu`), and what is said when a
//! GPU scenario meets a machine without a usable GPU.

use crate::spec::{Backend, Host, Mechanism, ModelCatalog, PartitionSpec, Precision, Scenario};
use crate::text::{wrap_message, ERROR_WIDTH};
use crate::user_error::{user, UserError};

/// Whether a workload of `s` runs on a CUDA GPU.
pub fn needs_gpu(s: &Scenario) -> bool {
    s.device.backend == Backend::Cuda && s.workloads.iter().any(|w| w.on_gpu())
}

/// A GPU scenario on a machine without a usable GPU: which file and field ask for cuda, why it
/// cannot run here, and the override that runs it on the CPU (a runtime failure, exit 1, as
/// any GPU failure), wrapped for a terminal.
pub fn no_gpu_text(s: &Scenario, file: &str, why: &str) -> String {
    let gpu_workloads: Vec<&str> = s
        .workloads
        .iter()
        .filter(|w| w.on_gpu())
        .map(|w| w.name.as_str())
        .collect();
    wrap_message(
        &format!(
            "{file}: device.backend = \"cuda\" (mechanism \"{}\"): {} on a CUDA GPU, and \
             none can be used here: {why}.\nTo run the workloads on the CPU instead: isolane \
             run {file} --backend cpu (partitions, GPUs and fp16/bf16/tf32 are dropped, each \
             said in a note; rates sized for a GPU may miss their deadlines on the CPU).",
            s.device.mechanism.name(),
            match gpu_workloads.as_slice() {
                [one] => format!("workload `{one}` runs"),
                all => format!("its {} workloads run", all.len()),
            },
        ),
        ERROR_WIDTH,
    )
}

/// `--backend B` on a scenario file. `cpu`: every workload on the CPU backend, the scenario's
/// GPU settings dropped and each drop said through `note` (wrapped), then the scenario checked
/// again against `models`; `cuda`: the scenario must already be one.
pub fn override_backend(
    s: &mut Scenario,
    file: &str,
    backend: &str,
    models: &dyn ModelCatalog,
    note: &mut dyn FnMut(&str),
) -> Result<(), UserError> {
    if backend == "cuda" {
        if s.device.backend == Backend::Cuda {
            return Ok(());
        }
        return Err(user(format!(
            "--backend cuda: {file} runs on the CPU (device.backend = \"cpu\"); a GPU scenario \
             needs [device] backend = \"cuda\" and a mechanism (docs/scenario.md); --backend \
             cpu is the only override of a scenario's backend"
        )));
    }
    for n in on_cpu(s) {
        note(&wrap_message(&format!("note: --backend cpu: {n}"), 80));
    }
    s.validate(models).map_err(|e| {
        user(format!(
            "--backend cpu: {file} cannot run on the CPU as it is: {e}"
        ))
    })
}

/// The scenario with every workload on the CPU backend: no mechanism, partitions, GPUs or
/// reduced precisions (the CPU backend runs fp32); returns what was dropped, in words.
pub fn on_cpu(s: &mut Scenario) -> Vec<String> {
    let mut notes = Vec::new();
    if s.device.backend == Backend::Cpu && !s.workloads.iter().any(|w| w.on_gpu()) {
        return notes; // already a CPU scenario: its hosts are its own
    }
    let d = &mut s.device;
    if d.backend == Backend::Cuda && d.mechanism != Mechanism::None {
        notes.push(format!(
            "device.backend \"cuda\" and mechanism \"{}\" dropped: the workloads run on the \
             CPU, not partitioned",
            d.mechanism.name()
        ));
    }
    if d.several_gpus() {
        notes.push("device.gpus dropped".into());
    }
    d.backend = Backend::Cpu;
    d.mechanism = Mechanism::None;
    d.host = Host::Thread;
    d.gpus.clear();
    d.gpu = 0;
    let (mut partitioned, mut reduced, mut pinned) = (Vec::new(), Vec::new(), Vec::new());
    for w in &mut s.workloads {
        if w.partition != PartitionSpec::default() {
            partitioned.push(w.name.clone());
        }
        if w.program.is_none() && w.precision != Precision::Fp32 {
            reduced.push(format!("{} ({})", w.name, w.precision.name()));
            w.precision = Precision::Fp32;
        }
        if w.gpu.is_some() {
            pinned.push(w.name.clone());
        }
        w.partition = PartitionSpec::default();
        w.backend = Backend::Cpu;
        w.gpu = None;
        if w.program.is_none() {
            w.host = Host::Thread;
        }
    }
    if !partitioned.is_empty() {
        notes.push(format!("partitions dropped: {}", partitioned.join(", ")));
    }
    if !reduced.is_empty() {
        notes.push(format!(
            "fp32 instead of {} (the CPU backend computes in fp32)",
            reduced.join(", ")
        ));
    }
    if !pinned.is_empty() {
        notes.push(format!("`gpu` dropped: {}", pinned.join(", ")));
    }
    notes
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two green partitions of resnet18 on one GPU.
    const GREEN: &str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scenarios/gpu/green-2x64-resnet18.toml"
    );
    const MODELS: [&str; 1] = ["resnet18"];

    #[test]
    fn backend_cpu_runs_a_gpu_scenario_on_the_cpu_and_says_what_it_dropped() {
        let (models, path) = (MODELS, GREEN);
        let mut s = Scenario::load(path, &models).unwrap();
        assert!(needs_gpu(&s));
        let notes = on_cpu(&mut s).join("\n");
        assert!(!needs_gpu(&s));
        assert!(notes.contains("mechanism \"green\" dropped"), "{notes}");
        assert!(notes.contains("partitions dropped: front, rear"), "{notes}");
        assert!(s.workloads.iter().all(|w| w.backend == Backend::Cpu
            && w.partition == PartitionSpec::default()
            && w.precision == Precision::Fp32));
        // The result is a scenario the CPU runs.
        s.validate(&models).unwrap();
        // The error without a GPU names the file, the field and the override.
        let e = no_gpu_text(
            &Scenario::load(path, &models).unwrap(),
            "g.toml",
            "no CUDA driver: libcuda not found",
        );
        let flat = e.split_whitespace().collect::<Vec<_>>().join(" ");
        for want in [
            "g.toml: device.backend = \"cuda\"",
            "no CUDA driver",
            "isolane run g.toml --backend cpu",
        ] {
            assert!(flat.contains(want), "{want}: {e}");
        }
        assert!(e.lines().all(|l| l.chars().count() <= ERROR_WIDTH), "{e}");
    }

    #[test]
    fn backend_cuda_refuses_a_cpu_scenario_and_keeps_a_gpu_one() {
        let (models, path) = (MODELS, GREEN);
        let mut s = Scenario::load(path, &models).unwrap();
        let mut said = Vec::new();
        override_backend(&mut s, "g.toml", "cuda", &models, &mut |n| {
            said.push(n.to_string())
        })
        .unwrap();
        assert!(said.is_empty() && needs_gpu(&s));
        override_backend(&mut s, "g.toml", "cpu", &models, &mut |n| {
            said.push(n.to_string())
        })
        .unwrap();
        assert!(
            said.iter().all(|n| n.starts_with("note: --backend cpu: ")),
            "{said:?}"
        );
        assert!(!said.is_empty() && !needs_gpu(&s));
        let e = override_backend(&mut s, "g.toml", "cuda", &models, &mut |_| {}).unwrap_err();
        assert!(
            e.to_string()
                .contains("--backend cuda: g.toml runs on the CPU"),
            "{e}"
        );
    }
}
