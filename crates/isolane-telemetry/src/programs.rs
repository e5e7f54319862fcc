//! What telemetry can say about a command workload (an external program, docs/programs.md):
//! its process tree's peak device memory (NVML's running compute processes, summed over its
//! pids per sample), the share of the SMs it kept busy (NVML's per-process utilisation), and
//! an energy shared out by that share — attributed, and labelled so, since NVML has no
//! per-process energy.

use isolane_core::results::{ProgramEnergySource, RunSummary, WorkloadSummary};

use crate::{cumulative_energy_j, energy_between_j, EnergySource, Recording, Sample};

/// Fills in the telemetry of every command workload of `summary` from `rec`.
pub fn attach_programs(summary: &mut RunSummary, rec: &Recording) {
    attach_programs_on(summary, rec, &|_| true);
}

/// [`attach_programs`] for the command workloads that `on` says ran on `rec`'s GPU.
pub(crate) fn attach_programs_on(
    summary: &mut RunSummary,
    rec: &Recording,
    on: &dyn Fn(&str) -> bool,
) {
    let Some(t0) = summary.t0_monotonic_ns else {
        return;
    };
    let (cumulative, source) = cumulative_energy_j(&rec.samples);
    for w in summary.workloads.iter_mut().filter(|w| on(&w.name)) {
        let Some(p) = &w.program else { continue };
        let window = (
            t0 + (p.started_s * 1e9) as i64,
            t0 + (p.ended_s * 1e9) as i64,
        );
        let pids = p.pids.clone();
        if let Some(peak) = tree_peak_mib(&rec.samples, &pids) {
            w.metrics.gpu_memory_mib = Some(peak);
        }
        let Some(share) = sm_share(&rec.samples, &pids, window) else {
            continue;
        };
        let energy = (source != EnergySource::None && rec.samples.len() > 1)
            .then(|| energy_between_j(&rec.samples, &cumulative, window.0, window.1));
        set_share(w, share, energy);
    }
}

fn set_share(w: &mut WorkloadSummary, share: SmShare, device_energy_j: Option<f64>) {
    let Some(p) = w.program.as_mut() else { return };
    p.gpu_share_pct = Some(share.own_pct);
    if let (Some(e), Some(fraction)) = (device_energy_j, share.fraction()) {
        p.energy_j = Some(e * fraction);
        p.energy_source = Some(ProgramEnergySource::AttributedBySmShare);
    }
}

/// The most device memory the processes `pids` held together in one sample (MiB).
fn tree_peak_mib(samples: &[Sample], pids: &[u32]) -> Option<f64> {
    samples
        .iter()
        .filter_map(|s| {
            let own = s
                .reading
                .process_memory_mib
                .iter()
                .filter(|(p, _)| pids.contains(p));
            let mut any = false;
            let sum = own.map(|(_, m)| {
                any = true;
                *m
            });
            let total: f64 = sum.sum();
            any.then_some(total)
        })
        .reduce(f64::max)
}

/// A program's SM use over its run, beside every process's.
#[derive(Debug, Clone, Copy, PartialEq)]
struct SmShare {
    /// Mean over the samples of the SM utilisation of its processes (% of the device).
    own_pct: f64,
    /// The same for every process on the device.
    all_pct: f64,
}

impl SmShare {
    /// Its share of all processes' SM use (`None` when nobody used the SMs).
    fn fraction(self) -> Option<f64> {
        (self.all_pct > 0.0).then(|| (self.own_pct / self.all_pct).min(1.0))
    }
}

/// The SM use of `pids` over `window` (absolute ns), from the samples in it that carry
/// per-process utilisation. `None` when no sample names one of `pids`: no NVML support, or a
/// driver that books the program's work to another process (under MPS it may be the MPS
/// server's), which cannot be told from a program that used no SM — so nothing is claimed.
fn sm_share(samples: &[Sample], pids: &[u32], window: (i64, i64)) -> Option<SmShare> {
    let inside = samples
        .iter()
        .filter(|s| s.t_ns >= window.0 && s.t_ns <= window.1)
        .filter_map(|s| s.reading.process_sm_util_pct.as_ref());
    let (mut n, mut seen, mut own, mut all) = (0usize, false, 0.0, 0.0);
    for util in inside {
        n += 1;
        for (pid, u) in util {
            all += u;
            if pids.contains(pid) {
                seen = true;
                own += u;
            }
        }
    }
    (seen && n > 0).then(|| SmShare {
        own_pct: own / n as f64,
        all_pct: all / n as f64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Reading;
    use isolane_core::results::{ProgramEnd, ProgramSummary, WorkloadSummary};

    fn sample(t_s: f64, energy_mj: u64, mem: &[(u32, f64)], util: &[(u32, f64)]) -> Sample {
        Sample {
            t_ns: (t_s * 1e9) as i64,
            reading: Reading {
                energy_counter_mj: Some(energy_mj),
                power_w: Some(100.0),
                process_memory_mib: mem.to_vec(),
                process_sm_util_pct: Some(util.to_vec()),
                ..Reading::default()
            },
        }
    }

    fn program_summary(pids: Vec<u32>) -> RunSummary {
        let mut w = WorkloadSummary::new("serve", "python3 serve.py", 1);
        w.program = Some(ProgramSummary {
            command: vec!["python3".into(), "serve.py".into()],
            end: ProgramEnd::Exited,
            started_s: 0.0,
            ended_s: 2.0,
            cpu_user_s: 0.0,
            cpu_system_s: 0.0,
            cpu_pct: 0.0,
            max_rss_mib: 0.0,
            pids,
            stdout: String::new(),
            stderr: String::new(),
            gpu_share_pct: None,
            energy_j: None,
            energy_source: None,
        });
        let mut s = RunSummary::new("run");
        s.t0_monotonic_ns = Some(0);
        s.workloads.push(w);
        s
    }

    fn recording(samples: Vec<Sample>) -> Recording {
        Recording {
            device: "fake".into(),
            source: "fake",
            period: std::time::Duration::from_millis(50),
            samples,
            cpu_ns: 0,
            wall_ns: 0,
            overruns: 0,
            refresh_every: Vec::new(),
        }
    }

    #[test]
    fn the_tree_memory_is_summed_and_energy_attributed_by_sm_share() {
        // pid 10 and its child 11 are the program's; 99 is a model worker beside it.
        let rec = recording(vec![
            sample(
                0.0,
                0,
                &[(10, 500.0), (99, 800.0)],
                &[(10, 30.0), (99, 60.0)],
            ),
            sample(
                1.0,
                100_000,
                &[(10, 500.0), (11, 300.0), (99, 800.0)],
                &[(10, 20.0), (11, 10.0), (99, 60.0)],
            ),
            sample(2.0, 200_000, &[(99, 800.0)], &[(99, 60.0)]),
        ]);
        let mut s = program_summary(vec![10, 11]);
        attach_programs(&mut s, &rec);
        let w = &s.workloads[0];
        assert_eq!(w.metrics.gpu_memory_mib, Some(800.0));
        let p = w.program.as_ref().unwrap();
        // Own: (30 + 30 + 0) / 3 = 20 %; all: (90 + 90 + 60) / 3 = 80 %.
        assert_eq!(p.gpu_share_pct, Some(20.0));
        let e = p.energy_j.unwrap();
        assert!((e - 200.0 * 0.25).abs() < 1e-6, "{e}");
        assert_eq!(
            p.energy_source,
            Some(ProgramEnergySource::AttributedBySmShare)
        );
    }

    #[test]
    fn without_per_process_utilisation_nothing_is_attributed() {
        let mut a = sample(0.0, 0, &[(10, 500.0)], &[]);
        let mut b = sample(1.0, 100_000, &[(10, 500.0)], &[]);
        a.reading.process_sm_util_pct = None;
        b.reading.process_sm_util_pct = None;
        let mut s = program_summary(vec![10]);
        attach_programs(&mut s, &recording(vec![a, b]));
        let p = s.workloads[0].program.as_ref().unwrap();
        assert_eq!(
            (p.gpu_share_pct, p.energy_j, p.energy_source),
            (None, None, None)
        );
        assert_eq!(s.workloads[0].metrics.gpu_memory_mib, Some(500.0));
    }

    #[test]
    fn a_program_never_named_by_the_driver_is_claimed_nothing() {
        // Only the MPS server (pid 7) is named: the program's own use is unknown, not 0.
        let rec = recording(vec![
            sample(0.0, 0, &[], &[(7, 80.0)]),
            sample(1.0, 1000, &[], &[(7, 80.0)]),
        ]);
        let mut s = program_summary(vec![10]);
        attach_programs(&mut s, &rec);
        let w = &s.workloads[0];
        assert_eq!(w.metrics.gpu_memory_mib, None);
        let p = w.program.as_ref().unwrap();
        assert_eq!(
            (p.gpu_share_pct, p.energy_j, p.energy_source),
            (None, None, None)
        );
    }

    #[test]
    fn with_no_sm_use_at_all_there_is_no_energy_to_share_out() {
        let rec = recording(vec![
            sample(0.0, 0, &[(10, 500.0)], &[(10, 0.0)]),
            sample(1.0, 1000, &[(10, 500.0)], &[(10, 0.0)]),
        ]);
        let mut s = program_summary(vec![10]);
        attach_programs(&mut s, &rec);
        let p = s.workloads[0].program.as_ref().unwrap();
        assert_eq!(p.gpu_share_pct, Some(0.0));
        assert_eq!(p.energy_j, None);
    }
}
