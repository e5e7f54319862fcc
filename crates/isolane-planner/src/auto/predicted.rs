//! The first plan with predicted stretches: where no verification run (learned) or matrix
//! (`--stretch-from`) gave a workload its stretch, the one the memory system is predicted to
//! cause beside the workloads planned on its GPU replaces `--stretch` (1 by default), so that
//! the first plan already holds beside its neighbours (issue 34; docs/planner.md).

use isolane_core::predict::{fitted, memory_system, MemoryProfile};
use isolane_core::spec::Mechanism;

use super::profiling::Profiles;
use super::{AutoError, Bench, Event, Observer, Target};
use crate::predicted::planned_stretches;
use crate::{Demand, GpusPlan, Ladder, Options};

/// Plans made again at most, each with stretches raised to the last plan's predictions (a
/// neighbour moved to a larger partition runs faster and takes more bandwidth).
const PASSES: usize = 3;

/// Stretches that differ by less than this are the same (a re-plan for 0.1 % changes nothing).
const SAME: f64 = 0.005;

/// `planned` again, with each open workload's stretch raised to its prediction, until the
/// predictions of the plan are those it was made with (or [`PASSES`] plans). Says each open
/// workload's prediction. Without coefficients for the device and mechanism, or without
/// profiles, the plan as it is.
#[allow(clippy::too_many_arguments)]
pub(super) fn with_predicted<B: Bench>(
    profiles: &mut Profiles<'_>,
    target: &Target,
    mech: Mechanism,
    ladder: &Ladder,
    demands: Vec<Demand>,
    planned: GpusPlan,
    memory: &[Option<MemoryProfile>],
    opts: &Options,
    bench: &mut B,
    observer: &mut dyn Observer,
) -> Result<(Vec<Demand>, GpusPlan), AutoError<B::Error>> {
    let device = target.device().name;
    let (Some(f), Some(sys)) = (fitted(device, mech), memory_system(device)) else {
        return Ok((demands, planned));
    };
    let open: Vec<bool> = demands
        .iter()
        .enumerate()
        .map(|(i, d)| {
            d.stretch.is_none()
                && d.added_p99_ms.is_none()
                && memory.get(i).is_some_and(|m| m.is_some())
        })
        .collect();
    if !open.contains(&true) {
        return Ok((demands, planned));
    }
    let (mut demands, mut planned) = (demands, planned);
    // What the last plan with a partition for everyone predicted: said when the stretches it
    // raised leave no plan.
    let mut shown = Vec::new();
    for _ in 0..PASSES {
        let predictions = planned_stretches(&planned, memory, f, &sys);
        if predictions.iter().any(Option::is_some) {
            shown = predictions.clone();
        }
        let mut next = demands.clone();
        let mut raised = false;
        for (i, p) in predictions.iter().enumerate() {
            let (true, Some(p)) = (open[i], p) else {
                continue;
            };
            let now = demands[i].stretch.unwrap_or(opts.stretch);
            if p.prediction.stretch > now + SAME {
                next[i].stretch = Some(p.prediction.stretch);
                raised = true;
            }
        }
        if !raised {
            break;
        }
        planned = profiles.plan(target, mech, ladder, &next, opts, bench, observer)?;
        demands = next;
    }
    let last = planned_stretches(&planned, memory, f, &sys);
    let last = if last.iter().any(Option::is_some) {
        last
    } else {
        shown
    };
    for (i, p) in last.iter().enumerate() {
        let (true, Some(p)) = (open[i], p) else {
            continue;
        };
        observer.event(&Event::PredictedStretch {
            workload: &demands[i].name,
            predicted: p.prediction.stretch,
            planned_with: demands[i].stretch.unwrap_or(opts.stretch),
            dram_share: p.prediction.terms.dram,
            l2_share: p.prediction.terms.l2,
            worst: (p.prediction.worst.as_ref()).map(|(n, s)| (n.as_str(), *s)),
            model: p.floor().map(|_| p.model),
        });
    }
    Ok((demands, planned))
}
