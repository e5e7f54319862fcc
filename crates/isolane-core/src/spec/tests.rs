//! Scenario parsing: one test per kind of malformed scenario, each asserting file, line, field
//! and the allowed values in the message.

use super::*;

const FILE: &str = "dir/s.toml";
const MODELS: [&str; 2] = ["resnet18", "yolov8n"];

fn parse(text: &str) -> Result<Scenario, SpecError> {
    Scenario::from_toml_str(text, FILE, &MODELS)
}

fn err(text: &str) -> String {
    match parse(text) {
        Ok(s) => panic!("expected an error, parsed {s:#?}"),
        Err(e) => {
            assert_eq!(e.exit_code(), 2);
            assert!(e.is_user_error());
            e.to_string()
        }
    }
}

/// Asserts the message starts with `file:line:` and contains every needle.
#[track_caller]
fn assert_err(text: &str, line: usize, needles: &[&str]) {
    let e = err(text);
    let prefix = format!("{FILE}:{line}:");
    assert!(e.starts_with(&prefix), "expected {prefix} in:\n{e}");
    for n in needles {
        assert!(e.contains(n), "expected {n:?} in:\n{e}");
    }
}

const MIN: &str = r#"
[[workload]]
name = "cam0"
model = "spin:4ms"
rate_hz = 100
jobs = 500
"#;

#[test]
fn minimal_scenario_gets_every_default() {
    let s = parse(MIN).unwrap();
    assert_eq!(
        s.device,
        DeviceSpec {
            backend: Backend::Cpu,
            gpu: 0,
            mechanism: Mechanism::None,
            host: Host::Thread,
            gpus: Vec::new(),
        }
    );
    assert_eq!(s.timing, TimingSpec::default());
    let w = &s.workloads[0];
    assert_eq!(w.name, "cam0");
    assert_eq!(w.batch, 1);
    assert_eq!(w.precision, Precision::Fp32);
    assert_eq!(w.rate, Rate::Hz(100.0));
    assert_eq!(w.deadline_ms, None);
    assert_eq!(w.deadline_s(), Some(0.01));
    assert_eq!(w.deadline_ns(), Some(10_000_000));
    assert_eq!(w.length, RunLength::Jobs(500));
    assert_eq!(w.warmup_jobs, 10);
    assert_eq!(w.late, LatePolicy::Skip);
    assert!(w.cpu.is_empty());
    assert_eq!(w.role, Role::Standalone);
    assert_eq!(w.ramp, None);
    assert_eq!(w.host, Host::Thread);
    assert_eq!(w.partition, PartitionSpec::default());
    assert!(w.plan_check);
    assert_eq!(w.planned_jobs(), Some(500));
    assert_eq!(
        w.model_source(),
        Ok(ModelSource::Spin(SpinModel {
            service: std::time::Duration::from_millis(4),
            jitter: std::time::Duration::ZERO
        }))
    );
}

const FULL: &str = r#"
# Two cameras and an interferer on one GPU, green contexts.
[device]
backend = "cuda"
gpu = 1
mechanism = "green"

[timing]
spin_us = 100
start_delay_ms = 20
seed = 7

[[workload]]
name = "cam0"
model = "resnet18"
batch = 4
precision = "fp16"
rate_hz = 50.5
deadline_ms = 15
duration_s = 2.5
warmup_jobs = 0
late = "queue"
cpu = [0, 1]
role = "victim"
host = "process"
[workload.partition]
sms = 16

[[workload]]
name = "bulk.v-2"
model = "spin:1ms~0.25ms"
rate_hz = "max"
duration_s = 1

[[workload]]
name = "noise"
model = "yolov8n"
role = "interferer"
ramp = { from_hz = 10, to_hz = 200, steps = 5, step_s = 2 }
partition = { sms = 8 }
"#;

#[test]
fn full_scenario_parses_and_round_trips() {
    let s = parse(FULL).unwrap();
    assert_eq!(
        s.device,
        DeviceSpec {
            backend: Backend::Cuda,
            gpu: 1,
            mechanism: Mechanism::Green,
            host: Host::Thread,
            gpus: Vec::new(),
        }
    );
    assert_eq!(
        s.timing,
        TimingSpec {
            spin_us: 100,
            start_delay_ms: 20,
            seed: 7
        }
    );
    let [a, b, c] = &s.workloads[..] else {
        panic!("3 workloads")
    };
    assert_eq!(
        (a.batch, a.precision, a.rate),
        (4, Precision::Fp16, Rate::Hz(50.5))
    );
    assert_eq!(
        (a.deadline_ms, a.length),
        (Some(15.0), RunLength::DurationS(2.5))
    );
    assert_eq!(
        (a.warmup_jobs, a.late, a.cpu.clone()),
        (0, LatePolicy::Queue, vec![0, 1])
    );
    assert_eq!(
        (a.role, a.host, a.partition.sms),
        (Role::Victim, Host::Process, Some(16))
    );
    assert_eq!(a.planned_jobs(), Some(127)); // releases at k/50.5 s < 2.5 s: k = 0..=126
    assert_eq!(
        (b.rate, b.deadline_s(), b.planned_jobs()),
        (Rate::Max(MaxRate::Max), None, None)
    );
    assert_eq!(b.host, Host::Thread);
    let ramp = Ramp {
        from_hz: 10.0,
        to_hz: 200.0,
        steps: 5,
        step_s: 2.0,
    };
    assert_eq!((c.role, c.ramp), (Role::Interferer, Some(ramp)));
    // An interferer's rate and length come from its ramp.
    assert_eq!(
        (c.rate, c.length),
        (Rate::Hz(10.0), RunLength::DurationS(10.0))
    );
    assert_eq!(c.planned_jobs(), Some(20 + 115 + 210 + 305 + 400));
    assert_eq!(c.model_source(), Ok(ModelSource::Builtin("yolov8n".into())));

    let text = s.to_toml_string().unwrap();
    let again = Scenario::from_toml_str(&text, "resolved.toml", &MODELS)
        .unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(again, s, "{text}");
    assert!(text.contains("rate_hz = \"max\""), "{text}");
    assert!(s.validate(&MODELS).is_ok());
}

#[test]
fn minimal_scenario_round_trips_with_every_default_written() {
    let s = parse(MIN).unwrap();
    let text = s.to_toml_string().unwrap();
    for key in [
        "backend = \"cpu\"",
        "mechanism = \"none\"",
        "host = \"thread\"",
        "seed =",
        "spin_us =",
        "batch = 1",
        "precision = \"fp32\"",
        "warmup_jobs = 10",
        "late = \"skip\"",
        "role = \"standalone\"",
        "cpu = []",
    ] {
        assert!(text.contains(key), "{key} missing in\n{text}");
    }
    assert_eq!(
        Scenario::from_toml_str(&text, "r.toml", &MODELS).unwrap(),
        s
    );
}

#[test]
fn syntax_error_names_file_line_and_column() {
    let e = err("[[workload]]\nname = \"a\"\nrate_hz = = 3\n");
    assert!(e.starts_with("dir/s.toml:3:"), "{e}");
    assert!(e.contains("TOML syntax error"), "{e}");
    let e = err("[device]\nbackend = \"cpu\"\nbackend = \"cuda\"\n");
    assert!(
        e.starts_with("dir/s.toml:3:1:") && e.contains("duplicate key"),
        "{e}"
    );
}

#[test]
fn unknown_keys_list_the_allowed_ones() {
    assert_err(
        &format!("{MIN}rte_hz = 5\n"),
        7,
        &[
            "workload[0].rte_hz",
            "unknown key",
            "did you mean \"rate_hz\"",
            "allowed keys here: name, model, weights",
        ],
    );
    assert_err(
        &format!("[device]\nbackend = \"cpu\"\ngpu_count = 2\n{MIN}"),
        3,
        &[
            "device.gpu_count",
            "unknown key",
            "backend, gpu, gpus, mechanism, host",
        ],
    );
    assert_err(
        &format!("[timings]\nseed = 1\n{MIN}"),
        1,
        &[
            "timings",
            "unknown key",
            "device, timing, protection, workload",
        ],
    );
    assert_err(
        &format!("{MIN}[workload.partition]\ncores = 3\n"),
        8,
        &[
            "workload[0].partition.cores",
            "sms, thread_pct, mem_limit_mib, mig_profile",
        ],
    );
}

#[test]
fn wrong_types_say_what_was_found() {
    assert_err(
        "[[workload]]\nname = \"a\"\nmodel = \"spin:1ms\"\nrate_hz = \"fast\"\njobs = 5\n",
        4,
        &[
            "workload[0].rate_hz",
            "found string \"fast\"",
            "expected a finite number > 0",
            "\"max\"",
        ],
    );
    assert_err(
        "[[workload]]\nname = \"a\"\nmodel = \"spin:1ms\"\nrate_hz = 5\njobs = 5\nbatch = 1.5\n",
        6,
        &[
            "workload[0].batch",
            "found float 1.5",
            "an integer >= 1 (at most 4294967295)",
        ],
    );
    assert_err(
        "[[workload]]\nname = 3\nmodel = \"spin:1ms\"\nrate_hz = 5\njobs = 5\n",
        2,
        &["workload[0].name", "found integer 3", "letters, digits"],
    );
    assert_err(
        &format!("{MIN}cpu = \"0-3\"\n"),
        7,
        &[
            "workload[0].cpu",
            "found string \"0-3\"",
            "an array of CPU ids",
        ],
    );
    assert_err(
        &format!("{MIN}late = \"drop\"\n"),
        7,
        &[
            "workload[0].late",
            "found string \"drop\"",
            "one of \"skip\" | \"queue\"",
        ],
    );
    assert_err(
        &format!("[device]\nbackend = \"gpu\"\n{MIN}"),
        2,
        &["device.backend", "\"cpu\" | \"cuda\""],
    );
    assert_err(
        &format!("device = 3\n{MIN}"),
        1,
        &["device", "found integer 3; expected a table"],
    );
}

#[test]
fn rates_must_be_positive_finite_numbers() {
    for (v, found) in [
        ("0", "integer 0"),
        ("-5.0", "float -5.0"),
        ("nan", "float nan"),
        ("inf", "float inf"),
    ] {
        let text =
            format!("[[workload]]\nname = \"a\"\nmodel = \"spin:1ms\"\nrate_hz = {v}\njobs = 5\n");
        assert_err(
            &text,
            4,
            &[
                "workload[0].rate_hz",
                found,
                "expected a finite number > 0 (jobs per second) and <= 1e9",
            ],
        );
    }
}

#[test]
fn deadlines_and_durations_must_be_positive() {
    assert_err(
        &format!("{MIN}deadline_ms = 0\n"),
        7,
        &["workload[0].deadline_ms", "found integer 0", "> 0"],
    );
    assert_err(
        &format!("{MIN}deadline_ms = -1.5\n"),
        7,
        &["workload[0].deadline_ms", "found float -1.5"],
    );
    assert_err(
        "[[workload]]\nname = \"a\"\nmodel = \"spin:1ms\"\nrate_hz = 5\nduration_s = 0.0\n",
        5,
        &["workload[0].duration_s", "found float 0.0", "seconds > 0"],
    );
    assert_err(
        "[[workload]]\nname = \"a\"\nmodel = \"spin:1ms\"\nrate_hz = 5\njobs = 0\n",
        5,
        &["workload[0].jobs", "found integer 0", "an integer >= 1"],
    );
    assert_err(
        &format!("{MIN}warmup_jobs = -1\n"),
        7,
        &["workload[0].warmup_jobs", "an integer >= 0"],
    );
}

#[test]
fn batch_zero() {
    assert_err(
        &format!("{MIN}batch = 0\n"),
        7,
        &[
            "workload[0].batch",
            "found integer 0",
            "an integer >= 1 (at most 4294967295)",
        ],
    );
}

#[test]
fn duplicate_names() {
    let text = format!("{MIN}{MIN}");
    assert_err(
        &text,
        9,
        &[
            "workload[1].name",
            "\"cam0\"",
            "already the name of workload[0] (line 3)",
            "unique",
        ],
    );
}

#[test]
fn bad_names() {
    for (name, found) in [
        ("cam 0", "\"cam 0\""),
        ("a/b", "\"a/b\""),
        ("", "\"\""),
        ("..", "\"..\""),
    ] {
        let text =
            format!("[[workload]]\nname = {name:?}\nmodel = \"spin:1ms\"\nrate_hz = 5\njobs = 5\n");
        assert_err(
            &text,
            2,
            &[
                "workload[0].name",
                found,
                "letters, digits, '_', '.' or '-'",
            ],
        );
    }
}

#[test]
fn unknown_models_list_the_known_ones() {
    let text = "[[workload]]\nname = \"a\"\nmodel = \"resnet19\"\nrate_hz = 5\njobs = 5\n";
    assert_err(
        text,
        3,
        &[
            "workload[0].model",
            "unknown model \"resnet19\"",
            "a built-in model: resnet18, yolov8n",
            "spin:<time>",
            ".onnx",
        ],
    );
    let e = Scenario::from_toml_str(text, FILE, &NoBuiltinModels)
        .unwrap_err()
        .to_string();
    assert!(e.contains("no built-in models in this build"), "{e}");
    assert_err(
        "[[workload]]\nname = \"a\"\nmodel = \"spin:4\"\nrate_hz = 5\njobs = 5\n",
        3,
        &[
            "workload[0].model",
            "\"4\" has no unit",
            "units ns, us, ms or s",
        ],
    );
    assert_err(
        "[[workload]]\nname = \"a\"\nmodel = \"spin4ms\"\nrate_hz = 5\njobs = 5\n",
        3,
        &[
            "workload[0].model",
            "unknown model \"spin4ms\"",
            "spin:<time>[~<jitter>]",
        ],
    );
}

#[test]
fn onnx_and_weights_files_must_exist_and_come_back_absolute() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("m.onnx"), b"x").unwrap();
    std::fs::write(dir.path().join("w.safetensors"), b"x").unwrap();
    let scen = dir.path().join("s.toml");
    let text = "[[workload]]\nname = \"a\"\nmodel = \"m.onnx\"\nrate_hz = 5\njobs = 5\n\
                [[workload]]\nname = \"b\"\nmodel = \"resnet18\"\nweights = \"w.safetensors\"\n\
                rate_hz = 5\njobs = 5\n";
    let s = Scenario::from_toml_str(text, &scen, &MODELS).unwrap();
    let abs = dir.path().canonicalize().unwrap();
    let w = &s.workloads[0];
    assert_eq!(w.model, abs.join("m.onnx").to_str().unwrap());
    let b = &s.workloads[1];
    assert_eq!(b.weights.as_deref(), abs.join("w.safetensors").to_str());
    assert!(matches!(w.model_source(), Ok(ModelSource::Onnx(_))));
    // The resolved file works from anywhere.
    let again = Scenario::from_toml_str(&s.to_toml_string().unwrap(), "/elsewhere/r.toml", &MODELS)
        .unwrap();
    assert_eq!(again, s);

    let e = Scenario::from_toml_str(&text.replace("m.onnx", "missing.onnx"), &scen, &MODELS)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(":3:9: workload[0].model: ") && e.contains("missing.onnx cannot be opened"),
        "{e}"
    );
    assert!(
        e.contains("relative to the scenario file's directory"),
        "{e}"
    );
    let e = Scenario::from_toml_str(&text.replace("w.safetensors", "nope.bin"), &scen, &MODELS)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(":9:11: workload[1].weights: ")
            && e.contains("expected an existing weights file"),
        "{e}"
    );
}

/// An .onnx model or a saved plan runs on the weights it carries: a weights file beside it
/// was once accepted and silently ignored.
#[test]
fn weights_are_not_allowed_with_a_model_file() {
    let dir = tempfile::tempdir().unwrap();
    let scen = dir.path().join("s.toml");
    for (model, what) in [
        ("m.onnx", "an .onnx model"),
        ("m.isoplan", "a saved plan (.isoplan)"),
    ] {
        std::fs::write(dir.path().join(model), b"x").unwrap();
        std::fs::write(dir.path().join("w.safetensors"), b"x").unwrap();
        let text = format!(
            "[[workload]]\nname = \"a\"\nmodel = \"{model}\"\nweights = \"w.safetensors\"\n\
             rate_hz = 5\njobs = 5\n"
        );
        let e = Scenario::from_toml_str(&text, &scen, &MODELS)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(":4:1: workload[0].weights: ")
                && e.contains(&format!(
                    "not allowed with {what}, which carries its own weights"
                )),
            "{e}"
        );
    }
}

#[test]
fn exactly_one_of_duration_and_jobs() {
    assert_err(
        &format!("{MIN}duration_s = 5\n"),
        7,
        &[
            "workload[0].duration_s",
            "found both duration_s and jobs; expected exactly one of them",
        ],
    );
    assert_err(
        "[[workload]]\nname = \"a\"\nmodel = \"spin:1ms\"\nrate_hz = 5\n",
        1,
        &[
            "workload[0].duration_s",
            "missing in [workload[0]]",
            "exactly one of duration_s",
            "or jobs",
        ],
    );
}

#[test]
fn missing_required_keys_point_at_the_table_header() {
    let text = "[[workload]]\nname = \"a\"\njobs = 5\n\n[[workload]]\nmodel = \"spin:1ms\"\nrate_hz = 5\njobs = 5\n";
    let e = err(text);
    let lines: Vec<&str> = e.lines().collect();
    assert_eq!(lines.len(), 3, "{e}");
    assert!(
        lines[0].starts_with("dir/s.toml:1:1: workload[0].model: missing"),
        "{e}"
    );
    assert!(
        lines[1].starts_with("dir/s.toml:1:1: workload[0].rate_hz: missing"),
        "{e}"
    );
    assert!(
        lines[2].starts_with("dir/s.toml:5:1: workload[1].name: missing"),
        "{e}"
    );
}

#[test]
fn ramp_only_for_interferers_and_required_for_them() {
    assert_err(
        &format!("{MIN}ramp = {{ from_hz = 1, to_hz = 2, steps = 2, step_s = 1 }}\n"),
        7,
        &[
            "workload[0].ramp",
            "not allowed with role \"standalone\"",
            "role = \"interferer\"",
        ],
    );
    assert_err(
        "[[workload]]\nname = \"a\"\nmodel = \"spin:1ms\"\nrole = \"interferer\"\n",
        1,
        &[
            "workload[0].ramp",
            "missing",
            "from_hz",
            "to_hz",
            "steps",
            "step_s",
        ],
    );
    assert_err(
        "[[workload]]\nname = \"a\"\nmodel = \"spin:1ms\"\nrole = \"interferer\"\nrate_hz = 5\nramp = { from_hz = 1, to_hz = 2, steps = 2, step_s = 1 }\n",
        5,
        &["workload[0].rate_hz", "not allowed with role \"interferer\"", "ramp"],
    );
    assert_err(
        "[[workload]]\nname = \"a\"\nmodel = \"spin:1ms\"\nrole = \"interferer\"\njobs = 5\nramp = { from_hz = 1, to_hz = 2, steps = 2, step_s = 1 }\n",
        5,
        &["workload[0].jobs", "not allowed with role \"interferer\"", "steps × step_s"],
    );
}

#[test]
fn ramp_values_are_checked() {
    let base = "[[workload]]\nname = \"a\"\nmodel = \"spin:1ms\"\nrole = \"interferer\"\n";
    assert_err(
        &format!("{base}ramp = {{ from_hz = 1, to_hz = 2, steps = 0, step_s = 1 }}\n"),
        5,
        &[
            "workload[0].ramp.steps",
            "found integer 0",
            "an integer >= 1 (at most 100000)",
        ],
    );
    assert_err(
        &format!("{base}ramp = {{ from_hz = 20, to_hz = 2, steps = 3, step_s = 1 }}\n"),
        5,
        &[
            "workload[0].ramp.to_hz",
            "found to_hz = 2.0 below from_hz = 20.0",
            "from_hz <= to_hz",
        ],
    );
    assert_err(
        &format!("{base}[workload.ramp]\nfrom_hz = 0\nto_hz = 2\nsteps = 3\nstep_s = -1\n"),
        6,
        &[
            "workload[0].ramp.from_hz",
            "found integer 0",
            "a finite rate > 0 in Hz",
        ],
    );
    let e = err(&format!(
        "{base}[workload.ramp]\nfrom_hz = 0\nto_hz = 2\nsteps = 3\nstep_s = -1\n"
    ));
    assert!(
        e.contains("dir/s.toml:9:10: workload[0].ramp.step_s: found integer -1"),
        "{e}"
    );
    assert_err(
        &format!("{base}ramp = {{ from_hz = 1, to_hz = 2, steps = 3 }}\n"),
        5,
        &["workload[0].ramp.step_s", "missing in [workload[0].ramp]"],
    );
}

#[test]
fn mechanism_must_fit_the_backend() {
    assert_err(
        &format!("[device]\nmechanism = \"mps\"\n{MIN}"),
        2,
        &[
            "device.mechanism",
            "found \"mps\" with backend \"cpu\"",
            "expected \"none\"",
        ],
    );
    assert_err(
        &format!("[device]\nbackend = \"cuda\"\nmechanism = \"none\"\n{MIN}"),
        3,
        &[
            "device.mechanism",
            "found \"none\" with backend \"cuda\"",
            "\"timeslice\" | \"mps\" | \"mig\" | \"green\"",
        ],
    );
    // cuda without a mechanism: timeslice, in worker processes.
    let s = parse(&format!("[device]\nbackend = \"cuda\"\n{MIN}")).unwrap();
    assert_eq!(
        (s.device.mechanism, s.device.host),
        (Mechanism::Timeslice, Host::Process)
    );
    assert_eq!(s.workloads[0].host, Host::Process);
}

#[test]
fn host_thread_is_refused_where_processes_are_needed() {
    assert_err(
        &format!("[device]\nbackend = \"cuda\"\nmechanism = \"mps\"\nhost = \"thread\"\n{MIN}"),
        4,
        &[
            "device.host",
            "found \"thread\" with mechanism \"mps\"",
            "expected \"process\"",
            "MPS client",
        ],
    );
    assert_err(
        &format!("[device]\nbackend = \"cuda\"\nmechanism = \"mig\"\n{MIN}host = \"thread\"\n"),
        10,
        &["workload[0].host", "expected \"process\""],
    );
    // process with none and with green is allowed.
    let s = parse(&format!("[device]\nhost = \"process\"\n{MIN}")).unwrap();
    assert_eq!(s.workloads[0].host, Host::Process);
    let s = parse(&format!(
        "[device]\nbackend = \"cuda\"\nmechanism = \"green\"\n{MIN}host = \"process\"\n"
    ))
    .unwrap();
    assert_eq!(
        (s.device.host, s.workloads[0].host),
        (Host::Thread, Host::Process)
    );
}

#[test]
fn partition_fields_must_belong_to_the_mechanism() {
    let mps = "[device]\nbackend = \"cuda\"\nmechanism = \"mps\"\n";
    assert_err(
        &format!("{mps}{MIN}[workload.partition]\nsms = 8\n"),
        11,
        &[
            "workload[0].partition.sms",
            "belongs to mechanism \"green\"",
            "device.mechanism is \"mps\"",
            "only thread_pct, mem_limit_mib",
        ],
    );
    assert_err(
        &format!("{MIN}partition = {{ thread_pct = 50 }}\n"),
        7,
        &[
            "workload[0].partition.thread_pct",
            "belongs to mechanism \"mps\"",
            "no partition keys",
        ],
    );
    assert_err(
        &format!("{mps}{MIN}partition = {{ thread_pct = 101 }}\n"),
        10,
        &[
            "workload[0].partition.thread_pct",
            "found integer 101",
            "an integer from 1 to 100",
        ],
    );
    let s = parse(&format!(
        "{mps}{MIN}partition = {{ thread_pct = 30, mem_limit_mib = 2048 }}\n"
    ))
    .unwrap();
    assert_eq!(s.workloads[0].partition.thread_pct, Some(30));
    assert_eq!(s.workloads[0].partition.mem_limit_mib, Some(2048));
    let mig = "[device]\nbackend = \"cuda\"\nmechanism = \"mig\"\n";
    let s = parse(&format!(
        "{mig}{MIN}partition = {{ mig_profile = \"1g.10gb\" }}\n"
    ))
    .unwrap();
    assert_eq!(
        s.workloads[0].partition.mig_profile.as_deref(),
        Some("1g.10gb")
    );
    assert_eq!(
        Scenario::from_toml_str(&s.to_toml_string().unwrap(), "r", &MODELS).unwrap(),
        s
    );
}

#[test]
fn precision_other_than_fp32_needs_cuda() {
    assert_err(
        &format!("{MIN}precision = \"fp16\"\n"),
        7,
        &[
            "workload[0].precision",
            "found \"fp16\" with backend \"cpu\"",
            "expected \"fp32\"",
        ],
    );
    assert_err(
        &format!("{MIN}precision = \"int8\"\n"),
        7,
        &["\"fp32\" | \"tf32\" | \"fp16\" | \"bf16\""],
    );
}

#[test]
fn weights_are_not_allowed_with_spin() {
    assert_err(
        &format!("{MIN}weights = \"w.safetensors\"\n"),
        7,
        &[
            "workload[0].weights",
            "not allowed with a spin: or kernel: model",
        ],
    );
}

#[test]
fn kernel_models_validate_and_a_bad_one_names_its_field() {
    let ok = MIN.replace("spin:4ms", "kernel:gemm:256:bf16");
    let s = parse(&ok).unwrap();
    assert_eq!(
        s.workloads[0].model_source(),
        Ok(ModelSource::Kernel(crate::spec::KernelModel::Gemm {
            n: 256,
            precision: Precision::Bf16
        }))
    );
    assert_err(
        &MIN.replace("spin:4ms", "kernel:triad:5MB"),
        4,
        &["workload[0].model", "size of", "KiB, MiB or GiB"],
    );
    assert_err(
        &format!(
            "{}weights = \"w.safetensors\"\n",
            MIN.replace("spin:4ms", "kernel:l2:1MiB")
        ),
        7,
        &["not allowed with a spin: or kernel: model"],
    );
}

#[test]
fn duplicate_cpu_ids() {
    let e = err(&format!("{MIN}cpu = [0, 2, 0]\n"));
    assert!(
        e.starts_with(
            "dir/s.toml:7:14: workload[0].cpu[2]: found CPU 0 again (already workload[0].cpu[0])"
        ),
        "{e}"
    );
    assert_err(
        &format!("{MIN}cpu = [-1]\n"),
        7,
        &[
            "workload[0].cpu[0]",
            "found integer -1",
            "an integer >= 0 (at most 4294967295)",
        ],
    );
}

#[test]
fn victims_run_at_a_fixed_rate() {
    assert_err(
        "[[workload]]\nname = \"a\"\nmodel = \"spin:1ms\"\nrole = \"victim\"\nrate_hz = \"max\"\njobs = 5\n",
        5,
        &["workload[0].rate_hz", "found \"max\" with role \"victim\"", "fixed rate > 0"],
    );
    assert_err(
        &format!("{MIN}role = \"bully\"\n"),
        7,
        &["\"standalone\" | \"victim\" | \"interferer\""],
    );
}

#[test]
fn no_workloads() {
    assert_err(
        "[device]\nbackend = \"cpu\"\n",
        1,
        &["workload: no workloads", "[[workload]]"],
    );
    assert_err("workload = []\n", 1, &["workload: no workloads"]);
    assert_err(
        "[workload]\nname = \"a\"\n",
        1,
        &[
            "workload: found a table; expected an array of tables",
            "[[workload]], with two brackets",
        ],
    );
}

#[test]
fn every_problem_is_reported_in_file_order() {
    let text =
        "[[workload]]\nname = \"a b\"\nmodel = \"spin:1ms\"\nrate_hz = -1\njobs = 0\nbogus = 1\n";
    let e = parse(text).unwrap_err();
    let fields: Vec<(usize, &str)> = e
        .problems()
        .iter()
        .map(|p| (p.line, p.field.as_str()))
        .collect();
    assert_eq!(
        fields,
        vec![
            (2, "workload[0].name"),
            (4, "workload[0].rate_hz"),
            (5, "workload[0].jobs"),
            (6, "workload[0].bogus")
        ]
    );
    assert_eq!(e.to_string().lines().count(), 4);
}

#[test]
fn columns_count_characters_not_bytes() {
    let e = err(&format!("# ünïcödé\n{MIN}batch = 0\n"));
    assert!(e.starts_with("dir/s.toml:8:9: workload[0].batch"), "{e}");
    let e = err("# ü\n[[workload]]\nname = \"é\" \nmodel = \"spin:1ms\"\nrate_hz = 1\njobs = 1\n");
    assert!(e.starts_with("dir/s.toml:3:8: workload[0].name"), "{e}");
}

#[test]
fn load_reports_unreadable_files() {
    let e = Scenario::load("/nonexistent/x.toml", &MODELS).unwrap_err();
    assert!(matches!(e, SpecError::Read { .. }));
    assert_eq!(e.exit_code(), 2);
    assert!(
        e.to_string()
            .starts_with("/nonexistent/x.toml: cannot read the scenario file"),
        "{e}"
    );
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("ok.toml");
    std::fs::write(&p, MIN).unwrap();
    assert_eq!(Scenario::load(&p, &MODELS).unwrap().workloads.len(), 1);
}

#[test]
fn validate_checks_scenarios_built_in_code() {
    let mut s = parse(MIN).unwrap();
    assert!(s.validate(&MODELS).is_ok());
    s.workloads[0].batch = 0;
    s.workloads[0].model = "nope".into();
    let e = s.validate(&MODELS).unwrap_err().to_string();
    // No file was written by the user: no invented file name or position, only the fields.
    assert!(
        !e.contains("<generated scenario>")
            && e.lines().any(|l| l.starts_with("workload[0].model: "))
            && e.lines().any(|l| l.starts_with("workload[0].batch: ")),
        "{e}"
    );
    // Seeds use the whole u64 range (toml writes them; the parser reads them back).
    let mut s = parse(MIN).unwrap();
    s.timing.seed = u64::MAX;
    assert_eq!(
        Scenario::from_toml_str(&s.to_toml_string().unwrap(), "r", &MODELS).unwrap(),
        s
    );
}

/// The rules run on the value itself (no TOML round trip): every problem names its field, none
/// a position, and rules that relate fields hold for values no file could spell.
#[test]
fn validate_runs_the_rules_on_the_value() {
    let base = parse(MIN).unwrap();
    let problems = |s: &Scenario| -> Vec<String> {
        let e = s.validate(&MODELS).unwrap_err();
        assert!(e.problems().iter().all(|p| p.line == 0 && p.column == 0));
        e.to_string().lines().map(str::to_string).collect()
    };
    let mut s = base.clone();
    s.workloads.push(base.workloads[0].clone());
    s.workloads[1].cpu = vec![3, 3];
    s.workloads[1].deadline_ms = Some(f64::NAN);
    s.workloads[0].rate = Rate::Hz(-1.5);
    s.workloads[0].length = RunLength::DurationS(0.0);
    assert_eq!(
        problems(&s),
        [
            "workload[1].name: found \"cam0\", already the name of workload[0]; expected a name \
             unique in the scenario"
                .to_string(),
            format!(
                "workload[0].rate_hz: found float -1.5; expected {}",
                format::rate_expected()
            ),
            format!(
                "workload[0].duration_s: found float 0.0; expected {}",
                format::seconds_expected("seconds", 1.0)
            ),
            format!(
                "workload[1].deadline_ms: found float nan; expected {}",
                format::seconds_expected("milliseconds", 1e3)
            ),
            "workload[1].cpu[1]: found CPU 3 again (already workload[1].cpu[0]); expected each \
             CPU id once"
                .to_string(),
        ]
    );
    // Role and ramp: a ramp only with role interferer, and an interferer needs one.
    let mut s = base.clone();
    s.workloads[0].ramp = Some(Ramp {
        from_hz: 1.0,
        to_hz: 2.0,
        steps: 2,
        step_s: 1.0,
    });
    assert!(problems(&s)[0].starts_with("workload[0].ramp: not allowed with role \"standalone\""));
    s.workloads[0].role = Role::Interferer;
    // An interferer's rate and length follow from its ramp; what the value holds is not looked at.
    s.workloads[0].rate = Rate::Hz(-1.0);
    assert!(s.validate(&MODELS).is_ok());
    s.workloads[0].ramp = None;
    assert_eq!(
        problems(&s),
        [format!(
            "workload[0].ramp: missing in [workload[0]]; expected {}",
            format::RAMP_EXPECTED
        )]
    );
    let mut s = base;
    s.workloads.clear();
    assert_eq!(
        problems(&s),
        ["workload: no workloads; expected at least one [[workload]] table"]
    );
}

/// Four billion steps were allowed: `isolane isolation` then listed their rates (32 GB) and
/// kept a result per step, and took 22 GB of memory before it was killed. Steps are bounded,
/// and the jobs of the longest ramp are counted against the job limit.
#[test]
fn a_ramp_of_billions_of_steps_is_refused_naming_the_bound() {
    let ramp = |hz: &str, steps: &str| {
        format!(
            "[[workload]]\nname = \"i\"\nmodel = \"spin:1ms\"\nrole = \"interferer\"\n\
             ramp = {{ from_hz = {hz}, to_hz = {hz}, steps = {steps}, step_s = 0.1 }}\n"
        )
    };
    assert_err(
        &ramp("1000", "4000000000"),
        5,
        &[
            "workload[0].ramp.steps: found integer 4000000000; expected an integer >= 1 (at most \
           100000)",
        ],
    );
    assert_err(
        &ramp("1e9", "100000"),
        5,
        &["workload[0].ramp: releases 1e13 jobs over its steps"],
    );
    assert!(parse(&ramp("1000", "100000")).is_ok());
}

#[test]
fn ramp_math() {
    let r = Ramp {
        from_hz: 10.0,
        to_hz: 200.0,
        steps: 5,
        step_s: 2.0,
    };
    assert_eq!(r.rates(), vec![10.0, 57.5, 105.0, 152.5, 200.0]);
    assert_eq!((r.step_count(), r.total_duration_s()), (5, 10.0));
    assert_eq!(
        (
            r.step_at(0.0),
            r.step_at(3.9),
            r.step_at(9.99),
            r.step_at(10.0),
            r.step_at(-1.0)
        ),
        (Some(0), Some(1), Some(4), None, None)
    );
    let one = Ramp {
        from_hz: 7.0,
        to_hz: 99.0,
        steps: 1,
        step_s: 1.5,
    };
    assert_eq!(one.rates(), vec![7.0]);
    assert_eq!(one.total_duration_s(), 1.5);
    let r = Ramp {
        from_hz: 0.1,
        to_hz: 0.3,
        steps: 3,
        step_s: 1.0,
    };
    assert_eq!(r.rates().last(), Some(&0.3));
}

#[test]
fn the_documented_example_is_valid() {
    let doc = include_str!("../../../../docs/scenario.md");
    let start = doc.find("```toml\n").expect("an example") + "```toml\n".len();
    let end = start + doc[start..].find("```").expect("its end");
    let s = Scenario::from_toml_str(&doc[start..end], "docs/scenario.md", &MODELS)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(s.workloads.len(), 2);
    assert_eq!(
        s.workloads[1].ramp.map(|r| r.rates()),
        Some(vec![10.0, 57.5, 105.0, 152.5, 200.0])
    );
    assert_eq!(s.timing.seed, 1);
    assert_eq!(
        TimingSpec::default().seed,
        22_026_830,
        "docs/scenario.md states the default seed"
    );
}

#[test]
fn plan_check_is_a_boolean_that_round_trips() {
    let s = parse(&format!("{MIN}plan_check = false\n")).unwrap();
    assert!(!s.workloads[0].plan_check);
    let back = parse(&s.to_toml_string().unwrap()).unwrap();
    assert_eq!(back, s);
    assert_err(
        &format!("{MIN}plan_check = \"no\"\n"),
        7,
        &[
            "workload[0].plan_check",
            "found string \"no\"",
            "true or false",
        ],
    );
}

// ---- limits: every count, rate and time bounded (docs/scenario.md, "Limits") ----

/// A one-workload scenario with `rate_hz = {rate}` and `extra` lines appended to the workload.
fn with_rate(rate: &str, extra: &str) -> String {
    format!("[[workload]]\nname = \"a\"\nmodel = \"spin:1ms\"\nrate_hz = {rate}\n{extra}")
}

#[test]
fn a_rate_above_one_release_per_ns_is_refused() {
    assert_err(
        &with_rate("1e300", "duration_s = 1\n"),
        4,
        &[
            "workload[0].rate_hz",
            "found float 1e300",
            "<= 1e9 (one per ns, the clock's resolution)",
        ],
    );
    assert!(parse(&with_rate("1e9", "duration_s = 1e-6\n")).is_ok());
}

#[test]
fn a_duration_that_releases_no_job_is_refused() {
    assert_err(
        &with_rate("100", "duration_s = 1e-300\n"),
        5,
        &[
            "workload[0].duration_s",
            "found float 1e-300",
            "from 1e-9 (1 ns)",
        ],
    );
    // The shortest duration, 1 ns, releases job 0 at t0: a run of one job.
    for d in ["1e-9", "0.001"] {
        let s = parse(&with_rate("100", &format!("duration_s = {d}\n"))).unwrap();
        assert_eq!(s.workloads[0].planned_jobs(), Some(1));
    }
    // A rate so low that duration × rate underflows to 0 releases none that planning counts.
    assert_err(
        &with_rate("5e-324", "duration_s = 1e-9\n"),
        5,
        &["workload[0].duration_s", "no job would be released"],
    );
}

#[test]
fn durations_and_deadlines_have_an_upper_bound() {
    assert_err(
        &with_rate("1", "duration_s = 1e300\n"),
        5,
        &["workload[0].duration_s", "to 8.64e6 (100 days)"],
    );
    assert_err(
        &with_rate("1", "jobs = 1\ndeadline_ms = 1e300\n"),
        6,
        &["workload[0].deadline_ms", "to 8.64e9 (100 days)"],
    );
    // More jobs than MAX_JOBS from duration × rate.
    assert_err(
        &with_rate("1e9", "duration_s = 8e6\n"),
        5,
        &[
            "workload[0].duration_s",
            "expected at most 1000000000000 jobs",
        ],
    );
}

#[test]
fn too_large_counts_state_the_real_bound() {
    for (key, value) in [
        ("warmup_jobs", "9223372036854775807"),
        ("jobs", "9223372036854775807"),
    ] {
        let text = with_rate("10", &format!("{key} = {value}\n"));
        let e = err(&text);
        assert!(
            e.contains(&format!("workload[0].{key}: found integer {value}"))
                && e.contains("(at most 1000000000000)"),
            "{e}"
        );
    }
    let e = err(&format!(
        "[timing]\nstart_delay_ms = 18446744073709551615\n{MIN}"
    ));
    assert!(
        e.contains("timing.start_delay_ms") && e.contains("(at most 3600000)"),
        "{e}"
    );
    let e = err(&format!("[timing]\nspin_us = 10000000\n{MIN}"));
    assert!(
        e.contains("timing.spin_us") && e.contains("(at most 1000000)"),
        "{e}"
    );
}

#[test]
fn nan_and_infinities_are_refused_in_every_float_key() {
    let ramp = |from: &str, to: &str, step: &str| {
        format!(
            "[[workload]]\nname = \"i\"\nmodel = \"spin:1ms\"\nrole = \"interferer\"\n\
             ramp = {{ from_hz = {from}, to_hz = {to}, steps = 2, step_s = {step} }}\n"
        )
    };
    for bad in ["nan", "inf", "-inf", "+nan"] {
        let cases = [
            (with_rate(bad, "jobs = 1\n"), "workload[0].rate_hz"),
            (
                with_rate("1", &format!("jobs = 1\ndeadline_ms = {bad}\n")),
                "workload[0].deadline_ms",
            ),
            (
                with_rate("1", &format!("duration_s = {bad}\n")),
                "workload[0].duration_s",
            ),
            (ramp(bad, "2", "1"), "workload[0].ramp.from_hz"),
            (ramp("1", bad, "1"), "workload[0].ramp.to_hz"),
            (ramp("1", "2", bad), "workload[0].ramp.step_s"),
        ];
        for (text, field) in cases {
            let e = err(&text);
            assert!(
                e.contains(&format!("{field}: found float {bad}")) && e.contains("finite"),
                "{e}"
            );
        }
    }
}

#[test]
fn a_ramp_longer_than_the_longest_run_is_refused() {
    let text = "[[workload]]\nname = \"i\"\nmodel = \"spin:1ms\"\nrole = \"interferer\"\n\
                ramp = { from_hz = 1, to_hz = 10, steps = 100000, step_s = 8e6 }\n";
    assert_err(
        text,
        5,
        &[
            "workload[0].ramp",
            "steps × step_s",
            "expected at most 8.64e6 s",
        ],
    );
}

/// A scenario of `n` workloads, each on its own lines.
fn many_workloads(n: usize) -> String {
    let mut text = String::with_capacity(n * 80);
    for i in 0..n {
        text.push_str(&format!(
            "[[workload]]\nname = \"w{i}\"\nmodel = \"spin:1ms\"\nrate_hz = 10\njobs = 5\n"
        ));
    }
    text
}

/// Fastest of three validations of `text`, in seconds.
fn validation_time(text: &str) -> f64 {
    (0..3)
        .map(|_| {
            let t = std::time::Instant::now();
            assert!(parse(text).is_ok());
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

#[test]
fn validation_time_grows_linearly_with_the_workloads() {
    // 8× the workloads: about 8× the time when linear, 64× when quadratic (32k workloads took
    // 37 s when every name's line number was found by scanning the text before it). The bound
    // sits between the two, far from both, and compares two runs of the same machine, so a
    // slow or busy one moves both alike; the fastest of three damps a stall in one of them.
    let small = validation_time(&many_workloads(2_000));
    let large = validation_time(&many_workloads(16_000));
    let ratio = large / small;
    assert!(
        ratio < 24.0,
        "2k workloads: {small:.3} s, 16k: {large:.3} s, ratio {ratio:.1} (linear ≈ 8)"
    );
    // Duplicate names are still found at that size.
    let mut text = many_workloads(16_000);
    text.push_str("[[workload]]\nname = \"w7\"\nmodel = \"spin:1ms\"\nrate_hz = 10\njobs = 5\n");
    assert!(err(&text).contains("already the name of workload[7] (line 37)"));
}

#[test]
fn criticality_and_protection_parse_with_defaults_and_round_trip() {
    let s = parse(&format!(
        "[protection]\npiece_us = 500\nmargin_us = 0\nstretch = 1.5\npriorities = false\nguard = false\nadmission = \"refuse\"\nl2_persist_mib = 24\nslack_order = true\nshare = true\n{MIN}criticality = \"best_effort\"\n"
    ))
    .unwrap();
    assert_eq!(s.workloads[0].criticality, Criticality::BestEffort);
    assert_eq!(
        s.protection,
        ProtectionSpec {
            enabled: true,
            piece_us: 500,
            margin_us: 0,
            stretch: Some(1.5),
            priorities: false,
            guard: false,
            admission: AdmissionMode::Refuse,
            l2_persist_mib: 24,
            slack_order: true,
            share: true,
            fine_piece_us: 0,
        }
    );
    let d = parse(MIN).unwrap();
    assert_eq!(d.workloads[0].criticality, Criticality::Critical);
    assert_eq!(d.protection, ProtectionSpec::default());
    // The resolved scenario says both, and reads back the same.
    let text = s.to_toml_string().unwrap();
    assert!(text.contains("criticality = \"best_effort\""), "{text}");
    let back = parse(&text).unwrap();
    assert_eq!(back.protection, s.protection);
    assert_eq!(back.workloads[0].criticality, Criticality::BestEffort);
}

#[test]
fn bad_criticality_and_protection_values_name_the_field_and_the_choices() {
    assert_err(
        &format!("{MIN}criticality = \"low\"\n"),
        7,
        &["workload[0].criticality", "critical", "best_effort"],
    );
    assert_err(
        &format!("[protection]\npiece_us = 5\n{MIN}"),
        2,
        &["protection.piece_us", "20"],
    );
    assert_err(
        &format!("[protection]\nenable = false\n{MIN}"),
        2,
        &[
            "protection.enable",
            "unknown key",
            "enabled, piece_us, margin_us",
        ],
    );
    // The levers of issue 34: each bad value names its field and what it allows.
    assert_err(
        &format!("[protection]\nadmission = \"block\"\n{MIN}"),
        2,
        &["protection.admission", "\"warn\" | \"refuse\" | \"off\""],
    );
    assert_err(
        &format!("[protection]\nl2_persist_mib = 4096\n{MIN}"),
        2,
        &["protection.l2_persist_mib", "1024"],
    );
    assert_err(
        &format!("[protection]\nl2_persist_mib = -1\n{MIN}"),
        2,
        &["protection.l2_persist_mib"],
    );
    assert_err(
        &format!("[protection]\nslack_order = \"yes\"\n{MIN}"),
        2,
        &["protection.slack_order", "true or false"],
    );
    assert_err(
        &format!("[protection]\nshare = 1\n{MIN}"),
        2,
        &["protection.share", "true or false"],
    );
}

/// `[protection] fine_piece_us` (best effort in runs of fine pieces): off by default, from 20
/// to `piece_us` when set, written and read back; a bad value names the key and its range.
#[test]
fn fine_pieces_parse_round_trip_and_stay_within_piece_us() {
    assert_eq!(parse(MIN).unwrap().protection.fine_piece_us, 0);
    let s = parse(&format!(
        "[protection]\npiece_us = 100\nfine_piece_us = 25\n{MIN}"
    ))
    .unwrap();
    assert_eq!(s.protection.fine_piece_us, 25);
    let text = s.to_toml_string().unwrap();
    assert!(text.contains("fine_piece_us = 25"), "{text}");
    assert_eq!(parse(&text).unwrap().protection, s.protection);
    // Both bounds, and 0 (off) whatever piece_us is.
    for ok in [
        "fine_piece_us = 20",
        "fine_piece_us = 100",
        "fine_piece_us = 0",
    ] {
        let s = parse(&format!("[protection]\npiece_us = 100\n{ok}\n{MIN}")).unwrap();
        assert_eq!(
            parse(&s.to_toml_string().unwrap()).unwrap().protection,
            s.protection
        );
    }
    // Under the shortest piece; over piece_us (given, and the default 250).
    assert_err(
        &format!("[protection]\nfine_piece_us = 10\n{MIN}"),
        2,
        &[
            "protection.fine_piece_us",
            "found integer 10",
            "0 (off)",
            "from 20 to piece_us (250)",
        ],
    );
    assert_err(
        &format!("[protection]\npiece_us = 100\nfine_piece_us = 101\n{MIN}"),
        3,
        &[
            "protection.fine_piece_us",
            "101",
            "from 20 to piece_us (100)",
        ],
    );
    assert_err(
        &format!("[protection]\nfine_piece_us = 300\n{MIN}"),
        2,
        &["protection.fine_piece_us", "piece_us (250)"],
    );
    // Not an integer: named at the walk, with the same range in words.
    assert_err(
        &format!("[protection]\nfine_piece_us = \"fine\"\n{MIN}"),
        2,
        &[
            "protection.fine_piece_us",
            "0 (off), or an integer from 20 to piece_us",
        ],
    );
    assert_err(
        &format!("[protection]\nfine_piece_us = -5\n{MIN}"),
        2,
        &["protection.fine_piece_us"],
    );
    // A piece_us that breaks its own rule is reported once, there; fine_piece_us is judged
    // against the lower bound only.
    let e = err(&format!(
        "[protection]\npiece_us = 5\nfine_piece_us = 40\n{MIN}"
    ));
    assert!(
        e.contains("protection.piece_us") && !e.contains("fine_piece_us"),
        "{e}"
    );
    // A scenario built in code is held to the same rule.
    let mut built = parse(MIN).unwrap();
    built.protection.fine_piece_us = 300;
    let e = built.validate(&MODELS).unwrap_err().to_string();
    assert!(
        e.contains("protection.fine_piece_us") && e.contains("300"),
        "{e}"
    );
}

#[test]
fn a_workloads_own_stretch_parses_round_trips_and_is_for_critical_work_only() {
    let s = parse(&format!("{MIN}stretch = 1.25\n")).unwrap();
    assert_eq!(s.workloads[0].stretch, Some(1.25));
    let back = parse(&s.to_toml_string().unwrap()).unwrap();
    assert_eq!(back.workloads[0].stretch, Some(1.25));
    assert_eq!(parse(MIN).unwrap().workloads[0].stretch, None);
    assert_err(
        &format!("{MIN}stretch = 0.5\n"),
        7,
        &["workload[0].stretch", "0.5"],
    );
    assert_err(
        &format!("{MIN}criticality = \"best_effort\"\nstretch = 1.5\n"),
        8,
        &["workload[0].stretch", "critical workloads", "best_effort"],
    );
}

#[test]
fn a_phase_parses_round_trips_and_is_never_negative() {
    let s = parse(&format!("{MIN}phase_ms = 2.5\n")).unwrap();
    assert_eq!(s.workloads[0].phase_ms, Some(2.5));
    let text = s.to_toml_string().unwrap();
    assert!(text.contains("phase_ms = 2.5"), "{text}");
    assert_eq!(parse(&text).unwrap().workloads[0].phase_ms, Some(2.5));
    assert_eq!(
        parse(&format!("{MIN}phase_ms = 0\n")).unwrap().workloads[0].phase_ms,
        Some(0.0)
    );
    // Absent: none, and none written.
    let s = parse(MIN).unwrap();
    assert_eq!(s.workloads[0].phase_ms, None);
    assert!(!s.to_toml_string().unwrap().contains("phase_ms"));
    assert_err(
        &format!("{MIN}phase_ms = -1\n"),
        7,
        &[
            "workload[0].phase_ms",
            "found integer -1",
            "milliseconds >= 0",
        ],
    );
    assert_err(
        &format!("{MIN}phase_ms = \"soon\"\n"),
        7,
        &["workload[0].phase_ms", "milliseconds >= 0"],
    );
    assert_err(
        &format!("{MIN}phase_ms = 1e300\n"),
        7,
        &["workload[0].phase_ms", "100 days"],
    );
}

mod gpus;
mod programs_and_backends;

/// `[[app]]` tables are isolane-app's (docs/apps.md): the walk lets them through, and a file
/// of apps needs no workload; the apps' own keys are not read here.
#[test]
fn apps_pass_through_and_need_no_workloads() {
    let s = parse("[device]\nbackend = \"cpu\"\n\n[[app]]\nname = \"a\"\nanything = 1\n").unwrap();
    assert!(s.workloads.is_empty());
    // workloads beside apps are still read and checked
    assert_err(
        "[[app]]\nname = \"a\"\n\n[[workload]]\nname = \"w\"\n",
        4,
        &["workload[0]", "model"],
    );
}

#[test]
fn a_tiny_rate_is_printed_the_shortest_way() {
    // Issue 31: `rate_hz = 1e-300` came back as 0.000…0001 with 300 digits.
    let e = err(&with_rate("1e-300", "duration_s = 1\n"));
    assert!(e.contains("rate_hz = 1e-300: no job"), "{e}");
    assert!(e.len() < 400, "{} bytes: {e}", e.len());
    let e = err(&with_rate(
        "1e-300",
        "role = \"interferer\"\nramp = { from_hz = 1e-300, to_hz = 1, steps = 2, step_s = 1 }\n",
    ));
    assert!(!e.contains("0.0000000000"), "{e}");
}

#[test]
fn a_duplicate_key_is_named() {
    let e = err(&format!("{MIN}batch = 1\nbatch = 2\n"));
    assert!(
        e.starts_with("dir/s.toml:8:1: TOML syntax error: duplicate key `batch`"),
        "{e}"
    );
    let e = err("[device]\nbackend = \"cpu\"\n[device]\n");
    assert!(e.contains("duplicate key `device`"), "{e}");
}

#[test]
fn a_file_of_many_problems_lists_a_bounded_number() {
    // Issue 31: 650 k unknown keys printed 200 MB of errors.
    let mut text = MIN.to_string();
    for k in 0..5000 {
        text += &format!("unknown_{k} = 1\n");
    }
    let e = parse(&text).unwrap_err();
    assert_eq!(e.problems().len(), 5000);
    let shown = e.to_string();
    let lines: Vec<&str> = shown.lines().collect();
    assert_eq!(lines.len(), error::MAX_LISTED_PROBLEMS + 1, "{shown}");
    assert!(lines[0].contains("unknown_0"), "{shown}");
    let left = 5000 - error::MAX_LISTED_PROBLEMS;
    assert_eq!(
        lines[error::MAX_LISTED_PROBLEMS],
        format!(
            "dir/s.toml: and {left} more problem(s), not shown: fix the ones above and run again"
        )
    );
}

#[test]
fn a_scenario_is_read_once_and_capped() {
    let e = Scenario::load("/dev/zero", &MODELS)
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("/dev/zero: cannot read the scenario file: larger than 16 MiB"),
        "{e}"
    );
    // A FIFO holds its text once: reading it twice (as `run` did for [[app]] scenarios) would
    // wait forever for a second writer.
    let d = tempfile::tempdir().unwrap();
    let fifo = d.path().join("s.toml");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: `c` is a NUL-terminated path, as mkfifo(3) requires.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let writer = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::write(&fifo, MIN).unwrap())
    };
    assert_eq!(Scenario::read_file(&fifo).unwrap(), MIN);
    writer.join().unwrap();
}

// ---- [workload.serve] ----

/// A workload of batch 8 with `serve` lines after its own keys (from line 9).
fn served(serve: &str) -> String {
    format!(
        "\n[[workload]]\nname = \"cam0\"\nmodel = \"spin:4ms\"\nbatch = 8\nrate_hz = 100\njobs = \
         500\ncriticality = \"best_effort\"\n{serve}"
    )
}

#[test]
fn serve_defaults_come_from_the_criticality_and_are_not_written() {
    let s = parse(MIN).unwrap();
    let w = &s.workloads[0];
    assert_eq!(w.serve, ServeSpec::default());
    assert_eq!(w.serve.queue_limit, 64);
    assert_eq!(w.serve.when_full, WhenFull::Refuse);
    // Critical: one request per job; best effort: what is queued, with no delay.
    assert_eq!(w.serve.batching_for(w.criticality), None);
    assert_eq!(
        w.serve.batching_for(Criticality::BestEffort),
        Some(Batching {
            max_delay_ms: 0.0,
            preferred: Vec::new()
        })
    );
    assert!(!s.to_toml_string().unwrap().contains("serve"));
    // A table that says only the defaults is the default, and writes as none.
    let s = parse(&served(
        "[workload.serve]\nqueue_limit = 64\nwhen_full = \"refuse\"\n",
    ))
    .unwrap();
    assert!(s.workloads[0].serve.is_default());
    let text = s.to_toml_string().unwrap();
    assert!(!text.contains("serve"), "{text}");
    assert_eq!(parse(&text).unwrap(), s);
}

#[test]
fn a_serve_table_parses_and_round_trips() {
    let s = parse(&served(
        "[workload.serve]\nqueue_limit = 32\nwhen_full = \"drop_oldest\"\n\
         [workload.serve.batching]\nmax_delay_ms = 2.5\npreferred = [4, 8]\n",
    ))
    .unwrap();
    assert_eq!(
        s.workloads[0].serve,
        ServeSpec {
            queue_limit: 32,
            when_full: WhenFull::DropOldest,
            batching: Some(Batching {
                max_delay_ms: 2.5,
                preferred: vec![4, 8]
            }),
        }
    );
    assert_eq!(WhenFull::DropOldest.name(), "drop_oldest");
    let text = s.to_toml_string().unwrap();
    for line in [
        "[workload.serve]",
        "queue_limit = 32",
        "when_full = \"drop_oldest\"",
        "[workload.serve.batching]",
        "max_delay_ms = 2.5",
        "preferred = [4, 8]",
    ] {
        assert!(text.contains(line), "{line} missing in\n{text}");
    }
    assert_eq!(parse(&text).unwrap(), s, "{text}");
    // Inline tables read the same; an integer delay is a number of ms.
    let inline = parse(&served(
        "serve = { queue_limit = 32, when_full = \"drop_oldest\", batching = { max_delay_ms = \
         2.5, preferred = [4, 8] } }\n",
    ))
    .unwrap();
    assert_eq!(inline, s);
    let whole = parse(&served("serve.batching.max_delay_ms = 3\n")).unwrap();
    assert_eq!(
        whole.workloads[0]
            .serve
            .batching
            .as_ref()
            .map(|b| b.max_delay_ms),
        Some(3.0)
    );
}

/// An empty batching table turns batching on (a critical workload's default is off) and is
/// written back, so that the resolved file batches too.
#[test]
fn an_empty_batching_table_batches_with_no_delay_and_round_trips() {
    let text = format!("{MIN}[workload.serve.batching]\n");
    let s = parse(&text).unwrap();
    let serve = &s.workloads[0].serve;
    assert_eq!(serve.queue_limit, 64);
    assert_eq!(serve.batching, Some(Batching::default()));
    assert!(serve.batching_for(Criticality::Critical).is_some());
    let written = s.to_toml_string().unwrap();
    assert!(
        written.contains("[workload.serve.batching]\nmax_delay_ms = 0.0\n"),
        "{written}"
    );
    assert!(!written.contains("preferred"), "{written}");
    assert_eq!(parse(&written).unwrap(), s, "{written}");
}

#[test]
fn bad_serve_values_name_the_field_and_the_allowed_values() {
    let queue = "an integer >= 1 (at most 65536)";
    for (v, found) in [
        ("0", "found integer 0"),
        ("65537", "found integer 65537"),
        ("-1", "found integer -1"),
        ("4.0", "found float 4.0"),
        ("\"64\"", "found string \"64\""),
    ] {
        assert_err(
            &served(&format!("[workload.serve]\nqueue_limit = {v}\n")),
            10,
            &["workload[0].serve.queue_limit: ", found, queue],
        );
    }
    assert_err(
        &served("[workload.serve]\nwhen_full = \"block\"\n"),
        10,
        &[
            "workload[0].serve.when_full: found string \"block\"; expected one of \"refuse\" | \
             \"drop_oldest\"",
        ],
    );
    let delay = "expected a finite number of milliseconds >= 0, at most 10000";
    for (v, found) in [
        ("-1", "found integer -1"),
        ("-0.5", "found float -0.5"),
        ("10000.5", "found float 10000.5"),
        ("nan", "found float nan"),
        ("inf", "found float inf"),
        ("\"2ms\"", "found string \"2ms\""),
    ] {
        assert_err(
            &served(&format!("[workload.serve.batching]\nmax_delay_ms = {v}\n")),
            10,
            &["workload[0].serve.batching.max_delay_ms: ", found, delay],
        );
    }
    assert!(parse(&served("serve.batching.max_delay_ms = 10000\n")).is_ok());
    let sizes = "expected an array of batch sizes from 1 to the workload's batch (8), strictly \
                 increasing, e.g. [4, 8]";
    for (v, field, found) in [
        ("[4, 16]", "preferred[1]", "found integer 16"),
        ("[0]", "preferred[0]", "found integer 0"),
        ("[-1]", "preferred[0]", "found integer -1"),
        ("[2, \"4\"]", "preferred[1]", "found string \"4\""),
        ("[2.0]", "preferred[0]", "found float 2.0"),
        ("4", "preferred", "found integer 4"),
    ] {
        assert_err(
            &served(&format!("[workload.serve.batching]\npreferred = {v}\n")),
            10,
            &[
                &format!("workload[0].serve.batching.{field}: "),
                found,
                sizes,
            ],
        );
    }
    for (v, found) in [
        ("[8, 4]", "found 4 after preferred[0] = 8"),
        ("[1, 4, 4]", "found 4 after preferred[1] = 4"),
    ] {
        assert_err(
            &served(&format!("[workload.serve.batching]\npreferred = {v}\n")),
            10,
            &[
                "workload[0].serve.batching.preferred[",
                found,
                "expected strictly increasing batch sizes",
            ],
        );
    }
    // Every size up to the batch is allowed, and none at all.
    assert!(parse(&served("serve.batching.preferred = [1, 2, 8]\n")).is_ok());
    assert!(parse(&served("serve.batching.preferred = []\n")).is_ok());
}

#[test]
fn serve_tables_refuse_unknown_keys_and_other_types() {
    assert_err(
        &served("[workload.serve]\nqueue_limt = 3\n"),
        10,
        &[
            "workload[0].serve.queue_limt: unknown key (did you mean \"queue_limit\"?); allowed \
             keys here: queue_limit, when_full, batching",
        ],
    );
    assert_err(
        &served("[workload.serve.batching]\nmax_dely_ms = 3\n"),
        10,
        &[
            "workload[0].serve.batching.max_dely_ms: unknown key (did you mean \
             \"max_delay_ms\"?); allowed keys here: max_delay_ms, preferred",
        ],
    );
    assert_err(
        &served("serve = 5\n"),
        9,
        &["workload[0].serve: found integer 5; expected a table"],
    );
    assert_err(
        &served("serve = { batching = true }\n"),
        9,
        &["workload[0].serve.batching: found boolean true; expected a table"],
    );
    assert_err(
        &served("serv = {}\n"),
        9,
        &["workload[0].serv: unknown key (did you mean \"serve\"?)"],
    );
}

/// The field path names the workload by its index: the third workload's problem is
/// `workload[2]`'s, at its own line.
#[test]
fn a_serve_problem_names_its_workload() {
    let text = format!(
        "{}\n[[workload]]\nname = \"b\"\nmodel = \"spin:1ms\"\nrate_hz = 10\njobs = 5\n\
         \n[[workload]]\nname = \"c\"\nmodel = \"spin:1ms\"\nrate_hz = 10\njobs = 5\n\
         [workload.serve]\nwhen_full = \"wait\"\n",
        MIN
    );
    assert_err(
        &text,
        20,
        &[
            "workload[2].serve.when_full: found string \"wait\"",
            "\"refuse\" | \"drop_oldest\"",
        ],
    );
}

#[test]
fn a_serve_table_is_refused_on_a_command_workload_and_an_interferer() {
    let program = "\n[[workload]]\nname = \"p\"\ncommand = [\"true\"]\n[workload.serve]\n";
    assert_err(
        program,
        5,
        &["workload[0].serve: not allowed on a command workload: `isolane serve` serves models"],
    );
    // Refused by name once, not for its values too.
    let e = err(&format!("{program}queue_limit = 0\n"));
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(
        e.contains("workload[0].serve: not allowed on a command workload"),
        "{e}"
    );
    let interferer = "\n[[workload]]\nname = \"noise\"\nmodel = \"spin:1ms\"\nrole = \
                      \"interferer\"\nramp = { from_hz = 10, to_hz = 20, steps = 2, step_s = 1 \
                      }\nserve = { queue_limit = 0 }\n";
    let e = err(interferer);
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(
        e.starts_with(&format!(
            "{FILE}:7:1: workload[0].serve: not allowed with role \"interferer\""
        )),
        "{e}"
    );
}

/// A scenario built in code is held to the same rules, by field.
#[test]
fn validate_checks_serve_on_the_value() {
    let base = parse(&served("")).unwrap();
    let problems = |s: &Scenario| -> Vec<String> {
        let e = s.validate(&MODELS).unwrap_err();
        e.to_string().lines().map(str::to_string).collect()
    };
    let mut s = base.clone();
    s.workloads[0].serve = ServeSpec {
        queue_limit: 0,
        when_full: WhenFull::Refuse,
        batching: Some(Batching {
            max_delay_ms: f64::INFINITY,
            preferred: vec![9],
        }),
    };
    assert_eq!(
        problems(&s),
        [
            "workload[0].serve.queue_limit: found integer 0; expected an integer >= 1 (at most \
             65536)"
                .to_string(),
            format!(
                "workload[0].serve.batching.max_delay_ms: found float inf; expected {}",
                format::max_delay_expected()
            ),
            format!(
                "workload[0].serve.batching.preferred[0]: found integer 9; expected {}",
                format::preferred_expected(Some(8))
            ),
        ]
    );
    // A program's serve table is refused by name, whatever it holds.
    let mut s = parse("\n[[workload]]\nname = \"p\"\ncommand = [\"true\"]\n").unwrap();
    s.workloads[0].serve.queue_limit = 8;
    assert_eq!(problems(&s).len(), 1);
    assert!(problems(&s)[0].starts_with("workload[0].serve: not allowed on a command workload"));
    // Valid values write and read back the same.
    let mut s = base;
    s.workloads[0].serve.batching = Some(Batching {
        max_delay_ms: 0.125,
        preferred: vec![2],
    });
    s.validate(&MODELS).unwrap();
    assert_eq!(parse(&s.to_toml_string().unwrap()).unwrap(), s);
}

/// docs/scenario.md's `[workload.serve]` example reads as it says.
#[test]
fn the_documented_serve_example_is_valid() {
    let doc = include_str!("../../../../docs/scenario.md");
    let at = doc.find("### `[workload.serve]`").expect("the section");
    let start = at + doc[at..].find("```toml\n").expect("an example") + "```toml\n".len();
    let end = start + doc[start..].find("```").expect("its end");
    let s = Scenario::from_toml_str(&doc[start..end], "docs/scenario.md", &["resnet50"])
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        s.workloads[0].serve,
        ServeSpec {
            queue_limit: 32,
            when_full: WhenFull::DropOldest,
            batching: Some(Batching {
                max_delay_ms: 2.0,
                preferred: vec![4, 8]
            }),
        }
    );
}

/// A batch that is refused itself gives the preferred sizes no bound to be told: each problem is
/// reported once, where it is.
#[test]
fn preferred_sizes_beside_a_bad_batch_are_told_no_bound() {
    let text = format!("{MIN}batch = 0\nserve.batching.preferred = [\"x\", 4]\n");
    let e = err(&text);
    assert!(e.contains("workload[0].batch: found integer 0"), "{e}");
    assert!(
        e.contains(
            "workload[0].serve.batching.preferred[0]: found string \"x\"; expected an array of \
             batch sizes from 1 to the workload's batch, strictly increasing"
        ),
        "{e}"
    );
    assert_eq!(e.lines().count(), 2, "{e}");
}

#[test]
fn int8_and_fp8_take_a_calibration_folder_resolved_absolute() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("cal")).unwrap();
    let scen = dir.path().join("s.toml");
    let text = "[[workload]]\nname = \"a\"\nmodel = \"resnet18\"\nprecision = \"int8\"\n\
                calibration = \"cal\"\nrate_hz = 5\njobs = 5\n";
    let s = Scenario::from_toml_str(text, &scen, &MODELS).unwrap();
    let w = &s.workloads[0];
    let abs = dir.path().canonicalize().unwrap();
    assert_eq!(w.precision, Precision::Int8);
    assert_eq!(
        w.calibration,
        Some(CalibrationSpec {
            dir: abs.join("cal").to_str().unwrap().to_string(),
            method: CalibrationMethod::Percentile,
            skips: CalibrationSkips::Quantized,
        })
    );
    // Written and read back from anywhere; on the CPU backend too.
    let again = Scenario::from_toml_str(&s.to_toml_string().unwrap(), "/elsewhere/r.toml", &MODELS)
        .unwrap();
    assert_eq!(again, s);
    let fp8 = text
        .replace("\"int8\"", "\"fp8\"")
        .replace("jobs = 5\n", "jobs = 5\ncalibration_method = \"minmax\"\n");
    let s = Scenario::from_toml_str(&fp8, &scen, &MODELS).unwrap();
    let w = &s.workloads[0];
    assert_eq!(w.precision, Precision::Fp8);
    assert_eq!(
        w.calibration.as_ref().unwrap().method,
        CalibrationMethod::Minmax
    );
    let e = Scenario::from_toml_str(&text.replace("= \"cal\"", "= \"nope\""), &scen, &MODELS)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(":5:15: workload[0].calibration: ") && e.contains("nope is not a folder"),
        "{e}"
    );
}

#[test]
fn calibration_skips_are_quantized_unless_written_float() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("cal")).unwrap();
    let scen = dir.path().join("s.toml");
    let text = "[[workload]]\nname = \"a\"\nmodel = \"resnet18\"\nprecision = \"int8\"\n\
                calibration = \"cal\"\nrate_hz = 5\njobs = 5\n";
    let read = |text: &str| Scenario::from_toml_str(text, &scen, &MODELS).unwrap();
    let skips = |s: &Scenario| s.workloads[0].calibration.as_ref().unwrap().skips;
    let s = read(text);
    assert_eq!(skips(&s), CalibrationSkips::Quantized);
    assert!(!s.to_toml_string().unwrap().contains("calibration_skips"));
    for (name, want) in [
        ("quantized", CalibrationSkips::Quantized),
        ("float", CalibrationSkips::Float),
    ] {
        let s = read(&format!("{text}calibration_skips = \"{name}\"\n"));
        assert_eq!(skips(&s), want);
        // Written only where not the default, and read back the same from anywhere.
        let written = s.to_toml_string().unwrap();
        let float = written.contains("calibration_skips = \"float\"");
        assert_eq!(float, want == CalibrationSkips::Float, "{written}");
        let again = Scenario::from_toml_str(&written, "/elsewhere/r.toml", &MODELS).unwrap();
        assert_eq!(again, s);
    }
}

#[test]
fn calibration_keys_are_refused_where_they_mean_nothing() {
    const W: &str = "[[workload]]\nname = \"a\"\nmodel = \"resnet18\"\nrate_hz = 5\njobs = 5\n";
    assert_err(
        &format!("{W}precision = \"int8\"\n"),
        1,
        &[
            "workload[0].calibration: missing in [workload[0]]",
            "a folder of .npy files or images",
            "precision = \"int8\" quantizes the model from it",
        ],
    );
    assert_err(
        &format!("{W}precision = \"fp32\"\ncalibration = \"cal\"\n"),
        7,
        &[
            "workload[0].calibration: only with precision = \"int8\" or \"fp8\"",
            "this workload's precision is \"fp32\"",
        ],
    );
    let e = err(&format!(
        "{W}precision = \"int8\"\ncalibration_method = \"kl\"\n"
    ));
    assert!(
        e.contains(
            ":7:22: workload[0].calibration_method: found string \"kl\"; expected one of \
                    \"percentile\" | \"entropy\" | \"minmax\""
        ),
        "{e}"
    );
    let e = err(&format!(
        "{W}precision = \"int8\"\ncalibration_skips = \"bytes\"\n"
    ));
    assert!(
        e.contains(
            "dir/s.toml:7:21: workload[0].calibration_skips: found string \"bytes\"; expected \
             one of \"quantized\" | \"float\""
        ),
        "{e}"
    );
    for (precision, line) in [("precision = \"fp32\"\n", 7), ("", 6)] {
        assert_err(
            &format!("{W}{precision}calibration_skips = \"float\"\n"),
            line,
            &[
                "workload[0].calibration_skips: only with precision = \"int8\" or \"fp8\"",
                "remove calibration_skips",
            ],
        );
    }
    assert_err(
        &format!("{W}precision = \"int9\"\n"),
        6,
        &["workload[0].precision", "\"int8\" | \"fp8\""],
    );
    let e = err(&format!(
        "{W}precision = \"fp8\"\ncalibration = \".\"\ncalibration_method = \"entropy\"\n"
    ));
    assert!(
        e.contains("workload[0].calibration_method: found \"entropy\" with precision \"fp8\"")
            && e.contains("\"percentile\" | \"minmax\""),
        "{e}"
    );
    let e = err(
        "[[workload]]\nname = \"a\"\nmodel = \"spin:1ms\"\nrate_hz = 5\njobs = 5\n\
         precision = \"int8\"\ncalibration = \".\"\n",
    );
    assert!(
        e.contains("workload[0].precision: found \"int8\" with a spin: or kernel: model"),
        "{e}"
    );
    // The CPU backend runs int8 (its quantized graph at fp32), not fp16.
    let e = err(&format!(
        "{W}precision = \"fp16\"\n[device]\nbackend = \"cpu\"\n"
    ));
    assert!(e.contains("expected \"fp32\", \"int8\" or \"fp8\""), "{e}");
}

#[test]
fn a_calibration_left_on_a_float_precision_is_not_written() {
    // `run --backend cpu` may set a GPU workload's precision in code; the file written for
    // the run must still be read back.
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("cal")).unwrap();
    let text = "[[workload]]\nname = \"a\"\nmodel = \"resnet18\"\nprecision = \"int8\"\n\
                calibration = \"cal\"\nrate_hz = 5\njobs = 5\n";
    let mut s = Scenario::from_toml_str(text, dir.path().join("s.toml"), &MODELS).unwrap();
    s.workloads[0].precision = Precision::Fp32;
    let written = s.to_toml_string().unwrap();
    assert!(!written.contains("calibration"), "{written}");
    let again = Scenario::from_toml_str(&written, "/elsewhere/r.toml", &MODELS).unwrap();
    assert_eq!(again.workloads[0].calibration, None);
}
