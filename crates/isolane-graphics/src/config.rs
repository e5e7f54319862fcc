//! The renderer's settings.

use crate::{DevicePreference, GraphicsError, Palette};

/// How a [`crate::Renderer`] is made. `RendererConfig::new(w, h)` gives the defaults; change
/// fields with struct update syntax.
#[derive(Debug, Clone, PartialEq)]
pub struct RendererConfig {
    /// The frames' size, which is also the size of the rendered image.
    pub width: u32,
    pub height: u32,
    /// Which Vulkan device renders.
    pub device: DevicePreference,
    /// Weight of the class colour where the mask is not background: 0 leaves the frame, 1
    /// paints the colour.
    pub mask_alpha: f32,
    /// Width of the box outlines in pixels.
    pub line_width: f32,
    /// Boxes scoring below this are not drawn.
    pub min_score: f32,
    /// Size in pixels of one cell of the 5x7 font of the box labels (`<class>:<score>`);
    /// 0 draws no labels.
    pub label_scale: u32,
    pub palette: Palette,
}

impl RendererConfig {
    /// The defaults for `width` x `height` frames: the automatic device choice, a mask at half
    /// weight, 2-pixel outlines, every box drawn with a label of 2-pixel cells, the default
    /// palette.
    pub fn new(width: u32, height: u32) -> Self {
        Self {
            width,
            height,
            device: DevicePreference::Auto,
            mask_alpha: 0.5,
            line_width: 2.0,
            min_score: 0.0,
            label_scale: 2,
            palette: Palette::default(),
        }
    }

    /// Checks the values that need no device; `max_side` is the device's largest 2D image side.
    pub(crate) fn check(&self, max_side: u32) -> Result<(), GraphicsError> {
        let bad = |what: String| Err(GraphicsError::Config(what));
        if self.width == 0 || self.height == 0 {
            return bad(format!(
                "the size is {}x{}; both sides must be at least 1",
                self.width, self.height
            ));
        }
        if self.width > max_side || self.height > max_side {
            return bad(format!(
                "the size is {}x{}; this device renders at most {max_side} pixels a side",
                self.width, self.height
            ));
        }
        if !(0.0..=1.0).contains(&self.mask_alpha) {
            return bad(format!(
                "mask_alpha is {}; it must be between 0 and 1",
                self.mask_alpha
            ));
        }
        if !(self.line_width.is_finite() && self.line_width > 0.0) {
            return bad(format!(
                "line_width is {}; it must be a positive number of pixels",
                self.line_width
            ));
        }
        if self.label_scale > 64 {
            return bad(format!(
                "label_scale is {}; at most 64 pixels a cell",
                self.label_scale
            ));
        }
        if self.min_score.is_nan() {
            return bad("min_score is NaN".to_string());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_pass_and_each_bad_value_is_named() {
        assert!(RendererConfig::new(64, 32).check(4096).is_ok());
        let cases = [
            (RendererConfig::new(0, 32), "at least 1"),
            (RendererConfig::new(8192, 32), "at most 4096"),
            (
                RendererConfig {
                    mask_alpha: 1.5,
                    ..RendererConfig::new(8, 8)
                },
                "mask_alpha",
            ),
            (
                RendererConfig {
                    line_width: 0.0,
                    ..RendererConfig::new(8, 8)
                },
                "line_width",
            ),
            (
                RendererConfig {
                    min_score: f32::NAN,
                    ..RendererConfig::new(8, 8)
                },
                "min_score",
            ),
        ];
        for (config, words) in cases {
            let text = config.check(4096).unwrap_err().to_string();
            assert!(text.contains(words), "{text}");
        }
    }
}
