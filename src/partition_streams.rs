//! Green groups handed from the partition setup to the workloads that run in them.
//!
//! The runtime builds each thread-hosted workload's executor on that workload's own thread
//! through the registered engine, which knows the workload but not the partitions; the run
//! command offers each workload's [`GreenGroup`] here before the run, and the engine takes it
//! when it builds that workload's model, so the model's context and stream are the group's.

use std::collections::BTreeMap;
use std::sync::Mutex;

use isolane_gpu::GreenGroup;

static OFFERED: Mutex<BTreeMap<String, GreenGroup>> = Mutex::new(BTreeMap::new());

fn offered() -> std::sync::MutexGuard<'static, BTreeMap<String, GreenGroup>> {
    OFFERED.lock().unwrap_or_else(|p| p.into_inner())
}

/// Makes `group` the partition of workload `name`.
pub fn offer(name: &str, group: GreenGroup) {
    offered().insert(name.to_string(), group);
}

/// Takes workload `name`'s green group, if it has one.
pub fn take(name: &str) -> Option<GreenGroup> {
    offered().remove(name)
}

/// Destroys groups nobody took (a run that failed before building every workload).
pub fn clear() {
    offered().clear();
}
