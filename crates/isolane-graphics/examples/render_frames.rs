//! Renders synthetic frames with boxes and a mask, prints the time per frame and saves the last
//! one as a PNG to look at.
//!
//!     cargo run --release -p isolane-graphics --example render_frames -- [WIDTH HEIGHT FRAMES PNG]
//!
//! Defaults: 1280 720 100 frame.png. ISOLANE_VULKAN_DEVICE picks the device (auto, gpu, cpu,
//! an index or part of a name).

use std::path::PathBuf;

use isolane_graphics::{
    BoxOverlay, DevicePreference, FrameRef, MaskRef, Overlay, Renderer, RendererConfig,
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let number = |i: usize, default: u32| -> Result<u32, String> {
        args.get(i).map_or(Ok(default), |a| {
            a.parse()
                .map_err(|_| format!("argument {}: {a:?} is not a number", i + 1))
        })
    };
    let (width, height, frames) = (number(0, 1280)?, number(1, 720)?, number(2, 100)?);
    let png = PathBuf::from(args.get(3).map_or("frame.png", String::as_str));
    let device = DevicePreference::from_env()?.unwrap_or_default();
    let mut renderer = Renderer::new(RendererConfig {
        device,
        ..RendererConfig::new(width, height)
    })?;
    println!("device: {}", renderer.device_name());

    // A diagonal gradient, a mask with a disc of class 2, three boxes.
    let rgba: Vec<u8> = (0..width * height)
        .flat_map(|i| {
            let (x, y) = (i % width, i / width);
            [(x * 255 / width) as u8, (y * 255 / height) as u8, 128, 255]
        })
        .collect();
    let (mw, mh) = (width / 4, height / 4);
    let classes: Vec<u8> = (0..mw * mh)
        .map(|i| {
            let (dx, dy) = (
                (i % mw) as i64 - mw as i64 / 2,
                (i / mw) as i64 - mh as i64 / 2,
            );
            if dx * dx + dy * dy < (mh as i64 / 3).pow(2) {
                2
            } else {
                0
            }
        })
        .collect();
    let (w, h) = (width as f32, height as f32);
    let boxes = [
        BoxOverlay {
            x0: 0.1 * w,
            y0: 0.1 * h,
            x1: 0.4 * w,
            y1: 0.5 * h,
            class: 1,
            score: 0.95,
        },
        BoxOverlay {
            x0: 0.5 * w,
            y0: 0.2 * h,
            x1: 0.9 * w,
            y1: 0.8 * h,
            class: 3,
            score: 0.7,
        },
        BoxOverlay {
            x0: 0.3 * w,
            y0: 0.6 * h,
            x1: 0.6 * w,
            y1: 0.95 * h,
            class: 4,
            score: 0.6,
        },
    ];
    let frame = FrameRef {
        width,
        height,
        rgba: &rgba,
    };
    let overlay = Overlay {
        boxes: &boxes,
        mask: Some(MaskRef {
            width: mw,
            height: mh,
            classes: &classes,
        }),
    };
    for i in 0..frames {
        let t = renderer.render(frame, &overlay)?;
        let gpu = t
            .gpu
            .map_or("n/a".to_string(), |g| format!("{:.3}", g.total_ms));
        println!("frame {i}: cpu {:.3} ms, gpu {gpu} ms", t.cpu_ms);
    }
    renderer.save_png(&png)?;
    println!("saved {}", png.display());
    Ok(())
}
