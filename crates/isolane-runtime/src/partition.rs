//! How a partition reaches a thread-hosted workload: through its plan.
//!
//! A green group (a green context and its stream) cannot be sent to a workload by name through
//! a process-wide map, and the runtime does not depend on `isolane-gpu`: the caller that set
//! the partitions up puts each workload's group into its [`crate::WorkloadPlan`] as an opaque
//! [`PartitionHandle`]; the workload's thread takes it out and gives it to the engine's
//! `build`, which knows what it is. Worker processes get their partition from their
//! environment instead (`RunOptions::worker_env`).

use std::any::Any;
use std::sync::{Arc, Mutex};

/// What a partition is to the runtime: something the engine downcasts and keeps alive for as
/// long as the model runs in it.
pub type Partition = Box<dyn Any + Send>;

/// A workload's partition, taken once by the thread that builds the workload.
///
/// Cloning shares the one slot (a plan is cloned onto the workload's thread). A partition that
/// nobody takes (a workload that failed before its build) is dropped with the last clone of
/// the plan, i.e. when the run has ended, before the caller takes the partitions down.
#[derive(Clone, Default)]
pub struct PartitionHandle(Arc<Mutex<Option<Partition>>>);

impl PartitionHandle {
    /// A handle holding `partition`.
    pub fn new(partition: Partition) -> Self {
        PartitionHandle(Arc::new(Mutex::new(Some(partition))))
    }

    /// Takes the partition out (`None` if there was none or it was taken already).
    pub fn take(&self) -> Option<Partition> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

/// Makes a new partition for a model while it serves (`ctl resize NAME sms=N`): implemented by
/// the session over the GPU's partitions, so that the server need not know how they are made.
pub trait Repartition: Send + Sync {
    /// SMs a green partition's size is a multiple of (the driver's unit).
    fn green_unit_sms(&self) -> u32;
    /// SMs no green partition holds now.
    fn free_green_sms(&self) -> u32;
    /// A new green partition of `sms` SMs for `workload` (index `index` in its scenario): its
    /// own SMs first, then free ones, never another model's. The error says why not, in words.
    fn green(&self, index: usize, workload: &str, sms: u32) -> Result<Partition, String>;
}

impl std::fmt::Debug for PartitionHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let held = self.0.lock().map(|slot| slot.is_some()).unwrap_or(false);
        f.write_str(if held {
            "PartitionHandle(held)"
        } else {
            "PartitionHandle(empty)"
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partition_is_taken_once_across_clones() {
        let handle = PartitionHandle::new(Box::new(7u32));
        let clone = handle.clone();
        let taken = clone.take().expect("the partition is there");
        assert_eq!(taken.downcast_ref::<u32>(), Some(&7));
        assert!(handle.take().is_none());
        assert!(PartitionHandle::default().take().is_none());
    }

    #[test]
    fn an_untaken_partition_drops_with_the_last_clone() {
        struct Flag(Arc<std::sync::atomic::AtomicBool>);
        impl Drop for Flag {
            fn drop(&mut self) {
                self.0.store(true, std::sync::atomic::Ordering::SeqCst);
            }
        }
        let dropped = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let handle = PartitionHandle::new(Box::new(Flag(Arc::clone(&dropped))));
        let clone = handle.clone();
        drop(handle);
        assert!(!dropped.load(std::sync::atomic::Ordering::SeqCst));
        drop(clone);
        assert!(dropped.load(std::sync::atomic::Ordering::SeqCst));
    }
}
