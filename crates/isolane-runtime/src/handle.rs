//! The coordinator as a handle while its session runs (issue 32): a caller submits an input to
//! a workload and gets the output, and adds, removes and resizes the workloads' partitions
//! while the others go on.
//!
//! A [`Coordinator`] holds a session's slots, one per workload of its plan. Each slot is a
//! *front*, which callers reach (isolane-serve's served model: its queue, admission and
//! statistics), and at most one running *instance* behind it: a thread that built the model in
//! its partition through the session's [`Instances`] (one build at a time, the guard), warmed
//! it up and drives it. What a front is and how an instance is driven belong to the caller's
//! [`Driver`]; the lifecycle belongs here, once:
//!
//! - [`Coordinator::start`]: every slot's first instance, built one after the other;
//! - [`Coordinator::resize`]: a new instance (a new partition, or new settings) built and
//!   warmed while the old one serves, then switched in; the old one ends after its job;
//! - [`Coordinator::remove`]: the front lets its instance go, which ends and frees its
//!   executor (and with it its partition); the front stays, unloaded;
//! - [`Coordinator::add`]: an instance for an unloaded front, in a partition given now;
//! - [`Coordinator::admit`]: a change asked of the session's admission hook
//!   ([`AdmitChange`]) before anything is made, e.g. an interference prediction.
//!
//! One change at a time ([`Coordinator::change_turn`]): each is checked against the partitions
//! as the last one left them. `isolane run`'s fixed-rate workloads are released beside it by
//! [`crate::coordinator::Releasing`], with the same [`Instances`].

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use isolane_core::spec::{Host, WorkloadSpec};

use crate::exec::{ExecError, Executor};
use crate::instance::{GuardPart, How, Instances, PrepareError, Prepared};
use crate::partition::{Partition, Repartition};

/// Where an instance runs, in words (`cpu 2,3`, `green 24 SMs`, `mps 30%`), and its SMs in a
/// green partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    pub words: String,
    pub sms: Option<u32>,
}

/// The side of a slot that callers reach; it outlives the instances behind it.
pub trait Front: Send + Sync + 'static {
    /// Whether an instance serves it (false once removed, until added again).
    fn is_loaded(&self) -> bool;
}

/// A front that takes inputs: [`Coordinator::submit`].
pub trait Submit: Front {
    type Input;
    /// What the caller gets back at once (serve: the receiver of the answer).
    type Answer;
    type Refusal;
    fn submit(&self, input: Self::Input) -> Result<Self::Answer, Self::Refusal>;
}

/// What makes and drives a session's instances, whoever the caller is.
pub trait Driver: Send + Sync + 'static {
    type Front: Front;
    /// How an instance that replaced another took over (serve: when, and its pause).
    type Took: Send + 'static;

    /// Builds `spec`'s executor in `partition` on the instance's thread (slot `index`).
    fn build(
        &self,
        spec: &WorkloadSpec,
        index: usize,
        partition: Option<Partition>,
    ) -> Result<Box<dyn Executor>, ExecError>;

    /// Warm-up jobs before the instance serves.
    fn warmup_jobs(&self, spec: &WorkloadSpec) -> u64 {
        spec.warmup_jobs
    }

    /// The instance thread's name.
    fn thread_name(&self, spec: &WorkloadSpec) -> String {
        format!("isolane-{}", spec.name)
    }

    /// Why an instance could not be prepared, in the caller's words.
    fn prepare_failed(&self, e: PrepareError) -> String {
        e.to_string()
    }

    /// On the instance's thread, once warm: the front it serves and the instance number it
    /// serves as. A first instance (`existing` none) makes the front; a later one takes
    /// `existing`'s over (asked for at `requested`, ns, monotonic clock) and says how.
    /// `index`: the workload's position in the scenario.
    fn warm(
        &self,
        index: usize,
        spec: &WorkloadSpec,
        place: &Place,
        prepared: &Prepared,
        existing: Option<(&Arc<Self::Front>, i64)>,
    ) -> (Arc<Self::Front>, u64, Option<Self::Took>);

    /// Drives the instance until its front lets it go (a newer instance took over, a
    /// removal, the session's end).
    fn drive(&self, front: &Self::Front, instance: u64, prepared: Prepared, stop: &Arc<AtomicBool>);

    /// The session ends, or its start failed: the front takes nothing more, and its instance
    /// ends once what it took is done.
    fn close(&self, front: &Self::Front);
}

/// A change the session's admission is asked about before anything is made.
#[derive(Debug)]
pub struct Proposed<'a> {
    /// `add`, `resize` or `settings`.
    pub kind: &'static str,
    /// The workload as it is (`None`: unloaded).
    pub from: Option<&'a WorkloadSpec>,
    pub to: &'a WorkloadSpec,
    /// Its size afterwards in a green partition (the spec's own otherwise).
    pub sms: Option<u32>,
    /// The other loaded workloads, as they are.
    pub others: &'a [WorkloadSpec],
}

/// The session's admission of a change ([`Coordinator::set_admission`]): `Err` says why not,
/// in words, and the change is refused with nothing made.
pub trait AdmitChange: Send + Sync {
    fn admit(&self, change: &Proposed<'_>) -> Result<(), String>;
}

/// An instance that could not be made; the slot is as it was.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("workload `{workload}`: {message}")]
pub struct InstanceError {
    pub workload: String,
    pub message: String,
    /// The change's caller can fix it (a model file that is bad or missing now, a model
    /// loaded already): a server answers 4xx, a CLI exits 2.
    pub user: bool,
}

/// One workload of the session: its front, its running instance, the spec it was built from.
pub struct Slot<F> {
    /// The workload's position in the scenario (seeds its random stream, names its part in
    /// the guard).
    index: usize,
    front: Arc<F>,
    spec: Mutex<WorkloadSpec>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl<F> Slot<F> {
    pub fn index(&self) -> usize {
        self.index
    }

    pub fn front(&self) -> &Arc<F> {
        &self.front
    }

    /// The workload as its instance was last built (or its settings last changed).
    pub fn spec(&self) -> WorkloadSpec {
        lock(&self.spec).clone()
    }
}

/// The session's handle: see the module's comment.
pub struct Coordinator<D: Driver> {
    instances: Arc<Instances>,
    driver: Arc<D>,
    slots: Vec<Slot<D::Front>>,
    by_name: HashMap<String, usize>,
    /// Held by a change from its checks to its end, and by the session's end.
    control: Mutex<()>,
    /// Where a resized green partition comes from (`None`: green partitions cannot be made
    /// while running).
    repartition: Mutex<Option<Arc<dyn Repartition>>>,
    admission: Mutex<Option<Arc<dyn AdmitChange>>>,
}

/// One slot's first instance, as [`Coordinator::start`] takes it.
pub struct Start {
    pub index: usize,
    pub spec: WorkloadSpec,
    pub place: Place,
    pub partition: Option<Partition>,
}

/// What a [`Submit`] front answered at once.
pub type Submitted<F> = Result<<F as Submit>::Answer, <F as Submit>::Refusal>;

/// A started instance: its front, its thread, and how it took over (a later instance).
type Spawned<F, T> = (Arc<F>, JoinHandle<()>, Option<T>);

impl<D: Driver> Coordinator<D> {
    /// Builds and warms up each workload's first instance, one after the other, and returns
    /// once all serve. If one fails, those started are closed and joined, and its error said.
    pub fn start(
        instances: Arc<Instances>,
        driver: D,
        workloads: Vec<Start>,
    ) -> Result<Coordinator<D>, InstanceError> {
        let mut c = Coordinator {
            instances,
            driver: Arc::new(driver),
            slots: Vec::with_capacity(workloads.len()),
            by_name: HashMap::new(),
            control: Mutex::new(()),
            repartition: Mutex::new(None),
            admission: Mutex::new(None),
        };
        for w in workloads {
            let name = w.spec.name.clone();
            match c.spawn(w.index, w.spec.clone(), w.place, w.partition, None) {
                Ok((front, thread, _)) => {
                    c.by_name.insert(name, c.slots.len());
                    c.slots.push(Slot {
                        index: w.index,
                        front,
                        spec: Mutex::new(w.spec),
                        thread: Mutex::new(Some(thread)),
                    });
                }
                Err(e) => {
                    c.end();
                    return Err(e);
                }
            }
        }
        Ok(c)
    }

    pub fn instances(&self) -> &Arc<Instances> {
        &self.instances
    }

    pub fn driver(&self) -> &D {
        &self.driver
    }

    /// Every slot, in the order started.
    pub fn slots(&self) -> &[Slot<D::Front>] {
        &self.slots
    }

    /// Slot `name`'s position in [`Coordinator::slots`].
    pub fn position(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }

    /// Workload `name`'s front.
    pub fn front(&self, name: &str) -> Option<&Arc<D::Front>> {
        self.position(name).map(|i| &self.slots[i].front)
    }

    /// Submits `input` to workload `name`; `None` when the session has no such workload.
    pub fn submit(
        &self,
        name: &str,
        input: <D::Front as Submit>::Input,
    ) -> Option<Submitted<D::Front>>
    where
        D::Front: Submit,
    {
        self.front(name).map(|f| f.submit(input))
    }

    /// The turn to change the session: held from a change's checks to its end.
    pub fn change_turn(&self) -> MutexGuard<'_, ()> {
        lock(&self.control)
    }

    /// The turn, if no change holds it now.
    pub fn try_change_turn(&self) -> Option<MutexGuard<'_, ()>> {
        match self.control.try_lock() {
            Ok(g) => Some(g),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// Lets green partitions be made while running (a resize, an add).
    pub fn set_repartition(&self, r: Option<Arc<dyn Repartition>>) {
        *lock(&self.repartition) = r;
    }

    pub fn repartition(&self) -> Option<Arc<dyn Repartition>> {
        lock(&self.repartition).clone()
    }

    /// Asks `admission` about every change from now on ([`Coordinator::admit`]).
    pub fn set_admission(&self, admission: Option<Arc<dyn AdmitChange>>) {
        *lock(&self.admission) = admission;
    }

    /// Whether slot `i` may become `to` (`kind`: `add`, `resize`, `settings`; `sms`: its
    /// green size afterwards), beside the other loaded workloads as they are: the admission
    /// hook's answer, `Ok` without one. Asked before anything is made.
    pub fn admit(
        &self,
        i: usize,
        kind: &'static str,
        to: &WorkloadSpec,
        sms: Option<u32>,
    ) -> Result<(), String> {
        let Some(admission) = lock(&self.admission).clone() else {
            return Ok(());
        };
        let slot = &self.slots[i];
        let from = slot.front.is_loaded().then(|| slot.spec());
        let others = self.loaded_specs_but(i);
        admission.admit(&Proposed {
            kind,
            from: from.as_ref(),
            to,
            sms,
            others: &others,
        })
    }

    /// The specs of the loaded workloads other than slot `i`'s.
    pub fn loaded_specs_but(&self, i: usize) -> Vec<WorkloadSpec> {
        self.slots
            .iter()
            .enumerate()
            .filter(|&(j, s)| j != i && s.front.is_loaded())
            .map(|(_, s)| s.spec())
            .collect()
    }

    /// Keeps `spec` as slot `i`'s without a new instance (settings its front applies itself:
    /// a deadline, a criticality).
    pub fn set_spec(&self, i: usize, spec: WorkloadSpec) {
        *lock(&self.slots[i].spec) = spec;
    }

    /// A new instance for slot `i` (loaded) from `spec`, in `partition` (`None`: as the
    /// driver builds it without one), warmed while the old one serves, then switched in; the
    /// old instance's thread is joined (its executor and partition freed) before this returns.
    /// On an error the old instance still serves.
    pub fn resize(
        &self,
        i: usize,
        spec: WorkloadSpec,
        place: Place,
        partition: Option<Partition>,
        requested: i64,
    ) -> Result<Option<D::Took>, InstanceError> {
        self.replace(i, spec, place, partition, requested)
    }

    /// An instance for slot `i`, whose front is unloaded, from `spec` in `partition`.
    pub fn add(
        &self,
        i: usize,
        spec: WorkloadSpec,
        place: Place,
        partition: Option<Partition>,
        requested: i64,
    ) -> Result<Option<D::Took>, InstanceError> {
        if self.slots[i].front.is_loaded() {
            return Err(InstanceError {
                workload: spec.name,
                message: "it is loaded already; resize it instead".into(),
                user: true,
            });
        }
        self.replace(i, spec, place, partition, requested)
    }

    fn replace(
        &self,
        i: usize,
        spec: WorkloadSpec,
        place: Place,
        partition: Option<Partition>,
        requested: i64,
    ) -> Result<Option<D::Took>, InstanceError> {
        let slot = &self.slots[i];
        let existing = Some((Arc::clone(&slot.front), requested));
        let (_, thread, took) = self.spawn(slot.index, spec.clone(), place, partition, existing)?;
        let old = lock(&slot.thread).replace(thread);
        if let Some(t) = old {
            let _ = t.join();
        }
        *lock(&slot.spec) = spec;
        Ok(took)
    }

    /// Slot `i`'s front lets its instance go (`let_go`: e.g. answers what it took, then
    /// refuses); its thread is joined, which frees its executor and partition. The front
    /// stays, unloaded.
    pub fn remove<R>(&self, i: usize, let_go: impl FnOnce(&D::Front) -> R) -> R {
        let slot = &self.slots[i];
        let out = let_go(&slot.front);
        if let Some(t) = lock(&slot.thread).take() {
            let _ = t.join();
        }
        out
    }

    /// Joins every instance's thread (after the fronts let them go: the session's end).
    pub fn join(&self) {
        for slot in &self.slots {
            if let Some(t) = lock(&slot.thread).take() {
                let _ = t.join();
            }
        }
    }

    /// Closes every front and joins its instance: the session's end without a drain (a
    /// failed start).
    pub fn end(&self) {
        for slot in &self.slots {
            self.driver.close(&slot.front);
        }
        self.join();
    }

    /// Builds an instance of `spec` (slot `index`) on a thread of its own, in `partition`,
    /// pinned to `spec.cpu` (a worker process pins itself, and the thread that drives it
    /// stays off its cores), and waits until it is warm.
    fn spawn(
        &self,
        index: usize,
        spec: WorkloadSpec,
        place: Place,
        partition: Option<Partition>,
        existing: Option<(Arc<D::Front>, i64)>,
    ) -> Result<Spawned<D::Front, D::Took>, InstanceError> {
        // An error is its words and whether it is the caller's to fix.
        type Ready<F, T> = Result<(Arc<F>, Option<T>), (String, bool)>;
        let (ready_tx, ready_rx) = mpsc::channel::<Ready<D::Front, D::Took>>();
        let name = spec.name.clone();
        let failed = |message: String, user: bool| InstanceError {
            workload: name.clone(),
            message,
            user,
        };
        let driver = Arc::clone(&self.driver);
        let instances = Arc::clone(&self.instances);
        let thread = std::thread::Builder::new()
            .name(driver.thread_name(&spec))
            .spawn(move || {
                let replacement = existing.is_some();
                let mut build = |partition| driver.build(&spec, index, partition);
                let how = How {
                    warmup_jobs: driver.warmup_jobs(&spec),
                    pin: spec.host != Host::Process,
                    // A front publishes what it runs to the guard itself (it knows when
                    // inputs wait); a replacement warms up beside the instances serving, held.
                    guard: if replacement {
                        GuardPart::Replacement
                    } else {
                        GuardPart::BestEffortOnly
                    },
                    build: Some(&mut build),
                    check: None,
                };
                let prepared = match instances.prepare(index, &spec, index, partition, how) {
                    Ok(p) => p,
                    Err(e) => {
                        let user = matches!(e, PrepareError::Build(ExecError::BadModel { .. }));
                        let _ = ready_tx.send(Err((driver.prepare_failed(e), user)));
                        return;
                    }
                };
                let existing = existing.as_ref().map(|(f, at)| (f, *at));
                let (front, instance, took) =
                    driver.warm(index, &spec, &place, &prepared, existing);
                if ready_tx.send(Ok((Arc::clone(&front), took))).is_err() {
                    return;
                }
                driver.drive(&front, instance, prepared, instances.stop());
            })
            .map_err(|e| failed(format!("cannot start its thread: {e}"), false))?;
        match ready_rx.recv() {
            Ok(Ok((front, took))) => Ok((front, thread, took)),
            Ok(Err((message, user))) => {
                let _ = thread.join();
                Err(failed(message, user))
            }
            Err(_) => {
                let _ = thread.join();
                Err(failed(
                    "its thread ended while the model was built".into(),
                    false,
                ))
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::{Duration, Instant};

    use isolane_core::spec::Scenario;

    use super::*;
    use crate::coordinator::RunPlan;
    use crate::exec::SpinExecutor;

    /// A front that counts its instance's jobs and answers `input + jobs so far`.
    struct Counter {
        loaded: AtomicBool,
        instance: AtomicU64,
        next: AtomicU64,
        jobs: AtomicU64,
        closed: AtomicBool,
        /// The cores each instance was built for, in order.
        built: Mutex<Vec<Vec<usize>>>,
    }

    impl Front for Counter {
        fn is_loaded(&self) -> bool {
            self.loaded.load(Ordering::SeqCst)
        }
    }

    impl Submit for Counter {
        type Input = u64;
        type Answer = u64;
        type Refusal = String;
        fn submit(&self, input: u64) -> Result<u64, String> {
            if !self.is_loaded() {
                return Err("unloaded".into());
            }
            Ok(input + self.jobs.load(Ordering::SeqCst))
        }
    }

    /// `spin:` jobs of 100 µs; a workload named `broken` (or one given core 9999) fails to build.
    struct Spin;

    impl Driver for Spin {
        type Front = Counter;
        type Took = u64;

        fn build(
            &self,
            spec: &WorkloadSpec,
            _: usize,
            _: Option<Partition>,
        ) -> Result<Box<dyn Executor>, ExecError> {
            if spec.model == "spin:7ms" {
                return Err(ExecError::EngineUnavailable {
                    workload: spec.name.clone(),
                    model: spec.model.clone(),
                });
            }
            Ok(Box::new(SpinExecutor::new(100_000, 0, 1)))
        }

        fn warm(
            &self,
            _: usize,
            spec: &WorkloadSpec,
            _: &Place,
            _: &Prepared,
            existing: Option<(&Arc<Counter>, i64)>,
        ) -> (Arc<Counter>, u64, Option<u64>) {
            let front = match existing {
                Some((f, _)) => Arc::clone(f),
                None => Arc::new(Counter {
                    loaded: AtomicBool::new(true),
                    instance: AtomicU64::new(0),
                    next: AtomicU64::new(1),
                    jobs: AtomicU64::new(0),
                    closed: AtomicBool::new(false),
                    built: Mutex::new(Vec::new()),
                }),
            };
            lock(&front.built).push(spec.cpu.clone());
            if existing.is_none() {
                return (front, 0, None);
            }
            let n = front.next.fetch_add(1, Ordering::SeqCst);
            front.instance.store(n, Ordering::SeqCst);
            front.loaded.store(true, Ordering::SeqCst);
            (front, n, Some(n))
        }

        fn drive(&self, front: &Counter, instance: u64, mut p: Prepared, _: &Arc<AtomicBool>) {
            while front.instance.load(Ordering::SeqCst) == instance
                && !front.closed.load(Ordering::SeqCst)
            {
                p.executor.run_job().unwrap();
                front.jobs.fetch_add(1, Ordering::SeqCst);
            }
        }

        fn close(&self, front: &Counter) {
            front.closed.store(true, Ordering::SeqCst);
        }
    }

    fn session(models: &[&str]) -> (RunPlan, Arc<Instances>) {
        let body: String = models
            .iter()
            .enumerate()
            .map(|(i, m)| {
                format!(
                    "[[workload]]\nname = \"w{i}\"\nmodel = \"{m}\"\nrate_hz = 10\njobs = 1\n\
                     warmup_jobs = 1\n\n"
                )
            })
            .collect();
        let s = Scenario::from_toml_str(
            &format!("[device]\nbackend = \"cpu\"\n\n{body}"),
            "t.toml",
            &Vec::<String>::new(),
        )
        .unwrap();
        let plan = RunPlan::from_scenario(&s);
        let stop = Arc::new(AtomicBool::new(false));
        let instances = Arc::new(Instances::new(&plan, None, stop).unwrap());
        (plan, instances)
    }

    fn starts(plan: &RunPlan) -> Vec<Start> {
        plan.workloads
            .iter()
            .map(|w| Start {
                index: w.index,
                spec: w.spec.clone(),
                place: Place {
                    words: "cpu".into(),
                    sms: None,
                },
                partition: None,
            })
            .collect()
    }

    fn cpu() -> Place {
        Place {
            words: "cpu".into(),
            sms: None,
        }
    }

    /// Waits (generously: a loaded 2-core machine) until `f` holds.
    fn eventually(what: &str, f: impl Fn() -> bool) {
        let until = Instant::now() + Duration::from_secs(20);
        while !f() {
            assert!(Instant::now() < until, "{what} did not happen in 20 s");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn a_workload_is_resized_removed_and_added_while_the_others_run() {
        let (plan, instances) = session(&["spin:100us", "spin:100us"]);
        let c = Coordinator::start(instances, Spin, starts(&plan)).unwrap();
        assert_eq!(c.slots().len(), 2);
        assert_eq!(c.position("w1"), Some(1));
        assert_eq!(c.submit("w0", 5).map(|r| r.is_ok()), Some(true));
        assert!(c.submit("nobody", 5).is_none());
        let w0 = Arc::clone(c.front("w0").unwrap());
        let w1 = Arc::clone(c.front("w1").unwrap());
        eventually("w0's first jobs", || w0.jobs.load(Ordering::SeqCst) > 0);

        // A resize: a new instance from the changed spec takes over; the old one's thread is
        // joined before it returns.
        let mut moved = c.slots()[0].spec();
        moved.cpu = vec![0];
        let took = {
            let _turn = c.change_turn();
            c.resize(0, moved.clone(), cpu(), None, 0).unwrap()
        };
        assert_eq!(took, Some(1));
        assert_eq!(c.slots()[0].spec().cpu, vec![0]);
        assert_eq!(*lock(&w0.built), [vec![], vec![0]]);
        let before = w0.jobs.load(Ordering::SeqCst);
        eventually("the new instance's jobs", || {
            w0.jobs.load(Ordering::SeqCst) > before
        });

        // A removal: the front lets its instance go; the other workload runs on.
        let said = c.remove(1, |f| {
            f.loaded.store(false, Ordering::SeqCst);
            f.instance.store(u64::MAX, Ordering::SeqCst);
            "let go"
        });
        assert_eq!(said, "let go");
        assert_eq!(c.submit("w1", 1), Some(Err("unloaded".to_string())));
        let stopped = w1.jobs.load(Ordering::SeqCst);
        let before = w0.jobs.load(Ordering::SeqCst);
        eventually("w0 running on", || w0.jobs.load(Ordering::SeqCst) > before);
        assert_eq!(
            w1.jobs.load(Ordering::SeqCst),
            stopped,
            "w1's instance ended"
        );
        // Only its admission's view changes: w1 is no longer among the loaded.
        assert_eq!(c.loaded_specs_but(0).len(), 0);

        // A resize of a loaded workload is not an add.
        let e = c.add(0, moved, cpu(), None, 0).unwrap_err();
        assert_eq!(
            e.to_string(),
            "workload `w0`: it is loaded already; resize it instead"
        );
        // An add: the unloaded workload gets an instance again.
        assert_eq!(
            c.add(1, c.slots()[1].spec(), cpu(), None, 0).unwrap(),
            Some(1)
        );
        eventually("w1 again", || w1.jobs.load(Ordering::SeqCst) > stopped);
        assert!(c.submit("w1", 1).unwrap().is_ok());
        c.end();
    }

    #[test]
    fn an_instance_that_cannot_be_built_leaves_the_one_serving() {
        let (plan, instances) = session(&["spin:100us"]);
        let c = Coordinator::start(instances, Spin, starts(&plan)).unwrap();
        let w0 = Arc::clone(c.front("w0").unwrap());
        let mut broken = c.slots()[0].spec();
        broken.model = "spin:7ms".into();
        let e = c.resize(0, broken, cpu(), None, 0).unwrap_err();
        assert_eq!(e.workload, "w0");
        assert!(e.message.contains("spin:7ms"), "{e}");
        // The spec kept is the one serving, and it still runs.
        assert_eq!(c.slots()[0].spec().model, "spin:100us");
        let before = w0.jobs.load(Ordering::SeqCst);
        eventually("the old instance running on", || {
            w0.jobs.load(Ordering::SeqCst) > before
        });
        c.end();
        // A start that fails ends the instances already started.
        let (plan, instances) = session(&["spin:100us", "spin:7ms"]);
        let e = Coordinator::start(instances, Spin, starts(&plan))
            .err()
            .unwrap();
        assert_eq!(e.workload, "w1");
    }

    #[test]
    fn a_change_is_asked_of_the_admission_hook_with_the_others_as_they_are() {
        struct AtMost(u32, Mutex<Vec<String>>);
        impl AdmitChange for AtMost {
            fn admit(&self, p: &Proposed<'_>) -> Result<(), String> {
                let others: Vec<&str> = p.others.iter().map(|o| o.name.as_str()).collect();
                lock(&self.1).push(format!(
                    "{} {} from {} beside {others:?}",
                    p.kind,
                    p.to.name,
                    p.from.map_or("nothing", |f| f.model.as_str())
                ));
                match p.sms {
                    Some(n) if n > self.0 => Err(format!("{n} SMs would slow the others")),
                    _ => Ok(()),
                }
            }
        }
        let (plan, instances) = session(&["spin:100us", "spin:200us"]);
        let c = Coordinator::start(instances, Spin, starts(&plan)).unwrap();
        let spec = c.slots()[0].spec();
        // No hook: every change is admitted.
        assert_eq!(c.admit(0, "resize", &spec, Some(64)), Ok(()));
        let hook = Arc::new(AtMost(32, Mutex::new(Vec::new())));
        c.set_admission(Some(Arc::clone(&hook) as Arc<dyn AdmitChange>));
        assert_eq!(c.admit(0, "resize", &spec, Some(16)), Ok(()));
        assert_eq!(
            c.admit(0, "resize", &spec, Some(64)),
            Err("64 SMs would slow the others".to_string())
        );
        assert_eq!(
            lock(&hook.1)[0],
            r#"resize w0 from spin:100us beside ["w1"]"#
        );
        c.end();
    }
}
