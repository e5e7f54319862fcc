//! `isolane coexec`: the co-execution study (issue 17 item 5, docs/coexec.md). The jobs file
//! and flags → an `isolane_runtime::coexec::StudyConfig`; each job alone and each pair at once
//! is run by `run`'s own `measure` into its own folder, then reduced to times, speedup and
//! slowdowns (`fill_job`, `fill_concurrent`).

use std::path::{Path, PathBuf};

use clap::Args;
use isolane_core::admission::AdmissionOptions;
use isolane_core::results::{coexec_csv, CoexecCell, CoexecIndex, CoexecJob, Intensity, RunStatus};
use isolane_core::spec::Scenario;
use isolane_runtime::coexec::{self as study, StudyConfig, Way};
use isolane_runtime::coordinator::RunPlan;
use isolane_runtime::output;

use super::{user, EXIT_FAILED, EXIT_INTERRUPTED};

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
    #[arg(long, value_delimiter = ',', value_parser = way)]
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
    /// Use --out even if it is not empty (each run's folder is replaced).
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

fn way(s: &str) -> Result<String, String> {
    match Way::parse(s) {
        Some(_) => Ok(s.to_string()),
        None => Err(format!(
            "`{s}` is not a mechanism; expected one of {}",
            study::ALL_WAYS.map(Way::word).join(", ")
        )),
    }
}

/// The jobs file and flags as the library's configuration.
fn config(a: &CoexecArgs) -> anyhow::Result<StudyConfig> {
    let (mut base, file) = super::load_scenario(Some(&a.jobs))?;
    super::refuse_several_gpus(&base, &file, "coexec")?;
    study::check_jobs(&file, &base).map_err(user)?;
    let names: Vec<String> = base.workloads.iter().map(|w| w.name.clone()).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let given: Vec<Way> = a.mechanisms.iter().filter_map(|m| Way::parse(m)).collect();
    let ways = study::ways(base.device.backend, &given);
    set_mig_profiles(&mut base, &names, &a.mig_profiles)?;
    let thread_pct = study::split(
        "thread-pct",
        &names,
        &a.thread_pct,
        study::DEFAULT_THREAD_PCT,
        1..=100,
        "from 1 to 100",
    )
    .map_err(user)?;
    let green_sms = study::split(
        "green-sms",
        &names,
        &a.green_sms,
        study::DEFAULT_GREEN_SMS,
        1..=u32::MAX,
        "at least 1",
    )
    .map_err(user)?;
    let pairs = study::pairs(&names, &a.pairs).map_err(user)?;
    Ok(StudyConfig {
        jobs_file: file,
        base,
        pairs,
        ways,
        thread_pct,
        green_sms,
    })
}

/// `--mig-profiles NAME=PROFILE`: kept on the job for its mig cells.
fn set_mig_profiles(base: &mut Scenario, names: &[&str], given: &[String]) -> anyhow::Result<()> {
    for g in given {
        let i = g
            .split_once('=')
            .and_then(|(n, p)| Some((names.iter().position(|x| *x == n)?, p)))
            .filter(|(_, p)| !p.is_empty());
        let Some((i, p)) = i else {
            return Err(user(format!(
                "--mig-profiles {g}: expected NAME=PROFILE with a workload name of the jobs \
                 file ({}) and a MIG profile such as 3g.40gb",
                names.join(", ")
            )));
        };
        base.workloads[i].partition.mig_profile = Some(p.to_string());
    }
    Ok(())
}

pub fn run(a: CoexecArgs, engine: &isolane_runtime::exec::Engine) -> anyhow::Result<u8> {
    let c = config(&a)?;
    let in_pairs = jobs_in_pairs(&c);
    check_alone(&c, &in_pairs)?;
    let out = super::run::prepare_out(a.out.as_deref(), a.force)?;
    let mut index = c.index(env!("CARGO_PKG_VERSION"));
    let runner = Runner {
        out: &out,
        args: &a,
        engine,
    };
    let code = run_study(&c, &runner, &in_pairs, &mut index)?;
    index.energy_note = study::energy_note(&index);
    write_index(&out, &index)?;
    println!("{}", isolane_report::coexec_jobs_table(&index.jobs));
    println!("{}", isolane_report::coexec_table(&index.cells, a.wide));
    if let Some(note) = &index.energy_note {
        println!("{note}");
    }
    println!("results: {}", out.display());
    Ok(code)
}

/// The jobs that are in some pair, in file order (only they run alone).
fn jobs_in_pairs(c: &StudyConfig) -> Vec<usize> {
    (0..c.base.workloads.len())
        .filter(|i| c.pairs.iter().any(|&(a, b)| a == *i || b == *i))
        .collect()
}

/// Every alone run is validated and, on a GPU, admitted before anything runs, so a mistake
/// runs nothing (exit 2). Concurrent cells that do not fit are skipped with the reason.
fn check_alone(c: &StudyConfig, jobs: &[usize]) -> anyhow::Result<()> {
    let models = builtin_names();
    for &i in jobs {
        let s = c.alone_scenario(i);
        let name = format!("coexec job {} alone", s.workloads[0].name);
        s.validate(&models)
            .map_err(|e| user(format!("{name}: {e}")))?;
        super::admit_or_refuse(&s, &name)?;
    }
    Ok(())
}

fn builtin_names() -> Vec<&'static str> {
    isolane_engine::builtin_models()
        .iter()
        .map(|m| m.name)
        .collect()
}

/// What every run needs.
struct Runner<'a> {
    out: &'a Path,
    args: &'a CoexecArgs,
    engine: &'a isolane_runtime::exec::Engine,
}

/// Each job alone, then pair by pair: sequential, then each way at once. Returns the exit code.
fn run_study(
    c: &StudyConfig,
    runner: &Runner<'_>,
    jobs: &[usize],
    index: &mut CoexecIndex,
) -> anyhow::Result<u8> {
    index.jobs = (0..c.base.workloads.len())
        .map(|i| pending_job(c, i))
        .collect();
    let mut code = 0u8;
    for &i in jobs {
        code = code.max(runner.run_alone(c, i, index)?);
        if code == EXIT_INTERRUPTED {
            return Ok(code);
        }
    }
    for &pair in &c.pairs {
        index.cells.push(study::sequential_cell(&index.jobs, pair));
        for &way in &c.ways {
            code = code.max(runner.run_pair(c, pair, way, index)?);
            if code == EXIT_INTERRUPTED {
                return Ok(code);
            }
        }
    }
    index.jobs.retain(|j| j.status != "pending");
    Ok(code)
}

fn pending_job(c: &StudyConfig, i: usize) -> CoexecJob {
    let name = c.base.workloads[i].name.clone();
    CoexecJob {
        dir: format!("alone/{name}"),
        what: study::job_what(&c.base, i),
        name,
        status: "pending".into(),
        error: None,
        wall_s: None,
        energy_j: None,
        dram_bw_util_pct: None,
        work: None,
        bytes_total: None,
        intensity: Intensity::Unknown,
    }
}

/// A run's contribution to the exit code: 0 ok, 130 interrupted, 1 otherwise.
fn status_code(status: &str) -> u8 {
    match status {
        "ok" | "skipped" => 0,
        "interrupted" => EXIT_INTERRUPTED,
        _ => EXIT_FAILED,
    }
}

impl Runner<'_> {
    fn run_alone(&self, c: &StudyConfig, i: usize, index: &mut CoexecIndex) -> anyhow::Result<u8> {
        let s = c.alone_scenario(i);
        let mut job = index.jobs[i].clone();
        eprintln!("coexec: {} alone", job.name);
        let name = format!("coexec job {} alone", job.name);
        match self.measure(&s, &job.dir, &name, &AdmissionOptions::default()) {
            Ok(summary) => {
                job.status = status_word(summary.status).into();
                study::fill_job(&mut job, &summary);
            }
            Err(e) => {
                eprintln!("coexec: {} alone: {e:#}", job.name);
                job.status = "error".into();
                job.error = Some(format!("{e:#}"));
            }
        }
        let code = status_code(&job.status);
        index.jobs[i] = job;
        write_index(self.out, index)?;
        Ok(code)
    }

    fn run_pair(
        &self,
        c: &StudyConfig,
        pair: (usize, usize),
        way: Way,
        index: &mut CoexecIndex,
    ) -> anyhow::Result<u8> {
        let mut cell = study::cell(&index.jobs, pair, way.word());
        match c.concurrent_scenario(pair, way) {
            Err(reason) => skip(&mut cell, reason),
            Ok(s) => {
                let alone = (&index.jobs[pair.0], &index.jobs[pair.1]);
                self.run_concurrent(&s, way, &mut cell, alone)
            }
        }
        let code = status_code(&cell.status);
        index.cells.push(cell);
        write_index(self.out, index)?;
        Ok(code)
    }

    /// Runs one pair at once; a scenario that does not validate or is not admitted (a
    /// partition this GPU cannot give) is skipped with that reason.
    fn run_concurrent(
        &self,
        s: &Scenario,
        way: Way,
        cell: &mut CoexecCell,
        alone: (&CoexecJob, &CoexecJob),
    ) {
        cell.partition_a = study::partition_words(s, 0);
        cell.partition_b = study::partition_words(s, 1);
        let name = format!("coexec {} + {} ({})", cell.a, cell.b, cell.mechanism);
        if let Err(e) = s.validate(&builtin_names()) {
            return skip(cell, format!("{e}"));
        }
        if way == Way::Mig {
            if let Some(reason) = mig_unavailable(s.device.gpu) {
                return skip(cell, reason);
            }
        }
        let options = AdmissionOptions {
            mps_thread_budget_pct: way.mps_thread_budget_pct(),
        };
        if let Err(e) = super::admit_or_refuse_with(s, &name, &options) {
            return skip(cell, format!("{e:#}"));
        }
        cell.dir = format!("pairs/{}+{}/{}", cell.a, cell.b, cell.mechanism);
        eprintln!("{name}");
        match self.measure(s, &cell.dir, &name, &options) {
            Ok(summary) => {
                cell.status = status_word(summary.status).into();
                cell.reason = summary.workloads.iter().find_map(|w| w.error.clone());
                study::fill_concurrent(cell, &summary, alone);
            }
            Err(e) => {
                eprintln!("{name}: {e:#}");
                cell.status = "error".into();
                cell.reason = Some(format!("{e:#}"));
            }
        }
    }

    fn measure(
        &self,
        s: &Scenario,
        dir: &str,
        name: &str,
        options: &AdmissionOptions,
    ) -> anyhow::Result<isolane_core::results::RunSummary> {
        let admitted = super::admit_or_refuse_with(s, name, options)?;
        let plan = RunPlan::from_scenario(s);
        let m = super::run::measure(super::run::Request {
            command: "coexec",
            scenario: s,
            scenario_name: name.to_string(),
            admitted: admitted.as_ref(),
            plan: &plan,
            out: Some(&self.out.join(dir)),
            force: true,
            quiet: self.args.quiet,
            partitions: &self.args.partitions,
            engine: self.engine,
        })?;
        super::run::write_run_files(&m)?;
        super::run::report_failures(&m.summary);
        Ok(m.summary)
    }
}

/// Why GPU `gpu` cannot run MIG instances now, if it cannot: isolane never changes MIG mode
/// (docs/partitions.md), so a GPU with it off skips the `mig` cells.
fn mig_unavailable(gpu: u32) -> Option<String> {
    let devices = match isolane_gpu::devices::list_devices() {
        Ok(d) => d,
        Err(e) => return Some(format!("the GPUs could not be listed: {e:#}")),
    };
    let d = devices.iter().find(|d| d.index == gpu)?;
    match (d.mig.supported, d.mig.current) {
        (false, _) => Some(format!("{} (GPU {gpu}) does not support MIG", d.name)),
        (true, Some(true)) => None,
        _ => Some(format!(
            "MIG mode is off on GPU {gpu} ({}); isolane never turns it on (an administrator's \
             `nvidia-smi -i {gpu} -mig 1`)",
            d.name
        )),
    }
}

fn skip(cell: &mut CoexecCell, reason: String) {
    eprintln!(
        "coexec {} + {} ({}): skipped: {reason}",
        cell.a, cell.b, cell.mechanism
    );
    cell.status = "skipped".into();
    cell.reason = Some(reason);
}

fn status_word(s: RunStatus) -> &'static str {
    match s {
        RunStatus::Ok => "ok",
        RunStatus::Failed => "failed",
        RunStatus::Interrupted => "interrupted",
    }
}

fn write_index(out: &Path, index: &CoexecIndex) -> anyhow::Result<()> {
    isolane_core::results::write_json(&out.join("coexec.json"), index)?;
    output::write_atomic(&out.join("coexec.csv"), coexec_csv(&index.cells).as_bytes())?;
    Ok(())
}
