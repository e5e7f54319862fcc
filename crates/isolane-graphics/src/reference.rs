//! The CPU reference of what [`crate::Renderer::render`] draws, pixel for pixel: the oracle the
//! Vulkan output is tested against. Frame and box pixels must match it exactly; a blended mask
//! pixel within 1 (the device may round the blend's last bit differently).

use crate::scene::{check_frame, check_overlay};
use crate::{BoxOverlay, FrameRef, GraphicsError, MaskRef, Overlay, RendererConfig};

/// The RGBA image the renderer draws for this frame and overlay.
pub fn render_reference(
    config: &RendererConfig,
    frame: &FrameRef<'_>,
    overlay: &Overlay<'_>,
) -> Result<Vec<u8>, GraphicsError> {
    check_frame(frame, config.width, config.height)?;
    check_overlay(overlay)?;
    let mut image = frame.rgba.to_vec();
    if let Some(mask) = &overlay.mask {
        blend_mask(config, mask, &mut image);
    }
    for b in overlay.boxes.iter().filter(|b| b.score >= config.min_score) {
        draw_outline(config, b, &mut image);
    }
    Ok(image)
}

/// The mask's class at frame pixel (x, y): nearest neighbour, in integers as the shader does.
pub fn mask_class_at(
    mask: &MaskRef<'_>,
    frame_width: u32,
    frame_height: u32,
    x: u32,
    y: u32,
) -> u8 {
    let mx = (u64::from(x) * u64::from(mask.width) / u64::from(frame_width))
        .min(u64::from(mask.width) - 1);
    let my = (u64::from(y) * u64::from(mask.height) / u64::from(frame_height))
        .min(u64::from(mask.height) - 1);
    mask.classes[(my * u64::from(mask.width) + mx) as usize]
}

fn blend_mask(config: &RendererConfig, mask: &MaskRef<'_>, image: &mut [u8]) {
    let a = config.mask_alpha;
    for y in 0..config.height {
        for x in 0..config.width {
            let class = mask_class_at(mask, config.width, config.height, x, y);
            if class == 0 {
                continue;
            }
            let colour = config.palette.colour(class);
            let at = ((y * config.width + x) * 4) as usize;
            for (channel, c) in image[at..at + 3].iter_mut().zip(colour) {
                let mixed = f32::from(*channel) / 255.0 * (1.0 - a) + f32::from(c) / 255.0 * a;
                *channel = (mixed * 255.0).round() as u8;
            }
        }
    }
}

fn draw_outline(config: &RendererConfig, b: &BoxOverlay, image: &mut [u8]) {
    let [r, g, bl] = config.palette.colour(b.class);
    let w = config.line_width.min(0.5 * (b.x1 - b.x0).min(b.y1 - b.y0));
    let edges = [
        (b.x0, b.y0, b.x1, b.y0 + w),
        (b.x0, b.y1 - w, b.x1, b.y1),
        (b.x0, b.y0, b.x0 + w, b.y1),
        (b.x1 - w, b.y0, b.x1, b.y1),
    ];
    for (x0, y0, x1, y1) in edges {
        // A pixel is covered when its centre is inside [x0, x1) x [y0, y1).
        for y in covered(y0, y1, config.height) {
            for x in covered(x0, x1, config.width) {
                let at = ((y * config.width + x) * 4) as usize;
                image[at..at + 4].copy_from_slice(&[r, g, bl, 255]);
            }
        }
    }
}

/// The pixels whose centres lie in [lo, hi), clipped to 0..size.
fn covered(lo: f32, hi: f32, size: u32) -> std::ops::Range<u32> {
    let first = (lo - 0.5).ceil().clamp(0.0, size as f32) as u32;
    let end = (hi - 0.5).ceil().clamp(0.0, size as f32) as u32;
    first..end.max(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn covered_takes_pixels_whose_centres_are_inside() {
        assert_eq!(covered(2.0, 4.0, 10), 2..4);
        assert_eq!(covered(2.5, 4.5, 10), 2..4);
        assert_eq!(covered(2.6, 4.4, 10), 3..4);
        assert_eq!(covered(-3.0, 2.0, 10), 0..2);
        assert_eq!(covered(8.0, 30.0, 10), 8..10);
        assert_eq!(covered(5.0, 5.0, 10), 5..5);
    }

    #[test]
    fn a_box_and_a_mask_over_a_small_frame_by_hand() {
        // 8x4 grey frame; a 4x2 mask whose top-left cell is class 2 (green), i.e. frame pixels
        // x 0..2, y 0..2; a 1-pixel red (class 1) outline around x 4..8, y 0..4.
        let frame_rgba = [100u8, 100, 100, 7].repeat(32);
        let frame = FrameRef {
            width: 8,
            height: 4,
            rgba: &frame_rgba,
        };
        let classes = [2u8, 0, 0, 0, 0, 0, 0, 0];
        let mask = MaskRef {
            width: 4,
            height: 2,
            classes: &classes,
        };
        let boxes = [BoxOverlay {
            x0: 4.0,
            y0: 0.0,
            x1: 8.0,
            y1: 4.0,
            class: 1,
            score: 1.0,
        }];
        let config = RendererConfig {
            line_width: 1.0,
            ..RendererConfig::new(8, 4)
        };
        let image = render_reference(
            &config,
            &frame,
            &Overlay {
                boxes: &boxes,
                mask: Some(mask),
            },
        )
        .unwrap();
        let px = |x: usize, y: usize| &image[(y * 8 + x) * 4..(y * 8 + x) * 4 + 4];
        // At half weight red and blue mix 100 with 0 (50), green 100 with 255 (177.5 -> 178);
        // alpha stays the frame's.
        assert_eq!(px(0, 0), [50, 178, 50, 7]);
        assert_eq!(px(1, 1), [50, 178, 50, 7]);
        assert_eq!(px(2, 0), [100, 100, 100, 7]);
        assert_eq!(px(4, 2), [255, 0, 0, 255]);
        assert_eq!(px(7, 3), [255, 0, 0, 255]);
        assert_eq!(px(5, 1), [100, 100, 100, 7]);
    }

    #[test]
    fn boxes_below_the_minimum_score_are_not_drawn() {
        let frame_rgba = vec![9u8; 4 * 4 * 4];
        let frame = FrameRef {
            width: 4,
            height: 4,
            rgba: &frame_rgba,
        };
        let boxes = [BoxOverlay {
            x0: 0.0,
            y0: 0.0,
            x1: 4.0,
            y1: 4.0,
            class: 3,
            score: 0.2,
        }];
        let config = RendererConfig {
            min_score: 0.5,
            ..RendererConfig::new(4, 4)
        };
        let image = render_reference(
            &config,
            &frame,
            &Overlay {
                boxes: &boxes,
                mask: None,
            },
        )
        .unwrap();
        assert_eq!(image, frame_rgba);
    }
}
