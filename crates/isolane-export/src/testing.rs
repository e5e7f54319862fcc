//! Planned scenarios of the unit tests, parsed as a user's file is.

use isolane_core::spec::Scenario;

pub const MODELS: [&str; 4] = ["resnet18", "resnet50", "mobilenet_v2", "vit_b_16"];

pub fn parse(text: &str) -> Scenario {
    Scenario::from_toml_str(text, "planned.toml", &MODELS).unwrap()
}

/// Two workloads in green contexts, as `plan --auto` writes them.
pub fn green() -> Scenario {
    parse(
        r#"
[device]
backend = "cuda"
mechanism = "green"

[[workload]]
name = "inspect"
model = "resnet50"
batch = 16
precision = "fp16"
rate_hz = 200
deadline_ms = 3
duration_s = 10
[workload.partition]
sms = 32

[[workload]]
name = "cam"
model = "resnet18"
precision = "fp16"
rate_hz = 500
deadline_ms = 2
duration_s = 10
criticality = "best_effort"
[workload.partition]
sms = 8
"#,
    )
}

/// Two MPS clients, one with a pinned-memory limit.
pub fn mps() -> Scenario {
    parse(
        r#"
[device]
backend = "cuda"
mechanism = "mps"

[[workload]]
name = "inspect"
model = "resnet50"
rate_hz = 100
duration_s = 10
[workload.partition]
thread_pct = 60
mem_limit_mib = 4096

[[workload]]
name = "cam"
model = "resnet18"
rate_hz = 100
duration_s = 10
[workload.partition]
thread_pct = 30
"#,
    )
}

/// Three MIG instances, two of one profile.
pub fn mig() -> Scenario {
    parse(
        r#"
[device]
backend = "cuda"
mechanism = "mig"

[[workload]]
name = "a"
model = "resnet50"
rate_hz = 100
duration_s = 10
[workload.partition]
mig_profile = "3g.40gb"

[[workload]]
name = "b"
model = "resnet18"
rate_hz = 100
duration_s = 10
[workload.partition]
mig_profile = "1g.10gb"

[[workload]]
name = "c"
model = "resnet18"
rate_hz = 100
duration_s = 10
[workload.partition]
mig_profile = "1g.10gb"
"#,
    )
}

/// A CPU scenario (no GPU partition).
pub fn cpu() -> Scenario {
    parse(
        r#"
[device]
backend = "cpu"

[[workload]]
name = "echo"
model = "spin:1ms"
rate_hz = 100
duration_s = 10
cpu = [1]
"#,
    )
}

/// Two time-sliced workloads.
pub fn timeslice() -> Scenario {
    parse(
        r#"
[device]
backend = "cuda"
mechanism = "timeslice"

[[workload]]
name = "a"
model = "resnet50"
rate_hz = 100
duration_s = 10

[[workload]]
name = "b"
model = "resnet18"
rate_hz = 100
duration_s = 10
"#,
    )
}
