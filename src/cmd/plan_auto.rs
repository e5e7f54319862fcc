//! `isolane plan --auto SCENARIO`: partitions for workloads that have rates and deadlines but
//! none of their own (docs/planner.md). The search is `isolane_planner`'s; this file measures
//! the profiles it asks for (each workload alone, closed loop, in a partition of the size asked,
//! through the same run path as `isolane run`), writes the planned scenario and verifies it.

use std::path::Path;

use anyhow::Context as _;
use isolane_core::results::{InterferenceIndex, RunSummary};
use isolane_core::spec::{
    Backend, Criticality, Host, LatePolicy, MaxRate, Mechanism, PartitionSpec, Rate, Role,
    RunLength, Scenario, WorkloadSpec,
};
use isolane_planner::cache::ProfileKey;
use isolane_planner::{
    Choice, Demand, Ladder, LearnedStretch, Options, Outcome, Point, ProfileCache, Profiler,
    StretchKey, Unit,
};
use isolane_runtime::exec::Engine;
use isolane_runtime::RunPlan;

use super::plan::PlanArgs;
use super::user;

/// Warm-up jobs of each profile run (excluded from its times).
const PROFILE_WARMUP: u64 = 20;

pub fn run(args: &PlanArgs, engine: &Engine) -> anyhow::Result<u8> {
    let (scenario, name) = super::load_scenario(Some(&args.scenario))?;
    let demands = demands(&scenario, &name)?;
    let mechanisms = mechanisms(&scenario, args.mechanism.as_deref())?;
    let opts = Options {
        margin: args.margin,
        stretch: args.stretch,
        max_util: args.max_util,
    };
    let cache = ProfileCache::new(
        args.profile_cache
            .clone()
            .unwrap_or_else(ProfileCache::default_dir),
    );
    let matrix = match &args.stretch_from {
        Some(p) => Some(read_matrix(p)?),
        None => None,
    };
    let learned = LearnedStretch::new(cache.dir());
    let device = device_id(&scenario);
    let work = tempfile::tempdir().context("a folder for the profile runs")?;
    let mut best: Option<(Mechanism, Vec<Demand>, Vec<Choice>)> = None;
    for mech in &mechanisms {
        let ladder = ladder(&scenario, *mech)?;
        let mut profiler = RunProfiler {
            scenario: &scenario,
            mechanism: *mech,
            cache: &cache,
            device: device.clone(),
            jobs: args.profile_jobs,
            engine,
            work: work.path(),
        };
        let demands = with_stretch(&scenario, &demands, *mech, matrix.as_ref(), args.stretch);
        let demands = with_learned(&scenario, &demands, *mech, &device, &learned);
        let t = std::time::Instant::now();
        let outcome = isolane_planner::plan(&demands, &ladder, &opts, &mut profiler)
            .map_err(|e| anyhow::anyhow!("profiling for the {mech:?} plan: {e}"))?;
        print_outcome(*mech, &ladder, &outcome, t.elapsed().as_secs_f64());
        if let (Outcome::Planned { choices, .. }, None) = (&outcome, &best) {
            best = Some((*mech, demands.clone(), choices.clone()));
        }
    }
    let Some((mech, mut demands, mut choices)) = best else {
        return Ok(super::EXIT_USER);
    };
    let ladder = ladder(&scenario, mech)?;
    for round in 1.. {
        let planned = planned_scenario(&scenario, mech, &choices);
        write_plan(&planned, &choices, &ladder, args)?;
        if !args.verify {
            return Ok(0);
        }
        let summary = verify(&planned, args, round, engine)?;
        let missed = print_verification(&summary, &choices);
        learn(&scenario, &choices, &summary, mech, &device, &learned);
        if !missed {
            return Ok(0);
        }
        if round >= args.rounds {
            println!("the plan does NOT hold: a workload missed its deadline");
            return Ok(super::EXIT_FAILED);
        }
        demands = calibrated(&demands, &choices, &summary);
        let mut profiler = RunProfiler {
            scenario: &scenario,
            mechanism: mech,
            cache: &cache,
            device: device.clone(),
            jobs: args.profile_jobs,
            engine,
            work: work.path(),
        };
        let t = std::time::Instant::now();
        let outcome = isolane_planner::plan(&demands, &ladder, &opts, &mut profiler)
            .map_err(|e| anyhow::anyhow!("profiling for the {mech:?} plan: {e}"))?;
        print_outcome(mech, &ladder, &outcome, t.elapsed().as_secs_f64());
        match outcome {
            Outcome::Planned { choices: next, .. } if sizes(&next) != sizes(&choices) => {
                println!(
                    "round {}: planned again with the measured stretch",
                    round + 1
                );
                choices = next;
            }
            Outcome::Planned { .. } => {
                println!(
                    "the plan does NOT hold, and planning with the measured stretch gives the \
                     same partitions"
                );
                return Ok(super::EXIT_FAILED);
            }
            Outcome::NoPlan { .. } => {
                println!("the plan does NOT hold, and with the measured stretch there is none");
                return Ok(super::EXIT_FAILED);
            }
        }
    }
    unreachable!("the rounds end by returning")
}

/// Which learned stretch workload `i` of `s` has: beside the scenario's other workloads.
fn stretch_key(s: &Scenario, i: usize, mech: Mechanism, device: &str) -> StretchKey {
    let id = |w: &WorkloadSpec| {
        format!(
            "{}-b{}-{}",
            model_id(&w.model),
            w.batch,
            format!("{:?}", w.precision).to_lowercase()
        )
    };
    StretchKey {
        device: device.to_string(),
        mechanism: format!("{mech:?}").to_lowercase(),
        workload: id(&s.workloads[i]),
        neighbours: (s.workloads.iter().enumerate())
            .filter(|(j, _)| *j != i)
            .map(|(_, w)| id(w))
            .collect(),
    }
}

/// The stretch an earlier verification run measured beside the same workloads, where there is
/// one: it replaces the matrix's and --stretch, which were measured beside other neighbours.
fn with_learned(
    s: &Scenario,
    demands: &[Demand],
    mech: Mechanism,
    device: &str,
    learned: &LearnedStretch,
) -> Vec<Demand> {
    demands
        .iter()
        .enumerate()
        .map(
            |(i, d)| match learned.get(&stretch_key(s, i, mech, device)) {
                Some(st) => {
                    // Below 1 is the noise of two runs, not neighbours that speed a job up.
                    let st = st.max(1.0);
                    eprintln!(
                        "{}: stretch {st:.2} measured by an earlier verification beside the same \
                     workloads",
                        d.name
                    );
                    Demand {
                        stretch: Some(st),
                        ..d.clone()
                    }
                }
                None => d.clone(),
            },
        )
        .collect()
}

/// Keeps each workload's measured stretch for later plans of the same workloads.
fn learn(
    s: &Scenario,
    choices: &[Choice],
    summary: &RunSummary,
    mech: Mechanism,
    device: &str,
    learned: &LearnedStretch,
) {
    for (i, c) in choices.iter().enumerate() {
        let Some(st) = measured_stretch(c, summary) else {
            continue;
        };
        if let Err(e) = learned.put(&stretch_key(s, i, mech, device), st) {
            eprintln!(
                "note: cannot keep the measured stretch of {}: {e}",
                c.workload
            );
        }
    }
}

fn sizes(choices: &[Choice]) -> Vec<u32> {
    choices.iter().map(|c| c.size).collect()
}

/// The planned scenario, annotated, to `-o FILE` or stdout.
fn write_plan(
    planned: &Scenario,
    choices: &[Choice],
    ladder: &Ladder,
    args: &PlanArgs,
) -> anyhow::Result<()> {
    let text = annotate(&planned.to_toml_string()?, choices, ladder);
    match &args.out {
        Some(p) => {
            isolane_core::files::write_atomic(p, text.as_bytes())
                .with_context(|| format!("writing {}", p.display()))?;
            println!("planned scenario: {}", p.display());
        }
        None => print!("{text}"),
    }
    Ok(())
}

/// A workload's stretch as its verification run measured it: its p99.9 response time beside
/// the others over its p99.9 execution time alone in the same partition (queueing and the
/// neighbours' interference both count).
fn measured_stretch(c: &Choice, summary: &RunSummary) -> Option<f64> {
    summary
        .workloads
        .iter()
        .find(|w| w.name == c.workload)
        .and_then(|w| w.metrics.latency_ms.p999)
        .map(|p999| p999 / c.profile.tail_ms())
        .filter(|s| s.is_finite() && *s > 0.0)
}

/// Each workload's stretch for the next round: the measured one, never below the stretch it
/// was planned with.
fn calibrated(demands: &[Demand], choices: &[Choice], summary: &RunSummary) -> Vec<Demand> {
    demands
        .iter()
        .zip(choices)
        .map(|(d, c)| {
            let measured = measured_stretch(c, summary);
            let before = c.predicted_tail_ms / c.profile.tail_ms();
            let stretch = measured.map_or(before, |m| m.max(before));
            eprintln!(
                "{}: stretch {before:.2} planned, {} measured",
                d.name,
                measured.map_or("nothing".into(), |m| format!("{m:.2}"))
            );
            Demand {
                stretch: Some(stretch),
                ..d.clone()
            }
        })
        .collect()
}

/// Each workload's rate and deadline; one without either cannot be planned.
fn demands(s: &Scenario, name: &str) -> anyhow::Result<Vec<Demand>> {
    s.workloads
        .iter()
        .map(|w| {
            let Rate::Hz(hz) = w.rate else {
                return Err(user(format!(
                    "{name}: workload `{}`: rate_hz = \"max\" cannot be planned; give it a rate",
                    w.name
                )));
            };
            Ok(Demand {
                name: w.name.clone(),
                rate_hz: hz,
                deadline_ms: w.deadline_s().unwrap_or(1.0 / hz) * 1e3,
                critical: w.criticality == Criticality::Critical,
                stretch: None,
            })
        })
        .collect()
}

/// interference.json, or the folder holding it.
fn read_matrix(p: &Path) -> anyhow::Result<InterferenceIndex> {
    let file = if p.is_dir() {
        p.join("interference.json")
    } else {
        p.to_path_buf()
    };
    isolane_core::results::read_json(&file).map_err(|e| user(format!("--stretch-from: {e}")))
}

/// Each workload's stretch from the matrix, beside the scenario's other models, where the
/// matrix measured that mechanism and the workload's model and precision as a victim; a model
/// it never measured takes the worst stretch of any victim at that precision (or --stretch
/// when that is larger): planning it as if alone would be the optimistic guess.
fn with_stretch(
    s: &Scenario,
    demands: &[Demand],
    mech: Mechanism,
    matrix: Option<&InterferenceIndex>,
    stated: f64,
) -> Vec<Demand> {
    let Some(m) = matrix.filter(|m| m.mechanism == format!("{mech:?}").to_lowercase()) else {
        return demands.to_vec();
    };
    demands
        .iter()
        .zip(&s.workloads)
        .map(|(d, w)| {
            let others: Vec<&str> = s
                .workloads
                .iter()
                .filter(|o| o.name != w.name)
                .map(|o| o.model.as_str())
                .collect();
            let precision = format!("{:?}", w.precision).to_lowercase();
            let measured = isolane_planner::stretch_from(m, &w.model, &precision, &others);
            let stand_in = || {
                let worst = isolane_planner::worst_stretch(m, &precision)?;
                let st = worst.max(stated);
                eprintln!(
                    "{}: stretch {st:.2}, the matrix's worst at {precision} (it did not measure \
                     {} as a victim)",
                    w.name, w.model
                );
                Some(st)
            };
            if let Some(st) = measured {
                eprintln!("{}: stretch {st:.2} from the interference matrix", w.name);
            }
            Demand {
                stretch: measured.or_else(stand_in).or(d.stretch),
                ..d.clone()
            }
        })
        .collect()
}

/// The mechanisms to plan with: `--mechanism` (`all`: green, MPS and time-slicing), else the
/// scenario's own; on the CPU, cores.
fn mechanisms(s: &Scenario, flag: Option<&str>) -> anyhow::Result<Vec<Mechanism>> {
    if s.device.backend == Backend::Cpu {
        return Ok(vec![Mechanism::None]);
    }
    Ok(match flag {
        Some("all") => vec![Mechanism::Green, Mechanism::Mps, Mechanism::Timeslice],
        Some("green") => vec![Mechanism::Green],
        Some("mps") => vec![Mechanism::Mps],
        Some("timeslice") => vec![Mechanism::Timeslice],
        Some(other) => {
            return Err(user(format!(
                "--mechanism: `{other}` cannot be planned; allowed: green, mps, timeslice, all"
            )))
        }
        None => match s.device.mechanism {
            m @ (Mechanism::Green | Mechanism::Mps | Mechanism::Timeslice) => vec![m],
            Mechanism::None => vec![Mechanism::Timeslice],
            Mechanism::Mig => {
                return Err(user(
                    "mechanism \"mig\" cannot be planned yet; pass --mechanism green, mps, \
                     timeslice or all",
                ))
            }
        },
    })
}

fn ladder(s: &Scenario, mech: Mechanism) -> anyhow::Result<Ladder> {
    if s.device.backend == Backend::Cpu {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
        return Ok(Ladder::cores(cores));
    }
    Ok(match mech {
        Mechanism::Green => {
            let d = super::detected_device_model(s.device.gpu)?;
            let r = d
                .green_rules()
                .ok_or_else(|| user(format!("{} has no green contexts", d.name)))?;
            Ladder::green(d.sm_count, r.min_sms, r.step_sms)
        }
        Mechanism::Mps => Ladder::mps(5),
        _ => Ladder::whole(),
    })
}

/// This machine's device for the profile cache: GPU name and driver, or the CPU.
fn device_id(s: &Scenario) -> String {
    if s.device.backend == Backend::Cpu {
        let model = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|t| {
                t.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split(':').nth(1))
                    .map(|m| m.trim().to_string())
            })
            .unwrap_or_else(|| "cpu".into());
        return format!("cpu {model}");
    }
    isolane_gpu::devices::list_devices()
        .ok()
        .and_then(|ds| ds.into_iter().find(|d| d.index == s.device.gpu))
        .map(|d| {
            format!(
                "{} {}",
                d.name,
                d.driver_version.unwrap_or(d.cuda_driver_version)
            )
        })
        .unwrap_or_else(|| format!("gpu{}", s.device.gpu))
}

/// The model as the cache knows it: an ONNX file by name and content hash (a re-exported
/// file is measured again), anything else by its name.
fn model_id(model: &str) -> String {
    if !model.ends_with(".onnx") {
        return model.to_string();
    }
    let hash = std::fs::read(model).map_or(0, |b| crc32fast::hash(&b));
    let name = Path::new(model)
        .file_name()
        .map_or_else(|| model.to_string(), |n| n.to_string_lossy().into_owned());
    format!("{name}-{hash:08x}")
}

/// Profiles by running the workload alone, closed loop, through `isolane run`'s path.
struct RunProfiler<'a> {
    scenario: &'a Scenario,
    mechanism: Mechanism,
    cache: &'a ProfileCache,
    device: String,
    jobs: u64,
    engine: &'a Engine,
    work: &'a Path,
}

impl RunProfiler<'_> {
    fn key(&self, w: &WorkloadSpec, size: u32) -> ProfileKey {
        ProfileKey {
            device: self.device.clone(),
            model: model_id(&w.model),
            batch: w.batch,
            precision: format!("{:?}", w.precision).to_lowercase(),
            mechanism: format!("{:?}", self.mechanism).to_lowercase(),
            size,
        }
    }

    fn measure(&self, index: usize, size: u32) -> anyhow::Result<Point> {
        let mut w = self.scenario.workloads[index].clone();
        w.rate = Rate::Max(MaxRate::Max);
        w.deadline_ms = None;
        w.length = RunLength::Jobs(self.jobs);
        w.warmup_jobs = PROFILE_WARMUP;
        w.role = Role::Standalone;
        w.ramp = None;
        w.late = LatePolicy::Queue;
        w.criticality = Criticality::Critical;
        let mut s = self.scenario.clone();
        place(&mut s, &mut w, self.mechanism, size, 0);
        s.workloads = vec![w];
        let admitted = super::admit_or_refuse(&s, "the profile run")?;
        let plan = RunPlan::from_scenario(&s);
        let out = self.work.join(format!("w{index}-{size}"));
        let m = super::run::measure(super::run::Request {
            command: "plan",
            scenario: &s,
            scenario_name: "profile".into(),
            admitted: admitted.as_ref(),
            plan: &plan,
            out: Some(&out),
            force: true,
            quiet: true,
            partitions: &super::PartitionFlags::default(),
            engine: self.engine,
        })?;
        let r = &m.result.workloads[0];
        if let isolane_runtime::WorkloadStatus::Failed(f) = &r.status {
            anyhow::bail!(
                "the profile run of `{}` failed: {}",
                s.workloads[0].name,
                f.message
            );
        }
        let t = isolane_core::metrics::exec_times(&r.records);
        let (Some(p50), Some(p99), Some(mean)) = (t.p50, t.p99, t.mean) else {
            anyhow::bail!(
                "the profile run of `{}` completed no job",
                s.workloads[0].name
            );
        };
        Ok(Point {
            size,
            exec_p50_ms: p50,
            exec_p99_ms: p99,
            exec_mean_ms: mean,
            exec_p999_ms: t.p999,
        })
    }
}

impl Profiler for RunProfiler<'_> {
    fn profile(&mut self, index: usize, size: u32) -> Result<Point, String> {
        let key = self.key(&self.scenario.workloads[index], size);
        if let Some(p) = self.cache.get(&key) {
            return Ok(p);
        }
        let p = self.measure(index, size).map_err(|e| format!("{e:#}"))?;
        if let Err(e) = self.cache.put(&key, &p) {
            eprintln!(
                "note: cannot keep the profile in {}: {e}",
                self.cache.dir().display()
            );
        }
        eprintln!(
            "profiled {} in {}: p50 {:.3} ms, p99 {:.3} ms, p99.9 {:.3} ms",
            self.scenario.workloads[index].name,
            describe(self.mechanism, size),
            p.exec_p50_ms,
            p.exec_p99_ms,
            p.tail_ms()
        );
        Ok(p)
    }
}

fn describe(mech: Mechanism, size: u32) -> String {
    match mech {
        Mechanism::Green => format!("{size} SMs"),
        Mechanism::Mps => format!("{size} % of the threads"),
        Mechanism::None => "one core".into(),
        _ => "the whole GPU".into(),
    }
}

/// Puts workload `w` in a partition of `size` under `mech` (on the CPU: on core `core`).
fn place(s: &mut Scenario, w: &mut WorkloadSpec, mech: Mechanism, size: u32, core: usize) {
    w.partition = PartitionSpec::default();
    if s.device.backend == Backend::Cpu {
        w.cpu = vec![core];
        w.host = Host::Thread;
        return;
    }
    s.device.mechanism = mech;
    match mech {
        Mechanism::Green => {
            w.partition.sms = Some(size);
            w.host = Host::Thread;
        }
        Mechanism::Mps => {
            w.partition.thread_pct = Some(size);
            w.host = Host::Process;
        }
        _ => w.host = Host::Process,
    }
    s.device.host = w.host;
}

/// The scenario with every workload in its planned partition.
fn planned_scenario(s: &Scenario, mech: Mechanism, choices: &[Choice]) -> Scenario {
    let mut out = s.clone();
    let mut workloads = std::mem::take(&mut out.workloads);
    for (k, (w, c)) in workloads.iter_mut().zip(choices).enumerate() {
        place(&mut out, w, mech, c.size, k);
    }
    out.workloads = workloads;
    out
}

/// The resolved scenario with a comment above each workload: its partition, predicted p99 and
/// p99.9, and the slack the deadline leaves beyond the p99.9.
fn annotate(toml: &str, choices: &[Choice], ladder: &Ladder) -> String {
    let mut out = String::new();
    let mut next = choices.iter();
    for line in toml.lines() {
        if line.trim() == "[[workload]]" {
            if let Some(c) = next.next() {
                out.push_str(&format!(
                    "# planned: {}; predicted p99 {:.3} ms, p99.9 {:.3} ms (deadline {:.3} ms, \
                     slack {:.3} ms); utilisation {:.2}\n",
                    ladder.describe(c.size),
                    c.predicted_p99_ms,
                    c.predicted_tail_ms,
                    c.deadline_ms,
                    c.slack_ms(),
                    c.util
                ));
            }
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

fn print_outcome(mech: Mechanism, ladder: &Ladder, o: &Outcome, secs: f64) {
    let title = match ladder.unit {
        Unit::Cores => "cpu cores".to_string(),
        _ => format!("{mech:?}").to_lowercase(),
    };
    match o {
        Outcome::Planned {
            choices,
            used,
            capacity,
        } => {
            eprintln!(
                "{title}: planned in {secs:.2} s, using {} of {} ({} spare):",
                ladder.describe(*used),
                ladder.describe(*capacity),
                ladder.describe(capacity - used)
            );
            for c in choices {
                eprintln!(
                    "  {:<14} {:>8}  p99 {:>6.3}  p99.9 {:>6.3} of {:>6.3} ms  slack {:>6.3} ms",
                    c.workload,
                    ladder.describe(c.size),
                    c.predicted_p99_ms,
                    c.predicted_tail_ms,
                    c.deadline_ms,
                    c.slack_ms()
                );
            }
        }
        Outcome::NoPlan { reasons, partial } => {
            eprintln!("{title}: no plan ({secs:.2} s):");
            for r in reasons {
                eprintln!("  {r}");
            }
            if !partial.is_empty() {
                let parts: Vec<String> = partial
                    .iter()
                    .map(|c| format!("{} {}", c.workload, ladder.describe(c.size)))
                    .collect();
                eprintln!("  best partial plan: {}", parts.join(", "));
            }
        }
    }
}

/// Runs the planned scenario (verification round `round`) and returns what it measured.
fn verify(
    s: &Scenario,
    args: &PlanArgs,
    round: u32,
    engine: &Engine,
) -> anyhow::Result<RunSummary> {
    // Round 1 runs in --verify-out, later rounds beside it (DIR.round2 …).
    let out = args.verify_out.as_ref().map(|d| match round {
        1 => d.clone(),
        k => {
            let mut name = d.as_os_str().to_owned();
            name.push(format!(".round{k}"));
            std::path::PathBuf::from(name)
        }
    });
    let admitted = super::admit_or_refuse(s, "the planned scenario")?;
    let plan = RunPlan::from_scenario(s);
    let m = super::run::measure(super::run::Request {
        command: "plan",
        scenario: s,
        scenario_name: "planned".into(),
        admitted: admitted.as_ref(),
        plan: &plan,
        out: out.as_deref(),
        force: args.force,
        quiet: true,
        partitions: &super::PartitionFlags::default(),
        engine,
    })?;
    super::run::write_run_files(&m)?;
    println!("verification run {round}: {}", m.out.display());
    Ok(m.summary)
}

/// Predicted against measured p99 and p99.9 (response times, ms) per workload; whether one
/// missed its deadline (timeouts above 0.1 %, or a measured p99 above it): then the plan
/// does not hold.
fn print_verification(summary: &RunSummary, choices: &[Choice]) -> bool {
    println!(
        "{:<14} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}  verdict",
        "workload", "p99 pred", "measured", "p999 pre", "measured", "deadline", "timeouts"
    );
    let mut missed = false;
    for (w, c) in summary.workloads.iter().zip(choices) {
        let lat = &w.metrics.latency_ms;
        let p99 = lat.p99.unwrap_or(f64::INFINITY);
        let p999 = lat.p999.unwrap_or(f64::INFINITY);
        let miss = w.metrics.timeout_pct > 0.1 || p99 > c.deadline_ms;
        missed |= miss;
        println!(
            "{:<14} {:>8.3} {:>8.3} {:>8.3} {:>8.3} {:>8.3} {:>7.2}%  {}",
            w.name,
            c.predicted_p99_ms,
            p99,
            c.predicted_tail_ms,
            p999,
            c.deadline_ms,
            w.metrics.timeout_pct,
            if miss { "MISSED" } else { "met" }
        );
    }
    println!("(response times in ms, predicted from the profiles alone × stretch)");
    missed
}
