//! The CUDA lowering of the `quant` family (its engine home: isolane-engine's `ops/quant.rs`).
//! FakeQuant and the quantized GEMMs it feeds (`crate::int8`, docs/cuda.md "int8 and fp8").

use crate::plan::*;

impl Planner<'_> {
    /// Lowers `Op::FakeQuant(q)`: one elementwise pass (the `fake_quant` kernel). A first
    /// step: the activations stay in the plan's dtype and the neighbouring convolutions and
    /// matrix products run in it; int8 / fp8 tensor-core kernels with the Q/DQ fused into
    /// them are next (issue 33).
    pub(in crate::plan) fn lower_fake_quant(
        &mut self,
        c: &NodeCtx,
        q: &FakeQuantAttrs,
    ) -> Result<Lowered> {
        let p = self;
        let (name, outs, out_shape, x0) = (c.name, &c.outs, &c.out_shape, c.x0);
        let shape = p.shapes[x0].clone();
        let rank = shape.len();
        // A value stored with zero-padded channels (`cpad`) is quantized whole, padding
        // included (a zero stays zero: it quantizes to the zero point), and its output is
        // stored alike for the padded convolutions that read it.
        let padded = match q.granularity {
            Granularity::PerTensor => p.cpad[x0],
            _ => None,
        };
        let strided = p.vstrides[x0].is_some();
        let (x, keep, channels, inner) = match q.granularity {
            Granularity::PerTensor if padded.is_some() => (p.raw(x0, name)?, false, 1, 1),
            Granularity::PerTensor if !strided => (p.raw(x0, name)?, p.nhwc[x0], 1, 1),
            Granularity::PerTensor => (p.plain(x0, name)?, false, 1, 1),
            Granularity::PerAxis { axis } => {
                let a = norm_axis(axis, rank)
                    .ok_or_else(|| unsupported(name, format!("axis {axis} of rank {rank}")))?;
                if p.es < 4 && matches!(q.qtype, QuantType::Int16 | QuantType::Uint16) {
                    return Err(unsupported(
                        name,
                        "per-axis int16 / uint16 quantization runs on cuda at fp32 and tf32 only \
                         (its zero points are not exact in fp16 or bf16 storage)",
                    ));
                }
                if p.nhwc[x0] && !strided && a == 1 && rank == 4 {
                    (p.raw(x0, name)?, true, shape[1], 1)
                } else {
                    (
                        p.plain(x0, name)?,
                        false,
                        shape[a],
                        shape[a + 1..].iter().product(),
                    )
                }
            }
            Granularity::Blocked { .. } => {
                return Err(unsupported(
                    name,
                    "blocked quantization of a runtime tensor (blocked weights fold at import)",
                ))
            }
        };
        let params = if q.scales.len() > 1 {
            let s = Tensor::new(vec![q.scales.len()], q.scales.clone())?;
            let z = Tensor::new(vec![q.zero_points.len()], q.zero_points.clone())?;
            Some([p.new_const(s), p.new_const(z)])
        } else {
            None
        };
        let (y, n) = match padded {
            Some(cp) => {
                let n = p.numel(x0) / shape[1] * cp;
                let y = Loc::Storage {
                    id: p.new_storage(n * p.es),
                    offset: 0,
                };
                p.store_like(outs[0], x0, y);
                (y, n)
            }
            None => (p.output(outs[0], keep), out_shape.iter().product()),
        };
        p.push(
            name,
            StepKind::FakeQuant(FakeQuantStep {
                x,
                y,
                n,
                channels,
                inner,
                params,
                scale: q.scales.first().copied().unwrap_or(1.0),
                zero_point: q.zero_points.first().copied().unwrap_or(0.0),
                qtype: q.qtype,
                saturate: q.saturate,
            }),
        );
        Ok(Lowered::Steps)
    }

    /// Decides which products run as quantized GEMMs (`self.quant`) and sets, per node,
    /// whether it is a FakeQuant that emits nothing (`self.fq_skip`): every reader is one of
    /// them, reading it as its quantized operand, or as its residual of bytes
    /// ([`Planner::residual_bytes`]). A convolution needs the channels-last plan (its GEMM
    /// reads NHWC rows).
    pub(in crate::plan) fn find_quant_gemms(&mut self, pat: &Patterns) {
        let g = self.g;
        for (ni, n) in g.nodes.iter().enumerate() {
            let eligible = match &n.op {
                Op::Conv(_) => self.opts.channels_last,
                Op::Linear { .. } => true,
                _ => false,
            };
            if eligible {
                self.quant[ni] = crate::int8::classify(g, &self.shapes, ni).ok();
            }
        }
        let operand_only = |p: &Self, f: usize, u: usize| {
            let v = g.nodes[f].outputs[0];
            p.quant[u].is_some()
                && g.nodes[u].inputs[0] == v
                && g.nodes[u].inputs[1..].iter().all(|&i| i != v)
        };
        self.fq_skip = g
            .nodes
            .iter()
            .enumerate()
            .map(|(f, n)| {
                matches!(n.op, Op::FakeQuant(_))
                    && !pat.is_output[n.outputs[0]]
                    && !pat.users_of[n.outputs[0]].is_empty()
                    && pat.users_of[n.outputs[0]]
                        .iter()
                        .all(|&u| operand_only(self, f, u))
            })
            .collect();
        // Then the FakeQuants a residual reads too, once the first decisions are known (the
        // producer's bytes depend on them).
        for f in 0..g.nodes.len() {
            if self.fq_skip[f] || !matches!(g.nodes[f].op, Op::FakeQuant(_)) {
                continue;
            }
            let v = g.nodes[f].outputs[0];
            let users = &pat.users_of[v];
            let readers_fit = !pat.is_output[v]
                && users.iter().any(|&u| self.residual_reader(f, u))
                && users
                    .iter()
                    .all(|&u| operand_only(self, f, u) || self.residual_reader(f, u));
            if readers_fit {
                self.fq_skip[f] = true;
                self.fq_skip[f] = self.residual_bytes(f, pat);
            }
        }
    }

    /// Whether node `u` reads FakeQuant `f`'s output as a residual it can take as bytes: a
    /// quantized channels-last convolution of `f`'s type whose residual it is (and maybe its
    /// operand too), `f` per tensor.
    fn residual_reader(&self, f: usize, u: usize) -> bool {
        let g = self.g;
        let (v, n) = (g.nodes[f].outputs[0], &g.nodes[u]);
        let Op::FakeQuant(fq) = &g.nodes[f].op else {
            return false;
        };
        let (Op::Conv(a), Some(q)) = (&n.op, &self.quant[u]) else {
            return false;
        };
        a.residual
            && n.inputs.get(3) == Some(&v)
            && n.inputs[1..3].iter().all(|&i| i != v)
            && q.qtype == fq.qtype
            && fq.scales.len() == 1
            && fq.scales[0] > 0.0
            && fq.scales[0].is_finite()
            && fq.zero_points.iter().all(|&z| z == 0.0)
    }

    /// Whether the bytes of FakeQuant `f`'s input (NHWC, at `f`'s scale) will exist before its
    /// residual readers run, so that `f` emits nothing (`fq_skip[f]` set while asking): its
    /// producer's epilogue writes them ([`Planner::quantized_output`] or
    /// [`Planner::quantized_copy`]), or a direct quantized convolution reads `f` as its operand
    /// ahead of every residual reader (its rows are those bytes).
    fn residual_bytes(&self, f: usize, pat: &Patterns) -> bool {
        let g = self.g;
        let (u, v) = (g.nodes[f].inputs[0], g.nodes[f].outputs[0]);
        let Op::FakeQuant(fq) = &g.nodes[f].op else {
            return false;
        };
        let s = fq.scales[0];
        let first_residual = pat.users_of[v]
            .iter()
            .copied()
            .filter(|&r| self.residual_reader(f, r))
            .min()
            .unwrap_or(0);
        // A reader that is both is lowered operand first (its rows are the bytes).
        let direct_first = pat.users_of[v].iter().any(|&r| {
            r <= first_residual
                && matches!(g.nodes[r].op, Op::Conv(_))
                && g.nodes[r].inputs[0] == v
                && self.quant[r]
                    .as_ref()
                    .is_some_and(|q| q.direct && q.x_scale == s && q.qtype == fq.qtype)
        });
        let by_producer = g.producer(u).is_some_and(|p| match g.nodes[p].op {
            Op::Conv(_) => {
                self.quantized_output(p, u, true, pat) == Some((s, fq.qtype))
                    || self.quantized_copy(p, u, true, pat) == Some(s)
            }
            // resnet18's first block: its skip is the max pool's output.
            Op::MaxPool(_) | Op::AveragePool(_) => {
                self.pool_reads_nhwc(p) && self.pooled_bytes(u, true, pat) == Some((s, fq.qtype))
            }
            _ => false,
        });
        direct_first || by_producer
    }

    /// Whether pool node `p` will read (and so write) NHWC values, known before lowering: its
    /// input is a convolution's output of the channels-last plan, which is stored NHWC
    /// whenever it has several channels and pixels ([`Planner::output`]).
    fn pool_reads_nhwc(&self, p: usize) -> bool {
        let g = self.g;
        let x = g.nodes[p].inputs[0];
        let sh = &self.shapes[x];
        self.opts.channels_last
            && g.producer(x)
                .is_some_and(|c| matches!(g.nodes[c].op, Op::Conv(_)))
            && sh.len() == 4
            && sh[1] > 1
            && sh[2] * sh[3] > 1
    }

    /// Lowers a Conv or Linear that [`Planner::find_quant_gemms`] chose: the FakeQuant's input
    /// quantized (after an im2col for a convolution that is not 1×1 stride 1), the GEMM, the
    /// epilogue into the node's output. Where that input was left quantized by its producer's
    /// epilogue ([`Planner::quantized_output`]), nothing is quantized again: a direct GEMM
    /// reads those bytes, an im2col copies them.
    pub(in crate::plan) fn lower_quant_gemm(
        &mut self,
        c: &NodeCtx,
        pat: &Patterns,
    ) -> Result<Lowered> {
        let q = self.quant[c.ni]
            .clone()
            .ok_or_else(|| unsupported(c.name, "no quantized GEMM was chosen"))?;
        let (g, name, n) = (self.g, c.name, c.n);
        let fq = g
            .producer(c.x0)
            .ok_or_else(|| unsupported(name, "the quantized input has no producer"))?;
        let u = g.nodes[fq].inputs[0];
        let (mm, nn, k) = (q.m, q.n, q.k);
        let nhwc = matches!(n.op, Op::Conv(_));
        // The input exists only as the bytes its producer's epilogue wrote.
        let pre = self.loc[u]
            .is_none()
            .then_some(self.quantized_of[u])
            .flatten();
        if let Some((l, _, _, _)) = pre {
            self.touch(l);
        }
        let mut rows_of_u = true;
        // `tmpl`: a convolution's geometry as this step reads x (its alternatives', too).
        let (x, mut conv, wrows, tmpl) = match &n.op {
            Op::Conv(a) => {
                if self.vstrides[u].is_some() {
                    // Not met so far: a convolution's input is never a strided view (only
                    // stride-aware readers get those), and a FakeQuant between them keeps it so.
                    return Err(unsupported(
                        name,
                        "a quantized convolution of a strided view (report it: the plan would \
                         need an NHWC copy first)",
                    ));
                }
                let xs = four(&self.shapes[u], name)?;
                let (x, xs, pads) = match pre {
                    // Symmetric padding only (`quantized_output` checked it).
                    Some((l, ..)) => (l, xs, [a.pads[0], a.pads[1]]),
                    None => {
                        let x = self.channels_last(u, name)?;
                        self.pad_asymmetric(name, x, xs, a.pads, true)?
                    }
                };
                rows_of_u = xs == four(&self.shapes[u], name)?;
                let ws = four(&c.in_shapes[1], name)?;
                // [M, C, kh, kw] → [M, kh, kw, C]: the im2col's column order (and a 1×1's
                // channel order).
                let [mo, ch, kh, kw] = ws;
                let mut wr = vec![0f32; q.w.len()];
                for o in 0..mo {
                    for ci in 0..ch {
                        for i in 0..kh * kw {
                            wr[(o * kh * kw + i) * ch + ci] = q.w[(o * ch + ci) * kh * kw + i];
                        }
                    }
                }
                // w and y are set below, once they exist (the im2col reads neither).
                let tmpl = ConvStep {
                    x,
                    w: x,
                    bias: None,
                    residual: None,
                    y: x,
                    x_shape: xs,
                    w_shape: ws,
                    y_shape: four(&c.out_shape, name)?,
                    pads,
                    strides: a.strides,
                    dilations: a.dilations,
                    groups: 1,
                    act: None,
                    nhwc: true,
                    col: None,
                };
                let conv = if q.direct {
                    None
                } else {
                    // The im2col of bytes writes the quantized matrix itself (below).
                    let col = match pre {
                        Some(_) => None,
                        None => Some(Loc::Storage {
                            id: self.new_storage(mm * k * self.es),
                            offset: 0,
                        }),
                    };
                    Some(ConvStep {
                        col,
                        ..tmpl.clone()
                    })
                };
                (x, conv, wr, Some(tmpl))
            }
            _ => match pre {
                Some((l, ..)) => (l, None, q.w.clone(), None),
                None => (self.plain(u, name)?, None, q.w.clone(), None),
            },
        };
        let repr = if q.qtype == QuantType::Int8 {
            ConstRepr::I8
        } else {
            ConstRepr::E4M3
        };
        let w = self.new_const(Tensor::new(vec![nn, k], wrows)?);
        if let Loc::Const { id, .. } = w {
            self.const_repr.push((id, repr));
        }
        let sc: Vec<f32> = q.w_scales.iter().map(|&s| q.x_scale * s).collect();
        let scale = self.new_const(Tensor::new(vec![nn], sc)?);
        if let Loc::Const { id, .. } = scale {
            self.const_repr.push((id, ConstRepr::F32));
        }
        let bias = match n.inputs.get(2) {
            Some(&b) => Some(self.raw(b, name)?),
            None => None,
        };
        // Rows of the same activations at the same scale are quantized once: by the producer's
        // epilogue, or by the first direct GEMM that reads them.
        let reuse = match self.quantized_of[u] {
            Some((l, s, t, px))
                if (conv.is_none() || pre.is_some())
                    && rows_of_u
                    && s == q.x_scale
                    && t == q.qtype
                    && px == nhwc =>
            {
                self.touch(l);
                Some(l)
            }
            _ => None,
        };
        // A convolution of floats that needs an im2col (a strided 1×1: resnet's downsample)
        // whose bytes a producer wrote as its quantized copy (`y_copy`, whatever path that
        // producer keeps): cuDNN's paths read them in place instead of quantizing x again.
        let copy_of_x = match (self.quantized_of[u], &conv, pre) {
            (Some((l, s, t, px)), Some(_), None)
                if nhwc
                    && px
                    && rows_of_u
                    && s == q.x_scale
                    && t == q.qtype
                    && self.steps.iter().any(|st| {
                        matches!(&st.kind, StepKind::QuantGemm(g)
                            if g.y_copy.map(|(c, _)| c) == Some(l))
                    }) =>
            {
                self.touch(l);
                Some(l)
            }
            _ => None,
        };
        if pre.is_some() && reuse.is_none() {
            return Err(unsupported(
                name,
                "its input was quantized by its producer for another scale or layout",
            ));
        }
        let xq = match (&conv, reuse) {
            (None, Some(l)) => l,
            // A matrix of its own (an im2col's, of the producer's bytes or of floats).
            _ => {
                let l = Loc::Storage {
                    id: self.new_storage(mm * k),
                    offset: 0,
                };
                if conv.is_none() && rows_of_u {
                    self.quantized_of[u] = Some((l, q.x_scale, q.qtype, nhwc));
                }
                l
            }
        };
        // After xq: a skip that is also this step's operand reads its rows.
        let ((residual, residual_scale), act) = match &n.op {
            Op::Conv(a) => {
                let r = match (a.residual, n.inputs.get(3)) {
                    (true, Some(&r)) => self.quant_residual(r, q.qtype, name)?,
                    _ => (None, None),
                };
                (r, a.activation)
            }
            Op::Linear { activation } => ((None, None), *activation),
            _ => {
                return Err(unsupported(
                    name,
                    "a quantized GEMM of neither Conv nor Linear",
                ))
            }
        };
        let acc = Loc::Storage {
            id: self.new_storage(mm * nn * 4),
            offset: 0,
        };
        let out = c.outs[0];
        let y_quant = self.quantized_output(c.ni, out, nhwc, pat);
        let y = match y_quant {
            // Only the next GEMMs read this value, quantized.
            Some((s, t)) => self.bytes_output(out, s, t, nhwc),
            None => self.output(out, nhwc),
        };
        // Where y stays in floats for another reader, its bytes for the next direct GEMMs are
        // made here, by this step's path (cuDNN's graph writes both at once), not by them.
        let y_copy = match y_quant {
            Some(_) => None,
            None => self.quantized_copy(c.ni, out, nhwc, pat).map(|s| {
                let l = Loc::Storage {
                    id: self.new_storage(mm * nn),
                    offset: 0,
                };
                self.quantized_of[out] = Some((l, s, q.qtype, nhwc));
                (l, s)
            }),
        };
        if let Some(cv) = conv.as_mut() {
            (cv.w, cv.y) = (w, y);
            if pre.is_some() {
                cv.col = Some(xq);
            }
        }
        let xq_ready = conv.is_none() && reuse.is_some();
        let alt = self.quant_alternatives(
            c,
            (&q, tmpl, pre.is_some()),
            [w, xq],
            (xq_ready, copy_of_x),
            [acc, y],
            (y_quant, y_copy.map(|(_, s)| s), residual_scale),
        )?;
        self.push(
            name,
            StepKind::QuantGemm(Box::new(QuantGemmStep {
                qtype: q.qtype,
                x,
                x_quantized: pre.is_some(),
                conv,
                xq_ready,
                xq,
                w,
                acc,
                scale,
                bias,
                residual,
                residual_scale,
                y,
                y_scale: y_quant.map(|(s, _)| s),
                y_copy,
                m: mm,
                n: nn,
                k,
                x_scale: q.x_scale,
                act,
                alt: Some(Box::new(alt)),
            })),
        );
        Ok(Lowered::Steps)
    }

    /// A quantized convolution's residual `r`: the bytes of a skip the model quantizes (`r` a
    /// FakeQuant that emits nothing, [`Planner::residual_bytes`]) with their scale, else its
    /// floats, channels-last.
    fn quant_residual(
        &mut self,
        r: usize,
        qtype: QuantType,
        name: &str,
    ) -> Result<(Option<Loc>, Option<f32>)> {
        let g = self.g;
        let skipped = g.producer(r).filter(|&f| self.fq_skip[f]);
        let Some(f) = skipped else {
            return Ok((Some(self.channels_last(r, name)?), None));
        };
        let (Op::FakeQuant(fq), u) = (&g.nodes[f].op, g.nodes[f].inputs[0]) else {
            return Err(unsupported(
                name,
                "a residual of bytes not made by a FakeQuant",
            ));
        };
        match self.quantized_of[u] {
            Some((l, s, t, true)) if s == fq.scales[0] && t == qtype => {
                self.touch(l);
                Ok((Some(l), Some(s)))
            }
            _ => Err(unsupported(
                name,
                "its residual's bytes were not made at its scale and layout (report it: the \
                 plan chose to read them)",
            )),
        }
    }

    /// The alternatives of the quantized product of node `c` ([`QuantAlternatives`]): `q` its
    /// GEMM, `tmpl` a convolution's geometry as the step reads x (`x_quantized`: x is its
    /// producer's bytes), `w` the quantized weight, `xq` the GEMM's quantized rows (made by
    /// an earlier step when `xq_ready`; x's bytes whole at `copy_of_x` where a producer wrote
    /// them, which cuDNN's paths then read), `acc` and `y` the step's accumulator and output (bytes
    /// when `y_quant`; quantized as well, by `y_copy`'s scale, when that is given), and
    /// `residual_scale` where the residual is bytes. The float step's bias is the step's own,
    /// its residual too unless that is bytes (then dequantized into storage of its own).
    pub(in crate::plan) fn quant_alternatives(
        &mut self,
        c: &NodeCtx,
        (q, tmpl, x_quantized): (&crate::int8::Int8Gemm, Option<ConvStep>, bool),
        [w, xq]: [Loc; 2],
        (xq_ready, copy_of_x): (bool, Option<Loc>),
        [acc, y]: [Loc; 2],
        (y_quant, y_copy, residual_scale): (Option<(f32, QuantType)>, Option<f32>, Option<f32>),
    ) -> Result<QuantAlternatives> {
        let (n, name, es) = (c.n, c.name, self.es);
        let (mm, nn, k) = (q.m, q.n, q.k);
        let x_n = tmpl.as_ref().map_or(mm * k, |t| t.x_shape.iter().product());
        let fresh = |p: &mut Self, bytes: usize| Loc::Storage {
            id: p.new_storage(bytes),
            offset: 0,
        };
        let xf = fresh(self, x_n * es);
        let yf = y_quant.map(|_| fresh(self, mm * nn * es));
        // The graph's weight itself: on the quantization grid, as the fake-quant steps read it.
        let wf = self.raw(n.inputs[1], name)?;
        let bias = match n.inputs.get(2) {
            Some(&b) => Some(self.raw(b, name)?),
            None => None,
        };
        // A residual of bytes: the float step reads it dequantized, into storage of its own.
        let rf = residual_scale.map(|_| fresh(self, mm * nn * es));
        let product = match (&tmpl, &n.op) {
            (Some(t), Op::Conv(a)) => {
                let residual = match (rf, a.residual, n.inputs.get(3)) {
                    (Some(rf), ..) => Some(rf),
                    (None, true, Some(&r)) => Some(self.channels_last(r, name)?),
                    _ => None,
                };
                let Loc::Const { id, .. } = wf else {
                    return Err(unsupported(
                        name,
                        "a quantized convolution's computed filter",
                    ));
                };
                if !self.filter_nhwc.contains(&id) {
                    self.filter_nhwc.push(id);
                }
                let mut f = ConvStep {
                    x: xf,
                    w: wf,
                    bias,
                    residual,
                    y: yf.unwrap_or(y),
                    act: a.activation,
                    ..t.clone()
                };
                if !f.direct_gemm() {
                    f.col = Some(fresh(self, mm * k * es));
                }
                StepKind::Conv(f)
            }
            (None, Op::Linear { activation }) => StepKind::Linear(LinearStep {
                x: xf,
                w: wf,
                bias,
                y: yf.unwrap_or(y),
                m: mm,
                n: nn,
                k,
                act: *activation,
                residual: None,
            }),
            _ => {
                return Err(unsupported(
                    name,
                    "a quantized GEMM of neither Conv nor Linear",
                ))
            }
        };
        // cuDNN's int8 convolutions take NHWC int8 with C a multiple of 4 (INT8_EXT_CONFIG:
        // int32 sums, f32 y). A direct 1×1's x bytes are its GEMM's rows: quantized into `xq`
        // itself (which later GEMMs may read), or read there when an earlier step made them.
        let (dnn_conv, xb) = match &tmpl {
            Some(t) if t.x_shape[1].is_multiple_of(4) && nn.is_multiple_of(4) => {
                let (xb, x) = match (x_quantized, q.direct, xq_ready, copy_of_x) {
                    (true, ..) => (None, t.x),
                    (false, true, true, _) => (None, xq),
                    (false, true, false, _) => (Some(xq), xq),
                    (false, false, _, Some(b)) => (None, b),
                    (false, false, _, None) => {
                        let b = fresh(self, x_n);
                        (Some(b), b)
                    }
                };
                let conv = ConvStep {
                    x,
                    w,
                    y: acc,
                    ..t.clone()
                };
                (Some(conv), xb)
            }
            _ => (None, None),
        };
        let graph = match (&dnn_conv, &n.op) {
            (Some(_), Op::Conv(a)) if crate::int8::quant_graph_act(a.activation).is_some() => {
                self.quant_graph_consts(n, q, (y_quant, y_copy), residual_scale)?
            }
            _ => None,
        };
        Ok(QuantAlternatives {
            dnn_conv,
            xb,
            graph,
            float: QuantFloat {
                xf,
                x_n,
                product,
                yf,
                fills_xq: false,
                residual: rf,
            },
        })
    }

    /// The f32 constants cuDNN's fused quantized graph of node `n` reads
    /// ([`QuantGraphConsts`]): its bias in f32, and `1 / y_scale` per channel where its output
    /// is bytes (`y_quant`), or `1 / y_copy` where it is quantized as well
    /// ([`QuantGraphConsts::copy_inv`]). `None` where the bias is not a constant.
    pub(in crate::plan) fn quant_graph_consts(
        &mut self,
        n: &Node,
        q: &crate::int8::Int8Gemm,
        (y_quant, y_copy): (Option<(f32, QuantType)>, Option<f32>),
        residual_scale: Option<f32>,
    ) -> Result<Option<QuantGraphConsts>> {
        let g = self.g;
        // A residual of bytes is added as read: every constant before it divided by its scale
        // r, the last multiply (there is always one) r / y_scale or r. Never with a second
        // output, whose multiply reads y as written.
        let r = residual_scale.unwrap_or(1.0);
        if residual_scale.is_some() && y_copy.is_some() {
            return Ok(None);
        }
        let channels = match n.inputs.get(1).and_then(|&w| g.constant(w)) {
            Some(w) => w.shape[0],
            None => return Ok(None),
        };
        let bias = match n.inputs.get(2) {
            Some(&b) => match g.constant(b) {
                Some(t) => Some(t.data.clone()),
                None => return Ok(None),
            },
            None => None,
        };
        let f32_const = |p: &mut Self, data: Vec<f32>| -> Result<Loc> {
            let l = p.new_const(Tensor::new(vec![data.len()], data)?);
            if let Loc::Const { id, .. } = l {
                p.const_repr.push((id, ConstRepr::F32));
            }
            Ok(l)
        };
        let bias = match bias {
            Some(b) if residual_scale.is_some() => {
                Some(f32_const(self, b.iter().map(|v| v / r).collect())?)
            }
            Some(b) => Some(f32_const(self, b)?),
            None => None,
        };
        let y_inv = match (y_quant, residual_scale) {
            (Some((s, _)), _) => Some(f32_const(
                self,
                vec![crate::int8::inverse_scale(s) * r; channels],
            )?),
            (None, Some(_)) => Some(f32_const(self, vec![r; channels])?),
            (None, None) => None,
        };
        let scale = match residual_scale {
            Some(_) => {
                let sc = q.w_scales.iter().map(|&w| q.x_scale * w / r).collect();
                Some(f32_const(self, sc)?)
            }
            None => None,
        };
        let copy_inv = match y_copy {
            Some(s) => Some(f32_const(
                self,
                vec![crate::int8::inverse_scale(s); channels],
            )?),
            None => None,
        };
        Ok(Some(QuantGraphConsts {
            bias,
            y_inv,
            copy_inv,
            scale,
        }))
    }

    /// Whether node `ni`'s output `v` (rows NHWC when `nhwc`) may leave its epilogue quantized
    /// for the next GEMMs: `v` is read only by one FakeQuant (not a graph output) that emits
    /// nothing, every reader of that FakeQuant runs as a quantized GEMM of the same type and
    /// layout (a convolution after a convolution, a Linear after a Linear) that needs no
    /// padding copy, and the bytes the im2col copies are whole 4-byte words (C a multiple of
    /// 4). Returns the FakeQuant's scale and type.
    pub(in crate::plan) fn quantized_output(
        &self,
        ni: usize,
        v: usize,
        nhwc: bool,
        pat: &Patterns,
    ) -> Option<(f32, QuantType)> {
        let producer_type = self.quant[ni].as_ref()?.qtype;
        let fq = self.bytes_only(v, nhwc, pat)?;
        (fq.qtype == producer_type).then_some((fq.scales[0], fq.qtype))
    }

    /// Whether pool output `v` (stored NHWC when `nhwc`) can be written as bytes only, for
    /// quantized GEMMs ([`PoolStep::y_quant`]), as [`Planner::quantized_output`] asks of a
    /// quantized product: so the pool writes a quarter of fp32's bytes (half of fp16's) and
    /// no quantize kernel runs after it (resnet's max pool before its first block). Int8 and
    /// e4m3 at zero point 0; returns the FakeQuant's scale and type.
    pub(in crate::plan) fn pooled_bytes(
        &self,
        v: usize,
        nhwc: bool,
        pat: &Patterns,
    ) -> Option<(f32, QuantType)> {
        let fq = self.bytes_only(v, nhwc, pat)?;
        let (s, t) = (fq.scales[0], fq.qtype);
        let symmetric = fq.zero_points.iter().all(|&z| z == 0.0);
        let byte = matches!(t, QuantType::Int8 | QuantType::Float8E4M3Fn);
        (symmetric && byte && s > 0.0 && s.is_finite()).then_some((s, t))
    }

    /// The FakeQuant whose bytes value `v` (NHWC when `nhwc`) can be stored as, bytes only:
    /// `v`'s one reader, per tensor, emitting nothing, and every reader of it reads its bytes
    /// as they would be laid out (a convolution's symmetric pads and whole 4-byte channel
    /// groups for its im2col, a Linear's rows).
    fn bytes_only(&self, v: usize, nhwc: bool, pat: &Patterns) -> Option<&FakeQuantAttrs> {
        let g = self.g;
        if pat.is_output[v] || pat.users_of[v].len() != 1 {
            return None;
        }
        let f = pat.users_of[v][0];
        let Op::FakeQuant(fq) = &g.nodes[f].op else {
            return None;
        };
        let fv = g.nodes[f].outputs[0];
        if !self.fq_skip[f] || fq.scales.len() != 1 {
            return None;
        }
        let channels = *self.shapes[v].last()?;
        let fits = pat.users_of[fv].iter().all(|&r| {
            let Some(q) = &self.quant[r] else {
                return false;
            };
            if self.residual_reader(f, r) && g.nodes[r].inputs[0] != fv {
                return nhwc;
            }
            match &g.nodes[r].op {
                Op::Conv(a) => {
                    let c = if self.shapes[v].len() == 4 {
                        self.shapes[v][1]
                    } else {
                        0
                    };
                    nhwc && a.pads[0] == a.pads[2]
                        && a.pads[1] == a.pads[3]
                        && (q.direct || c % 4 == 0)
                        && q.qtype == fq.qtype
                }
                Op::Linear { .. } => !nhwc && channels == q.k && q.qtype == fq.qtype,
                _ => false,
            }
        });
        fits.then_some(fq)
    }

    /// Whether node `ni`'s output `v` (kept in floats: [`Planner::quantized_output`] said no)
    /// should also be quantized by `ni`'s step for the next GEMMs: one of `v`'s readers is a
    /// FakeQuant (per tensor, of `ni`'s type) that emits nothing, and a direct quantized GEMM
    /// of the same layout reads it, which would otherwise quantize `v`'s rows itself. Its other
    /// readers (a residual) read the floats. Returns the FakeQuant's scale.
    pub(in crate::plan) fn quantized_copy(
        &self,
        ni: usize,
        v: usize,
        nhwc: bool,
        pat: &Patterns,
    ) -> Option<f32> {
        let g = self.g;
        let producer_type = self.quant[ni].as_ref()?.qtype;
        let mut fqs = pat.users_of[v]
            .iter()
            .filter(|&&u| matches!(g.nodes[u].op, Op::FakeQuant(_)));
        let f = *fqs.next()?;
        if fqs.next().is_some() || !self.fq_skip[f] {
            return None;
        }
        let Op::FakeQuant(fq) = &g.nodes[f].op else {
            return None;
        };
        if fq.qtype != producer_type || fq.scales.len() != 1 {
            return None;
        }
        let fv = g.nodes[f].outputs[0];
        let direct_reader = pat.users_of[fv].iter().any(|&r| {
            let Some(q) = &self.quant[r] else {
                return false;
            };
            let same_layout = match &g.nodes[r].op {
                Op::Conv(_) => nhwc,
                Op::Linear { .. } => !nhwc,
                _ => false,
            };
            q.direct && same_layout && q.qtype == fq.qtype && q.x_scale == fq.scales[0]
        });
        direct_reader.then_some(fq.scales[0])
    }
}
