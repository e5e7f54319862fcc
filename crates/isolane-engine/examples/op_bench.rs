//! Micro-benchmarks of single ops through the CPU backend (development aid):
//! `cargo run --release -p isolane-engine --example op_bench -- [threads]`.

use std::time::Instant;

use isolane_engine::cpu::CpuBackend;
use isolane_engine::ir::{ConvAttrs, PoolAttrs};
use isolane_engine::{CompiledModel, Dim, Graph, Op, Precision, Tensor};

fn time(name: &str, g: &Graph, threads: usize, flops: f64) {
    let mut m = CpuBackend::new(threads)
        .compile_cpu(g, 1, Precision::Fp32)
        .unwrap();
    m.input_mut()
        .iter_mut()
        .enumerate()
        .for_each(|(i, v)| *v = (i % 13) as f32 * 0.1);
    for _ in 0..3 {
        m.run().unwrap();
    }
    let mut ts: Vec<f64> = (0..30)
        .map(|_| {
            let t = Instant::now();
            m.run().unwrap();
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    ts.sort_by(|a, b| a.total_cmp(b));
    let ms = ts[15];
    println!("{name:40} {ms:8.3} ms  {:7.1} GFLOP/s", flops / ms / 1e6);
}

fn conv(c: usize, m: usize, hw: usize, k: usize, s: usize, threads: usize) {
    conv_epi(c, m, hw, k, s, threads, false);
}

/// `relu`: with a bias and a fused ReLU, as the convolutions of a BN-folded ResNet.
fn conv_epi(c: usize, m: usize, hw: usize, k: usize, s: usize, threads: usize, relu: bool) {
    let mut g = Graph::new("conv");
    let x = g.add_input(
        "x",
        vec![Dim::Batch, Dim::Fixed(c), Dim::Fixed(hw), Dim::Fixed(hw)],
    );
    let w = g.add_constant(
        "w",
        Tensor::new(vec![m, c, k, k], vec![0.01; m * c * k * k]).unwrap(),
    );
    let a = ConvAttrs {
        strides: [s, s],
        pads: [k / 2; 4],
        activation: relu.then_some(isolane_engine::ir::Unary::Relu),
        ..Default::default()
    };
    let mut ins = vec![x, w];
    if relu {
        let b = Tensor::new(vec![m], vec![0.01; m]).unwrap();
        ins.push(g.add_constant("b", b));
    }
    let y = g.add_op("conv", Op::Conv(a), &ins).unwrap();
    g.add_output(y).unwrap();
    let o = (hw + 2 * (k / 2) - k) / s + 1;
    time(
        &format!(
            "conv {c}->{m} {k}x{k} s{s} {hw}x{hw}{}",
            if relu { " +bias+relu" } else { "" }
        ),
        &g,
        threads,
        2.0 * (m * c * k * k * o * o) as f64,
    );
}

fn main() {
    let threads: usize = std::env::args().nth(1).map_or(2, |s| s.parse().unwrap());
    conv(3, 64, 224, 7, 2, threads);
    conv_epi(3, 64, 224, 7, 2, threads, true);
    conv(64, 64, 56, 3, 1, threads);
    conv(128, 128, 28, 3, 1, threads);
    conv(256, 256, 14, 3, 1, threads);
    conv(512, 512, 7, 3, 1, threads);
    conv(64, 256, 56, 1, 1, threads);
    let mut g = Graph::new("mm");
    let a = g.add_input("a", vec![Dim::Fixed(3136), Dim::Fixed(576)]);
    let b = g.add_input("b", vec![Dim::Fixed(576), Dim::Fixed(64)]);
    let y = g.add_op("mm", Op::MatMul, &[a, b]).unwrap();
    g.add_output(y).unwrap();
    time(
        "matmul 3136x576x64",
        &g,
        threads,
        2.0 * 3136.0 * 576.0 * 64.0,
    );
    let mut g = Graph::new("pool");
    let x = g.add_input(
        "x",
        vec![Dim::Batch, Dim::Fixed(64), Dim::Fixed(112), Dim::Fixed(112)],
    );
    let y = g
        .add_op(
            "pool",
            Op::MaxPool(PoolAttrs {
                kernel: [3, 3],
                strides: [2, 2],
                pads: [1; 4],
                ..Default::default()
            }),
            &[x],
        )
        .unwrap();
    g.add_output(y).unwrap();
    time("maxpool 3x3 s2 64x112x112", &g, threads, 0.0);
}
