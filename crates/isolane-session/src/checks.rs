//! What commands other than `isolane run` refuse in a scenario, by name: command workloads,
//! several GPUs, workloads on a backend of their own. Each refusal is the user's mistake (exit
//! code 2 at the CLI) and says what to do instead.

use isolane_core::spec::{Backend, Scenario};

/// Command workloads (external programs, docs/programs.md) run only under `isolane run`: a
/// program has no jobs to search a rate for, profile, verify or ramp. `command` names the
/// subcommand refusing them (a user's mistake: exit code 2).
pub fn refuse_programs(scenario: &Scenario, file: &str, command: &str) -> Result<(), String> {
    match scenario.workloads.iter().find(|w| w.program.is_some()) {
        None => Ok(()),
        Some(w) => Err(format!(
            "{file}: workload `{}` is a command workload (an external program), which only \
             `isolane run` runs; `isolane {command}` needs model workloads (remove it, or run \
             the scenario with `isolane run`)",
            w.name
        )),
    }
}

/// Several GPUs (`device.gpus`) are built for `isolane run`, `isolane plan` (with `--auto`)
/// and `isolane verify` (admission, partitions, telemetry, placement and probes per GPU): the
/// commands that ramp or pair workloads on one device refuse such a scenario by name rather
/// than run it on its first GPU alone (docs/partitions.md, Several GPUs; a user's mistake:
/// exit code 2).
pub fn refuse_several_gpus(scenario: &Scenario, file: &str, command: &str) -> Result<(), String> {
    if !scenario.device.several_gpus() {
        return Ok(());
    }
    let list: Vec<String> = scenario.device.gpus.iter().map(u32::to_string).collect();
    Err(format!(
        "{file}: device.gpus = [{}]: `isolane {command}` works on one GPU; several GPUs are \
         built for `isolane run`, `isolane plan` and `isolane verify` (write device.gpu = N to \
         use one GPU)",
        list.join(", ")
    ))
}

/// `plan --auto` sizes, and `verify` probes, every workload on the device: a workload with a
/// backend of its own (a CPU one in a GPU scenario, docs/programs.md) is refused by name
/// rather than planned or probed wrongly (exit code 2).
pub fn refuse_mixed_backends(scenario: &Scenario, file: &str, command: &str) -> Result<(), String> {
    let name = |b: Backend| match b {
        Backend::Cpu => "cpu",
        Backend::Cuda => "cuda",
    };
    match scenario
        .workloads
        .iter()
        .find(|w| w.backend != scenario.device.backend)
    {
        None => Ok(()),
        Some(w) => Err(format!(
            "{file}: workload `{}` runs on backend \"{}\" and the device on \"{}\"; `isolane \
             {command}` takes every workload to the device's backend (remove its backend key, \
             or give the GPU workloads a scenario of their own)",
            w.name,
            name(w.backend),
            name(scenario.device.backend)
        )),
    }
}
