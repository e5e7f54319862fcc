//! Shared by the emulation (CPU) and GPU tests: inputs, the error measure, and the small graphs
//! that exercise one op in every mode.

use isolane_engine::ir::{
    Binary, ConvAttrs, CoordMode, Dim, Graph, NearestMode, Op, PoolAttrs, ReduceKind, ResizeAttrs,
    ResizeMode, ResizeSize, Tensor, Unary,
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

/// A graph of one `Reduce` of an input of `dims` (after the batch), optionally squared
/// before and square-rooted after, as the importer writes ReduceL2.
#[allow(dead_code)] // each test binary uses its part of this module
pub fn reduce_graph(
    kind: ReduceKind,
    dims: &[usize],
    axes: &[i64],
    keepdims: bool,
    l2: bool,
) -> Graph {
    let mut g = Graph::new(format!("reduce_{kind:?}_{axes:?}_keep{keepdims}_l2{l2}"));
    let shape = std::iter::once(Dim::Batch)
        .chain(dims.iter().map(|&d| Dim::Fixed(d)))
        .collect();
    let mut x = g.add_input("x", shape);
    if l2 {
        x = g
            .add_op("square", Op::Binary(Binary::Mul), &[x, x])
            .unwrap();
    }
    let reduce = Op::Reduce {
        kind,
        axes: axes.to_vec(),
        keepdims,
    };
    let mut y = g.add_op("reduce", reduce, &[x]).unwrap();
    if l2 {
        y = g.add_op("sqrt", Op::Unary(Unary::Sqrt), &[y]).unwrap();
    }
    g.add_output(y).unwrap();
    g
}

/// A convolution of `[B, 4, 9, 8]` by `groups` groups (4: depthwise) with ONNX `pads`.
#[allow(dead_code)] // each test binary uses its part of this module
pub fn conv_graph(pads: [usize; 4], strides: [usize; 2], groups: usize) -> Graph {
    let mut g = Graph::new(format!("conv_pads{pads:?}_s{strides:?}_g{groups}"));
    let fixed = |d: &[usize]| d.iter().map(|&d| Dim::Fixed(d)).collect::<Vec<_>>();
    let shape = [vec![Dim::Batch], fixed(&[4, 9, 8])].concat();
    let x = g.add_input("x", shape);
    let cg = 4 / groups;
    let w = Tensor::new(vec![8, cg, 3, 3], random(8 * cg * 9, 5)).unwrap();
    let w = g.add_constant("w", w);
    let b = g.add_constant("b", Tensor::new(vec![8], random(8, 6)).unwrap());
    let a = ConvAttrs {
        strides,
        pads,
        groups,
        ..Default::default()
    };
    let y = g.add_op("conv", Op::Conv(a), &[x, w, b]).unwrap();
    g.add_output(y).unwrap();
    g
}

/// The graphs of issue 12 (ops the cuda backend used to refuse): every Reduce kind over
/// trailing and middle axes with and without keepdims, ReduceL2 as imported, and asymmetric
/// convolution padding (dense, grouped, depthwise).
#[allow(dead_code)] // each test binary uses its part of this module
pub fn issue12_graphs() -> Vec<Graph> {
    let kinds = [
        ReduceKind::Mean,
        ReduceKind::Sum,
        ReduceKind::Max,
        ReduceKind::Min,
        ReduceKind::L1,
        ReduceKind::SumSquare,
        ReduceKind::L2,
    ];
    let sets: [(&[usize], &[i64]); 5] = [
        (&[6, 5], &[-1]),
        (&[6, 5], &[1]),
        (&[3, 4, 5], &[2, 3]),
        (&[3, 4, 5], &[1, 3]),
        (&[3, 4, 5], &[0, 2]),
    ];
    let mut gs = Vec::new();
    for (dims, axes) in sets {
        for keepdims in [true, false] {
            for kind in kinds {
                gs.push(reduce_graph(kind, dims, axes, keepdims, false));
            }
            gs.push(reduce_graph(ReduceKind::Sum, dims, axes, keepdims, true));
        }
    }
    for (pads, strides, groups) in asymmetric_conv_cases() {
        gs.push(conv_graph(pads, strides, groups));
    }
    gs
}

/// `(pads, strides, groups)` of [`conv_graph`] with asymmetric padding.
#[allow(dead_code)] // each test binary uses its part of this module
pub fn asymmetric_conv_cases() -> Vec<([usize; 4], [usize; 2], usize)> {
    vec![
        ([0, 0, 1, 1], [2, 2], 1),
        ([0, 0, 1, 1], [1, 1], 1),
        ([1, 2, 2, 1], [1, 1], 1),
        ([0, 1, 1, 1], [2, 1], 2),
        ([0, 0, 1, 1], [2, 2], 4),
    ]
}

/// A convolution of `[B, c, h, w]` into `m` channels by a `k`×`k` filter of stride `s`,
/// padding `k / 2`, `groups` groups (`c`: depthwise), bias and `act` fused: shapes whose
/// channels fill the 16-byte vector kernels and cuDNN's graph API (session 14).
#[allow(dead_code)] // each test binary uses its part of this module
pub fn vector_conv_graph(
    [c, h, w]: [usize; 3],
    m: usize,
    k: usize,
    s: usize,
    groups: usize,
    act: Option<isolane_engine::ir::Unary>,
) -> Graph {
    let mut g = Graph::new(format!(
        "conv_c{c}_m{m}_{h}x{w}_k{k}_s{s}_g{groups}_{act:?}"
    ));
    let fixed = |d: &[usize]| d.iter().map(|&d| Dim::Fixed(d)).collect::<Vec<_>>();
    let x = g.add_input("x", [vec![Dim::Batch], fixed(&[c, h, w])].concat());
    let cg = c / groups;
    let wt = Tensor::new(vec![m, cg, k, k], random(m * cg * k * k, 11)).unwrap();
    let wt = g.add_constant("w", wt);
    let b = g.add_constant("b", Tensor::new(vec![m], random(m, 12)).unwrap());
    let a = ConvAttrs {
        strides: [s, s],
        pads: [k / 2; 4],
        groups,
        activation: act,
        ..Default::default()
    };
    let y = g.add_op("conv", Op::Conv(a), &[x, wt, b]).unwrap();
    g.add_output(y).unwrap();
    g
}

/// Session 14's kernel shapes: depthwise 3×3, 5×5 and 7×7 at strides 1 and 2 with channels that
/// fill the 16-byte vector kernels; dense (stride 1 and 2), 1×1 and grouped convolutions with
/// ReLU, none or SiLU for cuDNN's graph API with its epilogue fused or not.
#[allow(dead_code)] // each test binary uses its part of this module
pub fn session14_graphs() -> Vec<Graph> {
    let mut graphs = Vec::new();
    for k in [3, 5, 7] {
        for s in [1, 2] {
            graphs.push(vector_conv_graph(
                [32, 15, 17],
                32,
                k,
                s,
                32,
                Some(Unary::Relu),
            ));
        }
    }
    graphs.push(vector_conv_graph(
        [16, 14, 14],
        32,
        3,
        1,
        1,
        Some(Unary::Relu),
    ));
    graphs.push(vector_conv_graph([16, 14, 14], 32, 3, 2, 1, None));
    graphs.push(vector_conv_graph(
        [32, 9, 9],
        64,
        1,
        1,
        1,
        Some(Unary::Silu),
    ));
    graphs.push(vector_conv_graph(
        [16, 14, 14],
        32,
        3,
        1,
        2,
        Some(Unary::Relu),
    ));
    graphs
}

/// A constant maker for a test graph: each call adds `name` of `shape`, seeded random values
/// times `s`, the seed one past the previous call's (the first `seed + 1`).
#[allow(dead_code)] // each test binary uses its part of this module
fn seeded_weights(mut seed: u64) -> impl FnMut(&mut Graph, &str, Vec<usize>, f32) -> usize {
    move |g, name, shape, s| {
        seed += 1;
        let n: usize = shape.iter().product();
        let d = random(n, seed).into_iter().map(|v| v * s).collect();
        g.add_constant(name, Tensor::new(shape, d).unwrap())
    }
}

/// A small CNN for the quantized GEMM path: a 3×3 convolution on 3 channels (K = 27: not on
/// the path), a direct 1×1 (16 → 16), a 3×3 stride-2 convolution through the im2col
/// (K = 144 → 32), a 1×1 whose sum with the block input is fused as a residual, a pool and a
/// Linear (32 → 16): every K and N a multiple of 16, so that fp8 takes the same path.
#[allow(dead_code)] // each test binary uses its part of this module
pub fn quant_cnn() -> Graph {
    let mut g = Graph::new("quant_cnn");
    let x = g.add_input(
        "x",
        vec![Dim::Batch, Dim::Fixed(3), Dim::Fixed(12), Dim::Fixed(12)],
    );
    let mut w = seeded_weights(70);
    let conv = |pads: [usize; 4], strides: [usize; 2]| {
        Op::Conv(ConvAttrs {
            pads,
            strides,
            activation: Some(Unary::Relu),
            ..Default::default()
        })
    };
    let (w1, b1) = (
        w(&mut g, "w1", vec![16, 3, 3, 3], 0.4),
        w(&mut g, "b1", vec![16], 0.1),
    );
    let (w2, b2) = (
        w(&mut g, "w2", vec![16, 16, 1, 1], 0.3),
        w(&mut g, "b2", vec![16], 0.1),
    );
    let (w3, b3) = (
        w(&mut g, "w3", vec![32, 16, 3, 3], 0.15),
        w(&mut g, "b3", vec![32], 0.1),
    );
    let (w4, b4) = (
        w(&mut g, "w4", vec![32, 32, 1, 1], 0.2),
        w(&mut g, "b4", vec![32], 0.1),
    );
    let (wl, bl) = (
        w(&mut g, "wl", vec![16, 32], 0.3),
        w(&mut g, "bl", vec![16], 0.1),
    );
    let h = g.add_op("c1", conv([1; 4], [1, 1]), &[x, w1, b1]).unwrap();
    let h = g.add_op("c2", conv([0; 4], [1, 1]), &[h, w2, b2]).unwrap();
    let h3 = g.add_op("c3", conv([1; 4], [2, 2]), &[h, w3, b3]).unwrap();
    let c4 = Op::Conv(ConvAttrs::default());
    let h = g.add_op("c4", c4, &[h3, w4, b4]).unwrap();
    let h = g.add_op("add", Op::Binary(Binary::Add), &[h, h3]).unwrap();
    let h = g.add_op("relu", Op::Unary(Unary::Relu), &[h]).unwrap();
    let h = g.add_op("pool", Op::GlobalAveragePool, &[h]).unwrap();
    let h = g.add_op("flat", Op::Flatten { axis: 1 }, &[h]).unwrap();
    let lin = Op::Linear { activation: None };
    let y = g.add_op("fc", lin, &[h, wl, bl]).unwrap();
    g.add_output(y).unwrap();
    g
}

/// A small CNN with resnet's entry: a 3×3 convolution on 3 channels (K = 27: not quantized),
/// a 3×3 stride-2 pool (`max`, else an average), then a bottleneck block whose two readers of
/// the pool are quantized GEMMs: `a` (16 → 16, a `first` × `first` kernel: 1 a direct GEMM,
/// 3 an im2col) and the downsample `d` (1×1, 16 → 32), `b` (1×1, 16 → 32) summed with `d`,
/// a ReLU, a global pool and a Linear (32 → 16).
#[allow(dead_code)] // each test binary uses its part of this module
pub fn pooled_quant_cnn(first: usize, max: bool) -> Graph {
    pooled_cnn(first, max, true)
}

/// [`pooled_quant_cnn`] with resnet18's first block instead: no downsample, `b` (1×1,
/// 16 → 16) summed with the pool's output itself, the skip.
#[allow(dead_code)] // each test binary uses its part of this module
pub fn pooled_skip_cnn(first: usize) -> Graph {
    pooled_cnn(first, true, false)
}

#[allow(dead_code)] // each test binary uses its part of this module
fn pooled_cnn(first: usize, max: bool, downsample: bool) -> Graph {
    let mut g = Graph::new("pooled_quant_cnn");
    let x = g.add_input(
        "x",
        vec![Dim::Batch, Dim::Fixed(3), Dim::Fixed(12), Dim::Fixed(12)],
    );
    let mut w = seeded_weights(170);
    let conv = |pad: usize, activation: Option<Unary>| {
        Op::Conv(ConvAttrs {
            pads: [pad; 4],
            activation,
            ..Default::default()
        })
    };
    let (w1, b1) = (
        w(&mut g, "w1", vec![16, 3, 3, 3], 0.4),
        w(&mut g, "b1", vec![16], 0.1),
    );
    let (wa, ba) = (
        w(&mut g, "wa", vec![16, 16, first, first], 0.3 / first as f32),
        w(&mut g, "ba", vec![16], 0.1),
    );
    let downsample_weights = downsample.then(|| {
        (
            w(&mut g, "wd", vec![32, 16, 1, 1], 0.3),
            w(&mut g, "bd", vec![32], 0.1),
        )
    });
    let width = if downsample { 32 } else { 16 };
    let (wb, bb) = (
        w(&mut g, "wb", vec![width, 16, 1, 1], 0.3),
        w(&mut g, "bb", vec![width], 0.1),
    );
    let (wl, bl) = (
        w(&mut g, "wl", vec![16, width], 0.3),
        w(&mut g, "bl", vec![16], 0.1),
    );
    let h = g
        .add_op("c1", conv(1, Some(Unary::Relu)), &[x, w1, b1])
        .unwrap();
    let pa = PoolAttrs {
        kernel: [3, 3],
        strides: [2, 2],
        pads: [1; 4],
        ..Default::default()
    };
    let pool = if max {
        Op::MaxPool(pa)
    } else {
        Op::AveragePool(pa)
    };
    let p = g.add_op("pool", pool, &[h]).unwrap();
    let a = g
        .add_op("a", conv(first / 2, Some(Unary::Relu)), &[p, wa, ba])
        .unwrap();
    let skip = match downsample_weights {
        Some((wd, bd)) => g.add_op("d", conv(0, None), &[p, wd, bd]).unwrap(),
        None => p,
    };
    let b = g.add_op("b", conv(0, None), &[a, wb, bb]).unwrap();
    let h = g
        .add_op("add", Op::Binary(Binary::Add), &[b, skip])
        .unwrap();
    let h = g.add_op("relu", Op::Unary(Unary::Relu), &[h]).unwrap();
    let h = g.add_op("gap", Op::GlobalAveragePool, &[h]).unwrap();
    let h = g.add_op("flat", Op::Flatten { axis: 1 }, &[h]).unwrap();
    let y = g
        .add_op("fc", Op::Linear { activation: None }, &[h, wl, bl])
        .unwrap();
    g.add_output(y).unwrap();
    g
}
