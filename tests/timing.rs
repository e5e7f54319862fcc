//! Acceptance tests of the release loop's timing (issue 2), on `spin:` workloads.
//!
//! They run one at a time (a lock), since each busy-waits a core and CI has two. Bounds are set
//! for a busy 2-core machine; the measured values are printed for the record.
//!
//! This file has its own harness (`harness = false`, libtest2-mimic) because the standard one
//! cannot skip a test at run time: a test whose attempts all ran while the hypervisor took the
//! CPU ([`common::attempts`]) proves nothing either way, and is reported as **ignored**, with the
//! reason, and counted in the "N ignored" of the summary line, instead of reading as passed.
//! `--include-ignored` turns such an outcome into a failure. Output is never captured here (the
//! harness has no capture, and rejects `--nocapture`).

mod common;

use std::sync::Mutex;
use std::time::Instant;

use common::*;
use libtest2_mimic::{RunContext, RunError, RunResult, Trial};

fn main() {
    libtest2_mimic::Harness::with_env()
        .discover([
            Trial::test(
                "spin_4ms_at_100hz_keeps_its_deadlines",
                spin_4ms_at_100hz_keeps_its_deadlines,
            ),
            Trial::test(
                "overload_with_skip_drops_jobs_and_ends_on_schedule",
                overload_with_skip_drops_jobs_and_ends_on_schedule,
            ),
            Trial::test(
                "overload_with_queue_runs_every_job_and_backlog_grows",
                |_| {
                    overload_with_queue_runs_every_job_and_backlog_grows();
                    Ok(())
                },
            ),
        ])
        .main();
}

/// A conclusion as the harness reports it: passed, or ignored with the reason when the host's
/// CPU steal or other processes' load made every attempt inconclusive (a failure under
/// `--include-ignored`).
fn report(cx: RunContext<'_>, c: Conclusion) -> RunResult {
    match c {
        Conclusion::Passed => Ok(()),
        Conclusion::Inconclusive(why) => {
            cx.ignore_for(format!("inconclusive: {why}"))?;
            Err(RunError::fail(format!("inconclusive: {why}")))
        }
    }
}

static SERIAL: Mutex<()> = Mutex::new(());

fn one_workload(rate: &str, jobs: u32, late: &str) -> String {
    format!(
        "[device]\nbackend = \"cpu\"\nmechanism = \"none\"\nhost = \"thread\"\n\n\
         [[workload]]\nname = \"w\"\nmodel = \"spin:4ms\"\nrate_hz = {rate}\njobs = {jobs}\n\
         late = \"{late}\"\n"
    )
}

fn spin_4ms_at_100hz_keeps_its_deadlines(cx: RunContext<'_>) -> RunResult {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let c = attempts(5, || {
        let tmp = tempfile::tempdir().unwrap();
        let sc = scenario(tmp.path(), "s.toml", &one_workload("100", 500, "skip"));
        let out = tmp.path().join("out");
        run_ok(
            isolane()
                .arg("run")
                .arg(&sc)
                .arg("--out")
                .arg(&out)
                .arg("--quiet"),
        );
        let s = summary(&out);
        let w = workload(&s, "w");
        let (p50, pct) = (f(&w["latency_ms"]["p50"]), f(&w["timeout_pct"]));
        let late = &w["start_lateness_us"];
        println!(
            "spin:4ms @100 Hz: p50 {p50:.3} ms, p99 {:.3} ms, max {:.3} ms, timeouts {pct:.2} %, \
         start lateness p50 {:.1} µs p99 {:.1} µs max {:.1} µs",
            f(&w["latency_ms"]["p99"]),
            f(&w["latency_ms"]["max"]),
            f(&late["p50"]),
            f(&late["p99"]),
            f(&late["max"])
        );
        assert_eq!(w["jobs"], 500);
        assert_eq!(w["status"], "ok");
        assert_eq!(jobs_rows(&out, "w").len(), 500);
        check((3.8..=5.0).contains(&p50), || format!("p50 {p50} ms"))?;
        // Zero on an idle machine. A job misses only when its thread is kept off the CPU for more
        // than the 6 ms of slack; with parallel builds on a 2-core box that happened to 1 % of jobs
        // (measured), so the bound is 2 %.
        check(pct <= 2.0, || format!("timeouts {pct} %"))
    });
    report(cx, c)
}

fn overload_with_skip_drops_jobs_and_ends_on_schedule(cx: RunContext<'_>) -> RunResult {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let c = attempts(5, || {
        let tmp = tempfile::tempdir().unwrap();
        let sc = scenario(tmp.path(), "s.toml", &one_workload("300", 500, "skip"));
        let out = tmp.path().join("out");
        run_ok(
            isolane()
                .arg("run")
                .arg(&sc)
                .arg("--out")
                .arg(&out)
                .arg("--quiet"),
        );
        let s = summary(&out);
        let w = workload(&s, "w");
        let pct = f(&w["timeout_pct"]);
        let wall = f(&s["wall_s"]);
        let scheduled = 500.0 / 300.0;
        println!(
        "spin:4ms @300 Hz skip: timeouts {pct:.1} %, wall {wall:.3} s (schedule {scheduled:.3} s)"
    );
        assert!(pct > 99.0, "timeouts {pct} %");
        assert_eq!(w["jobs"], 500);
        // Ends with the schedule: at most one job in flight past the last release, plus slack.
        check(wall < scheduled + 0.2, || format!("wall {wall} s"))?;
        let rows = jobs_rows(&out, "w");
        // A 4 ms job never meets a 3.33 ms deadline, so every job is a timeout; the back-to-back
        // jobs fall behind by 0.67 ms a period, so about every 6th job's deadline has passed before
        // it could start and is skipped (≈ 83 of 500). A disturbed run skips more, never fewer.
        let skipped = rows.iter().filter(|r| r[2].is_empty()).count();
        println!("skipped {skipped} of 500");
        assert!(rows
            .iter()
            .filter(|r| r[2].is_empty())
            .all(|r| r[3].is_empty() && r[5] == "1"));
        check((70..=250).contains(&skipped), || {
            format!("{skipped} skipped")
        })
    });
    report(cx, c)
}

fn overload_with_queue_runs_every_job_and_backlog_grows() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().unwrap();
    let sc = scenario(tmp.path(), "s.toml", &one_workload("300", 500, "queue"));
    let out = tmp.path().join("out");
    let started = Instant::now();
    run_ok(
        isolane()
            .arg("run")
            .arg(&sc)
            .arg("--out")
            .arg(&out)
            .arg("--quiet"),
    );
    println!("queue run took {:.2} s", started.elapsed().as_secs_f64());
    let s = summary(&out);
    let w = workload(&s, "w");
    assert_eq!(w["jobs"], 500);
    assert_eq!(w["completed"], 500);
    let lat: Vec<f64> = jobs_rows(&out, "w")
        .iter()
        .map(|r| r[4].parse::<f64>().unwrap())
        .collect();
    assert_eq!(lat.len(), 500);
    // Deciles of the job sequence: each job adds ~0.67 ms of backlog, so each decile's mean is
    // ~33 ms above the previous one (never less: each queued job ends ≥ 4 ms after the previous
    // one but is released only 3.33 ms after it, so the backlog cannot shrink; a disturbance only
    // adds to it).
    let deciles: Vec<f64> = lat
        .chunks(50)
        .map(|c| c.iter().sum::<f64>() / c.len() as f64)
        .collect();
    println!("queue decile mean latency (ms): {deciles:.1?}");
    for d in deciles.windows(2) {
        assert!(d[1] > d[0] + 10.0, "backlog not growing: {deciles:?}");
    }
    assert!(
        deciles[9] > 250.0 && deciles[9] > 3.0 * deciles[0],
        "{deciles:?}"
    );
}
