//! What a person sees of a run, a max-rate search and a profile run on a terminal: a run's bar
//! ([`ProgressView`]). Progress of a max-rate search: the time it should take, said up front, and a
//! spinner per batch with the time left at least. Off the terminal (piped, CI logs) only the
//! up-front estimate is printed, once, on stderr. The profile runs of `plan --auto` the same
//! way: a bar of jobs with the time left on a terminal, plain lines otherwise
//! ([`ProfileProgress`]).

use std::io::IsTerminal;
use std::time::Duration;

use isolane_runtime::maxrate::SearchEvent;

/// Whether a bar may be drawn: not asked to be quiet, and stderr (where bars go) a terminal.
pub fn bar_allowed(quiet: bool) -> bool {
    !quiet && std::io::stderr().is_terminal()
}

/// The search's size: N jobs per batch, K validation batches.
#[derive(Debug, Clone, Copy)]
pub struct SearchSize {
    pub jobs: u64,
    pub validations: u32,
}

impl SearchSize {
    /// Seconds of the shortest possible search when one job takes `per_job_s`: the
    /// back-to-back batch, one search batch and K validation batches, each of N jobs at
    /// about one job per `per_job_s`.
    pub fn least_s(self, per_job_s: f64) -> f64 {
        self.batch_s(per_job_s) * (2.0 + f64::from(self.validations))
    }

    /// Seconds of one batch of N jobs.
    pub fn batch_s(self, per_job_s: f64) -> f64 {
        self.jobs as f64 * per_job_s
    }

    /// A smaller search the user can ask for: N / 5 (at least 50) and one validation batch;
    /// `None` when this one is already that small.
    pub fn quicker(self) -> Option<SearchSize> {
        let q = SearchSize {
            jobs: (self.jobs / 5).max(50),
            validations: self.validations.min(1),
        };
        (q.jobs < self.jobs || q.validations < self.validations).then_some(q)
    }
}

/// `42 s`, `3 min 20 s`, `1 h 5 min`.
pub fn duration_text(s: f64) -> String {
    let s = s.max(0.0).round() as u64;
    match s {
        0..=59 => format!("{s} s"),
        60..=3599 => format!("{} min {} s", s / 60, s % 60),
        _ => format!("{} h {} min", s / 3600, (s % 3600) / 60),
    }
}

/// What `maxrate` says before it starts, from the median time of the warm-up jobs.
pub fn estimate_text(size: SearchSize, per_job_s: f64) -> String {
    // Short lines: the note reads whole in an 80-column terminal.
    let mut s = format!(
        "maxrate: one job takes ~{:.2} ms here: the search takes at least ~{}\n  \
         (a back-to-back batch, 1 search batch and {} validation {} of {} jobs;\n  \
         each further search step ~{})",
        per_job_s * 1e3,
        duration_text(size.least_s(per_job_s)),
        size.validations,
        if size.validations == 1 {
            "batch"
        } else {
            "batches"
        },
        size.jobs,
        duration_text(size.batch_s(per_job_s)),
    );
    if let Some(q) = size.quicker() {
        s.push_str(&format!(
            "\n  quicker, coarser: --jobs {} --validations {} (at least ~{})",
            q.jobs,
            q.validations,
            duration_text(q.least_s(per_job_s)),
        ));
    }
    s
}

/// Median of the warm-up job times, seconds (`None` without warm-up jobs).
pub fn median_s(times: &[f64]) -> Option<f64> {
    let mut t: Vec<f64> = times.iter().copied().filter(|x| x.is_finite()).collect();
    if t.is_empty() {
        return None;
    }
    t.sort_by(f64::total_cmp);
    Some(t[t.len() / 2])
}

/// Shows a search as it goes: the estimate once the warm-up jobs ran, then each batch on a
/// spinner: its number, rate and misses, and the time left at least (the K validation batches
/// still to come, plus one search batch before the first miss). Fed the search's events, from
/// this process or from the worker that searches in an MPS client.
pub struct SearchProgress {
    size: SearchSize,
    quiet: bool,
    bar: Option<indicatif::ProgressBar>,
    batches: u32,
    /// Clean batches in a row since the first miss (validation progress).
    clean_since_miss: Option<u32>,
}

impl SearchProgress {
    pub fn new(size: SearchSize, quiet: bool) -> Self {
        SearchProgress {
            size,
            quiet,
            bar: None,
            batches: 0,
            clean_since_miss: None,
        }
    }

    pub fn observe(&mut self, event: &SearchEvent) {
        match event {
            SearchEvent::WarmedUp { job_s } => {
                if let (false, Some(per_job_s)) = (self.quiet, median_s(job_s)) {
                    eprintln!("{}", estimate_text(self.size, per_job_s));
                }
                // After the estimate, so that the spinner does not overwrite it.
                self.bar = bar_allowed(self.quiet).then(spinner);
            }
            SearchEvent::BackToBack { jobs } => self.show(format!(
                "batch 1: {jobs} jobs back to back for the initial rate"
            )),
            SearchEvent::AtRate { jobs, rate_hz } => {
                self.batches += 1;
                let batch_s = *jobs as f64 / rate_hz;
                self.show(format!(
                    "batch {}: {jobs} jobs at {rate_hz:.2} /s (~{} each; at least ~{} left)",
                    self.batches + 1,
                    duration_text(batch_s),
                    duration_text(batch_s * f64::from(self.batches_left())),
                ));
            }
            SearchEvent::BatchDone { outcome } => {
                self.clean_since_miss = match (self.clean_since_miss, outcome.violations) {
                    (_, v) if v > 0 => Some(0),
                    (Some(c), _) => Some(c + 1),
                    (None, _) => None,
                };
            }
        }
    }

    fn show(&self, msg: String) {
        if let Some(bar) = &self.bar {
            bar.set_message(msg);
        }
    }

    /// Batches still to come at least, after the ones seen so far.
    fn batches_left(&self) -> u32 {
        match self.clean_since_miss {
            None => 1 + self.size.validations,
            Some(clean) => self.size.validations.saturating_sub(clean),
        }
    }

    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

/// One profile run of `plan --auto` as it goes: on a terminal a bar of its jobs with the time
/// left (indicatif's, from the jobs done so far); off one a line when it starts and, once its
/// first jobs have run, a line with the time it should take. Fed the run's progress (the
/// session's `Observer`); warnings and notes go to stderr as a run's do.
pub struct ProfileProgress {
    what: String,
    /// Jobs the run times (after its warm-up).
    jobs: u64,
    bar: Option<indicatif::ProgressBar>,
    /// Off a terminal: whether the estimate line was printed.
    estimated: bool,
}

/// Seconds into a profile run before its pace is trusted for an estimate (the first jobs are
/// slower: caches, the CPU's frequency).
const ESTIMATE_AFTER_S: f64 = 1.0;

impl ProfileProgress {
    /// `what`: the workload and partition (`camera in one core`); `expected_s`: how long the
    /// run should take, where an earlier profile of the workload says (`None`: not known yet).
    pub fn start(what: &str, jobs: u64, expected_s: Option<f64>, quiet: bool) -> Self {
        let bar = bar_allowed(quiet).then(|| {
            let bar = indicatif::ProgressBar::new(jobs);
            if let Ok(style) = indicatif::ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {msg} {wide_bar} {pos}/{len} jobs ~{eta} left",
            ) {
                bar.set_style(style);
            }
            bar.set_message(format!("profiling {what}"));
            bar.enable_steady_tick(Duration::from_millis(200));
            bar
        });
        if bar.is_none() && !quiet {
            eprintln!("{}", start_line(what, jobs, expected_s));
        }
        ProfileProgress {
            what: what.to_string(),
            jobs,
            bar,
            estimated: quiet || expected_s.is_some(),
        }
    }

    pub fn update(&mut self, jobs_done: u64, elapsed_s: f64) {
        if let Some(bar) = &self.bar {
            bar.set_position(jobs_done.min(self.jobs));
            return;
        }
        if self.estimated || elapsed_s < ESTIMATE_AFTER_S || jobs_done == 0 {
            return;
        }
        self.estimated = true;
        let per_job = elapsed_s / jobs_done as f64;
        eprintln!(
            "  {}: ~{} per job here, ~{} left",
            self.what,
            ms_text(per_job),
            duration_text(per_job * self.jobs.saturating_sub(jobs_done) as f64)
        );
    }

    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

impl crate::Observer for ProfileProgress {
    fn progress(&mut self, p: &isolane_runtime::coordinator::Progress) {
        self.update(p.jobs_done, p.elapsed_s);
    }

    fn finished(&mut self) {
        self.finish();
    }

    fn warning(&mut self, message: &str) {
        self.print(&format!("warning: {message}"));
    }

    fn note(&mut self, message: &str) {
        self.print(message);
    }
}

impl ProfileProgress {
    /// A line above the bar (or on stderr without one).
    fn print(&self, line: &str) {
        match &self.bar {
            Some(bar) => bar.println(line),
            None => eprintln!("{line}"),
        }
    }
}

/// What a profile run says when it starts off a terminal.
pub fn start_line(what: &str, jobs: u64, expected_s: Option<f64>) -> String {
    let eta = match expected_s {
        Some(s) => format!("~{}", duration_text(s)),
        None => "time said once its first jobs ran".to_string(),
    };
    format!("profiling {what}: {jobs} jobs back to back ({eta})")
}

/// `41.2 ms`, `850 µs`.
fn ms_text(s: f64) -> String {
    if s >= 1e-3 {
        format!("{:.1} ms", s * 1e3)
    } else {
        format!("{:.0} µs", s * 1e6)
    }
}

fn spinner() -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new_spinner();
    if let Ok(style) =
        indicatif::ProgressStyle::with_template("{spinner} [{elapsed_precise}] {msg}")
    {
        bar.set_style(style);
    }
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

/// A progress bar on stderr with the time left (the run's planned length, or its jobs, done so
/// far), only when stdout is a terminal and not `--quiet`: piped output stays clean.
pub struct ProgressView {
    bar: Option<indicatif::ProgressBar>,
}

impl ProgressView {
    pub fn new(quiet: bool) -> Self {
        let bar = (!quiet && std::io::stdout().is_terminal()).then(|| {
            let bar = indicatif::ProgressBar::new(1000);
            if let Ok(style) = indicatif::ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {wide_bar} {percent:>3}% ~{eta} left, {msg}",
            ) {
                bar.set_style(style);
            }
            bar
        });
        ProgressView { bar }
    }

    pub fn update(&self, p: &isolane_runtime::coordinator::Progress) {
        let Some(bar) = &self.bar else { return };
        let frac = match (p.planned_s, p.jobs_expected) {
            (Some(s), _) if s > 0.0 => p.elapsed_s / s,
            (_, Some(n)) if n > 0 => p.jobs_done as f64 / n as f64,
            _ => 0.0,
        };
        bar.set_position((frac.clamp(0.0, 1.0) * 1000.0) as u64);
        bar.set_message(format!("{} jobs", p.jobs_done));
    }

    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

/// What a run shows a person: the progress bar on stdout, warnings and notes on stderr.
impl crate::Observer for ProgressView {
    fn progress(&mut self, p: &isolane_runtime::coordinator::Progress) {
        self.update(p);
    }

    fn finished(&mut self) {
        self.finish();
    }

    fn warning(&mut self, message: &str) {
        eprintln!("warning: {message}");
    }

    fn note(&mut self, message: &str) {
        eprintln!("{message}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use isolane_core::maxrate::BatchOutcome;

    #[test]
    fn the_estimate_names_the_least_time_and_a_quicker_search() {
        let size = SearchSize {
            jobs: 1000,
            validations: 3,
        };
        // 4 ms per job: 5 batches of 4 s at least.
        assert_eq!(size.least_s(0.004), 20.0);
        let text = estimate_text(size, 0.004);
        assert!(text.contains("~4.00 ms"), "{text}");
        assert!(text.contains("at least ~20 s"), "{text}");
        assert!(
            text.contains("--jobs 200 --validations 1 (at least ~2 s)"),
            "{text}"
        );
        let small = SearchSize {
            jobs: 50,
            validations: 1,
        };
        assert!(small.quicker().is_none());
        assert!(!estimate_text(small, 0.004).contains("quicker"));
        let widest = text.lines().map(|l| l.chars().count()).max().unwrap_or(0);
        assert!(widest <= 80, "{widest} columns:\n{text}");
    }

    #[test]
    fn durations_read_as_a_person_would_say_them() {
        assert_eq!(duration_text(42.4), "42 s");
        assert_eq!(duration_text(337.0), "5 min 37 s");
        assert_eq!(duration_text(3900.0), "1 h 5 min");
    }

    fn batch(jobs: u64, rate_hz: f64, violations: u64) -> [SearchEvent; 2] {
        [
            SearchEvent::AtRate { jobs, rate_hz },
            SearchEvent::BatchDone {
                outcome: BatchOutcome { jobs, violations },
            },
        ]
    }

    #[test]
    fn a_profile_run_off_a_terminal_says_when_it_starts_and_how_long_it_takes() {
        assert_eq!(
            start_line("camera in one core", 1000, Some(42.0)),
            "profiling camera in one core: 1000 jobs back to back (~42 s)"
        );
        assert!(start_line("camera in one core", 1000, None).contains("once its first jobs ran"));
        // Quiet: no bar, no line.
        let mut p = ProfileProgress::start("camera in one core", 1000, None, true);
        assert!(p.bar.is_none());
        p.update(10, 2.0);
        // Not quiet, off a terminal (cargo test's stderr is captured): the estimate waits for
        // the run's pace, then is said once.
        let mut p = ProfileProgress {
            what: "camera in one core".into(),
            jobs: 1000,
            bar: None,
            estimated: false,
        };
        p.update(3, 0.5);
        assert!(!p.estimated, "too early to trust the pace");
        p.update(25, 1.0);
        assert!(p.estimated);
        assert_eq!(ms_text(0.0412), "41.2 ms");
        assert_eq!(ms_text(0.00085), "850 µs");
    }

    #[test]
    fn the_batches_left_count_down_through_the_validation() {
        let size = SearchSize {
            jobs: 10,
            validations: 3,
        };
        let mut p = SearchProgress::new(size, true);
        assert_eq!(p.batches_left(), 4);
        batch(10, 90.0, 0).iter().for_each(|e| p.observe(e));
        assert_eq!(p.batches_left(), 4, "still searching");
        batch(10, 101.0, 1).iter().for_each(|e| p.observe(e));
        assert_eq!(p.batches_left(), 3, "a miss: K validations to go");
        batch(10, 100.0, 0).iter().for_each(|e| p.observe(e));
        assert_eq!(p.batches_left(), 2);
        assert_eq!(p.batches, 3);
    }
}
