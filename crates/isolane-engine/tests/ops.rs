//! Each CPU kernel against a naive reference implementation on random data.
#![allow(
    clippy::type_complexity,
    clippy::needless_range_loop,
    clippy::identity_op
)]

use isolane_engine::cpu::CpuBackend;
use isolane_engine::ir::*;
use isolane_engine::reference::interpret;
use isolane_engine::weights::{synthesize, Init};
use isolane_engine::{Backend, Precision};

fn rnd(name: &str, shape: &[usize]) -> Tensor {
    synthesize(42, name, shape, Init::Normal(1.0))
}

/// Runs `op` on `inputs` (graph inputs where `is_const` is false, constants otherwise),
/// compiled through the passes with 1 and 3 threads, and through the interpreter; checks that
/// all agree and returns the compiled outputs.
fn run(op: Op, inputs: &[Tensor], is_const: &[bool]) -> Vec<Tensor> {
    let mut g = Graph::new("t");
    let mut ids = Vec::new();
    let mut feeds = Vec::new();
    for (i, (t, &c)) in inputs.iter().zip(is_const).enumerate() {
        if c {
            ids.push(g.add_constant(format!("c{i}"), t.clone()));
        } else {
            ids.push(g.add_input(
                format!("x{i}"),
                t.shape.iter().map(|&d| Dim::Fixed(d)).collect(),
            ));
            feeds.push(t.clone());
        }
    }
    let outs = g.add_node("op", op, &ids).unwrap();
    for o in outs {
        g.add_output(o).unwrap();
    }
    let reference = interpret(&g, 1, &feeds).unwrap();
    let mut result = Vec::new();
    for threads in [1, 3] {
        let mut m = CpuBackend::new(threads)
            .compile(&g, 1, Precision::Fp32)
            .unwrap();
        for (i, f) in feeds.iter().enumerate() {
            m.input_mut_at(i).copy_from_slice(&f.data);
        }
        m.run().unwrap();
        result = (0..m.num_outputs())
            .map(|i| Tensor::new(m.output_shape_at(i).to_vec(), m.output_at(i).to_vec()).unwrap())
            .collect::<Vec<_>>();
        for (a, b) in result.iter().zip(&reference) {
            assert_eq!(a.shape, b.shape);
            assert_close(&a.data, &b.data, 1e-5, "compiled vs interpreted");
        }
    }
    result
}

fn assert_close(a: &[f32], b: &[f32], tol: f32, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    // Elementwise, relative to the element and to the tensor's RMS (sums of many terms can
    // cancel to values much smaller than their rounding error).
    let rms = (b.iter().map(|v| (v * v) as f64).sum::<f64>() / b.len().max(1) as f64).sqrt() as f32;
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        let d = (x - y).abs();
        assert!(
            d <= tol * (1.0 + y.abs() + rms),
            "{what}: element {i}: {x} vs {y}"
        );
    }
}

fn idx4(s: &[usize], a: usize, b: usize, c: usize, d: usize) -> usize {
    ((a * s[1] + b) * s[2] + c) * s[3] + d
}

fn naive_conv(x: &Tensor, w: &Tensor, b: Option<&Tensor>, a: &ConvAttrs) -> Tensor {
    let (n, c, h, wd) = (x.shape[0], x.shape[1], x.shape[2], x.shape[3]);
    let (m, cg, kh, kw) = (w.shape[0], w.shape[1], w.shape[2], w.shape[3]);
    let g = c / cg;
    let mg = m / g;
    let oh = (h + a.pads[0] + a.pads[2] - a.dilations[0] * (kh - 1) - 1) / a.strides[0] + 1;
    let ow = (wd + a.pads[1] + a.pads[3] - a.dilations[1] * (kw - 1) - 1) / a.strides[1] + 1;
    let os = [n, m, oh, ow];
    let mut out = Tensor::zeros(os.to_vec());
    for ni in 0..n {
        for oc in 0..m {
            let gi = oc / mg;
            for oy in 0..oh {
                for ox in 0..ow {
                    let mut s = b.map_or(0.0, |b| b.data[oc] as f64);
                    for ci in 0..cg {
                        for ky in 0..kh {
                            for kx in 0..kw {
                                let iy = (oy * a.strides[0] + ky * a.dilations[0]) as isize
                                    - a.pads[0] as isize;
                                let ix = (ox * a.strides[1] + kx * a.dilations[1]) as isize
                                    - a.pads[1] as isize;
                                if iy < 0 || ix < 0 || iy >= h as isize || ix >= wd as isize {
                                    continue;
                                }
                                s += x.data
                                    [idx4(&x.shape, ni, gi * cg + ci, iy as usize, ix as usize)]
                                    as f64
                                    * w.data[idx4(&w.shape, oc, ci, ky, kx)] as f64;
                            }
                        }
                    }
                    out.data[idx4(&os, ni, oc, oy, ox)] = s as f32;
                }
            }
        }
    }
    out
}

#[test]
fn conv_variants() {
    // (n, c, h, w, m, k, stride, pad [t,l,b,r], dilation, groups)
    let cases: &[(
        usize,
        usize,
        usize,
        usize,
        usize,
        usize,
        usize,
        [usize; 4],
        usize,
        usize,
    )] = &[
        (1, 3, 9, 11, 4, 3, 1, [1, 1, 1, 1], 1, 1),
        (2, 4, 10, 10, 6, 3, 2, [1, 0, 2, 1], 1, 2),
        (1, 8, 12, 12, 8, 3, 1, [2, 2, 2, 2], 2, 1),
        (2, 6, 9, 9, 6, 3, 1, [1, 1, 1, 1], 1, 6), // depthwise
        (1, 6, 9, 9, 12, 5, 2, [2, 2, 2, 2], 1, 6), // depthwise, multiplier 2
        (1, 6, 11, 11, 6, 3, 2, [1, 1, 1, 1], 3, 6), // depthwise, dilated, strided
        (2, 16, 7, 7, 32, 1, 1, [0, 0, 0, 0], 1, 1), // pointwise
        (1, 16, 7, 9, 8, 1, 2, [0, 0, 0, 0], 1, 1), // strided 1x1
        (1, 3, 40, 40, 16, 7, 2, [3, 3, 3, 3], 1, 1), // stem-like, tiled path
        (1, 64, 20, 20, 64, 3, 1, [1, 1, 1, 1], 1, 1), // tiled path, many tiles
        (1, 4, 16, 16, 8, 4, 4, [0, 0, 0, 0], 1, 1), // patchify
        (2, 16, 9, 7, 24, 3, 1, [0, 1, 2, 1], 1, 1), // Winograd, odd output, asymmetric pads
        (1, 4, 9, 9, 4, 3, 1, [4, 4, 4, 4], 4, 1), // dilated, kernel wider than input
        (1, 32, 30, 30, 16, 3, 1, [2, 2, 2, 2], 2, 1), // dilated, tiled
        (2, 8, 15, 13, 16, 3, 2, [1, 0, 2, 1], 1, 1), // implicit GEMM, strided, asymmetric pads
        (1, 32, 7, 7, 96, 3, 1, [1, 1, 1, 1], 1, 1), // implicit GEMM, channels split among threads
        (1, 5, 23, 21, 8, 5, 3, [2, 1, 0, 2], 1, 1), // implicit GEMM, stride 3, 5x5
    ];
    for (ci, &(n, c, h, w, m, k, s, pads, d, g)) in cases.iter().enumerate() {
        let x = rnd(&format!("x{ci}"), &[n, c, h, w]);
        let wt = rnd(&format!("w{ci}"), &[m, c / g, k, k]);
        let b = rnd(&format!("b{ci}"), &[m]);
        let a = ConvAttrs {
            strides: [s, s],
            pads,
            dilations: [d, d],
            groups: g,
            ..Default::default()
        };
        let want = naive_conv(&x, &wt, Some(&b), &a);
        let got = run(
            Op::Conv(a.clone()),
            &[x.clone(), wt.clone(), b.clone()],
            &[false, true, true],
        );
        assert_eq!(got[0].shape, want.shape, "case {ci}");
        assert_close(&got[0].data, &want.data, 1e-4, &format!("conv case {ci}"));
        // Weight as a runtime input too (no constant folding of the weight path).
        let got = run(Op::Conv(a.clone()), &[x, wt, b], &[false, false, false]);
        assert_close(
            &got[0].data,
            &want.data,
            1e-4,
            &format!("conv case {ci} (runtime weights)"),
        );
    }
}

#[test]
fn conv_fused_epilogues_match_unfused() {
    // conv -> BN -> add(residual) -> relu, and conv -> sigmoid*x (SiLU); the passes fold and
    // fuse these; compiled results must equal the unoptimised interpreter (checked in `run`'s
    // sibling below through a whole graph).
    let mut g = Graph::new("fuse");
    let x = g.add_input(
        "x",
        vec![Dim::Batch, Dim::Fixed(16), Dim::Fixed(10), Dim::Fixed(10)],
    );
    let w = g.add_constant("w", rnd("w", &[16, 16, 3, 3]));
    let c = g
        .add_op(
            "conv",
            Op::Conv(ConvAttrs {
                pads: [1; 4],
                ..Default::default()
            }),
            &[x, w],
        )
        .unwrap();
    let mut bn: Vec<ValueId> = ["g", "b", "m"]
        .iter()
        .map(|n| g.add_constant(*n, rnd(n, &[16])))
        .collect();
    bn.push(g.add_constant("v", Tensor::new(vec![16], vec![1.5; 16]).unwrap()));
    let y = g
        .add_op(
            "bn",
            Op::BatchNorm { eps: 1e-5 },
            &[c, bn[0], bn[1], bn[2], bn[3]],
        )
        .unwrap();
    let y = g.add_op("add", Op::Binary(Binary::Add), &[y, x]).unwrap();
    let y = g.add_op("relu", Op::Unary(Unary::Relu), &[y]).unwrap();
    let w2 = g.add_constant("w2", rnd("w2", &[8, 16, 1, 1]));
    let z = g
        .add_op("conv2", Op::Conv(ConvAttrs::default()), &[y, w2])
        .unwrap();
    let s = g.add_op("sig", Op::Unary(Unary::Sigmoid), &[z]).unwrap();
    let z = g.add_op("mul", Op::Binary(Binary::Mul), &[z, s]).unwrap();
    g.add_output(z).unwrap();
    let opt = isolane_engine::passes::optimize(&g, 2).unwrap();
    let ops: Vec<&str> = opt.nodes.iter().map(|n| n.op.name()).collect();
    assert_eq!(
        ops,
        ["Conv", "Conv"],
        "BN, add, relu and SiLU fused into the convs: {ops:?}"
    );
    match &opt.nodes[0].op {
        Op::Conv(a) => assert!(a.residual && a.activation == Some(Unary::Relu)),
        _ => unreachable!(),
    }
    let xin = rnd("xin", &[2, 16, 10, 10]);
    let want = interpret(&g, 2, std::slice::from_ref(&xin)).unwrap();
    let mut m = CpuBackend::new(2).compile(&g, 2, Precision::Fp32).unwrap();
    m.input_mut().copy_from_slice(&xin.data);
    m.run().unwrap();
    assert_close(m.output(), &want[0].data, 1e-5, "fused vs unfused");
}

#[test]
fn pooling() {
    let x = rnd("x", &[2, 3, 11, 13]);
    for (k, s, p, ceil, cip) in [
        (3, 2, 1, false, false),
        (3, 2, 0, true, false),
        (2, 2, 0, false, false),
        (3, 1, 1, false, true),
        (3, 2, 1, true, true),
    ] {
        let attrs = PoolAttrs {
            kernel: [k, k],
            strides: [s, s],
            pads: [p; 4],
            ceil_mode: ceil,
            count_include_pad: cip,
            ..Default::default()
        };
        let mx = run(
            Op::MaxPool(attrs.clone()),
            std::slice::from_ref(&x),
            &[false],
        );
        let av = run(
            Op::AveragePool(attrs.clone()),
            std::slice::from_ref(&x),
            &[false],
        );
        let (oh, ow) = (mx[0].shape[2], mx[0].shape[3]);
        let out_len = |i: usize| {
            let o = if ceil {
                (i + 2 * p - k).div_ceil(s) + 1
            } else {
                (i + 2 * p - k) / s + 1
            };
            if ceil && (o - 1) * s >= i + p {
                o - 1
            } else {
                o
            }
        };
        assert_eq!((oh, ow), (out_len(11), out_len(13)));
        for nc in 0..6 {
            for oy in 0..oh {
                for ox in 0..ow {
                    let (mut m, mut sum, mut cnt) = (f32::NEG_INFINITY, 0.0, 0);
                    let (y0, x0) = (
                        (oy * s) as isize - p as isize,
                        (ox * s) as isize - p as isize,
                    );
                    for ky in 0..k as isize {
                        for kx in 0..k as isize {
                            let (iy, ix) = (y0 + ky, x0 + kx);
                            if iy >= 0 && ix >= 0 && iy < 11 && ix < 13 {
                                let v = x.data[nc * 143 + iy as usize * 13 + ix as usize];
                                m = m.max(v);
                                sum += v;
                                cnt += 1;
                            }
                        }
                    }
                    let div = if cip {
                        let ye = (y0 + k as isize).min(11 + p as isize);
                        let xe = (x0 + k as isize).min(13 + p as isize);
                        ((ye - y0) * (xe - x0)) as f32
                    } else {
                        cnt as f32
                    };
                    let o = nc * oh * ow + oy * ow + ox;
                    assert_eq!(mx[0].data[o], m);
                    assert!(
                        (av[0].data[o] - sum / div).abs() < 1e-5,
                        "avg k{k} s{s} p{p} ceil {ceil} cip {cip}"
                    );
                }
            }
        }
    }
    let g = run(Op::GlobalAveragePool, std::slice::from_ref(&x), &[false]);
    assert_eq!(g[0].shape, [2, 3, 1, 1]);
    let mean0: f32 = x.data[..143].iter().sum::<f32>() / 143.0;
    assert!((g[0].data[0] - mean0).abs() < 1e-5);
    let a = run(
        Op::AdaptiveAvgPool { output: [4, 5] },
        std::slice::from_ref(&x),
        &[false],
    );
    for oy in 0..4usize {
        for ox in 0..5usize {
            let (y0, y1) = (oy * 11 / 4, ((oy + 1) * 11).div_ceil(4));
            let (x0, x1) = (ox * 13 / 5, ((ox + 1) * 13).div_ceil(5));
            let mut s = 0.0;
            for y in y0..y1 {
                for xx in x0..x1 {
                    s += x.data[y * 13 + xx];
                }
            }
            let want = s / ((y1 - y0) * (x1 - x0)) as f32;
            assert!((a[0].data[oy * 5 + ox] - want).abs() < 1e-5);
        }
    }
}

fn naive_matmul(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    let mut o = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            o[i * n + j] = (0..k)
                .map(|t| a[i * k + t] as f64 * b[t * n + j] as f64)
                .sum::<f64>() as f32;
        }
    }
    o
}

#[test]
fn matmul_broadcasting() {
    // [2,1,3,4] x [3,4,5] -> [2,3,3,5]
    let a = rnd("a", &[2, 1, 3, 4]);
    let b = rnd("b", &[3, 4, 5]);
    for consts in [[false, false], [false, true]] {
        let got = run(Op::MatMul, &[a.clone(), b.clone()], &consts);
        assert_eq!(got[0].shape, [2, 3, 3, 5]);
        for i in 0..2 {
            for j in 0..3 {
                let want = naive_matmul(
                    &a.data[i * 12..i * 12 + 12],
                    &b.data[j * 20..j * 20 + 20],
                    3,
                    4,
                    5,
                );
                let o = (i * 3 + j) * 15;
                assert_close(&got[0].data[o..o + 15], &want, 1e-5, "batched matmul");
            }
        }
    }
    // 2-D x constant 2-D becomes Linear through the passes.
    let a = rnd("a2", &[7, 9]);
    let b = rnd("b2", &[9, 4]);
    let got = run(Op::MatMul, &[a.clone(), b.clone()], &[false, true]);
    assert_close(
        &got[0].data,
        &naive_matmul(&a.data, &b.data, 7, 9, 4),
        1e-5,
        "matmul->linear",
    );
    // 1-D promotion.
    let v = rnd("v", &[9]);
    let got = run(Op::MatMul, &[v.clone(), b.clone()], &[false, false]);
    assert_eq!(got[0].shape, [4]);
    assert_close(
        &got[0].data,
        &naive_matmul(&v.data, &b.data, 1, 9, 4),
        1e-5,
        "vector matmul",
    );
}

#[test]
fn gemm_and_linear() {
    let a = rnd("a", &[5, 6]);
    let bt = rnd("bt", &[4, 6]); // transposed B
    let c = rnd("c", &[4]);
    let mut b = vec![0.0; 24];
    for i in 0..4 {
        for j in 0..6 {
            b[j * 4 + i] = bt.data[i * 6 + j];
        }
    }
    let mut want = naive_matmul(&a.data, &b, 5, 6, 4);
    for (i, v) in want.iter_mut().enumerate() {
        *v = 0.5 * *v + 2.0 * c.data[i % 4];
    }
    let op = Op::Gemm {
        alpha: 0.5,
        beta: 2.0,
        trans_a: false,
        trans_b: true,
    };
    for consts in [[false, false, false], [false, true, true]] {
        let got = run(op.clone(), &[a.clone(), bt.clone(), c.clone()], &consts);
        assert_close(&got[0].data, &want, 1e-5, "gemm");
    }
    let got = run(
        Op::Linear {
            activation: Some(Unary::Relu),
        },
        &[a.clone(), bt.clone(), c.clone()],
        &[false, true, true],
    );
    let lin: Vec<f32> = naive_matmul(&a.data, &b, 5, 6, 4)
        .iter()
        .enumerate()
        .map(|(i, v)| (v + c.data[i % 4]).max(0.0))
        .collect();
    assert_close(&got[0].data, &lin, 1e-5, "linear+relu");
}

/// Shapes that span several row panels, 48-column blocks and depth blocks, and that the
/// threads split: Linear with constant (packed at compile time) and runtime weights, one and
/// two rows (row × matrix path), Gemm with transposed operands, a batched MatMul with more
/// matrices than threads and one with fewer.
#[test]
fn large_matrix_products() {
    let (k, n) = (300, 130);
    let w = rnd("lw", &[n, k]);
    let bias = rnd("lb", &[n]);
    for rows in [1, 2, 37] {
        let x = rnd(&format!("lx{rows}"), &[rows, k]);
        let mut want = vec![0.0f32; rows * n];
        for r in 0..rows {
            for j in 0..n {
                let mut acc = bias.data[j] as f64;
                for kk in 0..k {
                    acc += x.data[r * k + kk] as f64 * w.data[j * k + kk] as f64;
                }
                want[r * n + j] = (acc as f32).max(0.0);
            }
        }
        let op = Op::Linear {
            activation: Some(Unary::Relu),
        };
        for consts in [[false, true, true], [false, false, false]] {
            let got = run(op.clone(), &[x.clone(), w.clone(), bias.clone()], &consts);
            assert_close(&got[0].data, &want, 1e-4, &format!("linear {rows} rows"));
        }
    }
    // Gemm, both operands transposed: A is stored k×m, B is stored n×k.
    let (m, k, n) = (29, 140, 100);
    let at = rnd("gat", &[k, m]);
    let bt = rnd("gbt", &[n, k]);
    let c = rnd("gc", &[m, n]);
    let mut want = vec![0.0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut acc = 0.0f64;
            for kk in 0..k {
                acc += at.data[kk * m + i] as f64 * bt.data[j * k + kk] as f64;
            }
            want[i * n + j] = 0.75 * acc as f32 - 1.5 * c.data[i * n + j];
        }
    }
    let op = Op::Gemm {
        alpha: 0.75,
        beta: -1.5,
        trans_a: true,
        trans_b: true,
    };
    let got = run(op, &[at, bt, c], &[false, false, false]);
    assert_close(&got[0].data, &want, 1e-4, "gemm transposed");
    for (batch, m, k, n) in [(8, 33, 70, 50), (2, 40, 150, 97)] {
        let a = rnd(&format!("ma{batch}"), &[batch, m, k]);
        let b = rnd(&format!("mb{batch}"), &[batch, k, n]);
        let got = run(Op::MatMul, &[a.clone(), b.clone()], &[false, false]);
        for i in 0..batch {
            let want = naive_matmul(
                &a.data[i * m * k..(i + 1) * m * k],
                &b.data[i * k * n..(i + 1) * k * n],
                m,
                k,
                n,
            );
            let o = i * m * n;
            assert_close(
                &got[0].data[o..o + m * n],
                &want,
                1e-4,
                &format!("batched matmul {batch}x{m}x{k}x{n}"),
            );
        }
    }
}

#[test]
fn normalisation_and_softmax() {
    let x = rnd("x", &[3, 4, 5]);
    let g = rnd("g", &[5]);
    let b = rnd("b", &[5]);
    let got = run(
        Op::LayerNorm {
            axis: -1,
            eps: 1e-6,
        },
        &[x.clone(), g.clone(), b.clone()],
        &[false, true, true],
    );
    for r in 0..12 {
        let row = &x.data[r * 5..r * 5 + 5];
        let mean = row.iter().map(|&v| v as f64).sum::<f64>() / 5.0;
        let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / 5.0;
        for i in 0..5 {
            let want =
                ((row[i] as f64 - mean) / (var + 1e-6).sqrt()) as f32 * g.data[i] + b.data[i];
            assert!((got[0].data[r * 5 + i] - want).abs() < 1e-5);
        }
    }
    // LayerNorm over the last two dims.
    let g2 = rnd("g2", &[4, 5]);
    let got = run(
        Op::LayerNorm { axis: 1, eps: 1e-5 },
        &[x.clone(), g2.clone()],
        &[false, true],
    );
    let blk = &x.data[20..40];
    let mean = blk.iter().sum::<f32>() / 20.0;
    let var = blk.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / 20.0;
    assert!(
        (got[0].data[20 + 7] - (blk[7] - mean) / (var + 1e-5).sqrt() * g2.data[7]).abs() < 1e-5
    );
    for axis in [-1i64, 1, 0] {
        let got = run(Op::Softmax { axis }, std::slice::from_ref(&x), &[false]);
        let a = norm_axis(axis, 3).unwrap();
        let st = [20, 5, 1];
        for base in 0..60 {
            let idx = [base / 20, base / 5 % 4, base % 5];
            if idx[a] != 0 {
                continue;
            }
            let vals: Vec<f32> = (0..x.shape[a]).map(|j| x.data[base + j * st[a]]).collect();
            let m = vals.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let s: f32 = vals.iter().map(|v| (v - m).exp()).sum();
            for j in 0..vals.len() {
                let want = (vals[j] - m).exp() / s;
                assert!(
                    (got[0].data[base + j * st[a]] - want).abs() < 1e-6,
                    "softmax axis {axis}"
                );
            }
        }
    }
    let bn: Vec<Tensor> = ["s", "bb", "mm"].iter().map(|n| rnd(n, &[4])).collect();
    let var = Tensor::new(vec![4], vec![0.5, 1.0, 2.0, 3.0]).unwrap();
    let x4 = rnd("x4", &[2, 4, 3, 3]);
    let got = run(
        Op::BatchNorm { eps: 1e-5 },
        &[
            x4.clone(),
            bn[0].clone(),
            bn[1].clone(),
            bn[2].clone(),
            var.clone(),
        ],
        &[false, true, true, true, true],
    );
    for (i, v) in got[0].data.iter().enumerate() {
        let c = i / 9 % 4;
        let want = (x4.data[i] - bn[2].data[c]) / (var.data[c] + 1e-5).sqrt() * bn[0].data[c]
            + bn[1].data[c];
        assert!((v - want).abs() < 1e-5);
    }
}

#[test]
fn reduce_mean_keepdims() {
    let x = rnd("x", &[2, 3, 4]);
    let got = run(
        Op::Reduce {
            kind: ReduceKind::Mean,
            axes: vec![1],
            keepdims: true,
        },
        std::slice::from_ref(&x),
        &[false],
    );
    assert_eq!(got[0].shape, [2, 1, 4]);
    for i in 0..2 {
        for k in 0..4 {
            let want = (0..3).map(|j| x.data[i * 12 + j * 4 + k]).sum::<f32>() / 3.0;
            assert!((got[0].data[i * 4 + k] - want).abs() < 1e-6);
        }
    }
    let got = run(
        Op::Reduce {
            kind: ReduceKind::Max,
            axes: vec![0, 2],
            keepdims: false,
        },
        std::slice::from_ref(&x),
        &[false],
    );
    assert_eq!(got[0].shape, [3]);
}

fn bilinear_ref(x: &[f32], h: usize, w: usize, oh: usize, ow: usize, align: bool) -> Vec<f32> {
    let src = |o: usize, out: usize, inp: usize| -> f32 {
        if align {
            if out > 1 {
                o as f32 * (inp - 1) as f32 / (out - 1) as f32
            } else {
                0.0
            }
        } else {
            ((o as f32 + 0.5) * inp as f32 / out as f32 - 0.5).max(0.0)
        }
    };
    let mut o = vec![0.0; oh * ow];
    for y in 0..oh {
        let sy = src(y, oh, h).min((h - 1) as f32);
        let (y0, ly) = (sy.floor() as usize, sy - sy.floor());
        let y1 = (y0 + 1).min(h - 1);
        for xx in 0..ow {
            let sx = src(xx, ow, w).min((w - 1) as f32);
            let (x0, lx) = (sx.floor() as usize, sx - sx.floor());
            let x1 = (x0 + 1).min(w - 1);
            o[y * ow + xx] = (1.0 - ly) * ((1.0 - lx) * x[y0 * w + x0] + lx * x[y0 * w + x1])
                + ly * ((1.0 - lx) * x[y1 * w + x0] + lx * x[y1 * w + x1]);
        }
    }
    o
}

#[test]
fn resize_modes() {
    let x = rnd("x", &[1, 2, 5, 7]);
    for (coord, align) in [
        (CoordMode::PytorchHalfPixel, false),
        (CoordMode::HalfPixel, false),
        (CoordMode::AlignCorners, true),
    ] {
        let got = run(
            Op::Resize(ResizeAttrs {
                mode: ResizeMode::Linear,
                coord,
                nearest: NearestMode::Floor,
                size: ResizeSize::Size([12, 9]),
            }),
            std::slice::from_ref(&x),
            &[false],
        );
        for c in 0..2 {
            let want = bilinear_ref(&x.data[c * 35..(c + 1) * 35], 5, 7, 12, 9, align);
            assert_close(
                &got[0].data[c * 108..(c + 1) * 108],
                &want,
                1e-5,
                "bilinear",
            );
        }
    }
    let got = run(
        Op::Resize(ResizeAttrs {
            mode: ResizeMode::Nearest,
            coord: CoordMode::Asymmetric,
            nearest: NearestMode::Floor,
            size: ResizeSize::Scales([2.0, 2.0]),
        }),
        std::slice::from_ref(&x),
        &[false],
    );
    assert_eq!(got[0].shape, [1, 2, 10, 14]);
    for y in 0..10 {
        for xx in 0..14 {
            assert_eq!(got[0].data[y * 14 + xx], x.data[(y / 2) * 7 + xx / 2]);
        }
    }
}

#[test]
fn data_movement() {
    let x = rnd("x", &[2, 3, 4]);
    let at = |i: usize, j: usize, k: usize| x.data[i * 12 + j * 4 + k];
    let t = run(
        Op::Transpose {
            perm: vec![2, 0, 1],
        },
        std::slice::from_ref(&x),
        &[false],
    );
    assert_eq!(t[0].shape, [4, 2, 3]);
    assert_eq!(t[0].data[3 * 6 + 1 * 3 + 2], at(1, 2, 3));
    let s = run(
        Op::Slice {
            starts: vec![-1, 3],
            ends: vec![i64::MIN, 0],
            axes: vec![1, 2],
            steps: vec![-2, -2],
        },
        std::slice::from_ref(&x),
        &[false],
    );
    assert_eq!(s[0].shape, [2, 2, 2]);
    assert_eq!(
        s[0].data,
        vec![
            at(0, 2, 3),
            at(0, 2, 1),
            at(0, 0, 3),
            at(0, 0, 1),
            at(1, 2, 3),
            at(1, 2, 1),
            at(1, 0, 3),
            at(1, 0, 1)
        ]
    );
    let y = rnd("y", &[2, 1, 4]);
    let c = run(
        Op::Concat { axis: 1 },
        &[x.clone(), y.clone()],
        &[false, false],
    );
    assert_eq!(c[0].shape, [2, 4, 4]);
    assert_eq!(c[0].data[16 + 12..16 + 16], y.data[4..8]);
    let sp = run(
        Op::Split {
            axis: 2,
            sizes: vec![1, 3],
        },
        std::slice::from_ref(&x),
        &[false],
    );
    assert_eq!(sp[0].shape, [2, 3, 1]);
    assert_eq!(sp[1].data[0..3], [at(0, 0, 1), at(0, 0, 2), at(0, 0, 3)]);
    let g = run(
        Op::Gather {
            axis: 1,
            indices: vec![2, -3],
            indices_shape: vec![2],
        },
        std::slice::from_ref(&x),
        &[false],
    );
    assert_eq!(g[0].shape, [2, 2, 4]);
    assert_eq!(
        g[0].data[4..8],
        [at(0, 0, 0), at(0, 0, 1), at(0, 0, 2), at(0, 0, 3)]
    );
    let g = run(
        Op::Gather {
            axis: 1,
            indices: vec![0],
            indices_shape: vec![],
        },
        std::slice::from_ref(&x),
        &[false],
    );
    assert_eq!(g[0].shape, [2, 4]);
    let e = run(
        Op::Expand {
            shape: vec![Dim::Fixed(2), Dim::Fixed(3), Dim::Fixed(4)],
        },
        std::slice::from_ref(&y),
        &[false],
    );
    assert_eq!(e[0].data[4..8], y.data[0..4]);
    assert_eq!(e[0].data[12 + 8..12 + 12], y.data[4..8]);
    let f = run(Op::Flatten { axis: 1 }, std::slice::from_ref(&x), &[false]);
    assert_eq!(f[0].shape, [2, 12]);
    assert_eq!(f[0].data, x.data);
    let r = run(
        Op::Reshape {
            shape: vec![Dim::Copy, Dim::Infer, Dim::Fixed(2)],
        },
        std::slice::from_ref(&x),
        &[false],
    );
    assert_eq!(r[0].shape, [2, 6, 2]);
    let u = run(
        Op::Unsqueeze { axes: vec![0, -1] },
        std::slice::from_ref(&x),
        &[false],
    );
    assert_eq!(u[0].shape, [1, 2, 3, 4, 1]);
    let q = run(Op::Squeeze { axes: vec![] }, &[u[0].clone()], &[false]);
    assert_eq!(q[0].shape, [2, 3, 4]);
}

#[test]
fn elementwise_broadcasting() {
    let a = rnd("a", &[2, 3, 4]);
    let b = rnd("b", &[3, 1]);
    for op in [
        Binary::Add,
        Binary::Sub,
        Binary::Mul,
        Binary::Div,
        Binary::Max,
        Binary::Min,
    ] {
        let got = run(Op::Binary(op), &[a.clone(), b.clone()], &[false, false]);
        for i in 0..24 {
            let (x, y) = (a.data[i], b.data[i / 4 % 3]);
            let want = match op {
                Binary::Add => x + y,
                Binary::Sub => x - y,
                Binary::Mul => x * y,
                Binary::Div => x / y,
                Binary::Max => x.max(y),
                Binary::Min => x.min(y),
                Binary::Pow => unreachable!(),
            };
            assert!(
                (got[0].data[i] - want).abs() <= 1e-6 * (1.0 + want.abs()),
                "{op:?}"
            );
        }
    }
    // Scalar on the left, row vector on the right, and Pow.
    let s = Tensor::scalar(2.0);
    let got = run(
        Op::Binary(Binary::Pow),
        &[a.clone(), s.clone()],
        &[false, true],
    );
    assert_close(
        &got[0].data,
        &a.data.iter().map(|v| v * v).collect::<Vec<_>>(),
        1e-6,
        "pow 2",
    );
    let r = rnd("r", &[4]);
    let got = run(Op::Binary(Binary::Sub), &[s, r.clone()], &[true, false]);
    assert_close(
        &got[0].data,
        &r.data.iter().map(|v| 2.0 - v).collect::<Vec<_>>(),
        1e-6,
        "scalar - row",
    );
    let bad = {
        let mut g = Graph::new("bad");
        let x = g.add_input("x", vec![Dim::Fixed(3)]);
        let y = g.add_input("y", vec![Dim::Fixed(4)]);
        let z = g.add_op("add", Op::Binary(Binary::Add), &[x, y]).unwrap();
        g.add_output(z).unwrap();
        CpuBackend::new(1)
            .compile(&g, 1, Precision::Fp32)
            .err()
            .unwrap()
    };
    assert!(bad.to_string().contains("add"), "{bad}");
}

#[test]
fn unary_functions() {
    let x = synthesize(3, "u", &[1000], Init::Normal(3.0));
    let cases: Vec<(Unary, Box<dyn Fn(f64) -> f64>)> = vec![
        (Unary::Relu, Box::new(|v: f64| v.max(0.0))),
        (Unary::Relu6, Box::new(|v: f64| v.clamp(0.0, 6.0))),
        (Unary::Sigmoid, Box::new(|v: f64| 1.0 / (1.0 + (-v).exp()))),
        (Unary::Silu, Box::new(|v: f64| v / (1.0 + (-v).exp()))),
        (
            Unary::HardSwish,
            Box::new(|v: f64| v * (v + 3.0).clamp(0.0, 6.0) / 6.0),
        ),
        (
            Unary::HardSigmoid {
                alpha: 0.2,
                beta: 0.5,
            },
            Box::new(|v: f64| (0.2 * v + 0.5).clamp(0.0, 1.0)),
        ),
        (
            Unary::Gelu,
            Box::new(|v: f64| 0.5 * v * (1.0 + erf_ref(v / std::f64::consts::SQRT_2))),
        ),
        (Unary::Erf, Box::new(erf_ref)),
        (Unary::Tanh, Box::new(|v: f64| v.tanh())),
        (Unary::Exp, Box::new(|v: f64| v.exp())),
        (
            Unary::Clip {
                min: -1.0,
                max: 2.0,
            },
            Box::new(|v: f64| v.clamp(-1.0, 2.0)),
        ),
    ];
    for (u, f) in cases {
        let got = run(Op::Unary(u), std::slice::from_ref(&x), &[false]);
        for (g, &v) in got[0].data.iter().zip(&x.data) {
            let want = f(v as f64) as f32;
            assert!(
                (g - want).abs() <= 2e-6 * (1.0 + want.abs()),
                "{u:?}({v}) = {g}, want {want}"
            );
        }
    }
}

/// erf: Maclaurin series for |x| < 2.5, erfc's continued fraction (Lentz) above.
fn erf_ref(x: f64) -> f64 {
    if x.abs() >= 2.5 {
        let z = x.abs();
        let (mut f, mut c, mut d) = (z, z, 0.0f64);
        for i in 1..500 {
            let a = i as f64 / 2.0;
            d = 1.0 / (z + a * d);
            c = z + a / c;
            f *= c * d;
        }
        let erfc = (-z * z).exp() / (f * std::f64::consts::PI.sqrt());
        return x.signum() * (1.0 - erfc);
    }
    let mut sum = 0.0;
    let mut term = x;
    let mut n = 0.0;
    loop {
        let t = term / (2.0 * n + 1.0);
        sum += t;
        if t.abs() < 1e-18 {
            break;
        }
        n += 1.0;
        term *= -x * x / n;
    }
    sum * 2.0 / std::f64::consts::PI.sqrt()
}

#[test]
fn bad_graphs_are_errors() {
    // Wrong input count.
    let mut g = Graph::new("g");
    let x = g.add_input("x", vec![Dim::Batch, Dim::Fixed(3)]);
    assert!(g
        .add_node("c", Op::Conv(ConvAttrs::default()), &[x])
        .is_err());
    // Unknown value.
    assert!(g.add_node("r", Op::Unary(Unary::Relu), &[99]).is_err());
    // Conv on a 2-D input: shape error at compile, naming the node.
    let w = g.add_constant("w", Tensor::zeros(vec![4, 3, 1, 1]));
    let y = g
        .add_op("conv_bad", Op::Conv(ConvAttrs::default()), &[x, w])
        .unwrap();
    g.add_output(y).unwrap();
    let e = CpuBackend::new(1)
        .compile(&g, 1, Precision::Fp32)
        .err()
        .unwrap();
    assert!(e.to_string().contains("conv_bad"), "{e}");
    // Batch 0 and unsupported precision.
    let mut g = Graph::new("g");
    let x = g.add_input("x", vec![Dim::Batch, Dim::Fixed(3)]);
    let y = g.add_op("r", Op::Unary(Unary::Relu), &[x]).unwrap();
    g.add_output(y).unwrap();
    assert!(CpuBackend::new(1).compile(&g, 0, Precision::Fp32).is_err());
    assert!(CpuBackend::new(1).compile(&g, 1, Precision::Fp16).is_err());
    // No outputs.
    let g = Graph::new("empty");
    assert!(CpuBackend::new(1).compile(&g, 1, Precision::Fp32).is_err());
    // Bad reshape.
    let mut g = Graph::new("g");
    let x = g.add_input("x", vec![Dim::Batch, Dim::Fixed(3)]);
    let y = g
        .add_op(
            "rs",
            Op::Reshape {
                shape: vec![Dim::Fixed(7)],
            },
            &[x],
        )
        .unwrap();
    g.add_output(y).unwrap();
    assert!(g.infer_shapes(1).is_err());
}

#[test]
fn batch_is_symbolic() {
    let mut g = Graph::new("g");
    let x = g.add_input("x", vec![Dim::Batch, Dim::Fixed(6)]);
    let y = g
        .add_op(
            "rs",
            Op::Reshape {
                shape: vec![Dim::BatchTimes(2), Dim::Fixed(3)],
            },
            &[x],
        )
        .unwrap();
    let z = g.add_op("relu", Op::Unary(Unary::Relu), &[y]).unwrap();
    g.add_output(z).unwrap();
    for batch in [1, 4] {
        let mut m = CpuBackend::new(1)
            .compile(&g, batch, Precision::Fp32)
            .unwrap();
        assert_eq!(m.input_shape(), [batch, 6]);
        assert_eq!(m.output_shape(), [2 * batch, 3]);
        m.input_mut()
            .iter_mut()
            .enumerate()
            .for_each(|(i, v)| *v = i as f32 - 5.0);
        m.run().unwrap();
        let want: Vec<f32> = (0..6 * batch).map(|i| (i as f32 - 5.0).max(0.0)).collect();
        assert_eq!(m.output(), want.as_slice());
    }
}

#[test]
fn onnx_style_gelu_and_linear_are_fused() {
    // MatMul(x, W) + b, then GELU as PyTorch exports it: (x * (erf(x / √2) + 1)) * 0.5.
    let mut g = Graph::new("gelu");
    let x = g.add_input("x", vec![Dim::Batch, Dim::Fixed(5), Dim::Fixed(8)]);
    let w = g.add_constant("w", rnd("w", &[8, 12]));
    let b = g.add_constant("b", rnd("b", &[12]));
    let m = g.add_op("mm", Op::MatMul, &[x, w]).unwrap();
    let y = g.add_op("bias", Op::Binary(Binary::Add), &[m, b]).unwrap();
    let s2 = g.add_constant("sqrt2", Tensor::scalar(std::f32::consts::SQRT_2));
    let one = g.add_constant("one", Tensor::scalar(1.0));
    let half = g.add_constant("half", Tensor::scalar(0.5));
    let d = g.add_op("div", Op::Binary(Binary::Div), &[y, s2]).unwrap();
    let e = g.add_op("erf", Op::Unary(Unary::Erf), &[d]).unwrap();
    let a = g.add_op("add", Op::Binary(Binary::Add), &[e, one]).unwrap();
    let p = g.add_op("mul", Op::Binary(Binary::Mul), &[y, a]).unwrap();
    let z = g
        .add_op("mul_half", Op::Binary(Binary::Mul), &[p, half])
        .unwrap();
    g.add_output(z).unwrap();
    let opt = isolane_engine::passes::optimize(&g, 3).unwrap();
    assert_eq!(
        opt.nodes.len(),
        1,
        "{:?}",
        opt.nodes.iter().map(|n| n.op.name()).collect::<Vec<_>>()
    );
    assert_eq!(
        opt.nodes[0].op,
        Op::Linear {
            activation: Some(Unary::Gelu)
        }
    );
    let xin = rnd("xin", &[3, 5, 8]);
    let want = interpret(&g, 3, std::slice::from_ref(&xin)).unwrap();
    let mut m = CpuBackend::new(2).compile(&g, 3, Precision::Fp32).unwrap();
    m.input_mut().copy_from_slice(&xin.data);
    m.run().unwrap();
    assert_close(m.output(), &want[0].data, 1e-5, "fused GELU vs decomposed");
}
