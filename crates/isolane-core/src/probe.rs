//! The GPU probe's configuration and result as plain data (the probe itself, a CUDA kernel, is
//! `isolane_gpu::probe`). They live here so that `isolane verify`'s probe workers can send a
//! result over the one worker protocol (`isolane_runtime::protocol`) typed, with neither
//! isolane-runtime nor isolane-gpu depending on the other.

use serde::{Deserialize, Serialize};

/// Shape of the probe's work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeConfig {
    pub block_threads: u32,
    /// FMA iterations per item (× 4 independent chains).
    pub iters: u32,
}

impl Default for ProbeConfig {
    fn default() -> Self {
        // ~35 µs per item on an H100 SM with 8 blocks resident: short enough that the deadline
        // is overshot by little, long enough that the per-item timer read costs nothing.
        ProbeConfig {
            block_threads: 256,
            iters: 1024,
        }
    }
}

impl ProbeConfig {
    /// FP32 operations of one item (an FMA counts as 2).
    pub fn flops_per_item(&self) -> f64 {
        f64::from(self.block_threads) * f64::from(self.iters) * 4.0 * 2.0
    }
}

/// One measurement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProbeResult {
    /// Items (block-sized units of work) completed per second of wall time.
    pub blocks_per_s: f64,
    pub gflops: f64,
    pub items: u64,
    pub elapsed_s: f64,
    /// Distinct `%smid` values that did work (virtualised inside MPS clients).
    pub sm_ids_seen: Vec<u32>,
    pub grid_blocks: u32,
    pub config: ProbeConfig,
}

impl ProbeResult {
    /// Builds a result from raw counters (pure; tested on CPU).
    pub fn from_counts(
        items: u64,
        elapsed_s: f64,
        sm_items: &[u32],
        grid_blocks: u32,
        config: ProbeConfig,
    ) -> Self {
        let per_s = if elapsed_s > 0.0 {
            items as f64 / elapsed_s
        } else {
            0.0
        };
        ProbeResult {
            blocks_per_s: per_s,
            gflops: per_s * config.flops_per_item() / 1e9,
            items,
            elapsed_s,
            sm_ids_seen: sm_items
                .iter()
                .enumerate()
                .filter(|(_, &n)| n > 0)
                .map(|(i, _)| i as u32)
                .collect(),
            grid_blocks,
            config,
        }
    }
}
