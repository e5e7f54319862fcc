//! What the planning loop says, as typed events, and the text `isolane plan --auto` prints for
//! each: the plan and what it measures on stderr (stdout may be the planned scenario), the
//! planned scenario, the verification and the verdicts on stdout.

use std::path::Path;

use isolane_core::results::RunSummary;
use isolane_core::spec::Mechanism;
use isolane_core::text::wrap_message;

use super::rounds::{host_late_ms, missed, planned_choices};
use crate::{Choice, GpusPlan, Ladder, Outcome, Point, Unit};

/// Where an event's text goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// One mechanism's plan and what its verification measured (`--mechanism all --verify`).
#[derive(Debug, Clone)]
pub struct Compared {
    pub mech: Mechanism,
    /// The capacity it leaves (`44 SMs of 132 SMs (88 SMs spare)`).
    pub spare: String,
    pub plan: GpusPlan,
    pub summary: RunSummary,
}

/// What the loop says, in the order it happens.
#[derive(Debug)]
pub enum Event<'a> {
    /// `--mechanism all` leaves MIG out, for this reason.
    MigSkipped { why: &'a str },
    /// A workload's stretch, from the interference matrix.
    MatrixStretch { workload: &'a str, stretch: f64 },
    /// A workload's stretch is the matrix's worst at its precision: the matrix never measured
    /// its model as a victim.
    MatrixWorstStretch {
        workload: &'a str,
        model: &'a str,
        precision: &'a str,
        stretch: f64,
    },
    /// A workload's stretch (and delay added to its p99) from an earlier verification beside
    /// the same workloads.
    LearnedStretch {
        workload: &'a str,
        stretch: f64,
        added_p99_ms: Option<f64>,
    },
    /// A workload's stretch predicted from the memory-system demand of the workloads planned
    /// on its GPU (`isolane_core::predict`), and the stretch it was planned with.
    PredictedStretch {
        workload: &'a str,
        predicted: f64,
        planned_with: f64,
        /// The neighbours' DRAM bandwidth while they run, as a share of the peak.
        dram_share: f64,
        /// The share of the L2 they hold or stream through during one of its jobs.
        l2_share: f64,
        /// The neighbour that alone would stretch it most, and by how much.
        worst: Option<(&'a str, f64)>,
        /// The model's own figure where admission's floor for a CNN victim raised it
        /// (`Fitted::admission_stretch`).
        model: Option<f64>,
    },
    /// A cached profile of another engine revision is used: it may not be measured now.
    StaleProfileUsed { stale: &'a str, why: &'a str },
    /// A cached profile of another engine revision is measured again.
    StaleProfileMeasured { stale: &'a str },
    /// A profile run measured this.
    Profiled {
        workload: &'a str,
        partition: &'a str,
        point: &'a Point,
    },
    /// A measured profile could not be kept in the cache.
    CannotKeepProfile { dir: &'a Path, error: &'a str },
    /// One mechanism's plan, or why there is none.
    Outcome {
        mechanism: Mechanism,
        ladder: &'a Ladder,
        plan: &'a GpusPlan,
        /// The time it took, profiling included.
        secs: f64,
        margin: f64,
    },
    /// Profiles were missing: what to do about it.
    MissingProfiles { hint: &'a str },
    /// `--export-profiles`: this many profiles copied.
    Exported { count: usize, dir: &'a Path },
    /// A note on the release phases of the planned scenario (where they are staggered, or where
    /// staggering them would keep jobs apart).
    ReleasePhases { text: &'a str },
    /// The planned scenario was written to this file.
    PlanWritten { path: &'a Path },
    /// The planned scenario, for the caller to show (it wrote it nowhere).
    PlannedScenario { text: &'a str },
    /// A run of a planned scenario is in this folder (`verification run 1: DIR`).
    VerificationRun { label: &'a str, dir: &'a Path },
    /// Predicted against measured per workload, in a run of the plan.
    Verification {
        summary: &'a RunSummary,
        choices: &'a [Choice],
    },
    /// The stretch a workload was planned with and the one its run measured.
    Calibrated {
        workload: &'a str,
        planned: f64,
        measured: Option<f64>,
    },
    /// A measured stretch could not be kept.
    CannotKeepStretch { workload: &'a str, error: &'a str },
    /// The plan held, every prediction within the tolerance (a fraction).
    Holds { tolerance: f64 },
    /// The plan held, with predictions off for these workloads (`name (+23 %)`) and no round
    /// left.
    HoldsPredictionsOff { tolerance: f64, off: &'a str },
    /// The plan held with predictions off: round `round` runs the same partitions, predicted
    /// again.
    Repredicted { round: u32, off: &'a str },
    /// A workload missed, and no round is left.
    Missed,
    /// A workload missed: round `round` runs a plan made with the measured stretch.
    Replanned { round: u32 },
    /// A workload missed, and the measured stretch gives the same partitions.
    MissedSamePartitions,
    /// Jobs that missed started late on the host: round `round` runs the same partitions with
    /// each release thread spinning `spin_us` before its releases.
    SpinRaised {
        round: u32,
        spin_us: u64,
        late_ms: f64,
    },
    /// A workload missed, and with the measured stretch there is no plan.
    MissedNoPlan,
    /// Another mechanism's plan could not be run to compare.
    OtherPlanNotRun {
        mechanism: Mechanism,
        error: &'a str,
    },
    /// The mechanisms side by side.
    Comparison { compared: &'a [Compared] },
}

impl Event<'_> {
    pub fn stream(&self) -> Stream {
        match self {
            Event::PlanWritten { .. }
            | Event::PlannedScenario { .. }
            | Event::VerificationRun { .. }
            | Event::Verification { .. }
            | Event::Holds { .. }
            | Event::HoldsPredictionsOff { .. }
            | Event::Repredicted { .. }
            | Event::Missed
            | Event::Replanned { .. }
            | Event::MissedSamePartitions
            | Event::SpinRaised { .. }
            | Event::MissedNoPlan
            | Event::Comparison { .. } => Stream::Stdout,
            _ => Stream::Stderr,
        }
    }

    /// The text `isolane plan --auto` prints, each line ending in a newline.
    pub fn text(&self) -> String {
        let mut lines: Vec<String> = match self {
            Event::PlannedScenario { text } => return text.to_string(),
            Event::MigSkipped { why } => vec![wrap_message(&format!("mig: skipped: {why}"), 80)],
            Event::MatrixStretch { workload, stretch } => vec![format!(
                "{workload}: stretch {stretch:.2} from the interference matrix"
            )],
            Event::MatrixWorstStretch {
                workload,
                model,
                precision,
                stretch,
            } => vec![format!(
                "{workload}: stretch {stretch:.2}, the matrix's worst at {precision} (it did not \
                 measure {model} as a victim)"
            )],
            Event::LearnedStretch {
                workload,
                stretch,
                added_p99_ms,
            } => vec![format!(
                "{workload}: stretch {stretch:.2} (p99: {}) measured by an earlier verification \
                 beside the same workloads",
                added_p99_ms.map_or("not measured".into(), |a| format!("+{a:.3} ms"))
            )],
            Event::PredictedStretch {
                workload,
                predicted,
                planned_with,
                dram_share,
                l2_share,
                worst,
                model,
            } => vec![wrap_message(
                &format!(
                    "{workload}: stretch {predicted:.2} predicted beside the workloads planned \
                     on its GPU (their DRAM {:.1} % of the peak while they run, {:.0} % of the \
                     L2{}{}); planned with {planned_with:.2}",
                    100.0 * dram_share,
                    100.0 * l2_share,
                    worst.map_or(String::new(), |(n, s)| format!("; most from {n}, {s:.2}")),
                    model.map_or(String::new(), |m| format!(
                        "; the model says {m:.2}, admission's floor for a CNN victim \
                         {predicted:.2}"
                    ))
                ),
                80,
            )],
            Event::StaleProfileUsed { stale, why } => {
                vec![format!("note: {stale}; using it ({why})")]
            }
            Event::StaleProfileMeasured { stale } => {
                vec![format!("note: {stale}: measuring it again")]
            }
            Event::Profiled {
                workload,
                partition,
                point,
            } => vec![format!(
                "profiled {workload} in {partition}: p50 {:.3} ms, p99 {:.3} ms, p99.9 {:.3} ms",
                point.exec_p50_ms,
                point.exec_p99_ms,
                point.tail_ms()
            )],
            Event::CannotKeepProfile { dir, error } => vec![format!(
                "note: cannot keep the profile in {}: {error}",
                dir.display()
            )],
            Event::Outcome {
                mechanism,
                ladder,
                plan,
                secs,
                margin,
            } => outcome_lines(*mechanism, ladder, plan, *secs, *margin),
            Event::MissingProfiles { hint } => vec![wrap_message(hint, 80)],
            Event::Exported { count, dir } => {
                vec![format!("exported {count} profiles to {}", dir.display())]
            }
            Event::ReleasePhases { text } => vec![text.to_string()],
            Event::PlanWritten { path } => vec![format!("planned scenario: {}", path.display())],
            Event::VerificationRun { label, dir } => vec![format!("{label}: {}", dir.display())],
            Event::Verification { summary, choices } => verification_lines(summary, choices),
            Event::Calibrated {
                workload,
                planned,
                measured,
            } => vec![format!(
                "{workload}: stretch {planned:.2} planned, {} measured",
                measured.map_or("nothing".into(), |m| format!("{m:.2}"))
            )],
            Event::CannotKeepStretch { workload, error } => vec![format!(
                "note: cannot keep the measured stretch of {workload}: {error}"
            )],
            Event::Holds { tolerance } => vec![format!(
                "the plan holds, every predicted p99 within {:.0} % of the measured",
                100.0 * tolerance
            )],
            Event::HoldsPredictionsOff { tolerance, off } => vec![format!(
                "the plan holds; predicted p99 off by more than {:.0} % for {off}",
                100.0 * tolerance
            )],
            Event::Repredicted { round, off } => vec![format!(
                "round {round}: the plan holds but the predicted p99 was off for {off}; the same \
                 partitions again, each p99 predicted from the delay this run measured"
            )],
            Event::Missed => vec!["the plan does NOT hold: a workload missed its deadline".into()],
            Event::Replanned { round } => vec![format!(
                "round {round}: planned again with the measured stretch"
            )],
            Event::MissedSamePartitions => vec!["the plan does NOT hold, and planning with the \
                 measured stretch gives the same partitions"
                .into()],
            Event::SpinRaised {
                round,
                spin_us,
                late_ms,
            } => vec![format!(
                "round {round}: jobs of workloads that missed started up to {late_ms:.2} ms \
                 late on the host, \
                 and planning with the measured stretch gives the same partitions; the same \
                 partitions again with [timing] spin_us = {spin_us} (each workload's release \
                 thread spins that long before its releases instead of sleeping: a core each)"
            )],
            Event::MissedNoPlan => {
                vec!["the plan does NOT hold, and with the measured stretch there is none".into()]
            }
            Event::OtherPlanNotRun { mechanism, error } => vec![format!(
                "{}: its plan could not be run: {error}",
                mechanism.name()
            )],
            Event::Comparison { compared } => comparison_lines(compared),
        };
        lines.push(String::new());
        lines.join("\n")
    }
}

/// A choice's partition in words: `48 SMs`, `3g.40gb at memory slice 4`.
pub(crate) fn partition_words(ladder: &Ladder, c: &Choice) -> String {
    match c.mig_start {
        Some(start) => format!("{} at memory slice {start}", ladder.describe(c.size)),
        None => ladder.describe(c.size),
    }
}

/// `; device memory about 2340 of 81559 MiB` when the workloads' memory is known; on several
/// GPUs each GPU's (`; device memory about 1734 of 81559 MiB on GPU 0, 484 on GPU 1`).
fn memory_words(ladder: &Ladder, plan: &GpusPlan, choices: &[Choice]) -> String {
    let Some(device) = ladder
        .device_memory_mib
        .filter(|_| ladder.unit != Unit::Mig)
    else {
        return String::new();
    };
    let on = |gpu: Option<u32>| -> Option<u64> {
        let known: Vec<u64> = choices
            .iter()
            .filter(|c| gpu.is_none() || plan.gpu_of(&c.workload) == gpu)
            .filter_map(|c| c.memory_mib)
            .collect();
        (!known.is_empty()).then(|| known.iter().sum())
    };
    if plan.gpus.is_empty() {
        return on(None).map_or(String::new(), |m| {
            format!("; device memory about {m} of {device} MiB")
        });
    }
    let each: Vec<String> = plan
        .gpus
        .iter()
        .filter_map(|&g| on(Some(g)).map(|m| (g, m)))
        .enumerate()
        .map(|(k, (g, m))| match k {
            0 => format!("{m} of {device} MiB on GPU {g}"),
            _ => format!("{m} on GPU {g}"),
        })
        .collect();
    if each.is_empty() {
        return String::new();
    }
    format!("; device memory about {}", each.join(", "))
}

fn outcome_lines(
    mech: Mechanism,
    ladder: &Ladder,
    plan: &GpusPlan,
    secs: f64,
    margin: f64,
) -> Vec<String> {
    let title = match ladder.unit {
        Unit::Cores => "cpu cores".to_string(),
        _ => mech.name().to_string(),
    };
    let on = |c: &Choice| gpu_words(plan, c);
    let mut lines = Vec::new();
    match &plan.outcome {
        Outcome::Planned {
            choices,
            used,
            capacity,
        } => {
            lines.push(format!(
                "{title}: planned in {secs:.2} s, using {}{}:",
                usage(ladder, plan, *used, *capacity),
                memory_words(ladder, plan, choices)
            ));
            for c in choices {
                let memory = match (c.memory_mib, ladder.memory_of(c.size)) {
                    (Some(m), Some(of)) if ladder.unit == Unit::Mig => {
                        format!("  memory {m} of {of} MiB")
                    }
                    _ => String::new(),
                };
                lines.push(format!(
                    "  {:<14} {}{:>8}  p99 {:>6.3}  p99.9 {:>6.3} of {:>6.3} ms  slack {:>6.3} ms{memory}",
                    c.workload,
                    on(c),
                    partition_words(ladder, c),
                    c.predicted_p99_ms,
                    c.predicted_tail_ms,
                    c.deadline_ms,
                    c.slack_ms()
                ));
            }
            lines.extend(tail_notes(choices, margin));
        }
        Outcome::NoPlan {
            reasons,
            unprofiled,
            partial,
        } => {
            lines.push(format!("{title}: no plan ({secs:.2} s):"));
            for r in reasons {
                lines.push(indented(r));
            }
            for u in unprofiled {
                lines.push(indented(&format!("not profiled: {}", u.why)));
            }
            if !partial.is_empty() {
                let parts: Vec<String> = partial
                    .iter()
                    .map(|c| format!("{} {}{}", c.workload, on(c), partition_words(ladder, c)))
                    .collect();
                lines.push(indented(&format!(
                    "best partial plan: {}",
                    parts.join(", ")
                )));
            }
        }
    }
    lines
}

/// A line of the plan's outcome: two spaces in, wrapped to 80 columns (continuations four in).
fn indented(text: &str) -> String {
    wrap_message(text, 78)
        .lines()
        .map(|l| format!("  {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A note per workload planned on its p99 with a p99.9 over `margin` × its deadline (a CPU
/// core, [`crate::tail_rule`]), wrapped to 80 columns.
fn tail_notes(choices: &[Choice], margin: f64) -> Vec<String> {
    choices
        .iter()
        .filter(|c| c.tail_at_risk(margin))
        .map(|c| {
            wrap_message(
                &format!(
                    "note: `{}`: p99.9 {:.3} ms is over {:.0} % of its {:.3} ms deadline; \
                     planned on its p99 ({:.3} ms): a CPU core is not kept from the host's \
                     other processes, whose tail this is. More than 0.1 % of its jobs may miss \
                     while the machine is as busy as during the profile (--verify measures it).",
                    c.workload,
                    c.predicted_tail_ms,
                    margin * 100.0,
                    c.deadline_ms,
                    c.predicted_p99_ms
                ),
                80,
            )
        })
        .collect()
}

/// `GPU 1 ` before a choice's partition on several GPUs; nothing on one.
fn gpu_words(plan: &GpusPlan, c: &Choice) -> String {
    plan.gpu_of(&c.workload)
        .map_or(String::new(), |g| format!("GPU {g} "))
}

/// The capacity a plan leaves, in words (`44 SMs of 132 SMs (88 SMs spare)`).
pub(crate) fn spare_words(ladder: &Ladder, plan: &GpusPlan) -> String {
    match &plan.outcome {
        Outcome::Planned { used, capacity, .. } => usage(ladder, plan, *used, *capacity),
        Outcome::NoPlan { .. } => String::new(),
    }
}

/// `96 SMs of 132 SMs (36 SMs spare)`; on several GPUs each GPU's, `GPU 0: … ; GPU 1: …`.
fn usage(ladder: &Ladder, plan: &GpusPlan, used: u32, capacity: u32) -> String {
    if ladder.unit == Unit::Whole {
        return time_usage(plan);
    }
    let one = |used: u32, capacity: u32| {
        format!(
            "{} of {} ({} spare)",
            ladder.describe_amount(used),
            ladder.describe_amount(capacity),
            ladder.describe_amount(capacity.saturating_sub(used))
        )
    };
    if plan.gpus.is_empty() {
        return one(used, capacity);
    }
    plan.gpus
        .iter()
        .zip(&plan.used)
        .map(|(g, &u)| format!("GPU {g}: {}", one(u, ladder.capacity)))
        .collect::<Vec<_>>()
        .join("; ")
}

/// Time-slicing shares time, not space: the share of the GPU's time the jobs keep it busy
/// (rate × mean execution time, summed), per GPU on several.
fn time_usage(plan: &GpusPlan) -> String {
    let choices = planned_choices(plan);
    let busy = |gpu: Option<u32>| -> String {
        let pct: f64 = (choices.iter())
            .filter(|c| gpu.is_none() || plan.gpu_of(&c.workload) == gpu)
            .map(|c| 100.0 * c.util)
            .sum();
        format!(
            "the whole GPU in turns, {pct:.0} % of its time busy ({:.0} % spare)",
            (100.0 - pct).max(0.0)
        )
    };
    if plan.gpus.is_empty() {
        return busy(None);
    }
    (plan.gpus.iter())
        .map(|&g| format!("GPU {g}: {}", busy(Some(g))))
        .collect::<Vec<_>>()
        .join("; ")
}

/// Predicted against measured p99 and p99.9 (response times, ms) per workload, its jobs and
/// timeouts and its verdict, with what the run's length and late starts mean for it.
fn verification_lines(summary: &RunSummary, choices: &[Choice]) -> Vec<String> {
    let mut lines = vec![format!(
        "{:<14} {:>8} {:>8} {:>6} {:>8} {:>8} {:>8} {:>6} {:>8}  verdict",
        "workload",
        "p99 pred",
        "measured",
        "error",
        "p999 pre",
        "measured",
        "deadline",
        "jobs",
        "timeouts"
    )];
    let mut fewest_jobs = u64::MAX;
    for (w, c) in summary.workloads.iter().zip(choices) {
        let lat = &w.metrics.latency_ms;
        let p99 = lat.p99.unwrap_or(f64::INFINITY);
        let p999 = lat.p999.unwrap_or(f64::INFINITY);
        let miss = missed(w, c.deadline_ms);
        let error = c.predicted_p99_ms / p99 - 1.0;
        lines.push(format!(
            "{:<14} {:>8.3} {:>8.3} {:>5.0}% {:>8.3} {:>8.3} {:>8.3} {:>6} {:>7.2}%  {}",
            w.name,
            c.predicted_p99_ms,
            p99,
            100.0 * error,
            c.predicted_tail_ms,
            p999,
            c.deadline_ms,
            w.metrics.jobs,
            w.metrics.timeout_pct,
            if miss { "MISSED" } else { "met" }
        ));
        fewest_jobs = fewest_jobs.min(w.metrics.jobs);
    }
    lines.push(
        "(response times in ms; p99 predicted from the p99 alone + the delay a run measured, \
         or × the stretch; error = predicted / measured − 1)"
            .into(),
    );
    if let Some(note) = late_start_note(summary, choices) {
        lines.push(note);
    }
    if fewest_jobs < 3000 {
        // Rule of three: no miss in n jobs bounds the miss rate below 3/n at 95 % confidence.
        lines.push(format!(
            "(with {fewest_jobs} jobs a workload's 0.1 % allows {} miss(es), and none bounds \
             its miss rate only below {:.2} % at 95 % confidence: --verify-duration S runs \
             longer)",
            fewest_jobs / 1000,
            300.0 / fewest_jobs.max(1) as f64
        ));
    }
    lines
}

/// Where jobs of a workload that missed started late on the host ([`host_late_ms`]): the
/// `[timing] spin_us` that keeps the release threads awake through such a wake-up (the latest
/// late start plus 0.5 ms, in steps of 0.5 ms), and that latest late start (ms). Session 29
/// (results/h200x2-planner/session29-cell-two-gpus.md): starts up to 1.5 ms late with a spin
/// of 200 µs were 0.23 ms late at most with 4,000.
pub(crate) fn host_late_spin(summary: &RunSummary, choices: &[Choice]) -> Option<(u64, f64)> {
    let latest_ms = (summary.workloads.iter().zip(choices))
        .filter(|(w, c)| missed(w, c.deadline_ms))
        .filter_map(|(w, c)| host_late_ms(w, c.deadline_ms))
        .fold(None, |m: Option<f64>, ms| Some(m.map_or(ms, |m| m.max(ms))))?;
    let spin_us = ((latest_ms + 0.5) * 2.0).ceil() as u64 * 500;
    Some((spin_us, latest_ms))
}

/// Where a workload that missed had a job start late by more than a quarter of its deadline:
/// its launch waited for the host, or for its previous job, which a partition of the same
/// size does not change. Says so, with the run's CPU steal and the spin that would keep the
/// release threads awake through such a wake-up; the verdict stands.
pub(crate) fn late_start_note(summary: &RunSummary, choices: &[Choice]) -> Option<String> {
    let (spin_us, _) = host_late_spin(summary, choices)?;
    let late: Vec<String> = (summary.workloads.iter().zip(choices))
        .filter(|(w, c)| missed(w, c.deadline_ms))
        .filter_map(|(w, c)| {
            host_late_ms(w, c.deadline_ms).map(|ms| format!("{} {ms:.2} ms", w.name))
        })
        .collect();
    let steal = summary
        .cpu_steal_pct
        .map_or("not reported".into(), |p| format!("{p:.3} %"));
    Some(format!(
        "(a job of a workload that missed started late: {}, after its release; its launch \
         waited for the host or for its previous job, not for its partition's SMs (the \
         hypervisor's CPU steal in this run: {steal}): run again, or longer, to tell; its \
         measured stretch is its execution time's p99 (end − start) over its p99 alone where the \
         run recorded it; a thread that slept too long before a release starts on time with \
         [timing] spin_us = {spin_us} in the scenario (unless it spun that long already: then the \
         host stalled it otherwise), at the cost of a core per workload while it spins)",
        late.join(", ")
    ))
}

/// The mechanisms side by side: the capacity each plan leaves, and per workload the slack its
/// deadline was predicted to leave beyond the p99.9 and the slack measured.
pub(crate) fn comparison_lines(compared: &[Compared]) -> Vec<String> {
    let mut lines = vec![
        "mechanisms compared (the first is the plan written; slack = deadline − p99.9, ms):".into(),
        format!(
            "{:<10} {:<14} {:>10} {:>10} {:>9}  verdict",
            "mechanism", "workload", "slack pred", "measured", "timeouts"
        ),
    ];
    for c in compared {
        for (w, ch) in c.summary.workloads.iter().zip(planned_choices(&c.plan)) {
            let lat = &w.metrics.latency_ms;
            let measured = ch.deadline_ms - lat.p999.unwrap_or(f64::INFINITY);
            let miss = missed(w, ch.deadline_ms);
            lines.push(format!(
                "{:<10} {:<14} {:>10.3} {:>10.3} {:>8.2}%  {}",
                c.mech.name(),
                w.name,
                ch.slack_ms(),
                measured,
                w.metrics.timeout_pct,
                if miss { "MISSED" } else { "met" }
            ));
        }
        lines.push(format!("{:<10} spare: {}", c.mech.name(), c.spare));
    }
    lines
}
