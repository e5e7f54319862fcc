//! The table of a run's command workloads (external programs, docs/programs.md): how each
//! ended and what it used. Attributed values are marked as such, never shown as measured.

use isolane_core::results::{ProgramEnd, ProgramEnergySource, WorkloadSummary};

use crate::{fit, num, right_align_from, table, Layout};

/// One row per command workload of `workloads` (none: `None`): how it ended (exit code or
/// signal, timed out, stopped at duration), wall and CPU time, GPU share, peak device memory
/// of its process tree and energy; an energy shared out by SM use is marked `*`, and a
/// footnote says so.
pub fn programs_table(workloads: &[WorkloadSummary], layout: Layout) -> Option<String> {
    let programs: Vec<&WorkloadSummary> =
        workloads.iter().filter(|w| w.program.is_some()).collect();
    if programs.is_empty() {
        return None;
    }
    let header = [
        "program", "ended", "wall s", "cpu s", "gpu %", "mem MiB", "energy J",
    ];
    let mut t = table(&header);
    let mut attributed = false;
    for w in &programs {
        let Some(p) = &w.program else { continue };
        let energy = match (p.energy_j, p.energy_source) {
            (Some(e), Some(ProgramEnergySource::AttributedBySmShare)) => {
                attributed = true;
                format!("{e:.1}*")
            }
            (e, _) => num(e, 1),
        };
        t.add_row(vec![
            w.name.clone(),
            ended(w),
            format!("{:.2}", w.wall_s),
            format!("{:.2}", p.cpu_user_s + p.cpu_system_s),
            num(p.gpu_share_pct, 1),
            num(w.metrics.gpu_memory_mib, 0),
            energy,
        ]);
    }
    right_align_from(&mut t, 2);
    fit(&mut t, layout);
    let mut out = t.to_string();
    if attributed {
        out.push_str(
            "\n* attributed, not measured: the device's energy over the program's run × its\n  \
             share of the SM use of all processes (NVML has no per-process energy)",
        );
    }
    Some(out)
}

/// "exit 0", "exit 3", "SIGSEGV", "timed out", "stopped at duration", …
pub fn ended(w: &WorkloadSummary) -> String {
    let Some(p) = &w.program else {
        return String::new();
    };
    match (p.end, w.exit_code, w.signal) {
        (ProgramEnd::Exited, Some(code), _) => format!("exit {code}"),
        (ProgramEnd::Killed, _, Some(sig)) => format!("signal {sig}"),
        (end, _, _) => end.words().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use isolane_core::results::ProgramSummary;

    fn program(name: &str, end: ProgramEnd, exit: Option<i32>) -> WorkloadSummary {
        let mut w = WorkloadSummary::new(name, "sh -c true", 1);
        w.exit_code = exit;
        w.wall_s = 0.25;
        w.program = Some(ProgramSummary {
            command: vec!["sh".into(), "-c".into(), "true".into()],
            end,
            started_s: 0.0,
            ended_s: 0.25,
            cpu_user_s: 0.01,
            cpu_system_s: 0.0,
            cpu_pct: 4.0,
            max_rss_mib: 3.0,
            pids: vec![42],
            stdout: format!("{name}.stdout"),
            stderr: format!("{name}.stderr"),
            gpu_share_pct: None,
            energy_j: None,
            energy_source: None,
        });
        w
    }

    #[test]
    fn no_programs_no_table() {
        let w = WorkloadSummary::new("model", "resnet18", 1);
        assert_eq!(programs_table(&[w], Layout::default()), None);
    }

    #[test]
    fn each_program_says_how_it_ended_and_attributed_energy_is_marked() {
        let ok = program("ok", ProgramEnd::Exited, Some(0));
        let hung = program("hung", ProgramEnd::TimedOut, None);
        let mut gpu = program("gpu", ProgramEnd::StoppedAtDuration, None);
        if let Some(p) = gpu.program.as_mut() {
            p.gpu_share_pct = Some(37.5);
            p.energy_j = Some(120.0);
            p.energy_source = Some(ProgramEnergySource::AttributedBySmShare);
        }
        let t = programs_table(&[ok, hung, gpu], Layout::default()).unwrap();
        assert!(t.contains("exit 0"), "{t}");
        assert!(t.contains("timed out"), "{t}");
        assert!(t.contains("stopped at duration"), "{t}");
        assert!(t.contains("37.5"), "{t}");
        assert!(t.contains("120.0*"), "{t}");
        assert!(t.contains("* attributed"), "{t}");
        assert!(t.lines().all(|l| l.chars().count() <= 80), "{t}");
    }
}
