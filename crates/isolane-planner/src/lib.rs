//! The planner (`isolane plan --auto`, docs/planner.md): from workloads with rates and
//! deadlines but no partitions to the smallest partitions that meet them, or the reasons why
//! none do.
//!
//! It knows nothing of how a model is measured: a [`Profiler`] gives a workload's execution
//! times alone in a partition of a given size (the binary runs the model there; tests use
//! tables), and [`ProfileCache`] keeps them on disk between plans. What it decides:
//!
//! - **green / MPS** (a [`Ladder`] of SM counts or thread percentages): for each workload the
//!   smallest size whose predicted tail, the measured p99.9 execution time × the stated
//!   stretch beside neighbours, stays within `margin × deadline` (a 0.1 % timeout budget is a
//!   p99.9 bound: planning on p99 let 0.12–0.17 % of jobs miss on the H100), and whose utilisation
//!   (rate × mean execution time × the same stretch: a neighbour lengthens every job, not only
//!   the tail) stays under `max_util`. Sizes are searched by bisection,
//!   assuming a larger partition is never slower; then the sizes must fit the device together.
//! - **time-slicing** (one size, the whole GPU): workloads take turns, so a job may wait for one
//!   job of every other workload: predicted p99 = (own p99 + the others' p99) × stretch, and the
//!   utilisations must add up to at most `max_util`.
//! - **MIG** (a [`Ladder`] of GPU-instance profiles, smallest first by compute then memory
//!   slices): the smallest profile per workload as for green, then one placement of all of
//!   them on the GPU ([`isolane_core::device_model::place_mig_instances`]).
//! - **CPU cores**: each workload a core of its own, profiled pinned to one core. The core is
//!   not partitioned from the host's other processes, so there the p99 holds the deadline and
//!   a p99.9 over it is planned and said ([`tail_rule`]).
//!
//! Every GPU plan also checks device memory: a workload's estimate against its partition's
//! memory (a MIG instance's, else the device's), and all of them together against the device.
//!
//! On several GPUs of one model ([`plan_gpus`]) the workloads are first placed on GPUs
//! (pinned ones stay, the others first-fit decreasing), then each GPU is planned as above.
//!
//! The closed loop around the search (profile → plan → verify → plan again, the stretch
//! learned from verification runs, mechanisms compared) is [`auto::run`]: what it measures
//! comes through the caller's [`auto::Bench`], what it says goes out as [`auto::Event`]s.

pub mod auto;
mod budget;
pub mod cache;
pub mod foresee;
mod gpus;
pub mod learned;
pub mod offline;
pub mod phases;
pub mod predicted;
mod search;
mod stretch;

pub use budget::ProfileBudget;
pub use cache::{cpu_name, ProfileCache};
pub use gpus::{plan_gpus, GpusPlan};
pub use learned::{Learned, LearnedStretch, StretchKey};
pub use phases::{stagger, Periodic, StaggerError, Staggered};
pub use search::{
    plan, plan_capped, predicted, tail_rule, Capped, CappedPlan, Choice, Keep, Outcome, TailRule,
    Unprofiled,
};
pub use stretch::{stretch_from, worst_stretch};

use isolane_core::device_model::{MigModel, MigProfile};
use serde::{Deserialize, Serialize};

/// What one workload must achieve.
#[derive(Debug, Clone, PartialEq)]
pub struct Demand {
    pub name: String,
    /// Release rate (Hz).
    pub rate_hz: f64,
    /// Relative deadline (ms).
    pub deadline_ms: f64,
    /// Critical workloads are packed first when not everything fits.
    pub critical: bool,
    /// This workload's own interference stretch (e.g. from an interference matrix, beside its
    /// actual neighbours); `None`: [`Options::stretch`]. It stretches the p99.9 the search
    /// holds to the deadline.
    pub stretch: Option<f64>,
    /// The delay (ms) the neighbours and queueing add to this workload's p99, where a
    /// verification run measured it: its p99 response time beside them minus its p99 alone in
    /// the same partition. The predicted p99 is the p99 alone plus it (`None`: the p99 alone ×
    /// `stretch`). A delay carries over to another partition size where a ratio does not (a
    /// camera moved from 8 to 16 SMs beside resnet50: −23 % as a ratio, +2 % as a delay, on
    /// the H100; docs/planner.md), and a p99.9 ratio carries one job in a thousand's spikes.
    pub added_p99_ms: Option<f64>,
    /// Device memory the workload needs (MiB), when it is known (the engine's estimate).
    pub memory_mib: Option<u64>,
}

/// A workload's execution times alone in a partition of `size` (ms).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Point {
    pub size: u32,
    pub exec_p50_ms: f64,
    pub exec_p99_ms: f64,
    pub exec_mean_ms: f64,
    /// The 99.9th percentile: what a deadline must hold for at most 0.1 % timeouts. Profiles
    /// from before it was kept have none; their p99 stands in (said in the plan's notes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec_p999_ms: Option<f64>,
}

impl Point {
    /// The tail the plan must fit in: p99.9, or p99 where the profile has no p99.9.
    pub fn tail_ms(&self) -> f64 {
        self.exec_p999_ms.unwrap_or(self.exec_p99_ms)
    }
}

/// Why a profile is not there.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProfileError {
    /// Not measured, and it may not be here (planning offline, or the profiling budget is
    /// spent): the search of this workload stops, the others go on, and the outcome names it.
    #[error("{0}")]
    NotProfiled(String),
    /// Measuring failed: no plan can be trusted.
    #[error("{0}")]
    Failed(String),
}

/// Measures workload `workload` (an index into the demands) alone in a partition of `size`.
pub trait Profiler {
    fn profile(&mut self, workload: usize, size: u32) -> Result<Point, ProfileError>;
}

/// What a size means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Unit {
    /// Green-context SMs.
    Sms,
    /// MPS active thread percentage.
    ThreadPct,
    /// Time-slicing: every workload on the whole GPU.
    Whole,
    /// CPU cores, one per workload.
    Cores,
    /// MIG GPU instances: a size is an index into [`Ladder::mig`]'s profiles.
    Mig,
}

/// The sizes a partition may have, smallest first, and how much there is in all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ladder {
    pub unit: Unit,
    pub sizes: Vec<u32>,
    /// SMs, thread %, cores, or (MIG) compute slices in all.
    pub capacity: u32,
    /// The device's memory (MiB); `None` on the CPU, where memory is not planned.
    pub device_memory_mib: Option<u64>,
    /// The MIG model whose profiles the sizes index (`Unit::Mig` only).
    pub mig: Option<MigModel>,
}

impl Ladder {
    /// Green contexts on a device of `sm_count` SMs with the given minimum and step.
    pub fn green(sm_count: u32, min: u32, step: u32) -> Ladder {
        let step = step.max(1);
        Ladder {
            unit: Unit::Sms,
            sizes: (min.max(step)..=sm_count).step_by(step as usize).collect(),
            capacity: sm_count,
            device_memory_mib: None,
            mig: None,
        }
    }

    /// MPS thread percentages in steps of `step` %, up to 100 % in all.
    pub fn mps(step: u32) -> Ladder {
        let step = step.clamp(1, 100);
        Ladder {
            unit: Unit::ThreadPct,
            sizes: (step..=100).step_by(step as usize).collect(),
            capacity: 100,
            device_memory_mib: None,
            mig: None,
        }
    }

    /// Time-slicing: the whole GPU for everyone (size 1 stands for it).
    pub fn whole() -> Ladder {
        Ladder {
            unit: Unit::Whole,
            sizes: vec![1],
            capacity: 1,
            device_memory_mib: None,
            mig: None,
        }
    }

    /// One CPU core per workload, `cores` in all.
    pub fn cores(cores: u32) -> Ladder {
        Ladder {
            unit: Unit::Cores,
            sizes: vec![1],
            capacity: cores,
            device_memory_mib: None,
            mig: None,
        }
    }

    /// MIG GPU instances of `mig`'s base profiles (media-extension variants give no more
    /// compute or memory), smallest first: by compute slices, then memory slices, so that a
    /// later size is never slower and never has less memory.
    pub fn mig(mig: &MigModel) -> Ladder {
        let mut sizes: Vec<u32> = (0..mig.profiles.len() as u32)
            .filter(|&i| !mig.profiles[i as usize].media_extensions)
            .collect();
        sizes.sort_by_key(|&i| {
            let p = &mig.profiles[i as usize];
            (p.compute_slices, p.memory_slices)
        });
        Ladder {
            unit: Unit::Mig,
            sizes,
            capacity: mig.compute_slices,
            device_memory_mib: None,
            mig: Some(mig.clone()),
        }
    }

    /// The same ladder on a device of `mib` MiB, whose memory the plan then checks.
    pub fn with_device_memory(self, mib: u64) -> Ladder {
        Ladder {
            device_memory_mib: Some(mib),
            ..self
        }
    }

    /// The MIG profile a size stands for (`Unit::Mig` only).
    pub fn mig_profile(&self, size: u32) -> Option<&MigProfile> {
        self.mig.as_ref()?.profiles.get(size as usize)
    }

    /// How much of the capacity a partition of `size` takes (MIG: its compute slices).
    pub fn cost(&self, size: u32) -> u32 {
        match self.unit {
            Unit::Mig => self.mig_profile(size).map_or(0, |p| p.compute_slices),
            _ => size,
        }
    }

    /// The memory a workload in a partition of `size` may use at most (MiB): a MIG
    /// instance's own, else the whole device's.
    pub fn memory_of(&self, size: u32) -> Option<u64> {
        match self.unit {
            Unit::Mig => self.mig_profile(size).map(|p| p.memory_mib),
            _ => self.device_memory_mib,
        }
    }

    /// The size as profile files name it: `48`, `25`, `1g.10gb`.
    pub fn label(&self, size: u32) -> String {
        match self.mig_profile(size) {
            Some(p) if self.unit == Unit::Mig => p.name.to_string(),
            _ => size.to_string(),
        }
    }

    /// An amount of the capacity in words: `96 SMs`, `5 compute slices`.
    pub fn describe_amount(&self, amount: u32) -> String {
        match self.unit {
            Unit::Mig if amount == 1 => "1 compute slice".into(),
            Unit::Mig => format!("{amount} compute slices"),
            _ => self.describe(amount),
        }
    }

    /// A size in words: `48 SMs`, `25 %`, `whole GPU`, `1 core`.
    pub fn describe(&self, size: u32) -> String {
        match self.unit {
            Unit::Sms => format!("{size} SMs"),
            Unit::ThreadPct => format!("{size} %"),
            Unit::Whole => "whole GPU".into(),
            Unit::Cores if size == 1 => "1 core".into(),
            Unit::Cores => format!("{size} cores"),
            Unit::Mig => self.label(size),
        }
    }
}

/// Where the workloads go on several GPUs (`--objective`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Objective {
    /// Each on the GPU whose workloads take the least of it so far, where the plan still
    /// holds: fewer neighbours share each GPU's memory system, so each keeps more slack (on two
    /// H200s, packing a held-out scenario onto GPU 0 stretched it 1.11–1.61×, issue 34).
    #[default]
    Spread,
    /// Each on the first GPU where the plan still holds (first-fit decreasing): the fewest
    /// GPUs, the others left for other work.
    Pack,
}

impl Objective {
    pub fn name(self) -> &'static str {
        match self {
            Objective::Spread => "spread",
            Objective::Pack => "pack",
        }
    }
}

/// How much margin a plan keeps.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Options {
    /// A predicted p99.9 may use at most this fraction of the deadline (e.g. 0.9).
    pub margin: f64,
    /// Measured alone execution times are multiplied by this for the neighbours' interference
    /// (≥ 1; e.g. the worst p99 stretch of `isolane interference` for the mechanism).
    pub stretch: f64,
    /// Largest utilisation (rate × mean execution time) a workload, or for time-slicing all of
    /// them together, may have: above it queues build up.
    pub max_util: f64,
    /// Where the workloads go on several GPUs.
    pub objective: Objective,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            margin: 0.9,
            stretch: 1.0,
            max_util: 0.8,
            objective: Objective::Spread,
        }
    }
}
