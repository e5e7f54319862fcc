//! A session's model instances: one workload's model built once, inside its partition, on the
//! thread that will drive it, warmed up, with its part in the criticality guard.
//!
//! [`Instances`] is what every instance of one session is built with: the device, the engine,
//! the guard, the stop flag, and the turn that lets one instance build and warm up at a time.
//! `run` and the studies (the [`crate::coordinator`]) and `isolane serve` (isolane-serve's
//! `Server`) both build their instances through [`Instances::prepare`]; they differ only in the
//! driver that takes a warm instance over on the same thread:
//!
//! - a fixed-rate schedule: the release loop ([`crate::release::run_loop_guarded`]) after the
//!   session's start barrier, with the common t0 (docs/design.md, "Timing semantics"); the
//!   loop runs on the thread that executes the jobs, so no job is handed from one thread to
//!   another;
//! - requests: a served model's queue, admission and batching (isolane-serve's `model.rs`).
//!
//! A `host = "process"` workload's instance lives in an `isolane worker`: `run` spawns it with
//! the `setup` role, where it builds, warms up and runs the same release loop itself (so its
//! timing is a thread host's), while `serve` drives it as an executor through the `exec` role
//! ([`crate::remote_exec`]), built through [`Instances::prepare`] like any other.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use isolane_core::spec::{Criticality, DeviceSpec, TimingSpec, WorkloadSpec};

use crate::affinity::{self, AffinityError};
use crate::clock;
use crate::coordinator::RunPlan;
use crate::exec::{self, Engine, ExecError, Executor};
use crate::guard::{Guard, GuardRole, GuardSetup};
use crate::partition::Partition;
use crate::release::{warm_up, warmup_capacity};

/// What every instance of a session is built with.
pub struct Instances {
    device: DeviceSpec,
    timing: TimingSpec,
    engine: Option<Engine>,
    /// The session's criticality guard and each workload's part in it, by the plan's slot.
    guard: Option<(Arc<Guard>, Vec<GuardSetup>)>,
    /// Raised to stop: a warm-up ends early, a held best-effort piece stops waiting.
    stop: Arc<AtomicBool>,
    /// Held by the one instance that builds and warms up at a time. A CUDA build times its
    /// candidate kernels on the GPU and keeps the fastest; timed beside another instance's
    /// build or warm-up, they were measured under interference that the session does not
    /// have, and the choice (and the model's speed, up to 1.9× for resnet18 in 32 SMs)
    /// changed from run to run (docs/interference.md).
    turn: Mutex<()>,
}

/// Why an instance could not be prepared. Each caller words it as its users know it.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    /// The thread could not be pinned to the workload's cores.
    #[error("{0}")]
    Pin(AffinityError),
    /// The model could not be built.
    #[error(transparent)]
    Build(ExecError),
    /// A warm-up job failed.
    #[error("{0}")]
    WarmUp(ExecError),
    /// What the caller's check of the warm-up refused (a closed loop whose records would not
    /// fit this machine's memory).
    #[error("{0}")]
    Checked(String),
    /// The guard's shared file could not be opened.
    #[error("{0}")]
    Guard(std::io::Error),
}

/// A warm instance, ready for its driver.
pub struct Prepared {
    pub executor: Box<dyn Executor>,
    /// The warm-up jobs' service times (ns).
    pub warmup_ns: Vec<i64>,
    /// Its part in the guard, as [`How::guard`] asked.
    pub role: GuardRole,
}

/// Which part of the guard an instance takes at preparation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuardPart {
    /// Its whole part: a critical instance publishes through its role (the release loop).
    Full,
    /// Only a best-effort workload's (split into pieces, held), by the workload's criticality
    /// now (a change while serving may have changed it): a critical served model publishes
    /// through its queue instead, which knows when requests wait.
    BestEffortOnly,
    /// As `BestEffortOnly`, for an instance that replaces one while the models serve (a
    /// resize, a reload): a best-effort model's warm-up jobs after its first run held by the
    /// guard, piece by piece, as its served jobs are. On the H200 a replacement's warm-up ran
    /// unprotected beside the serving critical model, which went past its deadline. The build
    /// itself (a CUDA build's timing runs) is one call the guard cannot split or hold.
    Replacement,
}

/// How one instance is prepared.
pub struct How<'a> {
    /// Jobs run back to back before the driver takes over.
    pub warmup_jobs: u64,
    /// Pin the thread to the workload's cores before the build (a CPU model's thread pool
    /// inherits the mask). Not for a thread that drives a worker process: it stays off the
    /// worker's cores.
    pub pin: bool,
    pub guard: GuardPart,
    /// Builds the executor in the partition; `None`: the session's engine, on this thread.
    #[allow(clippy::type_complexity)]
    pub build: Option<&'a mut dyn FnMut(Option<Partition>) -> Result<Box<dyn Executor>, ExecError>>,
    /// Checks the warm-up's service times before the guard is joined.
    #[allow(clippy::type_complexity)]
    pub check: Option<&'a dyn Fn(&[i64]) -> Result<(), String>>,
}

impl Instances {
    /// The instances of `plan`'s workloads, built by `engine` (`None`: only `spin:` models),
    /// with the plan's guard when it protects anyone.
    pub fn new(
        plan: &RunPlan,
        engine: Option<Engine>,
        stop: Arc<AtomicBool>,
    ) -> std::io::Result<Instances> {
        Ok(Instances {
            device: plan.device.clone(),
            timing: plan.timing.clone(),
            engine,
            guard: plan.guard()?,
            stop,
            turn: Mutex::new(()),
        })
    }

    pub fn device(&self) -> &DeviceSpec {
        &self.device
    }

    pub fn timing(&self) -> &TimingSpec {
        &self.timing
    }

    pub fn engine(&self) -> Option<&Engine> {
        self.engine.as_ref()
    }

    pub fn stop(&self) -> &Arc<AtomicBool> {
        &self.stop
    }

    /// The session's guard (`None`: nobody is protected).
    pub fn guard(&self) -> Option<&Arc<Guard>> {
        self.guard.as_ref().map(|(g, _)| g)
    }

    /// The part of the workload in plan slot `slot` in the guard.
    pub fn guard_setup(&self, slot: usize) -> Option<&GuardSetup> {
        self.guard.as_ref().and_then(|(_, s)| s.get(slot))
    }

    /// Marks slot `slot`'s critical part finished, so that best effort stops leaving room for
    /// it (a no-op for best effort and unprotected sessions).
    pub fn guard_done(&self, slot: usize) {
        if let Some((g, setups)) = &self.guard {
            if let Some(c) = setups.get(slot).and_then(|s| s.critical_slot) {
                g.finish(c);
            }
        }
    }

    /// The turn to build and warm up (see [`Instances::prepare`]), for an instance prepared
    /// elsewhere: a worker process that builds its own.
    pub fn turn(&self) -> MutexGuard<'_, ()> {
        self.turn.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Builds workload `spec`'s instance (plan slot `slot`, scenario position `index`) on the
    /// calling thread, in `partition`, in its turn; warms it up; gives it its part in the
    /// guard.
    pub fn prepare(
        &self,
        slot: usize,
        spec: &WorkloadSpec,
        index: usize,
        partition: Option<Partition>,
        how: How<'_>,
    ) -> Result<Prepared, PrepareError> {
        if how.pin {
            affinity::pin_current_thread(&spec.cpu).map_err(PrepareError::Pin)?;
        }
        let _turn = self.turn();
        let mut executor = match how.build {
            Some(build) => build(partition),
            None => exec::executor_for(
                self.engine.as_deref(),
                &spec.device(&self.device),
                spec,
                self.timing.seed,
                index,
                partition,
            ),
        }
        .map_err(PrepareError::Build)?;
        let setup = match how.guard {
            GuardPart::Full => self.guard_setup(slot),
            GuardPart::BestEffortOnly | GuardPart::Replacement => self
                .guard_setup(slot)
                .filter(|_| spec.criticality != Criticality::Critical),
        };
        // Only a replacement: at the start no critical model publishes yet, and a held
        // warm-up would wait for one that waits for this instance's turn.
        let held =
            how.guard == GuardPart::Replacement && setup.is_some_and(|s| s.critical_slot.is_none());
        let mut warmup_ns = Vec::with_capacity(warmup_capacity(how.warmup_jobs));
        // A held warm-up's first job runs as it is: its time is what the guard's estimate of
        // the jobs held after it starts from.
        let first = if held {
            how.warmup_jobs.min(1)
        } else {
            how.warmup_jobs
        };
        warm_up(executor.as_mut(), first, &mut warmup_ns, &self.stop)
            .map_err(PrepareError::WarmUp)?;
        let check = |warmup_ns: &[i64]| match how.check {
            Some(check) => check(warmup_ns).map_err(PrepareError::Checked),
            None => Ok(()),
        };
        if !held {
            check(&warmup_ns)?;
        }
        if how.guard != GuardPart::Full && setup.is_none() {
            self.set_l2_aside(slot, executor.as_mut())?;
        }
        let mut role = GuardRole::attach(setup, self.guard(), executor.as_mut(), &warmup_ns)
            .map_err(PrepareError::Guard)?;
        if let (true, GuardRole::BestEffort(hold)) = (held, &mut role) {
            for _ in first..how.warmup_jobs {
                if self.stop.load(Ordering::Relaxed) {
                    break;
                }
                // Its service time is the pieces' own, not the holds between them.
                let mut ran = 0;
                for i in 0..executor.pieces() {
                    hold.before_piece(i, &self.stop);
                    let a = clock::now_ns();
                    executor.run_piece(i).map_err(PrepareError::WarmUp)?;
                    ran += clock::now_ns() - a;
                }
                hold.job_done();
                warmup_ns.push(ran);
            }
            check(&warmup_ns)?;
        }
        Ok(Prepared {
            executor,
            warmup_ns,
            role,
        })
    }
}

impl Instances {
    /// A critical served model publishes through its queue and takes no guard role, but its
    /// weights get their L2 set aside (`[protection] l2_persist_mib`) as a run's critical
    /// workload's do when it joins the guard.
    fn set_l2_aside(&self, slot: usize, executor: &mut dyn Executor) -> Result<(), PrepareError> {
        let (Some(guard), Some(setup)) = (self.guard(), self.guard_setup(slot)) else {
            return Ok(());
        };
        let mib = guard.policy().l2_persist_mib;
        if setup.critical_slot.is_none() || mib == 0 {
            return Ok(());
        }
        executor
            .persist_weights_in_l2(mib)
            .map_err(|e| PrepareError::Guard(std::io::Error::other(e.to_string())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use isolane_core::spec::Scenario;

    fn plan(body: &str) -> RunPlan {
        let s = Scenario::from_toml_str(
            &format!("[device]\nbackend = \"cpu\"\n\n{body}"),
            "t.toml",
            &Vec::<String>::new(),
        )
        .unwrap();
        RunPlan::from_scenario(&s)
    }

    const PAIR: &str = "[[workload]]\nname = \"c\"\nmodel = \"spin:200us\"\nrate_hz = 10\n\
                        jobs = 1\nwarmup_jobs = 3\n\n[[workload]]\nname = \"b\"\n\
                        model = \"spin:1ms\"\nrate_hz = 10\njobs = 1\nwarmup_jobs = 3\n\
                        criticality = \"best_effort\"\n";

    fn how<'a>(guard: GuardPart) -> How<'a> {
        How {
            warmup_jobs: 3,
            pin: true,
            guard,
            build: None,
            check: None,
        }
    }

    #[test]
    fn an_instance_is_built_warmed_up_and_given_its_part_in_the_guard() {
        let p = plan(PAIR);
        let instances = Instances::new(&p, None, Arc::new(AtomicBool::new(false))).unwrap();
        assert!(instances.guard().is_some(), "critical beside best effort");
        let w = &p.workloads;
        let c = instances
            .prepare(0, &w[0].spec, 0, None, how(GuardPart::Full))
            .unwrap();
        assert_eq!(c.warmup_ns.len(), 3);
        assert!(
            c.warmup_ns.iter().all(|&t| t >= 200_000),
            "{:?}",
            c.warmup_ns
        );
        assert!(matches!(c.role, GuardRole::Critical(_)));
        // A served critical model publishes through its queue: no role of its own.
        let c = instances
            .prepare(0, &w[0].spec, 0, None, how(GuardPart::BestEffortOnly))
            .unwrap();
        assert!(matches!(c.role, GuardRole::Off));
        let b = instances
            .prepare(1, &w[1].spec, 1, None, how(GuardPart::BestEffortOnly))
            .unwrap();
        assert!(matches!(b.role, GuardRole::BestEffort(_)));
    }

    #[test]
    fn a_best_effort_replacement_warms_up_held_by_the_guard_and_a_first_instance_does_not() {
        // On the H200 a resize's new instance warmed up beside the serving critical model,
        // unprotected, and the critical model went past its deadline. A replacement's
        // warm-up is now held while the critical slot has no room (here: not known yet, as
        // between two of its jobs), and goes on once it has.
        let p = plan(PAIR);
        let instances = Instances::new(&p, None, Arc::new(AtomicBool::new(false))).unwrap();
        let guard = Arc::clone(instances.guard().unwrap());
        let critical = instances.guard_setup(0).unwrap().critical_slot.unwrap();
        let w = &p.workloads;
        // A first instance (the start: nobody publishes yet) is not held.
        let b = instances
            .prepare(1, &w[1].spec, 1, None, how(GuardPart::BestEffortOnly))
            .unwrap();
        assert_eq!(b.warmup_ns.len(), 3);
        let released = std::thread::scope(|s| {
            let released = s.spawn(|| {
                std::thread::sleep(std::time::Duration::from_millis(300));
                let at = clock::now_ns();
                crate::guard::CriticalPublisher::new(Arc::clone(&guard), critical, 200_000, None)
                    .finished();
                at
            });
            let b = instances
                .prepare(1, &w[1].spec, 1, None, how(GuardPart::Replacement))
                .unwrap();
            let done = clock::now_ns();
            assert!(matches!(b.role, GuardRole::BestEffort(_)));
            assert_eq!(b.warmup_ns.len(), 3, "{:?}", b.warmup_ns);
            // Each held job's time is its own run, not the wait.
            assert!(
                b.warmup_ns.iter().all(|&t| t < 300_000_000),
                "{:?}",
                b.warmup_ns
            );
            (released.join().unwrap(), done)
        });
        assert!(
            released.1 > released.0,
            "the replacement's warm-up ended before the critical slot let best effort run"
        );
    }

    /// Records the L2 it was asked to set aside.
    struct L2Probe(Arc<std::sync::atomic::AtomicU64>);

    impl Executor for L2Probe {
        fn run_job(&mut self) -> Result<(), ExecError> {
            Ok(())
        }

        fn persist_weights_in_l2(&mut self, mib: u64) -> Result<(), ExecError> {
            self.0.store(mib, std::sync::atomic::Ordering::Relaxed);
            Ok(())
        }
    }

    /// HH's wiring note: a served critical model took no guard role, so `l2_persist_mib`
    /// never reached it; it does now, as a run's critical workload's role gives it.
    #[test]
    fn a_served_critical_model_gets_its_l2_set_aside() {
        let p = plan(&format!("[protection]\nl2_persist_mib = 6\n\n{PAIR}"));
        let instances = Instances::new(&p, None, Arc::new(AtomicBool::new(false))).unwrap();
        for (slot, part, want) in [
            (0, GuardPart::BestEffortOnly, 6),
            (0, GuardPart::Full, 6),
            // Best effort keeps no L2.
            (1, GuardPart::BestEffortOnly, 0),
        ] {
            let asked = Arc::new(std::sync::atomic::AtomicU64::new(0));
            let probe = Arc::clone(&asked);
            let mut build = move |_: Option<Partition>| -> Result<Box<dyn Executor>, ExecError> {
                Ok(Box::new(L2Probe(Arc::clone(&probe))))
            };
            let how = How {
                build: Some(&mut build),
                ..how(part)
            };
            instances
                .prepare(slot, &p.workloads[slot].spec, slot, None, how)
                .unwrap();
            let got = asked.load(std::sync::atomic::Ordering::Relaxed);
            assert_eq!(got, want, "slot {slot} {part:?}");
        }
    }

    #[test]
    fn each_failure_says_which_step_failed() {
        let p = plan(PAIR);
        let instances = Instances::new(&p, None, Arc::new(AtomicBool::new(false))).unwrap();
        let mut spec = p.workloads[0].spec.clone();
        // A core no machine has: refused before anything is built.
        spec.cpu = vec![100_000];
        let e = instances
            .prepare(0, &spec, 0, None, how(GuardPart::Full))
            .err()
            .unwrap();
        assert!(matches!(e, PrepareError::Pin(_)), "{e}");
        // A model that needs an engine, in a session without one.
        let mut spec = p.workloads[0].spec.clone();
        spec.model = "mobilenet_v2".into();
        let e = instances
            .prepare(0, &spec, 0, None, how(GuardPart::Full))
            .err()
            .unwrap();
        assert!(matches!(e, PrepareError::Build(_)), "{e}");
        // The caller's check sees the warm-up and its refusal is said as it is.
        let refuse = |t: &[i64]| Err(format!("{} warm-up jobs refused", t.len()));
        let e = instances
            .prepare(
                0,
                &p.workloads[0].spec,
                0,
                None,
                How {
                    check: Some(&refuse),
                    ..how(GuardPart::Full)
                },
            )
            .err()
            .unwrap();
        assert_eq!(e.to_string(), "3 warm-up jobs refused");
    }

    #[test]
    fn a_given_builder_builds_the_executor() {
        let p = plan(PAIR);
        let instances = Instances::new(&p, None, Arc::new(AtomicBool::new(false))).unwrap();
        let mut built = 0;
        let mut build = |_: Option<Partition>| -> Result<Box<dyn Executor>, ExecError> {
            built += 1;
            Ok(Box::new(exec::SpinExecutor::new(1_000, 0, 1)))
        };
        let ready = instances
            .prepare(
                1,
                &p.workloads[1].spec,
                1,
                None,
                How {
                    build: Some(&mut build),
                    ..how(GuardPart::Full)
                },
            )
            .unwrap();
        // 1 µs jobs, not the spec's 1 ms: the builder's executor ran the warm-up.
        assert!(ready.warmup_ns.iter().any(|&t| t < 1_000_000));
        assert_eq!(built, 1);
    }
}
