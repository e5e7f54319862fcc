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
    print!("{}", isolane_executors::listing::devices_text(&r));
    Ok(0)
}
