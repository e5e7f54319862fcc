//! After the first frame, rendering allocates nothing on the Rust heap (a counting global
//! allocator; the driver's own allocations are its business). Alone in its test binary so that
//! no other test's allocations are counted. Needs Vulkan (lavapipe in CI), like tests/render.rs.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use common::{frame_pixels, mask, mask_classes, renderer, spread_boxes};
use isolane_graphics::{FrameRef, Overlay, RendererConfig};

struct Counting;
static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller keeps GlobalAlloc's contract, which we pass on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn frames_after_the_first_allocate_nothing() {
    let (w, h) = (64, 48);
    let Some(mut r) = renderer(RendererConfig::new(w, h)) else {
        return;
    };
    let rgba = frame_pixels(w, h, 0);
    let classes = mask_classes(w / 2, h / 2);
    let boxes = spread_boxes(w, h, 10);
    let frame = FrameRef {
        width: w,
        height: h,
        rgba: &rgba,
    };
    let overlay = Overlay {
        boxes: &boxes,
        mask: Some(mask(w / 2, h / 2, &classes)),
    };
    let mut image = Vec::new();
    r.render(frame, &overlay).unwrap();
    r.read_back_into(&mut image).unwrap();

    let before = ALLOCATIONS.load(Ordering::Relaxed);
    for _ in 0..20 {
        r.render(frame, &overlay).unwrap();
        r.render(frame, &Overlay::default()).unwrap();
        r.read_back_into(&mut image).unwrap();
    }
    let allocations = ALLOCATIONS.load(Ordering::Relaxed) - before;
    assert_eq!(allocations, 0, "60 calls allocated {allocations} times");
}
