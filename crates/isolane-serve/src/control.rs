//! Control while serving (docs/serve.md, "Control while serving"): a model's partition,
//! deadline and criticality changed, and the model unloaded and loaded again, without stopping
//! the server.
//!
//! As Triton's model instances: a served model is its queue, admission and statistics (shared)
//! plus one running instance (a thread, its executor, its partition). A change that needs
//! another partition builds a new instance there and warms it while the old one serves; then
//! the new one takes the queue over and the old one ends after the job it runs. Requests queue
//! meanwhile and are answered; admission predicts with the new instance's service time from
//! the switch on. The pause (the time the model served nothing) is the handoff: from the old
//! instance's last job to the new one free to take a job. Every change is checked first
//! (cores that exist and no other model holds, a deadline the model can meet, a criticality
//! the guard can follow), and a refusal names the limit.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use isolane_core::spec::{Backend, Criticality};
use isolane_protocol::RepositoryIndexEntry;
use isolane_runtime::clock;

use crate::model::{Load, ServedModel};
use crate::{ModelInfo, Server};

/// The keys a change may set (`ctl resize NAME KEY=VALUE…`).
pub const KEYS: &str = "cpu=LIST (cores, e.g. 2,3 or 0-3), sms=N (green SMs, on a GPU), \
                        thread_pct=P (MPS), deadline_ms=MS, criticality=critical|best_effort";

/// How long an unload waits for the requests it took to be answered.
pub const UNLOAD_GRACE: Duration = Duration::from_secs(30);

/// A change made while serving, as `ctl` and the metrics report it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Change {
    pub model: String,
    /// `resize` (a new instance in another partition), `reload` (a new instance in the same
    /// one), `load`, `unload`, `settings` (deadline or criticality: no new instance).
    pub kind: &'static str,
    /// What changed, in words (`cpu 0 → 1`, `deadline_ms 50 → 20`).
    pub what: Vec<String>,
    /// From the request to the new instance serving (to the model unloaded, for an unload;
    /// to the settings replaced, for `settings`), ms.
    pub took_ms: f64,
    /// The time the model served nothing, ms; none when no instance served before (a load) or
    /// none was replaced (`settings`, `unload`).
    pub pause_ms: Option<f64>,
    /// Requests still queued when an unload's time ran out, refused.
    pub abandoned: usize,
    /// The model's partition afterwards, in words.
    pub partition: String,
}

/// A refused or failed change: the HTTP status it is answered with, and why.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct ControlError {
    /// 400 a malformed change, 404 an unknown model, 409 one the server's state or
    /// partitions refuse, 503 while draining, 500 a new instance that failed (the old one
    /// still serves).
    pub status: u16,
    pub message: String,
}

impl ControlError {
    fn new(status: u16, message: impl Into<String>) -> ControlError {
        ControlError {
            status,
            message: message.into(),
        }
    }
}

/// One model as `ctl status` shows it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ModelStatus {
    pub name: String,
    /// `READY` or `UNAVAILABLE` (unloaded, or the server draining), as the repository index.
    pub state: &'static str,
    pub backend: &'static str,
    pub partition: String,
    pub cpu: Vec<usize>,
    pub sms: Option<u32>,
    pub criticality: &'static str,
    pub deadline_ms: Option<f64>,
    pub load: Load,
    pub last_change: Option<Change>,
}

impl Server {
    /// The repository index: every model with its state (`READY`, or `UNAVAILABLE` with the
    /// reason: unloaded, or the server shutting down); `ready_only` lists the ready ones.
    pub fn repository_index(&self, ready_only: bool) -> Vec<RepositoryIndexEntry> {
        let serving = self.is_ready();
        self.shared
            .models()
            .filter_map(|m| {
                let loaded = m.is_loaded();
                let ready = serving && loaded;
                if ready_only && !ready {
                    return None;
                }
                let mut entry = crate::wire::index_entry(&m.info(), ready);
                if serving && !loaded {
                    entry.reason = "unloaded".into();
                }
                Some(entry)
            })
            .collect()
    }

    /// Every model's partition, criticality, deadline and load.
    pub fn status(&self) -> Vec<ModelStatus> {
        let ready = self.is_ready();
        self.shared
            .models()
            .zip(&self.shared.last)
            .map(|(m, last)| {
                let info = m.info();
                ModelStatus {
                    name: info.name.clone(),
                    state: if ready && m.is_loaded() {
                        "READY"
                    } else {
                        "UNAVAILABLE"
                    },
                    backend: info.backend,
                    partition: info.partition.clone(),
                    cpu: info.cpu.clone(),
                    sms: info.sms,
                    criticality: info.criticality.name(),
                    deadline_ms: info.deadline.map(|d| d.as_secs_f64() * 1e3),
                    load: m.load(),
                    last_change: lock(last).clone(),
                }
            })
            .collect()
    }

    /// Changes model `name`'s settings (`KEY=VALUE`s, [`KEYS`]), all checked before any is
    /// made. A new partition (`cpu`) starts a new instance there, which takes over once warm;
    /// a deadline or criticality alone replaces no instance.
    pub fn change(
        &self,
        name: &str,
        settings: &[(String, String)],
    ) -> Result<Change, ControlError> {
        let requested = clock::now_ns();
        let (i, model) = self.control_target(name)?;
        let coordinator = &self.shared.coordinator;
        let _one = coordinator.change_turn();
        self.refuse_while_draining(name)?;
        if !model.is_loaded() {
            return Err(ControlError::new(
                409,
                format!(
                    "model `{name}` is unloaded; load it first (POST \
                     /v2/repository/models/{name}/load, or isolane ctl load {name})"
                ),
            ));
        }
        if settings.is_empty() {
            return Err(ControlError::new(
                400,
                format!("model `{name}`: nothing to change; expected KEY=VALUE: {KEYS}"),
            ));
        }
        let slot = &coordinator.slots()[i];
        let info = model.info();
        let mut spec = slot.spec();
        let mut what = Vec::new();
        let mut rebuild = false;
        // A green partition's new size: a new green context, made before the new instance.
        let mut green: Option<u32> = None;
        let mut seen: Vec<&str> = Vec::new();
        for (key, value) in settings {
            let bad = |allowed: &str| {
                ControlError::new(
                    400,
                    format!("model `{name}`: {key}=`{value}`: expected {allowed}"),
                )
            };
            if seen.contains(&key.as_str()) {
                return Err(ControlError::new(
                    400,
                    format!("model `{name}`: {key} is given twice"),
                ));
            }
            seen.push(key);
            match key.as_str() {
                "cpu" => {
                    if info.backend != "cpu" {
                        return Err(ControlError::new(
                            400,
                            format!(
                                "model `{name}` runs on the GPU: cpu= moves a CPU model's \
                                 threads; a green partition is resized with sms=N"
                            ),
                        ));
                    }
                    let cores = parse_cores(value)
                        .ok_or_else(|| bad("core numbers, e.g. cpu=2,3 or cpu=0-3"))?;
                    self.check_cores(i, &cores)?;
                    what.push(format!(
                        "cpu {} → {}",
                        cores_words(&spec.cpu),
                        cores_words(&cores)
                    ));
                    spec.cpu = cores;
                    rebuild = true;
                }
                "sms" => {
                    let sms: u32 = value
                        .parse()
                        .ok()
                        .filter(|&n| n > 0)
                        .ok_or_else(|| bad("a positive number of SMs, e.g. sms=48"))?;
                    if info.backend == "cpu" {
                        return Err(ControlError::new(
                            400,
                            format!(
                                "model `{name}` runs on the CPU: its partition is its cores \
                                 (cpu=LIST); sms= sizes a green partition on a GPU"
                            ),
                        ));
                    }
                    let Some(from) = info.sms else {
                        return Err(ControlError::new(
                            409,
                            format!(
                                "model `{name}` runs in {}, not in a green partition: \
                                 thread_pct=P resizes an MPS client",
                                info.partition
                            ),
                        ));
                    };
                    let unit = self.check_green(name, from, sms)?;
                    what.push(format!("sms {from} → {sms} (units of {unit})"));
                    spec.partition.sms = Some(sms);
                    green = Some(sms);
                    rebuild = true;
                }
                "thread_pct" => {
                    let pct = value
                        .parse::<u32>()
                        .ok()
                        .filter(|p| (1..=100).contains(p))
                        .ok_or_else(|| bad("a percentage from 1 to 100, e.g. thread_pct=30"))?;
                    if !info.partition.starts_with("mps") {
                        return Err(ControlError::new(
                            409,
                            format!(
                                "model `{name}`: thread_pct sets an MPS client's share of the \
                                 GPU, and this model is not one (its partition: {}); resize a \
                                 green partition with sms=N, a CPU model with cpu=LIST",
                                info.partition
                            ),
                        ));
                    }
                    self.check_thread_pct(i, pct)?;
                    what.push(format!(
                        "thread_pct {} → {pct}",
                        spec.partition
                            .thread_pct
                            .map_or("none".into(), |p| p.to_string())
                    ));
                    // A new MPS client: its share is fixed when CUDA starts in its process.
                    spec.partition.thread_pct = Some(pct);
                    rebuild = true;
                }
                "deadline_ms" => {
                    let ms: f64 = value
                        .parse()
                        .ok()
                        .filter(|d: &f64| d.is_finite() && *d > 0.0 && *d <= 3_600_000.0)
                        .ok_or_else(|| bad("milliseconds above 0, at most 3600000"))?;
                    let service = model.load().service_ms;
                    if ms < service {
                        return Err(ControlError::new(
                            409,
                            format!(
                                "model `{name}`: deadline_ms={ms} is shorter than one of its \
                                 jobs ({service:.3} ms now): every request would be refused"
                            ),
                        ));
                    }
                    what.push(format!(
                        "deadline_ms {} → {ms}",
                        info.deadline
                            .map_or("none".into(), |d| format!("{}", d.as_secs_f64() * 1e3))
                    ));
                    spec.deadline_ms = Some(ms);
                }
                "criticality" => {
                    let c = match value.as_str() {
                        "critical" => Criticality::Critical,
                        "best_effort" => Criticality::BestEffort,
                        _ => return Err(bad("critical or best_effort")),
                    };
                    self.check_criticality(i, c)?;
                    what.push(format!(
                        "criticality {} → {}",
                        spec.criticality.name(),
                        c.name()
                    ));
                    spec.criticality = c;
                }
                _ => {
                    return Err(ControlError::new(
                        400,
                        format!("model `{name}`: unknown setting `{key}`; expected {KEYS}"),
                    ))
                }
            }
        }
        let kind = if rebuild { "resize" } else { "settings" };
        self.admit(i, kind, &spec, green.or(info.sms))?;
        let change = if rebuild {
            let partition = match green {
                Some(sms) => Some(self.green_partition(slot.index(), name, sms)?),
                None => None,
            };
            self.new_instance(i, &model, spec, "resize", requested, partition)?
        } else {
            let info = ModelInfo {
                criticality: spec.criticality,
                deadline: spec.deadline_s().map(Duration::from_secs_f64),
                batching: spec.serve.batching_for(spec.criticality),
                ..(*info).clone()
            };
            model
                .stats
                .describe((&info.partition, spec.criticality.name()), info.sms);
            let partition = info.partition.clone();
            model.set_info(info);
            coordinator.set_spec(i, spec);
            Change {
                model: name.to_string(),
                kind: "settings",
                what: Vec::new(),
                took_ms: ms_since(requested),
                pause_ms: None,
                abandoned: 0,
                partition,
            }
        };
        Ok(self.record(i, &model, Change { what, ..change }))
    }

    /// Triton's load: an unloaded model is built again (its last settings) and serves; a
    /// loaded one is rebuilt in its partition and the new instance takes over (a reload).
    pub fn load_model(&self, name: &str) -> Result<Change, ControlError> {
        let requested = clock::now_ns();
        let (i, model) = self.control_target(name)?;
        let coordinator = &self.shared.coordinator;
        let _one = coordinator.change_turn();
        self.refuse_while_draining(name)?;
        let spec = coordinator.slots()[i].spec();
        let info = model.info();
        let loaded = model.is_loaded();
        self.admit(i, if loaded { "resize" } else { "add" }, &spec, info.sms)?;
        // A green model is loaded again in a new green context of its size: its own SMs
        // (a reload), or free ones (a load after an unload freed them).
        let green = match info.sms {
            Some(sms) if coordinator.repartition().is_some() => {
                Some(self.green_partition(coordinator.slots()[i].index(), name, sms)?)
            }
            Some(sms) => {
                return Err(ControlError::new(
                    409,
                    format!(
                        "model `{name}` runs in a green partition of {sms} SMs that cannot be \
                         made again while serving (serve's start notes say why); restart serve"
                    ),
                ))
            }
            None => None,
        };
        if !loaded {
            // Another model may have moved onto its cores while it was unloaded.
            if !spec.cpu.is_empty() {
                self.check_cores(i, &spec.cpu)?;
            }
        }
        let kind = if loaded { "reload" } else { "load" };
        let change = self.new_instance(i, &model, spec, kind, requested, green)?;
        Ok(self.record(i, &model, change))
    }

    /// Triton's unload: new requests are refused (404, "has no available versions"), those
    /// taken are answered (for at most [`UNLOAD_GRACE`]), then its instance ends and frees
    /// its executor. Unloading an unloaded model does nothing.
    pub fn unload_model(&self, name: &str) -> Result<Change, ControlError> {
        let requested = clock::now_ns();
        let (i, model) = self.control_target(name)?;
        let _one = self.shared.coordinator.change_turn();
        self.refuse_while_draining(name)?;
        let info = model.info();
        let mut change = Change {
            model: name.to_string(),
            kind: "unload",
            what: Vec::new(),
            took_ms: 0.0,
            pause_ms: None,
            abandoned: 0,
            partition: info.partition.clone(),
        };
        if !model.is_loaded() {
            change.what.push("already unloaded".into());
            change.took_ms = ms_since(requested);
            return Ok(change);
        }
        model.stats.set_ready(false);
        // Its instance's thread ends and is joined: its executor and partition are freed.
        change.abandoned = self
            .shared
            .coordinator
            .remove(i, |m| m.unload(UNLOAD_GRACE));
        change.took_ms = ms_since(requested);
        Ok(self.record(i, &model, change))
    }

    /// Builds model `i`'s next instance from `spec` and lets it take over (an unloaded
    /// model's: it is added); the old instance's thread is joined (its executor freed)
    /// before this returns.
    fn new_instance(
        &self,
        i: usize,
        model: &Arc<ServedModel>,
        spec: isolane_core::spec::WorkloadSpec,
        kind: &'static str,
        requested: i64,
        partition: Option<(isolane_runtime::partition::Partition, u32)>,
    ) -> Result<Change, ControlError> {
        let info = model.info();
        let name = info.name.clone();
        let (partition, (words, sms)) = match partition {
            Some((p, sms)) => (Some(p), (green_words(sms), Some(sms))),
            None => (
                None,
                (
                    mps_words(&info.partition, spec.partition.thread_pct),
                    info.sms,
                ),
            ),
        };
        let place = crate::place(self.shared.coordinator.driver(), &spec, words, sms);
        let coordinator = &self.shared.coordinator;
        let made = if model.is_loaded() {
            coordinator.resize(i, spec, place, partition, requested)
        } else {
            coordinator.add(i, spec, place, partition, requested)
        };
        let took = made.map_err(|e| {
            ControlError::new(
                if e.user { 400 } else { 500 },
                format!(
                    "{}; the model's instance before the change still serves",
                    crate::model_error(e)
                ),
            )
        })?;
        let took = took.unwrap_or(crate::model::TakeOver {
            took_ns: clock::now_ns() - requested,
            pause_ns: None,
        });
        Ok(Change {
            model: name,
            kind,
            what: Vec::new(),
            took_ms: took.took_ns as f64 / 1e6,
            pause_ms: took.pause_ns.map(|p| p as f64 / 1e6),
            abandoned: 0,
            partition: model.info().partition.clone(),
        })
    }

    /// The session's admission of a change to model `i` (`Server::set_admission`), before
    /// anything is made: its refusal is a 409 naming the model.
    fn admit(
        &self,
        i: usize,
        kind: &'static str,
        to: &isolane_core::spec::WorkloadSpec,
        sms: Option<u32>,
    ) -> Result<(), ControlError> {
        self.shared
            .coordinator
            .admit(i, kind, to, sms)
            .map_err(|why| ControlError::new(409, format!("model `{}`: {why}", to.name)))
    }

    /// Checks a green resize of model `name` from `from` to `to` SMs against the driver's unit
    /// and the free SMs before anything is made; returns the unit.
    fn check_green(&self, name: &str, from: u32, to: u32) -> Result<u32, ControlError> {
        let Some(rp) = self.shared.coordinator.repartition() else {
            return Err(ControlError::new(
                409,
                format!(
                    "model `{name}`: sms={to}: this server's green partitions cannot be resized \
                     (serve's start notes say why: sizes that are not multiples of the \
                     driver's unit); restart serve with the new size"
                ),
            ));
        };
        let unit = rp.green_unit_sms();
        if !to.is_multiple_of(unit) {
            return Err(ControlError::new(
                400,
                format!(
                    "model `{name}`: sms={to}: expected a multiple of {unit} SMs (the driver's \
                     unit of a green partition), e.g. sms={}",
                    (to / unit).max(1) * unit
                ),
            ));
        }
        let free = rp.free_green_sms();
        if to > from && to - from > free {
            return Err(ControlError::new(
                409,
                format!(
                    "model `{name}`: sms={to}: it holds {from} SMs and {free} are free; \
                     shrink another model first (isolane ctl resize OTHER sms=N)"
                ),
            ));
        }
        Ok(unit)
    }

    /// A new green partition of `sms` SMs for model `name`, before its new instance is built.
    fn green_partition(
        &self,
        index: usize,
        name: &str,
        sms: u32,
    ) -> Result<(isolane_runtime::partition::Partition, u32), ControlError> {
        let rp = self.shared.coordinator.repartition().ok_or_else(|| {
            ControlError::new(
                409,
                format!("model `{name}`: green partitions cannot be resized"),
            )
        })?;
        let p = rp.green(index, name, sms).map_err(|e| {
            ControlError::new(
                409,
                format!("model `{name}`: sms={sms}: {e}; the model still serves as before"),
            )
        })?;
        Ok((p, sms))
    }

    /// Counts and keeps `change`, and says it on the access log.
    fn record(&self, i: usize, model: &ServedModel, change: Change) -> Change {
        let ns = |ms: f64| (ms * 1e6) as i64;
        model
            .stats
            .changed(change.kind, ns(change.took_ms), change.pause_ms.map(ns));
        tracing::info!(
            target: "isolane::access",
            protocol = "control",
            model = change.model.as_str(),
            change = change.kind,
            what = change.what.join("; ").as_str(),
            partition = change.partition.as_str(),
            took_us = (change.took_ms * 1e3) as u64,
            pause_us = change.pause_ms.map(|p| (p * 1e3) as u64),
        );
        *lock(&self.shared.last[i]) = Some(change.clone());
        change
    }

    fn control_target(&self, name: &str) -> Result<(usize, Arc<ServedModel>), ControlError> {
        match self.shared.coordinator.position(name) {
            Some(i) => Ok((i, Arc::clone(self.shared.model(i)))),
            None => Err(ControlError::new(404, self.unknown(name).to_string())),
        }
    }

    fn refuse_while_draining(&self, name: &str) -> Result<(), ControlError> {
        if self.shared.draining.load(Ordering::Relaxed) {
            return Err(ControlError::new(
                503,
                format!("the server is shutting down; model `{name}` is not changed"),
            ));
        }
        Ok(())
    }

    /// `cores` for model `i`: not empty, no core twice, each available to this process and
    /// held by no other loaded model (its own may be kept).
    /// MPS admission's rule for a new share: the thread percentages of the clients served on
    /// one GPU add up to at most 100 (`isolane_core::admission`'s default budget).
    fn check_thread_pct(&self, i: usize, pct: u32) -> Result<(), ControlError> {
        let budget = isolane_core::admission::AdmissionOptions::default().mps_thread_budget_pct;
        let coordinator = &self.shared.coordinator;
        let gpu = coordinator.slots()[i].spec().gpu;
        let others: u32 = coordinator
            .loaded_specs_but(i)
            .into_iter()
            .filter(|spec| spec.gpu == gpu)
            .filter_map(|spec| spec.partition.thread_pct)
            .sum();
        if others + pct > budget {
            let name = self.shared.model(i).info().name.clone();
            return Err(ControlError::new(
                409,
                format!(
                    "model `{name}`: thread_pct={pct}: the other MPS clients on its GPU hold \
                     {others}%, and the shares may add up to {budget}% at most (at most {}% \
                     here)",
                    budget.saturating_sub(others)
                ),
            ));
        }
        Ok(())
    }

    fn check_cores(&self, i: usize, cores: &[usize]) -> Result<(), ControlError> {
        let name = self.shared.model(i).info().name.clone();
        let mut sorted = cores.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        if sorted.len() != cores.len() {
            return Err(ControlError::new(
                400,
                format!(
                    "model `{name}`: cpu={}: a core is listed twice",
                    cores_words(cores)
                ),
            ));
        }
        let available = isolane_runtime::affinity::available_cores();
        for &c in cores {
            if !available.contains(&c) {
                return Err(ControlError::new(
                    409,
                    format!(
                        "model `{name}`: cpu core {c} does not exist or is not available to \
                         the server (available: {})",
                        cores_words(&available)
                    ),
                ));
            }
            for (j, other) in self.shared.models().enumerate() {
                let theirs = other.info();
                if j != i && other.is_loaded() && theirs.cpu.contains(&c) {
                    return Err(ControlError::new(
                        409,
                        format!(
                            "model `{name}`: cpu core {c} is model `{}`'s (cpu {}); free \
                             cores: {}",
                            theirs.name,
                            cores_words(&theirs.cpu),
                            cores_words(&self.free_cores(i, &available))
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The available cores no loaded model but `i` is pinned to.
    fn free_cores(&self, i: usize, available: &[usize]) -> Vec<usize> {
        available
            .iter()
            .copied()
            .filter(|c| {
                !self
                    .shared
                    .models()
                    .enumerate()
                    .any(|(j, m)| j != i && m.is_loaded() && m.info().cpu.contains(c))
            })
            .collect()
    }

    /// Whether model `i` may become `to`: the guard's critical slots and best-effort pieces
    /// are set when the server starts, so a protected server keeps its criticalities, and an
    /// unprotected one may not end up with both kinds unless `[protection]` is off.
    fn check_criticality(&self, i: usize, to: Criticality) -> Result<(), ControlError> {
        let name = self.shared.model(i).info().name.clone();
        if self.shared.guard.is_some() {
            return Err(ControlError::new(
                409,
                format!(
                    "model `{name}`: criticality cannot change while the criticality guard \
                     protects this server: its critical slots and best-effort pieces are set \
                     when the server starts ([protection]); change the scenario and restart \
                     serve"
                ),
            ));
        }
        let kinds: Vec<Criticality> = self
            .shared
            .models()
            .enumerate()
            .map(|(j, m)| if j == i { to } else { m.info().criticality })
            .collect();
        let mixed =
            kinds.contains(&Criticality::Critical) && kinds.contains(&Criticality::BestEffort);
        if mixed && self.shared.protection {
            return Err(ControlError::new(
                409,
                format!(
                    "model `{name}`: criticality = {} would put critical and best-effort \
                     models side by side without the criticality guard, which is set up only \
                     when the server starts with both; restart serve with the changed \
                     scenario, or set [protection] enabled = false",
                    to.name()
                ),
            ));
        }
        Ok(())
    }
}

/// `2,3`, `0-3`, `0-1,4`: the cores, in the order given (None: not that).
pub(crate) fn parse_cores(s: &str) -> Option<Vec<usize>> {
    let mut out = Vec::new();
    for part in s.split(',') {
        let part = part.trim();
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
                if a > b || b - a > 4096 {
                    return None;
                }
                out.extend(a..=b);
            }
            None => out.push(part.parse().ok()?),
        }
    }
    (!out.is_empty() && out.len() <= 4096).then_some(out)
}

/// A core list in words (`2,3`; `none`: unpinned).
pub(crate) fn cores_words(cores: &[usize]) -> String {
    if cores.is_empty() {
        return "none".into();
    }
    cores
        .iter()
        .map(|c| c.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// A CPU model's partition in words: `cpu` unpinned, `cpu 2,3` pinned.
pub(crate) fn cpu_words(backend: Backend, cores: &[usize], words: String) -> String {
    match backend {
        Backend::Cpu if !cores.is_empty() => format!("cpu {}", cores_words(cores)),
        _ => words,
    }
}

fn ms_since(t: i64) -> f64 {
    (clock::now_ns() - t) as f64 / 1e6
}

pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// An MPS partition's words with its share now (`mps 20%` → `mps 40%`; the rest kept).
/// A green partition in words, as serve's start names it (`isolane_session::live`).
fn green_words(sms: u32) -> String {
    let green = isolane_core::admission::ResolvedPartition::Green {
        group: 0,
        sms,
        first_sm: 0,
    };
    isolane_session::live::partition_words(isolane_core::spec::Backend::Cuda, Some(&green))
}

fn mps_words(words: &str, thread_pct: Option<u32>) -> String {
    match (words.strip_prefix("mps "), thread_pct) {
        (Some(rest), Some(p)) => {
            let tail = rest.find('%').map_or("", |k| &rest[k + 1..]);
            format!("mps {p}%{tail}")
        }
        _ => words.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::mps_words;

    #[test]
    fn an_mps_partitions_words_follow_its_new_share() {
        assert_eq!(mps_words("mps 20%", Some(40)), "mps 40%");
        assert_eq!(
            mps_words("mps 20%, 4096 MiB pinned", Some(35)),
            "mps 35%, 4096 MiB pinned"
        );
        assert_eq!(mps_words("green 24 SMs", Some(40)), "green 24 SMs");
        assert_eq!(mps_words("mps 20%", None), "mps 20%");
    }
}
