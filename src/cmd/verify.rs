//! `isolane verify SCENARIO`: measures what each partition of a scenario really gets — a probe
//! kernel's throughput alone in its partition and beside saturating neighbours in all the
//! others — and reports the share of the whole GPU and the interference (docs/partitions.md).
//! The work is `isolane_session::verify`'s; the timeslice, MPS and MIG probes run in
//! `isolane worker` processes (the probe role of the worker protocol).

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use isolane_core::spec::Mechanism;
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
            verify::time_needed(&verify::partitions_per_gpu(&scenario), args.duration_s)
        );
    }
    let reports = verify::verify_each_gpu(&scenario, &opts).map_err(|e: GpuError| {
        if e.is_user_error() {
            user(format!("{name}: {e}"))
        } else {
            anyhow::Error::new(e)
        }
    })?;
    let (json, table) = verify::report_texts(&reports)?;
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
