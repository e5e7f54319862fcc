//! `isolane verify SCENARIO`: measures what each partition of a scenario really gets — a probe
//! kernel's throughput alone in its partition and beside saturating neighbours in all the
//! others — and reports the share of the whole GPU and the interference (docs/partitions.md).
//! The work is `isolane_session::verify`'s; the timeslice, MPS and MIG probes run in
//! `isolane worker` processes (the probe role of the worker protocol).

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use isolane_core::spec::Mechanism;
use isolane_gpu::verify::format_table;
use isolane_gpu::GpuError;
use isolane_session::verify::{self, VerifyOptions};

use super::user;

#[derive(Args)]
#[command(
    about = "Measure each partition's share of the GPU and the interference between partitions",
    long_about = "Admits SCENARIO's partitions (backend cuda) on the GPU it names (on several \
                  GPUs, device.gpus: every GPU's, then verifies one GPU after the other), creates them \
                  (green contexts, a private MPS daemon, MIG instances with \
                  --allow-mig-reconfigure, or plain worker processes for timeslice) and runs a \
                  compute-bound probe kernel: first on the whole GPU, then in each partition \
                  alone, then in each partition while every other partition runs the probe flat \
                  out. Reports per partition: share of the whole GPU = alone / whole GPU, and \
                  interference = 1 - beside / alone. The scenario's models are not run. A plan \
                  that admission control rejects is a mistake in the input (exit 2)."
)]
pub struct VerifyArgs {
    /// Scenario file (TOML) with backend = "cuda".
    pub scenario: PathBuf,
    /// Length of each measurement in seconds (at least 0.5 is used).
    #[arg(long, default_value_t = 2.0, value_name = "S")]
    pub duration_s: f64,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Also write verify.json and verify.txt into this directory (created if missing).
    #[arg(long, short = 'o', value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// mig: allow creating and destroying GPU/compute instances (MIG mode must already be on;
    /// isolane never changes it).
    #[arg(long)]
    pub allow_mig_reconfigure: bool,
    /// mps: use an MPS daemon that is already running for this GPU instead of refusing (it is
    /// left running afterwards). `--mps-join-existing` is an old name for it.
    #[arg(long = "join-mps", alias = "mps-join-existing")]
    pub join_mps: bool,
    /// No progress lines on stderr.
    #[arg(long, short = 'q')]
    pub quiet: bool,
}

pub fn run(args: VerifyArgs) -> anyhow::Result<u8> {
    let max_s = isolane_core::spec::limits::MAX_SECONDS;
    if !(args.duration_s.is_finite() && args.duration_s > 0.0 && args.duration_s <= max_s) {
        return Err(user(format!(
            "--duration-s {:e}: must be a positive number of seconds, at most {max_s:e} (100 days)",
            args.duration_s
        )));
    }
    let (scenario, name) = super::load_scenario(Some(&args.scenario))?;
    super::refuse_programs(&scenario, &name, "verify")?;
    super::refuse_mixed_backends(&scenario, &name, "verify")?;
    if scenario.device.mechanism == Mechanism::Mps {
        // Ctrl-C or SIGTERM while the daemon runs: stop it, then die of the signal.
        isolane_gpu::mps::install_signal_handlers()?;
    }
    let opts = VerifyOptions {
        duration: Duration::from_secs_f64(args.duration_s),
        choices: isolane_session::PartitionChoices {
            allow_mig_reconfigure: args.allow_mig_reconfigure,
            join_mps: args.join_mps,
            ..Default::default()
        },
        worker: None,
        verbose: !args.quiet,
    };
    if !args.quiet {
        eprintln!(
            "{}",
            time_needed(&partitions_per_gpu(&scenario), args.duration_s)
        );
    }
    let reports = verify::verify_each_gpu(&scenario, &opts).map_err(|e: GpuError| {
        if e.is_user_error() {
            user(format!("{name}: {e}"))
        } else {
            anyhow::Error::new(e)
        }
    })?;
    // One GPU: its report, as always; several: one report per GPU (each names its `gpu`).
    let (json, table) = match reports.as_slice() {
        [one] => (serde_json::to_string_pretty(one)?, format_table(one)),
        all => (
            serde_json::to_string_pretty(all)?,
            all.iter().map(format_table).collect::<Vec<_>>().join("\n"),
        ),
    };
    if args.json {
        println!("{json}");
    } else {
        print!("{table}");
    }
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir).map_err(|e| user(format!("--out {}: {e}", dir.display())))?;
        super::write_output(&dir.join("verify.json"), json.as_bytes())?;
        super::write_output(&dir.join("verify.txt"), table.as_bytes())?;
        if !args.json {
            println!("results: {}", dir.display());
        }
    }
    Ok(0)
}

/// How many partitions each GPU of the scenario verifies (GPUs without workloads left out).
fn partitions_per_gpu(s: &isolane_core::spec::Scenario) -> Vec<usize> {
    s.device
        .all_gpus()
        .into_iter()
        .map(|g| s.on_one_gpu(g).workloads.len())
        .filter(|&n| n > 0)
        .collect()
}

/// What verify says before it starts: per GPU, the probe on the whole GPU, each partition alone
/// and, with two or more, each beside the others saturating; each measurement at least 0.5 s.
fn time_needed(per_gpu: &[usize], duration_s: f64) -> String {
    let measurements: usize = per_gpu
        .iter()
        .map(|&n| 1 + n + if n >= 2 { n } else { 0 })
        .sum();
    let partitions: usize = per_gpu.iter().sum();
    let gpus = match per_gpu.len() {
        1 => String::new(),
        n => format!(" on {n} GPUs, one after the other"),
    };
    format!(
        "verify: {partitions} partition(s){gpus}, {measurements} measurements of {:.1} s: at \
         least ~{}\n  (plus setting the partitions up)",
        duration_s.max(0.5),
        isolane_session::progress::duration_text(measurements as f64 * duration_s.max(0.5))
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_time_needed_counts_every_measurement() {
        // 4 partitions: whole GPU, 4 alone, 4 beside = 9 measurements of 2 s.
        let t = super::time_needed(&[4], 2.0);
        assert!(t.contains("9 measurements of 2.0 s: at least ~18 s"), "{t}");
        assert!(!t.contains("GPUs"), "{t}");
        // One partition has no neighbours; short measurements last 0.5 s.
        let t = super::time_needed(&[1], 0.1);
        assert!(t.contains("2 measurements of 0.5 s: at least ~1 s"), "{t}");
        // Two GPUs, each measured on its own: (1 + 2 + 2) + (1 + 1).
        let t = super::time_needed(&[2, 1], 1.0);
        assert!(
            t.contains("3 partition(s) on 2 GPUs, one after the other, 7 measurements"),
            "{t}"
        );
    }

    #[test]
    fn each_gpu_with_workloads_is_verified() {
        use isolane_core::spec::{NoBuiltinModels, Scenario};
        let text = "[device]\nbackend = \"cuda\"\ngpus = [0, 1, 2]\nmechanism = \"green\"\n\
                    [[workload]]\nname = \"a\"\nmodel = \"spin:1ms\"\nrate_hz = 10\njobs = 1\n\
                    [workload.partition]\nsms = 8\n\
                    [[workload]]\nname = \"b\"\nmodel = \"spin:1ms\"\nrate_hz = 10\njobs = 1\n\
                    gpu = 2\n[workload.partition]\nsms = 8\n\
                    [[workload]]\nname = \"c\"\nmodel = \"spin:1ms\"\nrate_hz = 10\njobs = 1\n\
                    gpu = 2\n[workload.partition]\nsms = 8\n";
        let s = Scenario::from_toml_str(text, "s.toml", &NoBuiltinModels).unwrap();
        assert_eq!(super::partitions_per_gpu(&s), [1, 2], "GPU 1 has none");
    }
}
