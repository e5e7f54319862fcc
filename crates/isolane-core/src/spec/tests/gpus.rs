//! Several GPUs: `[device] gpus` and a workload's `gpu`: what parses, how it resolves and
//! writes back, and what each rule refuses (docs/scenario.md, docs/partitions.md).

use super::{assert_err, parse};
use crate::spec::*;

const TWO_GPUS: &str = r#"
[device]
backend = "cuda"
gpus = [0, 1]
mechanism = "green"

[[workload]]
name = "a"
model = "spin:1ms"
rate_hz = 10
jobs = 10
partition = { sms = 64 }

[[workload]]
name = "b"
model = "spin:1ms"
rate_hz = 10
jobs = 10
gpu = 1
partition = { sms = 64 }

[[workload]]
name = "c"
model = "spin:1ms"
rate_hz = 10
jobs = 10
backend = "cpu"
"#;

/// The 1-based line of the first line of `text` that starts with `needle`.
fn line_of(text: &str, needle: &str) -> usize {
    text.lines()
        .position(|l| l.starts_with(needle))
        .expect(needle)
        + 1
}

#[test]
fn two_gpus_resolve_each_gpu_workload_to_a_gpu_and_round_trip() {
    let s = parse(TWO_GPUS).unwrap();
    assert_eq!((s.device.gpu, s.device.gpus.clone()), (0, vec![0, 1]));
    assert_eq!(s.device.all_gpus(), [0, 1]);
    let gpus: Vec<_> = s.workloads.iter().map(|w| w.gpu).collect();
    // The first GPU by default; a CPU workload has none.
    assert_eq!(gpus, [Some(0), Some(1), None]);
    assert_eq!(s.workloads[1].device(&s.device).gpu, 1);
    let text = s.to_toml_string().unwrap();
    assert!(text.contains("gpus = [0, 1]"), "{text}");
    let device = text.split("[timing]").next().unwrap_or_default();
    assert!(
        !device.contains("gpu ="),
        "only gpus for several GPUs:\n{text}"
    );
    assert!(text.contains("gpu = 1\n"), "b's GPU written out:\n{text}");
    assert_eq!(parse(&text).unwrap(), s, "{text}");
}

#[test]
fn one_gpu_resolves_and_writes_exactly_as_before() {
    // A list of one GPU is that GPU: b's `gpu = 1` names it.
    let one = TWO_GPUS.replace("gpus = [0, 1]", "gpus = [1]");
    let s = parse(&one).unwrap();
    assert_eq!((s.device.gpu, s.device.gpus.len()), (1, 0));
    assert!(s.workloads.iter().all(|w| w.gpu.is_none()));
    let text = s.to_toml_string().unwrap();
    assert!(
        text.contains("gpu = 1\n") && !text.contains("gpus"),
        "{text}"
    );
    let single = TWO_GPUS
        .replace("gpus = [0, 1]", "gpu = 1")
        .replace("gpu = 1\npartition", "partition");
    assert_eq!(parse(&single).unwrap().to_toml_string().unwrap(), text);
}

#[test]
fn a_workload_gpu_must_be_one_of_the_devices() {
    let text = TWO_GPUS.replace("gpu = 1\n", "gpu = 2\n");
    let line = line_of(&text, "gpu = 2");
    assert_err(&text, line, &["workload[1].gpu", "found GPU 2", "0 | 1"]);
    let single = TWO_GPUS.replace("gpus = [0, 1]", "gpu = 0");
    assert_err(
        &single,
        line_of(&single, "gpu = 1"),
        &["workload[1].gpu", "found GPU 1", "GPUs: 0 "],
    );
}

#[test]
fn gpus_refuses_duplicates_empty_lists_and_gpu_beside_it() {
    let dup = TWO_GPUS.replace("gpus = [0, 1]", "gpus = [0, 1, 0]");
    assert_err(&dup, 4, &["device.gpus", "GPU 0 twice", "distinct"]);
    let empty = TWO_GPUS.replace("gpus = [0, 1]", "gpus = []");
    assert_err(&empty, 4, &["device.gpus", "non-empty array"]);
    let both = TWO_GPUS.replace("gpus = [0, 1]", "gpu = 0\ngpus = [0, 1]");
    assert_err(
        &both,
        line_of(&both, "gpus"),
        &["device.gpus", "either gpu", "not both"],
    );
    let negative = TWO_GPUS.replace("gpus = [0, 1]", "gpus = [0, -1]");
    assert_err(&negative, 4, &["device.gpus", "integer"]);
}

#[test]
fn gpu_is_refused_on_cpu_and_command_workloads() {
    let cpu = TWO_GPUS.replace("backend = \"cpu\"\n", "backend = \"cpu\"\ngpu = 1\n");
    assert_err(
        &cpu,
        line_of(&cpu, "backend = \"cpu\"") + 1,
        &["workload[2].gpu", "backend \"cpu\"", "remove"],
    );
    let program = format!(
        "{TWO_GPUS}\n[[workload]]\nname = \"p\"\ncommand = [\"true\"]\nbackend = \"cpu\"\ngpu = 1\n"
    );
    assert_err(
        &program,
        program.lines().count(),
        &["workload[3].gpu", "not allowed with `command`"],
    );
}

#[test]
fn a_scenario_built_in_code_is_held_to_the_same_rules() {
    let mut s = parse(TWO_GPUS).unwrap();
    s.device.gpus = vec![1, 0];
    let e = s.validate(&NoBuiltinModels).unwrap_err().to_string();
    assert!(e.contains("expected gpu to be the first of gpus"), "{e}");
    let mut s = parse(TWO_GPUS).unwrap();
    s.workloads[0].gpu = Some(7);
    let e = s.validate(&NoBuiltinModels).unwrap_err().to_string();
    assert!(
        e.contains("workload[0].gpu") && e.contains("found GPU 7"),
        "{e}"
    );
}

#[test]
fn the_file_tells_which_workloads_name_their_gpu() {
    let text = "[device]\nbackend = \"cuda\"\ngpus = [0, 1]\nmechanism = \"green\"\n\
                [[workload]]\nname = \"a\"\nmodel = \"spin:1ms\"\n\
                [[workload]]\nname = \"b\"\nmodel = \"spin:1ms\"\ngpu = 1\n";
    assert_eq!(Scenario::workloads_naming_their_gpu(text), [false, true]);
    assert!(Scenario::workloads_naming_their_gpu("not = [toml").is_empty());
    assert!(Scenario::workloads_naming_their_gpu("[device]\n").is_empty());
}

#[test]
fn a_scenario_on_two_gpus_splits_into_one_scenario_per_gpu() {
    let text = "[device]\nbackend = \"cuda\"\ngpus = [1, 0]\nmechanism = \"green\"\n\
                [[workload]]\nname = \"a\"\nmodel = \"spin:1ms\"\nrate_hz = 10\njobs = 1\n\
                [workload.partition]\nsms = 8\n\
                [[workload]]\nname = \"b\"\nmodel = \"spin:1ms\"\nrate_hz = 10\njobs = 1\n\
                gpu = 0\n[workload.partition]\nsms = 16\n";
    let s = Scenario::from_toml_str(text, "s.toml", &NoBuiltinModels).unwrap();
    let one = s.on_one_gpu(1);
    assert_eq!((one.device.gpu, one.device.gpus.len()), (1, 0));
    let names: Vec<(&str, Option<u32>)> = one
        .workloads
        .iter()
        .map(|w| (w.name.as_str(), w.gpu))
        .collect();
    assert_eq!(names, [("a", None)], "the device's first GPU is 1");
    let zero = s.on_one_gpu(0);
    assert_eq!(zero.workloads.len(), 1);
    assert_eq!(zero.workloads[0].partition.sms, Some(16));
    assert!(!zero.device.several_gpus());
    // Each part is a valid one-GPU scenario of its own.
    zero.validate(&NoBuiltinModels).unwrap();
    assert!(s.on_one_gpu(7).workloads.is_empty());
}
