//! The fixed drawing state: the render pass, the descriptor layout shared by both shaders, the
//! frame and box pipelines, the sampler and the one descriptor set. Made once per renderer.

use ash::vk;

use crate::error::VkContext;
use crate::GraphicsError;

/// The rendered image's format: 8-bit RGBA, like the frames.
pub(crate) const TARGET_FORMAT: vk::Format = vk::Format::R8G8B8A8_UNORM;

/// The SPIR-V that build.rs made from shaders/*.wgsl.
const FRAME_SPIRV: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/frame.spv"));
const BOXES_SPIRV: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/boxes.spv"));
const LABELS_SPIRV: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/labels.spv"));

/// Bindings of the one descriptor set (the shaders' @binding numbers).
pub(crate) mod binding {
    pub const FRAME: u32 = 0;
    pub const SAMPLER: u32 = 1;
    pub const MASK: u32 = 2;
    pub const PARAMS: u32 = 3;
    pub const BOXES: u32 = 4;
    pub const LABELS: u32 = 5;
}

#[derive(Default)]
pub(crate) struct Pipelines {
    pub render_pass: vk::RenderPass,
    pub set_layout: vk::DescriptorSetLayout,
    pub layout: vk::PipelineLayout,
    pub frame: vk::Pipeline,
    pub boxes: vk::Pipeline,
    pub labels: vk::Pipeline,
    pub sampler: vk::Sampler,
    pub pool: vk::DescriptorPool,
    pub set: vk::DescriptorSet,
}

impl Pipelines {
    /// Fills in every object for a `width` x `height` target; on error what exists is left for
    /// `destroy`.
    pub fn create(
        &mut self,
        device: &ash::Device,
        width: u32,
        height: u32,
    ) -> Result<(), GraphicsError> {
        self.render_pass = render_pass(device)?;
        self.set_layout = set_layout(device)?;
        let layouts = [self.set_layout];
        let info = vk::PipelineLayoutCreateInfo::default().set_layouts(&layouts);
        // SAFETY: a valid device and a set layout of it.
        self.layout =
            unsafe { device.create_pipeline_layout(&info, None) }.call("vkCreatePipelineLayout")?;
        let extent = vk::Extent2D { width, height };
        self.frame = pipeline(device, FRAME_SPIRV, self.layout, self.render_pass, extent)?;
        self.boxes = pipeline(device, BOXES_SPIRV, self.layout, self.render_pass, extent)?;
        self.labels = pipeline(device, LABELS_SPIRV, self.layout, self.render_pass, extent)?;
        self.sampler = sampler(device)?;
        self.pool = descriptor_pool(device)?;
        let allocate = vk::DescriptorSetAllocateInfo::default()
            .descriptor_pool(self.pool)
            .set_layouts(&layouts);
        // SAFETY: a pool with room for exactly this one set.
        let sets = unsafe { device.allocate_descriptor_sets(&allocate) }
            .call("vkAllocateDescriptorSets")?;
        self.set = sets[0];
        Ok(())
    }

    /// Destroys every object (null ones are skipped by Vulkan); the GPU must be done with them.
    pub fn destroy(&mut self, device: &ash::Device) {
        // SAFETY: the handles are this device's or null and the caller waited for the GPU; the
        // set goes with its pool.
        unsafe {
            device.destroy_descriptor_pool(self.pool, None);
            device.destroy_sampler(self.sampler, None);
            device.destroy_pipeline(self.labels, None);
            device.destroy_pipeline(self.boxes, None);
            device.destroy_pipeline(self.frame, None);
            device.destroy_pipeline_layout(self.layout, None);
            device.destroy_descriptor_set_layout(self.set_layout, None);
            device.destroy_render_pass(self.render_pass, None);
        }
        *self = Self::default();
    }
}

fn render_pass(device: &ash::Device) -> Result<vk::RenderPass, GraphicsError> {
    let attachment = vk::AttachmentDescription::default()
        .format(TARGET_FORMAT)
        .samples(vk::SampleCountFlags::TYPE_1)
        // The frame's triangle covers every pixel, so the old contents are never read.
        .load_op(vk::AttachmentLoadOp::DONT_CARE)
        .store_op(vk::AttachmentStoreOp::STORE)
        .stencil_load_op(vk::AttachmentLoadOp::DONT_CARE)
        .stencil_store_op(vk::AttachmentStoreOp::DONT_CARE)
        .initial_layout(vk::ImageLayout::UNDEFINED)
        // Ready for read_back's copy.
        .final_layout(vk::ImageLayout::TRANSFER_SRC_OPTIMAL);
    let colour = [vk::AttachmentReference {
        attachment: 0,
        layout: vk::ImageLayout::COLOR_ATTACHMENT_OPTIMAL,
    }];
    let subpass = vk::SubpassDescription::default()
        .pipeline_bind_point(vk::PipelineBindPoint::GRAPHICS)
        .color_attachments(&colour);
    let dependencies = [
        // A previous read-back's copy out of the target finishes before it is drawn over.
        vk::SubpassDependency::default()
            .src_subpass(vk::SUBPASS_EXTERNAL)
            .dst_subpass(0)
            .src_stage_mask(
                vk::PipelineStageFlags::TRANSFER | vk::PipelineStageFlags::COLOR_ATTACHMENT_OUTPUT,
            )
            .dst_stage_mask(vk::PipelineStageFlags::COLOR_ATTACHMENT_OUTPUT)
            .dst_access_mask(vk::AccessFlags::COLOR_ATTACHMENT_WRITE),
        // The drawing is visible to the read-back's copy.
        vk::SubpassDependency::default()
            .src_subpass(0)
            .dst_subpass(vk::SUBPASS_EXTERNAL)
            .src_stage_mask(vk::PipelineStageFlags::COLOR_ATTACHMENT_OUTPUT)
            .src_access_mask(vk::AccessFlags::COLOR_ATTACHMENT_WRITE)
            .dst_stage_mask(vk::PipelineStageFlags::TRANSFER)
            .dst_access_mask(vk::AccessFlags::TRANSFER_READ),
    ];
    let attachments = [attachment];
    let subpasses = [subpass];
    let info = vk::RenderPassCreateInfo::default()
        .attachments(&attachments)
        .subpasses(&subpasses)
        .dependencies(&dependencies);
    // SAFETY: a valid device; `info` and its arrays outlive the call.
    unsafe { device.create_render_pass(&info, None) }.call("vkCreateRenderPass")
}

fn set_layout(device: &ash::Device) -> Result<vk::DescriptorSetLayout, GraphicsError> {
    let entry = |binding, ty, stages| {
        vk::DescriptorSetLayoutBinding::default()
            .binding(binding)
            .descriptor_type(ty)
            .descriptor_count(1)
            .stage_flags(stages)
    };
    let fragment = vk::ShaderStageFlags::FRAGMENT;
    let bindings = [
        entry(binding::FRAME, vk::DescriptorType::SAMPLED_IMAGE, fragment),
        entry(binding::SAMPLER, vk::DescriptorType::SAMPLER, fragment),
        entry(binding::MASK, vk::DescriptorType::SAMPLED_IMAGE, fragment),
        entry(
            binding::PARAMS,
            vk::DescriptorType::UNIFORM_BUFFER,
            fragment | vk::ShaderStageFlags::VERTEX,
        ),
        entry(
            binding::BOXES,
            vk::DescriptorType::STORAGE_BUFFER,
            vk::ShaderStageFlags::VERTEX,
        ),
        entry(
            binding::LABELS,
            vk::DescriptorType::STORAGE_BUFFER,
            vk::ShaderStageFlags::VERTEX,
        ),
    ];
    let info = vk::DescriptorSetLayoutCreateInfo::default().bindings(&bindings);
    // SAFETY: a valid device; `info` and its array outlive the call.
    unsafe { device.create_descriptor_set_layout(&info, None) }.call("vkCreateDescriptorSetLayout")
}

fn descriptor_pool(device: &ash::Device) -> Result<vk::DescriptorPool, GraphicsError> {
    let size = |ty, descriptor_count| vk::DescriptorPoolSize {
        ty,
        descriptor_count,
    };
    let sizes = [
        size(vk::DescriptorType::SAMPLED_IMAGE, 2),
        size(vk::DescriptorType::SAMPLER, 1),
        size(vk::DescriptorType::UNIFORM_BUFFER, 1),
        size(vk::DescriptorType::STORAGE_BUFFER, 2),
    ];
    let info = vk::DescriptorPoolCreateInfo::default()
        .max_sets(1)
        .pool_sizes(&sizes);
    // SAFETY: a valid device; `info` and its array outlive the call.
    unsafe { device.create_descriptor_pool(&info, None) }.call("vkCreateDescriptorPool")
}

fn sampler(device: &ash::Device) -> Result<vk::Sampler, GraphicsError> {
    // Nearest: the target has the frame's size, so each pixel reads exactly its own texel.
    let info = vk::SamplerCreateInfo::default()
        .mag_filter(vk::Filter::NEAREST)
        .min_filter(vk::Filter::NEAREST)
        .mipmap_mode(vk::SamplerMipmapMode::NEAREST)
        .address_mode_u(vk::SamplerAddressMode::CLAMP_TO_EDGE)
        .address_mode_v(vk::SamplerAddressMode::CLAMP_TO_EDGE)
        .address_mode_w(vk::SamplerAddressMode::CLAMP_TO_EDGE)
        .max_lod(0.0);
    // SAFETY: a valid device and create info.
    unsafe { device.create_sampler(&info, None) }.call("vkCreateSampler")
}

/// A pipeline of one shader module's `vs_main` and `fs_main`: no vertex buffers (the shaders
/// make their vertices from the vertex and instance index), triangles, no blending.
fn pipeline(
    device: &ash::Device,
    spirv: &[u8],
    layout: vk::PipelineLayout,
    render_pass: vk::RenderPass,
    extent: vk::Extent2D,
) -> Result<vk::Pipeline, GraphicsError> {
    let module = shader_module(device, spirv)?;
    let stages = [
        vk::PipelineShaderStageCreateInfo::default()
            .stage(vk::ShaderStageFlags::VERTEX)
            .module(module)
            .name(c"vs_main"),
        vk::PipelineShaderStageCreateInfo::default()
            .stage(vk::ShaderStageFlags::FRAGMENT)
            .module(module)
            .name(c"fs_main"),
    ];
    let vertex_input = vk::PipelineVertexInputStateCreateInfo::default();
    let assembly = vk::PipelineInputAssemblyStateCreateInfo::default()
        .topology(vk::PrimitiveTopology::TRIANGLE_LIST);
    let viewports = [vk::Viewport {
        x: 0.0,
        y: 0.0,
        width: extent.width as f32,
        height: extent.height as f32,
        min_depth: 0.0,
        max_depth: 1.0,
    }];
    let scissors = [vk::Rect2D {
        offset: vk::Offset2D::default(),
        extent,
    }];
    let viewport = vk::PipelineViewportStateCreateInfo::default()
        .viewports(&viewports)
        .scissors(&scissors);
    let raster = vk::PipelineRasterizationStateCreateInfo::default()
        .polygon_mode(vk::PolygonMode::FILL)
        .cull_mode(vk::CullModeFlags::NONE)
        .front_face(vk::FrontFace::COUNTER_CLOCKWISE)
        .line_width(1.0);
    let multisample = vk::PipelineMultisampleStateCreateInfo::default()
        .rasterization_samples(vk::SampleCountFlags::TYPE_1);
    let blend_attachments = [vk::PipelineColorBlendAttachmentState::default()
        .color_write_mask(vk::ColorComponentFlags::RGBA)];
    let blend = vk::PipelineColorBlendStateCreateInfo::default().attachments(&blend_attachments);
    let info = vk::GraphicsPipelineCreateInfo::default()
        .stages(&stages)
        .vertex_input_state(&vertex_input)
        .input_assembly_state(&assembly)
        .viewport_state(&viewport)
        .rasterization_state(&raster)
        .multisample_state(&multisample)
        .color_blend_state(&blend)
        .layout(layout)
        .render_pass(render_pass)
        .subpass(0);
    // SAFETY: every state the pipeline needs is given and outlives the call; the module's
    // entry points and bindings match the layout (build.rs validated the shaders).
    let made =
        unsafe { device.create_graphics_pipelines(vk::PipelineCache::null(), &[info], None) };
    // SAFETY: the module is no longer needed once the pipeline is made (or failed).
    unsafe { device.destroy_shader_module(module, None) };
    made.map(|p| p[0])
        .map_err(|(_, result)| GraphicsError::Vulkan {
            call: "vkCreateGraphicsPipelines",
            result,
        })
}

fn shader_module(device: &ash::Device, spirv: &[u8]) -> Result<vk::ShaderModule, GraphicsError> {
    // read_spv copies into u32 words (include_bytes gives no alignment).
    let words =
        ash::util::read_spv(&mut std::io::Cursor::new(spirv)).map_err(GraphicsError::Shader)?;
    let info = vk::ShaderModuleCreateInfo::default().code(&words);
    // SAFETY: SPIR-V that naga produced and validated at build time.
    unsafe { device.create_shader_module(&info, None) }.call("vkCreateShaderModule")
}
