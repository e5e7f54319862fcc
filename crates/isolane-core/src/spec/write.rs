//! Writing the resolved scenario in the user format. Private mirror types keep the user format
//! (rate_hz, duration_s / jobs, no `length`) independent of the public types' serde
//! representation.

use serde::Serialize;

use super::error::SpecError;
use super::format::{
    name_of, BACKENDS, CALIBRATION_METHODS, CALIBRATION_SKIPS, CRITICALITIES, HOSTS, LATE,
    MECHANISMS, PRECISIONS, ROLES, WHEN_FULL,
};
use super::{
    CalibrationSkips, PartitionSpec, ProgramSpec, ProtectionSpec, Ramp, Rate, Role, RunLength,
    Scenario, ServeSpec, TimingSpec, WorkloadSpec,
};

#[derive(Serialize)]
struct OutScenario<'a> {
    device: OutDevice<'a>,
    timing: &'a TimingSpec,
    protection: &'a ProtectionSpec,
    workload: Vec<OutAny<'a>>,
}

#[derive(Serialize)]
struct OutDevice<'a> {
    backend: &'static str,
    /// One GPU: `gpu`; several: `gpus` alone (the file format refuses both at once).
    #[serde(skip_serializing_if = "Option::is_none")]
    gpu: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    gpus: Option<&'a [u32]>,
    mechanism: &'static str,
    host: &'static str,
}

/// One `[[workload]]` table: a model workload, or a command workload with only its own keys.
#[derive(Serialize)]
#[serde(untagged)]
enum OutAny<'a> {
    Model(Box<OutWorkload<'a>>),
    Program(OutProgram<'a>),
}

#[derive(Serialize)]
struct OutProgram<'a> {
    name: &'a str,
    command: &'a [String],
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    env: &'a std::collections::BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cwd: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    duration_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    timeout_s: Option<f64>,
    cpu: &'a [usize],
    backend: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    partition: Option<OutPartition<'a>>,
}

#[derive(Serialize)]
struct OutWorkload<'a> {
    name: &'a str,
    model: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    weights: Option<&'a str>,
    batch: u32,
    precision: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    calibration: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    calibration_method: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    calibration_skips: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rate_hz: Option<Rate>,
    #[serde(skip_serializing_if = "Option::is_none")]
    deadline_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    phase_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    duration_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    jobs: Option<u64>,
    warmup_jobs: u64,
    late: &'static str,
    cpu: &'a [usize],
    role: &'static str,
    host: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    ramp: Option<&'a Ramp>,
    #[serde(skip_serializing_if = "Option::is_none")]
    partition: Option<OutPartition<'a>>,
    plan_check: bool,
    criticality: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    stretch: Option<f64>,
    backend: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    gpu: Option<u32>,
    /// Written only when it is not the default, so that a scenario without one writes as before.
    #[serde(skip_serializing_if = "Option::is_none")]
    serve: Option<OutServe<'a>>,
}

#[derive(Serialize)]
struct OutServe<'a> {
    queue_limit: u32,
    when_full: &'static str,
    /// `None`: the criticality's default, which the file says by leaving the table out.
    #[serde(skip_serializing_if = "Option::is_none")]
    batching: Option<OutBatching<'a>>,
}

#[derive(Serialize)]
struct OutBatching<'a> {
    max_delay_ms: f64,
    #[serde(skip_serializing_if = "<[u32]>::is_empty")]
    preferred: &'a [u32],
}

#[derive(Serialize)]
struct OutPartition<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    sms: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    thread_pct: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mem_limit_mib: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mig_profile: Option<&'a str>,
}

pub(super) fn to_toml(s: &Scenario) -> Result<String, SpecError> {
    let out = OutScenario {
        device: OutDevice {
            backend: name_of(BACKENDS, s.device.backend),
            gpu: (!s.device.several_gpus()).then_some(s.device.gpu),
            gpus: s.device.several_gpus().then_some(&s.device.gpus[..]),
            mechanism: name_of(MECHANISMS, s.device.mechanism),
            host: name_of(HOSTS, s.device.host),
        },
        timing: &s.timing,
        protection: &s.protection,
        workload: s
            .workloads
            .iter()
            .map(|w| match &w.program {
                Some(p) => OutAny::Program(out_program(w, p)),
                None => OutAny::Model(Box::new(out_workload(w))),
            })
            .collect(),
    };
    let body = toml::to_string(&out).map_err(|e| SpecError::Write(e.to_string()))?;
    Ok(format!(
        "# Resolved scenario written by isolane {}: every default filled in.\n\
         # A missing deadline_ms means \"the period\" (for an interferer: of the current ramp step).\n\n{body}",
        env!("CARGO_PKG_VERSION")
    ))
}

fn out_partition(p: &PartitionSpec) -> Option<OutPartition<'_>> {
    (*p != PartitionSpec::default()).then_some(OutPartition {
        sms: p.sms,
        thread_pct: p.thread_pct,
        mem_limit_mib: p.mem_limit_mib,
        mig_profile: p.mig_profile.as_deref(),
    })
}

fn out_serve(s: &ServeSpec) -> Option<OutServe<'_>> {
    (!s.is_default()).then(|| OutServe {
        queue_limit: s.queue_limit,
        when_full: name_of(WHEN_FULL, s.when_full),
        batching: s.batching.as_ref().map(|b| OutBatching {
            max_delay_ms: b.max_delay_ms,
            preferred: &b.preferred,
        }),
    })
}

fn out_program<'a>(w: &'a WorkloadSpec, p: &'a ProgramSpec) -> OutProgram<'a> {
    OutProgram {
        name: &w.name,
        command: &p.command,
        env: &p.env,
        cwd: p.cwd.as_deref(),
        duration_s: p.duration_s,
        timeout_s: p.timeout_s,
        cpu: &w.cpu,
        backend: name_of(BACKENDS, w.backend),
        partition: out_partition(&w.partition),
    }
}

fn out_workload(w: &WorkloadSpec) -> OutWorkload<'_> {
    let interferer = w.role == Role::Interferer;
    let calibration = w.calibration.as_ref().filter(|_| w.precision.quantized());
    OutWorkload {
        name: &w.name,
        model: &w.model,
        weights: w.weights.as_deref(),
        batch: w.batch,
        precision: name_of(PRECISIONS, w.precision),
        // Only where they mean something: a scenario whose precision was changed in code
        // (`run --backend cpu` of a GPU scenario) stays a valid file.
        calibration: calibration.map(|c| c.dir.as_str()),
        calibration_method: calibration.map(|c| name_of(CALIBRATION_METHODS, c.method)),
        // The default left out, so that a file written before the key existed is written
        // back the same.
        calibration_skips: calibration
            .filter(|c| c.skips != CalibrationSkips::default())
            .map(|c| name_of(CALIBRATION_SKIPS, c.skips)),
        // An interferer's rate and length follow from its ramp; writing them would
        // make the file invalid.
        rate_hz: (!interferer).then_some(w.rate),
        deadline_ms: w.deadline_ms,
        phase_ms: w.phase_ms,
        duration_s: match w.length {
            RunLength::DurationS(d) if !interferer => Some(d),
            _ => None,
        },
        jobs: match w.length {
            RunLength::Jobs(n) if !interferer => Some(n),
            _ => None,
        },
        warmup_jobs: w.warmup_jobs,
        late: name_of(LATE, w.late),
        cpu: &w.cpu,
        role: name_of(ROLES, w.role),
        host: name_of(HOSTS, w.host),
        ramp: w.ramp.as_ref(),
        partition: out_partition(&w.partition),
        plan_check: w.plan_check,
        criticality: name_of(CRITICALITIES, w.criticality),
        stretch: w.stretch,
        backend: name_of(BACKENDS, w.backend),
        gpu: w.gpu,
        serve: out_serve(&w.serve),
    }
}
