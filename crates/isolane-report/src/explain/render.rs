//! What `isolane explain` prints of an explanation: per workload its late share and the
//! causes' table, each neighbour's memory figures, the copy engine's note; prose wrapped to the
//! tables' 80 columns unless wide.

use super::{Explanation, WorkloadExplanation};

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

/// Busy this much of its run (%), a workload has too little idle time to absorb a slow job:
/// explain says so.
const BUSY_QUEUES_PCT: f64 = 90.0;

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
            crate::ms(w.typical_service_ms),
            w.typical_from
        ),
        wide,
    ));
    if let Some(b) = w.busy_pct {
        let queue = if b >= BUSY_QUEUES_PCT {
            ": a job over its typical delays the ones after it, and a few per cent more on \
             every job queue them for good"
        } else {
            ""
        };
        s.push_str(&wrapped(&format!("busy {b:.1} % of its run{queue}"), wide));
    }
    let rows: Vec<Vec<String>> = w
        .causes
        .iter()
        .map(|c| {
            vec![
                c.cause.words(),
                format!("{:.2}", c.late_pct.unwrap_or(0.0)),
                crate::ms(Some(c.time_ms)),
            ]
        })
        .collect();
    let header = ["cause", "late %", "time ms"];
    s.push_str(&if wide {
        crate::wide_table(&header, &rows, &[0])
    } else {
        crate::plain_table(&header, &rows, &[0])
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
    let width = usize::from(crate::TERMINAL_COLUMNS) - INDENT.len();
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
