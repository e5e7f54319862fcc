//! A model's device memory: one allocation for the weights, the activation arena and (where they
//! fit) the workspaces; the pinned host buffers; where a plan location lies on the device.

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

/// Where each of the workspaces `sizes` goes in an allocation of `block` bytes whose first
/// `used` bytes are taken: its offset in the rest (the driver's rounding), each aligned after
/// the one before, or `None` where it does not fit (an allocation of its own).
pub(super) fn workspace_offsets(
    used: usize,
    block: usize,
    sizes: [usize; 2],
) -> [Option<usize>; 2] {
    let mut free = used
        .checked_next_multiple_of(crate::plan::ALIGN)
        .unwrap_or(usize::MAX);
    sizes.map(|bytes| {
        let end = free.checked_add(bytes).filter(|&end| end <= block)?;
        let at = free;
        // Past the largest aligned offset nothing more fits.
        free = end
            .checked_next_multiple_of(crate::plan::ALIGN)
            .unwrap_or(usize::MAX);
        Some(at)
    })
}

/// Where [`CudaModel::upload_weights`] put the weights: each constant's offset, their bytes,
/// and the bytes of the one allocation that they and the arena use (the rest is the driver's
/// rounding).
pub(super) struct WeightBlock {
    pub(super) const_offs: Vec<usize>,
    pub(super) const_bytes: usize,
    pub(super) block_used: usize,
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
        let block = DeviceBuffer::new(block_bytes)
            .map_err(|e| e.for_allocation("the weights and the activation arena"))?;
        let whole = block.span();
        self.block = Some(block);
        let inside = |offset, bytes| {
            whole.slice(offset, bytes).ok_or_else(|| {
                EngineError::Runtime(format!(
                    "{bytes} bytes at {offset} are outside the model's allocation of {block_bytes}"
                ))
            })
        };
        self.weights = inside(0, const_bytes)?;
        self.arena = inside(weights_span, plan.arena_bytes)?;
        // SAFETY: the weights span is allocated device memory of const_bytes; host is
        // const_bytes long; synchronous.
        cu_check("cuMemcpyHtoD", unsafe {
            cu::cuMemcpyHtoD_v2(
                self.weights.ptr(),
                host.as_ptr() as *const c_void,
                self.weights.bytes(),
            )
        })?;
        drop(host);
        // Poison the arena once so that a read of unwritten memory shows up as NaN in tests
        // (0xff bytes are NaN in f32, f16 and bf16).
        // SAFETY: the arena span is allocated device memory; synchronous memset.
        cu_check("cuMemsetD8", unsafe {
            cu::cuMemsetD8_v2(self.arena.ptr(), 0xff, self.arena.bytes())
        })?;
        Ok(WeightBlock {
            const_offs,
            const_bytes,
            block_used,
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
        let whole = self
            .block
            .as_ref()
            .map_or(DeviceSpan::EMPTY, DeviceBuffer::span);
        let offsets = workspace_offsets(block.block_used, whole.bytes(), [dnn, mm]);
        let mut place = |bytes: usize, at: Option<usize>| -> Result<DeviceSpan> {
            if let Some(span) = at.and_then(|o| whole.slice(o, bytes)) {
                return Ok(span);
            }
            let own =
                DeviceBuffer::new(bytes).map_err(|e| e.for_allocation("a library workspace"))?;
            let span = own.span();
            self.own_workspaces.push(own);
            Ok(span)
        };
        self.workspace = place(dnn, offsets[0])?;
        self.mm_workspace = place(mm, offsets[1])?;
        // cuBLASLt's semaphores start at zero (MM_WORKSPACE_CAP).
        dev_zero(self.mm_workspace)?;
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

    /// The device memory of `len` elements at a plan location, if they lie inside the arena
    /// or the weights.
    pub(super) fn device_span(&self, l: Loc, len: usize) -> Option<DeviceSpan> {
        let es = self.dtype.size();
        let (span, start) = match l {
            Loc::Storage { id, offset } => {
                (self.arena, self.storage_offsets.get(id)? + offset * es)
            }
            Loc::Const { id, offset } => (self.weights, self.const_offsets.get(id)? + offset * es),
        };
        span.slice(start, len.checked_mul(es)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    #[test]
    fn workspaces_take_the_allocations_rounding_where_they_fit() {
        // 1 MiB used of 2: cuDNN's 512 KiB fits, cuBLASLt's 600 KiB no longer does.
        assert_eq!(
            workspace_offsets(MIB, 2 * MIB, [512 << 10, 600 << 10]),
            [Some(MIB), None]
        );
        // The first too large for the rest, the second still placed where the first was not.
        assert_eq!(
            workspace_offsets(MIB, 2 * MIB, [2 * MIB, 256]),
            [None, Some(MIB)]
        );
        // Each starts aligned after the one before, and an exact fit fits.
        let after = crate::plan::align(MIB + 1000);
        assert_eq!(
            workspace_offsets(MIB, after + 24, [1000, 24]),
            [Some(MIB), Some(after)]
        );
        assert_eq!(workspace_offsets(MIB, after + 23, [1000, 24])[1], None);
        // No workspace needs no room; a used size past the block leaves none.
        assert_eq!(
            workspace_offsets(2 * MIB, 2 * MIB, [0, 0]),
            [Some(2 * MIB); 2]
        );
        assert_eq!(workspace_offsets(3 * MIB, 2 * MIB, [0, 1]), [None, None]);
        assert_eq!(
            workspace_offsets(0, usize::MAX, [usize::MAX, 1]),
            [Some(0), None]
        );
    }
}
