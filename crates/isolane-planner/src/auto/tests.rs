use std::path::{Path, PathBuf};
use std::time::Duration;

use isolane_core::device_model::DeviceModel;
use isolane_core::results::RunSummary;
use isolane_core::spec::{Mechanism, NoBuiltinModels, Scenario};

use super::events::{comparison_lines, late_start_note, spare_words};
use super::rounds::{
    calibrated, measured_added_p99, measured_stretch, planned_choices, repredict, sizes, verdict,
};
use super::*;
use crate::cache::DeviceRecord;
use crate::{Choice, Demand, GpusPlan, Ladder, Options, Outcome, Point, ProfileCache};

fn here(model: &str, mig_on: Option<bool>, cache: &Path) -> Target {
    let device = isolane_core::device_model::device_model(model).unwrap();
    Target::Here {
        record: DeviceRecord {
            gpu: "NVIDIA H100 80GB HBM3".into(),
            driver: "580.159.04".into(),
            device_model: device.name.into(),
        },
        device,
        cache: ProfileCache::new(cache),
        mig_on,
        gpu: 0,
    }
}

/// The committed H100 verification run of three-cameras (session 9).
fn three_cameras_run() -> RunSummary {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../results/h100-planner");
    isolane_core::results::read_json(&dir.join("verify-three-cameras/summary.json")).unwrap()
}

fn measured_p99(summary: &RunSummary, name: &str) -> f64 {
    let w = summary.workloads.iter().find(|w| w.name == name).unwrap();
    w.metrics.latency_ms.p99.unwrap()
}

/// Keeps what the loop says, as the CLI would print it.
#[derive(Default)]
struct Said(Vec<(Stream, String)>);

impl Observer for Said {
    fn event(&mut self, event: &Event<'_>) {
        self.0.push((event.stream(), event.text()));
    }
}

impl Said {
    /// Whether something said on `stream` holds `text`, wrapped lines joined.
    fn any(&self, stream: Stream, text: &str) -> bool {
        let flat = |t: &str| t.split_whitespace().collect::<Vec<_>>().join(" ");
        (self.0.iter()).any(|(s, t)| *s == stream && flat(t).contains(&flat(text)))
    }
}

/// A bench without an engine: each workload alone takes 64 / size ms for every statistic, and
/// verification run `k` measures what `runs[k - 1]` gives (p99, p99.9, timeout %).
struct FakeBench {
    base: RunSummary,
    runs: Vec<(f64, f64, f64)>,
    profiled: Vec<(usize, u32)>,
    /// The partitions (SMs per workload) and folder of each verification run.
    verified: Vec<(Vec<Option<u32>>, Option<PathBuf>)>,
    written: Vec<String>,
    refuse: bool,
    /// Each workload's memory-system demand, as the engine would compute it.
    traffic: Vec<Option<isolane_core::predict::MemoryProfile>>,
    /// Per verification run (where given): its latest late start (µs) and every workload's
    /// execution p99 (ms).
    host: Vec<Option<(f64, f64)>>,
    /// Each verification run's `[timing] spin_us`.
    spins: Vec<u64>,
}

impl FakeBench {
    fn new(runs: Vec<(f64, f64, f64)>) -> FakeBench {
        FakeBench {
            base: three_cameras_run(),
            runs,
            profiled: Vec::new(),
            verified: Vec::new(),
            written: Vec::new(),
            refuse: false,
            traffic: Vec::new(),
            host: Vec::new(),
            spins: Vec::new(),
        }
    }
}

impl Bench for FakeBench {
    type Error = String;

    fn memory_estimates(&mut self, scenario: &Scenario) -> Vec<Option<u64>> {
        vec![None; scenario.workloads.len()]
    }

    fn memory_profiles(
        &mut self,
        _scenario: &Scenario,
        _device: &DeviceModel,
    ) -> Vec<Option<isolane_core::predict::MemoryProfile>> {
        self.traffic.clone()
    }

    fn admit(&mut self, _planned: &Scenario, device: &DeviceModel) -> Result<(), String> {
        match self.refuse {
            true => Err(format!(
                "the planned scenario does not fit the {}",
                device.name
            )),
            false => Ok(()),
        }
    }

    fn profile(&mut self, run: &ProfileRun<'_>) -> Result<Point, String> {
        assert_eq!(
            run.scenario.workloads.len(),
            1,
            "a profile runs one workload"
        );
        assert_eq!(run.scenario.workloads[0].partition.sms, Some(run.size));
        self.profiled.push((run.workload, run.size));
        let t = 64.0 / run.size as f64;
        Ok(Point {
            size: run.size,
            exec_p50_ms: t,
            exec_p99_ms: t,
            exec_mean_ms: t,
            exec_p999_ms: Some(t),
        })
    }

    fn verify(&mut self, planned: &Scenario, out: Option<&Path>) -> Result<Verified, String> {
        let sms = planned.workloads.iter().map(|w| w.partition.sms).collect();
        self.verified.push((sms, out.map(Path::to_path_buf)));
        let (p99, p999, timeout_pct) = self.runs[self.verified.len() - 1];
        let host = self.host.get(self.verified.len() - 1).copied().flatten();
        self.spins.push(planned.timing.spin_us);
        let mut summary = self.base.clone();
        let template = summary.workloads[0].clone();
        summary.workloads = (planned.workloads.iter())
            .map(|w| {
                let mut s = template.clone();
                s.name = w.name.clone();
                s.metrics.latency_ms.p99 = Some(p99);
                s.metrics.latency_ms.p999 = Some(p999);
                s.metrics.timeout_pct = timeout_pct;
                s.metrics.jobs = 5000;
                s.metrics.start_lateness_us.max = host.map(|(late_us, _)| late_us);
                s.exec_ms = host.map(|(_, exec_p99)| isolane_core::metrics::ExecTimes {
                    jobs: 5000,
                    p99: Some(exec_p99),
                    ..Default::default()
                });
                s
            })
            .collect();
        Ok(Verified {
            summary,
            dir: PathBuf::from(format!("runs/v{}", self.verified.len())),
        })
    }

    fn write_plan(&mut self, text: &str) -> Result<Option<PathBuf>, String> {
        self.written.push(text.to_string());
        Ok(Some(PathBuf::from("planned.toml")))
    }
}

/// Two workloads at 50 Hz with a 10 ms deadline, on an H100 with green contexts.
const TWO_CAMERAS: &str = "[device]\nbackend = \"cuda\"\nmechanism = \"green\"\n\
    [[workload]]\nname = \"a\"\nmodel = \"spin:1ms\"\nrate_hz = 50\ndeadline_ms = 10\njobs = 1\n\
    [[workload]]\nname = \"b\"\nmodel = \"spin:1ms\"\nrate_hz = 50\ndeadline_ms = 10\njobs = 1\n";

fn two_cameras() -> Scenario {
    Scenario::from_toml_str(TWO_CAMERAS, Path::new("two.toml"), &NoBuiltinModels).unwrap()
}

fn verifying(rounds: u32) -> Config {
    Config {
        verify: true,
        verify_out: Some(PathBuf::from("out/v")),
        rounds,
        ..Config::default()
    }
}

fn plan_two_cameras(
    config: &Config,
    bench: &mut FakeBench,
    said: &mut Said,
) -> Result<Finish, AutoError<String>> {
    let cache = tempfile::tempdir().unwrap();
    let target = here("h100-sxm", None, cache.path());
    let scenario = two_cameras();
    let input = Input {
        scenario: &scenario,
        name: "two.toml",
        text: TWO_CAMERAS,
        target: &target,
    };
    run(&input, config, bench, said)
}

/// A verification that misses (5 % timeouts, p99.9 twice the p99.9 alone) plans again with
/// the stretch it measured: 8 SMs (8 ms of 9 allowed) become 16 (4 ms × 2); the second run
/// holds, and the loop ends with the plan holding, written twice, run in DIR and DIR.round2.
#[test]
fn a_verification_that_misses_plans_again_and_then_holds() {
    let mut bench = FakeBench::new(vec![(8.5, 16.0, 5.0), (4.4, 4.5, 0.0)]);
    let mut said = Said::default();
    let finish = plan_two_cameras(&verifying(3), &mut bench, &mut said).unwrap();
    assert_eq!(finish.ending, Ending::Holds);
    let sms: Vec<_> = bench.verified.iter().map(|(s, _)| s.clone()).collect();
    assert_eq!(sms, [[Some(8), Some(8)], [Some(16), Some(16)]]);
    let outs: Vec<_> = bench.verified.iter().map(|(_, o)| o.clone()).collect();
    assert_eq!(
        outs,
        [Some("out/v".into()), Some("out/v.round2".into())] as [Option<PathBuf>; 2]
    );
    assert_eq!(bench.written.len(), 2, "each round writes its plan");
    let written = finish.written.unwrap();
    assert_eq!(written.mechanism, Mechanism::Green);
    assert_eq!(sizes(planned_choices(&written.plan)), [16, 16]);
    assert!(
        written.text.contains("# planned: 16 SMs"),
        "{}",
        written.text
    );
    assert_eq!(
        finish.last_run.unwrap().workloads[0].metrics.timeout_pct,
        0.0
    );
    assert!(said.any(Stream::Stderr, "a: stretch 1.00 planned, 2.00 measured"));
    assert!(said.any(
        Stream::Stdout,
        "round 2: planned again with the measured stretch"
    ));
    assert!(said.any(Stream::Stdout, "verification run 2: runs/v2"));
    assert!(said.any(
        Stream::Stdout,
        "the plan holds, every predicted p99 within 15 % of the measured"
    ));
    assert!(!said.any(Stream::Stdout, "does NOT hold"));
    // The stdout lines in order: plan written, run, table, verdict, per round.
    let last = &said.0.last().unwrap().1;
    assert!(last.starts_with("the plan holds"), "{last}");
}

/// A round whose misses started late on the host, with each job's own time as planned (an
/// execution p99 of 8 ms in 8 SMs: stretch 1.00), plans the same partitions; instead of
/// stopping there, the next round runs them with a spin past the latest late start (4 ms:
/// 4,500 µs), written into the plan, and holds. Without a round left it stops as before; a
/// round that spun that long already is not given the same spin again.
#[test]
fn misses_that_started_late_on_the_host_run_again_with_a_longer_spin() {
    let late = Some((4_000.0, 8.0));
    let mut bench = FakeBench::new(vec![(9.9, 12.0, 1.0), (8.2, 8.4, 0.0)]);
    bench.host = vec![late, None];
    let mut said = Said::default();
    let finish = plan_two_cameras(&verifying(3), &mut bench, &mut said).unwrap();
    assert_eq!(finish.ending, Ending::Holds);
    let sms: Vec<_> = bench.verified.iter().map(|(s, _)| s.clone()).collect();
    assert_eq!(sms, [[Some(8), Some(8)], [Some(8), Some(8)]]);
    assert_eq!(bench.spins, [200, 4500]);
    assert!(said.any(
        Stream::Stdout,
        "round 2: jobs of workloads that missed started up to 4.00 ms late on the host"
    ));
    assert!(said.any(Stream::Stdout, "[timing] spin_us = 4500"));
    let written = finish.written.unwrap();
    assert!(written.text.contains("spin_us = 4500"), "{}", written.text);
    assert!(!said.any(Stream::Stdout, "the plan does NOT hold"));

    // Late starts, but each job's own time twice as long as planned (16 ms in 8 SMs): planned
    // again in 16 SMs, at the scenario's spin (the new partitions alone are tried).
    let mut bench = FakeBench::new(vec![(9.9, 12.0, 1.0), (4.4, 4.5, 0.0), (4.4, 4.5, 0.0)]);
    bench.host = vec![Some((4_000.0, 16.0)), None, None];
    let mut said = Said::default();
    let finish = plan_two_cameras(&verifying(3), &mut bench, &mut said).unwrap();
    assert_eq!(finish.ending, Ending::Holds);
    let sms: Vec<_> = bench.verified.iter().map(|(s, _)| s.clone()).collect();
    assert_eq!(sms[..2], [[Some(8), Some(8)], [Some(16), Some(16)]]);
    assert!(bench.spins.iter().all(|&s| s == 200), "{:?}", bench.spins);
    assert!(!said.any(Stream::Stdout, "late on the host, and planning"));

    // A spin round whose predictions were off runs a third round, still spinning.
    let mut bench = FakeBench::new(vec![(9.9, 12.0, 1.0), (9.6, 9.7, 0.0), (9.6, 9.7, 0.0)]);
    bench.host = vec![late, None, None];
    let finish = plan_two_cameras(&verifying(3), &mut bench, &mut Said::default()).unwrap();
    assert_eq!(finish.ending, Ending::Holds);
    assert_eq!(bench.spins, [200, 4500, 4500]);

    // A stall of 2 s: the spin stops at the key's limit (1 s), which the written plan keeps.
    let mut bench = FakeBench::new(vec![(9.9, 12.0, 1.0), (8.2, 8.4, 0.0)]);
    bench.host = vec![Some((2_000_000.0, 8.0)), None];
    let finish = plan_two_cameras(&verifying(3), &mut bench, &mut Said::default()).unwrap();
    assert_eq!(bench.spins, [200, 1_000_000]);
    let written = finish.written.unwrap();
    assert!(
        written.text.contains("spin_us = 1000000"),
        "{}",
        written.text
    );

    // One round only: the miss is the verdict.
    let mut bench = FakeBench::new(vec![(9.9, 12.0, 1.0)]);
    bench.host = vec![late];
    let finish = plan_two_cameras(&verifying(1), &mut bench, &mut Said::default()).unwrap();
    assert_eq!(finish.ending, Ending::DoesNotHold);
    assert_eq!(bench.spins, [200]);

    // Late again by as much after spinning 4,500 µs: the same partitions do not hold.
    let mut bench = FakeBench::new(vec![(9.9, 12.0, 1.0), (9.9, 12.0, 1.0), (8.2, 8.4, 0.0)]);
    bench.host = vec![late, late, None];
    let mut said = Said::default();
    let finish = plan_two_cameras(&verifying(3), &mut bench, &mut said).unwrap();
    assert_eq!(finish.ending, Ending::DoesNotHold);
    assert_eq!(bench.spins, [200, 4500]);
    assert!(said.any(
        Stream::Stdout,
        "the plan does NOT hold, and planning with the measured stretch gives the same partitions"
    ));
}

/// Without rounds left, a miss is the verdict: the plan does not hold.
#[test]
fn a_miss_with_no_round_left_does_not_hold() {
    let mut bench = FakeBench::new(vec![(8.5, 16.0, 5.0)]);
    let mut said = Said::default();
    let finish = plan_two_cameras(&verifying(1), &mut bench, &mut said).unwrap();
    assert_eq!(finish.ending, Ending::DoesNotHold);
    assert_eq!(bench.verified.len(), 1);
    assert!(said.any(
        Stream::Stdout,
        "the plan does NOT hold: a workload missed its deadline"
    ));
}

/// A run that holds with a predicted p99 off by more than the tolerance (8 ms predicted, 9.5
/// measured: −16 %) runs the same partitions again, predicted from the delay it measured; the
/// second run matches and the plan holds. With one round only, the loop ends saying so.
#[test]
fn a_prediction_off_by_more_than_the_tolerance_is_checked_again() {
    let mut bench = FakeBench::new(vec![(9.5, 9.6, 0.0), (9.5, 9.6, 0.0)]);
    let mut said = Said::default();
    let finish = plan_two_cameras(&verifying(3), &mut bench, &mut said).unwrap();
    assert_eq!(finish.ending, Ending::Holds);
    let sms: Vec<_> = bench.verified.iter().map(|(s, _)| s.clone()).collect();
    assert_eq!(
        sms,
        [[Some(8), Some(8)], [Some(8), Some(8)]],
        "same partitions"
    );
    assert!(said.any(
        Stream::Stdout,
        "round 2: the plan holds but the predicted p99 was off for a (-16 %), b (-16 %)"
    ));
    let plan = finish.written.unwrap().plan;
    for c in planned_choices(&plan) {
        assert!((c.predicted_p99_ms - 9.5).abs() < 1e-9, "{c:?}");
    }
    assert!(said.any(Stream::Stdout, "the plan holds, every predicted p99 within"));

    let mut bench = FakeBench::new(vec![(9.5, 9.6, 0.0)]);
    let mut said = Said::default();
    let finish = plan_two_cameras(&verifying(1), &mut bench, &mut said).unwrap();
    assert_eq!(finish.ending, Ending::Holds);
    assert!(said.any(
        Stream::Stdout,
        "the plan holds; predicted p99 off by more than 15 % for a (-16 %), b (-16 %)"
    ));
}

/// A spent profiling budget measures nothing: no plan, the sizes not profiled named, and what
/// to do about it said.
#[test]
fn a_spent_budget_measures_nothing_and_says_so() {
    let mut bench = FakeBench::new(Vec::new());
    let mut said = Said::default();
    let config = Config {
        profile_budget: Some(Duration::ZERO),
        ..Config::default()
    };
    let finish = plan_two_cameras(&config, &mut bench, &mut said).unwrap();
    assert_eq!(finish.ending, Ending::NoPlan);
    assert!(finish.written.is_none());
    assert!(bench.profiled.is_empty());
    assert!(said.any(Stream::Stderr, "green: no plan"));
    assert!(said.any(Stream::Stderr, "the profiling budget is spent"));
    assert!(said.any(Stream::Stderr, "plan again (with a larger"));
}

/// A plan admission refuses is never written, and the bench's error comes back as it was.
#[test]
fn a_plan_admission_refuses_is_not_written() {
    let mut bench = FakeBench::new(Vec::new());
    bench.refuse = true;
    let mut said = Said::default();
    let e = plan_two_cameras(&Config::default(), &mut bench, &mut said).unwrap_err();
    assert!(matches!(e, AutoError::Bench(_)));
    assert_eq!(
        format!("{e:#}"),
        "the planned scenario does not fit the h100-sxm"
    );
    assert!(bench.written.is_empty());
}

/// A verification's measured stretch is its p99.9 response over the p99.9 alone, and the
/// next round plans with it, never with less than it planned with: the committed H100
/// run of three-cameras (front_vit planned ×1.24 in 32 SMs, measured 1.739 ms against
/// 1.299 ms alone: ×1.34).
#[test]
fn a_round_plans_with_the_stretch_its_verification_measured() {
    let summary = three_cameras_run();
    let choice = |name: &str, tail: f64, stretch: f64| {
        let profile = Point {
            size: 32,
            exec_p50_ms: tail,
            exec_p99_ms: tail,
            exec_mean_ms: tail,
            exec_p999_ms: Some(tail),
        };
        Choice {
            workload: name.into(),
            size: 32,
            predicted_p99_ms: tail * stretch,
            predicted_tail_ms: tail * stretch,
            deadline_ms: 2.0,
            util: 0.5,
            profile,
            memory_mib: None,
            mig_start: None,
        }
    };
    let demand = |name: &str| Demand {
        name: name.into(),
        rate_hz: 400.0,
        deadline_ms: 2.0,
        critical: true,
        stretch: None,
        added_p99_ms: None,
        memory_mib: None,
    };
    // front_vit measured more than it was planned with; rear_det (planned ×2.0) less.
    let choices = [
        choice("front_vit", 1.299, 1.24),
        choice("rear_det", 1.0, 2.0),
    ];
    let measured = measured_stretch(&choices[0], &summary).unwrap();
    assert!((measured - 1.738751 / 1.299).abs() < 1e-9, "{measured}");
    let mut said = Said::default();
    let next = calibrated(
        &[demand("front_vit"), demand("rear_det")],
        &choices,
        &summary,
        &mut said,
    );
    assert!(said.any(
        Stream::Stderr,
        "front_vit: stretch 1.24 planned, 1.34 measured"
    ));
    assert!((next[0].stretch.unwrap() - measured).abs() < 1e-9);
    assert!(
        (next[1].stretch.unwrap() - 2.0).abs() < 1e-9,
        "never below the plan's"
    );
    // The delay added to the p99: its p99 response minus its p99 alone, as the latest run
    // measured it (not held to the plan's), never below 0.
    let p99 = |name: &str| measured_p99(&summary, name);
    let front_added = measured_added_p99(&choices[0], &summary).unwrap();
    assert!(front_added > 0.0);
    assert!(
        (front_added - (p99("front_vit") - 1.299)).abs() < 1e-9,
        "{front_added}"
    );
    assert_eq!(next[0].added_p99_ms, Some(front_added));
    let rear_added = (p99("rear_det") - 1.0).max(0.0);
    assert_eq!(next[1].added_p99_ms, Some(rear_added));
    // A workload the run does not know has nothing measured.
    assert_eq!(
        measured_stretch(&choice("nobody", 1.0, 1.0), &summary),
        None
    );
    assert_eq!(
        measured_added_p99(&choice("nobody", 1.0, 1.0), &summary),
        None
    );
    // Faster than alone (two runs' noise) adds nothing.
    assert_eq!(
        measured_added_p99(&choice("front_vit", 100.0, 1.0), &summary),
        Some(0.0)
    );
}

/// A run whose predictions were off (deadlines met) names those workloads; predicted again
/// from the delays it measured, the same partitions predict its p99s exactly.
#[test]
fn predictions_off_by_more_than_the_tolerance_are_named_and_made_again() {
    let summary = three_cameras_run();
    let p99 = |name: &str| measured_p99(&summary, name);
    let choice = |name: &str, alone: f64, predicted: f64| Choice {
        workload: name.into(),
        size: 32,
        predicted_p99_ms: predicted,
        predicted_tail_ms: predicted,
        deadline_ms: 100.0,
        util: 0.1,
        profile: Point {
            size: 32,
            exec_p50_ms: alone,
            exec_p99_ms: alone,
            exec_mean_ms: alone,
            exec_p999_ms: Some(alone),
        },
        memory_mib: None,
        mig_start: None,
    };
    let names: Vec<String> = summary.workloads.iter().map(|w| w.name.clone()).collect();
    // The first predicted 30 % low, the others within 10 %.
    let choices: Vec<Choice> = (names.iter().enumerate())
        .map(|(i, n)| {
            let f = if i == 0 { 0.7 } else { 1.1 };
            choice(n, 0.8 * p99(n), f * p99(n))
        })
        .collect();
    let v = verdict(&summary, &choices, 0.15);
    assert!(!v.missed);
    assert_eq!(v.off, [format!("{} (-30 %)", names[0])]);
    assert!(verdict(&summary, &choices, 0.35).off.is_empty());

    let demands: Vec<Demand> = (names.iter())
        .map(|n| Demand {
            name: n.clone(),
            rate_hz: 10.0,
            deadline_ms: 100.0,
            critical: false,
            stretch: None,
            added_p99_ms: None,
            memory_mib: None,
        })
        .collect();
    let demands = calibrated(&demands, &choices, &summary, &mut Said::default());
    let mut plan = GpusPlan {
        gpus: Vec::new(),
        gpu_of: Vec::new(),
        used: Vec::new(),
        outcome: Outcome::Planned {
            choices: choices.clone(),
            used: 96,
            capacity: 132,
        },
    };
    repredict(&mut plan, &demands, &Options::default());
    let again = planned_choices(&plan);
    assert_eq!(sizes(again), sizes(&choices));
    for (c, d) in again.iter().zip(&demands) {
        assert!((c.predicted_p99_ms - p99(&c.workload)).abs() < 1e-9);
        // The p99.9 with the stretch the run measured (never below the planned one).
        let stretch = d.stretch.unwrap();
        assert!((c.predicted_tail_ms - c.profile.tail_ms() * stretch).abs() < 1e-9);
    }
    assert!(verdict(&summary, again, 0.15).off.is_empty());
}

/// A plan for each workload of `summary`: 32 SMs, every time 1 ms alone, predicted p99
/// 1 ms and p99.9 1.5 ms against a 2 ms deadline.
fn one_choice_each(summary: &RunSummary) -> Vec<Choice> {
    (summary.workloads.iter())
        .map(|w| Choice {
            workload: w.name.clone(),
            size: 32,
            predicted_p99_ms: 1.0,
            predicted_tail_ms: 1.5,
            deadline_ms: 2.0,
            util: 0.5,
            profile: Point {
                size: 32,
                exec_p50_ms: 1.0,
                exec_p99_ms: 1.0,
                exec_mean_ms: 1.0,
                exec_p999_ms: Some(1.0),
            },
            memory_mib: None,
            mig_start: None,
        })
        .collect()
}

/// A workload that missed with a job started late by more than a quarter of its deadline
/// gets a note naming the host; late starts of workloads that met, or short ones, none.
#[test]
fn a_miss_with_late_starts_is_said_to_be_the_hosts() {
    let mut summary = three_cameras_run();
    let choices = one_choice_each(&summary);
    for w in &mut summary.workloads {
        w.metrics.timeout_pct = 0.0;
        w.metrics.latency_ms.p99 = Some(1.0);
        w.metrics.start_lateness_us.max = Some(4_120.0);
    }
    summary.cpu_steal_pct = Some(0.012);
    assert_eq!(
        late_start_note(&summary, &choices),
        None,
        "every workload met"
    );
    summary.workloads[1].metrics.timeout_pct = 0.2;
    let note = late_start_note(&summary, &choices).unwrap();
    let name = &summary.workloads[1].name;
    assert!(
        note.contains(&format!("started late: {name} 4.12 ms")),
        "{note}"
    );
    assert!(note.contains("CPU steal in this run: 0.012 %"), "{note}");
    // A spin past the latest late start (4.12 ms + 0.5, in steps of 0.5 ms).
    assert!(note.contains("[timing] spin_us = 5000 "), "{note}");
    // The verification's text carries it.
    let text = Event::Verification {
        summary: &summary,
        choices: &choices,
    }
    .text();
    assert!(text.contains(&note), "{text}");
    summary.workloads[1].metrics.start_lateness_us.max = Some(300.0);
    assert_eq!(
        late_start_note(&summary, &choices),
        None,
        "0.3 ms of a 2 ms deadline"
    );
}

/// A workload whose jobs started late on the host is calibrated by its execution time's p99
/// (end − start) over its p99 alone, not by its response time's p99.9, nor by its execution
/// time's p99.9, which the host's stalls reach too: the late starts are not its partition's or
/// its neighbours' doing. Without late starts, or without execution times (a summary written
/// before session 28), its response time's, as before.
#[test]
fn a_stretch_read_where_jobs_started_late_on_the_host_is_the_execution_times() {
    let mut summary = three_cameras_run();
    let choices = one_choice_each(&summary);
    let (c, tail) = (&choices[1], choices[1].profile.tail_ms());
    let p99 = c.profile.exec_p99_ms;
    let w = &mut summary.workloads[1];
    w.metrics.latency_ms.p999 = Some(4.0 * tail);
    w.exec_ms = Some(isolane_core::metrics::ExecTimes {
        jobs: 1200,
        p99: Some(1.05 * p99),
        p999: Some(2.5 * tail),
        ..Default::default()
    });
    w.metrics.start_lateness_us.max = Some(0.1 * c.deadline_ms * 1e3);
    let response = measured_stretch(c, &summary).unwrap();
    assert!((response - 4.0).abs() < 1e-9, "no late start: {response}");
    summary.workloads[1].metrics.start_lateness_us.max = Some(0.5 * c.deadline_ms * 1e3);
    let exec = measured_stretch(c, &summary).unwrap();
    assert!((exec - 1.05).abs() < 1e-9, "late starts: {exec}");
    summary.workloads[1].exec_ms = None;
    let old = measured_stretch(c, &summary).unwrap();
    assert!((old - 4.0).abs() < 1e-9, "no execution times: {old}");
}

/// Several mechanisms with verification compare each mechanism's predicted slack (deadline −
/// p99.9) with the one its run measured, and say what each plan leaves spare.
#[test]
fn mechanisms_are_compared_by_predicted_and_measured_slack() {
    let summary = three_cameras_run();
    let choices = one_choice_each(&summary);
    let plan = GpusPlan {
        gpus: Vec::new(),
        gpu_of: Vec::new(),
        used: Vec::new(),
        outcome: Outcome::Planned {
            choices,
            used: 96,
            capacity: 132,
        },
    };
    let compared = [Mechanism::Green, Mechanism::Mps].map(|mech| Compared {
        mech,
        spare: format!("spare of {}", mech.name()),
        plan: plan.clone(),
        summary: summary.clone(),
    });
    let lines = comparison_lines(&compared);
    let w = &summary.workloads[0];
    let measured = 2.0 - w.metrics.latency_ms.p999.unwrap();
    let row = lines
        .iter()
        .find(|l| l.starts_with("mps") && l.contains(w.name.as_str()))
        .unwrap();
    assert!(row.contains("0.500"), "{row}");
    assert!(row.contains(&format!("{measured:.3}")), "{row}");
    assert!(lines.contains(&format!("{:<10} spare: spare of mps", "mps")));
    // One row per workload and mechanism, a spare line per mechanism, two header lines.
    assert_eq!(lines.len(), 2 + 2 * (summary.workloads.len() + 1));
    // Time-slicing leaves time spare, not SMs: three workloads at utilisation 0.5 each.
    assert_eq!(
        spare_words(&Ladder::whole(), &plan),
        "the whole GPU in turns, 150 % of its time busy (0 % spare)"
    );
    let mut two = plan.clone();
    if let Outcome::Planned { choices, .. } = &mut two.outcome {
        choices.truncate(1);
        choices[0].util = 0.3;
    }
    assert_eq!(
        spare_words(&Ladder::whole(), &two),
        "the whole GPU in turns, 30 % of its time busy (70 % spare)"
    );
}

/// Only a `gpu` written in the file pins a workload: the resolved scenario fills one in
/// for every workload, and the planner may place those the file leaves free.
#[test]
fn the_file_says_which_workloads_are_pinned_to_a_gpu() {
    let text = "[device]\nbackend = \"cuda\"\ngpus = [0, 1]\nmechanism = \"green\"\n\
                [[workload]]\nname = \"free\"\nmodel = \"spin:1ms\"\nrate_hz = 10\njobs = 1\n\
                [[workload]]\nname = \"pinned\"\nmodel = \"spin:1ms\"\nrate_hz = 10\n\
                jobs = 1\ngpu = 0\n";
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("s.toml");
    std::fs::write(&file, text).unwrap();
    let s = Scenario::from_toml_str(text, &file, &NoBuiltinModels).unwrap();
    assert_eq!(s.workloads[0].gpu, Some(0), "resolved to the first GPU");
    let spread = scenario::Spread::of(&s, text).unwrap();
    assert_eq!(spread.gpus, [0, 1]);
    assert_eq!(spread.pinned, [None, Some(0)]);
    // One GPU: nothing to place.
    let one = Scenario::from_toml_str(
        &text.replace("gpus = [0, 1]", "gpu = 0"),
        &file,
        &NoBuiltinModels,
    )
    .unwrap();
    assert!(scenario::Spread::of(&one, text).is_none());
}

/// On this machine's GPU MIG can be planned only with MIG mode on (the profile runs need
/// MIG instances); several mechanisms then leave MIG out with that reason.
#[test]
fn mig_is_planned_here_only_with_mig_mode_on() {
    let w = [crate::offline::WorkloadId {
        name: "a".into(),
        model: "resnet18".into(),
        batch: 1,
        precision: "fp16".into(),
    }];
    let unused = Path::new("unused");
    let off = here("h100-sxm", Some(false), unused)
        .mig_unavailable(&w)
        .unwrap();
    assert!(
        off.starts_with(
            "MIG mode is off on GPU 0 (h100-sxm): MIG instances cannot be profiled here"
        ),
        "{off}"
    );
    assert!(here("h100-sxm", None, unused).mig_unavailable(&w).is_some());
    assert_eq!(
        here("h100-sxm", Some(true), unused).mig_unavailable(&w),
        None
    );
    let l40s = here("l40s", Some(false), unused)
        .mig_unavailable(&w)
        .unwrap();
    assert!(l40s.contains("has no MIG"), "{l40s}");
}

/// The first plan holds the deadlines to the stretch the memory system is predicted to cause
/// (isolane_core::predict, the H200's fitted coefficients), not to 1: two workloads that each
/// stream 9.6 GB a job take, at 8 SMs (8 ms a job), a quarter of the H200's DRAM bandwidth and
/// the whole L2 from each other: ×1.53, 12.3 ms of the 9 allowed, so 16 SMs; there the
/// neighbour runs twice as fast and takes half the bandwidth: ×1.84, 7.4 ms, and the plan
/// stays. Without profiles, 8 SMs each (as before).
#[test]
fn the_first_plan_holds_the_deadlines_to_the_predicted_stretch() {
    use isolane_core::predict::{MemoryProfile, ProfileSource};
    let plan = |traffic: Vec<Option<MemoryProfile>>, predict: bool| {
        let cache = tempfile::tempdir().unwrap();
        let target = here("h200", None, cache.path());
        let scenario = two_cameras();
        let input = Input {
            scenario: &scenario,
            name: "two.toml",
            text: TWO_CAMERAS,
            target: &target,
        };
        let mut bench = FakeBench::new(Vec::new());
        bench.traffic = traffic;
        let mut said = Said::default();
        let config = Config {
            predict,
            ..Config::default()
        };
        let finish = run(&input, &config, &mut bench, &mut said).unwrap();
        let Outcome::Planned { choices, .. } = &finish.written.unwrap().plan.outcome else {
            panic!("no plan");
        };
        let sizes: Vec<u32> = choices.iter().map(|c| c.size).collect();
        (sizes, said)
    };
    let (alone, said) = plan(Vec::new(), true);
    assert_eq!(alone, [8, 8]);
    assert!(!said.any(Stream::Stderr, "predicted"));
    let streaming = Some(MemoryProfile {
        dram_bytes_per_job: 9.6e9,
        resident: false,
        l2_footprint_bytes: 9.6e9,
        flops_per_job: 0.0,
        source: ProfileSource::Computed,
    });
    let (sizes, said) = plan(vec![streaming; 2], true);
    assert_eq!(sizes, [16, 16]);
    assert!(
        said.any(
            Stream::Stderr,
            "a: stretch 1.84 predicted beside the workloads planned on its GPU (their DRAM \
             50.0 % of the peak while they run, 100 % of the L2; most from b, 1.84); planned \
             with 1.84"
        ),
        "{:?}",
        said.0
    );
    // A workload the engine has no profile of keeps the stated stretch, and is no one's
    // neighbour: b alone, its neighbour unknown, stretches by nothing.
    let (sizes, said) = plan(vec![None, streaming], true);
    assert_eq!(sizes, [8, 8]);
    assert!(said.any(Stream::Stderr, "b: stretch 1.00 predicted"));
    // `--no-predict`: planned with --stretch, as before.
    let (sizes, said) = plan(vec![streaming; 2], false);
    assert_eq!(sizes, [8, 8]);
    assert!(!said.any(Stream::Stderr, "predicted"));
}

/// A calibrated workload whose skips stay in floats runs another plan than the default's:
/// its profiles are keyed apart; the default keeps the plain precision (caches stay valid).
#[test]
fn float_skips_are_profiled_apart() {
    use isolane_core::spec::{CalibrationMethod, CalibrationSkips, CalibrationSpec, Precision};
    let mut s = two_cameras();
    for w in &mut s.workloads {
        w.precision = Precision::Int8;
    }
    let calibration = |skips| {
        Some(CalibrationSpec {
            dir: "/cal".into(),
            method: CalibrationMethod::Percentile,
            skips,
        })
    };
    s.workloads[0].calibration = calibration(CalibrationSkips::Quantized);
    s.workloads[1].calibration = calibration(CalibrationSkips::Float);
    let ids = workload_ids(&s);
    assert_eq!(ids[0].precision, "int8");
    assert_eq!(ids[1].precision, "int8 float skips");
}
