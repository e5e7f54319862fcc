//! `isolane coexec`: the co-execution study (issue 17 item 5, docs/coexec.md). The jobs file
//! and flags → an `isolane_runtime::coexec::StudyConfig` (`isolane_session::studies::coexec`,
//! which also runs the study); each run is `run`'s own `measure` (`isolane_session::study_runs::StudyRuns`).

use std::path::PathBuf;

use clap::Args;
use isolane_runtime::coexec::StudyConfig;
use isolane_session::studies::coexec;

#[derive(Args)]
#[command(
    about = "Run pairs of jobs alone, one after the other and at once under each mechanism",
    long_about = "The co-execution study: each [[workload]] of JOBS (a scenario file) is a job \
                  of fixed work (jobs = N, or a command that runs to completion). Each job runs \
                  alone; each pair (all, or --pairs) runs at once under each --mechanisms \
                  entry. Per cell: each job's wall time, the makespan, the speedup over one \
                  after the other, each job's slowdown over alone, the energy (NVML) and the \
                  pair's memory/compute class. Mechanisms a cell cannot use are skipped with \
                  the reason. Writes coexec.json, coexec.csv and one run folder per run, which \
                  `isolane report` draws (docs/coexec.md)."
)]
pub struct CoexecArgs {
    /// The jobs: a scenario file whose workloads are the jobs.
    jobs: PathBuf,
    /// Pairs to run, NAME:NAME comma-separated. Default: every pair of jobs.
    #[arg(long, value_delimiter = ',')]
    pairs: Vec<String>,
    /// Ways to run a pair at once, comma-separated: none (cpu), timeslice, mps (100 % each),
    /// mps-provisioned (--thread-pct), green (--green-sms), mig (--mig-profiles). Default: all
    /// of them on the cpu (the GPU ones are reported skipped), all but none on cuda.
    #[arg(long, value_delimiter = ',', value_parser = coexec::way_flag)]
    mechanisms: Vec<String>,
    /// mps-provisioned: a job's thread %, NAME=PCT comma-separated (default 50 each).
    #[arg(long, value_delimiter = ',')]
    thread_pct: Vec<String>,
    /// green: a job's SMs, NAME=SMS comma-separated (default 64 each).
    #[arg(long, value_delimiter = ',')]
    green_sms: Vec<String>,
    /// mig: a job's MIG profile, NAME=PROFILE comma-separated (MIG mode must already be on).
    #[arg(long, value_delimiter = ',')]
    mig_profiles: Vec<String>,
    /// Output directory. Default: a new runs/<YYYYmmdd-HHMMSS>.
    #[arg(long, short = 'o', value_name = "DIR")]
    out: Option<PathBuf>,
    /// Use --out even if it is not empty: coexec's files and each run's folder are replaced.
    #[arg(long)]
    force: bool,
    /// No progress bars.
    #[arg(long, short = 'q')]
    quiet: bool,
    /// Every column of the table (default: the ones that fit 80 columns).
    #[arg(long)]
    wide: bool,
    #[command(flatten)]
    partitions: super::PartitionFlags,
}

/// The jobs file and flags as the library's configuration.
fn config(a: &CoexecArgs) -> anyhow::Result<StudyConfig> {
    let (base, file) = super::load_scenario(Some(&a.jobs))?;
    super::refuse_several_gpus(&base, &file, "coexec")?;
    let flags = coexec::CoexecFlags {
        pairs: a.pairs.clone(),
        mechanisms: a.mechanisms.clone(),
        thread_pct: a.thread_pct.clone(),
        green_sms: a.green_sms.clone(),
        mig_profiles: a.mig_profiles.clone(),
    };
    coexec::config(&flags, base, file).map_err(super::studies::failure_error)
}

pub fn run(a: CoexecArgs, engine: &isolane_runtime::exec::Engine) -> anyhow::Result<u8> {
    let c = config(&a)?;
    let runs = super::studies::StudyRuns {
        machine: &super::studies::Executors,
        quiet: a.quiet,
        choices: a.partitions.choices(),
        engine,
    };
    coexec::check(&c, &runs).map_err(super::studies::study_error)?;
    let out = super::run::prepare_out_for(a.out.as_deref(), a.force, super::run::Maker::Coexec)?;
    let (code, index) = coexec::run(&c, &out, &runs, env!("CARGO_PKG_VERSION"))
        .map_err(super::studies::study_error)?;
    println!("{}", isolane_report::coexec_jobs_table(&index.jobs));
    println!("{}", isolane_report::coexec_table(&index.cells, a.wide));
    if let Some(note) = &index.energy_note {
        println!("{note}");
    }
    println!("results: {}", out.display());
    Ok(code)
}
