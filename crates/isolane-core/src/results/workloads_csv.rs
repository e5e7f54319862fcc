//! workloads.csv: a run's summary.json as a flat table, one row per workload, for pandas and
//! spreadsheets (docs/report.md, Reading results in Python).

use super::{csv_field, RunSummary};

/// The flat per-run table, one row per workload (docs/report.md, Reading results in Python).
pub const WORKLOADS_CSV: &str = "workloads.csv";

/// workloads.csv's columns, in order. Documented in docs/report.md: a name is only ever added
/// at the end, never renamed or removed, so that scripts reading it by name keep working.
pub const WORKLOADS_COLUMNS: &[&str] = &[
    "workload",
    "model",
    "batch",
    "backend",
    "host",
    "criticality",
    "status",
    "mechanism",
    "partition",
    "rate_hz",
    "deadline_ms",
    "jobs",
    "completed",
    "timeouts",
    "timeout_pct",
    "throughput_ips",
    "latency_mean_ms",
    "latency_std_ms",
    "latency_min_ms",
    "latency_p10_ms",
    "latency_p50_ms",
    "latency_p90_ms",
    "latency_p95_ms",
    "latency_p99_ms",
    "latency_p999_ms",
    "latency_max_ms",
    "latency_tail_ms",
    "latency_flatness_ms",
    "start_lateness_p50_us",
    "start_lateness_p99_us",
    "start_lateness_max_us",
    "wall_s",
    "cpu_pct",
    "runqueue_wait_ms",
    "gpu_memory_mib",
    "memory_estimate_mib",
    "energy_j",
    "j_per_image",
];

/// summary.json's workloads as one CSV row each, under [`WORKLOADS_COLUMNS`]; a value the run
/// does not have (no GPU memory on the CPU, no latency without a completed job) is an empty
/// cell, which pandas reads as NaN.
pub fn workloads_csv(summary: &RunSummary) -> String {
    fn num(v: Option<f64>) -> String {
        v.filter(|x| x.is_finite())
            .map_or_else(String::new, |x| x.to_string())
    }
    // The serde name (`best_effort`, `cpu`), as summary.json writes it.
    fn word<T: serde::Serialize>(v: &T) -> String {
        match serde_json::to_value(v) {
            Ok(serde_json::Value::String(s)) => s,
            _ => String::new(),
        }
    }
    let mut out = WORKLOADS_COLUMNS.join(",");
    out.push('\n');
    for w in &summary.workloads {
        let part = summary.partitions.iter().find(|p| p.workload == w.name);
        let m = &w.metrics;
        let l = &m.latency_ms;
        let row = [
            csv_field(&w.name),
            csv_field(&w.model),
            w.batch.to_string(),
            w.backend.as_ref().map_or_else(String::new, word),
            csv_field(&w.host),
            word(&w.criticality),
            word(&w.status),
            part.map_or_else(String::new, |p| word(&p.mechanism)),
            part.map_or_else(String::new, |p| csv_field(&p.partition)),
            num(w.rate_hz),
            num(w.deadline_ms),
            m.jobs.to_string(),
            m.completed.to_string(),
            m.timeouts.to_string(),
            num(Some(m.timeout_pct)),
            num(Some(m.throughput_ips)),
            num(l.mean),
            num(l.std),
            num(l.min),
            num(l.p10),
            num(l.p50),
            num(l.p90),
            num(l.p95),
            num(l.p99),
            num(l.p999),
            num(l.max),
            num(l.tail),
            num(l.flatness),
            num(m.start_lateness_us.p50),
            num(m.start_lateness_us.p99),
            num(m.start_lateness_us.max),
            num(Some(w.wall_s)),
            num(w.cpu.as_ref().map(|c| c.cpu_pct)),
            num(w.cpu.as_ref().map(|c| c.runqueue_wait_ms)),
            num(m.gpu_memory_mib),
            w.memory_estimate_mib
                .map_or_else(String::new, |x| x.to_string()),
            num(m.energy_j),
            num(m.j_per_image),
        ];
        debug_assert_eq!(row.len(), WORKLOADS_COLUMNS.len());
        out.push_str(&row.join(","));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A green H200 run committed in results/ (one workload in 48 SMs).
    const GREEN_RUN: &str = include_str!(
        "../../../../results/h200-protection/session10/together/alone/green/v0_vit_b_16/run/summary.json"
    );

    #[test]
    fn workloads_csv_has_the_documented_columns_and_one_row_per_workload() {
        let mut summary: RunSummary = serde_json::from_str(GREEN_RUN).unwrap();
        // A model path with a comma stays one field.
        let mut second = summary.workloads[0].clone();
        second.name = "b".into();
        second.model = "/m/a,b.onnx".into();
        second.metrics.latency_ms.p999 = None;
        summary.workloads.push(second);
        let text = workloads_csv(&summary);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert_eq!(lines[0], WORKLOADS_COLUMNS.join(","));
        let header: Vec<&str> = lines[0].split(',').collect();
        let row: Vec<&str> = lines[1].split(',').collect();
        assert_eq!(row.len(), header.len(), "{text}");
        let cell = |name: &str| row[header.iter().position(|h| *h == name).unwrap()];
        assert_eq!(cell("workload"), "v0_vit_b_16");
        assert_eq!(cell("backend"), "cuda");
        assert_eq!(cell("criticality"), "critical");
        assert_eq!(cell("status"), "ok");
        assert_eq!(cell("mechanism"), "green");
        assert_eq!(cell("partition"), "green 48 SMs");
        assert_eq!(cell("jobs"), "2966");
        assert_eq!(cell("latency_p50_ms"), "1.012223");
        assert!(lines[2].starts_with("b,\"/m/a,b.onnx\",1,"), "{}", lines[2]);
        // A value the run lacks is an empty cell (NaN in pandas).
        assert!(lines[2].contains(",,"), "{}", lines[2]);
    }
}
