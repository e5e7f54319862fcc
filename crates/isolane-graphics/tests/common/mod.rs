//! Frames, masks and boxes made up for the tests, and the renderer they draw with.

#![allow(dead_code)] // each test binary uses part of it

use isolane_core::system_packages::{skip_without, VULKAN};
use isolane_graphics::reference::{mask_class_at, render_reference};
use isolane_graphics::{
    BoxOverlay, DevicePreference, FrameRef, MaskRef, Overlay, Renderer, RendererConfig,
};

/// The frame's alpha everywhere: box pixels (alpha 255) stand out from it.
pub const FRAME_ALPHA: u8 = 200;

/// A renderer on the device `ISOLANE_VULKAN_DEVICE` names (automatic choice without it). Without
/// a Vulkan loader or device: `None`, the test skips with the install hint (it fails instead
/// under ISOLANE_STRICT=1, as in CI).
pub fn renderer(config: RendererConfig) -> Option<Renderer> {
    let device = DevicePreference::from_env()
        .expect("ISOLANE_VULKAN_DEVICE")
        .unwrap_or(config.device.clone());
    match Renderer::new(RendererConfig { device, ..config }) {
        Ok(r) => Some(r),
        Err(e) if e.is_vulkan_missing() => {
            skip_without(&VULKAN, &e);
            None
        }
        Err(e) => panic!("{e}"),
    }
}

/// A frame where every pixel differs from its neighbours, so a misplaced texel shows.
pub fn frame_pixels(width: u32, height: u32, seed: u32) -> Vec<u8> {
    let mut rgba = Vec::with_capacity((width * height * 4) as usize);
    for y in 0..height {
        for x in 0..width {
            let r = (x * 7 + y * 3 + seed) % 256;
            let g = (x * 5 + y * 11 + seed * 3) % 256;
            let b = (x * 13 + y * 17 + seed * 7) % 256;
            rgba.extend_from_slice(&[r as u8, g as u8, b as u8, FRAME_ALPHA]);
        }
    }
    rgba
}

/// A mask with two rectangles of class 2 and 3 on background.
pub fn mask_classes(width: u32, height: u32) -> Vec<u8> {
    let mut classes = vec![0u8; (width * height) as usize];
    for y in 0..height {
        for x in 0..width {
            let class = if x < width / 2 && y < height / 2 {
                2
            } else if x >= width * 3 / 4 && y >= height / 2 {
                3
            } else {
                0
            };
            classes[(y * width + x) as usize] = class;
        }
    }
    classes
}

/// `count` boxes spread over a `width` x `height` frame, integer edges, classes 1.. in turn.
pub fn spread_boxes(width: u32, height: u32, count: usize) -> Vec<BoxOverlay> {
    (0..count)
        .map(|i| {
            let x0 = ((i * 37) % (width as usize * 3 / 4)) as f32;
            let y0 = ((i * 23) % (height as usize * 3 / 4)) as f32;
            BoxOverlay {
                x0,
                y0,
                x1: x0 + (width / 5) as f32,
                y1: y0 + (height / 6) as f32,
                class: 1 + (i % 11) as u8,
                score: 0.9,
            }
        })
        .collect()
}

/// Checks the rendered image against the CPU reference: exactly where the frame or a box shows,
/// within 1 where the mask is blended (the device may round the blend's last bit differently).
/// Returns how many pixels were blended.
pub fn assert_matches_reference(
    config: &RendererConfig,
    frame: &FrameRef<'_>,
    overlay: &Overlay<'_>,
    got: &[u8],
) -> usize {
    let expected =
        render_reference(config, frame, overlay).expect("the reference takes the same input");
    assert_eq!(got.len(), expected.len());
    let mut blended = 0;
    for y in 0..config.height {
        for x in 0..config.width {
            let at = ((y * config.width + x) * 4) as usize;
            let (g, e) = (&got[at..at + 4], &expected[at..at + 4]);
            let masked = overlay
                .mask
                .as_ref()
                .is_some_and(|m| mask_class_at(m, config.width, config.height, x, y) != 0);
            let boxed = e[3] == 255;
            if masked && !boxed {
                blended += 1;
                let close = g.iter().zip(e).all(|(a, b)| a.abs_diff(*b) <= 1);
                assert!(
                    close,
                    "blended pixel ({x}, {y}): got {g:?}, expected {e:?} within 1"
                );
            } else {
                assert_eq!(
                    g, e,
                    "pixel ({x}, {y}) (box: {boxed}): got {g:?}, expected {e:?} exactly"
                );
            }
        }
    }
    blended
}

pub fn mask(width: u32, height: u32, classes: &[u8]) -> MaskRef<'_> {
    MaskRef {
        width,
        height,
        classes,
    }
}
