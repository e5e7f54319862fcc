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
use isolane_runtime::jobs_stream::BatchSender;
use isolane_runtime::release::{capacity_for, run_loop_guarded, LoopEnd, RecordSink};

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
    // `serve --out`: the records join the served models' in jobs/<workload>.csv, on the
    // server's time base, while the schedule goes on.
    let out = ctx.records.as_ref().and_then(|(sinks, records_t0)| {
        sinks
            .get(w.index)
            .map(|s| (s.clone(), t0.saturating_sub(*records_t0)))
    });
    let mut sink = Shifted {
        records: Vec::with_capacity(capacity_for(&w.schedule, hint)),
        out,
        sent: 0,
    };
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
    sink.flush();
    run.records = sink.records;
    run.end = end.map_err(|e| e.to_string());
    run
}

/// Keeps a released workload's records (relative to its t0) and hands them, moved to the
/// server's time base, to `serve --out`'s writer whenever the loop waits for a release.
struct Shifted {
    records: Vec<JobRecord>,
    /// The writer, and the ns from the server's time base to the released t0.
    out: Option<(BatchSender, i64)>,
    /// Records before this index have been handed to the writer.
    sent: usize,
}

impl Shifted {
    fn flush(&mut self) {
        if let Some((out, shift)) = &self.out {
            let shifted: Vec<JobRecord> = self.records[self.sent..]
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
        self.sent = self.records.len();
    }
}

impl RecordSink for Shifted {
    fn record(&mut self, rec: &JobRecord) {
        self.records.push(*rec);
    }

    // Called only with a wait ahead (IDLE_MIN_NS beyond the spin): the copy costs no job's
    // timing.
    fn idle(&mut self, _until_ns: i64) {
        self.flush();
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
            records,
            released: Vec::new(),
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
        while s.shared.released.iter().any(|r| {
            r.thread
                .lock()
                .unwrap()
                .as_ref()
                .is_some_and(|t| !t.is_finished())
        }) && std::time::Instant::now() < until
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
