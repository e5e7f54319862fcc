//! The renderer on a hardware GPU at 1920x1080: the same pixels as the CPU reference, and the
//! time per frame. `#[ignore]`d: run with `--ignored` where a GPU and its Vulkan driver are.
//! ISOLANE_VULKAN_DEVICE picks another device than the first hardware GPU; ISOLANE_GRAPHICS_FRAMES
//! sets the number of timed frames (default 300); with OUT set, the per-frame times go to
//! $OUT/graphics-frames.csv and the first frame to $OUT/graphics-1080p.png.

mod common;

use std::path::PathBuf;

use common::{assert_matches_reference, frame_pixels, mask, mask_classes, renderer, spread_boxes};
use isolane_graphics::{DeviceKind, DevicePreference, FrameRef, Overlay, RendererConfig};

const W: u32 = 1920;
const H: u32 = 1080;
const WARM_UP: usize = 20;

#[test]
#[ignore = "needs a GPU with a Vulkan driver"]
fn renders_1080p_frames_on_the_gpu_and_times_them() {
    let config = RendererConfig {
        device: DevicePreference::Gpu,
        ..RendererConfig::new(W, H)
    };
    let mut r = renderer(config).expect("a GPU test never passes by finding no GPU");
    let device = r.device().clone();
    assert_ne!(
        device.kind,
        DeviceKind::Cpu,
        "{} is a software renderer, not a GPU",
        device.name
    );
    println!(
        "device: {} ({:?}, vendor {:#06x})",
        device.name, device.kind, device.vendor_id
    );

    // A model-sized mask (half resolution, upscaled), 20 detections.
    let rgba = frame_pixels(W, H, 3);
    let classes = mask_classes(W / 2, H / 2);
    let boxes = spread_boxes(W, H, 20);
    let frame = FrameRef {
        width: W,
        height: H,
        rgba: &rgba,
    };
    let overlay = Overlay {
        boxes: &boxes,
        mask: Some(mask(W / 2, H / 2, &classes)),
    };
    r.render(frame, &overlay).unwrap();
    let first = r.read_back().unwrap();
    let blended = assert_matches_reference(r.config(), &frame, &overlay, &first);
    println!("pixels: match the CPU reference ({blended} blended within 1, the rest exact)");
    let out = std::env::var_os("OUT").map(PathBuf::from);
    if let Some(dir) = &out {
        r.save_png(&dir.join("graphics-1080p.png")).unwrap();
    }

    for _ in 0..WARM_UP {
        r.render(frame, &overlay).unwrap();
    }
    let frames: usize = std::env::var("ISOLANE_GRAPHICS_FRAMES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let timings: Vec<_> = (0..frames)
        .map(|_| r.render(frame, &overlay).unwrap())
        .collect();
    let mut read_back_ms = Vec::new();
    let mut rgba_out = Vec::new();
    for _ in 0..20 {
        let start = std::time::Instant::now();
        r.read_back_into(&mut rgba_out).unwrap();
        read_back_ms.push(start.elapsed().as_secs_f64() * 1e3);
    }

    let column = |f: &dyn Fn(&isolane_graphics::RenderTiming) -> Option<f64>| -> Vec<f64> {
        timings.iter().filter_map(f).collect()
    };
    println!(
        "{frames} frames of {W}x{H}, 20 boxes, a {}x{} mask (ms):",
        W / 2,
        H / 2
    );
    report("cpu (whole call)", column(&|t| Some(t.cpu_ms)));
    report("cpu staging copies", column(&|t| Some(t.cpu_upload_ms)));
    report("gpu total", column(&|t| t.gpu.map(|g| g.total_ms)));
    report("gpu upload", column(&|t| t.gpu.map(|g| g.upload_ms)));
    report("gpu draw", column(&|t| t.gpu.map(|g| g.draw_ms)));
    report("read_back (20 calls)", read_back_ms);
    if let Some(dir) = &out {
        let mut csv =
            String::from("frame,cpu_ms,cpu_upload_ms,gpu_total_ms,gpu_upload_ms,gpu_draw_ms\n");
        for (i, t) in timings.iter().enumerate() {
            let g = |f: fn(&isolane_graphics::GpuTiming) -> f64| {
                t.gpu
                    .as_ref()
                    .map_or(String::new(), |g| format!("{:.4}", f(g)))
            };
            csv += &format!(
                "{i},{:.4},{:.4},{},{},{}\n",
                t.cpu_ms,
                t.cpu_upload_ms,
                g(|g| g.total_ms),
                g(|g| g.upload_ms),
                g(|g| g.draw_ms)
            );
        }
        std::fs::write(dir.join("graphics-frames.csv"), csv).unwrap();
    }
}

fn report(what: &str, mut values: Vec<f64>) {
    if values.is_empty() {
        println!("  {what:<22} (no timestamps on this queue)");
        return;
    }
    values.sort_by(f64::total_cmp);
    let at = |q: f64| values[((values.len() - 1) as f64 * q).round() as usize];
    println!(
        "  {what:<22} p50 {:>8.3}  p99 {:>8.3}  max {:>8.3}",
        at(0.5),
        at(0.99),
        at(1.0)
    );
}
