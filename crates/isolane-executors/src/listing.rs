//! What the listing commands print: `isolane devices` (each CUDA device and what it offers to
//! partitioning) and `isolane models` (the built-in architectures with their size and cost).

use std::fmt::Write as _;

use isolane_engine::builtin_models;
use isolane_gpu::devices::DevicesReport;

/// `isolane devices`'s text: each device, then MPS; with no device, why.
pub fn devices_text(r: &DevicesReport) -> String {
    let mut out = String::new();
    // Writing to a String cannot fail.
    macro_rules! say {
        ($($a:tt)*) => {{
            let _ = writeln!(out, $($a)*);
        }};
    }
    if r.devices.is_empty() {
        say!(
            "no CUDA device ({})",
            r.no_device_reason.as_deref().unwrap_or("none found")
        );
    }
    for d in &r.devices {
        say!("GPU {}: {} ({})", d.index, d.name, d.uuid);
        say!(
            "  compute capability {}.{}, {} SMs, {} MiB",
            d.compute_capability.0,
            d.compute_capability.1,
            d.sm_count,
            d.memory_mib
        );
        say!(
            "  driver {}, CUDA {}",
            d.driver_version.as_deref().unwrap_or("unknown (no NVML)"),
            d.cuda_driver_version
        );
        let onoff = |b: Option<bool>| match b {
            Some(true) => "on",
            Some(false) => "off",
            None => "unknown",
        };
        if d.mig.supported {
            say!(
                "  MIG mode: current {}, pending {}",
                onoff(d.mig.current),
                onoff(d.mig.pending)
            );
        } else {
            say!("  MIG: not supported");
        }
        match (&d.green_rules, &d.green_driver) {
            (Some(g), Some(drv)) => say!(
                "  green contexts: min {} SMs, step {} (driver: min {}, alignment {})",
                g.min_sms,
                g.step_sms,
                drv.min_partition_sms,
                drv.coscheduled_alignment
            ),
            (Some(g), None) => say!(
                "  green contexts: min {} SMs, step {} (driver support unknown)",
                g.min_sms,
                g.step_sms
            ),
            (None, _) => say!("  green contexts: not supported"),
        }
        say!("  device model for admission control: {}", d.device_model);
    }
    let m = &r.mps;
    if m.daemon_running {
        say!(
            "MPS: a control daemon is running (pipe directory {}, pid(s) {:?})",
            m.pipe_dir,
            m.daemon_pids
        );
    } else {
        say!("MPS: no control daemon running");
    }
    match &m.control_binary {
        Some(b) => say!("MPS: isolane can start its own daemon ({b})"),
        None => say!("MPS: nvidia-cuda-mps-control not found; isolane cannot start a daemon"),
    }
    out
}

/// `isolane models --json`: an array of objects.
pub fn models_json() -> serde_json::Result<String> {
    let v: Vec<serde_json::Value> = builtin_models()
        .iter()
        .map(|m| {
            serde_json::json!({
                "name": m.name,
                "params": m.params,
                "gflops_per_image": m.gflops_per_image,
                "input_shape": m.input_shape,
                "output_shape": m.output_shape,
                "description": m.description,
            })
        })
        .collect();
    serde_json::to_string_pretty(&v)
}

/// `isolane models`'s table, in 80 columns: the description wraps inside its cell.
pub fn models_table() -> String {
    let rows: Vec<Vec<String>> = builtin_models()
        .iter()
        .map(|m| {
            vec![
                m.name.to_string(),
                group_thousands(m.params),
                format!("{:.2}", m.gflops_per_image),
                shape(&m.input_shape),
                m.description.to_string(),
            ]
        })
        .collect();
    isolane_report::plain_table(
        &["model", "params", "GFLOP/img", "input", "description"],
        &rows,
        &[0, 3, 4],
    )
}

fn shape(s: &[usize]) -> String {
    s.iter().map(usize::to_string).collect::<Vec<_>>().join("x")
}

fn group_thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn thousands() {
        assert_eq!(super::group_thousands(11_689_512), "11,689,512");
        assert_eq!(super::group_thousands(512), "512");
        assert_eq!(super::group_thousands(1000), "1,000");
    }
}
