//! isolane's visualization stage (the last step of an endoscopy-style pipeline: source →
//! preprocessing → inference → postprocessing → **visualization** → sink): a frame with its
//! detection boxes and class mask, rendered offscreen through Vulkan.
//!
//! ```no_run
//! use isolane_graphics::{BoxOverlay, FrameRef, Overlay, Renderer, RendererConfig};
//! # fn main() -> Result<(), isolane_graphics::GraphicsError> {
//! let mut renderer = Renderer::new(RendererConfig::new(640, 480))?;
//! let rgba = vec![0u8; 640 * 480 * 4];
//! let boxes = [BoxOverlay { x0: 10.0, y0: 20.0, x1: 200.0, y1: 120.0, class: 1, score: 0.9 }];
//! let timing = renderer.render(FrameRef { width: 640, height: 480, rgba: &rgba }, &Overlay { boxes: &boxes, mask: None })?;
//! println!("{} on {}: {:.3} ms", "frame", renderer.device_name(), timing.cpu_ms);
//! renderer.save_png(std::path::Path::new("frame.png"))?;
//! # Ok(()) }
//! ```
//!
//! The Vulkan loader is opened at run time (no Vulkan SDK to build); the shaders are WGSL,
//! translated to SPIR-V by naga at build time. docs/graphics.md says what is drawn and how.

mod config;
mod error;
mod label;
pub mod reference;
mod renderer;
mod scene;
mod select;
mod vulkan;

pub use config::RendererConfig;
pub use error::{says_vulkan_missing, GraphicsError};
pub use renderer::{GpuTiming, RenderTiming, Renderer};
pub use scene::{BoxOverlay, FrameRef, MaskRef, Overlay, Palette};
pub use select::{
    format_gpu_uuid, parse_gpu_uuid, DeviceInfo, DeviceKind, DevicePreference, DEVICE_ENV,
};

/// The device a renderer with `preference` would open, found without opening it: a caller
/// can check its choice before it has a frame to size a renderer by (an app's graphics stage
/// pinned to a GPU's UUID fails at its build rather than at its first frame).
pub fn find_device(preference: &DevicePreference) -> Result<DeviceInfo, GraphicsError> {
    let devices = vulkan::context::devices()?;
    let chosen = select::choose(&devices, preference)?;
    Ok(devices[chosen].clone())
}
