//! The renderer on a real Vulkan device (in CI Mesa's lavapipe, on the CPU): read-back pixels
//! against the CPU reference. Without Vulkan they skip with the install hint (they fail under ISOLANE_STRICT=1, as in CI).

mod common;

use common::{
    assert_matches_reference, frame_pixels, mask, mask_classes, renderer, spread_boxes, FRAME_ALPHA,
};
use isolane_graphics::{BoxOverlay, FrameRef, GraphicsError, Overlay, Palette, RendererConfig};

const W: u32 = 64;
const H: u32 = 48;

fn config() -> RendererConfig {
    RendererConfig {
        min_score: 0.5,
        ..RendererConfig::new(W, H)
    }
}

#[test]
fn box_edges_mask_blend_and_untouched_pixels_are_where_they_belong() {
    let Some(mut r) = renderer(config()) else {
        return;
    };
    let rgba = frame_pixels(W, H, 0);
    let frame = FrameRef {
        width: W,
        height: H,
        rgba: &rgba,
    };
    // Half-resolution mask: class 2 over frame x 0..32, y 0..24; class 3 over x 48..64, y 24..48.
    let classes = mask_classes(W / 2, H / 2);
    let boxes = [
        BoxOverlay {
            x0: 10.0,
            y0: 30.0,
            x1: 40.0,
            y1: 44.0,
            class: 1,
            score: 0.9,
        },
        // Half off the frame: clipped.
        BoxOverlay {
            x0: 50.0,
            y0: -5.0,
            x1: 80.0,
            y1: 10.0,
            class: 4,
            score: 0.8,
        },
        // Below min_score: not drawn.
        BoxOverlay {
            x0: 2.0,
            y0: 2.0,
            x1: 20.0,
            y1: 20.0,
            class: 5,
            score: 0.1,
        },
    ];
    let overlay = Overlay {
        boxes: &boxes,
        mask: Some(mask(W / 2, H / 2, &classes)),
    };
    let timing = r.render(frame, &overlay).unwrap();
    let got = r.read_back().unwrap();
    let px = |x: u32, y: u32| got[((y * W + x) * 4) as usize..][..4].to_vec();
    let frame_px = |x: u32, y: u32| rgba[((y * W + x) * 4) as usize..][..4].to_vec();
    let palette = Palette::default();
    let opaque = |[r, g, b]: [u8; 3]| vec![r, g, b, 255];

    // Box 0's outline (2 px) in class 1's colour, its inside and outside the frame's pixels.
    assert_eq!(px(10, 35), opaque(palette.colour(1)), "left edge");
    assert_eq!(
        px(11, 35),
        opaque(palette.colour(1)),
        "left edge, second pixel"
    );
    assert_eq!(px(39, 43), opaque(palette.colour(1)), "bottom-right corner");
    assert_eq!(px(12, 35), frame_px(12, 35), "just inside the outline");
    assert_eq!(px(9, 35), frame_px(9, 35), "just outside the box");
    assert_eq!(px(40, 35), frame_px(40, 35), "right of the right edge");
    // The clipped box: its left edge and bottom band show inside the frame.
    assert_eq!(px(50, 0), opaque(palette.colour(4)));
    assert_eq!(px(60, 9), opaque(palette.colour(4)));
    assert_eq!(px(60, 10), frame_px(60, 10));
    // The low-scoring box is absent (under the class-2 mask there: blended, not class 5).
    assert_ne!(px(2, 10), opaque(palette.colour(5)));
    // Mask: class 2 (green) blended at half weight over frame x 0..32, y 0..24.
    let (f, c) = (frame_px(5, 5), palette.colour(2));
    for ch in 0..3 {
        let expected = (f32::from(f[ch]) + f32::from(c[ch])) / 2.0;
        assert!(
            (f32::from(px(5, 5)[ch]) - expected).abs() <= 1.0,
            "mask blend, channel {ch}: {:?}",
            px(5, 5)
        );
    }
    assert_eq!(
        px(5, 5)[3],
        FRAME_ALPHA,
        "the blend keeps the frame's alpha"
    );
    assert_eq!(px(32, 5), frame_px(32, 5), "right of the class-2 region");

    let blended = assert_matches_reference(r.config(), &frame, &overlay, &got);
    assert!(blended > 500, "{blended} blended pixels");
    assert!(timing.cpu_ms > 0.0 && timing.cpu_upload_ms <= timing.cpu_ms);
    if let Some(gpu) = timing.gpu {
        assert!(
            gpu.total_ms >= gpu.draw_ms && gpu.total_ms >= gpu.upload_ms,
            "{gpu:?}"
        );
    }
}

#[test]
fn later_frames_reuse_the_renderer_and_leave_nothing_behind() {
    let Some(mut r) = renderer(config()) else {
        return;
    };
    let (a, b) = (frame_pixels(W, H, 1), frame_pixels(W, H, 99));
    let classes = mask_classes(W, H);
    let boxes = spread_boxes(W, H, 5);
    let first = Overlay {
        boxes: &boxes,
        mask: Some(mask(W, H, &classes)),
    };
    r.render(
        FrameRef {
            width: W,
            height: H,
            rgba: &a,
        },
        &first,
    )
    .unwrap();
    // No mask, no boxes: exactly the new frame.
    r.render(
        FrameRef {
            width: W,
            height: H,
            rgba: &b,
        },
        &Overlay::default(),
    )
    .unwrap();
    assert_eq!(r.read_back().unwrap(), b);
    // More boxes than the first buffer holds (it grows), and a mask of another size.
    let many = spread_boxes(W, H, 150);
    let small = mask_classes(7, 5);
    let frame = FrameRef {
        width: W,
        height: H,
        rgba: &a,
    };
    let overlay = Overlay {
        boxes: &many,
        mask: Some(mask(7, 5, &small)),
    };
    r.render(frame, &overlay).unwrap();
    let got = r.read_back().unwrap();
    assert_matches_reference(r.config(), &frame, &overlay, &got);
}

#[test]
fn fractional_edges_cover_the_pixels_whose_centres_are_inside() {
    let rgba = frame_pixels(W, H, 2);
    // Edges 0.2 px or more from every pixel centre: far beyond a rasterizer's sub-pixel
    // precision, so the coverage rule decides alone. Line width 2.6 as well.
    let boxes = [
        BoxOverlay {
            x0: 10.3,
            y0: 5.8,
            x1: 30.7,
            y1: 20.2,
            class: 1,
            score: 0.9,
        },
        BoxOverlay {
            x0: 40.1,
            y0: 25.4,
            x1: 45.9,
            y1: 46.6,
            class: 6,
            score: 0.9,
        },
    ];
    // No labels: they would cover pixels checked by hand below.
    let config = RendererConfig {
        line_width: 2.6,
        label_scale: 0,
        ..config()
    };
    let Some(mut r) = renderer(config.clone()) else {
        return;
    };
    let frame = FrameRef {
        width: W,
        height: H,
        rgba: &rgba,
    };
    let overlay = Overlay {
        boxes: &boxes,
        mask: None,
    };
    r.render(frame, &overlay).unwrap();
    let got = r.read_back().unwrap();
    assert_matches_reference(&config, &frame, &overlay, &got);
    // Box 0's left band covers x 10.3..12.9: pixels 10 (centre 10.5), 11 and 12 (12.5), not 13.
    let px = |x: u32, y: u32| got[((y * W + x) * 4) as usize..][..4].to_vec();
    let red = vec![255, 0, 0, 255];
    assert_eq!((px(10, 12), px(12, 12)), (red.clone(), red));
    assert_eq!(
        px(13, 12),
        rgba[((12 * W + 13) * 4) as usize..][..4].to_vec()
    );
}

#[test]
fn labels_are_drawn_above_boxes_or_inside_them_and_clipped() {
    let rgba = frame_pixels(W, H, 4);
    let boxes = [
        // Room above: "1:0.50" at (4, 30 - 7 - 1 = 22), cells of 1 pixel.
        BoxOverlay {
            x0: 4.0,
            y0: 30.0,
            x1: 40.0,
            y1: 46.0,
            class: 1,
            score: 0.5,
        },
        // At the top: inside, below the 2-pixel edge; three class digits, the score clamped to
        // 9.99, running off the right of the frame.
        BoxOverlay {
            x0: 20.0,
            y0: 1.0,
            x1: 63.0,
            y1: 20.0,
            class: 255,
            score: 42.0,
        },
    ];
    let config = RendererConfig {
        label_scale: 1,
        ..config()
    };
    let Some(mut r) = renderer(config.clone()) else {
        return;
    };
    let frame = FrameRef {
        width: W,
        height: H,
        rgba: &rgba,
    };
    let overlay = Overlay {
        boxes: &boxes,
        mask: None,
    };
    r.render(frame, &overlay).unwrap();
    let got = r.read_back().unwrap();
    assert_matches_reference(&config, &frame, &overlay, &got);
    let px = |x: u32, y: u32| got[((y * W + x) * 4) as usize..][..4].to_vec();
    let red = vec![255, 0, 0, 255];
    // The "1"'s stem: cell column 2, rows 0-6 of the first glyph.
    assert!((22..29).all(|y| px(6, y) == red), "the 1's stem");
    assert_ne!(px(6, 21), red);
    assert_ne!(px(5, 22), red, "left of the stem, top row");
}

#[test]
fn huge_boxes_and_line_widths_are_clipped_not_a_panic() {
    let rgba = frame_pixels(W, H, 6);
    let boxes = [
        BoxOverlay {
            x0: -3e38,
            y0: -3e38,
            x1: 3e38,
            y1: 3e38,
            class: 2,
            score: 1.0,
        },
        BoxOverlay {
            x0: 1e9,
            y0: 5.0,
            x1: 2e9,
            y1: 9.0,
            class: 3,
            score: 1.0,
        },
    ];
    let config = RendererConfig {
        line_width: 1e30,
        ..config()
    };
    let Some(mut r) = renderer(config.clone()) else {
        return;
    };
    let frame = FrameRef {
        width: W,
        height: H,
        rgba: &rgba,
    };
    let overlay = Overlay {
        boxes: &boxes,
        mask: None,
    };
    r.render(frame, &overlay).unwrap();
    let got = r.read_back().unwrap();
    assert_matches_reference(&config, &frame, &overlay, &got);
}

#[test]
fn save_png_writes_what_read_back_returns() {
    let Some(mut r) = renderer(config()) else {
        return;
    };
    let rgba = frame_pixels(W, H, 5);
    let boxes = spread_boxes(W, H, 3);
    r.render(
        FrameRef {
            width: W,
            height: H,
            rgba: &rgba,
        },
        &Overlay {
            boxes: &boxes,
            mask: None,
        },
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("frame.png");
    r.save_png(&path).unwrap();
    let decoded = image::open(&path).unwrap().into_rgba8();
    assert_eq!(decoded.dimensions(), (W, H));
    assert_eq!(decoded.into_raw(), r.read_back().unwrap());
}

#[test]
fn bad_input_is_a_typed_error_and_the_renderer_goes_on() {
    let Some(mut r) = renderer(config()) else {
        return;
    };
    assert!(matches!(r.read_back(), Err(GraphicsError::NothingRendered)));
    let small = frame_pixels(8, 8, 0);
    let wrong_size = r.render(
        FrameRef {
            width: 8,
            height: 8,
            rgba: &small,
        },
        &Overlay::default(),
    );
    assert!(
        matches!(wrong_size, Err(GraphicsError::FrameSize { .. })),
        "{wrong_size:?}"
    );
    let rgba = frame_pixels(W, H, 0);
    let frame = FrameRef {
        width: W,
        height: H,
        rgba: &rgba,
    };
    let nan = [BoxOverlay {
        x0: f32::NAN,
        y0: 0.0,
        x1: 1.0,
        y1: 1.0,
        class: 1,
        score: 1.0,
    }];
    assert!(matches!(
        r.render(
            frame,
            &Overlay {
                boxes: &nan,
                mask: None
            }
        ),
        Err(GraphicsError::BadBox { index: 0, .. })
    ));
    let short = [0u8; 3];
    let bad_mask = Overlay {
        boxes: &[],
        mask: Some(mask(2, 2, &short)),
    };
    assert!(matches!(
        r.render(frame, &bad_mask),
        Err(GraphicsError::DataLength { what: "mask", .. })
    ));
    // A mask wider than the device's images: refused, and the renderer goes on.
    let wide = vec![1u8; 100_000];
    let too_wide = Overlay {
        boxes: &[],
        mask: Some(mask(100_000, 1, &wide)),
    };
    assert!(matches!(
        r.render(frame, &too_wide),
        Err(GraphicsError::Config(_))
    ));
    r.render(frame, &Overlay::default()).unwrap();
    assert_eq!(r.read_back().unwrap(), rgba);
    let classes = mask_classes(W, H);
    let masked = Overlay {
        boxes: &[],
        mask: Some(mask(W, H, &classes)),
    };
    r.render(frame, &masked).unwrap();
    let got = r.read_back().unwrap();
    assert_matches_reference(r.config(), &frame, &masked, &got);
}

#[test]
fn a_size_beyond_the_device_is_refused_with_its_limit() {
    let Some(_) = renderer(config()) else { return };
    let huge = RendererConfig::new(1 << 20, 8);
    match isolane_graphics::Renderer::new(huge) {
        Err(GraphicsError::Config(text)) => assert!(text.contains("at most"), "{text}"),
        other => panic!(
            "expected a Config error, got {:?}",
            other.map(|r| r.device_name().to_string())
        ),
    }
}

#[test]
fn the_device_is_named_and_a_missing_one_is_refused() {
    let Some(r) = renderer(config()) else { return };
    assert!(!r.device_name().is_empty());
    let missing = RendererConfig {
        device: "no such device".parse().unwrap(),
        ..config()
    };
    match isolane_graphics::Renderer::new(missing) {
        Err(GraphicsError::NoMatchingDevice { available, .. }) => {
            assert!(available.contains(r.device_name()))
        }
        other => panic!(
            "expected NoMatchingDevice, got {:?}",
            other.map(|r| r.device_name().to_string())
        ),
    }
}

/// The device's Vulkan 1.1 `deviceUUID` is read (lavapipe has one too), and a renderer asked
/// for that UUID opens that same device: the path an app's graphics stage on CUDA GPU N takes
/// with GPU N's UUID.
#[test]
fn a_renderer_asked_for_a_devices_uuid_opens_that_device() {
    let Some(first) = common::renderer(config()) else {
        return;
    };
    let info = first.device().clone();
    let uuid = info
        .uuid
        .unwrap_or_else(|| panic!("{} (Vulkan 1.1) gave no deviceUUID", info.name));
    drop(first);
    let text = isolane_graphics::format_gpu_uuid(&uuid);
    let by_uuid = isolane_graphics::Renderer::new(RendererConfig {
        device: text.parse().unwrap(),
        ..config()
    })
    .unwrap_or_else(|e| panic!("{text}: {e}"));
    assert_eq!(by_uuid.device(), &info);
    // Found without opening it, as an app's graphics stage checks at its build.
    let pref = isolane_graphics::DevicePreference::Uuid(uuid);
    assert_eq!(isolane_graphics::find_device(&pref).unwrap(), info);
    let missing = isolane_graphics::DevicePreference::Uuid(uuid.map(|b| !b));
    assert!(matches!(
        isolane_graphics::find_device(&missing),
        Err(GraphicsError::NoMatchingDevice { .. })
    ));
    // A UUID no device has is refused, the devices listed with theirs.
    let other = uuid.map(|b| !b);
    let err = isolane_graphics::Renderer::new(RendererConfig {
        device: isolane_graphics::DevicePreference::Uuid(other),
        ..config()
    })
    .err()
    .expect("no device has the inverted UUID")
    .to_string();
    assert!(err.contains(&text), "{err}");
}
