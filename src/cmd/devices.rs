//! `isolane devices [--json]`: each CUDA device and what it offers to partitioning.
//!
//! Informational: with no driver or no GPU it prints `no CUDA device (reason)` (JSON: an empty
//! `devices` list and `no_device_reason`) and exits 0. It never changes a GPU setting.

use clap::Args;

#[derive(Args)]
#[command(
    about = "List CUDA devices: SMs, memory, versions, MIG mode, green-context granularity, MPS",
    long_about = "For each CUDA device: name, UUID, compute capability, SM count, memory, driver \
                  and CUDA versions, MIG mode (current/pending), green-context granularity \
                  (minimum and step, from paper 000's Table I, and the driver's own minimum), \
                  and the offline device model admission control uses for it. Also whether an \
                  MPS control daemon is running and whether isolane can start its own.\n\n\
                  Exits 0 also when there is no CUDA device (it says why)."
)]
pub struct DevicesArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: DevicesArgs) -> anyhow::Result<u8> {
    let r = isolane_gpu::devices::report();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(0);
    }
    if r.devices.is_empty() {
        println!(
            "no CUDA device ({})",
            r.no_device_reason.as_deref().unwrap_or("none found")
        );
    }
    for d in &r.devices {
        println!("GPU {}: {} ({})", d.index, d.name, d.uuid);
        println!(
            "  compute capability {}.{}, {} SMs, {} MiB",
            d.compute_capability.0, d.compute_capability.1, d.sm_count, d.memory_mib
        );
        println!(
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
            println!(
                "  MIG mode: current {}, pending {}",
                onoff(d.mig.current),
                onoff(d.mig.pending)
            );
        } else {
            println!("  MIG: not supported");
        }
        match (&d.green_rules, &d.green_driver) {
            (Some(g), Some(drv)) => println!(
                "  green contexts: min {} SMs, step {} (driver: min {}, alignment {})",
                g.min_sms, g.step_sms, drv.min_partition_sms, drv.coscheduled_alignment
            ),
            (Some(g), None) => println!(
                "  green contexts: min {} SMs, step {} (driver support unknown)",
                g.min_sms, g.step_sms
            ),
            (None, _) => println!("  green contexts: not supported"),
        }
        println!("  device model for admission control: {}", d.device_model);
    }
    let m = &r.mps;
    if m.daemon_running {
        println!(
            "MPS: a control daemon is running (pipe directory {}, pid(s) {:?})",
            m.pipe_dir, m.daemon_pids
        );
    } else {
        println!("MPS: no control daemon running");
    }
    match &m.control_binary {
        Some(b) => println!("MPS: isolane can start its own daemon ({b})"),
        None => println!("MPS: nvidia-cuda-mps-control not found; isolane cannot start a daemon"),
    }
    Ok(0)
}
