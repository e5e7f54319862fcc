//! The command buffer, its fence and the timestamp queries: one submission at a time, recorded
//! anew for each frame (recording is cheap; the objects are made once).

use std::time::Duration;

use ash::vk;

use super::context::Context;
use crate::error::VkContext;
use crate::GraphicsError;

/// How long a submission may take before the renderer gives up on it (a hung device).
const SUBMIT_TIMEOUT: Duration = Duration::from_secs(30);

/// Timestamps of a frame: start, uploads done, drawing done.
pub(crate) const QUERIES: u32 = 3;

#[derive(Default)]
pub(crate) struct Commands {
    pool: vk::CommandPool,
    pub buffer: vk::CommandBuffer,
    fence: vk::Fence,
    /// Null where the queue has no timestamps.
    pub queries: vk::QueryPool,
}

impl Commands {
    pub fn create(&mut self, ctx: &Context) -> Result<(), GraphicsError> {
        let device = &ctx.device;
        let info = vk::CommandPoolCreateInfo::default()
            .flags(vk::CommandPoolCreateFlags::RESET_COMMAND_BUFFER)
            .queue_family_index(ctx.queue_family);
        // SAFETY: a valid device and one of its queue families.
        self.pool =
            unsafe { device.create_command_pool(&info, None) }.call("vkCreateCommandPool")?;
        let allocate = vk::CommandBufferAllocateInfo::default()
            .command_pool(self.pool)
            .level(vk::CommandBufferLevel::PRIMARY)
            .command_buffer_count(1);
        // SAFETY: a pool of this device.
        self.buffer = unsafe { device.allocate_command_buffers(&allocate) }
            .call("vkAllocateCommandBuffers")?[0];
        // SAFETY: a valid device.
        self.fence = unsafe { device.create_fence(&vk::FenceCreateInfo::default(), None) }
            .call("vkCreateFence")?;
        if ctx.timestamps.is_some() {
            let info = vk::QueryPoolCreateInfo::default()
                .query_type(vk::QueryType::TIMESTAMP)
                .query_count(QUERIES);
            // SAFETY: a valid device whose queue family has timestamps.
            self.queries =
                unsafe { device.create_query_pool(&info, None) }.call("vkCreateQueryPool")?;
        }
        Ok(())
    }

    /// Resets the command buffer and starts recording into it.
    pub fn begin(&self, device: &ash::Device) -> Result<(), GraphicsError> {
        let begin = vk::CommandBufferBeginInfo::default()
            .flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT);
        // SAFETY: the buffer is not in use (every submission is waited for) and its pool allows
        // resetting it.
        unsafe {
            device
                .reset_command_buffer(self.buffer, vk::CommandBufferResetFlags::empty())
                .call("vkResetCommandBuffer")?;
            device
                .begin_command_buffer(self.buffer, &begin)
                .call("vkBeginCommandBuffer")
        }
    }

    /// Ends recording, submits, and waits for the GPU to finish.
    pub fn submit_and_wait(&self, ctx: &Context) -> Result<(), GraphicsError> {
        let device = &ctx.device;
        let buffers = [self.buffer];
        let submit = vk::SubmitInfo::default().command_buffers(&buffers);
        let timeout = SUBMIT_TIMEOUT.as_nanos() as u64;
        // SAFETY: the buffer is recording; the fence is unsignalled (reset here, before the
        // submission, so that a failed submission leaves nothing behind) and the queue is only
        // used from `&mut Renderer` methods.
        unsafe {
            device
                .end_command_buffer(self.buffer)
                .call("vkEndCommandBuffer")?;
            device.reset_fences(&[self.fence]).call("vkResetFences")?;
            device
                .queue_submit(ctx.queue, &[submit], self.fence)
                .call("vkQueueSubmit")?;
            device
                .wait_for_fences(&[self.fence], true, timeout)
                .call("vkWaitForFences")
        }
    }

    /// Writes timestamp `index` once the work before it has reached `stage`.
    pub fn timestamp(&self, device: &ash::Device, stage: vk::PipelineStageFlags, index: u32) {
        if self.queries == vk::QueryPool::null() {
            return;
        }
        // SAFETY: recording; the pool has QUERIES queries, reset at the start of this buffer.
        unsafe { device.cmd_write_timestamp(self.buffer, stage, self.queries, index) };
    }

    /// Resets the timestamp queries (at the start of a frame's recording).
    pub fn reset_timestamps(&self, device: &ash::Device) {
        if self.queries == vk::QueryPool::null() {
            return;
        }
        // SAFETY: recording, outside a render pass; the pool has QUERIES queries.
        unsafe { device.cmd_reset_query_pool(self.buffer, self.queries, 0, QUERIES) };
    }

    /// The raw timestamps of the last frame, after its submission was waited for.
    pub fn read_timestamps(
        &self,
        device: &ash::Device,
    ) -> Result<Option<[u64; QUERIES as usize]>, GraphicsError> {
        if self.queries == vk::QueryPool::null() {
            return Ok(None);
        }
        let mut ticks = [0u64; QUERIES as usize];
        let flags = vk::QueryResultFlags::TYPE_64 | vk::QueryResultFlags::WAIT;
        // SAFETY: all QUERIES queries were written by the finished submission.
        unsafe { device.get_query_pool_results(self.queries, 0, &mut ticks, flags) }
            .call("vkGetQueryPoolResults")?;
        Ok(Some(ticks))
    }

    pub fn destroy(&mut self, device: &ash::Device) {
        // SAFETY: the handles are this device's or null and the caller waited for the GPU; the
        // command buffer goes with its pool.
        unsafe {
            device.destroy_query_pool(self.queries, None);
            device.destroy_fence(self.fence, None);
            device.destroy_command_pool(self.pool, None);
        }
        *self = Self::default();
    }
}
