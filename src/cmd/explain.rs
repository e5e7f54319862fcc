//! `isolane explain RUN_DIR`: each late job's time attributed to its causes, per workload a
//! table, written to RUN_DIR/explain.json (isolane_report::explain; docs/criticality.md).

use std::path::PathBuf;

use clap::Args;
use isolane_report::explain::{self, Explanation, MemoryProfiles, WorkloadExplanation};

use super::user;

#[derive(Args)]
#[command(
    about = "Say why a run's late jobs were late: neighbours, host, guard, own service time",
    long_about = "Reads the run or isolation folder RUN_DIR (summary.json, scenario.toml, \
                  jobs/*.csv) and attributes each late job (a timeout, skipped ones included) \
                  to its causes, as time: the neighbour workloads that ran beside it (sharing \
                  its GPU, whose memory system partitions do not split, or its CPU cores), named, \
                  with their memory intensity when --memory gives it; the host (a start later \
                  than the job could start, with no neighbour on its cores); the criticality \
                  guard's holds (held_ms); and its own service time beyond its typical (the \
                  median of its jobs that ran with no neighbour beside them, or of its jobs in a \
                  run alone given with --alone). A job queued behind \
                  its own earlier job inherits that job's causes. Each late job counts once, \
                  split among its causes by their time, so per workload the causes' shares add \
                  up to its late %. Prints a table per workload and writes RUN_DIR/explain.json \
                  (rewritten each time; no other file is touched), which isolane report draws. \
                  Copy-engine waits are not in the job records: said so. See \
                  docs/criticality.md, \"Why jobs were late\". RUN_DIR without what is \
                  needed (summary.json, scenario.toml, a jobs/<workload>.csv) is refused with \
                  what is missing (exit 2)."
)]
pub struct ExplainArgs {
    /// A run or isolation results folder (holds summary.json and jobs/).
    pub run_dir: PathBuf,
    /// Models' memory-system figures (TOML: [[model]] entries with model, dram_gb_s, l2_mib,
    /// source), to name each neighbour's memory intensity; without it, "unknown".
    #[arg(long, value_name = "FILE")]
    pub memory: Option<PathBuf>,
    /// A run folder of the workloads alone (repeatable): each workload's typical service time
    /// is then taken from its jobs there, not from the run's own (where every job may have run
    /// beside a neighbour); a workload none of them has keeps its own.
    #[arg(long, value_name = "DIR")]
    pub alone: Vec<PathBuf>,
    /// Every column at its natural width (no fitting to 80 columns).
    #[arg(long)]
    pub wide: bool,
}

pub fn run(args: ExplainArgs) -> anyhow::Result<u8> {
    let profiles = match &args.memory {
        Some(p) => Some((p.as_path(), MemoryProfiles::load(p).map_err(user)?)),
        None => None,
    };
    let e = explain::explain_dir(
        &args.run_dir,
        profiles.as_ref().map(|(p, m)| (*p, m)),
        &args.alone,
    )
    .map_err(user)?;
    print!("{}", render(&e, args.wide));
    let path = explain::write_explanation(&args.run_dir, &e)?;
    println!("explain: {}", path.display());
    Ok(0)
}

/// Per workload its late share and the causes' table; then each neighbour's memory figures
/// and the copy engine's note.
pub fn render(e: &Explanation, wide: bool) -> String {
    let mut out = String::new();
    for w in &e.workloads {
        out.push_str(&workload_text(w, wide, e.memory_profiles.is_some()));
    }
    out.push_str(&format!("copy-engine waits: {}\n", e.copy_engine));
    out
}

fn workload_text(w: &WorkloadExplanation, wide: bool, profiles: bool) -> String {
    let mut s = String::new();
    if w.late == 0 {
        let why = if w.deadline_ms.is_none() {
            " (no deadline)"
        } else {
            ""
        };
        s.push_str(&format!("{}: no late job of {}{why}\n", w.name, w.jobs));
        return s;
    }
    s.push_str(&format!(
        "{}: {} of {} jobs late ({:.2} %)\n",
        w.name, w.late, w.jobs, w.late_pct
    ));
    s.push_str(&wrapped(
        &format!(
            "typical service {} ms: {}",
            isolane_report::ms(w.typical_service_ms),
            w.typical_from
        ),
        wide,
    ));
    let rows: Vec<Vec<String>> = w
        .causes
        .iter()
        .map(|c| {
            vec![
                c.cause.words(),
                format!("{:.2}", c.late_pct.unwrap_or(0.0)),
                isolane_report::ms(Some(c.time_ms)),
            ]
        })
        .collect();
    let header = ["cause", "late %", "time ms"];
    s.push_str(&if wide {
        isolane_report::wide_table(&header, &rows, &[0])
    } else {
        isolane_report::plain_table(&header, &rows, &[0])
    });
    s.push('\n');
    for n in &w.neighbours {
        let memory = match &n.memory {
            Some(m) => format!("memory: {}", m.words()),
            None if profiles => "memory intensity unknown (not in the --memory file)".into(),
            None => "memory intensity unknown (no --memory file)".into(),
        };
        s.push_str(&wrapped(
            &format!("{} ({}) shares {}; {memory}", n.name, n.model, n.shares),
            wide,
        ));
    }
    s
}

/// `text` indented by two spaces, wrapped at word boundaries to the tables' 80 columns
/// unless `wide`.
fn wrapped(text: &str, wide: bool) -> String {
    const INDENT: &str = "  ";
    if wide {
        return format!("{INDENT}{text}\n");
    }
    let width = usize::from(isolane_report::TERMINAL_COLUMNS) - INDENT.len();
    let mut out = String::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > width {
            out.push_str(&format!("{INDENT}{line}\n"));
            line.clear();
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        out.push_str(&format!("{INDENT}{line}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prose_lines_fit_80_columns_unless_wide() {
        let text = "typical service 3.002 ms: the median of all 200 completed jobs (only 1 \
                    ran with no neighbour beside it; fewer than 10)";
        let w = wrapped(text, false);
        assert!(w.lines().count() > 1, "{w}");
        assert!(
            w.lines()
                .all(|l| l.chars().count() <= 80 && l.starts_with("  ")),
            "{w}"
        );
        assert_eq!(
            w.split_whitespace().collect::<Vec<_>>(),
            text.split_whitespace().collect::<Vec<_>>()
        );
        assert_eq!(wrapped(text, true).lines().count(), 1);
    }
}
