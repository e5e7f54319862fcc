//! `isolane coexec`'s runs (docs/coexec.md): each job alone, then each pair one after the other
//! and at once under each mechanism, each run into its own folder and reduced to times,
//! speedup and slowdowns (`isolane_runtime::coexec`'s `fill_job`, `fill_concurrent`);
//! coexec.json and coexec.csv are rewritten after every run.

use std::path::Path;

use isolane_core::admission::AdmissionOptions;
use isolane_core::results::{coexec_csv, CoexecCell, CoexecIndex, CoexecJob, Intensity};
use isolane_core::spec::Scenario;
use isolane_runtime::coexec::{self as study, StudyConfig, Way};
use isolane_runtime::output;

use super::{status_word, Failure, RunError, Runs, StudyError, EXIT_FAILED, EXIT_INTERRUPTED};

/// One of `--mechanisms`' values, checked where clap parses it: a way two workloads can share
/// the device.
pub fn way_flag(s: &str) -> Result<String, String> {
    match Way::parse(s) {
        Some(_) => Ok(s.to_string()),
        None => Err(format!(
            "`{s}` is not a mechanism; expected one of {}",
            study::ALL_WAYS.map(Way::word).join(", ")
        )),
    }
}

/// The flags of `isolane coexec` that shape the study (comma lists as the user gave them).
#[derive(Debug, Clone, Default)]
pub struct CoexecFlags {
    /// `NAME:NAME` pairs (none: every pair).
    pub pairs: Vec<String>,
    /// Ways to run a pair at once, each one [`Way::parse`] takes (none: the backend's all).
    pub mechanisms: Vec<String>,
    /// `NAME=PCT`.
    pub thread_pct: Vec<String>,
    /// `NAME=SMS`.
    pub green_sms: Vec<String>,
    /// `NAME=PROFILE`.
    pub mig_profiles: Vec<String>,
}

/// The jobs file (`base`, named `file`) and the flags as the study's configuration; a
/// mistake is the user's.
pub fn config(a: &CoexecFlags, mut base: Scenario, file: String) -> Result<StudyConfig, Failure> {
    study::check_jobs(&file, &base).map_err(Failure::user)?;
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
    .map_err(Failure::user)?;
    let green_sms = study::split(
        "green-sms",
        &names,
        &a.green_sms,
        study::DEFAULT_GREEN_SMS,
        1..=u32::MAX,
        "at least 1",
    )
    .map_err(Failure::user)?;
    let pairs = study::pairs(&names, &a.pairs).map_err(Failure::user)?;
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
fn set_mig_profiles(base: &mut Scenario, names: &[&str], given: &[String]) -> Result<(), Failure> {
    for g in given {
        let i = g
            .split_once('=')
            .and_then(|(n, p)| Some((names.iter().position(|x| *x == n)?, p)))
            .filter(|(_, p)| !p.is_empty());
        let Some((i, p)) = i else {
            return Err(Failure::user(format!(
                "--mig-profiles {g}: expected NAME=PROFILE with a workload name of the jobs \
                 file ({}) and a MIG profile such as 3g.40gb",
                names.join(", ")
            )));
        };
        base.workloads[i].partition.mig_profile = Some(p.to_string());
    }
    Ok(())
}

/// Runs the study into `out` (checked by [`check`] before `out` was made); returns the exit
/// code (0, 1: a run failed, 130: interrupted) and the index as written.
pub fn run(
    c: &StudyConfig,
    out: &Path,
    runs: &dyn Runs,
    version: &str,
) -> Result<(u8, CoexecIndex), StudyError> {
    let in_pairs = jobs_in_pairs(c);
    let mut index = c.index(version);
    let runner = Runner { out, runs };
    let code = run_study(c, &runner, &in_pairs, &mut index)?;
    index.energy_note = study::energy_note(&index);
    write_index(out, &index)?;
    Ok((code, index))
}

/// Every alone run is validated and, on a GPU, admitted before anything runs, so a mistake
/// runs nothing (exit 2). Concurrent cells that do not fit are skipped with the reason.
pub fn check(c: &StudyConfig, runs: &dyn Runs) -> Result<(), StudyError> {
    check_alone(c, &jobs_in_pairs(c), runs)
}

/// The jobs that are in some pair, in file order (only they run alone).
fn jobs_in_pairs(c: &StudyConfig) -> Vec<usize> {
    (0..c.base.workloads.len())
        .filter(|i| c.pairs.iter().any(|&(a, b)| a == *i || b == *i))
        .collect()
}

fn check_alone(c: &StudyConfig, jobs: &[usize], runs: &dyn Runs) -> Result<(), StudyError> {
    let models = runs.models();
    for &i in jobs {
        let s = c.alone_scenario(i);
        let name = format!("coexec job {} alone", s.workloads[0].name);
        s.validate(&models)
            .map_err(|e| Failure::user(format!("{name}: {e}")))?;
        runs.admit(&s, &name, &AdmissionOptions::default())?;
        runs.preflight(&s, &name)?;
    }
    Ok(())
}

/// What every run needs.
struct Runner<'a> {
    out: &'a Path,
    runs: &'a dyn Runs,
}

/// Each job alone, then pair by pair: sequential, then each way at once. Returns the exit code.
fn run_study(
    c: &StudyConfig,
    runner: &Runner<'_>,
    jobs: &[usize],
    index: &mut CoexecIndex,
) -> Result<u8, StudyError> {
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
    fn run_alone(
        &self,
        c: &StudyConfig,
        i: usize,
        index: &mut CoexecIndex,
    ) -> Result<u8, StudyError> {
        let s = c.alone_scenario(i);
        let mut job = index.jobs[i].clone();
        self.runs.say(&format!("coexec: {} alone", job.name));
        let name = format!("coexec job {} alone", job.name);
        match self.measure(&s, &job.dir, &name, &AdmissionOptions::default()) {
            Ok(summary) => {
                job.status = status_word(summary.status).into();
                study::fill_job(&mut job, &summary);
            }
            Err(e) => {
                self.runs.say(&format!("coexec: {} alone: {e}", job.name));
                job.status = "error".into();
                job.error = Some(e.text);
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
    ) -> Result<u8, StudyError> {
        let mut cell = study::cell(&index.jobs, pair, way.word());
        match c.concurrent_scenario(pair, way) {
            Err(reason) => self.skip(&mut cell, reason),
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
        if let Err(e) = s.validate(&self.runs.models()) {
            return self.skip(cell, format!("{e}"));
        }
        if way == Way::Mig {
            if let Some(reason) = mig_unavailable(s.device.gpu) {
                return self.skip(cell, reason);
            }
        }
        let options = AdmissionOptions {
            mps_thread_budget_pct: way.mps_thread_budget_pct(),
        };
        if let Err(e) = self.runs.admit(s, &name, &options) {
            return self.skip(cell, e.text);
        }
        cell.dir = format!("pairs/{}+{}/{}", cell.a, cell.b, cell.mechanism);
        self.runs.say(&name);
        match self.measure(s, &cell.dir, &name, &options) {
            Ok(summary) => {
                cell.status = status_word(summary.status).into();
                cell.reason = summary.workloads.iter().find_map(|w| w.error.clone());
                study::fill_concurrent(cell, &summary, alone);
            }
            Err(e) => {
                self.runs.say(&format!("{name}: {e}"));
                cell.status = "error".into();
                cell.reason = Some(e.text);
            }
        }
    }

    /// Runs `s` into `dir`; a run that could not be made or written is the run's failure.
    fn measure(
        &self,
        s: &Scenario,
        dir: &str,
        name: &str,
        options: &AdmissionOptions,
    ) -> Result<isolane_core::results::RunSummary, Failure> {
        match self
            .runs
            .measure("coexec", s, name, &self.out.join(dir), options)
        {
            Ok(ran) => Ok(ran.summary),
            Err(RunError::Measuring(e) | RunError::Writing(e)) => Err(e),
        }
    }

    fn skip(&self, cell: &mut CoexecCell, reason: String) {
        self.runs.say(&format!(
            "coexec {} + {} ({}): skipped: {reason}",
            cell.a, cell.b, cell.mechanism
        ));
        cell.status = "skipped".into();
        cell.reason = Some(reason);
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

fn write_index(out: &Path, index: &CoexecIndex) -> Result<(), StudyError> {
    isolane_core::results::write_json(&out.join("coexec.json"), index)?;
    output::write_atomic(&out.join("coexec.csv"), coexec_csv(&index.cells).as_bytes())?;
    Ok(())
}
