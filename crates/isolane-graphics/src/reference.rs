//! The CPU reference of what [`crate::Renderer::render`] draws, pixel for pixel: the oracle the
//! Vulkan output is tested against. Frame and box pixels must match it exactly; a blended mask
//! pixel within 1 (the device may round the blend's last bit differently).

use crate::label;
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
    let visible = || overlay.boxes.iter().filter(|b| b.score >= config.min_score);
    for b in visible() {
        draw_outline(config, b, &mut image);
    }
    if config.label_scale > 0 {
        for b in visible() {
            draw_label(config, b, &mut image);
        }
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

/// The box's label over everything: each set cell of each glyph a `label_scale`-pixel square.
fn draw_label(config: &RendererConfig, b: &BoxOverlay, image: &mut [u8]) {
    let scale = config.label_scale;
    let [r, g, bl] = config.palette.colour(b.class);
    let (glyphs, count) = label::glyphs(b);
    let (x0, y0) = label::origin(b, scale, config.line_width);
    for (i, &glyph) in glyphs[..count].iter().enumerate() {
        let left = i64::from(x0) + i64::from(i as u32 * label::ADVANCE * scale);
        let cells = (0..label::GLYPH_H).flat_map(|cy| (0..label::GLYPH_W).map(move |cx| (cx, cy)));
        for (cx, cy) in cells.filter(|&(cx, cy)| label::cell_set(glyph, cx, cy)) {
            let (px0, py0) = (
                left + i64::from(cx * scale),
                i64::from(y0) + i64::from(cy * scale),
            );
            for y in clip(py0, scale, config.height) {
                for x in clip(px0, scale, config.width) {
                    let at = ((y * config.width + x) * 4) as usize;
                    image[at..at + 4].copy_from_slice(&[r, g, bl, 255]);
                }
            }
        }
    }
}

/// `start..start + len` clipped to 0..size.
fn clip(start: i64, len: u32, size: u32) -> std::ops::Range<u32> {
    let lo = start.clamp(0, i64::from(size));
    let hi = (start + i64::from(len)).clamp(0, i64::from(size));
    lo as u32..hi.max(lo) as u32
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
            label_scale: 0,
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
    fn a_label_by_hand() {
        // Box class 1 at (2, 20): label "1:0.50" above it at (2, 20 - 7 - 1 = 12), scale 1.
        let frame_rgba = vec![0u8; 40 * 30 * 4];
        let frame = FrameRef {
            width: 40,
            height: 30,
            rgba: &frame_rgba,
        };
        let boxes = [BoxOverlay {
            x0: 2.0,
            y0: 20.0,
            x1: 30.0,
            y1: 28.0,
            class: 1,
            score: 0.5,
        }];
        let config = RendererConfig {
            label_scale: 1,
            ..RendererConfig::new(40, 30)
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
        let lit = |x: u32, y: u32| image[((y * 40 + x) * 4) as usize] == 255;
        // The "1": its stem is cell column 2, rows 0-6 -> pixels x 4, y 12..19.
        assert!((12..19).all(|y| lit(4, y)));
        assert!(!lit(2, 12) && !lit(4, 11) && !lit(4, 19));
        // The ":" (second glyph, x 8..13): cells (1..3, 1..3) and (1..3, 4..6).
        assert!(lit(9, 13) && lit(10, 14) && !lit(9, 15) && lit(9, 16) && !lit(8, 13));
        // Then "0", and the "." (fourth glyph, x 20..25): cells rows 5-6, columns 1-2.
        assert!(lit(21, 17) && lit(22, 18) && !lit(21, 16) && !lit(20, 17));
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
