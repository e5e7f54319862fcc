//! A run's timeline in the report: a window of the run around its worst job, each workload a
//! lane of job bars (start to end), drawn as inline SVG by hand (the chart library has no bar
//! spans on a time axis). The whole run, for Perfetto, is `isolane trace`.

use std::fmt::Write as _;

use isolane_trace::{Job, Step};

use crate::html::escape;
use crate::plot::PALETTE;

/// What the report keeps of a run's jobs: the window and the jobs in it.
#[derive(Debug, Clone, PartialEq)]
pub struct TimelineWindow {
    pub from_ms: f64,
    pub to_ms: f64,
    /// Per workload (summary order): its jobs that overlap the window.
    pub lanes: Vec<(String, Vec<Job>)>,
    /// Isolation steps that overlap the window.
    pub steps: Vec<Step>,
    /// The worst job: (lane, job index, response time ms).
    pub worst: (usize, u64, f64),
}

/// Periods of the fastest workload a window shows ...
const WINDOW_PERIODS: f64 = 25.0;
/// ... and at least this many times the worst response time, so the worst job and what ran
/// beside it before and after are both in view.
const WINDOW_WORST: f64 = 8.0;

/// The median gap between a lane's releases (ms), `None` with fewer than 2 jobs.
fn median_period_ms(jobs: &[Job]) -> Option<f64> {
    let mut gaps: Vec<f64> = jobs
        .windows(2)
        .map(|w| w[1].release_ms - w[0].release_ms)
        .filter(|g| *g > 0.0)
        .collect();
    gaps.sort_by(f64::total_cmp);
    gaps.get(gaps.len() / 2).copied()
}

/// The window around the worst job: [`WINDOW_PERIODS`] periods of the fastest workload (at
/// least [`WINDOW_WORST`] × the worst response time), from a quarter of it before the worst
/// job's release. `None` when no job completed.
pub fn window(lanes: Vec<(String, Vec<Job>)>, steps: &[Step]) -> Option<TimelineWindow> {
    let worst = lanes
        .iter()
        .enumerate()
        .flat_map(|(i, (_, jobs))| jobs.iter().map(move |j| (i, j)))
        .filter_map(|(i, j)| j.latency_ms.map(|l| (i, j, l)))
        .max_by(|a, b| a.2.total_cmp(&b.2))
        .map(|(i, j, l)| (i, j.index, l, j.release_ms))?;
    let period = lanes
        .iter()
        .filter_map(|(_, jobs)| median_period_ms(jobs))
        .fold(f64::INFINITY, f64::min);
    let period = if period.is_finite() { period } else { worst.2 };
    let width = (WINDOW_PERIODS * period).max(WINDOW_WORST * worst.2);
    let from_ms = (worst.3 - width / 4.0).max(0.0);
    let to_ms = from_ms + width;
    let inside = |j: &Job| {
        let end = j.end_ms.unwrap_or(j.release_ms);
        end >= from_ms && j.release_ms <= to_ms
    };
    Some(TimelineWindow {
        from_ms,
        to_ms,
        lanes: lanes
            .into_iter()
            .map(|(name, jobs)| (name, jobs.into_iter().filter(|j| inside(j)).collect()))
            .collect(),
        steps: steps
            .iter()
            .filter(|s| s.end_ms >= from_ms && s.start_ms <= to_ms)
            .cloned()
            .collect(),
        worst: (worst.0, worst.1, worst.2),
    })
}

const WIDTH: f64 = 1300.0;
const LEFT: f64 = 150.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 56.0;
const LANE: f64 = 34.0;
const AXIS: f64 = 50.0;

fn hex(i: usize) -> String {
    let (r, g, b) = PALETTE[i % PALETTE.len()];
    format!("#{r:02X}{g:02X}{b:02X}")
}

/// The window as an SVG drawing: title, a lane per workload with its name, job bars in the
/// workload's colour (a missed deadline outlined in black, a skipped job a black ×, a hold a
/// grey bar from the release), release ticks, step boundaries, a time axis.
pub fn svg(title: &str, w: &TimelineWindow) -> String {
    let height = TOP + LANE * w.lanes.len() as f64 + AXIS;
    let span = (w.to_ms - w.from_ms).max(1e-9);
    let x = |ms: f64| LEFT + (ms - w.from_ms).clamp(0.0, span) / span * (WIDTH - LEFT - RIGHT);
    let mut s = String::new();
    let _ = write!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{height}\" \
         viewBox=\"0 0 {WIDTH} {height}\" font-family=\"sans-serif\">\
         <rect width=\"{WIDTH}\" height=\"{height}\" fill=\"#FFFFFF\"/>\
         <text x=\"{}\" y=\"22\" font-size=\"16\" text-anchor=\"middle\">{}</text>\
         <text x=\"{}\" y=\"40\" font-size=\"11\" text-anchor=\"middle\" fill=\"#555555\">\
         bars: jobs from start to end · outlined: missed deadline · ×: skipped · grey: held \
         back · ticks: releases</text>",
        WIDTH / 2.0,
        escape(title),
        WIDTH / 2.0,
    );
    for st in &w.steps {
        let sx = x(st.start_ms);
        let _ = write!(
            s,
            "<line x1=\"{sx:.1}\" x2=\"{sx:.1}\" y1=\"{TOP}\" y2=\"{:.1}\" stroke=\"#999999\" \
             stroke-dasharray=\"4 3\"/><text x=\"{:.1}\" y=\"{:.1}\" font-size=\"10\" \
             fill=\"#555555\">step {} · {:.0} Hz</text>",
            height - AXIS,
            sx + 3.0,
            TOP - 3.0,
            st.step,
            st.interferer_rate_hz
        );
    }
    for (i, (name, jobs)) in w.lanes.iter().enumerate() {
        lane(&mut s, i, name, jobs, w, &x);
    }
    axis(&mut s, w, height, &x);
    s.push_str("</svg>");
    s
}

fn lane(
    s: &mut String,
    i: usize,
    name: &str,
    jobs: &[Job],
    w: &TimelineWindow,
    x: &impl Fn(f64) -> f64,
) {
    let top = TOP + LANE * i as f64;
    let color = hex(i);
    let _ = write!(
        s,
        "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"12\" text-anchor=\"end\">{}</text>",
        LEFT - 8.0,
        top + LANE / 2.0 + 4.0,
        escape(name)
    );
    let mut worst = String::new();
    for j in jobs {
        let rx = x(j.release_ms);
        let _ = write!(
            s,
            "<line x1=\"{rx:.1}\" x2=\"{rx:.1}\" y1=\"{:.1}\" y2=\"{:.1}\" stroke=\"#777777\"/>",
            top + 2.0,
            top + 8.0
        );
        if let Some(h) = j.held_ms.filter(|h| *h > 0.0) {
            let _ = write!(
                s,
                "<rect x=\"{rx:.1}\" y=\"{:.1}\" width=\"{:.2}\" height=\"6\" fill=\"#BBBBBB\"/>",
                top + LANE - 10.0,
                (x(j.release_ms + h) - rx).max(0.5)
            );
        }
        let (Some(start), Some(end)) = (j.start_ms, j.end_ms) else {
            let _ = write!(
                s,
                "<path d=\"M{:.1} {:.1}l8 8m0 -8l-8 8\" stroke=\"#000000\" stroke-width=\"1.5\"/>",
                rx - 4.0,
                top + 10.0
            );
            continue;
        };
        let (x0, x1) = (x(start), x(end));
        let outline = if j.timeout {
            " stroke=\"#000000\" stroke-width=\"1.5\""
        } else {
            ""
        };
        let is_worst = (i, j.index) == (w.worst.0, w.worst.1);
        let _ = write!(
            s,
            "<rect data-job=\"{}\" x=\"{x0:.2}\" y=\"{:.1}\" width=\"{:.2}\" height=\"{:.1}\" \
             fill=\"{color}\"{outline}><title>{} job {}: {:.3} ms{}</title></rect>",
            j.index,
            top + 10.0,
            (x1 - x0).max(0.5),
            LANE - 22.0,
            escape(name),
            j.index,
            j.latency_ms.unwrap_or(end - j.release_ms),
            if j.timeout {
                ", missed its deadline"
            } else {
                ""
            }
        );
        if is_worst {
            // Drawn last, above the bars: a marker over the worst bar and its response time.
            worst = format!(
                "<path d=\"M{x0:.1} {:.1}l5 -7h-10z\" fill=\"#000000\"/><text x=\"{:.1}\" \
                 y=\"{:.1}\" font-size=\"11\" font-weight=\"bold\">worst: {:.3} ms</text>",
                top + 9.0,
                x0 + 8.0,
                top + 8.0,
                w.worst.2
            );
        }
    }
    s.push_str(&worst);
}

/// The time axis: a line, 6 ticks with their times, the axis name.
fn axis(s: &mut String, w: &TimelineWindow, height: f64, x: &impl Fn(f64) -> f64) {
    let y = height - AXIS + 4.0;
    let _ = write!(
        s,
        "<line x1=\"{LEFT}\" x2=\"{:.1}\" y1=\"{y}\" y2=\"{y}\" stroke=\"#333333\"/>",
        WIDTH - RIGHT
    );
    let span = w.to_ms - w.from_ms;
    let digits = if span < 10.0 { 2 } else { 1 };
    for k in 0..=5 {
        let ms = w.from_ms + span * f64::from(k) / 5.0;
        let tx = x(ms);
        let _ = write!(
            s,
            "<line x1=\"{tx:.1}\" x2=\"{tx:.1}\" y1=\"{y}\" y2=\"{:.1}\" stroke=\"#333333\"/>\
             <text x=\"{tx:.1}\" y=\"{:.1}\" font-size=\"11\" text-anchor=\"middle\">\
             {ms:.digits$}</text>",
            y + 5.0,
            y + 18.0
        );
    }
    let _ = write!(
        s,
        "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"12\" text-anchor=\"middle\">time since t0 \
         (ms)</text>",
        (LEFT + WIDTH - RIGHT) / 2.0,
        height - 8.0
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(index: u64, release: f64, latency: Option<f64>) -> Job {
        Job {
            index,
            release_ms: release,
            start_ms: latency.map(|_| release),
            end_ms: latency.map(|l| release + l),
            latency_ms: latency,
            timeout: latency.is_none_or(|l| l > 4.0),
            held_ms: None,
        }
    }

    #[test]
    fn the_window_is_25_periods_around_the_worst_job() {
        // 5 ms period, 1 ms jobs, the worst (job 300) takes 9 ms.
        let jobs: Vec<Job> = (0..1000)
            .map(|k| job(k, k as f64 * 5.0, Some(if k == 300 { 9.0 } else { 1.0 })))
            .collect();
        let w = window(vec![("a".into(), jobs)], &[]).unwrap();
        assert_eq!(w.worst, (0, 300, 9.0));
        assert_eq!((w.from_ms, w.to_ms), (1500.0 - 31.25, 1500.0 + 93.75));
        let kept: Vec<u64> = w.lanes[0].1.iter().map(|j| j.index).collect();
        assert_eq!(kept.first(), Some(&294));
        assert_eq!(kept.last(), Some(&318));
        // A worst job far longer than the period widens the window to 8× it.
        let long = vec![job(0, 0.0, Some(100.0)), job(1, 5.0, Some(1.0))];
        let w = window(vec![("a".into(), long)], &[]).unwrap();
        assert_eq!(w.to_ms - w.from_ms, 800.0);
    }

    #[test]
    fn no_completed_job_means_no_timeline() {
        assert_eq!(
            window(vec![("a".into(), vec![job(0, 0.0, None)])], &[]),
            None
        );
    }

    #[test]
    fn the_drawing_marks_jobs_timeouts_skips_and_holds() {
        let mut held = job(2, 10.0, Some(1.0));
        held.held_ms = Some(0.5);
        let jobs = vec![
            job(0, 0.0, Some(1.0)),
            job(1, 5.0, Some(6.0)),
            held,
            job(3, 15.0, None),
        ];
        let w = window(vec![("cam<1>".into(), jobs)], &[]).unwrap();
        let svg = svg("t", &w);
        assert_eq!(svg.matches("<rect data-job=").count(), 3);
        assert_eq!(
            svg.matches("stroke=\"#000000\" stroke-width=\"1.5\"><title>")
                .count(),
            1
        );
        assert!(svg.contains("fill=\"#BBBBBB\""), "the hold");
        assert!(svg.contains("l8 8m0 -8l-8 8"), "the skip");
        assert!(svg.contains("cam&lt;1&gt;"), "names are escaped");
        assert!(svg.contains("worst: 6.000 ms"));
    }
}
