//! A model's device memory: one allocation for the weights, the activation arena and (where they fit) the workspaces; the pinned host buffers; where a plan location lies on the device.

use super::*;

/// The driver's allocation granularity on the H100 (driver 580): every free-memory drop we
/// measured was a multiple of it. Only sizes the shared weights + arena allocation; a device
/// with another granularity loses at most the workspace's sharing of the rounding.
pub(super) const ALLOC_GRANULARITY: usize = 2 << 20;

pub(super) fn free_mem() -> Result<usize> {
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: valid out-pointers, a context is current.
    cu_check("cuMemGetInfo", unsafe {
        cu::cuMemGetInfo_v2(&mut free, &mut total)
    })?;
    Ok(free)
}

/// Where [`CudaModel::upload_weights`] put the weights: each constant's offset, their bytes,
/// and the one allocation's used and rounded sizes (the arena follows the weights).
pub(super) struct WeightBlock {
    pub(super) const_offs: Vec<usize>,
    pub(super) const_bytes: usize,
    pub(super) block_used: usize,
    pub(super) block_bytes: usize,
}

impl CudaModel {
    /// Weights (converted on the host, uploaded once) and the arena share one allocation:
    /// the driver rounds every allocation up to ALLOC_GRANULARITY, which for a small model
    /// is a large share of its memory (resnet18 fp16 with three allocations: 34 MiB for
    /// 28.8 MiB planned). What the rounding leaves over may hold the workspace
    /// ([`CudaModel::place_workspace`]).
    pub(super) fn upload_weights(&mut self, plan: &Plan) -> Result<WeightBlock> {
        let (const_offs, const_bytes) = plan.const_layout();
        let host = plan.weights_host();
        let weights_span = crate::plan::align(const_bytes);
        let block_used = weights_span + plan.arena_bytes;
        let block_bytes = block_used.div_ceil(ALLOC_GRANULARITY).max(1) * ALLOC_GRANULARITY;
        self.weights = dev_alloc(block_bytes)
            .map_err(|e| e.for_allocation("the weights and the activation arena"))?;
        // SAFETY: the device buffer holds const_bytes; host is const_bytes long; synchronous.
        cu_check("cuMemcpyHtoD", unsafe {
            cu::cuMemcpyHtoD_v2(self.weights, host.as_ptr() as *const c_void, const_bytes)
        })?;
        drop(host);
        self.arena = self.weights + weights_span as u64;
        // Poison the arena once so that a read of unwritten memory shows up as NaN in tests
        // (0xff bytes are NaN in f32, f16 and bf16).
        // SAFETY: the arena holds arena_bytes; synchronous memset.
        cu_check("cuMemsetD8", unsafe {
            cu::cuMemsetD8_v2(self.arena, 0xff, plan.arena_bytes)
        })?;
        Ok(WeightBlock {
            const_offs,
            const_bytes,
            block_used,
            block_bytes,
        })
    }

    /// Pinned host buffers for inputs and outputs.
    pub(super) fn alloc_pinned_io(&mut self, plan: &Plan) -> Result<()> {
        for io in &plan.inputs {
            let n: usize = io.shape.iter().product();
            self.host_in.push(PinnedF32::new(n)?);
        }
        for io in &plan.outputs {
            let n: usize = io.shape.iter().product();
            self.host_out.push(PinnedF32::new(n)?);
        }
        Ok(())
    }

    /// The one workspace: the largest any chosen algorithm needs, in the weights block's
    /// rounding where it fits, else an allocation of its own; and the memory report.
    pub(super) fn place_workspace(&mut self, plan: &Plan, block: &WeightBlock) -> Result<()> {
        let graphs = self.launches.iter().filter_map(|l| match l {
            Launch::ConvGraph { graph, .. } => Some(self.conv_graphs[*graph].workspace),
            _ => None,
        });
        let dnn = self
            .convs
            .iter()
            .map(|c| c.workspace)
            .chain(graphs)
            .max()
            .unwrap_or(0);
        let mm = self.mms.iter().map(|x| x.workspace).max().unwrap_or(0);
        // Each in the weights allocation's rounding where it fits, else an allocation of its own.
        let mut free = crate::plan::align(block.block_used);
        let mut place = |bytes: usize| -> Result<(u64, bool)> {
            if free + bytes <= block.block_bytes {
                let at = self.weights + free as u64;
                free = crate::plan::align(free + bytes);
                Ok((at, false))
            } else {
                let at = dev_alloc(bytes).map_err(|e| e.for_allocation("a library workspace"))?;
                Ok((at, true))
            }
        };
        (self.workspace, self.workspace_owned) = place(dnn)?;
        (self.mm_workspace, self.mm_workspace_owned) = place(mm)?;
        // cuBLASLt's semaphores start at zero (MM_WORKSPACE_CAP).
        dev_zero(self.mm_workspace, mm)?;
        let ws = dnn + mm;
        self.mem = MemoryReport {
            weights_bytes: block.const_bytes,
            arena_bytes: plan.arena_bytes,
            workspace_bytes: ws,
            total_bytes: block.const_bytes + plan.arena_bytes + ws,
            device_delta_bytes: 0,
        };
        Ok(())
    }

    /// Device address of `len` elements at a plan location, if they lie inside the arena or
    /// the weights.
    pub(super) fn device_span(&self, l: Loc, len: usize) -> Option<u64> {
        let es = self.dtype.size();
        let (base, start, limit) = match l {
            Loc::Storage { id, offset } => (
                self.arena,
                self.storage_offsets.get(id)? + offset * es,
                self.mem.arena_bytes,
            ),
            Loc::Const { id, offset } => (
                self.weights,
                self.const_offsets.get(id)? + offset * es,
                self.mem.weights_bytes,
            ),
        };
        (start + len * es <= limit).then_some(base + start as u64)
    }
}
