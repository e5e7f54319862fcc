//! isolane-gpu: CUDA device discovery, green contexts, the MPS daemon, MIG, probe kernels and
//! the measured verification of partitions (docs/partitions.md).
//!
//! Builds without a CUDA toolkit (cudarc with dynamic loading); at run time a missing libcuda,
//! libnvrtc or libnvidia-ml is a [`GpuError::LibraryNotFound`], never a panic. Nothing in this
//! crate changes a GPU setting: no MIG-mode change, clocks, power limit, compute mode,
//! persistence mode or reset.

// One unsafe operation per block, each with its own SAFETY comment (root Cargo.toml).
#![warn(clippy::multiple_unsafe_ops_per_block)]

pub mod call;
pub mod devices;
pub mod driver;
pub mod error;
pub mod green;
pub mod green_pool;
pub mod host_pin;
pub mod loader;
pub mod mig;
pub mod mps;
pub mod partitions;
pub mod probe;
pub mod verify;

pub use devices::{list_devices, DeviceInfo};
pub use error::{GpuError, Result};
pub use green::{GreenGroup, GreenPartitioning};
pub use green_pool::GreenPool;
pub use mps::{MpsDaemon, MpsOptions};
pub use partitions::{PartitionRecord, PartitionSession, SessionOptions};
pub use probe::{Probe, ProbeResult};
