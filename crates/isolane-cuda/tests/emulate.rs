//! Runs fp32 plans on the CPU, step by step, in one host arena laid out exactly as the GPU's
//! (same offsets, same aliasing, same filter layouts), and compares with the CPU backend. A
//! planning mistake — a storage reused while still alive, a wrong stride of a view, a fusion
//! that drops a term — shows up here as a wrong number, in CI, without a GPU. (The GPU kernels
//! themselves are checked by tests/gpu.rs.)

mod common;

use common::{random, reduce_graph, rel_l2};
use isolane_cuda::check::StepRunner;
use isolane_cuda::plan::{
    self, act_code, binary_code, phys_strides, AttentionStep, LayerNormStep, LinearStep, Loc,
    MatMulStep, Plan, PlanOptions, PoolStep, QuantGemmStep, ResizeStep, SoftmaxStep, Step,
    StepKind, Strided,
};
use isolane_engine::ir::{
    Binary, ConvAttrs, CoordMode, Dim, Graph, NearestMode, Op, ReduceKind, ResizeAttrs, ResizeMode,
    ResizeSize, Tensor, Unary,
};
use isolane_engine::{build_model, passes, Backend, CpuBackend, Precision, Weights};

struct Mem {
    arena: Vec<f32>,
    weights: Vec<f32>,
    st_off: Vec<usize>,
    c_off: Vec<usize>,
    /// The one-byte quantized storages of `QuantGemm` steps (by storage id), as their values:
    /// the f32 arena has one slot per 4 bytes.
    quantized: std::collections::HashMap<usize, Vec<f64>>,
}

impl Mem {
    fn idx(&self, l: Loc) -> (bool, usize) {
        match l {
            Loc::Storage { id, offset } => (true, self.st_off[id] + offset),
            Loc::Const { id, offset } => (false, self.c_off[id] + offset),
        }
    }
    fn get(&self, l: Loc, i: usize) -> f32 {
        match self.idx(l) {
            (true, b) => self.arena[b + i],
            (false, b) => self.weights[b + i],
        }
    }
    fn set(&mut self, l: Loc, i: usize, v: f32) {
        let (a, b) = self.idx(l);
        assert!(a, "a step writes a constant");
        self.arena[b + i] = v;
    }
}

fn erf(x: f32) -> f32 {
    // Abramowitz & Stegun 7.1.26 in f64 (|error| < 1.5e-7).
    let x = x as f64;
    let t = 1.0 / (1.0 + 0.3275911 * x.abs());
    let y = 1.0
        - (((((1.061405429 * t - 1.453152027) * t) + 1.421413741) * t - 0.284496736) * t
            + 0.254829592)
            * t
            * (-x * x).exp();
    (if x >= 0.0 { y } else { -y }) as f32
}

fn act(u: Option<Unary>, x: f32) -> f32 {
    let (k, p0, p1) = act_code(u, plan::DType::F32);
    match k {
        0 => x,
        1 => x.max(0.0),
        2 => x.clamp(0.0, 6.0),
        3 => x.clamp(p0, p1),
        4 => {
            if x >= 0.0 {
                x
            } else {
                p0 * x
            }
        }
        5 => 1.0 / (1.0 + (-x).exp()),
        6 => (p0 * x + p1).clamp(0.0, 1.0),
        7 => x * (x + 3.0).clamp(0.0, 6.0) / 6.0,
        8 => x / (1.0 + (-x).exp()),
        9 => 0.5 * x * (1.0 + erf(x / std::f32::consts::SQRT_2)),
        10 => 0.5 * x * (1.0 + (0.797_884_6 * (x + 0.044715 * x * x * x)).tanh()),
        11 => x.tanh(),
        12 => x.exp(),
        13 => x.ln(),
        14 => x.sqrt(),
        15 => erf(x),
        16 => -x,
        17 => x.abs(),
        18 => 1.0 / x,
        other => panic!("activation code {other} not emulated"),
    }
}

fn for_space(s: &Strided, mut f: impl FnMut(&[usize])) {
    let r = s.dims.len();
    let mut idx = vec![0usize; r];
    for _ in 0..s.numel() {
        let offs: Vec<usize> = (0..s.strides.len())
            .map(|k| (0..r).map(|d| idx[d] * s.strides[k][d]).sum())
            .collect();
        f(&offs);
        for d in (0..r).rev() {
            idx[d] += 1;
            if idx[d] < s.dims[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

fn s4(shape: &[usize; 4], nhwc: bool) -> Vec<usize> {
    phys_strides(shape, nhwc)
}

/// The plan on the CPU: its arena and weights as the GPU lays them out, run step by step.
struct Emulator<'p> {
    p: &'p Plan,
    m: Mem,
}

impl<'p> Emulator<'p> {
    fn new(p: &'p Plan) -> Self {
        assert_eq!(p.dtype, plan::DType::F32);
        let w = p.weights_host();
        let (c_offs, _) = p.const_layout();
        let m = Mem {
            // NaN everywhere: a read of a never-written element poisons the output.
            arena: vec![f32::NAN; p.arena_bytes / 4],
            weights: w
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            st_off: p.storages.iter().map(|s| s.offset / 4).collect(),
            c_off: c_offs.iter().map(|o| o / 4).collect(),
            quantized: Default::default(),
        };
        Emulator { p, m }
    }

    fn output(&self, k: usize) -> Vec<f32> {
        let out = Loc::Storage {
            id: self.p.outputs[k].staging,
            offset: 0,
        };
        let n: usize = self.p.outputs[k].shape.iter().product();
        (0..n).map(|i| self.m.get(out, i)).collect()
    }
}

impl StepRunner for Emulator<'_> {
    fn run_plan(&mut self, inputs: &[Vec<f32>]) -> isolane_engine::Result<Vec<Vec<f32>>> {
        self.write_inputs(inputs)?;
        self.run_steps(0, self.p.steps.len())?;
        Ok((0..self.p.outputs.len()).map(|k| self.output(k)).collect())
    }
    fn write_inputs(&mut self, inputs: &[Vec<f32>]) -> isolane_engine::Result<()> {
        for (k, x) in inputs.iter().enumerate() {
            let at = Loc::Storage {
                id: self.p.inputs[k].staging,
                offset: 0,
            };
            for (i, v) in x.iter().enumerate() {
                self.m.set(at, i, *v);
            }
        }
        Ok(())
    }
    fn run_steps(&mut self, from: usize, to: usize) -> isolane_engine::Result<()> {
        for step in &self.p.steps[from..to] {
            exec_step(self.p, &mut self.m, step);
        }
        Ok(())
    }
    fn read(&mut self, loc: Loc, len: usize) -> isolane_engine::Result<Vec<f32>> {
        Ok((0..len).map(|i| self.m.get(loc, i)).collect())
    }
}

fn run(p: &Plan, input: &[f32]) -> Vec<f32> {
    let mut e = Emulator::new(p);
    e.run_plan(&[input.to_vec()]).unwrap().swap_remove(0)
}

/// One step, with the semantics the GPU kernels and libraries have.
fn exec_step(p: &Plan, m: &mut Mem, step: &Step) {
    match &step.kind {
        StepKind::CastIn {
            x,
            y,
            n,
            nhwc: Some((c, hw, padded)),
            quant,
        } => {
            use isolane_engine::quant::{dequantize, quantize};
            for i in 0..*n {
                let (b, ch, px) = (i / (c * hw), i / hw % c, i % hw);
                let mut v = m.get(*x, i);
                if let Some(q) = quant {
                    let s = q.scale;
                    v = dequantize(
                        quantize(v, s, q.zero_point, q.qtype, q.saturate),
                        s,
                        q.zero_point,
                    );
                }
                m.set(*y, (b * hw + px) * padded + ch, v);
                if ch == 0 {
                    for pad in *c..*padded {
                        m.set(*y, (b * hw + px) * padded + pad, 0.0);
                    }
                }
            }
        }
        StepKind::CastIn { x, y, n, .. } | StepKind::CastOut { x, y, n } => {
            for i in 0..*n {
                let v = m.get(*x, i);
                m.set(*y, i, v);
            }
        }
        StepKind::Conv(c) | StepKind::DwConv(c) => {
            let dw = matches!(step.kind, StepKind::DwConv(_));
            let [n, ch, h, wd] = c.x_shape;
            let [mo, cg, kh, kw] = c.w_shape;
            let [_, _, oh, ow] = c.y_shape;
            let xs = s4(&c.x_shape, c.nhwc);
            let ys = s4(&c.y_shape, c.nhwc);
            let wid = match c.w {
                Loc::Const { id, .. } => id,
                _ => panic!("computed filter"),
            };
            let krsc = p.filter_nhwc.contains(&wid);
            let hwm = p.filter_dw_hwc.contains(&wid);
            let per_group = mo / c.groups;
            let mut out = vec![0f32; n * mo * oh * ow];
            for b in 0..n {
                for o in 0..mo {
                    let g = o / per_group;
                    for y0 in 0..oh {
                        for x0 in 0..ow {
                            let mut acc = 0f32;
                            for ci in 0..cg {
                                let cin = if dw { o / (mo / ch) } else { g * cg + ci };
                                for a in 0..kh {
                                    let ih = (y0 * c.strides[0] + a * c.dilations[0]) as isize
                                        - c.pads[0] as isize;
                                    if ih < 0 || ih >= h as isize {
                                        continue;
                                    }
                                    for bb in 0..kw {
                                        let iw = (x0 * c.strides[1] + bb * c.dilations[1]) as isize
                                            - c.pads[1] as isize;
                                        if iw < 0 || iw >= wd as isize {
                                            continue;
                                        }
                                        let xi = b * xs[0]
                                            + cin * xs[1]
                                            + ih as usize * xs[2]
                                            + iw as usize * xs[3];
                                        let wi = if hwm {
                                            (a * kw + bb) * mo + o
                                        } else if krsc {
                                            ((o * kh + a) * kw + bb) * cg + ci
                                        } else {
                                            ((o * cg + ci) * kh + a) * kw + bb
                                        };
                                        acc += m.get(c.x, xi) * m.get(c.w, wi);
                                    }
                                }
                            }
                            let yi = b * ys[0] + o * ys[1] + y0 * ys[2] + x0 * ys[3];
                            if let Some(bl) = c.bias {
                                acc += m.get(bl, o);
                            }
                            if let Some(r) = c.residual {
                                acc += m.get(r, yi);
                            }
                            out[yi] = act(c.act, acc);
                        }
                    }
                }
            }
            for (i, v) in out.into_iter().enumerate() {
                m.set(c.y, i, v);
            }
        }
        StepKind::Linear(LinearStep {
            x,
            w,
            bias,
            y,
            m: rows,
            n,
            k,
            act: a,
            residual,
        }) => {
            let mut out = vec![0f32; rows * n];
            for r in 0..*rows {
                for j in 0..*n {
                    let mut acc = 0f32;
                    for kk in 0..*k {
                        acc += m.get(*x, r * k + kk) * m.get(*w, j * k + kk);
                    }
                    if let Some(b) = bias {
                        acc += m.get(*b, j);
                    }
                    if let Some(rl) = residual {
                        acc += m.get(*rl, r * n + j);
                    }
                    out[r * n + j] = act(*a, acc);
                }
            }
            for (i, v) in out.into_iter().enumerate() {
                m.set(*y, i, v);
            }
        }
        StepKind::MatMul(MatMulStep {
            a,
            b,
            y,
            batch,
            m: rows,
            n,
            k,
            a_batch_stride,
            b_batch_stride,
            b_trans,
            alpha,
            lda,
            ldb,
            ldy,
            y_batch_stride,
        }) => {
            let mut out = Vec::new();
            for bt in 0..*batch {
                for r in 0..*rows {
                    for j in 0..*n {
                        let mut acc = 0f32;
                        for kk in 0..*k {
                            let av = m.get(*a, bt * a_batch_stride + r * lda + kk);
                            let bi = if *b_trans { j * ldb + kk } else { kk * ldb + j };
                            acc += av * m.get(*b, bt * b_batch_stride + bi);
                        }
                        out.push((bt * y_batch_stride + r * ldy + j, alpha * acc));
                    }
                }
            }
            for (i, v) in out {
                m.set(*y, i, v);
            }
        }
        StepKind::Pointwise {
            x,
            y,
            scale,
            bias,
            residual,
            n,
            channels,
            inner,
            act: a,
        } => {
            for i in 0..*n {
                let ch = (i / inner) % channels;
                let mut v = m.get(*x, i);
                if let Some(s) = scale {
                    v *= m.get(*s, ch);
                }
                if let Some(b) = bias {
                    v += m.get(*b, ch);
                }
                if let Some(r) = residual {
                    v += m.get(*r, i);
                }
                m.set(*y, i, act(*a, v));
            }
        }
        StepKind::Binary { a, b, y, op, space } => {
            let mut out = Vec::new();
            for_space(space, |o| {
                let (va, vb) = (m.get(*a, o[1]), m.get(*b, o[2]));
                let v = match binary_code(*op) {
                    0 => va + vb,
                    1 => va - vb,
                    2 => va * vb,
                    3 => va / vb,
                    4 => va.powf(vb),
                    5 => va.max(vb),
                    _ => va.min(vb),
                };
                out.push((o[0], v));
            });
            for (i, v) in out {
                m.set(*y, i, v);
            }
        }
        StepKind::Copy { x, y, space } => {
            let mut out = Vec::new();
            for_space(space, |o| out.push((o[0], m.get(*x, o[1]))));
            for (i, v) in out {
                m.set(*y, i, v);
            }
        }
        StepKind::LayerNorm(LayerNormStep {
            x,
            scale,
            bias,
            y,
            rows,
            cols,
            eps,
        }) => {
            for r in 0..*rows {
                let v: Vec<f32> = (0..*cols).map(|c| m.get(*x, r * cols + c)).collect();
                let mean = v.iter().sum::<f32>() / *cols as f32;
                let var = v.iter().map(|a| (a - mean) * (a - mean)).sum::<f32>() / *cols as f32;
                let rstd = 1.0 / (var + eps).sqrt();
                for (c, vc) in v.iter().enumerate() {
                    let mut o = (vc - mean) * rstd * m.get(*scale, c);
                    if let Some(b) = bias {
                        o += m.get(*b, c);
                    }
                    m.set(*y, r * cols + c, o);
                }
            }
        }
        StepKind::Softmax(SoftmaxStep {
            x,
            y,
            outer,
            len,
            inner,
        }) => {
            for o in 0..*outer {
                for i in 0..*inner {
                    let at = |c: usize| o * len * inner + c * inner + i;
                    let v: Vec<f32> = (0..*len).map(|c| m.get(*x, at(c))).collect();
                    let mx = v.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                    let s: f32 = v.iter().map(|a| (a - mx).exp()).sum();
                    for (c, vc) in v.iter().enumerate() {
                        m.set(*y, at(c), (vc - mx).exp() / s);
                    }
                }
            }
        }
        StepKind::Attention(AttentionStep {
            q,
            k,
            v,
            y,
            batch,
            heads,
            seq,
            dim,
            alpha,
            out_scale,
            q_strides,
            k_strides,
            v_strides,
            y_strides,
        }) => {
            let at =
                |st: &[usize; 3], b: usize, h: usize, r: usize| b * st[0] + h * st[1] + r * st[2];
            for b in 0..*batch {
                for h in 0..*heads {
                    for i in 0..*seq {
                        let sc: Vec<f32> = (0..*seq)
                            .map(|j| {
                                let (qo, ko) = (at(q_strides, b, h, i), at(k_strides, b, h, j));
                                alpha
                                    * (0..*dim)
                                        .map(|d| m.get(*q, qo + d) * m.get(*k, ko + d))
                                        .sum::<f32>()
                            })
                            .collect();
                        let mx = sc.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                        let pr: Vec<f32> = sc.iter().map(|a| (a - mx).exp()).collect();
                        let s: f32 = pr.iter().sum();
                        for d in 0..*dim {
                            let o: f32 = (0..*seq)
                                .map(|j| pr[j] * m.get(*v, at(v_strides, b, h, j) + d))
                                .sum();
                            m.set(*y, at(y_strides, b, h, i) + d, o / s * out_scale);
                        }
                    }
                }
            }
        }
        StepKind::Pool(PoolStep {
            x,
            y,
            max,
            x_shape,
            out_hw,
            kernel,
            strides,
            pads,
            dilations,
            count_include_pad,
            nhwc,
            y_quant,
        }) => {
            let [n, c, h, w] = *x_shape;
            let xs = s4(x_shape, *nhwc);
            let ys = s4(&[n, c, out_hw[0], out_hw[1]], *nhwc);
            let mut pooled = vec![0f32; n * c * out_hw[0] * out_hw[1]];
            for b in 0..n {
                for ch in 0..c {
                    for oy in 0..out_hw[0] {
                        for ox in 0..out_hw[1] {
                            let mut acc = if *max { f32::NEG_INFINITY } else { 0.0 };
                            let mut cnt = 0;
                            for a in 0..kernel[0] {
                                let ih = (oy * strides[0] + a * dilations[0]) as isize
                                    - pads[0] as isize;
                                for bb in 0..kernel[1] {
                                    let iw = (ox * strides[1] + bb * dilations[1]) as isize
                                        - pads[1] as isize;
                                    if ih < 0 || iw < 0 || ih >= h as isize || iw >= w as isize {
                                        continue;
                                    }
                                    let v = m.get(
                                        *x,
                                        b * xs[0]
                                            + ch * xs[1]
                                            + ih as usize * xs[2]
                                            + iw as usize * xs[3],
                                    );
                                    acc = if *max { acc.max(v) } else { acc + v };
                                    cnt += 1;
                                }
                            }
                            if !*max {
                                // pool2d's divisor: with the padding counted, the window
                                // clipped to the padded input (the bottom and right pads taken
                                // as the top and left ones: the lowering refuses others).
                                let div = if *count_include_pad {
                                    let (h0, w0) = (
                                        (oy * strides[0]) as isize - pads[0] as isize,
                                        (ox * strides[1]) as isize - pads[1] as isize,
                                    );
                                    let he = (h0 + ((kernel[0] - 1) * dilations[0]) as isize + 1)
                                        .min((h + pads[0]) as isize);
                                    let we = (w0 + ((kernel[1] - 1) * dilations[1]) as isize + 1)
                                        .min((w + pads[1]) as isize);
                                    let (dh, dw) = (dilations[0] as isize, dilations[1] as isize);
                                    (((he - h0 + dh - 1) / dh) * ((we - w0 + dw - 1) / dw)) as f32
                                } else {
                                    cnt as f32
                                };
                                acc = if div > 0.0 { acc / div } else { 0.0 };
                            }
                            pooled[b * ys[0] + ch * ys[1] + oy * ys[2] + ox * ys[3]] = acc;
                        }
                    }
                }
            }
            match y_quant {
                // The bytes the quantize kernel makes of the values (pool2d_q8).
                Some((s, qtype)) => {
                    let bytes = pooled
                        .iter()
                        .map(|&v| isolane_engine::quant::quantize(v, *s, 0.0, *qtype, true) as f64)
                        .collect();
                    m.quantized.insert(storage_id(*y), bytes);
                }
                None => {
                    for (i, v) in pooled.into_iter().enumerate() {
                        m.set(*y, i, v);
                    }
                }
            }
        }
        StepKind::RowReduce {
            x,
            y,
            rows,
            hw,
            kind,
        } => {
            for r in 0..*rows {
                let v = kind.apply((0..*hw).map(|j| m.get(*x, r * hw + j)), *hw);
                m.set(*y, r, v);
            }
        }
        StepKind::ChanMean { x, y, n, c, hw } => {
            for b in 0..*n {
                for ch in 0..*c {
                    let s: f32 = (0..*hw).map(|j| m.get(*x, b * hw * c + j * c + ch)).sum();
                    m.set(*y, b * c + ch, s / *hw as f32);
                }
            }
        }
        StepKind::Resize(ResizeStep {
            x,
            y,
            x_shape,
            out_hw,
            linear,
            coord,
            nearest,
            scales,
            nhwc,
        }) => {
            // The engine's definition of where each output pixel reads, from the codes the
            // plan hands the kernel (so a wrong code or scale shows up here).
            let r = ResizeAttrs {
                mode: if *linear {
                    ResizeMode::Linear
                } else {
                    ResizeMode::Nearest
                },
                coord: [
                    CoordMode::HalfPixel,
                    CoordMode::PytorchHalfPixel,
                    CoordMode::AlignCorners,
                    CoordMode::Asymmetric,
                ][*coord as usize],
                nearest: [
                    NearestMode::RoundPreferFloor,
                    NearestMode::RoundPreferCeil,
                    NearestMode::Floor,
                    NearestMode::Ceil,
                ][*nearest as usize],
                size: ResizeSize::Size(*out_hw),
            };
            let [n, c, h, w] = *x_shape;
            let xs = s4(x_shape, *nhwc);
            let ys = s4(&[n, c, out_hw[0], out_hw[1]], *nhwc);
            for b in 0..n {
                for ch in 0..c {
                    let at =
                        |yy: usize, xx: usize| b * xs[0] + ch * xs[1] + yy * xs[2] + xx * xs[3];
                    for oy in 0..out_hw[0] {
                        let (y0, y1, ly) = r.source(oy, h, out_hw[0], scales[0]);
                        for ox in 0..out_hw[1] {
                            let (x0, x1, lx) = r.source(ox, w, out_hw[1], scales[1]);
                            let top =
                                m.get(*x, at(y0, x0)) * (1.0 - lx) + m.get(*x, at(y0, x1)) * lx;
                            let bot =
                                m.get(*x, at(y1, x0)) * (1.0 - lx) + m.get(*x, at(y1, x1)) * lx;
                            let v = if *linear {
                                top * (1.0 - ly) + bot * ly
                            } else {
                                m.get(*x, at(y0, x0))
                            };
                            m.set(*y, b * ys[0] + ch * ys[1] + oy * ys[2] + ox * ys[3], v);
                        }
                    }
                }
            }
        }
        StepKind::AdaptivePool { .. } => panic!("not emulated"),
        StepKind::QuantGemm(q) => exec_quant_gemm(p, m, q),
        StepKind::FakeQuant(fq) => {
            use isolane_engine::quant::{dequantize, quantize};
            for i in 0..fq.n {
                let (s, z) = match fq.params {
                    Some([sl, zl]) => {
                        let c = (i / fq.inner) % fq.channels;
                        (m.get(sl, c), m.get(zl, c))
                    }
                    None => (fq.scale, fq.zero_point),
                };
                let q = quantize(m.get(fq.x, i), s, z, fq.qtype, fq.saturate);
                m.set(fq.y, i, dequantize(q, s, z));
            }
        }
    }
}

/// A quantized GEMM as the GPU runs it: im2col (NHWC, columns in `[kh, kw, C]` order), the
/// quantize kernel's rounding, an exact sum (int32 on the GPU; f32 for fp8, exact here in f64
/// for e4m3 products), the epilogue's one multiply-add per output.
fn exec_quant_gemm(p: &Plan, m: &mut Mem, q: &QuantGemmStep) {
    use isolane_engine::quant::quantize;
    let graph_wrote_copy = exec_quant_path(p, m, q);
    // y's bytes for the next direct GEMMs: the quantize kernel after every path but a graph
    // that writes them itself.
    if let (Some((l, s)), false) = (q.y_copy, graph_wrote_copy) {
        let bytes = (0..q.m * q.n)
            .map(|i| quantize(m.get(q.y, i), s, 0.0, q.qtype, true) as f64)
            .collect();
        m.quantized.insert(storage_id(l), bytes);
    }
}

/// The emulated step's path (`QUANT_PATHS`); true where cuDNN's graph wrote y's quantized
/// copy itself.
fn exec_quant_path(p: &Plan, m: &mut Mem, q: &QuantGemmStep) -> bool {
    use isolane_engine::quant::quantize;
    let path = QUANT_PATHS.with(|c| {
        let (pattern, next) = &mut *c.borrow_mut();
        *next += 1;
        pattern.get((*next - 1) % pattern.len().max(1)).copied()
    });
    match (path.unwrap_or(0), q.alt.as_deref()) {
        (1, Some(alt)) if alt.dnn_conv.is_some() => {
            exec_quant_dnn_conv(p, m, q, alt);
            return false;
        }
        (3, Some(alt)) if alt.dnn_conv.is_some() && alt.graph.is_some() => {
            return exec_quant_graph(p, m, q, alt)
        }
        (2, Some(alt)) => {
            // The float candidate as the build records it under the emulated build options.
            let plain = QUANT_OPTIONS
                .with(|o| o.get())
                .unwrap_or_default()
                .quant_float_plain();
            exec_quant_float(p, m, q, &alt.float, plain);
            return false;
        }
        (4, Some(alt)) => {
            exec_quant_float(p, m, q, &alt.float, true);
            return false;
        }
        (5, Some(alt)) if alt.xb.is_some() && q.conv.is_some() && !q.x_quantized => {
            // x quantized whole into xb, then the GEMM path over those bytes (their im2col
            // into xq), as the GPU's quantize + im2col_b4 run it.
            let xb = alt.xb.unwrap();
            let c = q.conv.as_ref().unwrap();
            let n: usize = c.x_shape.iter().product();
            let bytes = (0..n)
                .map(|i| quantize(m.get(q.x, i), q.x_scale, 0.0, q.qtype, true) as f64)
                .collect();
            m.quantized.insert(storage_id(xb), bytes);
            let on_bytes = QuantGemmStep {
                x: xb,
                x_quantized: true,
                conv: Some(plan::ConvStep {
                    x: xb,
                    col: Some(q.xq),
                    ..c.clone()
                }),
                alt: None,
                ..q.clone()
            };
            exec_int8_gemm(p, m, &on_bytes);
            return false;
        }
        _ => {}
    }
    exec_int8_gemm(p, m, q);
    false
}

/// The int8 (fp8) GEMM path as planned: im2col, quantize, exact sum, epilogue.
fn exec_int8_gemm(p: &Plan, m: &mut Mem, q: &QuantGemmStep) {
    use isolane_engine::quant::quantize;
    let sid = |l: Loc| match l {
        Loc::Storage { id, .. } => id,
        Loc::Const { .. } => panic!("a quantized constant"),
    };
    // x as floats, or (x_quantized) the bytes its producer's epilogue left.
    let xq_in = q.x_quantized.then(|| {
        m.quantized
            .get(&sid(q.x))
            .expect("x_quantized but no producer quantized it")
            .clone()
    });
    let get = |m: &Mem, i: usize| match &xq_in {
        Some(v) => v[i] as f32,
        None => m.get(q.x, i),
    };
    let rows: Vec<f32> = match &q.conv {
        Some(c) => {
            let [n, ch, h, wd] = c.x_shape;
            let [_, _, kh, kw] = c.w_shape;
            let [_, _, oh, ow] = c.y_shape;
            let xs = s4(&c.x_shape, true);
            let mut col = Vec::with_capacity(q.m * q.k);
            for b in 0..n {
                for y0 in 0..oh {
                    for x0 in 0..ow {
                        for a in 0..kh {
                            for bb in 0..kw {
                                let ih = (y0 * c.strides[0] + a * c.dilations[0]) as isize
                                    - c.pads[0] as isize;
                                let iw = (x0 * c.strides[1] + bb * c.dilations[1]) as isize
                                    - c.pads[1] as isize;
                                for ci in 0..ch {
                                    let inside = ih >= 0
                                        && iw >= 0
                                        && (ih as usize) < h
                                        && (iw as usize) < wd;
                                    col.push(if inside {
                                        let xi = b * xs[0]
                                            + ci * xs[1]
                                            + ih as usize * xs[2]
                                            + iw as usize * xs[3];
                                        get(m, xi)
                                    } else {
                                        0.0
                                    });
                                }
                            }
                        }
                    }
                }
            }
            col
        }
        None => (0..q.m * q.k).map(|i| get(m, i)).collect(),
    };
    assert_eq!(rows.len(), q.m * q.k);
    let xid = sid(q.xq);
    if q.x_quantized {
        // Already on the grid: the im2col copied bytes (or the rows are x itself).
        assert_eq!(q.conv.is_none(), xid == sid(q.x));
        m.quantized
            .insert(xid, rows.iter().map(|&v| v as f64).collect());
    } else if q.xq_ready {
        let made = m
            .quantized
            .get(&xid)
            .expect("xq_ready but nothing quantized it");
        let again: Vec<f64> = rows
            .iter()
            .map(|&v| quantize(v, q.x_scale, 0.0, q.qtype, true) as f64)
            .collect();
        assert_eq!(made, &again, "a reused xq holds other activations");
    } else {
        let xq = rows
            .iter()
            .map(|&v| quantize(v, q.x_scale, 0.0, q.qtype, true) as f64)
            .collect();
        m.quantized.insert(xid, xq);
    }
    let xq = m.quantized[&xid].clone();
    let Loc::Const { id: wid, .. } = q.w else {
        panic!("a computed quantized weight")
    };
    assert!(
        p.repr_of(wid).is_some(),
        "the weight is stored in the activation dtype"
    );
    let w = &p.consts[wid].data;
    let acc = |r: usize, j: usize| -> f64 {
        (0..q.k)
            .map(|kk| xq[r * q.k + kk] * w[j * q.k + kk] as f64)
            .sum()
    };
    quant_epilogue(m, q, acc);
}

/// The residual of quantized product `q` at `i` as its epilogue reads it: floats, or a byte
/// times its scale in f32 (`residual_scale`).
fn residual_at(m: &Mem, q: &QuantGemmStep, i: usize) -> f32 {
    let rl = q.residual.expect("a residual");
    match q.residual_scale {
        Some(s) => residual_byte(m, q, i) * s,
        None => m.get(rl, i),
    }
}

/// Byte `i` of a residual of bytes, as its value on the grid.
fn residual_byte(m: &Mem, q: &QuantGemmStep, i: usize) -> f32 {
    let rl = q.residual.expect("a residual");
    let bytes = m
        .quantized
        .get(&storage_id(rl))
        .expect("a residual of bytes nothing made");
    assert_eq!(bytes.len(), q.m * q.n, "the residual's bytes are y's shape");
    bytes[i] as f32
}

/// The dequantizing epilogue of a quantized GEMM over the sums `acc(row, channel)`: one
/// multiply-add by the channel's scale and bias, the residual, the activation, and the
/// quantization for the next GEMMs where the step's output is bytes.
fn quant_epilogue(m: &mut Mem, q: &QuantGemmStep, acc: impl Fn(usize, usize) -> f64) {
    use isolane_engine::quant::quantize;
    let mut out = vec![0f32; q.m * q.n];
    for r in 0..q.m {
        for j in 0..q.n {
            let acc = acc(r, j);
            let mut v =
                (acc as f32).mul_add(m.get(q.scale, j), q.bias.map_or(0.0, |b| m.get(b, j)));
            if q.residual.is_some() {
                v += residual_at(m, q, r * q.n + j);
            }
            out[r * q.n + j] = act(q.act, v);
        }
    }
    match q.y_scale {
        // Quantized for the next GEMMs, as their quantize step would have.
        Some(s) => {
            let yq = out
                .iter()
                .map(|&v| quantize(v, s, 0.0, q.qtype, true) as f64)
                .collect();
            m.quantized.insert(storage_id(q.y), yq);
        }
        None => {
            for (i, v) in out.into_iter().enumerate() {
                m.set(q.y, i, v);
            }
        }
    }
}

thread_local! {
    /// Which path each emulated QuantGemm step takes, the pattern cycled over the steps in
    /// order (and the count so far): 0 its int8 GEMM, 1 cuDNN's int8 convolution where
    /// planned (else 0), 2 the float step (4: reading x unquantized, `quant_float_plain`), 3
    /// cuDNN's fused quantized graph where planned (else 0), 5 the
    /// GEMM with x quantized before its im2col where planned (else 0); the candidates of the
    /// build's timed choice.
    static QUANT_PATHS: std::cell::RefCell<(Vec<usize>, usize)> =
        const { std::cell::RefCell::new((Vec::new(), 0)) };
    /// The build options the emulated float candidate (path 2) follows, as the build's
    /// `float_launches` does (`None`: the defaults, what a QDQ file is built with).
    static QUANT_OPTIONS: std::cell::Cell<Option<isolane_cuda::BuildOptions>> =
        const { std::cell::Cell::new(None) };
}

/// The plan's output for `x` with the quantized products' paths cycling through `pattern`
/// (`QUANT_PATHS`), reset afterwards.
fn run_paths(p: &Plan, x: &[f32], pattern: &[usize]) -> Vec<f32> {
    QUANT_PATHS.with(|c| *c.borrow_mut() = (pattern.to_vec(), 0));
    let got = run(p, x);
    QUANT_PATHS.with(|c| *c.borrow_mut() = (Vec::new(), 0));
    got
}

/// A seeded random input for `q` at `batch` and the CPU backend's output for it: what the
/// emulated plans are held to.
fn cpu_reference(q: &Graph, batch: usize, seed: u64) -> (Vec<f32>, Vec<f32>) {
    let mut cpu = CpuBackend::new(1)
        .compile(q, batch, Precision::Fp32)
        .unwrap();
    let x = random(cpu.input_mut().len(), seed);
    cpu.input_mut().copy_from_slice(&x);
    cpu.run().unwrap();
    (x, cpu.output().to_vec())
}

/// The fake-quantize passes of a plan: FakeQuant steps, and input casts that apply one.
fn fake_quant_passes(p: &Plan) -> usize {
    p.steps
        .iter()
        .filter(|s| {
            matches!(
                s.kind,
                StepKind::FakeQuant(_) | StepKind::CastIn { quant: Some(_), .. }
            )
        })
        .count()
}

/// Checks that `p` computes `want` from `x` within 1e-5 with its quantized products' paths
/// cycling through each of `patterns` (`run_paths`); `what` names the case.
fn assert_paths_compute(p: &Plan, x: &[f32], want: &[f32], patterns: &[&[usize]], what: &str) {
    for pattern in patterns {
        let got = run_paths(p, x, pattern);
        let err = rel_l2(&got, want);
        assert!(err < 1e-5, "{what} paths {pattern:?}: rel L2 {err:e}");
    }
}

/// The plan's quantized product named `name`.
fn quant_gemm<'a>(p: &'a Plan, name: &str) -> &'a QuantGemmStep {
    p.steps
        .iter()
        .find_map(|s| match &s.kind {
            StepKind::QuantGemm(g) if s.name == name => Some(&**g),
            _ => None,
        })
        .unwrap_or_else(|| {
            let names: Vec<&str> = p.steps.iter().map(|s| s.name.as_str()).collect();
            panic!("{name} is no quantized GEMM: {names:?}")
        })
}

fn storage_id(l: Loc) -> usize {
    match l {
        Loc::Storage { id, .. } => id,
        Loc::Const { .. } => panic!("a quantized constant"),
    }
}

/// cuDNN's int8 convolution as planned: x quantized whole into `xb` (or the producer's
/// bytes), the NHWC convolution of those bytes with the KRSC byte filter into the
/// accumulator (int32 sums, stored as f32), the epilogue.
fn exec_quant_dnn_conv(
    p: &Plan,
    m: &mut Mem,
    q: &QuantGemmStep,
    alt: &isolane_cuda::plan::QuantAlternatives,
) {
    let sums = dnn_conv_sums(p, m, q, alt);
    // cuDNN's f32 y holds the int32 sum rounded to f32.
    quant_epilogue(m, q, |r, o| sums[r * q.n + o] as f32 as f64);
}

/// cuDNN's fused quantized graph as planned: the same sums as its int8 convolution, then its
/// f32 pointwise steps (scale, f32 bias, residual, ReLU) and, where the step's output is
/// bytes, the multiply by the inverse output scale and the conversion (`isolane_cuda::int8`'s
/// `graph_value` and `graph_requantize`): no rounding to the activation dtype between them.
fn exec_quant_graph(
    p: &Plan,
    m: &mut Mem,
    q: &QuantGemmStep,
    alt: &isolane_cuda::plan::QuantAlternatives,
) -> bool {
    use isolane_cuda::int8::{graph_requantize, graph_value};
    let g = alt.graph.as_ref().unwrap();
    let bytes_in = q.residual_scale;
    assert_eq!(
        g.y_inv.is_some(),
        q.y_scale.is_some() || bytes_in.is_some(),
        "the graph's last multiply"
    );
    assert_eq!(g.copy_inv.is_some(), q.y_copy.is_some(), "the graph's copy");
    assert_eq!(
        g.scale.is_some(),
        bytes_in.is_some(),
        "the graph's own scales"
    );
    let (relu, upper) = isolane_cuda::int8::quant_graph_act(q.act).expect("a graph's act");
    // A residual of bytes is added as read: the clip divided by its scale, as the build does.
    let upper = upper.map(|u| u / bytes_in.unwrap_or(1.0));
    let sums = dnn_conv_sums(p, m, q, alt);
    let mut out = vec![0f32; q.m * q.n];
    for r in 0..q.m {
        for j in 0..q.n {
            let i = r * q.n + j;
            let residual = match (q.residual, bytes_in) {
                (Some(_), Some(_)) => residual_byte(m, q, i),
                (Some(rl), None) => m.get(rl, i),
                (None, _) => 0.0,
            };
            // The int32 sum converted to f32 by the first pointwise step.
            let v = graph_value(
                sums[i] as i32 as f32,
                m.get(g.scale.unwrap_or(q.scale), j),
                g.bias.map_or(0.0, |b| m.get(b, j)),
                residual,
                relu,
            )
            .min(upper.unwrap_or(f32::INFINITY));
            out[i] = match (g.y_inv, q.y_scale) {
                (Some(inv), Some(_)) => graph_requantize(v, m.get(inv, j), q.qtype),
                // Floats out after a residual of bytes: scaled back by its last multiply.
                (Some(inv), None) => v * m.get(inv, j),
                (None, _) => v,
            };
        }
    }
    // The graph's second output: y (f32 inside the graph) times the inverse scale, converted.
    if let (Some((l, _)), Some(inv)) = (q.y_copy, g.copy_inv) {
        let yq = (0..q.m * q.n)
            .map(|i| graph_requantize(out[i], m.get(inv, i % q.n), q.qtype) as f64)
            .collect();
        m.quantized.insert(storage_id(l), yq);
    }
    match q.y_scale {
        Some(_) => {
            let yq = out.into_iter().map(|v| v as f64).collect();
            m.quantized.insert(storage_id(q.y), yq);
        }
        None => {
            for (i, v) in out.into_iter().enumerate() {
                m.set(q.y, i, v);
            }
        }
    }
    q.y_copy.is_some()
}

/// The exact sums `[M, N]` of cuDNN's convolution of the quantized bytes (x quantized whole
/// into `xb` first where planned so) with the KRSC byte filter.
fn dnn_conv_sums(
    p: &Plan,
    m: &mut Mem,
    q: &QuantGemmStep,
    alt: &isolane_cuda::plan::QuantAlternatives,
) -> Vec<f64> {
    use isolane_engine::quant::quantize;
    let c = alt.dnn_conv.as_ref().unwrap();
    assert_eq!(
        (c.w, c.y),
        (q.w, q.acc),
        "cuDNN's conv reads the GEMM's filter"
    );
    assert!(c.nhwc && c.col.is_none() && c.groups == 1);
    let [n, ch, h, wd] = c.x_shape;
    let [mo, cg, kh, kw] = c.w_shape;
    let [_, _, oh, ow] = c.y_shape;
    assert_eq!((cg, mo, n * oh * ow, kh * kw * ch), (ch, q.n, q.m, q.k));
    match alt.xb {
        Some(xb) => {
            assert!(!q.x_quantized && c.x == xb);
            let bytes = (0..n * h * wd * ch)
                .map(|i| quantize(m.get(q.x, i), q.x_scale, 0.0, q.qtype, true) as f64)
                .collect();
            m.quantized.insert(storage_id(xb), bytes);
        }
        // x's bytes as its producer left them, as an earlier GEMM's rows, or as a producer's
        // quantized copy (`y_copy`) that this im2col'ed convolution reads in place.
        None => assert!(
            (q.x_quantized && c.x == q.x)
                || (q.xq_ready && c.x == q.xq)
                || (q.conv.is_some() && c.x != q.xq && m.quantized.contains_key(&storage_id(c.x)))
        ),
    }
    let x = m.quantized[&storage_id(c.x)].clone();
    assert_eq!(x.len(), n * h * wd * ch);
    let Loc::Const { id: wid, .. } = c.w else {
        panic!("a computed filter")
    };
    let w = &p.consts[wid].data;
    let mut sums = vec![0f64; q.m * q.n];
    for (i, out) in sums.iter_mut().enumerate() {
        let (r, o) = (i / q.n, i % q.n);
        let (b, y0, x0) = (r / (oh * ow), (r / ow) % oh, r % ow);
        let mut s = 0f64;
        for a in 0..kh {
            for bb in 0..kw {
                let ih = (y0 * c.strides[0] + a * c.dilations[0]) as isize - c.pads[0] as isize;
                let iw = (x0 * c.strides[1] + bb * c.dilations[1]) as isize - c.pads[1] as isize;
                if ih < 0 || iw < 0 || ih as usize >= h || iw as usize >= wd {
                    continue;
                }
                for ci in 0..ch {
                    let xi = ((b * h + ih as usize) * wd + iw as usize) * ch + ci;
                    s += x[xi] * w[((o * kh + a) * kw + bb) * ch + ci] as f64;
                }
            }
        }
        *out = s;
    }
    sums
}

/// The float step as planned: x's fake-quant values (from floats, or the producer's bytes
/// dequantized), the Conv or Linear step on them, its result quantized where the step's
/// output is bytes; the shared quantized rows filled where later GEMMs read them.
fn exec_quant_float(
    p: &Plan,
    m: &mut Mem,
    q: &QuantGemmStep,
    f: &isolane_cuda::plan::QuantFloat,
    plain: bool,
) {
    use isolane_engine::quant::{dequantize, quantize};
    let plain = plain && !q.x_quantized;
    let xf: Vec<f32> = if plain {
        Vec::new()
    } else if q.x_quantized {
        let b = &m.quantized[&storage_id(q.x)];
        assert_eq!(b.len(), f.x_n);
        b.iter()
            .map(|&v| dequantize(v as f32, q.x_scale, 0.0))
            .collect()
    } else {
        (0..f.x_n)
            .map(|i| {
                let v = quantize(m.get(q.x, i), q.x_scale, 0.0, q.qtype, true);
                dequantize(v, q.x_scale, 0.0)
            })
            .collect()
    };
    if f.fills_xq {
        assert!(!q.x_quantized && q.conv.is_none() && !q.xq_ready);
        let rows = (0..q.m * q.k)
            .map(|i| quantize(m.get(q.x, i), q.x_scale, 0.0, q.qtype, true) as f64)
            .collect();
        m.quantized.insert(storage_id(q.xq), rows);
    }
    for (i, v) in xf.into_iter().enumerate() {
        m.set(f.xf, i, v);
    }
    // A residual of bytes, dequantized into the float step's own storage (after xq is filled:
    // a skip that is also the operand has its bytes there).
    if let (Some(rf), Some(s)) = (f.residual, q.residual_scale) {
        for i in 0..q.m * q.n {
            let v = dequantize(residual_byte(m, q, i), s, 0.0);
            m.set(rf, i, v);
        }
    }
    let inner = Step {
        name: "float".into(),
        kind: match plain {
            true => f.product_on(q.x),
            false => f.product.clone(),
        },
    };
    exec_step(p, m, &inner);
    match (f.yf, q.y_scale) {
        (Some(yf), Some(s)) => {
            let yq = (0..q.m * q.n)
                .map(|i| quantize(m.get(yf, i), s, 0.0, q.qtype, true) as f64)
                .collect();
            m.quantized.insert(storage_id(q.y), yq);
        }
        (None, None) => {}
        other => panic!("a float step's output and the step's disagree: {other:?}"),
    }
}

fn check(g: &Graph, batch: usize, channels_last: bool, tol: f64) {
    check_with(
        g,
        batch,
        PlanOptions {
            channels_last,
            ..Default::default()
        },
        tol,
    );
}

fn check_with(g: &Graph, batch: usize, opts: PlanOptions, tol: f64) {
    let channels_last = opts.channels_last;
    let opt = passes::optimize(g, batch).unwrap();
    let p = plan::plan_with(&opt, batch, Precision::Fp32, opts).unwrap();
    if opts.fused_attention {
        assert!(
            p.steps
                .iter()
                .any(|s| matches!(s.kind, StepKind::Attention(AttentionStep { .. }))),
            "no fused attention planned"
        );
    }
    let mut cpu = CpuBackend::new(1)
        .compile(g, batch, Precision::Fp32)
        .unwrap();
    let x = random(cpu.input_mut().len(), 9);
    cpu.input_mut().copy_from_slice(&x);
    cpu.run().unwrap();
    let got = run(&p, &x);
    let err = rel_l2(&got, cpu.output());
    assert!(
        err < tol,
        "{} batch {batch} channels_last {channels_last}: rel L2 {err:e}",
        g.name
    );
}

/// Where an attention block applies its `1/√d` scale.
#[derive(Clone, Copy)]
enum AttnScale {
    /// `(q·s)·kᵀ`, as isolane-engine's arch/vit.rs builds it.
    Query,
    /// `(q·√s)·(kᵀ·√s)`, as torch.onnx exports `scaled_dot_product_attention` (opset 14+).
    QueryAndKey,
}

/// ViT's encoder block as torchvision writes it (see isolane-engine's arch/vit.rs), small.
fn tiny_vit_block() -> Graph {
    vit_block(10, 32, 4, AttnScale::Query)
}

/// ViT's encoder block as torchvision writes it: `seq` tokens of width `h`, `heads` heads.
fn vit_block(seq: usize, h: usize, heads: usize, at: AttnScale) -> Graph {
    let hd = h / heads;
    let mut g = Graph::new("tiny_vit_block");
    let mut seed = 100;
    let mut c = |g: &mut Graph, name: &str, shape: Vec<usize>, scale: f32| {
        seed += 1;
        let n = shape.iter().product();
        let d = random(n, seed).into_iter().map(|v| v * scale).collect();
        g.add_constant(name, Tensor::new(shape, d).unwrap())
    };
    let x = g.add_input("x", vec![Dim::Batch, Dim::Fixed(seq), Dim::Fixed(h)]);
    let ln_w = c(&mut g, "ln.w", vec![h], 1.0);
    let ln_b = c(&mut g, "ln.b", vec![h], 0.1);
    let a = g
        .add_op(
            "ln",
            Op::LayerNorm {
                axis: -1,
                eps: 1e-6,
            },
            &[x, ln_w, ln_b],
        )
        .unwrap();
    let w = c(&mut g, "in_proj.w", vec![3 * h, h], 0.3);
    let b = c(&mut g, "in_proj.b", vec![3 * h], 0.1);
    let qkv = g
        .add_op("in_proj", Op::Linear { activation: None }, &[a, w, b])
        .unwrap();
    let r = g
        .add_op(
            "split_heads",
            Op::Reshape {
                shape: vec![
                    Dim::Batch,
                    Dim::Fixed(seq),
                    Dim::Fixed(3),
                    Dim::Fixed(heads),
                    Dim::Fixed(hd),
                ],
            },
            &[qkv],
        )
        .unwrap();
    let t = g
        .add_op(
            "qkv_t",
            Op::Transpose {
                perm: vec![2, 0, 3, 1, 4],
            },
            &[r],
        )
        .unwrap();
    let parts = g
        .add_node(
            "qkv",
            Op::Split {
                axis: 0,
                sizes: vec![1, 1, 1],
            },
            &[t],
        )
        .unwrap();
    let sq = |g: &mut Graph, v, n: &str| g.add_op(n, Op::Squeeze { axes: vec![0] }, &[v]).unwrap();
    let q = sq(&mut g, parts[0], "q");
    let k = sq(&mut g, parts[1], "k");
    let v = sq(&mut g, parts[2], "v");
    let s = 1.0 / (hd as f32).sqrt();
    let q_scale = match at {
        AttnScale::Query => s,
        AttnScale::QueryAndKey => s.sqrt(),
    };
    let scale = g.add_constant("scale", Tensor::scalar(q_scale));
    let q = g
        .add_op("q_scaled", Op::Binary(Binary::Mul), &[q, scale])
        .unwrap();
    let mut kt = g
        .add_op(
            "k_t",
            Op::Transpose {
                perm: vec![0, 1, 3, 2],
            },
            &[k],
        )
        .unwrap();
    if let AttnScale::QueryAndKey = at {
        let k_scale = g.add_constant("k_scale", Tensor::scalar(s.sqrt()));
        kt = g
            .add_op("k_t_scaled", Op::Binary(Binary::Mul), &[kt, k_scale])
            .unwrap();
    }
    let s = g.add_op("scores", Op::MatMul, &[q, kt]).unwrap();
    let pr = g.add_op("softmax", Op::Softmax { axis: -1 }, &[s]).unwrap();
    let o = g.add_op("context", Op::MatMul, &[pr, v]).unwrap();
    let o = g
        .add_op(
            "merge_t",
            Op::Transpose {
                perm: vec![0, 2, 1, 3],
            },
            &[o],
        )
        .unwrap();
    let o = g
        .add_op(
            "merge",
            Op::Reshape {
                shape: vec![Dim::Batch, Dim::Fixed(seq), Dim::Fixed(h)],
            },
            &[o],
        )
        .unwrap();
    let w2 = c(&mut g, "out.w", vec![h, h], 0.3);
    let b2 = c(&mut g, "out.b", vec![h], 0.1);
    let o = g
        .add_op("out_proj", Op::Linear { activation: None }, &[o, w2, b2])
        .unwrap();
    let y = g.add_op("add_1", Op::Binary(Binary::Add), &[o, x]).unwrap();
    let w3 = c(&mut g, "mlp0.w", vec![4 * h, h], 0.3);
    let b3 = c(&mut g, "mlp0.b", vec![4 * h], 0.1);
    let m = g
        .add_op("mlp0", Op::Linear { activation: None }, &[y, w3, b3])
        .unwrap();
    let m = g.add_op("gelu", Op::Unary(Unary::Gelu), &[m]).unwrap();
    let w4 = c(&mut g, "mlp3.w", vec![h, 4 * h], 0.2);
    let b4 = c(&mut g, "mlp3.b", vec![h], 0.1);
    let m = g
        .add_op("mlp3", Op::Linear { activation: None }, &[m, w4, b4])
        .unwrap();
    let out = g.add_op("add_2", Op::Binary(Binary::Add), &[y, m]).unwrap();
    g.add_output(out).unwrap();
    g
}

#[test]
fn vit_block_plan_computes_the_graph() {
    let g = tiny_vit_block();
    for batch in [1, 2, 3] {
        check(&g, batch, true, 1e-5);
    }
}

/// The fused attention step (head dim 64, the kernel's): q, k, v read in place from the QKV
/// projection, the context written straight into the merged-heads layout, at batches 1–3.
#[test]
fn vit_block_with_fused_attention_computes_the_graph() {
    for at in [AttnScale::Query, AttnScale::QueryAndKey] {
        vit_block_with_fused_attention(at);
    }
}

/// torch's scaled-dot-product export (`(q·√s)·(kᵀ·√s)`) gets the fused step too: kᵀ·√s is
/// read as k with the scale in alpha (check_with asserts an Attention step is planned).
fn vit_block_with_fused_attention(at: AttnScale) {
    let g = vit_block(10, 128, 2, at);
    for batch in [1, 2, 3] {
        check_with(
            &g,
            batch,
            PlanOptions {
                channels_last: true,
                fused_attention: true,
            },
            1e-5,
        );
    }
}

/// torch.onnx's scaled-dot-product export scales q and kᵀ by √s each before their MatMul;
/// both scalings fold into the matmul's alpha, each once (issue 12: the scale of kᵀ was
/// counted twice, so every imported ViT's attention was too flat on cuda).
#[test]
fn attention_scaled_on_both_operands_computes_the_graph() {
    let g = vit_block(10, 32, 4, AttnScale::QueryAndKey);
    for batch in [1, 2] {
        check(&g, batch, true, 1e-5);
    }
}

/// A fixture of tests/data (made by make_torch_fixtures.py with the real PyTorch exporter):
/// its plan against the CPU backend at `batches` (channels-last and not), and against
/// onnxruntime's output on the fixture's own input.
fn check_torch_fixture(name: &str, batches: &[usize]) {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/");
    let g = isolane_engine::onnx::import_file(format!("{dir}{name}.onnx")).unwrap();
    for &batch in batches {
        check(&g, batch, true, 1e-5);
        check(&g, batch, false, 1e-5);
    }
    if g.nodes.iter().any(|n| matches!(n.op, Op::Softmax { .. })) {
        // Attention with the kernel's head dim: planned as the fused step (asserted).
        check_with(
            &g,
            2,
            PlanOptions {
                channels_last: true,
                fused_attention: true,
            },
            1e-5,
        );
    }
    let x = isolane_engine::io::read_npy(format!("{dir}{name}.input.npy")).unwrap();
    let want = isolane_engine::io::read_npy(format!("{dir}{name}.output.npy")).unwrap();
    let batch = x.shape[0];
    let opt = passes::optimize(&g, batch).unwrap();
    let p = plan::plan(&opt, batch, Precision::Fp32).unwrap();
    let err = rel_l2(&run(&p, &x.data), &want.data);
    assert!(err < 1e-5, "{name}: plan vs onnxruntime: rel L2 {err:e}");
}

/// A torchvision VisionTransformer (1 layer, 2 heads, image 32, patch 8) exported by
/// `torch.onnx.export(dynamo=False, opset_version=17)`: the graph as a user's ViT reaches the
/// cuda backend (issue 12).
#[test]
fn torch_exported_vit_plan_computes_the_graph() {
    check_torch_fixture("torch_vit_l1_h2_i32_p8_op17", &[1, 2, 3]);
}

/// A torchvision DenseNet as exported by torch: BatchNormalizations of concatenated features
/// follow no convolution and are planned as one per-channel scale-and-shift pass (NHWC and
/// NCHW).
#[test]
fn torch_exported_densenet_plan_computes_the_graph() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/");
    let g =
        isolane_engine::onnx::import_file(format!("{dir}torch_densenet_tiny_op17.onnx")).unwrap();
    let opt = passes::optimize(&g, 1).unwrap();
    let standalone = opt
        .nodes
        .iter()
        .filter(|n| matches!(n.op, Op::BatchNorm { .. }))
        .count();
    assert!(
        standalone >= 4,
        "{standalone} standalone BatchNorms after the passes"
    );
    check_torch_fixture("torch_densenet_tiny_op17", &[1, 2]);
}

#[test]
fn mobilenet_v2_plan_computes_the_graph() {
    let g = build_model("mobilenet_v2", Weights::Synthetic { seed: 5 }).unwrap();
    check(&g, 1, true, 1e-4);
}

#[test]
#[ignore = "slow in debug builds (naive convolutions of the whole network)"]
fn resnet18_and_nchw_plans_compute_the_graph() {
    let g = build_model("resnet18", Weights::Synthetic { seed: 5 }).unwrap();
    check(&g, 1, true, 1e-4);
    let g = build_model("mobilenet_v2", Weights::Synthetic { seed: 5 }).unwrap();
    check(&g, 1, false, 1e-4);
}

#[test]
fn resize_plans_compute_the_graph_in_every_mode() {
    for r in common::resize_cases() {
        for channels_last in [true, false] {
            check(&common::resize_graph(r.clone()), 2, channels_last, 1e-5);
        }
    }
}

/// The fixture's optimised graph (what the plan is made from) and its fp32 plan.
fn fixture_plan(name: &str, batch: usize, opts: PlanOptions) -> (Graph, Graph, Plan) {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/");
    let g = isolane_engine::onnx::import_file(format!("{dir}{name}.onnx")).unwrap();
    let opt = passes::optimize(&g, batch).unwrap();
    let p = plan::plan_with(&opt, batch, Precision::Fp32, opts).unwrap();
    (g, opt, p)
}

/// The plan check's step-by-step comparison of the emulated plan `p` of `opt` with the
/// reference evaluator (tolerance 1e-5), on the check's input of `seed`.
fn emulated_divergence(
    opt: &Graph,
    p: &Plan,
    batch: usize,
    seed: u64,
) -> isolane_cuda::check::Divergence {
    let n: usize = p.inputs[0].shape.iter().product();
    let inputs = vec![isolane_cuda::check::check_input(n, seed)];
    let mut emulator = Emulator::new(p);
    isolane_cuda::check::locate_divergence(opt, p, batch, &inputs, &mut emulator, 1e-5)
        .unwrap()
        .unwrap()
}

/// Every value the plan stores, read where its probe says right after the steps that compute
/// it, equals the reference evaluator's value of the same node: the plan check's comparison
/// of intermediate values has no false alarm (views, strided and NHWC values, values scaled
/// by a folded alpha, the fused attention's context, a Linear whose output became a residual
/// sum).
#[test]
fn every_probed_value_matches_the_reference() {
    let cases: Vec<(String, Graph, usize, PlanOptions)> = vec![
        (
            "vit fixture".into(),
            fixture_plan("torch_vit_l1_h2_i32_p8_op17", 2, PlanOptions::default()).0,
            2,
            PlanOptions::default(),
        ),
        (
            "densenet fixture nchw".into(),
            fixture_plan("torch_densenet_tiny_op17", 2, PlanOptions::default()).0,
            2,
            PlanOptions {
                channels_last: false,
                fused_attention: false,
            },
        ),
        (
            "densenet fixture nhwc".into(),
            fixture_plan("torch_densenet_tiny_op17", 1, PlanOptions::default()).0,
            1,
            PlanOptions::default(),
        ),
        (
            "vit block, fused attention".into(),
            vit_block(10, 128, 2, AttnScale::Query),
            2,
            PlanOptions {
                channels_last: true,
                fused_attention: true,
            },
        ),
        (
            "vit fixture, fused attention".into(),
            fixture_plan("torch_vit_l1_h2_i32_p8_op17", 2, PlanOptions::default()).0,
            2,
            PlanOptions {
                channels_last: true,
                fused_attention: true,
            },
        ),
        (
            "vit block, batch 1".into(),
            tiny_vit_block(),
            1,
            PlanOptions::default(),
        ),
    ];
    for (what, g, batch, opts) in cases {
        let opt = passes::optimize(&g, batch).unwrap();
        let p = plan::plan_with(&opt, batch, Precision::Fp32, opts).unwrap();
        let computing = opt.nodes.len();
        assert!(
            p.probes.len() * 2 >= computing,
            "{what}: {} probes for {computing} nodes",
            p.probes.len()
        );
        let d = emulated_divergence(&opt, &p, batch, 1);
        assert!(!d.exceeds, "{what}: {d:?}");
    }
}

/// The plan check on a right plan passes; on a plan corrupted by the test hook (one node's
/// stored output negated) it fails and names that node and its op, wherever the node is.
#[test]
fn plan_check_names_the_node_of_a_wrong_plan() {
    let batch = 2;
    let (g, opt, p) = fixture_plan("torch_vit_l1_h2_i32_p8_op17", batch, PlanOptions::default());
    let r = isolane_cuda::check::check_plan(&g, &opt, &p, batch, &mut Emulator::new(&p)).unwrap();
    assert!(r.rel_l2 < 1e-5, "{r:?}");
    assert_eq!(r.tolerance, 1e-4);
    let first = |pred: &dyn Fn(&Op) -> bool| {
        opt.nodes
            .iter()
            .find(|n| pred(&n.op))
            .map(|n| (n.name.clone(), n.op.name()))
            .unwrap()
    };
    let last = opt.nodes.last().unwrap();
    let victims = [
        first(&|op| matches!(op, Op::LayerNorm { .. })),
        first(&|op| matches!(op, Op::MatMul)),
        first(&|op| matches!(op, Op::Softmax { .. })),
        (last.name.clone(), last.op.name()),
    ];
    for (node, op) in victims {
        let mut bad = p.clone();
        assert!(plan::corrupt_node(&mut bad.clone(), "no such node").is_err());
        plan::corrupt_node(&mut bad, &node).unwrap();
        // At bf16's rules too: the model's sensitivity to rounding does not excuse the error.
        for precision in [Precision::Fp32, Precision::Bf16] {
            bad.precision = precision;
            let e =
                isolane_cuda::check::check_plan(&g, &opt, &bad, batch, &mut Emulator::new(&bad))
                    .unwrap_err()
                    .to_string();
            println!("{e}");
            assert!(
                e.contains(&format!(
                    "first node whose output diverges is `{node}` ({op})"
                )),
                "{node} {precision}: {e}"
            );
            // The failure names the steps that computed the node (what a rebuild may change):
            // the node's own step and, last, the hook's negation after it.
            let f =
                isolane_cuda::check::check_plan_at(&g, &opt, &bad, batch, &mut Emulator::new(&bad))
                    .unwrap_err();
            let steps = f.steps.expect("the diverging node's steps");
            let own = bad.steps.iter().rposition(|s| s.name == node).unwrap();
            let hook = steps.end - 1;
            // From the steps run for the value compared before it (none before the first).
            let ready = bad.probes.iter().find(|pr| pr.node == node).unwrap().ready;
            let before = bad
                .probes
                .iter()
                .map(|pr| pr.ready)
                .filter(|&r| r < ready)
                .max();
            assert_eq!(steps.start, before.unwrap_or(0), "{node}: {steps:?}");
            assert!(
                steps.contains(&own) && bad.steps[hook].name.starts_with(&format!("{node} (")),
                "{node}: {steps:?} ({own})"
            );
        }
    }
}

/// The engine's fixtures from the real PyTorch exporters (tools/fixtures/make_torch_fixtures.py,
/// every `torch_*.onnx` there): e.g. a ViT at opset 14 (LayerNorm decomposed into
/// ReduceMean/Sub/Pow/Sqrt/Div) and 17, a ConvNeXt (permutes around its LayerNorms, layer
/// scale), a slim MobileNetV2, and whatever the default (dynamo) exporter's fixtures add: their
/// cuda plans against the CPU backend, NHWC and NCHW, batches 1 and 2, and every stored value
/// against the reference evaluator.
#[test]
fn engine_torch_fixtures_plan_right() {
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../isolane-engine/tests/fixtures/onnx/"
    );
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            let f = e.ok()?.file_name().into_string().ok()?;
            let stem = f.strip_suffix(".onnx")?;
            stem.starts_with("torch_").then(|| stem.to_string())
        })
        .collect();
    names.sort();
    assert!(names.len() >= 4, "torch fixtures: {names:?}");
    for name in names {
        let g = isolane_engine::onnx::import_file(format!("{dir}{name}.onnx")).unwrap();
        for batch in [1, 2] {
            check(&g, batch, true, 1e-5);
            check(&g, batch, false, 1e-5);
            let opt = passes::optimize(&g, batch).unwrap();
            let p = plan::plan(&opt, batch, Precision::Fp32).unwrap();
            let d = emulated_divergence(&opt, &p, batch, 2);
            assert!(!d.exceeds, "{name} batch {batch}: {d:?}");
        }
    }
}

/// A transpose of a transpose, as PyTorch 2.11's default (dynamo) exporter writes kᵀ of its
/// scaled-dot-product attention (`[S, BH, d]` → `[BH, S, d]` → `[BH, d, S]`, then a reshape):
/// the first is a strided view (its only user reads strides), the second is copied and must
/// read its input through those strides (issue 12: it read them as contiguous).
#[test]
fn transpose_of_a_strided_transpose_computes_the_graph() {
    let mut g = Graph::new("transpose_of_transpose");
    let x = g.add_input("x", vec![Dim::Batch, Dim::Fixed(5), Dim::Fixed(4)]);
    let t1 = g
        .add_op(
            "t1",
            Op::Transpose {
                perm: vec![1, 0, 2],
            },
            &[x],
        )
        .unwrap();
    let t2 = g
        .add_op(
            "t2",
            Op::Transpose {
                perm: vec![0, 2, 1],
            },
            &[t1],
        )
        .unwrap();
    let r = g
        .add_op(
            "r",
            Op::Reshape {
                shape: vec![Dim::Fixed(5), Dim::Fixed(4), Dim::Batch],
            },
            &[t2],
        )
        .unwrap();
    let w = g.add_constant("w", Tensor::new(vec![5, 4, 1], random(20, 3)).unwrap());
    let y = g.add_op("y", Op::Binary(Binary::Add), &[r, w]).unwrap();
    g.add_output(y).unwrap();
    for batch in [2, 3] {
        check(&g, batch, true, 1e-6);
    }
}

#[test]
fn every_reduce_kind_over_trailing_axes_computes_the_graph() {
    let kinds = [
        ReduceKind::Mean,
        ReduceKind::Sum,
        ReduceKind::Max,
        ReduceKind::Min,
        ReduceKind::L1,
        ReduceKind::SumSquare,
        ReduceKind::L2,
    ];
    for kind in kinds {
        for keepdims in [true, false] {
            check(
                &reduce_graph(kind, &[6, 5], &[-1], keepdims, false),
                2,
                true,
                1e-6,
            );
            check(
                &reduce_graph(kind, &[3, 4, 5], &[2, 3], keepdims, false),
                2,
                true,
                1e-6,
            );
        }
    }
}

#[test]
fn reduce_l2_as_imported_computes_the_graph() {
    for keepdims in [true, false] {
        let g = reduce_graph(ReduceKind::Sum, &[6, 5], &[-1], keepdims, true);
        check(&g, 2, true, 1e-6);
    }
}

/// levit's and mixer's ReduceMean over the tokens of `[B, N, C]`, and other non-trailing sets.
#[test]
fn reduce_over_non_trailing_axes_computes_the_graph() {
    let cases: [(&[usize], &[i64]); 4] = [
        (&[6, 5], &[1]),
        (&[6, 5], &[0, 1]),
        (&[3, 4, 5], &[1, 3]),
        (&[3, 4, 5], &[0, 2]),
    ];
    for (dims, axes) in cases {
        for keepdims in [true, false] {
            for kind in [ReduceKind::Mean, ReduceKind::Max] {
                for cl in [true, false] {
                    check(
                        &reduce_graph(kind, dims, axes, keepdims, false),
                        2,
                        cl,
                        1e-6,
                    );
                }
            }
            let l2 = reduce_graph(ReduceKind::Sum, dims, axes, keepdims, true);
            check(&l2, 3, true, 1e-6);
        }
    }
}

/// tf_efficientnet's SAME_UPPER padding exports as `[0, 0, 1, 1]`: padded explicitly first.
#[test]
fn asymmetric_conv_padding_computes_the_graph() {
    for (pads, strides, groups) in common::asymmetric_conv_cases() {
        for cl in [true, false] {
            check(&common::conv_graph(pads, strides, groups), 2, cl, 1e-5);
        }
    }
}

/// A device whose every value beyond `limit` in magnitude becomes `beyond`: infinite, as fp16's
/// do past 65504 (the plan check must call that an overflow of the precision's range, not a
/// wrong plan), or NaN (which it must not).
struct Overflowing<'p> {
    inner: Emulator<'p>,
    limit: f32,
    beyond: f32,
}

impl Overflowing<'_> {
    fn clip(&self, v: Vec<f32>) -> Vec<f32> {
        v.into_iter()
            .map(|x| if x.abs() > self.limit { self.beyond } else { x })
            .collect()
    }
}

impl isolane_cuda::check::StepRunner for Overflowing<'_> {
    fn run_plan(&mut self, inputs: &[Vec<f32>]) -> isolane_engine::Result<Vec<Vec<f32>>> {
        let out = self.inner.run_plan(inputs)?;
        Ok(out.into_iter().map(|o| self.clip(o)).collect())
    }
    fn write_inputs(&mut self, inputs: &[Vec<f32>]) -> isolane_engine::Result<()> {
        self.inner.write_inputs(inputs)
    }
    fn run_steps(&mut self, from: usize, to: usize) -> isolane_engine::Result<()> {
        self.inner.run_steps(from, to)
    }
    fn read(&mut self, loc: Loc, len: usize) -> isolane_engine::Result<Vec<f32>> {
        let v = self.inner.read(loc, len)?;
        Ok(self.clip(v))
    }
}

/// A device whose kernel of one step computes other bits: right after step `at` it moves
/// the first element of the value at `loc` by one unit in the last place, as a kernel that
/// sums in another order would.
struct OneUlpOff<'p> {
    inner: Emulator<'p>,
    at: usize,
    loc: Loc,
}

impl isolane_cuda::check::StepRunner for OneUlpOff<'_> {
    fn run_plan(&mut self, inputs: &[Vec<f32>]) -> isolane_engine::Result<Vec<Vec<f32>>> {
        self.write_inputs(inputs)?;
        self.run_steps(0, self.inner.p.steps.len())?;
        Ok((0..self.inner.p.outputs.len())
            .map(|k| self.inner.output(k))
            .collect())
    }
    fn write_inputs(&mut self, inputs: &[Vec<f32>]) -> isolane_engine::Result<()> {
        self.inner.write_inputs(inputs)
    }
    fn run_steps(&mut self, from: usize, to: usize) -> isolane_engine::Result<()> {
        for s in from..to {
            self.inner.run_steps(s, s + 1)?;
            if s == self.at {
                let v = self.inner.m.get(self.loc, 0);
                self.inner
                    .m
                    .set(self.loc, 0, f32::from_bits(v.to_bits() ^ 1));
            }
        }
        Ok(())
    }
    fn read(&mut self, loc: Loc, len: usize) -> isolane_engine::Result<Vec<f32>> {
        self.inner.read(loc, len)
    }
}

/// A saved plan keeps the bits of every value it stores, so that a load computing other bits
/// names the node whose kernel changed them: two runs of one plan give the same bits at every
/// value; a kernel one ulp off in one step is named, and every value before it keeps its bits.
#[test]
fn the_first_value_with_other_bits_names_its_node() {
    use isolane_cuda::check::{check_input, first_other_value, value_bits};
    let (_, _, p) = fixture_plan("torch_vit_l1_h2_i32_p8_op17", 1, PlanOptions::default());
    let n: usize = p.inputs[0].shape.iter().product();
    let inputs = vec![check_input(n, 3)];
    let built = value_bits(&p.probes, &inputs, &mut Emulator::new(&p)).unwrap();
    assert_eq!(built.len(), p.probes.len());
    let again = value_bits(&p.probes, &inputs, &mut Emulator::new(&p)).unwrap();
    assert_eq!(built, again);
    assert!(first_other_value(&built, &again, &p.probes).contains("every stored value"));
    // A value in the middle whose step completes it alone.
    let j = (p.probes.len() / 2..p.probes.len())
        .find(|&j| p.probes[j - 1].ready < p.probes[j].ready)
        .expect("a probe completed by a step of its own");
    let mut off = OneUlpOff {
        inner: Emulator::new(&p),
        at: p.probes[j].ready - 1,
        loc: p.probes[j].loc,
    };
    let here = value_bits(&p.probes, &inputs, &mut off).unwrap();
    assert_eq!(built[..j], here[..j], "values before the changed step");
    assert_ne!(built[j], here[j]);
    let said = first_other_value(&built, &here, &p.probes);
    assert!(
        said.contains(&format!("`{}` ({})", p.probes[j].node, p.probes[j].op))
            && said.contains(&format!("value {} of {}", j + 1, p.probes.len())),
        "{said}"
    );
    assert!(first_other_value(&[], &here, &p.probes).contains("keeps no value"));
    assert!(first_other_value(&built[..j], &here, &p.probes).contains("no node can be named"));
}

#[test]
fn plan_check_calls_an_fp16_overflow_by_its_name() {
    let batch = 1;
    let (g, opt, p) = fixture_plan("torch_vit_l1_h2_i32_p8_op17", batch, PlanOptions::default());
    // The same values with fp16's tolerance and range rules: the emulator computes in f32.
    let mut p16 = p.clone();
    p16.precision = Precision::Fp16;
    let mut dev = Overflowing {
        inner: Emulator::new(&p16),
        limit: 2.0,
        beyond: f32::INFINITY,
    };
    let e = isolane_cuda::check::check_plan(&g, &opt, &p16, batch, &mut dev)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("exceed fp16's range") && e.contains("bf16"),
        "{e}"
    );
    assert!(
        e.contains("is infinite where the CPU reference's reaches"),
        "{e}"
    );
    // A NaN is no overflow (a 0/0 is a fault of the plan): the plain message, node named.
    let mut dev = Overflowing {
        inner: Emulator::new(&p16),
        limit: 2.0,
        beyond: f32::NAN,
    };
    let e = isolane_cuda::check::check_plan(&g, &opt, &p16, batch, &mut dev)
        .unwrap_err()
        .to_string();
    assert!(!e.contains("exceed fp16's range"), "{e}");
    assert!(e.contains("the first node whose output diverges is"), "{e}");
}

/// A model whose output is a small difference of two large products: rounding its weights to
/// bf16 moves the output by tens of percent, on any GPU.
fn cancelling_products() -> Graph {
    let mut g = Graph::new("cancelling_products");
    let x = g.add_input("x", vec![Dim::Batch, Dim::Fixed(64)]);
    let w = random(64 * 64, 41);
    // The second weights differ from the first by 2^-9 relative: less than bf16's rounding.
    let w2: Vec<f32> = w
        .iter()
        .zip(random(64 * 64, 42))
        .map(|(a, r)| a * (1.0 + r * 2f32.powi(-9)))
        .collect();
    let w1 = g.add_constant("w1", Tensor::new(vec![64, 64], w).unwrap());
    let w2 = g.add_constant("w2", Tensor::new(vec![64, 64], w2).unwrap());
    let a = g.add_op("a", Op::MatMul, &[x, w1]).unwrap();
    let b = g.add_op("b", Op::MatMul, &[x, w2]).unwrap();
    let y = g.add_op("y", Op::Binary(Binary::Sub), &[a, b]).unwrap();
    g.add_output(y).unwrap();
    g
}

/// The plan check holds a model that sensitive to a wider limit: a plan that rounds its
/// weights as the GPU does (bf16) passes, with the sensitivity reported; at fp32 nothing is
/// widened (the same rounded plan is refused); an unrounded plan passes at the plain limit.
#[test]
fn plan_check_widens_its_limit_for_a_model_sensitive_to_rounding() {
    use isolane_cuda::check::{check_plan, mantissa_bits, round_mantissa, tolerance};
    let batch = 2;
    let g = cancelling_products();
    let opt = passes::optimize(&g, batch).unwrap();
    // An f32 plan held to bf16's rules (the emulator computes in f32), as in the overflow test.
    let mut p = plan::plan_with(&opt, batch, Precision::Fp32, PlanOptions::default()).unwrap();
    p.precision = Precision::Bf16;
    let exact = check_plan(&g, &opt, &p, batch, &mut Emulator::new(&p)).unwrap();
    assert!(
        exact.rel_l2 < 1e-5 && exact.sensitivity.is_none(),
        "{exact:?}"
    );
    let bits = mantissa_bits(Precision::Bf16);
    for c in &mut p.consts {
        let mut t = c.as_ref().clone();
        t.data
            .iter_mut()
            .for_each(|v| *v = round_mantissa(*v, bits));
        *c = std::sync::Arc::new(t);
    }
    let r = check_plan(&g, &opt, &p, batch, &mut Emulator::new(&p)).unwrap();
    let s = r.sensitivity.expect("the limit was widened");
    assert!(r.rel_l2 > tolerance(Precision::Bf16), "{r:?}");
    assert!(
        s > 0.1 && r.tolerance == 3.0 * s && r.rel_l2 <= r.tolerance,
        "{r:?}"
    );
    p.precision = Precision::Fp32;
    let e = check_plan(&g, &opt, &p, batch, &mut Emulator::new(&p))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("plan check failed") && !e.contains("widened"),
        "{e}"
    );
}

/// The shapes of the GPU test `session14_kernels_match_the_cpu_backend`
/// (`common::session14_graphs`): their plans compute the graph, NHWC and NCHW, batches 1 and 3.
#[test]
fn session14_kernel_shapes_plan_right() {
    let graphs = common::session14_graphs();
    for g in &graphs {
        for batch in [1, 3] {
            for channels_last in [true, false] {
                check(g, batch, channels_last, 1e-5);
            }
        }
    }
}

/// QDQ models (isolane-engine's fixtures, from onnxruntime) plan into `fake_quant` steps that
/// compute what onnxruntime does: the Q → DQ pairs on the input bit for bit (int8, uint8,
/// int16, float8; per tensor and per axis), onnxruntime's `quantize_static` models as the CPU
/// backend does (docs/onnx.md); in both layouts.
#[test]
fn fake_quant_plans_compute_qdq_models() {
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../isolane-engine/tests/fixtures/onnx/qdq/"
    );
    for name in [
        "exact_int8_per_tensor_op13",
        "exact_uint8_per_axis_op13",
        "exact_int16_per_axis_op21",
        "exact_fp8_e4m3fn_saturate1_op19",
        "exact_fp8_e4m3fn_per_axis_op21",
        "static_cnn_s8s8_per_channel",
        "static_cnn_u8s8_per_tensor",
        "static_mlp_u8s8_per_channel",
    ] {
        let g = isolane_engine::onnx::import_file(format!("{dir}{name}.onnx")).unwrap();
        let x = isolane_engine::io::read_npy(format!("{dir}{name}.input.npy")).unwrap();
        let want = isolane_engine::io::read_npy(format!("{dir}{name}.output.npy")).unwrap();
        let batch = x.shape[0];
        let opt = passes::optimize(&g, batch).unwrap();
        for channels_last in [true, false] {
            let opts = PlanOptions {
                channels_last,
                ..Default::default()
            };
            let p = plan::plan_with(&opt, batch, Precision::Fp32, opts).unwrap();
            assert!(
                p.steps
                    .iter()
                    .any(|s| matches!(s.kind, StepKind::FakeQuant(_))),
                "{name}: no fake_quant step"
            );
            let got = run(&p, &x.data);
            if name.starts_with("exact_") {
                let bad = got
                    .iter()
                    .zip(&want.data)
                    .filter(|(a, b)| a.to_bits() != b.to_bits())
                    .count();
                assert_eq!(bad, 0, "{name} channels_last {channels_last}");
            } else {
                let err = rel_l2(&got, &want.data);
                assert!(err < 1e-2, "{name} channels_last {channels_last}: {err:e}");
            }
        }
    }
}

/// A per-channel FakeQuant of a convolution's output, which the channels-last plan keeps
/// NHWC (the channel is then the innermost index), computes the graph in both layouts.
#[test]
fn per_channel_fake_quant_of_an_nhwc_value_computes_the_graph() {
    use isolane_engine::quant::{FakeQuantAttrs, Granularity, QuantType};
    let mut g = Graph::new("conv_fake_quant_conv");
    let x = g.add_input(
        "x",
        vec![Dim::Batch, Dim::Fixed(3), Dim::Fixed(6), Dim::Fixed(6)],
    );
    let w1 = g.add_constant(
        "w1",
        Tensor::new(vec![4, 3, 3, 3], random(108, 31)).unwrap(),
    );
    let w2 = g.add_constant("w2", Tensor::new(vec![2, 4, 1, 1], random(8, 32)).unwrap());
    let conv = |pads| {
        Op::Conv(ConvAttrs {
            pads,
            ..Default::default()
        })
    };
    let c1 = g.add_op("c1", conv([1; 4]), &[x, w1]).unwrap();
    let fq = Op::FakeQuant(FakeQuantAttrs {
        qtype: QuantType::Int8,
        saturate: true,
        granularity: Granularity::PerAxis { axis: 1 },
        scales: vec![0.05, 0.1, 0.2, 0.4],
        zero_points: vec![0.0, 1.0, -2.0, 3.0],
    });
    let q = g.add_op("q", fq, &[c1]).unwrap();
    let y = g.add_op("c2", conv([0; 4]), &[q, w2]).unwrap();
    g.add_output(y).unwrap();
    check(&g, 2, true, 1e-5);
    check(&g, 2, false, 1e-5);
}

/// The engine's ONNX fixtures of the forms imported as other ops (opsets 7–12, Tile, 3-D
/// Conv and pooling, training-mode BatchNormalization over a weight): their plans (NHWC and
/// NCHW) against the CPU backend, and the NHWC plan against the fixture's expected output
/// (onnxruntime's; the ONNX reference evaluator's for the training-mode BatchNormalization).
#[test]
fn older_opsets_tile_and_3d_window_plans_compute_the_graph() {
    // An even-sized LRN imports as an average pool whose pads differ before and after with the
    // padding counted, which pool2d cannot divide right at the far edge: refused, not wrong.
    let even = isolane_engine::onnx::import_file(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../isolane-engine/tests/fixtures/onnx/lrn_even_size_defaults_op13.onnx"
    ))
    .unwrap();
    let opt = passes::optimize(&even, 2).unwrap();
    let err = plan::plan(&opt, 2, Precision::Fp32)
        .unwrap_err()
        .to_string();
    assert!(err.contains("asymmetric pads"), "{err}");
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../isolane-engine/tests/fixtures/onnx/"
    );
    for name in [
        "tiny_cnn_op7",
        "softmax_coerced_op11",
        "upsample_linear_op8",
        "resize10_nearest_down_op10",
        "batchnorm_spatial0_op7",
        "clip_attrs_op9",
        "pad_attrs_op10",
        "tile_op13",
        "tile_batch_op11",
        "tile_by_batch_op13",
        "bn_training_weight_std_op15",
        "conv3d_basic_op13",
        "conv3d_stride_groups_op11",
        "maxpool3d_ceil_op12",
        "avgpool3d_exclude_pad_ceil_op11",
        "global_avgpool_5d_op13",
        "lrn_op7",
        "prelu_channel_op7",
        "prelu_scalar_last_axis_op16",
    ] {
        let g = isolane_engine::onnx::import_file(format!("{dir}{name}.onnx")).unwrap();
        let x = isolane_engine::io::read_npy(format!("{dir}{name}.input.npy")).unwrap();
        let want = isolane_engine::io::read_npy(format!("{dir}{name}.output.npy")).unwrap();
        let batch = x.shape[0];
        check(&g, batch, true, 1e-5);
        check(&g, batch, false, 1e-5);
        let opt = passes::optimize(&g, batch).unwrap();
        let p = plan::plan(&opt, batch, Precision::Fp32).unwrap();
        let err = rel_l2(&run(&p, &x.data), &want.data);
        assert!(
            err < 1e-5,
            "{name}: plan vs the expected output: rel L2 {err:e}"
        );
    }
}

/// A Gemm of any form (a transposed or computed operand, alpha, beta, a full-shape C) and a
/// Slice walking an axis backwards plan on cuda: the passes rewrite them into products,
/// broadcasts and Gathers first (`isolane_engine::decompose`).
#[test]
fn general_gemm_and_reversing_slice_plans_compute_the_graph() {
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../isolane-engine/tests/fixtures/onnx/"
    );
    for name in [
        "gemm_plain_op13",
        "gemm_transa_op13",
        "gemm_transab_noc_op13",
        "gemm_transb_alpha_beta_op13",
        "slice_steps_op13",
    ] {
        let g = isolane_engine::onnx::import_file(format!("{dir}{name}.onnx")).unwrap();
        let x = isolane_engine::io::read_npy(format!("{dir}{name}.input.npy")).unwrap();
        let want = isolane_engine::io::read_npy(format!("{dir}{name}.output.npy")).unwrap();
        let batch = x.shape[0];
        check(&g, batch, true, 1e-5);
        check(&g, batch, false, 1e-5);
        let opt = passes::optimize(&g, batch).unwrap();
        let p = plan::plan(&opt, batch, Precision::Fp32).unwrap();
        let err = rel_l2(&run(&p, &x.data), &want.data);
        assert!(
            err < 1e-5,
            "{name}: plan vs onnxruntime's output: rel L2 {err:e}"
        );
    }
}

/// The ops of the models users export that Run 12 found refused (session 25), imported as
/// ops cuda plans: Col2Im (MobileViTV2) as reshapes and a transpose, a cubic Resize of a
/// runtime tensor (CrossViT) as two products by constant matrices, LSTM (Sequencer2D), GRU
/// and RNN unrolled into products, Splits, activations and elementwise updates, a ConstantOfShape of a
/// batch-dependent shape as an Expand, DETR's pixel mask folded at import. Each plans, its
/// emulated plan matches the CPU backend (NHWC and NCHW) and the fixture's expected output
/// (onnxruntime's, or the onnx reference evaluator's for LSTM's layout 1).
#[test]
fn user_export_ops_plan_and_compute_the_graph() {
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../isolane-engine/tests/fixtures/onnx/"
    );
    for name in [
        "col2im_blocks_op18",
        "col2im_pads_op18",
        "resize_cubic_runtime_scales_op13",
        "resize_cubic_runtime_sizes_op18",
        "lstm_forward_op14",
        "lstm_bidirectional_layout1_states_peepholes_op14",
        "lstm_reverse_clip_relu_yh_op14",
        "lstm_classic_zero_states_op17",
        "gru_linear_before_reset_op14",
        "gru_bidirectional_states_clip_op14",
        "rnn_forward_op14",
        "rnn_reverse_relu_state_op14",
        "mask_resize_cast_gathernd_op17",
        "conv_transpose_k4s2p1_op17",
        "conv_transpose_k3s2_outpad_op17",
        "conv_transpose_groups_dilation_op13",
    ] {
        let g = isolane_engine::onnx::import_file(format!("{dir}{name}.onnx")).unwrap();
        let x = isolane_engine::io::read_npy(format!("{dir}{name}.input.npy")).unwrap();
        let want = isolane_engine::io::read_npy(format!("{dir}{name}.output.npy")).unwrap();
        let batch = x.shape[0];
        check(&g, batch, true, 1e-5);
        check(&g, batch, false, 1e-5);
        let opt = passes::optimize(&g, batch).unwrap();
        let p = plan::plan(&opt, batch, Precision::Fp32).unwrap();
        let err = rel_l2(&run(&p, &x.data), &want.data);
        assert!(
            err < 1e-5,
            "{name}: plan vs the expected output: rel L2 {err:e}"
        );
    }
}

/// A model file of one's own through the cuda plan, on the CPU: `ISOLANE_EMULATE_MODEL`
/// (an .onnx), `ISOLANE_EMULATE_INPUT` (its input, .npy, the batch its dimension 0) and
/// `ISOLANE_EMULATE_EXPECT` (the expected first output, e.g. onnxruntime's, .npy). Imports,
/// plans at fp32 (NHWC), runs the plan in the emulator and asserts rel L2 < 1e-4 (what
/// docs/conformance.md's Run 13 ran for the Hugging Face and timm exports). Slow in debug.
#[test]
#[ignore = "needs ISOLANE_EMULATE_MODEL, _INPUT and _EXPECT; slow in debug builds"]
fn a_model_file_plans_and_computes_its_expected_output() {
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} is not set"));
    let model = var("ISOLANE_EMULATE_MODEL");
    let g = isolane_engine::onnx::import_file(&model).unwrap();
    let x = isolane_engine::io::read_npy(var("ISOLANE_EMULATE_INPUT")).unwrap();
    let want = isolane_engine::io::read_npy(var("ISOLANE_EMULATE_EXPECT")).unwrap();
    let batch = x.shape[0];
    let opt = passes::optimize(&g, batch).unwrap();
    let p = plan::plan(&opt, batch, Precision::Fp32).unwrap();
    let got = run(&p, &x.data);
    assert_eq!(got.len(), want.data.len(), "{model}: output size");
    let err = rel_l2(&got, &want.data);
    println!(
        "{model}: {} plan steps, emulated plan vs expected: rel L2 {err:.2e}",
        p.steps.len()
    );
    assert!(err < 1e-4, "{model}: rel L2 {err:e}");
}

/// The quantized graph of [`common::quant_cnn`] (calibrated on seeded inputs) and its plan at fp32.
/// The small CNN calibrated with its skip added in floats (`residual_skips` off: a block
/// output stored in floats and quantized as well for the next GEMMs, `y_copy`).
fn quant_cnn_plan(qtype: isolane_engine::quant::QuantType, batch: usize) -> (Graph, Plan) {
    quant_cnn_plan_with(qtype, batch, false)
}

fn quant_cnn_plan_with(
    qtype: isolane_engine::quant::QuantType,
    batch: usize,
    residual_skips: bool,
) -> (Graph, Plan) {
    calibrated_plan(&common::quant_cnn(), qtype, batch, residual_skips)
}

/// `g` (a 3 × 12 × 12 input) calibrated by min-max on seeded inputs, and its plan at fp32.
fn calibrated_plan(
    g: &Graph,
    qtype: isolane_engine::quant::QuantType,
    batch: usize,
    residual_skips: bool,
) -> (Graph, Plan) {
    use isolane_engine::calibrate::{quantize_model, CalibMethod, CalibOptions};
    let samples: Vec<Vec<Tensor>> = (0..3)
        .map(|s| vec![Tensor::new(vec![batch, 3, 12, 12], random(batch * 432, 90 + s)).unwrap()])
        .collect();
    let opts = CalibOptions {
        qtype,
        method: CalibMethod::MinMax,
        residual_skips,
        ..Default::default()
    };
    let q = quantize_model(g, batch, &samples, &opts).unwrap().graph;
    let p = plan::plan_with(&q, batch, Precision::Fp32, PlanOptions::default()).unwrap();
    (q, p)
}

/// The plan's (first) pool step.
fn pool_step(p: &Plan) -> &PoolStep {
    p.steps
        .iter()
        .find_map(|s| match &s.kind {
            StepKind::Pool(pool) => Some(pool),
            _ => None,
        })
        .expect("a pool step")
}

/// Path patterns (`run_paths`) that compute the QDQ graph exactly: each candidate alone and
/// two mixes, but 4, the plain float step, which reads x unquantized on purpose.
const EXACT_PATHS: [&[usize]; 7] = [&[0], &[1], &[2], &[3], &[5], &[2, 0, 1], &[3, 5, 0]];

/// A pool whose only readers are quantized GEMMs (resnet's max pool before its first block)
/// writes the bytes they read, not floats for them to quantize: the pool step holds the
/// readers' scale, both readers take its bytes (a direct GEMM reads them in place, a 3×3's
/// im2col copies them), and no quantize of them runs anywhere. Every candidate, alone and
/// mixed, computes what the CPU backend computes from the QDQ graph (int8 and fp8, max and
/// average pools, and resnet18's block whose skip is the pool's output). Where the pool is also
/// a graph output it stays in floats.
#[test]
fn a_pool_read_only_by_quantized_products_writes_their_bytes() {
    use isolane_engine::quant::QuantType;
    for qtype in [QuantType::Int8, QuantType::Float8E4M3Fn] {
        for (first, max, batch) in [(1, true, 1), (3, true, 2), (1, false, 2)] {
            let what = format!("{qtype} first {first}×{first} max {max} batch {batch}");
            let g = common::pooled_quant_cnn(first, max);
            let (q, p) = calibrated_plan(&g, qtype, batch, true);
            let pool = pool_step(&p);
            let (a, d) = (quant_gemm(&p, "a"), quant_gemm(&p, "d"));
            assert_eq!(pool.y_quant, Some((a.x_scale, qtype)), "{what}: {pool:?}");
            assert!(pool.nhwc, "{what}");
            for r in [a, d] {
                assert!(r.x_quantized && r.x == pool.y, "{what}: {r:?}");
            }
            assert_eq!(a.conv.is_some(), first == 3, "{what}");
            if first == 1 {
                // Both direct: they read the pool's bytes in place.
                assert!(a.xq == pool.y && d.xq == pool.y, "{what}");
            }
            let fake_quants = fake_quant_passes(&p);
            assert_eq!(fake_quants, 1, "{what}: only the stem's input");
            let (x, want) = cpu_reference(&q, batch, 6);
            assert_paths_compute(&p, &x, &want, &EXACT_PATHS, &what);
        }
    }
    // resnet18's first block: the pool's output is also the skip `b` adds (quantized, as
    // calibration quantizes skips by default), read as bytes.
    for qtype in [QuantType::Int8, QuantType::Float8E4M3Fn] {
        for (first, batch) in [(3, 1), (1, 2)] {
            let what = format!("{qtype} skip from the pool, first {first}×{first} batch {batch}");
            let (q, p) = calibrated_plan(&common::pooled_skip_cnn(first), qtype, batch, true);
            let pool = pool_step(&p);
            let (a, b) = (quant_gemm(&p, "a"), quant_gemm(&p, "b"));
            assert_eq!(pool.y_quant, Some((a.x_scale, qtype)), "{what}: {pool:?}");
            assert!(a.x_quantized && a.x == pool.y, "{what}: {a:?}");
            assert_eq!(
                (b.residual, b.residual_scale),
                (Some(pool.y), Some(a.x_scale)),
                "{what}: {b:?}"
            );
            let (x, want) = cpu_reference(&q, batch, 7);
            assert_paths_compute(&p, &x, &want, &EXACT_PATHS, &what);
        }
    }
    // A pool that is also an output keeps its floats (the readers quantize them).
    let mut g = common::pooled_quant_cnn(1, true);
    let pool_out = g.nodes.iter().find(|n| n.name == "pool").unwrap().outputs[0];
    g.add_output(pool_out).unwrap();
    let (_, p) = calibrated_plan(&g, QuantType::Int8, 1, true);
    let pooled_bytes = p
        .steps
        .iter()
        .any(|s| matches!(&s.kind, StepKind::Pool(pool) if pool.y_quant.is_some()));
    assert!(!pooled_bytes, "a pool that is an output writes floats");
    assert!(!quant_gemm(&p, "a").x_quantized);
}

/// Quantized products plan into QuantGemm steps (direct 1×1, im2col, Linear; the 3-channel
/// stem keeps its fake-quant steps), their weights stored one byte each and their scales in
/// f32, and the emulated plan computes what the CPU backend computes from the QDQ graph: the
/// same integers, summed exactly, scaled once (int8 and fp8).
#[test]
fn quantized_products_plan_into_quant_gemms_that_compute_the_graph() {
    use isolane_cuda::plan::ConstRepr;
    use isolane_engine::quant::QuantType;
    for qtype in [QuantType::Int8, QuantType::Float8E4M3Fn] {
        for batch in [1, 3] {
            let (q, p) = quant_cnn_plan(qtype, batch);
            let gemms: Vec<(&str, &QuantGemmStep)> = p
                .steps
                .iter()
                .filter_map(|s| match &s.kind {
                    StepKind::QuantGemm(g) => Some((s.name.as_str(), &**g)),
                    _ => None,
                })
                .collect();
            let names: Vec<&str> = gemms.iter().map(|(n, _)| *n).collect();
            assert_eq!(names, ["c2", "c3", "c4", "fc"], "{qtype} batch {batch}");
            let by = |n: &str| gemms.iter().find(|(m, _)| *m == n).unwrap().1;
            let (c2, c3, c4, fc) = (by("c2"), by("c3"), by("c4"), by("fc"));
            assert!(c2.conv.is_none() && c3.conv.is_some() && c4.conv.is_none());
            assert_eq!((c2.m, c2.n, c2.k), (batch * 144, 16, 16));
            assert_eq!((c3.m, c3.n, c3.k), (batch * 36, 32, 144));
            assert_eq!((fc.m, fc.n, fc.k), (batch, 16, 32));
            assert!(c4.residual.is_some(), "the add is fused into c4");
            // c2's output is read only by c3's quantized im2col: c2's epilogue quantizes it,
            // c3 copies bytes and quantizes nothing; c3's output is also the residual of c4,
            // so it is stored in full, and c3's step quantizes it as well for c4 (a direct
            // 1×1), which reads those bytes and quantizes nothing.
            assert!(c2.y_scale.is_some() && c3.x_quantized, "{c2:?}\n{c3:?}");
            assert!(c3.y_scale.is_none() && !c4.x_quantized);
            let (copy, s) = c3.y_copy.expect("c3 quantizes its output for c4");
            assert!(
                c4.xq_ready && c4.xq == copy && s == c4.x_scale,
                "{c3:?}\n{c4:?}"
            );
            assert!(c2.y_copy.is_none() && c4.y_copy.is_none() && fc.y_copy.is_none());
            let graph = c3.alt.as_ref().and_then(|a| a.graph.as_ref());
            assert!(graph.is_none_or(|g| g.copy_inv.is_some() && g.y_inv.is_none()));
            assert!(c4.y_scale.is_none(), "c4 → add → relu → pool is not a GEMM");
            // c1 (K = 27) stays on the fake-quant path: its input's FakeQuant is planned (in
            // the input's cast).
            assert_eq!(fake_quant_passes(&p), 1);
            // Buffer sizes: one byte per quantized element, 4 per accumulator.
            for g in [c2, c3, c4, fc] {
                let bytes = |l: Loc| match l {
                    Loc::Storage { id, .. } => p.storages[id].bytes,
                    Loc::Const { .. } => panic!("a constant"),
                };
                assert_eq!(bytes(g.xq), g.m * g.k);
                assert_eq!(bytes(g.acc), g.m * g.n * 4);
                let Loc::Const { id: w, .. } = g.w else {
                    panic!()
                };
                let Loc::Const { id: s, .. } = g.scale else {
                    panic!()
                };
                let want = if qtype == QuantType::Int8 {
                    ConstRepr::I8
                } else {
                    ConstRepr::E4M3
                };
                assert_eq!(p.repr_of(w), Some(want));
                assert_eq!(p.repr_of(s), Some(ConstRepr::F32));
                let (offs, _) = p.const_layout();
                let host = p.weights_host();
                let wb = &host[offs[w]..offs[w] + g.n * g.k];
                for (b, v) in wb.iter().zip(&p.consts[w].data) {
                    let back = if qtype == QuantType::Int8 {
                        *b as i8 as f32
                    } else {
                        assert_eq!(*b, isolane_cuda::int8::e4m3_bits(*v));
                        *v
                    };
                    assert_eq!(back, *v);
                }
            }
            let mut cpu = CpuBackend::new(1)
                .compile(&q, batch, Precision::Fp32)
                .unwrap();
            let x = random(cpu.input_mut().len(), 5);
            cpu.input_mut().copy_from_slice(&x);
            cpu.run().unwrap();
            let got = run(&p, &x);
            let err = rel_l2(&got, cpu.output());
            assert!(err < 1e-5, "{qtype} batch {batch}: rel L2 {err:e}");
        }
    }
}

/// A skip the model quantizes (calibration's default) is read as bytes: c3's output, read by
/// c4 as its operand and as its residual, leaves c3's epilogue as bytes only (no float copy,
/// no quantize kernel), and c4 adds `byte · scale`; cuDNN's graph adds the bytes as read with
/// its constants divided by the scale and a last multiply by it. Every candidate, alone and
/// mixed, computes what the CPU backend computes from the QDQ graph (int8 and fp8).
#[test]
fn a_quantized_skip_is_read_as_bytes_on_every_path() {
    use isolane_engine::quant::QuantType;
    for qtype in [QuantType::Int8, QuantType::Float8E4M3Fn] {
        for batch in [1, 3] {
            let (q, p) = quant_cnn_plan_with(qtype, batch, true);
            let (c3, c4) = (quant_gemm(&p, "c3"), quant_gemm(&p, "c4"));
            let ys = c3.y_scale.expect("c3 writes bytes only");
            assert!(c3.y_copy.is_none(), "{c3:?}");
            assert!(c4.x_quantized && c4.x == c3.y, "{c4:?}");
            assert_eq!((c4.residual, c4.residual_scale), (Some(c3.y), Some(ys)));
            // The skip's FakeQuant emits nothing.
            assert_eq!(
                fake_quant_passes(&p),
                1,
                "only the stem's input is fake-quantized"
            );
            let alt = c4.alt.as_ref().unwrap();
            assert!(alt.float.residual.is_some());
            let gc = alt.graph.as_ref().expect("c4's graph");
            let (Some(Loc::Const { id: sc, .. }), Some(Loc::Const { id: inv, .. })) =
                (gc.scale, gc.y_inv)
            else {
                panic!("c4's graph scales: {gc:?}")
            };
            let Loc::Const { id: own, .. } = c4.scale else {
                panic!()
            };
            for (a, b) in p.consts[sc].data.iter().zip(&p.consts[own].data) {
                assert_eq!(*a, b / ys);
            }
            assert!(p.consts[inv].data.iter().all(|&v| v == ys), "floats out");
            let (x, want) = cpu_reference(&q, batch, 5);
            // Within 1e-5: the graph's division of its constants by the skip's scale rounds in
            // f32.
            let patterns: [&[usize]; 9] = [
                &[0],
                &[1],
                &[2],
                &[3],
                &[5],
                &[2, 0, 1],
                &[0, 3, 2],
                &[3, 3, 3],
                &[5, 5, 2, 1],
            ];
            assert_paths_compute(&p, &x, &want, &patterns, &format!("{qtype} batch {batch}"));
        }
    }
}

/// Two bottleneck blocks as resnet's stages begin and go on (block A: 1×1 → 3×3 → 1×1 plus a
/// downsample 1×1 as its skip; block B: the same with A's output as its skip), calibrated with
/// the skips quantized: both skips are read as bytes, A's downsample and A's last 1×1 write bytes
/// only (their readers are quantized GEMMs and a residual), and only the stem's input is
/// fake-quantized. Every path, alone and mixed, computes what the CPU backend computes from
/// the QDQ graph (int8 and fp8).
#[test]
fn two_bottleneck_blocks_keep_their_skips_in_bytes() {
    use isolane_engine::calibrate::{quantize_model, CalibMethod, CalibOptions};
    use isolane_engine::quant::QuantType;
    let batch = 2;
    let mut g = Graph::new("bottlenecks");
    let x = g.add_input(
        "x",
        vec![Dim::Batch, Dim::Fixed(3), Dim::Fixed(8), Dim::Fixed(8)],
    );
    let mut seed = 500;
    let mut w = |g: &mut Graph, name: &str, shape: Vec<usize>| {
        seed += 1;
        let n: usize = shape.iter().product();
        let d = random(n, seed).into_iter().map(|v| v * 0.25).collect();
        g.add_constant(name, Tensor::new(shape, d).unwrap())
    };
    let conv = |k: usize, act| {
        Op::Conv(ConvAttrs {
            pads: [k / 2; 4],
            activation: act,
            ..Default::default()
        })
    };
    let relu = Some(Unary::Relu);
    let ws = w(&mut g, "ws", vec![16, 3, 3, 3]);
    let stem = g.add_op("stem", conv(3, relu), &[x, ws]).unwrap();
    // A block: 1×1 (C → 16), 3×3 (16 → 16), 1×1 (16 → 32), plus `skip`, ReLU (K and N
    // multiples of 16, as fp8's GEMMs need).
    let mut block = |g: &mut Graph, name: &str, x: usize, c: usize, skip: Option<usize>| {
        let w1 = w(g, &format!("{name}.w1"), vec![16, c, 1, 1]);
        let w2 = w(g, &format!("{name}.w2"), vec![16, 16, 3, 3]);
        let w3 = w(g, &format!("{name}.w3"), vec![32, 16, 1, 1]);
        let skip = match skip {
            Some(s) => s,
            None => {
                let wd = w(g, &format!("{name}.wd"), vec![32, c, 1, 1]);
                g.add_op(format!("{name}.down"), conv(1, None), &[x, wd])
                    .unwrap()
            }
        };
        let h = g
            .add_op(format!("{name}.c1"), conv(1, relu), &[x, w1])
            .unwrap();
        let h = g
            .add_op(format!("{name}.c2"), conv(3, relu), &[h, w2])
            .unwrap();
        let h = g
            .add_op(format!("{name}.c3"), conv(1, None), &[h, w3])
            .unwrap();
        let h = g
            .add_op(format!("{name}.add"), Op::Binary(Binary::Add), &[h, skip])
            .unwrap();
        g.add_op(format!("{name}.relu"), Op::Unary(Unary::Relu), &[h])
            .unwrap()
    };
    let a = block(&mut g, "a", stem, 16, None);
    let b = block(&mut g, "b", a, 32, Some(a));
    let y = g.add_op("pool", Op::GlobalAveragePool, &[b]).unwrap();
    g.add_output(y).unwrap();
    for qtype in [QuantType::Int8, QuantType::Float8E4M3Fn] {
        let samples: Vec<Vec<Tensor>> = (0..3)
            .map(|s| vec![Tensor::new(vec![batch, 3, 8, 8], random(batch * 192, 520 + s)).unwrap()])
            .collect();
        let opts = CalibOptions {
            qtype,
            method: CalibMethod::MinMax,
            ..Default::default()
        };
        let q = quantize_model(&g, batch, &samples, &opts).unwrap().graph;
        let p = plan::plan_with(&q, batch, Precision::Fp32, PlanOptions::default()).unwrap();
        let step = |n: &str| quant_gemm(&p, n);
        let (down, a3, b1, b3) = (step("a.down"), step("a.c3"), step("b.c1"), step("b.c3"));
        // A's skip is its downsample's output, B's is A's output: both bytes only.
        assert!(down.y_scale.is_some() && down.y_copy.is_none(), "{down:?}");
        assert!(a3.y_scale.is_some() && a3.y_copy.is_none(), "{a3:?}");
        assert_eq!(
            (a3.residual, a3.residual_scale),
            (Some(down.y), down.y_scale)
        );
        assert!(b1.x_quantized && b1.x == a3.y, "{b1:?}");
        assert_eq!((b3.residual, b3.residual_scale), (Some(a3.y), a3.y_scale));
        // B's output goes to the pool in floats.
        assert!(b3.y_scale.is_none());
        let fake_quants = fake_quant_passes(&p);
        assert_eq!(fake_quants, 1, "only the stem's input: {:#?}", p.steps);
        let (x, want) = cpu_reference(&q, batch, 9);
        let patterns: [&[usize]; 8] = [
            &[0],
            &[1],
            &[2],
            &[3],
            &[5],
            &[3, 2, 0, 1],
            &[2, 3, 3],
            &[1, 5, 2],
        ];
        assert_paths_compute(&p, &x, &want, &patterns, &qtype.to_string());
    }
}

/// Every candidate of the build's per-layer choice computes the graph: cuDNN's convolution of
/// the quantized bytes (every convolution: x quantized whole into bytes of its own, a direct
/// 1×1's into its GEMM rows, or its producer's bytes read in place; f32 sums, the same
/// epilogue) and the float
/// step (fake-quant values of x, from floats or dequantized from bytes; its output quantized
/// where the next GEMM reads bytes), alone and mixed layer by layer with the int8 GEMM, so
/// that a float layer between int8 ones hands bytes on correctly.
#[test]
fn every_quantized_layer_choice_computes_the_graph() {
    use isolane_engine::quant::QuantType;
    for qtype in [QuantType::Int8, QuantType::Float8E4M3Fn] {
        for batch in [1, 3] {
            let (q, p) = quant_cnn_plan(qtype, batch);
            let gemms: Vec<(&str, &QuantGemmStep)> = p
                .steps
                .iter()
                .filter_map(|s| match &s.kind {
                    StepKind::QuantGemm(g) => Some((s.name.as_str(), &**g)),
                    _ => None,
                })
                .collect();
            let dnn: Vec<&str> = gemms
                .iter()
                .filter(|(_, g)| g.alt.as_ref().unwrap().dnn_conv.is_some())
                .map(|(n, _)| *n)
                .collect();
            // The fc Linear has no convolution; c2 and c4 are direct 1×1s (x's bytes are their
            // GEMM's rows), c3 needs an im2col.
            assert_eq!(dnn, ["c2", "c3", "c4"], "{qtype}");
            for (name, g) in &gemms {
                let alt = g.alt.as_ref().unwrap();
                let Some(dc) = &alt.dnn_conv else { continue };
                match (g.x_quantized, g.conv.is_none(), g.xq_ready) {
                    (true, ..) => assert!(alt.xb.is_none() && dc.x == g.x, "{name}"),
                    (false, true, true) => assert!(alt.xb.is_none() && dc.x == g.xq, "{name}"),
                    (false, true, false) => {
                        assert_eq!((alt.xb, dc.x), (Some(g.xq), g.xq), "{name}")
                    }
                    (false, false, _) => assert!(alt.xb == Some(dc.x) && dc.x != g.xq, "{name}"),
                }
            }
            for (name, g) in &gemms {
                let alt = g.alt.as_ref().unwrap();
                // cuDNN's fused graph where its convolution is planned, its inverse output
                // scale where the step writes bytes for the next quantized convolution.
                match (&alt.dnn_conv, &alt.graph) {
                    (Some(_), Some(gc)) => {
                        assert_eq!(gc.y_inv.is_some(), g.y_scale.is_some(), "{name}");
                        assert_eq!(gc.bias.is_some(), g.bias.is_some(), "{name}");
                        // One f32 inverse output scale per output channel.
                        if let (Some(Loc::Const { id, .. }), Some(ys)) = (gc.y_inv, g.y_scale) {
                            let inv = &p.consts[id].data;
                            assert_eq!(inv.len(), g.n, "{name}");
                            assert!(inv.iter().all(|&v| v == 1.0 / ys), "{name}: {inv:?}");
                            assert!(p.const_repr.contains(&(id, plan::ConstRepr::F32)));
                        }
                    }
                    (None, None) => {}
                    other => panic!("{name}: {other:?}"),
                }
                // A float output is written in place by the float product; bytes go through yf.
                assert_eq!(alt.float.yf.is_some(), g.y_scale.is_some(), "{name}");
                match &alt.float.product {
                    StepKind::Conv(c) => assert_eq!((c.x, c.nhwc), (alt.float.xf, true)),
                    StepKind::Linear(l) => {
                        assert_eq!((l.x, l.m, l.n, l.k), (alt.float.xf, g.m, g.n, g.k))
                    }
                    other => panic!("{name}: {other:?}"),
                }
            }
            let (x, want) = cpu_reference(&q, batch, 5);
            let patterns: [&[usize]; 10] = [
                &[1],
                &[2],
                &[3],
                &[5],
                &[2, 0, 1],
                &[0, 2, 1],
                &[1, 2],
                &[3, 0, 3],
                &[0, 3, 2],
                &[5, 5, 2, 1],
            ];
            assert_paths_compute(&p, &x, &want, &patterns, &format!("{qtype} batch {batch}"));
        }
    }
}

/// cuDNN's fused quantized graph takes a ReLU6 and a `Clip(0, max)` (MobileNetV2's expand
/// convolutions had no graph for their ReLU6): the small CNN with c2's ReLU as ReLU6 and c3's
/// as `Clip(0, 0.5)` (low enough to clip), its graph path alone and mixed with the others,
/// against the CPU backend.
#[test]
fn a_relu6_convolution_takes_the_quantized_graph() {
    use isolane_engine::calibrate::{quantize_model, CalibMethod, CalibOptions};
    use isolane_engine::quant::QuantType;
    for qtype in [QuantType::Int8, QuantType::Float8E4M3Fn] {
        let batch = 2;
        let mut g = common::quant_cnn();
        for n in g.nodes.iter_mut() {
            if let Op::Conv(a) = &mut n.op {
                match n.name.as_str() {
                    "c2" => a.activation = Some(Unary::Relu6),
                    "c3" => a.activation = Some(Unary::Clip { min: 0.0, max: 0.5 }),
                    _ => {}
                }
            }
        }
        let samples: Vec<Vec<Tensor>> = (0..3)
            .map(|s| {
                vec![Tensor::new(vec![batch, 3, 12, 12], random(batch * 432, 90 + s)).unwrap()]
            })
            .collect();
        let opts = CalibOptions {
            qtype,
            method: CalibMethod::MinMax,
            ..Default::default()
        };
        let q = quantize_model(&g, batch, &samples, &opts).unwrap().graph;
        let p = plan::plan_with(&q, batch, Precision::Fp32, PlanOptions::default()).unwrap();
        let graphs: Vec<&str> = p
            .steps
            .iter()
            .filter_map(|s| match &s.kind {
                StepKind::QuantGemm(g) if g.alt.as_ref().is_some_and(|a| a.graph.is_some()) => {
                    Some(s.name.as_str())
                }
                _ => None,
            })
            .collect();
        assert_eq!(graphs, ["c2", "c3", "c4"], "{qtype}");
        let (x, want) = cpu_reference(&q, batch, 5);
        let patterns: [&[usize]; 3] = [&[3], &[0, 3, 3], &[2, 3, 0]];
        assert_paths_compute(&p, &x, &want, &patterns, &qtype.to_string());
    }
}

/// A value read as floats by a residual and, through one FakeQuant, by a direct 1×1 and a
/// strided 1×1 (resnet's block output and its next block's conv1 and downsample): its
/// producer writes its bytes too (`y_copy`), the 1×1 reads them as its rows (`xq_ready`) and
/// the strided one's cuDNN paths read them in place (no `xb`); every path mix computes what the
/// CPU computes.
#[test]
fn a_block_output_is_quantized_once_by_its_producer() {
    use isolane_engine::calibrate::{quantize_model, CalibMethod, CalibOptions};
    use isolane_engine::quant::QuantType;
    let batch = 2;
    for qtype in [QuantType::Int8, QuantType::Float8E4M3Fn] {
        let mut g = Graph::new("block");
        let x = g.add_input(
            "x",
            vec![Dim::Batch, Dim::Fixed(3), Dim::Fixed(6), Dim::Fixed(6)],
        );
        let mut seed = 400;
        let mut w = |g: &mut Graph, name: &str, shape: Vec<usize>| {
            seed += 1;
            let n: usize = shape.iter().product();
            let d = random(n, seed).into_iter().map(|v| v * 0.3).collect();
            g.add_constant(name, Tensor::new(shape, d).unwrap())
        };
        let conv = |strides: [usize; 2], act| {
            Op::Conv(ConvAttrs {
                strides,
                activation: act,
                ..Default::default()
            })
        };
        // A stem first: the plan's input stays on the fake-quant path (as quant_cnn's c1).
        let (ws, bs) = (
            w(&mut g, "ws", vec![16, 3, 3, 3]),
            w(&mut g, "bs", vec![16]),
        );
        let (wa, ba) = (
            w(&mut g, "wa", vec![16, 16, 1, 1]),
            w(&mut g, "ba", vec![16]),
        );
        let (wb, bb) = (
            w(&mut g, "wb", vec![16, 16, 1, 1]),
            w(&mut g, "bb", vec![16]),
        );
        let (wc, bc) = (
            w(&mut g, "wc", vec![16, 16, 1, 1]),
            w(&mut g, "bc", vec![16]),
        );
        let stem = Op::Conv(ConvAttrs {
            pads: [1; 4],
            activation: Some(Unary::Relu),
            ..Default::default()
        });
        let x = g.add_op("s", stem, &[x, ws, bs]).unwrap();
        let h = g
            .add_op("a", conv([1, 1], Some(Unary::Relu)), &[x, wa, ba])
            .unwrap();
        let b = g.add_op("b", conv([1, 1], None), &[h, wb, bb]).unwrap();
        let b = g.add_op("add", Op::Binary(Binary::Add), &[b, h]).unwrap();
        let b = g.add_op("relu", Op::Unary(Unary::Relu), &[b]).unwrap();
        let c = g.add_op("c", conv([2, 2], None), &[h, wc, bc]).unwrap();
        let pb = g.add_op("pool_b", Op::GlobalAveragePool, &[b]).unwrap();
        let pc = g.add_op("pool_c", Op::GlobalAveragePool, &[c]).unwrap();
        let y = g.add_op("sum", Op::Binary(Binary::Add), &[pb, pc]).unwrap();
        g.add_output(y).unwrap();
        let samples: Vec<Vec<Tensor>> = (0..3)
            .map(|s| vec![Tensor::new(vec![batch, 3, 6, 6], random(batch * 108, 410 + s)).unwrap()])
            .collect();
        let opts = CalibOptions {
            qtype,
            method: CalibMethod::MinMax,
            residual_skips: false,
            ..Default::default()
        };
        let q = quantize_model(&g, batch, &samples, &opts).unwrap().graph;
        let p = plan::plan_with(&q, batch, Precision::Fp32, PlanOptions::default()).unwrap();
        let (a, b, c) = (
            quant_gemm(&p, "a"),
            quant_gemm(&p, "b"),
            quant_gemm(&p, "c"),
        );
        let (copy, _) = a.y_copy.expect("a's output is quantized by a");
        assert!(
            a.y_scale.is_none() && b.xq_ready && b.xq == copy,
            "{a:?}\n{b:?}"
        );
        let alt = c.alt.as_ref().unwrap();
        let dc = alt.dnn_conv.as_ref().expect("C a multiple of 4");
        assert!(
            c.conv.is_some() && alt.xb.is_none() && dc.x == copy,
            "{c:?}"
        );
        let (x, want) = cpu_reference(&q, batch, 7);
        let patterns: [&[usize]; 8] = [
            &[0],
            &[1],
            &[2],
            &[3],
            &[3, 0, 1],
            &[2, 3, 3],
            &[0, 2, 3],
            &[3, 1, 2],
        ];
        assert_paths_compute(&p, &x, &want, &patterns, &qtype.to_string());
    }
}

/// A 3×3 convolution whose input is floats (a ReLU's, not a quantized GEMM's bytes): every
/// candidate computes the graph, the GEMM with x quantized before its im2col of bytes among
/// them (x into its own bytes `xb`, their im2col into `xq`), an asymmetric padding too.
#[test]
fn a_convolution_of_floats_takes_every_candidate() {
    use isolane_engine::calibrate::{quantize_model, CalibOptions};
    use isolane_engine::quant::QuantType;
    for (pads, qtype) in [
        ([1; 4], QuantType::Int8),
        ([0, 0, 1, 1], QuantType::Int8),
        ([1; 4], QuantType::Float8E4M3Fn),
    ] {
        let mut g = Graph::new("relu_conv");
        let x = g.add_input(
            "x",
            vec![Dim::Batch, Dim::Fixed(16), Dim::Fixed(6), Dim::Fixed(6)],
        );
        let d = random(32 * 16 * 9, 300)
            .into_iter()
            .map(|v| v * 0.2)
            .collect();
        let w = g.add_constant("w", Tensor::new(vec![32, 16, 3, 3], d).unwrap());
        let b = g.add_constant("b", Tensor::new(vec![32], random(32, 301)).unwrap());
        let h = g.add_op("pre", Op::Unary(Unary::Relu), &[x]).unwrap();
        let conv = Op::Conv(ConvAttrs {
            pads,
            activation: Some(Unary::Relu),
            ..Default::default()
        });
        let y = g.add_op("conv", conv, &[h, w, b]).unwrap();
        g.add_output(y).unwrap();
        let batch = 2;
        let samples = vec![vec![Tensor::new(
            vec![batch, 16, 6, 6],
            random(batch * 576, 302),
        )
        .unwrap()]];
        let opts = CalibOptions {
            qtype,
            ..Default::default()
        };
        let q = quantize_model(&g, batch, &samples, &opts).unwrap().graph;
        let p = plan::plan_with(&q, batch, Precision::Fp32, PlanOptions::default()).unwrap();
        let gemms: Vec<&QuantGemmStep> = p
            .steps
            .iter()
            .filter_map(|s| match &s.kind {
                StepKind::QuantGemm(g) => Some(&**g),
                _ => None,
            })
            .collect();
        assert_eq!(gemms.len(), 1, "{qtype} {pads:?}");
        let c = gemms[0];
        let alt = c.alt.as_ref().unwrap();
        assert!(c.conv.is_some() && !c.x_quantized, "{c:?}");
        let xb = alt.xb.expect("x's own bytes");
        let n: usize = alt.dnn_conv.as_ref().unwrap().x_shape.iter().product();
        let Loc::Storage { id, .. } = xb else {
            panic!()
        };
        assert_eq!(p.storages[id].bytes, n);
        let (x, want) = cpu_reference(&q, batch, 303);
        let patterns: [&[usize]; 5] = [&[0], &[1], &[2], &[3], &[5]];
        assert_paths_compute(&p, &x, &want, &patterns, &format!("{qtype} {pads:?}"));
    }
}

/// `ISOLANE_CUDA_QUANT_FLOAT=plain`: the float candidate reads x unquantized where x is floats
/// (TensorRT's per-layer fallback for a calibrated model), and dequantizes the producer's bytes
/// where those are all there is. The plan with every layer so computes the quantized graph with
/// the FakeQuants before exactly those layers taken out; one layer left on its int8 GEMM
/// still quantizes.
#[test]
fn a_plain_float_layer_reads_its_input_unquantized() {
    use isolane_engine::quant::QuantType;
    for qtype in [QuantType::Int8, QuantType::Float8E4M3Fn] {
        let batch = 2;
        let (q, p) = quant_cnn_plan(qtype, batch);
        let gemms: Vec<(&str, &QuantGemmStep)> = p
            .steps
            .iter()
            .filter_map(|s| match &s.kind {
                StepKind::QuantGemm(g) => Some((s.name.as_str(), &**g)),
                _ => None,
            })
            .collect();
        let x = random(batch * 3 * 12 * 12, 6);
        for pattern in [vec![4], vec![4, 0, 4, 0]] {
            // The reference: the FakeQuant before each plain layer (whose x is floats) bypassed.
            let mut want_g = q.clone();
            for (k, (name, g)) in gemms.iter().enumerate() {
                if pattern[k % pattern.len()] != 4 || g.x_quantized {
                    continue;
                }
                let ni = want_g.nodes.iter().position(|n| n.name == *name).unwrap();
                let fq = want_g.producer(want_g.nodes[ni].inputs[0]).unwrap();
                assert!(matches!(want_g.nodes[fq].op, Op::FakeQuant(_)), "{name}");
                want_g.nodes[ni].inputs[0] = want_g.nodes[fq].inputs[0];
            }
            let mut cpu = CpuBackend::new(1)
                .compile(&want_g, batch, Precision::Fp32)
                .unwrap();
            cpu.input_mut().copy_from_slice(&x);
            cpu.run().unwrap();
            let got = run_paths(&p, &x, &pattern);
            let err = rel_l2(&got, cpu.output());
            assert!(err < 1e-5, "{qtype} paths {pattern:?}: rel L2 {err:e}");
            // And it is not the QDQ graph's arithmetic.
            let mut qdq = CpuBackend::new(1)
                .compile(&q, batch, Precision::Fp32)
                .unwrap();
            qdq.input_mut().copy_from_slice(&x);
            qdq.run().unwrap();
            assert!(rel_l2(&got, qdq.output()) > 1e-4, "{qtype} {pattern:?}");
        }
    }
}

/// The graph `q` with the FakeQuant before each of `layers` bypassed: what a plan whose float
/// steps read x unquantized computes there.
fn without_fake_quant_before(q: &Graph, layers: &[&str]) -> Graph {
    let names: Vec<String> = layers.iter().map(|l| l.to_string()).collect();
    let g = isolane_engine::quant::without_input_fake_quant(q, &names);
    for name in layers {
        let n = g.nodes.iter().find(|n| n.name == *name).unwrap();
        let from = g.producer(n.inputs[0]).map(|p| &g.nodes[p].op);
        assert!(
            !matches!(from, Some(Op::FakeQuant(_))),
            "{name} still reads a FakeQuant"
        );
    }
    g
}

/// The CPU backend's fp32 output of `g` for input `x`.
fn cpu_output(g: &Graph, batch: usize, x: &[f32]) -> Vec<f32> {
    let mut cpu = CpuBackend::new(1)
        .compile(g, batch, Precision::Fp32)
        .unwrap();
    cpu.input_mut().copy_from_slice(x);
    cpu.run().unwrap();
    cpu.output().to_vec()
}

/// A calibrated model (the executors build it `for_calibrated`): where its layers keep the
/// float step, that step is plain (x unquantized) by default: the plan computes the quantized
/// graph without those layers' input FakeQuants (the FakeQuant before a layer whose x arrives
/// as its producer's bytes stays: the bytes are all there is), and it is nearer the float
/// model than the QDQ arithmetic is, within the error calibration itself allows.
#[test]
fn a_calibrated_models_float_steps_run_plain_by_default() {
    use isolane_engine::quant::QuantType;
    let options = isolane_cuda::BuildOptions::default().for_calibrated(true);
    for qtype in [QuantType::Int8, QuantType::Float8E4M3Fn] {
        let batch = 2;
        let (q, p) = quant_cnn_plan(qtype, batch);
        let plain: Vec<&str> = p
            .steps
            .iter()
            .filter_map(|s| match &s.kind {
                StepKind::QuantGemm(g) if !g.x_quantized => Some(s.name.as_str()),
                _ => None,
            })
            .collect();
        assert!(plain.len() >= 2, "{plain:?}");
        let x = random(batch * 3 * 12 * 12, 6);
        QUANT_OPTIONS.with(|o| o.set(Some(options)));
        let got = run_paths(&p, &x, &[2]);
        QUANT_OPTIONS.with(|o| o.set(None));
        let want = cpu_output(&without_fake_quant_before(&q, &plain), batch, &x);
        let err = rel_l2(&got, &want);
        assert!(err < 1e-5, "{qtype}: rel L2 {err:e}");
        let float = cpu_output(&common::quant_cnn(), batch, &x);
        let qdq = cpu_output(&q, batch, &x);
        let (plain_err, qdq_err) = (rel_l2(&got, &float), rel_l2(&qdq, &float));
        assert!(
            plain_err > 0.0 && plain_err < qdq_err,
            "{qtype}: {plain_err:e} vs {qdq_err:e}"
        );
        let bound = match qtype {
            QuantType::Int8 => 0.05,
            _ => 0.1,
        };
        assert!(
            plain_err < bound,
            "{qtype}: rel L2 to the float model {plain_err:e}"
        );
    }
}

/// A QDQ file (built without `for_calibrated`): its float steps keep the fake-quant
/// arithmetic its author wrote, never a plain step, unless `ISOLANE_CUDA_QUANT_FLOAT=plain`
/// forces it; `=fake-quant` keeps a calibrated model's too.
#[test]
fn a_qdq_files_float_steps_keep_their_fake_quant() {
    use isolane_cuda::options::QuantFloatInput;
    use isolane_engine::quant::QuantType;
    let batch = 2;
    let (q, p) = quant_cnn_plan(QuantType::Int8, batch);
    let x = random(batch * 3 * 12 * 12, 6);
    let qdq = cpu_output(&q, batch, &x);
    let float_steps = |options: Option<isolane_cuda::BuildOptions>| {
        QUANT_OPTIONS.with(|o| o.set(options));
        let got = run_paths(&p, &x, &[2]);
        QUANT_OPTIONS.with(|o| o.set(None));
        rel_l2(&got, &qdq)
    };
    let forced = |quant_float| isolane_cuda::BuildOptions {
        quant_float,
        ..Default::default()
    };
    for options in [
        None,
        Some(isolane_cuda::BuildOptions::default()),
        Some(forced(QuantFloatInput::FakeQuant).for_calibrated(true)),
    ] {
        let err = float_steps(options);
        assert!(err < 1e-5, "{options:?}: rel L2 {err:e}");
    }
    let err = float_steps(Some(forced(QuantFloatInput::Plain)));
    assert!(err > 1e-4, "forced plain: rel L2 {err:e}");
}

/// Two Linears reading one quantized activation (as a transformer's q, k and v projections
/// do): the activation is quantized once, the second GEMM reuses it, and the plan computes
/// the graph.
#[test]
fn one_quantized_activation_read_by_two_gemms_is_quantized_once() {
    use isolane_engine::calibrate::{quantize_model, CalibOptions};
    let mut g = Graph::new("two_linears");
    let x = g.add_input("x", vec![Dim::Batch, Dim::Fixed(5), Dim::Fixed(32)]);
    let mut seed = 200;
    let mut w = |g: &mut Graph, name: &str, shape: Vec<usize>| {
        seed += 1;
        let n: usize = shape.iter().product();
        let d = random(n, seed).into_iter().map(|v| v * 0.3).collect();
        g.add_constant(name, Tensor::new(shape, d).unwrap())
    };
    let (wa, ba) = (w(&mut g, "wa", vec![32, 32]), w(&mut g, "ba", vec![32]));
    let (wb, bb) = (w(&mut g, "wb", vec![32, 32]), w(&mut g, "bb", vec![32]));
    let h = g.add_op("pre", Op::Unary(Unary::Relu), &[x]).unwrap();
    let lin = || Op::Linear { activation: None };
    let a = g.add_op("a", lin(), &[h, wa, ba]).unwrap();
    let b = g.add_op("b", lin(), &[h, wb, bb]).unwrap();
    let y = g.add_op("sum", Op::Binary(Binary::Mul), &[a, b]).unwrap();
    g.add_output(y).unwrap();
    let batch = 2;
    let samples = vec![vec![Tensor::new(
        vec![batch, 5, 32],
        random(batch * 160, 3),
    )
    .unwrap()]];
    let q = quantize_model(&g, batch, &samples, &CalibOptions::default())
        .unwrap()
        .graph;
    let p = plan::plan_with(&q, batch, Precision::Fp32, PlanOptions::default()).unwrap();
    let gemms: Vec<&QuantGemmStep> = p
        .steps
        .iter()
        .filter_map(|s| match &s.kind {
            StepKind::QuantGemm(g) => Some(&**g),
            _ => None,
        })
        .collect();
    assert_eq!(
        gemms.len(),
        2,
        "{:?}",
        p.steps.iter().map(|s| &s.name).collect::<Vec<_>>()
    );
    assert!(!gemms[0].xq_ready && gemms[1].xq_ready);
    assert_eq!(gemms[0].xq, gemms[1].xq);
    // Should the first take its float step, it still fills the rows the second reads.
    let fills = |g: &QuantGemmStep| g.alt.as_ref().unwrap().float.fills_xq;
    assert!(fills(gemms[0]) && !fills(gemms[1]));
    assert_eq!((gemms[1].m, gemms[1].n, gemms[1].k), (batch * 5, 32, 32));
    let mut cpu = CpuBackend::new(1)
        .compile(&q, batch, Precision::Fp32)
        .unwrap();
    let x = random(cpu.input_mut().len(), 8);
    cpu.input_mut().copy_from_slice(&x);
    cpu.run().unwrap();
    for pattern in [vec![0], vec![2, 0], vec![2]] {
        let got = run_paths(&p, &x, &pattern);
        let err = rel_l2(&got, cpu.output());
        assert!(err < 1e-5, "paths {pattern:?}: rel L2 {err:e}");
    }
}

/// Issue 33: onnxruntime's QDQ digits CNN (int8) at batch 360, emulated: the plan sums each
/// layer's integers exactly and scales once, the CPU reference dequantizes and sums floats, so
/// a few of the 368,640 values after `c2` that lie on an int8 rounding boundary land one step
/// over (rel L2 2.5e-4 against fp32's 1e-4). The check passes it, its limit widened by what
/// such flips move the output (check::quantization_sensitivity); the emulated plan is the
/// GPU's arithmetic, so the check is right to.
#[test]
fn the_qdq_digits_plan_passes_the_check_at_batch_360() {
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../isolane-engine/tests/fixtures/digits/"
    );
    let g = isolane_engine::onnx::import_file(format!("{dir}digits_int8_qdq.onnx")).unwrap();
    let batch = 360;
    QUANT_PATHS.with(|c| *c.borrow_mut() = (vec![0], 0));
    let opt = passes::optimize(&g, batch).unwrap();
    let p = plan::plan_with(&opt, batch, Precision::Fp32, PlanOptions::default()).unwrap();
    let r = isolane_cuda::check::check_plan(&g, &opt, &p, batch, &mut Emulator::new(&p))
        .unwrap_or_else(|e| panic!("{e}"));
    println!("digits int8 QDQ, batch {batch}, emulated: {r:?}");
    let q = r
        .quantization
        .expect("over fp32's limit, widened for its quantizers");
    assert!(
        r.rel_l2 > isolane_cuda::check::tolerance(Precision::Fp32) && r.rel_l2 <= r.tolerance,
        "{r:?}"
    );
    assert!(q > 0.0 && q < 1e-2, "{r:?}");
}

/// A CNN's input is cast straight into the channels-last layout its first convolution reads
/// (one pass, no layout copy after it), also at fp32, where the cast only reorders, and also
/// through a calibrated stem's FakeQuant; and the emulated plan computes what the CPU backend
/// does. An input that something else reads too
/// keeps its order (here a ReLU of the input, a second output).
#[test]
fn a_cnn_input_is_cast_channels_last_once() {
    let layout_copies = |p: &Plan| {
        p.steps
            .iter()
            .filter(|s| s.name.ends_with("(to NHWC)"))
            .map(|s| s.name.clone())
            .collect::<Vec<_>>()
    };
    let g = common::quant_cnn();
    let batch = 2;
    let p = plan::plan(&g, batch, Precision::Fp32).unwrap();
    match &p.steps[0].kind {
        StepKind::CastIn { nhwc, n, .. } => {
            // Stored as 4 channels (a zero fourth), which the stem's convolution reads with
            // its filter padded alike.
            assert_eq!(*nhwc, Some((3, 144, 4)));
            assert_eq!(*n, batch * 3 * 144);
        }
        other => panic!("the first step: {other:?}"),
    }
    let stem = p
        .steps
        .iter()
        .find_map(|s| match &s.kind {
            StepKind::Conv(c) if s.name.starts_with("c1") => Some(c),
            _ => None,
        })
        .expect("the stem convolution");
    assert_eq!((stem.x_shape[1], stem.w_shape[1]), (4, 4), "{stem:?}");
    assert!(
        !layout_copies(&p).iter().any(|n| n.starts_with("c1")),
        "{:?}",
        layout_copies(&p)
    );
    let x = random(batch * 432, 3);
    let mut cpu = CpuBackend::new(1)
        .compile(&g, batch, Precision::Fp32)
        .unwrap();
    cpu.input_mut().copy_from_slice(&x);
    cpu.run().unwrap();
    let err = rel_l2(&run(&p, &x), cpu.output());
    assert!(err < 1e-5, "rel L2 {err:e}");

    // A calibrated model's input goes through the stem's FakeQuant first: the cast applies
    // it, channels last and padded too (no fake-quant pass, no copy before the stem).
    let (_, p) = quant_cnn_plan(isolane_engine::quant::QuantType::Int8, batch);
    assert!(
        matches!(
            p.steps[0].kind,
            StepKind::CastIn {
                nhwc: Some((3, 144, 4)),
                quant: Some(_),
                ..
            }
        ),
        "{:?}",
        p.steps[0]
    );
    assert!(
        !matches!(p.steps[1].kind, StepKind::FakeQuant(_)),
        "{:?}",
        p.steps[1]
    );
    assert!(layout_copies(&p).is_empty(), "{:?}", layout_copies(&p));

    let mut g = common::quant_cnn();
    let x_in = g.inputs[0];
    let r = g.add_op("also", Op::Unary(Unary::Relu), &[x_in]).unwrap();
    g.add_output(r).unwrap();
    let p = plan::plan(&g, batch, Precision::Fp32).unwrap();
    assert!(
        !p.steps
            .iter()
            .any(|s| matches!(s.kind, StepKind::CastIn { .. })),
        "fp32 in its own order needs no cast"
    );
    assert_eq!(layout_copies(&p).len(), 1, "{:?}", layout_copies(&p));
}

/// An RGB stem of overlapping windows (3×3 stride 2) reads its input stored as 4 channels,
/// its filter padded alike; a patchifying stem (4×4 stride 4, as ConvNeXt's and ViT's) keeps
/// 3, where a fourth channel would only lengthen its GEMM (at fp32 and fp16). Both plans
/// compute what the CPU backend does.
#[test]
fn only_an_overlapping_rgb_stem_reads_a_padded_input() {
    let stem = |k: usize, s: usize, pad: usize| {
        let mut g = Graph::new("stem");
        let x = g.add_input(
            "x",
            vec![Dim::Batch, Dim::Fixed(3), Dim::Fixed(16), Dim::Fixed(16)],
        );
        let data = |n: usize, seed: usize| -> Vec<f32> {
            (0..n)
                .map(|i| (((i * 7 + seed * 13) % 17) as f32 - 8.0) / 16.0)
                .collect()
        };
        let w = g.add_constant(
            "w",
            Tensor::new(vec![8, 3, k, k], data(24 * k * k, 1)).unwrap(),
        );
        let b = g.add_constant("b", Tensor::new(vec![8], data(8, 2)).unwrap());
        let attrs = ConvAttrs {
            strides: [s, s],
            pads: [pad; 4],
            activation: Some(Unary::Relu),
            ..Default::default()
        };
        let y = g.add_op("stem", Op::Conv(attrs), &[x, w, b]).unwrap();
        g.add_output(y).unwrap();
        g
    };
    for (g, padded) in [(stem(3, 2, 1), 4), (stem(4, 4, 0), 3)] {
        for precision in [Precision::Fp32, Precision::Fp16] {
            let batch = 2;
            let p = plan::plan(&g, batch, precision).unwrap();
            assert!(
                matches!(p.steps[0].kind, StepKind::CastIn { nhwc: Some((3, 256, c)), .. } if c == padded),
                "{:?}",
                p.steps[0]
            );
            let conv = p
                .steps
                .iter()
                .find_map(|s| match &s.kind {
                    StepKind::Conv(c) => Some(c),
                    _ => None,
                })
                .expect("the stem");
            assert_eq!((conv.x_shape[1], conv.w_shape[1]), (padded, padded));
            // The emulator runs fp32 plans (the layout is the same at every precision).
            if precision != Precision::Fp32 {
                continue;
            }
            let (x, want) = cpu_reference(&g, batch, 5);
            let err = rel_l2(&run(&p, &x), &want);
            assert!(err < 1e-5, "{padded} {precision:?}: rel L2 {err:e}");
        }
    }
}
