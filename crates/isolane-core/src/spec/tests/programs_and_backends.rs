//! Command workloads (`command = [...]`) and per-workload `backend`: what parses, what each
//! rule refuses, and that the resolved file reads back the same.

use super::{assert_err, parse, FILE};
use crate::spec::*;

const PROGRAM: &str = r#"
[[workload]]
name = "serve"
command = ["sh", "-c", "sleep 0.2; echo hi"]
env = { GREETING = "hi" }
duration_s = 5
timeout_s = 10
cpu = [0]
"#;

#[test]
fn a_command_workload_parses_with_its_own_keys_and_round_trips() {
    let s = parse(PROGRAM).unwrap();
    let w = &s.workloads[0];
    let p = w.program.as_ref().expect("a program");
    assert_eq!(p.command, ["sh", "-c", "sleep 0.2; echo hi"]);
    assert_eq!(p.env.get("GREETING").map(String::as_str), Some("hi"));
    assert_eq!((p.duration_s, p.timeout_s), (Some(5.0), Some(10.0)));
    assert_eq!(w.cpu, [0]);
    assert_eq!(w.host, Host::Process);
    assert_eq!(w.backend, Backend::Cpu);
    let text = s.to_toml_string().unwrap();
    assert!(!text.contains("model"), "{text}");
    assert_eq!(parse(&text).unwrap(), s, "{text}");
}

#[test]
fn a_command_workload_refuses_model_keys_by_name() {
    let text = r#"
[[workload]]
name = "serve"
command = ["true"]
rate_hz = 10
"#;
    assert_err(
        text,
        5,
        &[
            "workload[0].rate_hz",
            "not allowed with `command`",
            "no model, rate, deadline",
        ],
    );
    let text = "[[workload]]\nname = \"serve\"\ncommand = [\"true\"]\nmodel = \"resnet18\"\n";
    assert_err(
        text,
        4,
        &["workload[0].model", "not allowed with `command`"],
    );
}

#[test]
fn a_model_workload_refuses_program_keys() {
    let text = format!("{}timeout_s = 3\n", super::MIN);
    assert_err(
        &text,
        7,
        &["workload[0].timeout_s", "only for a command workload"],
    );
}

#[test]
fn a_command_must_name_a_program_and_hold_strings() {
    let text = "[[workload]]\nname = \"p\"\ncommand = []\n";
    assert_err(
        text,
        3,
        &["workload[0].command", "empty array", "at least the program"],
    );
    let text = "[[workload]]\nname = \"p\"\ncommand = [\"sleep\", 1]\n";
    assert_err(
        text,
        3,
        &[
            "workload[0].command[1]",
            "found integer 1",
            "expected a string",
        ],
    );
    let text = "[[workload]]\nname = \"p\"\ncommand = \"sleep 1\"\n";
    assert_err(text, 3, &["workload[0].command", "an array of strings"]);
}

#[test]
fn env_values_are_strings_and_partition_variables_are_isolanes() {
    let text = "[[workload]]\nname = \"p\"\ncommand = [\"true\"]\nenv = { N = 1 }\n";
    assert_err(text, 4, &["workload[0].env.N", "expected a string"]);
    let text = r#"
[device]
backend = "cuda"
mechanism = "mps"

[[workload]]
name = "p"
command = ["true"]
env = { CUDA_MPS_ACTIVE_THREAD_PERCENTAGE = "100" }
partition = { thread_pct = 50 }
"#;
    assert_err(
        text,
        9,
        &[
            "workload[0].env",
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
            "isolane sets",
        ],
    );
}

#[test]
fn timeout_must_exceed_duration_and_both_be_positive() {
    let text = "[[workload]]\nname = \"p\"\ncommand = [\"true\"]\nduration_s = 5\ntimeout_s = 5\n";
    assert_err(
        text,
        5,
        &["workload[0].timeout_s", "expected timeout_s > duration_s"],
    );
    let text = "[[workload]]\nname = \"p\"\ncommand = [\"true\"]\ntimeout_s = 0\n";
    assert_err(text, 4, &["workload[0].timeout_s", "> 0"]);
}

#[test]
fn cwd_must_be_a_directory_and_comes_back_absolute() {
    let text = "[[workload]]\nname = \"p\"\ncommand = [\"true\"]\ncwd = \"no-such-dir\"\n";
    assert_err(text, 4, &["workload[0].cwd", "not a directory"]);
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("work")).unwrap();
    let file = dir.path().join("s.toml");
    let text = "[[workload]]\nname = \"p\"\ncommand = [\"true\"]\ncwd = \"work\"\n";
    let s = Scenario::from_toml_str(text, &file, &Vec::<String>::new()).unwrap();
    let cwd = s.workloads[0]
        .program
        .as_ref()
        .unwrap()
        .cwd
        .clone()
        .unwrap();
    assert!(std::path::Path::new(&cwd).is_absolute(), "{cwd}");
    assert!(cwd.ends_with("work"), "{cwd}");
}

#[test]
fn green_contexts_cannot_confine_a_program() {
    let text = r#"
[device]
backend = "cuda"
mechanism = "green"

[[workload]]
name = "p"
command = ["python3", "serve.py"]
partition = { sms = 16 }
"#;
    assert_err(
        text,
        8,
        &[
            "workload[0].command",
            "mechanism \"green\"",
            "cannot be imposed on another program",
        ],
    );
    // On the CPU beside green GPU workloads, a program is fine.
    let text = text.replace("partition = { sms = 16 }", "backend = \"cpu\"");
    let s = parse(&text).unwrap();
    assert_eq!(s.workloads[0].backend, Backend::Cpu);
}

#[test]
fn an_mps_program_takes_its_partition() {
    let text = r#"
[device]
backend = "cuda"
mechanism = "mps"

[[workload]]
name = "p"
command = ["python3", "-c", "import torch"]
partition = { thread_pct = 25, mem_limit_mib = 4096 }
"#;
    let s = parse(text).unwrap();
    let w = &s.workloads[0];
    assert_eq!(w.backend, Backend::Cuda);
    assert_eq!(w.partition.thread_pct, Some(25));
    assert_eq!(parse(&s.to_toml_string().unwrap()).unwrap(), s);
}

const MIXED: &str = r#"
[device]
backend = "cuda"
mechanism = "timeslice"

[[workload]]
name = "cpu-resnet"
model = "resnet18"
backend = "cpu"
rate_hz = 5
duration_s = 2
cpu = [1]

[[workload]]
name = "gpu-fp16"
model = "resnet18"
precision = "fp16"
rate_hz = 50
duration_s = 2
"#;

#[test]
fn a_workload_may_run_on_the_cpu_beside_gpu_workloads() {
    let s = parse(MIXED).unwrap();
    assert_eq!(s.workloads[0].backend, Backend::Cpu);
    assert_eq!(s.workloads[1].backend, Backend::Cuda);
    let cpu_device = s.workloads[0].device(&s.device);
    assert_eq!(
        (cpu_device.backend, cpu_device.mechanism),
        (Backend::Cpu, Mechanism::None)
    );
    assert_eq!(s.workloads[1].device(&s.device), s.device);
    let text = s.to_toml_string().unwrap();
    assert_eq!(parse(&text).unwrap(), s, "{text}");
}

#[test]
fn a_cpu_workload_refuses_gpu_partition_keys_and_gpu_precisions() {
    let text = MIXED.replace("cpu = [1]", "cpu = [1]\npartition = { thread_pct = 50 }");
    assert_err(
        &text,
        13,
        &[
            "workload[0].partition.thread_pct",
            "backend \"cpu\"",
            "no GPU partition",
        ],
    );
    let text = MIXED.replace(
        "backend = \"cpu\"",
        "backend = \"cpu\"\nprecision = \"fp16\"",
    );
    assert_err(&text, 10, &["workload[0].precision", "expected \"fp32\""]);
}

#[test]
fn a_cuda_workload_needs_a_cuda_device() {
    let text = format!("{}backend = \"cuda\"\n", super::MIN);
    assert_err(
        &text,
        7,
        &[
            "workload[0].backend",
            "device.backend \"cpu\"",
            "expected \"cpu\"",
        ],
    );
    let text = format!("{}backend = \"tpu\"\n", super::MIN);
    assert_err(&text, 7, &["workload[0].backend", "\"cpu\" | \"cuda\""]);
}

#[test]
fn a_cpu_workload_may_be_a_thread_under_mps() {
    let text = r#"
[device]
backend = "cuda"
mechanism = "mps"

[[workload]]
name = "on-cpu"
model = "spin:1ms"
backend = "cpu"
host = "thread"
rate_hz = 10
jobs = 5
"#;
    let s = parse(text).unwrap();
    assert_eq!(s.workloads[0].host, Host::Thread);
    let _ = FILE;
}
