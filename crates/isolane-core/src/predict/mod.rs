//! Predicting interference before a run (issue 34, docs/interference.md "Predicting the
//! stretch"): the stretch a victim's execution time suffers beside given neighbours, each in
//! partitions of their own (green contexts or MPS, which split the SMs only), from what each
//! job asks of the shared memory system.
//!
//! A workload's [`MemoryProfile`] is computed from its model (the engine's
//! `isolane_engine::traffic`: DRAM bytes per job, and what it keeps in or pushes through the
//! L2), or measured ([`MemoryProfile::measured`], from NVML's GPM DRAM bandwidth of the
//! workload alone). Beside neighbours, each running its own jobs of a known execution time:
//!
//! - **DRAM**: each neighbour's bandwidth while it runs (its DRAM bytes per job over its
//!   execution time) as a share of the device's peak, summed;
//! - **L2**: the share of the L2 the neighbours take while one victim job runs: a resident
//!   neighbour (weights and activations fit) keeps its footprint there, a streaming one pushes
//!   its bytes through at its rate for the victim job's length; at most the whole L2;
//!
//! and `stretch = 1 + dram × DRAM + l2 × L2`, two coefficients per GPU model fitted by least
//! squares (never below 0) to measured stretches ([`fitted`], with the data's path). The
//! neighbours are taken busy whenever the victim runs: a p99 sees the overlap.

use serde::{Deserialize, Serialize};

/// What a GPU's memory system offers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MemorySystem {
    /// Peak DRAM bandwidth (bytes/s): the scale of NVML's GPM DRAM-bandwidth percentage.
    pub dram_bytes_per_s: f64,
    /// L2 cache (bytes).
    pub l2_bytes: u64,
}

/// The memory system of a device model (`isolane_core::device_model` names): the vendor's
/// figures (H200: 4.8 TB/s HBM3e, 60 MB of L2, which PyTorch reported on the machines here;
/// H100 SXM: 3.35 TB/s, 50 MB). `None`: not known, nothing is predicted.
pub fn memory_system(device_model: &str) -> Option<MemorySystem> {
    match device_model {
        "h200" => Some(MemorySystem {
            dram_bytes_per_s: 4.8e12,
            l2_bytes: 60_000_000,
        }),
        "h100-sxm" => Some(MemorySystem {
            dram_bytes_per_s: 3.35e12,
            l2_bytes: 50_000_000,
        }),
        _ => None,
    }
}

/// Where a profile's figures come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProfileSource {
    /// From the model's graph (shapes, weights, precision, batch, the device's L2).
    Computed,
    /// From the device's counters while the workload ran alone (GPM DRAM bandwidth).
    Measured,
}

/// What one job of a workload asks of the memory system.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct MemoryProfile {
    /// Bytes a job reads from and writes to DRAM.
    pub dram_bytes_per_job: f64,
    /// Whether its weights and activations stay in the L2 from one job to the next.
    pub resident: bool,
    /// What a job keeps in the L2 (resident) or pushes through it (bytes).
    pub l2_footprint_bytes: f64,
    /// Floating-point operations of a job.
    pub flops_per_job: f64,
    pub source: ProfileSource,
}

impl MemoryProfile {
    /// DRAM bandwidth while a job runs (GB/s), at its execution time alone.
    pub fn dram_gb_per_s(&self, exec_ms: f64) -> f64 {
        self.dram_bytes_per_job / (exec_ms * 1e-3) / 1e9
    }

    /// The profile with its DRAM bytes replaced by a measurement: NVML GPM's DRAM bandwidth
    /// (% of the peak, the mean over a run of the workload alone) at the jobs per second that
    /// run completed. A measurement that cannot be one (not finite, negative, no jobs) leaves
    /// the profile as it is.
    pub fn measured(self, dram_bw_util_pct: f64, jobs_per_s: f64, sys: &MemorySystem) -> Self {
        let usable = dram_bw_util_pct.is_finite()
            && dram_bw_util_pct >= 0.0
            && jobs_per_s.is_finite()
            && jobs_per_s > 0.0;
        if !usable {
            return self;
        }
        MemoryProfile {
            dram_bytes_per_job: dram_bw_util_pct / 100.0 * sys.dram_bytes_per_s / jobs_per_s,
            source: ProfileSource::Measured,
            ..self
        }
    }
}

/// A workload beside the victim: its profile and its execution time alone in its partition.
#[derive(Debug, Clone, PartialEq)]
pub struct Neighbour {
    pub name: String,
    pub profile: MemoryProfile,
    pub exec_ms: f64,
}

/// What the neighbours take from the memory system while one victim job runs.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Terms {
    /// The neighbours' DRAM bandwidth together, as a share of the peak (0..).
    pub dram: f64,
    /// The share of the L2 they hold or stream through (0..=1).
    pub l2: f64,
}

impl Terms {
    /// One neighbour's terms beside a victim job of `victim_exec_ms`.
    pub fn of(n: &Neighbour, victim_exec_ms: f64, sys: &MemorySystem) -> Terms {
        let l2 = sys.l2_bytes as f64;
        if !(n.exec_ms.is_finite() && n.exec_ms > 0.0) {
            return Terms::default();
        }
        let dram = n.profile.dram_bytes_per_job / (n.exec_ms * 1e-3) / sys.dram_bytes_per_s;
        let l2_share = if n.profile.resident {
            n.profile.l2_footprint_bytes / l2
        } else {
            n.profile.dram_bytes_per_job * (victim_exec_ms / n.exec_ms) / l2
        };
        Terms {
            dram: dram.max(0.0),
            l2: l2_share.clamp(0.0, 1.0),
        }
    }

    /// All neighbours' terms: DRAM shares add up, the L2 is taken at most once.
    pub fn beside(neighbours: &[Neighbour], victim_exec_ms: f64, sys: &MemorySystem) -> Terms {
        let mut t = Terms::default();
        for n in neighbours {
            let one = Terms::of(n, victim_exec_ms, sys);
            t.dram += one.dram;
            t.l2 += one.l2;
        }
        t.l2 = t.l2.min(1.0);
        t
    }
}

/// The two coefficients of one GPU model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Coefficients {
    /// Stretch per unit of the neighbours' DRAM share.
    pub dram: f64,
    /// Stretch per unit of L2 share taken.
    pub l2: f64,
}

impl Coefficients {
    pub fn stretch(&self, t: &Terms) -> f64 {
        1.0 + self.dram * t.dram + self.l2 * t.l2
    }
}

/// A GPU model's coefficients and the measurements they were fitted to.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fitted {
    pub device_model: &'static str,
    pub coefficients: Coefficients,
    /// The committed points (this crate's `src/predict/`), made from the results named.
    pub points: &'static str,
    pub models: &'static str,
    pub data: &'static str,
    /// Admission's floor for a resident victim (a model that keeps itself in the L2: the
    /// CNNs) beside any busy neighbour: the highest p99 stretch `matrix` measured for a
    /// resident victim beside a resident neighbour, where the fitted terms (a resident
    /// neighbour's footprint only) under-predict every pair. `None`: no matrix measured.
    pub resident_floor: Option<f64>,
    /// The measured interference matrix `resident_floor` is taken from.
    pub matrix: &'static str,
}

impl Fitted {
    /// The stretch admission assumes for a victim with `victim` profile beside `neighbours`
    /// that the model predicts `stretch` for: at least [`Fitted::resident_floor`] for a
    /// resident victim beside any neighbour at all, because the matrix measured CNN victims at
    /// 1.19–1.36 ×p99 beside CNN neighbours that the model puts at 1.09–1.20, and no less
    /// beside a streaming one (docs/interference.md, "Admission's floor for CNN victims").
    /// `plan --auto`'s first plan and `serve --autoplan`'s re-plans take it too
    /// (`isolane_planner::predicted::planned_stretches`).
    pub fn admission_stretch(
        &self,
        victim: &MemoryProfile,
        neighbours: &[Neighbour],
        stretch: f64,
    ) -> f64 {
        match self.resident_floor {
            Some(floor) if victim.resident && !neighbours.is_empty() => stretch.max(floor),
            _ => stretch,
        }
    }
}

/// The H200's coefficients: least squares over the 28 points of `h200-points.csv` (green and
/// MPS; made by `python3 scripts/interference_fit_data.py` from
/// results/h200-protection/**/protection.csv), with the model profiles of `h200-models.csv`
/// (the engine's `traffic`). `cargo test -p isolane-core --lib predict -- --nocapture` fits
/// them again, fails where these differ, and prints each point's error.
const H200: Fitted = Fitted {
    device_model: "h200",
    coefficients: Coefficients {
        dram: 1.2359,
        l2: 0.2235,
    },
    points: "crates/isolane-core/src/predict/h200-points.csv",
    models: "crates/isolane-core/src/predict/h200-models.csv",
    data: "results/h200-protection/**/protection.csv",
    // mobilenet_v2 beside resnet50, both fp16, batch 1, the highest of the six resident pairs
    // (1.1944 to 1.3622); the predict tests take it from the matrix again.
    resident_floor: Some(1.3622),
    matrix: "results/h200-predict/interference.csv",
};

/// The fitted coefficients for a device model under a mechanism that splits the SMs only
/// (green contexts, MPS). `None` elsewhere: no data measured there (the H100's matrix
/// predates the build's fixed kernel choice, docs/interference.md), or a mechanism where the
/// stretch is not the memory system's (time-slicing: jobs wait for each other; MIG: L2 and
/// DRAM are partitioned too).
pub fn fitted(device_model: &str, mechanism: crate::spec::Mechanism) -> Option<&'static Fitted> {
    use crate::spec::Mechanism;
    if !matches!(mechanism, Mechanism::Green | Mechanism::Mps) {
        return None;
    }
    match device_model {
        "h200" => Some(&H200),
        _ => None,
    }
}

/// A victim's predicted stretch beside its neighbours.
#[derive(Debug, Clone, PartialEq)]
pub struct Prediction {
    pub stretch: f64,
    pub terms: Terms,
    /// The neighbour that alone would stretch it most, and by how much.
    pub worst: Option<(String, f64)>,
}

/// The stretch a victim of `victim_exec_ms` alone suffers beside `neighbours`.
pub fn predict(
    c: &Coefficients,
    sys: &MemorySystem,
    victim_exec_ms: f64,
    neighbours: &[Neighbour],
) -> Prediction {
    let terms = Terms::beside(neighbours, victim_exec_ms, sys);
    let worst = neighbours
        .iter()
        .map(|n| {
            let s = c.stretch(&Terms::beside(std::slice::from_ref(n), victim_exec_ms, sys));
            (n.name.clone(), s)
        })
        .max_by(|a, b| a.1.total_cmp(&b.1));
    Prediction {
        stretch: c.stretch(&terms),
        terms,
        worst,
    }
}

/// Least squares of `stretch − 1 = dram × DRAM + l2 × L2` over measured points, neither
/// coefficient below 0 (a neighbour never speeds a victim up): the unconstrained solution
/// where both are ≥ 0, else the better of the two one-term fits.
pub fn fit(points: &[(Terms, f64)]) -> Coefficients {
    let (mut xx, mut xy, mut yy, mut xz, mut yz) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for (t, s) in points {
        let z = s - 1.0;
        xx += t.dram * t.dram;
        xy += t.dram * t.l2;
        yy += t.l2 * t.l2;
        xz += t.dram * z;
        yz += t.l2 * z;
    }
    let det = xx * yy - xy * xy;
    if det.abs() > 1e-12 {
        let a = (xz * yy - yz * xy) / det;
        let b = (yz * xx - xz * xy) / det;
        if a >= 0.0 && b >= 0.0 {
            return Coefficients { dram: a, l2: b };
        }
    }
    let sse =
        |c: &Coefficients| -> f64 { points.iter().map(|(t, s)| (c.stretch(t) - s).powi(2)).sum() };
    let only_dram = Coefficients {
        dram: if xx > 0.0 { (xz / xx).max(0.0) } else { 0.0 },
        l2: 0.0,
    };
    let only_l2 = Coefficients {
        dram: 0.0,
        l2: if yy > 0.0 { (yz / yy).max(0.0) } else { 0.0 },
    };
    if sse(&only_dram) <= sse(&only_l2) {
        only_dram
    } else {
        only_l2
    }
}

#[cfg(test)]
mod tests;
