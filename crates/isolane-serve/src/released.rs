//! Fixed-rate jobs beside requests: workloads of the served scenario that are not served but
//! released on their own schedules (`rate_hz`, `jobs` or `duration_s`, `late`, `deadline_ms`,
//! `phase_ms`), or command workloads whose program is started at t0 and stopped by the drain
//! (docs/programs.md), as `isolane run` releases them: by the same [`Releasing`] session handle
//! (isolane-runtime's coordinator), with the server's `Instances` (one build at a time, the
//! server's guard). So a released workload's host is a run's: a thread host builds its
//! instance and runs the release loop on that thread; a `host = "process"` one is an
//! `isolane worker` that runs the loop itself; a workload that fails ends alone, its failure
//! said at the stop. The timing is a run's (docs/design.md, "Timing semantics"): an absolute
//! schedule from one t0 common to every released workload, taken once all the server's
//! instances are warm (`[timing] start_delay_ms` after), the late policy, response times from
//! the scheduled release. Their records reach `/metrics` (run's families under
//! `isolane_serve_released_`) and `serve --out`'s jobs/ from the releasing session's jobs
//! writer, never from a release loop's thread.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use isolane_core::spec::WorkloadSpec;
use isolane_core::JobRecord;
use isolane_runtime::coordinator::{Releasing, RunOptions, RunPlan, WorkloadStatus};
use isolane_runtime::handle::{AdmitChange, Proposed};
use isolane_runtime::jobs_stream::{BatchSender, RecordObserver};
use isolane_runtime::program::ProgramOutcome;
use isolane_runtime::release::LoopEnd;

use crate::{InstanceContext, ServeError, ServeMetrics};

/// The server's admission of changes ([`crate::Server::set_admission`]) with the released
/// workloads among each change's neighbours: they share the GPU with the served models as a
/// run's workloads do, so a change that would make a critical model miss beside one of them
/// is refused (or warned of) naming it, as beside a served model.
pub(crate) struct BesideReleased {
    pub(crate) admission: Arc<dyn AdmitChange>,
    pub(crate) released: Arc<Released>,
}

impl AdmitChange for BesideReleased {
    fn admit(&self, change: &Proposed<'_>) -> Result<(), String> {
        let released = self.released.neighbours();
        if released.is_empty() {
            return self.admission.admit(change);
        }
        let others: Vec<WorkloadSpec> = change.others.iter().cloned().chain(released).collect();
        self.admission.admit(&Proposed {
            others: &others,
            ..*change
        })
    }
}

/// What a released workload ran, once the server has drained.
#[derive(Debug, Clone)]
pub struct ReleasedRun {
    pub name: String,
    /// Its jobs, relative to the released workloads' t0 (as a run's records are).
    pub records: Vec<JobRecord>,
    /// The warm-up jobs' service times (ns).
    pub warmup_ns: Vec<i64>,
    /// `Completed`: every scheduled job was released; `Interrupted`: the drain stopped it (or
    /// the server never started); `Err`: it failed (a job, its worker process).
    pub end: Result<LoopEnd, String>,
    /// The released workloads' t0 (ns, monotonic clock); `None` if it never started.
    pub t0_ns: Option<i64>,
    /// A command workload: how its program ran (`None` for models, and for a program that
    /// never reached t0). Its `end` is `Completed` when the program ended by itself or at its
    /// `duration_s` without failing, `Interrupted` when the drain stopped it.
    pub program: Option<ProgramOutcome>,
}

/// The released workloads of a server: their releasing session, until the drain ends it.
pub(crate) struct Released {
    releasing: Mutex<Option<Releasing>>,
    /// Raised when the drain begins: no more jobs are released.
    stop: Arc<AtomicBool>,
    observer: Arc<Observer>,
    /// The released workloads as the scenario gives them, in its order: what the served
    /// models' admission sees of them (no change while serving alters them).
    specs: Vec<WorkloadSpec>,
}

impl Released {
    /// Starts the hosts of `plan`'s workloads named in `names` (building in the server's
    /// build turn, beside the served models' builds); they wait for [`Released::go`].
    /// `None` when nothing is released.
    pub(crate) fn start(
        ctx: &InstanceContext,
        plan: &RunPlan,
        names: &[String],
    ) -> Result<Option<Released>, ServeError> {
        let slots: Vec<usize> = (0..plan.workloads.len())
            .filter(|&i| names.contains(&plan.workloads[i].spec.name))
            .collect();
        if slots.is_empty() {
            return Ok(None);
        }
        let stop = Arc::new(AtomicBool::new(false));
        // `serve --out`: the records join the served models' in jobs/<workload>.csv.
        let observer = Arc::new(Observer {
            metrics: Arc::clone(&ctx.metrics),
            out: plan
                .workloads
                .iter()
                .map(|w| {
                    let (sinks, _) = ctx.records.as_ref()?;
                    sinks.get(w.index).cloned()
                })
                .collect(),
            base_ns: ctx.records.as_ref().map(|(_, base)| *base),
            shift_ns: AtomicI64::new(0),
        });
        let names: Vec<Option<&str>> = plan
            .workloads
            .iter()
            .enumerate()
            .map(|(i, w)| slots.contains(&i).then_some(w.spec.name.as_str()))
            .collect();
        ctx.metrics.released().begin(&names);
        let mut opts = RunOptions::new(Arc::clone(&stop));
        opts.engine = Some(ctx.engine.clone());
        opts.programs_dir = ctx.programs_dir.clone();
        opts.observer = Some(Arc::clone(&observer) as Arc<dyn RecordObserver>);
        if let Some(p) = &ctx.processes {
            // A released worker is started as a run's: `<program> worker --workload NAME`,
            // with its partition's environment and the command's own.
            opts.worker_exe = Some(p.command.program.clone());
            opts.worker_env = p.env.clone();
            // A program gets its partition's environment only: the worker command's own is
            // isolane's.
            for &s in slots
                .iter()
                .filter(|&&s| plan.workloads[s].spec.program.is_none())
            {
                let env = opts
                    .worker_env
                    .entry(plan.workloads[s].spec.name.clone())
                    .or_default();
                env.extend(p.command.env.iter().cloned());
            }
            if let Some(started) = p.on_start.clone() {
                opts.on_worker_start = Some(Arc::new(move |_: &str, pid: u32| started(pid)));
            }
        }
        let releasing = Releasing::start(plan, &slots, Arc::clone(&ctx.instances), &opts)
            .map_err(|e| ServeError::Partitions(isolane_session::SessionError::Run(e)))?;
        Ok(Some(Released {
            releasing: Mutex::new(Some(releasing)),
            stop,
            observer,
            specs: slots
                .iter()
                .map(|&s| plan.workloads[s].spec.clone())
                .collect(),
        }))
    }

    /// Waits until every released workload is warm, then releases them all from `t0` (ns,
    /// monotonic clock). A workload that could not be built or warmed up fails the start:
    /// every released one is stopped, and its error said.
    pub(crate) fn go(&self, t0: i64) -> Result<(), ServeError> {
        let mut guard = self.releasing.lock().unwrap_or_else(|p| p.into_inner());
        let Some(releasing) = guard.as_mut() else {
            return Ok(());
        };
        let barrier = releasing.wait_ready();
        if barrier.failed == 0 && !barrier.stopped {
            if let Some(base) = self.observer.base_ns {
                self.observer
                    .shift_ns
                    .store(t0.saturating_sub(base), Ordering::Relaxed);
            }
            releasing.go(Some(t0));
            return Ok(());
        }
        drop(guard);
        let runs = self.finish();
        let failed = runs
            .into_iter()
            .find_map(|r| r.end.err().map(|e| (r.name, e)));
        Err(match failed {
            Some((workload, message)) => ServeError::Model { workload, message },
            None => ServeError::Refused("the released workloads were stopped before t0".into()),
        })
    }

    /// Stops releasing (the drain, or a failed start): what is running ends its job.
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Stops releasing, waits for every released workload to end and says what each ran
    /// (in the scenario's order); empty after the first call.
    pub(crate) fn finish(&self) -> Vec<ReleasedRun> {
        self.stop();
        let releasing = self
            .releasing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let Some(releasing) = releasing else {
            return Vec::new();
        };
        let t0_ns = releasing.t0();
        releasing
            .finish()
            .workloads
            .into_iter()
            .map(|w| ReleasedRun {
                end: match w.status {
                    WorkloadStatus::Ok => Ok(LoopEnd::Completed),
                    WorkloadStatus::Interrupted => Ok(LoopEnd::Interrupted),
                    WorkloadStatus::Failed(f) => Err(f.message),
                },
                name: w.name,
                records: w.records,
                warmup_ns: w.warmup_ns,
                t0_ns,
                program: w.program,
            })
            .collect()
    }

    /// The released workloads that are the served models' neighbours now: all of them while
    /// the releasing session has one still going (before t0 too, when they are about to be
    /// released), none once the drain stopped it or every schedule ended. One whose schedule
    /// ended while another's goes on still counts: the session says only whether any goes on,
    /// and a neighbour too many errs towards a refusal, never towards a missed deadline.
    pub(crate) fn neighbours(&self) -> Vec<WorkloadSpec> {
        if self.stop.load(Ordering::Relaxed) {
            return Vec::new();
        }
        let releasing = self.releasing.lock().unwrap_or_else(|p| p.into_inner());
        match releasing.as_ref() {
            Some(r) if r.running() => self.specs.clone(),
            _ => Vec::new(),
        }
    }

    /// Whether any released workload is still going.
    #[cfg(test)]
    pub(crate) fn running(&self) -> bool {
        self.releasing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .is_some_and(|r| r.running())
    }
}

/// Sees the released workloads' records on the releasing session's jobs writer: counts them
/// in `/metrics`, and hands them to `serve --out`'s writer on the server's time base.
struct Observer {
    metrics: Arc<ServeMetrics>,
    /// `serve --out`'s sink of each plan slot.
    out: Vec<Option<BatchSender>>,
    /// The time `serve --out`'s records count from (ns, monotonic clock).
    base_ns: Option<i64>,
    /// The released t0 less that base (ns), set before t0.
    shift_ns: AtomicI64,
}

impl RecordObserver for Observer {
    fn records(&self, slot: usize, records: &[JobRecord]) {
        self.metrics.released().observe(slot, records);
        let Some(Some(out)) = self.out.get(slot) else {
            return;
        };
        let shift = self.shift_ns.load(Ordering::Relaxed);
        let shifted: Vec<JobRecord> = records
            .iter()
            .map(|r| JobRecord {
                release_ns: r.release_ns + shift,
                start_ns: r.start_ns.map(|s| s + shift),
                end_ns: r.end_ns.map(|e| e + shift),
                ..*r
            })
            .collect();
        out.send(&shifted);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use isolane_core::spec::Scenario;
    use isolane_protocol::{DataType, Tensor};
    use isolane_runtime::coordinator::RunPlan;
    use isolane_runtime::exec::SPIN_INPUT;

    use crate::{InferRequest, ServeOptions, Server};

    use super::*;

    use crate::tests::NoEngine;

    fn start(tick: &str, released: &[&str]) -> Result<Server, crate::ServeError> {
        start_with(tick, released, None)
    }

    fn start_with(
        tick: &str,
        released: &[&str],
        records: Option<(Vec<BatchSender>, i64)>,
    ) -> Result<Server, crate::ServeError> {
        let tick = format!(
            "name = \"tick\"\nmodel = \"spin:200us\"\nwarmup_jobs = 2\nlate = \"queue\"\n{tick}"
        );
        server_of(&tick, released, records, None)
    }

    /// A CPU server of `echo` (served) and the workload `second` (its TOML keys), `released`
    /// released beside it.
    fn server_of(
        second: &str,
        released: &[&str],
        records: Option<(Vec<BatchSender>, i64)>,
        programs_dir: Option<&std::path::Path>,
    ) -> Result<Server, crate::ServeError> {
        let toml = format!(
            "[device]\nbackend = \"cpu\"\n\n[[workload]]\nname = \"echo\"\n\
             model = \"spin:300us\"\nrate_hz = 100\njobs = 1\nwarmup_jobs = 1\n\n\
             [[workload]]\n{second}\n"
        );
        let scenario =
            Scenario::from_toml_str(&toml, "t.toml", &isolane_core::spec::NoBuiltinModels)
                .unwrap_or_else(|e| panic!("{e}"));
        let plan = RunPlan::from_scenario(&scenario);
        let words: Vec<_> = plan
            .workloads
            .iter()
            .map(|_| ("cpu".into(), None))
            .collect();
        let options = ServeOptions {
            engine: Arc::new(NoEngine),
            seed: 1,
            records,
            released: Vec::new(),
            programs_dir: programs_dir.map(|d| d.to_path_buf()),
        };
        let released: Vec<String> = released.iter().map(|s| s.to_string()).collect();
        Server::start_releasing(&plan, &words, &options, None, &released)
    }

    fn request() -> InferRequest {
        let t = Tensor::new(
            SPIN_INPUT,
            DataType::Fp32,
            vec![1, 1],
            1f32.to_le_bytes().to_vec(),
        )
        .unwrap();
        InferRequest {
            inputs: vec![t],
            outputs: None,
            deadline: None,
        }
    }

    #[test]
    fn released_jobs_run_on_their_schedule_beside_served_requests() {
        let s = start("rate_hz = 200\njobs = 20", &["tick"]).unwrap();
        // The served model answers; the released one is not served.
        let rx = s.submit("echo", request()).unwrap();
        let answer = rx.blocking_recv().unwrap().unwrap();
        assert_eq!(answer.outputs.len(), 1);
        let e = s.submit("tick", request()).unwrap_err();
        assert_eq!(e.reason(), "unknown_model", "{e}");
        assert_eq!(
            s.models().map(|m| m.name.clone()).collect::<Vec<_>>(),
            ["echo"]
        );
        // 20 jobs at 200 Hz: 95 ms of schedule; a loaded machine gets ample time to end it.
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        std::thread::sleep(Duration::from_millis(300));
        let mut runs = Vec::new();
        while std::time::Instant::now() < deadline {
            // The drain stops the schedule: wait for its end first (the queue policy runs every
            // job, however late).
            let done = !s.shared.released.as_ref().is_some_and(|r| r.running());
            if done {
                s.drain(Duration::from_secs(5));
                runs = s.released_runs();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(runs.len(), 1, "the released schedule did not end in 20 s");
        let tick = &runs[0];
        assert_eq!(tick.name, "tick");
        assert!(matches!(tick.end, Ok(LoopEnd::Completed)), "{:?}", tick.end);
        assert_eq!(tick.warmup_ns.len(), 2);
        assert!(tick.t0_ns.is_some());
        assert_eq!(tick.records.len(), 20);
        for (k, r) in tick.records.iter().enumerate() {
            // The absolute schedule of a run: job k at k·T from t0.
            assert_eq!(r.release_ns, k as i64 * 5_000_000);
            let (Some(start), Some(end)) = (r.start_ns, r.end_ns) else {
                panic!("job {k} did not run under `queue`");
            };
            assert!(start >= r.release_ns && end - start >= 200_000, "{r:?}");
        }
        // Every job reached /metrics, in run's families under the server's prefix; a served
        // model has none of them.
        let text = s.metrics().encode();
        for line in [
            r#"isolane_serve_released_jobs_total{workload="tick"} 20"#,
            r#"isolane_serve_released_jobs_completed_total{workload="tick"} 20"#,
            r#"isolane_serve_released_latency_seconds_count{workload="tick"} 20"#,
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "`{line}` missing from\n{text}"
            );
        }
        assert!(
            !text.contains(r#"released_jobs_total{workload="echo"}"#),
            "{text}"
        );
    }

    /// A released workload whose model cannot be built fails the server's start with its
    /// error, as a served model's does, and stops whatever was built.
    #[test]
    fn a_released_workload_that_cannot_be_built_fails_the_start() {
        let toml = "[device]\nbackend = \"cpu\"\n\n[[workload]]\nname = \"echo\"\n\
                    model = \"spin:300us\"\nrate_hz = 100\njobs = 1\n\n[[workload]]\n\
                    name = \"tick\"\nmodel = \"toy\"\nrate_hz = 100\njobs = 5\n";
        let scenario = Scenario::from_toml_str(toml, "t.toml", &["toy"]).unwrap();
        let plan = RunPlan::from_scenario(&scenario);
        let words: Vec<_> = plan
            .workloads
            .iter()
            .map(|_| ("cpu".into(), None))
            .collect();
        let options = ServeOptions {
            engine: Arc::new(NoEngine),
            seed: 1,
            records: None,
            released: Vec::new(),
            programs_dir: None,
        };
        let e = Server::start_releasing(&plan, &words, &options, None, &["tick".into()])
            .err()
            .unwrap();
        assert!(!e.is_user_error());
        let said = e.to_string();
        assert!(said.starts_with("workload `tick`: "), "{said}");
        assert!(said.contains("toy"), "{said}");
    }

    #[test]
    fn serve_out_gets_the_released_jobs_on_the_servers_time_base() {
        let dir = tempfile::tempdir().unwrap();
        let names = ["echo".to_string(), "tick".to_string()];
        let stream =
            isolane_runtime::jobs_stream::JobsStream::start(Some(dir.path()), &names, None)
                .unwrap();
        let base = isolane_runtime::clock::now_ns();
        let records = Some((vec![stream.sender(0), stream.sender(1)], base));
        let s = start_with(
            "rate_hz = 200
jobs = 10",
            &["tick"],
            records,
        )
        .unwrap();
        std::thread::sleep(Duration::from_millis(200));
        let until = std::time::Instant::now() + Duration::from_secs(20);
        while s.shared.released.as_ref().is_some_and(|r| r.running())
            && std::time::Instant::now() < until
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        s.drain(Duration::from_secs(5));
        let run = s.released_runs().remove(0);
        drop(s);
        stream.finish().unwrap();
        let path = dir.path().join("jobs/tick.csv");
        let written = isolane_runtime::output::read_jobs_csv(&path).unwrap();
        assert_eq!(written.len(), 10);
        // Each job as it ran, moved from the released t0 to the server's base.
        let shift = run.t0_ns.unwrap() - base;
        assert!(shift > 0);
        for (w, r) in written.iter().zip(&run.records) {
            assert_eq!(w.index, r.index);
            assert_eq!(w.release_ns, r.release_ns + shift, "{w:?}");
            assert_eq!(w.end_ns, r.end_ns.map(|e| e + shift), "{w:?}");
        }
    }

    /// The admission of a change beside the recorded H200 trio (results/h200-protection,
    /// green-load75: each model's p99 alone in its partition as profiles in a cache, each
    /// model's traffic from h200-models.csv), asked by CPU stand-ins of the same names: the
    /// stand-ins' specs are read as the trio's by name, as the binary's admission would read
    /// the H200 server's own.
    struct OnTheH200 {
        live: isolane_planner::foresee::LiveForesight,
        h200: Scenario,
        _cache: tempfile::TempDir,
    }

    impl OnTheH200 {
        fn new() -> OnTheH200 {
            let dir = tempfile::tempdir().unwrap();
            let (h200, live) = isolane_planner::foresee::recorded_h200_trio(dir.path());
            OnTheH200 {
                live,
                h200,
                _cache: dir,
            }
        }
    }

    impl AdmitChange for OnTheH200 {
        fn admit(&self, c: &Proposed<'_>) -> Result<(), String> {
            let on_h200 = |w: &WorkloadSpec| {
                let h = self.h200.workloads.iter().find(|h| h.name == w.name);
                h.cloned()
                    .unwrap_or_else(|| panic!("`{}` is not the trio's", w.name))
            };
            let others: Vec<WorkloadSpec> = c.others.iter().map(on_h200).collect();
            let from = c.from.map(on_h200);
            // The binary's admission (isolane_executors::foresee) answers a load so.
            match self
                .live
                .change(from.as_ref(), &on_h200(c.to), None, &others)
            {
                f @ isolane_core::admission::Foresight::Refuse(_) => {
                    Err(f.change_text("loading it"))
                }
                _ => Ok(()),
            }
        }
    }

    /// The trio as CPU stand-ins: the two critical models served, vit_l_32 released beside
    /// them (`serve --release be_vit_l_32`) or served too.
    fn trio(released: &[&str]) -> Server {
        let toml = "[device]\nbackend = \"cpu\"\n\n\
             [[workload]]\nname = \"v0_vit_b_16\"\nmodel = \"spin:300us\"\nrate_hz = 100\n\
             jobs = 1\nwarmup_jobs = 1\n\n\
             [[workload]]\nname = \"v1_resnet18\"\nmodel = \"spin:300us\"\nrate_hz = 100\n\
             jobs = 1\nwarmup_jobs = 1\n\n\
             [[workload]]\nname = \"be_vit_l_32\"\nmodel = \"spin:200us\"\nwarmup_jobs = 1\n\
             late = \"queue\"\nrate_hz = 100\njobs = 100000\n";
        let scenario =
            Scenario::from_toml_str(toml, "t.toml", &isolane_core::spec::NoBuiltinModels)
                .unwrap_or_else(|e| panic!("{e}"));
        let plan = RunPlan::from_scenario(&scenario);
        let words: Vec<_> = (plan.workloads.iter())
            .map(|_| ("cpu".into(), None))
            .collect();
        let options = ServeOptions {
            engine: Arc::new(NoEngine),
            seed: 1,
            records: None,
            released: Vec::new(),
            programs_dir: None,
        };
        let released: Vec<String> = released.iter().map(|s| s.to_string()).collect();
        let s = Server::start_releasing(&plan, &words, &options, None, &released)
            .unwrap_or_else(|e| panic!("{e}"));
        s.set_admission(Some(Arc::new(OnTheH200::new()) as Arc<dyn AdmitChange>));
        s
    }

    /// Issue 32/34: a released workload shares the GPU with the served models, so the live
    /// admission counts it as a neighbour: loading vit_b_16 again beside resnet18 and the
    /// released vit_l_32 is refused, naming vit_l_32 and the stretch; beside resnet18 alone
    /// (vit_l_32 served and unloaded) it is made; and once the drain stopped the releasing,
    /// vit_l_32 is nobody's neighbour.
    #[test]
    fn a_change_refused_because_of_a_released_neighbour_names_it() {
        let s = trio(&["be_vit_l_32"]);
        assert_eq!(s.models().count(), 2);
        s.unload_model("v0_vit_b_16").unwrap();
        let e = s.load_model("v0_vit_b_16").unwrap_err();
        assert_eq!(e.status, 409, "{}", e.message);
        assert!(
            e.message.starts_with(
                "model `v0_vit_b_16`: loading it: 1 critical workload is predicted to miss"
            ) && e.message.contains("'v0_vit_b_16'")
                && e.message.contains("'be_vit_l_32' (stretch 1.3"),
            "{}",
            e.message
        );
        assert!(!s.is_model_ready("v0_vit_b_16"));
        assert!(s.shared.released.as_ref().unwrap().running());
        s.drain(Duration::from_secs(5));
        assert!(s.shared.released.as_ref().unwrap().neighbours().is_empty());

        let s = trio(&[]);
        s.unload_model("be_vit_l_32").unwrap();
        s.unload_model("v0_vit_b_16").unwrap();
        assert_eq!(s.load_model("v0_vit_b_16").unwrap().kind, "load");
        assert_eq!(s.drain(Duration::from_secs(5)).abandoned, 0);
    }

    #[test]
    fn the_drain_stops_a_released_schedule() {
        let s = start("rate_hz = 100\njobs = 100000", &["tick"]).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        s.drain(Duration::from_secs(5));
        let runs = s.released_runs();
        assert_eq!(runs.len(), 1);
        assert!(
            matches!(runs[0].end, Ok(LoopEnd::Interrupted)),
            "{:?}",
            runs[0].end
        );
        let n = runs[0].records.len();
        assert!((1..100_000).contains(&n), "{n} jobs");
    }

    fn program_server(
        command: &str,
        released: &[&str],
        dir: Option<&std::path::Path>,
    ) -> Result<Server, crate::ServeError> {
        server_of(
            &format!("name = \"prog\"\ncommand = {command}"),
            released,
            None,
            dir,
        )
    }

    /// A command workload released beside the served models, as `run` runs it: its program
    /// starts once the models are warm, writes its output to the folder given, shows in
    /// /metrics' released families, and the drain stops it.
    #[test]
    fn a_released_program_runs_beside_the_models_until_the_drain() {
        let dir = tempfile::tempdir().unwrap();
        let command = r#"["sh", "-c", "echo started; exec sleep 60"]"#;
        let s = program_server(command, &["prog"], Some(dir.path())).unwrap();
        let stdout = dir.path().join("prog.stdout");
        let until = std::time::Instant::now() + Duration::from_secs(20);
        while std::fs::read_to_string(&stdout).unwrap_or_default() != "started\n" {
            assert!(
                std::time::Instant::now() < until,
                "the program did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        // The served model answers beside it; the program is not served.
        let answer = s.submit("echo", request()).unwrap().blocking_recv();
        assert_eq!(answer.unwrap().unwrap().outputs.len(), 1);
        assert_eq!(
            s.submit("prog", request()).unwrap_err().reason(),
            "unknown_model"
        );
        let text = s.metrics().encode();
        let line = r#"isolane_serve_released_jobs_total{workload="prog"} 0"#;
        assert!(
            text.lines().any(|l| l == line),
            "`{line}` missing from\n{text}"
        );
        let at = std::time::Instant::now();
        s.drain(Duration::from_secs(5));
        // Stopped, not waited for: its `sleep 60` is cut short.
        assert!(at.elapsed() < Duration::from_secs(50));
        let runs = s.released_runs();
        assert_eq!(runs.len(), 1);
        assert!(
            matches!(runs[0].end, Ok(LoopEnd::Interrupted)),
            "{:?}",
            runs[0].end
        );
        let program = runs[0].program.as_ref().expect("the program's outcome");
        assert_eq!(
            program.end,
            isolane_core::results::ProgramEnd::Interrupted,
            "{program:?}"
        );
        assert_eq!(program.stdout.as_deref(), Some(stdout.as_path()));
        assert!(runs[0].records.is_empty());
    }

    /// A program that ends by itself is complete; one that fails says why, as a run's does.
    #[test]
    fn a_released_program_that_ends_or_fails_says_so() {
        for (command, ok) in [(r#"["true"]"#, true), (r#"["sh", "-c", "exit 3"]"#, false)] {
            let s = program_server(command, &["prog"], None).unwrap();
            let until = std::time::Instant::now() + Duration::from_secs(20);
            while s.shared.released.as_ref().is_some_and(|r| r.running()) {
                assert!(std::time::Instant::now() < until, "{command} did not end");
                std::thread::sleep(Duration::from_millis(20));
            }
            s.drain(Duration::from_secs(5));
            let run = s.released_runs().remove(0);
            let program = run.program.as_ref().unwrap();
            if ok {
                assert!(matches!(run.end, Ok(LoopEnd::Completed)), "{:?}", run.end);
                assert_eq!(program.exit_code, Some(0));
            } else {
                let e = run.end.unwrap_err();
                assert!(e.contains('3'), "{e}");
                assert_eq!(program.exit_code, Some(3));
            }
        }
        // Not released, a program is refused: it takes no requests.
        let e = program_server(r#"["true"]"#, &[], None).err().unwrap();
        assert!(e.is_user_error());
        assert_eq!(
            e.to_string(),
            "workload `prog` runs a program (`command`), which has no inputs to serve; serve \
             takes models, and runs a program beside them with --release prog"
        );
    }

    #[test]
    fn a_released_name_must_be_a_workload() {
        let e = start("rate_hz = 100\njobs = 1", &["tock"]).err().unwrap();
        assert!(e.is_user_error());
        assert_eq!(
            e.to_string(),
            "released workload `tock` is not a workload of the scenario"
        );
        // Without it, both are served.
        let s = start("rate_hz = 100\njobs = 1", &[]).unwrap();
        assert_eq!(s.models().count(), 2);
        assert!(s.released_runs().is_empty());
        s.drain(Duration::from_secs(1));
    }
}
