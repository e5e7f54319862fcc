//! Summarising a run into summary.json's typed form ([`isolane_core::results`] owns the
//! schema). Metric names are core's `WorkloadMetrics` (docs/design.md, "Metrics"), flattened
//! into each workload's object.

use isolane_core::metrics::{exec_times, workload_metrics};
use isolane_core::results::SCHEMA_VERSION;
use isolane_core::results::{
    CpuSummary, HeldSummary, ProgramSummary, RunStatus, RunSummary, WorkloadSummary,
};
use isolane_core::spec::{ProgramSpec, Rate, WorkloadSpec};
use isolane_core::JobRecord;

use crate::coordinator::{RunResult, WorkloadPlan, WorkloadResult, WorkloadStatus};
use crate::schedule::Schedule;

/// The wall time a workload's throughput is measured over: from t0 to its last job's end or,
/// when later, to the end of the schedule's span for the jobs it released (a rate-limited
/// workload's throughput is then at most its rate: 25 jobs at 5 Hz over 5 s is 5.0 /s).
pub fn workload_wall_s(records: &[JobRecord], schedule: &Schedule, run_wall_s: f64) -> f64 {
    let last = records
        .iter()
        .map(|r| r.end_ns.unwrap_or(r.release_ns))
        .max();
    let span = schedule.span_ns(records.len() as u64);
    match (last, span) {
        (Some(ns), Some(span)) if ns.max(span) > 0 => ns.max(span) as f64 / 1e9,
        (Some(ns), None) if ns > 0 => ns as f64 / 1e9,
        _ => run_wall_s,
    }
}

pub fn summarize_workload(
    spec: &WorkloadSpec,
    schedule: &Schedule,
    result: &WorkloadResult,
    run_wall_s: f64,
) -> WorkloadSummary {
    let deadline_ns = schedule.deadline_ns;
    let wall_s = workload_wall_s(&result.records, schedule, run_wall_s);
    let mut metrics = workload_metrics(&result.records, spec.batch, wall_s, deadline_ns);
    // The engine's own count; telemetry replaces it with the process's peak where that is
    // this workload's alone (a worker process, or the only workload).
    metrics.gpu_memory_mib = result.device_memory_mib;
    let (status, error, signal, exit_code, ran_out_of_memory) = match &result.status {
        WorkloadStatus::Ok => (RunStatus::Ok, None, None, None, false),
        WorkloadStatus::Interrupted => (RunStatus::Interrupted, None, None, None, false),
        WorkloadStatus::Failed(f) => (
            RunStatus::Failed,
            Some(f.message.clone()),
            f.signal,
            f.exit_code,
            f.out_of_memory,
        ),
    };
    WorkloadSummary {
        name: spec.name.clone(),
        model: spec.model.clone(),
        batch: spec.batch,
        rate_hz: match spec.rate {
            Rate::Hz(h) => Some(h),
            Rate::Max(_) => None,
        },
        deadline_ms: deadline_ns.map(|d| d as f64 / 1e6),
        host: format!("{:?}", spec.host).to_lowercase(),
        status,
        error,
        signal,
        exit_code,
        ran_out_of_memory,
        pid: result.pid,
        wall_s,
        memory_estimate_mib: None,
        criticality: spec.criticality,
        held: result
            .pieces
            .map(|p| HeldSummary::of(&result.records, p as u64)),
        work: spec.kernel().map(|k| k.work()),
        cpu: result.cpu.map(|c| cpu_summary(&c, wall_s)),
        backend: Some(spec.backend),
        program: None,
        exec_ms: (metrics.completed > 0).then(|| exec_times(&result.records)),
        metrics,
    }
}

/// A command workload's summary: how its program ended, its wall and CPU time (its `jobs`
/// and latencies are those of no job). Telemetry adds its GPU share, energy and device memory.
pub fn summarize_program(
    spec: &WorkloadSpec,
    program: &ProgramSpec,
    result: &WorkloadResult,
    t0_ns: Option<i64>,
) -> WorkloadSummary {
    let Some(o) = &result.program else {
        // It never got to start: the run was aborted before t0.
        let mut w = summarize_workload(spec, &Schedule::from_workload(spec), result, 0.0);
        w.model = program.command_line();
        return w;
    };
    let wall_s = o.wall_s();
    let mut w = summarize_workload(spec, &Schedule::from_workload(spec), result, wall_s);
    w.model = program.command_line();
    w.wall_s = wall_s;
    w.exit_code = o.exit_code;
    w.signal = o.signal;
    let since_t0 = |ns: i64| t0_ns.map_or(0.0, |t0| (ns - t0) as f64 / 1e9);
    let cpu_s = o.usage.user_s + o.usage.system_s;
    let file = |p: &Option<std::path::PathBuf>| {
        p.as_ref()
            .and_then(|p| p.file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    w.program = Some(ProgramSummary {
        command: program.command.clone(),
        end: o.end,
        started_s: since_t0(o.started_ns),
        ended_s: since_t0(o.ended_ns),
        cpu_user_s: o.usage.user_s,
        cpu_system_s: o.usage.system_s,
        cpu_pct: if wall_s > 0.0 {
            cpu_s / wall_s * 100.0
        } else {
            0.0
        },
        max_rss_mib: o.usage.max_rss_mib,
        pids: o.pids.clone(),
        stdout: file(&o.stdout),
        stderr: file(&o.stderr),
        gpu_share_pct: None,
        energy_j: None,
        energy_source: None,
    });
    w
}

fn cpu_summary(c: &crate::thread_cpu::ThreadCpu, wall_s: f64) -> CpuSummary {
    let cpu_s = c.cpu_ns as f64 / 1e9;
    CpuSummary {
        cpu_s,
        cpu_pct: if wall_s > 0.0 {
            cpu_s / wall_s * 100.0
        } else {
            0.0
        },
        runqueue_wait_ms: c.runqueue_ns as f64 / 1e6,
        voluntary_switches: c.voluntary_switches,
        involuntary_switches: c.involuntary_switches,
    }
}

/// Run-level status: interrupted wins over failed (the user stopped it), failed over ok.
pub fn run_status(result: &RunResult) -> RunStatus {
    if result.interrupted {
        RunStatus::Interrupted
    } else if result
        .workloads
        .iter()
        .any(|w| matches!(w.status, WorkloadStatus::Failed(_)))
    {
        RunStatus::Failed
    } else {
        RunStatus::Ok
    }
}

pub struct RunInfo<'a> {
    pub command: &'a str,
    pub started_at: chrono::DateTime<chrono::Utc>,
    pub scenario: String,
}

pub fn summarize_run(info: &RunInfo, plans: &[WorkloadPlan], result: &RunResult) -> RunSummary {
    let workloads = plans
        .iter()
        .zip(&result.workloads)
        .map(|(p, r)| match &p.spec.program {
            Some(program) => summarize_program(&p.spec, program, r, result.t0_ns),
            None => summarize_workload(&p.spec, &p.schedule, r, result.wall_s),
        })
        .collect();
    RunSummary {
        schema_version: SCHEMA_VERSION,
        isolane_version: env!("CARGO_PKG_VERSION").to_string(),
        command: info.command.to_string(),
        status: run_status(result),
        interrupted: result.interrupted,
        complete: true,
        rebuilt_by: None,
        files_incomplete: None,
        started_at: info
            .started_at
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        host: crate::output::host_name(),
        scenario: info.scenario.clone(),
        t0_monotonic_ns: result.t0_ns,
        wall_s: result.wall_s,
        cpu_steal_pct: result.cpu_steal_pct,
        workloads,
        partitions: Vec::new(),
        telemetry: None,
        telemetry_per_gpu: Vec::new(),
        isolation: None,
        apps: Vec::new(),
    }
}
