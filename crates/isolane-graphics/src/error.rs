//! The crate's typed errors.

use std::path::PathBuf;

use ash::vk;

/// Everything that can go wrong while setting up or using a [`crate::Renderer`].
#[derive(Debug, thiserror::Error)]
pub enum GraphicsError {
    /// libvulkan could not be opened: no Vulkan loader is installed.
    #[error(
        "no Vulkan loader could be loaded ({0}); install one with a driver, e.g. \
         `apt install libvulkan1 mesa-vulkan-drivers` (Mesa's lavapipe renders on the CPU) \
         or the GPU vendor's driver with its Vulkan ICD"
    )]
    LoaderMissing(String),
    /// The loader is there but no driver offers a device that can draw.
    #[error(
        "no Vulkan device with a graphics queue was found; install a driver, e.g. \
         `apt install mesa-vulkan-drivers` (lavapipe, on the CPU) or the GPU vendor's Vulkan ICD"
    )]
    NoDevice,
    /// The device preference matched none of the devices present.
    #[error("no Vulkan device matches {wanted}; devices found: {available}")]
    NoMatchingDevice { wanted: String, available: String },
    /// A device preference string that does not parse.
    #[error("invalid Vulkan device preference {0:?}: expected auto, gpu, cpu, an index, a GPU UUID (GPU-...) or part of a device name")]
    BadDevicePreference(String),
    /// A Vulkan call returned an error.
    #[error("Vulkan call {call} failed: {result}")]
    Vulkan {
        call: &'static str,
        result: vk::Result,
    },
    /// The SPIR-V built into the crate is not whole words (a broken build).
    #[error("the built-in SPIR-V could not be read: {0}")]
    Shader(std::io::Error),
    /// No memory type of the device suits a buffer or image.
    #[error("the Vulkan device has no memory type suitable for {0}")]
    NoMemoryType(&'static str),
    /// A configuration value out of range.
    #[error("invalid renderer configuration: {0}")]
    Config(String),
    /// The frame's size differs from the renderer's.
    #[error("the frame is {got_width}x{got_height}, the renderer renders {width}x{height}")]
    FrameSize {
        got_width: u32,
        got_height: u32,
        width: u32,
        height: u32,
    },
    /// A frame or mask whose byte count does not match its size.
    #[error("the {what} has {got} bytes, {width}x{height} needs {expected}")]
    DataLength {
        what: &'static str,
        got: usize,
        expected: usize,
        width: u32,
        height: u32,
    },
    /// A mask with a zero side.
    #[error("the mask is {width}x{height}; both sides must be at least 1")]
    EmptyMask { width: u32, height: u32 },
    /// A box with a non-finite coordinate or score, or with x1 < x0 or y1 < y0.
    #[error("box {index} is invalid: {reason}")]
    BadBox { index: usize, reason: String },
    /// `read_back`/`save_png` before anything was rendered.
    #[error("nothing has been rendered yet")]
    NothingRendered,
    /// Writing a PNG failed.
    #[error("writing {path}: {source}")]
    Png {
        path: PathBuf,
        source: image::ImageError,
    },
}

/// The start of [`GraphicsError::LoaderMissing`]'s and [`GraphicsError::NoDevice`]'s texts.
const VULKAN_MISSING_TEXTS: [&str; 2] = [
    "no Vulkan loader could be loaded",
    "no Vulkan device with a graphics queue was found",
];

impl GraphicsError {
    /// Whether the machine lacks Vulkan (no loader, or no driver with a device that draws), as
    /// opposed to Vulkan failing: the one case where a test that renders skips.
    pub fn is_vulkan_missing(&self) -> bool {
        matches!(
            self,
            GraphicsError::LoaderMissing(_) | GraphicsError::NoDevice
        )
    }
}

/// [`GraphicsError::is_vulkan_missing`] for an error that reached the caller as text (an app
/// stage's error, a command's stderr).
pub fn says_vulkan_missing(text: &str) -> bool {
    VULKAN_MISSING_TEXTS.iter().any(|t| text.contains(t))
}

/// Names the failed Vulkan call in the error.
pub(crate) trait VkContext<T> {
    fn call(self, call: &'static str) -> Result<T, GraphicsError>;
}

impl<T> VkContext<T> for Result<T, vk::Result> {
    fn call(self, call: &'static str) -> Result<T, GraphicsError> {
        self.map_err(|result| GraphicsError::Vulkan { call, result })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_vulkan_is_told_from_its_text() {
        for e in [
            GraphicsError::LoaderMissing("libvulkan.so.1".into()),
            GraphicsError::NoDevice,
        ] {
            assert!(e.is_vulkan_missing());
            assert!(
                says_vulkan_missing(&format!("app `a`: stage `draw`: {e}")),
                "{e}"
            );
        }
        let other = GraphicsError::NothingRendered;
        assert!(!other.is_vulkan_missing());
        assert!(!says_vulkan_missing(&other.to_string()));
    }
}
