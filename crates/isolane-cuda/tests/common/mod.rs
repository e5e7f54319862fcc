//! Shared by the emulation (CPU) and GPU tests: inputs, the error measure, and the small graphs
//! that exercise one op in every mode.

use isolane_engine::ir::{
    ConvAttrs, CoordMode, Dim, Graph, NearestMode, Op, ResizeAttrs, ResizeMode, ResizeSize, Tensor,
};

/// A file of tests/data: beside the sources when the test runs where it was built, else from
/// the repository root (the GPU machine runs staged test binaries there, by
/// scripts/gpu-test.sh, where the build's absolute paths do not exist).
#[allow(dead_code)] // each test binary uses its part of this module
pub fn data_file(name: &str) -> std::path::PathBuf {
    let built = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name);
    if built.exists() {
        built
    } else {
        std::path::Path::new("crates/isolane-cuda/tests/data").join(name)
    }
}

/// Deterministic values in [-1, 1) (xorshift).
pub fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// ‖a − b‖ / ‖b‖; infinite if `a` has a NaN or an infinity.
pub fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    let (mut num, mut den) = (0f64, 0f64);
    for (x, y) in a.iter().zip(b) {
        let d = *x as f64 - *y as f64;
        num += d * d;
        den += (*y as f64) * (*y as f64);
    }
    if a.iter().any(|v| !v.is_finite()) {
        return f64::INFINITY;
    }
    (num / den.max(1e-30)).sqrt()
}

/// Every Resize mode the engine has: nearest with each rounding and bilinear, under each
/// coordinate transformation, each up by 2 (yolov8n's nearest), up to a given size (fcn's
/// bilinear) and down.
#[allow(dead_code)] // each test binary uses its part of this module
pub fn resize_cases() -> Vec<ResizeAttrs> {
    use CoordMode::*;
    use NearestMode::*;
    let mut modes = Vec::new();
    for coord in [HalfPixel, PytorchHalfPixel, AlignCorners, Asymmetric] {
        for nearest in [RoundPreferFloor, RoundPreferCeil, Floor, Ceil] {
            modes.push((ResizeMode::Nearest, coord, nearest));
        }
        modes.push((ResizeMode::Linear, coord, Floor));
    }
    let mut cases = Vec::new();
    for (mode, coord, nearest) in modes {
        for size in [
            ResizeSize::Scales([2.0, 2.0]),
            ResizeSize::Size([11, 16]),
            ResizeSize::Scales([0.6, 0.5]),
        ] {
            cases.push(ResizeAttrs {
                mode,
                coord,
                nearest,
                size,
            });
        }
    }
    cases
}

/// conv 3×3 (so that the Resize reads a channels-last tensor when planned so) → Resize →
/// conv 1×1, on a 5×7 image.
#[allow(dead_code)]
pub fn resize_graph(r: ResizeAttrs) -> Graph {
    let mut g = Graph::new("resize");
    let x = g.add_input(
        "x",
        vec![Dim::Batch, Dim::Fixed(3), Dim::Fixed(5), Dim::Fixed(7)],
    );
    let w1 = g.add_constant(
        "w1",
        Tensor::new(vec![6, 3, 3, 3], random(162, 31)).unwrap(),
    );
    let w2 = g.add_constant("w2", Tensor::new(vec![4, 6, 1, 1], random(24, 32)).unwrap());
    let conv = |pad| {
        Op::Conv(ConvAttrs {
            pads: [pad; 4],
            ..Default::default()
        })
    };
    let a = g.add_op("conv1", conv(1), &[x, w1]).unwrap();
    let b = g.add_op("resize", Op::Resize(r), &[a]).unwrap();
    let y = g.add_op("conv2", conv(0), &[b, w2]).unwrap();
    g.add_output(y).unwrap();
    g
}
