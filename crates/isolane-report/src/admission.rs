//! What `isolane plan` (and every command that admits a scenario) prints of admission: the
//! admitted plan's table, and the text of a refusal.

use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
use isolane_core::admission::{Plan, Rejection, ResolvedPartition};
use isolane_core::device_model::DeviceModel;

/// Why `scenario` does not fit `device`: one line per refused workload, at most
/// [`isolane_core::spec::MAX_LISTED_PROBLEMS`] of them.
pub fn rejection_text(scenario: &str, device: &DeviceModel, rejections: &[Rejection]) -> String {
    let mut s = format!(
        "{scenario}: the plan does not fit {} ({}):",
        device.name, device.description
    );
    // As for a scenario's problems: thousands of refused workloads would print megabytes.
    let shown = isolane_core::spec::MAX_LISTED_PROBLEMS;
    for r in rejections.iter().take(shown) {
        s.push_str(&format!("\n  workload '{}': {}", r.workload, r.message));
    }
    if rejections.len() > shown {
        s.push_str(&format!(
            "\n  and {} more workload(s) refused, not shown",
            rejections.len() - shown
        ));
    }
    s
}

/// `isolane plan`'s answer for `scenario` on `device`: whether it was admitted, and what to
/// print: the JSON object (`json`: `admitted` and the plan or the rejections), or words (the
/// plan's table under the device's name, or [`rejection_text`]).
pub fn answer(
    scenario: &str,
    device: &DeviceModel,
    admitted: &Result<Plan, Vec<Rejection>>,
    json: bool,
) -> serde_json::Result<(bool, String)> {
    let text = match (admitted, json) {
        (Ok(plan), true) => {
            serde_json::to_string_pretty(&serde_json::json!({ "admitted": true, "plan": plan }))?
        }
        (Err(rejections), true) => serde_json::to_string_pretty(
            &serde_json::json!({ "admitted": false, "rejections": rejections }),
        )?,
        (Ok(plan), false) => format!(
            "admitted on {} ({}):\n{}",
            device.name,
            device.description,
            plan_table(plan)
        ),
        (Err(rejections), false) => rejection_text(scenario, device, rejections),
    };
    Ok((admitted.is_ok(), text))
}

/// The admitted plan: each workload's partition, its details and its memory.
pub fn plan_table(plan: &Plan) -> Table {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    t.set_header(vec!["workload", "partition", "details", "mem MiB"]);
    // 80 columns: a long details cell wraps between words.
    crate::fit(&mut t, crate::Layout::default());
    for w in &plan.workloads {
        let (kind, details) = match &w.partition {
            ResolvedPartition::Cpu => ("cpu".to_string(), "no device partition".to_string()),
            ResolvedPartition::Whole => (
                "timeslice".to_string(),
                "whole GPU, taking turns".to_string(),
            ),
            ResolvedPartition::Green {
                group,
                sms,
                first_sm,
            } => (
                "green".to_string(),
                format!(
                    "group {group}: {sms} SMs (split positions {first_sm}..{})",
                    first_sm + sms
                ),
            ),
            ResolvedPartition::Mps {
                thread_pct,
                mem_limit_mib,
            } => (
                "mps".to_string(),
                match mem_limit_mib {
                    Some(m) => format!(
                        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={thread_pct}, pinned memory {m} MiB"
                    ),
                    None => format!("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={thread_pct}"),
                },
            ),
            ResolvedPartition::Mig {
                profile,
                start,
                sms,
                memory_mib,
            } => (
                "mig".to_string(),
                format!("{profile} at memory slice {start} ({sms} SMs, {memory_mib} MiB)"),
            ),
        };
        // Only a plan of several GPUs names them (one GPU's table is as it always was).
        let details = match w.gpu {
            Some(g) => format!("GPU {g}, {details}"),
            None => details,
        };
        t.add_row(vec![
            w.workload.clone(),
            kind,
            details,
            w.memory_mib
                .map(|m| m.to_string())
                .unwrap_or_else(|| "-".into()),
        ]);
    }
    t
}

#[cfg(test)]
mod tests {
    use isolane_core::admission::{RejectReason, Rejection};

    /// Issue 31: the list of refused workloads is bounded, as a scenario's problems are.
    #[test]
    fn thousands_of_refused_workloads_print_a_bounded_list() {
        let device = isolane_core::device_model::device_model("h100-sxm").unwrap();
        let rejections: Vec<Rejection> = (0..1000)
            .map(|i| Rejection {
                workload: format!("w{i}"),
                reason: RejectReason::MissingPartition {
                    field: "sms",
                    mechanism: "green",
                },
                message: "partition.sms is required with mechanism green".into(),
                gpu: None,
            })
            .collect();
        let text = super::rejection_text("s.toml", &device, &rejections);
        // `plan`'s answer is that text, or the same rejections as JSON.
        let refused = Err(rejections.clone());
        let (admitted, words) = super::answer("s.toml", &device, &refused, false).unwrap();
        assert!(!admitted && words == text);
        let (_, json) = super::answer("s.toml", &device, &refused, true).unwrap();
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["admitted"], false);
        assert_eq!(v["rejections"].as_array().map(Vec::len), Some(1000));
        let shown = isolane_core::spec::MAX_LISTED_PROBLEMS;
        assert_eq!(text.lines().count(), 1 + shown + 1, "{text}");
        assert!(text.contains("workload 'w0'") && !text.contains(&format!("'w{shown}'")));
        assert!(
            text.ends_with(&format!(
                "and {} more workload(s) refused, not shown",
                1000 - shown
            )),
            "{text}"
        );
    }
}
