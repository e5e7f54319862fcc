//! Fixed-rate jobs beside requests: a workload of the served scenario that is not served but
//! released on its own schedule (`rate_hz`, `jobs` or `duration_s`, `late`, `deadline_ms`,
//! `phase_ms`), as `isolane run` releases it. Its instance is one of the server's: built,
//! warmed up and given its part in the guard by the server's `Instances`, like a served
//! model's; then the release loop drives it on that same thread
//! (`isolane_runtime::release::run_loop_guarded`), so the timing is a run's (docs/design.md,
//! "Timing semantics"): an absolute schedule from one t0 common to every released workload,
//! taken once all the server's instances are warm (`[timing] start_delay_ms` after), the late
//! policy, response times from the scheduled release.

use std::sync::atomic::AtomicBool;
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use isolane_core::spec::Host;
use isolane_core::JobRecord;
use isolane_runtime::coordinator::WorkloadPlan;
use isolane_runtime::instance::{GuardPart, How};
use isolane_runtime::release::{capacity_for, run_loop_guarded, LoopEnd, VecSink};

use crate::{host, InstanceContext, ServeError};

/// What a released workload ran, once the server has drained.
#[derive(Debug, Clone)]
pub struct ReleasedRun {
    pub name: String,
    /// Its jobs, relative to the released workloads' t0 (as a run's records are).
    pub records: Vec<JobRecord>,
    /// The warm-up jobs' service times (ns).
    pub warmup_ns: Vec<i64>,
    /// `Completed`: every scheduled job was released; `Interrupted`: the drain stopped it (or
    /// the server never started); `Err`: a job failed.
    pub end: Result<LoopEnd, String>,
    /// The released workloads' t0 (ns, monotonic clock); `None` if it never started.
    pub t0_ns: Option<i64>,
}

/// The start of every released workload: the common t0, or none (the server did not start).
#[derive(Default)]
pub(crate) struct Start {
    t0: Mutex<Option<Option<i64>>>,
    cv: Condvar,
}

impl Start {
    pub(crate) fn open(&self, t0: Option<i64>) {
        *self.t0.lock().unwrap_or_else(|p| p.into_inner()) = Some(t0);
        self.cv.notify_all();
    }

    fn wait(&self) -> Option<i64> {
        let mut g = self.t0.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(t0) = *g {
                return t0;
            }
            g = self.cv.wait(g).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// A released workload's thread, in the server's state.
pub(crate) struct Released {
    pub(crate) thread: Mutex<Option<JoinHandle<ReleasedRun>>>,
}

/// Builds and warms up plan slot `slot`'s workload `w` on a thread of its own and returns once
/// it is warm; the thread then waits for `start` and releases its jobs until its schedule ends
/// or `stop` is raised (the drain).
pub(crate) fn spawn(
    ctx: &InstanceContext,
    slot: usize,
    w: &WorkloadPlan,
    start: Arc<Start>,
    stop: Arc<AtomicBool>,
) -> Result<Released, ServeError> {
    let ctx = ctx.clone();
    let w = w.clone();
    let name = w.spec.name.clone();
    let failed = |message: String| ServeError::Model {
        workload: name.clone(),
        message,
    };
    let (ready_tx, ready_rx) = mpsc::channel::<Result<(), String>>();
    let thread = std::thread::Builder::new()
        .name(format!("release-{}", w.spec.name))
        .spawn(move || {
            let run = release(&ctx, slot, &w, &start, &stop, &ready_tx);
            // However it ended, best effort stops leaving room for it.
            ctx.instances.guard_done(slot);
            run
        })
        .map_err(|e| failed(format!("cannot start its thread: {e}")))?;
    match ready_rx.recv() {
        Ok(Ok(())) => Ok(Released {
            thread: Mutex::new(Some(thread)),
        }),
        Ok(Err(message)) => {
            let _ = thread.join();
            Err(failed(message))
        }
        Err(_) => {
            let _ = thread.join();
            Err(failed("its thread ended while the model was built".into()))
        }
    }
}

fn release(
    ctx: &InstanceContext,
    slot: usize,
    w: &WorkloadPlan,
    start: &Start,
    stop: &AtomicBool,
    ready: &mpsc::Sender<Result<(), String>>,
) -> ReleasedRun {
    let spec = &w.spec;
    let mut run = ReleasedRun {
        name: spec.name.clone(),
        records: Vec::new(),
        warmup_ns: Vec::new(),
        end: Ok(LoopEnd::Interrupted),
        t0_ns: None,
    };
    let device = spec.device(ctx.instances.device());
    let mut build = |partition| {
        host::build_executor(
            &ctx.engine,
            &device,
            spec,
            (ctx.seed, w.index, ctx.poll_ns),
            partition,
            ctx.processes.as_ref(),
        )
    };
    let how = How {
        warmup_jobs: spec.warmup_jobs,
        pin: spec.host != Host::Process,
        guard: GuardPart::Full,
        build: Some(&mut build),
        check: None,
    };
    let prepared = ctx
        .instances
        .prepare(slot, spec, w.index, w.partition.take(), how);
    let mut prepared = match prepared {
        Ok(p) => p,
        Err(e) => {
            let message = e.to_string();
            let _ = ready.send(Err(message.clone()));
            run.end = Err(message);
            return run;
        }
    };
    run.warmup_ns = std::mem::take(&mut prepared.warmup_ns);
    if ready.send(Ok(())).is_err() {
        return run;
    }
    let Some(t0) = start.wait() else {
        return run;
    };
    run.t0_ns = Some(t0);
    let hint = (!run.warmup_ns.is_empty())
        .then(|| run.warmup_ns.iter().sum::<i64>() / run.warmup_ns.len() as i64);
    let mut sink = VecSink::with_capacity(capacity_for(&w.schedule, hint), None);
    let spin_ns = ctx.instances.timing().spin_us as i64 * 1000;
    let end = run_loop_guarded(
        prepared.executor.as_mut(),
        &w.schedule,
        t0,
        spin_ns,
        stop,
        &mut sink,
        &mut prepared.role,
    );
    run.records = sink.records;
    run.end = end.map_err(|e| e.to_string());
    // `serve --out`: the records join the served models' in jobs/<workload>.csv, on the
    // server's time base.
    if let Some((sinks, records_t0)) = &ctx.records {
        if let Some(out) = sinks.get(w.index) {
            let shift = t0 - records_t0;
            let shifted: Vec<JobRecord> = run
                .records
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
    run
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use isolane_core::spec::Scenario;
    use isolane_protocol::{DataType, Tensor};
    use isolane_runtime::coordinator::RunPlan;
    use isolane_runtime::exec::{EngineExecutors, ExecError, Executor, SPIN_INPUT};

    use crate::{InferRequest, ServeOptions, Server};

    use super::*;

    /// `spin:` models only: they need no engine.
    struct NoEngine;

    impl EngineExecutors for NoEngine {
        fn check(
            &self,
            _: &isolane_core::spec::DeviceSpec,
            _: &isolane_core::spec::WorkloadSpec,
        ) -> Result<(), ExecError> {
            Ok(())
        }

        fn build(
            &self,
            _: &isolane_core::spec::DeviceSpec,
            spec: &isolane_core::spec::WorkloadSpec,
            _: u64,
            _: usize,
            _: Option<isolane_runtime::partition::Partition>,
        ) -> Result<Box<dyn Executor>, ExecError> {
            Err(ExecError::EngineUnavailable {
                workload: spec.name.clone(),
                model: spec.model.clone(),
            })
        }
    }

    fn start(tick: &str, released: &[&str]) -> Result<Server, crate::ServeError> {
        let toml = format!(
            "[device]\nbackend = \"cpu\"\n\n[[workload]]\nname = \"echo\"\n\
             model = \"spin:300us\"\nrate_hz = 100\njobs = 1\nwarmup_jobs = 1\n\n\
             [[workload]]\nname = \"tick\"\nmodel = \"spin:200us\"\nwarmup_jobs = 2\n\
             late = \"queue\"\n{tick}\n"
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
            records: None,
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
            let done = s.shared.released.iter().all(|r| {
                r.thread
                    .lock()
                    .unwrap()
                    .as_ref()
                    .is_none_or(|t| t.is_finished())
            });
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
