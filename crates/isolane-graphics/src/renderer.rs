//! The renderer: a frame uploaded to a texture, drawn as a full-screen triangle with the class
//! mask blended in, box outlines drawn over it, all into an offscreen RGBA image of the frame's
//! size. Every GPU object is made once (the mask image and the box buffer again only when a
//! larger one is needed), so a frame allocates nothing after the first.

use std::path::Path;
use std::time::Instant;

use ash::vk;

use crate::error::VkContext;
use crate::scene::{check_frame, check_overlay};
use crate::select::DeviceInfo;
use crate::vulkan::commands::Commands;
use crate::vulkan::context::Context;
use crate::vulkan::memory::{DeviceImage, HostBuffer, COLOUR_RANGE};
use crate::vulkan::pipeline::{binding, Pipelines, TARGET_FORMAT};
use crate::{label, BoxOverlay, FrameRef, GraphicsError, MaskRef, Overlay, RendererConfig};

/// Bytes of the shaders' `Params` before the palette, of the palette (256 vec4<f32>) and of
/// the font (84 rows as 21 vec4<u32>).
const PARAMS_HEADER: usize = 32;
const PALETTE_BYTES: usize = 256 * 16;
const FONT_BYTES: usize = 21 * 16;
/// Bytes of one `GpuBox` (two vec4<f32>).
const BOX_BYTES: usize = 32;
/// Vertices of one box outline: four edges of two triangles.
const BOX_VERTICES: u32 = 24;
/// Bytes of one `GpuGlyph` (origin, glyph, padding, colour) and vertices of its quad.
const GLYPH_BYTES: usize = 32;
const GLYPH_VERTICES: u32 = 6;
/// First size of the box and glyph buffers (64 boxes).
const INITIAL_STORAGE: usize = 64 * BOX_BYTES;

/// Where a frame's time went.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RenderTiming {
    /// The whole call on the CPU: checks, copying into staging memory, recording, submitting
    /// and waiting for the GPU to finish.
    pub cpu_ms: f64,
    /// Of `cpu_ms`, copying the frame, mask and boxes into staging memory.
    pub cpu_upload_ms: f64,
    /// The GPU's own times from timestamp queries; None where the queue has no timestamps.
    pub gpu: Option<GpuTiming>,
}

/// GPU time of one frame, from timestamps at its start, after the uploads and after drawing.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpuTiming {
    /// Copying the frame and mask from staging memory into their textures.
    pub upload_ms: f64,
    /// The render pass: the frame with the mask, then the boxes.
    pub draw_ms: f64,
    pub total_ms: f64,
}

/// Renders frames with their overlays on one Vulkan device. Methods take `&mut self`: one frame
/// at a time, each waited for.
pub struct Renderer {
    config: RendererConfig,
    pipelines: Pipelines,
    commands: Commands,
    frame: DeviceImage,
    frame_staging: HostBuffer,
    mask: DeviceImage,
    mask_staging: HostBuffer,
    /// Whether the mask image is in the layout the shader reads (it must be even when unused).
    mask_ready: bool,
    target: DeviceImage,
    framebuffer: vk::Framebuffer,
    params: HostBuffer,
    boxes: HostBuffer,
    glyphs: HostBuffer,
    readback: HostBuffer,
    rendered: bool,
    // Last: dropped after Drop destroyed everything above.
    ctx: Context,
}

// SAFETY: the only thread-bound parts are the raw pointers of the mapped buffers, which point
// into memory the renderer owns and touches only through `&mut self` (or `&self` for reading
// back); Vulkan handles may move between threads as long as their use is externally
// synchronised, which `&mut self` guarantees.
unsafe impl Send for Renderer {}

impl Renderer {
    /// Opens the chosen device and makes every object a frame needs.
    pub fn new(config: RendererConfig) -> Result<Self, GraphicsError> {
        // The size is checked against the device below; everything else before opening one.
        config.check(u32::MAX)?;
        let ctx = Context::new(&config.device)?;
        config.check(ctx.limits.max_image_dimension2_d)?;
        let mut renderer = Self {
            config,
            pipelines: Pipelines::default(),
            commands: Commands::default(),
            frame: DeviceImage::default(),
            frame_staging: HostBuffer::default(),
            mask: DeviceImage::default(),
            mask_staging: HostBuffer::default(),
            mask_ready: false,
            target: DeviceImage::default(),
            framebuffer: vk::Framebuffer::null(),
            params: HostBuffer::default(),
            boxes: HostBuffer::default(),
            glyphs: HostBuffer::default(),
            readback: HostBuffer::default(),
            rendered: false,
            ctx,
        };
        // On error, dropping `renderer` destroys whatever was made.
        renderer.build()?;
        Ok(renderer)
    }

    /// The name of the device rendering, as its driver gives it.
    pub fn device_name(&self) -> &str {
        &self.ctx.info.name
    }

    /// The device rendering: its name, kind and vendor.
    pub fn device(&self) -> &DeviceInfo {
        &self.ctx.info
    }

    pub fn config(&self) -> &RendererConfig {
        &self.config
    }

    /// Draws `frame` with `overlay` and waits for the GPU to finish.
    pub fn render(
        &mut self,
        frame: FrameRef<'_>,
        overlay: &Overlay<'_>,
    ) -> Result<RenderTiming, GraphicsError> {
        let start = Instant::now();
        check_frame(&frame, self.config.width, self.config.height)?;
        check_overlay(overlay)?;
        let (boxes, glyphs) = self.fit_overlay(overlay)?;
        let upload_start = Instant::now();
        self.stage(&frame, overlay);
        let cpu_upload_ms = ms(upload_start.elapsed().as_secs_f64());
        self.record(overlay.mask.is_some(), boxes as u32, glyphs as u32)?;
        self.commands.submit_and_wait(&self.ctx)?;
        self.rendered = true;
        let gpu = self.gpu_timing()?;
        Ok(RenderTiming {
            cpu_ms: ms(start.elapsed().as_secs_f64()),
            cpu_upload_ms,
            gpu,
        })
    }

    /// Makes the mask image and the box and glyph buffers fit this overlay; returns how many
    /// boxes and glyphs are drawn.
    fn fit_overlay(&mut self, overlay: &Overlay<'_>) -> Result<(usize, usize), GraphicsError> {
        // Without a mask the bound one stays (any size), unless a failed resize left none.
        match &overlay.mask {
            Some(mask) => self.fit_mask(mask.width, mask.height)?,
            None if self.mask.image == vk::Image::null() => self.fit_mask(1, 1)?,
            None => {}
        }
        let min_score = self.config.min_score;
        let visible = || overlay.boxes.iter().filter(move |b| b.score >= min_score);
        let boxes = visible().count();
        let glyphs = match self.config.label_scale {
            0 => 0,
            _ => visible().map(|b| label::glyphs(b).1).sum(),
        };
        let set = self.pipelines.set;
        fit_storage(
            &self.ctx,
            set,
            &mut self.boxes,
            binding::BOXES,
            boxes * BOX_BYTES,
        )?;
        let glyph_bytes = glyphs * GLYPH_BYTES;
        fit_storage(
            &self.ctx,
            set,
            &mut self.glyphs,
            binding::LABELS,
            glyph_bytes,
        )?;
        Ok((boxes, glyphs))
    }

    /// The last rendered image: RGBA, rows top to bottom.
    pub fn read_back(&mut self) -> Result<Vec<u8>, GraphicsError> {
        let mut rgba = Vec::new();
        self.read_back_into(&mut rgba)?;
        Ok(rgba)
    }

    /// The last rendered image into `rgba` (replacing its contents; reusing its allocation).
    pub fn read_back_into(&mut self, rgba: &mut Vec<u8>) -> Result<(), GraphicsError> {
        if !self.rendered {
            return Err(GraphicsError::NothingRendered);
        }
        if self.readback.buffer == vk::Buffer::null() {
            let size = self.frame_staging.size;
            let usage = vk::BufferUsageFlags::TRANSFER_DST;
            self.readback = HostBuffer::new(&self.ctx, size, usage, "the read-back buffer", true)?;
        }
        let device = &self.ctx.device;
        self.commands.begin(device)?;
        let region = copy_region(self.target.extent());
        // SAFETY: recording; the target is in TRANSFER_SRC_OPTIMAL (the render pass's final
        // layout) and the buffer holds its whole size.
        unsafe {
            device.cmd_copy_image_to_buffer(
                self.commands.buffer,
                self.target.image,
                vk::ImageLayout::TRANSFER_SRC_OPTIMAL,
                self.readback.buffer,
                &[region],
            );
        }
        let to_host = vk::MemoryBarrier::default()
            .src_access_mask(vk::AccessFlags::TRANSFER_WRITE)
            .dst_access_mask(vk::AccessFlags::HOST_READ);
        self.barrier(
            vk::PipelineStageFlags::TRANSFER,
            vk::PipelineStageFlags::HOST,
            &[to_host],
            &[],
        );
        self.commands.submit_and_wait(&self.ctx)?;
        rgba.clear();
        rgba.extend_from_slice(self.readback.bytes());
        Ok(())
    }

    /// Writes the last rendered image to a PNG file.
    pub fn save_png(&mut self, path: &Path) -> Result<(), GraphicsError> {
        let rgba = self.read_back()?;
        image::save_buffer(
            path,
            &rgba,
            self.config.width,
            self.config.height,
            image::ColorType::Rgba8,
        )
        .map_err(|source| GraphicsError::Png {
            path: path.to_path_buf(),
            source,
        })
    }

    /// Makes the fixed objects: pipelines, commands, frame and target images, buffers.
    fn build(&mut self) -> Result<(), GraphicsError> {
        let (width, height) = (self.config.width, self.config.height);
        self.pipelines.create(&self.ctx.device, width, height)?;
        self.commands.create(&self.ctx)?;
        let sampled = vk::ImageUsageFlags::SAMPLED | vk::ImageUsageFlags::TRANSFER_DST;
        self.frame = DeviceImage::new(
            &self.ctx,
            (width, height),
            TARGET_FORMAT,
            sampled,
            "the frame texture",
        )?;
        let frame_bytes = width as usize * height as usize * 4;
        let upload = vk::BufferUsageFlags::TRANSFER_SRC;
        self.frame_staging = HostBuffer::new(
            &self.ctx,
            frame_bytes,
            upload,
            "the frame's staging buffer",
            false,
        )?;
        let drawn = vk::ImageUsageFlags::COLOR_ATTACHMENT | vk::ImageUsageFlags::TRANSFER_SRC;
        self.target = DeviceImage::new(
            &self.ctx,
            (width, height),
            TARGET_FORMAT,
            drawn,
            "the rendered image",
        )?;
        let attachments = [self.target.view];
        let info = vk::FramebufferCreateInfo::default()
            .render_pass(self.pipelines.render_pass)
            .attachments(&attachments)
            .width(width)
            .height(height)
            .layers(1);
        // SAFETY: the view is of an image of this size made for colour attachment in the render
        // pass's format.
        self.framebuffer = unsafe { self.ctx.device.create_framebuffer(&info, None) }
            .call("vkCreateFramebuffer")?;
        let uniform = vk::BufferUsageFlags::UNIFORM_BUFFER;
        self.params = HostBuffer::new(
            &self.ctx,
            PARAMS_HEADER + PALETTE_BYTES + FONT_BYTES,
            uniform,
            "the parameters",
            false,
        )?;
        self.write_palette();
        self.write_font();
        // A 1x1 mask and empty box and glyph buffers, so that the set is complete before the
        // first frame.
        self.fit_mask(1, 1)?;
        let set = self.pipelines.set;
        fit_storage(&self.ctx, set, &mut self.boxes, binding::BOXES, 0)?;
        fit_storage(&self.ctx, set, &mut self.glyphs, binding::LABELS, 0)?;
        self.bind_fixed();
        Ok(())
    }

    fn write_palette(&mut self) {
        let palette = self.config.palette.clone();
        let bytes = &mut self.params.bytes_mut()[PARAMS_HEADER..];
        for (class, slot) in bytes.chunks_exact_mut(16).enumerate() {
            let [r, g, b] = palette.colour(class as u8);
            write_f32s(slot, &[unorm(r), unorm(g), unorm(b), 1.0]);
        }
    }

    /// The font after the palette: glyph g's row r is word 7g + r.
    fn write_font(&mut self) {
        let words = &mut self.params.bytes_mut()[PARAMS_HEADER + PALETTE_BYTES..];
        let rows = label::FONT.iter().flatten();
        for (slot, row) in words.chunks_exact_mut(4).zip(rows) {
            slot.copy_from_slice(&u32::from(*row).to_ne_bytes());
        }
    }

    /// Points the set at the frame texture, the sampler and the parameters (fixed for life).
    fn bind_fixed(&self) {
        let frame = [vk::DescriptorImageInfo {
            sampler: vk::Sampler::null(),
            image_view: self.frame.view,
            image_layout: vk::ImageLayout::SHADER_READ_ONLY_OPTIMAL,
        }];
        let sampler = [vk::DescriptorImageInfo {
            sampler: self.pipelines.sampler,
            ..Default::default()
        }];
        let params = [buffer_info(self.params.buffer)];
        let set = self.pipelines.set;
        let writes = [
            write(set, binding::FRAME, vk::DescriptorType::SAMPLED_IMAGE).image_info(&frame),
            write(set, binding::SAMPLER, vk::DescriptorType::SAMPLER).image_info(&sampler),
            write(set, binding::PARAMS, vk::DescriptorType::UNIFORM_BUFFER).buffer_info(&params),
        ];
        // SAFETY: the set is not in use by the GPU (nothing submitted is pending) and every
        // handle written is alive and of the type its binding declares.
        unsafe { self.ctx.device.update_descriptor_sets(&writes, &[]) };
    }

    /// Makes the mask image and its staging buffer `width` x `height` if they are not already.
    /// On failure neither is left (so a later call makes both again and the set never names a
    /// destroyed view for long: no frame is drawn until a call succeeds).
    fn fit_mask(&mut self, width: u32, height: u32) -> Result<(), GraphicsError> {
        let ready = self.mask.image != vk::Image::null();
        if ready && (self.mask.width, self.mask.height) == (width, height) {
            return Ok(());
        }
        let max = self.ctx.limits.max_image_dimension2_d;
        if width > max || height > max {
            return Err(GraphicsError::Config(format!(
                "the mask is {width}x{height}; this device takes at most {max} pixels a side"
            )));
        }
        let made = self.make_mask(width, height);
        if made.is_err() {
            self.mask.destroy(&self.ctx.device);
            self.mask_staging.destroy(&self.ctx.device);
        }
        made
    }

    fn make_mask(&mut self, width: u32, height: u32) -> Result<(), GraphicsError> {
        self.mask.destroy(&self.ctx.device);
        self.mask_staging.destroy(&self.ctx.device);
        self.mask_ready = false;
        let usage = vk::ImageUsageFlags::SAMPLED | vk::ImageUsageFlags::TRANSFER_DST;
        self.mask = DeviceImage::new(
            &self.ctx,
            (width, height),
            vk::Format::R8_UINT,
            usage,
            "the mask texture",
        )?;
        let bytes = width as usize * height as usize;
        let upload = vk::BufferUsageFlags::TRANSFER_SRC;
        self.mask_staging =
            HostBuffer::new(&self.ctx, bytes, upload, "the mask's staging buffer", false)?;
        let mask = [vk::DescriptorImageInfo {
            sampler: vk::Sampler::null(),
            image_view: self.mask.view,
            image_layout: vk::ImageLayout::SHADER_READ_ONLY_OPTIMAL,
        }];
        let writes = [write(
            self.pipelines.set,
            binding::MASK,
            vk::DescriptorType::SAMPLED_IMAGE,
        )
        .image_info(&mask)];
        // SAFETY: as in bind_fixed: no submission is pending, the view is alive.
        unsafe { self.ctx.device.update_descriptor_sets(&writes, &[]) };
        Ok(())
    }

    /// Copies the frame, the mask, the parameters, the drawn boxes and their labels' glyphs
    /// into host memory.
    fn stage(&mut self, frame: &FrameRef<'_>, overlay: &Overlay<'_>) {
        self.frame_staging.bytes_mut().copy_from_slice(frame.rgba);
        if let Some(mask) = &overlay.mask {
            self.mask_staging.bytes_mut().copy_from_slice(mask.classes);
        }
        self.write_header(overlay.mask.as_ref());
        let min_score = self.config.min_score;
        let palette = &self.config.palette;
        let visible = || overlay.boxes.iter().filter(|b| b.score >= min_score);
        let slots = self.boxes.bytes_mut().chunks_exact_mut(BOX_BYTES);
        for (slot, b) in slots.zip(visible()) {
            write_f32s(slot, &gpu_box(b, palette.colour(b.class)));
        }
        let (scale, line_width) = (self.config.label_scale, self.config.line_width);
        if scale == 0 {
            return;
        }
        let mut slots = self.glyphs.bytes_mut().chunks_exact_mut(GLYPH_BYTES);
        for b in visible() {
            let (glyphs, count) = label::glyphs(b);
            let (x, y) = label::origin(b, scale, line_width);
            let [r, g, bl] = palette.colour(b.class);
            for (i, glyph) in glyphs[..count].iter().enumerate() {
                let Some(slot) = slots.next() else { return };
                let left = x + (i as u32 * label::ADVANCE * scale) as i32;
                write_glyph(slot, (left, y), *glyph, [r, g, bl]);
            }
        }
    }

    fn write_header(&mut self, mask: Option<&MaskRef<'_>>) {
        let (mask_width, mask_height) = mask.map_or((1, 1), |m| (m.width, m.height));
        let header = &mut self.params.bytes_mut()[..PARAMS_HEADER];
        let words = [
            self.config.width,
            self.config.height,
            mask_width,
            mask_height,
            self.config.mask_alpha.to_bits(),
            u32::from(mask.is_some()),
            self.config.line_width.to_bits(),
            self.config.label_scale,
        ];
        for (slot, word) in header.chunks_exact_mut(4).zip(words) {
            slot.copy_from_slice(&word.to_ne_bytes());
        }
    }

    /// Records the frame: uploads, then the render pass, between timestamps.
    fn record(&mut self, has_mask: bool, boxes: u32, glyphs: u32) -> Result<(), GraphicsError> {
        self.commands.begin(&self.ctx.device)?;
        self.commands.reset_timestamps(&self.ctx.device);
        self.commands
            .timestamp(&self.ctx.device, vk::PipelineStageFlags::TOP_OF_PIPE, 0);
        self.record_uploads(has_mask);
        self.commands
            .timestamp(&self.ctx.device, vk::PipelineStageFlags::TRANSFER, 1);
        self.record_draw(boxes, glyphs);
        self.commands
            .timestamp(&self.ctx.device, vk::PipelineStageFlags::BOTTOM_OF_PIPE, 2);
        Ok(())
    }

    /// Copies the staged frame (and mask) into their textures and makes them readable by the
    /// fragment shader.
    fn record_uploads(&mut self, has_mask: bool) {
        let uploads = if has_mask { 2 } else { 1 };
        // Old contents are discarded (UNDEFINED): every upload rewrites the whole image. The
        // previous frame's reads finished before its fence signalled.
        let to_copy = [self.frame.image, self.mask.image].map(|image| {
            layout_barrier(
                image,
                vk::ImageLayout::UNDEFINED,
                vk::ImageLayout::TRANSFER_DST_OPTIMAL,
            )
            .dst_access_mask(vk::AccessFlags::TRANSFER_WRITE)
        });
        self.barrier(
            vk::PipelineStageFlags::FRAGMENT_SHADER,
            vk::PipelineStageFlags::TRANSFER,
            &[],
            &to_copy[..uploads],
        );
        self.copy_into(self.frame_staging.buffer, &self.frame);
        if has_mask {
            self.copy_into(self.mask_staging.buffer, &self.mask);
        }
        let readable = |image, old| {
            layout_barrier(image, old, vk::ImageLayout::SHADER_READ_ONLY_OPTIMAL)
                .src_access_mask(vk::AccessFlags::TRANSFER_WRITE)
                .dst_access_mask(vk::AccessFlags::SHADER_READ)
        };
        let uploaded = vk::ImageLayout::TRANSFER_DST_OPTIMAL;
        let to_read = [
            readable(self.frame.image, uploaded),
            // Unused without a mask, but bound: its layout must be the one the set declares.
            readable(
                self.mask.image,
                if has_mask {
                    uploaded
                } else {
                    vk::ImageLayout::UNDEFINED
                },
            ),
        ];
        let transitions = if has_mask || !self.mask_ready { 2 } else { 1 };
        self.mask_ready = true;
        let (src, dst) = (
            vk::PipelineStageFlags::TRANSFER,
            vk::PipelineStageFlags::FRAGMENT_SHADER,
        );
        self.barrier(src, dst, &[], &to_read[..transitions]);
    }

    fn copy_into(&self, staging: vk::Buffer, image: &DeviceImage) {
        let region = copy_region(image.extent());
        // SAFETY: recording; the image is in TRANSFER_DST_OPTIMAL (barrier above) and the
        // staging buffer holds exactly its texels.
        unsafe {
            self.ctx.device.cmd_copy_buffer_to_image(
                self.commands.buffer,
                staging,
                image.image,
                vk::ImageLayout::TRANSFER_DST_OPTIMAL,
                &[region],
            );
        }
    }

    /// The render pass: the frame with the mask, then the box outlines over it, then the
    /// labels over those.
    fn record_draw(&self, boxes: u32, glyphs: u32) {
        let device = &self.ctx.device;
        let cb = self.commands.buffer;
        let area = vk::Rect2D {
            offset: vk::Offset2D::default(),
            extent: vk::Extent2D {
                width: self.config.width,
                height: self.config.height,
            },
        };
        let begin = vk::RenderPassBeginInfo::default()
            .render_pass(self.pipelines.render_pass)
            .framebuffer(self.framebuffer)
            .render_area(area);
        let graphics = vk::PipelineBindPoint::GRAPHICS;
        // SAFETY: recording; the framebuffer matches the render pass; the set's bindings are
        // all written and their images in the declared layouts; the pipelines use this layout.
        unsafe {
            device.cmd_begin_render_pass(cb, &begin, vk::SubpassContents::INLINE);
            device.cmd_bind_descriptor_sets(
                cb,
                graphics,
                self.pipelines.layout,
                0,
                &[self.pipelines.set],
                &[],
            );
            device.cmd_bind_pipeline(cb, graphics, self.pipelines.frame);
            device.cmd_draw(cb, 3, 1, 0, 0);
            if boxes > 0 {
                device.cmd_bind_pipeline(cb, graphics, self.pipelines.boxes);
                device.cmd_draw(cb, BOX_VERTICES, boxes, 0, 0);
            }
            if glyphs > 0 {
                device.cmd_bind_pipeline(cb, graphics, self.pipelines.labels);
                device.cmd_draw(cb, GLYPH_VERTICES, glyphs, 0, 0);
            }
            device.cmd_end_render_pass(cb);
        }
    }

    fn barrier(
        &self,
        src: vk::PipelineStageFlags,
        dst: vk::PipelineStageFlags,
        memory: &[vk::MemoryBarrier<'_>],
        images: &[vk::ImageMemoryBarrier<'_>],
    ) {
        // SAFETY: recording, outside a render pass; the barriers name live images of this device.
        unsafe {
            self.ctx.device.cmd_pipeline_barrier(
                self.commands.buffer,
                src,
                dst,
                vk::DependencyFlags::empty(),
                memory,
                &[],
                images,
            );
        }
    }

    fn gpu_timing(&self) -> Result<Option<GpuTiming>, GraphicsError> {
        let (Some(ticks), Some((period_ns, mask))) = (
            self.commands.read_timestamps(&self.ctx.device)?,
            self.ctx.timestamps,
        ) else {
            return Ok(None);
        };
        let span = |from: u64, to: u64| (to.wrapping_sub(from) & mask) as f64 * period_ns * 1e-6;
        Ok(Some(GpuTiming {
            upload_ms: span(ticks[0], ticks[1]),
            draw_ms: span(ticks[1], ticks[2]),
            total_ms: span(ticks[0], ticks[2]),
        }))
    }
}

impl Drop for Renderer {
    fn drop(&mut self) {
        let device = &self.ctx.device;
        // SAFETY: a valid device. If waiting fails (device lost) the objects are destroyed
        // anyway: a lost device runs nothing more.
        let _ = unsafe { device.device_wait_idle() };
        self.readback.destroy(device);
        self.glyphs.destroy(device);
        self.boxes.destroy(device);
        self.params.destroy(device);
        // SAFETY: this device's framebuffer (or null), no longer used.
        unsafe { device.destroy_framebuffer(self.framebuffer, None) };
        self.target.destroy(device);
        self.mask_staging.destroy(device);
        self.mask.destroy(device);
        self.frame_staging.destroy(device);
        self.frame.destroy(device);
        self.commands.destroy(device);
        self.pipelines.destroy(device);
    }
}

/// Makes the storage `buffer`, bound at `slot` of `set`, hold at least `bytes`: it grows by
/// powers of two from `INITIAL_STORAGE` bytes, and is bound again when remade. On failure it is
/// left empty (null) and remade by the next call.
fn fit_storage(
    ctx: &Context,
    set: vk::DescriptorSet,
    buffer: &mut HostBuffer,
    slot: u32,
    bytes: usize,
) -> Result<(), GraphicsError> {
    if bytes <= buffer.size && buffer.buffer != vk::Buffer::null() {
        return Ok(());
    }
    let size = bytes.max(INITIAL_STORAGE).next_power_of_two();
    buffer.destroy(&ctx.device);
    let usage = vk::BufferUsageFlags::STORAGE_BUFFER;
    *buffer = HostBuffer::new(ctx, size, usage, "a box or label buffer", false)?;
    let info = [buffer_info(buffer.buffer)];
    let writes = [write(set, slot, vk::DescriptorType::STORAGE_BUFFER).buffer_info(&info)];
    // SAFETY: as in bind_fixed: no submission is pending, the buffer is alive.
    unsafe { ctx.device.update_descriptor_sets(&writes, &[]) };
    Ok(())
}

/// A glyph as the shader reads it: origin, glyph index, padding, colour.
fn write_glyph(slot: &mut [u8], (x, y): (i32, i32), glyph: u8, [r, g, b]: [u8; 3]) {
    write_f32s(&mut slot[..8], &[x as f32, y as f32]);
    slot[8..12].copy_from_slice(&u32::from(glyph).to_ne_bytes());
    slot[12..16].copy_from_slice(&0u32.to_ne_bytes());
    write_f32s(&mut slot[16..], &[unorm(r), unorm(g), unorm(b), 1.0]);
}

/// A box as the shader reads it: edges, then its colour.
fn gpu_box(b: &BoxOverlay, [r, g, bl]: [u8; 3]) -> [f32; 8] {
    [b.x0, b.y0, b.x1, b.y1, unorm(r), unorm(g), unorm(bl), 1.0]
}

fn unorm(v: u8) -> f32 {
    f32::from(v) / 255.0
}

fn write_f32s(slot: &mut [u8], values: &[f32]) {
    for (bytes, v) in slot.chunks_exact_mut(4).zip(values) {
        bytes.copy_from_slice(&v.to_ne_bytes());
    }
}

fn ms(seconds: f64) -> f64 {
    seconds * 1e3
}

fn copy_region(extent: vk::Extent3D) -> vk::BufferImageCopy {
    vk::BufferImageCopy {
        buffer_offset: 0,
        buffer_row_length: 0,
        buffer_image_height: 0,
        image_subresource: vk::ImageSubresourceLayers {
            aspect_mask: vk::ImageAspectFlags::COLOR,
            mip_level: 0,
            base_array_layer: 0,
            layer_count: 1,
        },
        image_offset: vk::Offset3D::default(),
        image_extent: extent,
    }
}

fn layout_barrier(
    image: vk::Image,
    old: vk::ImageLayout,
    new: vk::ImageLayout,
) -> vk::ImageMemoryBarrier<'static> {
    vk::ImageMemoryBarrier::default()
        .old_layout(old)
        .new_layout(new)
        .src_queue_family_index(vk::QUEUE_FAMILY_IGNORED)
        .dst_queue_family_index(vk::QUEUE_FAMILY_IGNORED)
        .image(image)
        .subresource_range(COLOUR_RANGE)
}

fn buffer_info(buffer: vk::Buffer) -> vk::DescriptorBufferInfo {
    vk::DescriptorBufferInfo {
        buffer,
        offset: 0,
        range: vk::WHOLE_SIZE,
    }
}

fn write<'a>(
    set: vk::DescriptorSet,
    binding: u32,
    ty: vk::DescriptorType,
) -> vk::WriteDescriptorSet<'a> {
    vk::WriteDescriptorSet::default()
        .dst_set(set)
        .dst_binding(binding)
        .descriptor_type(ty)
}
