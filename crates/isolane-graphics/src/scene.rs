//! What one call to render draws: the frame, its boxes and its class mask, as plain borrowed
//! data, with the checks every input goes through before it reaches the GPU.

use crate::GraphicsError;

/// One RGBA frame, 8 bits per channel, rows top to bottom, no padding between rows.
#[derive(Debug, Clone, Copy)]
pub struct FrameRef<'a> {
    pub width: u32,
    pub height: u32,
    pub rgba: &'a [u8],
}

/// A detection drawn as a box outline in its class's colour.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BoxOverlay {
    /// Left, top, right, bottom edges in pixels of the frame, (0, 0) its top-left corner. The
    /// outline lies inside these edges; parts outside the frame are clipped.
    pub x0: f32,
    pub y0: f32,
    pub x1: f32,
    pub y1: f32,
    pub class: u8,
    /// Boxes scoring below [`crate::RendererConfig::min_score`] are not drawn.
    pub score: f32,
}

/// A segmentation mask: one class per pixel, rows top to bottom. It is scaled to the frame by
/// nearest neighbour (`mask x = x * mask width / frame width`, the same for y); class 0 is
/// background and leaves the frame as it is.
#[derive(Debug, Clone, Copy)]
pub struct MaskRef<'a> {
    pub width: u32,
    pub height: u32,
    pub classes: &'a [u8],
}

/// What is drawn over a frame.
#[derive(Debug, Clone, Copy, Default)]
pub struct Overlay<'a> {
    pub boxes: &'a [BoxOverlay],
    pub mask: Option<MaskRef<'a>>,
}

/// The colour of each class (RGB). Class 0 is background: masks never paint it, boxes of class
/// 0 are drawn in its colour.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Palette {
    colours: [[u8; 3]; 256],
}

/// Distinct, saturated colours; classes past the list reuse it in order.
const DEFAULT_COLOURS: [[u8; 3]; 12] = [
    [255, 0, 0],
    [0, 255, 0],
    [0, 0, 255],
    [255, 255, 0],
    [0, 255, 255],
    [255, 0, 255],
    [255, 128, 0],
    [128, 0, 255],
    [0, 128, 255],
    [255, 0, 128],
    [128, 255, 0],
    [255, 255, 255],
];

impl Default for Palette {
    fn default() -> Self {
        let mut colours = [[0u8; 3]; 256];
        for (class, colour) in colours.iter_mut().enumerate().skip(1) {
            *colour = DEFAULT_COLOURS[(class - 1) % DEFAULT_COLOURS.len()];
        }
        Self { colours }
    }
}

impl Palette {
    /// The colour of `class`.
    pub fn colour(&self, class: u8) -> [u8; 3] {
        self.colours[usize::from(class)]
    }

    /// Gives `class` the colour `rgb`.
    pub fn set(&mut self, class: u8, rgb: [u8; 3]) {
        self.colours[usize::from(class)] = rgb;
    }
}

/// Checks that the frame has the renderer's size and the bytes its size needs.
pub(crate) fn check_frame(
    frame: &FrameRef<'_>,
    width: u32,
    height: u32,
) -> Result<(), GraphicsError> {
    if (frame.width, frame.height) != (width, height) {
        return Err(GraphicsError::FrameSize {
            got_width: frame.width,
            got_height: frame.height,
            width,
            height,
        });
    }
    check_length("frame", frame.rgba.len(), frame.width, frame.height, 4)
}

/// Checks the mask's size and length and every box's numbers.
pub(crate) fn check_overlay(overlay: &Overlay<'_>) -> Result<(), GraphicsError> {
    if let Some(mask) = &overlay.mask {
        if mask.width == 0 || mask.height == 0 {
            return Err(GraphicsError::EmptyMask {
                width: mask.width,
                height: mask.height,
            });
        }
        check_length("mask", mask.classes.len(), mask.width, mask.height, 1)?;
    }
    for (index, b) in overlay.boxes.iter().enumerate() {
        check_box(b).map_err(|reason| GraphicsError::BadBox { index, reason })?;
    }
    Ok(())
}

fn check_box(b: &BoxOverlay) -> Result<(), String> {
    let numbers = [b.x0, b.y0, b.x1, b.y1, b.score];
    if numbers.iter().any(|v| !v.is_finite()) {
        return Err(format!("a coordinate or the score is not finite: {b:?}"));
    }
    if b.x1 < b.x0 || b.y1 < b.y0 {
        return Err(format!("x1 < x0 or y1 < y0: {b:?}"));
    }
    Ok(())
}

fn check_length(
    what: &'static str,
    got: usize,
    width: u32,
    height: u32,
    bytes_per_pixel: usize,
) -> Result<(), GraphicsError> {
    let expected = (width as usize)
        .checked_mul(height as usize)
        .and_then(|n| n.checked_mul(bytes_per_pixel));
    if expected != Some(got) {
        return Err(GraphicsError::DataLength {
            what,
            got,
            expected: expected.unwrap_or(usize::MAX),
            width,
            height,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn good_box() -> BoxOverlay {
        BoxOverlay {
            x0: 1.0,
            y0: 2.0,
            x1: 3.0,
            y1: 4.0,
            class: 1,
            score: 0.9,
        }
    }

    #[test]
    fn a_frame_of_another_size_or_length_is_refused() {
        let rgba = vec![0u8; 4 * 4 * 4];
        let frame = FrameRef {
            width: 4,
            height: 4,
            rgba: &rgba,
        };
        assert!(check_frame(&frame, 4, 4).is_ok());
        assert!(matches!(
            check_frame(&frame, 8, 4),
            Err(GraphicsError::FrameSize { .. })
        ));
        let short = FrameRef {
            width: 4,
            height: 4,
            rgba: &rgba[1..],
        };
        let err = check_frame(&short, 4, 4).unwrap_err();
        assert_eq!(err.to_string(), "the frame has 63 bytes, 4x4 needs 64");
    }

    #[test]
    fn masks_need_a_size_and_one_byte_per_pixel() {
        let classes = [0u8; 6];
        let ok = Overlay {
            boxes: &[],
            mask: Some(MaskRef {
                width: 3,
                height: 2,
                classes: &classes,
            }),
        };
        assert!(check_overlay(&ok).is_ok());
        let empty = Overlay {
            boxes: &[],
            mask: Some(MaskRef {
                width: 0,
                height: 2,
                classes: &[],
            }),
        };
        assert!(matches!(
            check_overlay(&empty),
            Err(GraphicsError::EmptyMask { .. })
        ));
        let long = Overlay {
            boxes: &[],
            mask: Some(MaskRef {
                width: 2,
                height: 2,
                classes: &classes,
            }),
        };
        assert!(matches!(
            check_overlay(&long),
            Err(GraphicsError::DataLength { what: "mask", .. })
        ));
    }

    #[test]
    fn boxes_with_nan_or_inverted_edges_are_refused_by_index() {
        let nan = BoxOverlay {
            score: f32::NAN,
            ..good_box()
        };
        let inverted = BoxOverlay {
            x0: 5.0,
            ..good_box()
        };
        for bad in [nan, inverted] {
            let boxes = [good_box(), bad];
            let err = check_overlay(&Overlay {
                boxes: &boxes,
                mask: None,
            })
            .unwrap_err();
            assert!(
                matches!(err, GraphicsError::BadBox { index: 1, .. }),
                "{err}"
            );
        }
        // Off the frame is fine: it is clipped.
        let outside = BoxOverlay {
            x0: -50.0,
            x1: 1e6,
            ..good_box()
        };
        assert!(check_overlay(&Overlay {
            boxes: &[outside],
            mask: None
        })
        .is_ok());
    }

    #[test]
    fn the_default_palette_cycles_and_can_be_changed() {
        let mut palette = Palette::default();
        assert_eq!(palette.colour(1), [255, 0, 0]);
        assert_eq!(palette.colour(13), [255, 0, 0]);
        palette.set(7, [1, 2, 3]);
        assert_eq!(palette.colour(7), [1, 2, 3]);
    }
}
