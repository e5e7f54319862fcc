//! Buffers and images with their own memory. Every handle starts null, and destroying a null
//! handle is a no-op in Vulkan, so a half-built renderer is torn down by the same code as a
//! whole one.

use ash::vk;

use super::context::Context;
use crate::error::VkContext;
use crate::GraphicsError;

/// The index of a memory type allowed by `type_bits` that has `required`, preferring one that
/// also has `preferred`.
pub(crate) fn find_memory_type(
    memory: &vk::PhysicalDeviceMemoryProperties,
    type_bits: u32,
    required: vk::MemoryPropertyFlags,
    preferred: vk::MemoryPropertyFlags,
) -> Option<u32> {
    let count = (memory.memory_type_count as usize).min(memory.memory_types.len());
    let find = |flags: vk::MemoryPropertyFlags| {
        memory.memory_types[..count]
            .iter()
            .enumerate()
            .find(|(i, t)| type_bits & (1 << i) != 0 && t.property_flags.contains(flags))
            .map(|(i, _)| i as u32)
    };
    find(required | preferred).or_else(|| find(required))
}

/// A host-visible, host-coherent buffer, mapped for its whole life.
pub(crate) struct HostBuffer {
    pub buffer: vk::Buffer,
    memory: vk::DeviceMemory,
    mapped: *mut u8,
    pub size: usize,
}

impl Default for HostBuffer {
    fn default() -> Self {
        Self {
            buffer: vk::Buffer::null(),
            memory: vk::DeviceMemory::null(),
            mapped: std::ptr::null_mut(),
            size: 0,
        }
    }
}

impl HostBuffer {
    /// A buffer of `size` bytes for `usage`; `cached` prefers host-cached memory (for reading
    /// back).
    pub fn new(
        ctx: &Context,
        size: usize,
        usage: vk::BufferUsageFlags,
        what: &'static str,
        cached: bool,
    ) -> Result<Self, GraphicsError> {
        let mut made = Self {
            size,
            ..Self::default()
        };
        match made.create(ctx, usage, what, cached) {
            Ok(()) => Ok(made),
            Err(e) => {
                made.destroy(&ctx.device);
                Err(e)
            }
        }
    }

    fn create(
        &mut self,
        ctx: &Context,
        usage: vk::BufferUsageFlags,
        what: &'static str,
        cached: bool,
    ) -> Result<(), GraphicsError> {
        let device = &ctx.device;
        let info = vk::BufferCreateInfo::default()
            .size(self.size.max(1) as u64)
            .usage(usage)
            .sharing_mode(vk::SharingMode::EXCLUSIVE);
        // SAFETY: a valid device and create info.
        self.buffer = unsafe { device.create_buffer(&info, None) }.call("vkCreateBuffer")?;
        // SAFETY: the buffer was just created on this device.
        let needs = unsafe { device.get_buffer_memory_requirements(self.buffer) };
        let required =
            vk::MemoryPropertyFlags::HOST_VISIBLE | vk::MemoryPropertyFlags::HOST_COHERENT;
        let preferred = if cached {
            vk::MemoryPropertyFlags::HOST_CACHED
        } else {
            vk::MemoryPropertyFlags::empty()
        };
        let type_index = find_memory_type(&ctx.memory, needs.memory_type_bits, required, preferred)
            .ok_or(GraphicsError::NoMemoryType(what))?;
        let allocate = vk::MemoryAllocateInfo::default()
            .allocation_size(needs.size)
            .memory_type_index(type_index);
        // SAFETY: a memory type of this device allowed for the buffer, at its required size.
        self.memory =
            unsafe { device.allocate_memory(&allocate, None) }.call("vkAllocateMemory")?;
        // SAFETY: fresh memory of the buffer's required size, offset 0, bound once.
        unsafe { device.bind_buffer_memory(self.buffer, self.memory, 0) }
            .call("vkBindBufferMemory")?;
        // SAFETY: host-visible memory, not mapped before; it stays mapped until it is freed.
        let mapped = unsafe {
            device.map_memory(self.memory, 0, vk::WHOLE_SIZE, vk::MemoryMapFlags::empty())
        }
        .call("vkMapMemory")?;
        self.mapped = mapped.cast();
        Ok(())
    }

    /// The mapped bytes. The caller has waited for every GPU use of the buffer to finish.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        if self.mapped.is_null() {
            return &mut [];
        }
        // SAFETY: `mapped` points to `size` bytes mapped for this buffer's life; `&mut self`
        // makes this the only view, and the renderer waits on its fence after every submission,
        // so the GPU is not using the memory.
        unsafe { std::slice::from_raw_parts_mut(self.mapped, self.size) }
    }

    /// The mapped bytes, for reading what the GPU wrote (after waiting for it).
    pub fn bytes(&self) -> &[u8] {
        if self.mapped.is_null() {
            return &[];
        }
        // SAFETY: as in `bytes_mut`; shared access only reads.
        unsafe { std::slice::from_raw_parts(self.mapped, self.size) }
    }

    /// Destroys the buffer and frees its memory (which unmaps it); null handles are skipped by
    /// Vulkan. The GPU must be done with it.
    pub fn destroy(&mut self, device: &ash::Device) {
        // SAFETY: the handles are this device's or null, and the caller waited for the GPU.
        unsafe {
            device.destroy_buffer(self.buffer, None);
            device.free_memory(self.memory, None);
        }
        *self = Self::default();
    }
}

/// A 2D image in device memory (where the device has it) with a view of its one level.
pub(crate) struct DeviceImage {
    pub image: vk::Image,
    pub view: vk::ImageView,
    memory: vk::DeviceMemory,
    pub width: u32,
    pub height: u32,
}

impl Default for DeviceImage {
    fn default() -> Self {
        Self {
            image: vk::Image::null(),
            view: vk::ImageView::null(),
            memory: vk::DeviceMemory::null(),
            width: 0,
            height: 0,
        }
    }
}

pub(crate) const COLOUR_RANGE: vk::ImageSubresourceRange = vk::ImageSubresourceRange {
    aspect_mask: vk::ImageAspectFlags::COLOR,
    base_mip_level: 0,
    level_count: 1,
    base_array_layer: 0,
    layer_count: 1,
};

impl DeviceImage {
    pub fn new(
        ctx: &Context,
        (width, height): (u32, u32),
        format: vk::Format,
        usage: vk::ImageUsageFlags,
        what: &'static str,
    ) -> Result<Self, GraphicsError> {
        let mut made = Self {
            width,
            height,
            ..Self::default()
        };
        match made.create(ctx, format, usage, what) {
            Ok(()) => Ok(made),
            Err(e) => {
                made.destroy(&ctx.device);
                Err(e)
            }
        }
    }

    fn create(
        &mut self,
        ctx: &Context,
        format: vk::Format,
        usage: vk::ImageUsageFlags,
        what: &'static str,
    ) -> Result<(), GraphicsError> {
        let device = &ctx.device;
        let info = vk::ImageCreateInfo::default()
            .image_type(vk::ImageType::TYPE_2D)
            .format(format)
            .extent(vk::Extent3D {
                width: self.width,
                height: self.height,
                depth: 1,
            })
            .mip_levels(1)
            .array_layers(1)
            .samples(vk::SampleCountFlags::TYPE_1)
            .tiling(vk::ImageTiling::OPTIMAL)
            .usage(usage)
            .sharing_mode(vk::SharingMode::EXCLUSIVE)
            .initial_layout(vk::ImageLayout::UNDEFINED);
        // SAFETY: a valid device and create info (format and usage are ones every device
        // supports for 2D optimal images; the size was checked against the device's limit).
        self.image = unsafe { device.create_image(&info, None) }.call("vkCreateImage")?;
        // SAFETY: the image was just created on this device.
        let needs = unsafe { device.get_image_memory_requirements(self.image) };
        let type_index = find_memory_type(
            &ctx.memory,
            needs.memory_type_bits,
            vk::MemoryPropertyFlags::empty(),
            vk::MemoryPropertyFlags::DEVICE_LOCAL,
        )
        .ok_or(GraphicsError::NoMemoryType(what))?;
        let allocate = vk::MemoryAllocateInfo::default()
            .allocation_size(needs.size)
            .memory_type_index(type_index);
        // SAFETY: a memory type of this device allowed for the image, at its required size.
        self.memory =
            unsafe { device.allocate_memory(&allocate, None) }.call("vkAllocateMemory")?;
        // SAFETY: fresh memory of the image's required size, offset 0, bound once.
        unsafe { device.bind_image_memory(self.image, self.memory, 0) }
            .call("vkBindImageMemory")?;
        let view = vk::ImageViewCreateInfo::default()
            .image(self.image)
            .view_type(vk::ImageViewType::TYPE_2D)
            .format(format)
            .subresource_range(COLOUR_RANGE);
        // SAFETY: a view of the whole of an image bound to memory, in the image's own format.
        self.view = unsafe { device.create_image_view(&view, None) }.call("vkCreateImageView")?;
        Ok(())
    }

    /// Destroys the view and the image and frees the memory; the GPU must be done with them.
    pub fn destroy(&mut self, device: &ash::Device) {
        // SAFETY: the handles are this device's or null, and the caller waited for the GPU.
        unsafe {
            device.destroy_image_view(self.view, None);
            device.destroy_image(self.image, None);
            device.free_memory(self.memory, None);
        }
        *self = Self::default();
    }

    pub fn extent(&self) -> vk::Extent3D {
        vk::Extent3D {
            width: self.width,
            height: self.height,
            depth: 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memory(flags: &[vk::MemoryPropertyFlags]) -> vk::PhysicalDeviceMemoryProperties {
        let mut props = vk::PhysicalDeviceMemoryProperties {
            memory_type_count: flags.len() as u32,
            ..Default::default()
        };
        for (slot, f) in props.memory_types.iter_mut().zip(flags) {
            slot.property_flags = *f;
        }
        props
    }

    #[test]
    fn memory_types_prefer_the_preferred_flags_and_respect_the_allowed_bits() {
        use vk::MemoryPropertyFlags as F;
        let props = memory(&[
            F::DEVICE_LOCAL,
            F::HOST_VISIBLE | F::HOST_COHERENT,
            F::HOST_VISIBLE | F::HOST_COHERENT | F::HOST_CACHED,
        ]);
        let host = F::HOST_VISIBLE | F::HOST_COHERENT;
        assert_eq!(find_memory_type(&props, 0b111, host, F::empty()), Some(1));
        assert_eq!(
            find_memory_type(&props, 0b111, host, F::HOST_CACHED),
            Some(2)
        );
        assert_eq!(
            find_memory_type(&props, 0b011, host, F::HOST_CACHED),
            Some(1)
        );
        assert_eq!(find_memory_type(&props, 0b001, host, F::empty()), None);
        assert_eq!(
            find_memory_type(&props, 0b110, F::empty(), F::DEVICE_LOCAL),
            Some(1)
        );
    }
}
